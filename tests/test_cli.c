/* test_cli.c - the dsattn tool's command line: the strict number parser
 * (tools/cli_num.c, compiled in here) and, through the built binary, every
 * numeric option of every subcommand refusing malformed values with exit
 * status 2 and a message naming the option and its range before any work;
 * then what the subcommands do (run, bench --weights, soak). */
#include "harness.h"

#include "../tools/cli_num.c"

#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

DSATTN_TEST(cli, parser_accepts_and_refuses)
{
    /* the refusals print to stderr by design; keep the log readable */
    fflush(stderr);
    int saved = dup(2), nul = open("/dev/null", O_WRONLY);
    if (nul >= 0) dup2(nul, 2);
    long long x = -7;
    CHECK_EQ_INT(dsattn_cli_int("t", "--n", "4096", 1, 1 << 30, 0, &x), 0);
    CHECK_EQ_INT(x, 4096);
    CHECK_EQ_INT(dsattn_cli_int("t", "--n", "1M", 1, 1 << 30, DSATTN_CLI_SUFFIX, &x), 0);
    CHECK_EQ_INT(x, 1048576);
    CHECK_EQ_INT(dsattn_cli_int("t", "--n", "128k", 1, 1 << 30, DSATTN_CLI_SUFFIX, &x), 0);
    CHECK_EQ_INT(x, 131072);
    CHECK_EQ_INT(dsattn_cli_int("t", "--n", "-3", -5, 5, 0, &x), 0);
    CHECK_EQ_INT(x, -3);
    x = 99;
    /* refused: no partial parses, no blanks, no suffix without the flag */
    const char *bad[] = { "", "abc", "1e3", " 1", "1 ", "+1", "1M", "0x10", "1.5", "-", "--1" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_MSG(dsattn_cli_int("t", "--n", bad[i], -5, 1 << 30, 0, &x) == 2, "'%s'", bad[i]);
    CHECK_EQ_INT(x, 99);
    CHECK_EQ_INT(dsattn_cli_int("t", "--n", "9223372036854775807", 0, 10, 0, &x), 2);
    CHECK_EQ_INT(dsattn_cli_int("t", "--n", "99999999999999999999", 0, 10, 0, &x), 2);
    CHECK_EQ_INT(dsattn_cli_int("t", "--n", "9999999999999G", 0, 1ll << 62,
                                DSATTN_CLI_SUFFIX, &x), 2);
    CHECK_EQ_INT(dsattn_cli_int("t", "--n", "0", 1, 10, 0, &x), 2);
    CHECK_EQ_INT(dsattn_cli_int("t", "--n", "11", 1, 10, 0, &x), 2);
    CHECK_EQ_INT(x, 99);

    uint64_t u = 0;
    CHECK_EQ_INT(dsattn_cli_u64("t", "--seed", "18446744073709551615", &u), 0);
    CHECK(u == UINT64_MAX);
    CHECK_EQ_INT(dsattn_cli_u64("t", "--seed", "18446744073709551616", &u), 2);
    CHECK_EQ_INT(dsattn_cli_u64("t", "--seed", "-1", &u), 2);
    CHECK_EQ_INT(dsattn_cli_u64("t", "--seed", "", &u), 2);

    double d = 0;
    CHECK_EQ_INT(dsattn_cli_double("t", "--mib", "512.5", 1, 1024, &d), 0);
    CHECK(d == 512.5);
    const char *badd[] = { "", "nan", "inf", "1e30", "0x10", "1,5", "-1", "2e", "1e-400" };
    for (size_t i = 0; i < sizeof badd / sizeof badd[0]; i++)
        CHECK_MSG(dsattn_cli_double("t", "--mib", badd[i], 1, 1024, &d) == 2, "'%s'", badd[i]);

    long long v[4];
    int n = 0;
    CHECK_EQ_INT(dsattn_cli_list("t", "--depth", "4096,65536,1M", 1, 1 << 30,
                                 DSATTN_CLI_SUFFIX, v, 4, &n), 0);
    CHECK_EQ_INT(n, 3);
    CHECK(v[0] == 4096 && v[1] == 65536 && v[2] == 1048576);
    const char *badl[] = { "", ",", "1,", ",1", "1,,2", "1,abc", "1,0", "1,2,3,4,5" };
    for (size_t i = 0; i < sizeof badl / sizeof badl[0]; i++)
        CHECK_MSG(dsattn_cli_list("t", "--depth", badl[i], 1, 1 << 30, DSATTN_CLI_SUFFIX, v, 4,
                                  &n) == 2, "'%s'", badl[i]);
    fflush(stderr);
    if (saved >= 0) dup2(saved, 2);
    if (saved >= 0) close(saved);
    if (nul >= 0) close(nul);
}

/* Run the CLI with argv (NULL-terminated); returns the exit status, stderr
 * (and stdout when with_stdout) in err.  fsize > 0: the child runs under
 * that file-size limit (RLIMIT_FSIZE, bytes). */
static int run_cli_ex(char *const *argv, char *err, size_t errlen, int with_stdout, long fsize)
{
    char path[DSATTN_TEST_PATH];
    if (!dsattn_test_tmp(path, sizeof path, "dsattn_test_cli_XXXXXX")) return -1;
    int fd = mkstemp(path);
    if (fd < 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        if (fsize > 0) {
            const struct rlimit rl = { (rlim_t)fsize, (rlim_t)fsize };
            if (setrlimit(RLIMIT_FSIZE, &rl)) _exit(126);
        }
        int nul = with_stdout ? fd : open("/dev/null", O_WRONLY);
        if (nul >= 0) dup2(nul, 1);
        dup2(fd, 2);
        execv(DSATTN_CLI_PATH, argv);
        _exit(127);
    }
    int ws = 0;
    if (pid < 0 || waitpid(pid, &ws, 0) != pid) ws = -1;
    lseek(fd, 0, SEEK_SET);
    ssize_t got = read(fd, err, errlen - 1);
    err[got > 0 ? got : 0] = 0;
    close(fd);
    unlink(path);
    return ws >= 0 && WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
}

static int run_cli_to(char *const *argv, char *err, size_t errlen, int with_stdout)
{
    return run_cli_ex(argv, err, errlen, with_stdout, 0);
}

/* The CLI with argv; its stderr in err (stdout discarded).  Exit status. */
static int run_cli(char *const *argv, char *err, size_t errlen)
{
    return run_cli_to(argv, err, errlen, 0);
}

/* Every command and bench mode: --help prints its usage to stdout and
 * exits 0; an unknown option is refused on stderr with exit 2. */
DSATTN_TEST(cli, every_help_to_stdout_every_unknown_option_refused)
{
    static const char *const cmds[][2] = {
        { "run", NULL }, { "bill", NULL }, { "trace", NULL }, { "info", NULL },
        { "make-weights", NULL }, { "soak", NULL }, { "ced", NULL }, { "bench", "kernels" },
        { "bench", "blas" }, { "bench", "v41" }, { "bench", "mha" }, { "bench", "mla" },
        { "bench", "v4" }, { "bench", "session" },
    };
    char out[8192];
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        for (int bad = 0; bad < 2; bad++) {
            char *argv[5] = { "dsattn", (char *)cmds[i][0], NULL, NULL, NULL };
            int a = 2;
            if (cmds[i][1]) argv[a++] = (char *)cmds[i][1];
            argv[a] = bad ? "--no-such-option" : "--help";
            /* stdout discarded: out holds stderr only */
            const int rc = run_cli(argv, out, sizeof out);
            if (bad)
                CHECK_MSG(rc == 2 && out[0], "%s %s --no-such-option: exit %d, stderr '%.80s'",
                          cmds[i][0], cmds[i][1] ? cmds[i][1] : "", rc, out);
            else
                CHECK_MSG(rc == 0 && !out[0], "%s %s --help: exit %d, stderr '%.80s'",
                          cmds[i][0], cmds[i][1] ? cmds[i][1] : "", rc, out);
        }
    }
    char *argv[3] = { "dsattn", "--version", NULL };
    CHECK_EQ_INT(run_cli_to(argv, out, sizeof out, 1), 0);
    CHECK_MSG(strncmp(out, dsattn_version(), strlen(dsattn_version())) == 0, "--version: '%s'", out);
}

