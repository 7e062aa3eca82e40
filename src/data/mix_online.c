/* mix_online.c - online data mixing (st_data_mix_online, strata/data.h): the sources'
 * mixture weights as an EXP3 bandit on their training loss, after Albalak et al. 2023
 * ("Efficient Online Data Mixing For Language Model Pre-Training"): a source's reward is
 * its loss, importance-weighted by the probability it was drawn with, smoothed by a
 * moving average; the weights are the rewards' softmax scaled by the exploration rate,
 * mixed with a uniform floor of that rate. Plain double arithmetic in a fixed order: the
 * same losses give the same weights, bit for bit, on every rank and after a resume.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "data/data_internal.h"

/* eps_t = min(1/K, sqrt(ln K / (K t))): the exploration rate of step t >= 1. */
static double mix_eps(int K, uint64_t t) {
    if (t < 1) t = 1;
    double e = sqrt(log((double)K) / ((double)K * (double)t));
    return e < 1.0 / K ? e : 1.0 / K;
}

/* pi_i = (1 - K eps_t) softmax(eps_{t-1} R)_i + eps_t. */
static void mix_weights(const st_data_mix_online *m, double *w) {
    const int K = (int)m->K;
    /* after t updates: the next is update t + 1, so eps_{t+1} and eps_t */
    double et = mix_eps(K, m->t + 1), ep = mix_eps(K, m->t);
    double mx = -INFINITY, z = 0;
    for (int i = 0; i < K; i++)
        if (ep * m->reward[i] > mx) mx = ep * m->reward[i];
    for (int i = 0; i < K; i++) z += exp(ep * m->reward[i] - mx);
    for (int i = 0; i < K; i++) w[i] = (1.0 - K * et) * exp(ep * m->reward[i] - mx) / z + et;
}

st_status st_data_mix_online_init(st_data_mix_online *m, int K, double alpha, int delay, st_err *err) {
    memset(m, 0, sizeof *m);
    if (K < 2 || K > ST_DATA_MAX_SOURCES)
        return st_errf(err, ST_ERR_INVALID, "mix online: %d sources; online mixing needs 2 to %d sources in key 'data'",
                       K, ST_DATA_MAX_SOURCES);
    if (!(alpha >= 0 && alpha < 1))
        return st_errf(err, ST_ERR_INVALID, "mix online: smoothing %g; give a number in [0, 1) (key 'mix_smoothing')",
                       alpha);
    if (delay < 1 || delay > ST_DATA_MIX_MAX_DELAY)
        return st_errf(err, ST_ERR_INVALID, "mix online: delay %d; give 1 to %d steps", delay, ST_DATA_MIX_MAX_DELAY);
    m->magic = ST_DATA_MIX_MAGIC, m->version = ST_DATA_MIX_VERSION;
    m->K = (uint32_t)K, m->delay = (uint32_t)delay;
    m->alpha = alpha;
    mix_weights(m, m->weights); /* uniform: every reward 0 */
    for (int d = 0; d < delay; d++) memcpy(m->ring[d], m->weights, sizeof m->weights);
    return ST_OK;
}

st_status st_data_mix_online_update(st_data_mix_online *m, const double *loss_sum, const double *count, st_err *err) {
    const int K = (int)m->K;
    for (int i = 0; i < K; i++)
        if (!(count[i] >= 0) || (count[i] > 0 && !isfinite(loss_sum[i])))
            return st_errf(err, ST_ERR_INVALID, "mix online: step %llu, source %d: loss sum %g over %g targets is not a "
                           "number; the run diverged (lower lr) or its data is broken",
                           (unsigned long long)m->t + 1, i, loss_sum[i], count[i]);
    for (int i = 0; i < K; i++)
        if (count[i] > 0) /* the source's mean loss over the probability it was drawn with */
            m->reward[i] = m->alpha * m->reward[i] + (1.0 - m->alpha) * (loss_sum[i] / count[i]) / m->weights[i];
    uint64_t s = m->t++; /* the update after step s (0-based) */
    mix_weights(m, m->weights);
    memcpy(m->ring[s % m->delay], m->weights, sizeof m->weights); /* step s + delay's */
    return ST_OK;
}

const double *st_data_mix_online_weights_for(const st_data_mix_online *m, uint64_t step) {
    if (step < m->t || step >= m->t + m->delay) return NULL;
    return m->ring[step % m->delay];
}

/* The state's bytes before its CRC. */
static uint32_t mix_crc(const st_data_mix_online *m) {
    return st_crc32c(0, m, offsetof(st_data_mix_online, crc32c));
}

void st_data_mix_online_seal(st_data_mix_online *m) { m->crc32c = mix_crc(m); }

st_status st_data_mix_online_check(const st_data_mix_online *m, int K, const char *where, st_err *err) {
    if (m->magic != ST_DATA_MIX_MAGIC || m->version != ST_DATA_MIX_VERSION)
        return st_errf(err, ST_ERR_FORMAT, "%s: not an online-mixing state (magic %08x version %u; want %08x version "
                       "%u)", where, m->magic, m->version, ST_DATA_MIX_MAGIC, ST_DATA_MIX_VERSION);
    if (m->crc32c != mix_crc(m))
        return st_errf(err, ST_ERR_FORMAT, "%s: the online-mixing state's CRC-32C does not match (corrupt); resume "
                       "from another checkpoint", where);
    if ((int)m->K != K)
        return st_errf(err, ST_ERR_INVALID, "%s: the online-mixing state has %u sources, the run %d; resume with the "
                       "same sources in key 'data'", where, m->K, K);
    return ST_OK;
}
