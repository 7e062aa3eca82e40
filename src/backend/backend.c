/* backend.c - what every backend shares: lifetime, whether its memory is the host's (and the
 * host's writes into it in place or through one staging buffer: st_host_stage), and a
 * device's memory figures (through the vtable, whose `memory` entry the budgeted arena
 * answers too: test_cuda_backend_emu links this beside its own build of the CUDA backend). */
#include <stdlib.h>
#include <string.h>

#include "strata/backend.h"

void st_backend_free(st_backend *be) {
    if (be && be->ops && be->ops->free) be->ops->free(be);
}

int st_backend_host_memory(const st_backend *be) {
    const char *n = be && be->ops ? be->ops->name : NULL;
    return n && (!strcmp(n, "cpu") || !strcmp(n, "ref"));
}

st_status st_host_stage_open(st_host_stage *hs, st_backend *be, size_t cap, st_err *err) {
    *hs = (st_host_stage){.be = be, .cap = cap};
    if (st_backend_host_memory(be)) return ST_OK;
    if (!(hs->buf = malloc((cap ? cap : 1) * sizeof(float))))
        return st_errf(err, ST_ERR_NOMEM, "out of memory for a staging buffer of %zu bytes (the values bound for "
                       "the %s backend's memory)", cap * sizeof(float), be->ops->name);
    return ST_OK;
}

float *st_host_stage_at(const st_host_stage *hs, float *dst) { return hs->buf ? hs->buf : dst; }

void st_host_stage_put(const st_host_stage *hs, float *dst, size_t n) {
    if (hs->buf && n) hs->be->ops->copy_to_device(hs->be, dst, hs->buf, n * sizeof(float));
}

void st_host_stage_close(st_host_stage *hs) {
    free(hs->buf);
    *hs = (st_host_stage){0};
}

st_status st_backend_memory(st_backend *be, size_t *used, size_t *peak, size_t *capacity, st_err *err) {
    size_t u = 0, p = 0, c = 0;
    int known = be && be->ops && be->ops->memory;
    if (known) be->ops->memory(be, &u, &p, &c);
    if (used) *used = u;
    if (peak) *peak = p;
    if (capacity) *capacity = c;
    if (!known)
        return st_errf(err, ST_ERR_UNSUPPORTED, "backend %s: its allocations are host memory without a bound, "
                       "nothing to measure; give it a device budget (st_backend_device_create)",
                       be && be->ops && be->ops->name ? be->ops->name : "(none)");
    return ST_OK;
}
