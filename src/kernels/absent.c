/* absent.c - the kernel tables of the architectures this build is not for,
 * as NULL pointers.
 *
 * The ISA files (*_avx2.c, *_avx512.c on x86-64; *_neon.c on aarch64) are
 * compiled only for their architecture (CMakeLists.txt, DSATTN_ARCH).  Each
 * defines its table pointer; here the other architectures' pointers are
 * NULL, so the dispatcher (dispatch.c) and the tests that enumerate every
 * table see "this build has no such table" and pick among what it has.
 */
#include "ktab.h"

#include <stddef.h>

#if !defined(__x86_64__)
const dsattn_kernels *const dsattn_kernels_avx2_ptr = NULL;
const dsattn_kernels *const dsattn_kernels_avx2_expshift_ptr = NULL;
int dsattn_avx2_fma_subnormal_full_rate(void) { return 0; }
int dsattn_avx2_fp8sh_plan32(const float *bm, size_t ng, const float *sc, float *pk,
                             float *unscale)
{
    (void)bm; (void)ng; (void)sc; (void)pk; (void)unscale;
    return 0;
}
const dsattn_kernels *const dsattn_kernels_avx512_ptr = NULL;
const dsattn_kernels *const dsattn_kernels_avx512_expshift_ptr = NULL;
const dsattn_mla_kern *const dsattn_mla_kern_avx2_ptr = NULL;
const dsattn_mla_kern *const dsattn_mla_kern_avx512_ptr = NULL;
const dsattn_sa_kern *const dsattn_sa_kern_avx512_ptr = NULL;
const dsattn_sa_kern *const dsattn_sa_kern_avx2_ptr = NULL;
const dsattn_pgemm_kern *const dsattn_pgemm_avx2_ptr = NULL;
const dsattn_pgemm_kern *const dsattn_pgemm_avx512_ptr = NULL;
const dsattn_pgemm_kern *const dsattn_pgemm_avx512_bf16_ptr = NULL;
const dsattn_mha_kern *const dsattn_mha_kern_avx512_ptr = NULL;
const dsattn_mha_kern *const dsattn_mha_kern_avx512_bf16_ptr = NULL;
int dsattn_avx512_bf16dot_full_rate(void) { return 0; }
const dsattn_mha_kern *const dsattn_mha_kern_avx2_ptr = NULL;
const dsattn_vmath_kern *const dsattn_vmath_avx2_ptr = NULL;
const dsattn_vmath_kern *const dsattn_vmath_avx512_ptr = NULL;
const dsattn_wdequant_kern *const dsattn_wdequant_avx512_ptr = NULL;
const dsattn_wdequant_kern *const dsattn_wdequant_avx2_ptr = NULL;
const dsattn_amx_kern *const dsattn_amx_avx512_ptr = NULL;
const dsattn_amx_kern *const dsattn_bf16blk_avx512_ptr = NULL;
const dsattn_index_kern *const dsattn_index_vnni_ptr = NULL;
const dsattn_index_kern *const dsattn_index_avx2_ptr = NULL;

/* The AMX shape predicate, asked by scratch sizing (mla_forward.c) with no
 * context at hand: no build of this architecture runs the AMX blocks, as
 * amx_attn_avx512.c says for an x86-64 build without AVX-512. */
int dsattn_amx_fits(size_t hp, size_t D, size_t C)
{
    (void)hp; (void)D; (void)C;
    return 0;
}
#endif

#if !defined(__aarch64__)
const dsattn_kernels *const dsattn_kernels_neon_ptr = NULL;
const dsattn_index_kern *const dsattn_index_neon_ptr = NULL;
const dsattn_index_kern *const dsattn_index_neon_dot_ptr = NULL;
const dsattn_vmath_kern *const dsattn_vmath_neon_ptr = NULL;
const dsattn_mla_kern *const dsattn_mla_kern_neon_ptr = NULL;
const dsattn_sa_kern *const dsattn_sa_kern_neon_ptr = NULL;
const dsattn_pgemm_kern *const dsattn_pgemm_neon_ptr = NULL;
const dsattn_wdequant_kern *const dsattn_wdequant_neon_ptr = NULL;
const dsattn_mha_kern *const dsattn_mha_kern_neon_ptr = NULL;
#endif
