/* cmd_report.c - strata report RUN_DIR: one self-contained HTML page with inline SVG
 * charts of a run (loss, validation loss and learning rate, step time stacked by phase,
 * memory per tier over time, achieved FLOP/s against the measured peak, and the loss forecast:
 * evaluations, the LR-aware law's fit, its band and the stopping point; with mix online the
 * sources' weights; with doc_signals the loss distribution of the documents seen, early and
 * late) and a plain-text summary on the terminal. Reads only metrics.jsonl, config.json and
 * doc_signals.bin, so it works on a run in progress and on runs made without a trace. No scripts, no external files: the page opens
 * anywhere and prints as it looks. */
#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli_prof.h"
#include "strata/data.h"
#include "strata/forecast.h"
#include "strata/schedule.h"
#include "strata/train.h"

#define MAX_PHASES 24
#define MAX_POINTS 1200 /* series longer than this are averaged into buckets for drawing */
#define MAX_MIX 16      /* sources drawn in the mixture-weights chart */

static const char *palette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948",
                                "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac", "#1f77b4", "#8c564b"};
#define NPAL (sizeof palette / sizeof palette[0])

/* ------------------------------------------------------------------ the run's data */

typedef struct run_data {
    int n, cap;
    double *step, *loss, *lr, *step_ms, *tok_s, *gflops, *frac, *elapsed_s, *exposed_ms;
    double *host_peak, *host_rss, *host_plan, *gpu_lost;
    double *val_loss; /* NAN on the steps without a validation */
    double peak_gflops;
    int n_phases;
    char *phase_name[MAX_PHASES];
    double *phase_ms[MAX_PHASES];
    int has_prof; /* lines with the profiler's fields */
    int has_gpu;
    int n_mix;    /* mix online: the sources' weights a step (mix_weights), NAN where a line has none */
    double *mixw[MAX_MIX];
} run_data;

#define NCOLS 14
static void columns(run_data *d, double **c[NCOLS]) {
    double **t[NCOLS] = {&d->step, &d->loss, &d->lr, &d->step_ms, &d->tok_s, &d->gflops, &d->frac, &d->elapsed_s,
                         &d->exposed_ms, &d->host_peak, &d->host_rss, &d->host_plan, &d->gpu_lost, &d->val_loss};
    memcpy(c, t, sizeof t);
}

static int grow(run_data *d) {
    int nc = d->cap ? d->cap * 2 : 256;
    double **cols[NCOLS];
    columns(d, cols);
    for (int i = 0; i < NCOLS; i++) {
        double *p = realloc(*cols[i], sizeof(double) * (size_t)nc);
        if (!p) return -1;
        *cols[i] = p;
    }
    for (int k = 0; k < d->n_phases; k++) {
        double *p = realloc(d->phase_ms[k], sizeof(double) * (size_t)nc);
        if (!p) return -1;
        d->phase_ms[k] = p;
    }
    for (int k = 0; k < d->n_mix; k++) {
        double *p = realloc(d->mixw[k], sizeof(double) * (size_t)nc);
        if (!p) return -1;
        d->mixw[k] = p;
    }
    d->cap = nc;
    return 0;
}

static double jnum(json_object *o, const char *key, double dflt) {
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v)) return dflt;
    json_type t = json_object_get_type(v);
    return (t == json_type_double || t == json_type_int) ? json_object_get_double(v) : dflt;
}

static int phase_index(run_data *d, const char *name) {
    for (int k = 0; k < d->n_phases; k++)
        if (!strcmp(d->phase_name[k], name)) return k;
    if (d->n_phases == MAX_PHASES) return -1;
    int k = d->n_phases++;
    d->phase_name[k] = strdup(name);
    d->phase_ms[k] = calloc((size_t)d->cap, sizeof(double)); /* earlier steps: 0 */
    return k;
}

static int load_metrics(const char *run_dir, run_data *d, char *why, size_t whycap) {
    char path[4096];
    st_run_path(path, sizeof path, run_dir, ST_RUN_METRICS);
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(why, whycap, "%s: cannot open: %s (is %s a run directory of strata train?)", path, strerror(errno),
                 run_dir);
        return -1;
    }
    char *line = NULL;
    size_t lcap = 0;
    long lineno = 0;
    double elapsed = 0;
    while (getline(&line, &lcap, f) > 0) {
        lineno++;
        if (line[0] == '\n') continue;
        json_object *o = json_tokener_parse(line);
        if (!o || !json_object_is_type(o, json_type_object)) {
            /* a run in progress may be cut mid-line: tolerate only the last line */
            if (o) json_object_put(o);
            int c = fgetc(f);
            if (c == EOF) break;
            snprintf(why, whycap, "%s:%ld: not a JSON object", path, lineno);
            free(line);
            fclose(f);
            return -1;
        }
        if (d->n == d->cap && grow(d)) {
            snprintf(why, whycap, "out of memory");
            json_object_put(o);
            break;
        }
        int i = d->n++;
        d->step[i] = jnum(o, "step", i + 1);
        d->loss[i] = jnum(o, "loss", NAN);
        d->lr[i] = jnum(o, "lr", NAN);
        d->step_ms[i] = jnum(o, "step_ms", NAN);
        d->tok_s[i] = jnum(o, "tokens_per_s", NAN);
        double af = jnum(o, "achieved_flops", NAN);
        d->gflops[i] = isnan(af) ? jnum(o, "achieved_gflops", NAN) : af / 1e9;
        double pf = jnum(o, "peak_flops", NAN);
        if (pf > 0) d->peak_gflops = pf / 1e9;
        d->frac[i] = jnum(o, "flops_frac", NAN);
        elapsed += isnan(d->step_ms[i]) ? 0 : d->step_ms[i] / 1e3;
        d->elapsed_s[i] = elapsed;
        d->exposed_ms[i] = jnum(o, "exposed_xfer_ms", NAN);
        d->host_peak[i] = jnum(o, "host_peak_bytes", NAN);
        d->host_rss[i] = jnum(o, "host_rss_bytes", NAN);
        d->host_plan[i] = jnum(o, "host_plan_bytes", NAN);
        d->gpu_lost[i] = jnum(o, "gpu_freq_lost", NAN);
        d->val_loss[i] = jnum(o, "val_loss", NAN);
        if (!isnan(d->gpu_lost[i])) d->has_gpu = 1;
        for (int k = 0; k < d->n_mix; k++) d->mixw[k][i] = NAN;
        json_object *mw;
        if (json_object_object_get_ex(o, "mix_weights", &mw) && json_object_is_type(mw, json_type_array)) {
            int K = (int)json_object_array_length(mw);
            for (; d->n_mix < K && d->n_mix < MAX_MIX; d->n_mix++) { /* a source first seen: NAN before */
                double *p = malloc(sizeof(double) * (size_t)d->cap);
                if (!p) break;
                for (int j = 0; j <= i; j++) p[j] = NAN;
                d->mixw[d->n_mix] = p;
            }
            for (int k = 0; k < K && k < d->n_mix; k++) d->mixw[k][i] = json_object_get_double(json_object_array_get_idx(mw, k));
        }
        for (int k = 0; k < d->n_phases; k++) d->phase_ms[k][i] = 0;
        json_object *ph;
        if (json_object_object_get_ex(o, "phase_ms", &ph) && json_object_is_type(ph, json_type_object)) {
            d->has_prof = 1;
            json_object_object_foreach(ph, key, val) {
                int k = phase_index(d, key);
                if (k >= 0) d->phase_ms[k][i] = json_object_get_double(val);
            }
        }
        json_object_put(o);
    }
    free(line);
    fclose(f);
    if (d->n == 0) {
        snprintf(why, whycap, "%s has no steps yet", path);
        return -1;
    }
    /* "other" last, so the named phases stack from the bottom in the order they ran */
    for (int k = 0; k + 1 < d->n_phases; k++)
        if (!strcmp(d->phase_name[k], "other")) {
            char *nm = d->phase_name[k];
            double *v = d->phase_ms[k];
            memmove(&d->phase_name[k], &d->phase_name[k + 1], sizeof(char *) * (size_t)(d->n_phases - k - 1));
            memmove(&d->phase_ms[k], &d->phase_ms[k + 1], sizeof(double *) * (size_t)(d->n_phases - k - 1));
            d->phase_name[d->n_phases - 1] = nm;
            d->phase_ms[d->n_phases - 1] = v;
            break;
        }
    return 0;
}

