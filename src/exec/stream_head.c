/* stream_head.c - the streaming executor's model ends: the embedding forward (on the
 * device, or on the host when the vocabulary is chunked) and the generic head (the arch's
 * final norm, the classifier, cross-entropy), whole on the device or in chunks of vc rows
 * that cross twice per step (online softmax; the first pass's logits wait on the host).
 */
#include <math.h>

#include "exec/stream_internal.h"

/* ------------------------------------------------------------------ the head
 * The same for every architecture (block.h): the arch's final norm, then logits = xn W^T
 * over the head's rows W (V, C), cross-entropy, and back. Whole on the device, or in
 * chunks of vc rows (online softmax) when W does not fit. */

/* Where the head's rows live on the device when they are resident (unchunked). */
static float *head_w(st_stream_exec *x) {
    return x->ly->tied ? x->d_pre_w + x->ly->head_offset : x->d_post_w + (x->ly->head_offset - x->post_offset);
}
static float *head_g(st_stream_exec *x) {
    if (x->hook_base && !x->ends) return NULL; /* a frozen head forms no gradient (dxn only) */
    return x->ly->tied ? x->d_pre_g + x->ly->head_offset : x->d_post_g + (x->ly->head_offset - x->post_offset);
}

/* The mean over targets >= 0 of per-row losses (host), as the models' own heads take it. */
static float mean_loss(const float *losses, const int32_t *targets, int N) {
    double sum = 0;
    int counted = 0;
    for (int i = 0; i < N; i++)
        if (targets[i] >= 0) {
            sum += losses[i];
            counted++;
        }
    return counted ? (float)(sum / counted) : 0.0f;
}

float stream_head_forward(st_stream_exec *x, const float *xin, const int32_t *targets, float dloss) {
    st_backend *dev = x->dev;
    int N = x->cfg.B * x->cfg.T, C = x->ly->n_embd, V = x->ly->vocab_size;
    x->arch->ops->norm_forward(x->dev_blocks, x->d_post_w, xin, x->d_xn, x->d_nstats);
    dev->ops->matmul_forward(dev, x->d_logits, x->d_xn, head_w(x), NULL, N, C, V, ST_W_OUT_IN);
    dev->ops->crossentropy_forward_backward(dev, x->d_logits, x->d_losses, x->d_tgt, N, V, dloss);
    st_prof_span lc = st_prof_begin(ST_PROF_CAT_COPY, "copy d2h losses", -1);
    dev->ops->copy_to_host(dev, x->h_losses, x->d_losses, sizeof(float) * (size_t)N);
    st_prof_end_bytes(&lc, (int64_t)(sizeof(float) * (size_t)N));
    return mean_loss(x->h_losses, targets, N);
}

void stream_head_backward(st_stream_exec *x, const float *xin) {
    st_backend *dev = x->dev;
    int N = x->cfg.B * x->cfg.T, C = x->ly->n_embd, V = x->ly->vocab_size;
    /* the logits buffer holds dlogits; dxn written (the same bits as cleared, then added to) */
    if (dev->ops->matmul_backward_write) {
        dev->ops->matmul_backward_write(dev, x->d_dxn, head_g(x), NULL, x->d_logits, x->d_xn, head_w(x), N, C, V,
                                        ST_W_OUT_IN);
    } else {
        dev->ops->memset0(dev, x->d_dxn, x->resid_numel * 4);
        dev->ops->matmul_backward(dev, x->d_dxn, head_g(x), NULL, x->d_logits, x->d_xn, head_w(x), N, C, V,
                                  ST_W_OUT_IN);
    }
    dev->ops->memset0(dev, x->d_dres, x->resid_numel * 4);
    x->arch->ops->norm_backward(x->dev_blocks, x->d_dres, x->d_post_g, x->d_dxn, xin, x->d_post_w, x->d_nstats);
}

static int vchunk_rows(const st_stream_exec *x, int c) {
    int r0 = c * x->vocab_chunk;
    return r0 + x->vocab_chunk <= x->ly->vocab_size ? x->vocab_chunk : x->ly->vocab_size - r0;
}

