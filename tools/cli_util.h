/* cli_util.h - what several subcommands share beyond number parsing
 * (cli_num.h): where the shipped configs are, editing a config.json into a
 * smaller sampler model, holding a config to its generation's rules,
 * temporary files, synthetic layer and stack inputs, and the MHA / GQA
 * stand-in stack.  Implemented in tools/cli_util.c. */
#ifndef DSATTN_CLI_UTIL_H
#define DSATTN_CLI_UTIL_H

#include "dsattn.h"

#include <cjson/cJSON.h>

#include <stddef.h>
#include <stdint.h>

/* The generation's own reading of the config at path (arch: its
 * dsattn_arch, from io/config.h): the rules a model of it must meet, beyond
 * the keys and tensor shapes the checkpoint layer checks (a V4 head_dim
 * whose nope part is not in FP8 blocks of 64, a V4.1 layer plan the
 * reference rejects, ...).  DSATTN_OK when a model of it can be made. */
dsattn_status dsattn_cli_config_check(const char *path, int arch, char *err, size_t errlen);

/* The configs folder: $DSATTN_CONFIGS, else ./configs when it holds
 * deepseek-v4.1-flash.json, else <folder of the executable>/../configs when
 * that does, else "configs". */
const char *dsattn_cli_configs_dir(void);

/* Set key to a number / an integer array, replacing what was there. */
void dsattn_cli_json_set_num(cJSON *j, const char *key, double v);
void dsattn_cli_json_set_ints(cJSON *j, const char *key, const int *v, int n);
/* The number at key, or def when it is absent or not a number. */
double dsattn_cli_json_num(const cJSON *j, const char *key, double def);
/* 1 when key "dtype" is "fp8". */
int dsattn_cli_json_is_fp8(const cJSON *j);
/* Print j to path; 0, or -1 when it cannot be written. */
int dsattn_cli_json_write(const cJSON *j, const char *path);

/* The folder for temporary files: $TMPDIR when set and not empty, else
 * /tmp. */
const char *dsattn_cli_tmp_root(void);
/* A new empty file of this process's own there, named
 * dsattn_<tag>_XXXXXX<suffix> (mkstemps: a name no one else has, mode
 * 0600), its path in buf[n]; 0, or -1 when it cannot be made.  The caller
 * writes it by that path and removes it. */
int dsattn_cli_tmp_file(char *buf, size_t n, const char *tag, const char *suffix);

/* b bytes as "x.xx MiB" (from 1 MiB) or "x.x KiB", in buf[n]; returns buf. */
const char *dsattn_cli_mib(double b, char *buf, size_t n);

/* The stand-in for a token embedding (dsattn run, dsattn soak): a row of
 * unit RMS (uniform in +-sqrt(3)) for position pos, a pure function of
 * (seed, pos), so a run reaching pos by any route feeds the same row.
 * (bf16 values need not hold: the residual stream is fp32.) */
void dsattn_cli_input_row(float *h, size_t dim, uint64_t seed, int64_t pos);

/* n bf16 values uniform in about +-1.7 (unit RMS: a normalised layer
 * input), from an xorshift stream started at seed * 0x9e3779b97f4a7c15 +
 * salt; malloc'd, NULL when out of memory. */
float *dsattn_cli_rand_bf16(size_t n, uint64_t seed, uint64_t salt);

/* MHA / GQA have no stand-in stack in the library (the others have
 * *_stack_forward): the library's stand-in loop (ops.h) around the layer
 * forward, as dsattn run and dsattn soak drive it, over the first
 * n_layers layers (a model may hold fewer than its config: dsattn run
 * --layers).  n tokens of one sequence (rows of h, updated in place);
 * advances the sequence by n on success. */
dsattn_status dsattn_cli_mha_stack(dsattn_ctx *ctx, dsattn_mha_seq *s, size_t n_layers,
                                   float *h, size_t n);
/* One batched decode step of B sequences (row k of h is sequence t[k]'s
 * token), xio: 2 * B * dim floats of scratch, failed as in
 * dsattn_mha_attn_forward_batch; advances each sequence by 1 on success. */
dsattn_status dsattn_cli_mha_stack_batch(dsattn_ctx *ctx, dsattn_mha_seq **t, size_t B,
                                         size_t n_layers, float *h, float *xio,
                                         size_t *failed);

#endif
