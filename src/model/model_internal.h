/* model_internal.h - what the model layer's files share and the public API does not
 * show (src/model only). */
#ifndef STRATA_MODEL_INTERNAL_H
#define STRATA_MODEL_INTERNAL_H

#include "strata/llama.h"
#include "strata/model.h"
#include "strata/safetensors.h"

/* A preset with overrides ov (may be NULL), or the Hugging Face directory hf_dir when it is
 * non-empty (an override may only repeat its value), resolved to its family (*is_llama) and
 * typed configuration (g or l filled), checked; errors name 'init_from', 'model', an
 * override's key or "model shape" (model_resolve.c). */
st_status model_family_resolve(const char *preset, const char *hf_dir, const st_model_overrides *ov, int *is_llama,
                                  st_gpt2_config *g, st_llama_config *l, st_err *err);

/* st_gpt2_create, st_llama_create, st_model_create_gpt2, st_model_create_llama and the two
 * Hugging Face directories' creators, the gradient vector allocated only where with_grads: 0
 * makes the base of a method over frozen weights (LoRA, POET-X), grads NULL (GPT-2's emb_g and
 * lnf_g too), 4 bytes a parameter at its start instead of 8. */
st_status model_gpt2_create(st_gpt2_model *m, const st_gpt2_config *cfg, int with_grads, st_backend *be,
                            st_err *err);
st_status model_llama_create(st_llama_model *m, const st_llama_config *cfg, int with_grads, st_backend *be,
                             st_err *err);
st_status model_create_gpt2(st_model **out, const st_gpt2_config *cfg, int with_grads, st_backend *be, st_err *err);
st_status model_create_llama(st_model **out, const st_llama_config *cfg, int with_grads, st_backend *be,
                             st_err *err);
st_status model_create_gpt2_hf(st_model **out, const char *dir, int with_grads, st_backend *be, st_err *err);
st_status model_create_llama_hf(st_model **out, const char *dir, int with_grads, st_backend *be, st_err *err);

/* Tensors t[0..n) from their files src[i], under names[i] (t[i].name where names is NULL), into
 * params (the backend's memory): every tensor checked first (st_safetensors_check_f32: present,
 * its shape, a float dtype) and nothing written unless all pass, so a failed load leaves params
 * as they were. In place where the backend's memory is the host's (no second copy of the
 * weights), else through one staging buffer of the largest tensor (model.c). */
st_status model_params_load(st_backend *be, float *params, const st_param_info *t, int n, st_safetensors *const *src,
                            const char *const *names, st_err *err);

/* What the loader calls after each tensor is in place: fn(ctx, t, at, err) with t the tensor's
 * row of the table and at its values (params + t->offset, the backend's memory), before the next
 * tensor is read; a status other than ST_OK stops the load with it. The caller of a load that
 * can stop so discards the half-loaded model (its tensors were all checked before the first
 * was written, so only fn stops it). */
typedef struct model_load_each {
    st_status (*fn)(void *ctx, const st_param_info *t, float *at, st_err *err);
    void *ctx;
} model_load_each;

/* model_params_load with each (NULL: none) called after each tensor. */
st_status model_params_load_each(st_backend *be, float *params, const st_param_info *t, int n,
                                 st_safetensors *const *src, const char *const *names, const model_load_each *each,
                                 st_err *err);

/* st_gpt2_load_safetensors with each (NULL: none) after each tensor (gpt2_io.c). */
st_status model_gpt2_load_safetensors(st_gpt2_model *m, const char *path, const model_load_each *each, st_err *err);

/* Weights from the Hugging Face directory dir into m (a GPT-2 or Llama-family model of the
 * directory's shape, st_model_create_from without weights), each (NULL: none) after each
 * tensor: what st_model_create_from does with weights after building the model (hf_io.c). */
st_status model_load_hf(st_model *m, const char *dir, const model_load_each *each, st_err *err);

/* st_params_init_by_role's values, bit for bit, drawn into params (the backend's memory) a tensor
 * at a time in the table's order, each (NULL: none) called after each tensor is in place and
 * before the next is drawn: a frozen base whose pages are taken as they are written
 * (model_params_alloc) rounds and gives back each block weight as it is drawn, never holding the
 * base whole in fp32. Each tensor's draws run in pieces on the threads; a device's memory takes
 * them through one staging buffer of the largest tensor. A status other than ST_OK from each
 * stops the draw with it (the caller discards the model). */
st_status model_params_init_each(st_backend *be, float *params, const st_param_info *t, int n, uint64_t seed,
                                 const char *resid_suffix, float resid_scale, const model_load_each *each,
                                 st_err *err);
/* m's init_random (GPT-2 or the Llama family: the same values for the same seed) through
 * model_params_init_each, each after each tensor. */
st_status model_init_each(st_model *m, uint64_t seed, const model_load_each *each, st_err *err);
/* The rules of the families' initialisations (st_params_init_by_role's resid_suffix and
 * resid_scale): GPT-2's projections into the residual stream scaled by 1 / sqrt(2 n_layer), and
 * none in the Llama family (llama_arch.c's init, Hugging Face's initializer_range alone). */
void model_gpt2_init_rule(int n_layer, const char **resid_suffix, float *resid_scale);

/* ti's values p all finite? ST_ERR_NONFINITE naming FROM, the tensor and the element (the
 * rule of st_model_check_finite, a tensor at a time). */
st_status model_tensor_check_finite(const st_param_info *ti, const float *p, const char *from, st_err *err);

/* The model's parameter vector of n values on be, zeroed: a base without gradients (a method
 * over frozen weights) on host memory gets its pages as they are written (st_alloc_untouched,
 * *untouched 1), so a loader that rounds and gives back each block weight as it reads it never
 * holds the base whole; else be's alloc (*untouched 0). model_params_free gives it back. */
float *model_params_alloc(st_backend *be, size_t n, int with_grads, int *untouched);
void model_params_free(st_backend *be, float *params, size_t n, int untouched);

#endif
