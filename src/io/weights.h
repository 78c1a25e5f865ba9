/* weights.h - the weight descriptor every compute path consumes.
 *
 * A dsattn_weight describes one Linear weight [rows, cols] (torch [out, in])
 * in the format the checkpoint stores it; GEMV runs directly on these bytes.
 * The bytes are normally borrowed from a memory-mapped checkpoint; `owned`
 * is set only when the loader had to convert something, and is freed by
 * whoever owns the descriptor (dsattn_weight_release).
 */
#ifndef DSATTN_WEIGHTS_H
#define DSATTN_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    DSATTN_W_F32  = 0,   /* float [rows, cols]                               */
    DSATTN_W_BF16 = 1,   /* uint16 bf16 bits [rows, cols]                    */
    DSATTN_W_FP8  = 2,   /* E4M3 [rows, cols] + fp32 scale per block x block */
    DSATTN_W_FP4  = 3,   /* E2M1 [rows, cols/2] + UE8M0 per 32 along cols    */
} dsattn_wkind;

typedef struct {
    dsattn_wkind   kind;
    size_t         rows, cols;
    const void    *data;        /* row-major; FP4: cols/2 bytes per row        */
    const float   *scale;       /* FP8: [ceil(rows/block), ceil(cols/block)]   */
    const uint8_t *scale_e8m0;  /* FP4: [rows, cols/32]                        */
    size_t         block;       /* FP8 block edge (32 or 128)                  */
    void          *owned;       /* converted storage to free, or NULL          */
} dsattn_weight;

#endif /* DSATTN_WEIGHTS_H */
