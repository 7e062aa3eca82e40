/* test_prof_trace.c - the trace of a real short training run, parsed and checked: valid
 * JSON, spans nested per thread, every phase present (per block, too), the counters,
 * the bytes of each step's copies adding up to what metrics.jsonl reports and to the
 * batch's size, the checkpoint write's bytes equal to the files on disk, and the phase
 * times of each metrics line adding up to its step time. */
#include <dirent.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "strata/prof.h"
#include "strata/train.h"
#include "testutil.h"

#define B 4
#define T 32
#define L 2
#define ACCUM 2
#define STEPS 3

typedef struct span {
    char name[64];
    double ts, dur;
    int tid;
    long long bytes;
} span;

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->tid != y->tid) return x->tid - y->tid;
    if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
    return x->dur > y->dur ? -1 : x->dur < y->dur;
}

static long long files_bytes(const char *dir) { /* independent of st_prof_dir_bytes */
    DIR *d = opendir(dir);
    if (!d) return -1;
    long long total = 0;
    struct dirent *e;
    char p[4096];
    while ((e = readdir(d))) {
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (!stat(p, &sb) && S_ISREG(sb.st_mode)) total += sb.st_size;
    }
    closedir(d);
    return total;
}

int main(void) {
    st_train_config c;
    st_train_config_defaults(&c);
    st_err err = {0};
    const char *kv[][2] = {{"model", "gpt2-mini"}, {"n_layer", "2"}, {"n_embd", "64"}, {"n_head", "2"},
                           {"batch", "4"},         {"seq", "32"},    {"grad_accum", "2"}, {"steps", "3"},
                           {"ckpt_every", "2"},    {"quiet", "1"},   {"trace", "1"},
                           {"eval_every", "0"},    {"sample_every", "0"}}; /* training's spans only */
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++)
        if (st_train_config_set(&c, kv[i][0], kv[i][1], &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
    snprintf(c.run_dir, sizeof c.run_dir, "%s/run", test_tmpdir());
    st_train_result res;
    CHECK(st_train_run(&c, &res, &err) == ST_OK, "train_run: %s", err.msg);
    char path[2048];
    snprintf(path, sizeof path, "%s/trace.json", c.run_dir);
    json_object *root = json_object_from_file(path);
    CHECK(root != NULL, "%s is valid JSON: %s", path, json_util_get_last_err());
    if (!root) return test_finish("prof_trace");
    json_object *evs;
    CHECK(json_object_object_get_ex(root, "traceEvents", &evs), "traceEvents");
    int n = (int)json_object_array_length(evs);
    span *sp = calloc((size_t)n, sizeof *sp);
    int ns = 0, main_tid = -1, proc_named = 0, n_counter_rss = 0, n_counter_hwm = 0, n_counter_flops = 0;
    for (int i = 0; i < n; i++) {
        json_object *e = json_object_array_get_idx(evs, (size_t)i), *v, *args, *b;
        const char *ph = json_object_object_get_ex(e, "ph", &v) ? json_object_get_string(v) : "";
        const char *name = json_object_object_get_ex(e, "name", &v) ? json_object_get_string(v) : "";
        if (!strcmp(ph, "X")) {
            span *s = &sp[ns++];
            snprintf(s->name, sizeof s->name, "%s", name);
            s->ts = json_object_object_get_ex(e, "ts", &v) ? json_object_get_double(v) : -1;
            s->dur = json_object_object_get_ex(e, "dur", &v) ? json_object_get_double(v) : -1;
            s->tid = json_object_object_get_ex(e, "tid", &v) ? json_object_get_int(v) : -1;
            s->bytes = json_object_object_get_ex(e, "args", &args) && json_object_object_get_ex(args, "bytes", &b)
                           ? json_object_get_int64(b) : -1;
        } else if (!strcmp(ph, "C")) {
            n_counter_rss += !strcmp(name, "host memory resident (bytes)");
            n_counter_hwm += !strcmp(name, "host memory peak (bytes)");
            n_counter_flops += !strcmp(name, "achieved (GFLOP/s)");
        } else if (!strcmp(ph, "M") && json_object_object_get_ex(e, "args", &args) &&
                   json_object_object_get_ex(args, "name", &b)) {
            if (!strcmp(name, "thread_name") && !strcmp(json_object_get_string(b), "main"))
                main_tid = json_object_object_get_ex(e, "tid", &v) ? json_object_get_int(v) : -1;
            if (!strcmp(name, "process_name") && strstr(json_object_get_string(b), "strata")) proc_named = 1;
        }
    }
    CHECK(proc_named && main_tid > 0, "process named, main thread named (tid %d)", main_tid);
    CHECK(n_counter_rss == STEPS && n_counter_hwm == STEPS && n_counter_flops == STEPS,
          "a memory and a FLOP/s counter sample per step: %d %d %d", n_counter_rss, n_counter_hwm, n_counter_flops);

    /* every phase, per block where there are blocks */
    struct { const char *name; int want; } phases[] = {
        {"step 1", 1}, {"step 2", 1}, {"step 3", 1}, {"data wait", STEPS * ACCUM}, {"forward", STEPS * ACCUM},
        {"backward", STEPS * ACCUM}, {"embedding", STEPS * ACCUM}, {"classifier", STEPS * ACCUM},
        {"forward block 0", STEPS * ACCUM}, {"forward block 1", STEPS * ACCUM},
        {"backward block 0", STEPS * ACCUM}, {"backward block 1", STEPS * ACCUM},
        {"copy h2d tokens", STEPS * ACCUM}, {"copy d2h losses", STEPS * ACCUM},
        {"grad norm", STEPS}, {"optimizer", STEPS}, {"checkpoint write", 2}};
    for (size_t k = 0; k < sizeof phases / sizeof phases[0]; k++) {
        int count = 0;
        for (int i = 0; i < ns; i++) count += !strcmp(sp[i].name, phases[k].name) && sp[i].tid == main_tid;
        CHECK(count == phases[k].want, "span '%s' on the main thread: %d, want %d", phases[k].name, count,
              phases[k].want);
    }
    /* nesting per thread */
    qsort(sp, (size_t)ns, sizeof *sp, cmp_span);
    double stack[64];
    int depth = 0, prev_tid = -1, nest_ok = 1;
    for (int i = 0; i < ns; i++) {
        if (sp[i].tid != prev_tid) depth = 0, prev_tid = sp[i].tid;
        CHECK(sp[i].ts >= 0 && sp[i].dur >= 0, "span %s has ts and dur", sp[i].name);
        while (depth && sp[i].ts >= stack[depth - 1]) depth--;
        if (depth && sp[i].ts + sp[i].dur > stack[depth - 1] + 1e-3) {
            nest_ok = 0;
            fprintf(stderr, "  %s [%.3f +%.3f] straddles its parent's end %.3f\n", sp[i].name, sp[i].ts, sp[i].dur,
                    stack[depth - 1]);
        }
        if (depth < 64) stack[depth++] = sp[i].ts + sp[i].dur;
    }
    CHECK(nest_ok, "spans nest on every thread");
    /* copies in each step: trace = metrics = the batch's bytes (tokens in, losses out) */
    snprintf(path, sizeof path, "%s/metrics.jsonl", c.run_dir);
    FILE *mf = fopen(path, "r");
    CHECK(mf != NULL, "metrics.jsonl");
    char line[8192];
    int lines = 0;
    while (mf && fgets(line, sizeof line, mf)) {
        json_object *o = json_tokener_parse(line), *v, *phm;
        CHECK(o != NULL, "metrics line is JSON");
        if (!o) continue;
        lines++;
        long step = json_object_object_get_ex(o, "step", &v) ? json_object_get_int(v) : -1;
        long long xb = json_object_object_get_ex(o, "xfer_bytes", &v) ? json_object_get_int64(v) : -1;
        char sname[32];
        snprintf(sname, sizeof sname, "step %ld", step);
        const span *st = NULL;
        for (int i = 0; i < ns; i++)
            if (!strcmp(sp[i].name, sname)) st = &sp[i];
        long long tb = 0;
        for (int i = 0; st && i < ns; i++)
            if (sp[i].tid == main_tid && !strncmp(sp[i].name, "copy ", 5) && sp[i].ts >= st->ts &&
                sp[i].ts + sp[i].dur <= st->ts + st->dur + 1e-3)
                tb += sp[i].bytes;
        long long want = (long long)ACCUM * B * T * (4 + 4 + 4); /* inputs, targets (int32), losses (f32) */
        CHECK(st && tb == xb && xb == want, "step %ld: copy bytes in the trace %lld, in metrics %lld, batch %lld", step,
              tb, xb, want);
        double sum = 0, step_ms = -1, prof_ms = -1;
        int has_block_phase = 0;
        if (json_object_object_get_ex(o, "phase_ms", &phm)) {
            json_object_object_foreach(phm, key, val) {
                sum += json_object_get_double(val);
                if (strstr(key, "block")) has_block_phase = 1;
            }
        }
        if (json_object_object_get_ex(o, "prof_step_ms", &v)) prof_ms = json_object_get_double(v);
        if (json_object_object_get_ex(o, "step_ms", &v)) step_ms = json_object_get_double(v);
        CHECK(fabs(sum - prof_ms) <= 0.01 * prof_ms + 0.01, "step %ld: phases sum to %.3f ms, step %.3f ms", step, sum,
              prof_ms);
        CHECK(fabs(prof_ms - step_ms) <= 0.1 * step_ms + 1.0, "step %ld: profiler's step %.3f ms vs the loop's %.3f ms",
              step, prof_ms, step_ms);
        CHECK(!has_block_phase, "blocks are inside forward/backward, not phases of their own");
        const char *need[] = {"data wait", "forward", "backward", "grad norm", "optimizer", "other"};
        for (int k = 0; k < 6; k++)
            CHECK(json_object_object_get_ex(phm, need[k], &v), "step %ld: phase_ms has '%s'", step, need[k]);
        const char *fields[] = {"achieved_flops", "peak_flops", "flops_frac", "host_peak_bytes", "host_rss_bytes",
                                "host_plan_bytes", "exposed_xfer_ms"};
        for (int k = 0; k < 7; k++)
            CHECK(json_object_object_get_ex(o, fields[k], &v), "step %ld: metrics has %s", step, fields[k]);
        json_object_put(o);
    }
    if (mf) fclose(mf);
    CHECK(lines == STEPS, "%d metrics lines", lines);
    /* checkpoint writes carry the bytes of the files they wrote */
    int ck = 0;
    for (int i = 0; i < ns; i++) {
        if (strcmp(sp[i].name, "checkpoint write")) continue;
        long step = ck == 0 ? 2 : 3;
        snprintf(path, sizeof path, "%s/checkpoints/step_%08ld", c.run_dir, step);
        long long fb = files_bytes(path);
        CHECK(fb > 0 && sp[i].bytes == fb, "checkpoint of step %ld: span says %lld bytes, files hold %lld", step,
              sp[i].bytes, fb);
        ck++;
    }
    free(sp);
    json_object_put(root);
    return test_finish("prof_trace");
}
