/* io_engine.c - the disk tier's io engine: one preallocated file per path, requests
 * split into 1-4 MiB pieces, io_uring with a ring per path or a pread/pwrite thread
 * pool, chosen once at start-up and said in the log.
 *
 * io_uring: the submitting thread owns a ring's submission side (under the path's
 * mutex) and one reaper thread per path owns its completion side, so a caller never
 * waits for a completion it did not ask for, and the queue stays depth-deep while the
 * caller computes. Thread pool: `depth` workers per path pull pieces from a FIFO, so
 * the same number of pieces are in flight as with io_uring. Completion of the last
 * piece of a ticket wakes its waiter; the first error of any piece is the ticket's. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#ifdef STRATA_HAVE_URING
#include <liburing.h>
#endif

#include "strata/io.h"

#define IO_MAX_BUFS 64

typedef struct io_slot {
    uint64_t id;     /* the ticket this slot serves; 0 when free */
    int pending;     /* pieces not yet complete */
    st_err err;      /* first error of any piece */
} io_slot;

typedef struct io_piece {
    struct io_piece *next;
    struct io_path *p;
    io_slot *slot;
    int write;
    uint64_t off;
    void *buf;
    size_t len;
} io_piece;

typedef struct io_path {
    st_io_engine *e;
    char *file;
    int fd, direct;
    uint64_t size;            /* the file's usable bytes */
    pthread_mutex_t mu;
    pthread_cond_t cv;        /* uring: a slot in the ring freed; threads: work queued */
    io_piece *head, *tail;    /* thread pool queue */
    int inflight, stop;
    double busy_t0;
    st_io_path_stats stats;
    pthread_t *threads;       /* reaper (uring) or workers (thread pool) */
    int n_threads;
#ifdef STRATA_HAVE_URING
    struct io_uring ring;
    int ring_ok, fixed_file, fixed_bufs;
#endif
} io_path;

struct st_io_engine {
    st_io_kind kind;
    size_t request_bytes;
    int depth, n_paths, keep_files, existing;
    uint64_t file_bytes;
    io_path *paths;
    pthread_mutex_t mu;       /* slots and tickets */
    pthread_cond_t cv_done;
    io_slot **slots;
    int n_slots;
    uint64_t next_ticket;
    pthread_mutex_t bufmu;    /* registered buffer table */
    struct { char *base; size_t len; } bufs[IO_MAX_BUFS];
    int n_bufs;
};

const char *st_io_kind_name(st_io_kind k) {
    return k == ST_IO_URING ? "io_uring" : k == ST_IO_THREADS ? "threads" : "auto";
}
st_io_kind st_io_engine_kind(const st_io_engine *e) { return e->kind; }
int st_io_engine_direct(const st_io_engine *e, int path) {
    return path >= 0 && path < e->n_paths ? e->paths[path].direct : 0;
}
size_t st_io_engine_request_bytes(const st_io_engine *e) { return e->request_bytes; }
int st_io_engine_depth(const st_io_engine *e) { return e->depth; }
uint64_t st_io_engine_file_bytes(const st_io_engine *e) { return e->file_bytes; }
uint64_t st_io_engine_path_bytes(const st_io_engine *e, int path) {
    return path >= 0 && path < e->n_paths ? e->paths[path].size : 0;
}

st_status st_io_sync(st_io_engine *e, int path, st_err *err) {
    if (path < 0 || path >= e->n_paths) return st_errf(err, ST_ERR_INVALID, "io: no path %d", path);
    int fault = st_iofault("io.sync", e->paths[path].file);
    if (fault > 0) errno = fault;
    if (fault > 0 || fdatasync(e->paths[path].fd) != 0)
        return st_errf(err, errno == ENOSPC ? ST_ERR_NOSPACE : ST_ERR_IO, "%s: fdatasync: %s", e->paths[path].file,
                       strerror(errno));
    return ST_OK;
}
const char *st_io_engine_file(const st_io_engine *e, int path) {
    return path >= 0 && path < e->n_paths ? e->paths[path].file : NULL;
}

void *st_io_alloc(size_t bytes) {
    void *p = NULL;
    size_t n = (bytes + ST_IO_ALIGN - 1) / ST_IO_ALIGN * ST_IO_ALIGN;
    if (posix_memalign(&p, ST_IO_ALIGN, n ? n : ST_IO_ALIGN)) return NULL;
    memset(p, 0, n);
    return p;
}
void st_io_free(void *p) { free(p); }

