/* plane.c - the shared data plane: one producer feeds the training processes of a
 * machine through a ring of batches in shared memory (/dev/shm/<name>).
 *
 * Why: with one loader per process, every process walks the same global batch, opens
 * the same files and keeps its own buffers. Here one thread runs a single loader for
 * all local ranks (rows of consecutive ranks are consecutive in the global batch, so
 * their union is one loader's slice) and each consumer reads its part in place.
 * Synchronisation is two kinds of counters in the shared header: `produced` (batches
 * published) and, per consumer, `released` (batches it is done with); the producer
 * reuses a slot once every consumer has released it. Waiting is polling with short
 * sleeps: the ring is meant to be ahead, so waits are rare.
 *
 * Faults: each participant holds an open-file-description lock on one byte of the
 * segment while attached (the producer byte 0, consumer i byte 1 + i), and the kernel
 * drops it when the process dies, however it dies. A waiting participant checks every
 * PLANE_POLL_S that the bytes of the others are still held and that the producer's
 * heartbeat (advanced by its thread on every turn of its loop) is younger than the
 * plane's timeout. So a killed producer or consumer ends the others with an error naming
 * it within milliseconds, a stopped or stuck producer within the timeout, never a hang;
 * the producer's process sees it in st_data_plane_check. A segment whose byte 0 nobody
 * holds is left over from a crashed producer: a new producer replaces it, and consumers
 * wait for that one instead of attaching to it.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "data/data_internal.h"

#define PLANE_MAGIC 0x53544450414e4532ull /* "STDPANE2" */
#define PLANE_MAX_LOCAL 64
#define PLANE_POLL_S 0.01           /* how often a waiting participant checks the others */
#define PLANE_TIMEOUT_DEFAULT_S 5.0 /* a producer silent this long has failed */

enum { PEER_NONE = 0, PEER_ATTACHED = 1, PEER_DETACHED = 2 };

typedef struct plane_hdr {
    _Atomic uint64_t magic; /* stored last: attach waits for it */
    uint32_t n_local, depth, B, T;
    uint64_t slot_bytes, part_bytes, total_bytes;
    double timeout_s;
    int32_t producer_pid;
    _Atomic int producer_state;
    _Atomic uint64_t beat_ns; /* the producer thread's last turn, CLOCK_MONOTONIC */
    _Atomic uint64_t produced;
    _Atomic uint64_t released[PLANE_MAX_LOCAL];
    _Atomic int32_t consumer_pid[PLANE_MAX_LOCAL];
    _Atomic int consumer_state[PLANE_MAX_LOCAL];
    _Atomic int failed; /* 0; 2 while fail_msg is written; 1 once it is */
    int fail_code;
    char fail_msg[ST_ERR_MSG_MAX];
} plane_hdr;

/* One consumer's part of a slot: this header, then its arrays. */
typedef struct plane_part {
    uint64_t step, first_sample;
    int32_t n_seqs, max_seqlen;
    st_data_loader_state after;
} plane_part;

struct st_data_plane {
    int producer;
    char name[256];
    plane_hdr *h;
    size_t map_bytes;
    int fd;             /* kept open: it holds this participant's lock byte */
    double last_check;  /* st_now() of the last look at the others (peers_alive) */
    /* consumer */
    int index;
    uint64_t taken;
    st_data_loader_state state;
    /* producer */
    st_data_loader *dl;
    pthread_t thread;
    int thread_live;
    _Atomic int stop;
};

static size_t al64(size_t n) { return (n + 63) & ~(size_t)63; }

static void part_layout(uint32_t B, uint32_t T, size_t off[6], size_t *bytes) {
    size_t o = al64(sizeof(plane_part));
    off[0] = o, o += al64((size_t)B * (T + 1) * 4); /* tokens */
    off[1] = o, o += al64((size_t)B * T * 4);       /* positions */
    off[2] = o, o += al64((size_t)B * T);           /* loss mask */
    off[3] = o, o += al64(B);                       /* source */
    off[4] = o, o += al64(((size_t)B * T + 1) * 4); /* cu_seqlens */
    *bytes = o;
}

