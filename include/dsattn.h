/* dsattn.h - public API of dsattn, DeepSeek's seven attention generations in C.
 *
 * Object model
 * ------------
 *   dsattn_ctx     threads + the kernel table (scalar reference, AVX2, AVX-512 or
 *                  NEON), the arithmetic mode and grow-only scratch (prefill
 *                  Linear, batched steps, prefill chunks): one context per
 *                  thread that calls into dsattn at the same time.  A context in
 *                  DSATTN_MODE_REFERENCE follows the bit-reproducible arithmetic
 *                  contract of the golden cases (products accumulated in double,
 *                  rounded once; no FMA contraction; lower index wins ties).
 *                  DSATTN_MODE_FAST uses SIMD kernels that accumulate in fp32.
 *   dsattn_v41     one DeepSeek-V4.1 (CSA2) attention stack: weights (borrowed
 *                  from a mapped checkpoint, or owned: random or converted),
 *                  the layer plan and,
 *                  per sequence, a dsattn_v41_seq holding the packed caches and
 *                  the four-slot shared attention runtime.  Two sequences of
 *                  the same stack run side by side: nothing is process-global.
 *
 * Every fallible call returns dsattn_status; the library never exits, aborts
 * or prints on bad input.  An allocation of 64 MiB or more (caches, weights,
 * a long prompt's scratch) that exceeds the memory the system has available
 * (its MemAvailable, and a cgroup v1 or v2 memory limit's headroom;
 * $DSATTN_MEM_AVAILABLE in bytes overrides both) fails with DSATTN_ERR_NOMEM
 * before it is touched, where Linux's overcommit would have let it through
 * and killed the process as the library zeroed it.  A NULL object or output pointer, a layer out of
 * range, a count of 0 or a position or count past the sequence's capacity
 * is DSATTN_ERR_INVALID_ARG, with nothing changed (seq_advance included:
 * a sequence never holds more tokens than its capacity).  Accessors that
 * return a number give -1 for a NULL object or a layer out of range
 * (dsattn_v4_layer_kind: DSATTN_V4_NONE); those returning a size_t, and the yes/no ones
 * (has_weights, ctx_amx), give 0, dsattn_mla_softmax_scale NaN, and the
 * context's dsattn_ctx_threads 0 and dsattn_ctx_mode DSATTN_MODE_FAST.
 * Whoever creates an object destroys it, and destroy(NULL) is a no-op.
 * Error detail text, where offered, goes to a caller buffer (char *err,
 * size_t errlen).
 *
 * A decode step allocates nothing: each sequence sizes its scratch when it
 * is created, from its capacity and the threads a context may run
 * (OpenMP's maximum, at least the processor count; a context with more
 * threads than that, or a prefill chunk, may allocate).  The bill's
 * scratch_bytes reports it.  What a prefill chunk needs beyond that scratch
 * is borrowed for the call (from the context's grow-only scratch,
 * dsattn_ctx_scratch_bytes, or heap memory freed before the call returns),
 * so the sequences of a context share one chunk's worth.  The rows a long
 * chunk leaves for later layers and for *_seq_selection (its top-k
 * selections in V3.2, V4 and V4.1 - chunk tokens x index_topk indices a
 * selecting layer - and V4.1's top-k and candidate slots) live until the
 * sequence's next step, which frees them (a free, not an allocation);
 * scratch_bytes counts them while they are held.
 *
 * The generation-specific entry points live in the sections below, one per
 * structure (MHA/GQA, MLA, DSA, CSA/HCA, CSA2).
 */
#ifndef DSATTN_H
#define DSATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#if defined(__GNUC__)
#pragma GCC visibility push(default)  /* the exported API: see CMakeLists.txt */
#endif

#define DSATTN_VERSION_MAJOR 0
#define DSATTN_VERSION_MINOR 1
#define DSATTN_VERSION_PATCH 0

/* ==== Status ============================================================ */

