/* core/fileutil.h - crash-safe file writing: write to PATH.tmp, fsync, rename onto PATH,
 * fsync the directory. A crash at any instant leaves the old file or the new one.
 * Also mkdir -p, fsync of a directory, rmtree without a shell, and the one-process lock.
 * Internal to libstrata (ckpt, model, tier and exec write files through it); not public API. */
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
    char keep_prev[4416]; /* set after open: the file being replaced stays under this name (a
                             hard link made just before the rename; "" : not kept) */
} st_file_writer;

st_status st_file_writer_open(st_file_writer *w, const char *path, st_err *err);
st_status st_file_writer_put(st_file_writer *w, const void *data, size_t n, st_err *err);
/* If status is ST_OK, flush, fsync and rename into place; otherwise remove the temporary.
 * Returns the first failure. */
st_status st_file_writer_close(st_file_writer *w, st_status status, st_err *err);

/* PATH holds exactly text and a newline, written as above (temporary, fsync, rename). */
st_status st_write_text(const char *path, const char *text, st_err *err);

/* fsync a directory so a rename inside it is durable. */
st_status st_fsync_dir(const char *dir, st_err *err);
/* mkdir -p */
st_status st_mkdirs(const char *path, st_err *err);

/* Remove PATH and everything below it, without a shell and without following symbolic
 * links (a link is removed, never its target). A PATH that does not exist is not an
 * error. The first failure names the entry that could not be removed. */
st_status st_rmtree(const char *path, st_err *err);

/* An exclusive advisory lock (flock) on the file PATH, created if absent, held until
 * st_lock_release or the process ends (also by a crash or SIGKILL: the kernel drops it,
 * so a stale lock never blocks a resume). The file records the holder (pid, host, time,
 * and the process's start time, which with the pid names one process); a second process is
 * refused with ST_ERR_BUSY and WHAT (for the message: "run directory", "state store"),
 * naming the live holder on this host (the kernel's /proc/locks) and, where the record names
 * another (a copy made with cp -a carries it), that the record is stale and how that is known
 * (no such pid, the pid reused with another start time, another host); where no holder can
 * be seen here (a network file system, another pid namespace), what the record says. */
typedef struct st_lock {
    int fd;
} st_lock;
st_status st_lock_acquire(st_lock *l, const char *path, const char *what, st_err *err);
/* The same lock shared (flock LOCK_SH): any number of readers hold it together; it is
 * refused while a process holds it exclusively, and an exclusive one is refused while it
 * is held. Released by st_lock_release. */
st_status st_lock_acquire_shared(st_lock *l, const char *path, const char *what, st_err *err);
void st_lock_release(st_lock *l);

#endif
