/* wdequant.c - scalar reference of wdequant.h and its table (the ktab slot). */
#include "wdequant.h"

#include "numfmt.h"

void dsattn_fp8_row_f32_ref(const uint8_t *w, const float *scale, size_t bs, size_t k,
                            float *out)
{
    for (size_t i = 0; i < k; i++) out[i] = dsattn_e4m3_to_f32(w[i]) * scale[i / bs];
}

const dsattn_wdequant_kern dsattn_wdequant_ref = { "ref", dsattn_fp8_row_f32_ref };

#if defined(__x86_64__)
static const dsattn_wdequant_kern wdequant_avx512 = { "avx512", dsattn_fp8_row_f32_avx512 };
const dsattn_wdequant_kern *const dsattn_wdequant_avx512_ptr = &wdequant_avx512;
#else
const dsattn_wdequant_kern *const dsattn_wdequant_avx512_ptr = NULL;
#endif
