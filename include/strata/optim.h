/* optim.h - the optimizer engine: AdamW over a flat parameter vector.
 *
 * The vector is described by segments (one per tensor): each has its own weight decay
 * (decided by tensor role, by name, in the model layer). State formats: fp32 moments,
 * or 8-bit blockwise moments (see st_optim_state_format).
 *
 * Example:
 *
 *     st_err err = {0};
 *     static float params[1010], grads[1010];       // the flat vector and its gradient
 *     st_optim_segment segs[] = {{.offset = 0, .n = 1000, .weight_decay = 0.1f},    // a matrix
 *                                {.offset = 1000, .n = 10, .weight_decay = 0.0f}};  // a bias
 *     st_optim *o = NULL;
 *     if (st_optim_create(&o, segs, 2, ST_OPTIM_STATE_F32, &err) != ST_OK) {
 *         fprintf(stderr, "strata: %s\n", err.msg);
 *         return 1;
 *     }
 *     double ss = st_optim_grad_sumsq_f32(grads, 1010);  // the squared global norm
 *     st_adamw_params hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
 *                        .step = 1, .grad_scale = st_optim_clip_scale(ss, 1.0f, 1.0f)};  // clip at 1
 *     st_optim_step(o, params, grads, &hp);
 *     printf("%zu parameters, %.0f state bytes each\n", st_optim_numel(o), st_optim_state_bytes_per_param(o));
 *     st_optim_free(o);
 *
 * End of example.
 *
 * The offloaded path (bf16 gradients in, bf16 working copy out, clipping, skip on NaN):
 *
 *     double ss = st_optim_grad_sumsq(grads_bf16, ST_BF16, n);   // per chunk as they arrive, summed in order
 *     hp.grad_scale = st_optim_clip_scale(ss, loss_scale, 1.0f); // unscale and clip, applied inside the pass
 *     st_optim_step_args a = {.params = master, .grads = grads_bf16, .grad_dtype = ST_BF16,
 *                          .work = weights_bf16, .work_dtype = ST_BF16, .grad_sumsq = ss};
 *     if (st_optim_step_ex(o, &a, &hp, &err) == ST_ERR_NONFINITE) { ... step skipped, lower the loss scale }
 *
 * One pass per element reads the master weight, the gradient (converted in registers) and
 * the two moments, and writes the master weight, the moments and the working copy. Every
 * kernel (portable C, AVX2+FMA, AVX-512) performs the same float operations in the same
 * order, so results are bit-identical across them and independent of the thread count.
 *
 * 8-bit states (ST_OPTIM_STATE_8BIT): each segment's moments are cut into blocks of
 * ST_OPTIM_Q8_BLOCK elements with one fp32 absmax per block and one byte per element. The
 * byte indexes the dynamic quantisation map of bitsandbytes (Dettmers et al.): signed for
 * the first moment, unsigned for the second, seven decades 1e-7..1 with linear steps inside
 * each decade, plus 0 and 1. The byte encoding is ours (the value set is bitsandbytes'):
 * codes are numbered by magnitude, level 0..128 (signed: zero, 127 codes, one) or 1..256
 * (unsigned: zero, 254 codes, one); first moment byte = 127 + sign * level (127 = zero,
 * 255 = +1; the map has no -1), second moment byte = level & 255 (1 = zero, 0 = one).
 * st_optim_q8_map gives every byte's code. Each element is rounded to the nearest code, so per
 * block |x - code * absmax| <= st_optim_q8_max_error(signed) * absmax(block) (+ float rounding,
 * ~1e-7 absmax): 0.00703 for the first moment, 0.00352 for the second. The update runs
 * block by block: dequantise, update, new absmax, requantise, with the block's new moments
 * held in a 2 KiB L1 buffer (no full-size temporary); the parameter update uses the
 * unquantised new moments, as bitsandbytes' blockwise 8-bit Adam does.
 */
#ifndef STRATA_OPTIM_H
#define STRATA_OPTIM_H

#include "strata/core.h"
#include "strata/tensor.h"

