/* model_resolve.c - a model's shape from a preset or a Hugging Face directory, whatever its
 * family, checked and described without building the model: what a configuration check and
 * a planner need (st_model_resolve, model.h). The one place above the families that tells
 * GPT-2 from the Llama family by name or by config.json. */
#include <stdio.h>
#include <string.h>

#include "strata/block.h"
#include "strata/llama.h"
#include "strata/model.h"
#include "model_internal.h"

/* An override that differs from the directory's value: the weights fix the shape. */
static st_status overrides_repeat(const char *dir, const st_model_overrides *ov, const int have[5], st_err *err) {
    static const char *names[5] = {"vocab_size", "max_seq", "n_layer", "n_head", "n_embd"};
    if (!ov) return ST_OK;
    const int want[5] = {ov->vocab_size, ov->max_seq, ov->n_layer, ov->n_head, ov->n_embd};
    for (int i = 0; i < 5; i++)
        if (want[i] > 0 && want[i] != have[i])
            return st_errf(err, ST_ERR_INVALID, "key '%s': %d differs from %s's %d; the shape comes from the "
                           "init_from directory (leave %s unset)", names[i], want[i], dir, have[i], names[i]);
    return ST_OK;
}

static void shape_gpt2(const st_gpt2_config *g, int B, int T, st_model_shape *out) {
    double C = g->n_embd, N = (double)B * T;
    out->arch = "gpt2";
    out->n_layer = g->n_layer, out->n_embd = g->n_embd, out->n_head = out->n_kv_head = g->n_head;
    out->vocab_size = g->vocab_size, out->max_seq = g->max_seq;
    /* in doubles: an absurd override must give a large number, not a wrapped one */
    out->n_params = g->n_layer * 12.0 * C * C + (double)(g->vocab_size + g->max_seq) * C;
    out->act_bytes = 4.0 * N * (g->n_layer * (16.0 * C + g->n_head + 4) + g->vocab_size + 12.0 * C);
    snprintf(out->desc, sizeof out->desc, "L=%d C=%d NH=%d V=%d maxT=%d", g->n_layer, g->n_embd, g->n_head,
             g->vocab_size, g->max_seq);
}

static void shape_llama(const st_llama_config *l, int B, int T, st_model_shape *out) {
    out->arch = "llama";
    out->n_layer = l->n_layer, out->n_embd = l->hidden_size, out->n_head = l->n_head, out->n_kv_head = l->n_kv_head;
    out->vocab_size = l->vocab_size, out->max_seq = l->max_seq;
    out->n_params = (double)st_llama_param_count(l);
    /* one sequence's bytes (they grow as B, and one sequence stays far inside size_t) times
     * B: at most B - 1 copies of the rotary tables over */
    out->act_bytes = B >= 1 && T >= 1 ? (double)B * (double)st_llama_act_bytes(l, 1, T) : 0;
    snprintf(out->desc, sizeof out->desc, "L=%d C=%d NH=%d NKV=%d V=%d maxT=%d", l->n_layer, l->hidden_size,
             l->n_head, l->n_kv_head, l->vocab_size, l->max_seq);
}

/* The family and its typed configuration, checked (model_internal.h): the dispatch that
 * st_model_resolve and st_model_create_from share. */
st_status model_family_resolve(const char *preset, const char *hf_dir, const st_model_overrides *ov, int *is_llama,
                                  st_gpt2_config *g, st_llama_config *l, st_err *err) {
    memset(g, 0, sizeof *g);
    memset(l, 0, sizeof *l);
    int llama;
    st_status s;
    if (hf_dir && hf_dir[0]) {
        llama = !st_gpt2_hf_is_dir(hf_dir);
        if (!llama && (s = st_gpt2_hf_config_read(hf_dir, g, err))) return st_err_prefix(err, "key 'init_from'");
        if (llama && (s = st_hf_config_read(hf_dir, l, err))) {
            if (s == ST_ERR_UNSUPPORTED && err) /* the Llama reader's list lacks the other family */
                snprintf(err->msg + strlen(err->msg), sizeof err->msg - strlen(err->msg),
                         "; or GPT-2 (GPT2LMHeadModel)");
            return st_err_prefix(err, "key 'init_from'");
        }
        const int have[5] = {llama ? l->vocab_size : g->vocab_size, llama ? l->max_seq : g->max_seq,
                             llama ? l->n_layer : g->n_layer, llama ? l->n_head : g->n_head,
                             llama ? l->hidden_size : g->n_embd};
        if ((s = overrides_repeat(hf_dir, ov, have, err))) return s;
    } else if (preset && st_llama_config_preset(preset, l, NULL) == ST_OK) {
        llama = 1;
        if ((s = st_llama_config_apply_overrides(l, ov, err))) return st_err_prefix(err, "model shape");
    } else if (preset && st_gpt2_config_preset(preset, g, NULL) == ST_OK) {
        llama = 0;
        if (ov) {
            if (ov->vocab_size > 0) g->vocab_size = ov->vocab_size;
            if (ov->max_seq > 0) g->max_seq = ov->max_seq;
            if (ov->n_layer > 0) g->n_layer = ov->n_layer;
            if (ov->n_head > 0) g->n_head = ov->n_head;
            if (ov->n_embd > 0) g->n_embd = ov->n_embd;
        }
    } else {
        return st_errf(err, ST_ERR_INVALID, "key 'model': unknown model '%s'; known models: %s (or init_from a "
                       "Hugging Face directory)", preset ? preset : "", st_model_preset_names());
    }
    if (!llama && (s = st_gpt2_config_validate(g, err))) return st_err_prefix(err, "model shape");
    *is_llama = llama;
    return ST_OK;
}

st_status st_model_resolve(const char *preset, const char *hf_dir, const st_model_overrides *ov, int B, int T,
                           st_model_shape *out, st_arch **arch, st_err *err) {
    memset(out, 0, sizeof *out);
    if (arch) *arch = NULL;
    if (B < 1 || T < 1) B = T = 0; /* no activations counted */
    st_gpt2_config g;
    st_llama_config l;
    int llama;
    st_status s = model_family_resolve(preset, hf_dir, ov, &llama, &g, &l, err);
    if (s) return s;
    out->from_dir = hf_dir && hf_dir[0];
    if (llama)
        shape_llama(&l, B, T, out);
    else
        shape_gpt2(&g, B, T, out);
    if (arch && (s = llama ? st_arch_llama(arch, &l, err) : st_arch_gpt2(arch, &g, err))) return s;
    return ST_OK;
}