typedef enum {
    DSATTN_OK               =  0,
    DSATTN_ERR_INVALID_ARG  = -1,  /* a caller argument is out of its domain  */
    DSATTN_ERR_NOMEM        = -2,
    DSATTN_ERR_UNSUPPORTED  = -3,  /* valid request, no implementation        */
    DSATTN_ERR_FORMAT       = -4,  /* malformed file / bytes / config         */
    DSATTN_ERR_OVERFLOW     = -5,  /* size arithmetic would overflow          */
    DSATTN_ERR_IO           = -6,  /* open/read/write/mmap failed             */
    DSATTN_ERR_NOT_FOUND    = -7,  /* a named tensor / key is missing         */
} dsattn_status;

const char *dsattn_status_str(dsattn_status s);
const char *dsattn_version(void);

/* ==== Context =========================================================== */

typedef enum {
    DSATTN_MODE_FAST      = 0,     /* SIMD + threads, fp32 accumulation       */
    DSATTN_MODE_REFERENCE = 1,     /* scalar, double accumulation, bit-exact  */
} dsattn_mode;

typedef enum {
    DSATTN_ISA_AUTO   = 0,         /* best the CPU has, or $DSATTN_ISA        */
    DSATTN_ISA_REF    = 1,
    DSATTN_ISA_AVX2   = 2,
    DSATTN_ISA_AVX512 = 3,
    DSATTN_ISA_NEON   = 4,         /* aarch64 builds: ARMv8.0 Advanced SIMD   */
} dsattn_isa;

/* The most threads a context takes (more is DSATTN_ERR_INVALID_ARG: OpenMP
 * would exit the process when it cannot start them). */
#define DSATTN_MAX_THREADS 1024

typedef struct {
    dsattn_mode mode;              /* REFERENCE forces the scalar kernels     */
    dsattn_isa  isa;               /* AUTO: from cpuid, overridable by env    */
    int         n_threads;         /* <= 0: OpenMP default; <= MAX_THREADS    */
} dsattn_ctx_params;

typedef struct dsattn_ctx dsattn_ctx;

dsattn_ctx_params dsattn_ctx_default_params(void);
dsattn_status dsattn_ctx_create(dsattn_ctx **out, const dsattn_ctx_params *p);
void          dsattn_ctx_destroy(dsattn_ctx *ctx);
/* The ISA the context actually runs ("ref", "avx2", "avx512", "neon"). */
const char   *dsattn_ctx_isa_name(const dsattn_ctx *ctx);
dsattn_mode   dsattn_ctx_mode(const dsattn_ctx *ctx);
int           dsattn_ctx_threads(const dsattn_ctx *ctx);
/* Bytes of grow-only scratch the context holds: the prefill Linear's, the
 * batched steps' rows and the prefill chunks' (a sequence keeps only what a
 * decode step needs; a longer chunk borrows the rest from its context).
 * It grows to the largest call made on the context and is freed by
 * dsattn_ctx_destroy.  0 for NULL. */
size_t        dsattn_ctx_scratch_bytes(const dsattn_ctx *ctx);
/* AMX-BF16 tiles (fast mode, avx512 table, where the CPU and OS offer
 * them; $DSATTN_AMX=0 turns them off at creation).  They run the V3
 * absorbed attention over the bf16 latent cache, the V3.2 indexer's logits,
 * the V4 / V4.1 sparse attention and the prefill Linear, on operands that
 * are bf16 numbers.  set_amx(ctx, 0) turns
 * them off, set_amx(ctx, 1) on where possible; both return the new state. */
int           dsattn_ctx_amx(const dsattn_ctx *ctx);
int           dsattn_ctx_set_amx(dsattn_ctx *ctx, int on);

/* Work counters: every kernel adds the FLOPs it performed and the bytes it
 * read (weights, caches, activations) so tools print a measured bill. */
typedef struct {
    uint64_t flops;
    uint64_t bytes_read;
} dsattn_counters;

void dsattn_ctx_counters_reset(dsattn_ctx *ctx);
dsattn_counters dsattn_ctx_counters(const dsattn_ctx *ctx);

/* Where a step's time goes: wall seconds, bytes read and FLOPs per phase
 * of the attention forward (V4, V4.1, V3 / V3.2 MLA), and how much of each
 * phase was weight projections (dsattn_linear).  Off by default (two clock
 * reads per phase and per projection when on); reset with the counters.
 * Time outside the phases (norms and residual of the stand-in stack, the
 * MHA/GQA forward) is not attributed; projections there count as OTHER. */
