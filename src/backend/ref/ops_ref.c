/* ops_ref.c - the double-precision reference ops: textbook loops, no tricks, no threads.
 *
 * Speed does not matter here; being obviously right does. Every loop follows the math
 * of the op directly so a reader can check it against the formula in a minute.
 */
#include "backend/ref/ops_ref.h"

#include <math.h>
#include <stddef.h>

void ref_encoder_forward(double *out, const int32_t *inp, const double *wte, const double *wpe, int B,
                         int T, int C) {
    /* out (B,T,C), inp (B,T), wte (V,C), wpe (>=T,C) */
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            double *o = out + ((size_t)b * T + t) * C;
            const double *te = wte + (size_t)inp[b * T + t] * C, *pe = wpe + (size_t)t * C;
            for (int c = 0; c < C; c++) o[c] = te[c] + pe[c];
        }
}

void ref_encoder_backward(double *dwte, double *dwpe, const double *dout, const int32_t *inp, int B,
                          int T, int C) {
    /* dwte (V,C) +=, dwpe (>=T,C) +=, dout (B,T,C), inp (B,T) */
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const double *d = dout + ((size_t)b * T + t) * C;
            double *dte = dwte + (size_t)inp[b * T + t] * C, *dpe = dwpe + (size_t)t * C;
            for (int c = 0; c < C; c++) {
                dte[c] += d[c];
                dpe[c] += d[c];
            }
        }
}

void ref_layernorm_forward(double *out, double *mean, double *rstd, const double *inp, const double *w,
                           const double *b, int N, int C) {
    /* out (N,C), mean (N), rstd (N), inp (N,C), w (C), b (C); biased variance as in GPT-2 */
    for (int n = 0; n < N; n++) {
        const double *x = inp + (size_t)n * C;
        double m = 0, v = 0;
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
        v /= C;
        double s = 1.0 / sqrt(v + REF_LAYERNORM_EPS);
        for (int c = 0; c < C; c++) out[(size_t)n * C + c] = (x[c] - m) * s * w[c] + b[c];
        mean[n] = m;
        rstd[n] = s;
    }
}

void ref_layernorm_backward(double *dinp, double *dw, double *db, const double *dout, const double *inp,
                            const double *w, const double *mean, const double *rstd, int N, int C) {
    /* dinp (N,C) +=, dw (C) +=, db (C) +=, dout (N,C), inp (N,C), w (C), mean (N), rstd (N).
     * With xhat = (x - mean) * rstd and g = w * dout, the Jacobian of xhat gives
     * dx = rstd * (g - mean(g) - xhat * mean(g * xhat)). */
    for (int n = 0; n < N; n++) {
        const double *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
        double g_mean = 0, gx_mean = 0;
        for (int c = 0; c < C; c++) {
            double xhat = (x[c] - mean[n]) * rstd[n];
            g_mean += w[c] * d[c];
            gx_mean += w[c] * d[c] * xhat;
        }
        g_mean /= C;
        gx_mean /= C;
        for (int c = 0; c < C; c++) {
            double xhat = (x[c] - mean[n]) * rstd[n];
            dinp[(size_t)n * C + c] += rstd[n] * (w[c] * d[c] - g_mean - xhat * gx_mean);
            dw[c] += xhat * d[c];
            db[c] += d[c];
        }
    }
}

/* Element w[c][o] of the logical (C,OC) weight, whatever the storage layout. */
static size_t w_index(int c, int o, int C, int OC, st_wlayout layout) {
    return layout == ST_W_IN_OUT ? (size_t)c * OC + o : (size_t)o * C + c;
}

void ref_matmul_forward(double *out, const double *inp, const double *w, const double *bias, int N, int C,
                        int OC, st_wlayout layout) {
    /* out (N,OC), inp (N,C), w (C,OC) or (OC,C), bias (OC) or NULL */
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = bias ? bias[o] : 0.0;
            for (int c = 0; c < C; c++) s += inp[(size_t)n * C + c] * w[w_index(c, o, C, OC, layout)];
            out[(size_t)n * OC + o] = s;
        }
}

