/* test_loader.c - the checkpoint loader: golden checkpoints of every
 * generation validate as complete; weight descriptors decode FP8/FP4/BF16
 * exactly; the name maps agree with convert.py; configs (HF and inference)
 * parse and bad ones fail; the writer round-trips in every layout; and one
 * small defective checkpoint per defect, generated here, is rejected with a
 * status and a message naming file, tensor and byte offset - through the
 * library and through `dsattn info`'s exit code. */
#include "checkpoint.h"
#include "config.h"
#include "harness.h"
#include "jsoncfg.h"
#include "names.h"
#include "numfmt.h"
#include "safetensors.h"
#include "mha.h"
#include "mla.h"
#include "v4.h"
#include "v41.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DSATTN_ARRAY_LEN_T(a) (sizeof(a) / sizeof((a)[0]))

static const char *gold(const char *rel) { return dsattn_test_data(rel); }

/* A fresh scratch folder per test. */
static char tdir[DSATTN_TEST_PATH];
static const char *scratch(const char *tag)
{
    dsattn_test_tmp(tdir, sizeof tdir, "dsattn_test_loader_%s", tag);
    char cmd[2 * DSATTN_TEST_PATH + 64];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", tdir, tdir);
    if (system(cmd) != 0) dsattn_test_fail(__FILE__, __LINE__, "cannot create %s", tdir);
    return tdir;
}
static void cleanup(void)
{
    char cmd[2 * DSATTN_TEST_PATH + 64];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tdir);
    if (system(cmd) != 0) { /* best effort */ }
}

static char pbuf[4][512];
static const char *pjoin(int slot, const char *dir, const char *name)
{
    snprintf(pbuf[slot], sizeof pbuf[slot], "%s/%s", dir, name);
    return pbuf[slot];
}

static size_t issues_seen;
static char last_issue[700];
static void on_issue(void *ud, dsattn_status st, const char *msg)
{
    (void)ud;
    (void)st;
    issues_seen++;
    snprintf(last_issue, sizeof last_issue, "%s", msg);
}

static dsattn_status validate_path(const char *path, const char *cfg, size_t *n_issues,
                                   char *err, size_t errlen)
{
    dsattn_ckpt *ck = NULL;
    dsattn_status st = dsattn_ckpt_open(&ck, path, cfg, err, errlen);
    if (st != DSATTN_OK) return st;
    issues_seen = 0;
    last_issue[0] = 0;
    st = dsattn_ckpt_validate(ck, on_issue, NULL, n_issues);
    if (st != DSATTN_OK) snprintf(err, errlen, "%s", last_issue);
    dsattn_ckpt_close(ck);
    return st;
}

/* ==== golden checkpoints ================================================ */

DSATTN_TEST(loader, golden_checkpoints_complete)
{
    const char *cases[] = { "golden/v3/tiny-seed0", "golden/v32/tiny-seed0",
                            "golden/v4/tiny-seed0", "golden/v41/tiny-seed0",
                            "golden/v41/tiny-seed2-fp8" };
    const dsattn_arch arch[] = { DSATTN_ARCH_V3, DSATTN_ARCH_V32, DSATTN_ARCH_V4,
                                 DSATTN_ARCH_V41, DSATTN_ARCH_V41 };
    for (size_t i = 0; i < 5; i++) {
        char w[512], err[700] = "";
        snprintf(w, sizeof w, "%s/weights.safetensors", gold(cases[i]));
        dsattn_ckpt *ck = NULL;
        dsattn_status st = dsattn_ckpt_open(&ck, w, NULL, err, sizeof err);
        CHECK_MSG(st == DSATTN_OK, "%s: %s", cases[i], err);
        if (!ck) continue;
        const dsattn_model_config *c = dsattn_ckpt_config(ck);
        CHECK(c && c->arch == arch[i]);
        size_t n = 99;
        issues_seen = 0;
        st = dsattn_ckpt_validate(ck, on_issue, NULL, &n);
        CHECK_MSG(st == DSATTN_OK && n == 0, "%s: %zu issues, last: %s", cases[i], n,
                  last_issue);
        /* every stored tensor is an expected one: nothing silently ignored */
        dsattn_tensor_spec *sp = NULL;
        size_t nsp = 0;
        CHECK_OK(dsattn_expected_tensors(c, &sp, &nsp, err, sizeof err));
        for (size_t k = 0; k < dsattn_ckpt_count(ck); k++) {
            char d[200];
            dsattn_name_describe(c, sp, nsp, dsattn_ckpt_at(ck, k)->name, d, sizeof d);
            CHECK_MSG(strncmp(d, "layer ", 6) == 0 && !strstr(d, "not used"),
                      "%s: %s -> %s", cases[i], dsattn_ckpt_at(ck, k)->name, d);
        }
        free(sp);
        dsattn_ckpt_close(ck);
    }
}

/* FP8 E4M3 with 32x32 UE8M0 blocks, as in the V4.1 fp8 golden case:
 * the descriptor must decode to code * 2^(e-127) per block, exactly. */
DSATTN_TEST(loader, fp8_descriptor_decodes_exactly)
{
    char w[512], err[700] = "";
    snprintf(w, sizeof w, "%s/weights.safetensors", gold("golden/v41/tiny-seed2-fp8"));
    dsattn_ckpt *ck = NULL;
    CHECK_OK(dsattn_ckpt_open(&ck, w, NULL, err, sizeof err));
    if (!ck) return;
    dsattn_weight wt;
    CHECK_OK(dsattn_ckpt_weight(ck, "layers.3.attn.wq_b", DSATTN_WMASK_ANY, 256, 64, &wt,
                                err, sizeof err));
    CHECK(wt.kind == DSATTN_W_FP8 && wt.block == 32 && wt.rows == 256 && wt.cols == 64);
    const dsattn_ckpt_entry *we = dsattn_ckpt_find(ck, "layers.3.attn.wq_b.weight");
    const dsattn_ckpt_entry *se = dsattn_ckpt_find(ck, "layers.3.attn.wq_b.scale");
    CHECK(we && se && wt.data == we->t->data);       /* borrowed, not copied */
    float row[64], want[64];
    int bad = 0;
    for (size_t r = 0; r < 256; r += 37) {
        dsattn_weight_row_f32(&wt, r, row);
        const uint8_t *codes = (const uint8_t *)we->t->data + r * 64;
        const uint8_t *sc = (const uint8_t *)se->t->data + (r / 32) * 2;
        for (size_t c = 0; c < 64; c++) {
            want[c] = dsattn_e4m3_to_f32(codes[c]) * ldexpf(1.0f, (int)sc[c / 32] - 127);
            bad += row[c] != want[c];
        }
    }
    CHECK_EQ_INT(bad, 0);
    /* bf16-only caller: dequantized once, RNE of the fp32 product */
    dsattn_weight wb;
    CHECK_OK(dsattn_ckpt_weight(ck, "layers.3.attn.wq_b", DSATTN_WMASK(DSATTN_W_BF16), 256,
                                64, &wb, err, sizeof err));
    CHECK(wb.kind == DSATTN_W_BF16 && wb.owned != NULL);
    float rb[64];
    dsattn_weight_row_f32(&wt, 100, row);
    dsattn_weight_row_f32(&wb, 100, rb);
    for (int c = 0; c < 64; c++) want[c] = dsattn_round_bf16(row[c]);
    CHECK_BITS("bf16 dequant", rb, want, 64);
    /* wrong shape for the config */
    dsattn_weight wx;
    CHECK_EQ_INT(dsattn_ckpt_weight(ck, "layers.3.attn.wq_b", DSATTN_WMASK_ANY, 128, 64, &wx,
                                    err, sizeof err), DSATTN_ERR_FORMAT);
    CHECK(strstr(err, "wrong shape") && strstr(err, "layers.3.attn.wq_b.weight") &&
          strstr(err, "file offset"));
    CHECK_EQ_INT(dsattn_ckpt_weight(ck, "layers.3.attn.nope", DSATTN_WMASK_ANY, 0, 0, &wx,
                                    err, sizeof err), DSATTN_ERR_NOT_FOUND);
    /* gemv reference agrees with the decoded rows */
    float x[64], y[256];
    for (int c = 0; c < 64; c++) x[c] = (float)(c % 7) - 3.0f;
    CHECK_EQ_INT(dsattn_weight_gemv_ref(&wt, x, y), 0);
    dsattn_weight_row_f32(&wt, 5, row);
    double acc = 0;
    for (int c = 0; c < 64; c++) acc += (double)row[c] * x[c];
    CHECK(y[5] == (float)acc);
    /* vectors */
    float sink[4];
    CHECK_OK(dsattn_ckpt_vector_f32(ck, "layers.0.attn.attn_sink", sink, 4, err, sizeof err));
    CHECK_EQ_INT(dsattn_ckpt_vector_f32(ck, "layers.0.attn.attn_sink", sink, 3, err,
                                        sizeof err), DSATTN_ERR_FORMAT);
    dsattn_weight_release(&wt);
    dsattn_weight_release(&wb);
    dsattn_weight_release(NULL);
    dsattn_ckpt_close(ck);
}

/* ==== FP4 and unaligned tensors via a hand-written file ================= */