/* ST_OPTIM_STATE_8BIT_FP: the same blocks and absmax, another byte code: a tiny float
 * format computed from the fp32 bits, no tables (adamw_kernels.h has the definition).
 * First moment: sign bit 7, then a 7-bit code for |m| / absmax: 16 binades with 3 mantissa
 * bits from 1 down to 1.7e-5, linear steps of ~2.1e-6 below; second moment: an 8-bit code,
 * 32 binades with 3 mantissa bits from 1 down to 2.6e-10. Relative rounding error <= 1/16
 * inside the binades (the dynamic map's is smaller near absmax, larger below 0.1 absmax);
 * its measured effect on training against fp32 states is in docs/BENCHMARKS.md (issue 31).
 * A different byte code: states of one format are never read as the other (the state store's
 * manifest and the checkpoints record the format's number and refuse the other map). */
typedef enum st_optim_state_format {
    ST_OPTIM_STATE_F32 = 0,
    ST_OPTIM_STATE_8BIT = 1,   /* the dynamic map (bitsandbytes' value set) */
    ST_OPTIM_STATE_8BIT_FP = 2 /* the float map */
} st_optim_state_format;

/* The format's name as the key optim_state spells it ("f32", "8bit", "8bit-fp"); "?" for
 * a number that is none of them. */
const char *st_optim_state_name(st_optim_state_format fmt);

#define ST_OPTIM_Q8_BLOCK 256 /* elements per absmax block of 8-bit states */
/* Elements per optimizer work item (the engine's chunk): a multiple of ST_OPTIM_Q8_BLOCK and
 * of every vector width x2. Whoever cuts the parameter vector (the state store's
 * subgroups) cuts on this grid, so results stay bit-identical to the in-memory optimizer. */
#define ST_OPTIM_CHUNK_ELEMS 16384

/* A segment's learning-rate class: which of st_adamw_params' rates updates it. */
typedef enum st_optim_lr_class {
    ST_OPTIM_LR_MAIN = 0,  /* st_adamw_params.lr (every segment unless said) */
    ST_OPTIM_LR_SECOND = 1 /* st_adamw_params.lr2 (method poetx: the packed Q's own rate) */
} st_optim_lr_class;

typedef struct st_optim_segment {
    size_t offset;      /* elements from the start of the flat vector */
    size_t n;           /* elements */
    float weight_decay; /* decoupled: p -= lr * wd * p (lr: the segment's class's) */
    int lr_class;       /* st_optim_lr_class; 0 (a zeroed or {offset, n, wd} segment): lr */
} st_optim_segment;

typedef struct st_adamw_params {
    float lr, beta1, beta2, eps;
    long step;        /* 1-based step number, for bias correction */
    float grad_scale; /* every gradient is multiplied by this first (clip * 1/loss_scale) */
    float lr2;        /* the learning rate of ST_OPTIM_LR_SECOND segments (read only where the
                         optimizer has one; the caller applies its schedule, as to lr) */
} st_adamw_params;

typedef struct st_optim st_optim;

/* Which kernels run the update (runtime dispatch; append-only). */
typedef enum st_optim_isa {
    ST_OPTIM_ISA_AUTO = 0,     /* the best the CPU supports */
    ST_OPTIM_ISA_PORTABLE = 1, /* plain C (fmaf): any CPU */
    ST_OPTIM_ISA_AVX2 = 2,     /* AVX2 + FMA + F16C */
    ST_OPTIM_ISA_AVX512 = 3,   /* AVX-512F + AVX-512CD + AVX-512BW + F16C */
    ST_OPTIM_ISA_AVX512_BF16 = 4 /* the same + AVX512-BF16 (bf16 working copy in one instruction) */
} st_optim_isa;

st_status st_optim_create(st_optim **out, const st_optim_segment *segs, int n_segs, st_optim_state_format fmt,
                       st_err *err);
void st_optim_free(st_optim *o);
size_t st_optim_numel(const st_optim *o);
int st_optim_segment_count(const st_optim *o);
st_optim_state_format st_optim_format(const st_optim *o);

