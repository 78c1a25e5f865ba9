/* cli.h - subcommand registry of the dsattn tool.  Each subcommand lives in
 * tools/cmd_<name>.c and registers itself with DSATTN_CMD, so adding one
 * touches no central table.  A command returns the process exit status:
 *
 *     DSATTN_CMD(name, order, "one-line summary")
 *     static int cmd_name(int argc, char **argv)
 *     {
 *         ...
 *     }
 */
#ifndef DSATTN_CLI_H
#define DSATTN_CLI_H

typedef int (*dsattn_cmd_fn)(int argc, char **argv);   /* argv[0] = name */

void dsattn_cli_register(const char *name, const char *summary, dsattn_cmd_fn fn,
                         int order);

/* Registers cmd_<name>, the function defined right after it (a plain
 * function, so readers and tools see its body as one). */
#define DSATTN_CMD(name, order, summary)                                    \
    static int cmd_##name(int argc, char **argv);                           \
    __attribute__((constructor)) static void reg_cmd_##name(void)           \
    {                                                                       \
        dsattn_cli_register(#name, summary, cmd_##name, order);             \
    }

#endif
