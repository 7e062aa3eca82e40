/* hf_inspect.c - a Hugging Face model directory described without loading it: what the
 * configuration is, whether the weight files match it, and what training it would cost in
 * memory, per class of state. Backs `strata inspect DIR`. */
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/hf_internal.h"
#include "strata/llama.h"
#include "strata/safetensors.h"


/* Sum one weight file's tensors into the totals (by dtype). */
static st_status scan_file(const char *path, size_t *numel, size_t *bytes, size_t by_dtype[8], int *n_tensors,
                           st_err *err) {
    st_safetensors *st;
    st_status s = st_safetensors_open(&st, path, err);
    if (s) return s;
    for (int i = 0; i < st_safetensors_count(st); i++) {
        const st_tensor_entry *e = st_safetensors_entry(st, i);
        if (strstr(e->name, "rotary_emb.inv_freq")) continue;
        *numel += e->numel;
        *bytes += e->end - e->begin;
        if ((unsigned)e->dtype < 8) by_dtype[e->dtype] += e->numel;
        (*n_tensors)++;
    }
    st_safetensors_close(st);
    return ST_OK;
}

/* bytes as "12.345 GiB" / "3.2 MiB" / "512 B" in a rotating static buffer (for printf) */
static const char *human(double bytes) {
    static char buf[8][32];
    static int k;
    char *b = buf[k++ % 8];
    if (bytes >= 1073741824.0) snprintf(b, 32, "%.3f GiB", bytes / 1073741824.0);
    else if (bytes >= 1048576.0) snprintf(b, 32, "%.1f MiB", bytes / 1048576.0);
    else if (bytes >= 1024.0) snprintf(b, 32, "%.1f KiB", bytes / 1024.0);
    else snprintf(b, 32, "%.0f B", bytes);
    return b;
}

st_status st_hf_inspect(const char *dir, int B, int T, double state_bytes_per_param, FILE *out, st_err *err) {
    st_llama_config c;
    st_status s = st_hf_config_read(dir, &c, err);
    if (s) return s;
    size_t want = st_llama_param_count(&c), numel = 0, bytes = 0, by_dtype[8] = {0};
    int n_tensors = 0, n_files = 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (access(path, F_OK) == 0) {
        char *text = hf_read_text(path, err);
        if (!text) return err ? err->code : ST_ERR_IO;
        json_object *idx = json_tokener_parse(text), *wm;
        free(text);
        if (!idx || !json_object_object_get_ex(idx, "weight_map", &wm) || !json_object_is_type(wm, json_type_object)) {
            if (idx) json_object_put(idx);
            return st_errf(err, ST_ERR_FORMAT, "%s: no 'weight_map' object", path);
        }
        /* each shard once, in the order first seen */
        const char **seen = calloc((size_t)json_object_object_length(wm) + 1, sizeof *seen);
        json_object_object_foreach(wm, key, val) {
            (void)key;
            const char *f = json_object_get_string(val);
            int dup = 0;
            for (int i = 0; i < n_files && !dup; i++) dup = !strcmp(seen[i], f);
            if (dup || !f) continue;
            seen[n_files++] = f;
            char sp[4096];
            snprintf(sp, sizeof sp, "%s/%s", dir, f);
            if (!s) s = scan_file(sp, &numel, &bytes, by_dtype, &n_tensors, err);
        }
        free(seen);
        json_object_put(idx);
        if (s) return s;
    } else {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        if ((s = scan_file(path, &numel, &bytes, by_dtype, &n_tensors, err))) return s;
        n_files = 1;
    }
    size_t tied_extra = c.tie_word_embeddings && numel == want + (size_t)c.vocab_size * c.hidden_size
                            ? (size_t)c.vocab_size * c.hidden_size : 0; /* a saved tied lm_head */
    fprintf(out, "%s: %s (%s)\n", dir, c.model_type, c.n_kv_head == c.n_head ? "multi-head" :
            c.n_kv_head == 1 ? "multi-query" : "grouped-query");
    fprintf(out, "  layers %d, hidden %d, intermediate %d, heads %d, kv heads %d, head_dim %d, vocab %d\n", c.n_layer,
            c.hidden_size, c.intermediate_size, c.n_head, c.n_kv_head, c.head_dim, c.vocab_size);
    fprintf(out, "  rope theta %g%s, rms_norm_eps %g, q/k/v bias %s, o bias %s, q/k norm %s, head %s, "
            "max positions %d%s\n", c.rope_theta, c.rope_llama3 ? " (llama3 scaling)" : "", c.rms_norm_eps,
            c.qkv_bias ? "yes" : "no", c.o_bias ? "yes" : "no", c.qk_norm ? "yes" : "no",
            c.tie_word_embeddings ? "tied" : "untied", c.max_seq, c.sliding_window ? " (sliding window set)" : "");
    fprintf(out, "  parameters %zu (%.3f B)\n", want, want / 1e9);
    fprintf(out, "  weights: %d tensors in %d file%s, %s on disk:", n_tensors, n_files, n_files > 1 ? "s" : "",
            human((double)bytes));
    for (int t = 0; t < 8; t++)
        if (by_dtype[t]) fprintf(out, " %s %zu", st_dtype_name((st_dtype)t), by_dtype[t]);
    fprintf(out, "\n");
    if (numel - tied_extra != want)
        fprintf(out, "  WARNING: the files hold %zu elements, the configuration needs %zu\n", numel, want);
    double w = 4.0 * want, g = 4.0 * want, o = state_bytes_per_param * want;
    double a = B > 0 && T > 0 ? (double)st_llama_act_bytes(&c, B, T) : 0;
    fprintf(out, "  training memory at batch %d x seq %d:\n", B, T);
    fprintf(out, "    weights (fp32)      %12s\n", human(w));
    fprintf(out, "    gradients (fp32)    %12s\n", human(g));
    fprintf(out, "    optimizer moments   %12s (%.2f bytes/param)\n", human(o), state_bytes_per_param);
    fprintf(out, "    activations         %12s (of which logits %s)\n", human(a),
            human(4.0 * B * T * (double)c.vocab_size));
    fprintf(out, "    total               %12s\n", human(w + g + o + a));
    return ST_OK;
}