/* Choose the kernels (tests and benchmarks compare them); ST_ERR_UNSUPPORTED where the CPU
 * lacks the instructions. The default is ST_OPTIM_ISA_AUTO. The environment variable
 * STRATA_OPTIM_ISA (portable, avx2, avx512, avx512bf16, auto), read once per process, caps
 * what the CPU is taken to offer: STRATA_OPTIM_ISA=avx2 runs an AVX-512 machine as an
 * AVX2-only one (AUTO picks AVX2, AVX-512 is refused); another value makes st_optim_create
 * fail naming it. */
st_status st_optim_set_isa(st_optim *o, st_optim_isa isa, st_err *err);
st_optim_isa st_optim_get_isa(const st_optim *o); /* the kernels in use, never AUTO */
st_optim_isa st_optim_isa_best(void);          /* what AUTO picks on this CPU (under STRATA_OPTIM_ISA) */
const char *st_optim_isa_name(st_optim_isa isa);

/* One AdamW step over every segment: params and grads are fp32 flat vectors. Runs the
 * non-finite check first: a gradient with NaN/Inf skips the step (nothing changes), logs a
 * warning and counts in st_optim_skipped_steps. Use st_optim_step_ex to pass a sum of squares
 * already computed (saves reading the gradients twice) and to get the status back. */
void st_optim_step(st_optim *o, float *params, const float *grads, const st_adamw_params *hp);

/* The extended step: any gradient dtype, a working copy written in the same pass, a range
 * of segments (layer streaming), buffers that hold only that range. */
typedef struct st_optim_step_args {
    float *params;        /* fp32 master weights (read and written) */
    const void *grads;    /* gradients, grad_dtype: ST_F32, ST_BF16 or ST_F16 */
    st_dtype grad_dtype;
    void *work;           /* optional: the working copy to write (NULL: none) */
    st_dtype work_dtype;  /* ST_BF16, ST_F16 or ST_F32 */
    size_t base;          /* flat index of params[0], grads[0] and work[0]: element i of the
                             flat vector is params[i - base] (0 for whole-vector buffers) */
    int seg_begin, seg_end; /* update segments [seg_begin, seg_end); seg_end == 0: to the last */
    double grad_sumsq;    /* sum of squares of the whole step's gradient (all segments, as
                             stored, before grad_scale), from st_optim_grad_sumsq; non-finite:
                             the step is skipped. Negative: computed here over the range. */
} st_optim_step_args;

/* ST_OK, or ST_ERR_NONFINITE when the gradient is not finite (the step is skipped: no
 * parameter, moment or working-copy element is written), or ST_ERR_INVALID for bad args. */
st_status st_optim_step_ex(st_optim *o, const st_optim_step_args *a, const st_adamw_params *hp, st_err *err);
long st_optim_skipped_steps(const st_optim *o);

/* The combined gradient multiplier for adamw_params.grad_scale: unscale by loss_scale and
 * clip the unscaled global norm to max_norm (max_norm <= 0: no clipping). sumsq is of the
 * scaled gradient as stored. */
float st_optim_clip_scale(double sumsq, float loss_scale, float max_norm);

/* The state as opaque byte buffers, for checkpoints: count, then each buffer's pointer and
 * size. fp32: m, v. 8-bit: m codes, v codes (bytes, segments padded to whole blocks),
 * m absmax, v absmax (fp32, one per block). */
int st_optim_state_count(const st_optim *o);
void *st_optim_state_buffer(st_optim *o, int i, size_t *bytes);
/* Zero the moments of every segment of class lr_class (f32: m and v; 8-bit: codes and
 * absmax, as a fresh state), leaving the others' untouched: Adam restarted for those
 * parameters (method poetx's merge). ST_ERR_INVALID without state (unbound, none bound) or
 * for a class that is not an st_optim_lr_class; *n_reset (may be NULL): the elements reset. */
st_status st_optim_reset_class(st_optim *o, int lr_class, size_t *n_reset, st_err *err);
/* Host bytes of moment state per parameter (fp32: 8; 8-bit: about 2.03 with absmax). The
 * fp32 master weights add 4 more. */
double st_optim_state_bytes_per_param(const st_optim *o);

