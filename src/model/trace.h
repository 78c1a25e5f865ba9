/* trace.h - `dsattn trace`: run a golden case folder through the library and
 * write every observable tensor, the interface used to compare dsattn with
 * any independent implementation of the official reference.
 *
 * A case folder holds config.json, weights.safetensors and
 * input.safetensors (x F32 [T, dim], prefill_len I32 [1]); the run is a
 * prefill of x[:P] at position 0, then one-token decode steps
 * (golden-cases.md §1-§2).  config.json's model_type picks the generation:
 * deepseek_v3 (MLA), deepseek_v32 (MLA + DSA), deepseek_v4 (CSA/HCA), and
 * deepseek_v41 or V4.1 keys without a model_type (CSA2).
 */
#ifndef DSATTN_TRACE_H
#define DSATTN_TRACE_H

#include "dsattn.h"

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

/* Shared helpers for backends: load input x [T, dim] and prefill length. */
dsattn_status dsattn_trace_load_input(const char *case_dir, float **x, size_t *T,
                                      size_t *dim, size_t *prefill, char *err,
                                      size_t errlen);

#endif
