/* trace.c - spans and counters into per-thread rings, drained into Chrome trace JSON.
 *
 * Each thread that records owns one ring (single producer). A writer thread wakes every
 * 200 ms and drains every ring (single consumer) into the file, so the traced threads
 * never format text or take a lock: an event is a clock read and a 40-byte store. Rings
 * live for the whole process (threads of an OpenMP pool outlive a trace, and a thread's
 * ring pointer must stay valid), and are reused by the next trace.
 *
 * The same span calls also time a step's phases on a thread that asked for it
 * (st_prof_phase_accounting), with or without a trace: step metrics are always written.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "strata/prof.h"

#define RING_CAP (1u << 16) /* events per thread: 65536 x 40 B = 2.5 MiB, touched as used */
#define RING_MASK (RING_CAP - 1)
#define MAX_THREADS 256
enum { PID_HOST = 1, PID_GPU = 2 };
enum { EV_SPAN = 0, EV_COUNTER = 1 };

typedef struct ev {
    uint64_t t0, t1; /* ns; a counter has t1 = 0 */
    const char *name;
    union { int64_t bytes; double value; } u;
    int32_t index;
    uint8_t kind, cat, pid;
} ev;
_Static_assert(sizeof(ev) == 40, "an event is 40 bytes: the ring's size and the cost per span assume it");

typedef struct ring {
    _Atomic uint64_t head; /* next slot the producer writes */
    char pad0[56];         /* head and tail on their own cache lines */
    _Atomic uint64_t tail; /* next slot the consumer reads */
    char pad1[56];
    _Atomic uint64_t dropped;
    _Atomic int active_gen; /* the trace generation this ring produced events in */
    int tid;
    char name[64];
    ev ev[RING_CAP];
} ring;

static ring *g_rings[MAX_THREADS];
static _Atomic int g_nrings;
static pthread_mutex_t g_reg_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int g_trace_on;
static _Atomic int g_gen;
static _Atomic uint64_t g_dropped_unregistered;

typedef struct tstate {
    ring *r;
    int depth;      /* open spans on this thread */
    int xfer_depth; /* open COPY/IO spans */
    int accounting;
    st_prof_phases ph;
} tstate;
static _Thread_local tstate t_st;

static struct {
    FILE *f;
    char path[1024];
    pthread_t thr;
    int thr_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    uint64_t origin_ns;
    char process_name[128];
    long n_written;
    int gpu_used;
    uint64_t dropped_at_start;
    double writer_cpu_s; /* CPU time spent formatting and writing, writer thread + final drain */
} g_w = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static const char *cat_names[ST_PROF_CAT_COUNT] = {"step", "data", "compute", "recompute", "copy", "io", "optim",
                                                "other"};

const char *st_prof_cat_name(st_prof_cat c) { return (unsigned)c < ST_PROF_CAT_COUNT ? cat_names[c] : "other"; }

uint64_t st_prof_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------------ rings */

static ring *ring_get(void) {
    if (t_st.r) return t_st.r;
    pthread_mutex_lock(&g_reg_lock);
    int n = atomic_load(&g_nrings);
    ring *r = NULL;
    if (n < MAX_THREADS) {
        r = calloc(1, sizeof *r); /* large: mmap'd, pages touched only as events land */
        if (r) {
            r->tid = n + 1;
            g_rings[n] = r;
            atomic_store_explicit(&g_nrings, n + 1, memory_order_release);
        }
    }
    pthread_mutex_unlock(&g_reg_lock);
    t_st.r = r;
    return r;
}

static void ring_push(const ev *e) {
    ring *r = ring_get();
    if (!r) {
        atomic_fetch_add_explicit(&g_dropped_unregistered, 1, memory_order_relaxed);
        return;
    }
    uint64_t h = atomic_load_explicit(&r->head, memory_order_relaxed);
    uint64_t t = atomic_load_explicit(&r->tail, memory_order_acquire);
    if (h - t >= RING_CAP) {
        atomic_fetch_add_explicit(&r->dropped, 1, memory_order_relaxed);
        return;
    }
    r->ev[h & RING_MASK] = *e;
    int gen = atomic_load_explicit(&g_gen, memory_order_relaxed);
    if (atomic_load_explicit(&r->active_gen, memory_order_relaxed) != gen)
        atomic_store_explicit(&r->active_gen, gen, memory_order_relaxed);
    atomic_store_explicit(&r->head, h + 1, memory_order_release);
}

/* ------------------------------------------------------------------ spans */

