/* dsattn_mha.h - public API section (see include/dsattn.h for the object
 * model).  Included by dsattn.h; do not include directly. */
#ifndef DSATTN_MHA_H
#define DSATTN_MHA_H
#endif
