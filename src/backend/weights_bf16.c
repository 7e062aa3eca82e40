/* weights_bf16.c - the bf16 weight copy a device's matmuls read under matmul bf16
 * (backend.h's st_backend_bf16_weights_*): the CPU backend reads it, every other backend
 * none. Apart from device.c so that an executor linked without the CUDA backend's objects
 * (the CUDA emulation tests) does not pull them in through device.c's dispatch. */
#include <string.h>

#include "backend/cpu/matmul_bf16.h"
#include "strata/backend.h"
#include "strata/tensor.h"

/* The CPU backend (and its budgeted arena, which shares its context) reads a bf16 weight
 * copy under matmul bf16; every other backend reads none. */
static int is_cpu(const st_backend *be) {
    return be && be->ops && be->ctx && be->ops->name && !strcmp(be->ops->name, "cpu");
}

int st_backend_bf16_weights_read(const st_backend *be) { return is_cpu(be) && cpu_backend_bf16_weights_read(be); }

void st_backend_bf16_weights_map(st_backend *be, int region, const float *base, const uint16_t *copy, size_t n) {
    if (is_cpu(be)) cpu_backend_bf16_weights_map(be, region, base, copy, n);
}

void st_backend_bf16_weights_round(st_backend *be, uint16_t *dst, const float *src, size_t n) {
    if (is_cpu(be)) cpu_backend_bf16_weights_round(be, dst, src, n);
    else st_convert(dst, ST_BF16, src, ST_F32, n);
}