static uint8_t *part_at(plane_hdr *h, uint64_t batch, int i) {
    return (uint8_t *)h + al64(sizeof *h) + (batch % h->depth) * h->slot_bytes + (size_t)i * h->part_bytes;
}

static void nap(void) {
    struct timespec ts = {0, 50 * 1000};
    nanosleep(&ts, NULL);
}

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* one clock for every process of the machine */
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Byte `byte` of the segment as a lock: taken (0) or refused (-1, someone holds it). */
static int lock_byte(int fd, int byte) {
    struct flock l;
    memset(&l, 0, sizeof l);
    l.l_type = F_WRLCK, l.l_whence = SEEK_SET, l.l_start = byte, l.l_len = 1;
    return fcntl(fd, F_OFD_SETLK, &l) == 0 ? 0 : -1;
}

/* Whether another open of the segment holds byte `byte`. A query that fails counts as
 * held: a peer is declared dead only on evidence. */
static int byte_held(int fd, int byte) {
    struct flock l;
    memset(&l, 0, sizeof l);
    l.l_type = F_WRLCK, l.l_whence = SEEK_SET, l.l_start = byte, l.l_len = 1;
    if (fcntl(fd, F_OFD_GETLK, &l) != 0) return 1;
    return l.l_type != F_UNLCK;
}

/* Mark the plane failed with a message for everyone; the first failure wins. */
__attribute__((format(printf, 3, 4))) static void plane_fail(plane_hdr *h, st_status code, const char *fmt, ...) {
    int expect = 0;
    if (!atomic_compare_exchange_strong(&h->failed, &expect, 2)) return;
    h->fail_code = (int)code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(h->fail_msg, sizeof h->fail_msg, fmt, ap);
    va_end(ap);
    atomic_store(&h->failed, 1);
}

static st_status plane_error(const st_data_plane *p, st_err *err) {
    while (atomic_load(&p->h->failed) == 2) nap();
    return st_errf(err, (st_status)p->h->fail_code, "data plane /dev/shm%s: %s", p->name, p->h->fail_msg);
}

/* Whether the others are still there (checked at most every PLANE_POLL_S): the producer
 * (for a consumer) holds its byte, has not closed and beat within the timeout; every
 * attached consumer holds its byte. On the first that is not, fails the plane for all
 * and returns 0. */
static int peers_alive(st_data_plane *p) {
    plane_hdr *h = p->h;
    if (atomic_load(&h->failed)) return 0;
    double t = st_now();
    if (t - p->last_check < PLANE_POLL_S) return 1;
    p->last_check = t;
    if (!p->producer) {
        if (atomic_load(&h->producer_state) == PEER_DETACHED) {
            plane_fail(h, ST_ERR_IO, "the producer (pid %d) has closed the plane; no more batches come",
                       (int)h->producer_pid);
            return 0;
        }
        if (!byte_held(p->fd, 0)) {
            plane_fail(h, ST_ERR_IO,
                       "the producer (pid %d) died (its lock on the segment is gone); its consumers cannot go "
                       "on without it: restart the job", (int)h->producer_pid);
            return 0;
        }
        uint64_t beat = atomic_load(&h->beat_ns), now = mono_ns();
        if (now > beat && (double)(now - beat) * 1e-9 > h->timeout_s) {
            plane_fail(h, ST_ERR_IO,
                       "the producer (pid %d) has made no progress for %.1f s (the plane's timeout is %.1f s): it "
                       "is stopped, or stuck reading its data", (int)h->producer_pid, (double)(now - beat) * 1e-9,
                       h->timeout_s);
            return 0;
        }
    }
    for (uint32_t i = 0; i < h->n_local; i++) {
        if ((!p->producer && (int)i == p->index) || atomic_load(&h->consumer_state[i]) != PEER_ATTACHED) continue;
        /* a consumer detaching marks itself before it lets go of its byte */
        if (!byte_held(p->fd, 1 + (int)i) && atomic_load(&h->consumer_state[i]) == PEER_ATTACHED) {
            plane_fail(h, ST_ERR_IO,
                       "consumer %u (pid %d) died without detaching; every batch holds its rows, so the "
                       "others stop too: restart the job", i, (int)atomic_load(&h->consumer_pid[i]));
            return 0;
        }
    }
    return 1;
}