static void free_run(run_data *d) {
    double **cols[NCOLS];
    columns(d, cols);
    for (int i = 0; i < NCOLS; i++) free(*cols[i]);
    for (int k = 0; k < d->n_phases; k++) free(d->phase_name[k]), free(d->phase_ms[k]);
    for (int k = 0; k < d->n_mix; k++) free(d->mixw[k]);
}

/* ------------------------------------------------------------------ the documents seen (doc_signals) */

/* Every record of RUN_DIR/doc_signals.bin with targets: its mean loss, its targets (the
 * weight) and its step. */
typedef struct doc_losses {
    long n, cap;
    double *mean, *w, *step;
    double last_step, mean_loss; /* mean_loss: every target's loss averaged (sum / count) */
    int have;
    char why[4400];
} doc_losses;

static void load_doc_losses(const char *run_dir, doc_losses *dl) {
    memset(dl, 0, sizeof *dl);
    uint8_t *h = malloc(ST_DATA_DOCSIG_HEADER_BYTES);
    FILE *f = NULL;
    uint32_t ns = 0;
    st_err err = {0};
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/%s", run_dir, ST_DATA_DOCSIG_FILE);
    if (!h || access(probe, F_OK) || st_data_docsig_open(run_dir, &f, h, &ns, &err)) {
        if (err.msg[0]) snprintf(dl->why, sizeof dl->why, "%s", err.msg); /* a file that is there and bad */
        free(h);
        return;
    }
    free(h);
    st_data_docsig r[1024];
    size_t got;
    double sum = 0, cnt = 0;
    while ((got = fread(r, sizeof *r, 1024, f)) > 0)
        for (size_t i = 0; i < got; i++) {
            if (!r[i].count) continue;
            if (dl->n == dl->cap) {
                long nc = dl->cap ? dl->cap * 2 : 4096;
                double *a = realloc(dl->mean, sizeof(double) * (size_t)nc), *b = a ? realloc(dl->w, sizeof(double) * (size_t)nc) : NULL;
                if (a) dl->mean = a;
                if (b) dl->w = b;
                double *c = b ? realloc(dl->step, sizeof(double) * (size_t)nc) : NULL;
                if (!c) {
                    snprintf(dl->why, sizeof dl->why, "out of memory reading %s", probe);
                    fclose(f);
                    return;
                }
                dl->step = c, dl->cap = nc;
            }
            dl->mean[dl->n] = r[i].loss_sum / r[i].count;
            dl->w[dl->n] = r[i].count;
            dl->step[dl->n] = (double)r[i].step;
            if (dl->step[dl->n] > dl->last_step) dl->last_step = dl->step[dl->n];
            sum += r[i].loss_sum, cnt += r[i].count;
            dl->n++;
        }
    fclose(f);
    dl->mean_loss = cnt > 0 ? sum / cnt : NAN;
    dl->have = dl->n > 0;
}

static void free_doc_losses(doc_losses *dl) { free(dl->mean), free(dl->w), free(dl->step); }

/* ------------------------------------------------------------------ statistics */

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Quantile q of the finite values of v[from..n); NAN if none. */
static double quantile(const double *v, int n, int from, double q) {
    double *t = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    int m = 0;
    for (int i = from; i < n; i++)
        if (isfinite(v[i])) t[m++] = v[i];
    double r = NAN;
    if (m) {
        qsort(t, (size_t)m, sizeof *t, cmp_d);
        double pos = q * (m - 1);
        int lo = (int)floor(pos);
        r = lo + 1 < m ? t[lo] + (pos - lo) * (t[lo + 1] - t[lo]) : t[lo];
    }
    free(t);
    return r;
}

static double vmax(const double *v, int n) {
    double m = -INFINITY;
    for (int i = 0; i < n; i++)
        if (isfinite(v[i]) && v[i] > m) m = v[i];
    return m;
}

static double vmin(const double *v, int n) {
    double m = INFINITY;
    for (int i = 0; i < n; i++)
        if (isfinite(v[i]) && v[i] < m) m = v[i];
    return m;
}

static int any_finite(const double *v, int n) {
    for (int i = 0; i < n; i++)
        if (isfinite(v[i])) return 1;
    return 0;
}

/* ------------------------------------------------------------------ SVG charts */

typedef struct chart {
    FILE *f;
    int W, H, ml, mr, mt, mb;
    double x0, x1, y0, y1, z0, z1; /* z: the optional right axis */
    int has_z;
} chart;

static double nice_step(double range, int target) {
    double raw = range / target, mag = pow(10, floor(log10(raw))), r = raw / mag;
    return (r < 1.5 ? 1 : r < 3 ? 2 : r < 7 ? 5 : 10) * mag;
}

static double px(const chart *c, double x) {
    double t = c->x1 > c->x0 ? (x - c->x0) / (c->x1 - c->x0) : 0.5;
    return c->ml + t * (c->W - c->ml - c->mr);
}