DSATTN_TEST(cli, every_numeric_option_is_strict)
{
    /* subcommand words, then the option; the option comes first so the
     * refusal cannot depend on any other argument */
    static const struct { const char *cmd[3]; const char *opt; } opts[] = {
        { { "run" }, "--seed" },           { { "run" }, "--prefill" },
        { { "run" }, "--decode" },         { { "run" }, "--threads" },
        { { "trace" }, "--threads" },
        { { "bill" }, "--ctx" },           { { "bill" }, "--budget-mib" },
        { { "bill" }, "--seed" },          { { "bill" }, "--threads" },
        { { "make-weights" }, "--seed" },  { { "make-weights" }, "--shards" },
        { { "bench", "kernels" }, "--threads" }, { { "bench", "kernels" }, "--mem" },
        { { "bench", "v41" }, "--depth" }, { { "bench", "v41" }, "--threads" },
        { { "bench", "v41" }, "--reps" },  { { "bench", "v41" }, "--prefill" },
        { { "bench", "v41" }, "--seed" },
        { { "bench", "mha" }, "--depth" }, { { "bench", "mha" }, "--threads" },
        { { "bench", "mha" }, "--reps" },  { { "bench", "mha" }, "--seed" },
        { { "bench", "mha" }, "--batch" }, { { "bench", "mla" }, "--batch" },
        { { "bench", "mla" }, "--depth" }, { { "bench", "mla" }, "--threads" },
        { { "bench", "mla" }, "--reps" },  { { "bench", "mla" }, "--seed" },
        { { "bench", "v4" }, "--depth" },  { { "bench", "v4" }, "--threads" },
        { { "bench", "v4" }, "--reps" },   { { "bench", "v4" }, "--seed" },
        { { "bench", "session" }, "--depth" }, { { "bench", "session" }, "--reps" },
        { { "soak" }, "--seconds" },       { { "soak" }, "--seed" },
        { { "soak" }, "--threads" },       { { "soak" }, "--report-every" },
    };
    static const char *vals[] = { "abc", "-1", "1e30", "", "99999999999999999999999" };
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
        for (size_t j = 0; j < sizeof vals / sizeof vals[0]; j++) {
            char *argv[8];
            int k = 0;
            argv[k++] = (char *)"dsattn";
            for (int c = 0; c < 3 && opts[i].cmd[c]; c++) argv[k++] = (char *)opts[i].cmd[c];
            argv[k++] = (char *)opts[i].opt;
            argv[k++] = (char *)vals[j];
            argv[k] = NULL;
            char err[2048];
            int rc = run_cli(argv, err, sizeof err);
            CHECK_MSG(rc == 2 && strstr(err, opts[i].opt) && strstr(err, "accepted"),
                      "%s %s %s '%s': exit %d, stderr '%s'", opts[i].cmd[0],
                      opts[i].cmd[1] ? opts[i].cmd[1] : "", opts[i].opt, vals[j], rc, err);
        }
}

/* Word options too: an unknown value is refused, never read as a default. */
DSATTN_TEST(cli, unknown_isa_is_refused)
{
    char *argv[] = { (char *)"dsattn", (char *)"bench", (char *)"kernels", (char *)"--isa",
                     (char *)"avx3", NULL };
    char err[2048];
    int rc = run_cli(argv, err, sizeof err);
    CHECK_MSG(rc == 2 && strstr(err, "--isa") && strstr(err, "avx3"), "exit %d, stderr '%s'", rc,
              err);
}

/* dsattn trace --compare: the verdict and the exit status.  Reference mode
 * against the case's own expected file: MATCH, bit for bit (0); the
 * reference index_k quirk against the owner-mode file: DIFFERS (1); fast
 * mode: `out` within the file's noise floor (0); no expected file, or an
 * unreadable one: 2. */
