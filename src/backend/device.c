/* device.c - the device names a run computes on (strata train's key 'device', strata bench
 * stream --device: cpu, or the CUDA backend where this strata was built with it; tier's
 * st_backend_device_create makes one), the error status of a backend whose ops report
 * nothing, and the matmul precision. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/matmul_bf16.h"
#include "strata/backend.h"
#ifdef STRATA_HAVE_CUDA
#include "backend/cuda/backend_cuda.h"
#endif

#define DEVICE_MAX_INDEX 1023 /* far above any machine's GPU count; keeps the digits an int */

#define DEVICE_FORMS "cpu, cuda or cuda:N (N: a CUDA device's index; cuda is cuda:0)"

st_status st_backend_gpu_create(st_backend **out, const char *device, size_t budget, st_err *err) {
    *out = NULL;
    int index;
    st_status s = st_backend_device_parse(device, &index, err);
    if (s) return s;
    if (index < 0) return st_errf(err, ST_ERR_INVALID, "device '%s' is not a GPU; give cuda or cuda:N", device ? device : "cpu");
    if ((s = st_backend_device_built(device, err))) return s;
#ifdef STRATA_HAVE_CUDA
    return st_backend_cuda_create(out, index, budget, err);
#else
    (void)budget;
    return ST_ERR_UNSUPPORTED; /* st_backend_device_built refused it */
#endif
}

st_status st_backend_device_parse(const char *device, int *cuda_index, st_err *err) {
    *cuda_index = -1;
    if (!device || !*device || !strcmp(device, "cpu")) return ST_OK; /* unset: cpu */
    if (!strcmp(device, "cuda")) {
        *cuda_index = 0;
        return ST_OK;
    }
    if (!strncmp(device, "cuda:", 5)) {
        const char *d = device + 5;
        int n = 0, ok = *d != 0 && strlen(d) <= 4;
        for (const char *p = d; ok && *p; p++) ok = *p >= '0' && *p <= '9';
        if (ok) n = atoi(d);
        if (ok && n <= DEVICE_MAX_INDEX) {
            *cuda_index = n;
            return ST_OK;
        }
        return st_errf(err, ST_ERR_INVALID, "device '%s': '%s' is not a CUDA device index (0 to %d); give "
                       DEVICE_FORMS, device, d, DEVICE_MAX_INDEX);
    }
    return st_errf(err, ST_ERR_INVALID, "device '%s' is not one this strata knows; give " DEVICE_FORMS, device);
}


st_status st_backend_device_built(const char *device, st_err *err) {
    int index;
    st_status s = st_backend_device_parse(device, &index, err);
    if (s || index < 0) return s;
#ifdef STRATA_HAVE_CUDA
    return ST_OK;
#else
    return st_errf(err, ST_ERR_UNSUPPORTED, "device '%s': this strata was built without the CUDA backend; build it "
                   "with cmake -DSTRATA_CUDA=ON (nvcc and the CUDA toolkit installed), or use device cpu", device);
#endif
}

st_status st_backend_status(st_backend *be, st_err *err) {
    if (!be || !be->ops) return ST_OK;
#ifdef STRATA_HAVE_CUDA
    if (be->ops->name && !strcmp(be->ops->name, "cuda")) return st_backend_cuda_status(be, err);
#else
    (void)err;
#endif
    return ST_OK; /* cpu, ref and the budgeted arena: an op cannot fail after it returns */
}

size_t st_backend_device_usable_bytes(const char *device, size_t budget) {
    int index;
    if (st_backend_device_parse(device, &index, NULL) || index < 0) return budget; /* the CPU arena: all of it */
#ifdef STRATA_HAVE_CUDA
    size_t ws = st_backend_cuda_matmul_workspace(budget); /* cuBLASLt's, carved from the arena at creation */
    return budget > ws ? budget - ws : 0;
#else
    return budget;
#endif
}

static const char *const matmul_names[] = {[ST_MATMUL_FP32] = "fp32", [ST_MATMUL_TF32] = "tf32",
                                           [ST_MATMUL_BF16] = "bf16", [ST_MATMUL_AUTO] = "auto"};

