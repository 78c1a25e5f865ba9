/* dsattn_mla.h - public API section (see include/dsattn.h for the object
 * model).  Included by dsattn.h; do not include directly. */
#ifndef DSATTN_MLA_H
#define DSATTN_MLA_H
#endif