DSATTN_TEST(cli, trace_compare_verdicts)
{
    char out[DSATTN_TEST_PATH], dir[1024], intended[1200], res[8192];
    dsattn_test_tmp(out, sizeof out, "dsattn_test_cli_trace.safetensors");
    snprintf(dir, sizeof dir, "%s", dsattn_test_data("golden/v41/tiny-seed0"));
    snprintf(intended, sizeof intended, "%s/expected_intended.safetensors", dir);
    const struct { const char *mode, *index_k, *cmp, *want; int rc; } cases[] = {
        { "reference", "owner", "auto", "verdict: MATCH, bit for bit", 0 },
        { "reference", "reference", "auto", "verdict: MATCH, bit for bit", 0 },
        { "reference", "reference", NULL, "verdict: DIFFERS", 1 },   /* the owner-mode file */
        { "fast", "owner", "auto", "verdict: MATCH, `out` within the noise floor", 0 },
        { "reference", "owner", "/nonexistent/expected.safetensors", "compare:", 2 },
        { "reference", "owner", out, "is the file --compare reads", 2 },    /* --out itself */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *argv[] = { (char *)"dsattn", (char *)"trace", (char *)"--case", dir,
                         (char *)"--out", out, (char *)"--mode", (char *)cases[i].mode,
                         (char *)"--index-k", (char *)cases[i].index_k, (char *)"--compare",
                         (char *)(cases[i].cmp ? cases[i].cmp : intended), NULL };
        const int rc = run_cli_to(argv, res, sizeof res, 1);
        CHECK_MSG(rc == cases[i].rc && strstr(res, cases[i].want), "case %zu: exit %d, '%s'", i,
                  rc, res);
    }
    /* auto in a folder with no expected file */
    char *argv[] = { (char *)"dsattn", (char *)"trace", (char *)"--case", dir, (char *)"--out",
                     out, (char *)"--compare", (char *)"auto", NULL };
    char nodir[DSATTN_TEST_PATH];
    dsattn_test_tmp(nodir, sizeof nodir, "dsattn_test_cli_case_XXXXXX");
    if (mkdtemp(nodir)) {
        static const char *const f[] = { "config.json", "weights.safetensors", "input.safetensors" };
        for (size_t i = 0; i < 3; i++) {
            char src[1200], dst[DSATTN_TEST_PATH + 32];
            snprintf(src, sizeof src, "%s/%s", dir, f[i]);
            snprintf(dst, sizeof dst, "%s/%s", nodir, f[i]);
            CHECK(symlink(src, dst) == 0);
        }
        argv[3] = nodir;
        const int rc = run_cli_to(argv, res, sizeof res, 1);
        CHECK_MSG(rc == 2 && strstr(res, "no expected.safetensors"), "exit %d, '%s'", rc, res);
        for (size_t i = 0; i < 3; i++) {
            char dst[DSATTN_TEST_PATH + 32];
            snprintf(dst, sizeof dst, "%s/%s", nodir, f[i]);
            unlink(dst);
        }
        rmdir(nodir);
    }
    unlink(out);
}

/* ==== dsattn run: every generation, --out ================================ */

#include "checkpoint.h"
#include "config.h"
#include "safetensors.h"

/* A tiny llama (GQA) config in the test's scratch file. */
static const char *tiny_llama(void)
{
    static char path[DSATTN_TEST_PATH];
    dsattn_test_tmp(path, sizeof path, "dsattn_test_cli_llama.json");
    FILE *f = fopen(path, "w");
    if (!f) return NULL;
    fprintf(f, "{\"model_type\": \"llama\", \"hidden_size\": 128, \"num_hidden_layers\": 3,\n"
               " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"rope_theta\": 10000.0,\n"
               " \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-6}\n");
    fclose(f);
    return path;
}

/* `dsattn run` with argv[1..] (NULL-terminated, at most 24). */
static int run_cmd(const char *const *args, char *err, size_t errlen)
{
    char *argv[32];
    int k = 0;
    argv[k++] = (char *)"dsattn";
    argv[k++] = (char *)"run";
    for (int i = 0; args[i] && k < 30; i++) argv[k++] = (char *)args[i];
    argv[k] = NULL;
    return run_cli(argv, err, errlen);
}

/* out.{position} of a --out file into v[n_pos][dim]; 0 on success. */
static int read_outs(const char *path, int64_t first, int n_pos, size_t dim, float *v)
{
    dsattn_st_file *f = NULL;
    char err[256];
    if (dsattn_st_open(&f, path, err, sizeof err)) return -1;
    int bad = dsattn_st_count(f) != (size_t)n_pos;
    for (int i = 0; i < n_pos && !bad; i++) {
        char nm[64];
        snprintf(nm, sizeof nm, "out.%lld", (long long)(first + i));
        const dsattn_st_tensor *t = dsattn_st_find(f, nm);
        bad = !t || t->dtype != DSATTN_DT_F32 || t->ndim != 1 || (size_t)t->shape[0] != dim ||
              dsattn_st_to_f32(t, v + (size_t)i * dim, dim) != DSATTN_OK;
    }
    dsattn_st_close(f);
    return bad ? -1 : 0;
}

/* A V4 config whose keys and shapes are well-formed but whose head_dim
 * 130 breaks a rule only the generation's reader knows (its nope part, 114,
 * is not in the window's FP8 blocks of 64), written to a test file named
 * into path; 0 on success. */
static int write_bad_v4(char *path, size_t n)
{
    dsattn_test_tmp(path, n, "dsattn_test_cli_badv4.json");
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "{\"model_type\": \"deepseek_v4\", \"dim\": 128, \"n_layers\": 2,"
               " \"n_heads\": 2, \"q_lora_rank\": 64, \"head_dim\": 130,"
               " \"rope_head_dim\": 16, \"o_groups\": 1, \"o_lora_rank\": 32,"
               " \"window_size\": 4, \"index_n_heads\": 2, \"index_head_dim\": 32,"
               " \"index_topk\": 4, \"compress_ratios\": [4, 8, 0],"
               " \"original_seq_len\": 65536, \"rope_theta\": 10000, \"rope_factor\": 16,"
               " \"beta_fast\": 32, \"beta_slow\": 1, \"compress_rope_theta\": 160000,"
               " \"norm_eps\": 1e-6}\n");
    return fclose(f);
}

static const struct { const char *name, *config; size_t dim; } run_gens[] = {
    { "MHA/GQA", NULL, 128 },
    { "V3", "golden/v3/tiny-seed0/config.json", 0 },
    { "V3.2", "golden/v32/tiny-seed0/config.json", 0 },
    { "V4", "golden/v4/tiny-seed0/config.json", 0 },
    { "V4.1", "golden/v41/tiny-seed0/config.json", 0 },
};

