/* bench_util.c - shared pieces of the bench modes (bench_util.h): the
 * machine probes (DRAM read bandwidth, fp32 FMA peak), the CPU name, list
 * parsing, the llama-bench style result table (markdown / csv / json, one
 * row per parameter combination, build and machine identity on every
 * machine-readable row) and the warm-up + repeated timing of one step.
 *
 * The probes use function-level target attributes because tools/ is
 * compiled without ISA flags; they run only if cpuid agrees.  Deliberately
 * not here: any model code, and speed assertions (numbers are reported).
 */
#include "dsattn_commit.h"
#include "bench_util.h"
#include "cli_num.h"
#include "cli_util.h"

#include "amx_attn.h"
#include "internal.h"
#include "kernels.h"
#include "ktab.h"
#include "safetensors.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* The read probes: one xor pass over bytes, four independent vector
 * accumulators (a single scalar chain reads only 8 bytes a cycle, slower
 * than the memory on some cores), in the vector width of the ISA being
 * measured: 64 bytes (AVX-512), 32 (AVX2) or 16 (the baseline).  The four
 * are named variables, not an array: gcc kept an array of them on the
 * stack, and the loop then ran at the speed of its store-to-load
 * forwarding - on a Zen 3 core 15-20 % under the DRAM's read rate (19.1-19.7
 * against 22.5-23.3 GB/s at one thread). */
#define XOR_PROBE_BODY(VB)                                                          \
    {                                                                               \
        typedef uint64_t vec __attribute__((vector_size(VB)));                      \
        vec s0 = { 0 }, s1 = s0, s2 = s0, s3 = s0;                                  \
        size_t i = 0;                                                               \
        for (; i + 4 * (VB) <= n; i += 4 * (VB)) {                                  \
            vec v0, v1, v2, v3;                                                     \
            memcpy(&v0, a + i, VB);                                                 \
            memcpy(&v1, a + i + (VB), VB);                                          \
            memcpy(&v2, a + i + 2 * (VB), VB);                                      \
            memcpy(&v3, a + i + 3 * (VB), VB);                                      \
            s0 ^= v0;                                                               \
            s1 ^= v1;                                                               \
            s2 ^= v2;                                                               \
            s3 ^= v3;                                                               \
        }                                                                           \
        uint64_t t = 0;                                                             \
        for (; i < n; i++) t += a[i];                                               \
        for (size_t e = 0; e < (VB) / 8; e++) t ^= s0[e] ^ s1[e] ^ s2[e] ^ s3[e];   \
        return t;                                                                   \
    }

#if defined(__x86_64__)
__attribute__((target("avx512f"))) static uint64_t xor_avx512(const uint8_t *a, size_t n)
XOR_PROBE_BODY(64)
__attribute__((target("avx2"))) static uint64_t xor_avx2(const uint8_t *a, size_t n)
XOR_PROBE_BODY(32)
#endif
static uint64_t xor_plain(const uint8_t *a, size_t n)
XOR_PROBE_BODY(16)

/* simd: 2 = AVX-512, 1 = AVX2, 0 = the baseline */
static uint64_t probe_xor(int simd, const void *p, size_t n)
{
    const uint8_t *a = p;
#if defined(__x86_64__)
    if (simd == 2) return xor_avx512(a, n);
    if (simd == 1) return xor_avx2(a, n);
#endif
    return xor_plain(a, n);
}

static volatile uint64_t probe_sink;
static volatile float fprobe_sink;

double dsattn_bench_read_bw_pool(int simd, const float *a, size_t n, int T, int reps)
{
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        uint64_t tot = 0;
        double t0 = now_s();
#pragma omp parallel num_threads(T) reduction(^ : tot)
        {
            int id = omp_get_thread_num(), nt = omp_get_num_threads();
            size_t per = (n / (size_t)nt) & ~(size_t)127;
            size_t b = per * (size_t)id, e = id == nt - 1 ? n : b + per;
            tot ^= probe_xor(simd, a + b, (e - b) * sizeof(float));
        }
        double t = now_s() - t0;
        probe_sink = tot;
        if (t < best) best = t;
    }
    return (double)n * 4.0 / best / 1e9;
}


