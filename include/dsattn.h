/* dsattn.h - public API of dsattn, DeepSeek's seven attention generations in C.
 *
 * Object model
 * ------------
 *   dsattn_ctx     threads + the kernel table (scalar reference, AVX2 or AVX-512)
 *                  and the arithmetic mode.  Owns nothing else.  A context in
 *                  DSATTN_MODE_REFERENCE follows the bit-reproducible arithmetic
 *                  contract of the golden cases (products accumulated in double,
 *                  rounded once; no FMA contraction; lower index wins ties).
 *                  DSATTN_MODE_FAST uses SIMD kernels that accumulate in fp32.
 *   dsattn_v41     one DeepSeek-V4.1 (CSA2) attention stack: weights (borrowed
 *                  from the caller or a mapped checkpoint), the layer plan and,
 *                  per sequence, a dsattn_v41_seq holding the packed caches and
 *                  the four-slot shared attention runtime.  Two sequences of
 *                  the same stack run side by side: nothing is process-global.
 *
 * Every fallible call returns dsattn_status; the library never exits, aborts
 * or prints on bad input.  Whoever creates an object destroys it, and
 * destroy(NULL) is a no-op.  Error detail text, where offered, goes to a
 * caller buffer (char *err, size_t errlen).
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
} dsattn_isa;

typedef struct {
    dsattn_mode mode;              /* REFERENCE forces the scalar kernels     */
    dsattn_isa  isa;               /* AUTO: from cpuid, overridable by env    */
    int         n_threads;         /* <= 0: OpenMP default                    */
} dsattn_ctx_params;

typedef struct dsattn_ctx dsattn_ctx;

dsattn_ctx_params dsattn_ctx_default_params(void);
dsattn_status dsattn_ctx_create(dsattn_ctx **out, const dsattn_ctx_params *p);
void          dsattn_ctx_destroy(dsattn_ctx *ctx);
/* The ISA the context actually runs ("ref", "avx2", "avx512"). */
const char   *dsattn_ctx_isa_name(const dsattn_ctx *ctx);
dsattn_mode   dsattn_ctx_mode(const dsattn_ctx *ctx);
int           dsattn_ctx_threads(const dsattn_ctx *ctx);

/* Work counters: every kernel adds the FLOPs it performed and the bytes it
 * read (weights, caches, activations) so tools print a measured bill. */
typedef struct {
    uint64_t flops;
    uint64_t bytes_read;
} dsattn_counters;

void dsattn_ctx_counters_reset(dsattn_ctx *ctx);
dsattn_counters dsattn_ctx_counters(const dsattn_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif /* DSATTN_H */