DSATTN_TEST(cli, run_every_generation)
{
    char out[DSATTN_TEST_PATH], err[4096];
    dsattn_test_tmp(out, sizeof out, "dsattn_test_cli_run.st");
    for (size_t g = 0; g < sizeof run_gens / sizeof run_gens[0]; g++) {
        const char *cfg = run_gens[g].config ? dsattn_test_data(run_gens[g].config) : tiny_llama();
        const char *args[] = { "--config", cfg, "--bf16", "--prefill", "6", "--decode", "2",
                               "--threads", "1", "--mode", "reference", "--out", out, NULL };
        int rc = run_cmd(args, err, sizeof err);
        CHECK_MSG(rc == 0, "%s: exit %d: %s", run_gens[g].name, rc, err);
        /* the dims come from the file: every golden config has dim 256 */
        size_t dim = run_gens[g].dim ? run_gens[g].dim : 256;
        float v[2 * 256];
        CHECK_MSG(read_outs(out, 6, 2, dim, v) == 0, "%s: out.6, out.7 [%zu]", run_gens[g].name,
                  dim);
        int finite = 1;
        for (size_t i = 0; i < 2 * dim; i++) finite &= isfinite(v[i]) != 0;
        CHECK_MSG(finite, "%s: non-finite outputs", run_gens[g].name);
        unlink(out);
    }
    /* a config the library refuses, run on its first layers (a copy of
     * the config with fewer layers): the error names the user's file */
    char cfg[DSATTN_TEST_PATH];
    const int bad_ok = write_bad_v4(cfg, sizeof cfg) == 0;
    CHECK(bad_ok);
    if (bad_ok) {
        const char *one[] = { "--config", cfg, "--bf16", "--layers", "1", NULL };
        CHECK_EQ_INT(run_cmd(one, err, sizeof err), 1);
        CHECK_MSG(strstr(err, cfg) && strstr(err, "head_dim 130") &&
                      strstr(err, "its first 1 layer)") && !strstr(err, "run-layers"),
                  "%s", err);
        unlink(cfg);
    }
    /* V4.1's layers share caches: --layers below its count is refused */
    const char *bad[] = { "--config", dsattn_test_data("golden/v41/tiny-seed0/config.json"),
                          "--layers", "3", NULL };
    CHECK_EQ_INT(run_cmd(bad, err, sizeof err), 2);
    unlink(tiny_llama());
}

/* Under valgrind the CLI runs as it is, without its re-exec (the kernel's
 * /proc/self/exe is valgrind's tool there, which refuses to run): a short
 * V4.1 run (the AVX2 table: valgrind has no AVX-512), exit 0 and no
 * memcheck error.  Skipped where valgrind is not installed (scripts/setup.sh
 * installs it), in a cross build (the CLI runs under an emulator) and in a
 * sanitizer build (AddressSanitizer's shadow memory and valgrind exclude
 * each other; the tests and the CLI share the build's flags). */
#if defined(__SANITIZE_ADDRESS__)
#define CLI_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CLI_ASAN 1
#endif
#endif
DSATTN_TEST(cli, runs_under_valgrind)
{
#if defined(CLI_ASAN)
    dsattn_test_skip("a sanitizer build: valgrind cannot run it");
#elif defined(__x86_64__)
    static const char vg[] = "/usr/bin/valgrind";
    if (access(vg, X_OK) != 0) {
        dsattn_test_skip("no /usr/bin/valgrind");
        return;
    }
    char path[DSATTN_TEST_PATH], out[16384];
    if (!dsattn_test_tmp(path, sizeof path, "dsattn_test_cli_vg_XXXXXX")) return;
    const int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    const pid_t pid = fork();
    if (pid == 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        unsetenv("OMP_WAIT_POLICY");          /* the CLI would re-exec to set it */
        unsetenv("DSATTN_BLAS_REEXEC");
        setenv("DSATTN_ISA", "avx2", 1);
        char *argv[] = { (char *)vg, "-q", "--error-exitcode=3", (char *)DSATTN_CLI_PATH, "run",
                         "--config",
                         (char *)dsattn_test_data("golden/v41/tiny-seed0/config.json"),
                         "--prefill", "3", "--decode", "1", "--threads", "1", NULL };
        execv(vg, argv);
        _exit(127);
    }
    int ws = 0;
    if (pid < 0 || waitpid(pid, &ws, 0) != pid) ws = -1;
    lseek(fd, 0, SEEK_SET);
    const ssize_t got = read(fd, out, sizeof out - 1);
    out[got > 0 ? got : 0] = 0;
    close(fd);
    unlink(path);
    const int rc = ws >= 0 && WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
    CHECK_MSG(rc == 0 && !strstr(out, "cannot run"), "valgrind dsattn run: exit %d: %s", rc,
              out);
#else
    dsattn_test_skip("valgrind runs the x86-64 build only here");
#endif
}

/* --batch B for MLA (V3, V3.2) and MHA / GQA: B sequences prefilled,
 * decoded in batched steps. */
DSATTN_TEST(cli, run_batch_mla)
{
    char err[4096];
    const char *cfgs[] = { "golden/v3/tiny-seed0/config.json", "golden/v32/tiny-seed0/config.json" };
    for (int g = 0; g < 2; g++) {
        const char *args[] = { "--config", dsattn_test_data(cfgs[g]), "--bf16", "--prefill", "4",
                               "--decode", "2", "--threads", "2", "--batch", "3", NULL };
        const int rc = run_cmd(args, err, sizeof err);
        CHECK_MSG(rc == 0, "%s --batch 3: exit %d: %s", cfgs[g], rc, err);
    }
    const char *mha[] = { "--config", tiny_llama(), "--prefill", "3", "--decode", "2", "--batch",
                          "2", "--threads", "2", NULL };
    const int rc = run_cmd(mha, err, sizeof err);
    CHECK_MSG(rc == 0, "MHA --batch 2: exit %d: %s", rc, err);
    unlink(tiny_llama());
}

/* --out: identical runs give identical files; the output at a position
 * does not depend on how many steps follow it (capacity) and changes with
 * the seed. */