double dsattn_bench_replay_read(const void *const *buf, const size_t *bytes, size_t n,
                                int threads, int reps)
{
    const int simd = dsattn_cpu_has_avx512() ? 2 : (dsattn_cpu_has_avx2() ? 1 : 0);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        uint64_t tot = 0;
        double t0 = now_s();
        for (size_t b = 0; b < n; b++) {
            const uint8_t *p = (const uint8_t *)buf[b];
            const size_t len = bytes[b];
#pragma omp parallel num_threads(threads) reduction(^ : tot) if (threads > 1)
            {
                size_t id = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
                size_t lo = len / nt * id & ~(size_t)63, hi = id + 1 == nt ? len : len / nt * (id + 1) & ~(size_t)63;
                tot ^= probe_xor(simd, p + lo, hi - lo);
            }
        }
        double t = now_s() - t0;
        probe_sink = tot;
        if (t < best) best = t;
    }
    return best;
}

void dsattn_bench_print_profile(const dsattn_bench_prof_row *rows, int n, const char *scope)
{
    printf("\nWhere the last timed step went (--profile; wall time per phase of the "
           "attention forward, summed over %s; \"projections\" is the part spent in "
           "weight projections):\n\n| step | thr | phase | ms | %% of step | projections ms "
           "| GB read | GB/s | GFLOP/s |\n|---|--:|---|--:|--:|--:|--:|--:|--:|\n", scope);
    for (int i = 0; i < n; i++) {
        double seen = 0;
        for (int ph = 0; ph < DSATTN_PHASE_COUNT; ph++) {
            const double t = rows[i].p.seconds[ph], gb = (double)rows[i].p.bytes_read[ph] / 1e9;
            seen += t;
            if (t <= 0) continue;
            printf("| %s | %d | %s | %.2f | %.1f%% | %.2f | %.3f | %.1f | %.1f |\n", rows[i].what,
                   rows[i].threads, dsattn_phase_name((dsattn_phase)ph), t * 1e3,
                   100.0 * t / rows[i].step_s, rows[i].p.proj_seconds[ph] * 1e3, gb, gb / t,
                   (double)rows[i].p.flops[ph] / 1e9 / t);
        }
        printf("| %s | %d | norms, residual, rest | %.2f | %.1f%% | | | | |\n", rows[i].what,
               rows[i].threads, (rows[i].step_s - seen) * 1e3,
               100.0 * (rows[i].step_s - seen) / rows[i].step_s);
    }
}

static double read_bw_cache[65];

static double read_bw_measure(int threads)
{
    const size_t n = (size_t)1 << 28;                  /* 1 GiB of floats */
    float *a = dsattn_alloc_array(n, sizeof(float));
    if (!a) return 1.0;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (size_t i = 0; i < n; i++) a[i] = (float)(i & 7);
    int simd = dsattn_cpu_has_avx512() ? 2 : (dsattn_cpu_has_avx2() ? 1 : 0);
    double bw = dsattn_bench_read_bw_pool(simd, a, n, threads, 5);
    dsattn_free(a);
    return bw;
}

double dsattn_bench_read_bw(int threads)
{
    if (threads < 1) threads = 1;
    if (threads <= 64 && read_bw_cache[threads] > 0) return read_bw_cache[threads];
    const double bw = read_bw_measure(threads);
    if (threads <= 64) read_bw_cache[threads] = bw;
    return bw;
}

int dsattn_bench_read_bw_again_line(FILE *f, int threads, double first, double again)
{
    const double r = again / first;
    fprintf(f, "DRAM read probe again at the end of the run, %d thread%s: %.2f GB/s (%.2f at "
               "first: x%.2f).\n", threads, threads > 1 ? "s" : "", again, first, r);
    return r > 1.15 || r < 1 / 1.15;
}

