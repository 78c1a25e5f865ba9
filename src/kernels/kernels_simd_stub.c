/* kernels_simd_stub.c - placeholder until the AVX2/AVX-512 tables land:
 * no fast path, so every context runs the reference kernels. */
#include "kernels.h"

const dsattn_kernels *const dsattn_kernels_avx2_ptr = 0;
const dsattn_kernels *const dsattn_kernels_avx512_ptr = 0;
