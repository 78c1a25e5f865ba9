/* topk.c - top-k selection with a deterministic tie rule.
 *
 * torch.topk leaves the order of equal scores unspecified; dsattn breaks
 * ties by the LOWER index (docs/reference-mode.md, item 5), for entries and for
 * candidate blocks alike.  -inf scores are ordinary (selectable) values, as
 * in torch.topk; NaN ranks above everything.
 *
 * dsattn_topk_ref sorts all n keys (the clear statement of the rule);
 * dsattn_topk keeps a k-entry min-heap, which rejects most entries with one
 * comparison when k << n (index top-512 out of a million entries), then
 * heap-sorts the k; dsattn_topk_par runs that heap on contiguous parts in
 * parallel and once more over their winners.  All return the same indices
 * in the same (descending) order.  dsattn_topk_set returns the same set
 * in ascending index order, by quickselect: for k a large share of n
 * (the index top-512 of a few thousand entries) it skips the heap's many
 * insertions and the sort a caller wanting index order would add.
 */
#include "ops.h"

#include <math.h>
#include <stdlib.h>

/* key(a) > key(b): higher score, or equal score and lower index. */
static int key_gt(float sa, int32_t ia, float sb, int32_t ib)
{
    int na = isnan(sa), nb = isnan(sb);
    if (na || nb) {
        if (na && nb) return ia < ib;
        return na;
    }
    if (sa != sb) return sa > sb;
    return ia < ib;
}

size_t dsattn_topk_scratch(size_t n, size_t k)
{
    (void)n;
    return k * sizeof(int32_t);
}

static void sift_down(const float *s, int32_t *h, size_t n, size_t i)
{
    /* min-heap on key: the root is the weakest kept entry */
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && key_gt(s[h[m]], h[m], s[h[l]], h[l])) m = l;
        if (r < n && key_gt(s[h[m]], h[m], s[h[r]], h[r])) m = r;
        if (m == i) return;
        int32_t t = h[i]; h[i] = h[m]; h[m] = t;
        i = m;
    }
}

static const float *g_sort_scores;   /* only used by qsort in the ref below */

static int cmp_desc(const void *a, const void *b)
{
    int32_t ia = *(const int32_t *)a, ib = *(const int32_t *)b;
    const float *s = g_sort_scores;
    if (key_gt(s[ia], ia, s[ib], ib)) return -1;
    if (key_gt(s[ib], ib, s[ia], ia)) return 1;
    return 0;
}

/* The k best of the candidates cand[0..n) (cand NULL: base + 0..n-1) into
 * h[0..k), k <= n, in descending key order: a k-entry min-heap of indices
 * into score, then heap-sorted. */
static void topk_heap(const float *score, const int32_t *cand, size_t base, size_t n, size_t k,
                      int32_t *h)
{
    for (size_t i = 0; i < k; i++) h[i] = cand ? cand[i] : (int32_t)(base + i);
    for (size_t i = k / 2; i-- > 0;) sift_down(score, h, k, i);
    size_t i = k;
    if (!cand) {
        /* Runs of 16 entries that cannot enter the heap are skipped with a
         * branch-free test the compiler vectorises: a later entry beats the
         * weakest kept one only by a higher score or by being NaN (an equal
         * score loses on its higher index). */
        const float *sb = score + base;
        for (; i + 16 <= n; i += 16) {
            const float t = score[h[0]];
            int any = 0;
            for (size_t j = 0; j < 16; j++) any |= (sb[i + j] > t) | (sb[i + j] != sb[i + j]);
            if (!any && t == t) continue;
            for (size_t j = i; j < i + 16; j++) {
                const int32_t c = (int32_t)(base + j);
                if (key_gt(score[c], c, score[h[0]], h[0])) {
                    h[0] = c;
                    sift_down(score, h, k, 0);
                }
            }
        }
    }
    for (; i < n; i++) {
        const int32_t c = cand ? cand[i] : (int32_t)(base + i);
        if (key_gt(score[c], c, score[h[0]], h[0])) {
            h[0] = c;
            sift_down(score, h, k, 0);
        }
    }
    /* heap-sort in place: the weakest kept entry goes to the end each
     * round, leaving the k in descending key order.  O(k log k); the
     * insertion sort this replaced was O(k^2): 65K comparisons for the
     * index top-512, 0.28 ms per V4.1 index layer.  Keys are distinct
     * (index tie rule), so every correct sort gives this same order. */
    for (size_t m = k; m > 1; m--) {
        int32_t t = h[0]; h[0] = h[m - 1]; h[m - 1] = t;
        sift_down(score, h, m - 1, 0);
    }
}

void dsattn_topk(const float *score, size_t n, size_t k, int32_t *idx_out,
                 void *scratch)
{
    (void)scratch;
    if (k > n) k = n;
    if (k == 0) return;
    topk_heap(score, NULL, 0, n, k, idx_out);
}

/* Parts worth a thread each: at least 64K entries and 16 k per part. */
static size_t topk_parts(size_t n, size_t k, int threads)
{
    size_t p = threads > 1 ? (size_t)threads : 1;
    while (p > 1 && (n / p < 65536 || n / p < 16 * k)) p--;
    return p;
}