/* ------------------------------------------------------------------ completion */

/* Path mutex held: the busy clock runs while anything is in flight. */
static void path_busy_inc(io_path *p) {
    if (p->inflight++ == 0) p->busy_t0 = st_now();
}
static void path_busy_dec(io_path *p) {
    if (--p->inflight == 0) p->stats.busy_s += st_now() - p->busy_t0;
}

/* res: bytes transferred or -errno. Called without the path mutex held. */
static void piece_complete(io_piece *pc, long long res) {
    io_path *p = pc->p;
    st_io_engine *e = p->e;
    st_err perr = {0};
    /* injected faults (tests) stand in for what the device reported */
    int fault = st_iofault(pc->write ? "io.write" : "io.read", p->file);
    if (fault) res = fault > 0 ? -(long long)fault : (long long)(pc->len / 2);
    if (res < 0) {
        int en = (int)-res;
        st_errf(&perr, en == ENOSPC ? ST_ERR_NOSPACE : ST_ERR_IO, "%s: %s of %zu bytes at offset %llu failed: %s",
                p->file, pc->write ? "write" : "read", pc->len, (unsigned long long)pc->off, strerror(en));
    } else if ((size_t)res < pc->len) {
        st_errf(&perr, pc->write ? ST_ERR_IO : ST_ERR_TRUNCATED, "%s: short %s at offset %llu: %lld of %zu bytes",
                p->file, pc->write ? "write" : "read", (unsigned long long)pc->off, res, pc->len);
    }
    pthread_mutex_lock(&p->mu);
    if (perr.code == ST_OK) {
        if (pc->write) p->stats.write_bytes += pc->len;
        else p->stats.read_bytes += pc->len;
    }
    p->stats.requests++;
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_lock(&e->mu);
    if (perr.code != ST_OK && pc->slot->err.code == ST_OK) pc->slot->err = perr;
    if (--pc->slot->pending == 0) pthread_cond_broadcast(&e->cv_done);
    pthread_mutex_unlock(&e->mu);
    free(pc);
}

/* ------------------------------------------------------------------ thread pool */

static void *pool_worker(void *arg) {
    io_path *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->head && !p->stop) pthread_cond_wait(&p->cv, &p->mu);
        if (!p->head) break;
        io_piece *pc = p->head;
        p->head = pc->next;
        if (!p->head) p->tail = NULL;
        path_busy_inc(p);
        pthread_mutex_unlock(&p->mu);
        /* pread/pwrite may transfer less than asked (signals, the end of the file):
         * continue until done, an error, or zero bytes (a real short transfer). */
        size_t done = 0;
        long long res = 0;
        while (done < pc->len) {
            ssize_t n = pc->write ? pwrite(p->fd, (char *)pc->buf + done, pc->len - done, (off_t)(pc->off + done))
                                  : pread(p->fd, (char *)pc->buf + done, pc->len - done, (off_t)(pc->off + done));
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) { res = -errno; break; }
            if (n == 0) break;
            done += (size_t)n;
        }
        if (res == 0) res = (long long)done;
        piece_complete(pc, res);
        pthread_mutex_lock(&p->mu);
        path_busy_dec(p);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* ------------------------------------------------------------------ io_uring */