DSATTN_TEST(loader, fp4_and_unaligned)
{
    const char *d = scratch("fp4");
    enum { R = 4, C = 64 };
    uint8_t packed[R * C / 2], sc[R * C / 32];
    for (int i = 0; i < R * C / 2; i++) packed[i] = (uint8_t)(i * 37 + 11);
    for (int i = 0; i < R * C / 32; i++) sc[i] = (uint8_t)(120 + i);
    uint16_t bf[3 * 5];
    for (int i = 0; i < 15; i++) bf[i] = dsattn_f32_to_bf16((float)i - 7.0f);
    dsattn_st_writer *w = dsattn_st_writer_create();
    int64_t s1[2] = { R, C / 2 }, s2[2] = { R, C / 32 }, s3[2] = { 3, 5 }, s0[1] = { 1 };
    uint8_t pad = 0;
    CHECK_OK(dsattn_st_writer_add(w, "pad", DSATTN_DT_U8, 1, s0, &pad)); /* misalign */
    CHECK_OK(dsattn_st_writer_add(w, "e.w1.weight", DSATTN_DT_I8, 2, s1, packed));
    CHECK_OK(dsattn_st_writer_add(w, "e.w1.scale", DSATTN_DT_F8_E8M0, 2, s2, sc));
    CHECK_OK(dsattn_st_writer_add(w, "b.weight", DSATTN_DT_BF16, 2, s3, bf));
    int64_t s4[2] = { R, C };
    CHECK_OK(dsattn_st_writer_add(w, "e.w2.weight", DSATTN_DT_F4, 2, s4, packed));
    CHECK_OK(dsattn_st_writer_add(w, "e.w2.scale", DSATTN_DT_F8_E8M0, 2, s2, sc));
    CHECK_OK(dsattn_st_writer_add(w, "e.w3.weight", DSATTN_DT_F4, 2, s4, packed));
    char err[700] = "";
    CHECK_OK(dsattn_st_writer_save(w, pjoin(0, d, "model.safetensors"), err, sizeof err));
    dsattn_st_writer_destroy(w);
    dsattn_ckpt *ck = NULL;
    CHECK_OK(dsattn_ckpt_open(&ck, d, NULL, err, sizeof err));
    if (!ck) return;
    CHECK(dsattn_ckpt_config(ck) == NULL);
    dsattn_weight wt;
    CHECK_OK(dsattn_ckpt_weight(ck, "e.w1", DSATTN_WMASK_ANY, R, C, &wt, err, sizeof err));
    CHECK(wt.kind == DSATTN_W_FP4 && wt.cols == C && wt.scale_e8m0 != NULL);
    float row[C];
    int bad = 0;
    for (int r = 0; r < R; r++) {
        dsattn_weight_row_f32(&wt, (size_t)r, row);
        for (int c = 0; c < C; c++) {
            uint8_t b = packed[r * C / 2 + c / 2];
            float v = dsattn_e2m1_table[(c & 1) ? b >> 4 : b & 15] *
                      ldexpf(1.0f, sc[r * 2 + c / 32] - 127);
            bad += row[c] != v;
        }
    }
    CHECK_EQ_INT(bad, 0);
    /* the same values as safetensors' own F4 (shape in values): same bytes */
    dsattn_weight wf;
    CHECK_OK(dsattn_ckpt_weight(ck, "e.w2", DSATTN_WMASK_ANY, R, C, &wf, err, sizeof err));
    CHECK(wf.kind == DSATTN_W_FP4 && wf.rows == R && wf.cols == C);
    CHECK(wf.data && memcmp(wf.data, wt.data, R * C / 2) == 0 &&
          memcmp(wf.scale_e8m0, wt.scale_e8m0, R * C / 32) == 0);
    dsattn_weight_release(&wf);
    /* F4 without its E8M0 scale is not a weight dsattn can read */
    CHECK_EQ_INT(dsattn_ckpt_weight(ck, "e.w3", DSATTN_WMASK_ANY, R, C, &wf, err, sizeof err),
                 DSATTN_ERR_FORMAT);
    CHECK(strstr(err, "e.w3.weight") != NULL);
    dsattn_weight_release(&wt);
    /* BF16 at an odd address: copied so uint16 loads are legal */
    CHECK_OK(dsattn_ckpt_weight(ck, "b", DSATTN_WMASK_ANY, 3, 5, &wt, err, sizeof err));
    CHECK(wt.kind == DSATTN_W_BF16 && ((uintptr_t)wt.data % 2) == 0);
    const dsattn_ckpt_entry *be = dsattn_ckpt_find(ck, "b.weight");
    CHECK(be && ((uintptr_t)be->t->data % 2) == 1 && wt.owned != NULL);
    CHECK(((const uint16_t *)wt.data)[14] == bf[14]);
    dsattn_weight_release(&wt);
    /* F32 accepted only: bf16 -> fp32 exactly */
    CHECK_OK(dsattn_ckpt_weight(ck, "b", DSATTN_WMASK(DSATTN_W_F32), 3, 5, &wt, err, sizeof err));
    CHECK(wt.kind == DSATTN_W_F32 && ((const float *)wt.data)[14] == 7.0f);
    dsattn_weight_release(&wt);
    /* validate without a config is an error, not a silent pass */
    size_t n = 0;
    CHECK_EQ_INT(dsattn_ckpt_validate(ck, NULL, NULL, &n), DSATTN_ERR_NOT_FOUND);
    dsattn_ckpt_close(ck);
    cleanup();
}

/* ==== names ============================================================= */

DSATTN_TEST(loader, name_maps_follow_convert_py)
{
    struct { dsattn_arch a; const char *in, *out; } cases[] = {
        { DSATTN_ARCH_V3, "model.layers.0.self_attn.q_a_proj.weight", "layers.0.attn.wq_a.weight" },
        { DSATTN_ARCH_V3, "model.layers.0.self_attn.q_a_proj.weight_scale_inv", "layers.0.attn.wq_a.scale" },
        { DSATTN_ARCH_V3, "model.layers.7.self_attn.q_a_layernorm.weight", "layers.7.attn.q_norm.weight" },
        { DSATTN_ARCH_V3, "model.layers.7.self_attn.kv_a_proj_with_mqa.weight", "layers.7.attn.wkv_a.weight" },
        { DSATTN_ARCH_V3, "model.layers.7.self_attn.kv_a_layernorm.weight", "layers.7.attn.kv_norm.weight" },
        { DSATTN_ARCH_V3, "model.layers.7.self_attn.kv_b_proj.weight", "layers.7.attn.wkv_b.weight" },
        { DSATTN_ARCH_V3, "model.layers.7.self_attn.o_proj.weight", "layers.7.attn.wo.weight" },
        { DSATTN_ARCH_V3, "model.layers.7.input_layernorm.weight", "layers.7.attn_norm.weight" },
        { DSATTN_ARCH_V3, "model.layers.7.mlp.experts.3.gate_proj.weight", "layers.7.ffn.experts.3.w1.weight" },
        { DSATTN_ARCH_V3, "model.norm.weight", "norm.weight" },
        { DSATTN_ARCH_V32, "model.layers.2.self_attn.indexer.wq_b.weight", "layers.2.attn.indexer.wq_b.weight" },
        { DSATTN_ARCH_V32, "model.layers.2.self_attn.indexer.k_norm.bias", "layers.2.attn.indexer.k_norm.bias" },
        { DSATTN_ARCH_V32, "model.layers.2.self_attn.indexer.wk.weight_scale_inv", "layers.2.attn.indexer.wk.scale" },
        { DSATTN_ARCH_V4, "layers.0.attn.wq_a.scale", "layers.0.attn.wq_a.scale" },
        { DSATTN_ARCH_V4, "layers.0.attn.attn_sink", "layers.0.attn.attn_sink" },
        { DSATTN_ARCH_V41, "model.layers.0.self_attn.wkv.weight_scale_inv", "layers.0.attn.wkv.scale" },
        { DSATTN_ARCH_V41, "layers.2.attn.compressor.wgate.weight", "layers.2.attn.compressor.wgate.weight" },
        /* DeepSeek-LLM (llama): k_proj / v_proj get wk / wv; the V3 rules
         * (no such key in convert.py) leave them as they are */
        { DSATTN_ARCH_LLAMA, "model.layers.3.self_attn.q_proj.weight", "layers.3.attn.wq.weight" },
        { DSATTN_ARCH_LLAMA, "model.layers.3.self_attn.k_proj.weight", "layers.3.attn.wk.weight" },
        { DSATTN_ARCH_LLAMA, "model.layers.3.self_attn.v_proj.weight", "layers.3.attn.wv.weight" },
        { DSATTN_ARCH_LLAMA, "model.layers.3.self_attn.o_proj.weight", "layers.3.attn.wo.weight" },
        { DSATTN_ARCH_LLAMA, "model.layers.3.input_layernorm.weight", "layers.3.attn_norm.weight" },
        { DSATTN_ARCH_LLAMA, "model.layers.3.mlp.up_proj.weight", "layers.3.ffn.w3.weight" },
        { DSATTN_ARCH_V3, "model.layers.3.self_attn.k_proj.weight", "layers.3.attn.k_proj.weight" },
    };
    for (size_t i = 0; i < DSATTN_ARRAY_LEN_T(cases); i++) {
        char out[DSATTN_NAME_MAX];
        CHECK(dsattn_name_to_inference(cases[i].a, cases[i].in, out, sizeof out) >= 0);
        CHECK_MSG(strcmp(out, cases[i].out) == 0, "%s -> %s, want %s", cases[i].in, out,
                  cases[i].out);
    }
    /* inference -> HF -> inference is the identity for every expected name */
    const char *cfgs[] = { "golden/v3/tiny-seed0/config.json", "golden/v32/tiny-seed0/config.json",
                           "golden/v4/tiny-seed0/config.json", "golden/v41/tiny-seed0/config.json" };
    for (size_t k = 0; k < 4; k++) {
        dsattn_model_config c;
        char err[400];
        CHECK_OK(dsattn_config_load(&c, gold(cfgs[k]), err, sizeof err));
        dsattn_tensor_spec *sp = NULL;
        size_t n = 0;
        CHECK_OK(dsattn_expected_tensors(&c, &sp, &n, err, sizeof err));
        for (size_t i = 0; i < n; i++) {
            const char *sfx[] = { ".weight", ".scale", "" };
            for (int j = 0; j < 3; j++) {
                if ((sp[i].kind == DSATTN_TS_LINEAR) != (j < 2)) continue;
                char inf[200], hf[200], back[200];
                snprintf(inf, sizeof inf, "%s%s", sp[i].name, sfx[j]);
                CHECK(dsattn_name_to_hf(c.arch, inf, hf, sizeof hf) >= 0);
                CHECK(dsattn_name_to_inference(c.arch, hf, back, sizeof back) >= 0);
                CHECK_MSG(strcmp(inf, back) == 0, "%s -> %s -> %s", inf, hf, back);
                if (c.arch == DSATTN_ARCH_V3) CHECK(strncmp(hf, "model.layers.", 13) == 0);
            }
        }
        free(sp);
    }
}