void stream_fetch_vchunk(st_stream_exec *x, int c) {
    size_t C = (size_t)x->ly->n_embd, r0 = (size_t)c * x->vocab_chunk;
    stream_weights_at(x, x->post_offset, x->n_params - x->post_offset); /* an untied head's rows are there */
    x->vocab_w_ticket[c] = h2d(x, x->d_vocab_w + (size_t)(c % 2) * x->vocab_chunk * C, x->host_params + x->ly->head_offset + r0 * C,
                          (size_t)vchunk_rows(x, c) * C * 4);
}

static float *logits_slot(st_stream_exec *x, int c) {
    return x->d_logits + (size_t)(c % 2) * (size_t)x->cfg.B * x->cfg.T * x->vocab_chunk;
}

float stream_chunked_head_forward(st_stream_exec *x, const float *xin, const int32_t *targets, double *compute_s) {
    st_backend *dev = x->dev;
    int N = x->cfg.B * x->cfg.T, C = x->ly->n_embd;
    stream_tspan ts;
    stream_compute_begin(x, &ts, ST_PROF_CAT_COMPUTE, "forward head norm", -1);
    x->arch->ops->norm_forward(x->dev_blocks, x->d_post_w, xin, x->d_xn, x->d_nstats);
    dev->ops->softmax_chunk_init(dev, x->d_rmax, x->d_rsum, x->d_tlogit, N);
    stream_compute_end(x, &ts, compute_s);
    uint64_t lg[2] = {0, 0}; /* each slot's logits on their way to the host */
    for (int c = 0; c < x->n_vocab_chunks; c++) {
        wait_ticket(x, x->vocab_w_ticket[c], "wait head chunk", c);
        wait_ticket(x, lg[c % 2], "wait logits slot", c);
        int nr = vchunk_rows(x, c);
        float *lo = logits_slot(x, c);
        stream_compute_begin(x, &ts, ST_PROF_CAT_COMPUTE, "forward head chunk", c);
        dev->ops->matmul_forward(dev, lo, x->d_xn, x->d_vocab_w + (size_t)(c % 2) * x->vocab_chunk * C, NULL, N, C, nr,
                                 ST_W_OUT_IN);
        /* kept for backward (the last two chunks stay in their slots); the stats only read */
        lg[c % 2] = 0;
        if (c + 2 < x->n_vocab_chunks) {
            x->d2h_act_bytes += (size_t)N * nr * 4; /* activations, not weights */
            lg[c % 2] = d2h(x, x->h_logits + (size_t)c * N * x->vocab_chunk, lo, (size_t)N * nr * 4);
        }
        dev->ops->softmax_chunk_stats(dev, lo, x->d_tgt, N, nr, c * x->vocab_chunk, x->d_rmax, x->d_rsum, x->d_tlogit);
        stream_compute_end(x, &ts, compute_s);
        if (c + 2 < x->n_vocab_chunks) stream_fetch_vchunk(x, c + 2);
    }
    dev->ops->copy_to_host(dev, x->h_rmax, x->d_rmax, (size_t)N * 4);
    dev->ops->copy_to_host(dev, x->h_rsum, x->d_rsum, (size_t)N * 8);
    dev->ops->copy_to_host(dev, x->h_tlogit, x->d_tlogit, (size_t)N * 4);
    for (int i = 0; i < N; i++)
        x->h_losses[i] = targets[i] >= 0 ? (float)(x->h_rmax[i] + log(x->h_rsum[i]) - x->h_tlogit[i]) : 0.0f;
    return mean_loss(x->h_losses, targets, N);
}

