/* index_scores_tmpl.h - the key loop of the lightning-indexer's integer
 * score forms (index_avx2.c, index_vnni_avx512.c), written once: the keys
 * (rows sel[j], or j0 + j when sel is NULL) in groups of IDX_ROWS through
 * the including file's score_rows, the rows 16 keys ahead prefetched, the
 * last n % IDX_ROWS keys one at a time; score_heads runs it with the number
 * of 16-head chunks as a constant (1..4), so score_rows's accumulators keep
 * compile-time shapes, and with whether sel is given as a constant: with
 * both address forms in one loop GCC vectorised the row addresses into a
 * masked load of sel, which on AMD cores takes a microcode assist when sel
 * is NULL (a masked-off load from an unmapped page).  The including file
 * defines, before it:
 *   IDX_ROWS    rows per score_rows call
 *   IDX_LUT     the type of the key decode table argument
 *   IDX_TARGET  the functions' target attribute (empty for a file built
 *               for its ISA)
 *   score_rows(p, row, dh, lut, nr, nhc, out), always_inline.
 * Include once, from those two files only. */
#ifndef IDX_ROWS
#error "index_scores_tmpl.h: define IDX_ROWS, IDX_LUT, IDX_TARGET and score_rows first"
#endif

IDX_TARGET static inline __attribute__((always_inline)) void
score_keys(const dsattn_index_vnni_q *p, const uint8_t *base, size_t rb, const int32_t *sel,
           size_t j0, size_t n, IDX_LUT lut, float *score, const size_t nhc, const int SEL)
{
    size_t j = 0;
    const uint8_t *row[IDX_ROWS];
    for (; j + IDX_ROWS <= n; j += IDX_ROWS) {
        for (size_t r = j + 16; r < j + 16 + IDX_ROWS && r < n; r++) {
            const char *a = (const char *)(base + (SEL ? (size_t)sel[r] : j0 + r) * rb);
            _mm_prefetch(a, _MM_HINT_T0);
            _mm_prefetch(a + rb - 1, _MM_HINT_T0);
        }
        for (size_t r = 0; r < IDX_ROWS; r++)
            row[r] = base + (SEL ? (size_t)sel[j + r] : j0 + j + r) * rb;
        score_rows(p, row, p->dh, lut, IDX_ROWS, nhc, score + j);
    }
    for (; j < n; j++) {
        row[0] = base + (SEL ? (size_t)sel[j] : j0 + j) * rb;
        score_rows(p, row, p->dh, lut, 1, nhc, score + j);
    }
}

IDX_TARGET static void score_heads(const dsattn_index_vnni_q *p, const uint8_t *base,
                                   size_t rb, const int32_t *sel, size_t j0, size_t n,
                                   IDX_LUT lut, float *score)
{
#define IDX_SCORE_KEYS(NHC)                                                          \
    do {                                                                             \
        if (sel) score_keys(p, base, rb, sel, j0, n, lut, score, NHC, 1);            \
        else     score_keys(p, base, rb, sel, j0, n, lut, score, NHC, 0);            \
    } while (0)
    switch (p->nh / 16) {
    case 1: IDX_SCORE_KEYS(1); break;
    case 2: IDX_SCORE_KEYS(2); break;
    case 3: IDX_SCORE_KEYS(3); break;
    default: IDX_SCORE_KEYS(4); break;
    }
#undef IDX_SCORE_KEYS
}
