/* bench_util.c - shared pieces of the bench modes (bench_util.h). */
#include "bench_util.h"

#include "internal.h"
#include "kernels.h"
#include "safetensors.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <time.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) static float sum_avx512(const float *a, size_t n)
{
    __m512 s[8];
    for (int j = 0; j < 8; j++) s[j] = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 128 <= n; i += 128)
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) s[j] = _mm512_add_ps(s[j], _mm512_load_ps(a + i + 16 * j));
    float t = 0;
    for (; i < n; i++) t += a[i];
    for (int j = 1; j < 8; j++) s[0] = _mm512_add_ps(s[0], s[j]);
    return t + _mm512_reduce_add_ps(s[0]);
}

__attribute__((target("avx2"))) static float sum_avx2(const float *a, size_t n)
{
    __m256 s[8];
    for (int j = 0; j < 8; j++) s[j] = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 64 <= n; i += 64)
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) s[j] = _mm256_add_ps(s[j], _mm256_load_ps(a + i + 8 * j));
    float t = 0, o[8];
    for (; i < n; i++) t += a[i];
    for (int j = 1; j < 8; j++) s[0] = _mm256_add_ps(s[0], s[j]);
    _mm256_storeu_ps(o, s[0]);
    for (int j = 0; j < 8; j++) t += o[j];
    return t;
}
#endif

static float sum_plain(const float *a, size_t n)
{
    float s = 0;
    for (size_t i = 0; i < n; i++) s += a[i];
    return s;
}

static float probe_sum(int simd, const float *a, size_t n)
{
#if defined(__x86_64__)
    if (simd == 2) return sum_avx512(a, n);
    if (simd == 1) return sum_avx2(a, n);
#endif
    return sum_plain(a, n);
}

static volatile float probe_sink;

double dsattn_bench_read_bw_pool(int simd, const float *a, size_t n, int T, int reps)
{
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        float tot = 0;
        double t0 = now_s();
#pragma omp parallel num_threads(T) reduction(+ : tot)
        {
            int id = omp_get_thread_num(), nt = omp_get_num_threads();
            size_t per = (n / (size_t)nt) & ~(size_t)127;
            size_t b = per * (size_t)id, e = id == nt - 1 ? n : b + per;
            tot += probe_sum(simd, a + b, e - b);
        }
        double t = now_s() - t0;
        probe_sink = tot;
        if (t < best) best = t;
    }
    return (double)n * 4.0 / best / 1e9;
}

double dsattn_bench_read_bw(int threads)
{
    static double cache[65];
    if (threads < 1) threads = 1;
    if (threads <= 64 && cache[threads] > 0) return cache[threads];
    const size_t n = (size_t)1 << 28;                  /* 1 GiB of floats */
    float *a = dsattn_alloc_array(n, sizeof(float));
    if (!a) return 1.0;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (size_t i = 0; i < n; i++) a[i] = (float)(i & 7);
    int simd = dsattn_cpu_has_avx512() ? 2 : (dsattn_cpu_has_avx2() ? 1 : 0);
    double bw = dsattn_bench_read_bw_pool(simd, a, n, threads, 5);
    dsattn_free(a);
    if (threads <= 64) cache[threads] = bw;
    return bw;
}


int dsattn_bench_compare_out(const char *pa, const char *pb, double *rel, double *cosine)
{
    char err[256];
    dsattn_st_file *fa = NULL, *fb = NULL;
    if (dsattn_st_open(&fa, pa, err, sizeof err)) return -1;
    if (dsattn_st_open(&fb, pb, err, sizeof err)) { dsattn_st_close(fa); return -1; }
    const dsattn_st_tensor *ta = dsattn_st_find(fa, "out"), *tb = dsattn_st_find(fb, "out");
    int st = -1;
    if (ta && tb && ta->numel == tb->numel) {
        float *a = malloc(ta->numel * sizeof(float)), *b = malloc(tb->numel * sizeof(float));
        if (a && b && !dsattn_st_to_f32(ta, a, ta->numel) && !dsattn_st_to_f32(tb, b, tb->numel)) {
            double num = 0, den = 0, ab = 0, aa = 0;
            for (size_t i = 0; i < ta->numel; i++) {
                double d = (double)a[i] - b[i];
                num += d * d;
                den += (double)b[i] * b[i];
                ab += (double)a[i] * b[i];
                aa += (double)a[i] * a[i];
            }
            *rel = sqrt(num / (den > 0 ? den : 1));
            *cosine = ab / sqrt((aa > 0 ? aa : 1) * (den > 0 ? den : 1));
            st = 0;
        }
        free(a);
        free(b);
    }
    dsattn_st_close(fa);
    dsattn_st_close(fb);
    return st;
}
