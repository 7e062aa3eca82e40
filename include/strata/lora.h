/* lora.h - LoRA (low-rank adapters) over a model's frozen weights, as Hugging Face PEFT
 * defines them: each target projection y = x W0 (+ b) gains (alpha / r) (x A^T) B^T with
 * A (r, in) and B (out, r), PEFT's lora_A.weight and lora_B.weight; dropout 0, no bias
 * trained. The base model's weights stay where they are, read-only: no gradient of them is
 * formed (its gradient vector is freed), so no optimizer state either; its blocks' matmul
 * weights may be held in bf16 or int8 instead (frozen_dtype below, as QLoRA holds its base).
 *
 * A LoRA model is an st_model whose parameter vector holds only the adapters, A then B of
 * each adapted projection in the base's tensor order, named as PEFT saves them
 * ("base_model.model.transformer.h.0.attn.c_attn.lora_A.weight"); forward and backward run
 * the base's blocks with a st_linear_hook (model.h) that adds the low-rank term after each
 * adapted matmul and, in backward, takes its gradient to A, B and the input. Under layer
 * streaming (strata/stream.h) the executor runs the base's blocks with the same hook
 * (st_lora_hook_bind; their matmul weights as held with frozen_dtype bf16 or int8) and the
 * in-memory step's optimizer updates the adapters (strata/step.h).
 *
 * Example:
 *
 *     st_err err = {0};
 *     st_backend *be = NULL;
 *     st_model *base = NULL, *m = NULL;
 *     st_lora_config lc = {.rank = 4, .alpha = 8, .targets = "c_attn,c_proj"};
 *     enum { B = 2, T = 8 };
 *     int32_t in[B * T] = {0}, tgt[B * T] = {0};
 *     if (st_backend_cpu_create(&be, 0, &err) || st_model_create(&base, "gpt2-tiny", NULL, be, &err)) {
 *         fprintf(stderr, "strata: %s\n", err.msg);
 *         return 1;
 *     }
 *     base->ops->init_random(base, 1);
 *     if (st_lora_model_create(&m, base, &lc, 1, &err) || m->ops->alloc_acts(m, B, T, &err)) {
 *         fprintf(stderr, "strata: %s\n", err.msg); // base is freed with m, or here on failure
 *         return 1;
 *     }
 *     st_model_zero_grad(m);
 *     float loss = m->ops->forward(m, in, tgt, 1.0f / (B * T));
 *     m->ops->backward(m);                            // m->grads: the adapters' only
 *     printf("loss %.3f, %zu trainable parameters\n", loss, m->n_params);
 *     st_model_free(m);                               // and the base
 *     st_backend_free(be);
 *
 * End of example.
 */
#ifndef STRATA_LORA_H
#define STRATA_LORA_H

#include "strata/model.h"
#include "strata/poetx.h" /* st_frozen_dtype */

typedef struct st_lora_config {
    int rank;          /* r >= 1, at most each adapted projection's smaller dimension */
    double alpha;      /* lora_alpha: the term is scaled by alpha / r */
    char targets[256]; /* PEFT's target_modules, comma-separated: a module is adapted when its
                        * name is a target or ends with "." + target (GPT-2: c_attn, c_proj,
                        * c_fc; the Llama family: q_proj, k_proj, v_proj, o_proj, gate_proj,
                        * up_proj, down_proj; short forms q, k, v, o, gate, up, down too) */
    st_frozen_dtype frozen_dtype; /* the precision every matmul weight of the base's blocks is
                        * held in (adapted or not: all are frozen): fp32 (0, the base's own
                        * vector), bf16 or int8 (src/model/frozen_store.h: rounded once from the
                        * base's weights at creation, dequantised a panel at a time inside the
                        * matmuls, the base's fp32 pages of them given back); on a backend whose
                        * memory is the host's. The embeddings, head, norms and biases stay fp32. */
} st_lora_config;

/* The adapters of cfg over base (GPT-2 or the Llama family, weights already set), A drawn as
 * PEFT does in kind (uniform in +-1/sqrt(in), from seed) and B zero, so the model starts as
 * the base. Takes base (freed with the LoRA model; on failure freed here too) and frees its
 * gradient vector. Refused, naming the key and the tensor: rank < 1 or above a projection's
 * smaller dimension ('lora_rank'), alpha <= 0 ('lora_alpha'), a target that names no
 * projection of the model ('lora_targets', with the model's), a frozen_dtype other than fp32 on
 * a backend whose memory is not the host's ('frozen_dtype'). */
st_status st_lora_model_create(st_model **out, st_model *base, const st_lora_config *cfg, uint64_t seed,
                               st_err *err);
/* st_lora_model_create over the weights of the Hugging Face directory hf_dir, read into base (a
 * model of hf_dir's shape built without its weights: st_model_create_from with with_weights 0
 * and no_grads) after the adapters are made: each tensor checked finite as it is read (as
 * st_model_check_finite would after a load, FROM hf_dir), and with frozen_dtype bf16 or int8
 * each block matmul weight rounded into the held store and its fp32 pages given back before the
 * next tensor is read, so the base is never whole in fp32 (its vector's pages are taken as they
 * are written). The same model, bit for bit, as st_model_create_from with weights, then
 * st_lora_model_create. Takes base (freed on failure, with the model made). */
st_status st_lora_model_create_from(st_model **out, st_model *base, const char *hf_dir, const st_lora_config *cfg,
                                    uint64_t seed, st_err *err);
