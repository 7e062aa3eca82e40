/* frozen_store.c - a frozen matmul weight in its precision and the panel matmuls through it
 * (frozen_store.h; the dtypes' names and sizes of strata/poetx.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "model/frozen_store.h"
#include "strata/tensor.h"

const char *st_frozen_dtype_name(st_frozen_dtype d) {
    return d == ST_FROZEN_F32 ? "fp32" : d == ST_FROZEN_BF16 ? "bf16" : d == ST_FROZEN_INT8 ? "int8" : "?";
}

int st_frozen_dtype_parse(const char *s, st_frozen_dtype *out) {
    for (int d = ST_FROZEN_F32; d <= ST_FROZEN_INT8; d++)
        if (!strcmp(s, st_frozen_dtype_name((st_frozen_dtype)d))) {
            *out = (st_frozen_dtype)d;
            return 0;
        }
    return -1;
}

size_t st_frozen_groups(size_t numel) { return (numel + ST_FROZEN_GROUP - 1) / ST_FROZEN_GROUP; }

size_t st_frozen_bytes(st_frozen_dtype d, size_t numel) {
    return d == ST_FROZEN_BF16   ? 2 * numel
           : d == ST_FROZEN_INT8 ? numel + 2 * sizeof(float) * st_frozen_groups(numel)
                                 : 4 * numel;
}

size_t st_frozen_panel_bytes(size_t max_numel) {
    size_t b = max_numel * sizeof(float);
    return b < ST_FROZEN_PANEL_BYTES ? b : ST_FROZEN_PANEL_BYTES;
}

int frozen_weight_alloc(frozen_weight *w, st_frozen_dtype d, int rows, int cols, st_wlayout layout) {
    memset(w, 0, sizeof *w);
    *w = (frozen_weight){.dtype = d, .rows = rows, .cols = cols, .layout = layout};
    size_t n = (size_t)rows * cols, g = st_frozen_groups(n);
    if (d == ST_FROZEN_BF16) {
        if (!(w->bf16 = malloc((n ? n : 1) * sizeof *w->bf16))) return -1;
    } else if (d == ST_FROZEN_INT8) {
        w->q = malloc(n ? n : 1);
        w->scale = malloc((g ? g : 1) * sizeof(float));
        w->zero = malloc((g ? g : 1) * sizeof(float));
        if (!w->q || !w->scale || !w->zero) {
            frozen_weight_free(w);
            return -1;
        }
    }
    return 0;
}

static size_t r64(size_t b) { return (b + 63) / 64 * 64; }

size_t frozen_weight_placed_bytes(st_frozen_dtype d, size_t numel) {
    return d == ST_FROZEN_BF16   ? r64(2 * numel)
           : d == ST_FROZEN_INT8 ? r64(numel) + 2 * r64(sizeof(float) * st_frozen_groups(numel))
                                 : 0;
}

void frozen_weight_place(frozen_weight *w, st_frozen_dtype d, int rows, int cols, st_wlayout layout, unsigned char *mem) {
    size_t n = (size_t)rows * cols, g = st_frozen_groups(n);
    *w = (frozen_weight){.dtype = d, .rows = rows, .cols = cols, .layout = layout, .placed = 1};
    if (d == ST_FROZEN_BF16) {
        w->bf16 = (uint16_t *)(void *)mem;
    } else if (d == ST_FROZEN_INT8) {
        w->q = mem;
        w->scale = (float *)(void *)(mem + r64(n));
        w->zero = (float *)(void *)(mem + r64(n) + r64(sizeof(float) * g));
    }
}

frozen_weight frozen_weight_moved(const frozen_weight *w, const void *from, const void *to) {
    frozen_weight v = *w;
    const unsigned char *f = from;
    unsigned char *t = (unsigned char *)to;
#define MOVE(p, T) if (v.p) v.p = (T *)(void *)(t + ((const unsigned char *)(const void *)w->p - f))
    MOVE(bf16, uint16_t);
    MOVE(q, uint8_t);
    MOVE(scale, float);
    MOVE(zero, float);
#undef MOVE
    return v;
}

void frozen_weight_free(frozen_weight *w) {
    if (w->placed) {
        w->bf16 = NULL;
        w->q = NULL;
        w->scale = w->zero = NULL;
        return;
    }
    free(w->bf16);
    free(w->q);
    free(w->scale);
    free(w->zero);
    w->bf16 = NULL;
    w->q = NULL;
    w->scale = w->zero = NULL;
}

/* One group: zero its smallest value, scale the range over 255 steps, each code the nearest
 * step (a group of one value, or of equal values: scale 0, every code 0, exact). */
static void quant_group(const float *x, size_t n, uint8_t *q, float *scale, float *zero) {
    float lo = x[0], hi = x[0];
    for (size_t i = 1; i < n; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
    }
    float s = (hi - lo) / 255.0f;
    *zero = lo;
    *scale = s > 0 ? s : 0;
    if (!(s > 0)) {
        memset(q, 0, n);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        double t = floor(((double)x[i] - (double)lo) / (double)s + 0.5);
        q[i] = (uint8_t)(t < 0 ? 0 : t > 255 ? 255 : t);
    }
}

