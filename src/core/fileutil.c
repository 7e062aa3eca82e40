/* fileutil.c - crash-safe writes (temporary + fsync + rename) and directory helpers. */
#include "core/fileutil.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
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

/* A process's start time (clock ticks after boot, /proc/PID/stat's 22nd field): with the
 * pid it names one process, where a pid alone may have been reused; 0 where unknown. */
static unsigned long long proc_start(long pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    unsigned long long start = 0;
    /* after ")": state (3), then fields 4..21, then starttime (22) */
    if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
                     &start) != 1)
        return 0;
    return start;
}

/* The command line of a live process, spaces for its NULs, at most cap - 1 bytes. */
static void proc_cmdline(long pid, char *out, size_t cap) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%ld/cmdline", pid);
    out[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    size_t n = fread(out, 1, cap - 1, f);
    fclose(f);
    while (n > 0 && out[n - 1] == 0) n--;
    for (size_t i = 0; i < n; i++)
        if (out[i] == 0) out[i] = ' ';
    out[n] = 0;
}

/* The process holding a flock on the open file fd, from /proc/locks (the kernel's list: the
 * pid that took the lock, the file's device and inode): prefer where it is one of several
 * (readers share the lock); 0 where none can be seen (a network file system's lock held
 * elsewhere, a holder in another pid namespace). */
static long flock_holder(int fd, long prefer) {
    struct stat st;
    FILE *f = fstat(fd, &st) == 0 ? fopen("/proc/locks", "r") : NULL;
    if (!f) return 0;
    char line[256];
    long found = 0, by_inode = 0;
    while (fgets(line, sizeof line, f)) {
        char type[16];
        long pid;
        unsigned maj, min;
        unsigned long long ino;
        /* "1: FLOCK  ADVISORY  WRITE 1234 fe:00:10952789 0 EOF"; waiters ("1: -> FLOCK") skipped */
        if (strstr(line, "->") ||
            sscanf(line, "%*[^:]: %15s %*s %*s %ld %x:%x:%llu", type, &pid, &maj, &min, &ino) != 5 ||
            strcmp(type, "FLOCK") || ino != (unsigned long long)st.st_ino || pid <= 0)
            continue;
        if (maj == major(st.st_dev) && min == minor(st.st_dev)) {
            if (!found || pid == prefer) found = pid;
            if (pid == prefer) break;
        } else if (!by_inode || pid == prefer) {
            by_inode = pid; /* overlay file systems report the lower device */
        }
    }
    fclose(f);
    return found ? found : by_inode;
}

/* Why the lock at path (opened as fd) is refused: the live holder on this host, with what
 * the file's record says where that is stale, or else what the record says and how far it
 * can be trusted, and what to do. */
static void describe_holder(int fd, const char *path, const char *what, char *out, size_t cap) {
    char rec[256] = "", host[128] = "?", rhost[128] = "";
    ssize_t n = pread(fd, rec, sizeof rec - 1, 0);
    rec[n > 0 ? n : 0] = 0;
    rec[strcspn(rec, "\n")] = 0;
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    long rpid = 0, since = 0;
    unsigned long long rstart = 0;
    int fields = sscanf(rec, "pid %ld on %127s since %ld, start %llu", &rpid, rhost, &since, &rstart);
    if (fields >= 2) rhost[strcspn(rhost, ",")] = 0;
    long holder = 0;
    for (int tries = 0; tries < 20 && !holder; tries++) { /* a holder between its flock and its list entry */
        holder = flock_holder(fd, rpid);
        if (!holder) usleep(5000);
    }
    /* what the record's process is now */
    const char *rstate = NULL;
    char why[200] = "";
    if (fields < 2) {
        rstate = "unreadable";
        snprintf(why, sizeof why, "it records no holder ('%.60s')", rec);
    } else if (strcmp(rhost, host)) {
        rstate = "another host";
        snprintf(why, sizeof why, "it names pid %ld on %s, another host (this is %s)", rpid, rhost, host);
    } else if (kill((pid_t)rpid, 0) != 0 && errno == ESRCH) {
        rstate = "dead";
        snprintf(why, sizeof why, "it names pid %ld on this host, and no such process exists", rpid);
    } else if (fields == 4 && proc_start(rpid) && proc_start(rpid) != rstart) {
        rstate = "reused";
        snprintf(why, sizeof why, "it names pid %ld, a number now used by another process (started at %llu ticks "
                 "after boot, not %llu)", rpid, proc_start(rpid), rstart);
    }
    if (holder) {
        char cmd[96];
        proc_cmdline(holder, cmd, sizeof cmd);
        if (holder == rpid && !rstate) {
            snprintf(out, cap, "the %s is in use by another strata process (%s; lock file %s); wait for it to end "
                     "or stop it, or use another directory", what, rec, path);
        } else {
            if (!rstate) snprintf(why, sizeof why, "it names pid %ld, which holds another copy of the file (the "
                                  "directory was copied while that process ran)", rpid);
            snprintf(out, cap, "the %s is in use by another process (pid %ld on this host: %s; lock file %s); the lock "
                     "file's record is stale: %s (a copy, cp -a, carries the record); wait for pid %ld to end or stop "
                     "it, or use another directory", what, holder, cmd[0] ? cmd : "command line unknown", path, why,
                     holder);
        }
        return;
    }
    /* no holder this host can see: the lock is held elsewhere (a network file system) or by a
     * process in another pid namespace */
    if (rstate && !strcmp(rstate, "another host"))
        snprintf(out, cap, "the %s is in use by a process this host cannot see (lock file %s); its record says %s, "
                 "which this host cannot check: stop that process there, or use another directory", what, path, why);
    else
        snprintf(out, cap, "the %s is locked, but by no process this host can see (a lock held through a network "
                 "file system, or from another pid namespace; lock file %s)%s%s; find the holder (fuser -v %s), or "
                 "use another directory", what, path, rstate ? ", and its record is stale: " : "; its record: ",
                 rstate ? why : rec, path);
}

static st_status lock_acquire(st_lock *l, const char *path, const char *what, int shared, st_err *err) {
    l->fd = -1;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return st_errf(err, ST_ERR_IO, "%s: cannot open the %s's lock file: %s", path, what, strerror(errno));
    if (flock(fd, (shared ? LOCK_SH : LOCK_EX) | LOCK_NB) != 0) {
        int e = errno;
        if (e != EWOULDBLOCK) {
            close(fd);
            return st_errf(err, ST_ERR_IO, "%s: cannot lock the %s: %s", path, what, strerror(e));
        }
        char msg[768];
        describe_holder(fd, path, what, msg, sizeof msg);
        close(fd);
        return st_errf(err, ST_ERR_BUSY, "%s", msg);
    }
    char host[128] = "?", line[256];
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    /* the start time makes the record name one process: a pid may be reused */
    int n = snprintf(line, sizeof line, "pid %d on %s since %ld, start %llu%s\n", (int)getpid(), host,
                     (long)time(NULL), proc_start((long)getpid()), shared ? ", reading" : "");
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
