/* cmd_info.c - `dsattn info PATH`: validate a checkpoint (file, shard index
 * or folder) against its config, list every tensor with what it feeds, and
 * print the layer plan the config implies.  On a session file (the
 * session magic), validate it and print its header (cli_session.c).  Exit 0 only when the
 * checkpoint is complete and consistent for its architecture; 1 when it is
 * not; 2 on usage errors.  All checking is the library's (checkpoint.h);
 * this file only prints.
 */
#include "checkpoint.h"
#include "cli.h"
#include "cli_session.h"
#include "cli_util.h"
#include "config.h"
#include "names.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void info_usage(FILE *f)
{
    fprintf(f,
            "usage: dsattn info PATH [--config config.json] [--quiet]\n"
            "  PATH: a .safetensors file, a model.safetensors.index.json, or a folder\n"
            "        (or a session file: its header, after checking every checksum)\n"
            "  Lists every tensor (inference name, dtype, shape, bytes, what it feeds),\n"
            "  the layer plan, and every problem found. Exit 0 only if complete.\n");
}

static void fmt_shape(char *b, size_t bl, const dsattn_st_tensor *t)
{
    size_t k = (size_t)snprintf(b, bl, "[");
    for (int d = 0; d < t->ndim && k < bl; d++)
        k += (size_t)snprintf(b + k, bl - k, "%s%lld", d ? "," : "", (long long)t->shape[d]);
    if (k < bl) snprintf(b + k, bl - k, "]");
}

static void on_issue(void *ud, dsattn_status st, const char *msg)
{
    (void)ud;
    fprintf(stderr, "error: %s [%s]\n", msg, dsattn_status_str(st));
}

static void print_plan(const dsattn_model_config *c)
{
    printf("\nlayer plan (%s, %lld layers", dsattn_arch_name(c->arch), (long long)c->n_layers);
    if (c->n_mtp) printf(" + %lld MTP/DSpark", (long long)c->n_mtp);
    printf("):\n");
    if (c->arch == DSATTN_ARCH_LLAMA) {
        printf("  layers 0..%lld: %s (%lld query heads, %lld KV heads of %lld dims)\n",
               (long long)c->n_layers - 1, c->n_kv_heads < c->n_heads ? "GQA" : "MHA",
               (long long)c->n_heads, (long long)c->n_kv_heads, (long long)c->head_dim);
        return;
    }
    if (c->arch == DSATTN_ARCH_V3 || c->arch == DSATTN_ARCH_V32) {
        printf("  layers 0..%lld: MLA (%lld heads, kv_lora %lld, rope %lld)%s\n",
               (long long)c->n_layers - 1, (long long)c->n_heads,
               (long long)c->kv_lora_rank, (long long)c->qk_rope_head_dim,
               c->arch == DSATTN_ARCH_V32 ? " + DSA lightning indexer" : "");
        return;
    }
    if (c->arch == DSATTN_ARCH_V4) {
        for (int64_t i = 0; i < c->n_compress_ratios; i++) {
            int64_t m = c->compress_ratios[i];
            printf("  layer %3lld  ratio %4lld  %s\n", (long long)i, (long long)m,
                   i >= c->n_layers ? "MTP (listed, not run)"
                   : m == 0 ? "SWA (window only)"
                   : m == 4 ? "CSA (compressed sparse, indexer)"
                            : "HCA (heavily compressed, dense)");
        }
        return;
    }
    dsattn_v41_plan *p = malloc(sizeof *p);
    char err[400];
    if (!p) return;
    if (dsattn_v41_plan_from_config(c, p, err, sizeof err) != DSATTN_OK) {
        printf("  (invalid: %s)\n", err);
        free(p);
        return;
    }
    for (int64_t i = 0; i < c->n_compress_ratios; i++) {
        const dsattn_v41_layer_plan *l = &p->layer[i];
        printf("  layer %3lld  ratio %lld  %-7s", (long long)i, (long long)l->ratio,
               dsattn_v41_mode_name(l->mode));
        if (l->mode == DSATTN_V41_REUSE || l->mode == DSATTN_V41_REINDEX)
            printf("  kv from %lld", (long long)l->kv_source);
        if (l->mode == DSATTN_V41_REUSE)
            printf(", top-k from %lld", (long long)l->index_source);
        if (l->is_candidate_source) printf("  candidate source");
        if (l->mode == DSATTN_V41_MTP) printf("  (listed, not run)");
        printf("\n");
    }
    printf("  Full %lld, Reindex %lld, Reuse %lld, SWA %lld\n", (long long)p->n_full,
           (long long)p->n_reindex, (long long)p->n_reuse, (long long)p->n_swa);
    free(p);
}