static int is_xfer(int cat) { return cat == ST_PROF_CAT_COPY || cat == ST_PROF_CAT_IO; }

st_prof_span st_prof_begin(st_prof_cat cat, const char *name, int index) {
    st_prof_span s = {0, name, index, (int16_t)cat, 0};
    if (!t_st.accounting && !atomic_load_explicit(&g_trace_on, memory_order_relaxed)) return s;
    s.t0_ns = st_prof_now_ns();
    if (cat == ST_PROF_CAT_STEP && t_st.depth > 0) s.transparent = 1;
    else t_st.depth++;
    if (is_xfer(cat)) t_st.xfer_depth++;
    return s;
}

static void phase_add(st_prof_phases *ph, const char *name, double sec) {
    for (int i = 0; i < ph->n; i++)
        if (ph->name[i] == name || !strcmp(ph->name[i], name)) {
            ph->seconds[i] += sec;
            return;
        }
    if (ph->n < ST_PROF_MAX_PHASES) {
        ph->name[ph->n] = name;
        ph->seconds[ph->n++] = sec;
    }
}

void st_prof_end_bytes(st_prof_span *s, int64_t bytes) {
    if (!s->t0_ns) return;
    uint64_t t1 = st_prof_now_ns();
    tstate *ts = &t_st;
    if (!s->transparent) ts->depth--;
    int x = is_xfer(s->cat);
    if (x) ts->xfer_depth--;
    if (ts->accounting) {
        double d = (double)(t1 - s->t0_ns) * 1e-9;
        if (ts->depth == 1 && !s->transparent) phase_add(&ts->ph, s->name, d);
        if (x && ts->xfer_depth == 0) {
            ts->ph.exposed_xfer_s += d;
            if (bytes > 0) ts->ph.xfer_bytes += bytes;
        }
    }
    if (atomic_load_explicit(&g_trace_on, memory_order_relaxed)) {
        ev e = {.t0 = s->t0_ns, .t1 = t1, .name = s->name, .index = s->index, .kind = EV_SPAN,
                .cat = (uint8_t)s->cat, .pid = PID_HOST};
        e.u.bytes = bytes;
        ring_push(&e);
    }
    s->t0_ns = 0;
}

void st_prof_end(st_prof_span *s) { st_prof_end_bytes(s, -1); }

void st_prof_span_gpu(st_prof_cat cat, const char *name, int index, uint64_t t0_ns, uint64_t t1_ns) {
    if (!atomic_load_explicit(&g_trace_on, memory_order_relaxed)) return;
    ev e = {.t0 = t0_ns, .t1 = t1_ns < t0_ns ? t0_ns : t1_ns, .name = name, .index = index, .kind = EV_SPAN,
            .cat = (uint8_t)cat, .pid = PID_GPU};
    e.u.bytes = -1;
    ring_push(&e);
}

static void counter_push(const char *name, double value, int pid) {
    if (!atomic_load_explicit(&g_trace_on, memory_order_relaxed)) return;
    ev e = {.t0 = st_prof_now_ns(), .name = name, .index = -1, .kind = EV_COUNTER, .pid = (uint8_t)pid};
    e.u.value = value;
    ring_push(&e);
}

void st_prof_counter(const char *name, double value) { counter_push(name, value, PID_HOST); }
void st_prof_counter_gpu(const char *name, double value) { counter_push(name, value, PID_GPU); }

void st_prof_thread_name(const char *name) {
    ring *r = ring_get();
    if (r) snprintf(r->name, sizeof r->name, "%s", name);
}

void st_prof_phase_accounting(int on) { t_st.accounting = on; }
void st_prof_phase_reset(void) { memset(&t_st.ph, 0, sizeof t_st.ph); }
void st_prof_phase_read(st_prof_phases *out) { *out = t_st.ph; }

/* ------------------------------------------------------------------ writer */

static void put_escaped(FILE *f, const char *s) {
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fputc('\\', f), fputc(c, f);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
}

static double rel_us(uint64_t t) { return t > g_w.origin_ns ? (double)(t - g_w.origin_ns) * 1e-3 : 0.0; }

static void sep(void) {
    if (g_w.n_written++) fputs(",\n", g_w.f);
}

static void write_counter(const char *name, int pid, uint64_t t, double v) {
    if (v != v || v > 1e300 || v < -1e300) v = 0; /* JSON has no NaN or Inf */
    sep();
    fputs("{\"ph\":\"C\",\"name\":\"", g_w.f);
    put_escaped(g_w.f, name);
    fprintf(g_w.f, "\",\"pid\":%d,\"ts\":%.3f,\"args\":{\"value\":%.15g}}", pid, rel_us(t), v);
    if (pid == PID_GPU) g_w.gpu_used = 1;
}

