/* cli_session.c - session files in the CLI: `dsattn info FILE` on a session
 * validates the whole file (every checksum, through the library) and prints
 * its header: generation, options, position, capacity, model hashes, size.
 * The format is docs/sessions.md; the checking is the library's.
 */
#include "cli_session.h"

#include "dsattn.h"

#include <stdio.h>
#include <string.h>

int dsattn_cli_is_session(const char *path)
{
    char m[8];
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(m, 1, sizeof m, f);
    fclose(f);
    return n == sizeof m && !memcmp(m, "DSATTNSS", 8);
}

static const char *variant_text(const dsattn_session_info *s, char *b, size_t n)
{
    static const char *mla[] = { "naive cache", "bf16 latent cache", "FP8 latent cache" };
    switch (s->generation) {
    case DSATTN_SESSION_V41:
        snprintf(b, n, "index_k %s", s->variant[0] ? "reference" : "owner");
        break;
    case DSATTN_SESSION_V4:
    case DSATTN_SESSION_MLA: {
        /* variant[1]: 0 for a sequence of every layer, else first | count << 16 */
        const unsigned first = s->variant[1] & 0xffffu, count = s->variant[1] >> 16;
        char sub[48] = "";
        if (s->variant[1])
            snprintf(sub, sizeof sub, ", layers %u..%u only", first, first + count - 1);
        if (s->generation == DSATTN_SESSION_V4)
            snprintf(b, n, "empty rows %s%s", s->variant[0] ? "zero" : "nan (reference)", sub);
        else
            snprintf(b, n, "%s%s", s->variant[0] < 3 ? mla[s->variant[0]] : "?", sub);
        break;
    }
    case DSATTN_SESSION_MHA:
        snprintf(b, n, "layers %u..%u", (unsigned)s->variant[0],
                 (unsigned)(s->variant[0] + s->variant[1] - 1));
        break;
    default:
        snprintf(b, n, "?");
    }
    return b;
}

int dsattn_cli_session_info(const char *path)
{
    dsattn_session_info s;
    char err[1024] = "", v[96];
    dsattn_status st = dsattn_session_info_read(path, &s, err, sizeof err);
    if (st) {
        fprintf(stderr, "error: %s [%s]\n", err, dsattn_status_str(st));
        fprintf(stderr, "FAILED: %s is not a valid session\n", path);
        return 1;
    }
    printf("session:     %s (format %u, written by dsattn %s)\n", path, s.format, s.lib_version);
    printf("generation:  %s (%s)\n", dsattn_session_gen_name(s.generation),
           variant_text(&s, v, sizeof v));
    printf("position:    %lld tokens consumed, capacity %llu\n", (long long)s.pos,
           (unsigned long long)s.capacity);
    printf("model:       config hash %016llx, shapes hash %016llx\n",
           (unsigned long long)s.config_hash, (unsigned long long)s.shapes_hash);
    printf("size:        %llu bytes in %u sections, every checksum verified\n",
           (unsigned long long)s.file_bytes, (unsigned)s.n_sections);
    return 0;
}
