/* cli_main.c - the command-line tool's entry point: finds the subcommand in
 * the registry (tools/cli.h) and runs it.  `dsattn` alone runs the main
 * job on the built-in default (the first registered command by order; for
 * the bill, with its short bench appended). */
#include "blas.h"
#include "cli.h"
#include "dsattn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { const char *name, *summary; dsattn_cmd_fn fn; int order; } cmd_entry;
static cmd_entry cmds[64];
static int n_cmds;

void dsattn_cli_register(const char *name, const char *summary, dsattn_cmd_fn fn,
                         int order)
{
    if (n_cmds < 64) cmds[n_cmds++] = (cmd_entry){ name, summary, fn, order };
}

static int by_order(const void *a, const void *b)
{
    return ((const cmd_entry *)a)->order - ((const cmd_entry *)b)->order;
}

static void usage(FILE *f)
{
    fprintf(f, "dsattn %s - DeepSeek's seven attention generations, measured\n\n"
               "usage: dsattn <command> [options]   (dsattn <command> --help)\n"
               "       dsattn --version\n\n",
            dsattn_version());
    for (int i = 0; i < n_cmds; i++)
        fprintf(f, "  %-13s %s\n", cmds[i].name, cmds[i].summary);
}

int main(int argc, char **argv)
{
    dsattn_blas_reexec_coretype(argv);   /* before anything else: may re-exec */
    qsort(cmds, (size_t)n_cmds, sizeof cmds[0], by_order);
    if (argc < 2) {
        if (n_cmds == 0) { usage(stdout); return 0; }
        /* The README's first command: the bill and, after it, a short
         * labelled bench (`dsattn bill --bench`).  Any other first command
         * runs bare. */
        int bill = !strcmp(cmds[0].name, "bill");
        char *def[] = { (char *)cmds[0].name, bill ? "--bench" : NULL, NULL };
        return cmds[0].fn(bill ? 2 : 1, def);
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) { printf("%s\n", dsattn_version()); return 0; }
    for (int i = 0; i < n_cmds; i++)
        if (!strcmp(argv[1], cmds[i].name)) return cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "dsattn: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
