/* dispatch.c - cpuid probes and the choice of kernel table.
 *
 * The only process-wide state dsattn has is the CPU's feature set, which is
 * immutable.  The table is chosen per context (dsattn_ctx_create): ref in
 * reference mode, otherwise the best path the CPU runs unless $DSATTN_ISA
 * or the caller forces one.  valgrind cannot execute AVX-512, so forcing
 * DSATTN_ISA=ref (or avx2) must always work.
 */
#include "kernels.h"

int dsattn_cpu_has_avx2(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

int dsattn_cpu_has_avx512(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           dsattn_cpu_has_avx2();
#else
    return 0;
#endif
}