void stream_chunked_head_backward(st_stream_exec *x, const float *xin, float dloss, double *compute_s) {
    st_backend *dev = x->dev;
    int N = x->cfg.B * x->cfg.T, C = x->ly->n_embd;
    size_t vcC = (size_t)x->vocab_chunk * C;
    /* where each chunk's head gradient lands, rows r0.. at head_dst + r0 C: the arch's gradient
     * vector, or a hook that trains the ends (POET-X) the head's gradient it keeps (grad_at, the
     * tensor whole from its first element, as hand_ends copies it); a frozen head forms none.
     * A tied head's rows are the embedding's: the embedding's backward adds to them after. */
    float *head_dst = !x->hook_base ? x->grad_dest + x->ly->head_offset
                    : x->ends       ? x->cfg.hook->grad_at(x->cfg.hook, -1, x->ly->head_offset)
                                    : NULL;
    dev->ops->memset0(dev, x->d_dxn, x->resid_numel * 4);
    x->vocab_g_ticket[0] = x->vocab_g_ticket[1] = 0;
    uint64_t lgt[2] = {0, 0};
    /* in reverse: the last two chunks of the first pass are still in their slots */
    for (int c = x->n_vocab_chunks - 1; c >= 0; c--) {
        wait_ticket(x, x->vocab_w_ticket[c], "wait head chunk", c);
        wait_ticket(x, x->vocab_g_ticket[c % 2], "wait head grad slot", c);
        int nr = vchunk_rows(x, c);
        float *w = x->d_vocab_w + (size_t)(c % 2) * vcC;
        float *g = head_dst ? x->d_vocab_g + (size_t)(c % 2) * vcC : NULL; /* frozen: dxn only */
        /* the forward's logits: the last two chunks never left their slots; the one after
         * this one comes back into the other slot while this one computes */
        if (c - 1 >= 0 && c - 1 + 2 < x->n_vocab_chunks) {
            x->h2d_act_bytes += (size_t)N * vchunk_rows(x, c - 1) * 4;
            lgt[(c - 1) % 2] = h2d(x, logits_slot(x, c - 1), x->h_logits + (size_t)(c - 1) * N * x->vocab_chunk,
                                   (size_t)N * vchunk_rows(x, c - 1) * 4);
        }
        wait_ticket(x, lgt[c % 2], "wait logits", c);
        float *lo = logits_slot(x, c);
        stream_tspan ts;
        stream_compute_begin(x, &ts, ST_PROF_CAT_COMPUTE, "backward head chunk", c);
        dev->ops->softmax_chunk_grad(dev, lo, x->d_tgt, N, nr, c * x->vocab_chunk, x->d_rmax, x->d_rsum, dloss);
        if (g) dev->ops->memset0(dev, g, (size_t)nr * C * 4);
        dev->ops->matmul_backward(dev, x->d_dxn, g, NULL, lo, x->d_xn, w, N, C, nr, ST_W_OUT_IN);
        stream_compute_end(x, &ts, compute_s);
        if (g) x->vocab_g_ticket[c % 2] = d2h(x, head_dst + (size_t)c * vcC, g, (size_t)nr * C * 4);
        if (c - 2 >= 0) stream_fetch_vchunk(x, c - 2);
    }
    stream_tspan ts;
    stream_compute_begin(x, &ts, ST_PROF_CAT_COMPUTE, "backward head norm", -1);
    dev->ops->memset0(dev, x->d_dres, x->resid_numel * 4);
    x->arch->ops->norm_backward(x->dev_blocks, x->d_dres, x->d_post_g, x->d_dxn, xin, x->d_post_w, x->d_nstats);
    stream_compute_end(x, &ts, compute_s);
}

/* The embedding forward: on the device, or (chunked vocabulary) on the host from its
 * master copy, the output crossing to the device. Returns that copy's ticket (0: none). */
uint64_t stream_embed_forward(st_stream_exec *x, const int32_t *inputs) {
    if (!x->vocab_chunk) {
        x->arch->ops->embed_forward(x->dev_blocks, x->d_pre_w, inputs, x->d_emb_out);
        return 0;
    }
    st_prof_span e = st_prof_begin(ST_PROF_CAT_OTHER, "forward embed (host)", -1);
    x->arch->ops->embed_forward(x->host_blocks, x->host_params, inputs, x->h_enc);
    st_prof_end(&e);
    return h2d(x, x->d_emb_out, x->h_enc, x->resid_numel * 4);
}
