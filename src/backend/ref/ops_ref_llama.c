/* ops_ref_llama.c - double-precision reference of the Llama-family ops (embedding without
 * positions, RMSNorm, rotary embedding, SwiGLU, grouped-query attention).
 *
 * As in ops_ref.c: textbook loops that follow the formulas, no threads, no tricks. The
 * finite-difference test checks each backward against its forward; the differential test
 * checks the fast backends against these.
 */
#include <math.h>
#include <stddef.h>

#include "backend/ref/ops_ref.h"

void ref_embedding_forward(double *out, const int32_t *inp, const double *wte, int B, int T, int C) {
    /* out (B,T,C), inp (B,T), wte (V,C) */
    for (int i = 0; i < B * T; i++)
        for (int c = 0; c < C; c++) out[(size_t)i * C + c] = wte[(size_t)inp[i] * C + c];
}

void ref_embedding_backward(double *dwte, const double *dout, const int32_t *inp, int B, int T, int C) {
    /* dwte (V,C) +=, dout (B,T,C) */
    for (int i = 0; i < B * T; i++)
        for (int c = 0; c < C; c++) dwte[(size_t)inp[i] * C + c] += dout[(size_t)i * C + c];
}

void ref_rmsnorm_forward(double *out, double *rstd, const double *inp, const double *w, int N, int H, int hs,
                         int ld, double eps) {
    /* groups of hs at n*ld + h*hs; rstd (N,H) */
    for (int n = 0; n < N; n++)
        for (int h = 0; h < H; h++) {
            size_t o = (size_t)n * ld + (size_t)h * hs;
            double ms = 0;
            for (int i = 0; i < hs; i++) ms += inp[o + i] * inp[o + i];
            ms /= hs;
            double r = 1.0 / sqrt(ms + eps);
            for (int i = 0; i < hs; i++) out[o + i] = inp[o + i] * r * w[i];
            rstd[(size_t)n * H + h] = r;
        }
}

void ref_rmsnorm_backward(double *dinp, double *dw, const double *dout, const double *inp, const double *w,
                          const double *rstd, int N, int H, int hs, int ld) {
    /* y_i = x_i r w_i, r = (mean(x^2) + eps)^-1/2, dr/dx_j = -r^3 x_j / hs, so with
     * g_i = dout_i w_i:  dx_j = r g_j - r^3 x_j / hs * sum_i g_i x_i;  dw_i += dout_i x_i r */
    for (int n = 0; n < N; n++)
        for (int h = 0; h < H; h++) {
            size_t o = (size_t)n * ld + (size_t)h * hs;
            double r = rstd[(size_t)n * H + h], gx = 0;
            for (int i = 0; i < hs; i++) gx += dout[o + i] * w[i] * inp[o + i];
            for (int j = 0; j < hs; j++) {
                dinp[o + j] += r * dout[o + j] * w[j] - r * r * r * inp[o + j] * gx / hs;
                dw[j] += dout[o + j] * inp[o + j] * r;
            }
        }
}

static void rope_rotate(double *x, const double *cos, const double *sin, int B, int T, int H, int hs, int ld,
                        double sign) {
    int half = hs / 2;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                double *p = x + ((size_t)b * T + t) * ld + (size_t)h * hs;
                for (int i = 0; i < half; i++) {
                    double c = cos[(size_t)t * half + i], s = sign * sin[(size_t)t * half + i];
                    double x1 = p[i], x2 = p[i + half];
                    p[i] = x1 * c - x2 * s;
                    p[i + half] = x2 * c + x1 * s;
                }
            }
}

void ref_rope_forward(double *x, const double *cos, const double *sin, int B, int T, int H, int hs, int ld) {
    rope_rotate(x, cos, sin, B, T, H, hs, ld, 1.0);
}

void ref_rope_backward(double *dx, const double *cos, const double *sin, int B, int T, int H, int hs, int ld) {
    /* the rotation is orthogonal: its transpose is the rotation by the negated angle */
    rope_rotate(dx, cos, sin, B, T, H, hs, ld, -1.0);
}

void ref_rope_tables(double *cos_t, double *sin_t, int T, int hs, double theta, int llama3, double factor,
                     double low_freq_factor, double high_freq_factor, double original_max_pos) {
    /* Hugging Face's _compute_default_rope_parameters and _compute_llama3_parameters */
    int half = hs / 2;
    for (int i = 0; i < half; i++) {
        double inv = 1.0 / pow(theta, (2.0 * i) / hs);
        if (llama3) {
            double low_wl = original_max_pos / low_freq_factor, high_wl = original_max_pos / high_freq_factor;
            double wl = 2.0 * M_PI / inv;
            if (wl > low_wl) {
                inv = inv / factor;
            } else if (!(wl < high_wl)) { /* medium: blend the scaled and unscaled frequency */
                double smooth = (original_max_pos / wl - low_freq_factor) / (high_freq_factor - low_freq_factor);
                inv = (1.0 - smooth) * inv / factor + smooth * inv;
            }
        }
        for (int t = 0; t < T; t++) {
            cos_t[(size_t)t * half + i] = cos(t * inv);
            sin_t[(size_t)t * half + i] = sin(t * inv);
        }
    }
}

