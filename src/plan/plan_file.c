/* plan_file.c - a stream plan saved as JSON to run again exactly (plan.h, "plan files"):
 * strata plan -o writes one, strata train --plan FILE reads one (and writes the plan it
 * ran to RUN_DIR/plan.json). The reader checks every key (type, range, names) and refuses
 * a key it does not know, naming the file, the key and what to do; it never exits. */
#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/fileutil.h"
#include "strata/plan.h"

#define REMAKE "make the plan again with strata plan --device_budget BYTES -o FILE"

const char *st_plan_act_name(int act) {
    return act == ST_STREAM_ACT_KEEP ? "keep" : act == ST_STREAM_ACT_OFFLOAD ? "offload"
                                         : act == ST_STREAM_ACT_RECOMPUTE ? "recompute" : "?";
}

static int act_from_name(const char *s, size_t n) {
    static const char *names[] = {"keep", "recompute", "offload"}; /* st_stream_act's order */
    for (int a = 0; a < 3; a++)
        if (strlen(names[a]) == n && !strncmp(s, names[a], n)) return a;
    return n == 4 && !strncmp(s, "auto", 4) ? ST_PLAN_ACT_FREE : -1;
}

st_status st_plan_act_parse(const char *spec, int n_blocks, unsigned char *fixed, int *n_fixed, st_err *err) {
    *n_fixed = 0;
    for (int l = 0; l < n_blocks; l++) fixed[l] = ST_PLAN_ACT_FREE;
    if (!spec || !*spec) return ST_OK;
    int all = act_from_name(spec, strlen(spec));
    if (all >= 0 || !strchr(spec, ':')) {
        if (all < 0)
            return st_errf(err, ST_ERR_INVALID, "'%.60s' is not auto, keep, offload, recompute or BLOCKS:CHOICE items "
                           "(e.g. 0-3:recompute,7:keep)", spec);
        for (int l = 0; l < n_blocks; l++) fixed[l] = (unsigned char)all;
        *n_fixed = all == ST_PLAN_ACT_FREE ? 0 : n_blocks;
        return ST_OK;
    }
    for (const char *p = spec; *p;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        const char *colon = memchr(p, ':', n);
        char *e1 = NULL, *e2 = NULL;
        long lo = -1, hi = -1;
        if (colon && colon > p && *p >= '0' && *p <= '9') {
            lo = hi = strtol(p, &e1, 10);
            if (e1 < colon && *e1 == '-' && e1[1] >= '0' && e1[1] <= '9') hi = strtol(e1 + 1, &e2, 10);
            else e2 = e1;
        }
        int act = colon ? act_from_name(colon + 1, n - (size_t)(colon + 1 - p)) : -1;
        if (!colon || lo < 0 || e2 != colon || act < 0)
            return st_errf(err, ST_ERR_INVALID, "item '%.*s' is not BLOCKS:CHOICE (BLOCKS a block or a range as 0-3, "
                           "CHOICE keep, offload, recompute or auto)", (int)(n < 60 ? n : 60), p);
        if (hi < lo || hi >= n_blocks)
            return st_errf(err, ST_ERR_INVALID, "item '%.*s': blocks %ld-%ld, the model has blocks 0-%d",
                           (int)(n < 60 ? n : 60), p, lo, hi, n_blocks - 1);
        for (long l = lo; l <= hi; l++) fixed[l] = (unsigned char)act;
        p += n;
        if (*p == ',') p++;
    }
    for (int l = 0; l < n_blocks; l++) *n_fixed += fixed[l] != ST_PLAN_ACT_FREE;
    return ST_OK;
}

void st_plan_act_describe(const unsigned char *fixed, int n_blocks, char *buf, size_t cap) {
    size_t at = 0;
    buf[0] = 0;
    for (int l = 0; l < n_blocks;) {
        int e = l;
        while (e + 1 < n_blocks && fixed[e + 1] == fixed[l]) e++;
        if (fixed[l] != ST_PLAN_ACT_FREE && at < cap) {
            const char *sep = at ? ", " : "", *name = st_plan_act_name(fixed[l]);
            int w = e > l ? snprintf(buf + at, cap - at, "%sblocks %d-%d %s", sep, l, e, name)
                          : snprintf(buf + at, cap - at, "%sblock %d %s", sep, l, name);
            at += w > 0 ? (size_t)w : 0;
        }
        l = e + 1;
    }
    if (at >= cap && cap > 4) snprintf(buf + cap - 4, 4, "...");
}