static void write_event(const ring *r, const ev *e) {
    if (e->kind == EV_COUNTER) {
        write_counter(e->name, e->pid, e->t0, e->u.value);
        return;
    }
    uint64_t t0 = e->t0 < g_w.origin_ns ? g_w.origin_ns : e->t0; /* began before the trace opened */
    double dur = e->t1 > t0 ? (double)(e->t1 - t0) * 1e-3 : 0.0;
    sep();
    fprintf(g_w.f, "{\"ph\":\"X\",\"cat\":\"%s\",\"name\":\"", st_prof_cat_name((st_prof_cat)e->cat));
    put_escaped(g_w.f, e->name);
    if (e->index >= 0) fprintf(g_w.f, " %d", e->index);
    fprintf(g_w.f, "\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f", e->pid, r->tid, rel_us(t0), dur);
    if (e->pid == PID_GPU) g_w.gpu_used = 1; /* device-timed spans (st_prof_span_gpu) */
    if (e->index >= 0 || e->u.bytes >= 0) {
        fputs(",\"args\":{", g_w.f);
        if (e->index >= 0) fprintf(g_w.f, "\"index\":%d%s", e->index, e->u.bytes >= 0 ? "," : "");
        if (e->u.bytes >= 0) fprintf(g_w.f, "\"bytes\":%lld", (long long)e->u.bytes);
        fputc('}', g_w.f);
    }
    fputc('}', g_w.f);
    /* A transfer draws its bandwidth as a step on a counter track: up while it runs. */
    if (is_xfer(e->cat) && e->u.bytes > 0 && e->t1 > t0) {
        const char *track = e->cat == ST_PROF_CAT_IO ? "disk I/O (MB/s)" : "copy (MB/s)";
        write_counter(track, PID_HOST, t0, (double)e->u.bytes / ((double)(e->t1 - t0) * 1e-9) / 1e6);
        write_counter(track, PID_HOST, e->t1, 0.0);
    }
}

static void drain_all(void) {
    int n = atomic_load_explicit(&g_nrings, memory_order_acquire);
    for (int i = 0; i < n; i++) {
        ring *r = g_rings[i];
        uint64_t h = atomic_load_explicit(&r->head, memory_order_acquire);
        uint64_t t = atomic_load_explicit(&r->tail, memory_order_relaxed);
        for (; t < h; t++) write_event(r, &r->ev[t & RING_MASK]);
        atomic_store_explicit(&r->tail, h, memory_order_release);
    }
}

static double thread_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *writer_main(void *arg) {
    (void)arg;
    st_prof_thread_name("trace writer");
    pthread_mutex_lock(&g_w.mu);
    while (!g_w.stop) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        /* Rarely: each wake-up can preempt a compute thread that others wait for at a
         * barrier, while a ring holds seconds of events of a training loop. */
        dl.tv_nsec += 200 * 1000000L;
        if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&g_w.cv, &g_w.mu, &dl);
        if (g_w.stop) break;
        pthread_mutex_unlock(&g_w.mu);
        drain_all();
        pthread_mutex_lock(&g_w.mu);
    }
    g_w.writer_cpu_s += thread_cpu_s(); /* read by the stopping thread after the join */
    pthread_mutex_unlock(&g_w.mu);
    return NULL;
}

uint64_t st_prof_trace_dropped(void) {
    uint64_t d = atomic_load(&g_dropped_unregistered);
    int n = atomic_load_explicit(&g_nrings, memory_order_acquire);
    for (int i = 0; i < n; i++) d += atomic_load(&g_rings[i]->dropped);
    return d - g_w.dropped_at_start;
}

int st_prof_trace_active(void) { return atomic_load(&g_trace_on); }

double st_prof_trace_writer_cpu_s(void) { return g_w.writer_cpu_s; }

void st_prof_trace_pause(int paused) {
    if (g_w.f) atomic_store(&g_trace_on, !paused);
}

