/* state_store.c - the tiered state store (strata/store.h): subgroups of the flat
 * optimizer state on disk paths, a read / update / write pipeline through the optimizer
 * engine, a host cache, and an atomic step switch with a CRC-32C per MiB; readers (a
 * shared lock) that copy out any element range, and stores filled from such ranges.
 *
 * NAME.manifest (little-endian, replaced atomically at every commit):
 *   0   char[8] "STRATAsm"        8  u32 version (2)       12 u32 format
 *   16  u64 numel                 24 u32 n_segs            28 u32 n_paths
 *   32  u32 n_subgroups           36 u32 in_place          40 u64 step (updates)
 *   48  u32 dirty                 52 u32 blob bytes        56 u64 commits
 *   64  u64 store id
 *   72  n_segs x {u64 offset, u64 n}
 *   ..  n_paths x u64 file bytes
 *   ..  n_subgroups x {u64 first, u64 end, u32 path, u32 current region, u64 offset[2],
 *                      u64 region bytes, u32 n_crc, u32 crc[n_crc]}
 *   ..  blob
 *   end u32 CRC-32C of every byte before it
 *
 * NAME.bin starts with one 4096-byte block: "STRATAsb", u32 version (1), u32 path index,
 * u64 store id, u32 n_paths; regions follow. A file given for the wrong path, or from
 * another store, is named as such rather than failing its checksums.
 */
#include "strata/store.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "core/fileutil.h"
#include "strata/prof.h"

#define MAX_STATE_BUFS ST_STORE_MAX_MOMENTS
#define READ_AHEAD 2
#define MANIFEST_MAGIC "STRATAsm"
#define MANIFEST_VERSION 2u
#define FILE_MAGIC "STRATAsb"
#define FILE_HEADER 4096u

typedef struct subgroup {
    size_t first, end;  /* flat element range (gaps between segments included) */
    int path, cur;      /* path index; current region (0 or 1) */
    uint64_t off[2];    /* the regions' offsets in the path's file */
    uint64_t bytes;     /* region bytes */
    uint64_t part[1 + MAX_STATE_BUFS]; /* master, then the moment buffers, inside a region */
    int n_crc;
    uint32_t *crc, *crc_new;
    st_optim *o;
    int buf;            /* the buffer holding it, or -1 */
    long done;          /* the step id in which it was last updated */
    size_t *pc_first;   /* where each of its optimizer's segments starts, relative to first */
    int n_pc;
} subgroup;

typedef struct sbuf {
    char *data;
    int sg;             /* -1: empty */
    uint64_t rt, wt;    /* read / write ticket in flight (0: none) */
    long last_use;
} sbuf;

struct st_store {
    st_store_config cfg;
    char *paths[ST_STORE_MAX_PATHS];
    double weight[ST_STORE_MAX_PATHS];
    uint64_t path_bytes[ST_STORE_MAX_PATHS];
    char name[256], manifest[4400];
    st_optim_segment *segs;
    int n_segs;
    size_t numel;
    subgroup *sg;
    int n_sg;
    uint64_t max_region;
    sbuf *buf;
    int n_buf;
    st_io_engine *io;
    uint64_t step, commits, id;
    unsigned char *blob;
    size_t blob_bytes;
    long step_id, use_clock;
    int *ord, *pos;     /* this step's visit order: ord[i] the subgroup visited i-th, pos its inverse */
    int failed;
    int readonly;       /* st_store_open_readonly: one buffer, shared locks, never written */
    st_store_stats stats;
    st_lock locks[ST_STORE_MAX_PATHS]; /* one per path: a second process is refused */
};

static uint64_t round4k(uint64_t x) { return (x + 4095) / 4096 * 4096; }

