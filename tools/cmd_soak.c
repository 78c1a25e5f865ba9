/* cmd_soak.c - `dsattn soak`: a long-run check a user runs on their own
 * machine for minutes or days.  One tiny random model per generation (MHA,
 * GQA, V3 MLA, V3.2 MLA + DSA, V4 CSA + HCA + SWA, V4.1 CSA2 with SWA /
 * Full / Reindex / Reuse layers and a candidate source; the configs are
 * written to $TMPDIR and removed as soon as the model is made) and one
 * context run a seeded random schedule of operations over a bounded pool of
 * live sequences per model: create, prefill at position 0 (MHA / GQA: a
 * chunk at any position; V4.1: sometimes a CED prefill), one-token decode, a batched decode of a random
 * subset (dsattn_*_stack_forward_batch), save + load, load_buffer, clone,
 * destroy, a push past a sequence's capacity, and a group of pipeline
 * stages (op_stages: sequences of some layers against one of every layer).
 * Inputs are dsattn run's seeded rows, one stream per sequence.  --shapes
 * odd swaps the tiny models for ones of shapes no kernel tiles evenly,
 * --shapes random for ones whose configs are drawn from the seed.
 *
 * Each operation checks what include/dsattn.h promises: the status, the
 * positions, finite outputs; a refused call (past the capacity, a batch
 * holding a full sequence, a load into a capacity below the position, a
 * truncated or damaged session buffer) changes nothing - rows, positions,
 * the sequence's session bytes - and returns no sequence, and the refused
 * sequence still takes a step (loaded with more room when it was full); a
 * clone or a reloaded session fed the same next inputs as its original
 * gives the same outputs bit for bit (both modes: docs/sessions.md), and
 * saved again at the same capacity the same bytes; one row of each batched
 * step equals the same sequence's one-sequence step (a clone taken before
 * the step): bit for bit in reference mode, within SOAK_FAST_BOUND in fast
 * (or, in rare rows, past it: SOAK_FAST_BOUND's comment); in reference
 * mode a V4.1 CED exact prefill equals a clone's full prefill bit for bit
 * (the last row, then the next steps).
 *
 * Memory (glibc): the heap in use is mallinfo2's uordblks (allocated
 * chunks, every arena) + hblkhd (mmapped chunks), exact once glibc's
 * per-thread cache is off - the command runs itself again with
 * GLIBC_TUNABLES=glibc.malloc.tcache_count=0 for that (reexec_exact) -
 * and RSS comes from /proc/self/statm; a line of both every --report-every
 * seconds.  Every sequence's footprint is what its making took (create,
 * clone, load) plus what its last prefill left (rows its next step frees:
 * include/dsattn.h); after each operation the heap
 * beside the live sequences (heap in use minus their footprints) may only
 * have grown by what an operation that grew the context's grow-only scratch
 * added: anything else over SOAK_HEAP_SLACK for the whole run is a failure
 * named at the operation that crossed it - a leak, or memory that drifts
 * upward with the pool at any size.  A destroy must release at least its
 * sequence's footprint.  At the end every sequence, model and the context
 * are destroyed and the heap in use must be back within SOAK_HEAP_SLACK of
 * its level before the context and the first model.
 *
 * The schedule is a function of --seed: a failure names the operation's
 * number, so the same command reproduces it.  A failed check never aborts:
 * the first one is reported (operation, generation, sequence, position),
 * everything is destroyed, temporary files removed, and the exit status is
 * 1.  SIGINT / SIGTERM end the run early, with the end-of-run checks.
 */
#include "cli.h"
#include "cli_num.h"
#include "bench_util.h"
#include "cli_util.h"
#include "dsattn.h"
#include "internal.h"
#include "numfmt.h"

#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
#include <malloc.h>
#define SOAK_HEAP 1
#else
#define SOAK_HEAP 0
#endif

enum {
    SOAK_POOL = 12,          /* live sequences per model, at most              */
    SOAK_CAP_MIN = 8,        /* a created sequence's capacity: 8 .. 600        */
    SOAK_CAP_MAX = 600,
    SOAK_LOAD_MAX = 640,     /* a load may ask for more room than was saved    */
    SOAK_SHORT = 32,         /* most prefills are at most this long            */
    SOAK_ROWS = SOAK_LOAD_MAX + 8,   /* rows of the input buffers: a refused chunk */
    SOAK_REDRAWS = 64,       /* --shapes random: draws of one model's config   */
};
/* The heap checks' allowance for one-time allocations (a thread's first
 * malloc makes its arena, whose header counts as in use) when the heap
 * figures are exact (heap_mode 2); with glibc's per-thread cache on, freed
 * small chunks it holds count as in use too (at most ~240 KiB a thread),
 * and only the end-of-run check runs, with the larger slack. */
#define SOAK_HEAP_SLACK ((size_t)64 << 10)
/* a sequence's destroy check, once a step split freed rows between members
 * or took them as given back (step_end) */
#define SOAK_ROWS_SLACK ((size_t)1 << 10)
#define SOAK_HEAP_SLACK_CACHED ((size_t)4 << 20)
/* Fast mode: a batched row against the same sequence's one-sequence step,
 * relative L2 over the row.  Not bit for bit: the batch runs other kernels
 * (the multi-row GEMV, from 4 or 8 rows the tiled GEMM) whose fp32 sums go
 * in another order (include/dsattn.h: "within the fast path's bounds").
 * Twins - a clone or a loaded session against its original - run the same
 * kernels on the same bytes and are held bit for bit in both modes, as
 * docs/sessions.md promises. */
#define SOAK_FAST_BOUND 5e-2
/* ... but for rare rows.  In fast mode a batched row and its twin differ
 * in last bits, and a discrete decision downstream can go the other way
 * when its inputs nearly tie: a top-k pick (V3.2's DSA, V4's CSA, V4.1's
 * index sources and candidate pool), an FP8 / FP4 rounding or a UE8M0
 * block scale of a cache entry or an activation.  The tiny random models
 * then carry the difference through their remaining layers, growing it up
 * to ~10x a layer, and the row ends past the bound.  Such rows are rare
 * (docs/benchmarks.md, 2026-12-06 21:20: 0-2 in a 30 s run's ~4,500
 * batched rows); a batched kernel that is wrong is past the bound at
 * nearly every step.  Each such row is reported with the first layer whose
 * attention outputs are past the bound and the first whose top-k selection
 * differs from the twin's.  A row whose top-k differs at or before the
 * first layer past the bound is a pick that went the other way; models
 * whose scores tie often (bf16 index scores, a top-k near the count of
 * entries, --shapes random draws both) have more of those: 0.9 % of a
 * V4.1 model's batched rows in one such run, 4 in its first 42 (seed 628,
 * docs/benchmarks.md 2026-12-07 18:50).  So a generation's rows past the
 * bound fail the run when those explained by a pick number more than
 * SOAK_DIVERGE_FREE plus one in SOAK_FLIP_PER of its batched rows, or the
 * others more than SOAK_DIVERGE_FREE plus one in SOAK_DIVERGE_PER. */
enum { SOAK_DIVERGE_FREE = 3, SOAK_DIVERGE_PER = 100, SOAK_FLIP_PER = 10, SOAK_SEL_MAX = 64 };

typedef enum { G_MHA, G_GQA, G_V3, G_V32, G_V4, G_V41, G_COUNT } gen_id;
typedef enum { F_MHA, F_MLA, F_V4, F_V41 } fam_t;

static const char *const gen_key[G_COUNT] = { "mha", "gqa", "v3", "v32", "v4", "v41" };
static const char *const gen_label[G_COUNT] = { "MHA", "GQA", "V3 MLA", "V3.2 MLA + DSA",
                                                "V4 CSA + HCA", "V4.1 CSA2" };

typedef enum {
    OP_CREATE, OP_PREFILL, OP_DECODE, OP_BATCH, OP_SAVE, OP_LOADBUF, OP_CLONE, OP_DESTROY,
    OP_OVERFLOW, OP_STAGES, OP_COUNT
} op_kind;
static const char *const op_name[OP_COUNT] = { "create", "prefill", "decode", "batch", "save",
                                               "loadbuf", "clone", "destroy", "overflow",
                                               "stages" };

/* ==== The tiny models ==================================================== */

/* Small configs in the shape of the tests' tiny ones: dims 256, a few
 * layers.  FP8 weights where the generation ships them (the Linear input
 * dims are multiples of 128 for V3 / V3.2 / V4's block scales). */
static const char *const tiny_config[G_COUNT] = {
    "{\"model_type\": \"llama\", \"hidden_size\": 256, \"num_hidden_layers\": 3,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"rope_theta\": 10000.0,"
    " \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-6}",
    "{\"model_type\": \"llama\", \"hidden_size\": 256, \"num_hidden_layers\": 3,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"rope_theta\": 10000.0,"
    " \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-6}",
    /* max_seq_len past original_seq_len: YaRN on */
    "{\"model_type\": \"deepseek_v3\", \"dim\": 256, \"n_layers\": 3, \"n_heads\": 4,"
    " \"q_lora_rank\": 128, \"kv_lora_rank\": 128, \"qk_nope_head_dim\": 32,"
    " \"qk_rope_head_dim\": 16, \"v_head_dim\": 32, \"original_seq_len\": 4096,"
    " \"rope_theta\": 10000.0, \"rope_factor\": 40, \"beta_fast\": 32, \"beta_slow\": 1,"
    " \"mscale\": 1.0, \"max_seq_len\": 16384, \"dtype\": \"fp8\"}",
    /* index_topk 8: most decode steps attend a subset of the tokens */
    "{\"model_type\": \"deepseek_v32\", \"dim\": 256, \"n_layers\": 3, \"n_heads\": 4,"
    " \"q_lora_rank\": 128, \"kv_lora_rank\": 128, \"qk_nope_head_dim\": 32,"
    " \"qk_rope_head_dim\": 16, \"v_head_dim\": 32, \"original_seq_len\": 4096,"
    " \"rope_theta\": 10000.0, \"rope_factor\": 40, \"beta_fast\": 32, \"beta_slow\": 1,"
    " \"mscale\": 1.0, \"max_seq_len\": 1024, \"dtype\": \"fp8\", \"index_n_heads\": 4,"
    " \"index_head_dim\": 128, \"index_topk\": 8, \"scale_fmt\": \"ue8m0\"}",
    /* SWA, CSA (ratio 4, top-4), HCA (ratio 16), and a trailing MTP entry */
    "{\"model_type\": \"deepseek_v4\", \"dim\": 256, \"n_layers\": 5, \"n_heads\": 4,"
    " \"q_lora_rank\": 128, \"head_dim\": 80, \"rope_head_dim\": 16, \"o_groups\": 2,"
    " \"o_lora_rank\": 128, \"window_size\": 8, \"original_seq_len\": 65536,"
    " \"rope_theta\": 10000, \"rope_factor\": 16, \"beta_fast\": 32, \"beta_slow\": 1,"
    " \"index_n_heads\": 8, \"index_head_dim\": 32, \"index_topk\": 4, \"dtype\": \"fp8\","
    " \"scale_fmt\": \"ue8m0\", \"compress_rope_theta\": 160000,"
    " \"compress_ratios\": [0, 4, 16, 4, 16, 0], \"norm_eps\": 1e-6}",
    /* the golden tiny-seed2-fp8 plan: SWA 0-1, Full 2 4 6, Reindex 8 10,
     * Reuse 3 5 7 9 11, candidate source 6 */
    "{\"model_type\": \"deepseek_v41\", \"dim\": 256, \"n_layers\": 12, \"n_heads\": 4,"
    " \"head_dim\": 64, \"rope_head_dim\": 16, \"q_lora_rank\": 64, \"o_groups\": 2,"
    " \"o_lora_rank\": 64, \"window_size\": 8,"
    " \"compress_ratios\": [0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1],"
    " \"kv_source_layers\": [2, 4, 6], \"index_source_layers\": [2, 4, 6, 8, 10],"
    " \"candidate_source_layer\": 6, \"candidate_topk_blocks\": 5,"
    " \"candidate_block_size\": 2, \"index_n_heads\": 8, \"index_head_dim\": 32,"
    " \"index_topk\": 6, \"rope_theta\": 10000.0, \"compress_rope_theta\": 160000.0,"
    " \"rope_factor\": 16, \"original_seq_len\": 65536, \"beta_fast\": 32, \"beta_slow\": 1,"
    " \"norm_eps\": 1e-20, \"dtype\": \"fp8\"}",
};

/* --shapes odd: configs no fast kernel tiles evenly, so the tails, the
 * fallbacks and the shapes' own plans run under the same schedule.  Odd
 * head counts (3, 5, 6), head dims 48 and 80, GQA groups of 3, V3 without
 * a query LoRA (q_lora_rank 0, YaRN off) and a value head unlike its key's
 * nope part, latent ranks 96 and 256 (only the latter takes the FP8 latent
 * rows), a V3.2 rope of 8 dims, V4 with HCA ratio 8, a CSA first layer,
 * three output groups of rank 48 (G x R = 144) and 3 index heads, V4.1
 * with 5 heads of 96 (32 rope), 5 output groups of rank 32, 3 index heads
 * and a plan whose Reindex layer feeds two Reuse layers.  FP8 weights on
 * V3 (used dequantized: partial 128 x 128 blocks at every edge) and V4.1
 * (blocks of 32); bf16 on V3.2 and V4, whose FP8 Linears quantize their
 * inputs in blocks of 128. */