static void *plane_main(void *arg) {
    st_data_plane *p = arg;
    plane_hdr *h = p->h;
    const uint32_t B = h->B, T = h->T;
    size_t off[6], pb;
    part_layout(B, T, off, &pb);
    for (uint64_t k = 0; !atomic_load(&p->stop); k++) {
        for (;;) { /* wait for the slot's previous batch to be released by everyone */
            atomic_store(&h->beat_ns, mono_ns());
            uint64_t lo = UINT64_MAX;
            for (uint32_t i = 0; i < h->n_local; i++) {
                uint64_t r = atomic_load(&h->released[i]);
                lo = r < lo ? r : lo;
            }
            int anyone = lo < UINT64_MAX - h->depth; /* detached consumers hold nothing back... */
            if ((anyone && k < lo + h->depth) || atomic_load(&p->stop)) break;
            if (!peers_alive(p)) return NULL;
            nap();                                   /* ...but with none left, produce nothing */
        }
        if (atomic_load(&p->stop) || atomic_load(&h->failed)) break;
        st_data_batch b;
        st_err e = {0};
        st_status rc = st_data_loader_next(p->dl, &b, &e);
        atomic_store(&h->beat_ns, mono_ns());
        if (rc) {
            plane_fail(h, rc, "the producer's loader failed: %s", e.msg);
            break;
        }
        st_data_loader_state st;
        st_data_loader_get_state(p->dl, &st);
        int seg = 1; /* walks b.cu_seqlens; segments never cross rows, so never consumers */
        for (uint32_t i = 0; i < h->n_local; i++) {
            uint8_t *q = part_at(h, k, (int)i);
            plane_part *pp = (plane_part *)q;
            pp->step = b.step;
            pp->first_sample = b.first_sample + (uint64_t)i * B;
            pp->after = st;
            memcpy(q + off[0], b.tokens + (size_t)i * B * (T + 1), (size_t)B * (T + 1) * 4);
            memcpy(q + off[1], b.positions + (size_t)i * B * T, (size_t)B * T * 4);
            memcpy(q + off[2], b.loss_mask + (size_t)i * B * T, (size_t)B * T);
            memcpy(q + off[3], b.source + (size_t)i * B, B);
            int32_t *cu = (int32_t *)(q + off[4]), base = (int32_t)(i * B * T), n = 0, mx = 0;
            cu[0] = 0;
            int32_t prev = base;
            while (seg <= b.n_seqs && b.cu_seqlens[seg] <= base + (int32_t)(B * T)) {
                cu[++n] = b.cu_seqlens[seg] - base;
                if (b.cu_seqlens[seg] - prev > mx) mx = b.cu_seqlens[seg] - prev;
                prev = b.cu_seqlens[seg++];
            }
            pp->n_seqs = n;
            pp->max_seqlen = mx;
        }
        atomic_store(&h->produced, k + 1); /* release: the parts above are visible first */
    }
    return NULL;
}

/* Create the segment, or replace one left by a producer that died (nobody holds its
 * byte 0); refuse if a live producer serves it. Returns the fd, holding byte 0. */