const char *st_plan_clip_name(int clip) {
    return clip == ST_STREAM_CLIP_SPECULATE ? "speculate" : clip == ST_STREAM_CLIP_DEFER ? "defer"
                                         : clip == ST_STREAM_CLIP_AUTO ? "auto" : "?";
}

void st_plan_file_init(st_plan_file *f, const st_arch *a, const char *model, int B, int T, size_t device_budget,
                    const st_stream_plan *p, const st_plan_prediction *pred) {
    memset(f, 0, sizeof *f);
    snprintf(f->model, sizeof f->model, "%s", model ? model : "");
    snprintf(f->arch, sizeof f->arch, "%s", a->ops->name);
    f->n_blocks = a->lay.n_blocks;
    f->n_embd = a->lay.n_embd;
    f->vocab_size = a->lay.vocab_size;
    f->n_params = a->lay.n_params;
    f->batch = B;
    f->seq = T;
    f->device_budget = device_budget;
    f->plan = *p;
    if (pred) {
        f->has_prediction = 1;
        f->pred = *pred;
        f->device_bytes = pred->device_bytes;
    }
}

/* ------------------------------------------------------------------ writing */

/* The prediction's members, in the order strata plan --json has always printed them. */
static const char *const pred_keys[] = {"step_s", "compute_s", "recompute_s", "transfer_exposed_s",
                                        "optim_exposed_s", "host_work_s", "block_forward_s", "block_backward_s"};
#define N_PRED (sizeof pred_keys / sizeof pred_keys[0])

static double *pred_field(st_plan_prediction *p, size_t i) {
    double *f[N_PRED] = {&p->step_s, &p->compute_s, &p->recompute_s, &p->transfer_exposed_s,
                         &p->optim_exposed_s, &p->host_work_s, &p->block_fwd_s, &p->block_bwd_s};
    return f[i];
}

json_object *st_plan_file_to_json(const st_plan_file *f) {
    json_object *o = json_object_new_object(), *blocks = json_object_new_array();
    json_object_object_add(o, "strata_plan", json_object_new_int(ST_PLAN_FILE_VERSION));
    json_object_object_add(o, "model", json_object_new_string(f->model));
    json_object_object_add(o, "arch", json_object_new_string(f->arch));
    json_object_object_add(o, "n_blocks", json_object_new_int(f->n_blocks));
    json_object_object_add(o, "n_embd", json_object_new_int(f->n_embd));
    json_object_object_add(o, "vocab_size", json_object_new_int(f->vocab_size));
    json_object_object_add(o, "n_params", json_object_new_int64((int64_t)f->n_params));
    json_object_object_add(o, "batch", json_object_new_int(f->batch));
    json_object_object_add(o, "seq", json_object_new_int(f->seq));
    json_object_object_add(o, "device_budget", json_object_new_int64((int64_t)f->device_budget));
    if (f->device_bytes) json_object_object_add(o, "device_bytes", json_object_new_int64((int64_t)f->device_bytes));
    const st_stream_plan *p = &f->plan;
    json_object_object_add(o, "prefetch_depth", json_object_new_int(p->prefetch_depth));
    json_object_object_add(o, "vocab_chunk", json_object_new_int(p->vocab_chunk));
    json_object_object_add(o, "overlap_optim", json_object_new_boolean(p->overlap_optim));
    json_object_object_add(o, "clip", json_object_new_string(st_plan_clip_name(p->clip)));
    json_object_object_add(o, "grad_dtype", json_object_new_string(p->grad_dtype == ST_BF16 ? "bf16" : "f32"));
    json_object_object_add(o, "act_dtype", json_object_new_string(p->act_dtype == ST_BF16 ? "bf16" : "f32"));
    json_object_object_add(o, "optim_threads", json_object_new_int(p->optim_threads > 0 ? p->optim_threads : 1));
    for (int l = 0; l < p->n_layer && l < ST_STREAM_MAX_LAYERS; l++)
        json_object_array_add(blocks, json_object_new_string(st_plan_act_name(p->act[l])));
    json_object_object_add(o, "blocks", blocks);
    if (f->has_prediction) {
        json_object *t = json_object_new_object();
        st_plan_prediction pr = f->pred;
        for (size_t i = 0; i < N_PRED; i++) json_object_object_add(t, pred_keys[i], json_object_new_double(*pred_field(&pr, i)));
        json_object_object_add(o, "predicted", t);
    }
    return o;
}

