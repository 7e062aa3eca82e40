/* backend_cpu_poetx.h - the CPU backend's POET-X ops (backend_cpu_poetx.c), which
 * backend_cpu.c puts into its vtable. Semantics and shapes: include/strata/backend.h. */
#ifndef STRATA_BACKEND_CPU_POETX_H
#define STRATA_BACKEND_CPU_POETX_H

#include "strata/backend.h"

void cpu_poet_cayley_forward(st_backend *be, float *G, const float *q, int nb, int b, int k);
void cpu_poet_cayley_backward(st_backend *be, float *dq, const float *dG, const float *q, int nb, int b, int k);
void cpu_poet_apply_forward(st_backend *be, float *y, const float *x, const float *G, const int32_t *perm, int N,
                            int d, int b, int trans);
void cpu_poet_apply_backward(st_backend *be, float *dx, float *dG, const float *dy, const float *x, const float *G,
                             const int32_t *perm, int N, int d, int b, int trans);
void cpu_poet_permute(st_backend *be, float *y, int ldy, const float *x, int ldx, const int32_t *perm, int N, int d,
                      int mode);

/* Rows per work unit of the apply's backward: each unit's part of dG is summed apart and
 * the parts added in unit order, so the bits depend on N, d and b only. Rows per unit
 * grow past 256 where the parts (units x d x b floats) would pass 2^24 floats. */
static inline int cpu_poet_rows_per_unit(int N, int d, int b) {
    long cap = (1L << 24) / ((long)d * b > 0 ? (long)d * b : 1), rows = 256;
    if (cap < 1) cap = 1;
    if ((N + rows - 1) / rows > cap) rows = (N + cap - 1) / cap;
    return (int)rows;
}

#endif
