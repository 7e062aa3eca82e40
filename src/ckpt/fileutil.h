/* fileutil.h - crash-safe file writing: write to PATH.tmp, fsync, rename onto PATH,
 * fsync the directory. A crash at any instant leaves the old file or the new one. */
#ifndef STRATA_FILEUTIL_H
#define STRATA_FILEUTIL_H

#include <stdint.h>
#include <stdio.h>

#include "strata/core.h"

typedef struct st_file_writer {
    FILE *f;
    char path[4096], tmp[4200];
    uint32_t crc;  /* CRC-32C of everything put so far */
    size_t bytes;
} st_file_writer;

st_status st_file_writer_open(st_file_writer *w, const char *path, st_err *err);
st_status st_file_writer_put(st_file_writer *w, const void *data, size_t n, st_err *err);
/* If status is ST_OK, flush, fsync and rename into place; otherwise remove the temporary.
 * Returns the first failure. */
st_status st_file_writer_close(st_file_writer *w, st_status status, st_err *err);

/* fsync a directory so a rename inside it is durable. */
st_status st_fsync_dir(const char *dir, st_err *err);
/* mkdir -p */
st_status st_mkdirs(const char *path, st_err *err);

#endif