st_status st_plan_file_save_json(const char *path, json_object *doc, st_err *err) {
    const char *text = json_object_to_json_string_ext(doc, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE);
    if (!text) return st_errf(err, ST_ERR_NOMEM, "%s: out of memory writing the plan", path);
    return st_write_text(path, text, err);
}

st_status st_plan_file_save(const char *path, const st_plan_file *f, st_err *err) {
    json_object *o = st_plan_file_to_json(f);
    st_status s = st_plan_file_save_json(path, o, err);
    json_object_put(o);
    return s;
}

/* ------------------------------------------------------------------ reading */

static st_status read_text(const char *path, char **out, size_t *len, st_err *err) {
    *out = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return st_errf(err, ST_ERR_IO, "plan file %s: cannot open: %s (%s, or give --plan auto)", path, strerror(errno),
                       REMAKE);
    struct stat sb;
    if (fstat(fileno(fp), &sb) == 0 && !S_ISREG(sb.st_mode)) {
        fclose(fp);
        return st_errf(err, ST_ERR_IO, "plan file %s: not a regular file; give the path of a plan file", path);
    }
    size_t cap = (size_t)sb.st_size + 1, n = 0;
    if (cap > ST_PLAN_FILE_MAX_BYTES + 1) {
        fclose(fp);
        return st_errf(err, ST_ERR_FORMAT, "plan file %s: %lld bytes, a plan is at most %u: is it the right file?", path,
                       (long long)sb.st_size, ST_PLAN_FILE_MAX_BYTES);
    }
    char *buf = malloc(cap);
    if (!buf) {
        fclose(fp);
        return st_errf(err, ST_ERR_NOMEM, "plan file %s: out of memory", path);
    }
    n = fread(buf, 1, cap - 1, fp);
    int bad = ferror(fp);
    fclose(fp);
    if (bad) {
        free(buf);
        return st_errf(err, ST_ERR_IO, "plan file %s: read error after %zu bytes", path, n);
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return ST_OK;
}

/* The keys a plan file may hold: the plan's, and what strata plan --json adds for people. */
static const char *const known_keys[] = {
    "strata_plan", "model", "arch", "n_blocks", "n_embd", "vocab_size", "n_params", "batch", "seq",
    "device_budget", "device_bytes", "prefetch_depth", "vocab_chunk", "overlap_optim", "clip", "grad_dtype",
    "act_dtype", "optim_threads", "blocks", "predicted", "fits", "profile", "solve_s", "optimal", "disk", "memory"};

/* An integer key in [lo, hi]: a JSON integer, or a number with no fraction (6e6). */
static st_status get_int(const char *path, json_object *o, const char *key, int required, long long lo, long long hi,
                         long long *out, st_err *err) {
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v)) {
        if (!required) return ST_OK;
        return st_errf(err, ST_ERR_FORMAT, "plan file %s: key '%s' is missing; %s", path, key, REMAKE);
    }
    long long x;
    if (json_object_is_type(v, json_type_int)) {
        x = (long long)json_object_get_int64(v);
    } else if (json_object_is_type(v, json_type_double)) {
        double d = json_object_get_double(v);
        if (!isfinite(d) || d != floor(d) || fabs(d) > 9e18)
            return st_errf(err, ST_ERR_FORMAT, "plan file %s: key '%s': %s is not a whole number; give an integer in "
                           "[%lld, %lld]", path, key, json_object_get_string(v), lo, hi);
        x = (long long)d;
    } else {
        return st_errf(err, ST_ERR_FORMAT, "plan file %s: key '%s' must be an integer, not %s; give one in [%lld, %lld]",
                       path, key, json_type_to_name(json_object_get_type(v)), lo, hi);
    }
    if (x < lo || x > hi)
        return st_errf(err, ST_ERR_FORMAT, "plan file %s: key '%s': %lld is outside [%lld, %lld]", path, key, x, lo, hi);
    *out = x;
    return ST_OK;
}

