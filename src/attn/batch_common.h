/* batch_common.h - what the batched decode steps of every generation (MHA /
 * GQA in mha_forward.c, MLA in mla_batch.c, V4 in v4_batch.c, V4.1 in
 * v41_batch.c) share:
 * the sequence-level checks made before anything is written, the offsets
 * of their B-row scratch, the step their layer functions take and the
 * rule of their public calls' `failed`.
 */
#ifndef DSATTN_BATCH_COMMON_H
#define DSATTN_BATCH_COMMON_H

#include "dsattn.h"
#include "internal.h"

#include <stddef.h>
#include <stdint.h>

/* What the checks read of one sequence of a batch. */
typedef struct {
    const void *seq;          /* the handle (a batch holds each once)       */
    const void *model;        /* every sequence must share the first one's  */
    int         variant;      /* ... and this (V4.1: the index_k mode)      */
    int64_t     pos;          /* tokens consumed so far                     */
    size_t      max_seq_len;
    size_t      dim;          /* the model's: floats per row of x and out   */
    int         has_weights;  /* 0: a config-only model                     */
    int64_t     n_layers;     /* the model's                                */
} dsattn_batch_seq_info;

/* Sequence i of the generation's array `seqs`: fills *info, 0 if it is NULL. */
typedef int (*dsattn_batch_info_fn)(const void *seqs, size_t i, dsattn_batch_seq_info *info);

/* Arguments, one model (and variant), distinct sequences, room for one
 * more token, B rows of dim floats addressable, the layer *layer (when not
 * NULL: a one-layer call) in the model's range, then weights loaded - so
 * a bad argument is INVALID_ARG before a config-only model is UNSUPPORTED.
 * *failed: the first bad sequence, SIZE_MAX when the error is not one
 * sequence's (written on every path). */
dsattn_status dsattn_batch_check_seqs(const dsattn_ctx *ctx, const void *seqs, size_t B,
                                      dsattn_batch_info_fn info, const void *x,
                                      const void *out, const int *layer, size_t *failed);

/* One buffer of a B-row scratch: a x b floats, its offset written to *off. */
typedef struct {
    size_t *off;
    size_t  a, b;
} dsattn_batch_buf;

/* Lays the buffers out one after the other, each 16-float aligned; *end:
 * the floats they take.  0 on size overflow (or more than
 * SIZE_MAX / sizeof(float) - 64 floats, the room a caller's alignment
 * needs). */
int dsattn_batch_layout(const dsattn_batch_buf *bufs, size_t n, size_t *end);

/* One batched step of a generation, the `seq` its layer function takes
 * (a dsattn_layer_fn over B = n rows, so the stand-in stack over B rows is
 * ops' dsattn_standin_rows): its sequences (its own array type), its B-row
 * scratch (V4, V4.1: the base of the context's batch scratch; MLA: a
 * dsattn_ws over it), its scratch plan, and where its per-layer checks
 * name a bad sequence (V4.1). */
typedef struct {
    const void *seqs;
    void       *scratch;
    const void *plan;
    size_t     *failed;
} dsattn_batch_step;

/* The result of a public batched call whose checks wrote the first bad
 * sequence to *bad: st, with *bad copied to *failed (when given) only if
 * the call failed. */
dsattn_status dsattn_batch_result(dsattn_status st, const size_t *bad, size_t *failed);

#endif /* DSATTN_BATCH_COMMON_H */