DSATTN_TEST(cli, run_out_is_reproducible)
{
    const char *gens[] = { "golden/v3/tiny-seed0/config.json", "golden/v41/tiny-seed0/config.json",
                           NULL };
    for (int g = 0; gens[g]; g++) {
        char a[DSATTN_TEST_PATH], b[DSATTN_TEST_PATH], c[DSATTN_TEST_PATH], d[DSATTN_TEST_PATH];
        char err[4096];
        dsattn_test_tmp(a, sizeof a, "dsattn_test_cli_a.st");
        dsattn_test_tmp(b, sizeof b, "dsattn_test_cli_b.st");
        dsattn_test_tmp(c, sizeof c, "dsattn_test_cli_c.st");
        dsattn_test_tmp(d, sizeof d, "dsattn_test_cli_d.st");
        const char *cfg = dsattn_test_data(gens[g]);
        for (int rep = 0; rep < 2; rep++) {
            const char *args[] = { "--config", cfg, "--bf16", "--prefill", "8", "--decode", "4",
                                   "--threads", "2", "--mode", "reference", "--out",
                                   rep ? b : a, NULL };
            CHECK_EQ_INT(run_cmd(args, err, sizeof err), 0);
        }
        const char *shorter[] = { "--config", cfg, "--bf16", "--prefill", "8", "--decode", "2",
                                  "--threads", "1", "--mode", "reference", "--out", c, NULL };
        CHECK_EQ_INT(run_cmd(shorter, err, sizeof err), 0);
        const char *seed2[] = { "--config", cfg, "--bf16", "--prefill", "8", "--decode", "4",
                                "--seed", "2", "--mode", "reference", "--out", d, NULL };
        CHECK_EQ_INT(run_cmd(seed2, err, sizeof err), 0);
        char cmd[2 * DSATTN_TEST_PATH + 32];
        snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", a, b);
        CHECK_MSG(system(cmd) == 0, "%s: two identical runs wrote different files", gens[g]);
        static float va[4 * 256], vc[2 * 256], vd[4 * 256];
        CHECK_OK(read_outs(a, 8, 4, 256, va));
        CHECK_OK(read_outs(c, 8, 2, 256, vc));
        CHECK_OK(read_outs(d, 8, 4, 256, vd));
        CHECK_BITS("out.8, out.9 with 2 or 4 decode steps", vc, va, 2 * 256);
        CHECK_MSG(memcmp(va, vd, sizeof va) != 0, "%s: seed 2 gave seed 1's outputs", gens[g]);
        unlink(a);
        unlink(b);
        unlink(c);
        unlink(d);
    }
}

/* --batch: V4.1 and V4 decode B sequences in batched steps (MLA, MHA:
 * run_batch_mla); the single-sequence options are refused. */
DSATTN_TEST(cli, run_batch)
{
    char err[4096];
    const char *cfgs[] = { "golden/v41/tiny-seed0/config.json", "golden/v4/tiny-seed0/config.json" };
    for (int g = 0; g < 2; g++) {
        const char *args[] = { "--config", dsattn_test_data(cfgs[g]), "--bf16", "--prefill", "3",
                               "--decode", "2", "--batch", "3", "--threads", "2", NULL };
        int rc = run_cmd(args, err, sizeof err);
        CHECK_MSG(rc == 0, "%s: exit %d: %s", cfgs[g], rc, err);
    }
    char never[DSATTN_TEST_PATH];
    dsattn_test_tmp(never, sizeof never, "dsattn_test_cli_never.ses");
    const char *save[] = { "--config", dsattn_test_data("golden/v41/tiny-seed0/config.json"),
                           "--batch", "2", "--save", never, NULL };
    CHECK_EQ_INT(run_cmd(save, err, sizeof err), 2);
    CHECK(access(never, F_OK) != 0);              /* refused before writing */
    const char *zero[] = { "--batch", "0", NULL };
    CHECK_EQ_INT(run_cmd(zero, err, sizeof err), 2);
}

/* The refusals `bench MODE --weights` shares: with --model (exit 2) and of
 * a missing checkpoint (exit 1, naming it, before any row); then removes
 * the checkpoint folder dir and the config file cfg. */
static void bench_weights_refusals(const char *mode, const char *model, const char *dir,
                                   const char *cfg)
{
    char err[8192];
    char *both[] = { "dsattn", "bench", (char *)mode, "--weights", (char *)dir, "--model",
                     (char *)model, "--depth", "64", NULL };
    CHECK_EQ_INT(run_cli(both, err, sizeof err), 2);
    CHECK_MSG(strstr(err, "--model and --weights"), "%s", err);
    char *bad[] = { "dsattn", "bench", (char *)mode, "--weights", "/nonexistent/w.safetensors",
                    "--depth", "64", "--threads", "1", NULL };
    CHECK_EQ_INT(run_cli(bad, err, sizeof err), 1);
    CHECK_MSG(strstr(err, "/nonexistent/w.safetensors") && !strstr(err, "[1/"), "%s", err);
    char rm[160];
    snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
    CHECK_EQ_INT(system(rm), 0);
    unlink(cfg);
}

/* bench mha --weights: layer 0 of a Llama-layout checkpoint (make-weights
 * --names hf) instead of the random 7B / 67B layers; --config only with
 * --weights; a missing checkpoint is an error naming it, before any table. */