void frozen_weight_set(frozen_weight *w, const float *src) {
    size_t n = (size_t)w->rows * w->cols;
    if (w->dtype == ST_FROZEN_F32) {
        if (src != w->f32) memcpy(w->f32, src, n * sizeof(float));
    } else if (w->dtype == ST_FROZEN_BF16) {
        st_convert(w->bf16, ST_BF16, src, ST_F32, n);
    } else {
        long ng = (long)st_frozen_groups(n);
#pragma omp parallel for schedule(static)
        for (long g = 0; g < ng; g++) {
            size_t e0 = (size_t)g * ST_FROZEN_GROUP, m = n - e0 < ST_FROZEN_GROUP ? n - e0 : ST_FROZEN_GROUP;
            quant_group(src + e0, m, w->q + e0, w->scale + g, w->zero + g);
        }
    }
}

void frozen_weight_get(const frozen_weight *w, size_t e0, size_t n, float *dst) {
    if (w->dtype == ST_FROZEN_F32) {
        memcpy(dst, w->f32 + e0, n * sizeof(float));
    } else if (w->dtype == ST_FROZEN_BF16) {
        for (size_t i = 0; i < n; i++) dst[i] = st_bf16_to_f32(w->bf16[e0 + i]);
    } else {
        for (size_t i = 0; i < n;) { /* a group at a time: its scale and zero read once */
            size_t e = e0 + i, g = e / ST_FROZEN_GROUP, end = (g + 1) * ST_FROZEN_GROUP - e0;
            if (end > n) end = n;
            float s = w->scale[g], z = w->zero[g];
            for (; i < end; i++) dst[i] = z + s * (float)w->q[e0 + i];
        }
    }
}

static int in_of(const frozen_weight *w) { return w->layout == ST_W_IN_OUT ? w->rows : w->cols; }
static int out_of(const frozen_weight *w) { return w->layout == ST_W_IN_OUT ? w->cols : w->rows; }

int frozen_panel_rows(const frozen_weight *w, size_t panel_floats) {
    size_t r = panel_floats / (size_t)in_of(w);
    if (r < 1) r = 1;
    return r > (size_t)out_of(w) ? out_of(w) : (int)r;
}

/* The panel of output rows [r0, r0 + n) in the weight's layout: (in, n) for ST_W_IN_OUT (a run
 * of n values from each stored row), (n, in) for ST_W_OUT_IN (n whole stored rows). */
static void fill_panel(const frozen_weight *w, int r0, int n, float *panel) {
    int in = in_of(w), out = out_of(w);
    if (w->layout == ST_W_IN_OUT) {
#pragma omp parallel for schedule(static)
        for (int i = 0; i < in; i++) frozen_weight_get(w, (size_t)i * out + r0, (size_t)n, panel + (size_t)i * n);
    } else {
#pragma omp parallel for schedule(static)
        for (int r = 0; r < n; r++) frozen_weight_get(w, (size_t)(r0 + r) * in, (size_t)in, panel + (size_t)r * in);
    }
}

void frozen_matmul_forward(st_backend *be, const frozen_weight *w, float *out, const float *x, int N, float *panel,
                           size_t panel_floats, float *tmp) {
    const st_backend_ops *o = be->ops;
    int in = in_of(w), nout = out_of(w);
    if (w->dtype == ST_FROZEN_F32) {
        o->matmul_forward(be, out, x, w->f32, NULL, N, in, nout, w->layout);
        return;
    }
    int pw = frozen_panel_rows(w, panel_floats);
    if (pw < nout) o->memset0(be, out, (size_t)N * nout * sizeof(float));
    for (int r0 = 0; r0 < nout; r0 += pw) {
        int n = nout - r0 < pw ? nout - r0 : pw;
        fill_panel(w, r0, n, panel);
        if (n == nout) {
            o->matmul_forward(be, out, x, panel, NULL, N, in, nout, w->layout);
        } else {
            o->matmul_forward(be, tmp, x, panel, NULL, N, in, n, w->layout);
            o->axpy_rows(be, out + r0, nout, tmp, n, 1.0f, N, n);
        }
    }
}

void frozen_matmul_backward_dx(st_backend *be, const frozen_weight *w, float *dx, const float *dout, int N,
                               float *panel, size_t panel_floats, float *tmp) {
    const st_backend_ops *o = be->ops;
    int in = in_of(w), nout = out_of(w);
    if (w->dtype == ST_FROZEN_F32) {
        o->matmul_backward(be, dx, NULL, NULL, dout, NULL, w->f32, N, in, nout, w->layout);
        return;
    }
    int pw = frozen_panel_rows(w, panel_floats);
    for (int r0 = 0; r0 < nout; r0 += pw) {
        int n = nout - r0 < pw ? nout - r0 : pw;
        fill_panel(w, r0, n, panel);
        if (n == nout) {
            o->matmul_backward(be, dx, NULL, NULL, dout, NULL, panel, N, in, nout, w->layout);
        } else { /* dout's columns of the panel, contiguous */
            o->memset0(be, tmp, (size_t)N * n * sizeof(float));
            o->axpy_rows(be, tmp, n, dout + r0, nout, 1.0f, N, n);
            o->matmul_backward(be, dx, NULL, NULL, tmp, NULL, panel, N, in, n, w->layout);
        }
    }
}

void frozen_release(void *p, size_t bytes) {
    long pg = sysconf(_SC_PAGESIZE);
    if (pg <= 0) return;
    uintptr_t a = ((uintptr_t)p + (uintptr_t)pg - 1) & ~(uintptr_t)(pg - 1);
    uintptr_t b = ((uintptr_t)p + bytes) & ~(uintptr_t)(pg - 1);
    if (b <= a) return;
    /* not huge pages first: khugepaged could otherwise fill the range again around a page left */
#ifdef MADV_NOHUGEPAGE
    madvise((void *)a, b - a, MADV_NOHUGEPAGE);
#endif
    madvise((void *)a, b - a, MADV_DONTNEED);
}
