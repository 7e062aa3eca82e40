/* test_device.c - the device backend by name (st_backend_device_create, src/backend/device.c):
 * the names accepted and refused (with the forms in the message), cpu as an arena of
 * exactly the budget over the host backend (an allocation of the whole budget fits, one
 * byte more does not), a budget of 0 refused, st_backend_status ST_OK on the CPU devices,
 * the bytes a plan gets (all of the budget on the CPU; on a GPU the budget less the
 * CUDA backend's cuBLASLt workspace, in a build with it), and cuda refused where this build
 * has no CUDA backend (saying how to build it) or, in one with it, where there is no GPU;
 * the matmul modes' names (st_backend_matmul_parse: fp32, tf32, bf16, auto; another refused
 * naming the key 'matmul') and st_backend_set_matmul on the CPU (tf32 refused; bf16 taken
 * where oneDNN was built, else refused naming it; auto one of them); st_backend_device_built
 * (cpu always, cuda only in a build with the CUDA backend); st_backend_memory on the cpu
 * device (its arena's used, peak and capacity) and the cpu backend (nothing to measure).
 * Needs no GPU: where one is, the cuda device is made and freed. */
#include <string.h>

#include "strata/backend.h"
#include "strata/tier.h"
#include "testutil.h"
#ifdef STRATA_HAVE_CUDA
#include "backend/cuda/backend_cuda.h"
#endif

static void parse_ok(const char *name, int want) {
    st_err err = {0};
    int idx = -7;
    st_status s = st_backend_device_parse(name, &idx, &err);
    CHECK(s == ST_OK && idx == want, "'%s': status %d index %d, want index %d (%s)", name ? name : "(null)", s, idx,
          want, err.msg);
}

static void parse_bad(const char *name) {
    st_err err = {0};
    int idx = -7;
    st_status s = st_backend_device_parse(name, &idx, &err);
    CHECK(s == ST_ERR_INVALID && strstr(err.msg, name) && strstr(err.msg, "cpu, cuda or cuda:N"),
          "'%s' refused naming it and the forms: status %d, '%s'", name, s, err.msg);
    st_backend *be = (st_backend *)&err; /* not touched on failure but set to NULL */
    s = st_backend_device_create(&be, name, NULL, 1 << 20, &err);
    CHECK(s == ST_ERR_INVALID && be == NULL, "create '%s': status %d", name, s);
}

/* key 'matmul': the one parser of the mode names (st_backend_matmul_parse), used by the key's
 * check and st_backend_set_matmul */
static void matmul_ok(const char *name, st_matmul_mode want) {
    st_err err = {0};
    st_matmul_mode m = (st_matmul_mode)-7;
    st_status s = st_backend_matmul_parse(name, &m, &err);
    CHECK(s == ST_OK && m == want, "matmul '%s': status %d mode %d, want %d (%s)", name ? name : "(null)", s, (int)m,
          (int)want, err.msg);
}
static void matmul_bad(const char *name, st_backend *cpu) {
    st_err err = {0};
    st_matmul_mode m = (st_matmul_mode)-7;
    char want[64];
    snprintf(want, sizeof want, "key 'matmul': '%s' is not fp32, tf32, bf16 or auto", name);
    st_status s = st_backend_matmul_parse(name, &m, &err);
    CHECK(s == ST_ERR_INVALID && m == ST_MATMUL_FP32 && strstr(err.msg, want), "matmul '%s' refused naming the key: "
          "status %d mode %d '%s'", name, s, (int)m, err.msg);
    err.msg[0] = 0;
    s = st_backend_set_matmul(cpu, name, &err);
    CHECK(s == ST_ERR_INVALID && strstr(err.msg, want), "set_matmul '%s' refused by the parser: status %d '%s'", name,
          s, err.msg);
}

