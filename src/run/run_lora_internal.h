/* run_lora_internal.h - strata train's method lora (run_lora.c): the keys checked before anything is
 * written, the model wrapped in its adapters, the PEFT adapter written at the end. */
#ifndef STRATA_RUN_LORA_INTERNAL_H
#define STRATA_RUN_LORA_INTERNAL_H

#include "strata/model.h"
#include "strata/train.h"

/* method and its keys against the model's tensor table, allocating no weights: a bad method,
 * lora keys where what they need is absent (save_adapter without method lora), method lora
 * with layer streaming (not yet), a rank or target the model refuses (naming the key and the
 * tensor). The disk state and ranks train the adapters' vector as any run's. */
st_status run_lora_check(const st_train_config *c, st_err *err);
/* An init_from that is a PEFT adapter directory (adapter_config.json, no config.json) becomes
 * its base (base_model_name_or_path, a model directory) and init_adapter the adapter, before
 * anything else reads c; a base that is a preset or no directory from here is refused, saying
 * to give --model or --init_from with --init_adapter. Otherwise nothing. */
st_status run_lora_init_from(st_train_config *c, st_err *err);
/* method lora: *m (the base, its weights set) becomes the LoRA model over it (its adapters
 * from init_adapter when given, unless resuming), its activations the run's to allocate; *m is NULL on failure (the base freed). Otherwise nothing. */
/* The adapter parameters method lora trains for c over the model a of family ("gpt2", "llama"). */
st_status run_lora_trainable(const st_train_config *c, const st_arch *a, const char *family, size_t *n, st_err *err);
/* The adapters' hook scratch for the run's B x T, in bytes (st_lora_hook_scratch_bytes): counted
 * beside the executor's tables under layer streaming, where the base's activations are the
 * executor's. */
double run_lora_hook_bytes(const st_train_config *c, const st_arch *a, const char *family);
/* The frozen base as held for c's frozen_dtype (bf16, int8: the blocks' matmul weights in it, its
 * panel buffer and the held matmuls' scratch for c's batch x seq, the rest fp32), in bytes; 0 for
 * fp32 (the account's 4 bytes a parameter). */
double run_lora_frozen_bytes(const st_train_config *c, const st_arch *a, const char *family);
/* The run's start in bytes for n_tr adapter parameters (the plan's method_start): the adapters
 * (their vectors, their initialisation's staging) and a bf16 or int8 store made first, then the
 * base built without gradients read from init_from or drawn from the seed a tensor at a time, each
 * block matmul weight rounded into the store as it is read or drawn (the base is never whole in
 * fp32); with fp32 a preset's base drawn whole in place, then the adapters wrapped over it. */
double run_lora_start_bytes(const st_train_config *c, const st_arch *a, const char *family, size_t n_tr);
st_status run_lora_open(const st_train_config *c, st_model **m, st_err *err);
/* 1 when c is method lora over init_from: its base is built without weights, which run_lora_open
 * reads (st_lora_model_create_from: each block weight held as it is read, each tensor checked
 * finite); 0: the base comes with its weights. */
int run_lora_loads_base(const st_train_config *c);
/* 1 when c is method lora over a preset with frozen_dtype bf16 or int8: its base is built without
 * weights, which run_lora_open draws (st_lora_model_create_drawn: each block weight held as it is
 * drawn); 0: the base comes with its weights, or fp32's are drawn whole before the wrap. */
int run_lora_draws_base(const st_train_config *c);
/* The end of a run: save_adapter's PEFT directory, said unless quiet. */
st_status run_lora_finish(const st_train_config *c, const st_model *m, int quiet, st_err *err);

#endif
