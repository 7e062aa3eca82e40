/* device.c - the device backend a run computes on, made by name (tier.h's
 * st_backend_device_create): the host's cores behind a budgeted arena (arena.c), or a GPU
 * (backend.h's st_backend_gpu_create, with its own arena). */
#include "strata/backend.h"
#include "strata/tier.h"

st_status st_backend_device_create(st_backend **out, const char *device, st_backend *host, size_t budget,
                                   st_err *err) {
    *out = NULL;
    int index;
    st_status s = st_backend_device_parse(device, &index, err);
    if (s) return s;
    if (!budget)
        return st_errf(err, ST_ERR_INVALID, "device '%s': a device budget of 0 bytes; give the bytes of device memory "
                       "the run may use (device_budget)", device ? device : "cpu");
    if (index < 0) {
        if (!host)
            return st_errf(err, ST_ERR_INVALID, "device 'cpu': no host backend to carve the budget over");
        return st_backend_with_budget(out, host, budget, err);
    }
    return st_backend_gpu_create(out, device, budget, err);
}
