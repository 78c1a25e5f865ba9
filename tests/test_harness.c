/* test_harness.c - the test runner's own scratch files (harness.h): every
 * suite writes its configs, checkpoints and sessions under one directory
 * of the process's own, which must go away with everything in it, and
 * only by the process that made it.
 */
#include "harness.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static int write_file(const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    int ok = fputs("x\n", f) >= 0;
    return fclose(f) == 0 && ok ? 0 : -1;
}

DSATTN_TEST(harness, scratch_paths_live_in_one_private_directory)
{
    const char *d = dsattn_test_tmpdir();
    CHECK(d != NULL);
    if (!d) return;
    struct stat st;
    CHECK(stat(d, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 0077) == 0);
    const char *root = getenv("TMPDIR");
    if (root && root[0]) CHECK_MSG(strncmp(d, root, strlen(root)) == 0, "%s not under %s", d, root);
    char p[DSATTN_TEST_PATH];
    CHECK(dsattn_test_tmp(p, sizeof p, "a_%d.json", 7) == p);
    CHECK(strncmp(p, d, strlen(d)) == 0 && strcmp(p + strlen(d), "/a_7.json") == 0);
    /* a path that does not fit is a failed check and "" (in a child, whose
     * failed check is its exit status, its message silenced) */
    pid_t pid = fork();
    if (pid == 0) {
        FILE *nul = freopen("/dev/null", "w", stderr);
        (void)nul;
        char small[8] = "zzzzzzz";
        const int before = dsattn_test_failed();
        const int ok = dsattn_test_tmp(small, sizeof small, "longer_than_eight") == NULL &&
                       small[0] == '\0' && dsattn_test_failed() == before + 1;
        _exit(ok ? 0 : 1);
    }
    int ws = -1;
    CHECK(pid > 0 && waitpid(pid, &ws, 0) == pid && WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
}

DSATTN_TEST(harness, scratch_directory_removed_with_its_contents)
{
    char f1[DSATTN_TEST_PATH], sub[DSATTN_TEST_PATH], f2[DSATTN_TEST_PATH + 16];
    char old[DSATTN_TEST_PATH];
    const char *d = dsattn_test_tmpdir();
    if (!d) { CHECK(d != NULL); return; }
    snprintf(old, sizeof old, "%s", d);
    dsattn_test_tmp(f1, sizeof f1, "file.bin");
    dsattn_test_tmp(sub, sizeof sub, "sub");
    CHECK(write_file(f1) == 0);
    CHECK(mkdir(sub, 0700) == 0);
    snprintf(f2, sizeof f2, "%s/inner.json", sub);
    CHECK(write_file(f2) == 0);

    /* a forked child (a test's CLI run, say) never removes its parent's */
    pid_t pid = fork();
    if (pid == 0) _exit(dsattn_test_tmp_cleanup() == 0 && access(f2, F_OK) == 0 ? 0 : 1);
    int ws = -1;
    CHECK(pid > 0 && waitpid(pid, &ws, 0) == pid && WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    CHECK(access(f2, F_OK) == 0);

    CHECK_EQ_INT(dsattn_test_tmp_cleanup(), 0);
    CHECK(access(f2, F_OK) != 0 && access(sub, F_OK) != 0 && access(old, F_OK) != 0);
    /* the next use makes a new one */
    const char *d2 = dsattn_test_tmpdir();
    CHECK(d2 != NULL && access(d2, F_OK) == 0);
}