size_t dsattn_topk_par_scratch(size_t n, size_t k, int threads)
{
    return topk_parts(n, k, threads) * DSATTN_MIN(k, n) * sizeof(int32_t);
}

void dsattn_topk_par(const float *score, size_t n, size_t k, int threads, int32_t *idx_out,
                     void *scratch)
{
    if (k > n) k = n;
    if (k == 0) return;
    const size_t parts = topk_parts(n, k, threads);
    if (parts < 2) {
        topk_heap(score, NULL, 0, n, k, idx_out);
        return;
    }
    /* every one of the k best is among the k best of its own part, so
     * the k best of the parts' winners are the k best: the same set, and
     * with distinct keys the same order */
    int32_t *win = scratch;
#pragma omp parallel for schedule(static) num_threads((int)parts)
    for (size_t p = 0; p < parts; p++) {
        const size_t a = n * p / parts, b = n * (p + 1) / parts;
        topk_heap(score, NULL, a, b - a, k, win + p * k);
    }
    topk_heap(score, win, 0, parts * k, k, idx_out);
}

/* a[lo..hi) rearranged so that a[lo..m) are the m - lo best keys
 * (quickselect, median-of-three pivots; past depth 2 log2 n it finishes
 * with a heap, so no input costs O(n^2)). */
static void select_best(const float *s, int32_t *a, size_t lo, size_t hi, size_t m, int depth)
{
    while (lo < m && m < hi && hi - lo > 16) {
        if (depth-- <= 0) {
            /* the heap's m - lo best, in place: the heap lives in
             * a[lo..m), the candidates it still reads lie past it */
            topk_heap(s, a + lo, 0, hi - lo, m - lo, a + lo);
            return;
        }
        size_t mid = lo + (hi - lo) / 2;
        int32_t x = a[lo], y = a[mid], z = a[hi - 1], p;
        /* the median of three keys as the pivot */
        if (key_gt(s[x], x, s[y], y)) { int32_t t = x; x = y; y = t; }   /* x <= y */
        if (key_gt(s[y], y, s[z], z)) y = key_gt(s[x], x, s[z], z) ? x : z;
        p = y;
        /* three-way is not needed: keys are distinct (index tie rule) */
        size_t i = lo, j = hi - 1;
        for (;;) {
            while (key_gt(s[a[i]], a[i], s[p], p)) i++;
            while (key_gt(s[p], p, s[a[j]], a[j])) j--;
            if (i >= j) break;
            int32_t t = a[i]; a[i] = a[j]; a[j] = t;
            i++;
            j--;
        }
        /* a[lo..j] >= pivot >= a[j+1..hi) (Hoare); both sides hold one of
         * the three sampled keys, so each pass shrinks the range */
        if (m <= j + 1) hi = j + 1;
        else lo = j + 1;
    }
    if (m <= lo || m >= hi) return;
    /* insertion sort of the short rest, best first */
    for (size_t i = lo + 1; i < hi; i++) {
        int32_t v = a[i];
        size_t j = i;
        while (j > lo && key_gt(s[v], v, s[a[j - 1]], a[j - 1])) { a[j] = a[j - 1]; j--; }
        a[j] = v;
    }
}

size_t dsattn_topk_set_scratch(size_t n) { return n * sizeof(int32_t); }

void dsattn_topk_set(const float *score, size_t n, size_t k, int32_t *idx_out, void *scratch)
{
    if (k > n) k = n;
    if (k == 0) return;
    int32_t *a = scratch;
    for (size_t i = 0; i < n; i++) a[i] = (int32_t)i;
    int depth = 2;
    for (size_t v = n; v > 1; v >>= 1) depth += 2;
    select_best(score, a, 0, n, k, depth);
    /* the k best are a[0..k): list them by index, ascending */
    int32_t worst = a[0];
    for (size_t i = 1; i < k; i++)
        if (key_gt(score[worst], worst, score[a[i]], a[i])) worst = a[i];
    size_t o = 0;
    for (size_t i = 0; i < n && o < k; i++)
        if (!key_gt(score[worst], worst, score[i], (int32_t)i)) idx_out[o++] = (int32_t)i;
}

/* Reference: sort all indices by key.  Not thread-safe (qsort context);
 * used by tests and by the reference mode of single-threaded callers. */
void dsattn_topk_ref(const float *score, size_t n, size_t k, int32_t *idx_out)
{
    int32_t *all = malloc(n * sizeof *all);
    if (!all) return;
    for (size_t i = 0; i < n; i++) all[i] = (int32_t)i;
    g_sort_scores = score;
    qsort(all, n, sizeof *all, cmp_desc);
    memcpy(idx_out, all, DSATTN_MIN(k, n) * sizeof *all);
    free(all);
}

static int cmp_idx(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (x < 0 && y >= 0) return 1;
    if (y < 0 && x >= 0) return -1;
    return (x > y) - (x < y);
}

void dsattn_sort_idx_valid_first(int32_t *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_idx);
}