static const char *const odd_config[G_COUNT] = {
    "{\"model_type\": \"llama\", \"hidden_size\": 240, \"num_hidden_layers\": 2,"
    " \"num_attention_heads\": 5, \"num_key_value_heads\": 5, \"rope_theta\": 10000.0,"
    " \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-6}",
    "{\"model_type\": \"llama\", \"hidden_size\": 480, \"num_hidden_layers\": 2,"
    " \"num_attention_heads\": 6, \"num_key_value_heads\": 2, \"rope_theta\": 10000.0,"
    " \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-6}",
    "{\"model_type\": \"deepseek_v3\", \"dim\": 192, \"n_layers\": 2, \"n_heads\": 3,"
    " \"q_lora_rank\": 0, \"kv_lora_rank\": 96, \"qk_nope_head_dim\": 48,"
    " \"qk_rope_head_dim\": 16, \"v_head_dim\": 40, \"original_seq_len\": 4096,"
    " \"rope_theta\": 10000.0, \"rope_factor\": 40, \"beta_fast\": 32, \"beta_slow\": 1,"
    " \"mscale\": 0.707, \"max_seq_len\": 4096}",
    "{\"model_type\": \"deepseek_v32\", \"dim\": 192, \"n_layers\": 2, \"n_heads\": 5,"
    " \"q_lora_rank\": 96, \"kv_lora_rank\": 256, \"qk_nope_head_dim\": 24,"
    " \"qk_rope_head_dim\": 8, \"v_head_dim\": 24, \"original_seq_len\": 4096,"
    " \"rope_theta\": 10000.0, \"rope_factor\": 40, \"beta_fast\": 32, \"beta_slow\": 1,"
    " \"mscale\": 1.0, \"max_seq_len\": 1024, \"index_n_heads\": 3,"
    " \"index_head_dim\": 128, \"index_topk\": 5, \"scale_fmt\": \"ue8m0\"}",
    "{\"model_type\": \"deepseek_v4\", \"dim\": 192, \"n_layers\": 4, \"n_heads\": 3,"
    " \"q_lora_rank\": 96, \"head_dim\": 80, \"rope_head_dim\": 16, \"o_groups\": 3,"
    " \"o_lora_rank\": 48, \"window_size\": 6, \"original_seq_len\": 65536,"
    " \"rope_theta\": 10000, \"rope_factor\": 16, \"beta_fast\": 32, \"beta_slow\": 1,"
    " \"index_n_heads\": 3, \"index_head_dim\": 32, \"index_topk\": 3,"
    " \"compress_rope_theta\": 160000, \"compress_ratios\": [4, 8, 0, 4, 0],"
    " \"norm_eps\": 1e-6}",
    "{\"model_type\": \"deepseek_v41\", \"dim\": 160, \"n_layers\": 10, \"n_heads\": 5,"
    " \"head_dim\": 96, \"rope_head_dim\": 32, \"q_lora_rank\": 96, \"o_groups\": 5,"
    " \"o_lora_rank\": 32, \"window_size\": 6,"
    " \"compress_ratios\": [0, 2, 2, 2, 2, 1, 1, 1, 1, 1],"
    " \"kv_source_layers\": [1, 3, 5], \"index_source_layers\": [1, 3, 5, 7],"
    " \"candidate_source_layer\": 5, \"candidate_topk_blocks\": 3,"
    " \"candidate_block_size\": 3, \"index_n_heads\": 3, \"index_head_dim\": 64,"
    " \"index_topk\": 5, \"rope_theta\": 10000.0, \"compress_rope_theta\": 160000.0,"
    " \"rope_factor\": 16, \"original_seq_len\": 65536, \"beta_fast\": 32, \"beta_slow\": 1,"
    " \"norm_eps\": 1e-6, \"dtype\": \"fp8\"}",
};

typedef enum { SHAPES_TINY, SHAPES_ODD, SHAPES_RANDOM, SHAPES_COUNT } shapes_id;
static const char *const shapes_key[SHAPES_COUNT] = { "tiny", "odd", "random" };
static const char *const *const shapes_config[SHAPES_RANDOM] = { tiny_config, odd_config };
/* random weights in FP8 (1) or bf16 (0), per set and generation; MHA /
 * GQA are bf16 as released whatever this says */
static const int shapes_fp8[SHAPES_RANDOM][G_COUNT] = { { 0, 0, 1, 1, 1, 1 },
                                                        { 0, 0, 1, 0, 0, 1 } };

/* --shapes random: each generation's config drawn from the seed (its own
 * stream, apart from the schedule's), within the ranges below, so every
 * seed runs other head counts, widths, ranks, windows, ratios, top-k
 * widths and - V4 and V4.1 - layer plans.  A draw the library's config
 * reader or weight maker refuses (DSATTN_ERR_FORMAT: a rule the draw does
 * not know) is drawn again, and the models line counts those. */
typedef struct { uint64_t x; } shape_rng;

static unsigned sr_n(shape_rng *r, unsigned n)          /* uniform in [0, n) */
{
    r->x ^= r->x >> 12; r->x ^= r->x << 25; r->x ^= r->x >> 27;
    return (unsigned)((r->x * 0x2545f4914f6cdd1dull) >> 33) % n;
}
static unsigned sr_in(shape_rng *r, unsigned lo, unsigned hi) { return lo + sr_n(r, hi - lo + 1); }
static unsigned sr_of(shape_rng *r, const unsigned *v, unsigned n) { return v[sr_n(r, n)]; }

/* a divisor of n, uniform over them; proper (< n) when n > 1 and proper */
static unsigned sr_divisor(shape_rng *r, unsigned n, int proper)
{
    unsigned d[16], k = 0;
    for (unsigned i = 1; i <= n && k < 16; i++)
        if (n % i == 0 && !(proper && n > 1 && i == n)) d[k++] = i;
    return d[sr_n(r, k)];
}