DSATTN_TEST(cli, bench_mha_weights)
{
    char err[8192], dir[DSATTN_TEST_PATH];
    dsattn_test_tmp(dir, sizeof dir, "dsattn_test_cli_mhaw");
    const char *cfg = tiny_llama();
    CHECK(cfg != NULL);
    char *mk[] = { "dsattn", "make-weights", "--config", (char *)cfg, "--seed", "3", "--names",
                   "hf", "--out", dir, NULL };
    CHECK_MSG(run_cli(mk, err, sizeof err) == 0, "make-weights: %s", err);
    char *ok[] = { "dsattn", "bench", "mha", "--weights", dir, "--depth", "64,100", "--threads",
                   "1", "--reps", "1", NULL };
    CHECK_MSG(run_cli(ok, err, sizeof err) == 0, "exit != 0: %s", err);
    CHECK_MSG(strstr(err, "3 layers") && strstr(err, "weights mapped from") &&
                  strstr(err, "[2/2] checkpoint depth 100"), "%s", err);
    char *withcfg[] = { "dsattn", "bench", "mha", "--weights", dir, "--config", (char *)cfg,
                        "--depth", "64", "--threads", "1", "--reps", "1", NULL };
    CHECK_MSG(run_cli_to(withcfg, err, sizeof err, 1) == 0, "exit != 0: %s", err);
    /* markdown: the run ends with the read probe again, on stdout */
    CHECK_MSG(strstr(err, "DRAM read probe again at the end of the run, 1 thread: "), "%s", err);
    /* --batch: one row per batch size, its aggregate tokens/s */
    char *batch[] = { "dsattn", "bench", "mha", "--weights", dir, "--depth", "64", "--threads",
                      "1", "--reps", "1", "--batch", "1,3", "--format", "csv", NULL };
    CHECK_MSG(run_cli_to(batch, err, sizeof err, 1) == 0, "exit != 0: %s", err);
    CHECK_MSG(strstr(err, ",batch,tok_per_s") && strstr(err, "[2/2] checkpoint depth 64, 1 "
                                                              "threads, a batch"), "%s", err);
    /* the run ends with the read probe again (on stderr beside csv) */
    CHECK_MSG(strstr(err, "DRAM read probe again at the end of the run, 1 thread: "), "%s", err);
    CHECK_EQ_INT(run_cli(batch, err, sizeof err), 0);                  /* stderr only */
    CHECK_MSG(strstr(err, "DRAM read probe again at the end of the run, 1 thread: "), "%s", err);
    char *lone[] = { "dsattn", "bench", "mha", "--config", (char *)cfg, "--depth", "64", NULL };
    CHECK_EQ_INT(run_cli(lone, err, sizeof err), 2);
    CHECK_MSG(strstr(err, "--config goes with --weights"), "%s", err);
    bench_weights_refusals("mha", "7b", dir, cfg);
}

/* bench mla --weights: layer 0 of a V3.2 checkpoint (make-weights, FP8,
 * HF names) and of the golden V3 one, instead of the random V3 / V3.2
 * layers; a cache format the checkpoint cannot take is skipped by name;
 * --model with --weights and a missing checkpoint are refused before any
 * table. */
DSATTN_TEST(cli, bench_mla_weights)
{
    char err[8192], dir[DSATTN_TEST_PATH], cfg[DSATTN_TEST_PATH];
    dsattn_test_tmp(dir, sizeof dir, "dsattn_test_cli_mlaw");
    dsattn_test_tmp(cfg, sizeof cfg, "dsattn_test_cli_v32.json");
    FILE *f = fopen(cfg, "w");
    CHECK(f != NULL);
    if (!f) return;
    fprintf(f, "{\"model_type\": \"deepseek_v32\", \"dim\": 256, \"n_layers\": 2, \"n_heads\": 4,\n"
               " \"q_lora_rank\": 128, \"kv_lora_rank\": 128, \"qk_nope_head_dim\": 32,\n"
               " \"qk_rope_head_dim\": 16, \"v_head_dim\": 32, \"original_seq_len\": 4096,\n"
               " \"rope_theta\": 10000.0, \"rope_factor\": 40, \"beta_fast\": 32, \"beta_slow\": 1,\n"
               " \"mscale\": 1.0, \"max_seq_len\": 256, \"dtype\": \"fp8\", \"index_n_heads\": 4,\n"
               " \"index_head_dim\": 128, \"index_topk\": 16, \"scale_fmt\": \"ue8m0\"}\n");
    fclose(f);
    char *mk[] = { "dsattn", "make-weights", "--config", cfg, "--seed", "3", "--format", "fp8",
                   "--names", "hf", "--out", dir, NULL };
    CHECK_MSG(run_cli(mk, err, sizeof err) == 0, "make-weights: %s", err);
    char *ok[] = { "dsattn", "bench", "mla", "--weights", dir, "--depth", "64,100", "--threads",
                   "1", "--reps", "1", "--batch", "1,2", NULL };
    CHECK_MSG(run_cli(ok, err, sizeof err) == 0, "exit != 0: %s", err);
    CHECK_MSG(strstr(err, "V3.2, 2 layers") && strstr(err, "v3.2 fast vs reference") &&
                  strstr(err, "[4/4] v3.2 depth 100"), "%s", err);
    char v3[600];
    snprintf(v3, sizeof v3, "%s", dsattn_test_data("golden/v3/tiny-seed0/weights.safetensors"));
    char *golden[] = { "dsattn", "bench", "mla", "--weights", v3, "--depth", "64", "--threads",
                       "1", "--reps", "1", "--format", "csv", NULL };
    CHECK_MSG(run_cli(golden, err, sizeof err) == 0, "exit != 0: %s", err);
    CHECK_MSG(strstr(err, "V3, 3 layers") && strstr(err, "[1/2] v3 depth 64") &&
                  strstr(err, "v3-fp8: this checkpoint's cache cannot take"), "%s", err);
    bench_weights_refusals("mla", "v3", dir, cfg);
}

/* bench v4 --weights: the golden V4 checkpoint's first CSA layer (2) and
 * first HCA layer (3) instead of random ones, checked against reference
 * mode first; --model with --weights and a missing checkpoint refused. */
DSATTN_TEST(cli, bench_v4_weights)
{
    char err[8192], w[600];
    snprintf(w, sizeof w, "%s", dsattn_test_data("golden/v4/tiny-seed0/weights.safetensors"));
    char *ok[] = { "dsattn", "bench", "v4", "--weights", w, "--depth", "64,300", "--threads", "1",
                   "--reps", "1", "--format", "csv", NULL };
    CHECK_MSG(run_cli(ok, err, sizeof err) == 0, "exit != 0: %s", err);
    CHECK_MSG(strstr(err, "7 layers") && strstr(err, "csa fast vs reference") &&
                  strstr(err, "hca fast vs reference") && strstr(err, "[4/4] hca depth 300"),
              "%s", err);
    char *both[] = { "dsattn", "bench", "v4", "--weights", w, "--model", "csa", NULL };
    CHECK_EQ_INT(run_cli(both, err, sizeof err), 2);
    CHECK_MSG(strstr(err, "--model and --weights"), "%s", err);
    char *bad[] = { "dsattn", "bench", "v4", "--weights", "/nonexistent/w.safetensors", NULL };
    CHECK_EQ_INT(run_cli(bad, err, sizeof err), 1);
    CHECK_MSG(strstr(err, "/nonexistent/w.safetensors") && !strstr(err, "[1/"), "%s", err);
}

