/* test_sft_fixture.c - document-aware packing against PyTorch: for tiny GPT-2, Llama, Qwen2
 * and Qwen3 (the weights of the existing fixtures), a packed SFT batch (two rows of several
 * documents, targets masked at each document's end and on "prompt" tokens) run with its
 * positions and doc_start (st_model_set_docs) gives the loss and every gradient of the fp64
 * PyTorch reference in tests/fixtures/sft_<model>.safetensors, which runs each document
 * separately with labels -100 on the masked targets (tools/gen_sft_fixtures.py). So both the
 * mask and the boundary are checked: a leak across a boundary, positions that do not restart,
 * or a masked target counted each change the loss and gradients. Tolerances are
 * test_llama_fixture's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/model.h"
#include "strata/safetensors.h"
#include "testutil.h"

static int run_fixture(const char *name) {
    st_err err = {0};
    st_safetensors *fx = NULL, *wx = NULL;
    char path[512];
    snprintf(path, sizeof path, "tests/fixtures/sft_%s.safetensors", name);
    if (st_safetensors_open(&fx, test_source_path(path), &err)) {
        fprintf(stderr, "sft_fixture: %s (generate it with /usr/bin/python3 tools/gen_sft_fixtures.py)\n", err.msg);
        return 77;
    }
    const char *preset = st_safetensors_meta(fx, "preset"), *weights = st_safetensors_meta(fx, "weights");
    int B = test_meta_int(fx, "B"), T = test_meta_int(fx, "T"), N = B * T;
    snprintf(path, sizeof path, "tests/fixtures/%s", weights ? weights : "(none)");
    st_backend *be = NULL;
    st_model *m = NULL;
    if (!preset || B < 1 || T < 1 || st_safetensors_open(&wx, test_source_path(path), &err) ||
        st_backend_cpu_create(&be, 0, &err) || st_model_create(&m, preset, NULL, be, &err) ||
        m->ops->alloc_acts(m, B, T, &err) ||
        test_load_params(wx, m->tensors, m->n_tensors, m->n_params, be, m->params, &err)) {
        CHECK(0, "%s setup: %s", name, err.msg);
        return 1;
    }
    const st_tensor_entry *e[4] = {st_safetensors_find(fx, "inputs"), st_safetensors_find(fx, "targets"),
                                   st_safetensors_find(fx, "positions"), st_safetensors_find(fx, "doc_start")};
    for (int i = 0; i < 4; i++)
        if (!e[i] || e[i]->numel != (size_t)N) {
            CHECK(0, "%s: inputs, targets, positions and doc_start of %d elements", name, N);
            return 1;
        }
    const int32_t *inputs = st_safetensors_data(fx, e[0]), *labels = st_safetensors_data(fx, e[1]);
    const int32_t *positions = st_safetensors_data(fx, e[2]), *doc_start = st_safetensors_data(fx, e[3]);
    int32_t *targets = malloc(sizeof(int32_t) * (size_t)N);
    int count = 0;
    for (int i = 0; i < N; i++) { /* PyTorch's -100 is strata's masked target (any < 0) */
        targets[i] = labels[i] < 0 ? -1 : labels[i];
        count += targets[i] >= 0;
    }
    CHECK(st_model_set_docs(m, positions, doc_start, &err) == ST_OK, "%s set_docs: %s", name, err.msg);
    st_model_zero_grad(m);
    float loss = m->ops->forward(m, inputs, targets, 1.0f / (float)count);
    m->ops->backward(m);
    float *ref_loss = test_read_f32(fx, "loss", 1);
    CHECK(ref_loss && fabsf(loss - ref_loss[0]) <= 1e-5f * ref_loss[0], "%s loss %.7f vs reference %.7f", name, loss,
          ref_loss ? ref_loss[0] : NAN);
    float *g = malloc(m->n_params * sizeof *g);
    be->ops->copy_to_host(be, g, m->grads, m->n_params * sizeof *g);
    for (int i = 0; i < m->n_tensors; i++) {
        const st_param_info *t = &m->tensors[i];
        char gname[160], what[200];
        snprintf(gname, sizeof gname, "grad.%s", t->name);
        float *ref = test_read_f32(fx, gname, t->numel);
        CHECK(ref != NULL, "%s: %s present", name, gname);
        if (!ref) continue;
        snprintf(what, sizeof what, "sft %s %s", name, gname);
        check_close_f32(what, g + t->offset, ref, t->numel, 1e-6, 1e-3);
        free(ref);
    }
    /* the same batch without its documents is another computation: the fixture can tell */
    CHECK(st_model_set_docs(m, NULL, NULL, &err) == ST_OK, "%s clear docs", name);
    float plain = m->ops->forward(m, inputs, targets, 0.0f);
    CHECK(ref_loss && fabsf(plain - ref_loss[0]) > 1e-4f, "%s: the loss without documents %.7f equals the "
          "reference's %.7f", name, plain, ref_loss ? ref_loss[0] : NAN);
    free(ref_loss), free(g), free(targets);
    st_model_free(m);
    st_backend_free(be);
    st_safetensors_close(fx);
    st_safetensors_close(wx);
    return 0;
}

int main(void) {
    const char *names[] = {"gpt2_tiny", "llama_tiny", "qwen2_tiny", "qwen3_tiny"};
    for (int i = 0; i < 4; i++)
        if (run_fixture(names[i]) == 77) return 77;
    return test_finish("sft_fixture");
}