static st_status create_segment(const char *name, size_t bytes, int *fd_out, st_err *err) {
    for (int attempt = 0; attempt < 3; attempt++) {
        int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd >= 0) {
            if (lock_byte(fd, 0) != 0) { /* taken in the instant since: a racing producer replaces it */
                close(fd);
                continue;
            }
            if (ftruncate(fd, (off_t)bytes) != 0) {
                int e = errno;
                close(fd);
                shm_unlink(name);
                return st_errf(err, ST_ERR_NOSPACE, "data plane /dev/shm%s: cannot size to %zu bytes: %s", name,
                               bytes, strerror(e));
            }
            *fd_out = fd;
            return ST_OK;
        }
        if (errno != EEXIST)
            return st_errf(err, ST_ERR_IO, "data plane /dev/shm%s: cannot create: %s", name, strerror(errno));
        fd = shm_open(name, O_RDWR, 0600);
        if (fd < 0) {
            if (errno == ENOENT) continue; /* removed meanwhile */
            return st_errf(err, ST_ERR_IO, "data plane /dev/shm%s: exists, but cannot be opened to check whether "
                           "its producer is alive: %s", name, strerror(errno));
        }
        int32_t pid = 0;
        if (pread(fd, &pid, sizeof pid, offsetof(plane_hdr, producer_pid)) != (ssize_t)sizeof pid) pid = 0;
        if (lock_byte(fd, 0) != 0) {
            close(fd);
            return st_errf(err, ST_ERR_BUSY,
                           "data plane /dev/shm%s: another producer (pid %d) is serving it; stop that one, or "
                           "give this one another name", name, (int)pid);
        }
        /* Left by a producer that died (pid): nobody serves it; consumers of it have
         * failed or will. */
        shm_unlink(name);
        close(fd);
    }
    return st_errf(err, ST_ERR_BUSY,
                   "data plane /dev/shm%s: still taken after replacing a stale segment three times; another "
                   "producer of the same name is starting", name);
}

static void shm_name(char *dst, size_t cap, const char *name) {
    snprintf(dst, cap, "%s%s", name[0] == '/' ? "" : "/", name);
}

st_status st_data_plane_serve(st_data_plane **out, const char *name, const st_data_loader_config *cfg, int first_rank,
                           int n_local, double timeout_s, st_err *err) {
    *out = NULL;
    if (!(timeout_s >= 0) || timeout_s > 1e6)
        return st_errf(err, ST_ERR_INVALID, "data plane: timeout %g s; give 0 (the default, %.0f s) or more",
                       timeout_s, PLANE_TIMEOUT_DEFAULT_S);
    if (n_local < 1 || n_local > PLANE_MAX_LOCAL || cfg->world % n_local || first_rank % n_local ||
        first_rank < 0 || first_rank + n_local > cfg->world)
        return st_errf(err, ST_ERR_INVALID,
                       "data plane: %d local ranks from rank %d of world %d; the local ranks must be a "
                       "block of n_local consecutive ranks (1..%d) starting at a multiple of n_local",
                       n_local, first_rank, cfg->world, PLANE_MAX_LOCAL);
    st_data_plane *p = calloc(1, sizeof *p);
    if (!p) return st_errf(err, ST_ERR_NOMEM, "data plane: out of memory");
    p->producer = 1;
    p->fd = -1;
    shm_name(p->name, sizeof p->name, name);
    /* One loader for the block of local ranks: rows of ranks first..first+n-1. */
    st_data_loader_config c = *cfg;
    c.B = cfg->B * n_local;
    c.world = cfg->world / n_local;
    c.rank = first_rank / n_local;
    c.prefetch = 0; /* the plane's ring is the prefetch */
    st_status rc = st_data_loader_open(&p->dl, &c, err);
    if (rc) {
        free(p);
        return st_err_prefix(err, "data plane");
    }
    size_t off[6], pb;
    part_layout((uint32_t)cfg->B, (uint32_t)cfg->T, off, &pb);
    uint32_t depth = cfg->prefetch > 0 ? (uint32_t)cfg->prefetch + 1 : 2;
    size_t slot = pb * (size_t)n_local, total = al64(sizeof(plane_hdr)) + slot * depth;
    rc = create_segment(p->name, total, &p->fd, err);
    void *m = MAP_FAILED;
    if (!rc) {
        m = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, p->fd, 0);
        if (m == MAP_FAILED) {
            rc = st_errf(err, ST_ERR_IO, "data plane /dev/shm%s: mmap of %zu bytes: %s", p->name, total,
                         strerror(errno));
            shm_unlink(p->name);
            close(p->fd);
        }
    }
    if (rc) {
        st_data_loader_close(p->dl);
        free(p);
        return rc;
    }
    p->h = m;
    p->map_bytes = total;
    plane_hdr *h = p->h;
    h->n_local = (uint32_t)n_local, h->depth = depth, h->B = (uint32_t)cfg->B, h->T = (uint32_t)cfg->T;
    h->slot_bytes = slot, h->part_bytes = pb, h->total_bytes = total;
    h->timeout_s = timeout_s > 0 ? timeout_s : PLANE_TIMEOUT_DEFAULT_S;
    h->producer_pid = (int32_t)getpid();
    atomic_store(&h->producer_state, PEER_ATTACHED);
    atomic_store(&h->beat_ns, mono_ns());
    atomic_store(&h->magic, PLANE_MAGIC);
    if (pthread_create(&p->thread, NULL, plane_main, p) != 0) {
        st_data_plane_close(p);
        return st_errf(err, ST_ERR_NOMEM, "data plane: cannot start the producer thread");
    }
    p->thread_live = 1;
    *out = p;
    return ST_OK;
}

