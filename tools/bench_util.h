/* bench_util.h - what several bench modes share: the machine's measured
 * limits (DRAM read bandwidth, fp32 FMA peak), comparisons of two trace
 * outputs, and the llama-bench style result table of the model-level modes
 * (every parameter a list, cross-multiplied; warm-up, mean +- sd; markdown,
 * csv or json carrying commit, CPU, ISA and the limits used). */
#ifndef DSATTN_BENCH_UTIL_H
#define DSATTN_BENCH_UTIL_H

#include "dsattn.h"

#include <stddef.h>
#include <stdio.h>

/* GB/s read by `threads` threads summing a 1 GiB array, best of 5.
 * Cached per thread count for the life of the process. */
double dsattn_bench_read_bw(int threads);
/* At the end of a run: the read probe again for every thread count the run
 * measured it for, one line each to f with the cached figure beside it, and
 * a warning where the two differ by more than 15 % - the memory's speed
 * moved during the run (a shared host), so every ratio against the first
 * figure carries that much doubt.  Nothing when the run never probed. */
void dsattn_bench_read_bw_recheck(FILE *f);
/* One such line for a probe of the caller's own (bench kernels); returns 1
 * when the two figures differ by more than 15 %. */
int dsattn_bench_read_bw_again_line(FILE *f, int threads, double first, double again);
/* The warning that goes with it */
void dsattn_bench_read_bw_moved(FILE *f);
/* The probe itself over a caller's array of n floats: simd 2 = AVX-512,
 * 1 = AVX2, 0 = plain C; best of reps passes. */
double dsattn_bench_read_bw_pool(int simd, const float *a, size_t n, int threads, int reps);

/* Seconds for `threads` threads to merely read a list of buffers, one
 * parallel region per buffer, each thread summing one contiguous share -
 * the access pattern of the decode GEMVs over the same memory, with no
 * compute.  Best of reps passes.  A model's weights are GBs in hundreds of
 * separate buffers; on a VM the reach of the TLBs and page walks makes that
 * slower to read than the 1 GiB probe above (bench v41 reports both). */
double dsattn_bench_replay_read(const void *const *buf, const size_t *bytes, size_t n,
                                int threads, int reps);

/* --profile: where the last timed step of a row went, phase by phase
 * (dsattn_ctx_profile), printed as one markdown table after the results.
 * scope says what the phases sum over ("the 40 layers", "the layer"). */
typedef struct {
    char           what[48];      /* "decode @4096", "prefill 128", ...   */
    int            threads;
    double         step_s;        /* wall time of that step              */
    dsattn_profile p;
} dsattn_bench_prof_row;
void dsattn_bench_print_profile(const dsattn_bench_prof_row *rows, int n, const char *scope);

/* fp32 FMA GFLOP/s of `threads` threads (independent chains), best of 3;
 * cached per thread count.  The vector width is the CPU's, or 8 lanes when
 * the AVX2 table is forced ($DSATTN_ISA=avx2).  1.0 when the CPU has no
 * AVX2/AVX-512. */
double dsattn_bench_fma_peak(int threads);
/* The same for the kernel table of ctx (8 lanes where it is the AVX2
 * table, whatever $DSATTN_ISA says): the peak of bench kernels --isa. */
double dsattn_bench_fma_peak_ctx(const dsattn_ctx *ctx, int threads);
/* The probe itself: simd 2 = AVX-512, 1 = AVX2 (0: returns 0). */
double dsattn_bench_fma_peak_probe(int simd, int threads);

/* The label of what a fast context of this process runs: its kernel
 * table's name, "+amx" where it uses the AMX-BF16 tiles, "+bf16dot" where
 * its Linears have the VDPBF16PS GEMM (pgemm.h; $DSATTN_ISA and
 * $DSATTN_AMX honoured).  A static buffer. */
const char *dsattn_bench_isa_label(void);

/* AMX-BF16 tile GFLOP/s of `threads` threads (TDPBF16PS on 4 independent
 * accumulator tiles), best of 3, cached; 0 where the CPU or OS has no AMX. */
double dsattn_bench_amx_bf16_peak(int threads);