/* A string key's value (NULL when absent and not required). */
static st_status get_str(const char *path, json_object *o, const char *key, int required, const char **out,
                         st_err *err) {
    json_object *v;
    *out = NULL;
    if (!json_object_object_get_ex(o, key, &v)) {
        if (!required) return ST_OK;
        return st_errf(err, ST_ERR_FORMAT, "plan file %s: key '%s' is missing; %s", path, key, REMAKE);
    }
    if (!json_object_is_type(v, json_type_string))
        return st_errf(err, ST_ERR_FORMAT, "plan file %s: key '%s' must be a string, not %s", path, key,
                       json_type_to_name(json_object_get_type(v)));
    *out = json_object_get_string(v);
    return ST_OK;
}

static st_status get_bool(const char *path, json_object *o, const char *key, int required, int *out, st_err *err) {
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v)) {
        if (!required) return ST_OK;
        return st_errf(err, ST_ERR_FORMAT, "plan file %s: key '%s' is missing; %s", path, key, REMAKE);
    }
    if (!json_object_is_type(v, json_type_boolean))
        return st_errf(err, ST_ERR_FORMAT, "plan file %s: key '%s' must be true or false, not %s", path, key,
                       json_type_to_name(json_object_get_type(v)));
    *out = json_object_get_boolean(v);
    return ST_OK;
}

/* A finite number >= 0 (the prediction's seconds). */
static st_status get_seconds(const char *path, json_object *o, const char *where, const char *key, double *out,
                             st_err *err) {
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v))
        return st_errf(err, ST_ERR_FORMAT, "plan file %s: key '%s%s' is missing; %s (or remove '%s')", path, where, key,
                       REMAKE, where[0] ? "predicted" : key);
    if (!json_object_is_type(v, json_type_double) && !json_object_is_type(v, json_type_int))
        return st_errf(err, ST_ERR_FORMAT, "plan file %s: key '%s%s' must be a number of seconds, not %s", path, where,
                       key, json_type_to_name(json_object_get_type(v)));
    double d = json_object_get_double(v);
    if (!isfinite(d) || d < 0)
        return st_errf(err, ST_ERR_FORMAT, "plan file %s: key '%s%s': %s is not a finite number of seconds >= 0", path,
                       where, key, json_object_get_string(v));
    *out = d;
    return ST_OK;
}