typedef enum {
    DSATTN_PHASE_QUERY = 0,        /* wq_a, q_norm, wq_b, RoPE (MLA: + W_uk)  */
    DSATTN_PHASE_KV,               /* the token's own KV: wkv / wkv_a, norm,
                                    * RoPE, the window row or latent written */
    DSATTN_PHASE_COMPRESS,         /* compressor(s), packed cache entries     */
    DSATTN_PHASE_INDEX,            /* indexer query, scores, pool, top-k      */
    DSATTN_PHASE_ATTN,             /* attention over the cache / picks        */
    DSATTN_PHASE_OUTPUT,           /* inverse RoPE, wo_a, wo_b (MLA: W_uv, wo) */
    DSATTN_PHASE_OTHER,
    DSATTN_PHASE_COUNT
} dsattn_phase;

typedef struct {
    double   seconds[DSATTN_PHASE_COUNT];       /* wall time in the phase   */
    double   proj_seconds[DSATTN_PHASE_COUNT];  /* of which dsattn_linear   */
    uint64_t bytes_read[DSATTN_PHASE_COUNT];    /* the kernels' counters    */
    uint64_t flops[DSATTN_PHASE_COUNT];
    uint64_t proj_flops[DSATTN_PHASE_COUNT];    /* of which dsattn_linear   */
} dsattn_profile;

void           dsattn_ctx_set_profiling(dsattn_ctx *ctx, int on);
dsattn_profile dsattn_ctx_profile(const dsattn_ctx *ctx);
const char    *dsattn_phase_name(dsattn_phase p);   /* "query", "kv", ... */

/* The KV bill of one sequence, measured from its live allocations, the same
 * struct for every generation: global (context-proportional) cache bytes
 * per token = bytes allocated / token capacity; the rest of what the
 * sequence holds separately: sliding windows, compressor state, and the
 * decode scratch sized at creation (so that a decode step allocates
 * nothing; part of it grows with the capacity, e.g. a score per key). */
typedef struct {
    double global_bytes_per_token;
    size_t global_bytes_allocated;
    size_t window_bytes;          /* all layers' sliding-window rings      */
    size_t state_bytes;           /* compressor / overlap fp32 state       */
    size_t scratch_bytes;         /* decode scratch and runtime buffers    */
} dsattn_kv_bill;

/* ==== Sessions ========================================================== */
/*
 * Every generation's sequence saves to a session file and loads back from
 * it (dsattn_<gen>_seq_save / _seq_load / _seq_load_buffer), and clones in
 * memory (dsattn_<gen>_seq_clone): a prefix shared by two continuations.
 * A session holds everything the next step reads - the packed caches as
 * stored, the sliding-window rings, the compressor state of an incomplete
 * group, the runtime slots that carry across steps - and the position;
 * per-chunk observations (the last chunk's selection, which layer read
 * what) are not state and start empty in a loaded or cloned sequence.
 * Saving is atomic (a temporary file in the same folder, fsync, rename,
 * fsync of the folder); loading validates the whole file (magic, format,
 * generation, model config and weight-shape hashes, every section's length
 * and checksum, the whole-file checksum) before it creates the sequence,
 * and fails with the file and the section named.  A loaded sequence may
 * get a larger capacity (max_seq_len) than the saved one; 0 keeps the
 * saved capacity.  Format: docs/sessions.md.
 */
typedef enum {
    DSATTN_SESSION_MHA = 1,
    DSATTN_SESSION_MLA = 2,
    DSATTN_SESSION_V4  = 3,
    DSATTN_SESSION_V41 = 4,
} dsattn_session_gen;

typedef struct {
    unsigned           format;           /* session format version          */
    char               lib_version[16];  /* dsattn_version() of the writer  */
    dsattn_session_gen generation;
    uint32_t           variant[2];       /* the sequence's options (docs)   */
    uint32_t           n_sections;
    uint64_t           config_hash, shapes_hash;
    int64_t            pos;              /* tokens consumed                 */
    uint64_t           capacity;         /* max_seq_len when saved          */
    uint64_t           file_bytes;
} dsattn_session_info;

