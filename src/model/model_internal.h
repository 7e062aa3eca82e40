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

#endif
