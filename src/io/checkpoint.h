/* checkpoint.h - a DeepSeek checkpoint as the compute code sees it: a set
 * of tensors addressed by their inference names, whatever the files call
 * them, and Linear weights handed out as dsattn_weight descriptors that
 * borrow the memory-mapped bytes.
 *
 * Opening accepts
 *   - one .safetensors file,
 *   - a model.safetensors.index.json (HF shard index; every shard its
 *     weight_map names is opened and validated, and every listed tensor must
 *     be in the shard the index says),
 *   - a folder holding either of those (index first, then model.safetensors).
 * The config is `config_path`, or else config.json next to the weights; a
 * checkpoint without a config can be listed but not validated.
 *
 * Names: every stored name is mapped to its inference name with the
 * generation's convert.py rules (names.h), so HF-named V3/V3.2 releases and
 * inference-named V4/V4.1 releases are looked up the same way.
 *
 * Lifetime: descriptors borrow from the checkpoint, which must outlive them;
 * dsattn_weight_release frees only what was converted.
 *
 * Deliberately not here: computing anything with the weights.
 */
#ifndef DSATTN_CHECKPOINT_H
#define DSATTN_CHECKPOINT_H

#include "config.h"
#include "dsattn.h"
#include "safetensors.h"
#include "weights.h"

#include <stddef.h>
#include <stdint.h>

typedef struct dsattn_ckpt dsattn_ckpt;

typedef struct {
    const char             *name;         /* inference name               */
    const char             *stored_name;  /* as the file spells it        */
    const char             *file;         /* path of its shard            */
    const dsattn_st_tensor *t;
} dsattn_ckpt_entry;

dsattn_status dsattn_ckpt_open(dsattn_ckpt **out, const char *path,
                               const char *config_path, char *err, size_t errlen);
void dsattn_ckpt_close(dsattn_ckpt *ck);
/* What every generation's loader opens: the checkpoint at `weights` with
 * its config, config_json when given, else the config.json beside the
 * weights (*cfg_path: the one used; an error naming the weights when there
 * is none). */
dsattn_status dsattn_ckpt_open_model(dsattn_ckpt **ck, const char **cfg_path,
                                     const char *weights, const char *config_json,
                                     char *err, size_t errlen);

/* NULL when no config was found. */
const dsattn_model_config *dsattn_ckpt_config(const dsattn_ckpt *ck);
const char *dsattn_ckpt_config_path(const dsattn_ckpt *ck);   /* or NULL */
/* "file", "index" or "folder+index" ... for listings. */
const char *dsattn_ckpt_layout(const dsattn_ckpt *ck);
size_t dsattn_ckpt_n_files(const dsattn_ckpt *ck);

/* Entries in file order (shard, then offset). */
size_t                   dsattn_ckpt_count(const dsattn_ckpt *ck);
const dsattn_ckpt_entry *dsattn_ckpt_at(const dsattn_ckpt *ck, size_t i);
const dsattn_ckpt_entry *dsattn_ckpt_find(const dsattn_ckpt *ck, const char *inf_name);

/* The Linear weight `base` ("layers.3.attn.wq_a"): base.weight plus, for
 * FP8 and FP4, base.scale.  Stored formats:
 *   F32 -> DSATTN_W_F32, BF16 -> DSATTN_W_BF16, F16 -> converted,
 *   F8_E4M3 + scale (F32 scale_inv or F8_E8M0) [ceil(r/b), ceil(c/b)]
 *     -> DSATTN_W_FP8, b = 32, 64 or 128 (from the config's weight_block_size
 *     when it fits, else from the scale shape),
 *   I8/U8 [r, c/2] + F8_E8M0 scale [r, c/32] -> DSATTN_W_FP4 (E2M1 pairs).
 * `accept` (DSATTN_WMASK bits) lists the kinds the caller can run; a stored
 * kind outside it is dequantized to BF16 (preferred) or F32 into `owned`,
 * exactly as the reference's weight_dequant does (fp32 product, one RNE
 * rounding to bf16).  rows/cols (0 = any) are checked against the file:
 * a mismatch is DSATTN_ERR_FORMAT "wrong shape for the config".  Scales
 * that are NaN, Inf or <= 0 are DSATTN_ERR_FORMAT naming the block and
 * byte offset.  Always fills *w on success (release it). */
dsattn_status dsattn_ckpt_weight(const dsattn_ckpt *ck, const char *base,
                                 unsigned accept, size_t rows, size_t cols,
                                 dsattn_weight *w, char *err, size_t errlen);

/* A non-Linear tensor (norm weight, bias, sink, ape) converted to fp32.
 * numel must equal n; NaN/Inf values are DSATTN_ERR_FORMAT. */
dsattn_status dsattn_ckpt_vector_f32(const dsattn_ckpt *ck, const char *name,
                                     float *out, size_t n, char *err, size_t errlen);

/* ==== Binder: a model's tensors bound from a checkpoint ================ */

/* What every generation's loader does with each tensor it names: a vector
 * read into an fp32 array, a Linear weight borrowed in the format stored
 * (or converted, when `accept` leaves the stored kind out).  Every array
 * and every converted weight goes on `owned`, the model's list, which the
 * model frees; borrowed bytes stay in the checkpoint, which the model keeps
 * open.  Errors name the tensor in err. */
typedef struct {
    const dsattn_ckpt   *ck;
    struct dsattn_owned *owned;
    char                *err;
    size_t               errlen;
} dsattn_binder;

dsattn_status dsattn_bind_vec(const dsattn_binder *b, const char *name, size_t n,
                              float **out);
/* name: the Linear's base ("layers.3.attn.wq_a") or its ".weight" tensor */
dsattn_status dsattn_bind_mat(const dsattn_binder *b, const char *name, unsigned accept,
                              size_t rows, size_t cols, dsattn_weight *w);

/* Check the checkpoint against its config: every expected attention tensor
 * present with the right shape, a usable dtype and finite scales.  Calls
 * `issue` (may be NULL) once per problem with an error text; *n_issues gets
 * the count.  DSATTN_OK only when there are none (and a config exists). */
typedef void (*dsattn_ckpt_issue_fn)(void *ud, dsattn_status st, const char *msg);
dsattn_status dsattn_ckpt_validate(const dsattn_ckpt *ck, dsattn_ckpt_issue_fn issue,
                                   void *ud, size_t *n_issues);

/* ==== Writer: a random checkpoint in the official layout ================= */

typedef enum { DSATTN_MW_BF16 = 0, DSATTN_MW_FP8 = 1 } dsattn_mw_format;
typedef enum { DSATTN_MW_NAMES_INFERENCE = 0, DSATTN_MW_NAMES_HF = 1 } dsattn_mw_names;

typedef struct {
    uint64_t         seed;
    dsattn_mw_format format;
    dsattn_mw_names  names;
    int              shards;      /* 1 = model.safetensors, N > 1 = index + N */
    const char      *config_path; /* copied to out_dir/config.json if set     */
} dsattn_mw_params;

/* Writes the attention tensors of layers 0..n_layers-1 of `cfg`, seeded,
 * into out_dir (created if missing).  FP8: every Linear the release stores
 * in FP8 is block-quantized (E4M3 + UE8M0 scale, or F32 scale_inv for V3);
 * the rest stay BF16 (norms), F32 (sinks, ape). */
dsattn_status dsattn_make_weights(const dsattn_model_config *cfg,
                                  const dsattn_mw_params *p, const char *out_dir,
                                  char *err, size_t errlen);

#endif /* DSATTN_CHECKPOINT_H */