/* Read and fully validate a session file's header, sections and checksums
 * (not against a model). */
dsattn_status dsattn_session_info_read(const char *path, dsattn_session_info *info,
                                       char *err, size_t errlen);
/* "mha", "mla", "v4", "v41". */
const char *dsattn_session_gen_name(dsattn_session_gen g);

/* ==== CSA2: DeepSeek-V4.1 (Flash) ======================================= */
/*
 * A dsattn_v41 is the attention part of a V4.1 model: config, layer plan and
 * weights.  A dsattn_v41_seq is one sequence over it: the packed caches
 * (window 528 B rows, compressed KV 288 B, index keys 68 B at real size),
 * the compressor state and the shared attention runtime (compress_kv,
 * index_k, topk_idxs, candidates).
 *
 * Layer modes come from the config (Attention.__init__): ratio 0 -> SWA;
 * ratio > 0 and a KV source -> FULL; an index source that is not a KV
 * source -> REINDEX; any other ratio > 0 layer -> REUSE (reads the current
 * compressed cache and top-k rows of its sources).
 *
 * Calling protocol (the reference's): for each chunk, call
 * dsattn_v41_attn_forward for every layer 0..n_layers-1 in order with that
 * layer's normalised input, then dsattn_v41_seq_advance.  The first chunk
 * may be a prefill of n >= 1 tokens at position 0; every later chunk is one
 * token (the reference supports no chunked prefill).
 * dsattn_v41_stack_forward runs the golden-case stand-in block
 * h += attn_l(bf16(RMSNorm_l(h))) over all layers and advances.
 */

typedef enum {
    DSATTN_V41_SWA     = 0,
    DSATTN_V41_FULL    = 1,
    DSATTN_V41_REINDEX = 2,
    DSATTN_V41_REUSE   = 3,
    DSATTN_V41_MTP     = 4,   /* DSpark / MTP layers past n_layers: reported,
                                 not run by the attention stack            */
} dsattn_v41_mode;

/* The reference's index_k quirk (docs/semantics.md §7.7): on decode
 * steps where a ratio-2 group is still filling, the official code's owners
 * score against whichever index_k was published last (layer 20's).
 * OWNER (default): each owner always scores and publishes its own keys, as
 * the code's comment and every serving engine intend.  REFERENCE: replay
 * the stale-slot behaviour bit for bit (where the stale keys are a coarser
 * owner's, fewer than the reader's entries, the rest score 0: the official
 * code's zero-initialised buffer, docs/semantics.md §7.7). */
typedef enum {
    DSATTN_V41_INDEX_K_OWNER     = 0,
    DSATTN_V41_INDEX_K_REFERENCE = 1,
} dsattn_v41_index_k;

typedef struct dsattn_v41     dsattn_v41;
typedef struct dsattn_v41_seq dsattn_v41_seq;

/* Load from a config.json and a safetensors file with the official
 * inference names (layers.{i}.attn.*, layers.{i}.attn_norm.weight).
 * The file is memory-mapped; weights are borrowed from the mapping. */
dsattn_status dsattn_v41_load(dsattn_v41 **out, const char *config_json,
                              const char *weights, char *err, size_t errlen);
/* Random weights from a seed at the config's dims (fp8 != 0: FP8 in the
 * config's weight blocks, 32 x 32 unless weight_block_size says otherwise,
 * as the released checkpoint; else bf16; the compressors of ratio 2+ fp32
 * either way). */
dsattn_status dsattn_v41_create_random(dsattn_v41 **out, const char *config_json,
                                       uint64_t seed, int fp8, char *err,
                                       size_t errlen);
/* Config and plan only, no weights: enough to create sequences, measure
 * the KV bill and inspect the plan; forward returns DSATTN_ERR_UNSUPPORTED. */
dsattn_status dsattn_v41_load_config(dsattn_v41 **out, const char *config_json,
                                     char *err, size_t errlen);
void dsattn_v41_destroy(dsattn_v41 *m);

