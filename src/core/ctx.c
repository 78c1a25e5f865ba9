/* ctx.c - dsattn_ctx: the arithmetic mode, the thread count, counters and
 * the phase profile, and the grow-only scratch of the prefill Linear and of
 * the batched forwards.  A context owns no tensors; it is cheap to create one
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
    dsattn_free(ctx->batch_ws);
    free(ctx);
}

void *dsattn_ctx_batch_scratch(dsattn_ctx *ctx, size_t bytes)
{
    if (!ctx || bytes == SIZE_MAX) return NULL;
    if (ctx->batch_ws_bytes < bytes) {
        size_t want = bytes;
        if (ctx->batch_ws_bytes <= SIZE_MAX / 2)
            want = DSATTN_MAX(bytes, ctx->batch_ws_bytes + ctx->batch_ws_bytes / 2);
        dsattn_free(ctx->batch_ws);
        ctx->batch_ws_bytes = 0;
        if (!(ctx->batch_ws = dsattn_alloc(want))) return NULL;
        ctx->batch_ws_bytes = want;
    }
    return ctx->batch_ws;
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
