/* fuzz_config.c - libFuzzer target over config.json: the shared reader
 * (dsattn_config_load, both key spellings, every generation's keys, llama's) and
 * every generation's own config reader and config-only model (MHA/GQA,
 * MLA + DSA, V4, V4.1 with its layer plan).  The input is the file's
 * bytes.  Every reader must accept or refuse it with a status and message,
 * never read outside its buffers (ASan) or hit UB (UBSan); abort() marks a
 * violated invariant (an accepted config whose basic dims are not
 * positive, or a model whose accessors disagree with its config). */
#include "config.h"
#include "dsattn.h"
#include "fuzz_common.h"
#include "mha.h"
#include "mla.h"
#include "v4.h"
#include "v41.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > (1u << 20)) return 0;   /* configs are small; keep runs fast */
    char path[512], err[1024];
    fuzz_write("config.json", data, size, path, sizeof path);

    dsattn_model_config *mc = calloc(1, sizeof *mc);
    if (!mc) return 0;
    if (dsattn_config_load(mc, path, err, sizeof err) == DSATTN_OK) {
        if (mc->n_layers < 1 || mc->dim < 1) abort();
        /* llama: the shapes its checkpoints are checked against */
        if (mc->arch == DSATTN_ARCH_LLAMA &&
            (mc->n_kv_heads < 1 || mc->n_heads % mc->n_kv_heads ||
             mc->head_dim * mc->n_heads != mc->dim))
            abort();
    }
    free(mc);

    dsattn_mha *mha = NULL;
    if (dsattn_mha_load_config(&mha, path, err, sizeof err) == DSATTN_OK) {
        if (dsattn_mha_n_layers(mha) < 1 || dsattn_mha_dim(mha) < 1 ||
            dsattn_mha_n_heads(mha) % dsattn_mha_n_kv_heads(mha))
            abort();
        dsattn_mha_destroy(mha);
    } else if (mha) abort();

    dsattn_mla *mla = NULL;
    if (dsattn_mla_create_config_only(&mla, path, err, sizeof err) == DSATTN_OK) {
        if (dsattn_mla_n_layers(mla) < 1 || dsattn_mla_dim(mla) < 1) abort();
        dsattn_mla_destroy(mla);
    } else if (mla) abort();

    dsattn_v4 *v4 = NULL;
    if (dsattn_v4_load_config(&v4, path, err, sizeof err) == DSATTN_OK) {
        if (dsattn_v4_n_layers(v4) < 1 || dsattn_v4_dim(v4) < 1) abort();
        for (int l = 0; l < dsattn_v4_n_layers(v4); l++) (void)dsattn_v4_layer_kind(v4, l);
        dsattn_v4_destroy(v4);
    } else if (v4) abort();

    dsattn_v41 *v41 = NULL;
    if (dsattn_v41_load_config(&v41, path, err, sizeof err) == DSATTN_OK) {
        if (dsattn_v41_n_layers(v41) < 1 || dsattn_v41_dim(v41) < 1) abort();
        for (int l = 0; l < dsattn_v41_n_layers(v41); l++) {
            dsattn_v41_mode md = dsattn_v41_layer_mode(v41, l);
            if (md < DSATTN_V41_SWA || md > DSATTN_V41_REUSE) abort();
        }
        dsattn_v41_destroy(v41);
    } else if (v41) abort();
    return 0;
}
