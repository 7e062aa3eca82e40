/* fileutil.c - crash-safe writes (temporary + fsync + rename) and directory helpers. */
#include "core/fileutil.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

st_status st_file_writer_open(st_file_writer *w, const char *path, st_err *err) {
    memset(w, 0, sizeof *w);
    if (strlen(path) >= sizeof w->path) return st_errf(err, ST_ERR_INVALID, "path too long: %s", path);
    snprintf(w->path, sizeof w->path, "%s", path);
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp.%d", path, (int)getpid());
    int fault = st_iofault("file.open", path);
    w->f = fault > 0 ? NULL : fopen(w->tmp, "wb");
    if (fault > 0) errno = fault;
    if (!w->f)
        return st_errf(err, errno == ENOSPC ? ST_ERR_NOSPACE : ST_ERR_IO, "%s: cannot create: %s", w->tmp,
                       strerror(errno));
    return ST_OK;
}

st_status st_file_writer_put(st_file_writer *w, const void *data, size_t n, st_err *err) {
    int fault = n ? st_iofault("file.write", w->path) : 0;
    if (fault) { /* a short write puts half the bytes down, then fails as a full disk does */
        if (fault == ST_IOFAULT_SHORT) fwrite(data, 1, n / 2, w->f);
        errno = fault > 0 ? fault : ENOSPC;
    }
    if (n && (fault || fwrite(data, 1, n, w->f) != n)) {
        int e = errno;
        return st_errf(err, e == ENOSPC ? ST_ERR_NOSPACE : ST_ERR_IO, "%s: write failed at offset %zu: %s%s", w->tmp,
                       w->bytes, strerror(e), e == ENOSPC ? "; free space on that disk (the previous file is intact)" : "");
    }
    w->crc = st_crc32c(w->crc, data, n);
    w->bytes += n;
    return ST_OK;
}

st_status st_fsync_dir(const char *dir, st_err *err) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return st_errf(err, ST_ERR_IO, "%s: cannot open directory: %s", dir, strerror(errno));
    int r = fsync(fd);
    close(fd);
    return r == 0 ? ST_OK : st_errf(err, ST_ERR_IO, "%s: fsync failed: %s", dir, strerror(errno));
}

st_status st_file_writer_close(st_file_writer *w, st_status status, st_err *err) {
    if (!w->f) return status;
    if (status == ST_OK) {
        int fault = st_iofault("file.fsync", w->path);
        if (fault > 0) errno = fault;
        if (fault > 0 || fflush(w->f) != 0 || fsync(fileno(w->f)) != 0) {
            int e = errno;
            status = st_errf(err, e == ENOSPC ? ST_ERR_NOSPACE : ST_ERR_IO, "%s: flush failed: %s", w->tmp, strerror(e));
        }
    }
    if (fclose(w->f) != 0 && status == ST_OK)
        status = st_errf(err, ST_ERR_IO, "%s: close failed: %s", w->tmp, strerror(errno));
    w->f = NULL;
    if (status != ST_OK) {
        unlink(w->tmp);
        return status;
    }
    if (w->keep_prev[0] && ((unlink(w->keep_prev) != 0 && errno != ENOENT) ||
                            (link(w->path, w->keep_prev) != 0 && errno != ENOENT))) {
        status = st_errf(err, ST_ERR_IO, "%s: cannot keep the file it replaces as %s: %s", w->path, w->keep_prev,
                         strerror(errno));
        unlink(w->tmp);
        return status;
    }
    int fault = st_iofault("file.rename", w->path);
    if (fault > 0) errno = fault;
    if (fault > 0 || rename(w->tmp, w->path) != 0) {
        status = st_errf(err, ST_ERR_IO, "%s: cannot rename into place: %s", w->path, strerror(errno));
        unlink(w->tmp);
        return status;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", w->path);
    return st_fsync_dir(dirname(dir), err);
}

st_status st_write_text(const char *path, const char *text, st_err *err) {
    st_file_writer w;
    st_status s = st_file_writer_open(&w, path, err);
    if (s) return s;
    s = st_file_writer_put(&w, text, strlen(text), err);
    if (!s) s = st_file_writer_put(&w, "\n", 1, err);
    return st_file_writer_close(&w, s, err);
}

st_status st_mkdirs(const char *path, st_err *err) {
    char buf[4096];
    if (strlen(path) >= sizeof buf) return st_errf(err, ST_ERR_INVALID, "path too long: %s", path);
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; ; p++) {
        if (*p == '/' || *p == 0) {
            char c = *p;
            *p = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return st_errf(err, ST_ERR_IO, "%s: cannot create directory: %s", buf, strerror(errno));
            *p = c;
            if (!c) break;
        }
    }
    return ST_OK;
}

static int rm_entry(const char *p, const struct stat *sb, int type, struct FTW *ftw) {
    (void)sb;
    (void)ftw;
    return (type == FTW_DP ? rmdir(p) : unlink(p)) != 0 && errno != ENOENT ? -1 : 0;
}

st_status st_rmtree(const char *path, st_err *err) {
    struct stat sb;
    if (lstat(path, &sb) != 0) {
        if (errno == ENOENT) return ST_OK;
        return st_errf(err, ST_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
    }
    if (!S_ISDIR(sb.st_mode)) {
        if (unlink(path) != 0 && errno != ENOENT)
            return st_errf(err, ST_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
        return ST_OK;
    }
    /* depth first, never crossing a symbolic link or into another file system */
    if (nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT) != 0)
        return st_errf(err, ST_ERR_IO, "%s: cannot remove everything below it: %s", path, strerror(errno));
    return ST_OK;
}

static st_status lock_acquire(st_lock *l, const char *path, const char *what, int shared, st_err *err) {
    l->fd = -1;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return st_errf(err, ST_ERR_IO, "%s: cannot open the %s's lock file: %s", path, what, strerror(errno));
    if (flock(fd, (shared ? LOCK_SH : LOCK_EX) | LOCK_NB) != 0) {
        int e = errno;
        char holder[256] = "";
        ssize_t n = pread(fd, holder, sizeof holder - 1, 0);
        close(fd);
        holder[n > 0 ? n : 0] = 0;
        holder[strcspn(holder, "\n")] = 0;
        if (e != EWOULDBLOCK)
            return st_errf(err, ST_ERR_IO, "%s: cannot lock the %s: %s", path, what, strerror(e));
        return st_errf(err, ST_ERR_BUSY,
                       "the %s is in use by another strata process (%s; lock file %s); wait for it to end or stop "
                       "it, or use another directory",
                       what, holder[0] ? holder : "holder unknown", path);
    }
    char host[128] = "?", line[256];
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    int n = snprintf(line, sizeof line, "pid %d on %s since %ld%s\n", (int)getpid(), host, (long)time(NULL),
                     shared ? ", reading" : "");
    /* the holder's description is information only; the flock is the lock */
    if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)n, 0) != n)
        st_log(1, "warning: %s: cannot record the lock's holder: %s\n", path, strerror(errno));
    l->fd = fd;
    return ST_OK;
}

st_status st_lock_acquire(st_lock *l, const char *path, const char *what, st_err *err) {
    return lock_acquire(l, path, what, 0, err);
}

st_status st_lock_acquire_shared(st_lock *l, const char *path, const char *what, st_err *err) {
    return lock_acquire(l, path, what, 1, err);
}

void st_lock_release(st_lock *l) {
    if (l && l->fd >= 0) {
        close(l->fd); /* closing the descriptor drops the flock */
        l->fd = -1;
    }
}
