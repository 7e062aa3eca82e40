/* test_core.c - errors, CRC-32C against published check values, bf16/f16 rounding. */
#include <math.h>
#include <string.h>

#include <stdlib.h>

#include "strata/core.h"
#include "strata/model.h"
#include "strata/tensor.h"
#include "testutil.h"

int main(void) {
    /* CRC-32C check value from RFC 3720 / iSCSI: "123456789" -> 0xE3069283 */
    CHECK(st_crc32c(0, "123456789", 9) == 0xE3069283u, "crc32c check value %08x", st_crc32c(0, "123456789", 9));
    /* incremental equals one-shot */
    CHECK(st_crc32c(st_crc32c(0, "1234", 4), "56789", 5) == 0xE3069283u, "crc32c incremental");
    {
        /* the SSE4.2 path and the table agree on every length and alignment */
        unsigned char buf[1100];
        for (int i = 0; i < 1100; i++) buf[i] = (unsigned char)(i * 131 + 7);
        for (int off = 0; off < 9; off++)
            for (int n = 0; n < 1050; n += 37) {
                uint32_t hw = st_crc32c(0x1234u, buf + off, (size_t)n);
                st_crc32c_force_table(1);
                uint32_t tb = st_crc32c(0x1234u, buf + off, (size_t)n);
                st_crc32c_force_table(0);
                CHECK(hw == tb, "crc32c hw %08x != table %08x at offset %d length %d", hw, tb, off, n);
            }
    }

    st_err err = {0};
    CHECK(st_errf(&err, ST_ERR_FORMAT, "file %s offset %d", "x.bin", 12) == ST_ERR_FORMAT, "errf code");
    CHECK(strcmp(err.msg, "file x.bin offset 12") == 0, "errf msg '%s'", err.msg);
    st_err_prefix(&err, "loading");
    CHECK(strcmp(err.msg, "loading: file x.bin offset 12") == 0, "prefix '%s'", err.msg);

    /* bf16: exact values survive, halfway rounds to even, NaN stays NaN */
    CHECK(st_bf16_to_f32(st_f32_to_bf16(1.5f)) == 1.5f, "bf16 exact");
    float halfway = 1.0f + 1.0f / 256.0f; /* exactly between 1 and 1+2^-7: rounds to even (1.0) */
    CHECK(st_bf16_to_f32(st_f32_to_bf16(halfway)) == 1.0f, "bf16 ties to even");
    CHECK(isnan(st_bf16_to_f32(st_f32_to_bf16(NAN))), "bf16 nan");

    /* f16 round trip of every f16 bit pattern that is finite */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = st_f16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        if (st_f32_to_f16(f) != h) bad++;
    }
    CHECK(bad == 0, "f16 round trip mismatches: %d", bad);
    CHECK(st_f32_to_f16(65520.0f) == 0x7c00, "f16 overflow to inf");
    CHECK(st_f16_to_f32(st_f32_to_f16(1e-7f)) == st_f16_to_f32(2), "f16 subnormal rounding");

    st_rng r1, r2;
    st_rng_seed(&r1, 42);
    st_rng_seed(&r2, 42);
    int same = 1;
    for (int i = 0; i < 100; i++) same &= st_rng_u64(&r1) == st_rng_u64(&r2);
    CHECK(same, "rng deterministic");

    /* st_rng_skip(k) lands where k draws do */
    static const uint64_t ks[] = {0, 1, 2, 63, 64, 65, 1000, 123457};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        st_rng a, b;
        st_rng_seed(&a, 7 + i);
        st_rng_seed(&b, 7 + i);
        for (uint64_t j = 0; j < ks[i]; j++) st_rng_u64(&a);
        st_rng_skip(&b, ks[i]);
        CHECK(a.s == b.s && st_rng_u64(&a) == st_rng_u64(&b), "st_rng_skip(%llu) differs from %llu draws",
              (unsigned long long)ks[i], (unsigned long long)ks[i]);
    }
    {
        /* st_params_init_by_role in parallel pieces gives one sequential pass's values, bit for
         * bit: a tensor of more than one piece (2^24 values), small ones, a norm and a bias
         * between them, and a scaled residual */
        st_param_info t[5];
        memset(t, 0, sizeof t);
        size_t numel[5] = {1000, (1u << 24) + 4097, 64, 333, 129};
        st_role role[5] = {ST_ROLE_EMBEDDING, ST_ROLE_MATMUL_WEIGHT, ST_ROLE_NORM_WEIGHT, ST_ROLE_MATMUL_WEIGHT, ST_ROLE_BIAS};
        const char *name[5] = {"a.weight", "b.weight", "n.weight", "c_proj.weight", "c.bias"};
        size_t off = 0;
        for (int i = 0; i < 5; i++) {
            snprintf(t[i].name, sizeof t[i].name, "%s", name[i]);
            t[i].offset = off, t[i].numel = numel[i], t[i].role = role[i], t[i].ndim = 1;
            t[i].shape[0] = (int)numel[i];
            off += numel[i];
        }
        float *got = malloc(off * sizeof *got), *want = malloc(off * sizeof *want);
        CHECK(got && want, "out of memory");
        if (got && want) {
            st_params_init_by_role(t, 5, got, 99, "c_proj.weight", 0.5f);
            st_rng r;
            st_rng_seed(&r, 99);
            for (int i = 0; i < 5; i++) {
                float *p = want + t[i].offset;
                for (size_t j = 0; j < t[i].numel; j++)
                    p[j] = role[i] == ST_ROLE_NORM_WEIGHT ? 1.0f
                           : role[i] == ST_ROLE_BIAS      ? 0.0f
                                                          : (i == 3 ? 0.01f : 0.02f) * st_rng_normal(&r);
            }
            size_t bad = 0, first = off;
            for (size_t j = 0; j < off; j++)
                if (memcmp(&got[j], &want[j], sizeof(float))) bad++, first = first < j ? first : j;
            CHECK(bad == 0, "params init: %zu of %zu values differ from one sequential pass (first at %zu)", bad, off, first);
        }
        free(got);
        free(want);
    }
    return test_finish("core");
}