#ifdef STRATA_HAVE_URING
static void *uring_reaper(void *arg) {
    io_path *p = arg;
    for (;;) {
        struct io_uring_cqe *cqe;
        int rc = io_uring_wait_cqe(&p->ring, &cqe);
        if (rc == -EINTR || rc == -EAGAIN) continue;
        if (rc < 0) break; /* the ring is broken; destroy still joins us */
        io_piece *pc = io_uring_cqe_get_data(cqe);
        long long res = cqe->res;
        io_uring_cqe_seen(&p->ring, cqe);
        if (!pc) break; /* the shutdown NOP */
        piece_complete(pc, res);
        pthread_mutex_lock(&p->mu);
        path_busy_dec(p);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    return NULL;
}

/* Path mutex held; inflight < depth so the ring has a free entry. */
static int uring_prep(io_path *p, io_piece *pc) {
    st_io_engine *e = p->e;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&p->ring);
    if (!sqe) return -EBUSY;
    int fd = p->fixed_file ? 0 : p->fd;
    int bi = -1;
    if (p->fixed_bufs) {
        pthread_mutex_lock(&e->bufmu);
        for (int i = 0; i < e->n_bufs; i++)
            if ((char *)pc->buf >= e->bufs[i].base && (char *)pc->buf + pc->len <= e->bufs[i].base + e->bufs[i].len) {
                bi = i;
                break;
            }
        pthread_mutex_unlock(&e->bufmu);
    }
    if (bi >= 0) {
        if (pc->write) io_uring_prep_write_fixed(sqe, fd, pc->buf, (unsigned)pc->len, pc->off, bi);
        else io_uring_prep_read_fixed(sqe, fd, pc->buf, (unsigned)pc->len, pc->off, bi);
    } else {
        if (pc->write) io_uring_prep_write(sqe, fd, pc->buf, (unsigned)pc->len, pc->off);
        else io_uring_prep_read(sqe, fd, pc->buf, (unsigned)pc->len, pc->off);
    }
    if (p->fixed_file) sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data(sqe, pc);
    return 0;
}

static int uring_start(io_path *p, int depth, st_err *err) {
    int rc = io_uring_queue_init((unsigned)depth, &p->ring, 0);
    if (rc < 0) return st_errf(err, ST_ERR_UNSUPPORTED, "io_uring_queue_init: %s", strerror(-rc));
    p->ring_ok = 1;
    /* Fixed file and buffers save a file-table lookup and a page pin per request;
     * without them (old kernels, locked-memory limits) plain requests still work. */
    p->fixed_file = io_uring_register_files(&p->ring, &p->fd, 1) == 0;
    p->fixed_bufs = io_uring_register_buffers_sparse(&p->ring, IO_MAX_BUFS) == 0;
    return ST_OK;
}
#endif

st_status st_io_register_buffer(st_io_engine *e, void *buf, size_t bytes, st_err *err) {
    if (!buf || !bytes || (uintptr_t)buf % ST_IO_ALIGN)
        return st_errf(err, ST_ERR_INVALID, "io register: the buffer must be non-empty and 4096-aligned (st_io_alloc)");
    pthread_mutex_lock(&e->bufmu);
    if (e->n_bufs == IO_MAX_BUFS) {
        pthread_mutex_unlock(&e->bufmu);
        return st_errf(err, ST_ERR_INVALID, "io register: at most %d buffers; register one larger buffer", IO_MAX_BUFS);
    }
    int slot = e->n_bufs;
#ifdef STRATA_HAVE_URING
    if (e->kind == ST_IO_URING) {
        struct iovec iov = {.iov_base = buf, .iov_len = bytes};
        for (int i = 0; i < e->n_paths; i++) {
            io_path *p = &e->paths[i];
            if (p->fixed_bufs && io_uring_register_buffers_update_tag(&p->ring, (unsigned)slot, &iov, NULL, 1) != 1) {
                /* Fall back to plain requests on this ring rather than fail the caller. */
                st_log(1, "io: %s: registering a %zu-byte buffer failed; plain requests\n", p->file, bytes);
                p->fixed_bufs = 0;
            }
        }
    }
#endif
    e->bufs[slot].base = buf;
    e->bufs[slot].len = bytes;
    e->n_bufs++;
    pthread_mutex_unlock(&e->bufmu);
    return ST_OK;
}

/* ------------------------------------------------------------------ submit / wait */