void dsattn_bench_read_bw_moved(FILE *f)
{
    fprintf(f, "WARNING: the memory's speed moved by more than 15 %% during the run (other work "
               "on the host): every ratio against the read probe carries that much doubt; "
               "compare builds in alternating runs.\n");
}

void dsattn_bench_read_bw_recheck(FILE *f)
{
    int moved = 0, any = 0;
    for (int t = 1; t <= 64; t++) {
        if (read_bw_cache[t] <= 0) continue;
        if (!any) fputc('\n', f);
        any = 1;
        moved |= dsattn_bench_read_bw_again_line(f, t, read_bw_cache[t], read_bw_measure(t));
    }
    if (moved) dsattn_bench_read_bw_moved(f);
}


/* ==== FMA peak (moved from cmd_bench.c) ================================= */
/* Many independent FMA chains (more than latency x ports) over register
 * values that stay normal. */

#if defined(__x86_64__)
/* 16 chains x 16 lanes x 2 flops per iteration */
__attribute__((target("avx512f,fma"))) static float fma_avx512(long iters, float seed)
{
    __m512 a[16];
    const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-3f);
    for (int j = 0; j < 16; j++) a[j] = _mm512_set1_ps(seed + (float)j);
    for (long i = 0; i < iters; i++)
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++) a[j] = _mm512_fmadd_ps(a[j], m, c);
    for (int j = 1; j < 16; j++) a[0] = _mm512_add_ps(a[0], a[j]);
    return _mm512_reduce_add_ps(a[0]);
}

__attribute__((target("avx2,fma"))) static float fma_avx2(long iters, float seed)
{
    __m256 a[12];
    const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-3f);
    float o[8], t = 0;
    for (int j = 0; j < 12; j++) a[j] = _mm256_set1_ps(seed + (float)j);
    for (long i = 0; i < iters; i++)
#pragma GCC unroll 12
        for (int j = 0; j < 12; j++) a[j] = _mm256_fmadd_ps(a[j], m, c);
    for (int j = 1; j < 12; j++) a[0] = _mm256_add_ps(a[0], a[j]);
    _mm256_storeu_ps(o, a[0]);
    for (int j = 0; j < 8; j++) t += o[j];
    return t;
}
#endif

#if defined(__x86_64__)
/* The best of 3 wall times of `loop` (iters iterations, a seed per round)
 * run on every thread of a team of `threads`: the peak probes' timing. */
static double probe_best_s(float (*loop)(long, float), long iters, int threads)
{
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        float tot = 0;
        double t0 = now_s();
#pragma omp parallel num_threads(threads) reduction(+ : tot)
        tot += loop(iters, (float)r);
        double t = now_s() - t0;
        fprobe_sink = tot;
        if (t < best) best = t;
    }
    return best;
}
#endif

double dsattn_bench_fma_peak_probe(int simd, int T)
{
#if defined(__x86_64__)
    if (simd == 0) return 0;
    const long iters = 20000000;
    const double best = probe_best_s(simd == 2 ? fma_avx512 : fma_avx2, iters, T);
    const double flops = (double)iters * T * (simd == 2 ? 16.0 * 16 * 2 : 12.0 * 8 * 2);
    return flops / best / 1e9;
#else
    (void)simd; (void)T;
    return 0;
#endif
}

/* The FMA width of a kernel table named isa: the CPU's widest, 8 lanes
 * for an AVX2 table forced on an AVX-512 CPU (2 / 1 / 0 as the probe). */
static int table_simd(const char *isa)
{
    int simd = dsattn_cpu_has_avx512() ? 2 : (dsattn_cpu_has_avx2() ? 1 : 0);
    if (simd == 2 && !strncmp(isa, "avx2", 4)) simd = 1;
    return simd;
}

