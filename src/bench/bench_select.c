/* bench_select.c - strata bench select: data selection against training on the whole corpus,
 * all compute counted (issue 27). On a corpus made by tools/gen_noisy_corpus.py --heldout N
 * (DIR/noisy: real text with injected noise, DIR/clean: the same text without it,
 * DIR/heldout: clean documents in neither, the validation set), per corpus: a small proxy
 * trained briefly on the corpus itself, its loss on every document (st_data_score_proxy),
 * deduplication (st_data_dedup) and a view keeping a band of the proxy losses without the
 * duplicates (st_data_select); then the model trained on the whole corpus and on the view,
 * the same steps, each with a learning rate decayed to 0 (st_train_run). Reported: each run's
 * final validation loss and FLOPs (the model's FLOPs a token x the tokens trained; the
 * selection side adds the proxy's training and the scoring), and the FLOP ratio at which the
 * selected run reaches the full run's final validation loss, read from its validation curve
 * by linear interpolation between evaluations. Optionally the same against a paced
 * curriculum (easy to hard by proxy loss) and online mixing (EXP3) over the proxy-loss
 * quartiles. With --bands 1, instead, the regime question: on a small corpus (seen for
 * several epochs) and a larger one (seen less than once), each with its own proxy, the
 * thirds of the proxy losses (easy, middle, hard) and the whole corpus, trained for the same
 * steps, decayed to 0. Everything goes through the library; the bench only configures, reads
 * metrics.jsonl and compares. */
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench/bench.h"
#include "strata/backend.h"
#include "strata/data.h"
#include "strata/model.h"
#include "strata/train.h"

static void usage(FILE *f) {
    fputs("usage: strata bench select --corpus DIR [options] [--json]\n"
          "  --corpus DIR       tools/gen_noisy_corpus.py --out DIR --heldout N: DIR/noisy, DIR/clean\n"
          "                     and DIR/heldout (the validation documents, in neither)\n"
          "  --model NAME       the trained model's preset (default gpt2-mini); --n_layer, --n_embd,\n"
          "                     --n_head override its shape; --vocab_size (default 320: bytes and the\n"
          "                     packer's end of document 256)\n"
          "  --batch B --seq T  (default 8 x 128)   --steps N (default 1000)   --lr (default 2e-3)\n"
          "  --warmup N         (default min(50, steps / 20)); the schedule is cosine to 0 (min_lr_frac 0): fully decayed\n"
          "  --eval_every N     (default steps / 20)   --eval_tokens N (default 32768)\n"
          "  --proxy_layers L --proxy_embd C --proxy_heads H  the proxy (default 2, 64, 2)\n"
          "  --proxy_steps N    (default 500)   --proxy_batch B --proxy_seq T (default 16 x 64)\n"
          "  --band LO HI       the view keeps the proxy-loss quantiles [LO, HI) (default 0 0.85)\n"
          "  --no_dedup         keep the duplicates in the view\n"
          "  --clean 0|1        also the comparison on DIR/clean (default 1)\n"
          "  --curriculum 0|1   also a paced run (the view's documents easy to hard, linear pacing from\n"
          "                     0.25 over the first half of the run) on the noisy corpus (default 1)\n"
          "  --online 0|1       also online mixing (EXP3) over the four proxy-loss quartiles of the\n"
          "                     deduplicated noisy corpus (default 1)\n"
          "  --budget R         also the view for the steps that put the selection side's FLOPs at the\n"
          "                     full run's / R, decayed to 0 over them: its final loss against the full\n"
          "                     run's (default 1.3, the issue's bar; 0: off)\n"
          "  --bands 0|1        instead, the regime question (default 0): on DIR/small (a small corpus, seen\n"
          "                     for several epochs; gen_noisy_corpus.py --small N) and on DIR/clean (one seen\n"
          "                     less than once), each with its own proxy, the three thirds of the proxy\n"
          "                     losses (easy, middle, hard; duplicates dropped first) and the whole corpus,\n"
          "                     each trained --steps steps decayed to 0 (equal FLOPs): which band wins\n"
          "  --threads N        (0: all cores)   --seed S (default 1)\n"
          "  --keep DIR         keep the runs, scores and views in DIR (default: a temporary, removed)\n"
          "  --json             print one JSON object\n"
          "Per corpus: full (every document), selected (the view), and their FLOPs; flop_ratio = the\n"
          "full run's FLOPs over the selection side's FLOPs (the proxy's training, the scoring and the\n"
          "selected run up to the step its validation curve reaches the full run's final validation\n"
          "loss, interpolated). The validation itself is not counted (the same on every side).\n",
          f);
}

typedef struct bopts {
    const char *corpus, *model, *keep;
    int n_layer, n_embd, n_head, vocab, B, T, threads, dedup, clean, curriculum, online, bands;
    long steps, warmup, eval_every, eval_tokens;
    int p_layers, p_embd, p_heads, p_B, p_T;
    long p_steps;
    double lr, band_lo, band_hi, budget;
    unsigned long long seed;
    int json;
} bopts;

/* A training run as the bench reads it back: its validation curve and FLOPs. */
typedef struct brun {
    int ok;
    double fpt;              /* the model's FLOPs a token at T (forward and backward) */
    long steps;              /* trained */
    double tokens, flops;
    double seconds;
    double final_val;
    int n;                   /* evaluations */
    long step[512];
    double val[512];
} brun;