DSATTN_CMD(info, 30, "validate and list a checkpoint (file, shard index or folder)")
static int cmd_info(int argc, char **argv)
{
    const char *path = NULL, *cfg = NULL;
    int quiet = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config") && i + 1 < argc) cfg = argv[++i];
        else if (!strcmp(argv[i], "--quiet") || !strcmp(argv[i], "-q")) quiet = 1;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            info_usage(stdout);
            return 0;
        } else if (argv[i][0] == '-' || path) {
            fprintf(stderr, "dsattn info: unexpected argument '%s'\n", argv[i]);
            info_usage(stderr);
            return 2;
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        info_usage(stderr);
        return 2;
    }
    if (dsattn_cli_is_session(path)) return dsattn_cli_session_info(path);
    char err[1024];
    dsattn_ckpt *ck = NULL;
    dsattn_status st = dsattn_ckpt_open(&ck, path, cfg, err, sizeof err);
    if (st != DSATTN_OK) {
        fprintf(stderr, "error: %s [%s]\n", err, dsattn_status_str(st));
        fprintf(stderr, "FAILED: %s cannot be loaded\n", path);
        return 1;
    }
    const dsattn_model_config *c = dsattn_ckpt_config(ck);
    printf("checkpoint: %s (%s, %zu file%s)\n", path, dsattn_ckpt_layout(ck),
           dsattn_ckpt_n_files(ck), dsattn_ckpt_n_files(ck) == 1 ? "" : "s");
    if (c)
        printf("config:     %s (%s keys) -> %s, dim %lld, %lld layers, %lld heads, "
               "weights %s%s%s\n", dsattn_ckpt_config_path(ck), c->hf_keys ? "HF" : "inference",
               dsattn_arch_name(c->arch), (long long)c->dim, (long long)c->n_layers,
               (long long)c->n_heads, c->dtype, c->weight_block ? ", block " : "",
               c->weight_block ? (c->weight_block == 128 ? "128x128" : c->weight_block == 64
                                  ? "64x64" : "32x32") : "");
    else
        printf("config:     none found (pass --config)\n");

    dsattn_tensor_spec *sp = NULL;
    size_t nsp = 0;
    if (c) dsattn_expected_tensors(c, &sp, &nsp, NULL, 0);
    size_t n = dsattn_ckpt_count(ck), unused = 0;
    uint64_t bytes = 0;
    if (!quiet)
        printf("\n%-52s %-8s %-16s %12s  %s\n", "tensor (inference name)", "dtype", "shape",
               "bytes", "feeds");
    for (size_t i = 0; i < n; i++) {
        const dsattn_ckpt_entry *e = dsattn_ckpt_at(ck, i);
        char shape[96], desc[160];
        fmt_shape(shape, sizeof shape, e->t);
        dsattn_name_describe(c, sp, nsp, e->name, desc, sizeof desc);
        if (!strncmp(desc, "not attention", 13) || strstr(desc, "not run") ||
            strstr(desc, "not used"))
            unused++;
        bytes += e->t->nbytes;
        if (quiet) continue;
        printf("%-52s %-8s %-16s %12zu  %s", e->name, dsattn_dtype_name(e->t->dtype), shape,
               e->t->nbytes, desc);
        if (strcmp(e->name, e->stored_name)) printf("  [stored as %s]", e->stored_name);
        if (dsattn_ckpt_n_files(ck) > 1) {
            const char *b = strrchr(e->file, '/');
            printf("  {%s}", b ? b + 1 : e->file);
        }
        printf("\n");
    }
    printf("\n%zu tensors, %llu bytes; %zu not used by the attention stack\n", n,
           (unsigned long long)bytes, unused);
    free(sp);
    if (c) print_plan(c);

    size_t issues = 0;
    st = dsattn_ckpt_validate(ck, on_issue, NULL, &issues);
    /* and the generation's own rules, which loading it applies */
    const char *cp = dsattn_ckpt_config_path(ck);
    if (c && cp) {
        const dsattn_status cs = dsattn_cli_config_check(cp, c->arch, err, sizeof err);
        if (cs != DSATTN_OK) {
            on_issue(NULL, cs, err);
            issues++;
        }
    }
    const char *arch = c ? dsattn_arch_name(c->arch) : "?";   /* static string */
    dsattn_ckpt_close(ck);
    if (st != DSATTN_OK || issues) {
        fprintf(stderr, "FAILED: %zu problem%s; the checkpoint is not complete and "
                        "consistent\n", issues, issues == 1 ? "" : "s");
        return 1;
    }
    printf("\nOK: complete and consistent for %s\n", arch);
    return 0;
}