int             dsattn_v41_n_layers(const dsattn_v41 *m);
int             dsattn_v41_dim(const dsattn_v41 *m);
dsattn_v41_mode dsattn_v41_layer_mode(const dsattn_v41 *m, int layer);
int             dsattn_v41_layer_ratio(const dsattn_v41 *m, int layer);
/* The plan's sources of a compressed layer (-1 for SWA layers and out of
 * range): the KV source whose compressed cache it reads (itself for Full
 * layers) and the index source whose top-k rows it attends (itself for
 * Full / Reindex layers).  dsattn_v41_seq_source_read / _topk_read report
 * what a sequence actually read. */
int             dsattn_v41_layer_kv_source(const dsattn_v41 *m, int layer);
int             dsattn_v41_layer_topk_source(const dsattn_v41 *m, int layer);
/* Bytes of weights the stack holds (all layers, as stored). */
size_t          dsattn_v41_weight_bytes(const dsattn_v41 *m);

dsattn_status dsattn_v41_seq_create(dsattn_v41_seq **out, const dsattn_v41 *m,
                                    size_t max_seq_len, dsattn_v41_index_k mode);
void dsattn_v41_seq_destroy(dsattn_v41_seq *s);
int64_t dsattn_v41_seq_pos(const dsattn_v41_seq *s);

/* x: [n, dim] the layer's normalised input (bf16 values); out: [n, dim]. */
dsattn_status dsattn_v41_attn_forward(dsattn_ctx *ctx, dsattn_v41_seq *s,
                                      int layer, const float *x, size_t n,
                                      float *out);
dsattn_status dsattn_v41_seq_advance(dsattn_v41_seq *s, size_t n);

/* Golden-case stand-in stack over all layers; h: [n, dim] fp32 residual,
 * updated in place.  attn_in/attn_out (optional, [n_layers, n, dim]). */
dsattn_status dsattn_v41_stack_forward(dsattn_ctx *ctx, dsattn_v41_seq *s,
                                       float *h, size_t n, float *attn_in,
                                       float *attn_out);

/* Batched decode: one token for each of n_seqs sequences in one call, the
 * weights streamed once for all of them (a serving loop's step).
 * x, out: [n_seqs, dim] row-major, row i the token of seqs[i], which may
 * be at any position - its first token (position 0) or deep in its
 * context, mid compressor group or not.  The sequences must be distinct,
 * of the same model and the same index_k mode, each with room for one
 * more token.  The result of row i is that of dsattn_v41_attn_forward on
 * seqs[i] alone: bit for bit in reference mode; in fast mode within the
 * fast path's bounds (up to 16 rows run the multi-token GEMV - on AMX
 * contexts up to 7 -, from 4 rows the bf16-dot GEMM where the CPU has
 * AVX512-BF16, more rows the tiled Linear).  Every sequence is checked
 * before anything is written: on an error (an allocation failure inside
 * the step excepted) nothing has changed in any sequence or in out, and
 * *failed (if not NULL) is the
 * index of the first bad sequence, or SIZE_MAX when the error is not one
 * sequence's (a NULL argument, n_seqs 0, a layer out of range).  The
 * caller advances every sequence after the last layer, as with one.
 * The B-row buffers are the context's (they grow to the largest batch it
 * has run), so a steady batched step allocates nothing. */
dsattn_status dsattn_v41_attn_forward_batch(dsattn_ctx *ctx, dsattn_v41_seq *const *seqs,
                                            size_t n_seqs, int layer, const float *x,
                                            float *out, size_t *failed);
/* The stand-in stack over the batch: h [n_seqs, dim] updated in place,
 * attn_in / attn_out (optional) [n_layers, n_seqs, dim]; advances every
 * sequence by one token. */
dsattn_status dsattn_v41_stack_forward_batch(dsattn_ctx *ctx, dsattn_v41_seq *const *seqs,
                                             size_t n_seqs, float *h, float *attn_in,
                                             float *attn_out, size_t *failed);

/* ---- CED prefill (docs/v41.md "CED prefill") -----------------------------
 * A prompt at position 0 need not run every layer over every token: the
 * last KV source S and the layers before it take every row (S's compressor
 * and index keys read all of them), a layer after S carries only its window
 * ring into decode.  EXACT: each layer after S runs over the rows its window
 * reaches back from the rows the next layer needs (the prompt's last token
 * for the last layer); the decode that follows and the last token's output
 * equal a full prefill's bit for bit in reference mode.  BOUNDED: every layer
 * after S sees only the last window_size prompt tokens (an approximation,
 * measured in docs/v41.md).  OFF: every layer, every row. */