/* ==== configs =========================================================== */

static dsattn_status cfg_from(const char *json, dsattn_model_config *c, char *err, size_t el)
{
    cJSON *j = NULL;
    dsattn_status st = dsattn_jcfg_parse(&j, json, strlen(json), "t.json", err, el);
    if (st != DSATTN_OK) return st;
    st = dsattn_config_from_json(c, j, "t.json", err, el);
    cJSON_Delete(j);
    return st;
}

DSATTN_TEST(loader, v41_flash_plan)
{
    dsattn_model_config c;
    char err[400] = "";
    char p[512];
    snprintf(p, sizeof p, "%s/../../configs/deepseek-v4.1-flash.json", gold(""));
    if (access(p, R_OK) != 0) dsattn_test_skip("configs/deepseek-v4.1-flash.json not present");
    CHECK_OK(dsattn_config_load(&c, p, err, sizeof err));
    dsattn_v41_plan *pl = malloc(sizeof *pl);
    CHECK_OK(dsattn_v41_plan_from_config(&c, pl, err, sizeof err));
    CHECK_EQ_INT(pl->n_full, 4);
    CHECK_EQ_INT(pl->n_reindex, 4);
    CHECK_EQ_INT(pl->n_reuse, 30);
    CHECK_EQ_INT(pl->n_swa, 2);
    CHECK_EQ_INT(pl->n_mtp, 3);
    CHECK(pl->layer[20].mode == DSATTN_V41_FULL && pl->layer[20].is_candidate_source);
    CHECK(pl->layer[24].mode == DSATTN_V41_REINDEX && pl->layer[24].kv_source == 20);
    CHECK(pl->layer[25].mode == DSATTN_V41_REUSE && pl->layer[25].index_source == 24);
    CHECK(pl->layer[7].kv_source == 2 && pl->layer[7].index_source == 2);
    CHECK(pl->layer[41].mode == DSATTN_V41_MTP);
    free(pl);
}

#define V41_TEXT(ratios, kv, idx, extra)                                           \
    "{\"architectures\":[\"DeepseekV41ForCausalLM\"],\"model_type\":\"deepseek_v41\"," \
    "\"quantization_config\":{\"quant_method\":\"fp8\",\"weight_block_size\":[32,32]," \
    "\"scale_fmt\":\"ue8m0\"},\"text_config\":{\"model_type\":\"deepseek_v41_text\","  \
    "\"hidden_size\":256,\"num_hidden_layers\":6,\"num_attention_heads\":4,"          \
    "\"head_dim\":64,\"qk_rope_head_dim\":16,\"q_lora_rank\":64,\"o_lora_rank\":64,"   \
    "\"o_groups\":2,\"rms_norm_eps\":1e-20,\"rope_theta\":10000,"                      \
    "\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":16,\"beta_fast\":32,"        \
    "\"beta_slow\":1,\"original_max_position_embeddings\":65536},"                     \
    "\"sliding_window\":8,\"compress_ratios\":" ratios ",\"compress_rope_theta\":160000," \
    "\"kv_source_layer_ids\":" kv ",\"index_source_layer_ids\":" idx ","               \
    "\"index_n_heads\":8,\"index_head_dim\":32,\"index_topk\":6,"                     \
    "\"candidate_source_layer_id\":2,\"candidate_topk_blocks\":4,"                    \
    "\"candidate_block_size\":2" extra "}}"

DSATTN_TEST(loader, hf_config_v41_text_config)
{
    dsattn_model_config c;
    char err[600] = "";
    CHECK_OK(cfg_from(V41_TEXT("[0,0,1,1,1,1,0]", "[2]", "[2,4]",
                               ",\"num_nextn_predict_layers\":1"), &c, err, sizeof err));
    CHECK(c.arch == DSATTN_ARCH_V41 && c.hf_keys && c.dim == 256 && c.n_layers == 6 &&
          c.n_mtp == 1 && c.weight_block == 32 && c.window_size == 8 &&
          !strcmp(c.dtype, "fp8") && c.original_seq_len == 65536 && c.rope_factor == 16);
    dsattn_v41_plan pl;
    CHECK_OK(dsattn_v41_plan_from_config(&c, &pl, err, sizeof err));
    CHECK(pl.layer[4].mode == DSATTN_V41_REINDEX && pl.layer[6].mode == DSATTN_V41_MTP);

    /* contradictions and omissions */
    struct { const char *json; dsattn_status st; const char *needle; } bad[] = {
        { V41_TEXT("[0,0,1,1,1,1]", "[2]", "[2,4]", ",\"num_nextn_predict_layers\":1"),
          DSATTN_ERR_FORMAT, "compress_ratios has 6 entries" },
        { V41_TEXT("[0,0,1,1,1,1,0]", "[1]", "[1,4]", ""), DSATTN_ERR_FORMAT,
          "ratio 0" },                                      /* source with ratio 0 */
        { V41_TEXT("[0,0,1,1,1,1,0]", "[2]", "[2,6]", ""), DSATTN_ERR_FORMAT,
          "index source layer 6" },                         /* source in MTP range */
        { V41_TEXT("[0,0,1,1,1,1,0]", "[2]", "[4]", ""), DSATTN_ERR_FORMAT,
          "candidate_source_layer" },
        { V41_TEXT("[0,0,1,1,1,1,0]", "[2,4]", "[2]", ""), DSATTN_ERR_FORMAT,
          "kv source layer 4 is not an index source" },
        { V41_TEXT("[0,1,1,1,1,1,0]", "[2]", "[2,4]", ""), DSATTN_ERR_FORMAT,
          "no kv source" },
        { V41_TEXT("[0,0,2,1,1,1,0]", "[2]", "[2,4]", ""), DSATTN_ERR_FORMAT,
          "whose ratio is 2" },
        { V41_TEXT("[0,0,1,1,1,1,0]", "[2,2]", "[2,4]", ""), DSATTN_ERR_FORMAT, "twice" },
        { "{\"model_type\":\"mistral\",\"hidden_size\":8}", DSATTN_ERR_UNSUPPORTED, "mistral" },
        { "{\"model_type\":\"llama\",\"hidden_size\":8}", DSATTN_ERR_NOT_FOUND,
          "'num_hidden_layers'" },
        { "{\"dim\":256,\"n_layers\":3,\"kv_lora_rank\":64,\"qk_nope_head_dim\":32,"
          "\"qk_rope_head_dim\":16,\"v_head_dim\":32}", DSATTN_ERR_NOT_FOUND, "'n_heads'" },
        { "{\"dim\":256,\"n_layers\":3,\"n_heads\":4.5,\"kv_lora_rank\":64}",
          DSATTN_ERR_FORMAT, "'n_heads'" },
        { "{\"foo\":1}", DSATTN_ERR_FORMAT, "not a DeepSeek config" },
    };
    for (size_t i = 0; i < DSATTN_ARRAY_LEN_T(bad); i++) {
        err[0] = 0;
        dsattn_status st = cfg_from(bad[i].json, &c, err, sizeof err);
        CHECK_MSG(st == bad[i].st && strstr(err, bad[i].needle) && strstr(err, "t.json"),
                  "case %zu: status %d, err '%s' (want %d, '%s')", i, (int)st, err,
                  (int)bad[i].st, bad[i].needle);
    }
}