void ref_swiglu_forward(double *out, const double *inp, int N, int F) {
    /* out (N,F), inp (N,2F) = [gate | up] */
    for (int n = 0; n < N; n++)
        for (int i = 0; i < F; i++) {
            double g = inp[(size_t)n * 2 * F + i], u = inp[(size_t)n * 2 * F + F + i];
            out[(size_t)n * F + i] = g / (1.0 + exp(-g)) * u;
        }
}

void ref_swiglu_backward(double *dinp, const double *inp, const double *dout, int N, int F) {
    /* silu(g) = g s(g), silu'(g) = s(g) (1 + g (1 - s(g))) */
    for (int n = 0; n < N; n++)
        for (int i = 0; i < F; i++) {
            double g = inp[(size_t)n * 2 * F + i], u = inp[(size_t)n * 2 * F + F + i];
            double d = dout[(size_t)n * F + i], s = 1.0 / (1.0 + exp(-g));
            dinp[(size_t)n * 2 * F + i] += d * u * s * (1.0 + g * (1.0 - s));
            dinp[(size_t)n * 2 * F + F + i] += d * g * s;
        }
}

static double dotd(const double *x, const double *y, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += x[i] * y[i];
    return s;
}

void ref_attention_gqa_forward(double *out, double *lse, const double *q, const double *k, const double *v,
                               int ld, int B, int T, int NH, int NKV, int hs) {
    ref_attention_gqa_doc_forward(out, lse, q, k, v, NULL, ld, B, T, NH, NKV, hs);
}

void ref_attention_gqa_doc_forward(double *out, double *lse, const double *q, const double *k, const double *v,
                                   const int32_t *doc_start, int ld, int B, int T, int NH, int NKV, int hs) {
    /* out (B,T,NH*hs), lse (B,NH,T); q, k, v rows ld apart. Scores recomputed per pass. */
    int G = NH / NKV, C = NH * hs;
    double scale = 1.0 / sqrt((double)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            size_t kvo = (size_t)(h / G) * hs;
            for (int t = 0; t < T; t++) {
                const double *qt = q + ((size_t)b * T + t) * ld + (size_t)h * hs;
                int j0 = doc_start ? doc_start[(size_t)b * T + t] : 0;
                double m = -INFINITY, sum = 0;
                for (int j = j0; j <= t; j++) m = fmax(m, scale * dotd(qt, k + ((size_t)b * T + j) * ld + kvo, hs));
                for (int j = j0; j <= t; j++) sum += exp(scale * dotd(qt, k + ((size_t)b * T + j) * ld + kvo, hs) - m);
                double l = m + log(sum);
                lse[((size_t)b * NH + h) * T + t] = l;
                double *o = out + ((size_t)b * T + t) * C + (size_t)h * hs;
                for (int d = 0; d < hs; d++) o[d] = 0;
                for (int j = j0; j <= t; j++) {
                    double p = exp(scale * dotd(qt, k + ((size_t)b * T + j) * ld + kvo, hs) - l);
                    const double *vj = v + ((size_t)b * T + j) * ld + kvo;
                    for (int d = 0; d < hs; d++) o[d] += p * vj[d];
                }
            }
        }
}

void ref_attention_gqa_backward(double *dq, double *dk, double *dv, const double *dout, const double *q,
                                const double *k, const double *v, const double *out, const double *lse,
                                int ld, int B, int T, int NH, int NKV, int hs) {
    ref_attention_gqa_doc_backward(dq, dk, dv, dout, q, k, v, out, lse, NULL, ld, B, T, NH, NKV, hs);
}

void ref_attention_gqa_doc_backward(double *dq, double *dk, double *dv, const double *dout, const double *q,
                                    const double *k, const double *v, const double *out, const double *lse,
                                    const int32_t *doc_start, int ld, int B, int T, int NH, int NKV, int hs) {
    /* As ref_attention_backward, with every query head of a group adding into its shared
     * key/value head: dv_j += P_tj dout_t, dS_tj = P_tj (dout_t.v_j - dout_t.out_t),
     * dq_t += scale dS_tj k_j, dk_j += scale dS_tj q_t. */
    int G = NH / NKV, C = NH * hs;
    double scale = 1.0 / sqrt((double)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            size_t kvo = (size_t)(h / G) * hs;
            for (int t = 0; t < T; t++) {
                size_t qo = ((size_t)b * T + t) * ld + (size_t)h * hs;
                const double *dO = dout + ((size_t)b * T + t) * C + (size_t)h * hs;
                const double *O = out + ((size_t)b * T + t) * C + (size_t)h * hs;
                double l = lse[((size_t)b * NH + h) * T + t], D = dotd(dO, O, hs);
                int j0 = doc_start ? doc_start[(size_t)b * T + t] : 0;
                for (int j = j0; j <= t; j++) {
                    size_t ko = ((size_t)b * T + j) * ld + kvo;
                    double p = exp(scale * dotd(q + qo, k + ko, hs) - l);
                    double ds = p * (dotd(dO, v + ko, hs) - D);
                    for (int d = 0; d < hs; d++) {
                        dq[qo + d] += scale * ds * k[ko + d];
                        dk[ko + d] += scale * ds * q[qo + d];
                        dv[ko + d] += p * dO[d];
                    }
                }
            }
        }
}
