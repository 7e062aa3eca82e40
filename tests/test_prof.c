/* test_prof.c - the profiler's parts, each against an independent fact: the trace file is
 * valid JSON whose spans nest per thread and whose counts match what was recorded (also
 * when a ring overflows), phase times match a wall clock, the memory estimate matches
 * what the model and the optimizer allocate, a run that cannot fit is refused with the
 * bytes missing, and a missing NVML is reported, not fatal. */
#include <json-c/json.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "strata/optim.h"
#include "strata/model.h"
#include "strata/plan.h"
#include "strata/prof.h"
#include "testutil.h"

static void sleep_ms(double ms) {
    struct timespec ts = {(time_t)(ms / 1000), (long)(((long long)(ms * 1e6)) % 1000000000LL)};
    nanosleep(&ts, NULL);
}

#define FLOOD 200000

static void *worker(void *arg) {
    int id = (int)(size_t)arg;
    st_prof_thread_name(id == 1 ? "worker one" : "worker two");
    for (int i = 0; i < 50; i++) {
        st_prof_span s = st_prof_begin(ST_PROF_CAT_COMPUTE, "work", i);
        st_prof_span c = st_prof_begin(ST_PROF_CAT_COPY, "copy h2d", -1);
        st_prof_end_bytes(&c, 4096);
        st_prof_end(&s);
        st_prof_counter("worker counter", i);
    }
    return NULL;
}

static void *flooder(void *arg) {
    (void)arg;
    st_prof_thread_name("flooder");
    /* faster than the writer drains (every 200 ms): the ring of 65536 must overflow */
    for (int i = 0; i < FLOOD; i++) {
        st_prof_span s = st_prof_begin(ST_PROF_CAT_OTHER, "flood", -1);
        st_prof_end(&s);
    }
    return NULL;
}

typedef struct span { double ts, dur; } span;
static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
    return x->dur > y->dur ? -1 : x->dur < y->dur; /* the longer (parent) first */
}

/* Spans of one thread must nest: each is inside the open parent, or after it. */
static int check_nesting(span *s, int n) {
    qsort(s, (size_t)n, sizeof *s, cmp_span);
    double stack[64];
    int depth = 0;
    for (int i = 0; i < n; i++) {
        while (depth && s[i].ts >= stack[depth - 1] - 1e-9) depth--;
        if (depth && s[i].ts + s[i].dur > stack[depth - 1] + 1e-3) return 0; /* straddles its parent's end */
        if (depth < 64) stack[depth++] = s[i].ts + s[i].dur;
    }
    return 1;
}