DSATTN_TEST(loader, hf_config_v3)
{
    const char *j =
        "{\"architectures\":[\"DeepseekV3ForCausalLM\"],\"model_type\":\"deepseek_v3\","
        "\"hidden_size\":7168,\"num_hidden_layers\":61,\"num_attention_heads\":128,"
        "\"q_lora_rank\":1536,\"kv_lora_rank\":512,\"qk_nope_head_dim\":128,"
        "\"qk_rope_head_dim\":64,\"v_head_dim\":128,\"rms_norm_eps\":1e-06,"
        "\"rope_theta\":10000,\"max_position_embeddings\":163840,"
        "\"num_nextn_predict_layers\":1,"
        "\"rope_scaling\":{\"beta_fast\":32,\"beta_slow\":1,\"factor\":40,\"mscale\":1.0,"
        "\"mscale_all_dim\":1.0,\"original_max_position_embeddings\":4096,\"type\":\"yarn\"},"
        "\"quantization_config\":{\"activation_scheme\":\"dynamic\",\"fmt\":\"e4m3\","
        "\"quant_method\":\"fp8\",\"weight_block_size\":[128,128]}}";
    dsattn_model_config c;
    char err[400] = "";
    CHECK_OK(cfg_from(j, &c, err, sizeof err));
    CHECK(c.arch == DSATTN_ARCH_V3 && c.n_layers == 61 && c.n_mtp == 1 &&
          c.weight_block == 128 && c.max_seq_len == 163840 && c.original_seq_len == 4096 &&
          c.rope_factor == 40 && c.kv_lora_rank == 512);
}

/* YaRN's beta_fast / beta_slow are ints in ModelArgs: an integral JSON
 * number (32 or 32.0) reads as that integer, in the HF rope_scaling object
 * and in the flat inference config alike; a fraction or a value no int64
 * holds is a FORMAT error naming the key (it was truncated, and 1e28 made
 * the conversion undefined: a fuzzer's find). */
DSATTN_TEST(loader, config_yarn_betas_are_integers)
{
    static const char *const hf =
        "{\"model_type\":\"deepseek_v3\",\"hidden_size\":7168,\"num_hidden_layers\":61,"
        "\"num_attention_heads\":128,\"q_lora_rank\":1536,\"kv_lora_rank\":512,"
        "\"qk_nope_head_dim\":128,\"qk_rope_head_dim\":64,\"v_head_dim\":128,"
        "\"rope_scaling\":{\"beta_fast\":%s,\"beta_slow\":1,\"factor\":40,"
        "\"original_max_position_embeddings\":4096,\"type\":\"yarn\"}}";
    static const char *const flat =
        "{\"vocab_size\":129280,\"dim\":7168,\"n_layers\":61,\"n_heads\":128,"
        "\"q_lora_rank\":1536,\"kv_lora_rank\":512,\"qk_nope_head_dim\":128,"
        "\"qk_rope_head_dim\":64,\"v_head_dim\":128,\"original_seq_len\":4096,"
        "\"rope_factor\":40,\"beta_fast\":32,\"beta_slow\":%s,\"mscale\":1.0}";
    static const struct { const char *v; int ok; } vals[] = {
        { "32", 1 }, { "32.0", 1 }, { "32.5", 0 }, { "1e28", 0 }, { "-1e28", 0 }, { "\"32\"", 0 },
    };
    for (int form = 0; form < 2; form++)
        for (size_t i = 0; i < DSATTN_ARRAY_LEN(vals); i++) {
            char j[1024], err[400] = "";
            snprintf(j, sizeof j, form ? flat : hf, vals[i].v);
            dsattn_model_config c;
            const dsattn_status st = cfg_from(j, &c, err, sizeof err);
            if (vals[i].ok) {
                CHECK_MSG(st == DSATTN_OK, "%s %s: %s", form ? "flat" : "HF", vals[i].v, err);
                CHECK(c.beta_fast == 32 && c.beta_slow == (form ? 32 : 1));
            } else {
                CHECK_MSG(st == DSATTN_ERR_FORMAT && strstr(err, form ? "beta_slow" : "beta_fast"),
                          "%s %s: status %d, '%s'", form ? "flat" : "HF", vals[i].v, (int)st, err);
            }
        }
}

/* A V4 HF config.json in the layout public V4 ports read (top-level keys,
 * HF names, one MTP entry at the end of compress_ratios, UE8M0 fp8
 * quantization_config): every field lands where the flat inference config
 * would put it. */
DSATTN_TEST(loader, hf_config_v4)
{
    const char *j =
        "{\"architectures\":[\"DeepseekV4ForCausalLM\"],\"model_type\":\"deepseek_v4\","
        "\"hidden_size\":4096,\"num_hidden_layers\":4,\"num_attention_heads\":64,"
        "\"num_key_value_heads\":1,\"head_dim\":512,\"qk_rope_head_dim\":64,"
        "\"q_lora_rank\":1024,\"o_lora_rank\":1024,\"o_groups\":8,\"sliding_window\":128,"
        "\"rms_norm_eps\":1e-06,\"max_position_embeddings\":1048576,"
        "\"rope_theta\":10000,\"compress_rope_theta\":160000,"
        "\"rope_scaling\":{\"type\":\"yarn\",\"factor\":16,"
        "\"original_max_position_embeddings\":65536,\"beta_fast\":32,\"beta_slow\":1},"
        "\"num_nextn_predict_layers\":1,\"compress_ratios\":[0,4,128,4,0],"
        "\"index_n_heads\":64,\"index_head_dim\":128,\"index_topk\":512,"
        "\"hc_mult\":4,\"n_routed_experts\":256,"
        "\"quantization_config\":{\"activation_scheme\":\"dynamic\",\"fmt\":\"e4m3\","
        "\"quant_method\":\"fp8\",\"scale_fmt\":\"ue8m0\",\"weight_block_size\":[128,128]}}";
    dsattn_model_config c;
    char err[400] = "";
    CHECK_OK(cfg_from(j, &c, err, sizeof err));
    CHECK_MSG(c.arch == DSATTN_ARCH_V4, "arch %d (%s)", (int)c.arch, err);
    CHECK(c.dim == 4096 && c.n_layers == 4 && c.n_mtp == 1 && c.n_heads == 64 &&
          c.head_dim == 512 && c.rope_head_dim == 64 && c.q_lora_rank == 1024 &&
          c.o_lora_rank == 1024 && c.o_groups == 8 && c.window_size == 128);
    CHECK(c.n_compress_ratios == 5 && c.compress_ratios[1] == 4 && c.compress_ratios[2] == 128);
    CHECK(c.rope_theta == 10000 && c.compress_rope_theta == 160000 && c.rope_factor == 16 &&
          c.original_seq_len == 65536 && c.beta_fast == 32 && c.beta_slow == 1);
    CHECK(c.index_n_heads == 64 && c.index_head_dim == 128 && c.index_topk == 512);
    CHECK(c.weight_block == 128 && strcmp(c.scale_fmt, "ue8m0") == 0 && c.norm_eps == 1e-6);
}

/* The official inference/config.json files carry no model_type: the
 * generation comes from the keys (kv_source_layers: V4.1; compress_ratios:
 * V4; index_n_heads: V3.2; kv_lora_rank: V3), and each generation's own
 * config reader takes them as the reference's ModelArgs would. */
DSATTN_TEST(loader, inference_configs_without_model_type)
{
    static const struct { const char *file; dsattn_arch arch; } cfgs[] = {
        { "deepseek-v3.json", DSATTN_ARCH_V3 },          { "deepseek-v3.2.json", DSATTN_ARCH_V32 },
        { "deepseek-v4-flash.json", DSATTN_ARCH_V4 },    { "deepseek-v4-pro.json", DSATTN_ARCH_V4 },
        { "deepseek-v4.1-flash.json", DSATTN_ARCH_V41 } };
    const char *d = scratch("infcfg");
    for (size_t k = 0; k < DSATTN_ARRAY_LEN_T(cfgs); k++) {
        char src[700], err[700] = "";
        snprintf(src, sizeof src, "%s/../../configs/%s", DSATTN_TEST_DATA, cfgs[k].file);
        cJSON *root = NULL;
        CHECK_OK(dsattn_jcfg_load(&root, src, err, sizeof err));
        if (!root) continue;
        cJSON_DeleteItemFromObjectCaseSensitive(root, "model_type");
        char *txt = cJSON_Print(root);
        cJSON_Delete(root);
        CHECK(txt != NULL && strstr(txt, "model_type") == NULL);
        const char *dst = pjoin(0, d, cfgs[k].file);
        FILE *f = fopen(dst, "w");
        CHECK(f != NULL && txt != NULL);
        if (f && txt) fputs(txt, f);
        if (f) fclose(f);
        cJSON_free(txt);
        dsattn_model_config c;
        CHECK_OK(dsattn_config_load(&c, dst, err, sizeof err));
        CHECK_MSG(c.arch == cfgs[k].arch, "%s: arch %d want %d", cfgs[k].file, (int)c.arch,
                  (int)cfgs[k].arch);
        CHECK_MSG(!c.hf_keys, "%s read as HF keys", cfgs[k].file);
        dsattn_status st;
        if (cfgs[k].arch == DSATTN_ARCH_V4) {
            dsattn_v4_config v4;
            st = dsattn_v4_config_load(&v4, dst, err, sizeof err);
            CHECK_MSG(st == DSATTN_OK && v4.dim == c.dim && v4.n_layers == c.n_layers,
                      "%s: %s", cfgs[k].file, err);
        } else if (cfgs[k].arch == DSATTN_ARCH_V41) {
            dsattn_v41_config v41;
            st = dsattn_v41_config_load(&v41, dst, err, sizeof err);
            CHECK_MSG(st == DSATTN_OK && v41.n_layers == 40 && v41.candidate_source_layer == 20,
                      "%s: %s", cfgs[k].file, err);
        } else {
            dsattn_mla_config mla;
            st = dsattn_mla_config_load(&mla, dst, err, sizeof err);
            CHECK_MSG(st == DSATTN_OK && mla.dsa == (cfgs[k].arch == DSATTN_ARCH_V32) &&
                          mla.kv_lora_rank == 512, "%s: %s", cfgs[k].file, err);
        }
    }
    cleanup();
}