/* the probe at one width, cached per width and thread count */
static double fma_peak_simd(int simd, int threads)
{
    static double cache[3][65];
    if (threads < 1) threads = 1;
    if (threads <= 64 && cache[simd][threads] > 0) return cache[simd][threads];
    double p = dsattn_bench_fma_peak_probe(simd, threads);
    if (p <= 0) p = 1.0;             /* no SIMD probe: fractions are not meaningful */
    if (threads <= 64) cache[simd][threads] = p;
    return p;
}

double dsattn_bench_fma_peak(int threads)
{
    return fma_peak_simd(table_simd(dsattn_bench_isa_label()), threads);
}

double dsattn_bench_fma_peak_ctx(const dsattn_ctx *ctx, int threads)
{
    return fma_peak_simd(table_simd(dsattn_ctx_isa_name(ctx)), threads);
}

#if defined(__x86_64__)
/* 4 tile products of 16 x 16 x 32 bf16 pairs per iteration */
__attribute__((target("amx-tile,amx-bf16"))) static float amx_bf16_loop(long iters, float seed)
{
    (void)seed;                           /* the tiles start from constants */
    static const uint16_t one[512] __attribute__((aligned(64))) = { 0x3f80 };   /* 1, then 0 */
    float c[256] __attribute__((aligned(64)));
    dsattn_amx_begin();                   /* 8 tiles of 16 rows x 64 bytes */
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, one, 64);
    _tile_loadd(5, one, 64);
    _tile_loadd(6, one, 64);
    _tile_loadd(7, one, 64);
    for (long i = 0; i < iters; i++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c, 64);
    dsattn_amx_end();
    return c[0];
}
#endif

const char *dsattn_bench_isa_label(void)
{
    static char name[24] = "?";
    dsattn_ctx *c = NULL;
    dsattn_ctx_params p = dsattn_ctx_default_params();
    p.n_threads = 1;
    if (dsattn_ctx_create(&c, &p) == DSATTN_OK)
        snprintf(name, sizeof name, "%s%s%s", dsattn_ctx_isa_name(c),
                 dsattn_ctx_amx(c) ? "+amx" : "",
                 c->kt->pgemm && c->kt->pgemm->fp8_bf16 ? "+bf16dot" : "");
    dsattn_ctx_destroy(c);
    return name;
}

double dsattn_bench_amx_bf16_peak(int threads)
{
#if defined(__x86_64__)
    static double cache[65];
    if (threads < 1) threads = 1;
    if (threads <= 64 && cache[threads] > 0) return cache[threads];
    if (!dsattn_cpu_has_amx_bf16()) return 0;
    const long iters = 2000000;
    const double best = probe_best_s(amx_bf16_loop, iters, threads);
    const double p = (double)iters * threads * 4 * 16 * 16 * 32 * 2 / best / 1e9;
    if (threads <= 64) cache[threads] = p;
    return p;
#else
    (void)threads;
    return 0;
#endif
}

#if defined(__x86_64__)
/* 16 chains x 16 lanes x 2 pairs x 2 flops per instruction */
__attribute__((target("avx512f,avx512bf16"))) static float bf16dot_loop(long iters, float seed)
{
    __m512 a[16];
    const __m512i w = _mm512_set1_epi16(0x3f80), x = _mm512_set1_epi16(0x3a80);   /* 1, 2^-10 */
    for (int j = 0; j < 16; j++) a[j] = _mm512_set1_ps(seed + (float)j);
    for (long i = 0; i < iters; i++)
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++) a[j] = _mm512_dpbf16_ps(a[j], (__m512bh)w, (__m512bh)x);
    for (int j = 1; j < 16; j++) a[0] = _mm512_add_ps(a[0], a[j]);
    return _mm512_reduce_add_ps(a[0]);
}
#endif

double dsattn_bench_bf16dot_peak(int threads)
{
#if defined(__x86_64__)
    static double cache[65];
    if (threads < 1) threads = 1;
    if (threads <= 64 && cache[threads] > 0) return cache[threads];
    if (!dsattn_cpu_has_avx512_bf16()) return 0;
    const long iters = 10000000;
    const double best = probe_best_s(bf16dot_loop, iters, threads);
    const double p = (double)iters * threads * 16 * 64 / best / 1e9;
    if (threads <= 64) cache[threads] = p;
    return p;
#else
    (void)threads;
    return 0;
#endif
}

