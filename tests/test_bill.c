/* test_bill.c - `dsattn bill` against the structures' own dimensions.
 *
 * The bill measures bytes per token from live allocations; this test
 * recomputes every row from the config files' dimensions with the
 * formulas of docs/semantics.md §11 and compares (a hidden constant
 * or a wrong cache layout in any generation shows up as a mismatch).  It
 * also checks the 437x ratio, that a decode step's counters saw at least
 * the cache bytes and attention FLOPs the structure implies, and that the
 * two-depth affine extrapolation of a dense row equals a direct
 * measurement. */
#include "harness.h"

#include <cjson/cJSON.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CONFIGS DSATTN_TEST_DATA "/../../configs"

static cJSON *run_json(const char *args)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "DSATTN_CONFIGS=%s %s bill --quiet --format json %s", CONFIGS,
             DSATTN_CLI_PATH, args);
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (size_t k; buf && (k = fread(buf + n, 1, cap - n - 1, p)) > 0;) {
        n += k;
        if (n + 1 == cap) buf = realloc(buf, cap *= 2);
    }
    int rc = pclose(p);
    CHECK_MSG(rc == 0, "%s exited with %d", cmd, rc);
    if (!buf) return NULL;
    buf[n] = 0;
    cJSON *j = cJSON_Parse(buf);
    CHECK_MSG(j != NULL, "output of '%s' is not JSON", cmd);
    free(buf);
    return j;
}

static cJSON *load_cfg(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", CONFIGS, name);
    FILE *f = fopen(path, "rb");
    CHECK_MSG(f != NULL, "cannot open %s", path);
    if (!f) return NULL;
    char buf[1 << 15];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return cJSON_Parse(buf);
}

static double num(const cJSON *j, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    CHECK_MSG(cJSON_IsNumber(v), "config key %s missing", k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static int in_list(const cJSON *j, const char *k, int l)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, k), *e;
    cJSON_ArrayForEach(e, a) if ((int)e->valuedouble == l) return 1;
    return 0;
}

/* ==== Bytes per token from the dimensions alone ========================= */

/* DeepSeek-LLM (Llama): K and V of every KV head, bf16. */
static double llama_bpt(const cJSON *c)
{
    double hd = num(c, "hidden_size") / num(c, "num_attention_heads");
    return 2.0 * num(c, "num_hidden_layers") * num(c, "num_key_value_heads") * hd * 2.0;
}

/* V3: bf16 latent + RoPE key (kv_cache + pe_cache).  V3.2: FlashMLA FP8
 * rows (latent E4M3 + an fp32 scale per 128 + bf16 RoPE) + FP8 index key
 * with one fp32 scale. */
static double mla_bpt(const cJSON *c, int dsa)
{
    double kl = num(c, "kv_lora_rank"), dr = num(c, "qk_rope_head_dim"), L = num(c, "n_layers");
    if (!dsa) return L * (kl + dr) * 2.0;
    return L * ((kl + 4.0 * kl / 128.0 + 2.0 * dr) + (num(c, "index_head_dim") + 4.0));
}

/* V4: MODEL1 rows (nope E4M3 | rope bf16 | UE8M0 per 64 nope | 1 pad) per
 * compressed entry; CSA (ratio 4) adds an FP4 index key (E2M1 + UE8M0/32). */
static double v4_bpt(const cJSON *c)
{
    double hd = num(c, "head_dim"), rd = num(c, "rope_head_dim"), di = num(c, "index_head_dim");
    double row = (hd - rd) + 2.0 * rd + (hd - rd) / 64.0 + 1.0, idx = di / 2.0 + di / 32.0;
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(c, "compress_ratios");
    int L = (int)num(c, "n_layers");
    double t = 0;
    for (int l = 0; l < L; l++) {
        double m = cJSON_GetArrayItem(r, l)->valuedouble;
        if (m == 4) t += (row + idx) / 4.0;
        else if (m > 0) t += row / m;
    }
    return t;
}

/* V4.1: each KV source layer keeps FP4 entries (E2M1 + E4M3 per 16) and FP4
 * index keys, one per `ratio` tokens; every other layer reads them. */
static double v41_bpt(const cJSON *c)
{
    double hd = num(c, "head_dim"), di = num(c, "index_head_dim");
    double row = hd / 2.0 + hd / 16.0 + di / 2.0 + di / 32.0;
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(c, "compress_ratios");
    double t = 0;
    for (int l = 0; l < (int)num(c, "n_layers"); l++)
        if (in_list(c, "kv_source_layers", l)) t += row / cJSON_GetArrayItem(r, l)->valuedouble;
    return t;
}

static const cJSON *row_of(const cJSON *out, const char *key)
{
    const cJSON *rows = cJSON_GetObjectItemCaseSensitive(out, "rows"), *r;
    cJSON_ArrayForEach(r, rows) {
        const cJSON *k = cJSON_GetObjectItemCaseSensitive(r, "key");
        if (cJSON_IsString(k) && !strcmp(k->valuestring, key)) return r;
    }
    return NULL;
}

