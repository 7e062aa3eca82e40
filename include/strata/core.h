/* core.h - status codes, error messages, aligned allocation, clocks, logging.
 *
 * Every fallible call in libstrata returns an st_status and, on failure, fills the
 * caller's st_err with a message that names what was wrong (file, offset, key), and
 * what to do. The library never calls exit() or abort() on bad input.
 *
 * Example:
 *
 *     #include "strata/model.h"
 *
 *     st_err err = {0};
 *     st_backend *be = NULL;
 *     st_model *m = NULL;
 *     st_status s = st_backend_cpu_create(&be, 0, &err);
 *     if (s == ST_OK) s = st_model_create(&m, "gpt2-tiny", NULL, be, &err);
 *     if (s == ST_OK) s = m->ops->load(m, "run/model.safetensors", &err);
 *     if (s != ST_OK) // e.g. "run/model.safetensors: cannot open: No such file or directory"
 *         fprintf(stderr, "strata: %s: %s\n", st_status_name(s), err.msg);
 *     st_model_free(m); // NULL is fine
 *     st_backend_free(be);
 *     return s == ST_OK ? 0 : 1;
 *
 * End of example.
 */
#ifndef STRATA_CORE_H
#define STRATA_CORE_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Append-only: values are stable across versions. */
typedef enum st_status {
    ST_OK = 0,
    ST_ERR_INVALID = 1,   /* an argument or configuration value is wrong */
    ST_ERR_IO = 2,        /* a system call on a file failed (errno in the message) */
    ST_ERR_FORMAT = 3,    /* a file's contents are malformed: magic, version, header */
    ST_ERR_TRUNCATED = 4, /* a file ends before its header says it should */
    ST_ERR_SHAPE = 5,     /* a tensor's shape or size disagrees with the model */
    ST_ERR_NOMEM = 6,     /* an allocation or a memory budget failed */
    ST_ERR_CHECKSUM = 7,  /* stored data does not match its checksum */
    ST_ERR_UNSUPPORTED = 8, /* a feature this build or machine does not have */
    ST_ERR_NOSPACE = 9,   /* a disk path is full or short of the bytes a plan needs */
    ST_ERR_NONFINITE = 10, /* a NaN or Inf where a finite value is required */
    ST_ERR_BUSY = 11      /* another process holds the run directory or state store */
} st_status;

#define ST_ERR_MSG_MAX 1024

typedef struct st_err {
    st_status code;
    char msg[ST_ERR_MSG_MAX];
} st_err;

/* Fill err (if not NULL) with a formatted message and return code. */
st_status st_errf(st_err *err, st_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Prefix an existing message with context ("loading ckpt: <old message>"). */
st_status st_err_prefix(st_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *st_status_name(st_status s);

/* 64-byte aligned allocation (cache line, AVX-512 register); zeroed. NULL on failure. */
void *st_alloc(size_t bytes);
void st_free(void *p);
/* Zeroed memory whose pages are taken only as they are first written (an anonymous mapping;
 * st_alloc fills its pages at once): a vector that is written a piece at a time, and pieces of
 * which are given back (madvise) before the next is written, never holds all its pages. 64-byte
 * aligned (2 MiB and huge pages advised from 4 MiB, as st_alloc). NULL on failure. Given back
 * with st_free_untouched and the same bytes. */
void *st_alloc_untouched(size_t bytes);
void st_free_untouched(void *p, size_t bytes);

/* Monotonic seconds. */
double st_now(void);

/* Logging to stderr; level 0 = quiet, 1 = info (default), 2 = debug. */
void st_log_set_level(int level);
int st_log_level(void);
void st_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Numbers as a person writes them on a command line. st_parse_count: "100M", "2.5B", "64K",
 * "1G" (decimal multipliers K/M/B or G) into a count; st_parse_bytes: "512MiB", "2GiB", "1e9",
 * "64KB" (B, K/KB, M/MB, G/GB, T/TB decimal; KiB, MiB, GiB, TiB binary) into bytes. Each
 * returns -1 for anything else (a negative number, an unknown suffix, trailing text). */
double st_parse_count(const char *s);
double st_parse_bytes(const char *s);

/* Write s[0..n) to f as one JSON string: quotes and backslashes escaped, control bytes and
 * bytes >= 127 as \u00XX (a byte as a code point: valid JSON whatever the bytes are). */
void st_fput_json_string(FILE *f, const char *s, size_t n);

/* CRC-32C (Castagnoli) of a byte range, continuing from crc (start with 0). */
uint32_t st_crc32c(uint32_t crc, const void *data, size_t n);
/* Tests: on = use the byte table even where SSE4.2 is present (off = detect again). */
void st_crc32c_force_table(int on);

/* Crash injection for tests: when the environment variable STRATA_FAILPOINT is NAME or
 * NAME:N, the N-th call (default the first) with that name kills the process with
 * SIGKILL, a crash at a chosen instant. Otherwise it does nothing. */
void st_failpoint(const char *name);

/* I/O fault injection for tests: when STRATA_IOFAULT is "OP:KIND[:N][@TEXT]", the N-th
 * call (default the first) of st_iofault(OP, path) whose path contains TEXT (any path when
 * absent) returns the fault, and every other call returns 0. KIND is eio, enospc (the
 * errno to fail with) or short (ST_IOFAULT_SHORT: transfer half, then fail). Every write,
 * fsync, rename and read of a file whose loss would lose state calls it just before the
 * system call, with one of these OPs (tests/test_io_faults.sh enumerates them):
 *   file.open, file.write, file.fsync, file.rename   files written whole (crash-safe writer,
 *                                                    data pack) and appended (metrics, trace,
 *                                                    TensorBoard events)
 *   file.read                                        the state store's manifest
 *   io.write, io.read, io.sync                       the io engine (the state store's files) */
#define ST_IOFAULT_SHORT (-1)
int st_iofault(const char *op, const char *path);

/* Deterministic random numbers (xorshift64*), state is one integer so it checkpoints. */
typedef struct st_rng { uint64_t s; } st_rng;
void st_rng_seed(st_rng *r, uint64_t seed);
uint64_t st_rng_u64(st_rng *r);
float st_rng_uniform(st_rng *r);           /* [0, 1) */
float st_rng_normal(st_rng *r);            /* N(0, 1), Box-Muller */
/* Advance r by k draws of st_rng_u64 (st_rng_normal takes 2) without making them: a
 * generator can be split into pieces that give, in parallel, the one sequence's values. */
void st_rng_skip(st_rng *r, uint64_t k);

#ifdef __cplusplus
}
#endif
#endif