double dsattn_bench_bf16blk_peak(const dsattn_ctx *ctx, int threads)
{
    if (!ctx || !ctx->kt->bf16blk) return 0;
    return dsattn_ctx_amx(ctx) ? dsattn_bench_amx_bf16_peak(threads)
                               : dsattn_bench_bf16dot_peak(threads);
}

double dsattn_bench_gemm_peak(const dsattn_ctx *ctx, int threads)
{
    double p = ctx ? dsattn_bench_fma_peak_ctx(ctx, threads) : dsattn_bench_fma_peak(threads);
    if (ctx && dsattn_ctx_amx(ctx)) p = DSATTN_MAX(p, dsattn_bench_amx_bf16_peak(threads));
    if (ctx && ctx->kt->pgemm && ctx->kt->pgemm->fp8_bf16)
        p = DSATTN_MAX(p, dsattn_bench_bf16dot_peak(threads));
    return p;
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
            dsattn_bench_rel_cos(a, b, ta->numel, rel, cosine);
            st = 0;
        }
        free(a);
        free(b);
    }
    dsattn_st_close(fa);
    dsattn_st_close(fb);
    return st;
}

void dsattn_bench_rel_cos(const float *got, const float *want, size_t n, double *rel,
                          double *cosine)
{
    double num = 0, den = 0, ab = 0, aa = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        num += d * d;
        den += (double)want[i] * want[i];
        ab += (double)got[i] * want[i];
        aa += (double)got[i] * got[i];
    }
    *rel = sqrt(num / (den > 0 ? den : 1));
    *cosine = ab / sqrt((aa > 0 ? aa : 1) * (den > 0 ? den : 1));
}

/* ==== Small shared helpers ============================================== */

double dsattn_bench_now(void) { return now_s(); }

void dsattn_bench_cpu_model(char *buf, size_t n)
{
    snprintf(buf, n, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) {
                c++;
                while (*c == ' ') c++;
                c[strcspn(c, "\n")] = 0;
                snprintf(buf, n, "%s", c);
            }
            break;
        }
    }
    fclose(f);
}

int dsattn_bench_in_list(const char *list, const char *name)
{
    size_t k = strlen(name);
    for (const char *p = list; p && *p;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (len == k && !strncmp(p, name, k)) return 1;
        p = c ? c + 1 : NULL;
    }
    return 0;
}

int dsattn_bench_parse_fmt(const char *s, dsattn_bench_fmt *f)
{
    if (!strcmp(s, "md") || !strcmp(s, "markdown")) *f = DSATTN_BENCH_MD;
    else if (!strcmp(s, "csv")) *f = DSATTN_BENCH_CSV;
    else if (!strcmp(s, "json")) *f = DSATTN_BENCH_JSON;
    else return -1;
    return 0;
}

/* ==== Result table ====================================================== */

static int is_number(const char *s)
{
    char *e;
    if (!*s) return 0;
    (void)strtod(s, &e);
    return *e == 0;
}