static st_status submit(st_io_engine *e, int path, int write, uint64_t off, void *buf, size_t bytes,
                        uint64_t *ticket, st_err *err) {
    const char *what = write ? "write" : "read";
    if (path < 0 || path >= e->n_paths)
        return st_errf(err, ST_ERR_INVALID, "io %s: path index %d out of range (%d paths)", what, path, e->n_paths);
    io_path *p = &e->paths[path];
    if (!buf || bytes == 0 || off % ST_IO_ALIGN || bytes % ST_IO_ALIGN || (uintptr_t)buf % ST_IO_ALIGN)
        return st_errf(err, ST_ERR_INVALID,
                       "%s: %s of %zu bytes at offset %llu: offset, size and buffer must be non-zero multiples of 4096",
                       p->file, what, bytes, (unsigned long long)off);
    if (off > p->size || bytes > p->size - off)
        return st_errf(err, ST_ERR_INVALID, "%s: %s of %zu bytes at offset %llu is past the end of the file (%llu bytes)",
                       p->file, what, bytes, (unsigned long long)off, (unsigned long long)p->size);
    size_t npieces = (bytes + e->request_bytes - 1) / e->request_bytes;

    pthread_mutex_lock(&e->mu);
    io_slot *slot = NULL;
    for (int i = 0; i < e->n_slots && !slot; i++)
        if (!e->slots[i]->id) slot = e->slots[i];
    if (!slot) {
        io_slot **ns = realloc(e->slots, sizeof *ns * (size_t)(e->n_slots + 1));
        io_slot *s = calloc(1, sizeof *s);
        if (!ns || !s) {
            if (ns) e->slots = ns;
            free(s);
            pthread_mutex_unlock(&e->mu);
            return st_errf(err, ST_ERR_NOMEM, "io %s: out of memory for a ticket", what);
        }
        e->slots = ns;
        e->slots[e->n_slots++] = slot = s;
    }
    slot->id = ++e->next_ticket;
    slot->pending = (int)npieces;
    memset(&slot->err, 0, sizeof slot->err);
    *ticket = slot->id;
    pthread_mutex_unlock(&e->mu);

    for (size_t k = 0; k < npieces; k++) {
        size_t o = k * e->request_bytes;
        io_piece *pc = calloc(1, sizeof *pc);
        if (!pc) {
            /* Account the missing pieces as failed so the ticket still completes. */
            pthread_mutex_lock(&e->mu);
            if (slot->err.code == ST_OK)
                st_errf(&slot->err, ST_ERR_NOMEM, "%s: out of memory queueing a %s", p->file, what);
            slot->pending -= (int)(npieces - k);
            if (slot->pending == 0) pthread_cond_broadcast(&e->cv_done);
            pthread_mutex_unlock(&e->mu);
            break;
        }
        pc->p = p;
        pc->slot = slot;
        pc->write = write;
        pc->off = off + o;
        pc->buf = (char *)buf + o;
        pc->len = bytes - o < e->request_bytes ? bytes - o : e->request_bytes;
        pthread_mutex_lock(&p->mu);
#ifdef STRATA_HAVE_URING
        if (e->kind == ST_IO_URING) {
            while (p->inflight >= e->depth) pthread_cond_wait(&p->cv, &p->mu);
            int rc = uring_prep(p, pc);
            if (rc == 0) {
                path_busy_inc(p);
                /* A transient refusal leaves the entry in the ring: submit again. */
                do rc = io_uring_submit(&p->ring);
                while (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY);
                if (rc >= 0) rc = 0;
                else path_busy_dec(p);
            }
            pthread_mutex_unlock(&p->mu);
            if (rc < 0) piece_complete(pc, rc);
            continue;
        }
#endif
        pc->next = NULL;
        if (p->tail) p->tail->next = pc;
        else p->head = pc;
        p->tail = pc;
        pthread_cond_signal(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    return ST_OK;
}

st_status st_io_read(st_io_engine *e, int path, uint64_t offset, void *buf, size_t bytes, uint64_t *ticket,
                     st_err *err) {
    return submit(e, path, 0, offset, buf, bytes, ticket, err);
}
st_status st_io_write(st_io_engine *e, int path, uint64_t offset, const void *buf, size_t bytes, uint64_t *ticket,
                      st_err *err) {
    /* The buffer is only read from; the cast serves the shared piece type. */
    return submit(e, path, 1, offset, (void *)buf, bytes, ticket, err);
}

st_status st_io_wait(st_io_engine *e, uint64_t ticket, st_err *err) {
    pthread_mutex_lock(&e->mu);
    io_slot *slot = NULL;
    for (int i = 0; i < e->n_slots && !slot; i++)
        if (e->slots[i]->id == ticket) slot = e->slots[i];
    if (!slot || !ticket) {
        pthread_mutex_unlock(&e->mu);
        return st_errf(err, ST_ERR_INVALID, "io wait: ticket %llu is unknown or was already waited",
                       (unsigned long long)ticket);
    }
    while (slot->pending > 0) pthread_cond_wait(&e->cv_done, &e->mu);
    st_err se = slot->err;
    slot->id = 0;
    pthread_mutex_unlock(&e->mu);
    if (se.code != ST_OK) {
        if (err) *err = se;
        return se.code;
    }
    return ST_OK;
}

void st_io_get_stats(st_io_engine *e, int path, st_io_path_stats *s) {
    memset(s, 0, sizeof *s);
    if (path < 0 || path >= e->n_paths) return;
    io_path *p = &e->paths[path];
    pthread_mutex_lock(&p->mu);
    *s = p->stats;
    if (p->inflight > 0) s->busy_s += st_now() - p->busy_t0;
    pthread_mutex_unlock(&p->mu);
}

/* ------------------------------------------------------------------ create / destroy */

/* Open (creating) the path's file, O_DIRECT when the filesystem takes it, and
 * preallocate file_bytes so a full disk is found now, not in the middle of a step. */
static st_status path_open(io_path *p, uint64_t bytes, int existing, st_err *err) {
    int cr = existing ? 0 : O_CREAT;
    p->fd = open(p->file, O_RDWR | cr | O_DIRECT | O_CLOEXEC, 0644);
    p->direct = 1;
    if (p->fd < 0 && errno == EINVAL) {
        p->fd = open(p->file, O_RDWR | cr | O_CLOEXEC, 0644);
        p->direct = 0;
        st_log(1, "io: %s: the filesystem does not take O_DIRECT; buffered I/O (page cache in the timings)\n", p->file);
    }
    if (p->fd < 0 && existing)
        return st_errf(err, ST_ERR_IO, "%s: cannot open the state file: %s (was the store moved or removed?)", p->file,
                       strerror(errno));
    if (p->fd < 0)
        return st_errf(err, ST_ERR_IO, "%s: cannot create the io file: %s (does the directory exist and is it writable?)",
                       p->file, strerror(errno));
    if (existing) {
        struct stat st;
        if (fstat(p->fd, &st) != 0 || (uint64_t)st.st_size < bytes) {
            unsigned long long have = fstat(p->fd, &st) == 0 ? (unsigned long long)st.st_size : 0;
            close(p->fd);
            p->fd = -1;
            return st_errf(err, ST_ERR_TRUNCATED, "%s: the state file has %llu bytes, the store needs %llu: it was "
                           "truncated; restore it from a copy or start a new store", p->file, have,
                           (unsigned long long)bytes);
        }
        p->size = bytes;
        return ST_OK;
    }
    p->size = bytes;
    int rc = fallocate(p->fd, 0, 0, (off_t)bytes);
    if (rc != 0 && (errno == EOPNOTSUPP || errno == ENOSYS)) {
        /* No fallocate (some network filesystems): size the file; space is not reserved. */
        st_log(1, "io: %s: fallocate unsupported; the file is sized but space is not reserved\n", p->file);
        rc = ftruncate(p->fd, (off_t)bytes);
    }
    if (rc != 0) {
        int en = errno;
        if (en == ENOSPC || en == EDQUOT) {
            struct statvfs vs;
            struct stat st;
            unsigned long long avail = 0, have = 0;
            if (fstatvfs(p->fd, &vs) == 0) avail = (unsigned long long)vs.f_bavail * vs.f_frsize;
            if (fstat(p->fd, &st) == 0) have = (unsigned long long)st.st_blocks * 512ull;
            unsigned long long missing = bytes > avail + have ? bytes - avail - have : 0;
            close(p->fd);
            p->fd = -1;
            unlink(p->file);
            return st_errf(err, ST_ERR_NOSPACE,
                           "%s: the disk path needs %llu bytes but has %llu free: %llu bytes missing; "
                           "free space, add a path, or give a smaller size",
                           p->file, (unsigned long long)bytes, avail + have, missing);
        }
        return st_errf(err, ST_ERR_IO, "%s: preallocating %llu bytes: %s", p->file, (unsigned long long)bytes,
                       strerror(en));
    }
    return ST_OK;
}

static void path_stop_threads(io_path *p) {
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int t = 0; t < p->n_threads; t++) pthread_join(p->threads[t], NULL);
    p->n_threads = 0;
}

void st_io_engine_destroy(st_io_engine *e) {
    if (!e) return;
    for (int i = 0; i < e->n_paths; i++) {
        io_path *p = &e->paths[i];
#ifdef STRATA_HAVE_URING
        if (p->ring_ok) {
            if (p->n_threads) {
                /* Drain, then wake the reaper with a NOP carrying no piece. */
                pthread_mutex_lock(&p->mu);
                while (p->inflight > 0) pthread_cond_wait(&p->cv, &p->mu);
                struct io_uring_sqe *sqe = io_uring_get_sqe(&p->ring);
                if (sqe) {
                    io_uring_prep_nop(sqe);
                    io_uring_sqe_set_data(sqe, NULL);
                    io_uring_submit(&p->ring);
                }
                pthread_mutex_unlock(&p->mu);
                for (int t = 0; t < p->n_threads; t++) pthread_join(p->threads[t], NULL);
                p->n_threads = 0;
            }
            io_uring_queue_exit(&p->ring);
            p->ring_ok = 0;
        }
#endif
        if (p->n_threads) path_stop_threads(p); /* workers drain the queue before they stop */
        free(p->threads);
        if (p->fd >= 0) close(p->fd);
        if (p->file && !e->keep_files && !e->existing && p->fd >= 0) unlink(p->file);
        free(p->file);
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cv);
    }
    for (int i = 0; i < e->n_slots; i++) free(e->slots[i]);
    free(e->slots);
    free(e->paths);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv_done);
    pthread_mutex_destroy(&e->bufmu);
    free(e);
}

