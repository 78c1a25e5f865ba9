/* trace.h - `dsattn trace`: run a golden case folder through the library and
 * write every observable tensor, the interface used to compare dsattn with
 * any independent implementation of the official reference.
 *
 * A case folder holds config.json, weights.safetensors and
 * input.safetensors (x F32 [T, dim], prefill_len I32 [1]); the run is a
 * prefill of x[:P] at position 0, then one-token decode steps
 * (tests/data/golden/README.md, "Protocol").  config.json's model_type picks the generation:
 * deepseek_v3 (MLA), deepseek_v32 (MLA + DSA), deepseek_v4 (CSA/HCA), and
 * deepseek_v41 or V4.1 keys without a model_type (CSA2).
 */
#ifndef DSATTN_TRACE_H
#define DSATTN_TRACE_H

#include "dsattn.h"
#include "safetensors.h"

typedef struct {
    dsattn_mode mode;          /* REFERENCE (bit-exact contract) or FAST      */
    int         n_threads;     /* <= 0: default                               */
    int         index_k_ref;   /* V4.1: 1 = reference stale-slot quirk        */
    int         mla_naive;     /* V3/V3.2: 1 = naive MLA path                 */
    int         v4_defined_empty; /* V4: 1 = all-invalid rows give 0, not NaN */
} dsattn_trace_opts;

typedef dsattn_status (*dsattn_trace_fn)(const char *case_dir, const char *out_path,
                                         const dsattn_trace_opts *o, char *err,
                                         size_t errlen);

/* Dispatch on config.json's model_type. */
dsattn_status dsattn_trace_case(const char *case_dir, const char *out_path,
                                const dsattn_trace_opts *o, char *err, size_t errlen);

/* Backends (one per generation). */
dsattn_status dsattn_trace_v41(const char *case_dir, const char *out_path,
                               const dsattn_trace_opts *o, char *err, size_t errlen);

/* V3 MLA and V3.2 MLA + DSA (trace_v3.c). */
dsattn_status dsattn_trace_v3(const char *case_dir, const char *out_path,
                              const dsattn_trace_opts *o, char *err, size_t errlen);
/* V4 CSA + HCA (trace_v4.c). */
dsattn_status dsattn_trace_v4(const char *case_dir, const char *out_path,
                              const dsattn_trace_opts *o, char *err, size_t errlen);

/* ==== The protocol runner every backend shares ========================== */

/* What a backend hands the runner: its sequence and two adapters. */
typedef struct {
    void  *seq;
    size_t n_layers, dim;
    /* the golden stand-in stack over all layers on h [n, dim] (in place),
     * capturing attn_in / attn_out [n_layers, n, dim]; advances the seq */
    dsattn_status (*stack)(dsattn_ctx *ctx, void *seq, float *h, size_t n, float *ain,
                           float *aout);
    /* the last chunk's own selection of layer l (rows x width), or non-OK
     * when the layer has none; may be NULL */
    dsattn_status (*selection)(const void *seq, int l, const int32_t **rows, size_t *n_rows,
                               size_t *width);
} dsattn_trace_stack;

/* Everything a run produces. */
typedef struct {
    float   *x;            /* [T, dim]: the input, then the final residual */
    size_t   T, P, dim, kw;
    float   *ain, *aout;   /* [n_layers, T, dim]                            */
    int32_t *topk;         /* [n_layers, T, kw], -1 padded                  */
} dsattn_trace_result;

/* Load input.safetensors of case_dir into r (x, T, P, dim), check dim, and
 * allocate the result arrays for n_layers and a top-k width min(kw, T)
 * (kw = index_topk; 0: no selections). */
dsattn_status dsattn_trace_result_init(dsattn_trace_result *r, const char *case_dir,
                                       size_t dim, size_t n_layers, size_t kw, char *err,
                                       size_t errlen);
void dsattn_trace_result_free(dsattn_trace_result *r);

/* Prefill x[:P] at position 0, then one-token decode steps, collecting
 * attn_in/attn_out and the selections (first kw picks of each row). */
dsattn_status dsattn_trace_run(dsattn_ctx *ctx, const dsattn_trace_stack *s,
                               dsattn_trace_result *r, char *err, size_t errlen);

/* A context for the trace options. */
dsattn_status dsattn_trace_ctx(dsattn_ctx **ctx, const dsattn_trace_opts *o);

/* Writer helpers: one F32 [r, c] tensor; `out` and layer.{i}.attn_out /
 * attn_in for every layer. */
dsattn_status dsattn_trace_add_f32(dsattn_st_writer *w, const char *name, const float *v,
                                   size_t r, size_t c);
dsattn_status dsattn_trace_add_common(dsattn_st_writer *w, const dsattn_trace_result *r,
                                      size_t n_layers);

/* Shared helpers for backends: load input x [T, dim] and prefill length. */
dsattn_status dsattn_trace_load_input(const char *case_dir, float **x, size_t *T,
                                      size_t *dim, size_t *prefill, char *err,
                                      size_t errlen);

#endif