static double py_range(const chart *c, double y, double lo, double hi) {
    double t = hi > lo ? (y - lo) / (hi - lo) : 0.5;
    if (t < 0) t = 0;
    if (t > 1) t = 1; /* values beyond the axis (a slow first step) are drawn at its edge */
    return c->H - c->mb - t * (c->H - c->mt - c->mb);
}

static double py(const chart *c, double y) { return py_range(c, y, c->y0, c->y1); }

/* A tick label in few characters: 1.5k, 2M, 0.003, 1.2e-04. */
static void fmt_tick(char *b, size_t cap, double v, double step) {
    double a = fabs(v);
    if (a == 0) snprintf(b, cap, "0");
    else if (a >= 1e9) snprintf(b, cap, "%gG", v / 1e9);
    else if (a >= 1e6) snprintf(b, cap, "%gM", v / 1e6);
    else if (a >= 1e4) snprintf(b, cap, "%gk", v / 1e3);
    else if (a < 1e-3) snprintf(b, cap, "%.1e", v);
    else {
        int dec = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
        snprintf(b, cap, "%.*f", dec > 6 ? 6 : dec, v);
    }
}

static void esc(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '&') fputs("&amp;", f);
        else if (*s == '"') fputs("&quot;", f);
        else fputc(*s, f);
    }
}

static void axis_range(double *lo, double *hi, int from_zero) {
    if (!isfinite(*lo) || !isfinite(*hi)) *lo = 0, *hi = 1;
    if (from_zero && *lo > 0) *lo = 0;
    if (*hi <= *lo) *hi = *lo + (*lo != 0 ? fabs(*lo) * 0.1 : 1);
    double pad = (*hi - *lo) * 0.05;
    *hi += pad;
    if (!from_zero || *lo < 0) *lo -= pad;
    double st = nice_step(*hi - *lo, 5);
    *lo = floor(*lo / st) * st;
    *hi = ceil(*hi / st) * st;
}

typedef struct legend {
    const char **names, **colors;
    const int *dashed; /* NULL: all solid */
    int n;
} legend;

/* Lays the legend out in rows under the title, above the plot (it never covers data);
 * draws it when f is not NULL; returns the number of rows. */
static int legend_layout(FILE *f, const legend *lg, int x_left, int x_right, int y_top) {
    if (!lg || lg->n == 0) return 0;
    double x = x_left, y = y_top;
    int rows = 1;
    for (int i = 0; i < lg->n; i++) {
        double w = 22 + 6.6 * (double)strlen(lg->names[i]) + 14;
        if (x + w > x_right && x > x_left) x = x_left, y += 17, rows++;
        int dash = lg->dashed && lg->dashed[i];
        if (f) {
            fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"%s\"%s/>",
                    x, x + 16, y - 4, y - 4, lg->colors[i], dash ? "2" : "6", dash ? " stroke-dasharray=\"5 3\"" : "");
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#222\">", x + 21, y);
            esc(f, lg->names[i]);
            fputs("</text>\n", f);
        }
        x += w;
    }
    return rows;
}

static void chart_begin(chart *c, FILE *f, const char *title, const legend *lg, double x0, double x1, double y0,
                        double y1, const char *xlabel, const char *ylabel, int has_z, double z0, double z1,
                        const char *zlabel) {
    *c = (chart){f, 560, 330, 64, has_z ? 70 : 20, 36, 48, x0, x1, y0, y1, z0, z1, has_z};
    int rows = legend_layout(NULL, lg, c->ml, c->W - c->mr, 0);
    c->mt = 36 + 17 * rows + (rows ? 4 : 0);
    c->H += 17 * rows;
    fprintf(f, "<svg class=\"chart\" viewBox=\"0 0 %d %d\" width=\"%d\" height=\"%d\" "
            "xmlns=\"http://www.w3.org/2000/svg\" font-family=\"system-ui, sans-serif\" font-size=\"12\">\n",
            c->W, c->H, c->W, c->H);
    fprintf(f, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#fff\"/>\n", c->W, c->H);
    fprintf(f, "<text x=\"%d\" y=\"20\" font-size=\"15\" font-weight=\"600\" fill=\"#222\">", c->ml);
    esc(f, title);
    fputs("</text>\n", f);
    legend_layout(f, lg, c->ml, c->W - c->mr, 40);
    double xs = nice_step(x1 - x0 > 0 ? x1 - x0 : 1, 6), ys = nice_step(y1 - y0 > 0 ? y1 - y0 : 1, 5);
    char b[32];
    for (double y = ceil(y0 / ys) * ys; y <= y1 + ys * 1e-6; y += ys) {
        double yy = py(c, y);
        fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>\n", c->ml, c->W - c->mr, yy,
                yy);
        fmt_tick(b, sizeof b, fabs(y) < ys * 1e-9 ? 0 : y, ys);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\" fill=\"#555\">%s</text>\n", c->ml - 6, yy + 4, b);
    }
    for (double x = ceil(x0 / xs) * xs; x <= x1 + xs * 1e-6; x += xs) {
        double xx = px(c, x);
        fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" stroke=\"#f0f0f0\"/>\n", xx, xx, c->mt,
                c->H - c->mb);
        fmt_tick(b, sizeof b, x, xs);
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" fill=\"#555\">%s</text>\n", xx, c->H - c->mb + 16,
                b);
    }
    if (has_z) {
        double zs = nice_step(z1 - z0 > 0 ? z1 - z0 : 1, 5);
        for (double z = ceil(z0 / zs) * zs; z <= z1 + zs * 1e-6; z += zs) {
            fmt_tick(b, sizeof b, fabs(z) < zs * 1e-9 ? 0 : z, zs);
            fprintf(f, "<text x=\"%d\" y=\"%.1f\" fill=\"#555\">%s</text>\n", c->W - c->mr + 6,
                    py_range(c, z, z0, z1) + 4, b);
        }
        fprintf(f, "<text transform=\"translate(%d,%d) rotate(90)\" text-anchor=\"middle\" fill=\"#333\">",
                c->W - 10, (c->mt + c->H - c->mb) / 2);
        esc(f, zlabel);
        fputs("</text>\n", f);
    }
    fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"#888\"/>\n", c->ml, c->W - c->mr, c->H - c->mb,
            c->H - c->mb);
    fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"#888\"/>\n", c->ml, c->ml, c->mt, c->H - c->mb);
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" fill=\"#333\">", (c->ml + c->W - c->mr) / 2, c->H - 10);
    esc(f, xlabel);
    fprintf(f, "</text>\n<text transform=\"translate(14,%d) rotate(-90)\" text-anchor=\"middle\" fill=\"#333\">",
            (c->mt + c->H - c->mb) / 2);
    esc(f, ylabel);
    fputs("</text>\n", f);
}