int main(void) {
    parse_ok("cpu", -1);
    parse_ok(NULL, -1);
    parse_ok("", -1);
    parse_ok("cuda", 0);
    parse_ok("cuda:0", 0);
    parse_ok("cuda:3", 3);
    parse_ok("cuda:1023", 1023);
    const char *bad[] = {"banana", "cuda:", "cuda:-1", "cuda:1x", "cuda:1024", "cuda:99999", "CUDA", "gpu", "cpu:0",
                         "cuda0", " cuda"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) parse_bad(bad[i]);

    st_err err = {0};
    st_backend *host = NULL, *dev = NULL;
    if (st_backend_cpu_create(&host, 1, &err) != ST_OK) {
        fprintf(stderr, "cpu backend: %s\n", err.msg);
        return 1;
    }
    /* cpu: an arena of exactly the budget (st_backend_with_budget) */
    size_t budget = 1u << 20;
    CHECK(st_backend_device_create(&dev, "cpu", host, budget, &err) == ST_OK && dev, "cpu device: %s", err.msg);
    if (dev) {
        st_arena *a = st_backend_arena(dev);
        CHECK(a && st_arena_budget(a) == budget, "the cpu device is an arena of the budget");
        void *p = dev->ops->alloc(dev, budget + 1);
        CHECK(p == NULL, "one byte over the budget does not fit");
        p = dev->ops->alloc(dev, budget);
        CHECK(p != NULL, "the whole budget fits");
        if (p) dev->ops->dealloc(dev, p);
        CHECK(st_backend_status(dev, &err) == ST_OK, "status of the cpu device: %s", err.msg);
        /* st_backend_memory: the arena's figures (bench stream's device_peak_bytes) */
        size_t used = 1, peak = 1, cap = 1;
        CHECK(st_backend_memory(dev, &used, &peak, &cap, &err) == ST_OK && cap == budget && used == 0 &&
                  peak == budget,
              "the cpu device's memory after the whole budget was taken and given back: used %zu peak %zu capacity "
              "%zu (%s)", used, peak, cap, err.msg);
        void *q = dev->ops->alloc(dev, 1000);
        CHECK(q && st_backend_memory(dev, &used, NULL, NULL, &err) == ST_OK && used >= 1000 && used < 2000,
              "1000 bytes held: used %zu", used);
        if (q) dev->ops->dealloc(dev, q);
        st_backend_free(dev);
        dev = NULL;
    }
    CHECK(st_backend_status(host, &err) == ST_OK, "status of the cpu backend");
    {
        size_t used = 1, peak = 1, cap = 1;
        st_status s1 = st_backend_memory(host, &used, &peak, &cap, &err);
        CHECK(s1 == ST_ERR_UNSUPPORTED && !used && !peak && !cap && strstr(err.msg, "cpu"),
              "the cpu backend has no bounded memory to measure: %d '%s'", s1, err.msg);
    }
    CHECK(st_backend_status(NULL, &err) == ST_OK, "status of no backend");
    CHECK(st_backend_device_create(&dev, "cpu", host, 0, &err) == ST_ERR_INVALID && !dev &&
              strstr(err.msg, "device_budget"),
          "a budget of 0 is refused naming device_budget: '%s'", err.msg);
    CHECK(st_backend_device_create(&dev, "cpu", NULL, budget, &err) == ST_ERR_INVALID && !dev, "cpu without a host");
    CHECK(st_backend_device_usable_bytes("cpu", budget) == budget, "the cpu device's plan gets the whole budget");
    matmul_ok("fp32", ST_MATMUL_FP32);
    matmul_ok(NULL, ST_MATMUL_FP32);
    matmul_ok("tf32", ST_MATMUL_TF32);
    matmul_ok("bf16", ST_MATMUL_BF16);
    matmul_ok("auto", ST_MATMUL_AUTO);
    CHECK(!strcmp(st_backend_matmul_name(ST_MATMUL_AUTO), "auto") && !strcmp(st_backend_matmul_name(ST_MATMUL_BF16),
                                                                             "bf16"), "the modes' names");
    const char *mm_bad[] = {"banana", "", "FP32", "fp16", "bf16 ", "tf3", "Auto"};
    for (size_t i = 0; i < sizeof mm_bad / sizeof mm_bad[0]; i++) matmul_bad(mm_bad[i], host);
    CHECK(st_backend_set_matmul(host, "fp32", &err) == ST_OK, "fp32 on the cpu backend: %s", err.msg);
    {
        st_status s2 = st_backend_set_matmul(host, "tf32", &err);
        CHECK(s2 == ST_ERR_UNSUPPORTED && strstr(err.msg, "key 'matmul': tf32") && strstr(err.msg, "fp32 or bf16"),
              "tf32 on the cpu backend refused: %d '%s'", s2, err.msg);
        CHECK(st_backend_matmul_check("cpu", "tf32", &err) == ST_ERR_UNSUPPORTED && strstr(err.msg, "key 'matmul'"),
              "the key's check refuses tf32 on cpu: '%s'", err.msg);
        CHECK(st_backend_matmul_check("cuda:1", "tf32", &err) == ST_OK, "the key's check takes tf32 on cuda");
        /* bf16: oneDNN's where this build has it, else refused naming the key and the package */
        char why[200];
        st_matmul_mode a = st_backend_matmul_auto("cpu", why, sizeof why);
        s2 = st_backend_set_matmul(host, "bf16", &err);
        st_status c2 = st_backend_matmul_check("cpu", "bf16", &err);
#ifdef STRATA_HAVE_DNNL
        CHECK(s2 == ST_OK && c2 == ST_OK, "bf16 on the cpu backend with oneDNN: %d '%s'", s2, err.msg);
#else
        CHECK(s2 == ST_ERR_UNSUPPORTED && c2 == ST_ERR_UNSUPPORTED && strstr(err.msg, "key 'matmul'") &&
                  strstr(err.msg, "libdnnl-dev") && a == ST_MATMUL_FP32,
              "bf16 on the cpu backend without oneDNN refused naming the key and how to build: %d '%s'", s2, err.msg);
#endif
        CHECK((a == ST_MATMUL_FP32 || a == ST_MATMUL_BF16) && why[0], "auto on the cpu is fp32 or bf16, with a reason");
        CHECK(st_backend_matmul_auto("cuda", NULL, 0) == ST_MATMUL_BF16, "auto on a GPU is bf16");
        CHECK(st_backend_set_matmul(host, "auto", &err) == ST_OK, "auto on the cpu backend: %s", err.msg);
        CHECK(st_backend_set_matmul(host, "fp32", &err) == ST_OK, "back to fp32: %s", err.msg);
    }

    size_t big = (size_t)1 << 30;
    /* st_backend_device_built: whether the build has the device's backend, nothing created */
    CHECK(st_backend_device_built("cpu", &err) == ST_OK && st_backend_device_built(NULL, &err) == ST_OK,
          "cpu is always built: %s", err.msg);
    CHECK(st_backend_device_built("banana", &err) == ST_ERR_INVALID && strstr(err.msg, "cpu, cuda or cuda:N"),
          "a bad name is refused by the form: '%s'", err.msg);
#ifdef STRATA_HAVE_CUDA
    CHECK(st_backend_device_built("cuda:1", &err) == ST_OK, "cuda:1 is built here: %s", err.msg);
    size_t ws = st_backend_cuda_matmul_workspace(big);
    CHECK(ws > 0 && st_backend_device_usable_bytes("cuda:1", big) == big - ws,
          "a GPU's plan gets the budget less cuBLASLt's workspace (%zu): %zu", ws,
          st_backend_device_usable_bytes("cuda:1", big));
    st_status s = st_backend_device_create(&dev, "cuda", host, 64u << 20, &err);
    if (s == ST_OK) { /* a GPU here */
        CHECK(dev && !strcmp(dev->ops->name, "cuda"), "cuda device");
        CHECK(st_backend_status(dev, &err) == ST_OK, "a fresh cuda device's status: %s", err.msg);
        st_backend_free(dev);
        dev = NULL;
    } else {
        CHECK(s == ST_ERR_UNSUPPORTED && !dev && strstr(err.msg, "no CUDA device"),
              "cuda without a GPU refused: %d '%s'", s, err.msg);
    }
#else
    CHECK(st_backend_device_built("cuda:1", &err) == ST_ERR_UNSUPPORTED && strstr(err.msg, "cuda:1") &&
              strstr(err.msg, "-DSTRATA_CUDA=ON"),
          "cuda:1 is not built here, saying how to build it: '%s'", err.msg);
    CHECK(st_backend_device_usable_bytes("cuda", big) == big, "no CUDA backend: nothing carved");
    st_status s = st_backend_device_create(&dev, "cuda:2", host, budget, &err);
    CHECK(s == ST_ERR_UNSUPPORTED && !dev && strstr(err.msg, "cuda:2") &&
              strstr(err.msg, "built without the CUDA backend") && strstr(err.msg, "-DSTRATA_CUDA=ON"),
          "cuda refused in a build without it, saying how to build it: %d '%s'", s, err.msg);
#endif
    st_backend_free(host);
    return test_finish("device");
}
