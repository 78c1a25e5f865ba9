/* wdequant.c - scalar reference of wdequant.h and the runtime choice. */
#include "wdequant.h"

#include "kernels.h"
#include "numfmt.h"

#include <string.h>

void dsattn_fp8_row_f32_ref(const uint8_t *w, const float *scale, size_t bs, size_t k,
                            float *out)
{
    for (size_t i = 0; i < k; i++) out[i] = dsattn_e4m3_to_f32(w[i]) * scale[i / bs];
}

dsattn_fp8_row_fn dsattn_fp8_row_for(const char *isa)
{
#if defined(__x86_64__)
    /* the context's table, not the CPU: DSATTN_ISA=avx2 / ref must keep
     * AVX-512 code out of the run (and the table is only "avx512" when the
     * CPU has it) */
    if (isa && !strcmp(isa, "avx512")) return dsattn_fp8_row_f32_avx512;
#else
    (void)isa;
#endif
    return dsattn_fp8_row_f32_ref;
}