const char *st_backend_matmul_name(st_matmul_mode mode) {
    return (unsigned)mode < sizeof matmul_names / sizeof matmul_names[0] ? matmul_names[mode] : "?";
}

st_status st_backend_matmul_parse(const char *name, st_matmul_mode *mode, st_err *err) {
    *mode = ST_MATMUL_FP32;
    if (!name) return ST_OK; /* unset: the default */
    for (int i = 0; i < (int)(sizeof matmul_names / sizeof matmul_names[0]); i++)
        if (!strcmp(name, matmul_names[i])) {
            *mode = (st_matmul_mode)i;
            return ST_OK;
        }
    return st_errf(err, ST_ERR_INVALID, "key 'matmul': '%s' is not fp32, tf32, bf16 or auto; give one of them", name);
}

st_matmul_mode st_backend_matmul_auto(const char *device, char *why, size_t why_size) {
    int index;
    if (!st_backend_device_parse(device, &index, NULL) && index >= 0) {
        if (why && why_size) snprintf(why, why_size, "device %s: the GPU's tensor cores", device);
        return ST_MATMUL_BF16;
    }
    cpu_bf16_units u = cpu_bf16_detect();
    int built = cpu_bf16_built();
    if (why && why_size)
        snprintf(why, why_size, "%s%s", u == CPU_BF16_NONE ? "this CPU has no bf16 matrix units (AMX-BF16, AVX512-BF16)"
                                        : u == CPU_BF16_AMX ? "this CPU has AMX-BF16" : "this CPU has AVX512-BF16",
                 u != CPU_BF16_NONE && !built ? ", but this strata was built without oneDNN (libdnnl-dev)" : "");
    return u != CPU_BF16_NONE && built ? ST_MATMUL_BF16 : ST_MATMUL_FP32;
}

st_status st_backend_matmul_check(const char *device, const char *mode, st_err *err) {
    st_matmul_mode m;
    int index;
    st_status s = st_backend_matmul_parse(mode, &m, err);
    if (s || (s = st_backend_device_parse(device, &index, err)) || index >= 0) return s; /* cuda: all of them */
    if (m == ST_MATMUL_TF32)
        return st_errf(err, ST_ERR_UNSUPPORTED, "key 'matmul': tf32 is the tensor cores of device cuda; device %s "
                       "computes fp32 or bf16: give matmul fp32, bf16 or auto, or device cuda with device_budget",
                       device && *device ? device : "cpu");
    if (m == ST_MATMUL_BF16 && !cpu_bf16_built()) {
        cpu_bf16 *b;
        return cpu_bf16_create(&b, err); /* the refusal: names the key and how to build with oneDNN */
    }
    return ST_OK;
}

st_status st_backend_set_matmul(st_backend *be, const char *mode, st_err *err) {
    st_matmul_mode m;
    st_status s = st_backend_matmul_parse(mode, &m, err);
    if (s) return s;
    if (!be || !be->ops) /* a CPU device not made yet (its arena shares the host backend's context): checked only */
        return m == ST_MATMUL_AUTO ? ST_OK : st_backend_matmul_check("cpu", mode, err);
    const char *name = be->ops->name ? be->ops->name : "cpu";
    int cpu = !strcmp(name, "cpu"), cuda = !strcmp(name, "cuda");
    if (m == ST_MATMUL_AUTO) {
        char why[160];
        m = st_backend_matmul_auto(cuda ? "cuda" : "cpu", why, sizeof why);
        st_log(1, "matmul auto: %s (%s)\n", st_backend_matmul_name(m), why);
    }
#ifdef STRATA_HAVE_CUDA
    if (cuda) return st_backend_cuda_set_matmul(be, m, err);
#endif
    if (cpu && be->ctx) return cpu_backend_set_matmul(be, m, err);
    if (m != ST_MATMUL_FP32)
        return st_errf(err, ST_ERR_UNSUPPORTED, "matmul '%s': the %s backend computes its matmuls in fp32 only; bf16 "
                       "is the cpu backend's (oneDNN) and tf32 the tensor cores of device cuda", mode, name);
    return ST_OK;
}
