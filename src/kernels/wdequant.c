/* wdequant.c - scalar reference of wdequant.h and the runtime choice. */
#include "wdequant.h"

#include "kernels.h"
#include "numfmt.h"

void dsattn_fp8_row_f32_ref(const uint8_t *w, const float *scale, size_t bs, size_t k,
                            float *out)
{
    for (size_t i = 0; i < k; i++) out[i] = dsattn_e4m3_to_f32(w[i]) * scale[i / bs];
}

dsattn_fp8_row_fn dsattn_fp8_row_best(void)
{
#if defined(__x86_64__)
    if (dsattn_cpu_has_avx512()) return dsattn_fp8_row_f32_avx512;
#endif
    return dsattn_fp8_row_f32_ref;
}