/* VDPBF16PS GFLOP/s of `threads` threads (16 independent 16-lane chains,
 * 64 flops an instruction), best of 3, cached; 0 where the CPU has no
 * AVX512-BF16. */
double dsattn_bench_bf16dot_peak(int threads);

/* The peak of ctx's bf16 attention blocks (ktab bf16blk): the AMX-BF16
 * tile peak where they are the tiles, the VDPBF16PS peak where they are
 * its form; 0 where ctx has none. */
double dsattn_bench_bf16blk_peak(const dsattn_ctx *ctx, int threads);

/* The peak of the fastest multiply ctx's Linears run, at `threads`
 * threads: the AMX-BF16 tile peak where ctx runs tiles, the VDPBF16PS
 * peak where its table has the bf16-dot GEMM, else the fp32 FMA peak -
 * the divisor of a FLOP bound that no step of ctx can beat. */
double dsattn_bench_gemm_peak(const dsattn_ctx *ctx, int threads);

/* "model name" of /proc/cpuinfo, or "unknown". */
void dsattn_bench_cpu_model(char *buf, size_t n);

/* Bounds of the bench modes' numeric options (parsed by tools/cli_num.h). */
#define DSATTN_BENCH_MAX_DEPTH (1ll << 30)   /* --depth: cache fill, tokens  */
#define DSATTN_BENCH_MAX_REPS  1000000       /* --reps                       */
#define DSATTN_BENCH_MAX_BATCH 256           /* --batch: sequences per step  */
/* Is `name` one of the comma-separated items of `list`? */
int dsattn_bench_in_list(const char *list, const char *name);

/* Relative L2 error and cosine of tensor `out` of two safetensors files. */
int dsattn_bench_compare_out(const char *a, const char *b, double *rel, double *cosine);
/* Relative L2 error and cosine of two float vectors (want = reference). */
void dsattn_bench_rel_cos(const float *got, const float *want, size_t n, double *rel,
                          double *cosine);

/* ==== Result table (model-level modes) ================================= */

typedef enum { DSATTN_BENCH_MD = 0, DSATTN_BENCH_CSV = 1, DSATTN_BENCH_JSON = 2 } dsattn_bench_fmt;

/* "md" / "markdown", "csv", "json"; -1 otherwise. */
int dsattn_bench_parse_fmt(const char *s, dsattn_bench_fmt *f);

#define DSATTN_BENCH_MAX_EXTRA 16

typedef struct {
    const char      *mode;        /* "mla", "v4", ...                        */
    const char      *title;       /* markdown: the paragraph above the table */
    dsattn_bench_fmt fmt;
    int              n_extra;     /* mode-specific columns after the common  */
    const char      *extra[DSATTN_BENCH_MAX_EXTRA];      /* md headers       */
    const char      *extra_key[DSATTN_BENCH_MAX_EXTRA];  /* csv / json keys  */
    /* filled by begin */
    int              n_rows;
    char             cpu[128];
    const char      *isa;
} dsattn_bench_table;

typedef struct {
    char      model[48];          /* e.g. "DeepSeek-V3"                      */
    char      variant[64];        /* e.g. "MLA absorbed, bf16 latent"        */
    long long depth;              /* tokens in the cache before the step     */
    int       threads, reps;
    double    kv_bytes;           /* global KV bytes per token (*_kv_bill)   */
    double    ms_mean, ms_sd;     /* one decode step, over reps              */
    double    gb, gflop;          /* per step, the kernels' counters         */
    double    lim_gbs, lim_gflops;/* measured read BW / FMA peak, same T     */
    char      extra[DSATTN_BENCH_MAX_EXTRA][32];  /* printed as is (json:
                                     a number when it parses as one)         */
} dsattn_bench_result;

void dsattn_bench_begin(dsattn_bench_table *t, const char *isa);
void dsattn_bench_row(dsattn_bench_table *t, const dsattn_bench_result *r);
/* footer: markdown notes printed after the table (NULL: none). */
void dsattn_bench_end(dsattn_bench_table *t, const char *footer);

/* One timed case: `step` is called once as a warm-up and then `reps`
 * times; each call's wall time and counters (reset before it) go into r
 * (ms_mean, ms_sd, gb, gflop of the last rep; lim_* for ctx's threads).
 * Returns the first failing status, else DSATTN_OK. */