typedef enum {
    DSATTN_V41_CED_OFF     = 0,
    DSATTN_V41_CED_EXACT   = 1,
    DSATTN_V41_CED_BOUNDED = 2,
} dsattn_v41_ced;

/* Rows a layer needs for a prompt of n tokens: its input for positions
 * [in_first, n), its attention output for [out_first, n).  A full model
 * runs the block (attention + FFN/MoE) of layer l for rows [out_first, n)
 * only; out_first of layer l is in_first of layer l + 1. */
typedef struct {
    size_t in_first, out_first;
} dsattn_v41_ced_rows;

/* rows: [n_layers]. */
dsattn_status dsattn_v41_ced_plan(const dsattn_v41 *m, size_t n, dsattn_v41_ced mode,
                                  dsattn_v41_ced_rows *rows);
/* Layer-rows of a prefill in that mode, summed over the layers: inputs
 * (window KV / compressor rows) and outputs (query, attention, output
 * projection rows).  Either pointer may be NULL. */
dsattn_status dsattn_v41_ced_work(const dsattn_v41 *m, size_t n, dsattn_v41_ced mode,
                                  uint64_t *in_rows, uint64_t *out_rows);
/* The layer forward over rows [first, first + n) of a prompt chunk at
 * position 0 that ends at first + n (x: [n, dim]), with outputs for rows
 * [first + out_first, first + n) only (out: [n - out_first, dim]).  The
 * sequence must be at position 0; a KV-source layer needs first == 0.  Call
 * it for every layer in order with the rows dsattn_v41_ced_plan gives (the
 * same chunk end each time), then dsattn_v41_seq_advance(s, chunk end). */
dsattn_status dsattn_v41_attn_forward_rows(dsattn_ctx *ctx, dsattn_v41_seq *s, int layer,
                                           const float *x, size_t n, size_t first,
                                           size_t out_first, float *out);
/* The stand-in stack of dsattn_v41_stack_forward over a prompt of n tokens
 * at position 0, in a CED mode (OFF: dsattn_v41_stack_forward itself).  In
 * EXACT / BOUNDED mode only h's last row is the stack's output (the rows
 * before hold partial sums).  attn_out (optional, [n_layers, n, dim]): each
 * layer's outputs, 0 on the rows the mode skips.  Advances by n. */
dsattn_status dsattn_v41_stack_prefill(dsattn_ctx *ctx, dsattn_v41_seq *s, float *h, size_t n,
                                       dsattn_v41_ced mode, float *attn_out);

/* The last chunk's own top-k selection of an index-source layer, as
 * compressed-entry indices j ascending, -1 padded: rows x width. */
dsattn_status dsattn_v41_seq_selection(const dsattn_v41_seq *s, int layer,
                                       const int32_t **rows, size_t *n_rows,
                                       size_t *width);
/* Which layer's compressed cache / index keys the layer read last chunk
 * (-1 if none): Reuse layers must name their source. */
int dsattn_v41_seq_source_read(const dsattn_v41_seq *s, int layer);
int dsattn_v41_seq_index_read(const dsattn_v41_seq *s, int layer);
/* The index source whose top-k rows (the runtime's topk_idxs slot) the
 * layer attended last chunk: itself for Full / Reindex layers. */
int dsattn_v41_seq_topk_read(const dsattn_v41_seq *s, int layer);

/* Packed cache contents of a layer: which = 0 window ring [w rows],
 * 1 compressed KV [entries written], 2 index keys [entries written]. */
dsattn_status dsattn_v41_seq_cache(const dsattn_v41_seq *s, int layer, int which,
                                   const uint8_t **rows, size_t *n_rows,
                                   size_t *row_bytes);

/* The bill, measured from the live allocations: global KV bytes per token
 * (compressed + index caches of every source, / max_seq_len), and the
 * bounded per-sequence window state in bytes. */
dsattn_status dsattn_v41_seq_kv_bill(const dsattn_v41_seq *s, dsattn_kv_bill *b);