static st_status parse_plan(const char *path, json_object *o, st_plan_file *f, st_err *err) {
    st_status s;
    long long x;
    /* what the file is, before anything else is judged */
    json_object *v;
    int fits = 1;
    if ((s = get_bool(path, o, "fits", 0, &fits, err))) return s;
    if (!fits || json_object_object_get_ex(o, "error", &v)) {
        const char *e = NULL;
        if (json_object_object_get_ex(o, "error", &v) && json_object_is_type(v, json_type_string))
            e = json_object_get_string(v);
        return st_errf(err, ST_ERR_FORMAT, "plan file %s holds no plan (key 'fits' is false%s%s): make one with a larger "
                       "--device_budget", path, e ? ": " : "", e ? e : "");
    }
    if (!json_object_object_get_ex(o, "strata_plan", &v))
        return st_errf(err, ST_ERR_FORMAT, "plan file %s: no \"strata_plan\" version key: is it a plan? strata plan "
                       "--device_budget BYTES -o FILE writes one", path);
    if ((s = get_int(path, o, "strata_plan", 1, 0, 1LL << 30, &x, err))) return s;
    if (x != ST_PLAN_FILE_VERSION)
        return st_errf(err, ST_ERR_FORMAT, "plan file %s: key 'strata_plan': version %lld, this strata reads version %d; "
                       "%s with this strata", path, x, ST_PLAN_FILE_VERSION, REMAKE);
    json_object_object_foreach(o, key, val) {
        (void)val;
        size_t i = 0;
        while (i < sizeof known_keys / sizeof known_keys[0] && strcmp(known_keys[i], key)) i++;
        if (i == sizeof known_keys / sizeof known_keys[0])
            return st_errf(err, ST_ERR_FORMAT, "plan file %s: unknown key '%.80s' (a misspelling?); remove it. Keys: "
                           "strata_plan, model, arch, n_blocks, n_embd, vocab_size, n_params, batch, seq, device_budget, "
                           "device_bytes, prefetch_depth, vocab_chunk, overlap_optim, clip, grad_dtype, act_dtype, optim_threads, "
                           "blocks, predicted, disk (and strata plan's fits, profile, solve_s, optimal)", path, key);
    }
    const char *str;
    if ((s = get_str(path, o, "model", 0, &str, err))) return s;
    if (str) snprintf(f->model, sizeof f->model, "%s", str);
    if ((s = get_str(path, o, "arch", 1, &str, err))) return s;
    if (!str[0] || strlen(str) >= sizeof f->arch)
        return st_errf(err, ST_ERR_FORMAT, "plan file %s: key 'arch': '%.40s' is not an architecture's name (gpt2, "
                       "llama)", path, str);
    snprintf(f->arch, sizeof f->arch, "%s", str);
    if ((s = get_int(path, o, "n_blocks", 1, 1, ST_STREAM_MAX_LAYERS, &x, err))) return s;
    f->n_blocks = (int)x;
    if ((s = get_int(path, o, "n_embd", 1, 1, 1 << 20, &x, err))) return s;
    f->n_embd = (int)x;
    if ((s = get_int(path, o, "vocab_size", 1, 1, 1 << 30, &x, err))) return s;
    f->vocab_size = (int)x;
    if ((s = get_int(path, o, "n_params", 1, 1, 1LL << 50, &x, err))) return s;
    f->n_params = (size_t)x;
    if ((s = get_int(path, o, "batch", 1, 1, 1 << 20, &x, err))) return s;
    f->batch = (int)x;
    if ((s = get_int(path, o, "seq", 1, 1, 1 << 20, &x, err))) return s;
    f->seq = (int)x;
    if ((s = get_int(path, o, "device_budget", 1, 1, (long long)1e18, &x, err))) return s;
    f->device_budget = (size_t)x;
    x = 0;
    if ((s = get_int(path, o, "device_bytes", 0, 1, (long long)1e18, &x, err))) return s;
    f->device_bytes = (size_t)x;

    st_stream_plan *p = &f->plan;
    st_stream_plan_default(p, f->n_blocks);
    if ((s = get_int(path, o, "prefetch_depth", 1, 1, 64, &x, err))) return s;
    p->prefetch_depth = (int)x;
    if ((s = get_int(path, o, "vocab_chunk", 1, 0, f->vocab_size, &x, err))) {
        size_t k = err ? strlen(err->msg) : 0;
        if (err) snprintf(err->msg + k, sizeof err->msg - k, " (0: the head resident on the device; else the rows of a chunk, at "
                 "most vocab_size)");
        return s;
    }
    p->vocab_chunk = (int)x;
    if ((s = get_bool(path, o, "overlap_optim", 1, &p->overlap_optim, err))) return s;
    if ((s = get_str(path, o, "clip", 1, &str, err))) return s;
    int c = 0;
    while (c <= ST_STREAM_CLIP_AUTO && strcmp(str, st_plan_clip_name(c))) c++;
    if (c > ST_STREAM_CLIP_AUTO)
        return st_errf(err, ST_ERR_FORMAT, "plan file %s: key 'clip': '%.40s' is not speculate, defer or auto", path, str);
    p->clip = (st_stream_clip)c;
    if ((s = get_str(path, o, "grad_dtype", 1, &str, err))) return s;
    if (strcmp(str, "f32") && strcmp(str, "bf16"))
        return st_errf(err, ST_ERR_FORMAT, "plan file %s: key 'grad_dtype': '%.40s' is not f32 or bf16", path, str);
    p->grad_dtype = strcmp(str, "f32") ? ST_BF16 : ST_F32;
    if ((s = get_str(path, o, "act_dtype", 0, &str, err))) return s; /* a file from before the key: f32 */
    if (str && strcmp(str, "f32") && strcmp(str, "bf16"))
        return st_errf(err, ST_ERR_FORMAT, "plan file %s: key 'act_dtype': '%.40s' is not f32 or bf16", path, str);
    p->act_dtype = str && !strcmp(str, "bf16") ? ST_BF16 : ST_F32;
    if ((s = get_int(path, o, "optim_threads", 1, 1, 4096, &x, err))) return s;
    p->optim_threads = (int)x;

    json_object *arr;
    if (!json_object_object_get_ex(o, "blocks", &arr))
        return st_errf(err, ST_ERR_FORMAT, "plan file %s: key 'blocks' is missing: a list of n_blocks (%d) entries, each "
                       "keep, offload or recompute", path, f->n_blocks);
    if (!json_object_is_type(arr, json_type_array))
        return st_errf(err, ST_ERR_FORMAT, "plan file %s: key 'blocks' must be a list of keep, offload or recompute, not "
                       "%s", path, json_type_to_name(json_object_get_type(arr)));
    size_t nb = json_object_array_length(arr);
    if (nb != (size_t)f->n_blocks)
        return st_errf(err, ST_ERR_FORMAT, "plan file %s: key 'blocks' has %zu entries, key 'n_blocks' says %d: give one "
                       "entry per block", path, nb, f->n_blocks);
    for (size_t l = 0; l < nb; l++) {
        json_object *e = json_object_array_get_idx(arr, l);
        const char *name = json_object_is_type(e, json_type_string) ? json_object_get_string(e) : NULL;
        int a = 0;
        while (name && a <= ST_STREAM_ACT_OFFLOAD && strcmp(name, st_plan_act_name(a))) a++;
        if (!name || a > ST_STREAM_ACT_OFFLOAD)
            return st_errf(err, ST_ERR_FORMAT, "plan file %s: key 'blocks': entry %zu is %s%.40s%s; each entry is "
                           "\"keep\", \"offload\" or \"recompute\"", path, l, name ? "'" : "",
                           name ? name : json_type_to_name(json_object_get_type(e)), name ? "'" : "");
        p->act[l] = (unsigned char)a;
    }

    json_object *t;
    if (json_object_object_get_ex(o, "predicted", &t)) {
        if (!json_object_is_type(t, json_type_object))
            return st_errf(err, ST_ERR_FORMAT, "plan file %s: key 'predicted' must be an object of seconds, not %s", path,
                           json_type_to_name(json_object_get_type(t)));
        json_object_object_foreach(t, pk, pv) {
            (void)pv;
            size_t i = 0;
            while (i < N_PRED && strcmp(pred_keys[i], pk)) i++;
            if (i == N_PRED)
                return st_errf(err, ST_ERR_FORMAT, "plan file %s: unknown key 'predicted.%.80s'; remove it", path, pk);
        }
        for (size_t i = 0; i < N_PRED; i++)
            if ((s = get_seconds(path, t, "predicted.", pred_keys[i], pred_field(&f->pred, i), err))) return s;
        f->has_prediction = 1;
        f->pred.device_bytes = f->device_bytes;
        f->pred.device_budget = f->device_budget;
        for (int l = 0; l < f->n_blocks; l++) {
            f->pred.n_keep += p->act[l] == ST_STREAM_ACT_KEEP;
            f->pred.n_offload += p->act[l] == ST_STREAM_ACT_OFFLOAD;
            f->pred.n_recompute += p->act[l] == ST_STREAM_ACT_RECOMPUTE;
        }
    }
    /* strata plan's additions, for people: only their types are checked */
    if (json_object_object_get_ex(o, "profile", &v) && !json_object_is_type(v, json_type_object))
        return st_errf(err, ST_ERR_FORMAT, "plan file %s: key 'profile' must be an object, not %s", path,
                       json_type_to_name(json_object_get_type(v)));
    /* the disk state's figures beside the prediction (st_plan_config_disk_to_json), for people */
    json_object *sb;
    int has_disk = json_object_object_get_ex(o, "disk", &v);
    if (has_disk && !json_object_is_type(v, json_type_object))
        return st_errf(err, ST_ERR_FORMAT, "plan file %s: key 'disk' must be an object, not %s", path,
                       json_type_to_name(json_object_get_type(v)));
    /* the store's host budget the plan was predicted with (run where the key state_budget is 0) */
    if (has_disk && json_object_object_get_ex(v, "state_budget", &sb)) {
        double b = json_object_get_double(sb);
        if (!json_object_is_type(sb, json_type_int) || !(b > 0) || b > 1e15)
            return st_errf(err, ST_ERR_FORMAT, "plan file %s: key 'disk.state_budget' must be a positive whole number "
                           "of bytes, not %s (make the plan again: strata plan ... -o FILE)", path,
                           json_object_to_json_string(sb));
        f->state_budget = (unsigned long long)json_object_get_int64(sb);
    }
    double sec;
    if (json_object_object_get_ex(o, "solve_s", &v) && (s = get_seconds(path, o, "", "solve_s", &sec, err))) return s;
    int opt;
    if ((s = get_bool(path, o, "optimal", 0, &opt, err))) return s;
    return ST_OK;
}

