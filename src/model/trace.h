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
#include "dsattn_mla.h"
#include "dsattn_v4.h"
#include "safetensors.h"

typedef struct {
    dsattn_mode mode;          /* REFERENCE (bit-exact contract) or FAST      */
    int         n_threads;     /* <= 0: default                               */
    int         index_k_ref;   /* V4.1: 1 = reference stale-slot quirk        */
    int         mla_naive;     /* V3/V3.2: 1 = naive MLA path                 */
    int         v4_defined_empty; /* V4: 1 = all-invalid rows give 0, not NaN */
} dsattn_trace_opts;

/* Dispatch on config.json's model_type. */
dsattn_status dsattn_trace_case(const char *case_dir, const char *out_path,
                                const dsattn_trace_opts *o, char *err, size_t errlen);

/* Load a case's input x [T, dim] and prefill length. */
dsattn_status dsattn_trace_load_input(const char *case_dir, float **x, size_t *T,
                                      size_t *dim, size_t *prefill, char *err,
                                      size_t errlen);

/* One F32 [r, c] tensor. */
dsattn_status dsattn_trace_add_f32(dsattn_st_writer *w, const char *name, const float *v,
                                   size_t r, size_t c);

/* A packed cache a generation writes: cache.{l}.{name} U8 [n, row bytes]
 * as stored, and cache.{l}.{name}_deq F32 [n, d], each row decoded by
 * unpack (seq: the sequence, for decoders that need its config). */
typedef struct {
    const char *name;
    size_t      d;
    void      (*unpack)(const uint8_t *row, size_t d, float *out, const void *seq);
} dsattn_trace_cache;

/* The row decoder of the FP4 index-key caches (V4, V4.1). */
void dsattn_trace_unpack_fp4_index(const uint8_t *row, size_t d, float *out, const void *seq);

/* Write caches[which] of layer l, for every `which` below n that get()
 * finds (DSATTN_ERR_NOT_FOUND: the layer has no such cache). */
dsattn_status dsattn_trace_add_caches(dsattn_st_writer *w, int l, const dsattn_trace_cache *caches,
                                      int n, dsattn_status (*get)(const void *seq, int l, int which,
                                                                  const uint8_t **rows, size_t *n_rows,
                                                                  size_t *row_bytes),
                                      const void *seq);

/* Layer l's caches, the part of the output each generation owns (trace.c
 * runs the protocol and writes the rest): trace_v3.c (MLA V3 and MLA + DSA
 * V3.2), trace_v4.c (CSA + HCA), trace_v41.c (CSA2). */
dsattn_status dsattn_trace_mla_caches(dsattn_st_writer *w, const dsattn_mla_seq *s, int l);
dsattn_status dsattn_trace_v4_caches(dsattn_st_writer *w, const dsattn_v4_seq *s, int l);
dsattn_status dsattn_trace_v41_caches(dsattn_st_writer *w, const dsattn_v41_seq *s, int l);

#endif