/* run --weights on a checkpoint whose loaded weights do not fit the memory
 * available (DSATTN_RUN_MEM_AVAILABLE stands in for MemAvailable): V3
 * converts its FP8 projections to bf16, so the run takes the first layers
 * that fit and says so; V3.2 borrows its FP8 bytes from the mapping and
 * runs every layer; with memory enough V3 runs every layer too. */
DSATTN_TEST(cli, run_weights_fits_the_memory)
{
    static char out[16384];
    char cfg[DSATTN_TEST_PATH], dir[2][DSATTN_TEST_PATH];
    for (int g = 0; g < 2; g++) {
        dsattn_test_tmp(cfg, sizeof cfg, "dsattn_test_cli_fit.json");
        dsattn_test_tmp(dir[g], sizeof dir[g], "dsattn_test_cli_fit_%d", g);
        FILE *f = fopen(cfg, "w");
        CHECK(f != NULL);
        if (!f) return;
        fprintf(f, "{\"model_type\": \"%s\", \"dim\": 1024, \"n_layers\": 6, \"n_heads\": 8,\n"
                   " \"q_lora_rank\": 512, \"kv_lora_rank\": 512, \"qk_nope_head_dim\": 128,\n"
                   " \"qk_rope_head_dim\": 64, \"v_head_dim\": 128, \"original_seq_len\": 4096,\n"
                   " \"rope_theta\": 10000.0, \"rope_factor\": 40, \"beta_fast\": 32,\n"
                   " \"beta_slow\": 1, \"mscale\": 1.0, \"max_seq_len\": 256, \"dtype\": \"fp8\"%s}\n",
                g ? "deepseek_v32" : "deepseek_v3",
                g ? ", \"index_n_heads\": 4, \"index_head_dim\": 128, \"index_topk\": 16,"
                    " \"scale_fmt\": \"ue8m0\"" : "");
        fclose(f);
        char *mk[] = { "dsattn", "make-weights", "--config", cfg, "--seed", "2", "--format", "fp8",
                       "--out", dir[g], NULL };
        CHECK_MSG(run_cli(mk, out, sizeof out) == 0, "make-weights: %s", out);
        unlink(cfg);
    }
    char *v3[] = { "dsattn", "run", "--weights", dir[0], "--prefill", "4", "--decode", "1",
                   "--threads", "1", NULL };
    char *v32[] = { "dsattn", "run", "--weights", dir[1], "--prefill", "4", "--decode", "1",
                    "--threads", "1", NULL };
    setenv("DSATTN_RUN_MEM_AVAILABLE", "30000000", 1);       /* ~2 V3 layers of bf16 */
    CHECK_MSG(run_cli_to(v3, out, sizeof out, 1) == 0, "%s", out);
    CHECK_MSG(strstr(out, "note: the weights of all 6 layers") && strstr(out, "running the first") &&
                  !strstr(out, " 6 of 6 layers"), "%s", out);
    CHECK_MSG(run_cli_to(v32, out, sizeof out, 1) == 0, "%s", out);
    CHECK_MSG(!strstr(out, "note:") && strstr(out, " 6 of 6 layers"), "%s", out);
    setenv("DSATTN_RUN_MEM_AVAILABLE", "1e12", 1);
    CHECK_MSG(run_cli_to(v3, out, sizeof out, 1) == 0, "%s", out);
    CHECK_MSG(!strstr(out, "note:") && strstr(out, " 6 of 6 layers"), "%s", out);
    unsetenv("DSATTN_RUN_MEM_AVAILABLE");
    for (int g = 0; g < 2; g++) {
        char rm[sizeof dir + 32];
        snprintf(rm, sizeof rm, "rm -rf '%s'", dir[g]);
        CHECK_EQ_INT(system(rm), 0);
    }
}

/* info and make-weights hold a config to the generation's own rules, not
 * only to its keys and tensor shapes: a V4 head_dim whose nope part is not
 * in the window's FP8 blocks of 64 loads nowhere, so make-weights writes
 * no checkpoint of it and info fails one written by the library's writer
 * (it said "OK: complete and consistent" before). */
DSATTN_TEST(cli, info_and_make_weights_apply_the_generation_rules)
{
    char cfg[DSATTN_TEST_PATH], dir[DSATTN_TEST_PATH], dir2[DSATTN_TEST_PATH], err[4096];
    dsattn_test_tmp(dir, sizeof dir, "dsattn_test_cli_rules");
    dsattn_test_tmp(dir2, sizeof dir2, "dsattn_test_cli_rules2");
    const int bad_ok = write_bad_v4(cfg, sizeof cfg) == 0;
    CHECK(bad_ok);
    if (!bad_ok) return;
    dsattn_model_config c;
    dsattn_mw_params p = { 1, DSATTN_MW_BF16, DSATTN_MW_NAMES_INFERENCE, 1, cfg };
    CHECK_OK(dsattn_config_load(&c, cfg, err, sizeof err));
    CHECK_OK(dsattn_make_weights(&c, &p, dir, err, sizeof err));
    char *info[] = { "dsattn", "info", dir, NULL };
    CHECK_EQ_INT(run_cli(info, err, sizeof err), 1);
    CHECK_MSG(strstr(err, "head_dim 130") && strstr(err, "FAILED"), "%s", err);
    char *mk[] = { "dsattn", "make-weights", "--config", cfg, "--seed", "1", "--out", dir2, NULL };
    CHECK_EQ_INT(run_cli(mk, err, sizeof err), 1);
    CHECK_MSG(strstr(err, "head_dim 130"), "%s", err);
    CHECK(access(dir2, F_OK) != 0);
    char rm[sizeof dir + 32];
    snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
    CHECK_EQ_INT(system(rm), 0);
    unlink(cfg);
}