st_status st_plan_file_load(const char *path, st_plan_file *f, st_err *err) {
    memset(f, 0, sizeof *f);
    char *t = NULL;
    size_t n = 0;
    st_status s = read_text(path, &t, &n, err);
    if (s) return s;
    json_tokener *tok = json_tokener_new();
    if (!tok) {
        free(t);
        return st_errf(err, ST_ERR_NOMEM, "plan file %s: out of memory", path);
    }
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
    json_object *root = json_tokener_parse_ex(tok, t, (int)n);
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    size_t end = json_tokener_get_parse_end(tok);
    while (root && end < n && (t[end] == ' ' || t[end] == '\n' || t[end] == '\r' || t[end] == '\t')) end++;
    if (!root || jerr != json_tokener_success)
        s = st_errf(err, ST_ERR_FORMAT, "plan file %s: not valid JSON: %s at offset %zu; %s", path,
                    jerr == json_tokener_continue ? "the text ends early" : json_tokener_error_desc(jerr), end, REMAKE);
    else if (end < n)
        s = st_errf(err, ST_ERR_FORMAT, "plan file %s: offset %zu: bytes after the plan's closing '}'", path, end);
    else if (!json_object_is_type(root, json_type_object))
        s = st_errf(err, ST_ERR_FORMAT, "plan file %s: a plan is a JSON object, not %s; %s", path,
                    json_type_to_name(json_object_get_type(root)), REMAKE);
    else
        s = parse_plan(path, root, f, err);
    if (root) json_object_put(root);
    json_tokener_free(tok);
    free(t);
    return s;
}