st_status st_io_engine_create(st_io_engine **out, const st_io_config *cfg, st_err *err) {
    *out = NULL;
    if (!cfg || !cfg->paths || cfg->n_paths < 1)
        return st_errf(err, ST_ERR_INVALID, "io engine: give at least one path");
    if (cfg->file_bytes == 0 && !cfg->path_file_bytes) return st_errf(err, ST_ERR_INVALID, "io engine: file_bytes must be positive");
    size_t req = cfg->request_bytes ? cfg->request_bytes : ST_IO_MIN_REQUEST;
    if (req < ST_IO_MIN_REQUEST || req > ST_IO_MAX_REQUEST || req % ST_IO_ALIGN)
        return st_errf(err, ST_ERR_INVALID, "io engine: request size %zu bytes: use 1-4 MiB, a multiple of 4096", req);
    int depth = cfg->depth ? cfg->depth : ST_IO_MIN_DEPTH;
    if (depth < ST_IO_MIN_DEPTH || depth > 4096)
        return st_errf(err, ST_ERR_INVALID, "io engine: queue depth %d: use %d to 4096", depth, ST_IO_MIN_DEPTH);
    st_io_kind kind = cfg->kind;
    const char *env = getenv("STRATA_IO");
    if (env && *env) {
        if (!strcmp(env, "threads")) kind = ST_IO_THREADS;
        else if (!strcmp(env, "uring") || !strcmp(env, "io_uring")) kind = ST_IO_URING;
        else if (strcmp(env, "auto"))
            return st_errf(err, ST_ERR_INVALID, "STRATA_IO=%s: use threads, uring or auto", env);
    }

    st_io_engine *e = calloc(1, sizeof *e);
    if (!e) return st_errf(err, ST_ERR_NOMEM, "io engine: out of memory");
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv_done, NULL);
    pthread_mutex_init(&e->bufmu, NULL);
    e->request_bytes = req;
    e->depth = depth;
    e->keep_files = cfg->keep_files;
    e->existing = cfg->open_existing;
    e->file_bytes = (cfg->file_bytes + ST_IO_ALIGN - 1) / ST_IO_ALIGN * ST_IO_ALIGN;
    e->paths = calloc((size_t)cfg->n_paths, sizeof *e->paths);
    if (!e->paths) {
        st_io_engine_destroy(e);
        return st_errf(err, ST_ERR_NOMEM, "io engine: out of memory");
    }
    e->n_paths = cfg->n_paths;
    const char *name = cfg->file_name ? cfg->file_name : "strata-io.bin";
    for (int i = 0; i < e->n_paths; i++) {
        io_path *p = &e->paths[i];
        p->e = e;
        p->fd = -1;
        pthread_mutex_init(&p->mu, NULL);
        pthread_cond_init(&p->cv, NULL);
    }
    st_status s = ST_OK;
    for (int i = 0; i < e->n_paths && s == ST_OK; i++) {
        io_path *p = &e->paths[i];
        size_t n = strlen(cfg->paths[i]) + strlen(name) + 2;
        p->file = malloc(n);
        if (!p->file) s = st_errf(err, ST_ERR_NOMEM, "io engine: out of memory");
        else {
            snprintf(p->file, n, "%s/%s", cfg->paths[i], name);
            uint64_t fb = cfg->path_file_bytes && cfg->path_file_bytes[i] ? cfg->path_file_bytes[i] : cfg->file_bytes;
            fb = (fb + ST_IO_ALIGN - 1) / ST_IO_ALIGN * ST_IO_ALIGN;
            if (fb == 0)
                s = st_errf(err, ST_ERR_INVALID, "io engine: path %d (%s) has no file size: give file_bytes or its "
                            "path_file_bytes entry", i, cfg->paths[i]);
            else
                s = path_open(p, fb, cfg->open_existing, err);
            if (fb > e->file_bytes) e->file_bytes = fb; /* the largest, where sizes differ */
        }
    }
    if (s != ST_OK) {
        st_io_engine_destroy(e);
        return s;
    }

    /* The engine is chosen once, for every path: mixed engines would make the probe's
     * figures and the log describe something no single path does. */
    const char *why = NULL;
    char whybuf[ST_ERR_MSG_MAX];