/*
 * The decode scratch (the kv_bill's scratch_bytes) a sequence of capacity
 * max_seq_len would allocate, without creating one (the bill's
 * per-sequence column at a context no cache could be made for); 0 for a
 * NULL model, SIZE_MAX when the size overflows. */
size_t dsattn_v41_seq_scratch_at(const dsattn_v41 *m, size_t max_seq_len);

/* Fill the caches as if `depth` tokens had been consumed, with random valid
 * packed entries (benchmarks at 1M context).  Sets the position to depth;
 * the index-key slot is left as a prefill of depth tokens in one chunk
 * leaves it (so a decode step in either index_k mode can follow), the
 * other runtime slots as a decode step expects them. */
dsattn_status dsattn_v41_seq_fill_synthetic(dsattn_v41_seq *s, int64_t depth,
                                            uint64_t seed);

/* Sessions (see "Sessions" above).  The loaded sequence keeps the saved
 * index_k mode. */
dsattn_status dsattn_v41_seq_save(const dsattn_v41_seq *s, const char *path,
                                  char *err, size_t errlen);
dsattn_status dsattn_v41_seq_load(dsattn_v41_seq **out, const dsattn_v41 *m,
                                  const char *path, size_t max_seq_len,
                                  char *err, size_t errlen);
dsattn_status dsattn_v41_seq_load_buffer(dsattn_v41_seq **out, const dsattn_v41 *m,
                                         const void *buf, size_t len,
                                         size_t max_seq_len, char *err,
                                         size_t errlen);
dsattn_status dsattn_v41_seq_clone(dsattn_v41_seq **out, const dsattn_v41_seq *s);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif
#ifdef __cplusplus
}
#endif

/* The other generations, one section each. */
#include "dsattn_mha.h"   /* MHA (DeepSeek-LLM 7B), GQA (67B)          */
#include "dsattn_mla.h"   /* MLA (V3), MLA + DSA indexer (V3.2)        */
#include "dsattn_v4.h"    /* CSA + HCA (V4 Flash / Pro)                */

/* ==== Trace: a golden case folder, every observable tensor ============== */
/*
 * What `dsattn trace` runs, for programs that compare dsattn with another
 * implementation of the official reference.  case_dir holds config.json,
 * weights.safetensors and input.safetensors (x F32 [T, dim], prefill_len
 * [1]); config.json picks the generation as the loaders read it (the
 * model_type at the top or in text_config - deepseek_v3, deepseek_v32,
 * deepseek_v4, deepseek_v41 -, else the keys only one generation has).  The
 * run is a prefill of x[:prefill_len] at position 0, then one-token decode
 * steps through the golden-case stand-in stack, and out_path receives a
 * safetensors file: `out` [T, dim] (the final residual),
 * layer.{i}.attn_in / attn_out [T, dim], layer.{i}.topk (I32, -1 padded)
 * where the generation selects, and the packed caches as cache.{i}.*.
 * docs/reference-mode.md and tests/data/golden/README.md say what each
 * tensor means.
 */
#ifdef __cplusplus
extern "C" {
#endif
#if defined(__GNUC__)
#pragma GCC visibility push(default)  /* the exported API: see CMakeLists.txt */
#endif

typedef struct {
    dsattn_mode        mode;       /* REFERENCE (default): the bit-exact contract */
    int                n_threads;  /* fast mode; <= 0: OpenMP default           */
    dsattn_v41_index_k index_k;    /* V4.1 index_k quirk (default OWNER)        */
    int                mla_naive;  /* V3 / V3.2: 1 = naive path (default 0: absorb) */
    dsattn_v4_empty    v4_empty;   /* V4 all-invalid rows (default REFERENCE: NaN) */
} dsattn_trace_params;

dsattn_trace_params dsattn_trace_default_params(void);
/* p NULL: the defaults.  out_path is written at the end of a successful run. */
dsattn_status dsattn_trace_write(const char *case_dir, const char *out_path,
                                 const dsattn_trace_params *p, char *err,
                                 size_t errlen);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif
#ifdef __cplusplus
}
#endif

#endif /* DSATTN_H */