typedef dsattn_status (*dsattn_bench_step_fn)(dsattn_ctx *ctx, void *arg);
dsattn_status dsattn_bench_time(dsattn_ctx *ctx, dsattn_bench_step_fn step, void *arg,
                                int reps, dsattn_bench_result *r);
/* The same with the warm-up call optional (warm = 0: none - a long prefill,
 * where one more call would double the run and its first-touch costs are
 * a small share of the timed one). */
dsattn_status dsattn_bench_time_w(dsattn_ctx *ctx, dsattn_bench_step_fn step, void *arg,
                                  int reps, int warm, dsattn_bench_result *r);

/* Seconds on a monotonic clock. */
double dsattn_bench_now(void);

/* ==== The options of the one-layer modes (mha, mla, v4) =============== */

#define DSATTN_BENCH_MAXL 16    /* entries of each list option */

typedef struct {
    const char      *configs;
    dsattn_bench_fmt fmt;
    const char      *models;
    long long        depth[DSATTN_BENCH_MAXL], thr[DSATTN_BENCH_MAXL], reps[DSATTN_BENCH_MAXL];
    int              nd, nt, nr;
    uint64_t         seed;
    int              profile;    /* --profile: print the phase table (mla, v4) */
    long long        batch[DSATTN_BENCH_MAXL]; /* --batch (mla, mha): sequences a step */
    int              nb;         /* 0: one sequence                            */
    const char      *weights;    /* --weights (mha, mla, v4): a checkpoint, else random */
    const char      *config;     /* --config (mha, mla; with --weights; v4 parses its own) */
} dsattn_bench_opts;

/* Parse `bench <mode>`'s options into o (its defaults already set):
 * --depth/--threads/--reps lists, --model, --configs, --seed, --format,
 * --profile (mla, v4), --batch (mla, mha), --weights (mha, mla, v4) and --config (mha, mla).  0 to
 * run, 1 after --help (usage printed), 2 on a refused option (message on
 * stderr). */
int dsattn_bench_parse_opts(const char *mode, int argc, char **argv, dsattn_bench_opts *o,
                            const char *usage);
/* A context of the mode and thread count (0: default), or NULL. */
dsattn_ctx *dsattn_bench_ctx(dsattn_mode mode, int threads);
/* The table's footnote: the DRAM read bandwidth and fp32 FMA peak at each of
 * the nt thread counts, and with amx the AMX-BF16 tile peak where the CPU
 * has the tiles. */
void dsattn_bench_limits_note(char *buf, size_t n, const long long *thr, int nt, int amx);

/* One decode step for dsattn_bench_verify: a fresh sequence of the model
 * behind arg, filled synthetically from seed to depth, then x through
 * layer 0 into out. */
typedef dsattn_status (*dsattn_bench_layer_step)(dsattn_ctx *ctx, const void *arg, int64_t depth,
                                                 uint64_t seed, const float *x, float *out);
/* Fast vs reference before timing: the step on a fast context (default
 * threads) and on a one-thread reference context with the same input
 * (dim bf16 values from x_seed): rel L2 error and cosine of the fast output
 * against the reference one.  Non-OK when a step fails. */
dsattn_status dsattn_bench_verify(dsattn_bench_layer_step step, const void *arg, size_t dim,
                                  int64_t depth, uint64_t seed, uint64_t x_seed, double *rel,
                                  double *cosine);

/* The V4.1 stack decode benchmark (bench_v41.c). */
int dsattn_bench_v41(int argc, char **argv);
/* `dsattn bench mha` (bench_attn.c), `mla` and `v4` (bench_model.c). */
int dsattn_bench_mha(int argc, char **argv);
int dsattn_bench_mla(int argc, char **argv);
int dsattn_bench_v4(int argc, char **argv);
/* `dsattn bench session` (bench_session.c): session save / load vs cp. */
int dsattn_bench_session(int argc, char **argv);
/* The short labelled bench `dsattn` with no arguments prints after the
 * bill (bench_model.c): a few V4.1 layers at 64K and one V3 MLA layer at
 * 32K, verified first.  threads <= 0: the OpenMP default. */
int dsattn_bench_short(const char *configs, int threads);

#endif
