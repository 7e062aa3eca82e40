/* test_cuda_emu_model.cpp - a whole model on the CUDA backend, end to end, under the
 * emulation: backend_cuda.cu compiled here by g++ against tests/cuda_emu (as
 * test_cuda_backend_emu does: emulated runtime, cuBLAS as OpenBLAS, the kernels under
 * cuda_emu.h; its entry points renamed so that they never meet the nvcc-built ones in
 * libstrata). For gpt2-tiny (LayerNorm, GELU, learned positions, (in, out) weights),
 * llama-tiny (RMSNorm, RoPE with Llama-3 scaling, SwiGLU, GQA, attention biases) and
 * qwen3-tiny (per-head q/k RMSNorm), st_model_create on the CUDA backend and on the CPU
 * backend, the same random weights, one forward and one backward of B = 2 rows of T = 11
 * tokens (some targets masked): the loss and every parameter's gradient must agree.
 * Tolerances: loss relative 1e-5; each gradient tensor |cuda - cpu| <= 1e-5 max|cpu| +
 * 1e-4 |cpu|, test_ops_diff's matmul and layernorm tolerance, for a whole step (both sides
 * round in fp32, in different orders; the worst gradient used 4% of it when written:
 * the test prints its err/tol per model). It runs every op the models use, so a wrong argument order between the model
 * code and the backend, or an op that reads host memory, shows here; under the
 * emulation device memory is host memory, so the last is seen only on a GPU. */
#define st_backend_cuda_create st_backend_cuda_emu_create
#define st_backend_cuda_status st_backend_cuda_emu_status
#include "backend/cuda/backend_cuda.cu"

#include <math.h>
#include <vector>

extern "C" {
#include "strata/model.h"
#include "testutil.h"
}

#define LOSS_RTOL 1e-5
#define GRAD_ATOL 1e-5 /* times max|cpu| of the tensor */
#define GRAD_RTOL 1e-4

struct StepOut {
    float loss = NAN;
    std::vector<float> grads;
    const st_param_info *tensors = nullptr;
    int n_tensors = 0;
};

static StepOut step(st_backend *be, st_model **keep, const char *preset, int B, int T, const std::vector<int32_t> &in,
                    const std::vector<int32_t> &tg, float dloss) {
    StepOut r;
    st_err err = {};
    st_model *m = nullptr;
    if (st_model_create(&m, preset, nullptr, be, &err) != ST_OK || m->ops->alloc_acts(m, B, T, &err) != ST_OK) {
        CHECK(0, "%s on %s: %s", preset, be->ops->name, err.msg);
        if (m) st_model_free(m);
        return r;
    }
    m->ops->init_random(m, 1337);
    st_model_zero_grad(m);
    r.loss = m->ops->forward(m, in.data(), tg.data(), dloss);
    m->ops->backward(m);
    be->ops->synchronize(be);
    r.grads.resize(m->n_params);
    be->ops->copy_to_host(be, r.grads.data(), m->grads, m->n_params * sizeof(float));
    r.tensors = m->tensors, r.n_tensors = m->n_tensors;
    *keep = m; /* the tensor table lives with the model */
    return r;
}

static void test_model(st_backend *gpu, st_backend *cpu, const char *preset) {
    const int B = 2, T = 11;
    int N = B * T;
    std::vector<int32_t> in(N), tg(N);
    int counted = 0;
    for (int i = 0; i < N; i++) {
        in[i] = (int32_t)((i * 29 + 5) % 61);
        tg[i] = i % 7 == 3 ? -1 : (int32_t)((i * 13 + 1) % 63);
        counted += tg[i] >= 0;
    }
    st_model *mg = nullptr, *mc = nullptr;
    StepOut g = step(gpu, &mg, preset, B, T, in, tg, 1.0f / counted);
    StepOut c = step(cpu, &mc, preset, B, T, in, tg, 1.0f / counted);
    if (!mg || !mc) {
        if (mg) st_model_free(mg);
        if (mc) st_model_free(mc);
        return;
    }
    st_err err = {};
    st_status s = st_backend_cuda_emu_status(gpu, &err);
    CHECK(s == ST_OK, "%s: the CUDA backend kept an error: %s", preset, err.msg);
    CHECK(fabs((double)g.loss - c.loss) <= LOSS_RTOL * fabs((double)c.loss) && c.loss > 0,
          "%s loss: cuda %.9g, cpu %.9g", preset, g.loss, c.loss);
    CHECK(g.grads.size() == c.grads.size(), "%s: %zu vs %zu parameters", preset, g.grads.size(), c.grads.size());
    double worst = 0;
    const char *worst_name = "";
    for (int t = 0; t < c.n_tensors && g.grads.size() == c.grads.size(); t++) {
        const st_param_info *p = &c.tensors[t];
        const float *a = g.grads.data() + p->offset, *r = c.grads.data() + p->offset;
        double mx = 0;
        for (size_t i = 0; i < p->numel; i++) mx = fmax(mx, fabs((double)r[i]));
        double atol = GRAD_ATOL * (mx > 0 ? mx : 1);
        char what[200];
        snprintf(what, sizeof what, "%s grad %s", preset, p->name);
        check_close_f32(what, a, r, p->numel, atol, GRAD_RTOL);
        for (size_t i = 0; i < p->numel; i++) {
            double e = fabs((double)a[i] - r[i]) / (atol + GRAD_RTOL * fabs((double)r[i]));
            if (!(e <= worst)) worst = e, worst_name = p->name;
        }
    }
    printf("%s: loss cuda %.9g cpu %.9g; worst gradient err/tol %.3g (%s), %zu parameters\n", preset, g.loss, c.loss,
           worst, worst_name, c.grads.size());
    st_model_free(mg);
    st_model_free(mc);
}

int main(void) {
    st_err err = {};
    st_backend *gpu = nullptr, *cpu = nullptr;
    if (st_backend_cuda_emu_create(&gpu, 0, (size_t)64 << 20, &err) != ST_OK ||
        st_backend_cpu_create(&cpu, 1, &err) != ST_OK) {
        fprintf(stderr, "test_cuda_emu_model: %s\n", err.msg);
        return 1;
    }
    for (const char *p : {"gpt2-tiny", "llama-tiny", "qwen3-tiny"}) test_model(gpu, cpu, p);
    st_backend_free(gpu);
    st_backend_free(cpu);
    return test_finish("test_cuda_emu_model");
}