static void test_trace(void) {
    const char *dir = test_tmpdir();
    char path[1024];
    snprintf(path, sizeof path, "%s/trace.json", dir);
    st_err err = {0};
    CHECK(st_prof_trace_start(path, "test process", &err) == ST_OK, "%s", err.msg);
    CHECK(st_prof_trace_start(path, "again", &err) == ST_ERR_INVALID, "a second trace at once is refused");
    st_prof_thread_name("main");
    st_prof_span outer = st_prof_begin(ST_PROF_CAT_STEP, "outer", -1);
    for (int l = 0; l < 3; l++) {
        ST_PROF_SCOPE(ST_PROF_CAT_COMPUTE, "inner", l);
        st_prof_span leaf = st_prof_begin(ST_PROF_CAT_COMPUTE, "leaf", -1);
        sleep_ms(1);
        st_prof_end(&leaf);
    }
    st_prof_span io = st_prof_begin(ST_PROF_CAT_IO, "disk write", -1);
    sleep_ms(2);
    st_prof_end_bytes(&io, 1000000);
    st_prof_end(&outer);
    st_prof_counter("memory (bytes)", 12345);
    pthread_t th[3];
    pthread_create(&th[0], NULL, worker, (void *)1);
    pthread_create(&th[1], NULL, worker, (void *)2);
    pthread_create(&th[2], NULL, flooder, NULL);
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    uint64_t dropped = st_prof_trace_dropped();
    CHECK(st_prof_trace_stop(&err) == ST_OK, "%s", err.msg);
    CHECK(!st_prof_trace_active(), "stopped");
    /* once stopped, spans cost nothing and record nothing */
    st_prof_span off = st_prof_begin(ST_PROF_CAT_COMPUTE, "after", -1);
    CHECK(off.t0_ns == 0, "no span is timed with no trace and no accounting");
    st_prof_end(&off);

    json_object *root = json_object_from_file(path);
    CHECK(root != NULL, "trace is valid JSON: %s", json_util_get_last_err());
    if (!root) return;
    json_object *evs = NULL, *other = NULL, *jd = NULL;
    CHECK(json_object_object_get_ex(root, "traceEvents", &evs) && json_object_is_type(evs, json_type_array),
          "traceEvents array");
    CHECK(json_object_object_get_ex(root, "otherData", &other) && json_object_object_get_ex(other, "dropped_events", &jd),
          "otherData.dropped_events");
    CHECK(jd && (uint64_t)json_object_get_int64(jd) == dropped, "dropped count in the file (%lld) is the API's (%llu)",
          jd ? (long long)json_object_get_int64(jd) : -1LL, (unsigned long long)dropped);
    int n = (int)json_object_array_length(evs);
    static span by_tid[8][FLOOD + 512];
    int nby[8] = {0};
    int n_flood = 0, n_inner = 0, n_outer = 0, n_work = 0, n_copy = 0, n_counter = 0, n_bw = 0, n_mem = 0;
    int io_bytes_ok = 0, names_ok = 0, proc_named = 0;
    char thread_names[8][64] = {{0}};
    for (int i = 0; i < n; i++) {
        json_object *e = json_object_array_get_idx(evs, (size_t)i), *v;
        const char *ph = json_object_object_get_ex(e, "ph", &v) ? json_object_get_string(v) : "";
        const char *name = json_object_object_get_ex(e, "name", &v) ? json_object_get_string(v) : "";
        int tid = json_object_object_get_ex(e, "tid", &v) ? json_object_get_int(v) : 0;
        if (!strcmp(ph, "X")) {
            double ts = json_object_object_get_ex(e, "ts", &v) ? json_object_get_double(v) : -1;
            double dur = json_object_object_get_ex(e, "dur", &v) ? json_object_get_double(v) : -1;
            if (!(ts >= 0 && dur >= 0)) CHECK(0, "span %s has ts and dur", name);
            if (tid > 0 && tid < 8) by_tid[tid][nby[tid]++] = (span){ts, dur};
            if (!strcmp(name, "flood")) n_flood++;
            if (!strncmp(name, "inner ", 6)) n_inner++;
            if (!strcmp(name, "outer")) n_outer++;
            if (!strncmp(name, "work ", 5)) n_work++;
            if (!strcmp(name, "copy h2d")) n_copy++;
            if (!strcmp(name, "disk write")) {
                json_object *args, *b;
                io_bytes_ok = json_object_object_get_ex(e, "args", &args) && json_object_object_get_ex(args, "bytes", &b) &&
                              json_object_get_int64(b) == 1000000 && dur >= 2000;
            }
            if (!strcmp(name, "inner 2")) names_ok = 1;
        } else if (!strcmp(ph, "C")) {
            n_counter++;
            if (!strcmp(name, "disk I/O (MB/s)")) n_bw++;
            if (!strcmp(name, "memory (bytes)")) {
                json_object *args, *val;
                n_mem += json_object_object_get_ex(e, "args", &args) && json_object_object_get_ex(args, "value", &val) &&
                         json_object_get_double(val) == 12345;
            }
        } else if (!strcmp(ph, "M")) {
            json_object *args, *nm;
            if (json_object_object_get_ex(e, "args", &args) && json_object_object_get_ex(args, "name", &nm)) {
                if (!strcmp(name, "process_name") && !strcmp(json_object_get_string(nm), "test process")) proc_named = 1;
                if (!strcmp(name, "thread_name") && tid > 0 && tid < 8)
                    snprintf(thread_names[tid], sizeof thread_names[tid], "%s", json_object_get_string(nm));
            }
        }
    }
    CHECK(n_outer == 1 && n_inner == 3 && names_ok, "main thread spans: outer %d, inner %d", n_outer, n_inner);
    CHECK(n_work == 100 && n_copy == 100, "worker spans: %d work, %d copies (want 100 each)", n_work, n_copy);
    CHECK(io_bytes_ok, "the disk write span carries its bytes and lasts >= 2 ms");
    CHECK(n_bw == 2 + 0, "a bandwidth track for the disk write (up, down): %d samples", n_bw);
    CHECK(n_mem == 1, "the memory counter sample with its value");
    CHECK(n_counter >= 100 + 1 + 2, "counter samples: %d", n_counter);
    CHECK(n_flood + (long long)dropped == FLOOD, "flood spans written %d + dropped %llu = %d pushed", n_flood,
          (unsigned long long)dropped, FLOOD);
    CHECK(dropped > 0, "the flood overflowed its ring (capacity 65536) and the drop was counted");
    CHECK(proc_named, "the process is named");
    int named = 0;
    for (int t = 1; t < 8; t++) {
        named += !strcmp(thread_names[t], "main") + !strcmp(thread_names[t], "worker one") +
                 !strcmp(thread_names[t], "worker two") + !strcmp(thread_names[t], "flooder");
        if (nby[t]) CHECK(check_nesting(by_tid[t], nby[t]), "spans of thread %d (%s) nest", t, thread_names[t]);
    }
    CHECK(named == 4, "threads named main, worker one, worker two, flooder: %d found", named);
    json_object_put(root);
}