void dsattn_bench_begin(dsattn_bench_table *t, const char *isa)
{
    t->n_rows = 0;
    t->isa = isa ? isa : "?";
    dsattn_bench_cpu_model(t->cpu, sizeof t->cpu);
    if (t->fmt == DSATTN_BENCH_CSV) {
        printf("build_commit,cpu_info,isa,mode,model,variant,depth,threads,reps,kv_bytes_per_token,"
               "ms_mean,ms_sd,gb_step,gflop_step,gb_s,gflop_s,read_bw_gb_s,fma_peak_gflop_s,"
               "frac_read_bw,frac_fma_peak");
        for (int i = 0; i < t->n_extra; i++) printf(",%s", t->extra_key[i]);
        printf("\n");
    } else if (t->fmt == DSATTN_BENCH_JSON) {
        printf("[\n");
    } else {
        double load1 = -1;
        FILE *la = fopen("/proc/loadavg", "r");
        if (la) {
            if (fscanf(la, "%lf", &load1) != 1) load1 = -1;
            fclose(la);
        }
        printf("dsattn bench %s - commit %s, cpu \"%s\", isa %s\n\n", t->mode, DSATTN_GIT_COMMIT,
               t->cpu, t->isa);
        if (t->title) printf("%s\n\n", t->title);
        if (load1 > 0.5)
            printf("(1-minute load average %.2f at the start: other processes share the cores "
                   "and memory, so times are high and noisy.)\n\n", load1);
        printf("| model | variant | depth | thr | KV B/token | ms/token | GB/s | %% read BW "
               "| GFLOP/s | %% FMA peak |");
        for (int i = 0; i < t->n_extra; i++) printf(" %s |", t->extra[i]);
        printf("\n|---|---|--:|--:|--:|--:|--:|--:|--:|--:|");
        for (int i = 0; i < t->n_extra; i++) printf("--:|");
        printf("\n");
    }
    fflush(stdout);
}

void dsattn_bench_row(dsattn_bench_table *t, const dsattn_bench_result *r)
{
    const double sec = r->ms_mean / 1e3;
    const double gbs = sec > 0 ? r->gb / sec : 0, gfs = sec > 0 ? r->gflop / sec : 0;
    const double fbw = r->lim_gbs > 0 ? gbs / r->lim_gbs : 0;
    const double ffl = r->lim_gflops > 0 ? gfs / r->lim_gflops : 0;
    if (t->fmt == DSATTN_BENCH_CSV) {
        printf("%s,\"%s\",%s,%s,%s,\"%s\",%lld,%d,%d,%.2f,%.3f,%.3f,%.5f,%.4f,%.3f,%.3f,%.3f,%.3f,"
               "%.4f,%.4f", DSATTN_GIT_COMMIT, t->cpu, t->isa, t->mode, r->model, r->variant,
               r->depth, r->threads, r->reps, r->kv_bytes, r->ms_mean, r->ms_sd, r->gb, r->gflop,
               gbs, gfs, r->lim_gbs, r->lim_gflops, fbw, ffl);
        for (int i = 0; i < t->n_extra; i++) printf(",%s", r->extra[i]);
        printf("\n");
    } else if (t->fmt == DSATTN_BENCH_JSON) {
        printf("%s  {\"build_commit\": \"%s\", \"cpu_info\": \"%s\", \"isa\": \"%s\", "
               "\"mode\": \"%s\", \"model\": \"%s\", \"variant\": \"%s\", \"depth\": %lld, "
               "\"threads\": %d, \"reps\": %d, \"kv_bytes_per_token\": %.2f, \"ms_mean\": %.3f, "
               "\"ms_sd\": %.3f, \"gb_step\": %.5f, \"gflop_step\": %.4f, \"gb_s\": %.3f, "
               "\"gflop_s\": %.3f, \"read_bw_gb_s\": %.3f, \"fma_peak_gflop_s\": %.3f, "
               "\"frac_read_bw\": %.4f, \"frac_fma_peak\": %.4f",
               t->n_rows ? ",\n" : "", DSATTN_GIT_COMMIT, t->cpu, t->isa, t->mode, r->model,
               r->variant, r->depth, r->threads, r->reps, r->kv_bytes, r->ms_mean, r->ms_sd, r->gb,
               r->gflop, gbs, gfs, r->lim_gbs, r->lim_gflops, fbw, ffl);
        for (int i = 0; i < t->n_extra; i++) {
            if (is_number(r->extra[i])) printf(", \"%s\": %s", t->extra_key[i], r->extra[i]);
            else printf(", \"%s\": \"%s\"", t->extra_key[i], r->extra[i]);
        }
        printf("}");
    } else {
        printf("| %s | %s | %lld | %d | %.0f | %.2f ± %.2f | %.2f | %.0f%% | %.1f | %.0f%% |",
               r->model, r->variant, r->depth, r->threads, r->kv_bytes, r->ms_mean, r->ms_sd, gbs,
               100.0 * fbw, gfs, 100.0 * ffl);
        for (int i = 0; i < t->n_extra; i++) printf(" %s |", r->extra[i]);
        printf("\n");
    }
    t->n_rows++;
    fflush(stdout);
}