/* ==== writer round trips ================================================ */

static const char *const mw_cfgs[] = {
    "golden/v3/tiny-seed0/config.json", "golden/v32/tiny-seed0/config.json",
    "golden/v4/tiny-seed0/config.json", "golden/v41/tiny-seed0/config.json" };

/* The golden V3.2 / V4 configs use ranks of 64, which FP8 Linears (input
 * quantized in blocks of 128) cannot take: the same config with q_lora_rank
 * and kv_lora_rank 128, written next to the scratch folder. */
static const char *fp8_ready(const char *src, char *out, size_t outlen)
{
    char err[700] = "";
    cJSON *root = NULL;
    if (dsattn_jcfg_load(&root, src, err, sizeof err) != DSATTN_OK) return src;
    const char *keys[] = { "q_lora_rank", "kv_lora_rank" };
    for (size_t i = 0; i < 2; i++)
        if (cJSON_GetObjectItemCaseSensitive(root, keys[i]))
            cJSON_ReplaceItemInObjectCaseSensitive(root, keys[i], cJSON_CreateNumber(128));
    char *txt = cJSON_Print(root);
    cJSON_Delete(root);
    dsattn_test_tmp(out, outlen, "dsattn_test_loader_fp8cfg.json");
    FILE *f = fopen(out, "w");
    if (f && txt) fputs(txt, f);
    if (f) fclose(f);
    cJSON_free(txt);
    return out;
}

DSATTN_TEST(loader, make_weights_every_layout)
{
    for (size_t k = 0; k < 4; k++) {
        dsattn_model_config c;
        char err[700] = "", cbuf[DSATTN_TEST_PATH];
        const char *cfg = fp8_ready(gold(mw_cfgs[k]), cbuf, sizeof cbuf);
        CHECK_OK(dsattn_config_load(&c, cfg, err, sizeof err));
        const char *d = scratch("mw");
        float ref[64];
        int have_ref = 0;
        for (int fmt = 0; fmt < 2; fmt++)
            for (int nm = 0; nm < 2; nm++)
                for (int shards = 1; shards <= 3; shards += 2) {
                    char sub[300];
                    snprintf(sub, sizeof sub, "%s/f%d_n%d_s%d", d, fmt, nm, shards);
                    dsattn_mw_params p = { 42, (dsattn_mw_format)fmt, (dsattn_mw_names)nm,
                                           shards, cfg };
                    dsattn_status st = dsattn_make_weights(&c, &p, sub, err, sizeof err);
                    CHECK_MSG(st == DSATTN_OK, "%s: %s", mw_cfgs[k], err);
                    size_t n = 0;
                    st = validate_path(sub, NULL, &n, err, sizeof err);
                    CHECK_MSG(st == DSATTN_OK && n == 0, "%s f%d n%d s%d: %s", mw_cfgs[k],
                              fmt, nm, shards, err);
                    dsattn_ckpt *ck = NULL;
                    if (dsattn_ckpt_open(&ck, sub, NULL, err, sizeof err) != DSATTN_OK)
                        continue;
                    CHECK_EQ_INT(dsattn_ckpt_n_files(ck), shards);
                    /* HF names where the release uses them */
                    const dsattn_ckpt_entry *e = dsattn_ckpt_find(ck, "layers.1.attn_norm.weight");
                    CHECK(e != NULL);
                    if (e && nm == 1 && c.arch == DSATTN_ARCH_V3)
                        CHECK(!strcmp(e->stored_name, "model.layers.1.input_layernorm.weight"));
                    /* same seed -> same values whatever the layout */
                    if (e && e->t->numel >= 64) {
                        float v[64];
                        float *all = malloc(e->t->numel * sizeof *all);
                        dsattn_st_to_f32(e->t, all, e->t->numel);
                        memcpy(v, all, sizeof v);
                        free(all);
                        if (!have_ref) memcpy(ref, v, sizeof v), have_ref = 1;
                        else CHECK_BITS("same seed", v, ref, 64);
                    }
                    /* FP8 files carry FP8 query weights */
                    dsattn_weight w;
                    const char *q = c.arch == DSATTN_ARCH_V3 || c.arch == DSATTN_ARCH_V32
                                        ? "layers.0.attn.wkv_b" : "layers.0.attn.wq_b";
                    CHECK_OK(dsattn_ckpt_weight(ck, q, DSATTN_WMASK_ANY, 0, 0, &w, err,
                                                sizeof err));
                    CHECK(w.kind == (fmt ? DSATTN_W_FP8 : DSATTN_W_BF16));
                    if (fmt) CHECK(w.block == (c.arch == DSATTN_ARCH_V41 ? 32u : 128u));
                    dsattn_weight_release(&w);
                    dsattn_ckpt_close(ck);
                }
        cleanup();
        if (cfg == cbuf) unlink(cbuf);
    }
}

/* ==== one defective checkpoint per defect =============================== */

/* Copy src (a safetensors file) to dst, letting `edit` drop or change each
 * tensor: return 0 keep, 1 drop; it may rewrite shape/bytes in place. */
typedef int (*edit_fn)(const char *name, int *ndim, int64_t *shape, uint8_t *bytes,
                       size_t nbytes, dsattn_dtype *dt);

static void rewrite(const char *src, const char *dst, edit_fn edit)
{
    char err[700];
    dsattn_st_file *f = NULL;
    CHECK_OK(dsattn_st_open(&f, src, err, sizeof err));
    if (!f) return;
    dsattn_st_writer *w = dsattn_st_writer_create();
    for (size_t i = 0; i < dsattn_st_count(f); i++) {
        const dsattn_st_tensor *t = dsattn_st_at(f, i);
        uint8_t *b = malloc(t->nbytes + 1);
        memcpy(b, t->data, t->nbytes);
        int nd = t->ndim;
        int64_t sh[8];
        memcpy(sh, t->shape, sizeof sh);
        dsattn_dtype dt = t->dtype;
        if (!edit(t->name, &nd, sh, b, t->nbytes, &dt))
            CHECK_OK(dsattn_st_writer_add(w, t->name, dt, nd, sh, b));
        free(b);
    }
    dsattn_st_close(f);
    CHECK_OK(dsattn_st_writer_save(w, dst, err, sizeof err));
    dsattn_st_writer_destroy(w);
}

static int drop_wkv(const char *n, int *nd, int64_t *sh, uint8_t *b, size_t nb, dsattn_dtype *dt)
{
    (void)nd, (void)sh, (void)b, (void)nb, (void)dt;
    return strcmp(n, "layers.2.attn.compressor.wkv.weight") == 0;
}
static int reshape_norm(const char *n, int *nd, int64_t *sh, uint8_t *b, size_t nb, dsattn_dtype *dt)
{
    (void)b, (void)nb, (void)dt;
    if (!strcmp(n, "layers.1.attn.q_norm.weight")) {  /* [64] -> [2, 32] */
        *nd = 2;
        sh[0] = 2;
        sh[1] = 32;
    }
    return 0;
}
static int nan_scale(const char *n, int *nd, int64_t *sh, uint8_t *b, size_t nb, dsattn_dtype *dt)
{
    (void)nd, (void)sh, (void)dt;
    if (!strcmp(n, "layers.3.attn.wq_a.scale") && nb > 5) b[5] = 0xff;  /* E8M0 NaN */
    return 0;
}
static int inf_scale(const char *n, int *nd, int64_t *sh, uint8_t *b, size_t nb, dsattn_dtype *dt)
{
    (void)nd, (void)sh, (void)dt;
    if (!strcmp(n, "model.layers.1.self_attn.o_proj.weight_scale_inv") && nb >= 4) {
        float inf = INFINITY;
        memcpy(b, &inf, 4);
    }
    return 0;
}

static void mkgood(const char *dir, const char *cfg_rel, dsattn_mw_format fmt,
                   dsattn_mw_names nm, int shards)
{
    dsattn_model_config c;
    char err[700];
    CHECK_OK(dsattn_config_load(&c, gold(cfg_rel), err, sizeof err));
    dsattn_mw_params p = { 7, fmt, nm, shards, gold(cfg_rel) };
    CHECK_OK(dsattn_make_weights(&c, &p, dir, err, sizeof err));
}

static void expect_invalid(const char *dir, dsattn_status want, const char *n1,
                           const char *n2)
{
    char err[700] = "";
    size_t n = 0;
    dsattn_status st = validate_path(dir, NULL, &n, err, sizeof err);
    CHECK_MSG(st == want, "status %d want %d (%s)", (int)st, (int)want, err);
    CHECK_MSG(!n1 || strstr(err, n1), "'%s' lacks '%s'", err, n1);
    CHECK_MSG(!n2 || strstr(err, n2), "'%s' lacks '%s'", err, n2);
}

DSATTN_TEST(loader, defect_missing_tensor)
{
    const char *d = scratch("missing");
    mkgood(d, "golden/v41/tiny-seed0/config.json", DSATTN_MW_BF16, DSATTN_MW_NAMES_INFERENCE, 1);
    rewrite(pjoin(0, d, "model.safetensors"), pjoin(1, d, "model.safetensors"), drop_wkv);
    expect_invalid(d, DSATTN_ERR_NOT_FOUND, "layers.2.attn.compressor.wkv.weight", "missing");
    cleanup();
}

