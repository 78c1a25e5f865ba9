/* bench_util.c - shared pieces of the bench modes (bench_util.h). */
#include "bench_util.h"

#include "internal.h"
#include "safetensors.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
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
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t = now_s(), total = 0;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(+ : total)
        for (size_t c = 0; c < n; c += 4096) {
            float acc[16] = { 0 };
            for (size_t i = c; i < c + 4096; i += 16)
                for (int k = 0; k < 16; k++) acc[k] += a[i + k];
            for (int k = 0; k < 16; k++) total += acc[k];
        }
        double gbs = (double)n * 4 / (now_s() - t) / 1e9;
        if (total < 0) gbs = 0;                        /* keep the sum alive */
        if (gbs > best) best = gbs;
    }
    dsattn_free(a);
    if (threads <= 64) cache[threads] = best;
    return best;
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
