/* example.c - a program outside the dsattn tree, built against an installed
 * copy (tests/install/run.sh builds it with pkg-config and with CMake's
 * find_package).  It uses only the public header: a context, a random V4.1
 * stack from a config.json, a prefill of 4 tokens and one decode step
 * through the golden-case stand-in stack, and the golden case's trace.
 * Prints the version and a checksum; exits non-zero on any error.
 *
 * usage: example CONFIG_JSON [CASE_DIR OUT_FILE]
 */
#include <dsattn.h>

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    if (argc < 2) { fprintf(stderr, "usage: example CONFIG_JSON [CASE_DIR OUT_FILE]\n"); return 2; }
    char err[512] = "";
    dsattn_ctx *ctx = NULL;
    dsattn_v41 *m = NULL;
    dsattn_v41_seq *s = NULL;
    float *h = NULL;
    int rc = 1;
    dsattn_status st = dsattn_ctx_create(&ctx, NULL);
    if (!st) st = dsattn_v41_create_random(&m, argv[1], 1, 0, err, sizeof err);
    if (!st) st = dsattn_v41_seq_create(&s, m, 64, DSATTN_V41_INDEX_K_OWNER);
    if (st) goto out;
    const size_t dim = (size_t)dsattn_v41_dim(m);
    h = calloc(5 * dim, sizeof *h);
    if (!h) goto out;
    for (size_t i = 0; i < 5 * dim; i++) h[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    st = dsattn_v41_stack_forward(ctx, s, h, 4, NULL, NULL);                 /* prefill */
    if (!st) st = dsattn_v41_stack_forward(ctx, s, h + 4 * dim, 1, NULL, NULL); /* decode  */
    if (st) goto out;
    double sum = 0;
    for (size_t i = 0; i < 5 * dim; i++) sum += h[i];
    printf("dsattn %s: %d layers, position %lld, checksum %.6f\n", dsattn_version(),
           dsattn_v41_n_layers(m), (long long)dsattn_v41_seq_pos(s), sum);
    if (argc >= 4) {
        st = dsattn_trace_write(argv[2], argv[3], NULL, err, sizeof err);
        if (st) goto out;
        printf("trace written to %s\n", argv[3]);
    }
    rc = 0;
out:
    if (rc) fprintf(stderr, "example: %s (%s)\n", err[0] ? err : "failed", dsattn_status_str(st));
    free(h);
    dsattn_v41_seq_destroy(s);
    dsattn_v41_destroy(m);
    dsattn_ctx_destroy(ctx);
    return rc;
}
