/* frozen_base_internal.h - the plumbing LoRA (lora.c) and POET-X (poetx.c) share around a
 * frozen base model (src/model only): the projections of each family and their walk over a
 * tensor table, the common head of the two models' impl, the base's gradient vector dropped,
 * the hook set, and the st_model ops that only pass through to the base (frozen_base.c). */
#ifndef STRATA_FROZEN_BASE_INTERNAL_H
#define STRATA_FROZEN_BASE_INTERNAL_H

#include <stddef.h>

#include "model/frozen_store.h"
#include "strata/model.h"

/* A projection of a family: the suffix of its weight's name, PEFT's module name, strata's
 * short form (NULL: none) and the block matmul it is part of (ST_MM_*). */
typedef struct frozen_proj {
    const char *suffix, *module, *short_name;
    int mm;
} frozen_proj;

/* The projections of GPT-2 (gpt2 1: 4 of them, weights (in, out), Conv1D) or of the Llama
 * family (0: 7, weights (out, in)); *n their number. */
const frozen_proj *frozen_base_projs(int gpt2, int *n);

/* The row of frozen_base_projs whose suffix the tensor name ends with, or -1. */
int frozen_base_proj_of(const char *name, int gpt2);

/* The layer in a block tensor's name (".h.<l>." or ".layers.<l>."), or -1. */
int frozen_base_layer_of(const char *name);

/* The number of layers of a tensor table (1 + the largest layer named). */
int frozen_base_layers(const st_param_info *tt, int nt);

/* One projection weight of a table, as frozen_base_next_site finds it. */
typedef struct frozen_site {
    const st_param_info *t; /* the base's tensor */
    int proj;               /* its row in frozen_base_projs */
    int key;                /* layer * ST_MM_COUNT + mm: the block matmul it is part of */
    int in, out;            /* input width, output rows */
    int col, ld;            /* its first column in the matmul's packed output, that output's width */
} frozen_site;

/* The next projection weight of tt[nt] in the table's order after *cursor (start at 0): fills
 * s, returns 0 at the end. The projections of one matmul stand together in a table. */
int frozen_base_next_site(const st_param_info *tt, int nt, int gpt2, int *cursor, frozen_site *s);

/* first[k] .. first[k + 1]: the items of key k (k < n_keys) among n items in key order, each
 * stride bytes and beginning with its int key. */
void frozen_base_index(int *first, int n_keys, const void *items, size_t stride, int n);

/* The head of LoRA's and POET-X's impl (their first member, so m->impl points to it). */
typedef struct frozen_base {
    st_linear_hook hook; /* first: the block functions call it with &hook */
    st_model *base;      /* owned: freed with the model */
    st_model *self;
    int gpt2;            /* 1: GPT-2; 0: the Llama family */
    int n_layer;
    int *first;          /* [n_layer * ST_MM_COUNT + 1] (frozen_base_index) */
    /* frozen_dtype bf16, int8 (frozen_base_hold): every held weight's codes in one allocation,
     * layer l's in the run [l * held_stride, + held_stride) (hook.held_block_bytes) */
    unsigned char *held_mem;
    size_t held_stride;
} frozen_base;

/* fb over base for the model self: its family, its layers, first allocated. Returns 0, or -1
 * out of memory. */
int frozen_base_init(frozen_base *fb, st_model *self, st_model *base);

/* m's backend, sizes (its n_params = np) and its parameter and gradient vectors of np floats
 * from the base's backend. Returns 0, or -1 when either vector could not be allocated. */
int frozen_base_vectors(st_model *m, const frozen_base *fb, size_t np);

/* bf16, int8: the n weights w[i] of layer[i] (in layer order) placed in one allocation, layer by
 * layer, each layer's run as long as the longest (st_frozen_held_block_bytes), and the hook's
 * held_block_bytes and held_host set: what a layer-streaming executor carries. Returns 0, or -1
 * out of memory. The codes are the caller's to fill (frozen_weight_set). */
int frozen_base_hold(frozen_base *fb, st_frozen_dtype d, frozen_weight *const *w, const int *layer, int n);
/* Held weight w of the layer the hook runs as the hook reads it: over the executor's copy of the
 * layer's run where it set one (hook.held), else w itself. */
frozen_weight frozen_base_held_view(const frozen_base *fb, const frozen_weight *w);

/* The base is frozen: its gradient vector is freed, the family's pointers into it cleared. */
void frozen_base_drop_grads(frozen_base *fb);

/* The hook the base's blocks call (NULL: none). */
void frozen_base_set_hook(frozen_base *fb, st_linear_hook *h);

/* What frozen_base_init and frozen_base_vectors made, and the base (the hook cleared first). */
void frozen_base_free(st_model *m, frozen_base *fb);

/* The base's activations for B x T; m reads its row losses. */
st_status frozen_base_alloc_acts(st_model *m, int B, int T, st_err *err);

/* st_model ops that pass through to the base (m->impl a frozen_base). backward: the base's,
 * then m's grad hook over all of m's parameters (the base's own is NULL). */
void frozen_base_backward(st_model *m);
int frozen_base_step_gemms(const st_model *m, int B, int T, st_gemm_shape *out, int max);
const float *frozen_base_logits(const st_model *m);
st_status frozen_base_set_docs(st_model *m, const int32_t *positions, const int32_t *doc_start, st_err *err);

#endif