st_status st_prof_trace_start(const char *path, const char *process_name, st_err *err) {
    if (atomic_load(&g_trace_on) || g_w.f)
        return st_errf(err, ST_ERR_INVALID, "trace %s: a trace (%s) is already open in this process; stop it first",
                       path, g_w.path);
    FILE *f = fopen(path, "w");
    if (!f) return st_errf(err, ST_ERR_IO, "trace %s: cannot create: %s", path, strerror(errno));
    setvbuf(f, NULL, _IOFBF, 1 << 20);
    g_w.f = f;
    snprintf(g_w.path, sizeof g_w.path, "%s", path);
    snprintf(g_w.process_name, sizeof g_w.process_name, "%s", process_name ? process_name : "strata");
    g_w.n_written = 0;
    g_w.gpu_used = 0;
    g_w.stop = 0;
    /* leftovers of an earlier trace (events pushed as it stopped) are discarded */
    int n = atomic_load_explicit(&g_nrings, memory_order_acquire);
    for (int i = 0; i < n; i++)
        atomic_store(&g_rings[i]->tail, atomic_load(&g_rings[i]->head));
    g_w.dropped_at_start = 0;
    g_w.dropped_at_start = st_prof_trace_dropped();
    g_w.writer_cpu_s = 0;
    atomic_fetch_add(&g_gen, 1);
    fputs("{\"traceEvents\":[\n", f);
    g_w.origin_ns = st_prof_now_ns();
    if (pthread_create(&g_w.thr, NULL, writer_main, NULL) != 0) {
        fclose(f);
        g_w.f = NULL;
        return st_errf(err, ST_ERR_INVALID, "trace %s: cannot start the writer thread", path);
    }
    g_w.thr_started = 1;
    atomic_store(&g_trace_on, 1);
    return ST_OK;
}

static void write_meta(const char *what, int pid, int tid, const char *key, const char *sval, long ival) {
    sep();
    fprintf(g_w.f, "{\"ph\":\"M\",\"name\":\"%s\",\"pid\":%d", what, pid);
    if (tid >= 0) fprintf(g_w.f, ",\"tid\":%d", tid);
    fprintf(g_w.f, ",\"args\":{\"%s\":", key);
    if (sval) {
        fputc('"', g_w.f);
        put_escaped(g_w.f, sval);
        fputc('"', g_w.f);
    } else {
        fprintf(g_w.f, "%ld", ival);
    }
    fputs("}}", g_w.f);
}

st_status st_prof_trace_stop(st_err *err) {
    if (!g_w.f) return ST_OK;
    atomic_store(&g_trace_on, 0);
    if (g_w.thr_started) {
        pthread_mutex_lock(&g_w.mu);
        g_w.stop = 1;
        pthread_cond_signal(&g_w.cv);
        pthread_mutex_unlock(&g_w.mu);
        pthread_join(g_w.thr, NULL);
        g_w.thr_started = 0;
    }
    double cpu0 = thread_cpu_s();
    drain_all();
    write_meta("process_name", PID_HOST, -1, "name", g_w.process_name, 0);
    write_meta("process_sort_index", PID_HOST, -1, "sort_index", NULL, 0);
    if (g_w.gpu_used) {
        write_meta("process_name", PID_GPU, -1, "name", "GPU (NVML)", 0);
        write_meta("process_sort_index", PID_GPU, -1, "sort_index", NULL, 1);
    }
    int gen = atomic_load(&g_gen);
    int n = atomic_load_explicit(&g_nrings, memory_order_acquire);
    for (int i = 0; i < n; i++) {
        ring *r = g_rings[i];
        if (atomic_load(&r->active_gen) != gen) continue;
        char name[80];
        if (r->name[0]) snprintf(name, sizeof name, "%s", r->name);
        else snprintf(name, sizeof name, "thread %d", r->tid);
        write_meta("thread_name", PID_HOST, r->tid, "name", name, 0);
        write_meta("thread_sort_index", PID_HOST, r->tid, "sort_index", NULL, r->tid);
    }
    uint64_t dropped = st_prof_trace_dropped();
    g_w.writer_cpu_s += thread_cpu_s() - cpu0;
    fprintf(g_w.f, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"clock\":\"CLOCK_MONOTONIC\",\"origin_ns\":%llu,"
            "\"dropped_events\":%llu}}\n", (unsigned long long)g_w.origin_ns, (unsigned long long)dropped);
    int fault = st_iofault("file.write", g_w.path);
    int bad = ferror(g_w.f) || fault;
    bad |= fclose(g_w.f) != 0;
    if (fault) errno = fault > 0 ? fault : ENOSPC;
    g_w.f = NULL;
    if (dropped) st_log(1, "trace %s: %llu events dropped (a ring was full)\n", g_w.path, (unsigned long long)dropped);
    if (bad) return st_errf(err, ST_ERR_IO, "trace %s: write failed: %s (disk full?)", g_w.path, strerror(errno));
    return ST_OK;
}
