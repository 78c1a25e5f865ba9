/* cmd_make_weights.c - `dsattn make-weights`: a seeded random checkpoint
 * of a config's attention stack in the official layout, for tests and
 * benchmarks.  The writing is dsattn_make_weights (src/io/mkweights.c);
 * this file parses flags.
 */
#include "checkpoint.h"
#include "cli.h"
#include "cli_num.h"
#include "cli_util.h"
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void mw_usage(FILE *f)
{
    fprintf(f,
            "usage: dsattn make-weights --config C --seed S --out DIR\n"
            "                           [--format bf16|fp8] [--names inference|hf] [--shards N]\n"
            "  Writes DIR/model.safetensors (or N shards + model.safetensors.index.json)\n"
            "  and DIR/config.json: the attention tensors of every backbone layer.\n");
}

static int run_make_weights(int argc, char **argv);

/* DSATTN_CMD builds a C identifier from the name, and the command has a
 * hyphen, so it registers itself by hand. */
__attribute__((constructor)) static void reg_cmd_make_weights(void)
{
    dsattn_cli_register("make-weights",
                        "write a seeded random checkpoint for a config (official layout)",
                        run_make_weights, 40);
}

static int run_make_weights(int argc, char **argv)
{
    const char *cfg_path = NULL, *out = NULL, *fmt = "bf16", *names = "inference";
    uint64_t seed = 0;
    int shards = 1, have_seed = 0, rc;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            mw_usage(stdout);
            return 0;
        }
        if (!v) {
            fprintf(stderr, "dsattn make-weights: '%s' needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--config")) cfg_path = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--format")) fmt = v;
        else if (!strcmp(a, "--names")) names = v;
        else if (!strcmp(a, "--seed")) {
            if ((rc = dsattn_cli_u64("make-weights", a, v, &seed))) return rc;
            have_seed = 1;
        } else if (!strcmp(a, "--shards")) {
            if ((rc = dsattn_cli_i32("make-weights", a, v, 1, 9999, 0, &shards))) return rc;
        } else {
            fprintf(stderr, "dsattn make-weights: unknown option '%s'\n", a);
            mw_usage(stderr);
            return 2;
        }
        i++;
    }
    if (!cfg_path || !out || !have_seed) {
        mw_usage(stderr);
        return 2;
    }
    dsattn_mw_params p = { seed, DSATTN_MW_BF16, DSATTN_MW_NAMES_INFERENCE,
                           shards, cfg_path };
    if (!strcmp(fmt, "fp8")) p.format = DSATTN_MW_FP8;
    else if (strcmp(fmt, "bf16")) {
        fprintf(stderr, "dsattn make-weights: --format must be bf16 or fp8\n");
        return 2;
    }
    if (!strcmp(names, "hf")) p.names = DSATTN_MW_NAMES_HF;
    else if (strcmp(names, "inference")) {
        fprintf(stderr, "dsattn make-weights: --names must be inference or hf\n");
        return 2;
    }
    char err[1024];
    dsattn_model_config c;
    dsattn_status st = dsattn_config_load(&c, cfg_path, err, sizeof err);
    /* no checkpoint of a config the library would refuse to load */
    if (st == DSATTN_OK) st = dsattn_cli_config_check(cfg_path, c.arch, err, sizeof err);
    if (st == DSATTN_OK) st = dsattn_make_weights(&c, &p, out, err, sizeof err);
    if (st != DSATTN_OK) {
        fprintf(stderr, "error: %s [%s]\n", err, dsattn_status_str(st));
        return 1;
    }
    printf("wrote %s checkpoint (%s, %s names, %d shard%s, seed %llu) to %s\n",
           dsattn_arch_name(c.arch), fmt, names, shards, shards == 1 ? "" : "s", (unsigned long long)seed, out);
    return 0;
}
