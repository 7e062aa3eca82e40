/* bench_pair.c - the scaffolding bench lora and bench poet share (bench_pair.h): their common
 * command line, the full-AdamW side and the method side built from one preset and seed, the
 * alternated timed steps and their medians, the load average, the cleanup. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/bench_pair.h"

void bench_pair_init(bench_pair *p, const char *name) {
    memset(p, 0, sizeof *p);
    p->name = name;
    p->model = "gpt2-mini";
    p->batch = 8;
    p->seq = 128;
    p->steps = 7;
}

static const bench_opt *find_opt(const bench_opt *opts, int n, const char *a) {
    for (int k = 0; k < n; k++)
        if (!strcmp(opts[k].name, a)) return &opts[k];
    return NULL;
}

int bench_pair_parse(bench_pair *p, int argc, char **argv, const char *usage, const bench_opt *opts, int n_opts) {
    const bench_opt common[] = {{"--json", 'f', &p->json},       {"--model", 's', &p->model},
                                {"--batch", 'i', &p->batch},     {"--seq", 'i', &p->seq},
                                {"--steps", 'i', &p->steps},     {"--threads", 'i', &p->threads}};
    const int n_common = (int)(sizeof common / sizeof *common);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            return 0;
        }
        const bench_opt *o = find_opt(common, n_common, a);
        if (!o) o = find_opt(opts, n_opts, a);
        if (o && o->kind == 'f') {
            *(int *)o->value = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "strata bench %s: %s needs a value\n%s", p->name, a, usage);
            return 2;
        }
        i++;
        if (!o) {
            fprintf(stderr, "strata bench %s: unknown option '%s'\n%s", p->name, a, usage);
            return 2;
        }
        if (o->kind == 's') *(const char **)o->value = v;
        else if (o->kind == 'i') *(int *)o->value = atoi(v);
        else *(double *)o->value = atof(v);
    }
    if (p->steps < 1 || p->steps > 1000 || p->batch < 1 || p->seq < 1) {
        fprintf(stderr, "strata bench %s: --steps 1..1000, --batch and --seq >= 1\n", p->name);
        return 2;
    }
    return -1;
}

static int open_optim(bench_side *s, st_err *err) {
    st_model *m = s->m;
    if (!(s->segs = calloc((size_t)m->n_tensors, sizeof *s->segs))) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    st_params_decay_segments(m->tensors, m->n_tensors, 0.1f, s->segs);
    return st_optim_create(&s->opt, s->segs, m->n_tensors, ST_OPTIM_STATE_F32, err);
}

/* One training step (forward, backward, AdamW), its seconds. */
static double one_step(bench_side *s, const int32_t *in, const int32_t *tg, int N) {
    double t0 = st_now();
    st_model_zero_grad(s->m);
    s->loss = s->m->ops->forward(s->m, in, tg, 1.0f / N);
    s->m->ops->backward(s->m);
    st_adamw_params hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = ++s->step,
                          .grad_scale = 1.0f};
    st_optim_step(s->opt, s->m->params, s->m->grads, &hp);
    return st_now() - t0;
}

static double read_loadavg(void) {
    double load[3] = {0};
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = -1;
        fclose(f);
    }
    return load[0];
}

static void close_side(bench_side *s) {
    st_optim_free(s->opt);
    free(s->segs);
    st_model_free(s->m);
}

void bench_pair_free(bench_pair *p) {
    free(p->in); /* and tg */
    free(p->t_full); /* and t_method */
    close_side(&p->full);
    close_side(&p->method);
    st_backend_free(p->be);
    memset(p, 0, sizeof *p);
}

int bench_pair_run(bench_pair *p, bench_pair_wrap wrap, void *ctx) {
    st_err *err = &p->err;
    int B = p->batch, T = p->seq, steps = p->steps;
    st_model *base = NULL;
    if (!(p->t_full = calloc(2 * (size_t)steps, sizeof *p->t_full))) goto fail;
    p->t_method = p->t_full + steps; /* the second half */
    if (st_backend_cpu_create(&p->be, p->threads, err) ||
        st_model_create(&p->full.m, p->model, NULL, p->be, err) || p->full.m->ops->alloc_acts(p->full.m, B, T, err))
        goto fail;
    p->full.m->ops->init_random(p->full.m, 1);
    if (st_model_create(&base, p->model, NULL, p->be, err)) goto fail;
    base->ops->init_random(base, 1);
    st_status s = wrap(ctx, &p->method.m, base, err); /* takes base */
    if (s || p->method.m->ops->alloc_acts(p->method.m, B, T, err) || open_optim(&p->full, err) ||
        open_optim(&p->method, err))
        goto fail;
    int N = B * T, V = p->full.m->vocab_size;
    if (!(p->in = malloc(sizeof(int32_t) * 2 * N))) goto fail; /* tg: its second half */
    p->tg = p->in + N;
    for (int i = 0; i < N; i++) {
        p->in[i] = (int32_t)((i * 2654435761u) % (unsigned)V);
        p->tg[i] = (int32_t)((i * 40503u + 7) % (unsigned)V);
    }
    one_step(&p->full, p->in, p->tg, N); /* warm-up: first touches, BLAS buffers */
    one_step(&p->method, p->in, p->tg, N);
    for (int i = 0; i < steps; i++) { /* alternated, the order flipped every pair */
        if (i & 1) {
            p->t_method[i] = one_step(&p->method, p->in, p->tg, N);
            p->t_full[i] = one_step(&p->full, p->in, p->tg, N);
        } else {
            p->t_full[i] = one_step(&p->full, p->in, p->tg, N);
            p->t_method[i] = one_step(&p->method, p->in, p->tg, N);
        }
    }
    p->med_full = bench_median(p->t_full, steps);
    p->med_method = bench_median(p->t_method, steps);
    p->loadavg = read_loadavg();
    return 0;
fail:
    fprintf(stderr, "strata bench %s: %s\n", p->name, err->msg[0] ? err->msg : "out of memory");
    bench_pair_free(p);
    return 1;
}
