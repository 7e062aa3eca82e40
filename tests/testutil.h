/* testutil.h - checks that count failures; a test's main returns test_finish(). */
#ifndef STRATA_TESTUTIL_H
#define STRATA_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "strata/core.h"

extern int test_failures;
extern int test_checks;

#define CHECK(cond, ...)                                                     \
    do {                                                                     \
        test_checks++;                                                       \
        if (!(cond)) {                                                       \
            test_failures++;                                                 \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);  \
            fprintf(stderr, __VA_ARGS__);                                    \
            fputc('\n', stderr);                                             \
        }                                                                    \
    } while (0)

/* Compare arrays: |a-b| <= atol + rtol*|b| element-wise; reports the worst element. */
int check_close_f32(const char *what, const float *a, const float *b, size_t n, double atol, double rtol);
int check_close_f64(const char *what, const double *a, const double *b, size_t n, double atol, double rtol);
/* Path under the source tree (STRATA_SOURCE_DIR), in a static buffer. */
const char *test_source_path(const char *rel);
/* A fresh empty temporary directory (mkdtemp); removed by test_finish unless the test failed. */
const char *test_tmpdir(void);
/* Fixture files (safetensors written by tools/gen_fixtures.py): a __metadata__ value as
 * an integer (-1 when absent), and a whole tensor as f32 (malloc'd; NULL and a message
 * when missing or of another size). */
struct st_safetensors;
int test_meta_int(struct st_safetensors *st, const char *key);
float *test_read_f32(struct st_safetensors *st, const char *name, size_t n);

/* Every parameter of a model's table (n tensors, n_params floats in all) from fixture fx
 * under its own (Hugging Face) name, into params on be. */
struct st_backend;
struct st_param_info;
struct st_err;
int test_load_params(struct st_safetensors *fx, const struct st_param_info *t, int n, size_t n_params,
                     struct st_backend *be, float *params, struct st_err *err);

/* A whole file (malloc'd, *n bytes; NULL if unreadable), and whether two files are equal
 * byte for byte (0 when either is unreadable). */
unsigned char *test_slurp(const char *path, size_t *n);
int test_same_file(const char *a, const char *b);

/* Print the summary line and return the exit code (0 pass, 1 fail). */
int test_finish(const char *name);
/* A permutation of 0..d-1 (malloc'd; exits on out of memory), Fisher-Yates from r's draws. */
int32_t *test_random_perm(st_rng *r, int d);

#endif