#ifdef STRATA_HAVE_URING
    if (kind != ST_IO_THREADS) {
        st_err uerr = {0};
        for (int i = 0; i < e->n_paths && !why; i++)
            if (uring_start(&e->paths[i], depth, &uerr) != ST_OK) {
                snprintf(whybuf, sizeof whybuf, "%s", uerr.msg);
                why = whybuf;
            }
        if (!why) e->kind = ST_IO_URING;
        else {
            for (int i = 0; i < e->n_paths; i++)
                if (e->paths[i].ring_ok) {
                    io_uring_queue_exit(&e->paths[i].ring);
                    e->paths[i].ring_ok = 0;
                }
            if (kind == ST_IO_URING) {
                st_io_engine_destroy(e);
                return st_errf(err, ST_ERR_UNSUPPORTED, "io engine: io_uring requested (STRATA_IO) but unavailable: %s", why);
            }
        }
    } else {
        why = "STRATA_IO=threads or asked for";
    }
#else
    if (kind == ST_IO_URING) {
        st_io_engine_destroy(e);
        return st_errf(err, ST_ERR_UNSUPPORTED, "io engine: io_uring requested but this build has no liburing");
    }
    why = "built without liburing";
    (void)whybuf;
#endif
    if (e->kind != ST_IO_URING) e->kind = ST_IO_THREADS;

    int per_path = e->kind == ST_IO_URING ? 1 : depth;
    for (int i = 0; i < e->n_paths && s == ST_OK; i++) {
        io_path *p = &e->paths[i];
        p->threads = calloc((size_t)per_path, sizeof *p->threads);
        if (!p->threads) {
            s = st_errf(err, ST_ERR_NOMEM, "io engine: out of memory");
            break;
        }
        for (int t = 0; t < per_path; t++) {
            void *(*fn)(void *) = pool_worker;
#ifdef STRATA_HAVE_URING
            if (e->kind == ST_IO_URING) fn = uring_reaper;
#endif
            if (pthread_create(&p->threads[t], NULL, fn, p) != 0) {
                s = st_errf(err, ST_ERR_NOMEM, "io engine: cannot start an io thread for %s", p->file);
                break;
            }
            p->n_threads++;
        }
    }
    if (s != ST_OK) {
        st_io_engine_destroy(e);
        return s;
    }
    if (e->kind == ST_IO_URING)
        st_log(1, "io engine: io_uring, %d path(s), depth %d, %zu KiB requests, fixed buffers %s\n", e->n_paths, depth,
               req >> 10,
#ifdef STRATA_HAVE_URING
               e->paths[0].fixed_bufs ? "yes" : "no"
#else
               "no"
#endif
        );
    else
        st_log(1, "io engine: threads (%s), %d path(s), %d workers per path, %zu KiB requests\n", why, e->n_paths,
               depth, req >> 10);
    *out = e;
    return ST_OK;
}
