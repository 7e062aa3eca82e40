/* model_internal.h - what the model layer's files share and the public API does not
 * show (src/model only). */
#ifndef STRATA_MODEL_INTERNAL_H
#define STRATA_MODEL_INTERNAL_H

#include "strata/llama.h"
#include "strata/model.h"

/* A preset with overrides ov (may be NULL), or the Hugging Face directory hf_dir when it is
 * non-empty (an override may only repeat its value), resolved to its family (*is_llama) and
 * typed configuration (g or l filled), checked; errors name 'init_from', 'model', an
 * override's key or "model shape" (model_resolve.c). */
st_status model_family_resolve(const char *preset, const char *hf_dir, const st_model_overrides *ov, int *is_llama,
                                  st_gpt2_config *g, st_llama_config *l, st_err *err);

#endif