DSATTN_TEST(loader, defect_wrong_shape_for_config)
{
    const char *d = scratch("shape");
    mkgood(d, "golden/v41/tiny-seed0/config.json", DSATTN_MW_BF16, DSATTN_MW_NAMES_INFERENCE, 1);
    rewrite(pjoin(0, d, "model.safetensors"), pjoin(1, d, "model.safetensors"), reshape_norm);
    expect_invalid(d, DSATTN_ERR_FORMAT, "layers.1.attn.q_norm.weight", "wrong shape");
    cleanup();
}

DSATTN_TEST(loader, defect_nan_inf_scales)
{
    const char *d = scratch("nan");
    mkgood(d, "golden/v41/tiny-seed0/config.json", DSATTN_MW_FP8, DSATTN_MW_NAMES_INFERENCE, 1);
    rewrite(pjoin(0, d, "model.safetensors"), pjoin(1, d, "model.safetensors"), nan_scale);
    expect_invalid(d, DSATTN_ERR_FORMAT, "layers.3.attn.wq_a.scale", "byte offset");
    cleanup();
    d = scratch("inf");
    mkgood(d, "golden/v3/tiny-seed0/config.json", DSATTN_MW_FP8, DSATTN_MW_NAMES_HF, 1);
    rewrite(pjoin(0, d, "model.safetensors"), pjoin(1, d, "model.safetensors"), inf_scale);
    expect_invalid(d, DSATTN_ERR_FORMAT, "model.layers.1.self_attn.o_proj.weight_scale_inv",
                   "block (0, 0)");
    cleanup();
}

DSATTN_TEST(loader, defect_shards)
{
    const char *d = scratch("shards");
    mkgood(d, "golden/v4/tiny-seed0/config.json", DSATTN_MW_BF16, DSATTN_MW_NAMES_INFERENCE, 3);
    char err[700] = "";
    size_t n = 0;
    CHECK_OK(validate_path(d, NULL, &n, err, sizeof err));
    /* index entry pointing at the wrong shard */
    char ip[512], *txt = NULL;
    snprintf(ip, sizeof ip, "%s/model.safetensors.index.json", d);
    FILE *fp = fopen(ip, "rb");
    if (fp) {
        txt = calloc(1 << 20, 1);
        size_t k = fread(txt, 1, (1 << 20) - 1, fp);
        txt[k] = 0;
        fclose(fp);
    }
    CHECK(txt != NULL);
    if (!txt) return;
    /* cJSON writes "key":<tab>"value": find the key, then its shard name */
    char *hit = strstr(txt, "\"layers.0.attn.wq_a.weight\":");
    if (hit) hit = strstr(hit, "model-00001-of-00003");
    CHECK(hit != NULL);
    if (hit) {
        hit[10] = '2';
        fp = fopen(ip, "wb");
        fputs(txt, fp);
        fclose(fp);
        expect_invalid(d, DSATTN_ERR_FORMAT, "layers.0.attn.wq_a.weight",
                       "model-00002-of-00003.safetensors");
        hit[10] = '1';
        fp = fopen(ip, "wb");
        fputs(txt, fp);
        fclose(fp);
    }
    free(txt);
    /* shard listed but missing */
    CHECK(unlink(pjoin(0, d, "model-00002-of-00003.safetensors")) == 0);
    expect_invalid(d, DSATTN_ERR_NOT_FOUND, "model-00002-of-00003.safetensors", "missing");
    /* index naming a path outside the folder */
    fp = fopen(ip, "wb");
    fputs("{\"weight_map\": {\"x\": \"../../etc/passwd\"}}", fp);
    fclose(fp);
    expect_invalid(d, DSATTN_ERR_FORMAT, "plain shard file name", NULL);
    cleanup();
}

/* The layouts a folder may hold besides model.safetensors(.index.json):
 * what the official convert.py writes (model{rank}-mp{world}.safetensors;
 * mp 1 loads, mp > 1 is refused with the way to convert), and exactly one
 * *.safetensors of any name.  Anything ambiguous is an error naming it. */
static void mv(const char *dir, const char *from, const char *to)
{
    CHECK_MSG(rename(pjoin(0, dir, from), pjoin(1, dir, to)) == 0, "rename %s -> %s", from, to);
}

static void expect_layout(const char *dir, const char *layout)
{
    char err[700] = "";
    size_t n = 0;
    dsattn_status st = validate_path(dir, NULL, &n, err, sizeof err);
    CHECK_MSG(st == DSATTN_OK && n == 0, "%s: %d %s", layout, (int)st, err);
    dsattn_ckpt *ck = NULL;
    CHECK_OK(dsattn_ckpt_open(&ck, dir, NULL, err, sizeof err));
    if (!ck) return;
    CHECK_MSG(strstr(dsattn_ckpt_layout(ck), layout) != NULL, "layout '%s', want '%s'",
              dsattn_ckpt_layout(ck), layout);
    CHECK_EQ_INT(dsattn_ckpt_n_files(ck), 1);
    dsattn_ckpt_close(ck);
}

DSATTN_TEST(loader, folder_layouts_convert_py_and_single_file)
{
    const char *d = scratch("layouts");
    mkgood(d, "golden/v41/tiny-seed0/config.json", DSATTN_MW_BF16, DSATTN_MW_NAMES_INFERENCE, 1);
    /* convert.py's own output name, mp 1: loads and runs */
    mv(d, "model.safetensors", "model0-mp1.safetensors");
    expect_layout(d, "model0-mp1.safetensors");
    char err[700] = "";
    dsattn_v41 *m = NULL;
    CHECK_OK(dsattn_v41_load(&m, NULL, d, err, sizeof err));
    CHECK(m != NULL && dsattn_v41_n_layers(m) > 0);
    dsattn_v41_destroy(m);
    /* one file of any name */
    mv(d, "model0-mp1.safetensors", "my-weights.safetensors");
    expect_layout(d, "one .safetensors file");
    /* two files and no index: which one is meant is not ours to guess */
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cp '%s/my-weights.safetensors' '%s/other.safetensors'", d, d);
    CHECK(system(cmd) == 0);
    expect_invalid(d, DSATTN_ERR_FORMAT, "2 .safetensors files", "name the file");
    /* a trace case: weights.safetensors beside input.safetensors (and the
     * expected files) is the one meant */
    mv(d, "my-weights.safetensors", "weights.safetensors");
    mv(d, "other.safetensors", "input.safetensors");
    expect_layout(d, "a trace case");
    mv(d, "input.safetensors", "other.safetensors");
    expect_invalid(d, DSATTN_ERR_FORMAT, "2 .safetensors files", "name the file");
    mv(d, "weights.safetensors", "my-weights.safetensors");
    /* split for 2 model-parallel ranks: refused, with the way to mp 1 */
    mv(d, "my-weights.safetensors", "model0-mp2.safetensors");
    mv(d, "other.safetensors", "model1-mp2.safetensors");
    expect_invalid(d, DSATTN_ERR_UNSUPPORTED, "model{rank}-mp2.safetensors",
                   "--model-parallel 1");
    /* world sizes that disagree */
    mv(d, "model1-mp2.safetensors", "model0-mp1.safetensors");
    expect_invalid(d, DSATTN_ERR_FORMAT, "different world sizes", NULL);
    /* none at all */
    CHECK(unlink(pjoin(0, d, "model0-mp1.safetensors")) == 0);
    CHECK(unlink(pjoin(0, d, "model0-mp2.safetensors")) == 0);
    expect_invalid(d, DSATTN_ERR_NOT_FOUND, "no .safetensors file", "model0-mp1.safetensors");
    /* only PyTorch pickles: never read, and the message says how to convert */
    FILE *f = fopen(pjoin(0, d, "pytorch_model-00001-of-00002.bin"), "w");
    if (f) fclose(f);
    expect_invalid(d, DSATTN_ERR_NOT_FOUND, "PyTorch pickles", "safe_serialization=True");
    cleanup();
}

/* An FP8 Linear whose input dim is not a multiple of the activation block
 * (32 for V4.1) is a checkpoint the reference cannot run: make-weights
 * refuses to write one, and info / validate / load name the tensor and
 * the block.  Built by hand from a bf16 checkpoint of an odd-shaped config
 * (q_lora_rank 80), its wq_b turned into FP8 codes with a scale grid. */
static const char *const odd_v41_cfg =
    "{\"dim\": 160, \"n_layers\": 3, \"n_heads\": 6, \"head_dim\": 64, \"rope_head_dim\": 16,"
    " \"q_lora_rank\": 80, \"o_groups\": 3, \"o_lora_rank\": 48, \"window_size\": 16,"
    " \"compress_ratios\": [0,2,2], \"kv_source_layers\": [1], \"index_source_layers\": [1],"
    " \"candidate_source_layer\": -1, \"index_n_heads\": 5, \"index_head_dim\": 32,"
    " \"index_topk\": 16, \"rope_theta\": 10000.0, \"compress_rope_theta\": 160000.0,"
    " \"rope_factor\": 16, \"original_seq_len\": 65536, \"beta_fast\": 32, \"beta_slow\": 1,"
    " \"norm_eps\": 1e-20, \"dtype\": \"bf16\"}";