st_status st_data_plane_attach(st_data_plane **out, const char *name, int local_index, double timeout_s, st_err *err) {
    *out = NULL;
    st_data_plane *p = calloc(1, sizeof *p);
    if (!p) return st_errf(err, ST_ERR_NOMEM, "data plane: out of memory");
    shm_name(p->name, sizeof p->name, name);
    double t0 = st_now();
    int32_t stale_pid = 0; /* a segment whose producer died: wait for its replacement */
    for (;;) {
        int fd = shm_open(p->name, O_RDWR, 0600);
        if (fd >= 0) {
            struct stat st;
            if (fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(plane_hdr)) {
                plane_hdr *h = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                if (h != MAP_FAILED) {
                    if (atomic_load(&h->magic) == PLANE_MAGIC && h->total_bytes == (uint64_t)st.st_size) {
                        if (byte_held(fd, 0)) {
                            p->h = h;
                            p->fd = fd;
                            p->map_bytes = (size_t)st.st_size;
                            break;
                        }
                        stale_pid = h->producer_pid;
                    }
                    munmap(h, (size_t)st.st_size);
                }
            }
            close(fd);
        }
        if (st_now() - t0 > timeout_s) {
            st_status rc =
                stale_pid ? st_errf(err, ST_ERR_IO,
                                    "data plane /dev/shm%s: after %.1f s only a segment left by a producer that "
                                    "died (pid %d); start the producer (st_data_plane_serve), it replaces the segment",
                                    p->name, timeout_s, (int)stale_pid)
                          : st_errf(err, ST_ERR_IO,
                                    "data plane /dev/shm%s: no producer after %.1f s; start the producer "
                                    "(st_data_plane_serve) on this machine with the same name",
                                    p->name, timeout_s);
            free(p);
            return rc;
        }
        struct timespec ts = {0, 1000 * 1000}; /* opening the segment 1000 times a second is plenty */
        nanosleep(&ts, NULL);
    }
    plane_hdr *h = p->h;
    st_status rc = ST_OK;
    if (local_index < 0 || (uint32_t)local_index >= h->n_local)
        rc = st_errf(err, ST_ERR_INVALID, "data plane /dev/shm%s: local index %d, the producer serves %u", p->name,
                     local_index, h->n_local);
    else if (atomic_load(&h->failed))
        rc = plane_error(p, err);
    else if (lock_byte(p->fd, 1 + local_index) != 0)
        rc = st_errf(err, ST_ERR_BUSY, "data plane /dev/shm%s: local index %d is attached by another consumer (pid %d)",
                     p->name, local_index, (int)atomic_load(&h->consumer_pid[local_index]));
    else if (atomic_load(&h->consumer_state[local_index]) == PEER_ATTACHED)
        rc = st_errf(err, ST_ERR_IO, "data plane /dev/shm%s: consumer %d (pid %d) of this plane died; restart the job",
                     p->name, local_index, (int)atomic_load(&h->consumer_pid[local_index]));
    if (rc) {
        munmap(p->h, p->map_bytes);
        close(p->fd);
        free(p);
        return rc;
    }
    p->index = local_index;
    p->taken = atomic_load(&h->released[local_index]);
    atomic_store(&h->consumer_pid[local_index], (int32_t)getpid());
    atomic_store(&h->consumer_state[local_index], PEER_ATTACHED); /* after its byte is held */
    *out = p;
    return ST_OK;
}

