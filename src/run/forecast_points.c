/* forecast_points.c - a run's evaluation points (strata/forecast.h): read from its
 * metrics.jsonl by strata forecast and by a resumed run's stopping rule, added to by the
 * loop as evaluations arrive. */
#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/forecast.h"

st_status st_forecast_points_add(st_forecast_points *p, long step, double loss, st_err *err) {
    while (p->n > 0 && p->step[p->n - 1] >= step) p->n--;
    if (p->n == p->cap) {
        int nc = p->cap ? 2 * p->cap : 64;
        long *s = realloc(p->step, sizeof(long) * (size_t)nc);
        if (s) p->step = s;
        double *l = s ? realloc(p->loss, sizeof(double) * (size_t)nc) : NULL;
        if (l) p->loss = l;
        if (!s || !l) return st_errf(err, ST_ERR_NOMEM, "forecast: out of memory for %d points", nc);
        p->cap = nc;
    }
    p->step[p->n] = step;
    p->loss[p->n++] = loss;
    return ST_OK;
}

void st_forecast_points_free(st_forecast_points *p) {
    free(p->step);
    free(p->loss);
    memset(p, 0, sizeof *p);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

st_status st_forecast_points_read(const char *path, long up_to, st_forecast_points *p, st_err *err) {
    memset(p, 0, sizeof *p);
    FILE *fp = fopen(path, "r");
    if (!fp) return st_errf(err, ST_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long lineno = 0, decided_at = 0;
    st_status s = ST_OK;
    int nf = 0, fcap = 0;
    double *fps = NULL;
    while (!s && (len = getline(&line, &cap, fp)) > 0) {
        lineno++;
        int complete = line[len - 1] == '\n';
        json_object *o = json_tokener_parse(line), *v;
        if (!o || !json_object_is_type(o, json_type_object) || !json_object_object_get_ex(o, "step", &v)) {
            if (o) json_object_put(o);
            if (!complete) break; /* the run is writing it */
            s = st_errf(err, ST_ERR_FORMAT, "%s:%ld: not a metrics record (a JSON object with a step)", path, lineno);
            break;
        }
        long step = (long)json_object_get_int64(v);
        if (up_to > 0 && step > up_to) {
            json_object_put(o);
            continue;
        }
        /* a resume's records replace those after its checkpoint */
        while (p->n > 0 && p->step[p->n - 1] >= step) p->n--;
        p->last_step = step;
        if (json_object_object_get_ex(o, "end_step", &v)) { /* a stopping rule's decision */
            p->end_step = (long)json_object_get_int64(v);
            p->decay_start = json_object_object_get_ex(o, "decay_start", &v) ? (long)json_object_get_int64(v) : 0;
            decided_at = step;
        } else if (step <= decided_at) { /* a resume from before the decision */
            p->decay_start = p->end_step = 0;
            decided_at = 0;
        }
        if (json_object_object_get_ex(o, "val_loss", &v) && json_object_is_type(v, json_type_double)) {
            double l = json_object_get_double(v);
            if (isfinite(l)) s = st_forecast_points_add(p, step, l, err);
        }
        json_object *g, *ms;
        if (json_object_object_get_ex(o, "achieved_gflops", &g) && json_object_object_get_ex(o, "step_ms", &ms)) {
            double x = json_object_get_double(g) * 1e9 * json_object_get_double(ms) * 1e-3;
            if (x > 0 && isfinite(x)) {
                if (nf == fcap) {
                    fcap = fcap ? 2 * fcap : 256;
                    double *t = realloc(fps, sizeof(double) * (size_t)fcap);
                    if (!t) s = st_errf(err, ST_ERR_NOMEM, "forecast: out of memory");
                    else fps = t;
                }
                if (!s) fps[nf++] = x;
            }
        }
        json_object_put(o);
    }
    free(line);
    fclose(fp);
    if (!s && nf) { /* each record's product carries its rounding: the median */
        qsort(fps, (size_t)nf, sizeof(double), cmp_double);
        p->flops_per_step = fps[nf / 2];
    }
    free(fps);
    if (s) st_forecast_points_free(p);
    return s;
}
