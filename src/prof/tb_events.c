/* tb_events.c - TensorBoard event files written by hand: TFRecord framing around a
 * tensorflow Event protobuf with only the fields TensorBoard's scalar dashboard reads.
 *
 * Record:  uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)
 *          (little-endian; masked = rotate right 15, plus 0xa282ead8)
 * Event:   wall_time double (field 1, fixed64), step int64 (field 2, varint),
 *          file_version string (field 3), summary Summary (field 5)
 * Summary: repeated Value (field 1); Value: tag string (field 1), simple_value float
 *          (field 2, fixed32).
 * Protobuf: a key is (field << 3 | wire type) as a varint; wire types 0 varint, 1 fixed64,
 * 2 length-delimited, 5 fixed32, all little-endian. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "strata/prof.h"

struct st_prof_tb {
    FILE *f;
    char path[2304];
};

/* An encoding buffer that grows; a failed allocation is remembered and reported once. */
typedef struct pb_buf {
    uint8_t *p;
    size_t n, cap;
    int oom;
} pb_buf;

static void pb_bytes(pb_buf *b, const void *src, size_t n) {
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void pb_varint(pb_buf *b, uint64_t v) {
    uint8_t t[10];
    int n = 0;
    do {
        t[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    pb_bytes(b, t, (size_t)n);
}

static void pb_key(pb_buf *b, int field, int wire) { pb_varint(b, (uint64_t)field << 3 | (uint64_t)wire); }

static void pb_le(pb_buf *b, uint64_t v, int nbytes) {
    uint8_t t[8];
    for (int i = 0; i < nbytes; i++) t[i] = (uint8_t)(v >> (8 * i));
    pb_bytes(b, t, (size_t)nbytes);
}

static void pb_fixed64_double(pb_buf *b, int field, double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    pb_key(b, field, 1);
    pb_le(b, u, 8);
}

static void pb_fixed32_float(pb_buf *b, int field, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    pb_key(b, field, 5);
    pb_le(b, u, 4);
}

static void pb_lenbytes(pb_buf *b, int field, const void *p, size_t n) {
    pb_key(b, field, 2);
    pb_varint(b, n);
    pb_bytes(b, p, n);
}

static uint32_t masked_crc(const void *p, size_t n) {
    uint32_t c = st_crc32c(0, p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static double wall_time_s(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + tv.tv_usec * 1e-6;
}

/* Frame one serialized Event as a TFRecord and flush it, so a live TensorBoard sees it. */
static st_status write_record(st_prof_tb *w, const pb_buf *ev, st_err *err) {
    if (ev->oom) return st_errf(err, ST_ERR_NOMEM, "%s: out of memory encoding an event", w->path);
    uint8_t head[12], tail[4];
    for (int i = 0; i < 8; i++) head[i] = (uint8_t)((uint64_t)ev->n >> (8 * i));
    uint32_t hc = masked_crc(head, 8), dc = masked_crc(ev->p, ev->n);
    for (int i = 0; i < 4; i++) {
        head[8 + i] = (uint8_t)(hc >> (8 * i));
        tail[i] = (uint8_t)(dc >> (8 * i));
    }
    errno = 0;
    int fault = st_iofault("file.write", w->path);
    if (fault > 0) errno = fault;
    if (fault || fwrite(head, 1, 12, w->f) != 12 || fwrite(ev->p, 1, ev->n, w->f) != ev->n || fwrite(tail, 1, 4, w->f) != 4 ||
        fflush(w->f))
        return st_errf(err, ST_ERR_IO, "%s: cannot write a TensorBoard event: %s", w->path,
                       errno ? strerror(errno) : "short write");
    return ST_OK;
}

st_status st_prof_tb_open(st_prof_tb **out, const char *run_dir, st_err *err) {
    *out = NULL;
    st_prof_tb *w = calloc(1, sizeof *w);
    if (!w) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1) || !host[0]) snprintf(host, sizeof host, "localhost");
    for (char *c = host; *c; c++)
        if (*c == '/') *c = '_'; /* a file name, not a path */
    double t = wall_time_s();
    snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%lld.%s", run_dir, (long long)t, host);
    /* append: a second writer in the same second (a resume) adds records to the same valid file */
    w->f = fopen(w->path, "ab");
    if (!w->f) {
        st_status s = st_errf(err, ST_ERR_IO, "%s: cannot open the TensorBoard event file: %s", w->path,
                              strerror(errno));
        free(w);
        return s;
    }
    pb_buf ev = {0};
    pb_fixed64_double(&ev, 1, t); /* step 0: omitted, as protobuf omits a default */
    pb_lenbytes(&ev, 3, "brain.Event:2", strlen("brain.Event:2"));
    st_status s = write_record(w, &ev, err);
    free(ev.p);
    if (s) {
        fclose(w->f);
        free(w);
        return s;
    }
    *out = w;
    return ST_OK;
}

st_status st_prof_tb_scalars(st_prof_tb *w, long step, const char *const *tags, const double *values, int n, st_err *err) {
    if (!w || n <= 0) return ST_OK;
    pb_buf sum = {0}, val = {0}, ev = {0};
    for (int i = 0; i < n; i++) {
        size_t tl = strlen(tags[i]);
        if (tl == 0 || tl > ST_PROF_TB_TAG_MAX) {
            free(sum.p);
            free(val.p);
            return st_errf(err, ST_ERR_INVALID, "%s: TensorBoard tag '%.64s' is empty or longer than %d bytes",
                           w->path, tags[i], ST_PROF_TB_TAG_MAX);
        }
        val.n = 0;
        pb_lenbytes(&val, 1, tags[i], tl);
        pb_fixed32_float(&val, 2, (float)values[i]);
        if (val.oom) sum.oom = 1;
        else pb_lenbytes(&sum, 1, val.p, val.n);
    }
    pb_fixed64_double(&ev, 1, wall_time_s());
    pb_key(&ev, 2, 0);
    pb_varint(&ev, (uint64_t)(int64_t)step); /* int64: a negative step takes ten bytes, as protobuf says */
    if (sum.oom) ev.oom = 1;
    else pb_lenbytes(&ev, 5, sum.p, sum.n);
    st_status s = write_record(w, &ev, err);
    free(sum.p);
    free(val.p);
    free(ev.p);
    return s;
}

st_status st_prof_tb_scalar(st_prof_tb *w, const char *tag, long step, double value, st_err *err) {
    return st_prof_tb_scalars(w, step, &tag, &value, 1, err);
}

const char *st_prof_tb_path(const st_prof_tb *w) { return w ? w->path : ""; }

st_status st_prof_tb_close(st_prof_tb *w, st_err *err) {
    if (!w) return ST_OK;
    errno = 0;
    st_status s = ST_OK;
    if (fclose(w->f))
        s = st_errf(err, ST_ERR_IO, "%s: cannot close the TensorBoard event file: %s", w->path,
                    errno ? strerror(errno) : "unknown error");
    free(w);
    return s;
}