DSATTN_TEST(loader, fp8_linear_off_the_activation_block_is_named)
{
    const char *d = scratch("fp8odd");
    char cfg[300];                     /* outside d: make-weights copies it in */
    snprintf(cfg, sizeof cfg, "%s.config.json", d);
    FILE *f = fopen(cfg, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(odd_v41_cfg, f);
    fclose(f);
    dsattn_model_config c;
    char err[700] = "";
    CHECK_OK(dsattn_config_load(&c, cfg, err, sizeof err));
    dsattn_mw_params p = { 3, DSATTN_MW_FP8, DSATTN_MW_NAMES_INFERENCE, 1, cfg };
    dsattn_status st = dsattn_make_weights(&c, &p, pjoin(3, d, "fp8"), err, sizeof err);
    CHECK_MSG(st == DSATTN_ERR_UNSUPPORTED && strstr(err, "layers.0.attn.wq_b.weight") &&
                  strstr(err, "activation block 32"), "make-weights fp8: %d %s", (int)st, err);
    p.format = DSATTN_MW_BF16;
    CHECK_OK(dsattn_make_weights(&c, &p, d, err, sizeof err));
    size_t n = 0;
    CHECK_OK(validate_path(d, NULL, &n, err, sizeof err));
    /* wq_b of layer 0 as FP8: codes 0x38 (1.0), UE8M0 scales 127 (1.0) */
    dsattn_st_file *src = NULL;
    CHECK_OK(dsattn_st_open(&src, pjoin(0, d, "model.safetensors"), err, sizeof err));
    if (!src) { cleanup(); return; }
    dsattn_st_writer *w = dsattn_st_writer_create();
    for (size_t i = 0; i < dsattn_st_count(src); i++) {
        const dsattn_st_tensor *t = dsattn_st_at(src, i);
        if (strcmp(t->name, "layers.0.attn.wq_b.weight") != 0) {
            CHECK_OK(dsattn_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data));
            continue;
        }
        CHECK(t->ndim == 2 && t->shape[1] == 80);
        uint8_t *codes = malloc(t->numel);
        memset(codes, 0x38, t->numel);
        CHECK_OK(dsattn_st_writer_add(w, t->name, DSATTN_DT_F8_E4M3, 2, t->shape, codes));
        int64_t ssh[2] = { (t->shape[0] + 31) / 32, (t->shape[1] + 31) / 32 };
        uint8_t *sc = malloc((size_t)(ssh[0] * ssh[1]));
        memset(sc, 127, (size_t)(ssh[0] * ssh[1]));
        CHECK_OK(dsattn_st_writer_add(w, "layers.0.attn.wq_b.scale", DSATTN_DT_F8_E8M0, 2, ssh,
                                      sc));
        free(codes);
        free(sc);
    }
    CHECK_OK(dsattn_st_writer_save(w, pjoin(1, d, "model.tmp"), err, sizeof err));
    dsattn_st_writer_destroy(w);
    dsattn_st_close(src);
    CHECK(rename(pjoin(1, d, "model.tmp"), pjoin(0, d, "model.safetensors")) == 0);
    expect_invalid(d, DSATTN_ERR_FORMAT, "layers.0.attn.wq_b.weight is stored as FP8 with 80",
                   "activation block 32");
    dsattn_v41 *m = NULL;
    st = dsattn_v41_load(&m, NULL, d, err, sizeof err);
    CHECK_MSG(st == DSATTN_ERR_FORMAT && m == NULL && strstr(err, "not a multiple of the "
                                                             "activation block 32"),
              "load: %d %s", (int)st, err);
    dsattn_v41_destroy(m);
    unlink(cfg);
    cleanup();
}

/* The byte-level defects, each as a whole checkpoint folder with a valid
 * config, so they are seen through the same path users take. */
static void write_raw(const char *path, const char *hdr, uint64_t claimed, size_t data_len,
                      size_t cut)
{
    FILE *fp = fopen(path, "wb");
    uint8_t lb[8];
    for (int i = 0; i < 8; i++) lb[i] = (uint8_t)(claimed >> (8 * i));
    size_t total = 8 + strlen(hdr) + data_len;
    uint8_t *b = calloc(total, 1);
    memcpy(b, lb, 8);
    memcpy(b + 8, hdr, strlen(hdr));
    fwrite(b, 1, cut ? cut : total, fp);
    fclose(fp);
    free(b);
}

DSATTN_TEST(loader, defect_bytes)
{
    const char *d = scratch("bytes");
    char cfg[600];
    snprintf(cfg, sizeof cfg, "cp '%s' '%s/config.json'",
             gold("golden/v41/tiny-seed0/config.json"), d);
    CHECK(system(cfg) == 0);
    const char *f = pjoin(2, d, "model.safetensors");
    const char *good = "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
    struct { const char *hdr; int64_t claimed; size_t dlen, cut; dsattn_status st;
             const char *needle; } cases[] = {
        { good, -1, 16, 5, DSATTN_ERR_FORMAT, "truncated" },
        { good, -1, 16, 8 + 40, DSATTN_ERR_FORMAT, "header length" },
        { good, -1, 10, 0, DSATTN_ERR_FORMAT, "past the data section" },
        { "{\"a\": nope}", -1, 0, 0, DSATTN_ERR_FORMAT, "not valid JSON" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,99]}}", -1, 16, 0,
          DSATTN_ERR_FORMAT, "byte offset" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
          "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", -1, 16, 0,
          DSATTN_ERR_FORMAT, "overlaps" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,16]}}", -1, 16, 0,
          DSATTN_ERR_FORMAT, "needs 12" },
        { "{\"a\":{\"dtype\":\"F3\",\"shape\":[4],\"data_offsets\":[0,16]}}", -1, 16, 0,
          DSATTN_ERR_FORMAT, "unknown dtype" },
        { "{\"a\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", -1, 16, 0,
          DSATTN_ERR_FORMAT, "whole number of bytes" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4],"
          "\"data_offsets\":[0,16]}}", -1, 16, 0, DSATTN_ERR_OVERFLOW, "overflow" },
    };
    for (size_t i = 0; i < DSATTN_ARRAY_LEN_T(cases); i++) {
        uint64_t cl = cases[i].claimed < 0 ? strlen(cases[i].hdr) : (uint64_t)cases[i].claimed;
        write_raw(f, cases[i].hdr, cl, cases[i].dlen, cases[i].cut);
        char err[700] = "";
        dsattn_ckpt *ck = NULL;
        dsattn_status st = dsattn_ckpt_open(&ck, d, NULL, err, sizeof err);
        CHECK_MSG(st == cases[i].st && !ck, "case %zu: status %d (%s)", i, (int)st, err);
        CHECK_MSG(strstr(err, cases[i].needle) && strstr(err, "model.safetensors"),
                  "case %zu: '%s' lacks '%s' or the file", i, err, cases[i].needle);
        dsattn_ckpt_close(ck);
    }
    cleanup();
}

/* `dsattn info`: exit 0 on a complete checkpoint, non-zero on a bad one. */
DSATTN_TEST(loader, cli_info_exit_codes)
{
    const char *d = scratch("cli");
    char cmd[1200], sub[400];
    snprintf(sub, sizeof sub, "%s/ok", d);
    snprintf(cmd, sizeof cmd,
             "'%s' make-weights --config '%s' --seed 3 --format fp8 --shards 2 --out '%s' "
             ">/dev/null", DSATTN_CLI_PATH, gold("golden/v41/tiny-seed2-fp8/config.json"), sub);
    CHECK_EQ_INT(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "'%s' info '%s' >/dev/null 2>&1", DSATTN_CLI_PATH, sub);
    CHECK_EQ_INT(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "'%s' info '%s/model.safetensors.index.json' -q >/dev/null 2>&1",
             DSATTN_CLI_PATH, sub);
    CHECK_EQ_INT(system(cmd), 0);
    /* run takes the checkpoint's own config.json (the tiny dims), not the
     * default real-size config */
    snprintf(cmd, sizeof cmd, "'%s' run --weights '%s' --prefill 5 --decode 2 --threads 1 "
             ">/dev/null 2>&1", DSATTN_CLI_PATH, sub);
    CHECK_EQ_INT(system(cmd), 0);
    /* drop a shard: non-zero, and stderr names it */
    snprintf(cmd, sizeof cmd, "rm '%s/model-00002-of-00002.safetensors' && '%s' info '%s' "
             "2>&1 >/dev/null | grep -q 'model-00002-of-00002.safetensors'",
             sub, DSATTN_CLI_PATH, sub);
    CHECK_EQ_INT(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "'%s' info '%s' >/dev/null 2>&1", DSATTN_CLI_PATH, sub);
    CHECK(system(cmd) != 0);
    snprintf(cmd, sizeof cmd, "'%s' info >/dev/null 2>&1", DSATTN_CLI_PATH);
    CHECK(system(cmd) != 0);
    snprintf(cmd, sizeof cmd, "'%s' make-weights --config /nonexistent.json --seed 1 --out "
             "'%s/x' >/dev/null 2>&1", DSATTN_CLI_PATH, d);
    CHECK(system(cmd) != 0);
    cleanup();
}

/* ==== DeepSeek-LLM (llama) checkpoints ================================== */

