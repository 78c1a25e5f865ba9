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
const dsattn_kernels *const dsattn_kernels_avx512_ptr = NULL;
const dsattn_mla_kern *const dsattn_mla_kern_avx512_ptr = NULL;
const dsattn_sa_kern *const dsattn_sa_kern_avx512_ptr = NULL;
const dsattn_pgemm_kern *const dsattn_pgemm_avx512_ptr = NULL;
const dsattn_mha_kern *const dsattn_mha_kern_avx512_ptr = NULL;
const dsattn_amx_kern *const dsattn_amx_avx512_ptr = NULL;
const dsattn_index_kern *const dsattn_index_vnni_ptr = NULL;
#endif

#if !defined(__aarch64__)
const dsattn_kernels *const dsattn_kernels_neon_ptr = NULL;
#endif