/* Selection-side figures of one corpus. */
typedef struct bside {
    const char *name;
    char dataset[2048];
    uint64_t docs, tokens;
    double proxy_fpt, proxy_flops, proxy_s, score_flops, score_s, dedup_s;
    uint64_t exact, near;
    uint64_t view_docs, view_tokens;
    brun full, sel, cur, onl;
    brun bud;                /* the view at the steps that put its total at the full run's / budget */
} bside;

static st_status set(st_train_config *c, const char *key, st_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static st_status set(st_train_config *c, const char *key, st_err *err, const char *fmt, ...) {
    char v[2200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v, sizeof v, fmt, ap);
    va_end(ap);
    return st_train_config_set(c, key, v, err);
}

/* metrics.jsonl's evaluations: the steps holding "val_loss". */
static st_status read_curve(const char *run_dir, brun *r, st_err *err) {
    char path[2200], line[8192];
    st_run_path(path, sizeof path, run_dir, ST_RUN_METRICS);
    FILE *f = fopen(path, "r");
    if (!f) return st_errf(err, ST_ERR_IO, "%s: cannot read the run's metrics", path);
    r->n = 0;
    while (fgets(line, sizeof line, f)) {
        const char *v = strstr(line, "\"val_loss\":"), *s = strstr(line, "\"step\":");
        if (!v || !s || r->n == (int)(sizeof r->step / sizeof r->step[0])) continue;
        r->step[r->n] = strtol(s + 7, NULL, 10);
        r->val[r->n] = strtod(v + 11, NULL);
        r->n++;
    }
    fclose(f);
    if (r->n == 0) return st_errf(err, ST_ERR_FORMAT, "%s: no validation loss was logged", path);
    r->final_val = r->val[r->n - 1];
    return ST_OK;
}

/* The model's FLOPs a token at T, from the run's final weights (the training loop's count). */
static st_status model_fpt(const char *run_dir, int T, int threads, double *fpt, st_err *err) {
    st_backend *be = NULL;
    st_model *m = NULL;
    st_status s = st_backend_cpu_create(&be, threads, err);
    if (!s) s = st_train_open_model(&m, run_dir, be, NULL, 0, err);
    if (!s) *fpt = m->ops->flops_per_token(m, T);
    st_model_free(m);
    st_backend_free(be);
    return s;
}

/* One training run: data (a data list), validation on val (none for the proxy). proxy: the
 * proxy's shape, batch and steps, else the main model's; mix_online: key mix online. */
static st_status train(const bopts *o, const char *run_dir, const char *data, const char *val, int proxy,
                       int mix_online, brun *r, st_err *err) {
    st_train_config c;
    st_train_config_defaults(&c);
    memset(r, 0, sizeof *r);
    st_status s = set(&c, "model", err, "%s", o->model);
    if (!s) s = set(&c, "vocab_size", err, "%d", o->vocab);
    if (!s && (proxy ? o->p_layers : o->n_layer)) s = set(&c, "n_layer", err, "%d", proxy ? o->p_layers : o->n_layer);
    if (!s && (proxy ? o->p_embd : o->n_embd)) s = set(&c, "n_embd", err, "%d", proxy ? o->p_embd : o->n_embd);
    if (!s && (proxy ? o->p_heads : o->n_head)) s = set(&c, "n_head", err, "%d", proxy ? o->p_heads : o->n_head);
    if (!s) s = set(&c, "batch", err, "%d", proxy ? o->p_B : o->B);
    if (!s) s = set(&c, "seq", err, "%d", proxy ? o->p_T : o->T);
    if (!s) s = set(&c, "steps", err, "%ld", proxy ? o->p_steps : o->steps);
    if (!s) s = set(&c, "warmup_steps", err, "%ld", proxy ? (o->warmup < o->p_steps / 10 ? o->warmup : o->p_steps / 10) : o->warmup);
    if (!s) s = set(&c, "lr", err, "%.9g", proxy ? 3e-3 : o->lr);
    if (!s) s = set(&c, "schedule", err, "cosine");
    if (!s) s = set(&c, "min_lr_frac", err, "0");
    if (!s) s = set(&c, "data", err, "%s", data);
    if (!s) s = set(&c, "val_data", err, "%s", proxy ? "none" : val);
    if (!s) s = set(&c, "eval_every", err, "%ld", proxy ? 0 : o->eval_every);
    if (!s && !proxy) s = set(&c, "eval_tokens", err, "%ld", o->eval_tokens);
    if (!s) s = set(&c, "sample_every", err, "0");
    if (!s) s = set(&c, "ckpt_every", err, "0");
    if (!s) s = set(&c, "quiet", err, "1");
    if (!s) s = set(&c, "threads", err, "%d", o->threads);
    if (!s) s = set(&c, "seed", err, "%llu", o->seed);
    if (!s && mix_online) s = set(&c, "mix", err, "online");
    if (!s) s = set(&c, "run_dir", err, "%s", run_dir);
    if (s) return s;
    st_train_result res;
    double t0 = st_now();
    if ((s = st_train_run(&c, &res, err))) return s;
    r->seconds = st_now() - t0;
    r->steps = res.steps_done;
    r->tokens = (double)res.steps_done * c.batch * c.seq * (c.grad_accum > 0 ? c.grad_accum : 1);
    if (!proxy && (s = read_curve(run_dir, r, err))) return s;
    if ((s = model_fpt(run_dir, c.seq, o->threads, &r->fpt, err))) return s;
    r->flops = r->fpt * r->tokens;
    r->ok = 1;
    return ST_OK;
}

/* Where run r's validation curve first reaches target: the step, interpolated linearly
 * between the evaluations around it (the first evaluation's step when already there);
 * -1 when never. */
static double reach_step(const brun *r, double target) {
    for (int i = 0; i < r->n; i++) {
        if (r->val[i] > target) continue;
        if (i == 0) return (double)r->step[0];
        double v0 = r->val[i - 1], v1 = r->val[i];
        return r->step[i - 1] + (r->step[i] - r->step[i - 1]) * (v0 - target) / (v0 - v1);
    }
    return -1;
}

static void log_line(const bopts *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void log_line(const bopts *o, const char *fmt, ...) {
    if (o->json) return;
    va_list ap;
    va_start(ap, fmt);
    fputs("  ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* The selection side's preparation on one corpus: the proxy trained on it (in dir/proxy),
 * its loss on every document (written to scores) and, with dedup, its duplicates (written
 * to dedup); their FLOPs and times into sd. */
static st_status prepare_side(const bopts *o, const char *dir, bside *sd, const char *scores, const char *dedup,
                              st_err *err) {
    char proxy[1200], val[1100];
    snprintf(val, sizeof val, "%s/heldout", o->corpus);
    snprintf(proxy, sizeof proxy, "%s/proxy", dir);
    if (mkdir(dir, 0755) && access(dir, F_OK)) return st_errf(err, ST_ERR_IO, "%s: cannot create it", dir);
    st_data_ident id;
    st_status s = st_data_ident_compute(sd->dataset, &id, err);
    if (s) return s;
    sd->docs = id.n_docs, sd->tokens = id.n_tokens;

    brun pr;
    log_line(o, "%s: training the proxy (%ld steps)", sd->name, o->p_steps);
    if ((s = train(o, proxy, sd->dataset, val, 1, 0, &pr, err))) return s;
    sd->proxy_fpt = pr.fpt, sd->proxy_flops = pr.flops, sd->proxy_s = pr.seconds;

    log_line(o, "%s: scoring %llu documents with the proxy", sd->name, (unsigned long long)sd->docs);
    st_backend *be = NULL;
    st_model *m = NULL;
    st_data_scores sc = {0};
    st_data_proxy_stats ps;
    st_data_proxy_config pc;
    st_data_proxy_config_init(&pc);
    pc.B = o->p_B, pc.T = o->p_T, pc.model_name = "proxy";
    s = st_backend_cpu_create(&be, o->threads, err);
    if (!s) s = st_train_open_model(&m, proxy, be, NULL, 0, err);
    if (!s) s = st_data_score_proxy(sd->dataset, m, &pc, &sc, &ps, err);
    if (!s) s = st_data_scores_write(scores, &sc, err);
    st_data_scores_free(&sc);
    st_model_free(m);
    st_backend_free(be);
    if (s) return s;
    sd->score_flops = ps.flops, sd->score_s = ps.seconds;

    if (o->dedup) {
        log_line(o, "%s: deduplicating", sd->name);
        st_data_dedup_config dc;
        st_data_dedup_config_init(&dc);
        dc.threads = o->threads;
        st_data_dedup_stats ds;
        memset(&sc, 0, sizeof sc);
        s = st_data_dedup(sd->dataset, &dc, &sc, &ds, err);
        if (!s) s = st_data_scores_write(dedup, &sc, err);
        st_data_scores_free(&sc);
        if (s) return s;
        sd->dedup_s = ds.total_s, sd->exact = ds.exact, sd->near = ds.near;
    }
    return ST_OK;
}

/* The selection side of one corpus, then its runs. */
static st_status run_side(const bopts *o, const char *root, bside *sd, int extras, st_err *err) {
    char dir[1100], proxy[1200], scores[1200], dedup[1200], view[1200], data[4000], val[1100];
    snprintf(dir, sizeof dir, "%s/%s", root, sd->name);
    snprintf(val, sizeof val, "%s/heldout", o->corpus);
    snprintf(scores, sizeof scores, "%s/proxy.scores", dir);
    snprintf(dedup, sizeof dedup, "%s/dedup.scores", dir);
    snprintf(view, sizeof view, "%s/selected.view", dir);
    st_status s = prepare_side(o, dir, sd, scores, dedup, err);
    if (s) return s;
    st_data_view_info vi;

    st_data_select_config sel = {.dataset = sd->dataset, .scores = scores, .keep = ST_DATA_KEEP_BAND,
                                 .band_lo = o->band_lo, .band_hi = o->band_hi, .dedup = o->dedup ? dedup : NULL};
    if ((s = st_data_select(view, &sel, &vi, err))) return s;
    sd->view_docs = vi.n_kept, sd->view_tokens = vi.kept_tokens;

    snprintf(proxy, sizeof proxy, "%s/full", dir);
    log_line(o, "%s: the full run (%ld steps on %llu documents)", sd->name, o->steps, (unsigned long long)sd->docs);
    if ((s = train(o, proxy, sd->dataset, val, 0, 0, &sd->full, err))) return s;
    snprintf(proxy, sizeof proxy, "%s/selected", dir);
    log_line(o, "%s: the selected run (%ld steps on %llu documents)", sd->name, o->steps,
             (unsigned long long)sd->view_docs);
    if ((s = train(o, proxy, view, val, 0, 0, &sd->sel, err))) return s;
    if (o->budget > 0) { /* the bar taken directly: a shorter selected run, itself decayed to 0 */
        double per_step = sd->sel.fpt * o->B * o->T, over = sd->proxy_flops + sd->score_flops;
        long n = (long)floor((sd->full.flops / o->budget - over) / per_step);
        if (n > o->warmup && n >= 2) {
            bopts ob = *o;
            ob.steps = n;
            snprintf(proxy, sizeof proxy, "%s/budget", dir);
            log_line(o, "%s: the selected run at 1/%.2f of the full run's FLOPs (%ld steps)", sd->name, o->budget, n);
            if ((s = train(&ob, proxy, view, val, 0, 0, &sd->bud, err))) return s;
        }
    }
    if (!extras) return ST_OK;

    if (o->curriculum) {
        char pv[1200];
        snprintf(pv, sizeof pv, "%s/paced.view", dir);
        st_data_select_config cc = sel;
        /* paced over the first half of the run: its draws are about its tokens over the
         * view's mean document length */
        double len = 0.5 * (double)o->steps * o->B * o->T / (double)sd->view_tokens;
        cc.pace = (st_data_pacing){.kind = ST_DATA_PACE_LINEAR, .steps = 4, .start = 0.25, .length = len, .band = 0};
        if ((s = st_data_select(pv, &cc, &vi, err))) return s;
        snprintf(proxy, sizeof proxy, "%s/curriculum", dir);
        log_line(o, "%s: the curriculum run (%ld steps)", sd->name, o->steps);
        if ((s = train(o, proxy, pv, val, 0, 0, &sd->cur, err))) return s;
    }
    if (o->online) {
        data[0] = 0;
        for (int q = 0; q < 4; q++) {
            char qv[1200];
            snprintf(qv, sizeof qv, "%s/quartile%d.view", dir, q);
            st_data_select_config qc = sel;
            qc.band_lo = q * 0.25, qc.band_hi = (q + 1) * 0.25;
            if ((s = st_data_select(qv, &qc, &vi, err))) return s;
            snprintf(data + strlen(data), sizeof data - strlen(data), "%s%s", q ? "," : "", qv);
        }
        snprintf(proxy, sizeof proxy, "%s/online", dir);
        log_line(o, "%s: the online-mixing run (%ld steps over 4 quartiles)", sd->name, o->steps);
        if ((s = train(o, proxy, data, val, 0, 1, &sd->onl, err))) return s;
    }
    return ST_OK;
}

/* The regime question (--bands 1): on a corpus, three bands of equal size by proxy loss
 * (thirds of the ranked losses, duplicates dropped first: easy the lowest, middle, hard the
 * highest), each trained for the same steps as the whole corpus, decayed to 0. */
static const char *const band_names[3] = {"easy", "middle", "hard"};

typedef struct bband {
    double lo, hi;                  /* quantiles of the ranked proxy losses */
    uint64_t docs, tokens;          /* the view's */
    uint64_t sdocs;                 /* documents in the band by the bench's own ranking of the scores */
    double smin, smean, smax;       /* their proxy losses */
    brun r;
} bband;

typedef struct bregime {
    bside sd;                       /* the corpus, its proxy and scoring; sd.full the whole corpus's run */
    bband band[3];
} bregime;

static int dbl_cmp(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

/* The bands' proxy losses, ranked here from the score files (not from the views): the
 * documents the views should hold, to check them against. */
static st_status band_stats(const bopts *o, const char *scores, const char *dedup, bregime *rg, st_err *err) {
    st_data_scores sc = {0}, dd = {0};
    st_status s = st_data_scores_read(scores, rg->sd.dataset, &sc, err);
    if (!s && o->dedup) s = st_data_scores_read(dedup, rg->sd.dataset, &dd, err);
    double *v = s ? NULL : malloc(sizeof *v * (sc.n_docs ? sc.n_docs : 1));
    if (!s && !v) s = st_errf(err, ST_ERR_NOMEM, "out of memory ranking %llu scores", (unsigned long long)sc.n_docs);
    if (!s) {
        uint64_t m = 0;
        for (uint64_t d = 0; d < sc.n_docs; d++)
            if (!o->dedup || !dd.dup[d]) v[m++] = sc.score[d];
        qsort(v, m, sizeof *v, dbl_cmp);
        for (int b = 0; b < 3; b++) {
            bband *bd = &rg->band[b];
            uint64_t i0 = (uint64_t)floor(bd->lo * (double)m), i1 = (uint64_t)floor(bd->hi * (double)m);
            double sum = 0;
            for (uint64_t i = i0; i < i1; i++) sum += v[i];
            bd->sdocs = i1 - i0;
            bd->smin = i1 > i0 ? v[i0] : NAN, bd->smax = i1 > i0 ? v[i1 - 1] : NAN;
            bd->smean = i1 > i0 ? sum / (double)(i1 - i0) : NAN;
        }
    }
    free(v);
    st_data_scores_free(&sc);
    st_data_scores_free(&dd);
    return s;
}

static st_status run_bands(const bopts *o, const char *root, bregime *rg, st_err *err) {
    bside *sd = &rg->sd;
    char dir[1100], scores[1200], dedup[1200], view[1200], run[1200], val[1100];
    snprintf(dir, sizeof dir, "%s/bands-%s", root, sd->name);
    snprintf(val, sizeof val, "%s/heldout", o->corpus);
    snprintf(scores, sizeof scores, "%s/proxy.scores", dir);
    snprintf(dedup, sizeof dedup, "%s/dedup.scores", dir);
    st_status s = prepare_side(o, dir, sd, scores, dedup, err);
    if (s) return s;
    for (int b = 0; b < 3; b++) {
        bband *bd = &rg->band[b];
        bd->lo = b / 3.0, bd->hi = b == 2 ? 1.0 : (b + 1) / 3.0;
        snprintf(view, sizeof view, "%s/%s.view", dir, band_names[b]);
        st_data_select_config sel = {.dataset = sd->dataset, .scores = scores, .keep = ST_DATA_KEEP_BAND,
                                     .band_lo = bd->lo, .band_hi = bd->hi, .dedup = o->dedup ? dedup : NULL};
        st_data_view_info vi;
        if ((s = st_data_select(view, &sel, &vi, err))) return s;
        bd->docs = vi.n_kept, bd->tokens = vi.kept_tokens;
    }
    if ((s = band_stats(o, scores, dedup, rg, err))) return s;
    snprintf(run, sizeof run, "%s/full", dir);
    log_line(o, "%s: the whole corpus (%ld steps on %llu documents)", sd->name, o->steps, (unsigned long long)sd->docs);
    if ((s = train(o, run, sd->dataset, val, 0, 0, &sd->full, err))) return s;
    for (int b = 0; b < 3; b++) {
        snprintf(view, sizeof view, "%s/%s.view", dir, band_names[b]);
        snprintf(run, sizeof run, "%s/%s", dir, band_names[b]);
        log_line(o, "%s: the %s band (%ld steps on %llu documents)", sd->name, band_names[b], o->steps,
                 (unsigned long long)rg->band[b].docs);
        if ((s = train(o, run, view, val, 0, 0, &rg->band[b].r, err))) return s;
    }
    return ST_OK;
}

/* The band with the lowest final validation loss, and the second lowest. */
static void band_rank(const bregime *rg, int *best, int *second) {
    int o[3] = {0, 1, 2};
    for (int i = 0; i < 3; i++)
        for (int j = i + 1; j < 3; j++)
            if (rg->band[o[j]].r.final_val < rg->band[o[i]].r.final_val) {
                int t = o[i];
                o[i] = o[j], o[j] = t;
            }
    *best = o[0], *second = o[1];
}

/* One run against the full run: its figures and where it reaches the full run's final loss. */
static void print_cmp(const bside *sd, const char *name, const brun *r, int with_overhead, int last, const char *extra) {
    double over = with_overhead ? sd->proxy_flops + sd->score_flops : 0;
    double target = sd->full.final_val, s = reach_step(r, target);
    double per_step = r->tokens / (double)r->steps;
    printf("\"%s\":{%s\"final_val_loss\":%.6f,\"flops_per_token\":%.6g,\"tokens\":%.0f,\"train_flops\":%.6g,"
           "\"overhead_flops\":%.6g,\"total_flops\":%.6g,\"seconds\":%.2f,",
           name, extra, r->final_val, r->fpt, r->tokens, r->flops, over, r->flops + over, r->seconds);
    if (with_overhead) {
        if (s >= 0) {
            double f = r->fpt * per_step * s + over;
            printf("\"reaches_full_loss\":true,\"step_at_full_loss\":%.6f,\"flops_at_full_loss\":%.6g,"
                   "\"flop_ratio\":%.6g,\"meets_1_3x\":%s,",
                   s, f, sd->full.flops / f, sd->full.flops / f >= 1.3 ? "true" : "false");
        } else
            printf("\"reaches_full_loss\":false,\"step_at_full_loss\":null,\"flops_at_full_loss\":null,"
                   "\"flop_ratio\":null,\"meets_1_3x\":false,");
    }
    printf("\"curve\":[");
    for (int i = 0; i < r->n; i++) printf("%s[%ld,%.6f]", i ? "," : "", r->step[i], r->val[i]);
    printf("]}%s", last ? "" : ",");
}

static void print_side(const bopts *o, const bside *sd, int extras) {
    printf("\"%s\":{\"dataset\":\"%s\",\"documents\":%llu,\"tokens\":%llu,\"proxy_flops_per_token\":%.6g,\"proxy_train_flops\":%.6g,"
           "\"proxy_train_s\":%.2f,\"score_flops\":%.6g,\"score_s\":%.2f,\"dedup_s\":%.3f,\"exact_duplicates\":%llu,"
           "\"near_duplicates\":%llu,\"view_documents\":%llu,\"view_tokens\":%llu,",
           sd->name, sd->dataset, (unsigned long long)sd->docs, (unsigned long long)sd->tokens, sd->proxy_fpt,
           sd->proxy_flops, sd->proxy_s, sd->score_flops, sd->score_s, sd->dedup_s, (unsigned long long)sd->exact,
           (unsigned long long)sd->near, (unsigned long long)sd->view_docs, (unsigned long long)sd->view_tokens);
    int cur = extras && o->curriculum, onl = extras && o->online;
    print_cmp(sd, "full", &sd->full, 0, 0, "");
    print_cmp(sd, "selected", &sd->sel, 1, o->budget <= 0 && !cur && !onl, "");
    if (o->budget > 0) {
        const brun *b = &sd->bud;
        double over = sd->proxy_flops + sd->score_flops;
        if (b->ok)
            printf("\"budget\":{\"ratio\":%.6g,\"steps\":%ld,\"final_val_loss\":%.6f,\"train_flops\":%.6g,"
                   "\"total_flops\":%.6g,\"flop_ratio\":%.6g,\"reaches_full_loss\":%s,\"seconds\":%.2f}%s",
                   o->budget, b->steps, b->final_val, b->flops, b->flops + over, sd->full.flops / (b->flops + over),
                   b->final_val <= sd->full.final_val ? "true" : "false", b->seconds, cur || onl ? "," : "");
        else /* the overhead alone leaves no room */
            printf("\"budget\":{\"ratio\":%.6g,\"steps\":0,\"final_val_loss\":null,\"reaches_full_loss\":false}%s",
                   o->budget, cur || onl ? "," : "");
    }
    if (cur) print_cmp(sd, "curriculum", &sd->cur, 1, !onl, "");
    if (onl) print_cmp(sd, "online", &sd->onl, 1, 1, "");
    printf("}");
}

static void print_text(const bopts *o, const bside *sd, int extras) {
    printf("%s corpus: %llu documents, %llu tokens; view %llu documents, %llu tokens (band [%g, %g)%s)\n",
           sd->name, (unsigned long long)sd->docs, (unsigned long long)sd->tokens, (unsigned long long)sd->view_docs,
           (unsigned long long)sd->view_tokens, o->band_lo, o->band_hi, o->dedup ? ", duplicates dropped" : "");
    printf("  proxy training %.3g FLOPs (%.1f s), scoring %.3g FLOPs (%.1f s), dedup %.2f s\n", sd->proxy_flops,
           sd->proxy_s, sd->score_flops, sd->score_s, sd->dedup_s);
    printf("  full:       final val %.4f, %.4g FLOPs (%.1f s)\n", sd->full.final_val, sd->full.flops,
           sd->full.seconds);
    if (o->budget > 0 && sd->bud.ok) {
        double tot = sd->bud.flops + sd->proxy_flops + sd->score_flops;
        printf("  selected at 1/%.2f: %ld steps decayed to 0, final val %.4f (%s the full run's), %.4g FLOPs (the full run's over these: %.3f)\n",
               o->budget, sd->bud.steps, sd->bud.final_val, sd->bud.final_val <= sd->full.final_val ? "reaches" : "short of",
               tot, sd->full.flops / tot);
    }
    const brun *rs[3] = {&sd->sel, extras && o->curriculum ? &sd->cur : NULL, extras && o->online ? &sd->onl : NULL};
    const char *names[3] = {"selected", "curriculum", "online"};
    for (int i = 0; i < 3; i++) {
        if (!rs[i]) continue;
        const brun *r = rs[i];
        double over = sd->proxy_flops + sd->score_flops, s = reach_step(r, sd->full.final_val);
        printf("  %-11s final val %.4f, %.4g FLOPs with the proxy and scoring (%.1f s)", names[i], r->final_val,
               r->flops + over, r->seconds);
        if (s >= 0) {
            double f = r->fpt * (r->tokens / (double)r->steps) * s + over;
            printf("; reaches %.4f at step %.1f: %.4g FLOPs (the full run's over these: %.3f)\n", sd->full.final_val, s, f,
                   sd->full.flops / f);
        } else
            printf("; never reaches %.4f\n", sd->full.final_val);
    }
}

/* The JSON keys both modes print first: the corpus, the model and its run, the proxy. */
static void print_run_keys(const bopts *o) {
    printf("\"corpus\":\"%s\",\"model\":\"%s\",\"n_layer\":%d,\"n_embd\":%d,\"n_head\":%d,\"vocab_size\":%d,"
           "\"batch\":%d,\"seq\":%d,\"steps\":%ld,\"lr\":%.6g,\"warmup\":%ld,\"schedule\":\"cosine\","
           "\"min_lr_frac\":0,\"eval_every\":%ld,\"eval_tokens\":%ld,\"proxy\":{\"n_layer\":%d,\"n_embd\":%d,"
           "\"n_head\":%d,\"steps\":%ld,\"batch\":%d,\"seq\":%d}",
           o->corpus, o->model, o->n_layer, o->n_embd, o->n_head, o->vocab, o->B, o->T, o->steps, o->lr, o->warmup,
           o->eval_every, o->eval_tokens, o->p_layers, o->p_embd, o->p_heads, o->p_steps, o->p_B, o->p_T);
}

static void print_bands(const bopts *o, const bregime *rg) {
    const bside *sd = &rg->sd;
    int best, second;
    band_rank(rg, &best, &second);
    printf("\"%s\":{\"dataset\":\"%s\",\"documents\":%llu,\"tokens\":%llu,\"proxy_flops_per_token\":%.6g,"
           "\"proxy_train_flops\":%.6g,\"proxy_train_s\":%.2f,\"score_flops\":%.6g,\"score_s\":%.2f,\"dedup_s\":%.3f,"
           "\"exact_duplicates\":%llu,\"near_duplicates\":%llu,\"epochs\":%.6g,",
           sd->name, sd->dataset, (unsigned long long)sd->docs, (unsigned long long)sd->tokens, sd->proxy_fpt,
           sd->proxy_flops, sd->proxy_s, sd->score_flops, sd->score_s, sd->dedup_s, (unsigned long long)sd->exact,
           (unsigned long long)sd->near, sd->full.tokens / (double)sd->tokens);
    print_cmp(sd, "full", &sd->full, 0, 0, "");
    printf("\"bands\":{");
    for (int b = 0; b < 3; b++) {
        const bband *bd = &rg->band[b];
        char extra[512];
        snprintf(extra, sizeof extra,
                 "\"band\":[%.9g,%.9g],\"view_documents\":%llu,\"view_tokens\":%llu,\"epochs\":%.6g,\"ranked_documents\":%llu,"
                 "\"proxy_loss\":{\"min\":%.6f,\"mean\":%.6f,\"max\":%.6f},",
                 bd->lo, bd->hi, (unsigned long long)bd->docs, (unsigned long long)bd->tokens,
                 bd->r.tokens / (double)bd->tokens, (unsigned long long)bd->sdocs, bd->smin, bd->smean, bd->smax);
        print_cmp(sd, band_names[b], &bd->r, 1, b == 2, extra);
    }
    printf("},\"winner\":\"%s\",\"winner_margin\":%.6f,\"winner_minus_full\":%.6f}", band_names[best],
           rg->band[second].r.final_val - rg->band[best].r.final_val,
           rg->band[best].r.final_val - sd->full.final_val);
    (void)o;
}

static void print_bands_text(const bregime *rg) {
    const bside *sd = &rg->sd;
    int best, second;
    band_rank(rg, &best, &second);
    printf("%s corpus: %llu documents, %llu tokens; proxy training %.3g FLOPs, scoring %.3g FLOPs\n", sd->name,
           (unsigned long long)sd->docs, (unsigned long long)sd->tokens, sd->proxy_flops, sd->score_flops);
    printf("  whole corpus: %.2f epochs, final val %.4f, %.4g FLOPs (%.1f s)\n", sd->full.tokens / (double)sd->tokens,
           sd->full.final_val, sd->full.flops, sd->full.seconds);
    for (int b = 0; b < 3; b++) {
        const bband *bd = &rg->band[b];
        printf("  %-6s [%.3f, %.3f): %llu documents, %llu tokens, proxy loss %.3f-%.3f, %.2f epochs, final val %.4f "
               "(%.1f s)\n", band_names[b], bd->lo, bd->hi, (unsigned long long)bd->docs, (unsigned long long)bd->tokens,
               bd->smin, bd->smax, bd->r.tokens / (double)bd->tokens, bd->r.final_val, bd->r.seconds);
    }
    printf("  best band: %s, by %.4f over the next; %+.4f against the whole corpus\n", band_names[best],
           rg->band[second].r.final_val - rg->band[best].r.final_val, rg->band[best].r.final_val - sd->full.final_val);
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

static void loadavg(char *buf, size_t cap) {
    FILE *f = fopen("/proc/loadavg", "r");
    buf[0] = 0;
    if (f) {
        if (fgets(buf, (int)cap, f)) buf[strcspn(buf, " ")] = 0; /* the 1-minute figure */
        fclose(f);
    }
    if (!buf[0]) snprintf(buf, cap, "null");
}

int bench_select(int argc, char **argv) {
    bopts o = {.model = "gpt2-mini", .vocab = 320, .B = 8, .T = 128, .steps = 1000, .warmup = -1, .eval_every = 0,
               .eval_tokens = 32768, .p_layers = 2, .p_embd = 64, .p_heads = 2, .p_B = 16, .p_T = 64,
               .p_steps = 500, .lr = 2e-3, .band_lo = 0, .band_hi = 0.85, .dedup = 1, .clean = 1, .curriculum = 1,
               .online = 1, .seed = 1, .budget = 1.3};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int more = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--json")) o.json = 1;
        else if (!strcmp(a, "--no_dedup")) o.dedup = 0;
        else if (!strcmp(a, "--corpus") && more) o.corpus = argv[++i];
        else if (!strcmp(a, "--model") && more) o.model = argv[++i];
        else if (!strcmp(a, "--keep") && more) o.keep = argv[++i];
        else if (!strcmp(a, "--n_layer") && more) o.n_layer = atoi(argv[++i]);
        else if (!strcmp(a, "--n_embd") && more) o.n_embd = atoi(argv[++i]);
        else if (!strcmp(a, "--n_head") && more) o.n_head = atoi(argv[++i]);
        else if (!strcmp(a, "--vocab_size") && more) o.vocab = atoi(argv[++i]);
        else if (!strcmp(a, "--batch") && more) o.B = atoi(argv[++i]);
        else if (!strcmp(a, "--seq") && more) o.T = atoi(argv[++i]);
        else if (!strcmp(a, "--steps") && more) o.steps = atol(argv[++i]);
        else if (!strcmp(a, "--lr") && more) o.lr = atof(argv[++i]);
        else if (!strcmp(a, "--warmup") && more) o.warmup = atol(argv[++i]);
        else if (!strcmp(a, "--eval_every") && more) o.eval_every = atol(argv[++i]);
        else if (!strcmp(a, "--eval_tokens") && more) o.eval_tokens = atol(argv[++i]);
        else if (!strcmp(a, "--proxy_layers") && more) o.p_layers = atoi(argv[++i]);
        else if (!strcmp(a, "--proxy_embd") && more) o.p_embd = atoi(argv[++i]);
        else if (!strcmp(a, "--proxy_heads") && more) o.p_heads = atoi(argv[++i]);
        else if (!strcmp(a, "--proxy_steps") && more) o.p_steps = atol(argv[++i]);
        else if (!strcmp(a, "--proxy_batch") && more) o.p_B = atoi(argv[++i]);
        else if (!strcmp(a, "--proxy_seq") && more) o.p_T = atoi(argv[++i]);
        else if (!strcmp(a, "--band") && i + 2 < argc) o.band_lo = atof(argv[++i]), o.band_hi = atof(argv[++i]);
        else if (!strcmp(a, "--clean") && more) o.clean = atoi(argv[++i]);
        else if (!strcmp(a, "--curriculum") && more) o.curriculum = atoi(argv[++i]);
        else if (!strcmp(a, "--online") && more) o.online = atoi(argv[++i]);
        else if (!strcmp(a, "--bands") && more) o.bands = atoi(argv[++i]);
        else if (!strcmp(a, "--budget") && more) o.budget = atof(argv[++i]);
        else if (!strcmp(a, "--threads") && more) o.threads = atoi(argv[++i]);
        else if (!strcmp(a, "--seed") && more) o.seed = strtoull(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "strata bench select: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!o.corpus) {
        fprintf(stderr, "strata bench select: --corpus DIR is required (python3 tools/gen_noisy_corpus.py "
                        "--strata strata --out DIR --heldout 300 makes one)\n");
        return 2;
    }
    if (o.warmup < 0) o.warmup = o.steps / 20 < 50 ? o.steps / 20 : 50;
    if (o.steps < 2 || o.p_steps < 1 || o.warmup >= o.steps || o.eval_every < 0 ||
        o.eval_tokens < 1 || o.B < 1 || o.T < 2 || o.p_B < 1 || o.p_T < 2) {
        fprintf(stderr, "strata bench select: need steps >= 2, warmup < steps, proxy_steps >= 1, batch >= 1, "
                        "seq >= 2, eval_tokens >= 1, eval_every >= 0\n");
        return 2;
    }
    if (o.eval_every == 0) o.eval_every = o.steps / 20 > 0 ? o.steps / 20 : 1;
    if (o.steps / o.eval_every + 2 > 512) {
        fprintf(stderr, "strata bench select: --eval_every %ld gives more than 510 evaluations; give a larger one\n",
                o.eval_every);
        return 2;
    }
    char root[900], load0[32], load1[32];
    if (o.keep) {
        snprintf(root, sizeof root, "%s", o.keep);
        if (mkdir(root, 0755) && access(root, F_OK)) { perror("strata bench select: --keep"); return 1; }
    } else {
        snprintf(root, sizeof root, "/tmp/strata-bench-select-XXXXXX");
        if (!mkdtemp(root)) { perror("strata bench select: mkdtemp"); return 1; }
    }
    st_err err = {0};
    for (int k = 0; k < 3; k++) { /* every dataset there before any work */
        static const char *names[3] = {"noisy", "clean", "heldout"};
        char path[1100];
        st_data_ident id;
        snprintf(path, sizeof path, "%s/%s", o.corpus, k == 0 && o.bands ? "small" : names[k]);
        if ((k != 1 || o.clean || o.bands) && st_data_ident_compute(path, &id, &err)) {
            fprintf(stderr, "strata bench select: --corpus %s: %s (tools/gen_noisy_corpus.py --out DIR --heldout N "
                            "writes noisy, clean and heldout%s)\n", o.corpus, err.msg,
                    o.bands ? "; --bands 1 needs small too: add --small N" : "");
            if (!o.keep) rmdir(root);
            return 1;
        }
    }
    loadavg(load0, sizeof load0);
    double t0 = st_now();
    if (o.bands) {
        static bregime rg[2]; /* large: the runs' curves */
        static const char *names[2] = {"small", "clean"};
        int rc = 0;
        for (int k = 0; k < 2 && !rc; k++) {
            rg[k].sd.name = names[k];
            snprintf(rg[k].sd.dataset, sizeof rg[k].sd.dataset, "%s/%s", o.corpus, names[k]);
            if (run_bands(&o, root, &rg[k], &err)) {
                fprintf(stderr, "strata bench select --bands: %s corpus: %s\n", names[k], err.msg);
                rc = 1;
            }
        }
        loadavg(load1, sizeof load1);
        if (!rc && o.json) {
            printf("{\"mode\":\"bands\",");
            print_run_keys(&o);
            printf(",\"dedup\":%s,\"threads\":%d,\"seed\":%llu,", o.dedup ? "true" : "false", o.threads, o.seed);
            for (int k = 0; k < 2; k++) {
                print_bands(&o, &rg[k]);
                printf(",");
            }
            printf("\"seconds\":%.1f,\"load_before\":%s,\"load_after\":%s}\n", st_now() - t0, load0, load1);
        } else if (!rc) {
            for (int k = 0; k < 2; k++) print_bands_text(&rg[k]);
            printf("%.1f s in all; load %s -> %s\n", st_now() - t0, load0, load1);
        }
        if (!o.keep) nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
        return rc;
    }
    bside sides[2] = {{.name = "noisy"}, {.name = "clean"}};
    int n_sides = o.clean ? 2 : 1, rc = 0;
    for (int k = 0; k < n_sides && !rc; k++) {
        snprintf(sides[k].dataset, sizeof sides[k].dataset, "%s/%s", o.corpus, sides[k].name);
        if (run_side(&o, root, &sides[k], k == 0, &err)) {
            fprintf(stderr, "strata bench select: %s corpus: %s\n", sides[k].name, err.msg);
            rc = 1;
        }
    }
    loadavg(load1, sizeof load1);
    if (!rc && o.json) {
        printf("{");
        print_run_keys(&o);
        printf(",\"band\":[%g,%g],\"dedup\":%s,\"budget\":%g,\"threads\":%d,\"seed\":%llu,", o.band_lo, o.band_hi,
               o.dedup ? "true" : "false", o.budget, o.threads, o.seed);
        for (int k = 0; k < n_sides; k++) {
            print_side(&o, &sides[k], k == 0);
            printf(",");
        }
        printf("\"seconds\":%.1f,\"load_before\":%s,\"load_after\":%s}\n", st_now() - t0, load0, load1);
    } else if (!rc) {
        for (int k = 0; k < n_sides; k++) print_text(&o, &sides[k], k == 0);
        printf("%.1f s in all; load %s -> %s\n", st_now() - t0, load0, load1);
    }
    if (!o.keep) nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return rc;
}