/* Average long series into at most MAX_POINTS buckets: a 100k-step run stays a small page. */
static int decimate(const double *x, const double *y, int n, double *ox, double *oy) {
    if (n <= MAX_POINTS) {
        memcpy(ox, x, sizeof(double) * (size_t)n);
        memcpy(oy, y, sizeof(double) * (size_t)n);
        return n;
    }
    int m = 0;
    for (int b = 0; b < MAX_POINTS; b++) {
        int i0 = (int)((long long)b * n / MAX_POINTS), i1 = (int)((long long)(b + 1) * n / MAX_POINTS);
        double sx = 0, sy = 0;
        int k = 0;
        for (int i = i0; i < i1; i++)
            if (isfinite(y[i])) sx += x[i], sy += y[i], k++;
        if (k) ox[m] = sx / k, oy[m++] = sy / k;
    }
    return m;
}

static void chart_line(chart *c, const double *x, const double *y, int n, const char *color, double width,
                       int dashed, int right_axis) {
    double *dx = malloc(sizeof(double) * (size_t)(n + 1)), *dy = malloc(sizeof(double) * (size_t)(n + 1));
    int m = decimate(x, y, n, dx, dy);
    fprintf(c->f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%.1f\"%s stroke-linejoin=\"round\" points=\"",
            color, width, dashed ? " stroke-dasharray=\"6 4\"" : "");
    for (int i = 0; i < m; i++)
        if (isfinite(dy[i]))
            fprintf(c->f, "%.1f,%.1f ", px(c, dx[i]), right_axis ? py_range(c, dy[i], c->z0, c->z1) : py(c, dy[i]));
    fputs("\"/>\n", c->f);
    free(dx);
    free(dy);
}

static void chart_end(chart *c) { fputs("</svg>\n", c->f); }

/* ------------------------------------------------------------------ the forecast */

/* The run's forecast as strata forecast makes it (src/cli/cmd_forecast.c): config.json's
 * schedule, metrics.jsonl's evaluations, the law fitted to those up to the stopping rule's
 * decision when the run took one (the forecast the decision was made on), else to all. */
typedef struct report_forecast {
    int have;              /* a schedule and points were read */
    st_forecast f;
    st_schedule sc;        /* decay_start: the decision's, as the run took it */
    st_forecast_points pts;
    int first, n_fit;      /* the fitted points: pts[first .. first + n_fit) */
    long decided, end;     /* the decision's step (0: none) and the run's last step */
    char why[320];
} report_forecast;

static void load_forecast(const char *run_dir, report_forecast *rf) {
    memset(rf, 0, sizeof *rf);
    st_err err = {0};
    st_train_config cfg;
    st_train_config_defaults(&cfg);
    char path[4200];
    st_run_path(path, sizeof path, run_dir, ST_RUN_CONFIG);
    if (st_train_config_load_json(&cfg, path, &err) || st_train_config_schedule(&cfg, &rf->sc, &err)) {
        snprintf(rf->why, sizeof rf->why, "no forecast: %.300s", err.msg);
        return;
    }
    st_run_path(path, sizeof path, run_dir, ST_RUN_METRICS);
    if (st_forecast_points_read(path, 0, &rf->pts, &err)) {
        snprintf(rf->why, sizeof rf->why, "no forecast: %.300s", err.msg);
        return;
    }
    rf->have = 1;
    rf->sc.decay_start = rf->pts.decay_start;
    rf->end = st_schedule_end(&rf->sc);
    if (rf->pts.end_step > 0) {
        rf->decided = rf->pts.decay_start > 0 ? rf->pts.decay_start : rf->pts.end_step;
        rf->end = rf->pts.end_step;
    }
    int n = rf->pts.n;
    while (rf->decided > 0 && n > 0 && rf->pts.step[n - 1] > rf->decided) n--;
    rf->first = st_forecast_first_point(rf->pts.step, n, -1);
    rf->n_fit = n - rf->first;
    if (st_forecast_fit(&rf->f, &rf->sc, ST_FORECAST_LAMBDA, rf->pts.flops_per_step, rf->pts.step + rf->first,
                        rf->pts.loss + rf->first, rf->n_fit, &err)) {
        rf->f.state = ST_FORECAST_NOT_CONVERGED;
        snprintf(rf->f.why, sizeof rf->f.why, "%.250s", err.msg);
    }
    if (rf->f.state != ST_FORECAST_OK) snprintf(rf->why, sizeof rf->why, "no forecast: %.300s", rf->f.why);
    else {
        double band, L = st_forecast_loss(&rf->f, &rf->sc, rf->end, &band);
        snprintf(rf->why, sizeof rf->why, "loss at step %ld: %.4f +- %.4f (%s)", rf->end, L, band, rf->f.why);
    }
}

/* The chart: the evaluations (the fitted ones filled), the fit (solid over the fitted
 * steps, dashed beyond), its band, the decision and the end. */