/* st_lora_model_create over a preset's base drawn from seed (its init_random's values, bit for
 * bit) after the adapters are made: base built without its weights and without gradients
 * (st_model_create_from with no_grads), and with frozen_dtype bf16 or int8 each block matmul
 * weight rounded into the held store and its fp32 pages given back before the next tensor is
 * drawn, so the base is never whole in fp32. The same model, bit for bit, as init_random, then
 * st_lora_model_create. Takes base (freed on failure, with the model made). */
st_status st_lora_model_create_drawn(st_model **out, st_model *base, const st_lora_config *cfg, uint64_t seed,
                                     st_err *err);
/* The configuration checked against a model's tensor table (the same refusals), allocating
 * nothing: how many adapter parameters it would train (*n_params, may be NULL). */
st_status st_lora_check(const st_param_info *tensors, int n_tensors, const char *arch, const st_lora_config *cfg,
                        size_t *n_params, st_err *err);
/* The adapters' hook scratch for B x T rows, in bytes (t, dt, u and the norms' dropped
 * gradients: what the model allocates for its hook besides the base's activations, under layer
 * streaming too); 0 for a configuration st_lora_check refuses. */
size_t st_lora_hook_scratch_bytes(const st_param_info *tensors, int n_tensors, const char *arch,
                                  const st_lora_config *cfg, int B, int T);
/* The matmul weights of the blocks of a tensor table of family arch ("gpt2", "llama"), as
 * frozen_dtype d holds them: their values (*numel), their bytes in d (*held), the dequantising
 * panel buffer (*panel; 0 with fp32) and the held matmuls' scratch in floats per row of the
 * batch (*row_floats, B x T rows: a packed matmul's projection, a panel's partial product; 0
 * with fp32). */
void st_lora_held_bytes(const st_param_info *tensors, int n_tensors, const char *arch, st_frozen_dtype d, size_t *numel,
                        size_t *held, size_t *panel, size_t *row_floats);
/* The most bytes st_lora_model_create_from's load holds in the base's vector and the held store
 * of frozen_dtype d while it reads a table of family arch (host memory), tensor by tensor in
 * the table's order: the tensors read so far (fp32, or as held where d rounds them), the tensor
 * being read in fp32 and its file's pages (4 bytes a value, st_params_load_extra_bytes' rule). */
size_t st_lora_load_peak_bytes(const st_param_info *tensors, int n_tensors, const char *arch, st_frozen_dtype d);
/* The same for st_lora_model_create_drawn's draw: the tensor being drawn in fp32 alone beside those
 * drawn so far (4 bytes a value: no file). */
size_t st_lora_draw_peak_bytes(const st_param_info *tensors, int n_tensors, const char *arch, st_frozen_dtype d);
/* Layer streaming (strata/stream.h): the hook an executor's blocks call over m's base (its
 * st_stream_config.hook, frozen), with its scratch for B x T rows and none of the base's own
 * activations. Its forward reads m->params, its backward adds to m->grads: host memory (the
 * CPU backend's). frozen_dtype bf16 or int8: the hook holds the blocks' matmul weights
 * (held_block_bytes, held_host: model.h) and the executor carries them as held. Until the next
 * alloc_acts or st_lora_hook_bind. */
st_status st_lora_hook_bind(st_model *m, int B, int T, st_linear_hook **hook, st_err *err);
/* 1 when m is a LoRA model. */
int st_model_is_lora(const st_model *m);
/* Its base model (frozen weights), and its configuration. */
st_model *st_lora_base(const st_model *m);
const st_lora_config *st_lora_config_of(const st_model *m);
/* A PEFT adapter directory DIR: adapter_config.json (LORA, r, lora_alpha, target_modules,
 * fan_in_fan_out for GPT-2's Conv1D, base_model_name_or_path = base_name) and
 * adapter_model.safetensors (F32, PEFT's names). PEFT's PeftModel.from_pretrained loads it. */
st_status st_lora_save_adapter(const st_model *m, const char *dir, const char *base_name, st_err *err);
/* The base with every adapter merged in (W0 + (alpha/r) B A in the base's layout), written
 * as the base's Hugging Face directory (its save_hf); the base's weights are unchanged after.
 * With frozen_dtype bf16 or int8, W0 is the held weight dequantised (the model trained), written
 * into the base's vector for the save and its pages given back after. */
st_status st_lora_save_merged_hf(const st_model *m, const char *dir, st_dtype dtype, st_err *err);

/* A PEFT adapter directory's adapter_config.json read back: peft_type LORA (no DoRA, rsLoRA,
 * bias or modules_to_save: refused, naming the file and the field), its r, lora_alpha and
 * target_modules (a list of names, joined with commas) into *cfg, base_model_name_or_path into
 * base (base_cap bytes; base may be NULL). */
st_status st_lora_read_adapter_config(const char *dir, st_lora_config *cfg, char *base, size_t base_cap,
                                      st_err *err);
/* The adapter directory dir against a configuration over a model's tensor table, allocating no
 * weights: the same r (else refused naming 'lora_rank'), lora_alpha ('lora_alpha') and adapted
 * projections ('lora_targets'), and adapter_model.safetensors holding every adapter under its
 * PEFT name and this model's shape (naming the tensor). */
st_status st_lora_check_adapter(const st_param_info *tensors, int n_tensors, const char *arch, const st_lora_config *cfg,
                                const char *dir, st_err *err);
/* m's adapters set from dir/adapter_model.safetensors (every one under its name and shape). */
st_status st_lora_load_adapter(st_model *m, const char *dir, st_err *err);

#endif
