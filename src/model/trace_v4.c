/* trace_v4.c - placeholder backend until the generation lands. */
#include "trace.h"

#include "internal.h"

dsattn_status dsattn_trace_v4(const char *case_dir, const char *out_path,
                              const dsattn_trace_opts *o, char *err, size_t errlen)
{
    (void)out_path; (void)o;
    return dsattn_errf(err, errlen, DSATTN_ERR_UNSUPPORTED,
                       "%s: this generation's trace backend is not implemented yet", case_dir);
}