static void forecast_chart(FILE *f, const report_forecast *rf) {
    chart c;
    const st_forecast_points *p = &rf->pts;
    int ok = rf->f.state == ST_FORECAST_OK;
    long x0s = p->n ? p->step[rf->first < p->n ? rf->first : 0] : 0, x1s = rf->end > 0 ? rf->end : 1;
    for (int i = 0; i < p->n; i++) x1s = p->step[i] > x1s ? p->step[i] : x1s;
    enum { K = 240 };
    double xs[K], L[K], lo[K], hi[K], y0 = INFINITY, y1 = -INFINITY;
    for (int i = rf->first; i < p->n; i++) y0 = fmin(y0, p->loss[i]), y1 = fmax(y1, p->loss[i]);
    if (ok)
        for (int k = 0; k < K; k++) {
            long st = x0s + (long)((double)(x1s - x0s) * k / (K - 1));
            double b;
            xs[k] = (double)st;
            L[k] = st_forecast_loss(&rf->f, &rf->sc, st, &b);
            lo[k] = L[k] - b, hi[k] = L[k] + b;
            y0 = fmin(y0, L[k]), y1 = fmax(y1, L[k]);
        }
    double x0 = (double)x0s, x1 = (double)x1s;
    if (x1 <= x0) x1 = x0 + 1;
    axis_range(&y0, &y1, 0);
    const char *names[] = {"validation loss (fitted)", "fit, then forecast (dashed)", "95% band", "stop decision / end"},
               *cols[] = {palette[2], palette[0], "#9ab8d8", palette[4]};
    int dash[] = {0, 0, 0, 1};
    legend lg = {names, cols, dash, ok ? 4 : 1};
    fputs("<div class=\"card\">", f);
    chart_begin(&c, f, "Loss forecast", &lg, x0, x1, y0, y1, "step", "validation loss", 0, 0, 0, "");
    if (ok) {
        fputs("<polygon class=\"band\" fill=\"#9ab8d8\" fill-opacity=\"0.35\" stroke=\"none\" points=\"", f);
        for (int k = 0; k < K; k++) fprintf(f, "%.1f,%.1f ", px(&c, xs[k]), py(&c, hi[k]));
        for (int k = K - 1; k >= 0; k--) fprintf(f, "%.1f,%.1f ", px(&c, xs[k]), py(&c, lo[k]));
        fputs("\"/>\n", f);
        int m = 0; /* the fitted steps: solid; beyond: dashed */
        while (m < K && xs[m] <= (double)rf->f.last_step) m++;
        if (m > 1) chart_line(&c, xs, L, m, palette[0], 2.0, 0, 0);
        if (m > 0 && m < K) chart_line(&c, xs + m - 1, L + m - 1, K - m + 1, palette[0], 2.0, 1, 0);
        else if (m == 0) chart_line(&c, xs, L, K, palette[0], 2.0, 1, 0);
    }
    for (int i = 0; i < p->n; i++) {
        if (p->step[i] < x0s) continue;
        int fitted = ok && i >= rf->first && i < rf->first + rf->n_fit;
        fprintf(f, "<circle class=\"fval\" cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\" stroke=\"%s\"/>\n",
                px(&c, (double)p->step[i]), py(&c, p->loss[i]), fitted ? palette[2] : "#fff", palette[2]);
    }
    long marks[2] = {rf->decided, rf->decided > 0 ? rf->end : 0};
    const char *mlab[2] = {"decision", "end"};
    for (int k = 0; k < 2; k++) {
        if (marks[k] <= 0) continue;
        double xx = px(&c, (double)marks[k]);
        int right = xx > c.W - c.mr - 90; /* near the right edge: the label on the line's left */
        fprintf(f, "<line class=\"stop\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"1.5\" "
                "stroke-dasharray=\"5 3\"/>\n<text x=\"%.1f\" y=\"%d\" fill=\"%s\" text-anchor=\"%s\">%s %ld</text>\n",
                xx, xx, c.mt, c.H - c.mb, palette[4], right ? xx - 4 : xx + 4, c.mt + 14 + 14 * k, palette[4],
                right ? "end" : "start", mlab[k], marks[k]);
    }
    if (!ok) {
        fprintf(f, "<text x=\"%d\" y=\"%d\" fill=\"#888\">", c.ml + 10, c.H / 2);
        esc(f, rf->why);
        fputs("</text>\n", f);
    }
    chart_end(&c);
    fputs("</div>\n", f);
}

/* ------------------------------------------------------------------ the page */

static void fmt_bytes(char *b, size_t cap, double v) {
    if (!isfinite(v)) snprintf(b, cap, "-");
    else if (v >= 1073741824.0) snprintf(b, cap, "%.2f GiB", v / 1073741824.0);
    else if (v >= 1048576.0) snprintf(b, cap, "%.1f MiB", v / 1048576.0);
    else snprintf(b, cap, "%.0f KiB", v / 1024.0);
}

typedef struct summary {
    char title[512], model[256];
    int n;
    double first_step, last_step, final_loss, min_loss, med_step_ms, med_tok_s, med_gflops, med_frac, peak_gflops;
    double host_peak, host_plan, med_exposed_ms, med_gpu_lost, total_s;
    int n_val;                                  /* steps with a validation loss */
    double val_final, val_final_step, val_min, val_min_step;
    double phase_med[MAX_PHASES];
} summary;

static void summarize(const run_data *d, const char *run_dir, summary *s) {
    memset(s, 0, sizeof *s);
    int from = d->n > 2 ? 1 : 0; /* the first step warms caches and threads: left out of medians */
    s->n = d->n;
    s->first_step = d->step[0];
    s->last_step = d->step[d->n - 1];
    s->final_loss = d->loss[d->n - 1];
    s->min_loss = vmin(d->loss, d->n);
    s->med_step_ms = quantile(d->step_ms, d->n, from, 0.5);
    s->med_tok_s = quantile(d->tok_s, d->n, from, 0.5);
    s->med_gflops = quantile(d->gflops, d->n, from, 0.5);
    s->med_frac = quantile(d->frac, d->n, from, 0.5);
    s->peak_gflops = d->peak_gflops;
    s->host_peak = vmax(d->host_peak, d->n);
    s->host_plan = vmax(d->host_plan, d->n);
    s->med_exposed_ms = quantile(d->exposed_ms, d->n, from, 0.5);
    s->med_gpu_lost = quantile(d->gpu_lost, d->n, from, 0.5);
    s->total_s = d->elapsed_s[d->n - 1];
    s->val_min = INFINITY;
    for (int i = 0; i < d->n; i++)
        if (isfinite(d->val_loss[i])) {
            s->n_val++;
            s->val_final = d->val_loss[i], s->val_final_step = d->step[i];
            if (d->val_loss[i] < s->val_min) s->val_min = d->val_loss[i], s->val_min_step = d->step[i];
        }
    for (int k = 0; k < d->n_phases; k++) s->phase_med[k] = quantile(d->phase_ms[k], d->n, from, 0.5);
    snprintf(s->title, sizeof s->title, "%s", run_dir);
    char path[4096];
    st_run_path(path, sizeof path, run_dir, ST_RUN_CONFIG);
    json_object *cfg = json_object_from_file(path);
    if (cfg) {
        json_object *v;
        const char *model = json_object_object_get_ex(cfg, "model", &v) ? json_object_get_string(v) : "?";
        snprintf(s->model, sizeof s->model, "%s, batch %.0f x seq %.0f x accum %.0f, optim_state %s, %.0f steps planned",
                 model, jnum(cfg, "batch", 0), jnum(cfg, "seq", 0), jnum(cfg, "grad_accum", 1),
                 json_object_object_get_ex(cfg, "optim_state", &v) ? json_object_get_string(v) : "?",
                 jnum(cfg, "steps", 0));
        json_object_put(cfg);
    }
}

