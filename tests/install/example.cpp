/* example.cpp - the C++ consumer of an installed dsattn (tests/install/run.sh
 * builds it with `c++ -std=c++17 -pedantic -Werror` and pkg-config): every
 * public header included from C++, the handles owned by std::unique_ptr
 * with the library's destroy functions, the buffers std::vector.  It runs
 * example.c's steps (a random V4.1 stack from a config.json, a prefill of 4
 * tokens, one decode step) and prints the same line, so run.sh can check
 * that both languages compute the same numbers through the library.
 *
 * usage: example_cpp CONFIG_JSON
 */
#include <dsattn.h>
#include <dsattn_mha.h>
#include <dsattn_mla.h>
#include <dsattn_v4.h>

#include <cstdio>
#include <memory>
#include <vector>

namespace {

template <class T, void (*Destroy)(T *)> struct deleter {
    void operator()(T *p) const { Destroy(p); }
};
using ctx_ptr = std::unique_ptr<dsattn_ctx, deleter<dsattn_ctx, dsattn_ctx_destroy>>;
using model_ptr = std::unique_ptr<dsattn_v41, deleter<dsattn_v41, dsattn_v41_destroy>>;
using seq_ptr = std::unique_ptr<dsattn_v41_seq, deleter<dsattn_v41_seq, dsattn_v41_seq_destroy>>;

int fail(dsattn_status st, const char *err)
{
    std::fprintf(stderr, "example_cpp: %s (%s)\n", err[0] ? err : "failed", dsattn_status_str(st));
    return 1;
}

}  // namespace

int main(int argc, char **argv)
{
    if (argc < 2) {
        std::fprintf(stderr, "usage: example_cpp CONFIG_JSON\n");
        return 2;
    }
    char err[512] = "";
    dsattn_ctx *c = nullptr;
    dsattn_status st = dsattn_ctx_create(&c, nullptr);
    ctx_ptr ctx(c);
    if (st) return fail(st, err);
    dsattn_v41 *mr = nullptr;
    st = dsattn_v41_create_random(&mr, argv[1], 1, 0, err, sizeof err);
    model_ptr m(mr);
    if (st) return fail(st, err);
    dsattn_v41_seq *sr = nullptr;
    st = dsattn_v41_seq_create(&sr, m.get(), 64, DSATTN_V41_INDEX_K_OWNER);
    seq_ptr s(sr);
    if (st) return fail(st, err);
    const size_t dim = static_cast<size_t>(dsattn_v41_dim(m.get()));
    std::vector<float> h(5 * dim);
    for (size_t i = 0; i < h.size(); i++)
        h[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    st = dsattn_v41_stack_forward(ctx.get(), s.get(), h.data(), 4, nullptr, nullptr);
    if (!st) st = dsattn_v41_stack_forward(ctx.get(), s.get(), h.data() + 4 * dim, 1, nullptr, nullptr);
    if (st) return fail(st, err);
    double sum = 0;
    for (float v : h) sum += v;
    std::printf("dsattn %s: %d layers, position %lld, checksum %.6f\n", dsattn_version(),
                dsattn_v41_n_layers(m.get()), static_cast<long long>(dsattn_v41_seq_pos(s.get())),
                sum);
    return 0;
}