st_status st_plan_file_check(const char *path, const st_plan_file *f, const st_arch *a, int B, int T, st_err *err) {
    const st_arch_layout *y = &a->lay;
    const char *what = NULL;
    long long want = 0, got = 0;
    if (strcmp(f->arch, a->ops->name))
        return st_errf(err, ST_ERR_INVALID, "plan file %s: key 'arch': the plan is for a %s model, this run's is %s; "
                       "make a plan for this model (strata plan with this run's keys --device_budget BYTES -o FILE)",
                       path, f->arch, a->ops->name);
    if (f->n_blocks != y->n_blocks) what = "n_blocks", want = y->n_blocks, got = f->n_blocks;
    else if (f->n_embd != y->n_embd) what = "n_embd", want = y->n_embd, got = f->n_embd;
    else if (f->vocab_size != y->vocab_size) what = "vocab_size", want = y->vocab_size, got = f->vocab_size;
    else if (f->n_params != y->n_params) what = "n_params", want = (long long)y->n_params, got = (long long)f->n_params;
    if (what)
        return st_errf(err, ST_ERR_INVALID, "plan file %s: key '%s': the plan was made for a model with %s %lld, this "
                       "run's has %lld; make a plan for this model (strata plan with this run's keys --device_budget "
                       "BYTES -o FILE)", path, what, what, got, want);
    if (f->batch != B || f->seq != T) {
        int batch = f->batch != B;
        return st_errf(err, ST_ERR_INVALID, "plan file %s: key '%s': the plan was made for %s %d, this run has %s %d; run "
                       "with --%s %d, or make a plan for %s %d (strata plan --%s %d ... -o FILE)", path,
                       batch ? "batch" : "seq", batch ? "batch" : "seq", batch ? f->batch : f->seq,
                       batch ? "batch" : "seq", batch ? B : T, batch ? "batch" : "seq", batch ? f->batch : f->seq,
                       batch ? "batch" : "seq", batch ? B : T, batch ? "batch" : "seq", batch ? B : T);
    }
    return ST_OK;
}
