/* wdequant.c - scalar reference of wdequant.h and its table (the ktab slot). */
#include "wdequant.h"

#include "numfmt.h"

void dsattn_fp8_row_f32_ref(const uint8_t *w, const float *scale, size_t bs, size_t k,
                            float *out)
{
    for (size_t i = 0; i < k; i++) out[i] = dsattn_e4m3_to_f32(w[i]) * scale[i / bs];
}

const dsattn_wdequant_kern dsattn_wdequant_ref = { "ref", dsattn_fp8_row_f32_ref };
