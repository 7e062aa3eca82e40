/* fuzz_common.h - what every parser harness shares: the input bytes as a file in /dev/shm
 * (for the parsers whose API takes a path), and the rule that a refused input comes
 * with a message.
 *
 * Each tests/fuzz/fuzz_<parser>.c defines `int fuzz_<parser>(const uint8_t *d, size_t n)`
 * (0: the input was parsed or cleanly refused; anything else: a finding) and, unless
 * FUZZ_NO_MAIN is defined, libFuzzer's entry point around it. tests/test_fuzz_regress.c
 * includes the same files with FUZZ_NO_MAIN and replays tests/fuzz/regress/ and the seed
 * corpora through the same functions in the ordinary (gcc) test suite. */
#ifndef STRATA_FUZZ_COMMON_H
#define STRATA_FUZZ_COMMON_H

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "strata/core.h"

static char fuzz_dir_path[256];
static char fuzz_names[8][64];

/* Remove what fuzz_file wrote (at exit: libFuzzer's runs end with exit()). */
static inline void fuzz_cleanup(void) {
    char p[1024];
    for (int i = 0; i < 8 && fuzz_names[i][0]; i++) {
        snprintf(p, sizeof p, "%s/%s", fuzz_dir_path, fuzz_names[i]);
        unlink(p);
    }
    rmdir(fuzz_dir_path);
}

/* A private directory for this process's files: /dev/shm (memory) when it exists. */
static inline const char *fuzz_dir(void) {
    char *dir = fuzz_dir_path;
    if (!dir[0]) {
        const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(dir, sizeof fuzz_dir_path, "%s/strata-fuzz-%d", base, (int)getpid());
        if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
            fprintf(stderr, "fuzz: cannot create %s: %s\n", dir, strerror(errno));
            abort();
        }
        atexit(fuzz_cleanup);
    }
    return dir;
}

/* Write d[0..n) to fuzz_dir()/name (replacing it) and return the path (static per name
 * slot: at most 4 names in use at once). */
static inline const char *fuzz_file(const char *name, const void *d, size_t n) {
    static char paths[4][512];
    static int next;
    char *p = paths[next++ & 3];
    snprintf(p, 512, "%s/%s", fuzz_dir(), name);
    for (int i = 0; i < 8; i++) {
        if (!strcmp(fuzz_names[i], name)) break;
        if (!fuzz_names[i][0]) {
            snprintf(fuzz_names[i], sizeof fuzz_names[i], "%s", name);
            break;
        }
    }
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        fprintf(stderr, "fuzz: cannot write %s: %s\n", p, strerror(errno));
        abort();
    }
    const uint8_t *b = d;
    while (n > 0) {
        ssize_t w = write(fd, b, n);
        if (w <= 0) {
            fprintf(stderr, "fuzz: short write to %s\n", p);
            abort();
        }
        b += w, n -= (size_t)w;
    }
    close(fd);
    return p;
}

/* A refusal must say what is wrong: a failing status with an empty message is a finding. */
static inline int fuzz_check_refusal(st_status s, const st_err *err, const char *what) {
    if (s != ST_OK && !err->msg[0]) {
        fprintf(stderr, "fuzz: %s failed (status %d) with no message\n", what, (int)s);
        return 1;
    }
    return 0;
}

#endif