static void test_phases(void) {
    st_prof_phase_accounting(1);
    st_prof_phase_reset();
    double t0 = st_now();
    st_prof_span step = st_prof_begin(ST_PROF_CAT_STEP, "step", 1);
    st_prof_span a = st_prof_begin(ST_PROF_CAT_COMPUTE, "alpha", -1);
    sleep_ms(20);
    st_prof_end(&a);
    double ta = st_now() - t0;
    for (int i = 0; i < 2; i++) {
        st_prof_span b = st_prof_begin(ST_PROF_CAT_COMPUTE, "beta", i);
        st_prof_span c = st_prof_begin(ST_PROF_CAT_COMPUTE, "gamma", -1); /* depth 2: not a phase */
        sleep_ms(5);
        st_prof_end(&c);
        st_prof_end(&b);
    }
    st_prof_span inner = st_prof_begin(ST_PROF_CAT_STEP, "executor step", -1); /* transparent: not a level */
    st_prof_span d = st_prof_begin(ST_PROF_CAT_COMPUTE, "delta", -1);
    sleep_ms(1);
    st_prof_end(&d);
    st_prof_end(&inner);
    st_prof_span x = st_prof_begin(ST_PROF_CAT_COPY, "copy wait", -1);
    st_prof_span y = st_prof_begin(ST_PROF_CAT_COPY, "nested copy", -1); /* inside another: not counted twice */
    sleep_ms(3);
    st_prof_end_bytes(&y, 100);
    st_prof_end_bytes(&x, 1000);
    st_prof_end(&step);
    double total = st_now() - t0;
    st_prof_phases ph;
    st_prof_phase_read(&ph);
    st_prof_phase_accounting(0);
    double alpha = -1, beta = -1, copy = -1, delta = -1;
    int gamma = 0, exec_step = 0;
    for (int i = 0; i < ph.n; i++) {
        if (!strcmp(ph.name[i], "alpha")) alpha = ph.seconds[i];
        if (!strcmp(ph.name[i], "beta")) beta = ph.seconds[i];
        if (!strcmp(ph.name[i], "copy wait")) copy = ph.seconds[i];
        if (!strcmp(ph.name[i], "gamma")) gamma = 1;
        if (!strcmp(ph.name[i], "delta")) delta = ph.seconds[i];
        if (!strcmp(ph.name[i], "executor step")) exec_step = 1;
    }
    CHECK(ph.n == 4 && !gamma, "four phases at depth 1 (got %d), gamma nested is not one", ph.n);
    CHECK(delta >= 0.001 && !exec_step, "a step span inside the step is transparent: delta %.4f is a phase", delta);
    CHECK(alpha >= 0.020 && alpha <= ta, "alpha %.4f s within [0.020, %.4f] (wall clock)", alpha, ta);
    CHECK(beta >= 0.010 && beta <= total - alpha, "beta (two spans summed) %.4f s >= 0.010", beta);
    CHECK(copy >= 0.003 && ph.exposed_xfer_s == copy, "exposed transfer %.4f = the outer copy span %.4f",
          ph.exposed_xfer_s, copy);
    CHECK(ph.xfer_bytes == 1000, "bytes of the outermost copy only: %lld", (long long)ph.xfer_bytes);
}