static int seg_cmp(const void *a, const void *b) {
    const st_optim_segment *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* ------------------------------------------------------------------ layout */

/* The subgroup's optimizer (its pieces of the segments, offsets relative to first) and the
 * region layout. */
static st_status sg_build(subgroup *g, const st_optim_segment *segs, int n_segs, st_optim_state_format fmt, st_err *err) {
    st_optim_segment *pc = malloc(sizeof *pc * (size_t)n_segs);
    if (!pc) return st_errf(err, ST_ERR_NOMEM, "state store: out of memory");
    int n = 0;
    for (int i = 0; i < n_segs; i++) {
        size_t lo = segs[i].offset > g->first ? segs[i].offset : g->first;
        size_t hi = segs[i].offset + segs[i].n < g->end ? segs[i].offset + segs[i].n : g->end;
        if (lo >= hi) continue;
        if ((lo - segs[i].offset) % ST_OPTIM_CHUNK_ELEMS) {
            free(pc);
            return st_errf(err, ST_ERR_FORMAT, "state store: subgroup [%zu, %zu) cuts segment %d off its %u-element grid",
                           g->first, g->end, i, ST_OPTIM_CHUNK_ELEMS);
        }
        pc[n] = segs[i]; /* its weight decay and learning-rate class */
        pc[n].offset = lo - g->first;
        pc[n++].n = hi - lo;
    }
    st_status s = n ? st_optim_create_unbound(&g->o, pc, n, fmt, err)
                    : st_errf(err, ST_ERR_FORMAT, "state store: subgroup [%zu, %zu) holds no parameters", g->first, g->end);
    if (!s && !(g->pc_first = malloc(sizeof *g->pc_first * (size_t)n))) s = st_errf(err, ST_ERR_NOMEM, "state store: out of memory");
    for (int i = 0; !s && i < n; i++) g->pc_first[i] = pc[i].offset;
    g->n_pc = n;
    free(pc);
    if (s) return s;
    uint64_t at = round4k((uint64_t)(g->end - g->first) * sizeof(float));
    g->part[0] = 0;
    for (int i = 0; i < st_optim_state_count(g->o); i++) {
        g->part[1 + i] = at;
        at += round4k(st_optim_state_buffer_bytes(g->o, i));
    }
    g->bytes = at;
    g->n_crc = (int)((at + ST_STORE_CRC_BLOCK - 1) / ST_STORE_CRC_BLOCK);
    g->crc = calloc((size_t)g->n_crc, sizeof *g->crc);
    g->crc_new = calloc((size_t)g->n_crc, sizeof *g->crc_new);
    g->buf = -1;
    g->done = -1;
    if (!g->crc || !g->crc_new) return st_errf(err, ST_ERR_NOMEM, "state store: out of memory");
    return ST_OK;
}

static void sg_free_all(subgroup *sg, int n) {
    for (int i = 0; i < n && sg; i++) {
        st_optim_free(sg[i].o);
        free(sg[i].pc_first);
        free(sg[i].crc);
        free(sg[i].crc_new);
    }
    free(sg);
}

static uint64_t target_region(const st_store_config *c) {
    if (c->region_bytes) return c->region_bytes;
    uint64_t b = (c->host_budget ? c->host_budget : 1ull << 30) / 8;
    if (b < (1u << 20)) b = 1u << 20;
    if (b > ST_STORE_MAX_REGION) b = ST_STORE_MAX_REGION;
    return b;
}

/* Cut the segments into subgroup ranges of about `target` region bytes. */
static st_status plan_cuts(const st_optim_segment *segs, int n_segs, st_optim_state_format fmt, uint64_t target,
                           size_t **cuts_out, int *n_out, st_err *err) {
    size_t E = (size_t)((double)target / st_store_bytes_per_param(fmt)) / ST_OPTIM_CHUNK_ELEMS * ST_OPTIM_CHUNK_ELEMS;
    if (E < ST_OPTIM_CHUNK_ELEMS) E = ST_OPTIM_CHUNK_ELEMS;
    size_t cap = 16, n = 0, *cuts = malloc(sizeof *cuts * cap * 2);
    if (!cuts) return st_errf(err, ST_ERR_NOMEM, "state store: out of memory");
    size_t cur_first = 0, cur_count = 0, last_end = 0;
#define CLOSE()                                                                                     \
    do {                                                                                            \
        if (n == cap) {                                                                             \
            size_t *nc = realloc(cuts, sizeof *cuts * cap * 4);                                     \
            if (!nc) { free(cuts); return st_errf(err, ST_ERR_NOMEM, "state store: out of memory"); } \
            cuts = nc;                                                                              \
            cap *= 2;                                                                               \
        }                                                                                           \
        cuts[2 * n] = cur_first;                                                                    \
        cuts[2 * n + 1] = last_end;                                                                 \
        n++;                                                                                        \
        cur_count = 0;                                                                              \
    } while (0)
    for (int i = 0; i < n_segs; i++) {
        size_t o = segs[i].offset, len = segs[i].n, pos = 0;
        while (pos < len) {
            if (cur_count == 0) cur_first = o + pos;
            size_t space = E - cur_count, rem = len - pos;
            if (rem <= space) {
                cur_count += rem;
                pos = len;
                last_end = o + len;
                if (cur_count == E) CLOSE();
            } else {
                size_t take = space / ST_OPTIM_CHUNK_ELEMS * ST_OPTIM_CHUNK_ELEMS;
                if (take == 0) {
                    CLOSE();
                    continue;
                }
                cur_count += take;
                pos += take;
                last_end = o + pos;
                CLOSE();
            }
        }
    }
    if (cur_count) CLOSE();
#undef CLOSE
    *cuts_out = cuts;
    *n_out = (int)n;
    return ST_OK;
}

static st_status check_config(const st_store_config *c, st_err *err) {
    if (!c || !c->paths || c->n_paths < 1 || c->n_paths > ST_STORE_MAX_PATHS)
        return st_errf(err, ST_ERR_INVALID, "state store: give 1 to %d disk paths", ST_STORE_MAX_PATHS);
    if (!c->segs || c->n_segs < 1) return st_errf(err, ST_ERR_INVALID, "state store: no parameter segments");
    if (c->fmt != ST_OPTIM_STATE_F32 && c->fmt != ST_OPTIM_STATE_8BIT && c->fmt != ST_OPTIM_STATE_8BIT_FP)
        return st_errf(err, ST_ERR_INVALID, "state store: unknown state format %d", (int)c->fmt);
    for (int p = 0; p < c->n_paths; p++) {
        struct stat sb;
        if (!c->paths[p] || stat(c->paths[p], &sb) != 0 || !S_ISDIR(sb.st_mode))
            return st_errf(err, ST_ERR_IO, "state store: path '%s' is not a directory; create it first",
                           c->paths[p] ? c->paths[p] : "(null)");
        if (c->path_weight && !(c->path_weight[p] > 0))
            return st_errf(err, ST_ERR_INVALID, "state store: path '%s' has weight %g; weights are measured "
                           "bandwidths and must be positive", c->paths[p], c->path_weight[p]);
        /* one directory named twice (or through a link) would put two paths' regions in one file */
        for (int q = 0; q < p; q++) {
            struct stat sq;
            if (stat(c->paths[q], &sq) == 0 && sq.st_dev == sb.st_dev && sq.st_ino == sb.st_ino)
                return st_errf(err, ST_ERR_INVALID, "state store: paths '%s' and '%s' are the same directory; give "
                               "each directory once", c->paths[q], c->paths[p]);
        }
    }
    return ST_OK;
}

/* Build the store object's layout (segments, subgroups, path assignment) without I/O. */
static st_status store_layout(st_store *s, st_err *err) {
    const st_store_config *c = &s->cfg;
    size_t *cuts = NULL;
    int n = 0;
    st_status st = plan_cuts(s->segs, s->n_segs, c->fmt, target_region(c), &cuts, &n, err);
    if (st) return st;
    s->sg = calloc((size_t)n, sizeof *s->sg);
    if (!s->sg) {
        free(cuts);
        return st_errf(err, ST_ERR_NOMEM, "state store: out of memory");
    }
    s->n_sg = n;
    double load[ST_STORE_MAX_PATHS] = {0};
    int copies = c->in_place ? 1 : 2;
    for (int p = 0; p < c->n_paths; p++) s->path_bytes[p] = FILE_HEADER;
    for (int i = 0; i < n && !st; i++) {
        subgroup *g = &s->sg[i];
        g->first = cuts[2 * i];
        g->end = cuts[2 * i + 1];
        if ((st = sg_build(g, s->segs, s->n_segs, c->fmt, err))) break;
        /* the path that would finish its share soonest with this subgroup added */
        int best = 0;
        double bt = 0;
        for (int p = 0; p < c->n_paths; p++) {
            double t = (load[p] + (double)g->bytes) / s->weight[p];
            if (p == 0 || t < bt) { best = p; bt = t; }
        }
        g->path = best;
        load[best] += (double)g->bytes;
        g->off[0] = s->path_bytes[best];
        g->off[1] = c->in_place ? g->off[0] : g->off[0] + g->bytes;
        s->path_bytes[best] += (uint64_t)copies * g->bytes;
        if (g->bytes > s->max_region) s->max_region = g->bytes;
    }
    free(cuts);
    return st;
}

static st_status store_alloc(st_store **out, const st_store_config *cfg, st_err *err) {
    *out = NULL;
    st_status st = check_config(cfg, err);
    if (st) return st;
    st_store *s = calloc(1, sizeof *s);
    if (!s) return st_errf(err, ST_ERR_NOMEM, "state store: out of memory");
    s->cfg = *cfg;
    for (int p = 0; p < ST_STORE_MAX_PATHS; p++) s->locks[p].fd = -1;
    snprintf(s->name, sizeof s->name, "%s", cfg->name ? cfg->name : "strata-state");
    for (int p = 0; p < cfg->n_paths; p++) {
        s->paths[p] = strdup(cfg->paths[p]);
        s->weight[p] = cfg->path_weight ? cfg->path_weight[p] : 1.0;
        if (!s->paths[p]) { st_store_close(s); return st_errf(err, ST_ERR_NOMEM, "state store: out of memory"); }
    }
    s->cfg.paths = NULL; /* owned copies in s->paths */
    s->cfg.path_weight = NULL;
    snprintf(s->manifest, sizeof s->manifest, "%s/%s.manifest", s->paths[0], s->name);
    s->segs = malloc(sizeof *s->segs * (size_t)cfg->n_segs);
    if (!s->segs) { st_store_close(s); return st_errf(err, ST_ERR_NOMEM, "state store: out of memory"); }
    memcpy(s->segs, cfg->segs, sizeof *s->segs * (size_t)cfg->n_segs);
    s->n_segs = cfg->n_segs;
    qsort(s->segs, (size_t)s->n_segs, sizeof *s->segs, seg_cmp);
    for (int i = 0; i < s->n_segs; i++) {
        if (i && s->segs[i - 1].offset + s->segs[i - 1].n > s->segs[i].offset) {
            st_store_close(s);
            return st_errf(err, ST_ERR_INVALID, "state store: parameter segments overlap at element %zu",
                           s->segs[i].offset);
        }
        if (s->segs[i].offset + s->segs[i].n > s->numel) s->numel = s->segs[i].offset + s->segs[i].n;
    }
    s->cfg.segs = s->segs;
    *out = s;
    return ST_OK;
}

/* The subgroup buffers a laid-out store takes from its host budget (0: 1 GiB): as many regions as
 * the budget holds, at most one per subgroup and 64 (the io engine registers up to 64 buffers);
 * a reader stages one region at a time. */
static uint64_t buffer_count(const st_store *s) {
    uint64_t budget = s->cfg.host_budget ? s->cfg.host_budget : 1ull << 30;
    uint64_t nb = s->readonly ? 1 : budget / s->max_region;
    if (nb > (uint64_t)s->n_sg) nb = (uint64_t)s->n_sg;
    return nb > 64 ? 64 : nb;
}

/* The pipeline needs 3 buffers (fewer subgroups: one each); a reader, one. */
static st_status buffers_enough(const st_store *s, uint64_t nb, st_err *err) {
    int need = s->readonly ? 1 : s->n_sg < 3 ? s->n_sg : 3;
    if (nb >= (uint64_t)need) return ST_OK;
    return st_errf(err, ST_ERR_NOMEM,
                   "state store: host budget %llu bytes holds %llu subgroup buffers of %llu bytes; the pipeline "
                   "needs %d: raise the host budget to at least %llu bytes or use smaller subgroups",
                   (unsigned long long)(s->cfg.host_budget ? s->cfg.host_budget : 1ull << 30), (unsigned long long)nb,
                   (unsigned long long)s->max_region, need, (unsigned long long)(need * s->max_region));
}

st_status st_store_plan(const st_store_config *cfg, uint64_t *path_bytes, uint64_t *host_bytes, st_err *err) {
    st_store *s;
    st_status st = store_alloc(&s, cfg, err);
    if (st) return st;
    if (!(st = store_layout(s, err))) {
        for (int p = 0; p < cfg->n_paths; p++) path_bytes[p] = s->path_bytes[p];
        if (host_bytes) *host_bytes = buffer_count(s) * s->max_region;
    }
    st_store_close(s);
    return st;
}

st_status st_store_rollback(const st_store_config *cfg, st_err *err) {
    char m[4400], prev[4500];
    snprintf(m, sizeof m, "%s/%s.manifest", cfg->paths[0], cfg->name ? cfg->name : "strata-state");
    snprintf(prev, sizeof prev, "%s.prev", m);
    if (access(prev, R_OK) != 0)
        return st_errf(err, ST_ERR_IO, "%s: no previous commit to return to (%s); the store was created with in_place, "
                       "or has committed once", prev, strerror(errno));
    if (rename(prev, m) != 0)
        return st_errf(err, ST_ERR_IO, "cannot return %s to its previous commit: %s", m, strerror(errno));
    return st_fsync_dir(cfg->paths[0], err);
}

int st_store_exists(const st_store_config *cfg) {
    if (!cfg || !cfg->paths || cfg->n_paths < 1) return 0;
    char m[4400];
    snprintf(m, sizeof m, "%s/%s.manifest", cfg->paths[0], cfg->name ? cfg->name : "strata-state");
    return access(m, F_OK) == 0;
}

/* ------------------------------------------------------------------ buffers and io */

static st_status buffers_create(st_store *s, st_err *err) {
    uint64_t nb = buffer_count(s);
    st_status st = buffers_enough(s, nb, err);
    if (st) return st;
    s->buf = calloc(nb, sizeof *s->buf);
    if (!s->buf) return st_errf(err, ST_ERR_NOMEM, "state store: out of memory");
    s->n_buf = (int)nb;
    for (int b = 0; b < s->n_buf; b++) {
        s->buf[b].sg = -1;
        s->buf[b].data = st_io_alloc(s->max_region);
        if (!s->buf[b].data)
            return st_errf(err, ST_ERR_NOMEM, "state store: cannot allocate %d buffers of %llu bytes", s->n_buf,
                           (unsigned long long)s->max_region);
        st_err e2 = {0};
        if (st_io_register_buffer(s->io, s->buf[b].data, s->max_region, &e2) != ST_OK)
            st_log(2, "state store: buffer %d not registered: %s\n", b, e2.msg);
    }
    return ST_OK;
}

static st_status io_open(st_store *s, int existing, st_err *err) {
    char fname[300];
    snprintf(fname, sizeof fname, "%s.bin", s->name);
    /* every path's size starts with its header block, so none is zero */
    st_io_config ic = {.paths = (const char *const *)s->paths, .n_paths = s->cfg.n_paths, .file_name = fname,
                       .path_file_bytes = s->path_bytes, .keep_files = 1, .open_existing = existing,
                       .kind = s->cfg.io_kind, .request_bytes = 1u << 20};
    return st_io_engine_create(&s->io, &ic, err);
}

static st_status wait_ticket(st_store *s, uint64_t *t, double *acc, st_err *err) {
    if (!*t) return ST_OK;
    double t0 = st_now();
    st_status st = st_io_wait(s->io, *t, err);
    *t = 0;
    if (acc) *acc += st_now() - t0;
    return st;
}

static void crc_region(const subgroup *g, const char *data, uint32_t *out) {
#pragma omp parallel for schedule(static) if (g->n_crc > 1)
    for (int k = 0; k < g->n_crc; k++) {
        uint64_t lo = (uint64_t)k * ST_STORE_CRC_BLOCK;
        uint64_t hi = lo + ST_STORE_CRC_BLOCK < g->bytes ? lo + ST_STORE_CRC_BLOCK : g->bytes;
        out[k] = st_crc32c(0, data + lo, hi - lo);
    }
}

static st_status verify_region(st_store *s, const subgroup *g, const char *data, st_err *err) {
    uint32_t stackc[64], *c = g->n_crc <= 64 ? stackc : malloc(sizeof *c * (size_t)g->n_crc);
    if (!c) return st_errf(err, ST_ERR_NOMEM, "state store: out of memory");
    crc_region(g, data, c);
    st_status st = ST_OK;
    for (int k = 0; k < g->n_crc; k++)
        if (c[k] != g->crc[k]) {
            uint64_t lo = g->off[g->cur] + (uint64_t)k * ST_STORE_CRC_BLOCK;
            uint64_t len = g->bytes - (uint64_t)k * ST_STORE_CRC_BLOCK;
            if (len > ST_STORE_CRC_BLOCK) len = ST_STORE_CRC_BLOCK;
            st = st_errf(err, ST_ERR_CHECKSUM,
                         "%s: bytes [%llu, %llu) do not match their checksum (subgroup %d, elements [%zu, %zu), "
                         "step %llu): the state file was changed or the disk returned bad data; restore the run "
                         "from a checkpoint",
                         st_io_engine_file(s->io, g->path), (unsigned long long)lo, (unsigned long long)(lo + len),
                         (int)(g - s->sg), g->first, g->end, (unsigned long long)s->step);
            break;
        }
    if (c != stackc) free(c);
    return st;
}

/* ------------------------------------------------------------------ manifest */

typedef struct mbuf {
    unsigned char *p;
    size_t n, cap;
} mbuf;

static int mput(mbuf *m, const void *d, size_t n) {
    if (m->n + n > m->cap) {
        size_t c = m->cap ? m->cap * 2 : 4096;
        while (c < m->n + n) c *= 2;
        unsigned char *q = realloc(m->p, c);
        if (!q) return -1;
        m->p = q;
        m->cap = c;
    }
    memcpy(m->p + m->n, d, n);
    m->n += n;
    return 0;
}
#define PUT(m, v) mput((m), &(v), sizeof(v))

/* The manifest for the current in-memory state (cur and crc of every subgroup). */
static st_status manifest_write(st_store *s, int dirty, st_err *err) {
    mbuf m = {0};
    uint32_t ver = MANIFEST_VERSION, fmt = (uint32_t)s->cfg.fmt, nseg = (uint32_t)s->n_segs,
             np = (uint32_t)s->cfg.n_paths, nsg = (uint32_t)s->n_sg, inpl = (uint32_t)!!s->cfg.in_place,
             dty = (uint32_t)dirty, bb = (uint32_t)s->blob_bytes;
    uint64_t numel = s->numel, commits = s->commits + 1;
    int bad = mput(&m, MANIFEST_MAGIC, 8) | PUT(&m, ver) | PUT(&m, fmt) | PUT(&m, numel) | PUT(&m, nseg) |
              PUT(&m, np) | PUT(&m, nsg) | PUT(&m, inpl) | PUT(&m, s->step) | PUT(&m, dty) | PUT(&m, bb) |
              PUT(&m, commits) | PUT(&m, s->id);
    for (int i = 0; i < s->n_segs; i++) {
        uint64_t o = s->segs[i].offset, n = s->segs[i].n;
        bad |= PUT(&m, o) | PUT(&m, n);
    }
    for (int p = 0; p < s->cfg.n_paths; p++) bad |= PUT(&m, s->path_bytes[p]);
    for (int i = 0; i < s->n_sg; i++) {
        subgroup *g = &s->sg[i];
        uint64_t f = g->first, e = g->end;
        uint32_t path = (uint32_t)g->path, cur = (uint32_t)g->cur, nc = (uint32_t)g->n_crc;
        bad |= PUT(&m, f) | PUT(&m, e) | PUT(&m, path) | PUT(&m, cur) | PUT(&m, g->off[0]) | PUT(&m, g->off[1]) |
               PUT(&m, g->bytes) | PUT(&m, nc) | mput(&m, g->crc, sizeof *g->crc * (size_t)g->n_crc);
    }
    if (s->blob_bytes) bad |= mput(&m, s->blob, s->blob_bytes);
    uint32_t crc = st_crc32c(0, m.p, m.n);
    bad |= PUT(&m, crc);
    if (bad) {
        free(m.p);
        return st_errf(err, ST_ERR_NOMEM, "state store: out of memory for the manifest");
    }
    /* two regions: the commit being replaced stays as NAME.manifest.prev (a hard link made
     * once the new manifest is whole and synced, just before it is renamed into place: a
     * full disk fails the commit before anything changes, and there is never an instant
     * without a manifest). Its regions are intact until the next step writes them, and
     * st_store_rollback returns to it: ranks that must agree on a step. */
    st_file_writer w;
    st_status st = st_file_writer_open(&w, s->manifest, err);
    if (!st && !s->cfg.in_place && s->commits > 0) snprintf(w.keep_prev, sizeof w.keep_prev, "%s.prev", s->manifest);
    if (!st) {
        st = st_file_writer_put(&w, m.p, m.n, err);
        st = st_file_writer_close(&w, st, err);
    }
    free(m.p);
    if (st) return st_err_prefix(err, "state store: committing step %llu", (unsigned long long)s->step);
    s->commits++;
    return ST_OK;
}

typedef struct mread {
    const unsigned char *p;
    size_t n, at;
    const char *file;
} mread;

static int mget(mread *r, void *d, size_t n) {
    if (r->at + n > r->n) return -1;
    memcpy(d, r->p + r->at, n);
    r->at += n;
    return 0;
}
#define GET(r, v) mget((r), &(v), sizeof(v))

typedef struct manifest_head {
    uint32_t fmt, nseg, np, nsg, inpl, dty, bb;
    uint64_t numel, step, commits, id;
} manifest_head;

/* Read a manifest whole, check its magic, checksum and version, and parse its header;
 * *r is left at the segment table, over *buf (the caller frees it). */
static st_status manifest_load(const char *path, unsigned char **buf, mread *r, manifest_head *h, st_err *err) {
    *buf = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return st_errf(err, ST_ERR_IO, "%s: cannot open the state manifest: %s", path, strerror(errno));
    unsigned char *p = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? cap * 2 : 65536;
            unsigned char *q = realloc(p, cap);
            if (!q) { free(p); fclose(f); return st_errf(err, ST_ERR_NOMEM, "state store: out of memory"); }
            p = q;
        }
        size_t got = fread(p + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    int fault = st_iofault("file.read", path);
    if (fault == ST_IOFAULT_SHORT) n /= 2;
    if (ferror(f) || fault > 0) {
        int en = fault > 0 ? fault : errno;
        fclose(f);
        free(p);
        return st_errf(err, ST_ERR_IO, "%s: reading the state manifest failed at byte %zu: %s", path, n, strerror(en));
    }
    fclose(f);
    *buf = p;
    uint32_t crc, ver;
    if (n < 80 || memcmp(p, MANIFEST_MAGIC, 8))
        return st_errf(err, ST_ERR_FORMAT, "%s: not a strata state manifest (%zu bytes, bad magic)", path, n);
    memcpy(&crc, p + n - 4, 4);
    if (st_crc32c(0, p, n - 4) != crc)
        return st_errf(err, ST_ERR_CHECKSUM, "%s: the manifest does not match its checksum (%zu bytes): it was changed "
                       "after it was written; restore the run from a checkpoint", path, n);
    *r = (mread){p, n - 4, 8, path};
    if (GET(r, ver) || ver != MANIFEST_VERSION)
        return st_errf(err, ST_ERR_FORMAT, "%s: manifest version %u, this strata reads %u", path, ver, MANIFEST_VERSION);
    if (GET(r, h->fmt) || GET(r, h->numel) || GET(r, h->nseg) || GET(r, h->np) || GET(r, h->nsg) || GET(r, h->inpl) ||
        GET(r, h->step) || GET(r, h->dty) || GET(r, h->bb) || GET(r, h->commits) || GET(r, h->id))
        return st_errf(err, ST_ERR_TRUNCATED, "%s: the manifest ends inside its header", path);
    if (h->np > ST_STORE_MAX_PATHS)
        return st_errf(err, ST_ERR_FORMAT, "%s: the manifest names %u paths; at most %d", path, h->np,
                       ST_STORE_MAX_PATHS);
    if (h->fmt > ST_OPTIM_STATE_8BIT_FP)
        return st_errf(err, ST_ERR_FORMAT, "%s: state format number %u at offset 12; this strata knows 0 (f32), 1 "
                       "(8bit) and 2 (8bit-fp): a newer strata wrote it, or the file is not a state manifest", path,
                       h->fmt);
    return ST_OK;
}

static st_status manifest_read(st_store *s, st_err *err) {
    unsigned char *p;
    mread r;
    manifest_head h;
    st_status st = manifest_load(s->manifest, &p, &r, &h, err);
    if (st) goto out;
    uint32_t fmt = h.fmt, nseg = h.nseg, np = h.np, nsg = h.nsg, inpl = h.inpl, dty = h.dty, bb = h.bb;
    uint64_t numel = h.numel;
    s->step = h.step;
    s->commits = h.commits;
    s->id = h.id;
    if (fmt != (uint32_t)s->cfg.fmt || numel != s->numel || nseg != (uint32_t)s->n_segs)
        { st = st_errf(err, ST_ERR_SHAPE, "%s: the store holds %s states of %llu parameters in %u tensors; this run has "
                       "%s states of %zu in %d: resume with the same model and optim_state, or start a new store",
                       s->manifest, st_optim_state_name((st_optim_state_format)fmt), (unsigned long long)numel, nseg,
                       st_optim_state_name(s->cfg.fmt), s->numel, s->n_segs); goto out; }
    if (np != (uint32_t)s->cfg.n_paths)
        { st = st_errf(err, ST_ERR_INVALID, "%s: the store spans %u paths; this run names %d: give the same paths",
                       s->manifest, np, s->cfg.n_paths); goto out; }
    if (dty)
        { st = st_errf(err, ST_ERR_FORMAT, "%s: the store was being updated in place (step %llu) when its process "
                       "stopped: the state is torn and cannot be used; restore the run from a checkpoint (the default "
                       "two-region mode survives crashes)", s->manifest, (unsigned long long)s->step + 1); goto out; }
    if (bb > ST_STORE_MAX_BLOB)
        { st = st_errf(err, ST_ERR_FORMAT, "%s: a caller blob of %u bytes; at most %u", s->manifest, bb,
                       ST_STORE_MAX_BLOB); goto out; }
    s->cfg.in_place = (int)inpl;
    for (uint32_t i = 0; i < nseg; i++) {
        uint64_t o, len;
        if (GET(&r, o) || GET(&r, len)) goto trunc;
        if (o != s->segs[i].offset || len != s->segs[i].n)
            { st = st_errf(err, ST_ERR_SHAPE, "%s: tensor %u is elements [%llu, +%llu) in the store, [%zu, +%zu) in this "
                           "run: resume with the same model", s->manifest, i, (unsigned long long)o,
                           (unsigned long long)len, s->segs[i].offset, s->segs[i].n); goto out; }
    }
    for (uint32_t p2 = 0; p2 < np; p2++)
        if (GET(&r, s->path_bytes[p2])) goto trunc;
    s->sg = calloc(nsg ? nsg : 1, sizeof *s->sg);
    if (!s->sg) { st = st_errf(err, ST_ERR_NOMEM, "state store: out of memory"); goto out; }
    for (uint32_t i = 0; i < nsg; i++) {
        subgroup *g = &s->sg[i];
        uint64_t fst, end, bytes;
        uint32_t path, cur, nc;
        if (GET(&r, fst) || GET(&r, end) || GET(&r, path) || GET(&r, cur) || GET(&r, g->off[0]) ||
            GET(&r, g->off[1]) || GET(&r, bytes) || GET(&r, nc))
            goto trunc;
        if (path >= np || cur > 1 || fst >= end || end > numel)
            { st = st_errf(err, ST_ERR_FORMAT, "%s: subgroup %u is malformed (path %u, region %u, elements [%llu, %llu))",
                           s->manifest, i, path, cur, (unsigned long long)fst, (unsigned long long)end); goto out; }
        g->first = (size_t)fst;
        g->end = (size_t)end;
        s->n_sg = (int)i + 1;
        if ((st = sg_build(g, s->segs, s->n_segs, s->cfg.fmt, err))) goto out;
        if (g->bytes != bytes || (uint32_t)g->n_crc != nc)
            { st = st_errf(err, ST_ERR_FORMAT, "%s: subgroup %u has %llu bytes on disk; this strata lays it out in "
                           "%llu", s->manifest, i, (unsigned long long)bytes, (unsigned long long)g->bytes); goto out; }
        g->path = (int)path;
        g->cur = (int)cur;
        if (mget(&r, g->crc, sizeof *g->crc * nc)) goto trunc;
        if (g->off[1] + bytes > s->path_bytes[path] || g->off[0] + bytes > s->path_bytes[path])
            { st = st_errf(err, ST_ERR_FORMAT, "%s: subgroup %u lies past the end of its file", s->manifest, i); goto out; }
        if (g->bytes > s->max_region) s->max_region = g->bytes;
    }
    s->blob = malloc(bb ? bb : 1);
    if (!s->blob || mget(&r, s->blob, bb)) goto trunc;
    s->blob_bytes = bb;
    if (r.at != r.n) goto trunc;
    goto out;
trunc:
    st = st_errf(err, ST_ERR_TRUNCATED, "%s: the manifest ends early or has trailing bytes (offset %zu of %zu)",
                 s->manifest, r.at, r.n);
out:
    free(p);
    return st;
}

st_status st_store_inspect(const char *manifest, FILE *out, st_err *err) {
    unsigned char *p;
    mread r;
    manifest_head h;
    st_status st = manifest_load(manifest, &p, &r, &h, err);
    if (st) goto out;
    r.at += (size_t)h.nseg * 16;
    uint64_t fb[ST_STORE_MAX_PATHS] = {0}, used[ST_STORE_MAX_PATHS] = {0}, maxr = 0;
    int per[ST_STORE_MAX_PATHS] = {0};
    for (uint32_t q = 0; q < h.np; q++)
        if (GET(&r, fb[q])) goto trunc;
    for (uint32_t i = 0; i < h.nsg; i++) {
        uint64_t fst, end, o0, o1, bytes;
        uint32_t path, cur, nc;
        if (GET(&r, fst) || GET(&r, end) || GET(&r, path) || GET(&r, cur) || GET(&r, o0) || GET(&r, o1) ||
            GET(&r, bytes) || GET(&r, nc) || path >= h.np)
            goto trunc;
        r.at += (size_t)nc * 4;
        per[path]++;
        used[path] += bytes;
        if (bytes > maxr) maxr = bytes;
    }
    fprintf(out, "%s: strata state store %016llx, step %llu (%llu commits)%s\n", manifest, (unsigned long long)h.id,
            (unsigned long long)h.step, (unsigned long long)h.commits, h.dty ? ", TORN: an in-place update was interrupted" : "");
    fprintf(out, "  %llu parameters in %u tensors, %s states (fp32 master weights + moments), %s\n",
            (unsigned long long)h.numel, h.nseg, st_optim_state_name((st_optim_state_format)h.fmt),
            h.inpl ? "one region per subgroup (in place, not crash-safe)" : "two regions per subgroup (crash-safe)");
    fprintf(out, "  %u subgroups of up to %.1f MiB, a CRC-32C per MiB; caller state %u bytes\n", h.nsg,
            (double)maxr / 1048576.0, h.bb);
    for (uint32_t q = 0; q < h.np; q++)
        fprintf(out, "  path %u: %d subgroups, %.3f GB of state, file %.3f GB\n", q, per[q], (double)used[q] / 1e9,
                (double)fb[q] / 1e9);
    goto out;
trunc:
    st = st_errf(err, ST_ERR_TRUNCATED, "%s: the manifest ends early (offset %zu)", manifest, r.at);
out:
    free(p);
    return st;
}

/* ------------------------------------------------------------------ create / open */

double st_store_bytes_per_param(st_optim_state_format fmt) {
    return fmt == ST_OPTIM_STATE_F32 ? 12.0 : 4.0 + 2.0 + 8.0 / ST_OPTIM_Q8_BLOCK;
}

st_status st_store_space(const st_store_config *cfg, const uint64_t *need, uint64_t *avail, uint64_t *fs_need,
                         st_err *err) {
    unsigned long fsid[ST_STORE_MAX_PATHS];
    int group[ST_STORE_MAX_PATHS], nfs = 0;
    uint64_t g_avail[ST_STORE_MAX_PATHS] = {0}, g_need[ST_STORE_MAX_PATHS] = {0};
    const char *name = cfg->name ? cfg->name : "strata-state";
    for (int p = 0; p < cfg->n_paths; p++) {
        struct statvfs vs;
        if (statvfs(cfg->paths[p], &vs) != 0)
            return st_errf(err, ST_ERR_IO, "state store: %s: statvfs: %s", cfg->paths[p], strerror(errno));
        /* a leftover file of an interrupted create already holds its blocks */
        char f[4400];
        struct stat sb;
        snprintf(f, sizeof f, "%s/%s.bin", cfg->paths[p], name);
        uint64_t have = stat(f, &sb) == 0 ? (uint64_t)sb.st_blocks * 512u : 0;
        int k = 0;
        while (k < nfs && fsid[k] != vs.f_fsid) k++;
        if (k == nfs) {
            fsid[nfs++] = vs.f_fsid;
            g_avail[k] = (uint64_t)vs.f_bavail * vs.f_frsize;
        }
        group[p] = k;
        g_avail[k] += have;
        g_need[k] += need[p];
    }
    for (int p = 0; p < cfg->n_paths; p++) {
        avail[p] = g_avail[group[p]];
        fs_need[p] = g_need[group[p]];
    }
    return ST_OK;
}

static st_status check_space(st_store *s, st_err *err) {
    uint64_t avail[ST_STORE_MAX_PATHS], need[ST_STORE_MAX_PATHS];
    st_store_config c = s->cfg;
    c.paths = (const char *const *)s->paths;
    c.name = s->name;
    st_status st = st_store_space(&c, s->path_bytes, avail, need, err);
    if (st) return st;
    for (int p = 0; p < s->cfg.n_paths; p++) /* the first path of a filesystem that is short */
        if (need[p] > avail[p])
            return st_errf(err, ST_ERR_NOSPACE,
                           "state store: %s needs %llu bytes for the optimizer state (%s) but its filesystem has %llu "
                           "free: %llu bytes missing; free space, add a path, use 8-bit states%s",
                           s->paths[p], (unsigned long long)need[p],
                           s->cfg.in_place ? "one region per subgroup" : "two regions per subgroup, for crash safety",
                           (unsigned long long)avail[p], (unsigned long long)(need[p] - avail[p]),
                           s->cfg.in_place ? "" : ", or update in place (half the disk, not crash-safe)");
    return ST_OK;
}

/* The header block of every path's file: written at create, checked at open. */
static st_status file_headers(st_store *s, int write, st_err *err) {
    unsigned char *h = st_io_alloc(FILE_HEADER);
    if (!h) return st_errf(err, ST_ERR_NOMEM, "state store: out of memory");
    st_status st = ST_OK;
    for (int p = 0; p < s->cfg.n_paths && !st; p++) {
        uint32_t ver = 1, idx = (uint32_t)p, np = (uint32_t)s->cfg.n_paths;
        if (write) {
            memset(h, 0, FILE_HEADER);
            memcpy(h, FILE_MAGIC, 8);
            memcpy(h + 8, &ver, 4);
            memcpy(h + 12, &idx, 4);
            memcpy(h + 16, &s->id, 8);
            memcpy(h + 24, &np, 4);
            uint64_t t;
            if (!(st = st_io_write(s->io, p, 0, h, FILE_HEADER, &t, err))) st = st_io_wait(s->io, t, err);
            continue;
        }
        /* before the io engine opens them (its size check would blame the wrong file) */
        char fn[4400];
        snprintf(fn, sizeof fn, "%s/%s.bin", s->paths[p], s->name);
        int fd = open(fn, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            st = st_errf(err, ST_ERR_IO, "%s: cannot open the state file: %s (was the store moved or removed?)", fn,
                         strerror(errno));
            break;
        }
        ssize_t got = pread(fd, h, FILE_HEADER, 0);
        close(fd);
        if (got != (ssize_t)FILE_HEADER) {
            st = st_errf(err, ST_ERR_TRUNCATED, "%s: the state file ends at %zd bytes, inside its header", fn, got);
            break;
        }
        uint64_t id;
        memcpy(&ver, h + 8, 4);
        memcpy(&idx, h + 12, 4);
        memcpy(&id, h + 16, 8);
        if (memcmp(h, FILE_MAGIC, 8) || ver != 1)
            st = st_errf(err, ST_ERR_FORMAT, "%s: not a strata state file (bad magic at offset 0)", fn);
        else if (id != s->id || idx != (uint32_t)p)
            st = st_errf(err, ST_ERR_INVALID, "%s: this file is path %u of store %016llx; the manifest %s wants "
                         "path %d of store %016llx here: give the paths in the order the store was created with",
                         fn, idx, (unsigned long long)id, s->manifest, p, (unsigned long long)s->id);
    }
    st_io_free(h);
    return st;
}

/* Temporaries of manifest commits a killed process left behind. */
static void remove_stale_tmp(const st_store *s) {
    char pat[4500];
    snprintf(pat, sizeof pat, "%s.tmp.*", s->manifest);
    glob_t g;
    if (glob(pat, GLOB_NOSORT, NULL, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; i++) unlink(g.gl_pathv[i]);
        globfree(&g);
    }
}

static uint64_t new_store_id(void) {
    st_rng r;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    st_rng_seed(&r, (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ ((uint64_t)getpid() << 16));
    return st_rng_u64(&r);
}

/* Every path's NAME.lock, held while the store is open: two processes on one store (or
 * sharing one of its paths) would interleave regions and manifests beyond repair. Readers
 * share it: any number of them, never beside a writer. */
static st_status lock_paths(st_store *s, st_err *err) {
    for (int p = 0; p < s->cfg.n_paths; p++) {
        char lp[4400];
        snprintf(lp, sizeof lp, "%s/%s.lock", s->paths[p], s->name);
        st_status st = s->readonly ? st_lock_acquire_shared(&s->locks[p], lp, "state store", err)
                                   : st_lock_acquire(&s->locks[p], lp, "state store", err);
        if (st) return st;
    }
    return ST_OK;
}

/* A new store at `step` with `blob`: each subgroup's master weights from init, or its master
 * weights and moments from fill (zero moments otherwise). */
static st_status create_impl(st_store **out, const st_store_config *cfg, st_store_init_fn init, st_store_fill_fn fill,
                             void *ctx, uint64_t step, const void *blob, size_t blob_bytes, st_err *err) {
    *out = NULL;
    if (blob_bytes > ST_STORE_MAX_BLOB)
        return st_errf(err, ST_ERR_INVALID, "state store: blob of %zu bytes; at most %u", blob_bytes,
                       ST_STORE_MAX_BLOB);
    st_store *s;
    st_status st = store_alloc(&s, cfg, err);
    if (st) return st;
    if ((st = lock_paths(s, err))) {
        st_store_close(s);
        return st;
    }
    if (access(s->manifest, F_OK) == 0) {
        st = st_errf(err, ST_ERR_INVALID, "%s: a state store already exists here; resume it, or remove %s and the "
                     "%s.bin files to start over", s->manifest, s->manifest, s->name);
        goto fail;
    }
    s->id = new_store_id();
    remove_stale_tmp(s);
    if ((st = store_layout(s, err)) || (st = check_space(s, err)) || (st = io_open(s, 0, err)) ||
        (st = buffers_create(s, err)) || (st = file_headers(s, 1, err)))
        goto fail;
    /* the first commit: master from init (or master and moments from fill), moments zero
     * otherwise, region 0 of every subgroup; last to first, so the buffers end holding the
     * first subgroups, which the first step visits first */
    for (int j = 0; j < s->n_sg && !st; j++) {
        int i = s->n_sg - 1 - j;
        subgroup *g = &s->sg[i];
        sbuf *b = &s->buf[j % s->n_buf];
        if ((st = wait_ticket(s, &b->wt, NULL, err))) break;
        if (b->sg >= 0) s->sg[b->sg].buf = -1;
        b->sg = -1;
        memset(b->data, 0, g->bytes);
        if (init) init(ctx, g->first, g->end - g->first, (float *)b->data);
        if (fill) {
            void *mom[MAX_STATE_BUFS];
            for (int k = 0; k < st_optim_state_count(g->o); k++) mom[k] = b->data + g->part[1 + k];
            if ((st = fill(ctx, g->first, g->end - g->first, (float *)b->data, mom, st_optim_state_count(g->o), err)))
                break;
        }
        crc_region(g, b->data, g->crc);
        g->cur = 0;
        st = st_io_write(s->io, g->path, g->off[0], b->data, g->bytes, &b->wt, err);
        b->sg = i;
        g->buf = (int)(b - s->buf);
        b->last_use = ++s->use_clock;
    }
    for (int b = 0; b < s->n_buf; b++) {
        st_err e2 = {0};
        st_status s2 = wait_ticket(s, &s->buf[b].wt, NULL, &e2);
        if (s2 && !st) { st = s2; *err = e2; }
    }
    for (int p = 0; p < s->cfg.n_paths && !st; p++) st = st_io_sync(s->io, p, err);
    /* the files' directory entries are durable before the manifest names them */
    for (int p = 0; p < s->cfg.n_paths && !st; p++) st = st_fsync_dir(s->paths[p], err);
    if (fill) st_failpoint("store_filled"); /* a re-shard's regions written, no manifest yet */
    if (!st && blob_bytes) {
        if (!(s->blob = malloc(blob_bytes))) st = st_errf(err, ST_ERR_NOMEM, "state store: out of memory");
        else memcpy(s->blob, blob, blob_bytes);
        s->blob_bytes = blob_bytes;
    }
    s->step = step;
    if (st || (st = manifest_write(s, 0, err))) goto fail;
    st_log(1, "state store: %d subgroups of up to %.1f MiB on %d path(s), %d host buffers (%.1f MiB), %s%s\n", s->n_sg,
           (double)s->max_region / 1048576.0, s->cfg.n_paths, s->n_buf,
           (double)s->n_buf * (double)s->max_region / 1048576.0, st_optim_state_name(s->cfg.fmt),
           s->cfg.in_place ? ", in place" : "");
    *out = s;
    return ST_OK;
fail:
    if (s->io) { /* no manifest: the files hold nothing anyone can use */
        for (int p = 0; p < s->cfg.n_paths; p++) {
            const char *f = st_io_engine_file(s->io, p);
            if (f && access(s->manifest, F_OK) != 0) unlink(f);
        }
    }
    st_store_close(s);
    return st;
}

st_status st_store_create(st_store **out, const st_store_config *cfg, st_store_init_fn init, void *ctx,
                          st_err *err) {
    return create_impl(out, cfg, init, NULL, ctx, 0, NULL, 0, err);
}

st_status st_store_create_filled(st_store **out, const st_store_config *cfg, st_store_fill_fn fill, void *ctx,
                                 uint64_t step, const void *blob, size_t blob_bytes, st_err *err) {
    if (!fill) return st_errf(err, ST_ERR_INVALID, "state store: st_store_create_filled needs a fill callback");
    return create_impl(out, cfg, NULL, fill, ctx, step, blob, blob_bytes, err);
}

static st_status open_impl(st_store **out, const st_store_config *cfg, int readonly, int previous, st_err *err) {
    *out = NULL;
    st_store *s;
    st_status st = store_alloc(&s, cfg, err);
    if (st) return st;
    s->readonly = readonly;
    if (previous) { /* NAME.manifest.prev: the commit before the last (st_store_rollback's) */
        size_t n = strlen(s->manifest);
        if (n + 5 >= sizeof s->manifest) {
            st_store_close(s);
            return st_errf(err, ST_ERR_INVALID, "state store: path too long: %s", s->manifest);
        }
        memcpy(s->manifest + n, ".prev", 6);
    }
    if ((st = lock_paths(s, err))) {
        st_store_close(s);
        return st;
    }
    if (!readonly) remove_stale_tmp(s); /* a reader changes nothing */
    if ((st = manifest_read(s, err)) || (st = file_headers(s, 0, err)) || (st = io_open(s, 1, err)) ||
        (st = buffers_create(s, err))) {
        st_store_close(s);
        return st;
    }
    st_log(readonly ? 2 : 1, "state store: opened %s%s at step %llu (%d subgroups on %d path(s)%s)\n", s->manifest,
           readonly ? " to read" : "", (unsigned long long)s->step, s->n_sg, s->cfg.n_paths,
           s->cfg.in_place ? ", updated in place as it was created: not crash-safe" : "");
    *out = s;
    return ST_OK;
}

st_status st_store_open(st_store **out, const st_store_config *cfg, st_err *err) {
    return open_impl(out, cfg, 0, 0, err);
}

st_status st_store_open_readonly(st_store **out, const st_store_config *cfg, int previous, st_err *err) {
    return open_impl(out, cfg, 1, previous, err);
}

st_status st_store_peek(const st_store_config *cfg, int previous, st_store_info *info, st_err *err) {
    memset(info, 0, sizeof *info);
    if (!cfg || !cfg->paths || cfg->n_paths < 1 || !cfg->paths[0])
        return st_errf(err, ST_ERR_INVALID, "state store: give 1 to %d disk paths", ST_STORE_MAX_PATHS);
    char m[4500];
    snprintf(m, sizeof m, "%s/%s.manifest%s", cfg->paths[0], cfg->name ? cfg->name : "strata-state",
             previous ? ".prev" : "");
    unsigned char *p;
    mread r;
    manifest_head h;
    st_status st = manifest_load(m, &p, &r, &h, err);
    if (!st) {
        info->step = h.step;
        info->numel = h.numel;
        info->fmt = (st_optim_state_format)h.fmt; /* 0 to 2: manifest_load refuses others */
        info->n_paths = (int)h.np;
        info->dirty = (int)h.dty;
    }
    free(p);
    return st;
}

void st_store_close(st_store *s) {
    if (!s) return;
    if (s->buf) {
        for (int b = 0; b < s->n_buf; b++) {
            if (s->buf[b].rt) st_io_wait(s->io, s->buf[b].rt, NULL);
            if (s->buf[b].wt) st_io_wait(s->io, s->buf[b].wt, NULL);
        }
    }
    st_io_engine_destroy(s->io);
    if (s->buf)
        for (int b = 0; b < s->n_buf; b++) st_io_free(s->buf[b].data);
    free(s->buf);
    sg_free_all(s->sg, s->n_sg);
    for (int p = 0; p < ST_STORE_MAX_PATHS; p++) {
        free(s->paths[p]);
        st_lock_release(&s->locks[p]);
    }
    free(s->segs);
    free(s->blob);
    free(s->ord);
    free(s->pos);
    free(s);
}

/* ------------------------------------------------------------------ the step */

static int order_at(const st_store *s, int i) {
    if (s->ord) return s->ord[i];
    return (s->step % 2 == 0) ? i : s->n_sg - 1 - i;
}
static int pos_of(const st_store *s, int g) {
    if (s->pos) return s->pos[g];
    return (s->step % 2 == 0) ? g : s->n_sg - 1 - g;
}

/* This step's order: alternating up and down (so the subgroups updated last stay cached for
 * the next step), or the caller's (the order its gradients land in). */
static st_status set_order(st_store *s, const st_store_step_args *a, st_err *err) {
    int n = s->n_sg;
    if (!s->ord && (!(s->ord = malloc(sizeof *s->ord * (size_t)n)) || !(s->pos = malloc(sizeof *s->pos * (size_t)n)))) {
        free(s->ord);
        s->ord = NULL;
        return st_errf(err, ST_ERR_NOMEM, "state store: out of memory");
    }
    for (int i = 0; i < n; i++) s->ord[i] = (s->step % 2 == 0) ? i : n - 1 - i;
    if (a->order_key) {
        double *key = malloc(sizeof *key * (size_t)n);
        if (!key) return st_errf(err, ST_ERR_NOMEM, "state store: out of memory");
        for (int g = 0; g < n; g++) {
            key[g] = a->order_key(a->ctx, s->sg[g].first, s->sg[g].end);
            s->ord[g] = g;
        }
        for (int i = 1; i < n; i++) { /* insertion sort, stable: a few hundred subgroups */
            int g = s->ord[i], j = i;
            for (; j > 0 && key[s->ord[j - 1]] > key[g]; j--) s->ord[j] = s->ord[j - 1];
            s->ord[j] = g;
        }
        free(key);
    }
    for (int i = 0; i < n; i++) s->pos[s->ord[i]] = i;
    return ST_OK;
}

/* A buffer to read into, not holding any subgroup of the window [lo, hi) of the order:
 * an empty one; else the least recently used of those updated this step; else the
 * resident one needed last. -1 if none. */
static int pick_buffer(const st_store *s, int lo, int hi) {
    int best = -1, best_done = 0;
    long best_key = 0;
    for (int b = 0; b < s->n_buf; b++) {
        const sbuf *x = &s->buf[b];
        if (x->sg < 0) return b;
        int pos = pos_of(s, x->sg);
        if (pos >= lo && pos < hi) continue;
        int done = s->sg[x->sg].done == s->step_id;
        long key = done ? -x->last_use : pos; /* larger is better */
        if (best < 0 || done > best_done || (done == best_done && key > best_key)) {
            best = b;
            best_done = done;
            best_key = key;
        }
    }
    return best;
}

/* How far a step reads ahead of the subgroup it updates: beside a backward (a->wait) every
 * buffer but the current one (from the forward on), else READ_AHEAD, leaving the rest as a
 * cache for the next step. */
static int read_ahead(const st_store *s, const st_store_step_args *a) {
    return a->wait && s->n_buf - 1 > READ_AHEAD ? s->n_buf - 1 : READ_AHEAD;
}

/* Subgroup g into buffer b, in the books (the buffer's old subgroup no longer resident). */
static void assign_buffer(st_store *s, int g, int b) {
    sbuf *x = &s->buf[b];
    if (x->sg >= 0) s->sg[x->sg].buf = -1;
    x->sg = g;
    s->sg[g].buf = b;
}

/* The read-ahead window [i, *next) of a step's order grown towards i + ahead: resident
 * subgroups are passed (a hit where not yet updated this step); returns the next subgroup to
 * read, its buffer in *buf (the caller reads it and moves *next past it), or -1 when the
 * window is full or no buffer is free. */
static int window_next(st_store *s, int i, int *next, int ahead, int *hits, int *buf) {
    for (; *next < s->n_sg && *next <= i + ahead; ++*next) {
        int g = order_at(s, *next);
        if (s->sg[g].buf < 0) return (*buf = pick_buffer(s, i, *next)) < 0 ? -1 : g;
        if (s->sg[g].done != s->step_id) ++*hits;
    }
    return -1;
}

/* A step's reads, predicted: the layout and the buffers st_store_step would have, and the
 * pipeline's own choices (set_order, pick_buffer: this file's code) run over four steps
 * without data, the last two reported. No file is opened. */
st_status st_store_plan_step(const st_store_config *cfg, const st_store_step_args *a, st_store_layout *out,
                             st_err *err) {
    memset(out, 0, sizeof *out);
    st_store *s;
    st_status st = store_alloc(&s, cfg, err);
    if (st) return st;
    if ((st = store_layout(s, err))) goto done;
    uint64_t nb = buffer_count(s);
    if ((st = buffers_enough(s, nb, err))) goto done;
    if (!(s->buf = calloc(nb, sizeof *s->buf))) {
        st = st_errf(err, ST_ERR_NOMEM, "state store: out of memory");
        goto done;
    }
    s->n_buf = (int)nb;
    for (int b = 0; b < s->n_buf; b++) s->buf[b].sg = -1;
    st_store_step_args none = {0};
    if (!a) a = &none;
    int n = s->n_sg, ahead = read_ahead(s, a);
    for (int k = 0; k < 4 && !st; k++) { /* as st_store_step, bookkeeping only */
        s->step = (uint64_t)k;
        if ((st = set_order(s, a, err))) break;
        s->step_id++;
        int *hits = &out->hits[k % 2];
        uint64_t *read = out->read_bytes[k % 2];
        *hits = 0;
        memset(read, 0, sizeof out->read_bytes[0]);
        memset(out->write_bytes, 0, sizeof out->write_bytes);
        for (int i = 0, next = 0, g, b; i < n; i++) {
            for (; (g = window_next(s, i, &next, ahead, hits, &b)) >= 0; next++) {
                assign_buffer(s, g, b); /* stage(), without its read */
                read[s->sg[g].path] += s->sg[g].bytes;
            }
            subgroup *sg = &s->sg[order_at(s, i)];
            out->write_bytes[sg->path] += sg->bytes;
            s->buf[sg->buf].last_use = ++s->use_clock;
            sg->done = s->step_id;
        }
    }
    out->n_subgroups = n;
    out->n_buffers = s->n_buf;
    out->region_bytes = s->max_region;
    out->host_bytes = (uint64_t)s->n_buf * s->max_region;
    for (int p = 0; p < cfg->n_paths; p++) out->path_bytes[p] = s->path_bytes[p];
done:
    st_store_close(s);
    return st;
}

static st_status stage(st_store *s, int g, int b, st_err *err) {
    sbuf *x = &s->buf[b];
    st_status st = wait_ticket(s, &x->wt, &s->stats.write_wait_s, err);
    if (st) return st;
    if (x->rt) { /* a read never checked (an abandoned step's read-ahead): done, its bytes dropped */
        st_io_wait(s->io, x->rt, NULL);
        x->rt = 0;
    }
    assign_buffer(s, g, b);
    subgroup *sg = &s->sg[g];
    return st_io_read(s->io, sg->path, sg->off[sg->cur], x->data, sg->bytes, &x->rt, err);
}

static st_status ensure_loaded(st_store *s, int g, st_err *err) {
    sbuf *x = &s->buf[s->sg[g].buf];
    if (!x->rt) return ST_OK;
    st_prof_span pr = st_prof_begin(ST_PROF_CAT_IO, "state read", g);
    st_status st = wait_ticket(s, &x->rt, &s->stats.read_wait_s, err);
    st_prof_end_bytes(&pr, s->sg[g].bytes);
    if (st) return st;
    double t0 = st_now();
    st = verify_region(s, &s->sg[g], x->data, err);
    s->stats.crc_s += st_now() - t0;
    return st;
}

static st_status finish_writes(st_store *s, st_err *err) {
    st_status st = ST_OK;
    for (int b = 0; b < s->n_buf; b++) {
        st_err e2 = {0};
        st_status s2 = wait_ticket(s, &s->buf[b].wt, &s->stats.write_wait_s, &e2);
        if (s2 && !st) { st = s2; if (err) *err = e2; }
    }
    return st;
}

/* One subgroup's update: its gradient in one dtype, or in runs of segments of one dtype each. */
static st_status update_subgroup(subgroup *sg, char *data, const st_store_step_args *a, const st_adamw_params *hp,
                                 st_err *err) {
    size_t cnt = sg->end - sg->first;
    void *work = a->work ? a->work(a->ctx, sg->first, cnt) : NULL;
    st_optim_step_args oa = {.params = (float *)data, .work = work, .work_dtype = a->work_dtype,
                          .grad_sumsq = a->grad_sumsq};
    if (!a->grad_dtype_of) {
        oa.grads = a->grads(a->ctx, sg->first, cnt);
        oa.grad_dtype = a->grad_dtype;
        return st_optim_step_ex(sg->o, &oa, hp, err);
    }
    for (int k = 0; k < sg->n_pc;) {
        st_dtype dt = a->grad_dtype_of(a->ctx, sg->first + sg->pc_first[k]);
        int e = k + 1;
        while (e < sg->n_pc && a->grad_dtype_of(a->ctx, sg->first + sg->pc_first[e]) == dt) e++;
        oa.grads = a->grads_as(a->ctx, sg->first, cnt, dt);
        oa.grad_dtype = dt;
        oa.seg_begin = k;
        oa.seg_end = e;
        st_status st = st_optim_step_ex(sg->o, &oa, hp, err);
        if (st) return st;
        k = e;
    }
    return ST_OK;
}

/* A subgroup's master weights and moments of the class a->reset_class, reset as asked (its
 * optimizer bound to the staged buffer), before its update. */
static st_status reset_subgroup(const st_store *s, subgroup *sg, char *data, const st_store_step_args *a,
                                st_err *err) {
    if (a->reset_master)
        for (int i = 0; i < s->n_segs; i++) {
            const st_optim_segment *sgm = &s->segs[i];
            size_t lo = sgm->offset > sg->first ? sgm->offset : sg->first;
            size_t hi = sgm->offset + sgm->n < sg->end ? sgm->offset + sgm->n : sg->end;
            if (sgm->lr_class == a->reset_class && lo < hi)
                memset((float *)data + (lo - sg->first), 0, (hi - lo) * sizeof(float));
        }
    return a->reset_moments ? st_optim_reset_class(sg->o, a->reset_class, NULL, err) : ST_OK;
}

st_status st_store_step(st_store *s, const st_store_step_args *a, const st_adamw_params *hp, st_err *err) {
    if (s->readonly)
        return st_errf(err, ST_ERR_INVALID, "state store %s: opened to read; it takes no step", s->manifest);
    if (s->failed)
        return st_errf(err, ST_ERR_INVALID, "state store %s: an earlier step failed; close and open the store again "
                       "(the disk holds step %llu)", s->manifest, (unsigned long long)s->step);
    if (!a || (a->grad_dtype_of ? !a->grads_as : !a->grads))
        return st_errf(err, ST_ERR_INVALID, "state store: the step needs a gradient source (grads, or grad_dtype_of "
                       "with grads_as)");
    if (a->blob_bytes > ST_STORE_MAX_BLOB)
        return st_errf(err, ST_ERR_INVALID, "state store: blob of %zu bytes; at most %u", a->blob_bytes,
                       ST_STORE_MAX_BLOB);
    if (!isfinite(a->grad_sumsq) || a->grad_sumsq < 0)
        return st_errf(err, ST_ERR_NONFINITE, "state store: gradient sum of squares %g; step skipped, nothing read "
                       "or written", a->grad_sumsq);
    if (a->commit && s->cfg.in_place)
        return st_errf(err, ST_ERR_INVALID, "state store %s: an in-place store (one region per subgroup) cannot take "
                       "a step that may be abandoned: its writes replace the committed state", s->manifest);
    double t0 = st_now();
    memset(&s->stats, 0, sizeof s->stats); /* this step's figures */
    st_status st = set_order(s, a, err);
    if (st) return st;
    s->step_id++;
    int abandon = 0;
    if (s->cfg.in_place && (st = manifest_write(s, 1, err))) return st; /* nothing written yet: not failed */
    int n = s->n_sg, next = 0;
    int ahead = read_ahead(s, a);
    for (int i = 0; i < n && !st; i++) {
        /* read ahead: the window [i, next) is staged or resident */
        for (int g, b; (g = window_next(s, i, &next, ahead, &s->stats.hits, &b)) >= 0; next++) {
            if ((st = stage(s, g, b, err))) break;
            s->stats.misses++;
            s->stats.read_bytes += s->sg[g].bytes;
        }
        if (st) break;
        int g = order_at(s, i);
        subgroup *sg = &s->sg[g];
        if (sg->buf < 0) { /* cannot happen with >= 1 buffer: the window starts at i */
            st = st_errf(err, ST_ERR_INVALID, "state store: internal error: subgroup %d not staged", g);
            break;
        }
        sbuf *x = &s->buf[sg->buf];
        if ((st = ensure_loaded(s, g, err))) break;
        if ((st = wait_ticket(s, &x->wt, &s->stats.write_wait_s, err))) break;
        void *bufs[MAX_STATE_BUFS];
        for (int k = 0; k < st_optim_state_count(sg->o); k++) bufs[k] = x->data + sg->part[1 + k];
        st_optim_bind_state(sg->o, bufs);
        size_t cnt = sg->end - sg->first;
        if (a->wait) { /* its gradients are still being computed */
            double tg = st_now();
            st_prof_span pg = st_prof_begin(ST_PROF_CAT_OPTIM, "state wait grads", g);
            st = a->wait(a->ctx, sg->first, cnt, err);
            st_prof_end(&pg);
            s->stats.grad_wait_s += st_now() - tg;
            if (st) {
                abandon = 1; /* nothing committed: the store stays at its last step */
                break;
            }
        }
        double tu = st_now();
        st_prof_span pu = st_prof_begin(ST_PROF_CAT_OPTIM, "state update", g);
        st = reset_subgroup(s, sg, x->data, a, err);
        if (!st) st = update_subgroup(sg, x->data, a, hp, err);
        st_prof_end(&pu);
        double tc = st_now();
        s->stats.update_s += tc - tu;
        if (st) break;
        crc_region(sg, x->data, sg->crc_new);
        s->stats.crc_s += st_now() - tc;
        int dst = s->cfg.in_place ? sg->cur : sg->cur ^ 1;
        if ((st = st_io_write(s->io, sg->path, sg->off[dst], x->data, sg->bytes, &x->wt, err))) break;
        s->stats.write_bytes += sg->bytes;
        x->last_use = ++s->use_clock;
        sg->done = s->step_id;
    }
    double tw = st_now();
    st_err e2 = {0};
    st_status s2 = finish_writes(s, &e2);
    if (s2 && !st) { st = s2; *err = e2; }
    for (int p = 0; p < s->cfg.n_paths && !st && !abandon; p++) st = st_io_sync(s->io, p, err);
    double tcm = st_now();
    s->stats.write_wait_s += tcm - tw;
    if (!st && !abandon && a->commit) {
        double tg = st_now();
        st_prof_span pg = st_prof_begin(ST_PROF_CAT_OPTIM, "state commit gate", -1);
        abandon = !a->commit(a->ctx);
        st_prof_end(&pg);
        s->stats.gate_wait_s = st_now() - tg;
        tcm = st_now();
    }
    if (abandon && !s->cfg.in_place) {
        /* the regions written are not the current ones and nothing points at them: drop the
         * buffers that hold this step's updates or reads not yet checked, keep those that
         * hold the committed state, checked */
        for (int b = 0; b < s->n_buf; b++) {
            sbuf *x = &s->buf[b];
            if (x->rt) { /* read ahead, never checked (a wait failed first): finished and dropped */
                st_io_wait(s->io, x->rt, NULL);
                x->rt = 0;
                if (x->sg >= 0) s->sg[x->sg].buf = -1;
                x->sg = -1;
                continue;
            }
            if (x->sg >= 0 && s->sg[x->sg].done == s->step_id) {
                s->sg[x->sg].buf = -1;
                s->sg[x->sg].done = -1;
                x->sg = -1;
            }
        }
        s->stats.abandoned = 1;
        s->stats.step_s = st_now() - t0;
        return st; /* ST_OK from the gate, or the wait's error */
    }
    st_failpoint("store_writes_done"); /* new regions written, manifest not yet switched */
    if (!st) {
        /* the switch: new regions and checksums become current in one manifest rename */
        for (int i = 0; i < n; i++) {
            subgroup *g = &s->sg[i];
            if (!s->cfg.in_place) g->cur ^= 1;
            uint32_t *t = g->crc;
            g->crc = g->crc_new;
            g->crc_new = t;
        }
        s->step++;
        if (a->blob_bytes) {
            unsigned char *nb = realloc(s->blob, a->blob_bytes);
            if (!nb) st = st_errf(err, ST_ERR_NOMEM, "state store: out of memory");
            else {
                s->blob = nb;
                memcpy(s->blob, a->blob, a->blob_bytes);
            }
        }
        s->blob_bytes = a->blob_bytes;
        if (!st) st = manifest_write(s, 0, err);
    }
    if (st) {
        s->failed = 1; /* buffers (and maybe cur) are ahead of the disk */
        return st;
    }
    s->stats.commit_s = st_now() - tcm;
    s->stats.step_s = st_now() - t0;
    return ST_OK;
}

st_status st_store_commit_blob(st_store *s, const void *blob, size_t bytes, st_err *err) {
    if (s->readonly) return st_errf(err, ST_ERR_INVALID, "state store %s: opened to read; nothing is committed", s->manifest);
    if (s->failed) return st_errf(err, ST_ERR_INVALID, "state store %s: an earlier step failed; reopen it", s->manifest);
    if (bytes > ST_STORE_MAX_BLOB) return st_errf(err, ST_ERR_INVALID, "state store: blob of %zu bytes", bytes);
    unsigned char *nb = realloc(s->blob, bytes ? bytes : 1);
    if (!nb) return st_errf(err, ST_ERR_NOMEM, "state store: out of memory");
    s->blob = nb;
    if (bytes) memcpy(s->blob, blob, bytes);
    s->blob_bytes = bytes;
    st_status st = manifest_write(s, 0, err);
    if (st) s->failed = 1;
    return st;
}

const void *st_store_blob(const st_store *s, size_t *bytes) {
    *bytes = s->blob_bytes;
    return s->blob_bytes ? s->blob : NULL;
}

st_status st_store_read_master(st_store *s, float *dst, st_err *err) {
    if (s->failed) return st_errf(err, ST_ERR_INVALID, "state store %s: an earlier step failed; reopen it", s->manifest);
    st_status st = ST_OK;
    for (int g = 0; g < s->n_sg && !st; g++) {
        subgroup *sg = &s->sg[g];
        if (sg->buf < 0) {
            int b = pick_buffer(s, 0, 0);
            if ((st = stage(s, g, b, err))) {
                s->failed = 1;
                break;
            }
        }
        if ((st = ensure_loaded(s, g, err))) {
            s->failed = 1; /* the buffer claims a subgroup whose read failed */
            break;
        }
        const float *m = (const float *)s->buf[sg->buf].data;
        for (int k = 0; k < s->n_segs; k++) {
            size_t lo = s->segs[k].offset > sg->first ? s->segs[k].offset : sg->first;
            size_t hi = s->segs[k].offset + s->segs[k].n < sg->end ? s->segs[k].offset + s->segs[k].n : sg->end;
            if (lo < hi) memcpy(dst + lo, m + (lo - sg->first), (hi - lo) * sizeof(float));
        }
    }
    return st;
}

size_t st_store_moment_offset(const st_optim_segment *segs, int n_segs, st_optim_state_format fmt, size_t first, size_t x,
                              int i) {
    if (x <= first) return 0;
    if (fmt == ST_OPTIM_STATE_F32) return (x - first) * sizeof(float); /* m and v: one float per element */
    size_t blocks = 0; /* 8-bit: each segment's whole blocks, in element order */
    for (int k = 0; k < n_segs; k++) {
        size_t lo = segs[k].offset > first ? segs[k].offset : first;
        size_t hi = segs[k].offset + segs[k].n < x ? segs[k].offset + segs[k].n : x;
        if (hi > lo) blocks += (hi - lo + ST_OPTIM_Q8_BLOCK - 1) / ST_OPTIM_Q8_BLOCK;
    }
    return i < 2 ? blocks * ST_OPTIM_Q8_BLOCK : blocks * sizeof(float); /* codes, then absmax */
}

/* An 8-bit store's state is cut only where the blocks of the segment the cut falls in are:
 * elsewhere the bytes of a range are not its own. */
static st_status check_grid(const st_store *s, size_t x, st_err *err) {
    if (s->cfg.fmt == ST_OPTIM_STATE_F32) return ST_OK;
    for (int k = 0; k < s->n_segs; k++)
        if (x > s->segs[k].offset && x < s->segs[k].offset + s->segs[k].n &&
            (x - s->segs[k].offset) % ST_OPTIM_Q8_BLOCK)
            return st_errf(err, ST_ERR_INVALID, "state store %s: element %zu cuts tensor %d (elements [%zu, +%zu)) off "
                           "its %d-element 8-bit blocks; a range of the state starts and ends on them", s->manifest, x,
                           k, s->segs[k].offset, s->segs[k].n, ST_OPTIM_Q8_BLOCK);
    return ST_OK;
}

st_status st_store_read_range(st_store *s, size_t first, size_t n, float *master, void *const moments[],
                              st_err *err) {
    if (s->failed) return st_errf(err, ST_ERR_INVALID, "state store %s: an earlier step failed; reopen it", s->manifest);
    size_t end = first + n;
    if (end > s->numel || end < first)
        return st_errf(err, ST_ERR_INVALID, "state store %s: elements [%zu, %zu) lie past its %zu", s->manifest, first,
                       end, s->numel);
    st_status st = check_grid(s, first, err);
    if (!st) st = check_grid(s, end, err);
    for (int g = 0; g < s->n_sg && !st; g++) {
        subgroup *sg = &s->sg[g];
        size_t a = sg->first > first ? sg->first : first, b = sg->end < end ? sg->end : end;
        if (a >= b) continue;
        if (sg->buf < 0) {
            int buf = pick_buffer(s, 0, 0);
            if ((st = stage(s, g, buf, err))) {
                s->failed = 1;
                break;
            }
        }
        if ((st = ensure_loaded(s, g, err))) { /* the CRC of every MiB */
            s->failed = 1;
            break;
        }
        const char *r = s->buf[sg->buf].data;
        memcpy(master + (a - first), r + (a - sg->first) * sizeof(float), (b - a) * sizeof(float));
        for (int i = 0; i < st_optim_state_count(sg->o) && !st; i++) {
            size_t src = st_store_moment_offset(s->segs, s->n_segs, s->cfg.fmt, sg->first, a, i);
            size_t len = st_store_moment_offset(s->segs, s->n_segs, s->cfg.fmt, sg->first, b, i) - src;
            size_t dst = st_store_moment_offset(s->segs, s->n_segs, s->cfg.fmt, first, a, i);
            if (src + len > st_optim_state_buffer_bytes(sg->o, i)) { /* the layout of optim.h, or a bug here */
                st = st_errf(err, ST_ERR_FORMAT, "state store %s: subgroup %d's moment buffer %d holds %zu bytes; "
                             "elements [%zu, %zu) would take [%zu, %zu)", s->manifest, g, i,
                             st_optim_state_buffer_bytes(sg->o, i), a, b, src, src + len);
                break;
            }
            memcpy((char *)moments[i] + dst, r + sg->part[1 + i] + src, len);
        }
    }
    return st;
}

void st_store_get_stats(const st_store *s, st_store_stats *out) {
    *out = s->stats;
    out->step = s->step;
    out->n_subgroups = s->n_sg;
    out->n_buffers = s->n_buf;
    out->cache_buffers = s->n_buf > READ_AHEAD + 1 ? s->n_buf - (READ_AHEAD + 1) : 0;
    out->region_bytes = s->max_region;
    out->host_bytes = (uint64_t)s->n_buf * s->max_region;
    out->disk_bytes = 0;
    for (int p = 0; p < s->cfg.n_paths; p++) out->disk_bytes += s->path_bytes[p];
}

int st_store_in_place(const st_store *s) { return s->cfg.in_place; }

void st_store_init_copy(void *ctx, size_t first, size_t n, float *dst) {
    memcpy(dst, (const float *)ctx + first, n * sizeof(float));
}

size_t st_store_numel(const st_store *s) { return s->numel; }
int st_store_n_paths(const st_store *s) { return s->cfg.n_paths; }
uint64_t st_store_path_bytes(const st_store *s, int p) {
    return p >= 0 && p < s->cfg.n_paths ? s->path_bytes[p] : 0;
}
st_io_engine *st_store_io(st_store *s) { return s->io; }
const char *st_store_manifest_path(const st_store *s) { return s->manifest; }
