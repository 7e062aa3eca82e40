/* frozen_store.h - a frozen matmul weight held in its precision (src/model; strata/poetx.h's
 * st_frozen_dtype): fp32 (the base's own vector, not copied), bf16 (round to nearest even) or
 * int8 (asymmetric: each group of ST_FROZEN_GROUP consecutive elements of the weight as the
 * base stores it has an fp32 scale and zero, x ~ zero + scale q, q in 0..255 the nearest). The
 * matmuls through it dequantise a panel of the weight at a time into a small fp32 buffer (at
 * most ST_FROZEN_PANEL_BYTES) and call the backend's matmul on it: no whole fp32 copy of the
 * weight exists while they run. Host memory only (the cpu backend): the panels are formed by the
 * host. */
#ifndef STRATA_FROZEN_STORE_H
#define STRATA_FROZEN_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "strata/backend.h"
#include "strata/poetx.h"

typedef struct frozen_weight {
    st_frozen_dtype dtype;
    int rows, cols;     /* as the base stores it: row-major rows x cols (GPT-2 (in, out), Llama (out, in)) */
    st_wlayout layout;  /* ST_W_IN_OUT (rows = in) or ST_W_OUT_IN (rows = out) */
    float *f32;         /* fp32: the base's own weight (not owned) */
    uint16_t *bf16;     /* bf16: rows x cols bit patterns (owned) */
    uint8_t *q;         /* int8: rows x cols codes (owned) */
    float *scale, *zero;/* int8: one per group of ST_FROZEN_GROUP elements (owned) */
    int placed;         /* 1: the codes are in the caller's memory (frozen_weight_place), not owned */
} frozen_weight;

/* w for a weight of rows x cols in layout, dtype d: the codes allocated (fp32: nothing; f32 is set
 * by the caller). Returns 0, or -1 out of memory (w freed). */
int frozen_weight_alloc(frozen_weight *w, st_frozen_dtype d, int rows, int cols, st_wlayout layout);
void frozen_weight_free(frozen_weight *w);
/* The bytes a weight of numel values in d takes placed in one run (frozen_weight_place): its codes,
 * then (int8) its scales and zeros, each part from a multiple of 64 bytes. 0 for fp32. */
size_t frozen_weight_placed_bytes(st_frozen_dtype d, size_t numel);
/* w for a weight of rows x cols in layout, dtype d (bf16 or int8), its codes at mem
 * (frozen_weight_placed_bytes of them, 64-byte aligned; the caller's: frozen_weight_free leaves it). */
void frozen_weight_place(frozen_weight *w, st_frozen_dtype d, int rows, int cols, st_wlayout layout, unsigned char *mem);
/* The placed weight w read from another copy of its run's bytes: its codes' pointers moved from
 * inside `from` to the same places inside `to`. */
frozen_weight frozen_weight_moved(const frozen_weight *w, const void *from, const void *to);
/* The weight's numel values (src, fp32, as stored) rounded into w (fp32: copied into w->f32 unless
 * src is w->f32). */
void frozen_weight_set(frozen_weight *w, const float *src);
/* dst[0 .. n) = the values of elements [e0, e0 + n) of the weight as stored, in fp32. */
void frozen_weight_get(const frozen_weight *w, size_t e0, size_t n, float *dst);
/* The rows of out a panel covers (at least 1, at most out) for a panel buffer of panel_floats. */
int frozen_panel_rows(const frozen_weight *w, size_t panel_floats);

/* out (N, out) = x (N, in) W^T through panels of the weight's output rows (fp32: the backend's
 * matmul on the weight itself). panel: panel_floats of host memory; tmp: N x out floats (only
 * used when the panels are more than one). */
void frozen_matmul_forward(st_backend *be, const frozen_weight *w, float *out, const float *x, int N, float *panel,
                           size_t panel_floats, float *tmp);
/* dx (N, in) += dout (N, out) W, likewise (no gradient of W). */
void frozen_matmul_backward_dx(st_backend *be, const frozen_weight *w, float *dx, const float *dout, int N,
                               float *panel, size_t panel_floats, float *tmp);

/* The whole pages inside [p, p + bytes) given back to the system (their contents become zero):
 * the fp32 copy of a weight once it is held in another precision. Host memory only. */
void frozen_release(void *p, size_t bytes);

#endif