/* bench v41 --weights: a checkpoint's own weights, memory-mapped, instead
 * of random ones (stderr says which); a missing one is an error naming it. */
DSATTN_TEST(cli, bench_v41_weights)
{
    char err[8192], w[600], data[600];
    snprintf(w, sizeof w, "%s", dsattn_test_data("golden/v41/tiny-seed2-fp8/weights.safetensors"));
    snprintf(data, sizeof data, "%s", dsattn_test_data(""));
    char *ok[] = { "dsattn", "bench", "v41", "--weights", w, "--depth", "64", "--threads", "1",
                   "--prefill", "4", "--reps", "1", "--data", data, NULL };
    CHECK_MSG(run_cli(ok, err, sizeof err) == 0, "exit != 0: %s", err);
    CHECK_MSG(strstr(err, "weights mapped from") && strstr(err, "12 layers"), "%s", err);
    char *bad[] = { "dsattn", "bench", "v41", "--weights", "/nonexistent/w.safetensors",
                    "--depth", "64", "--threads", "1", "--prefill", "0", NULL };
    CHECK_EQ_INT(run_cli(bad, err, sizeof err), 1);
    CHECK_MSG(strstr(err, "/nonexistent/w.safetensors"), "%s", err);
}

/* ==== dsattn soak ======================================================== */

/* A short soak in each mode: every generation, the report lines and the
 * PASS verdict, exit 0 (the suite's TMPDIR check: no file left behind). */
DSATTN_TEST(cli, soak_short_run_passes)
{
    static char out[65536];
    static const char *const modes[2] = { "reference", "fast" };
    for (int m = 0; m < 2; m++) {
        char *argv[] = { "dsattn", "soak", "--seconds", "2", "--report-every", "1", "--mode",
                         (char *)modes[m], NULL };
        const int rc = run_cli_to(argv, out, sizeof out, 1);
        CHECK_MSG(rc == 0, "soak --mode %s: exit %d: %s", modes[m], rc, out);
        CHECK_MSG(strstr(out, "dsattn soak: PASS: ") && strstr(out, " ops ") &&
                      strstr(out, "| live ") && strstr(out, "| heap ") && strstr(out, "| rss ") &&
                      strstr(out, "on mha,gqa,v3,v32,v4,v41") && !strstr(out, "FAIL"),
                  "soak --mode %s: %s", modes[m], out);
        const char *v = strstr(out, "dsattn soak: PASS: ");
        CHECK_MSG(v && strstr(v, modes[m]), "%s", out);
    }
    /* the odd shapes: their own models, named in the verdict */
    char *odd[] = { "dsattn", "soak", "--seconds", "2", "--report-every", "1", "--shapes", "odd",
                    NULL };
    int rc = run_cli_to(odd, out, sizeof out, 1);
    CHECK_MSG(rc == 0 && strstr(out, "dsattn soak: PASS: ") &&
                  strstr(out, "(odd shapes, fast mode") && strstr(out, "V3 MLA (2 layers, dim 192)") &&
                  strstr(out, "V4.1 CSA2 (10 layers, dim 160)") && !strstr(out, "FAIL"),
              "soak --shapes odd: exit %d: %s", rc, out);
    /* random shapes: each model's drawn config printed, the same for the
     * same seed, another for another seed */
    static char out2[65536];
    char *rnd[] = { "dsattn", "soak", "--seconds", "1", "--report-every", "1", "--shapes",
                    "random", "--seed", "7", "--gens", "v4,v41", NULL };
    rc = run_cli_to(rnd, out, sizeof out, 1);
    const char *c4 = strstr(out, "\n  v4 ("), *c41 = strstr(out, "\n  v41 (");
    CHECK_MSG(rc == 0 && strstr(out, "(random shapes, fast mode, seed 7)") && c4 && c41 &&
                  strstr(c4, "{\"model_type\": \"deepseek_v4\"") &&
                  strstr(c41, "\"kv_source_layers\": [") && !strstr(out, "FAIL"),
              "soak --shapes random: exit %d: %s", rc, out);
    CHECK_EQ_INT(run_cli_to(rnd, out2, sizeof out2, 1), 0);
    const char *d41 = strstr(out2, "\n  v41 (");
    CHECK(c41 && d41 && !strncmp(c41, d41, (size_t)(strchr(c41 + 1, '\n') - c41)));
    rnd[9] = "8";
    CHECK_EQ_INT(run_cli_to(rnd, out2, sizeof out2, 1), 0);
    d41 = strstr(out2, "\n  v41 (");
    CHECK(c41 && d41 && strncmp(c41, d41, (size_t)(strchr(c41 + 1, '\n') - c41)));
    char *bad[] = { "dsattn", "soak", "--gens", "v3,v5", NULL };
    CHECK_EQ_INT(run_cli(bad, out, sizeof out), 2);
    CHECK_MSG(strstr(out, "--gens"), "%s", out);
    char *bad_shapes[] = { "dsattn", "soak", "--shapes", "even", NULL };
    CHECK_EQ_INT(run_cli(bad_shapes, out, sizeof out), 2);
    CHECK_MSG(strstr(out, "bad option --shapes even"), "%s", out);
}

/* The failure path, through a real failure and no hook in the tool: a
 * file-size limit (RLIMIT_FSIZE, 8 KiB) makes the first save of an MHA
 * sequence past a few tokens fail with DSATTN_ERR_IO; soak reports the
 * operation, generation, sequence and position, exits 1, and leaves no
 * temporary file (the suite's TMPDIR check). */
DSATTN_TEST(cli, soak_reports_a_failure)
{
    static char out[65536];
    char *argv[] = { "dsattn", "soak", "--seconds", "60", "--gens", "mha", "--threads", "1",
                     "--report-every", "1000", NULL };
    const int rc = run_cli_ex(argv, out, sizeof out, 1, 8192);
    CHECK_MSG(rc == 1, "exit %d: %s", rc, out);
    const char *f = strstr(out, "dsattn soak: FAIL: operation #");
    CHECK_MSG(f && strstr(f, "on MHA, sequence #") && strstr(f, " at position ") &&
                  strstr(f, "save returned i/o error, expected ok") &&
                  strstr(f, "the same command reproduces it") && !strstr(out, "PASS"),
              "%s", out);
}
