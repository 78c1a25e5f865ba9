/* test_cli.c - the dsattn tool's command line: the strict number parser
 * (tools/cli_num.c, compiled in here) and, through the built binary, every
 * numeric option of every subcommand refusing malformed values with exit
 * status 2 and a message naming the option and its range before any work. */
#include "harness.h"

#include "../tools/cli_num.c"

#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
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
 * in err. */
static int run_cli(char *const *argv, char *err, size_t errlen)
{
    char path[] = "/tmp/dsattn_test_cli_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        int nul = open("/dev/null", O_WRONLY);
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
        { { "bench", "mla" }, "--depth" }, { { "bench", "mla" }, "--threads" },
        { { "bench", "mla" }, "--reps" },  { { "bench", "mla" }, "--seed" },
        { { "bench", "v4" }, "--depth" },  { { "bench", "v4" }, "--threads" },
        { { "bench", "v4" }, "--reps" },   { { "bench", "v4" }, "--seed" },
        { { "bench", "session" }, "--depth" }, { { "bench", "session" }, "--reps" },
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