void dsattn_bench_end(dsattn_bench_table *t, const char *footer)
{
    if (t->fmt == DSATTN_BENCH_JSON) printf("%s]\n", t->n_rows ? "\n" : "");
    else if (t->fmt == DSATTN_BENCH_MD && footer) printf("\n%s", footer);
    fflush(stdout);
}

dsattn_status dsattn_bench_time(dsattn_ctx *ctx, dsattn_bench_step_fn step, void *arg, int reps,
                                dsattn_bench_result *r)
{
    return dsattn_bench_time_w(ctx, step, arg, reps, 1, r);
}

dsattn_status dsattn_bench_time_w(dsattn_ctx *ctx, dsattn_bench_step_fn step, void *arg,
                                  int reps, int warm, dsattn_bench_result *r)
{
    const int T = dsattn_ctx_threads(ctx);
    r->threads = T;
    r->reps = reps;
    r->lim_gbs = dsattn_bench_read_bw(T);
    r->lim_gflops = dsattn_bench_fma_peak(T);
    dsattn_status st = warm ? step(ctx, arg) : DSATTN_OK;            /* warm-up */
    double sum = 0, sum2 = 0;
    for (int i = 0; i < reps && !st; i++) {
        dsattn_ctx_counters_reset(ctx);
        double t0 = now_s();
        st = step(ctx, arg);
        double ms = (now_s() - t0) * 1e3;
        dsattn_counters c = dsattn_ctx_counters(ctx);
        r->gb = (double)c.bytes_read / 1e9;
        r->gflop = (double)c.flops / 1e9;
        sum += ms;
        sum2 += ms * ms;
    }
    r->ms_mean = sum / (reps > 0 ? reps : 1);
    r->ms_sd = reps > 1 ? sqrt(fmax(0.0, (sum2 - sum * sum / reps) / (reps - 1))) : 0.0;
    return st;
}

/* ==== The options of the one-layer modes ================================ */

int dsattn_bench_parse_opts(const char *mode, int argc, char **argv, dsattn_bench_opts *o,
                            const char *usage)
{
    const int mla = !strcmp(mode, "mla"), mha = !strcmp(mode, "mha"), v4 = !strcmp(mode, "v4");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { printf("%s", usage); return 1; }
        if (!strcmp(a, "--profile") && !mha) { o->profile = 1; continue; }
        if (!v) { fprintf(stderr, "bench %s: %s needs a value\n", mode, a); return 2; }
        i++;
        char who[32];
        snprintf(who, sizeof who, "bench %s", mode);
        int rc = 0;
        if (!strcmp(a, "--depth"))
            rc = dsattn_cli_list(who, a, v, 1, DSATTN_BENCH_MAX_DEPTH, DSATTN_CLI_SUFFIX,
                                 o->depth, DSATTN_BENCH_MAXL, &o->nd);
        else if (!strcmp(a, "--threads"))
            rc = dsattn_cli_list(who, a, v, 1, DSATTN_CLI_MAX_THREADS, 0, o->thr,
                                 DSATTN_BENCH_MAXL, &o->nt);
        else if (!strcmp(a, "--reps"))
            rc = dsattn_cli_list(who, a, v, 1, DSATTN_BENCH_MAX_REPS, 0, o->reps,
                                 DSATTN_BENCH_MAXL, &o->nr);
        else if (!strcmp(a, "--batch") && (mla || mha))
            rc = dsattn_cli_list(who, a, v, 1, DSATTN_BENCH_MAX_BATCH, 0, o->batch,
                                 DSATTN_BENCH_MAXL, &o->nb);
        else if (!strcmp(a, "--weights") && (mha || mla || v4)) o->weights = v;
        else if (!strcmp(a, "--config") && (mha || mla)) o->config = v;
        else if (!strcmp(a, "--model")) o->models = v;
        else if (!strcmp(a, "--configs")) o->configs = v;
        else if (!strcmp(a, "--seed")) rc = dsattn_cli_u64(who, a, v, &o->seed);
        else if (!strcmp(a, "--format")) {
            if (dsattn_bench_parse_fmt(v, &o->fmt)) {
                fprintf(stderr, "bench %s: --format md|csv|json\n", mode);
                return 2;
            }
        } else {
            fprintf(stderr, "bench %s: unknown option %s\n%s", mode, a, usage);
            return 2;
        }
        if (rc) return rc;
    }
    if (o->config && !o->weights) {
        fprintf(stderr, "bench %s: --config goes with --weights (the config of a checkpoint)\n",
                mode);
        return 2;
    }
    if (o->nd <= 0 || o->nt <= 0 || o->nr <= 0) {
        fprintf(stderr, "bench %s: --depth/--threads/--reps take comma lists of positive "
                        "integers (K, M suffixes)\n", mode);
        return 2;
    }
    return 0;
}