/* Appends a JSON list of n ints to buf. */
static void json_list(char *buf, size_t cap, const char *key, const int *v, int n)
{
    size_t o = strlen(buf);
    o += (size_t)snprintf(buf + o, o < cap ? cap - o : 0, ", \"%s\": [", key);
    for (int i = 0; i < n; i++)
        o += (size_t)snprintf(buf + o, o < cap ? cap - o : 0, "%s%d", i ? ", " : "", v[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

/* A V4.1 layer plan the config reader takes: a few SWA layers, then runs
 * that each open with a Full layer (kv and index source) at the run's
 * ratio, followed by Reindex (index source), Reuse and SWA layers; the
 * candidate source (or none) an index source of the last run, so every
 * index source after it shares its ratio; sometimes a trailing MTP entry. */
static int v41_plan(shape_rng *r, int L, int *ratio, int *kv, int *nkv, int *ix, int *nix,
                    int *cand)
{
    static const unsigned ratios[] = { 1, 2, 3, 4, 8 };
    int i = 0, run_ix = 0, rr = 0;  /* the last run's index sources start at ix[run_ix] */
    *nkv = *nix = 0;
    for (unsigned n = sr_n(r, 3); n > 0 && i < L - 1; n--) ratio[i++] = 0;
    while (i < L) {
        const int len = (int)sr_in(r, 1, 4);
        rr = (int)sr_of(r, ratios, 5);
        run_ix = *nix;
        ratio[i] = rr;
        kv[(*nkv)++] = i;
        ix[(*nix)++] = i++;
        for (int k = 1; k < len && i < L; k++, i++) {
            const unsigned u = sr_n(r, 10);
            ratio[i] = u < 2 ? 0 : rr;                      /* SWA */
            if (u >= 2 && u < 5) ix[(*nix)++] = i;           /* Reindex; else Reuse */
        }
    }
    *cand = sr_n(r, 3) ? ix[run_ix + (int)sr_n(r, (unsigned)(*nix - run_ix))] : -1;
    ratio[L] = sr_n(r, 2) ? rr : 0;
    return L + (int)sr_n(r, 2);          /* compress_ratios: with an MTP entry or not */
}

/* Config attempt `attempt` of generation g for this seed, into buf; *fp8:
 * the weights to make.  Every value is drawn into a variable of its own, in
 * statement order (C leaves the order of a call's arguments open), so a
 * seed draws the same config whatever the compiler. */
static void random_config(gen_id g, uint64_t seed, unsigned attempt, char *buf, size_t cap,
                          int *fp8)
{
    shape_rng rs = { (seed + 1) * 0x9e3779b97f4a7c15ull ^ ((uint64_t)g << 40) ^
                     ((uint64_t)attempt << 20) ^ 0x5851f42d4c957f2dull };
    shape_rng *r = &rs;
    for (int i = 0; i < 4; i++) sr_n(r, 2);
    static const unsigned rope[] = { 8, 16, 32 };
    *fp8 = 0;
    if (g == G_MHA || g == G_GQA) {
        static const unsigned hd[] = { 16, 32, 48, 64, 80, 96, 128 };
        static const unsigned hg[] = { 2, 3, 4, 6, 8 };
        const unsigned h = g == G_MHA ? sr_in(r, 1, 8) : sr_of(r, hg, 5);
        const unsigned kvh = g == G_MHA ? h : sr_divisor(r, h, 1);
        const unsigned d = sr_of(r, hd, 7), L = sr_in(r, 1, 3);
        const unsigned theta = sr_n(r, 2) ? 10000 : 500000;
        snprintf(buf, cap, "{\"model_type\": \"llama\", \"hidden_size\": %u,"
                 " \"num_hidden_layers\": %u, \"num_attention_heads\": %u,"
                 " \"num_key_value_heads\": %u, \"rope_theta\": %u.0,"
                 " \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-6}",
                 h * d, L, h, kvh, theta);
        return;
    }
    if (g == G_V3 || g == G_V32) {
        /* V3.2's FP8 weights need dim, q_lora_rank, kv_lora_rank and
         * n_heads * v_head_dim in multiples of 128; the V3.2 indexer reads
         * the query LoRA's output and quantizes one 128-wide block a head */
        static const unsigned v8[] = { 32, 64, 128 };
        *fp8 = (int)sr_n(r, 2);
        /* one draw in three: any widths (odd ones too), with bf16 weights,
         * or on V3 FP8 ones too (V3 uses them dequantized: no blocks of
         * its inputs); w128: the widths in multiples of 128 */
        const int any = (g == G_V3 || !*fp8) && sr_n(r, 3) == 0, w128 = *fp8 && !any;
        const unsigned dim = w128 ? 128 * sr_in(r, 1, 3) : any ? sr_in(r, 8, 300)
                                                              : 32 * sr_in(r, 2, 12);
        const unsigned ql = g == G_V3 && sr_n(r, 3) == 0 ? 0
                          : w128 ? 128 * sr_in(r, 1, 2) : any ? sr_in(r, 1, 200)
                                                               : 32 * sr_in(r, 1, 6);
        const unsigned kl = any ? sr_in(r, 1, 200)
                          : w128 || sr_n(r, 2) ? 128 * sr_in(r, 1, 2) : 32 * sr_in(r, 1, 7);
        const unsigned v = w128 ? sr_of(r, v8, 3) : any ? sr_in(r, 1, 70) : 8 * sr_in(r, 1, 8);
        const unsigned h = w128 ? (128 / v) * sr_in(r, 1, v == 128 ? 3 : 2) : sr_in(r, 1, 6);
        const unsigned yarn = sr_n(r, 2), L = sr_in(r, 1, 3);
        const unsigned nope = any ? sr_in(r, 1, 70) : 8 * sr_in(r, 1, 8);
        const unsigned rd = sr_of(r, rope, 3), mscale = sr_n(r, 2);
        size_t o = (size_t)snprintf(buf, cap,
                 "{\"model_type\": \"%s\", \"dim\": %u, \"n_layers\": %u, \"n_heads\": %u,"
                 " \"q_lora_rank\": %u, \"kv_lora_rank\": %u, \"qk_nope_head_dim\": %u,"
                 " \"qk_rope_head_dim\": %u, \"v_head_dim\": %u, \"original_seq_len\": 4096,"
                 " \"rope_theta\": 10000.0, \"rope_factor\": 40, \"beta_fast\": 32,"
                 " \"beta_slow\": 1, \"mscale\": %s, \"max_seq_len\": %u%s",
                 g == G_V3 ? "deepseek_v3" : "deepseek_v32", dim, L, h, ql, kl, nope, rd, v,
                 mscale ? "1.0" : "0.707", yarn ? 16384 : 4096,
                 *fp8 ? ", \"dtype\": \"fp8\"" : "");
        if (g == G_V32) {
            const unsigned ih = sr_in(r, 1, 8), topk = sr_in(r, 1, 16);
            if (o < cap)
                snprintf(buf + o, cap - o, ", \"index_n_heads\": %u, \"index_head_dim\": 128,"
                         " \"index_topk\": %u, \"scale_fmt\": \"ue8m0\"}", ih, topk);
        } else if (o < cap) {
            snprintf(buf + o, cap - o, "}");
        }
        return;
    }
    const unsigned h = sr_in(r, 1, 6), og = sr_divisor(r, h, 0), window = sr_in(r, 2, 16);
    const unsigned ih = sr_in(r, 1, 8);
    if (g == G_V4) {
        /* the window and compressed KV store the non-rope dims in FP8
         * blocks of 64; FP8 weights need their Linear widths in 128s.
         * Ratio 4 is CSA (overlapping windows), every other ratio HCA;
         * compress_ratios has an MTP entry or not */
        static const unsigned hr[] = { 16, 32 };
        static const unsigned ratios[] = { 0, 2, 3, 4, 4, 8, 16 };
        *fp8 = (int)sr_n(r, 2);
        const int any = !*fp8 && sr_n(r, 3) == 0;     /* bf16: any Linear widths */
        const unsigned rd = sr_of(r, hr, 2), L = sr_in(r, 2, 6), mtp = sr_n(r, 2);
        int cr[8];
        for (unsigned i = 0; i < L + mtp; i++) cr[i] = (int)sr_of(r, ratios, 7);
        const unsigned dim = *fp8 ? 128 * sr_in(r, 1, 3) : any ? sr_in(r, 8, 300)
                                                              : 32 * sr_in(r, 2, 12);
        const unsigned ql = *fp8 ? 128 : any ? sr_in(r, 1, 200) : 32 * sr_in(r, 1, 6);
        const unsigned orank = *fp8 ? 128 * sr_in(r, 1, 2) : any ? sr_in(r, 1, 130)
                                                                  : 16 * sr_in(r, 1, 8);
        const unsigned hdim = rd + 64 * sr_in(r, 1, 2), idim = 32 * sr_in(r, 1, 4);
        const unsigned topk = sr_in(r, 1, 8);
        snprintf(buf, cap,
                 "{\"model_type\": \"deepseek_v4\", \"dim\": %u, \"n_layers\": %u,"
                 " \"n_heads\": %u, \"q_lora_rank\": %u, \"head_dim\": %u,"
                 " \"rope_head_dim\": %u, \"o_groups\": %u, \"o_lora_rank\": %u,"
                 " \"window_size\": %u, \"original_seq_len\": 65536, \"rope_theta\": 10000,"
                 " \"rope_factor\": 16, \"beta_fast\": 32, \"beta_slow\": 1,"
                 " \"index_n_heads\": %u, \"index_head_dim\": %u, \"index_topk\": %u,"
                 " \"compress_rope_theta\": 160000, \"norm_eps\": 1e-6%s",
                 dim, L, h, ql, hdim, rd, og, orank, window, ih, idim, topk,
                 *fp8 ? ", \"dtype\": \"fp8\", \"scale_fmt\": \"ue8m0\"" : "");
        json_list(buf, cap, "compress_ratios", cr, (int)(L + mtp));
        if (strlen(buf) + 1 < cap) strcat(buf, "}");
        return;
    }
    /* V4.1: head_dim, index_head_dim and, with FP8 weights, the Linear
     * widths in multiples of the FP8 block of 32 */
    *fp8 = (int)sr_n(r, 2);
    const int any = !*fp8 && sr_n(r, 3) == 0;         /* bf16: any Linear widths */
    const unsigned L = sr_in(r, 3, 12), hdim = 32 * sr_in(r, 1, 4);
    unsigned rd = sr_of(r, rope, 3);
    if (rd >= hdim) rd = 16;
    int cr[16], kv[16], ix[16], nkv, nix, cand;
    const int ncr = v41_plan(r, (int)L, cr, kv, &nkv, ix, &nix, &cand);
    const unsigned dim = *fp8 ? 32 * sr_in(r, 2, 8) : any ? sr_in(r, 8, 260) : 16 * sr_in(r, 4, 16);
    const unsigned ql = *fp8 ? 32 * sr_in(r, 1, 4) : any ? sr_in(r, 1, 130) : 16 * sr_in(r, 1, 8);
    const unsigned orank = *fp8 ? 32 * sr_in(r, 1, 2) : any ? sr_in(r, 1, 70) : 16 * sr_in(r, 1, 4);
    const unsigned blocks = sr_in(r, 1, 8), bsize = sr_in(r, 1, 4), idim = 32 * sr_in(r, 1, 2);
    const unsigned topk = sr_in(r, 1, 12);
    snprintf(buf, cap,
             "{\"model_type\": \"deepseek_v41\", \"dim\": %u, \"n_layers\": %u,"
             " \"n_heads\": %u, \"head_dim\": %u, \"rope_head_dim\": %u,"
             " \"q_lora_rank\": %u, \"o_groups\": %u, \"o_lora_rank\": %u,"
             " \"window_size\": %u, \"candidate_source_layer\": %d,"
             " \"candidate_topk_blocks\": %u, \"candidate_block_size\": %u,"
             " \"index_n_heads\": %u, \"index_head_dim\": %u, \"index_topk\": %u,"
             " \"rope_theta\": 10000.0, \"compress_rope_theta\": 160000.0,"
             " \"rope_factor\": 16, \"original_seq_len\": 65536, \"beta_fast\": 32,"
             " \"beta_slow\": 1, \"norm_eps\": 1e-6, \"dtype\": \"%s\"",
             dim, L, h, hdim, rd, ql, og, orank, window, cand, blocks, bsize, ih, idim, topk,
             *fp8 ? "fp8" : "bf16");
    json_list(buf, cap, "compress_ratios", cr, ncr);
    json_list(buf, cap, "kv_source_layers", kv, nkv);
    json_list(buf, cap, "index_source_layers", ix, nix);
    if (strlen(buf) + 1 < cap) strcat(buf, "}");
}

/* ==== The run's state, the clock, the heap ============================== */

typedef struct {
    void    *s;
    uint64_t uid;          /* "sequence #uid" in reports                      */
    uint64_t stream;       /* its inputs: dsattn_cli_input_row(stream, pos)   */
    size_t   cap;
    int      variant;      /* MLA cache format, V4 empty rule, V4.1 index_k   */
    size_t   footprint;    /* heap bytes its making and its last prefill took */
    size_t   rows;         /* of which the rows that prefill left (a chunk's
                            * selections, V4.1's runtime slots): its next
                            * step frees them                                  */
    size_t   slack;        /* its destroy check's (step_end)                  */
} slot;

typedef struct {
    gen_id g;
    fam_t  f;
    void  *m;
    size_t dim;
    int    n_layers;
    int    variant[3], n_variants;
    slot   pool[SOAK_POOL];
    int    n_live;
    int    fp8;             /* FP8 weights (MLA, V4, V4.1) */
    int    redrawn;         /* --shapes random: draws the library refused */
    char   config[1536];    /* the config it was made from */
} model;

typedef struct {
    dsattn_ctx  *ctx;
    dsattn_mode  mode;
    uint64_t     seed, rng, next_uid;
    model        mod[G_COUNT];
    int          n_mod;
    float       *h, *h2, *h3, *xio;     /* [SOAK_ROWS x dim] rows; MHA batch io */
    /* what happened */
    unsigned long long ops[OP_COUNT], n_ops;
    double       op_s[OP_COUNT];            /* seconds spent per kind        */
    unsigned long long twins, twins_exact, brows, brows_exact, refusals;
    unsigned long long brows_g[G_COUNT], div_g[G_COUNT], div_topk;  /* fast mode's rare rows */
    unsigned long long flip_g[G_COUNT];  /* of div_g, those a top-k pick explains  */
    unsigned long long ced[3], ced_twins;   /* V4.1 prefills by CED mode; EXACT held to OFF */
    unsigned long long stage_groups, stage_rows, stage_exact, stage_copies;  /* op_stages */
    double       div_rel;
    double       twin_rel, brow_rel;
    float       *ao, *ao2;              /* attention outputs: a batch [n_layers x
                                         * (SOAK_POOL + 1) x dim], one step's     */
    int          failed;
    char         what[1536];
    op_kind      cur;
    int          n_live;
    /* the heap: measured (heap_mode > 0), exact (heap_mode 2) */
    int          heapm, exact;
    size_t       live_bytes;         /* what the live sequences' making took    */
    size_t       scratch_seen;       /* ctx_scratch after the last operation    */
    long long    over_prev;          /* heap in use - live_bytes, then          */
    long long    scratch_growth;     /* added by operations that grew ctx_scratch */
    long long    unexplained;        /* added by any other operation            */
    long long    worst;              /* the most one such operation added       */
    unsigned long long worst_op;
    size_t       heap_peak;
} soak;

static volatile sig_atomic_t soak_stop;

static void on_signal(int sig)
{
    (void)sig;
    soak_stop = 1;
}

/* The context's grow-only scratch (the prefill Linear's, the batched
 * steps' and the prefill chunks'): it grows with the largest prefill chunk
 * and batch run so far. */
static size_t ctx_scratch(const dsattn_ctx *ctx) { return dsattn_ctx_scratch_bytes(ctx); }

/* Bytes of heap in use: chunks handed out in every arena + mmapped chunks. */
static size_t heap_in_use(void)
{
#if SOAK_HEAP
    const struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
#else
    return 0;
#endif
}

/* How far the heap figures go: 0 not at all (no mallinfo2, or an allocator
 * it does not see - a sanitizer's); 1 freed small chunks held in glibc's
 * per-thread cache still count as in use; 2 exact - the cache is off
 * (GLIBC_TUNABLES, read at the program's start, says so last) - as the
 * run needs for its per-operation checks. */
static int heap_mode(void)
{
    if (!SOAK_HEAP) return 0;
    void *(*volatile alloc)(size_t) = malloc;        /* not a pair the compiler drops */
    const size_t h0 = heap_in_use();
    void *p = alloc(4000);                           /* past the cache's sizes */
    if (!p) return 0;
    const size_t h1 = heap_in_use();
    free(p);
    if (h1 == h0) return 0;
    const char *t = getenv("GLIBC_TUNABLES"), *last = NULL;
    for (const char *q = t; q && (q = strstr(q, "glibc.malloc.tcache_count=")); q++) last = q;
    return last && last[26] == '0' && (last[27] == 0 || last[27] == ':') ? 2 : 1;
}

/* Run this command again with glibc's per-thread cache off
 * (GLIBC_TUNABLES=glibc.malloc.tcache_count=0, read only at a program's
 * start), once; returns when that cannot be done, and the run goes on with
 * inexact heap figures. */
static void reexec_exact(int argc, char **argv)
{
    if (heap_mode() != 1 || getenv("DSATTN_SOAK_REEXEC")) return;
    const char *old = getenv("GLIBC_TUNABLES");
    char *keep = old ? strdup(old) : NULL, val[2048];
    char **av = calloc((size_t)argc + 2, sizeof *av);
    const int w = snprintf(val, sizeof val, "%s%sglibc.malloc.tcache_count=0", old ? old : "",
                           old && *old ? ":" : "");
    if (av && w > 0 && (size_t)w < sizeof val && (!old || keep) &&
        !setenv("DSATTN_SOAK_REEXEC", "1", 1) && !setenv("GLIBC_TUNABLES", val, 1)) {
        av[0] = (char *)"dsattn";
        for (int i = 0; i < argc; i++) av[i + 1] = argv[i];
        fflush(stdout);
        fflush(stderr);
        execv("/proc/self/exe", av);
    }
    if (keep) setenv("GLIBC_TUNABLES", keep, 1);      /* as we found it */
    else unsetenv("GLIBC_TUNABLES");
    free(keep);
    free(av);
}

/* What the OpenMP runtime and glibc make once and keep, made now, before
 * the heap's starting level: every thread the run may use (libgomp's pool)
 * takes its first malloc (glibc makes its arena), and the main thread's
 * own copy of the OpenMP settings, which libgomp allocates at its first
 * omp_set_num_threads (the library calls it around OpenBLAS). */
static void warm_threads(int n)
{
    omp_set_num_threads(omp_get_max_threads());
#pragma omp parallel num_threads(n)
    {
        void *(*volatile alloc)(size_t) = malloc;
        free(alloc(64));
    }
}

static double rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    unsigned long long size = 0, res = 0;
    const int got = fscanf(f, "%llu %llu", &size, &res);
    fclose(f);
    return got == 2 ? (double)res * (double)sysconf(_SC_PAGESIZE) : 0;
}

static uint64_t rnd(soak *S)
{
    uint64_t x = S->rng;
    x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
    S->rng = x;
    return x * 0x2545f4914f6cdd1dull;
}

/* uniform in [0, n), n >= 1 */
static size_t rnd_n(soak *S, size_t n) { return (size_t)(rnd(S) % n); }
static int rnd_p(soak *S, double p) { return (double)(rnd(S) >> 11) * 0x1p-53 < p; }

/* ==== One face over the four structures ================================ */

static dsattn_status seq_make(const model *M, size_t cap, int variant, void **out)
{
    *out = NULL;
    switch (M->f) {
    case F_MHA: return dsattn_mha_seq_create((dsattn_mha_seq **)out, M->m, cap);
    case F_MLA: return dsattn_mla_seq_create((dsattn_mla_seq **)out, M->m, cap,
                                             (dsattn_mla_cache)variant);
    case F_V4:  return dsattn_v4_seq_create((dsattn_v4_seq **)out, M->m, cap,
                                            (dsattn_v4_empty)variant);
    default:    return dsattn_v41_seq_create((dsattn_v41_seq **)out, M->m, cap,
                                             (dsattn_v41_index_k)variant);
    }
}

static void seq_free(fam_t f, void *s)
{
    switch (f) {
    case F_MHA: dsattn_mha_seq_destroy(s); break;
    case F_MLA: dsattn_mla_seq_destroy(s); break;
    case F_V4:  dsattn_v4_seq_destroy(s); break;
    default:    dsattn_v41_seq_destroy(s); break;
    }
}

static int64_t seq_pos(fam_t f, const void *s)
{
    switch (f) {
    case F_MHA: return dsattn_mha_seq_pos(s);
    case F_MLA: return dsattn_mla_seq_pos(s);
    case F_V4:  return dsattn_v4_seq_pos(s);
    default:    return dsattn_v41_seq_pos(s);
    }
}

/* The sequence's bill: its scratch_bytes (decode scratch and the rows its
 * last chunk left). */
static size_t seq_scratch(fam_t f, const void *s)
{
    dsattn_kv_bill b = { 0 };
    switch (f) {
    case F_MHA: dsattn_mha_seq_kv_bill(s, &b); break;
    case F_MLA: dsattn_mla_seq_kv_bill(s, &b); break;
    case F_V4:  dsattn_v4_seq_kv_bill(s, &b); break;
    default:    dsattn_v41_seq_kv_bill(s, &b); break;
    }
    return b.scratch_bytes;
}

/* The stand-in stack over n tokens (MHA / GQA: the library's stand-in loop
 * around its layer forward, as dsattn run does); advances on success.
 * ao (optional, not MHA / GQA): each layer's attention outputs,
 * [n_layers x n x dim]. */
static dsattn_status stack(soak *S, const model *M, void *s, float *h, size_t n, float *ao)
{
    switch (M->f) {
    case F_MHA: return dsattn_cli_mha_stack(S->ctx, s, (size_t)M->n_layers, h, n);
    case F_MLA: return dsattn_mla_stack_forward(S->ctx, s, h, n, NULL, ao);
    case F_V4:  return dsattn_v4_stack_forward(S->ctx, s, h, n, NULL, ao);
    default:    return dsattn_v41_stack_forward(S->ctx, s, h, n, NULL, ao);
    }
}

/* One batched decode step of B sequences (rows of h); advances each on
 * success.  ao as stack's, [n_layers x B x dim]. */
static dsattn_status stack_batch(soak *S, const model *M, void *const *seqs, size_t B, float *h,
                                 size_t *failed, float *ao)
{
    switch (M->f) {
    case F_MHA: {
        dsattn_mha_seq *t[SOAK_POOL + 1];
        for (size_t k = 0; k < B; k++) t[k] = seqs[k];
        return dsattn_cli_mha_stack_batch(S->ctx, t, B, (size_t)M->n_layers, h, S->xio, failed);
    }
    case F_MLA: {
        dsattn_mla_seq *t[SOAK_POOL + 1];
        for (size_t k = 0; k < B; k++) t[k] = seqs[k];
        return dsattn_mla_stack_forward_batch(S->ctx, t, B, h, NULL, ao, failed);
    }
    case F_V4: {
        dsattn_v4_seq *t[SOAK_POOL + 1];
        for (size_t k = 0; k < B; k++) t[k] = seqs[k];
        return dsattn_v4_stack_forward_batch(S->ctx, t, B, h, NULL, ao, failed);
    }
    default: {
        dsattn_v41_seq *t[SOAK_POOL + 1];
        for (size_t k = 0; k < B; k++) t[k] = seqs[k];
        return dsattn_v41_stack_forward_batch(S->ctx, t, B, h, NULL, ao, failed);
    }
    }
}

static dsattn_status seq_save(fam_t f, const void *s, const char *path, char *err, size_t n)
{
    switch (f) {
    case F_MHA: return dsattn_mha_seq_save(s, path, err, n);
    case F_MLA: return dsattn_mla_seq_save(s, path, err, n);
    case F_V4:  return dsattn_v4_seq_save(s, path, err, n);
    default:    return dsattn_v41_seq_save(s, path, err, n);
    }
}

static dsattn_status seq_load(const model *M, const char *path, size_t cap, void **out, char *err,
                              size_t n)
{
    *out = NULL;
    switch (M->f) {
    case F_MHA: return dsattn_mha_seq_load((dsattn_mha_seq **)out, M->m, path, cap, err, n);
    case F_MLA: return dsattn_mla_seq_load((dsattn_mla_seq **)out, M->m, path, cap, err, n);
    case F_V4:  return dsattn_v4_seq_load((dsattn_v4_seq **)out, M->m, path, cap, err, n);
    default:    return dsattn_v41_seq_load((dsattn_v41_seq **)out, M->m, path, cap, err, n);
    }
}

static dsattn_status seq_load_buffer(const model *M, const void *buf, size_t len, size_t cap,
                                     void **out, char *err, size_t n)
{
    *out = NULL;
    switch (M->f) {
    case F_MHA: return dsattn_mha_seq_load_buffer((dsattn_mha_seq **)out, M->m, buf, len, cap,
                                                  err, n);
    case F_MLA: return dsattn_mla_seq_load_buffer((dsattn_mla_seq **)out, M->m, buf, len, cap,
                                                  err, n);
    case F_V4:  return dsattn_v4_seq_load_buffer((dsattn_v4_seq **)out, M->m, buf, len, cap,
                                                 err, n);
    default:    return dsattn_v41_seq_load_buffer((dsattn_v41_seq **)out, M->m, buf, len, cap,
                                                  err, n);
    }
}

static dsattn_status seq_clone(fam_t f, const void *s, void **out)
{
    *out = NULL;
    switch (f) {
    case F_MHA: return dsattn_mha_seq_clone((dsattn_mha_seq **)out, s);
    case F_MLA: return dsattn_mla_seq_clone((dsattn_mla_seq **)out, s);
    case F_V4:  return dsattn_v4_seq_clone((dsattn_v4_seq **)out, s);
    default:    return dsattn_v41_seq_clone((dsattn_v41_seq **)out, s);
    }
}

/* A layer's selection of the last chunk (V3.2, V4's CSA layers, V4.1's
 * index sources); anything else: not OK. */
static dsattn_status seq_sel(fam_t f, const void *s, int l, const int32_t **rows, size_t *nr,
                             size_t *w)
{
    switch (f) {
    case F_MLA: return dsattn_mla_seq_selection(s, l, rows, nr, w);
    case F_V4:  return dsattn_v4_seq_selection(s, l, rows, nr, w);
    case F_V41: return dsattn_v41_seq_selection(s, l, rows, nr, w);
    default:    return DSATTN_ERR_NOT_FOUND;
    }
}

static int cmp_i32(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The first layer whose last-chunk selections differ between a and b as
 * sets of picks per row (V4 keeps them in score order, where a near-tie
 * may only swap two), or -1.  *picks: how many of a's picks b lacks there
 * (all of them when the shapes differ), *width a's width. */
static int first_sel_diff(const model *M, const void *a, const void *b, size_t *picks,
                          size_t *width)
{
    for (int l = 0; l < M->n_layers; l++) {
        const int32_t *ra, *rb;
        size_t na = 0, nb = 0, wa = 0, wb = 0;
        const int oka = seq_sel(M->f, a, l, &ra, &na, &wa) == DSATTN_OK;
        const int okb = seq_sel(M->f, b, l, &rb, &nb, &wb) == DSATTN_OK;
        if (!oka && !okb) continue;
        *width = wa;
        *picks = wa * na;
        if (oka != okb || na != nb || wa != wb) return l;
        if (wa > SOAK_SEL_MAX) {            /* wider than the tiny models' */
            if (memcmp(ra, rb, na * wa * sizeof(int32_t))) return l;
            continue;
        }
        size_t miss = 0;
        for (size_t r = 0; r < na; r++) {
            int32_t x[SOAK_SEL_MAX], y[SOAK_SEL_MAX];
            memcpy(x, ra + r * wa, wa * sizeof(int32_t));
            memcpy(y, rb + r * wa, wa * sizeof(int32_t));
            qsort(x, wa, sizeof(int32_t), cmp_i32);
            qsort(y, wa, sizeof(int32_t), cmp_i32);
            for (size_t i = 0, k = 0; i < wa; i++) {
                while (k < wa && y[k] < x[i]) k++;
                if (k < wa && y[k] == x[i]) k++;
                else miss++;
            }
        }
        if (miss) {
            *picks = miss;
            return l;
        }
    }
    return -1;
}

static dsattn_session_gen session_gen(fam_t f)
{
    static const dsattn_session_gen g[4] = { DSATTN_SESSION_MHA, DSATTN_SESSION_MLA,
                                             DSATTN_SESSION_V4, DSATTN_SESSION_V41 };
    return g[f];
}

/* Sequences of one batch must share this (V4.1: the index_k mode). */
static int batch_key(const model *M, const slot *q) { return M->f == F_V41 ? q->variant : 0; }

static void model_free(model *M)
{
    for (int i = 0; i < M->n_live; i++) seq_free(M->f, M->pool[i].s);
    M->n_live = 0;
    switch (M->f) {
    case F_MHA: dsattn_mha_destroy(M->m); break;
    case F_MLA: dsattn_mla_destroy(M->m); break;
    case F_V4:  dsattn_v4_destroy(M->m); break;
    default:    dsattn_v41_destroy(M->m); break;
    }
    M->m = NULL;
}

/* The model of generation g from cfg (fp8: its weights), written to a
 * temporary file and removed at once. */
static dsattn_status model_create(model *M, const char *cfg, int fp8, uint64_t ws, char *e,
                                  size_t elen)
{
    char path[512];
    if (dsattn_cli_tmp_file(path, sizeof path, "soak", ".json")) {
        snprintf(e, elen, "cannot create a file in %s", dsattn_cli_tmp_root());
        return DSATTN_ERR_IO;
    }
    FILE *f = fopen(path, "w");
    const int wrote = f && fputs(cfg, f) >= 0;
    if (f && fclose(f)) f = NULL;
    if (!f || !wrote) {
        snprintf(e, elen, "cannot write %s", path);
        unlink(path);
        return DSATTN_ERR_IO;
    }
    dsattn_status st;
    switch (M->f) {
    case F_MHA: st = dsattn_mha_create_random((dsattn_mha **)&M->m, path, ws, e, elen); break;
    case F_MLA:
        st = dsattn_mla_create_random((dsattn_mla **)&M->m, path, ws, fp8, e, elen);
        break;
    case F_V4: st = dsattn_v4_create_random((dsattn_v4 **)&M->m, path, ws, fp8, e, elen); break;
    default:
        st = dsattn_v41_create_random((dsattn_v41 **)&M->m, path, ws, fp8, e, elen);
        break;
    }
    unlink(path);
    return st;
}

/* The model of generation g in shape set sh (--shapes random: drawn again
 * while the library refuses the draw's config, at most SOAK_REDRAWS
 * times); its sequence options, each probed once. */
static int model_make(model *M, gen_id g, shapes_id sh, uint64_t seed, char *err, size_t errlen)
{
    memset(M, 0, sizeof *M);
    M->g = g;
    M->f = g <= G_GQA ? F_MHA : g <= G_V32 ? F_MLA : g == G_V4 ? F_V4 : F_V41;
    char e[1024] = "";
    dsattn_status st;
    const uint64_t ws = seed * 7919u + (uint64_t)g;
    for (unsigned attempt = 0;; attempt++) {
        if (sh == SHAPES_RANDOM) {
            random_config(g, seed, attempt, M->config, sizeof M->config, &M->fp8);
        } else {
            snprintf(M->config, sizeof M->config, "%s", shapes_config[sh][g]);
            M->fp8 = shapes_fp8[sh][g];
        }
        e[0] = 0;
        st = model_create(M, M->config, M->fp8, ws, e, sizeof e);
        if (st != DSATTN_ERR_FORMAT || sh != SHAPES_RANDOM || attempt + 1 >= SOAK_REDRAWS) break;
        M->redrawn++;
    }
    if (st) {
        snprintf(err, errlen, "%s model: %s (%s)%s%s", gen_label[g], e, dsattn_status_str(st),
                 sh == SHAPES_RANDOM ? "; the last config drawn: " : "",
                 sh == SHAPES_RANDOM ? M->config : "");
        return -1;
    }
    switch (M->f) {
    case F_MHA:
        M->dim = (size_t)dsattn_mha_dim(M->m);
        M->n_layers = dsattn_mha_n_layers(M->m);
        break;
    case F_MLA:
        M->dim = (size_t)dsattn_mla_dim(M->m);
        M->n_layers = dsattn_mla_n_layers(M->m);
        break;
    case F_V4:
        M->dim = (size_t)dsattn_v4_dim(M->m);
        M->n_layers = dsattn_v4_n_layers(M->m);
        break;
    default:
        M->dim = (size_t)dsattn_v41_dim(M->m);
        M->n_layers = dsattn_v41_n_layers(M->m);
        break;
    }
    /* the options a sequence may take: MLA every cache format the model
     * takes (the FP8 latent rows need their own widths), V4 both
     * all-invalid-row rules, V4.1 both index_k modes */
    const int cand[3] = { 0, 1, 2 };
    const int n_cand = M->f == F_MHA ? 1 : M->f == F_MLA ? 3 : 2;
    for (int i = 0; i < n_cand; i++) {
        void *s = NULL;
        if (seq_make(M, SOAK_CAP_MIN, cand[i], &s) == DSATTN_OK && s)
            M->variant[M->n_variants++] = cand[i];
        if (s) seq_free(M->f, s);
    }
    if (!M->n_variants) {
        snprintf(err, errlen, "%s: no sequence could be made", gen_label[g]);
        return -1;
    }
    return 0;
}

/* ==== Checks ============================================================= */

/* The first failure: operation, generation, sequence, position. */
static void fail(soak *S, const model *M, const slot *q, int64_t pos, const char *fmt, ...)
{
    if (S->failed) return;
    S->failed = 1;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char who[160] = "";
    if (q)
        snprintf(who, sizeof who, ", sequence #%llu (capacity %zu) at position %lld",
                 (unsigned long long)q->uid, q->cap, (long long)pos);
    snprintf(S->what, sizeof S->what, "operation #%llu (%s) on %s%s: %s", S->n_ops + 1,
             op_name[S->cur], M ? gen_label[M->g] : "-", who, msg);
}

static int expect(soak *S, const model *M, const slot *q, int64_t pos, dsattn_status got,
                  dsattn_status want, const char *call, const char *err)
{
    if (got == want) return 1;
    fail(S, M, q, pos, "%s returned %s, expected %s%s%s", call, dsattn_status_str(got),
         dsattn_status_str(want), err && *err ? ": " : "", err ? err : "");
    return 0;
}

static int finite_rows(soak *S, const model *M, const slot *q, int64_t pos, const float *h,
                       size_t rows, const char *call)
{
    for (size_t i = 0; i < rows * M->dim; i++)
        if (!isfinite(h[i])) {
            fail(S, M, q, pos + (int64_t)(i / M->dim), "%s: non-finite output (row %zu, "
                 "element %zu: %g)", call, i / M->dim, i % M->dim, (double)h[i]);
            return 0;
        }
    return 1;
}

static int pos_is(soak *S, const model *M, const slot *q, const void *s, int64_t want,
                  const char *after)
{
    const int64_t p = seq_pos(M->f, s);
    if (p == want) return 1;
    fail(S, M, q, p, "position %lld after %s, expected %lld", (long long)p, after,
         (long long)want);
    return 0;
}

/* got against want (one row): bit for bit, or within a relative L2 of
 * bound when bound > 0.  *n_exact counts the bit-equal rows, *worst the
 * largest relative error. */
static int same_row(soak *S, const model *M, const slot *q, int64_t pos, const float *got,
                    const float *want, double bound, const char *what,
                    unsigned long long *n_exact, double *worst)
{
    if (!memcmp(got, want, M->dim * sizeof(float))) {
        (*n_exact)++;
        return 1;
    }
    double rel, cosine;
    dsattn_bench_rel_cos(got, want, M->dim, &rel, &cosine);
    if (rel > *worst) *worst = rel;
    if (rel <= bound) return 1;
    size_t i = 0;
    while (i < M->dim && !memcmp(&got[i], &want[i], sizeof(float))) i++;
    char b[64] = "bit for bit";
    if (bound > 0) snprintf(b, sizeof b, "bound %.3g", bound);
    fail(S, M, q, pos, "%s: outputs differ (relative L2 %.3g, %s; first at element %zu: %.9g "
         "vs %.9g)", what, rel, b, i, (double)got[i], (double)want[i]);
    return 0;
}

static void input_rows(float *h, const model *M, const slot *q, int64_t pos, size_t n)
{
    for (size_t t = 0; t < n; t++)
        dsattn_cli_input_row(h + t * M->dim, M->dim, q->stream, pos + (int64_t)t);
}

/* The whole file at path into a malloc'd buffer; 0 on success. */
static int read_all(const char *path, unsigned char **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    long n = -1;
    if (!fseek(f, 0, SEEK_END)) n = ftell(f);
    int rc = -1;
    if (n > 0 && !fseek(f, 0, SEEK_SET) && (*buf = malloc((size_t)n)) &&
        fread(*buf, 1, (size_t)n, f) == (size_t)n) {
        *len = (size_t)n;
        rc = 0;
    }
    fclose(f);
    if (rc) {
        free(*buf);
        *buf = NULL;
    }
    return rc;
}

/* Save s to a new temporary file and read it back: bytes in *buf (caller
 * frees), the path left in path (caller removes) or removed when path is
 * NULL.  Checks the status and dsattn_session_info_read's header. */
static int save_bytes(soak *S, const model *M, const slot *q, const void *s, size_t cap,
                      char *path, size_t pathlen, unsigned char **buf, size_t *len)
{
    char own[512], err[1024] = "";
    char *p = path ? path : own;
    const size_t pl = path ? pathlen : sizeof own;
    const int64_t pos = seq_pos(M->f, s);
    *buf = NULL;
    if (dsattn_cli_tmp_file(p, pl, "soak", ".ses")) {
        fail(S, M, q, pos, "cannot create a file in %s", dsattn_cli_tmp_root());
        return 0;
    }
    dsattn_status st = seq_save(M->f, s, p, err, sizeof err);
    int ok = expect(S, M, q, pos, st, DSATTN_OK, "save", err);
    dsattn_session_info info;
    if (ok) {
        st = dsattn_session_info_read(p, &info, err, sizeof err);
        ok = expect(S, M, q, pos, st, DSATTN_OK, "session_info_read", err);
    }
    if (ok && (info.pos != pos || info.capacity != cap || info.generation != session_gen(M->f))) {
        fail(S, M, q, pos, "session header: position %lld, capacity %llu, generation %s; "
             "expected %lld, %zu, %s", (long long)info.pos, (unsigned long long)info.capacity,
             dsattn_session_gen_name(info.generation), (long long)pos, cap,
             dsattn_session_gen_name(session_gen(M->f)));
        ok = 0;
    }
    if (ok && read_all(p, buf, len)) {
        fail(S, M, q, pos, "cannot read back %s", p);
        ok = 0;
    }
    if (!ok || !path) unlink(p);
    if (!ok) {
        free(*buf);
        *buf = NULL;
    }
    return ok;
}

/* ==== The pool ============================================================ */

static slot *pool_add(soak *S, model *M, void *s, size_t cap, int variant, size_t footprint)
{
    slot *q = &M->pool[M->n_live++];
    q->s = s;
    q->uid = ++S->next_uid;
    q->stream = S->seed * 0x100000001b3ull + q->uid;
    q->cap = cap;
    q->variant = variant;
    q->footprint = footprint;
    q->rows = q->slack = 0;
    S->live_bytes += footprint;
    S->n_live++;
    return q;
}

/* Destroy pool slot i: with an exact heap, it must release at least what
 * its making and its last prefill took (more when a prefill that also grew the
 * context's scratch grew it unaccounted). */
static void pool_remove(soak *S, model *M, int i)
{
    slot *q = &M->pool[i];
    const int64_t p = seq_pos(M->f, q->s);
    const size_t h0 = heap_in_use();
    seq_free(M->f, q->s);
    const size_t h1 = heap_in_use(), freed = h0 > h1 ? h0 - h1 : 0;
    if (S->exact && freed + q->slack < q->footprint)
        fail(S, M, q, p, "seq_destroy released %zu B of the heap; its making and prefills took "
             "%zu B", freed, q->footprint);
    S->live_bytes -= q->footprint;
    S->n_live--;
    M->pool[i] = M->pool[--M->n_live];
}

/* A random live slot that passes ok(), or NULL. */
static slot *pick(soak *S, model *M, int (*ok)(const model *, const slot *))
{
    int idx[SOAK_POOL], n = 0;
    for (int i = 0; i < M->n_live; i++)
        if (!ok || ok(M, &M->pool[i])) idx[n++] = i;
    return n ? &M->pool[idx[rnd_n(S, (size_t)n)]] : NULL;
}

static int has_room(const model *M, const slot *q) { return seq_pos(M->f, q->s) < (int64_t)q->cap; }
static int is_full(const model *M, const slot *q) { return seq_pos(M->f, q->s) == (int64_t)q->cap; }
static int at_start(const model *M, const slot *q)
{
    return seq_pos(M->f, q->s) == 0 || (M->f == F_MHA && has_room(M, q));
}

/* A twin (clone or loaded copy) of q: kept in the pool as a fork with
 * inputs of its own when there is room and the coin says so. */
static void keep_or_free(soak *S, model *M, void *t, size_t cap, int variant, size_t footprint)
{
    if (M->n_live < SOAK_POOL && rnd_p(S, 0.5)) pool_add(S, M, t, cap, variant, footprint);
    else seq_free(M->f, t);
}

/* A step frees the rows earlier prefills left in its sequences (their
 * selections, V4.1's runtime slots: include/dsattn.h).  step_begin takes
 * the heap, the context's scratch and each member's bill before the step;
 * step_end gives what the heap gave back to the members whose bill shrank,
 * in proportion to it, within the rows each holds (the split between
 * members is good to a few malloc headers: each gets SOAK_ROWS_SLACK on
 * its destroy check).  When the context's scratch changed in the step the
 * two cannot be told apart: the shrunk bills are taken as given back, and
 * as a bill counts the bytes asked for, not malloc's chunks around them,
 * those members get SOAK_ROWS_SLACK too. */
typedef struct {
    size_t h0, s0, n;
    slot  *q[SOAK_POOL + 1];
    size_t bill[SOAK_POOL + 1];
} step_rec;

static void step_begin(soak *S, const model *M, step_rec *r, slot *const *qs, size_t n)
{
    r->n = n;
    for (size_t k = 0; k < n; k++) {
        r->q[k] = qs[k];
        r->bill[k] = seq_scratch(M->f, qs[k]->s);
    }
    r->h0 = heap_in_use();
    r->s0 = ctx_scratch(S->ctx);
}

static void step_end(soak *S, const model *M, const step_rec *r)
{
    const size_t h1 = heap_in_use();
    const int exact = ctx_scratch(S->ctx) == r->s0;
    size_t shrunk[SOAK_POOL + 1], total = 0, members = 0;
    for (size_t k = 0; k < r->n; k++) {
        const size_t b = seq_scratch(M->f, r->q[k]->s);
        shrunk[k] = r->q[k]->rows && b < r->bill[k] ? r->bill[k] - b : 0;
        total += shrunk[k];
        members += shrunk[k] > 0;
    }
    if (!total) return;
    const size_t freed = h1 < r->h0 ? r->h0 - h1 : 0;
    for (size_t k = 0; k < r->n; k++) {
        if (!shrunk[k]) continue;
        slot *q = r->q[k];
        const size_t share = exact ? (size_t)((double)freed * (double)shrunk[k] / (double)total)
                                   : shrunk[k];
        const size_t d = DSATTN_MIN(share, q->rows);
        q->rows -= d;
        q->footprint -= d;
        S->live_bytes -= d;
        if (members > 1 || !exact) q->slack = SOAK_ROWS_SLACK;
    }
}

/* Feed q and its twin t (capacity tcap) the same next rows: equal outputs. */
static void twin_steps(soak *S, model *M, slot *q, void *t, size_t tcap, const char *what)
{
    const int64_t p = seq_pos(M->f, q->s);
    if (!pos_is(S, M, q, t, p, what)) return;
    const size_t room = DSATTN_MIN(q->cap, tcap) - (size_t)p;
    const size_t want = 1 + rnd_n(S, 3), k = DSATTN_MIN(room, want);
    char call[96];
    for (size_t i = 0; i < k && !S->failed; i++) {
        const int64_t at = p + (int64_t)i;
        input_rows(S->h, M, q, at, 1);
        memcpy(S->h2, S->h, M->dim * sizeof(float));
        snprintf(call, sizeof call, "%s: the original's step", what);
        step_rec r;
        step_begin(S, M, &r, &q, 1);
        const dsattn_status st = stack(S, M, q->s, S->h, 1, NULL);
        step_end(S, M, &r);
        if (!expect(S, M, q, at, st, DSATTN_OK, call, NULL)) return;
        snprintf(call, sizeof call, "%s: the twin's step", what);
        if (!expect(S, M, q, at, stack(S, M, t, S->h2, 1, NULL), DSATTN_OK, call, NULL)) return;
        if (!finite_rows(S, M, q, at, S->h, 1, what) || !finite_rows(S, M, q, at, S->h2, 1, what))
            return;
        snprintf(call, sizeof call, "%s, the twin against the original", what);
        S->twins++;
        if (!same_row(S, M, q, at, S->h2, S->h, 0, call, &S->twins_exact, &S->twin_rel)) return;
    }
}

/* ==== Operations ========================================================= */

static size_t new_cap(soak *S) { return SOAK_CAP_MIN + rnd_n(S, SOAK_CAP_MAX - SOAK_CAP_MIN + 1); }

/* A new sequence of capacity cap and the given option (-1: a random one). */
static slot *op_create(soak *S, model *M, size_t cap, int variant)
{
    if (variant < 0) variant = M->variant[rnd_n(S, (size_t)M->n_variants)];
    void *s = NULL;
    const size_t h0 = heap_in_use();
    const dsattn_status st = seq_make(M, cap, variant, &s);
    const size_t fp = heap_in_use() - h0;
    slot tmp = { 0 };
    tmp.uid = S->next_uid + 1;
    tmp.cap = cap;
    if (!expect(S, M, &tmp, 0, st, DSATTN_OK, "seq_create", NULL) || !s) {
        if (s) seq_free(M->f, s);
        if (!S->failed) fail(S, M, &tmp, 0, "seq_create returned no sequence");
        return NULL;
    }
    slot *q = pool_add(S, M, s, cap, variant, fp);
    return pos_is(S, M, q, s, 0, "seq_create") ? q : NULL;
}

/* A prompt of n tokens at q's position (0 but for MHA / GQA).  V4.1's
 * prompts are sometimes a CED prefill (dsattn_v41_stack_prefill, EXACT or
 * BOUNDED: the stack's output in the last row only); in reference mode an
 * EXACT one is held bit for bit to a clone's full prefill - the last row,
 * then the next steps (docs/v41.md, "CED prefill"). */
static void run_prefill(soak *S, model *M, slot *q, size_t n)
{
    const int64_t p = seq_pos(M->f, q->s);
    dsattn_v41_ced ced = DSATTN_V41_CED_OFF;
    void *twin = NULL;
    if (M->f == F_V41 && p == 0 && n > 1 && rnd_p(S, 0.3)) {
        ced = rnd_p(S, 0.5) ? DSATTN_V41_CED_EXACT : DSATTN_V41_CED_BOUNDED;
        if (ced == DSATTN_V41_CED_EXACT && S->mode == DSATTN_MODE_REFERENCE &&
            !expect(S, M, q, p, seq_clone(M->f, q->s, &twin), DSATTN_OK, "seq_clone", NULL))
            return;
    }
    input_rows(S->h, M, q, p, n);
    /* what a prefill leaves is the sequence's (the chunk's rows) - unless
     * the context's scratch grew too, when it cannot be told apart */
    const size_t h0 = heap_in_use(), s0 = ctx_scratch(S->ctx);
    const dsattn_status st = ced ? dsattn_v41_stack_prefill(S->ctx, q->s, S->h, n, ced, NULL)
                                 : stack(S, M, q->s, S->h, n, NULL);
    const size_t h1 = heap_in_use();
    if (ctx_scratch(S->ctx) == s0) {       /* the rows before, freed or reused, then these */
        const long long d = (long long)h1 - (long long)h0;
        const size_t rows = d < -(long long)q->rows ? 0 : (size_t)((long long)q->rows + d);
        q->footprint = q->footprint - q->rows + rows;
        S->live_bytes = S->live_bytes - q->rows + rows;
        q->rows = rows;
    } else {                               /* taken as gone: see step_end */
        q->footprint -= q->rows;
        S->live_bytes -= q->rows;
        q->rows = 0;
    }
    static const char *const what[3] = { "stack_forward (prefill)",
                                         "stack_prefill (CED exact)",
                                         "stack_prefill (CED bounded)" };
    const size_t last = ced ? n - 1 : 0;
    if (!expect(S, M, q, p, st, DSATTN_OK, what[ced], NULL) ||
        !pos_is(S, M, q, q->s, p + (int64_t)n, what[ced]) ||
        !finite_rows(S, M, q, p + (int64_t)last, S->h + last * M->dim, n - last, what[ced]))
        goto out;
    if (M->f == F_V41) S->ced[ced]++;
    if (twin) {
        input_rows(S->h2, M, q, p, n);
        if (!expect(S, M, q, p, stack(S, M, twin, S->h2, n, NULL), DSATTN_OK,
                    "a full prefill of the CED prefill's twin", NULL))
            goto out;
        S->twins++;
        S->ced_twins++;
        if (same_row(S, M, q, p + (int64_t)last, S->h + last * M->dim, S->h2 + last * M->dim, 0,
                     "a CED exact prefill's last row against a full prefill's",
                     &S->twins_exact, &S->twin_rel))
            twin_steps(S, M, q, twin, q->cap, "after a CED exact prefill");
    }
out:
    if (twin) seq_free(M->f, twin);
}

static void op_prefill(soak *S, model *M)
{
    slot *q = pick(S, M, at_start);
    const size_t room = q->cap - (size_t)seq_pos(M->f, q->s);
    const size_t n = 1 + rnd_n(S, rnd_p(S, 0.1) ? room : DSATTN_MIN(room, (size_t)SOAK_SHORT));
    run_prefill(S, M, q, n);
}

static void run_decode(soak *S, model *M, slot *q)
{
    const int64_t p = seq_pos(M->f, q->s);
    input_rows(S->h, M, q, p, 1);
    step_rec r;
    step_begin(S, M, &r, &q, 1);
    const dsattn_status st = stack(S, M, q->s, S->h, 1, NULL);
    step_end(S, M, &r);
    if (expect(S, M, q, p, st, DSATTN_OK, "stack_forward (decode)", NULL)
        && pos_is(S, M, q, q->s, p + 1, "a decode step"))
        finite_rows(S, M, q, p, S->h, 1, "decode");
}

static void op_decode(soak *S, model *M) { run_decode(S, M, pick(S, M, has_room)); }

/* Fast mode, batch member s (row j of B) against its twin t after the
 * step: 1 when row j is past SOAK_FAST_BOUND and its generation's rows
 * past it are still rare (SOAK_FAST_BOUND's comment; counted), 0 when the
 * row is within the bound (same_row judges it), and 0 with the run failed
 * when such rows come too often. */
static int diverged(soak *S, const model *M, const slot *q, int64_t pos, const void *s,
                    const void *t, size_t B, size_t j)
{
    const size_t dim = M->dim;
    double rel, cosine;
    dsattn_bench_rel_cos(S->h + j * dim, S->h2, dim, &rel, &cosine);
    if (!(rel > SOAK_FAST_BOUND)) return 0;
    int la = M->n_layers;                  /* the first layer past the bound */
    double ra = 0;
    if (M->f != F_MHA)
        for (int l = 0; l < M->n_layers && la == M->n_layers; l++) {
            double c;
            dsattn_bench_rel_cos(S->ao + ((size_t)l * B + j) * dim, S->ao2 + (size_t)l * dim,
                                 dim, &ra, &c);
            if (!(ra <= SOAK_FAST_BOUND)) la = l;
        }
    size_t picks = 0, width = 0;
    const int lf = first_sel_diff(M, s, t, &picks, &width);
    char why[192];
    if (la < M->n_layers)
        snprintf(why, sizeof why, "layer %d's attention outputs first past it (relative L2 "
                 "%.3g)", la, ra);
    else
        snprintf(why, sizeof why, "no layer's attention outputs past it");
    if (lf >= 0)
        snprintf(why + strlen(why), sizeof why - strlen(why), "; the top-k first differs at "
                 "layer %d (%zu of %zu picks)", lf, picks, width);
    else if (M->f != F_MHA)
        snprintf(why + strlen(why), sizeof why - strlen(why), "; every top-k the same");
    /* a pick that went the other way at or before the first layer past it */
    const int flip = lf >= 0 && lf <= la;
    S->div_g[M->g]++;
    S->flip_g[M->g] += (unsigned long long)flip;
    const unsigned long long n = flip ? S->flip_g[M->g] : S->div_g[M->g] - S->flip_g[M->g];
    if (n > SOAK_DIVERGE_FREE + S->brows_g[M->g] / (flip ? SOAK_FLIP_PER : SOAK_DIVERGE_PER)) {
        fail(S, M, q, pos, "a batched row against the same sequence's one-sequence step: "
             "relative L2 %.3g, bound %.3g (%s): %llu of this generation's %llu batched rows "
             "past the bound %s, more than near-ties explain", rel, SOAK_FAST_BOUND, why, n,
             S->brows_g[M->g], flip ? "after a top-k pick that differs" : "with no pick "
             "that differs before");
        return 0;
    }
    S->div_topk += lf >= 0;
    if (rel > S->div_rel) S->div_rel = rel;
    return 1;
}

static void op_batch(soak *S, model *M)
{
    const slot *first = pick(S, M, has_room);
    const int key = batch_key(M, first);
    int idx[SOAK_POOL], n = 0, full = -1;
    for (int i = 0; i < M->n_live; i++) {
        if (batch_key(M, &M->pool[i]) != key) continue;
        if (has_room(M, &M->pool[i])) idx[n++] = i;
        else if (full < 0 || rnd_p(S, 0.5)) full = i;
    }
    for (int i = n - 1; i > 0; i--) {                 /* a random order */
        const int j = (int)rnd_n(S, (size_t)i + 1), t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
    }
    const size_t B = 1 + rnd_n(S, (size_t)n), dim = M->dim;
    void *seqs[SOAK_POOL + 1];
    int64_t pos[SOAK_POOL + 1];
    for (size_t k = 0; k < B; k++) {
        slot *q = &M->pool[idx[k]];
        seqs[k] = q->s;
        pos[k] = seq_pos(M->f, q->s);
        input_rows(S->h + k * dim, M, q, pos[k], 1);
    }
    /* the one-sequence twin of a random member, taken before anything */
    const size_t j = rnd_n(S, B);
    slot *qj = &M->pool[idx[j]];
    void *twin = NULL;
    if (!expect(S, M, qj, pos[j], seq_clone(M->f, qj->s, &twin), DSATTN_OK, "seq_clone", NULL))
        return;
    /* sometimes a full sequence rides along first: the batch is refused
     * (DSATTN_ERR_INVALID_ARG, *failed its index) and nothing changes */
    if (full >= 0 && rnd_p(S, 0.3)) {
        const size_t at = rnd_n(S, B + 1);
        void *bad[SOAK_POOL + 1];
        for (size_t k = 0, u = 0; k <= B; k++) bad[k] = k == at ? M->pool[full].s : seqs[u++];
        float *h = S->h2;
        for (size_t k = 0, u = 0; k <= B; k++)
            memcpy(h + k * dim, k == at ? S->h : S->h + u++ * dim, dim * sizeof(float));
        memcpy(S->h3, h, (B + 1) * dim * sizeof(float));
        size_t failed = SIZE_MAX;
        const slot *qf = &M->pool[full];
        const dsattn_status st = stack_batch(S, M, bad, B + 1, h, &failed, NULL);
        S->refusals++;
        if (!expect(S, M, qf, (int64_t)qf->cap, st, DSATTN_ERR_INVALID_ARG,
                    "stack_forward_batch with a full sequence", NULL))
            goto out;
        if (failed != at) {
            fail(S, M, qf, (int64_t)qf->cap, "a batch refused for its full sequence %zu named "
                 "%zu as the first bad one", at, failed);
            goto out;
        }
        if (memcmp(h, S->h3, (B + 1) * dim * sizeof(float))) {
            fail(S, M, qf, (int64_t)qf->cap, "a refused batch changed its rows");
            goto out;
        }
        if (!pos_is(S, M, qf, qf->s, (int64_t)qf->cap, "a refused batch")) goto out;
        for (size_t k = 0; k < B; k++)
            if (!pos_is(S, M, &M->pool[idx[k]], seqs[k], pos[k], "a refused batch")) goto out;
    }
    {
        size_t failed = SIZE_MAX;
        slot *members[SOAK_POOL + 1];
        for (size_t k = 0; k < B; k++) members[k] = &M->pool[idx[k]];
        step_rec r;
        step_begin(S, M, &r, members, B);
        const dsattn_status st = stack_batch(S, M, seqs, B, S->h, &failed, S->ao);
        step_end(S, M, &r);
        char call[64];
        snprintf(call, sizeof call, "stack_forward_batch of %zu", B);
        if (!expect(S, M, st && failed < B ? &M->pool[idx[failed]] : qj,
                    st && failed < B ? pos[failed] : pos[j], st, DSATTN_OK, call, NULL))
            goto out;
        for (size_t k = 0; k < B; k++) {
            const slot *q = &M->pool[idx[k]];
            if (!pos_is(S, M, q, seqs[k], pos[k] + 1, call) ||
                !finite_rows(S, M, q, pos[k], S->h + k * dim, 1, call))
                goto out;
        }
    }
    /* row j against its twin's one-sequence step */
    input_rows(S->h2, M, qj, pos[j], 1);
    if (!expect(S, M, qj, pos[j], stack(S, M, twin, S->h2, 1, S->ao2), DSATTN_OK,
                "the batch member's one-sequence twin", NULL))
        goto out;
    S->brows++;
    S->brows_g[M->g]++;
    if (S->mode == DSATTN_MODE_FAST && diverged(S, M, qj, pos[j], seqs[j], twin, B, j))
        goto out;
    same_row(S, M, qj, pos[j], S->h + j * dim, S->h2,
             S->mode == DSATTN_MODE_FAST ? SOAK_FAST_BOUND : 0,
             "a batched row against the same sequence's one-sequence step", &S->brows_exact,
             &S->brow_rel);
out:
    seq_free(M->f, twin);
}

/* save + load (from_buffer 0) or save + load_buffer (1). */
static void op_reload(soak *S, model *M, int from_buffer)
{
    slot *q = pick(S, M, NULL);
    const int64_t p = seq_pos(M->f, q->s);
    char path[512], err[1024] = "";
    unsigned char *a = NULL, *b = NULL;
    size_t alen = 0, blen = 0;
    void *t = NULL;
    if (!save_bytes(S, M, q, q->s, q->cap, from_buffer ? NULL : path, sizeof path, &a, &alen))
        return;
    dsattn_status st;
    /* refusals: too small a capacity; a truncated or damaged buffer */
    if (p >= 2 && rnd_p(S, 0.25)) {
        st = from_buffer ? seq_load_buffer(M, a, alen, (size_t)p - 1, &t, err, sizeof err)
                         : seq_load(M, path, (size_t)p - 1, &t, err, sizeof err);
        S->refusals++;
        if (!expect(S, M, q, p, st, DSATTN_ERR_INVALID_ARG, "a load into a capacity below the "
                    "position", err))
            goto out;
        if (t) { fail(S, M, q, p, "a refused load returned a sequence"); goto out; }
    }
    if (from_buffer && rnd_p(S, 0.25)) {
        unsigned char *c = malloc(alen);
        if (!c) { fail(S, M, q, p, "out of memory"); goto out; }
        memcpy(c, a, alen);
        const size_t at = rnd_n(S, alen);
        const int trunc = rnd_p(S, 0.5);
        if (!trunc) c[at] ^= (unsigned char)(1u << rnd_n(S, 8));
        st = seq_load_buffer(M, c, trunc ? at : alen, 0, &t, err, sizeof err);
        free(c);
        S->refusals++;
        char call[96];
        snprintf(call, sizeof call, trunc ? "load_buffer of the first %zu of %zu bytes"
                                          : "load_buffer with a bit flipped in byte %zu of %zu",
                 at, alen);
        /* a length of 0 is a count of 0 (dsattn.h); any other damage a
         * malformed session */
        if (!expect(S, M, q, p, st, trunc && !at ? DSATTN_ERR_INVALID_ARG : DSATTN_ERR_FORMAT,
                    call, err))
            goto out;
        if (t) { fail(S, M, q, p, "%s returned a sequence", call); goto out; }
    }
    const size_t cap = rnd_p(S, 0.5) ? 0 : q->cap + rnd_n(S, SOAK_LOAD_MAX - q->cap + 1);
    const size_t tcap = cap ? cap : q->cap;
    const size_t h0 = heap_in_use();
    st = from_buffer ? seq_load_buffer(M, a, alen, cap, &t, err, sizeof err)
                     : seq_load(M, path, cap, &t, err, sizeof err);
    const size_t fp = heap_in_use() - h0;
    if (!expect(S, M, q, p, st, DSATTN_OK, from_buffer ? "load_buffer" : "load", err)) goto out;
    if (!t) { fail(S, M, q, p, "a load returned no sequence"); goto out; }
    if (!pos_is(S, M, q, t, p, "a load")) goto out;
    /* the same capacity: saving the loaded sequence gives the same bytes */
    if (tcap == q->cap) {
        if (!save_bytes(S, M, q, t, tcap, NULL, 0, &b, &blen)) goto out;
        if (blen != alen || memcmp(a, b, alen)) {
            fail(S, M, q, p, "the loaded sequence saves to other bytes (%zu vs %zu)", blen, alen);
            goto out;
        }
    }
    twin_steps(S, M, q, t, tcap, from_buffer ? "load_buffer" : "load");
    if (!S->failed) {
        const int variant = q->variant;
        if (rnd_p(S, 0.3)) pool_remove(S, M, (int)(q - M->pool));   /* the copy replaces it */
        keep_or_free(S, M, t, tcap, variant, fp);
        t = NULL;
    }
out:
    if (t) seq_free(M->f, t);
    if (!from_buffer) unlink(path);
    free(a);
    free(b);
}

static void op_clone(soak *S, model *M)
{
    slot *q = pick(S, M, NULL);
    const int64_t p = seq_pos(M->f, q->s);
    void *t = NULL;
    unsigned char *a = NULL, *b = NULL;
    size_t alen = 0, blen = 0;
    const size_t h0 = heap_in_use();
    const dsattn_status st = seq_clone(M->f, q->s, &t);
    const size_t fp = heap_in_use() - h0;
    if (!expect(S, M, q, p, st, DSATTN_OK, "seq_clone", NULL)) goto out;
    if (!t) { fail(S, M, q, p, "seq_clone returned no sequence"); goto out; }
    if (!pos_is(S, M, q, t, p, "seq_clone")) goto out;
    if (rnd_p(S, 0.25)) {                  /* the clone saves to the original's bytes */
        if (!save_bytes(S, M, q, q->s, q->cap, NULL, 0, &a, &alen) ||
            !save_bytes(S, M, q, t, q->cap, NULL, 0, &b, &blen))
            goto out;
        if (alen != blen || memcmp(a, b, alen)) {
            fail(S, M, q, p, "the clone saves to other bytes than its original");
            goto out;
        }
    }
    twin_steps(S, M, q, t, q->cap, "clone");
    if (!S->failed) {
        keep_or_free(S, M, t, q->cap, q->variant, fp);
        t = NULL;
    }
out:
    if (t) seq_free(M->f, t);
    free(a);
    free(b);
}

/* A full sequence q refuses one more token and is left as it was: its
 * session bytes equal a clone's taken before; a load with more room
 * continues from its position. */
static void refuse_full(soak *S, model *M, slot *q)
{
    const int64_t p = seq_pos(M->f, q->s);
    void *c = NULL, *t = NULL;
    unsigned char *a = NULL, *b = NULL;
    size_t alen = 0, blen = 0;
    char err[1024] = "";
    if (!expect(S, M, q, p, seq_clone(M->f, q->s, &c), DSATTN_OK, "seq_clone", NULL)) goto out;
    input_rows(S->h, M, q, p, 1);
    memcpy(S->h2, S->h, M->dim * sizeof(float));
    S->refusals++;
    if (!expect(S, M, q, p, stack(S, M, q->s, S->h, 1, NULL), DSATTN_ERR_INVALID_ARG,
                "stack_forward past the capacity", NULL))
        goto out;
    if (memcmp(S->h, S->h2, M->dim * sizeof(float))) {
        fail(S, M, q, p, "a refused step changed its rows");
        goto out;
    }
    if (!pos_is(S, M, q, q->s, p, "a refused step")) goto out;
    if (!save_bytes(S, M, q, c, q->cap, NULL, 0, &a, &alen) ||
        !save_bytes(S, M, q, q->s, q->cap, NULL, 0, &b, &blen))
        goto out;
    if (alen != blen || memcmp(a, b, alen)) {
        fail(S, M, q, p, "a refused step changed the sequence (its session differs from a "
             "clone taken before)");
        goto out;
    }
    const size_t cap = q->cap + 1 + rnd_n(S, 8);
    if (!expect(S, M, q, p, seq_load_buffer(M, b, blen, cap, &t, err, sizeof err), DSATTN_OK,
                "load_buffer with more room", err))
        goto out;
    input_rows(S->h, M, q, p, 1);
    if (expect(S, M, q, p, stack(S, M, t, S->h, 1, NULL), DSATTN_OK,
               "the step after the refused one, with more room", NULL))
        finite_rows(S, M, q, p, S->h, 1, "the step after the refused one");
out:
    if (c) seq_free(M->f, c);
    if (t) seq_free(M->f, t);
    free(a);
    free(b);
}

/* A chunk longer than the room left (at position 0; MHA / GQA anywhere)
 * is refused and changes nothing; the sequence then takes one token. */
static void refuse_chunk(soak *S, model *M, slot *q)
{
    const int64_t p = seq_pos(M->f, q->s);
    const size_t n = q->cap - (size_t)p + 1 + rnd_n(S, 4);
    input_rows(S->h, M, q, p, n);
    memcpy(S->h2, S->h, n * M->dim * sizeof(float));
    S->refusals++;
    if (!expect(S, M, q, p, stack(S, M, q->s, S->h, n, NULL), DSATTN_ERR_INVALID_ARG,
                "stack_forward of more tokens than the room left", NULL))
        return;
    if (memcmp(S->h, S->h2, n * M->dim * sizeof(float))) {
        fail(S, M, q, p, "a refused chunk of %zu changed its rows", n);
        return;
    }
    if (pos_is(S, M, q, q->s, p, "a refused chunk")) run_decode(S, M, q);
}

static void op_overflow(soak *S, model *M)
{
    slot *q = pick(S, M, is_full);
    if (q && rnd_p(S, 0.6)) { refuse_full(S, M, q); return; }
    if ((q = pick(S, M, at_start))) { refuse_chunk(S, M, q); return; }
    if (!(q = pick(S, M, is_full))) {
        /* none full: a new short sequence (in place of a random one when the
         * pool is full), filled up first */
        if (M->n_live == SOAK_POOL) pool_remove(S, M, (int)rnd_n(S, SOAK_POOL));
        if (!(q = op_create(S, M, SOAK_CAP_MIN + rnd_n(S, 17), -1))) return;
        run_prefill(S, M, q, q->cap);
        if (S->failed) return;
    }
    if (!S->failed) refuse_full(S, M, q);
}

/* ==== Pipeline stages ====================================================== */
/* A sequence may hold only some layers (dsattn_*_seq_create_layers: one
 * pipeline stage's caches; V4.1's layers share theirs, so it has none).
 * op_stages makes a sequence of every layer and two stages that split its
 * layers at a random point, [0, k) and [k, L), in the same cache format,
 * and feeds each layer the same rows (bf16, a stream of the group's own)
 * through dsattn_*_attn_forward on the whole sequence and on the stage
 * holding the layer: a prompt at position 0, then single tokens (MHA / GQA:
 * sometimes a chunk of a few).  The stage's outputs must be the whole
 * sequence's bit for bit, in both modes: the same kernels on the same
 * bytes.  Between chunks a stage may be replaced by its clone or by its
 * session loaded back with more room, which must carry on the same; a stage
 * must refuse a layer it does not hold (alone and in a batch, whose
 * *failed names it), leaving its position as it was, and a stage range
 * past the model or of no layers is refused at creation.  The group lives
 * within the operation: nothing of it joins the pool. */

static dsattn_status stage_make(const model *M, size_t cap, int variant, int first, int n,
                                void **out)
{
    *out = NULL;
    switch (M->f) {
    case F_MHA: return dsattn_mha_seq_create_layers((dsattn_mha_seq **)out, M->m, cap, first, n);
    case F_MLA: return dsattn_mla_seq_create_layers((dsattn_mla_seq **)out, M->m, cap,
                                                    (dsattn_mla_cache)variant, first, n);
    case F_V4:  return dsattn_v4_seq_create_layers((dsattn_v4_seq **)out, M->m, cap,
                                                   (dsattn_v4_empty)variant, first, n);
    default:    return DSATTN_ERR_UNSUPPORTED;
    }
}

static dsattn_status layer_fwd(soak *S, const model *M, void *s, int l, const float *x, size_t n,
                               float *out)
{
    switch (M->f) {
    case F_MHA: return dsattn_mha_attn_forward(S->ctx, s, l, x, n, out);
    case F_MLA: return dsattn_mla_attn_forward(S->ctx, s, l, x, n, out);
    case F_V4:  return dsattn_v4_attn_forward(S->ctx, s, l, x, n, out);
    default:    return DSATTN_ERR_UNSUPPORTED;
    }
}

static dsattn_status layer_fwd_batch(soak *S, const model *M, void *const *seqs, size_t B, int l,
                                     const float *x, float *out, size_t *failed)
{
    switch (M->f) {
    case F_MHA: return dsattn_mha_attn_forward_batch(S->ctx, (dsattn_mha_seq *const *)seqs, B,
                                                     l, x, out, failed);
    case F_MLA: return dsattn_mla_attn_forward_batch(S->ctx, (dsattn_mla_seq *const *)seqs, B,
                                                     l, x, out, failed);
    case F_V4:  return dsattn_v4_attn_forward_batch(S->ctx, (dsattn_v4_seq *const *)seqs, B, l,
                                                    x, out, failed);
    default:    return DSATTN_ERR_UNSUPPORTED;
    }
}

static dsattn_status seq_adv(const model *M, void *s, size_t n)
{
    switch (M->f) {
    case F_MHA: return dsattn_mha_seq_advance(s, n);
    case F_MLA: return dsattn_mla_seq_advance(s, n);
    case F_V4:  return dsattn_v4_seq_advance(s, n);
    default:    return dsattn_v41_seq_advance(s, n);
    }
}

/* Layer l's rows of the group's stream at positions pos.., as bf16 values
 * (a layer's input is its normalised residual in bf16) */
static void stage_rows(float *x, const model *M, uint64_t stream, int l, int64_t pos, size_t n)
{
    for (size_t t = 0; t < n; t++) {
        float *r = x + t * M->dim;
        dsattn_cli_input_row(r, M->dim, stream + 0x9e3779b97f4a7c15ull * (uint64_t)(l + 1),
                             pos + (int64_t)t);
        for (size_t i = 0; i < M->dim; i++) r[i] = dsattn_round_bf16(r[i]);
    }
}

/* Stage st (of [0, k) / [k, L)) refuses a layer it does not hold - alone,
 * and as member 1 of a batch after the whole sequence - and keeps its
 * position. */
static int stage_refuses(soak *S, const model *M, const slot *g, void *whole, void *st,
                         int layer, int64_t p)
{
    char call[96];
    stage_rows(S->h, M, g->stream, layer, p, 1);
    snprintf(call, sizeof call, "attn_forward of layer %d on a stage without it", layer);
    if (!expect(S, M, g, p, layer_fwd(S, M, st, layer, S->h, 1, S->h3), DSATTN_ERR_INVALID_ARG,
                call, NULL))
        return 0;
    void *both[2] = { whole, st };
    memcpy(S->h + M->dim, S->h, M->dim * sizeof(float));
    size_t failed = 0;
    snprintf(call, sizeof call, "attn_forward_batch of layer %d with a stage without it", layer);
    if (!expect(S, M, g, p, layer_fwd_batch(S, M, both, 2, layer, S->h, S->h3, &failed),
                DSATTN_ERR_INVALID_ARG, call, NULL))
        return 0;
    if (failed != 1) {
        fail(S, M, g, p, "%s: *failed = %zu, expected 1 (the stage)", call, failed);
        return 0;
    }
    S->refusals += 2;
    return pos_is(S, M, g, st, p, "a refused layer") && pos_is(S, M, g, whole, p, "a refused batch");
}

/* Stage *st replaced by its clone or its session loaded back with more
 * room (*cap grows); 0 on a failure (reported). */
static int stage_copy(soak *S, const model *M, slot *g, void **st, size_t *cap, int64_t p)
{
    void *t = NULL;
    if (rnd_p(S, 0.5)) {
        if (!expect(S, M, g, p, seq_clone(M->f, *st, &t), DSATTN_OK, "seq_clone of a stage", NULL))
            return 0;
    } else {
        unsigned char *buf = NULL;
        size_t len = 0;
        char err[1024] = "";
        if (!save_bytes(S, M, g, *st, *cap, NULL, 0, &buf, &len)) return 0;
        const size_t cap2 = *cap + rnd_n(S, 9);
        const dsattn_status rc = seq_load_buffer(M, buf, len, cap2, &t, err, sizeof err);
        free(buf);
        if (!expect(S, M, g, p, rc, DSATTN_OK, "load_buffer of a stage's session", err)) {
            if (t) seq_free(M->f, t);
            return 0;
        }
        *cap = cap2;
    }
    if (!t) {
        fail(S, M, g, p, "a stage's clone or load returned no sequence");
        return 0;
    }
    seq_free(M->f, *st);
    *st = t;
    S->stage_copies++;
    return pos_is(S, M, g, t, p, "a stage's clone or load");
}

static void op_stages(soak *S, model *M)
{
    const int L = M->n_layers, k = 1 + (int)rnd_n(S, (size_t)(L - 1));
    const int variant = M->variant[rnd_n(S, (size_t)M->n_variants)];
    slot g = { 0 };                        /* names the group in reports */
    g.uid = ++S->next_uid;
    g.stream = S->seed * 0x100000001b3ull + g.uid;
    g.cap = SOAK_CAP_MIN + rnd_n(S, 57);
    size_t cap_st[2] = { g.cap, g.cap };
    void *whole = NULL, *st[2] = { NULL, NULL }, *bad = NULL;
    if (!expect(S, M, &g, 0, seq_make(M, g.cap, variant, &whole), DSATTN_OK, "seq_create", NULL) ||
        !expect(S, M, &g, 0, stage_make(M, g.cap, variant, 0, k, &st[0]), DSATTN_OK,
                "seq_create_layers (first stage)", NULL) ||
        !expect(S, M, &g, 0, stage_make(M, g.cap, variant, k, L - k, &st[1]), DSATTN_OK,
                "seq_create_layers (second stage)", NULL))
        goto out;
    if (rnd_p(S, 0.25)) {                  /* ranges past the model, or empty */
        const int bf[3] = { k, -1, 0 }, bn[3] = { L - k + 1, 1, 0 };
        for (int i = 0; i < 3; i++) {
            if (!expect(S, M, &g, 0, stage_make(M, g.cap, variant, bf[i], bn[i], &bad),
                        DSATTN_ERR_INVALID_ARG, "seq_create_layers of a range it cannot hold",
                        NULL))
                goto out;
            if (bad) { fail(S, M, &g, 0, "a refused seq_create_layers returned a sequence"); goto out; }
            S->refusals++;
        }
    }
    S->stage_groups++;
    int64_t p = 0;
    const size_t steps = 1 + rnd_n(S, 8);
    for (size_t c = 0; c <= steps && !S->failed; c++) {
        const size_t room = DSATTN_MIN(DSATTN_MIN(cap_st[0], cap_st[1]), g.cap) - (size_t)p;
        if (!room) break;
        size_t n = 1;
        if (c == 0) n = 1 + rnd_n(S, DSATTN_MIN(room, (size_t)SOAK_SHORT));
        else if (M->f == F_MHA && rnd_p(S, 0.3)) n = 1 + rnd_n(S, DSATTN_MIN(room, (size_t)4));
        if (c > 0 && rnd_p(S, 0.2)) {
            const int s = (int)rnd_n(S, 2);
            if (!stage_refuses(S, M, &g, whole, st[s], s ? k - 1 : k, p)) goto out;
        }
        if (c > 0 && rnd_p(S, 0.2)) {
            const int s = (int)rnd_n(S, 2);
            if (!stage_copy(S, M, &g, &st[s], &cap_st[s], p)) goto out;
        }
        for (int l = 0; l < L; l++) {
            char call[96];
            stage_rows(S->h, M, g.stream, l, p, n);
            snprintf(call, sizeof call, "attn_forward of layer %d, the whole sequence", l);
            if (!expect(S, M, &g, p, layer_fwd(S, M, whole, l, S->h, n, S->h2), DSATTN_OK, call,
                        NULL))
                goto out;
            snprintf(call, sizeof call, "attn_forward of layer %d, its stage", l);
            if (!expect(S, M, &g, p, layer_fwd(S, M, st[l >= k], l, S->h, n, S->h3), DSATTN_OK,
                        call, NULL) ||
                !finite_rows(S, M, &g, p, S->h2, n, call))
                goto out;
            snprintf(call, sizeof call, "layer %d of a stage [%d, %d) against the whole sequence",
                     l, l >= k ? k : 0, l >= k ? L : k);
            double worst = 0;              /* bound 0: any difference fails */
            for (size_t t = 0; t < n; t++) {
                S->stage_rows++;
                if (!same_row(S, M, &g, p + (int64_t)t, S->h3 + t * M->dim, S->h2 + t * M->dim,
                              0, call, &S->stage_exact, &worst))
                    goto out;
            }
        }
        void *all[3] = { whole, st[0], st[1] };
        for (int i = 0; i < 3; i++)
            if (!expect(S, M, &g, p, seq_adv(M, all[i], n), DSATTN_OK, "seq_advance", NULL) ||
                !pos_is(S, M, &g, all[i], p + (int64_t)n, "seq_advance"))
                goto out;
        p += (int64_t)n;
    }
out:
    if (bad) seq_free(M->f, bad);
    for (int i = 0; i < 2; i++)
        if (st[i]) seq_free(M->f, st[i]);
    if (whole) seq_free(M->f, whole);
}

/* ==== The schedule ======================================================= */

static int can(const model *M, op_kind k)
{
    int room = 0, start = 0;
    for (int i = 0; i < M->n_live; i++) {
        room += has_room(M, &M->pool[i]);
        start += at_start(M, &M->pool[i]);
    }
    switch (k) {
    case OP_CREATE:   return M->n_live < SOAK_POOL;
    case OP_PREFILL:  return start > 0;
    case OP_DECODE:   case OP_BATCH: return room > 0;
    case OP_OVERFLOW: return 1;
    case OP_STAGES:   return M->f != F_V41 && M->n_layers >= 2;
    default:          return M->n_live > 0;
    }
}

static op_kind choose(soak *S, const model *M)
{
    double w[OP_COUNT] = { 3, 3, 6, 4, 1.5, 1.5, 1.5, 2, 1, 1 };
    if (M->n_live < 3) w[OP_CREATE] = 8;
    if (M->n_live >= SOAK_POOL - 1) w[OP_DESTROY] = 4;
    double total = 0;
    for (int k = 0; k < OP_COUNT; k++) total += can(M, (op_kind)k) ? w[k] : (w[k] = 0);
    double r = (double)(rnd(S) >> 11) * 0x1p-53 * total;
    for (int k = 0; k < OP_COUNT; k++) {
        if (r < w[k]) return (op_kind)k;
        r -= w[k];
    }
    return OP_OVERFLOW;
}

/* After each operation: the heap beside the live sequences (heap in use
 * minus what their making and prefills took) may grow only in an operation
 * that grew the context's scratch; anything else it gains is memory no
 * live object accounts for.  Exact heap: past SOAK_HEAP_SLACK over the run
 * (one-time allocations: a thread's first malloc makes its arena), a
 * failure at the operation that crossed it. */
static void heap_account(soak *S, const model *M)
{
    if (!S->heapm || S->failed) return;
    const size_t h = heap_in_use(), scr = ctx_scratch(S->ctx);
    if (h > S->heap_peak) S->heap_peak = h;
    const long long over = (long long)h - (long long)S->live_bytes, d = over - S->over_prev;
    S->over_prev = over;
    if (scr != S->scratch_seen) {
        S->scratch_seen = scr;
        S->scratch_growth += d;
        return;
    }
    if (d <= 0) return;          /* a destroy released growth its account missed */
    S->unexplained += d;
    if (d > S->worst) {
        S->worst = d;
        S->worst_op = S->n_ops + 1;
    }
    if (S->exact && S->unexplained > (long long)SOAK_HEAP_SLACK)
        fail(S, M, NULL, 0, "the heap beside the live sequences has grown by %lld B over the "
             "run, %lld B of it in this operation: memory no live sequence, model or context "
             "scratch holds (allowance for one-time allocations: %zu KiB)", S->unexplained, d,
             SOAK_HEAP_SLACK >> 10);
}

static void run_op(soak *S, model *M, op_kind k)
{
    S->cur = k;
    switch (k) {
    case OP_CREATE:   op_create(S, M, new_cap(S), -1); break;
    case OP_PREFILL:  op_prefill(S, M); break;
    case OP_DECODE:   op_decode(S, M); break;
    case OP_BATCH:    op_batch(S, M); break;
    case OP_SAVE:     op_reload(S, M, 0); break;
    case OP_LOADBUF:  op_reload(S, M, 1); break;
    case OP_CLONE:    op_clone(S, M); break;
    case OP_DESTROY:  pool_remove(S, M, (int)rnd_n(S, (size_t)M->n_live)); break;
    case OP_STAGES:   op_stages(S, M); break;
    default:          op_overflow(S, M); break;
    }
    heap_account(S, M);
    S->ops[k]++;
    S->n_ops++;
}

static void report(const soak *S, double elapsed)
{
    char b1[32], b2[32];
    printf("[%8.1f s] ops %llu:", elapsed, S->n_ops);
    for (int k = 0; k < OP_COUNT; k++) printf(" %s %llu", op_name[k], S->ops[k]);
    printf(" | live %d | heap %s | rss %s\n", S->n_live, dsattn_cli_mib((double)heap_in_use(), b1, sizeof b1),
           dsattn_cli_mib(rss_bytes(), b2, sizeof b2));
    fflush(stdout);
}

/* ==== The command ======================================================== */

static void soak_usage(FILE *f)
{
    fprintf(f,
        "usage: dsattn soak [--seconds S] [--seed N] [--threads T] [--mode fast|reference]\n"
        "                   [--gens mha,gqa,v3,v32,v4,v41] [--shapes tiny|odd|random]\n"
        "                   [--report-every S]\n\n"
        "A long-run check of this machine, for minutes or days: one tiny random model per\n"
        "generation and one context run a seeded random schedule over up to 12 live\n"
        "sequences per model - create (capacity 8..600), prefill (V4.1: sometimes CED\n"
        "exact or bounded), decode, a batched decode of a random subset, save + load,\n"
        "load_buffer, clone, destroy, a push past the capacity, and pipeline stages (two\n"
        "sequences of some layers beside one of every layer; not V4.1).  Each operation\n"
        "checks its status, the positions and finite outputs; that a refused call changes\n"
        "nothing; that a clone or a reloaded session fed the same inputs as its original\n"
        "gives the same outputs, bit for bit (and in reference mode a CED exact prefill a\n"
        "full prefill's); that a stage's layers give the whole sequence's outputs, bit for\n"
        "bit; that a batched row equals the same sequence's own step (bit for\n"
        "bit in reference mode, within a relative 5e-2 in fast mode, whose batched kernels\n"
        "sum in another order, or past it in rare rows where a near-tie downstream - a\n"
        "top-k pick, a rounding - went the other way: more than 3 + 1 in 10 of a\n"
        "generation's batched rows after a pick that differs, or 3 + 1 in 100 without\n"
        "one, fail);\n"
        "and that the heap beside the live sequences grows only with the context's\n"
        "grow-only scratch (glibc's mallinfo2, made exact by running again with\n"
        "GLIBC_TUNABLES=glibc.malloc.tcache_count=0; DSATTN_SOAK_REEXEC=1 skips that).\n"
        "A line every S seconds: operations by kind, live sequences, heap in use, RSS.  At\n"
        "the end everything is destroyed and the heap in use must be back at its level\n"
        "before the context and the first model, within 64 KiB.  Exit 0 with a PASS line;\n"
        "1 with the first failure (operation number, generation, sequence, position: the\n"
        "same command reproduces it).  Ctrl-C ends the run early, with the end checks.\n\n"
        "options:\n"
        "  --seconds S          how long the schedule runs (default 60)\n"
        "  --seed N             the schedule, weights and inputs (default 1)\n"
        "  --threads T          threads (default: OpenMP's)\n"
        "  --mode fast|reference  arithmetic (default fast)\n"
        "  --gens LIST          generations, comma-separated (default all:\n"
        "                       mha,gqa,v3,v32,v4,v41)\n"
        "  --shapes tiny|odd|random  the models' shapes: tiny (default: dims 256, 3 to\n"
        "                       12 layers, FP8 weights where released), odd (odd head\n"
        "                       counts and dims, GQA groups of 3, V3 without a query\n"
        "                       LoRA, output ranks no tile divides: the kernels' tails\n"
        "                       and fallbacks) or random (each model's config - widths,\n"
        "                       heads, ranks, windows, top-k, V4 / V4.1 layer plans,\n"
        "                       bf16 or FP8 weights - drawn from --seed and printed)\n"
        "  --report-every S     seconds between report lines (default 10)\n");
}

static int parse_gens(const char *v, int *on)
{
    char buf[256];
    if (strlen(v) >= sizeof buf) return -1;
    strcpy(buf, v);
    memset(on, 0, G_COUNT * sizeof *on);
    int n = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int g = 0;
        while (g < G_COUNT && strcmp(t, gen_key[g])) g++;
        if (g == G_COUNT || on[g]) return -1;
        on[g] = 1;
        n++;
    }
    return n ? 0 : -1;
}

DSATTN_CMD(soak, 45, "long-run check: random operations on every generation, outputs and heap checked")
static int cmd_soak(int argc, char **argv)
{
    double seconds = 60, every = 10, ran = 0;
    uint64_t seed = 1;
    int threads = 0, rc, on[G_COUNT] = { 1, 1, 1, 1, 1, 1 };
    shapes_id shapes = SHAPES_TINY;
    dsattn_mode mode = DSATTN_MODE_FAST;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { soak_usage(stdout); return 0; }
        if (!v) { fprintf(stderr, "dsattn soak: %s needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "--seconds")) {
            if ((rc = dsattn_cli_double("soak", a, v, 1, 1e9, &seconds))) return rc;
        } else if (!strcmp(a, "--report-every")) {
            if ((rc = dsattn_cli_double("soak", a, v, 0.1, 1e9, &every))) return rc;
        } else if (!strcmp(a, "--seed")) {
            if ((rc = dsattn_cli_u64("soak", a, v, &seed))) return rc;
        } else if (!strcmp(a, "--threads")) {
            if ((rc = dsattn_cli_i32("soak", a, v, 1, DSATTN_CLI_MAX_THREADS, 0, &threads)))
                return rc;
        } else if (!strcmp(a, "--mode") && !strcmp(v, "fast")) mode = DSATTN_MODE_FAST;
        else if (!strcmp(a, "--mode") && !strcmp(v, "reference")) mode = DSATTN_MODE_REFERENCE;
        else if (!strcmp(a, "--shapes") && !strcmp(v, "tiny")) shapes = SHAPES_TINY;
        else if (!strcmp(a, "--shapes") && !strcmp(v, "odd")) shapes = SHAPES_ODD;
        else if (!strcmp(a, "--shapes") && !strcmp(v, "random")) shapes = SHAPES_RANDOM;
        else if (!strcmp(a, "--gens")) {
            if (parse_gens(v, on)) {
                fprintf(stderr, "dsattn soak: --gens '%s': a comma list of mha, gqa, v3, v32, "
                                "v4, v41, each once\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "dsattn soak: bad option %s %s\n", a, v);
            soak_usage(stderr);
            return 2;
        }
    }
    reexec_exact(argc, argv);
    /* a file-size limit (ulimit -f) makes a save fail with an I/O error,
     * reported, instead of killing the process */
    signal(SIGXFSZ, SIG_IGN);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;          /* a save in progress finishes */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    soak *S = calloc(1, sizeof *S);
    if (!S) { fprintf(stderr, "dsattn soak: out of memory\n"); return 1; }
    S->mode = mode;
    S->seed = seed;
    S->rng = seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
    char gens[64] = "", b1[32], b2[32], b3[32];
    for (int g = 0; g < G_COUNT; g++)
        if (on[g]) snprintf(gens + strlen(gens), sizeof gens - strlen(gens), "%s%s",
                            gens[0] ? "," : "", gen_key[g]);
    printf("dsattn soak: %s, %s shapes, %s mode, seed %llu, %g s, a report every %g s\n", gens,
           shapes_key[shapes], mode == DSATTN_MODE_FAST ? "fast" : "reference",
           (unsigned long long)seed, seconds, every);
    fflush(stdout);

    warm_threads(DSATTN_MAX(threads, omp_get_max_threads()));
    S->heapm = heap_mode();
    S->exact = S->heapm == 2;
    const size_t heap0 = heap_in_use();                /* before the context and models */
    size_t heap_models = heap0;                        /* with them */
    char err[4096] = "";
    rc = 1;
    dsattn_ctx_params p = dsattn_ctx_default_params();
    p.mode = mode;
    p.n_threads = threads;
    dsattn_status st = dsattn_ctx_create(&S->ctx, &p);
    if (st) {
        fprintf(stderr, "dsattn soak: context: %s\n", dsattn_status_str(st));
        goto out;
    }
    size_t dim = 0;
    for (int g = 0; g < G_COUNT; g++) {
        if (!on[g]) continue;
        if (model_make(&S->mod[S->n_mod], (gen_id)g, shapes, seed, err, sizeof err)) {
            fprintf(stderr, "dsattn soak: %s\n", err);
            goto out;
        }
        dim = DSATTN_MAX(dim, S->mod[S->n_mod].dim);
        S->n_mod++;
    }
    size_t nl = 0;
    for (int i = 0; i < S->n_mod; i++) nl = DSATTN_MAX(nl, (size_t)S->mod[i].n_layers);
    if (!(S->h = malloc(3 * (size_t)SOAK_ROWS * dim * sizeof(float))) ||
        !(S->xio = malloc(2 * (size_t)(SOAK_POOL + 1) * dim * sizeof(float))) ||
        !(S->ao = malloc(nl * (size_t)(SOAK_POOL + 2) * dim * sizeof(float)))) {
        fprintf(stderr, "dsattn soak: out of memory\n");
        goto out;
    }
    S->h2 = S->h + (size_t)SOAK_ROWS * dim;
    S->h3 = S->h2 + (size_t)SOAK_ROWS * dim;
    S->ao2 = S->ao + nl * (size_t)(SOAK_POOL + 1) * dim;
    printf("  isa %s, %d threads; models:", dsattn_ctx_isa_name(S->ctx),
           dsattn_ctx_threads(S->ctx));
    for (int i = 0; i < S->n_mod; i++)
        printf("%s %s (%d layers, dim %zu)", i ? "," : "", gen_label[S->mod[i].g],
               S->mod[i].n_layers, S->mod[i].dim);
    for (int i = 0; shapes == SHAPES_RANDOM && i < S->n_mod; i++) {
        const model *M = &S->mod[i];
        printf("\n  %s (%s weights; %d draw%s refused): %s", gen_key[M->g],
               M->f == F_MHA || !M->fp8 ? "bf16" : "FP8", M->redrawn, M->redrawn == 1 ? "" : "s",
               M->config);
    }
    printf("\n  heap in use before the context and models: %s (%s)\n",
           dsattn_cli_mib((double)heap0, b1, sizeof b1),
           !S->heapm ? "not measured: needs glibc's allocator and mallinfo2"
           : S->exact ? "mallinfo2, glibc's per-thread cache off: exact"
                      : "mallinfo2, glibc's per-thread cache on: within its cached chunks");
    fflush(stdout);

    S->scratch_seen = ctx_scratch(S->ctx);
    S->over_prev = (long long)heap_in_use();
    heap_models = heap_in_use();
    const double t0 = dsattn_bench_now();
    double next = every, el = 0, reported = -1;
    while (!S->failed && !soak_stop && el < seconds) {
        model *M = &S->mod[rnd_n(S, (size_t)S->n_mod)];
        const op_kind k = choose(S, M);
        const double ts = dsattn_bench_now();
        run_op(S, M, k);
        el = dsattn_bench_now() - t0;
        S->op_s[k] += el - (ts - t0);
        if (el >= next || el >= seconds || S->failed || soak_stop) {
            report(S, el);
            reported = el;
            while (next <= el) next += every;
        }
    }
    if (reported != el) report(S, el);
    if (soak_stop) printf("stopped by a signal after %.1f s\n", el);
    ran = dsattn_bench_now() - t0;
    rc = S->failed;
out:;
    /* everything destroyed, then the heap against its level before */
    unsigned long long live_end = (unsigned long long)S->n_live;
    for (int i = 0; i < S->n_mod; i++) model_free(&S->mod[i]);
    dsattn_ctx_destroy(S->ctx);
    S->ctx = NULL;
    free(S->h);
    free(S->xio);
    free(S->ao);
    S->h = S->xio = S->ao = S->ao2 = NULL;
    const size_t heap1 = heap_in_use();
    if (rc && !S->failed) {              /* the set-up failed: said above */
        free(S);
        return 1;
    }
    if (S->failed) {
        fprintf(stderr, "dsattn soak: FAIL: %s\n  (seed %llu, %s mode, --gens %s, --shapes %s: "
                "the same command reproduces it)\n", S->what, (unsigned long long)seed,
                mode == DSATTN_MODE_FAST ? "fast" : "reference", gens, shapes_key[shapes]);
        free(S);
        return 1;
    }
    const long long back = (long long)heap1 - (long long)heap0;
    const size_t slack = S->exact ? SOAK_HEAP_SLACK : SOAK_HEAP_SLACK_CACHED;
    char heapmsg[96] = "heap not measured";
    if (S->heapm) snprintf(heapmsg, sizeof heapmsg, "heap back to %+lld B of its start", back);
    printf("\n%llu operations in %.1f s, %llu sequences live at the end; seconds by kind:",
           S->n_ops, ran, live_end);
    for (int k = 0; k < OP_COUNT; k++) printf(" %s %.1f", op_name[k], S->op_s[k]);
    printf("\ntwins (clone, load, load_buffer) fed the same inputs as their original: %llu rows, "
           "%llu bit-identical", S->twins, S->twins_exact);
    if (S->twins > S->twins_exact) printf(" (largest relative L2 %.3g)", S->twin_rel);
    printf("\nbatched rows against the same sequence's one-sequence step: %llu, %llu "
           "bit-identical", S->brows, S->brows_exact);
    if (S->brows > S->brows_exact) printf(" (largest relative L2 %.3g)", S->brow_rel);
    unsigned long long div = 0;
    for (int g = 0; g < G_COUNT; g++) div += S->div_g[g];
    if (div) {
        printf("; %llu past the bound (a near-tie downstream went the other way; %llu with a "
               "top-k that differs; largest relative L2 %.3g):", div, S->div_topk, S->div_rel);
        for (int g = 0; g < G_COUNT; g++)
            if (S->div_g[g])
                printf(" %s %llu of %llu", gen_key[g], S->div_g[g], S->brows_g[g]);
    }
    if (S->stage_groups)
        printf("\npipeline stages (two sequences of some layers) against a sequence of every "
               "layer: %llu groups, %llu rows, %llu bit-identical; %llu stages carried on as a "
               "clone or a reloaded session", S->stage_groups, S->stage_rows, S->stage_exact,
               S->stage_copies);
    if (S->ced[DSATTN_V41_CED_EXACT] + S->ced[DSATTN_V41_CED_BOUNDED])
        printf("\nV4.1 prompts by CED mode: off %llu, exact %llu (%llu held to a full prefill, "
               "bit for bit), bounded %llu", S->ced[0], S->ced[1], S->ced_twins, S->ced[2]);
    printf("\nrefused calls checked (past capacity, a full sequence in a batch, too small a load "
           "capacity, a damaged session buffer): %llu\n", S->refusals);
    if (S->heapm) {
        printf("heap in use: %s before the context and models, %s with them, peak %s, %+lld B "
               "after everything was destroyed (slack %zu KiB)\n",
               dsattn_cli_mib((double)heap0, b1, sizeof b1),
               dsattn_cli_mib((double)heap_models, b2, sizeof b2), dsattn_cli_mib((double)S->heap_peak, b3, sizeof b3),
               back, slack >> 10);
        printf("heap beside the live sequences: %+lld B over the run outside the context's "
               "grow-only scratch (largest %+lld B, operation #%llu; allowance %zu KiB%s), the "
               "scratch %+lld B\n", S->unexplained, S->worst, S->worst_op, SOAK_HEAP_SLACK >> 10,
               S->exact ? "" : ", not checked: inexact figures", S->scratch_growth);
    } else {
        printf("heap in use: not measured (needs glibc's allocator and mallinfo2)\n");
    }
    if (S->heapm && back > (long long)slack) {
        fprintf(stderr, "dsattn soak: FAIL: the heap in use after every sequence, model and the "
                "context were destroyed is %lld B above its level before them (slack %zu KiB)\n",
                back, slack >> 10);
        free(S);
        return 1;
    }
    printf("dsattn soak: PASS: %llu operations in %.0f s on %s (%s shapes, %s mode, seed %llu): "
           "every status, output, twin and refusal as promised; %s\n", S->n_ops, ran, gens,
           shapes_key[shapes], mode == DSATTN_MODE_FAST ? "fast" : "reference",
           (unsigned long long)seed, heapmsg);
    free(S);
    return 0;
}