static void test_mem_estimate(void) {
    const char *shapes[] = {"gpt2-tiny", "gpt2-mini"};
    int Bs[] = {2, 4}, Ts[] = {16, 64};
    for (int k = 0; k < 2; k++) {
        st_gpt2_config mc;
        st_err err = {0};
        st_gpt2_config_preset(shapes[k], &mc, &err);
        st_mem_plan e;
        st_arch *a = NULL;
        st_model_shape shape;
        CHECK(st_model_resolve(shapes[k], NULL, NULL, Bs[k], Ts[k], &shape, &a, &err) == ST_OK, "%s", err.msg);
        st_mem_request rq = {.arch = a, .B = Bs[k], .T = Ts[k], .state_format = ST_OPTIM_STATE_8BIT};
        CHECK(st_plan_memory(&rq, &e, &err) == ST_OK, "%s", err.msg);
        st_stream_config sc = {.arch = a, .B = Bs[k], .T = Ts[k], .external_optimizer = 1};
        st_stream_plan rp;
        st_stream_plan_resident(&rp, a->lay.n_blocks);
        CHECK(e.acts_stored == (double)st_stream_device_bytes(&sc, &rp) &&
                  e.acts_stored > 0.5 * st_gpt2_act_bytes(&mc, Bs[k], Ts[k]) &&
                  e.acts_stored < 2.0 * st_gpt2_act_bytes(&mc, Bs[k], Ts[k]),
              "%s activations: the resident executor's table, %.0f bytes (the model's own set %zu)", shapes[k],
              e.acts_stored, st_gpt2_act_bytes(&mc, Bs[k], Ts[k]));
        st_arch_free(a);
        st_backend *be = NULL;
        st_gpt2_model m;
        CHECK(st_backend_ref_create(&be, &err) == ST_OK, "%s", err.msg);
        CHECK(st_gpt2_create(&m, &mc, be, &err) == ST_OK, "%s", err.msg);
        CHECK(e.n_params == (double)m.n_params, "%s: estimate %.0f parameters, the model has %zu", shapes[k],
              e.n_params, m.n_params);
        CHECK(e.weights == 4.0 * m.n_params && e.grads == 4.0 * m.n_params, "fp32 weights and gradients");
        CHECK(e.acts_ckpt < e.acts_stored, "checkpointing stores less");
        for (int fmt = 0; fmt < 2; fmt++) {
            st_optim_segment *segs = calloc((size_t)m.n_tensors, sizeof *segs);
            for (int i = 0; i < m.n_tensors; i++)
                segs[i] = (st_optim_segment){.offset = m.tensors[i].offset, .n = m.tensors[i].numel};
            st_optim *o = NULL;
            CHECK(st_optim_create(&o, segs, m.n_tensors, fmt ? ST_OPTIM_STATE_8BIT : ST_OPTIM_STATE_F32, &err) == ST_OK, "%s",
                  err.msg);
            double bytes = 0;
            for (int i = 0; i < st_optim_state_count(o); i++) {
                size_t b;
                st_optim_state_buffer(o, i, &b);
                bytes += (double)b;
            }
            double want = fmt ? e.moments_8bit : e.moments_f32;
            CHECK(bytes == want, "%s %s moments: optimizer holds %.0f bytes, estimate %.0f", shapes[k],
                  fmt ? "8-bit" : "fp32", bytes, want);
            st_optim_free(o);
            free(segs);
        }
        st_gpt2_free(&m);
        st_backend_free(be);
        /* refusal: a host budget of half the need is short by the other half */
        double budget[ST_MEM_TIER_COUNT] = {0, e.tier_need[ST_MEM_TIER_HOST] / 2, 0};
        st_status s = st_mem_plan_check(&e, budget, &err);
        char want[64];
        snprintf(want, sizeof want, "%.0f bytes", e.tier_need[ST_MEM_TIER_HOST] - budget[ST_MEM_TIER_HOST]);
        CHECK(s == ST_ERR_NOMEM && strstr(err.msg, "host") && strstr(err.msg, want) && strstr(err.msg, "missing"),
              "refusal names the tier and the %s missing: %s", want, err.msg);
        budget[ST_MEM_TIER_HOST] = e.tier_need[ST_MEM_TIER_HOST] * 2;
        CHECK(st_mem_plan_check(&e, budget, &err) == ST_OK, "fits in twice its need");
    }
}

