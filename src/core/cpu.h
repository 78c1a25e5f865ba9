/* cpu.h - cpuid probes: does this CPU (and OS) run a path?  Immutable
 * answers, asked once (cpu.c). */
#ifndef DSATTN_CPU_H
#define DSATTN_CPU_H

int dsattn_cpu_has_avx2(void);     /* avx2 + fma + f16c              */
int dsattn_cpu_has_avx512(void);   /* avx512f + bw + vl + dq        */
int dsattn_cpu_has_avx512_bf16(void); /* + VDPBF16PS (AMD Zen 4/5, Intel
                                       * Cooper Lake, Sapphire Rapids on) */
/* AMX tiles with INT8 / BF16 multiplies, usable by this process (the OS
 * enables the tile state and grants the permission; asked once) */
int dsattn_cpu_has_amx_int8(void);
int dsattn_cpu_has_amx_bf16(void);
/* The L1 data cache of a core in bytes (the C library's answer, from
 * CPUID on x86-64), 0 where it gives none; asked once.  A tuning input
 * only: no kernel's result depends on it. */
unsigned long dsattn_cpu_l1d_bytes(void);
/* aarch64: the ARMv8.2 dot product (SDOT / UDOT), as the kernel reports it
 * (HWCAP_ASIMDDP); 0 on other CPUs */
int dsattn_cpu_has_neon_dotprod(void);

#endif /* DSATTN_CPU_H */
