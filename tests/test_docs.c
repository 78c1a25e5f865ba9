/* test_docs.c - the project is self-contained: no file of it sends a
 * reader to a document that is not in the project.
 *
 * Walks the source tree (src, include, tools, tests, docs, scripts, .ci,
 * cmake, configs, python, and the top-level README.md, CMakeLists.txt,
 * Makefile) and fails on any text file that names one of the research
 * notes the project was written from, or a folder outside the repository
 * that held them.  What a reader needs from them is in docs/semantics.md,
 * docs/reference-mode.md and tests/data/golden/README.md.  The names are
 * spelled in pieces here so this file does not match itself. */
#include "harness.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *const outside[] = {
    "golden" "-cases", "reference" "-semantics", "cross" "check", "paper" "-facts",
    "conventions" ".md", "shared" "/spec", "shared" "/seeds", "../" "shared",
};

static size_t files_seen, hits;

/* 1 when the first bytes hold a NUL: data, not text */
static int is_binary(const char *buf, size_t n)
{
    return memchr(buf, 0, n < 8192 ? n : 8192) != NULL;
}

static void scan_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    for (size_t k; buf && (k = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += k;
        if (n == cap) {
            if (cap >= ((size_t)64 << 20)) break;          /* no text file is that big */
            char *nb = realloc(buf, 2 * cap + 1);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (!buf) return;
    buf[n] = 0;
    if (!is_binary(buf, n)) {
        files_seen++;
        for (size_t i = 0; i < sizeof outside / sizeof outside[0]; i++) {
            const char *p = strstr(buf, outside[i]);
            if (!p) continue;
            size_t line = 1;
            for (const char *q = buf; q < p; q++) line += *q == '\n';
            hits++;
            CHECK_MSG(0, "%s:%zu names '%s', a document outside the project (point to docs/ "
                         "instead)", path, line, outside[i]);
        }
    }
    free(buf);
}

static void scan(const char *path, int depth)
{
    struct stat sb;
    if (depth > 12 || stat(path, &sb) != 0) return;
    if (S_ISREG(sb.st_mode)) {
        scan_file(path);
        return;
    }
    if (!S_ISDIR(sb.st_mode)) return;
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        const char *nm = de->d_name;
        if (!strcmp(nm, ".") || !strcmp(nm, "..") || !strcmp(nm, "__pycache__")) continue;
        char sub[4096];
        if (snprintf(sub, sizeof sub, "%s/%s", path, nm) >= (int)sizeof sub) continue;
        scan(sub, depth + 1);
    }
    closedir(d);
}

DSATTN_TEST(docs, no_file_names_a_document_outside_the_project)
{
    static const char *const roots[] = { "src", "include", "tools", "tests", "docs", "scripts",
                                         ".ci", "cmake", "configs", "python", "README.md",
                                         "CMakeLists.txt", "Makefile" };
    files_seen = hits = 0;
    for (size_t i = 0; i < sizeof roots / sizeof roots[0]; i++) {
        char p[4096];
        snprintf(p, sizeof p, "%s/../../%s", DSATTN_TEST_DATA, roots[i]);
        scan(p, 0);
    }
    /* the walk really read the tree (this file, the headers, the docs) */
    CHECK_MSG(files_seen > 50, "only %zu text files scanned", files_seen);
}

DSATTN_TEST(docs, the_documents_pointed_to_exist)
{
    static const char *const docs[] = { "docs/semantics.md", "docs/reference-mode.md",
                                        "tests/data/golden/README.md" };
    for (size_t i = 0; i < sizeof docs / sizeof docs[0]; i++) {
        char p[4096];
        snprintf(p, sizeof p, "%s/../../%s", DSATTN_TEST_DATA, docs[i]);
        struct stat sb;
        CHECK_MSG(stat(p, &sb) == 0 && sb.st_size > 1000, "%s is missing or empty", docs[i]);
    }
}
