/* bench_util.h - what several bench modes share: the machine's measured DRAM
 * read bandwidth and comparisons of two trace outputs. */
#ifndef DSATTN_BENCH_UTIL_H
#define DSATTN_BENCH_UTIL_H

#include <stddef.h>

/* GB/s read by `threads` threads summing a 1 GiB array, best of 3.
 * Cached per thread count for the life of the process. */
double dsattn_bench_read_bw(int threads);
/* The probe itself over a caller's array of n floats: simd 2 = AVX-512,
 * 1 = AVX2, 0 = plain C; best of reps passes. */
double dsattn_bench_read_bw_pool(int simd, const float *a, size_t n, int threads, int reps);

/* Relative L2 error and cosine of tensor `out` of two safetensors files. */
int dsattn_bench_compare_out(const char *a, const char *b, double *rel, double *cosine);

/* The V4.1 stack decode benchmark (bench_v41.c). */
int dsattn_bench_v41(int argc, char **argv);

#endif