static void print_summary(FILE *f, const run_data *d, const summary *s) {
    char b1[32], b2[32];
    fprintf(f, "run %s\n", s->title);
    if (s->model[0]) fprintf(f, "  model       %s\n", s->model);
    fprintf(f, "  steps       %.0f..%.0f (%d lines), %.1f s of steps\n", s->first_step, s->last_step, s->n, s->total_s);
    fprintf(f, "  loss        final %.4f, lowest %.4f\n", s->final_loss, s->min_loss);
    if (s->n_val)
        fprintf(f, "  validation  final %.4f (perplexity %.2f) at step %.0f, lowest %.4f at step %.0f (%d evaluations)\n",
                s->val_final, exp(s->val_final), s->val_final_step, s->val_min, s->val_min_step, s->n_val);
    fprintf(f, "  step time   median %.1f ms, %.0f tokens/s\n", s->med_step_ms, s->med_tok_s);
    if (s->peak_gflops > 0)
        fprintf(f, "  compute     median %.1f GFLOP/s = %.1f%% of the measured peak %.1f GFLOP/s\n", s->med_gflops,
                100 * s->med_frac, s->peak_gflops);
    else fprintf(f, "  compute     median %.1f GFLOP/s\n", s->med_gflops);
    if (d->n_phases) {
        fprintf(f, "  phases      (median ms per step)");
        for (int k = 0; k < d->n_phases; k++)
            fprintf(f, "%s%s %.1f", k % 4 == 0 ? "\n              " : ", ", d->phase_name[k], s->phase_med[k]);
        fputc('\n', f);
    }
    if (isfinite(s->med_exposed_ms)) fprintf(f, "  exposed transfer and I/O  median %.2f ms per step\n", s->med_exposed_ms);
    if (isfinite(s->host_peak)) {
        fmt_bytes(b1, sizeof b1, s->host_peak);
        fmt_bytes(b2, sizeof b2, s->host_plan);
        fprintf(f, "  memory      host peak %s (VmHWM); the plan estimated %s\n", b1, b2);
    }
    if (d->has_gpu) fprintf(f, "  GPU         median SM frequency lost %.1f%%\n", 100 * s->med_gpu_lost);
    if (!d->has_prof) fprintf(f, "  (metrics without the profiler's fields: no phases or memory)\n");
}

/* mix online: each source's weight a step */
static void mix_chart(FILE *f, const run_data *d) {
    int n = d->n;
    chart c;
    double x0 = d->step[0], x1 = d->step[n - 1], y0 = 0, y1 = 0;
    if (x1 <= x0) x1 = x0 + 1;
    for (int k = 0; k < d->n_mix; k++)
        if (any_finite(d->mixw[k], n) && vmax(d->mixw[k], n) > y1) y1 = vmax(d->mixw[k], n);
    axis_range(&y0, &y1, 1);
    char names[MAX_MIX][16];
    const char *ln[MAX_MIX], *lc[MAX_MIX];
    for (int k = 0; k < d->n_mix; k++) {
        snprintf(names[k], sizeof names[k], "source %d", k);
        ln[k] = names[k], lc[k] = palette[k % NPAL];
    }
    legend lg = {ln, lc, NULL, d->n_mix};
    fputs("<div class=\"card\">", f);
    chart_begin(&c, f, "Mixture weights (mix online)", &lg, x0, x1, y0, y1, "step", "weight", 0, 0, 0, "");
    for (int k = 0; k < d->n_mix; k++) chart_line(&c, d->step, d->mixw[k], n, palette[k % NPAL], 1.8, 0, 0);
    chart_end(&c);
    fputs("</div>\n", f);
}

#define DOC_BINS 30
/* doc_signals: the share of the targets whose segment's mean loss falls in each bin, for the
 * records of the first half of the steps and of the second */
static void doc_chart(FILE *f, const doc_losses *dl) {
    double *v = malloc(sizeof(double) * (size_t)dl->n);
    if (!v) return;
    memcpy(v, dl->mean, sizeof(double) * (size_t)dl->n);
    double lo = quantile(v, (int)dl->n, 0, 0.005), hi = quantile(v, (int)dl->n, 0, 0.995);
    free(v);
    if (!(hi > lo)) hi = lo + 1;
    double h[2][DOC_BINS] = {{0}}, tot[2] = {0, 0}, half = dl->last_step / 2;
    for (long i = 0; i < dl->n; i++) {
        int b = (int)((dl->mean[i] - lo) / (hi - lo) * DOC_BINS), part = dl->step[i] > half;
        b = b < 0 ? 0 : b >= DOC_BINS ? DOC_BINS - 1 : b;
        h[part][b] += dl->w[i], tot[part] += dl->w[i];
    }
    double xs[2 * DOC_BINS], ys[2][2 * DOC_BINS], y1 = 0, y0 = 0;
    for (int p = 0; p < 2; p++)
        for (int b = 0; b < DOC_BINS; b++) {
            double share = tot[p] > 0 ? h[p][b] / tot[p] : 0;
            xs[2 * b] = lo + (hi - lo) * b / DOC_BINS, xs[2 * b + 1] = lo + (hi - lo) * (b + 1) / DOC_BINS;
            ys[p][2 * b] = ys[p][2 * b + 1] = share;
            if (share > y1) y1 = share;
        }
    axis_range(&y0, &y1, 1);
    char n0[64], n1[64];
    snprintf(n0, sizeof n0, "steps 1-%.0f", half);
    snprintf(n1, sizeof n1, "steps %.0f-%.0f", half + 1, dl->last_step);
    const char *ln[2] = {n0, n1}, *lc[2] = {palette[0], palette[2]};
    legend lg = {ln, lc, NULL, tot[1] > 0 ? 2 : 1};
    chart c;
    fputs("<div class=\"card\">", f);
    chart_begin(&c, f, "Loss of the documents seen (doc_signals)", &lg, lo, hi, y0, y1,
                "a document segment's mean loss (nats per token)", "share of the targets", 0, 0, 0, "");
    for (int p = 0; p < 2; p++)
        if (tot[p] > 0) chart_line(&c, xs, ys[p], 2 * DOC_BINS, lc[p], 1.8, 0, 0);
    chart_end(&c);
    fputs("</div>\n", f);
}