void ref_matmul_backward(double *dinp, double *dw, double *dbias, const double *dout, const double *inp,
                         const double *w, int N, int C, int OC, st_wlayout layout) {
    /* dinp (N,C) +=, dw (same layout as w) +=, dbias (OC) +=, each NULL-able; dout (N,OC) */
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double d = dout[(size_t)n * OC + o];
            if (dbias) dbias[o] += d;
            for (int c = 0; c < C; c++) {
                size_t wi = w_index(c, o, C, OC, layout);
                if (dinp) dinp[(size_t)n * C + c] += d * w[wi];
                if (dw) dw[wi] += d * inp[(size_t)n * C + c];
            }
        }
}

/* Offset of head h of token (b,t) in qkv: part 0 = q, 1 = k, 2 = v. */
static size_t qkv_index(int b, int t, int part, int h, int T, int C, int hs) {
    return ((size_t)b * T + t) * 3 * C + (size_t)part * C + (size_t)h * hs;
}

static double dot(const double *x, const double *y, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += x[i] * y[i];
    return s;
}

void ref_attention_forward(double *out, double *lse, const double *qkv, int B, int T, int C, int NH) {
    ref_attention_doc_forward(out, lse, qkv, NULL, B, T, C, NH);
}

void ref_attention_doc_forward(double *out, double *lse, const double *qkv, const int32_t *doc_start, int B, int T,
                               int C, int NH) {
    /* out (B,T,C), lse (B,NH,T), qkv (B,T,3C), doc_start (B,T) or NULL (0). Scores are
     * recomputed in each pass (max, sum, output) rather than stored, so the reference
     * needs no scratch. Query t sees keys j0..t, j0 its document's start. */
    int hs = C / NH;
    double scale = 1.0 / sqrt((double)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double *q = qkv + qkv_index(b, t, 0, h, T, C, hs);
                int j0 = doc_start ? doc_start[(size_t)b * T + t] : 0;
                double m = -INFINITY, sum = 0;
                for (int j = j0; j <= t; j++) {
                    double s = scale * dot(q, qkv + qkv_index(b, j, 1, h, T, C, hs), hs);
                    if (s > m) m = s;
                }
                for (int j = j0; j <= t; j++)
                    sum += exp(scale * dot(q, qkv + qkv_index(b, j, 1, h, T, C, hs), hs) - m);
                double l = m + log(sum);
                lse[((size_t)b * NH + h) * T + t] = l;
                double *o = out + ((size_t)b * T + t) * C + (size_t)h * hs;
                for (int d = 0; d < hs; d++) o[d] = 0;
                for (int j = j0; j <= t; j++) {
                    double p = exp(scale * dot(q, qkv + qkv_index(b, j, 1, h, T, C, hs), hs) - l);
                    const double *v = qkv + qkv_index(b, j, 2, h, T, C, hs);
                    for (int d = 0; d < hs; d++) o[d] += p * v[d];
                }
            }
}

void ref_attention_backward(double *dqkv, const double *dout, const double *qkv, const double *out,
                            const double *lse, int B, int T, int C, int NH) {
    ref_attention_doc_backward(dqkv, dout, qkv, out, lse, NULL, B, T, C, NH);
}

