/* fuzz_common.h - what the libFuzzer targets of tests/fuzz share: a private
 * scratch folder per process and writing the fuzz input to a file in it,
 * for the readers whose entry points take a path (checkpoints, config.json,
 * shard indexes).  Header-only: every target is one translation unit. */
#ifndef DSATTN_FUZZ_COMMON_H
#define DSATTN_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The process's scratch folder, removed at exit with what it holds.  It is
 * made under $DSATTN_FUZZ_SCRATCH when set (scripts/fuzz.sh sets it to a
 * folder it removes itself: libFuzzer ends a run that hits a crash, a
 * timeout or a signal with _Exit, which skips this cleanup), else under
 * /dev/shm when it exists (the file is rewritten on every input), else /tmp. */
static char fuzz_dir_buf[256];
static const char *fuzz_files[8];
static int fuzz_n_files;

static void fuzz_cleanup(void)
{
    char p[512];
    for (int i = 0; i < fuzz_n_files; i++) {
        snprintf(p, sizeof p, "%s/%s", fuzz_dir_buf, fuzz_files[i]);
        unlink(p);
    }
    rmdir(fuzz_dir_buf);
}

static const char *fuzz_dir(void)
{
    if (fuzz_dir_buf[0]) return fuzz_dir_buf;
    const char *root = getenv("DSATTN_FUZZ_SCRATCH");
    if (!root || !*root) root = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    if (snprintf(fuzz_dir_buf, sizeof fuzz_dir_buf, "%s/dsattn-fuzz-XXXXXX", root) >=
        (int)sizeof fuzz_dir_buf)
        abort();                             /* the harness itself cannot run */
    if (!mkdtemp(fuzz_dir_buf)) abort();   /* the harness itself cannot run */
    atexit(fuzz_cleanup);
    return fuzz_dir_buf;
}

/* <dir>/<name> in path[n] (name must be a string literal), a name the exit
 * cleanup removes. */
static __attribute__((unused)) void fuzz_path(const char *name, char *path, size_t n)
{
    snprintf(path, n, "%s/%s", fuzz_dir(), name);
    int known = 0;
    for (int i = 0; i < fuzz_n_files; i++) known |= !strcmp(fuzz_files[i], name);
    if (!known && fuzz_n_files < 8) fuzz_files[fuzz_n_files++] = name;
}

/* Write data to fuzz_path(name).  Aborts only when the harness cannot
 * write its own file. */
static __attribute__((unused)) void fuzz_write(const char *name, const uint8_t *data, size_t size, char *path,
                       size_t n)
{
    fuzz_path(name, path, n);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    if (fclose(f)) abort();
}

#endif