static void test_machine(void) {
    double hwm = st_prof_host_peak_bytes(), rss = st_prof_host_rss_bytes(), avail = st_prof_host_available_bytes();
    /* The two are read one after the other, and the kernel folds per-thread RSS counters
     * into the totals in batches (up to 64 pages per thread), so VmHWM can trail VmRSS
     * by a few pages between reads: allow 1 MiB. */
    CHECK(hwm > 0 && rss > 0 && hwm + 1048576.0 >= rss, "VmHWM %.0f >= VmRSS %.0f (within 1 MiB) > 0", hwm, rss);
    CHECK(avail > 0, "MemAvailable read");
    double peak = st_prof_peak_flops();
    CHECK(peak > 1e8 && peak < 1e15, "measured peak %.3g FLOP/s is plausible for a CPU", peak);
    char dir[1024], path[1100];
    snprintf(dir, sizeof dir, "%s/sizes", test_tmpdir());
    mkdir(dir, 0755);
    int sizes[] = {1, 1000, 123457};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/f%d", dir, i);
        FILE *f = fopen(path, "wb");
        for (int j = 0; j < sizes[i]; j++) fputc(j & 0xff, f);
        fclose(f);
    }
    CHECK(st_prof_dir_bytes(dir) == 1 + 1000 + 123457, "directory bytes: %lld", (long long)st_prof_dir_bytes(dir));
    CHECK(st_prof_dir_bytes("/nonexistent/strata") == -1, "missing directory");
}

static void test_no_nvml(void) {
    setenv("STRATA_NVML_LIB", "/nonexistent/libnvidia-ml.so.1", 1);
    st_prof_gpu *g = (st_prof_gpu *)1;
    st_err err = {0};
    st_status s = st_prof_gpu_open(&g, 20, &err);
    CHECK(s == ST_ERR_UNSUPPORTED && g == NULL, "no NVML: unsupported, no handle");
    CHECK(strstr(err.msg, "NVML") && strstr(err.msg, "nonexistent"), "the reason names NVML and the path: %s", err.msg);
    double lost;
    uint64_t why;
    int n;
    st_prof_gpu_take_summary(NULL, &lost, &why, &n);
    CHECK(lost == -1 && n == 0, "no GPU: no summary");
    unsetenv("STRATA_NVML_LIB");
}

static void test_overhead(void) {
    /* The cost of a span while tracing, to set beside a step's length (bench trace measures
     * the whole effect). A loose bound: a span is two clock reads and a ring store. */
    const char *dir = test_tmpdir();
    char path[1024];
    snprintf(path, sizeof path, "%s/overhead.json", dir);
    st_err err = {0};
    CHECK(st_prof_trace_start(path, "overhead", &err) == ST_OK, "%s", err.msg);
    int reps = 32768; /* half a ring: no drops whatever the writer does */
    double t0 = st_now();
    for (int i = 0; i < reps; i++) {
        st_prof_span s = st_prof_begin(ST_PROF_CAT_COMPUTE, "span", i);
        st_prof_end(&s);
    }
    double per = (st_now() - t0) / reps;
    CHECK(st_prof_trace_stop(&err) == ST_OK, "%s", err.msg);
    printf("  one traced span: %.0f ns\n", per * 1e9);
    CHECK(per < 2e-6, "a traced span costs %.0f ns (< 2000)", per * 1e9);
}

int main(void) {
    test_trace();
    test_phases();
    test_mem_estimate();
    test_machine();
    test_no_nvml();
    test_overhead();
    return test_finish("prof");
}
