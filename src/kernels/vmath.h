/* vmath.h - vectorised elementwise math for the softmax loops of the fast
 * attention paths: exp(x - m) with its sum.  The scalar reference
 * (vmath.c) uses expf; the AVX-512 path (vmath_avx512.c) is a degree-6
 * polynomial after range reduction, within 2 ulp of expf, exact 0 for
 * -inf and NaN kept; the AVX2 path (vmath_avx2.c) is the same polynomial
 * on 8 lanes, the same bits, and the NEON path (vmath_neon.c) on 4 lanes,
 * the same bits again.  Reference mode never calls these: it evaluates exp
 * in double as the arithmetic contract says. */
#ifndef DSATTN_VMATH_H
#define DSATTN_VMATH_H

#include <stddef.h>

/* x[i] = exp(x[i] - m) for i < n; returns the fp32 sum of the results. */
typedef float (*dsattn_exp_sub_sum_fn)(float *x, size_t n, float m);

float dsattn_exp_sub_sum_ref(float *x, size_t n, float m);
float dsattn_exp_sub_sum_avx512(float *x, size_t n, float m);
float dsattn_exp_sub_sum_avx2(float *x, size_t n, float m);

/* out[i] = the attention softmaxes' exp (simd_avx512.h dsattn_exp512_ftz)
 * of x[i]: dsattn_exp512's value where that is >= 2^-100, else exactly 0
 * (no subnormal).  For the tests; AVX-512 builds only (elsewhere: expf
 * with the same cut). */
void dsattn_exp_ftz_avx512(const float *x, size_t n, float *out);
/* The same rule on 8 lanes (simd_avx2.h dsattn_exp256_ftz), x86-64 builds. */
void dsattn_exp_ftz_avx2(const float *x, size_t n, float *out);

/* The same rules on 4 lanes (simd_neon.h: the x86 forms' bits), aarch64
 * builds only. */
float dsattn_exp_sub_sum_neon(float *x, size_t n, float m);
void dsattn_exp_ftz_neon(const float *x, size_t n, float *out);

/* The ktab slot (ktab.h): one named form of exp_sub_sum. */
typedef struct dsattn_vmath_kern {
    const char            *name;                 /* "ref", "avx512", "avx2", "neon" */
    dsattn_exp_sub_sum_fn  exp_sub_sum;
} dsattn_vmath_kern;

extern const dsattn_vmath_kern dsattn_vmath_ref;
/* NULL when the build has no x86-64 path */
extern const dsattn_vmath_kern *const dsattn_vmath_avx512_ptr;
/* vmath_avx2.c; NULL outside x86-64 builds */
extern const dsattn_vmath_kern *const dsattn_vmath_avx2_ptr;
/* vmath_neon.c; NULL outside aarch64 builds */
extern const dsattn_vmath_kern *const dsattn_vmath_neon_ptr;

#endif
