/* ctx.c - dsattn_ctx: the arithmetic mode, the thread count, counters and
 * the phase profile, and the grow-only scratch of a call: the prefill
 * Linear's, the batched steps' and that of the prefill chunks too big for a
 * sequence's own (decode-step) scratch.  A context owns no tensors; it is cheap to create one
 * per mode.  Its kernel table is chosen where the kernels live:
 * dsattn_ctx_create, dsattn_ctx_isa_name and the AMX switch are in
 * src/kernels/dispatch.c (core sits below the kernel layer). */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

dsattn_ctx_params dsattn_ctx_default_params(void)
{
    dsattn_ctx_params p = { DSATTN_MODE_FAST, DSATTN_ISA_AUTO, 0 };
    return p;
}

void dsattn_ctx_destroy(dsattn_ctx *ctx)
{
    if (!ctx) return;
    dsattn_free(ctx->lin_ws);
    for (int i = 0; i < DSATTN_CTX_SCR_SLOTS; i++) dsattn_free(ctx->scr[i]);
    free(ctx);
}

void *dsattn_ctx_scratch(dsattn_ctx *ctx, dsattn_ctx_scr slot, size_t bytes)
{
    if (!ctx || (unsigned)slot >= DSATTN_CTX_SCR_SLOTS || bytes == SIZE_MAX) return NULL;
    void **buf = &ctx->scr[slot];
    size_t *have = &ctx->scr_bytes[slot];
    if (*have < bytes || !*buf) {
        size_t want = DSATTN_MAX(bytes, 64);
        if (*have <= SIZE_MAX / 2) want = DSATTN_MAX(want, *have + *have / 2);
        dsattn_free(*buf);
        *have = 0;
        if (!(*buf = dsattn_alloc(want))) return NULL;
        *have = want;
    }
    return *buf;
}

size_t dsattn_ctx_scratch_bytes(const dsattn_ctx *ctx)
{
    if (!ctx) return 0;
    size_t n = ctx->lin_ws_bytes;
    for (int i = 0; i < DSATTN_CTX_SCR_SLOTS; i++) n += ctx->scr_bytes[i];
    return n;
}

dsattn_mode dsattn_ctx_mode(const dsattn_ctx *ctx) { return ctx ? ctx->mode : DSATTN_MODE_FAST; }
int dsattn_ctx_threads(const dsattn_ctx *ctx) { return ctx ? ctx->n_threads : 0; }

void dsattn_ctx_counters_reset(dsattn_ctx *ctx)
{
    if (!ctx) return;
    memset(&ctx->cnt, 0, sizeof ctx->cnt);
    memset(&ctx->prof, 0, sizeof ctx->prof);
}

void dsattn_ctx_set_profiling(dsattn_ctx *ctx, int on)
{
    if (!ctx) return;
    ctx->prof_on = on != 0;
    ctx->phase = -1;
}

dsattn_profile dsattn_ctx_profile(const dsattn_ctx *ctx)
{
    dsattn_profile z;
    memset(&z, 0, sizeof z);
    return ctx ? ctx->prof : z;
}

const char *dsattn_phase_name(dsattn_phase p)
{
    static const char *const n[DSATTN_PHASE_COUNT] = {
        "query", "kv", "compress", "index", "attention", "output", "other" };
    return (unsigned)p < DSATTN_PHASE_COUNT ? n[p] : "?";
}

dsattn_counters dsattn_ctx_counters(const dsattn_ctx *ctx)
{
    dsattn_counters z = { 0, 0 };
    return ctx ? ctx->cnt : z;
}