/* State held by the caller (the disk tier streams it through a few buffers): an optimizer
 * with no state of its own; before each step bind st_optim_state_count buffers of
 * st_optim_state_buffer_bytes each, laid out as st_optim_state_buffer describes. A fresh state
 * is all zero bytes, as st_optim_create's is (8-bit: absmax 0 decodes every code to 0). */
st_status st_optim_create_unbound(st_optim **out, const st_optim_segment *segs, int n_segs, st_optim_state_format fmt,
                               st_err *err);
size_t st_optim_state_buffer_bytes(const st_optim *o, int i);
void st_optim_bind_state(st_optim *o, void *const bufs[]);

/* Sum of squares of a gradient, accumulated in double. NaN/Inf propagate, so a
 * non-finite result means the gradient had a non-finite element. Deterministic: fixed
 * chunks and lanes summed in a fixed order, identical on every kernel and thread count.
 * For chunks of one gradient, call per chunk and add the results in order. */
double st_optim_grad_sumsq(const void *g, st_dtype dt, size_t n); /* ST_F32, ST_BF16, ST_F16 */
double st_optim_grad_sumsq_f32(const float *g, size_t n);
double st_optim_grad_sumsq_bf16(const uint16_t *g, size_t n);
/* Elements per partial sum of st_optim_grad_sumsq: the sum of a vector is its chunks' partial
 * sums added in chunk order from 0. A vector cut on this grid (ZeRO's shards, dist.h) has
 * each piece's partials computed where it lives and the total summed in one place. */
#define ST_OPTIM_SUMSQ_CHUNK 65536
/* The partial sums: parts[c] for elements [c, c + 1) x ST_OPTIM_SUMSQ_CHUNK of g (the last one
 * shorter); returns their count. st_optim_grad_sumsq(g, dt, n) == parts[0] + parts[1] + ... */
size_t st_optim_grad_sumsq_parts(const void *g, st_dtype dt, size_t n, double *parts);

/* The plain scalar reference (fp32 state), one segment: the tests' oracle. */
void st_adamw_ref_f32(float *p, const float *g, float *m, float *v, size_t n, float weight_decay,
                   const st_adamw_params *hp);

/* The 8-bit map: code[byte] for the signed (first moment) or unsigned (second moment) map,
 * the largest rounding error as a fraction of absmax, and one block's quantise/dequantise
 * (n <= ST_OPTIM_Q8_BLOCK), as the update pass does it: the tests' window into the format. */
void st_optim_q8_map(int is_signed, float code[256]);
double st_optim_q8_max_error(int is_signed);
float st_optim_q8_quantize_block(const float *x, size_t n, int is_signed, uint8_t *q);
void st_optim_q8_dequantize_block(const uint8_t *q, size_t n, float absmax, int is_signed, float *x);
/* The same for either 8-bit format (ST_OPTIM_STATE_8BIT or ST_OPTIM_STATE_8BIT_FP); the
 * float map's code 0 is 0 and its top code 1 - delta (1.7e-5 signed, 2.6e-10 unsigned); dequantised as
 * code * absmax; quantise rounds a / absmax + delta to the nearest code, so per element
 * |x - code * absmax| <= |x| / 16 + ~2.2e-6 absmax (signed) or ~1.7e-10 absmax (unsigned). */
void st_optim_q8_codes(st_optim_state_format fmt, int is_signed, float code[256]);
float st_optim_q8_quantize(st_optim_state_format fmt, const float *x, size_t n, int is_signed, uint8_t *q);
void st_optim_q8_dequantize(st_optim_state_format fmt, const uint8_t *q, size_t n, float absmax, int is_signed,
                            float *x);

/* The bandwidth ceiling for `strata bench optim`: moves the same arrays as st_optim_step_ex
 * with the same arguments (same sizes, chunks, threads, vector width), reading and writing
 * each as the step does, with no arithmetic. Scrambles the contents (moments swapped). */
void st_optim_bench_ceiling(st_optim *o, const st_optim_step_args *a);
/* Bytes one step reads and writes per parameter for these dtypes (work_dtype < 0: none). */
double st_optim_step_bytes_per_param(const st_optim *o, st_dtype grad_dtype, int work_dtype);

#endif