void ref_attention_doc_backward(double *dqkv, const double *dout, const double *qkv, const double *out,
                                const double *lse, const int32_t *doc_start, int B, int T, int C, int NH) {
    /* dqkv (B,T,3C) +=, dout (B,T,C), qkv (B,T,3C), out (B,T,C), lse (B,NH,T).
     * With P_tj = exp(scale q_t.k_j - lse_t) recomputed from q, k and lse, and
     * dP_tj = dout_t . v_j:
     *   dv_j += sum_t P_tj dout_t
     *   dS_tj = P_tj (dP_tj - D_t),  D_t = sum_j P_tj dP_tj = dout_t . out_t
     *   dq_t += scale sum_j dS_tj k_j,  dk_j += scale sum_t dS_tj q_t
     * Each (t, j) pair is handled on its own, so no T x T matrix is needed. */
    int hs = C / NH;
    double scale = 1.0 / sqrt((double)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double *q = qkv + qkv_index(b, t, 0, h, T, C, hs);
                const double *dO = dout + ((size_t)b * T + t) * C + (size_t)h * hs;
                const double *O = out + ((size_t)b * T + t) * C + (size_t)h * hs;
                double *dq = dqkv + qkv_index(b, t, 0, h, T, C, hs);
                double l = lse[((size_t)b * NH + h) * T + t];
                double D = dot(dO, O, hs);
                int j0 = doc_start ? doc_start[(size_t)b * T + t] : 0;
                for (int j = j0; j <= t; j++) {
                    const double *k = qkv + qkv_index(b, j, 1, h, T, C, hs);
                    const double *v = qkv + qkv_index(b, j, 2, h, T, C, hs);
                    double *dk = dqkv + qkv_index(b, j, 1, h, T, C, hs);
                    double *dv = dqkv + qkv_index(b, j, 2, h, T, C, hs);
                    double p = exp(scale * dot(q, k, hs) - l);
                    double ds = p * (dot(dO, v, hs) - D);
                    for (int d = 0; d < hs; d++) {
                        dq[d] += scale * ds * k[d];
                        dk[d] += scale * ds * q[d];
                        dv[d] += p * dO[d];
                    }
                }
            }
}

#define GELU_K 0.7978845608028654 /* sqrt(2/pi) */
#define GELU_A 0.044715

void ref_gelu_forward(double *out, const double *inp, int n) {
    /* out (n), inp (n) */
    for (int i = 0; i < n; i++) {
        double x = inp[i];
        out[i] = 0.5 * x * (1.0 + tanh(GELU_K * (x + GELU_A * x * x * x)));
    }
}

void ref_gelu_backward(double *dinp, const double *inp, const double *dout, int n) {
    /* dinp (n) +=, inp (n), dout (n); d/dx of 0.5 x (1 + tanh(u(x))) */
    for (int i = 0; i < n; i++) {
        double x = inp[i];
        double th = tanh(GELU_K * (x + GELU_A * x * x * x));
        double du = GELU_K * (1.0 + 3.0 * GELU_A * x * x);
        dinp[i] += (0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du) * dout[i];
    }
}

void ref_residual_forward(double *out, const double *a, const double *b, int n) {
    /* out, a, b (n) */
    for (int i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void ref_residual_backward(double *da, double *db, const double *dout, int n) {
    /* da, db (n) +=, dout (n) */
    for (int i = 0; i < n; i++) {
        da[i] += dout[i];
        db[i] += dout[i];
    }
}

void ref_crossentropy_forward_backward(double *logits, double *losses, const int32_t *targets, int N, int V,
                                       double dloss) {
    /* logits (N,V) (overwritten by dlogits when dloss != 0), losses (N), targets (N) */
    for (int n = 0; n < N; n++) {
        double *l = logits + (size_t)n * V;
        int32_t tg = targets[n];
        if (tg < 0) {
            losses[n] = 0;
            if (dloss != 0)
                for (int v = 0; v < V; v++) l[v] = 0;
            continue;
        }
        double m = -INFINITY, sum = 0;
        for (int v = 0; v < V; v++)
            if (l[v] > m) m = l[v];
        for (int v = 0; v < V; v++) sum += exp(l[v] - m);
        double lse = m + log(sum);
        losses[n] = lse - l[tg];
        if (dloss != 0)
            for (int v = 0; v < V; v++) l[v] = (exp(l[v] - lse) - (v == tg ? 1.0 : 0.0)) * dloss;
    }
}