static void write_html(FILE *f, const run_data *d, const summary *s, const report_forecast *rf,
                       const doc_losses *dl) {
    int n = d->n;
    fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>strata report: ", f);
    esc(f, s->title);
    fputs("</title>\n<style>\n"
          "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px auto;max-width:1180px;"
          "color:#222;background:#f6f7f9}\n"
          "h1{font-size:22px;margin:0 0 4px} .sub{color:#555;margin-bottom:16px}\n"
          ".grid{display:grid;grid-template-columns:repeat(2,580px);gap:16px}\n"
          ".card{background:#fff;border:1px solid #ddd;border-radius:8px;padding:8px}\n"
          "table{border-collapse:collapse;background:#fff;border:1px solid #ddd;margin-bottom:16px}\n"
          "td{padding:4px 12px;border-bottom:1px solid #eee} td:first-child{color:#555}\n"
          ".note{color:#666;font-size:13px;margin-top:12px}\n"
          "</style></head><body>\n<h1>strata run report</h1>\n<div class=\"sub\">", f);
    esc(f, s->title);
    if (s->model[0]) {
        fputs(" &mdash; ", f);
        esc(f, s->model);
    }
    fputs("</div>\n<table>\n", f);
    char b1[32], b2[32];
    fprintf(f, "<tr><td>steps</td><td>%.0f to %.0f (%.1f s of steps)</td></tr>\n", s->first_step, s->last_step,
            s->total_s);
    fprintf(f, "<tr><td>loss</td><td>final %.4f, lowest %.4f</td></tr>\n", s->final_loss, s->min_loss);
    if (s->n_val)
        fprintf(f, "<tr><td>validation loss</td><td>final %.4f (perplexity %.2f) at step %.0f, lowest %.4f at step %.0f "
                "(%d evaluations)</td></tr>\n", s->val_final, exp(s->val_final), s->val_final_step, s->val_min,
                s->val_min_step, s->n_val);
    fprintf(f, "<tr><td>step time (median)</td><td>%.1f ms, %.0f tokens/s</td></tr>\n", s->med_step_ms, s->med_tok_s);
    if (s->peak_gflops > 0)
        fprintf(f, "<tr><td>achieved (median)</td><td>%.1f GFLOP/s = %.1f%% of the measured peak (%.1f GFLOP/s)</td></tr>\n",
                s->med_gflops, 100 * s->med_frac, s->peak_gflops);
    if (isfinite(s->med_exposed_ms))
        fprintf(f, "<tr><td>exposed transfer and I/O (median)</td><td>%.2f ms per step</td></tr>\n", s->med_exposed_ms);
    if (isfinite(s->host_peak)) {
        fmt_bytes(b1, sizeof b1, s->host_peak);
        fmt_bytes(b2, sizeof b2, s->host_plan);
        fprintf(f, "<tr><td>host memory</td><td>peak %s (VmHWM); the plan estimated %s (strata plan)</td></tr>\n", b1, b2);
    }
    if (d->has_gpu)
        fprintf(f, "<tr><td>GPU frequency lost (median)</td><td>%.1f%%</td></tr>\n", 100 * s->med_gpu_lost);
    fputs("</table>\n<div class=\"grid\">\n", f);

    chart c;
    /* 1. loss and learning rate */
    {
        double x0 = d->step[0], x1 = d->step[n - 1];
        if (x1 <= x0) x1 = x0 + 1;
        double y0 = vmin(d->loss, n), y1 = vmax(d->loss, n), z0 = 0, z1 = vmax(d->lr, n);
        if (s->n_val) { /* the validation points share the loss axis */
            y0 = fmin(y0, vmin(d->val_loss, n));
            y1 = fmax(y1, vmax(d->val_loss, n));
        }
        axis_range(&y0, &y1, 0);
        axis_range(&z0, &z1, 1);
        fputs("<div class=\"card\">", f);
        const char *names[] = {"loss", "learning rate (right axis)", "validation loss"},
                   *cols[] = {palette[0], palette[1], palette[2]};
        int dash[] = {0, 1, 0};
        legend lg = {names, cols, dash, s->n_val ? 3 : 2};
        chart_begin(&c, f, "Loss and learning rate", &lg, x0, x1, y0, y1, "step", "loss", 1, z0, z1, "learning rate");
        chart_line(&c, d->step, d->loss, n, palette[0], 1.8, 0, 0);
        chart_line(&c, d->step, d->lr, n, palette[1], 1.6, 1, 1);
        /* validation: a marker per evaluation (they are sparse; a run has few) */
        for (int i = 0; i < n; i++)
            if (isfinite(d->val_loss[i]))
                fprintf(f, "<circle class=\"val\" cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>\n", px(&c, d->step[i]),
                        py(&c, d->val_loss[i]), palette[2]);
        chart_end(&c);
        fputs("</div>\n", f);
    }
    /* 2. step time stacked by phase */
    {
        fputs("<div class=\"card\">", f);
        double x0 = d->step[0], x1 = d->step[n - 1];
        if (x1 <= x0) x1 = x0 + 1;
        /* the axis fits the steady state: a slow first step is drawn cut at the top */
        double y0 = 0, y1 = quantile(d->step_ms, n, 0, 0.98) * 1.1;
        axis_range(&y0, &y1, 1);
        const char *names[MAX_PHASES], *cols[MAX_PHASES];
        for (int k = 0; k < d->n_phases; k++) {
            names[k] = d->phase_name[k];
            cols[k] = strcmp(d->phase_name[k], "other") ? palette[k % NPAL] : "#c9c9c9";
        }
        legend lg = {names, cols, NULL, d->n_phases};
        chart_begin(&c, f, d->n_phases ? "Step time by phase" : "Step time", &lg, x0, x1, y0, y1, "step",
                    "ms per step", 0, 0, 0, "");
        if (d->n_phases) {
            double *lo = calloc((size_t)n, sizeof(double)), *hi = calloc((size_t)n, sizeof(double));
            double *dx = malloc(sizeof(double) * (size_t)n), *dlo = malloc(sizeof(double) * (size_t)n),
                   *dhi = malloc(sizeof(double) * (size_t)n);
            for (int k = 0; k < d->n_phases; k++) {
                for (int i = 0; i < n; i++) hi[i] = lo[i] + d->phase_ms[k][i];
                int m = decimate(d->step, lo, n, dx, dlo);
                decimate(d->step, hi, n, dx, dhi);
                fprintf(f, "<polygon fill=\"%s\" fill-opacity=\"0.85\" stroke=\"none\" points=\"", cols[k]);
                if (m == 1) { /* one step: a bar */
                    fprintf(f, "%.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f", px(&c, x0), py(&c, dlo[0]), px(&c, x1),
                            py(&c, dlo[0]), px(&c, x1), py(&c, dhi[0]), px(&c, x0), py(&c, dhi[0]));
                } else {
                    for (int i = 0; i < m; i++) fprintf(f, "%.1f,%.1f ", px(&c, dx[i]), py(&c, dhi[i]));
                    for (int i = m - 1; i >= 0; i--) fprintf(f, "%.1f,%.1f ", px(&c, dx[i]), py(&c, dlo[i]));
                }
                fputs("\"/>\n", f);
                memcpy(lo, hi, sizeof(double) * (size_t)n);
            }
            free(lo), free(hi), free(dx), free(dlo), free(dhi);
        } else {
            chart_line(&c, d->step, d->step_ms, n, palette[0], 1.5, 0, 0);
        }
        chart_end(&c);
        fputs("</div>\n", f);
    }
    /* 3. memory per tier over time */
    {
        fputs("<div class=\"card\">", f);
        double x0 = 0, x1 = d->elapsed_s[n - 1];
        if (x1 <= x0) x1 = 1;
        const double *ys[3] = {d->host_peak, d->host_rss, d->host_plan};
        const char *names[3] = {"host peak (VmHWM)", "host resident (VmRSS)", "host plan (estimated peak)"};
        const char *cols[3] = {palette[2], palette[0], palette[4]};
        int dash[3] = {0, 0, 1};
        double ymax = 0;
        for (int k = 0; k < 3; k++)
            if (any_finite(ys[k], n) && vmax(ys[k], n) > ymax) ymax = vmax(ys[k], n);
        double unit = ymax >= 1073741824.0 ? 1073741824.0 : 1048576.0;
        double y0 = 0, y1 = ymax / unit;
        axis_range(&y0, &y1, 1);
        const char *ln[3], *lc[3];
        int ld[3], nl = 0;
        for (int k = 0; k < 3; k++)
            if (any_finite(ys[k], n)) ln[nl] = names[k], lc[nl] = cols[k], ld[nl++] = dash[k];
        legend lg = {ln, lc, ld, nl};
        chart_begin(&c, f, "Memory per tier", &lg, x0, x1, y0, y1, "seconds of steps",
                    unit > 1048576.0 ? "GiB" : "MiB", 0, 0, 0, "");
        double *scaled = malloc(sizeof(double) * (size_t)n);
        for (int k = 0; k < 3; k++) {
            if (!any_finite(ys[k], n)) continue;
            for (int i = 0; i < n; i++) scaled[i] = ys[k][i] / unit;
            chart_line(&c, d->elapsed_s, scaled, n, cols[k], k == 2 ? 1.6 : 2.0, dash[k], 0);
        }
        free(scaled);
        if (!nl) fprintf(f, "<text x=\"%d\" y=\"%d\" fill=\"#888\">no memory fields in metrics.jsonl</text>\n", c.ml + 20,
                     c.H / 2);
        chart_end(&c);
        fputs("</div>\n", f);
    }
    /* 4. achieved FLOP/s */
    {
        fputs("<div class=\"card\">", f);
        double x0 = d->step[0], x1 = d->step[n - 1];
        if (x1 <= x0) x1 = x0 + 1;
        double y0 = 0, y1 = vmax(d->gflops, n);
        if (d->peak_gflops > y1) y1 = d->peak_gflops;
        axis_range(&y0, &y1, 1);
        const char *names[2] = {"achieved (model FLOPs / step time)", "measured peak (sgemm)"};
        const char *cols[2] = {palette[4], palette[2]};
        int dash[2] = {0, 1};
        legend lg = {names, cols, dash, d->peak_gflops > 0 ? 2 : 1};
        chart_begin(&c, f, "Achieved FLOP/s", &lg, x0, x1, y0, y1, "step", "GFLOP/s", 0, 0, 0, "");
        chart_line(&c, d->step, d->gflops, n, palette[4], 1.8, 0, 0);
        if (d->peak_gflops > 0) {
            double yy = py(&c, d->peak_gflops);
            fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\" "
                    "stroke-dasharray=\"6 4\"/>\n", c.ml, c.W - c.mr, yy, yy, palette[2]);
            fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\" fill=\"%s\">%.1f GFLOP/s</text>\n", c.W - c.mr - 4,
                    yy - 5, palette[2], d->peak_gflops);
        }
        chart_end(&c);
        fputs("</div>\n", f);
    }
    /* 5. the loss forecast (runs with evaluations at two steps or more) */
    if (rf->have && rf->pts.n >= 2) forecast_chart(f, rf);
    /* 6. mix online's weights; 7. the documents' losses */
    if (d->n_mix) mix_chart(f, d);
    if (dl->have) doc_chart(f, dl);
    fputs("</div>\n<p class=\"note\">From metrics.jsonl and config.json, written by <code>strata report</code>. "
          "Medians leave out the first step (warm-up). The step-time axis is scaled to the 98th percentile; "
          "taller steps are cut at the top. Phases are the spans directly inside each step; "
          "&ldquo;other&rdquo; is the rest of the step. With <code>--trace 1</code> the run also has "
          "trace.json (open it in ui.perfetto.dev).</p>\n</body></html>\n", f);
}