/* A small GQA config: 4 query heads of 32 dims over 2 KV heads. */
static const char *llama_cfg(const char *dir, const char *extra)
{
    static char path[600];
    snprintf(path, sizeof path, "%s/llama.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) dsattn_test_fail(__FILE__, __LINE__, "cannot write %s", path);
    fprintf(f, "{\"model_type\": \"llama\", \"hidden_size\": 128, \"num_hidden_layers\": 2, "
               "\"num_attention_heads\": 4, \"num_key_value_heads\": %s, \"rope_theta\": 10000.0, "
               "\"rms_norm_eps\": 1e-06, \"max_position_embeddings\": 4096, "
               "\"rope_scaling\": null, \"torch_dtype\": \"bfloat16\"%s}\n",
            extra && strstr(extra, "kv4") ? "4" : "2",
            extra && strstr(extra, "quant") ? ", \"quantization_config\": {\"quant_method\": \"fp8\"}"
                                            : "");
    fclose(f);
    return path;
}

DSATTN_TEST(loader, llama_config)
{
    const char *d = scratch("llcfg");
    dsattn_model_config c;
    char err[700] = "";
    CHECK_OK(dsattn_config_load(&c, llama_cfg(d, NULL), err, sizeof err));
    CHECK(c.arch == DSATTN_ARCH_LLAMA);
    CHECK(!strcmp(dsattn_arch_name(c.arch), "llama"));
    CHECK_EQ_INT(c.dim, 128);
    CHECK_EQ_INT(c.n_layers, 2);
    CHECK_EQ_INT(c.n_heads, 4);
    CHECK_EQ_INT(c.n_kv_heads, 2);
    CHECK_EQ_INT(c.head_dim, 32);
    CHECK(!strcmp(c.dtype, "bf16"));
    dsattn_tensor_spec *sp = NULL;
    size_t n = 0;
    CHECK_OK(dsattn_expected_tensors(&c, &sp, &n, err, sizeof err));
    CHECK_EQ_INT(n, 10);                            /* norm + 4 projections, 2 layers */
    for (size_t i = 0; sp && i < n; i++)
        if (!strcmp(sp[i].name, "layers.1.attn.wk"))
            CHECK(sp[i].shape[0] == 64 && sp[i].shape[1] == 128);
    free(sp);
    /* quantized llama weights and heads that do not divide are errors */
    CHECK(dsattn_config_load(&c, llama_cfg(d, "quant"), err, sizeof err) ==
          DSATTN_ERR_UNSUPPORTED);
    CHECK(strstr(err, "quantization_config") != NULL);
    CHECK(cfg_from("{\"model_type\": \"llama\", \"hidden_size\": 128, \"num_hidden_layers\": 2, "
                   "\"num_attention_heads\": 4, \"num_key_value_heads\": 3}", &c, err,
                   sizeof err) == DSATTN_ERR_FORMAT);
    CHECK(strstr(err, "num_key_value_heads") != NULL);
    CHECK(cfg_from("{\"model_type\": \"llama\", \"dim\": 128, \"n_layers\": 2, \"n_heads\": 4}",
                   &c, err, sizeof err) == DSATTN_ERR_FORMAT);
    cleanup();
}

/* The stored bytes of the tensor the file names `hf`. */
static const dsattn_st_tensor *stored(const dsattn_ckpt *ck, const char *hf)
{
    for (size_t i = 0; i < dsattn_ckpt_count(ck); i++)
        if (!strcmp(dsattn_ckpt_at(ck, i)->stored_name, hf)) return dsattn_ckpt_at(ck, i)->t;
    return NULL;
}

DSATTN_TEST(loader, llama_checkpoint_binds_every_projection)
{
    const char *d = scratch("llama");
    char err[700] = "", sub[400];
    dsattn_model_config c;
    const char *cfg = llama_cfg(d, NULL);
    CHECK_OK(dsattn_config_load(&c, cfg, err, sizeof err));
    snprintf(sub, sizeof sub, "%s/ckpt", d);
    dsattn_mw_params p = { 11, DSATTN_MW_BF16, DSATTN_MW_NAMES_HF, 2, cfg };
    CHECK_OK(dsattn_make_weights(&c, &p, sub, err, sizeof err));
    size_t n = 0;
    dsattn_status st = validate_path(sub, NULL, &n, err, sizeof err);
    CHECK_MSG(st == DSATTN_OK && n == 0, "%s", err);

    /* the config beside the weights, no config argument */
    dsattn_mha *m = NULL;
    st = dsattn_mha_load(&m, NULL, sub, err, sizeof err);
    CHECK_MSG(st == DSATTN_OK, "%s", err);
    dsattn_ckpt *ck = NULL;
    CHECK_OK(dsattn_ckpt_open(&ck, sub, NULL, err, sizeof err));
    if (m && ck) {
        CHECK_EQ_INT(dsattn_mha_n_kv_heads(m), 2);
        for (int l = 0; l < 2; l++) {
            CHECK(dsattn_mha_has_weights(m, l));
            const dsattn_mha_layer_w *L = &m->layer[l];
            const dsattn_weight *w[4] = { &L->wq, &L->wk, &L->wv, &L->wo };
            const char *hf[4] = { "q_proj", "k_proj", "v_proj", "o_proj" };
            const size_t rows[4] = { 128, 64, 64, 128 };
            for (int j = 0; j < 4; j++) {
                char nm[120];
                snprintf(nm, sizeof nm, "model.layers.%d.self_attn.%s.weight", l, hf[j]);
                const dsattn_st_tensor *t = stored(ck, nm);
                CHECK_MSG(t != NULL, "%s not in the file", nm);
                CHECK(w[j]->kind == DSATTN_W_BF16 && w[j]->rows == rows[j] && w[j]->cols == 128);
                if (t)
                    CHECK_MSG(t->nbytes == rows[j] * 128 * 2 &&
                                  !memcmp(w[j]->data, t->data, t->nbytes),
                              "layer %d %s: not the bytes stored as %s", l, hf[j], nm);
            }
            char nm[120];
            snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", l);
            const dsattn_st_tensor *t = stored(ck, nm);
            CHECK(t != NULL);
            if (t) {
                float v[128];
                dsattn_st_to_f32(t, v, 128);
                CHECK_BITS("input_layernorm", L->norm, v, 128);
            }
        }
        /* it runs: a 3-token chunk, then one decode token */
        dsattn_ctx *ctx = NULL;
        dsattn_ctx_params cp = dsattn_ctx_default_params();
        cp.n_threads = 1;
        CHECK_OK(dsattn_ctx_create(&ctx, &cp));
        dsattn_mha_seq *s = NULL;
        CHECK_OK(dsattn_mha_seq_create(&s, m, 8));
        float x[4 * 128], out[4 * 128];
        for (size_t i = 0; i < 4 * 128; i++) x[i] = dsattn_round_bf16(0.01f * (float)(i % 97) - 0.4f);
        for (int l = 0; l < 2 && s && ctx; l++)
            CHECK_OK(dsattn_mha_attn_forward(ctx, s, l, x, 3, out));
        if (s) CHECK_OK(dsattn_mha_seq_advance(s, 3));
        for (int l = 0; l < 2 && s && ctx; l++)
            CHECK_OK(dsattn_mha_attn_forward(ctx, s, l, x + 3 * 128, 1, out));
        int finite = 1, nonzero = 0;
        for (size_t i = 0; i < 128; i++) finite &= isfinite(out[i]) != 0, nonzero |= out[i] != 0.0f;
        CHECK(finite && nonzero);
        dsattn_mha_seq_destroy(s);
        dsattn_ctx_destroy(ctx);
    }
    dsattn_ckpt_close(ck);
    dsattn_mha_destroy(m);

    /* a config whose KV heads differ from the file's: an error naming the
     * tensor, no model */
    m = NULL;
    st = dsattn_mha_load(&m, llama_cfg(d, "kv4"), sub, err, sizeof err);
    CHECK_MSG(st == DSATTN_ERR_FORMAT && m == NULL && strstr(err, "k_proj") &&
                  strstr(err, "wrong shape"), "status %d: %s", (int)st, err);
    /* no config anywhere */
    CHECK(unlink(pjoin(0, sub, "config.json")) == 0);
    st = dsattn_mha_load(&m, NULL, sub, err, sizeof err);
    CHECK_MSG(st == DSATTN_ERR_NOT_FOUND && m == NULL && strstr(err, "config.json"),
              "status %d: %s", (int)st, err);
    cleanup();
}

/* `dsattn run --weights DIR` with no --config, for every generation: each
 * loader takes the config.json beside the weights. */
DSATTN_TEST(loader, cli_run_weights_every_generation)
{
    const char *d = scratch("clirun");
    const char *cfgs[] = { "golden/v3/tiny-seed0/config.json", "golden/v32/tiny-seed0/config.json",
                           "golden/v4/tiny-seed0/config.json", "golden/v41/tiny-seed0/config.json",
                           NULL };
    for (size_t k = 0; k < 5; k++) {
        char cmd[1400], sub[400];
        snprintf(sub, sizeof sub, "%s/g%zu", d, k);
        const char *cfg = cfgs[k] ? gold(cfgs[k]) : llama_cfg(d, NULL);
        snprintf(cmd, sizeof cmd, "'%s' make-weights --config '%s' --seed 3 --names hf --out '%s' "
                 ">/dev/null", DSATTN_CLI_PATH, cfg, sub);
        CHECK_EQ_INT(system(cmd), 0);
        snprintf(cmd, sizeof cmd, "'%s' run --weights '%s' --prefill 5 --decode 2 --threads 1 "
                 ">/dev/null 2>&1", DSATTN_CLI_PATH, sub);
        CHECK_MSG(system(cmd) == 0, "%s", cmd);
    }
    cleanup();
}