DSATTN_TEST(bill, bytes_per_token_match_the_dimensions_of_every_config)
{
    cJSON *out = run_json("--kv-only");
    if (!out) return;
    struct { const char *key, *cfg; int fam; double published; } want[] = {
        { "v1-7b", "deepseek-llm-7b.json", 0, 491520 },
        { "v1-67b", "deepseek-llm-67b.json", 0, 389120 },
        { "v3", "deepseek-v3.json", 1, 70272 },
        { "v3.2", "deepseek-v3.2.json", 2, 48068 },
        { "v4-flash", "deepseek-v4-flash.json", 3, 3514.25 },
        { "v4-pro", "deepseek-v4-pro.json", 3, 5031.4375 },
        { "v4.1-flash", "deepseek-v4.1-flash.json", 4, 890 },
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const cJSON *r = row_of(out, want[i].key);
        CHECK_MSG(r != NULL, "row %s missing", want[i].key);
        if (!r) continue;
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(r, "status");
        CHECK_MSG(cJSON_IsString(st) && !strcmp(st->valuestring, "kv-only"), "row %s: status %s",
                  want[i].key, cJSON_IsString(st) ? st->valuestring : "?");
        cJSON *c = load_cfg(want[i].cfg);
        if (!c) continue;
        double dims = want[i].fam == 0 ? llama_bpt(c)
                    : want[i].fam == 1 ? mla_bpt(c, 0)
                    : want[i].fam == 2 ? mla_bpt(c, 1)
                    : want[i].fam == 3 ? v4_bpt(c) : v41_bpt(c);
        /* every generation's decode scratch is sized at creation and billed */
        CHECK_MSG(num(r, "scratch_bytes") > 0, "%s: no scratch in the bill", want[i].key);
        double got = num(r, "global_kv_bytes_per_token");
        CHECK_MSG(got == dims, "%s: measured %.4f B/token, the dimensions give %.4f",
                  want[i].key, got, dims);
        /* and the published figure (a config edit would show here) */
        CHECK_MSG(fabs(dims - want[i].published) < 1e-9, "%s: dimensions give %.4f, published %.4f",
                  want[i].key, dims, want[i].published);
        cJSON_Delete(c);
    }
    const cJSON *v41 = row_of(out, "v4.1-flash");
    if (v41) {
        double ratio = num(v41, "ratio_to_v1_67b");
        CHECK_MSG(fabs(ratio - 389120.0 / 890.0) < 1e-9 && (int)(ratio + 0.5) == 437,
                  "V4.1 ratio to V1-67B %.4f, want 437.2", ratio);
        CHECK(num(v41, "window_bytes") == 40.0 * 128 * 528);   /* 40 FP8 rings of 128 rows */
        /* the decode scratch is in the per-sequence column: the indexer's
         * 4 floats per entry of a ratio-1 index source at 1M entries */
        CHECK_MSG(num(v41, "scratch_bytes") >= 16.0 * 1048576, "V4.1 scratch %.0f B",
                  num(v41, "scratch_bytes"));
    }
    const cJSON *g = row_of(out, "v1-67b");
    if (g) CHECK(num(g, "window_bytes") == 0 && num(g, "state_bytes") == 0);
    cJSON_Delete(out);
}

/* One real decode step of DeepSeek-LLM-7B at 16K: the counters must have
 * seen the whole cache (491,520 B per token) and 4*H*d FLOPs per key per
 * layer; and the two-depth affine fit (forced by a tiny budget) must give
 * the same numbers as the direct measurement - dense work is affine. */
DSATTN_TEST(bill, dense_decode_counters_and_affine_fit_seed1)
{
    cJSON *direct = run_json("--only v1-7b --ctx 16K");
    cJSON *fit = run_json("--only v1-7b --ctx 16K --budget-mib 1");
    const cJSON *a = direct ? row_of(direct, "v1-7b") : NULL, *b = fit ? row_of(fit, "v1-7b") : NULL;
    CHECK(a != NULL && b != NULL);
    if (a && b) {
        CHECK(!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "extrapolated")));
        CHECK(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(b, "extrapolated")));
        double ctx = 16384, fl = num(a, "attn_flops_per_token"), by = num(a, "attn_bytes_per_token");
        CHECK_MSG(by >= 491520.0 * ctx, "bytes %.4g < the cache %.4g", by, 491520.0 * ctx);
        CHECK_MSG(fl >= 4.0 * 32 * 128 * ctx * 30, "flops %.4g too low", fl);
        /* and not wildly above: projections are 4 * 2 * 4096^2 per layer */
        CHECK_MSG(fl <= 4.0 * 32 * 128 * ctx * 30 * 1.2 + 30 * 8.0 * 4096 * 4096 * 1.01,
                  "flops %.4g too high", fl);
        CHECK_MSG(num(b, "attn_flops_per_token") == fl, "fit %.6g vs direct %.6g flops",
                  num(b, "attn_flops_per_token"), fl);
        CHECK_MSG(num(b, "attn_bytes_per_token") == by, "fit %.6g vs direct %.6g bytes",
                  num(b, "attn_bytes_per_token"), by);
    }
    cJSON_Delete(direct);
    cJSON_Delete(fit);
}
