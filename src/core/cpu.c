/* cpu.c - cpuid probes (x86-64) and hwcaps (aarch64): what this CPU (and OS)
 * runs.
 *
 * Its only state is the CPU's feature set, which is immutable.  The kernel layer (src/kernels/dispatch.c) chooses its tables
 * from these answers; src/core/blas.c asks them to pick OpenBLAS's core.
 */
#include "cpu.h"

#include <unistd.h>
#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

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

/* AVX512-BF16: CPUID 7.1 EAX bit 5 (the zmm state's OS support is part of
 * dsattn_cpu_has_avx512) */
int dsattn_cpu_has_avx512_bf16(void)
{
#if defined(__x86_64__)
    unsigned a, b, c, d;
    return dsattn_cpu_has_avx512() && __get_cpuid_count(7, 1, &a, &b, &c, &d) &&
           (a & (1u << 5));
#else
    return 0;
#endif
}

/* AMX: the tile unit and the asked-for multiply (CPUID 7.0 EDX bit 24 TILE,
 * 25 INT8, 22 BF16), XTILECFG and XTILEDATA enabled by the OS (XCR0 bits
 * 17, 18), then the per-process permission for tile data
 * (ARCH_REQ_XCOMP_PERM, XFEATURE 18), asked once.  Many machines dsattn
 * runs on have none of it: every AMX path has an AVX-512 twin. */
static int amx_probe(unsigned edx_bit)
{
#if defined(__x86_64__)
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << edx_bit)))
        return 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27)))            /* OSXSAVE */
        return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    if ((lo & (3u << 17)) != (3u << 17)) return 0;
    static int perm = -1;                 /* the permission, asked once */
    int p = __atomic_load_n(&perm, __ATOMIC_ACQUIRE);
    if (p < 0) {
        p = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
        __atomic_store_n(&perm, p, __ATOMIC_RELEASE);
    }
    return p;
#else
    (void)edx_bit;
    return 0;
#endif
}

int dsattn_cpu_has_amx_int8(void)
{
    static int have = -1;                 /* immutable once known, like cpuid */
    int h = __atomic_load_n(&have, __ATOMIC_ACQUIRE);
    if (h < 0) {
        h = amx_probe(25);
        __atomic_store_n(&have, h, __ATOMIC_RELEASE);
    }
    return h;
}

int dsattn_cpu_has_amx_bf16(void)
{
    static int have = -1;
    int h = __atomic_load_n(&have, __ATOMIC_ACQUIRE);
    if (h < 0) {
        h = amx_probe(22) && dsattn_cpu_has_avx512();
        __atomic_store_n(&have, h, __ATOMIC_RELEASE);
    }
    return h;
}

unsigned long dsattn_cpu_l1d_bytes(void)
{
    static long known = -1;   /* immutable once asked */
    long r = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (r >= 0) return (unsigned long)r;
#ifdef _SC_LEVEL1_DCACHE_SIZE
    r = sysconf(_SC_LEVEL1_DCACHE_SIZE);
#endif
    if (r < 0) r = 0;
    __atomic_store_n(&known, r, __ATOMIC_RELAXED);
    return (unsigned long)r;
}

int dsattn_cpu_has_neon_dotprod(void)
{
#if defined(__aarch64__) && defined(__linux__)
    return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#else
    return 0;
#endif
}
