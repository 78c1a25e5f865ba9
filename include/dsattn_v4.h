/* dsattn_v4.h - public API section (see include/dsattn.h for the object
 * model).  Included by dsattn.h; do not include directly. */
#ifndef DSATTN_V4_H
#define DSATTN_V4_H
#endif
