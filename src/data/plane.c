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
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "data/data_internal.h"

#define PLANE_MAGIC 0x53544450414e4531ull /* "STDPANE1" */
#define PLANE_MAX_LOCAL 64

typedef struct plane_hdr {
    _Atomic uint64_t magic; /* stored last: attach waits for it */
    uint32_t n_local, depth, B, T;
    uint64_t slot_bytes, part_bytes, total_bytes;
    _Atomic uint64_t produced;
    _Atomic uint64_t released[PLANE_MAX_LOCAL];
    _Atomic int failed;
    int fail_code;
    char fail_msg[ST_ERR_MSG_MAX];
} plane_hdr;

/* One consumer's part of a slot: this header, then its arrays. */
typedef struct plane_part {
    uint64_t step, first_sample;
    int32_t n_seqs, max_seqlen;
    data_loader_state after;
} plane_part;

struct data_plane {
    int producer;
    char name[256];
    plane_hdr *h;
    size_t map_bytes;
    /* consumer */
    int index;
    uint64_t taken;
    data_loader_state state;
    /* producer */
    data_loader *dl;
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

static void *plane_main(void *arg) {
    data_plane *p = arg;
    plane_hdr *h = p->h;
    const uint32_t B = h->B, T = h->T;
    size_t off[6], pb;
    part_layout(B, T, off, &pb);
    for (uint64_t k = 0; !atomic_load(&p->stop); k++) {
        for (;;) { /* wait for the slot's previous batch to be released by everyone */
            uint64_t lo = UINT64_MAX;
            for (uint32_t i = 0; i < h->n_local; i++) {
                uint64_t r = atomic_load(&h->released[i]);
                lo = r < lo ? r : lo;
            }
            int anyone = lo < UINT64_MAX - h->depth; /* detached consumers hold nothing back... */
            if ((anyone && k < lo + h->depth) || atomic_load(&p->stop)) break;
            nap();                                   /* ...but with none left, produce nothing */
        }
        if (atomic_load(&p->stop)) break;
        data_batch b;
        st_err e = {0};
        st_status rc = data_loader_next(p->dl, &b, &e);
        if (rc) {
            h->fail_code = rc;
            snprintf(h->fail_msg, sizeof h->fail_msg, "%s", e.msg);
            atomic_store(&h->failed, 1);
            break;
        }
        data_loader_state st;
        data_loader_get_state(p->dl, &st);
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

static st_status map_shm(const char *name, int create, size_t bytes, plane_hdr **out, int *fd_out, st_err *err) {
    int fd = shm_open(name, create ? (O_RDWR | O_CREAT | O_EXCL) : O_RDWR, 0600);
    if (fd < 0)
        return st_errf(err, ST_ERR_IO, "data plane /dev/shm%s: %s: %s", name, create ? "cannot create" : "cannot open",
                       strerror(errno));
    if (create && ftruncate(fd, (off_t)bytes) != 0) {
        int e = errno;
        close(fd);
        shm_unlink(name);
        return st_errf(err, ST_ERR_NOSPACE, "data plane /dev/shm%s: cannot size to %zu bytes: %s", name, bytes,
                       strerror(e));
    }
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        int e = errno;
        close(fd);
        if (create) shm_unlink(name);
        return st_errf(err, ST_ERR_IO, "data plane /dev/shm%s: mmap of %zu bytes: %s", name, bytes, strerror(e));
    }
    *out = m;
    *fd_out = fd;
    return ST_OK;
}

static void shm_name(char *dst, size_t cap, const char *name) {
    snprintf(dst, cap, "%s%s", name[0] == '/' ? "" : "/", name);
}

st_status data_plane_serve(data_plane **out, const char *name, const data_loader_config *cfg, int first_rank,
                           int n_local, st_err *err) {
    *out = NULL;
    if (n_local < 1 || n_local > PLANE_MAX_LOCAL || cfg->world % n_local || first_rank % n_local ||
        first_rank < 0 || first_rank + n_local > cfg->world)
        return st_errf(err, ST_ERR_INVALID,
                       "data plane: %d local ranks from rank %d of world %d; the local ranks must be a "
                       "block of n_local consecutive ranks (1..%d) starting at a multiple of n_local",
                       n_local, first_rank, cfg->world, PLANE_MAX_LOCAL);
    data_plane *p = calloc(1, sizeof *p);
    if (!p) return st_errf(err, ST_ERR_NOMEM, "data plane: out of memory");
    p->producer = 1;
    shm_name(p->name, sizeof p->name, name);
    /* One loader for the block of local ranks: rows of ranks first..first+n-1. */
    data_loader_config c = *cfg;
    c.B = cfg->B * n_local;
    c.world = cfg->world / n_local;
    c.rank = first_rank / n_local;
    c.prefetch = 0; /* the plane's ring is the prefetch */
    st_status rc = data_loader_open(&p->dl, &c, err);
    if (rc) {
        free(p);
        return st_err_prefix(err, "data plane");
    }
    size_t off[6], pb;
    part_layout((uint32_t)cfg->B, (uint32_t)cfg->T, off, &pb);
    uint32_t depth = cfg->prefetch > 0 ? (uint32_t)cfg->prefetch + 1 : 2;
    size_t slot = pb * (size_t)n_local, total = al64(sizeof(plane_hdr)) + slot * depth;
    int fd = -1;
    rc = map_shm(p->name, 1, total, &p->h, &fd, err);
    if (rc) {
        data_loader_close(p->dl);
        free(p);
        return rc;
    }
    close(fd);
    p->map_bytes = total;
    plane_hdr *h = p->h;
    h->n_local = (uint32_t)n_local, h->depth = depth, h->B = (uint32_t)cfg->B, h->T = (uint32_t)cfg->T;
    h->slot_bytes = slot, h->part_bytes = pb, h->total_bytes = total;
    atomic_store(&h->magic, PLANE_MAGIC);
    if (pthread_create(&p->thread, NULL, plane_main, p) != 0) {
        data_plane_close(p);
        return st_errf(err, ST_ERR_NOMEM, "data plane: cannot start the producer thread");
    }
    p->thread_live = 1;
    *out = p;
    return ST_OK;
}

st_status data_plane_attach(data_plane **out, const char *name, int local_index, double timeout_s, st_err *err) {
    *out = NULL;
    data_plane *p = calloc(1, sizeof *p);
    if (!p) return st_errf(err, ST_ERR_NOMEM, "data plane: out of memory");
    shm_name(p->name, sizeof p->name, name);
    double t0 = st_now();
    int fd = -1;
    for (;;) {
        fd = shm_open(p->name, O_RDWR, 0600);
        if (fd >= 0) {
            struct stat st;
            if (fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(plane_hdr)) {
                plane_hdr *h = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                if (h != MAP_FAILED) {
                    if (atomic_load(&h->magic) == PLANE_MAGIC && h->total_bytes == (uint64_t)st.st_size) {
                        p->h = h;
                        p->map_bytes = (size_t)st.st_size;
                        break;
                    }
                    munmap(h, (size_t)st.st_size);
                }
            }
            close(fd);
            fd = -1;
        }
        if (st_now() - t0 > timeout_s) {
            free(p);
            return st_errf(err, ST_ERR_IO,
                           "data plane /dev/shm%s: no producer after %.1f s; start the producer "
                           "(data_plane_serve) on this machine with the same name", name[0] == '/' ? name : name,
                           timeout_s);
        }
        nap();
    }
    close(fd);
    if (local_index < 0 || (uint32_t)local_index >= p->h->n_local) {
        st_status rc = st_errf(err, ST_ERR_INVALID, "data plane %s: local index %d, the producer serves %u", p->name,
                               local_index, p->h->n_local);
        munmap(p->h, p->map_bytes);
        free(p);
        return rc;
    }
    p->index = local_index;
    p->taken = atomic_load(&p->h->released[local_index]);
    *out = p;
    return ST_OK;
}

st_status data_plane_next(data_plane *p, data_batch *b, st_err *err) {
    plane_hdr *h = p->h;
    if (p->producer) return st_errf(err, ST_ERR_INVALID, "data plane: next() on the producer handle");
    atomic_store(&h->released[p->index], p->taken); /* done with the previous batch */
    while (atomic_load(&h->produced) <= p->taken) {
        if (atomic_load(&h->failed))
            return st_errf(err, (st_status)h->fail_code, "data plane producer: %s", h->fail_msg);
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

void data_plane_get_state(const data_plane *p, data_loader_state *st) {
    if (p->producer) data_loader_get_state(p->dl, st);
    else *st = p->state;
}

void data_plane_close(data_plane *p) {
    if (!p) return;
    if (p->producer) {
        atomic_store(&p->stop, 1);
        if (p->thread_live) pthread_join(p->thread, NULL);
        data_loader_close(p->dl);
        shm_unlink(p->name);
    } else if (p->h) {
        atomic_store(&p->h->released[p->index], UINT64_MAX - p->h->depth); /* never hold the producer back */
    }
    if (p->h) munmap(p->h, p->map_bytes);
    free(p);
}