static void report_usage(FILE *f) {
    fprintf(f, "usage: strata report RUN_DIR [-o FILE.html] [--quiet]\n"
               "  Writes RUN_DIR/report.html (charts: loss and learning rate, step time by phase,\n"
               "  memory per tier, achieved FLOP/s, the loss forecast; with mix online the sources'\n"
               "  weights, with doc_signals the loss distribution of the documents seen) and prints a\n"
               "  summary of the run.\n");
}

int cmd_report(int argc, char **argv) {
    const char *run_dir = NULL, *out = NULL;
    int quiet = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            report_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "-o") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--quiet")) quiet = 1;
        else if (argv[i][0] != '-' && !run_dir) run_dir = argv[i];
        else {
            fprintf(stderr, "strata report: unexpected argument '%s'\n", argv[i]);
            report_usage(stderr);
            return 2;
        }
    }
    if (!run_dir) {
        report_usage(stderr);
        return 2;
    }
    run_data d = {0};
    char why[4200] = "";
    if (load_metrics(run_dir, &d, why, sizeof why)) {
        fprintf(stderr, "strata report: %s\n", why);
        free_run(&d);
        return 1;
    }
    summary s;
    summarize(&d, run_dir, &s);
    char path[4200];
    if (out) snprintf(path, sizeof path, "%s", out);
    else st_run_path(path, sizeof path, run_dir, ST_RUN_REPORT);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "strata report: %s: cannot create: %s\n", path, strerror(errno));
        free_run(&d);
        return 1;
    }
    report_forecast rf;
    load_forecast(run_dir, &rf);
    doc_losses dl;
    load_doc_losses(run_dir, &dl);
    if (dl.why[0]) fprintf(stderr, "strata report: the documents' chart left out: %s\n", dl.why);
    write_html(f, &d, &s, &rf, &dl);
    int bad = ferror(f) | (fclose(f) != 0);
    if (bad) {
        fprintf(stderr, "strata report: %s: write failed: %s\n", path, strerror(errno));
        st_forecast_points_free(&rf.pts);
        free_doc_losses(&dl);
        free_run(&d);
        return 1;
    }
    if (!quiet) {
        print_summary(stdout, &d, &s);
        if (rf.have && rf.pts.n >= 2) printf("  forecast    %s\n", rf.why);
        if (d.n_mix) {
            printf("  mix online  weights at step %.0f:", d.step[d.n - 1]);
            for (int k = 0; k < d.n_mix; k++) printf(" %.4f", d.mixw[k][d.n - 1]);
            putchar('\n');
        }
        if (dl.have)
            printf("  documents   %ld records (doc_signals), mean loss %.6f nats per token\n", dl.n, dl.mean_loss);
        printf("  report      %s\n", path);
    }
    st_forecast_points_free(&rf.pts);
    free_doc_losses(&dl);
    free_run(&d);
    return 0;
}