st_status st_data_plane_next(st_data_plane *p, st_data_batch *b, st_err *err) {
    plane_hdr *h = p->h;
    if (p->producer) return st_errf(err, ST_ERR_INVALID, "data plane: next() on the producer handle");
    if (atomic_load(&h->failed)) return plane_error(p, err);
    atomic_store(&h->released[p->index], p->taken); /* done with the previous batch */
    while (atomic_load(&h->produced) <= p->taken) {
        if (!peers_alive(p)) return plane_error(p, err);
        nap();
    }
    size_t off[6], pb;
    part_layout(h->B, h->T, off, &pb);
    uint8_t *q = part_at(h, p->taken, p->index);
    const plane_part *pp = (const plane_part *)q;
    b->B = (int)h->B, b->T = (int)h->T;
    b->tokens = (const int32_t *)(q + off[0]);
    b->positions = (const int32_t *)(q + off[1]);
    b->loss_mask = q + off[2];
    b->source = q + off[3];
    b->cu_seqlens = (const int32_t *)(q + off[4]);
    b->n_seqs = pp->n_seqs;
    b->max_seqlen = pp->max_seqlen;
    b->step = pp->step;
    b->first_sample = pp->first_sample;
    p->state = pp->after;
    p->taken++;
    return ST_OK;
}

void st_data_plane_get_state(const st_data_plane *p, st_data_loader_state *st) {
    if (p->producer) st_data_loader_get_state(p->dl, st);
    else *st = p->state;
}

st_status st_data_plane_check(st_data_plane *p, st_err *err) {
    if (atomic_load(&p->h->failed)) return plane_error(p, err);
    if (!p->producer) { /* the producer's thread looks at the others itself */
        p->last_check = 0;
        if (!peers_alive(p)) return plane_error(p, err);
    }
    return ST_OK;
}

void st_data_plane_close(st_data_plane *p) {
    if (!p) return;
    if (p->producer) {
        atomic_store(&p->stop, 1);
        if (p->thread_live) pthread_join(p->thread, NULL);
        st_data_loader_close(p->dl);
        if (p->h) {
            atomic_store(&p->h->producer_state, PEER_DETACHED); /* consumers still waiting: "closed", not "died" */
            shm_unlink(p->name);
        }
    } else if (p->h) {
        atomic_store(&p->h->released[p->index], UINT64_MAX - p->h->depth); /* never hold the producer back */
        atomic_store(&p->h->consumer_state[p->index], PEER_DETACHED);     /* before its byte is let go */
    }
    if (p->h) munmap(p->h, p->map_bytes);
    if (p->h && p->fd >= 0) close(p->fd);
    free(p);
}