dsattn_ctx *dsattn_bench_ctx(dsattn_mode mode, int threads)
{
    dsattn_ctx_params p = dsattn_ctx_default_params();
    p.mode = mode;
    p.n_threads = threads;
    dsattn_ctx *c = NULL;
    return dsattn_ctx_create(&c, &p) ? NULL : c;
}

void dsattn_bench_limits_note(char *buf, size_t n, const long long *thr, int nt, int amx)
{
    size_t k = (size_t)snprintf(buf, n, "Machine limits measured in this run (threads: DRAM read "
                                        "GB/s, fp32 FMA GFLOP/s):");
    for (int i = 0; i < nt && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s %lld: %.2f, %.1f", i ? ";" : "", thr[i],
                              dsattn_bench_read_bw((int)thr[i]), dsattn_bench_fma_peak((int)thr[i]));
    /* the AMX-BF16 tile peak where the CPU has the tiles */
    for (int i = 0; amx && i < nt && k < n && dsattn_bench_amx_bf16_peak(1) > 0; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s %lld thr %.0f", i ? "," : "; AMX-BF16 GFLOP/s:",
                              thr[i], dsattn_bench_amx_bf16_peak((int)thr[i]));
    /* the VDPBF16PS peak where the CPU has AVX512-BF16 */
    for (int i = 0; i < nt && k < n && dsattn_bench_bf16dot_peak(1) > 0; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s %lld thr %.0f", i ? "," : "; VDPBF16PS GFLOP/s:",
                              thr[i], dsattn_bench_bf16dot_peak((int)thr[i]));
    if (k < n) snprintf(buf + k, n - k, ".\n");
}

dsattn_status dsattn_bench_verify(dsattn_bench_layer_step step, const void *arg, size_t dim,
                                  int64_t depth, uint64_t seed, uint64_t x_seed, double *rel,
                                  double *cosine)
{
    dsattn_ctx *cf = dsattn_bench_ctx(DSATTN_MODE_FAST, 0);
    dsattn_ctx *cr = dsattn_bench_ctx(DSATTN_MODE_REFERENCE, 1);
    float *x = dsattn_cli_rand_bf16(dim, x_seed, 3);
    float *out = calloc(2 * dim + 1, sizeof(float));
    dsattn_status st = cf && cr && x && out ? DSATTN_OK : DSATTN_ERR_NOMEM;
    if (!st) st = step(cf, arg, depth, seed, x, out);
    if (!st) st = step(cr, arg, depth, seed, x, out + dim);
    if (!st) dsattn_bench_rel_cos(out, out + dim, dim, rel, cosine);
    dsattn_ctx_destroy(cf);
    dsattn_ctx_destroy(cr);
    free(x);
    free(out);
    return st;
}
