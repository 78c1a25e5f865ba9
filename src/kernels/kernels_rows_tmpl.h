/* kernels_rows_tmpl.h - the packed cache row entries of dsattn_kernels
 * (kernels.h) that are one call of a table's per-format row loop each,
 * written once for every table: dequant_*_row, mdot_fp4e4m3,
 * maxpy_fp4e4m3, mdot_fp4ue8m0, mdot_fp8ue8m0, maxpy_fp8ue8m0.  Each
 * kernels_*.c includes it after its three loops, which take the format
 * (DSATTN_ROW_*, kernels.h) as a constant:
 *
 *   dequant_range(fmt, row, d, i0, n, out)    elements [i0, i0 + n) of a row
 *   mdot_row(fmt, q, ldq, nh, row, d, out)    out[h] = q_h . deq(row)
 *   maxpy_row(fmt, p, nh, row, d, acc, ldacc) acc_h += p_h deq(row)
 *
 * The functions are static: each table gets its own, built with its
 * file's flags, the loops inlined into them.  The *_rows entries: the
 * row-after-row forms here, the blocked ones in their table files.
 * ROWS_TABLE_ENTRIES(mdot_rows, maxpy_rows) puts them all in a table. */

/* Each entry once per format: the shapes, then their instances. */
#define ROWS_DEQUANT(name, fmt)                                                    \
    static void name(const uint8_t *row, size_t d, float *out)                      \
    {                                                                               \
        dequant_range(fmt, row, d, 0, d, out);                                      \
    }
#define ROWS_MDOT(name, fmt)                                                       \
    static void name(const float *q, size_t ldq, size_t nh, const uint8_t *row,     \
                     size_t d, float *out)                                          \
    {                                                                               \
        mdot_row(fmt, q, ldq, nh, row, d, out);                                     \
    }
#define ROWS_MAXPY(name, fmt)                                                      \
    static void name(const float *p, size_t nh, const uint8_t *row, size_t d,       \
                     float *acc, size_t ldacc)                                      \
    {                                                                               \
        maxpy_row(fmt, p, nh, row, d, acc, ldacc);                                  \
    }

ROWS_DEQUANT(dequant_fp4e4m3_row, DSATTN_ROW_FP4E4M3)
ROWS_DEQUANT(dequant_fp8ue8m0_row, DSATTN_ROW_FP8UE8M0)
ROWS_DEQUANT(dequant_fp4ue8m0_row, DSATTN_ROW_FP4UE8M0)
ROWS_MDOT(mdot_fp4e4m3, DSATTN_ROW_FP4E4M3)
ROWS_MDOT(mdot_fp4ue8m0, DSATTN_ROW_FP4UE8M0)
ROWS_MDOT(mdot_fp8ue8m0, DSATTN_ROW_FP8UE8M0)
ROWS_MAXPY(maxpy_fp4e4m3, DSATTN_ROW_FP4E4M3)
ROWS_MAXPY(maxpy_fp8ue8m0, DSATTN_ROW_FP8UE8M0)

#undef ROWS_DEQUANT
#undef ROWS_MDOT
#undef ROWS_MAXPY

/* The table's entries for the functions above, one list for every table:
 * a table names its two *_rows forms (the row-after-row ones below, or its
 * own blocked ones). */
#define ROWS_TABLE_ENTRIES(mdot_rows, maxpy_rows)     \
    .dequant_fp4e4m3_row  = dequant_fp4e4m3_row,      \
    .dequant_fp8ue8m0_row = dequant_fp8ue8m0_row,     \
    .dequant_fp4ue8m0_row = dequant_fp4ue8m0_row,     \
    .mdot_fp4e4m3         = mdot_fp4e4m3,             \
    .mdot_fp4e4m3_rows    = mdot_rows,                \
    .maxpy_fp4e4m3        = maxpy_fp4e4m3,            \
    .maxpy_fp4e4m3_rows   = maxpy_rows,               \
    .mdot_fp4ue8m0        = mdot_fp4ue8m0,            \
    .mdot_fp8ue8m0        = mdot_fp8ue8m0,            \
    .maxpy_fp8ue8m0       = maxpy_fp8ue8m0

/* The *_rows entries for a table without a many-row form: one row after
 * another.  maxpy gathers the heads' weights of the row (64 at a time),
 * one FMA per row and element.  (The AVX-512 table blocks 8 rows; the ref
 * table's maxpy rounds once over all rows.) */
static __attribute__((unused)) void
mdot_fp4e4m3_rows_each(const float *q, size_t ldq, size_t nh, const uint8_t *const *rows,
                       size_t nr, size_t d, float *out, size_t ldo)
{
    for (size_t r = 0; r < nr; r++)
        mdot_row(DSATTN_ROW_FP4E4M3, q, ldq, nh, rows[r], d, out + r * ldo);
}

static __attribute__((unused)) void
maxpy_fp4e4m3_rows_each(const float *p, size_t ldp, size_t nh, const uint8_t *const *rows,
                        size_t nr, size_t d, float *acc, size_t ldacc)
{
    float ph[64];
    for (size_t r = 0; r < nr; r++)
        for (size_t h0 = 0; h0 < nh; h0 += 64) {
            const size_t n = nh - h0 < 64 ? nh - h0 : 64;
            for (size_t h = 0; h < n; h++) ph[h] = p[(h0 + h) * ldp + r];
            maxpy_row(DSATTN_ROW_FP4E4M3, ph, n, rows[r], d, acc + h0 * ldacc, ldacc);
        }
}
