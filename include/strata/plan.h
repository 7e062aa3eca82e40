/* plan.h - the planner: which stream plan (stream.h) to run, chosen from a cost model of
 * the machine (a st_plan_profile) and the model (block.h), as a mixed-integer program solved
 * with GLPK, before anything is allocated.
 *
 * The program chooses, per block, keep / offload / recompute of its activations, the
 * prefetch depth and the vocabulary chunking (resident head or chunks of some rows), and
 * minimises the predicted step time
 *     compute + recompute + exposed transfer + exposed optimizer
 * subject to the device budget; activation choices the user fixes (plan_options.fixed_act,
 * the key 'act') are constraints of the program, which still solves the rest. The device
 * bytes of every choice are those st_stream_device_bytes gives (the executor's own allocation
 * table, arena rounding included): the planner reads them from that function, never from a copy of its
 * formula, and checks the chosen plan against it before returning.
 *
 * Time model (LazyTrain-style windows). Each block's forward and its backward (with its
 * recomputed forward, if any) is a window of compute; the copies that run while it
 * computes must fit behind it, or the excess is exposed:
 *   forward window l   the weight fetch of block j (issued when block j-depth-1 is done,
 *                      needed by block j) spread evenly over windows j-depth .. j-1;
 *                      the activation drain of an offloaded block l-1 (not one of the
 *                      last two offloaded blocks, which stay on the device)
 *   backward window l  the weight fetch of block j (the last depth+1 blocks stay from the
 *                      forward) spread over windows j+depth .. j+1; the gradient drain of
 *                      block l+1; the activation fetch of an offloaded block l-1
 * Block and classifier compute: the profile's measured times at the model's shape, or the
 * arch's training FLOPs (1/3 forward, 2/3 backward) at the reference block's measured rates
 * (st_plan_profile below). Host work (every copy and the optimizer, hidden or not) costs the
 * compute host_work_slowdown of its seconds: the CPU backend's "device" is the host's cores.
 * The optimizer runs on the host behind the backward (overlap on);
 * what is longer than the backward below the last block is exposed, and the embedding's,
 * norm's and head's update and copies are not overlapped. The highest recompute block is
 * not run again (its forward is still in the shared set), as in the executor.
 *
 * Example:
 *     st_err err = {0};
 *     st_gpt2_config cfg;
 *     st_arch *a = NULL;
 *     if (st_gpt2_config_preset("gpt2-tiny", &cfg, &err) || st_arch_gpt2(&a, &cfg, &err)) return 1;
 *     st_plan_profile hw = {.version = ST_PLAN_PROFILE_VERSION, .sgemm_flops = 50e9, .h2d_bytes_per_s = 10e9,
 *                        .d2h_bytes_per_s = 10e9, .mem_bytes_per_s = 10e9, .optim_ns_per_param = 1.0,
 *                        .block_fwd_flops = 20e9, .block_bwd_flops = 20e9, .head_flops = 30e9};
 *     st_stream_plan *p = malloc(sizeof *p);
 *     st_plan_prediction pred;
 *     st_status s = p ? st_plan_stream(a, 2, 64, (size_t)64 << 20, &hw, p, &pred, &err) : ST_ERR_NOMEM;
 *     if (s == ST_OK) printf("%.3f s predicted, %zu device bytes\n", pred.step_s, pred.device_bytes);
 *     free(p);
 *     st_arch_free(a);
 * End of example.
 */
#ifndef STRATA_PLAN_H
#define STRATA_PLAN_H

#include <stddef.h>
#include <stdio.h>

#include "strata/backend.h"
#include "strata/block.h"
#include "strata/core.h"
#include "strata/stream.h"

#define ST_PLAN_PROFILE_VERSION 2 /* 2: the block's and the classifier's own measured times */
#define ST_PLAN_PROFILE_MAX_SHAPES 8
#define ST_PLAN_MAX_DEPTH 6      /* prefetch depths the program considers: 1 .. this */
#define ST_PLAN_MAX_VCHUNKS 8    /* vocabulary choices: resident (0) and up to 7 chunk sizes */
#define ST_PLAN_RULE_VOCAB_CHUNK 2048 /* the fixed rule's chunk (strata train without the planner): one
                                      of the program's choices, so the simple plans it starts from
                                      include the rule's and no plan it returns is predicted slower */
#define ST_PLAN_TIME_LIMIT_MS 600 /* GLPK's default limit, building the program included */
#define ST_PLAN_MIP_GAP 1e-4      /* default: stop within 0.01% of the best bound */
/* plan_options.prefer_resident_head: where the classifier (the vocabulary's head) lives.
 * The resident classifier equals the in-memory step bit for bit; the chunked one equals it
 * only to float rounding. */
#define ST_PLAN_HEAD_FASTEST 0          /* the fastest predicted plan, resident or chunked */
#define ST_PLAN_HEAD_RESIDENT_IF_FITS 1 /* the fastest plan with the head resident whenever one fits,
                                        else the fastest chunked one: bit-exact runs wherever the
                                        head fits, but the predicted step rises where the head
                                        first fits (the resident head takes device bytes the blocks
                                        had): 20.07% on tests/test_plan_sweep.c's CPU-like profile
                                        (10.383 s chunked, then 12.467 s resident) */
#define ST_PLAN_HEAD_RESIDENT_ON_TIE 2  /* the fastest plan; the head resident where that is predicted
                                        no slower than the fastest chunked plan (within
                                        ST_PLAN_RESIDENT_TIE): the predicted step never rises as the
                                        budget grows */
/* ST_PLAN_HEAD_RESIDENT_ON_TIE takes the resident head over a chunked plan predicted at most this
 * fraction faster: a tie, to the cost model's float rounding, not a price paid for bit-exact
 * results. Any larger tolerance t lets the predicted step rise by up to t as the budget grows
 * (the resident plan taken at a budget may be slower than a chunked plan at a smaller one). */
#define ST_PLAN_RESIDENT_TIE 1e-9

/* One block's and the classifier's measured compute at one model shape (the arch's kind,
 * width, block size; batch and sequence), as st_plan_profile_measure_shape times them: the
 * real ops (matmuls, attention, norms, activations, softmax), not FLOPs at a peak rate. */
typedef struct st_plan_shape_time {
    char arch[16];             /* st_arch_ops.name: "gpt2", "llama" */
    int n_embd, B, T;
    size_t block_numel;
    double block_fwd_s;        /* one block's forward */
    double block_bwd_s;        /* one block's backward */
    double head_s_per_row;     /* the classifier's forward and backward (logits, softmax, both
                                  gradients): seconds per vocabulary row ... */
    double head_s_per_chunk;   /* ... plus seconds per chunk (a line through chunks of
                                  ST_PLAN_HEAD_ROWS and ST_PLAN_HEAD_ROWS / 4 rows): a chunk of R rows
                                  takes head_s_per_chunk + R head_s_per_row */
} st_plan_shape_time;

#define ST_PLAN_HEAD_ROWS 2048    /* the classifier chunk the profile times */

/* What the cost model needs of the machine, as measured by st_plan_profile_measure and kept
 * in a versioned JSON file (st_plan_profile_save / st_plan_profile_load).
 * Block compute: the shape's own measured times when the profile holds the model's shape
 * (st_plan_profile_measure_shape), else the arch's training FLOPs at the effective rates of a
 * reference block (a GPT-2 block, C 512, batch 1 x seq 256) measured by st_plan_profile_measure. */
typedef struct st_plan_profile {
    int version;               /* ST_PLAN_PROFILE_VERSION */
    double sgemm_flops;        /* FLOP/s of the device backend's matmul at a block's shape */
    double h2d_bytes_per_s;    /* host -> device copies (the arena copy on the CPU backend) */
    double d2h_bytes_per_s;    /* device -> host */
    double mem_bytes_per_s;    /* host memcpy (bytes copied per second) */
    double optim_ns_per_param; /* fp32 AdamW update on the host, per parameter, every core */
    double block_fwd_flops;    /* the reference block's forward FLOPs / its measured time */
    double block_bwd_flops;    /* its backward's */
    double head_flops;         /* the reference classifier's FLOPs / its measured time */
    double host_work_slowdown; /* seconds the device's compute loses per second of host work
                                  (copies, the optimizer) running beside it: about 0 where the
                                  device has cores of its own, up to 1 on the CPU backend, whose
                                  "device" is the host's cores (measured: a matmul with and
                                  without a memcpy thread beside it) */
    int n_shapes;              /* measured shapes, at most ST_PLAN_PROFILE_MAX_SHAPES */
    st_plan_shape_time shapes[ST_PLAN_PROFILE_MAX_SHAPES];
} st_plan_profile;

typedef struct st_plan_options {
    int time_limit_ms; /* the whole solve's limit; at it the best plan found so far is returned
                          (<= 0: ST_PLAN_TIME_LIMIT_MS) */
    double mip_gap;    /* stop when within this fraction of the best bound (0: prove the
                          optimum; < 0: ST_PLAN_MIP_GAP) */
    int max_depth;     /* prefetch depths 1 .. max_depth (<= 0: ST_PLAN_MAX_DEPTH) */
    int allow_vocab_chunk; /* 0: the head stays resident (vocab_chunk 0) */
    int prefer_resident_head; /* PLAN_HEAD_*: strata train, strata plan and strata bench plan use
                          ST_PLAN_HEAD_RESIDENT_IF_FITS (streamed runs bit-exact with the in-memory
                          step wherever the head fits, which their tests check) */
    int no_incumbent;  /* 1: do not seed the program with the best simple plan (tests: the
                          program alone must find the optimum) */
    st_dtype act_dtype;  /* the plans' activation sets (st_stream_plan.act_dtype): ST_F32 (0) or ST_BF16,
                          which sizes every kept, offloaded and recomputed set at 2 bytes an element
                          (plus one fp32 working set), halves an offloaded set's copies and adds its
                          conversions (to bf16 after each forward, back before each backward) at the
                          profile's memory bandwidth; every plan made carries it */
    const unsigned char *fixed_act; /* NULL: every block's activation choice is the program's; else
                          n_blocks entries (st_plan_act_parse): a st_stream_act fixes that block's choice
                          (a constraint of the program: the depth, the vocabulary chunk and the
                          other blocks are still solved), ST_PLAN_ACT_FREE leaves it to the program */
    int frozen_base;   /* 1: the executor runs a frozen base (LoRA's, st_stream_config.hook frozen):
                          its plans' device bytes without the gradient slots and the embedding's and
                          head's gradients it does not allocate; 2: a base whose ends a hook trains
                          (POET-X's, hook frozen 0): without the gradient slots only */
    size_t held_block_bytes; /* frozen_base with frozen_dtype bf16 or int8: one block's matmul weights
                          as held (st_frozen_held_block_bytes; the hook's held_block_bytes): the
                          weight slots are held slabs, these bytes beside the 1-D tensors (0: fp32) */
} st_plan_options;

#define ST_PLAN_ACT_FREE 0xff

/* Explicit activation choices (strata train's and strata plan's key 'act') for n_blocks
 * blocks into fixed[0 .. n_blocks-1]: "auto" (or "") fixes none; "keep", "offload" or
 * "recompute" fixes every block; else comma-separated BLOCKS:CHOICE items, BLOCKS one block
 * "7" or a range "0-3", CHOICE keep, offload, recompute or auto (free again), later items
 * overriding earlier ones ("0-11:recompute,11:keep"). *n_fixed: how many blocks are fixed.
 * Fails naming the item and what is wrong with it. */
st_status st_plan_act_parse(const char *spec, int n_blocks, unsigned char *fixed, int *n_fixed, st_err *err);
/* The fixed choices as text for messages ("blocks 0-3 recompute, block 7 keep"), into buf. */
void st_plan_act_describe(const unsigned char *fixed, int n_blocks, char *buf, size_t cap);

typedef struct st_plan_prediction {
    double step_s;              /* the objective: the sum of the five parts below */
    double compute_s;           /* blocks' forward and backward, the head */
    double recompute_s;         /* forwards run again before their backward */
    double transfer_exposed_s;  /* copies not hidden behind compute */
    double optim_exposed_s;     /* the optimizer not hidden behind the backward */
    double host_work_s;         /* the compute lost to the step's host work (copies and optimizer,
                                   hidden or not) running on the device's cores: host_work_slowdown x
                                   its seconds */
    double block_fwd_s, block_bwd_s; /* one block's compute */
    size_t device_bytes;        /* st_stream_device_bytes of the plan */
    size_t device_budget;
    int n_keep, n_offload, n_recompute;
    double solve_s;             /* st_plan_stream: GLPK's time, building the program included */
    double program_s;           /* st_plan_stream: the program's objective for its plan (== step_s
                                   unless the simple incumbent was better; a check on the model) */
    int optimal;                /* 1: proven optimal; 0: the best incumbent at the time limit */
} st_plan_prediction;

/* Measure the profile on the device backend dev (an arena-budgeted backend needs about
 * 40 MiB free): a few short timed runs, well under a second. */
st_status st_plan_profile_measure(st_backend *dev, st_plan_profile *hw, st_err *err);
/* Time one block of a (forward, backward) and the classifier at batch B x seq T on dev
 * and keep them in hw (replacing the same shape's entry; the oldest goes when full): the
 * cost model then uses these times for that shape. Needs one block's weights, gradients
 * and activations and a ST_PLAN_HEAD_ROWS chunk of the classifier on dev; a few runs of each. */
st_status st_plan_profile_measure_shape(st_backend *dev, const st_arch *a, int B, int T, st_plan_profile *hw, st_err *err);
/* The profile every plan of this process is made from: measured on be (the CPU backend, or a
 * GPU's; plan_profile.c synchronizes before reading the clock) once per process and kind of
 * device, and a's block and classifier timed at batch B x seq T once per shape (a NULL: none; a
 * shape that cannot be timed is logged, and predicted from the reference rates). strata train,
 * strata plan and the benchmarks that plan all take it, so a second request in the same
 * process plans from the same figures at no cost. Thread-safe. */
st_status st_plan_profile_cached(st_backend *be, const st_arch *a, int B, int T, st_plan_profile *hw, st_err *err);
/* The entry of hw for a at B x T, or NULL. */
const st_plan_shape_time *st_plan_profile_shape(const st_plan_profile *hw, const st_arch *a, int B, int T);
st_status st_plan_profile_save(const char *path, const st_plan_profile *hw, st_err *err);
/* Fails naming the file and the key that is missing, not finite or not positive, or a
 * version this strata does not read. */
st_status st_plan_profile_load(const char *path, st_plan_profile *hw, st_err *err);

/* The vocabulary chunk sizes the program considers (out[0] == 0: resident head; then the
 * vocabulary halved up to six times, in whole 64-row lines, and ST_PLAN_RULE_VOCAB_CHUNK, all
 * below vocab_size, descending), at most ST_PLAN_MAX_VCHUNKS; returns how many. */
int st_plan_vocab_chunks(const st_arch *a, const st_plan_options *opt, int *out);

/* The cost model alone: the predicted step time of plan p (any plan) and its device bytes.
 * st_plan_stream's program is built from the same terms, so for the plan it returns the two
 * agree. */
st_status st_plan_predict(const st_arch *a, int B, int T, const st_plan_profile *hw, const st_stream_plan *p,
                       st_plan_prediction *pred, st_err *err);

/* The fastest predicted plan whose st_stream_device_bytes <= device_budget. out: the plan
 * (prefetch depth, vocab_chunk and act[] chosen; overlap on, automatic clipping, f32
 * drain). A budget no plan fits fails with ST_ERR_NOMEM naming the bytes missing; a build
 * without GLPK fails with ST_ERR_UNSUPPORTED. opt NULL: defaults. */
st_status st_plan_stream_ex(const st_arch *a, int B, int T, size_t device_budget, const st_plan_profile *hw,
                         const st_plan_options *opt, st_stream_plan *out, st_plan_prediction *pred, st_err *err);

/* The fixed rule, where no program is solved (a strata built without GLPK, or no plan found):
 * the first of ST_PLAN_RULE_CANDIDATES plans, the vocabulary resident then in
 * ST_PLAN_RULE_VOCAB_CHUNK-row chunks, each with every block keep, then offload, then recompute
 * (st_plan_rule_candidate i, the rest st_stream_plan_default's), whose st_stream_device_bytes(sc)
 * fits budget, fixed's choices kept (NULL: none). 1: p is it; 0: none fits (p the last tried,
 * the smallest). */
#define ST_PLAN_RULE_CANDIDATES 6
void st_plan_rule_candidate(const st_stream_config *sc, int i, st_stream_plan *p);
int st_plan_rule(const st_stream_config *sc, const unsigned char *fixed, size_t budget, st_stream_plan *p);
st_status st_plan_stream(const st_arch *a, int B, int T, size_t device_budget, const st_plan_profile *hw,
                      st_stream_plan *out, st_plan_prediction *pred, st_err *err);

/* ------------------------------------------------------------------ the plan request
 * The plan a run takes, one function for every caller: strata train, strata plan, bench plan
 * and bench stream each fill a request and call st_plan_for_run; what differs between them
 * is a field (strata plan loads a profile or measures one and never falls back to the rule;
 * bench stream fixes the activations it measures and asks for the rule alone). The machine's
 * profile: the one given, else measured on measure_on once per process
 * (st_plan_profile_cached). The plan: the program's (st_plan_stream_ex) within budget, else,
 * where the request allows it, the fixed rule's first candidate that fits. */
typedef enum st_plan_rule_order {
    ST_PLAN_RULE_HEAD_FIRST = 0, /* the vocabulary resident, then chunked; within each, every block
                                    keep, offload, recompute (st_plan_rule) */
    ST_PLAN_RULE_ACTS_FIRST = 1  /* each activation choice in turn, the vocabulary resident then
                                    chunked within it (bench stream: offload before recompute) */
} st_plan_rule_order;

typedef struct st_plan_request {
    const st_arch *arch;
    int B, T;
    size_t budget;                 /* the device bytes the plan may take */
    const st_stream_config *sc;    /* the executor's configuration its bytes are counted for (the rule) */
    const st_plan_profile *profile; /* the machine's figures, given (a file); NULL: measured on measure_on */
    st_backend *measure_on;        /* NULL with no profile: no program, the rule alone */
    int with_shape;                /* the model's own block and classifier timed at B x T */
    int solve;                     /* 1: the program (st_plan_stream_ex with options) */
    st_plan_options options;       /* its fixed_act is the rule's too */
    int rule;                      /* 1: the fixed rule where no program is solved or it finds no plan */
    st_plan_rule_order rule_order;
    const st_stream_plan *base;    /* the rule's candidates start from it (its depth, overlap, clip,
                                      drain); NULL: st_stream_plan_default */
    int vocab_chunk;               /* >= 0: every candidate's; < 0: resident, then ST_PLAN_RULE_VOCAB_CHUNK */
    const st_stream_act *rule_acts; /* the activation choices the rule tries, in order (NULL: keep,
                                      offload, recompute) */
    int n_rule_acts;
} st_plan_request;

typedef struct st_plan_result {
    st_stream_plan plan;
    st_plan_prediction pred;       /* the program's (has_pred); the rule's plan is not predicted */
    int has_pred, by_rule;
    st_plan_profile hw;            /* the profile the plan was made from */
    int have_hw;
    st_err why_rule;               /* by_rule: why the program did not choose */
} st_plan_result;

/* Fails with the program's error where the request allows no rule (ST_ERR_NOMEM: no plan
 * fits; with fixed_act, prefixed "key 'act'", as the choices given are refused, not bypassed),
 * with ST_ERR_NOMEM where no rule candidate fits either (out->plan the last tried, the
 * smallest), or with the profile's error where it cannot be measured or the rule is not allowed. */
st_status st_plan_for_run(const st_plan_request *rq, st_plan_result *out, st_err *err);

/* ------------------------------------------------------------------ the disk state
 * The training state in a disk store (strata/store.h; strata train's state_paths): the
 * executor keeps no moments in host memory (st_stream_config.external_optimizer) and each
 * step the store reads every subgroup's master weights and moments, updates them and writes
 * them to the other region. Its time in the model:
 *   io_s    the busiest path's bytes read and written per step over that path's probed mixed
 *           bandwidth (st_io_probe: requests alternating read and write, as the store
 *           streams): every subgroup's region written, and read but for the cache's hits,
 *           the subgroups still resident from the step before (st_store_plan_step: the
 *           store's own pipeline run on its layout, in the order the step takes: alternating
 *           after the backward, the gradients' order beside it);
 *   cpu_s   the update (optim_ns_per_param of the state format, per parameter), the CRC-32C
 *           of every byte read and written (crc_bytes_per_s) and, at the profile's host
 *           memory rate, the working copy of the weights (4 bytes a parameter);
 *   store_s max(io_s, cpu_s): the store reads ahead and writes behind its updates;
 * after the backward (store_beside 0, strata train's choice where host_work_slowdown >= 0.5)
 * all of store_s is exposed; beside it (store_beside 1) the store's cpu_s costs the compute
 * cpu_slowdown of its seconds, and the backward (the blocks' backward and their recomputed
 * forwards) so stretched hides the store up to its stretched length: the step ends when
 * the later of the two does, max(backward + cpu, store) after the first gradient. Either way the in-RAM optimizer's terms
 * (its update, its speculative backups) are gone. The store's host buffers (host_budget,
 * strata train's state_budget) set how many subgroups stay cached: st_train_plan_predict
 * chooses that budget where the user leaves it (st_plan_state_budget). The program (st_plan_stream) does not see
 * these terms: they add the same time to every plan but where recompute lengthens a
 * backward the store hides behind. */
typedef struct st_plan_disk {
    const char *const *paths; /* the store's directories (must exist: st_store_plan lays it out) */
    int n_paths;
    const double *mixed_bytes_per_s; /* each path's probed mixed bandwidth (bytes/s; st_io_probe's
                                        mixed_gbps x 1e9) */
    const double *path_weight;  /* st_store_config.path_weight (NULL: equal) */
    int fmt;                    /* st_optim_state_format: ST_OPTIM_STATE_F32 or ST_OPTIM_STATE_8BIT */
    double optim_ns_per_param;  /* the update of fmt on the host, per parameter (the profile's
                                   optim_ns_per_param is fp32's) */
    unsigned long long host_budget; /* st_store_config.host_budget (0: the store's 1 GiB) */
    int beside;                 /* st_stream_config.store_beside */
    float weight_decay;         /* for the store's segments (st_params_decay_segments) */
    double crc_bytes_per_s;     /* the CRC-32C rate as the store computes it (st_plan_crc_bytes_per_s;
                                   0: the profile's mem_bytes_per_s) */
    double cpu_slowdown;        /* beside the backward: seconds of compute lost per second of the store's
                                   update and CRC, which run on every host core (OpenMP): 1 on the CPU
                                   backend, whose compute is those cores (the profile's
                                   host_work_slowdown is a single copy thread's); 0: host_work_slowdown */
} st_plan_disk;

/* The CRC-32C rate the state store gets (st_crc32c over 1 MiB blocks on every core, as it
 * checks each region read and sums each one written), in bytes/s: a few runs over 64 MiB. */
st_status st_plan_crc_bytes_per_s(double *bytes_per_s, st_err *err);

typedef struct st_plan_disk_cost {
    double io_s, cpu_s, store_s; /* above */
    double hidden_s;             /* the part of store_s behind the backward (beside only) */
    unsigned long long read_bytes, write_bytes; /* per step, all paths */
    unsigned long long disk_bytes; /* the store's files on every path (both regions: st_store_plan) */
    unsigned long long store_host_bytes; /* the store's host buffers (st_store_plan) */
    unsigned long long state_budget; /* the host_budget the store was laid out for */
    int n_subgroups, n_buffers;  /* the store's layout (st_store_plan_step) */
    unsigned long long region_bytes; /* its largest subgroup region */
    double cache_hits;           /* subgroups a step finds cached, not read (read_bytes is without them):
                                    the mean of two steps, as read_bytes */
    size_t host_bytes;           /* the executor's and the store's host bytes together
                                    (st_plan_host_bytes_disk) */
} st_plan_disk_cost;

/* st_plan_predict with the state in a disk store: pred as st_plan_predict's with the store's
 * exposed time as optim_exposed_s, and the store's figures in dc (may be NULL). Fails where
 * the store cannot be laid out (a path that is not a directory) or a bandwidth is not
 * positive. */
st_status st_plan_predict_disk(const st_arch *a, int B, int T, const st_plan_profile *hw, const st_stream_plan *p,
                               const st_plan_disk *disk, st_plan_prediction *pred, st_plan_disk_cost *dc,
                               st_err *err);

/* Host bytes the streaming executor holds for plan p with the training state in RAM (fp32
 * moments, its own parameter and gradient vectors): parameters, gradients, moments, the
 * speculative update's backups, offloaded activation sets, the chunked classifier's
 * host side (embedding output, residual gradient, logits) and per-row buffers. The
 * device's bytes are not in it (pred.device_bytes). */
size_t st_plan_host_bytes(const st_arch *a, int B, int T, const st_stream_plan *p);
/* The same with the state in a disk store (external_optimizer): no moments and no speculative
 * backups in host memory; the store's own buffers are not in it (st_plan_disk_cost.host_bytes
 * adds them). */
size_t st_plan_host_bytes_disk(const st_arch *a, int B, int T, const st_stream_plan *p);

/* ------------------------------------------------------------------ the memory account (plan_memory.c)
 * The bytes each tier holds for a configuration, by class of training state, read from the
 * executor's allocation tables (st_stream_device_bytes, st_stream_host_bytes) for the step's
 * plan: in memory the resident plan (st_stream_plan_resident: every block in the host
 * vectors, every activation kept), streamed the plan given. strata train checks it against
 * host_budget before anything is written, strata plan prints it, plan_state auto compares
 * placements with it. */
enum { ST_MEM_TIER_DEVICE = 0, ST_MEM_TIER_HOST = 1, ST_MEM_TIER_DISK = 2, ST_MEM_TIER_COUNT = 3 };
const char *st_mem_tier_name(int tier);

typedef struct st_mem_request {
    const st_arch *arch;       /* the model as blocks */
    int B, T;                  /* batch and sequence length of a micro-batch */
    int grad_accum;            /* micro-batches a step (<= 1: one; more: the executor's second gradient) */
    st_optim_state_format state_format; /* the moments' format */
    int streamed;              /* 1: through a device budget (layer streaming); 0: in memory */
    const st_stream_plan *plan;/* streamed: the plan (NULL: the smallest, every block recomputed) */
    int device_is_host;        /* streamed on the CPU: the device tier's bytes are host memory too */
    int state_on_disk;         /* the moments in the disk state store (state_paths) */
    double state_budget;       /* ...its host buffers (<= 0: the store's default, 256 MiB) */
    double model_act_bytes;    /* > 0: the model trains through its own forward (LoRA, POET-X),
                                  these its activations, the executor's tables unused */
    double trainable_params;   /* > 0: a method over frozen base weights (LoRA, POET-X): the base's
                                  n_params held as fp32 without gradient or moments, these trained */
    st_dtype act_dtype;        /* plan NULL: the activation sets of the plan taken here (the resident
                                  one, or streamed the smallest), ST_F32 (0) or ST_BF16
                                  (st_step_setup.act_dtype); a plan given carries its own */
    int bf16_weights;          /* matmul bf16 on the CPU: the executor's bf16 copy of the weights
                                  (st_stream_bf16_weight_bytes) in host memory */
    double method_start;       /* > 0: the method's own start-up peak besides the runtime (LoRA, POET-X),
                                  in place of 12 bytes a base parameter */
    double method_staging;     /* > 0: the method's checkpoint staging (POET-X: its W0 too), in
                                  place of 4 bytes a trained parameter */
    double frozen_bytes;       /* > 0: the frozen base as held (POET-X's W0 in frozen_dtype), in
                                  place of 4 bytes a base parameter */
    int frozen_dtype;          /* ...W0's precision, strata/poetx.h's st_frozen_dtype (0: fp32) */
    double method_disk;        /* state_on_disk: what the method keeps on state_paths besides the
                                  store (POET-X: W0 and the permutations of two merges' files) */
    double hook_bytes;         /* > 0, streamed: the executor runs a hook that trains the base's
                                  ends (POET-X, st_stream_config.hook frozen 0), these the hook's own
                                  host bytes (kept h, scratch); its tables without gradient slots or
                                  host gradient vector, with the embedding's and head's gradients */
    double frozen_hook_bytes;  /* > 0, streamed over a frozen base (LoRA): the hook's own host bytes
                                  (the adapters' scratch) beside the executor's tables */
    size_t held_block_bytes;   /* streamed LoRA or POET-X over frozen_dtype bf16 or int8: one block's
                                  matmul weights as held (st_frozen_held_block_bytes), what each
                                  weight slot holds beside the block's 1-D tensors (0: fp32 slabs) */
} st_mem_request;

/* Bytes per class of training state and the peak each tier must hold. */
typedef struct st_mem_plan {
    double n_params;
    double weights;        /* fp32 working weights (the host vector) */
    double grads;          /* fp32 gradients (the host vector) */
    double master;         /* separate fp32 master copy: 0 while the weights are fp32 */
    double master_if_bf16; /* what it would be with bf16 working weights */
    double moments_f32;    /* AdamW m and v, fp32 */
    double moments_8bit;   /* m and v, 8-bit blockwise with fp32 absmax per block (either map) */
    double acts_stored;    /* the step's activations and working buffers under its plan (the
                              executor's device table: host memory in memory) */
    double acts_ckpt;      /* the same with every block recomputed */
    double exec_host;      /* the executor's other host buffers (per-row sums, grad_accum's
                              second gradient, offloaded activation sets, backups; matmul bf16's
                              copy of the weights) */
    double init_scratch;   /* transient host buffer of initialisation and checkpoints */
    double n_trainable;    /* LoRA, POET-X: the parameters trained (0: every one) */
    double frozen;         /* ...and the base's frozen weights as held (fp32, or W0 in frozen_dtype) */
    int frozen_dtype;      /* W0's precision (strata/poetx.h's st_frozen_dtype; 0: fp32) */
    double runtime;        /* code, libraries, data pipeline, BLAS buffers: measured once, a constant */
    int moments_8bit_used;
    int state_format;      /* st_optim_state_format of the moments (either 8-bit map, or f32) */
    int streamed;          /* the activations are the device tier's */
    int device_of_plan;    /* streamed: the device tier's need is a plan's device bytes (strata
                              plan's, the plan it chose), not these tables' */
    int moments_on_disk;   /* state_paths: master copy and moments in the disk state store */
    double state_buffers;  /* ...and its host buffers; the disk tier's need is the store's two
                              regions of master and moments (st_store_bytes_per_param) */
    double tier_need[ST_MEM_TIER_COUNT]; /* peak bytes each tier must hold */
} st_mem_plan;

st_status st_plan_memory(const st_mem_request *rq, st_mem_plan *out, st_err *err);
/* Refuse a plan that does not fit: budgets in bytes per tier (host <= 0: MemAvailable now;
 * device and disk <= 0: none; the disk state's store checks its paths' free space itself).
 * ST_ERR_NOMEM names each tier short and the bytes missing. */
st_status st_mem_plan_check(const st_mem_plan *e, const double budget[ST_MEM_TIER_COUNT], st_err *err);
/* The account as a table, for strata plan. */
void st_mem_plan_print(FILE *f, const st_mem_plan *e, const double budget[ST_MEM_TIER_COUNT]);
/* The same account as JSON, for strata plan --json: "classes" (each class's bytes, its tier or
 * "-" where the configuration does not use it), "tiers" (each tier's peak need, its budget or
 * null, and whether it fits: null where the budget is unknown), "fits", and for a method over
 * frozen weights "bytes_per_base_param". The caller owns the object. */
struct json_object;
struct json_object *st_mem_plan_to_json(const st_mem_plan *e, const double budget[ST_MEM_TIER_COUNT]);

/* ------------------------------------------------------------------ a run's prediction
 * What strata plan prints and strata train logs and saves (RUN_DIR/plan.json) for the plan
 * of a configuration: one function, so the plan printed is the plan run, predicted alike. */

/* The disk state's update runs beside the backward where host work leaves the device's
 * compute alone: host_work_slowdown below this (strata train's choice, st_stream_config.
 * store_beside); else after it (the CPU backend, whose device is the host's cores). */
#define ST_PLAN_STORE_BESIDE_BELOW 0.5
int st_plan_store_beside(const st_plan_profile *hw);

/* strata train's probe of a state path without state_profile: the smallest test file whose
 * mixed figure held steady on the dev machine's disk (strata probe --path DIR --bytes B, 2026-12-02,
 * a shared machine: 16 MiB 0.54-1.06 GB/s in 3 runs, 0.2-0.3 s; 64 MiB 0.26-2.43 GB/s in 7, 0.3-0.7 s;
 * 128 MiB 0.30-0.45 GB/s in 4, 1.1-1.4 s; 256 MiB 0.43-0.61 GB/s in 3, 1.7-2.2 s) */
#define ST_PLAN_PROBE_BYTES (128ull << 20)

/* The store's host budget (strata train's key state_budget) where the user leaves it 0 under
 * plan auto: the candidates ST_STORE_HOST_BUDGET_DEFAULT, doubled while it stays within the
 * host bytes left for the store (host_budget less the rest of the run, the memory plan's need or
 * the executor's st_plan_host_bytes_disk where larger; without host_budget half of what
 * MemAvailable leaves after it), and the budget
 * that caches every subgroup where that fits; each
 * predicted (st_plan_predict_disk: a larger cache reads less), the least step taken; a larger
 * budget is taken only where it predicts a step at least ST_PLAN_STATE_BUDGET_TIE (relative)
 * shorter than the smaller one taken so far: host memory must buy a step 1% shorter. */
#define ST_PLAN_STATE_BUDGETS 24
#define ST_PLAN_STATE_BUDGET_TIE 0.01
typedef struct st_plan_state_budget_cand {
    unsigned long long budget;
    int whole;                     /* 1: the smallest budget found that caches every subgroup */
    double step_s;
    double hits;
    int n_subgroups;
    unsigned long long read_bytes, store_host_bytes;
} st_plan_state_budget_cand;

typedef struct st_plan_config_disk {
    int on_disk;      /* 1: the configuration's state is on disk (state_paths): pred is st_plan_predict_disk's */
    int n_paths;
    int probed;       /* 1: the bandwidths were probed (no state_profile; now, or at the start reused), 0:
                         state_profile's */
    int reused;       /* 1: the bandwidths are those of the run's previous start (st_train_plan_predict_ex) */
    int beside;       /* st_plan_store_beside(hw) */
    double mixed_bytes_per_s[16]; /* each path's (ST_STORE_MAX_PATHS) */
    double crc_bytes_per_s;       /* st_plan_crc_bytes_per_s, measured now */
    char state_paths[2048];       /* the key state_paths the figures are for (st_train_config.state_paths) */
    st_plan_disk_cost dc;         /* dc.state_budget: the store's host budget predicted (chosen or given) */
    int budget_chosen;            /* 1: dc.state_budget chosen (st_plan_state_budget), 0: the key's */
    double host_cap;              /* chosen: the host bytes the store's buffers could take */
    int n_budgets, budget_pick;   /* chosen: the candidates, ascending, and the index taken */
    st_plan_state_budget_cand budgets[ST_PLAN_STATE_BUDGETS];
} st_plan_config_disk;

/* Choose disk->host_budget's value as above for plan p, host_cap bytes for the store's buffers
 * (disk->host_budget is not read): the candidates and the choice in cd (budgets, n_budgets,
 * budget_pick, host_cap, budget_chosen 1), the chosen one's prediction in pred and cd->dc. */
st_status st_plan_state_budget(const st_arch *a, int B, int T, const st_plan_profile *hw, const st_stream_plan *p,
                               const st_plan_disk *disk, double host_cap, st_plan_prediction *pred,
                               st_plan_config_disk *cd, st_err *err);

/* Candidate i of cd's choice as one line ("state_budget 536870912: predicted step 0.1234 s,
 * 8 of 16 subgroups cached, 123 bytes read a step: chosen"). */
void st_plan_state_budget_describe(const st_plan_config_disk *cd, int i, char *buf, size_t cap);

struct json_object;
/* {"io_s", "cpu_s", "store_s", "hidden_s", "beside", "probed", "reused", "state_paths",
 *  "mixed_bytes_per_s": [...], "crc_bytes_per_s", "read_bytes", "write_bytes", "host_bytes",
 *  "state_budget", "state_budget_chosen", "cache_hits", "n_subgroups"}: a new json-c object. */
struct json_object *st_plan_config_disk_to_json(const st_plan_config_disk *cd);

/* The update's time per parameter in state format fmt on the machine hw: fp32's is the
 * profile's optim_ns_per_param; the 8-bit one's is that times the ratio of the two updates
 * timed now over 2^20 parameters (the best of 7 each, taken in turns; once per process), since
 * the profile times fp32's only. */
st_status st_plan_optim_ns_per_param(const st_plan_profile *hw, int fmt, double *ns, st_err *err);

/* ------------------------------------------------------------------ plan_state auto
 * The optimizer state's format and tier where the user leaves them to the planner (the key
 * plan_state auto; f32 / 8-bit changes the optimizer's results): the placements f32 in host
 * memory, 8-bit in host memory, f32 on state_paths, 8-bit on state_paths (the last two only
 * with state_paths), in that order. st_train_state_fit checks which fit (the host budget, the
 * paths' free space for the store's two regions); st_train_state_choose predicts the step of
 * each that fits, as strata plan and strata train predict a run (with device_budget the
 * program at that budget, else the streamed model of every block kept and the head
 * resident; the update's ns/param of the format, st_plan_optim_ns_per_param; a disk
 * placement through st_train_plan_predict), and takes the fastest. A tie (the same step
 * to ST_PLAN_STATE_TIE_S, the precision printed) goes to the earlier placement. A disk
 * placement's time needs the paths' bandwidth from state_profile (neither command probes a
 * disk to choose): without it its time is unknown, and a disk placement is taken only where
 * no host-memory placement fits (the first that fits). With one placement that fits, or no
 * machine profile (hw NULL), the first that fits is taken and nothing is predicted. */
#define ST_PLAN_STATE_PLACEMENTS 4
#define ST_PLAN_STATE_TIE_S 1e-4 /* steps printed as %.4f s */
typedef struct st_plan_state_candidate {
    int fmt;                      /* ST_OPTIM_STATE_F32 or ST_OPTIM_STATE_8BIT */
    int on_disk;                  /* 0: host memory, 1: state_paths */
    int fits;                     /* the host budget and, on disk, the paths' free space */
    double host_bytes;            /* the run's host bytes with this placement */
    double disk_bytes, disk_free; /* on disk: the store's two regions; the paths' free bytes */
    int timed;                    /* 1: step_s predicted */
    double step_s;
    char note[320];               /* not fitting: what is short; fitting, not timed: why */
} st_plan_state_candidate;

typedef struct st_plan_state_choice {
    int n;                 /* 2 (no state_paths) or 4, in the order above */
    st_plan_state_candidate cand[ST_PLAN_STATE_PLACEMENTS];
    int chosen;            /* st_train_state_choose's index (-1 before) */
    int needs_profile;     /* st_train_state_fit: 1 where two or more placements that fit can be timed */
} st_plan_state_choice;



/* ------------------------------------------------------------------ plan files
 * A plan saved to run again exactly (strata plan -o FILE, strata train --plan FILE, and the
 * RUN_DIR/plan.json a streamed strata train writes): a JSON object
 *     {"strata_plan": 1, "model": "gpt2-tiny", "arch": "gpt2", "n_blocks": 4, "n_embd": 128,
 *      "vocab_size": 256, "n_params": 830208, "batch": 2, "seq": 32, "device_budget": 6000000,
 *      "device_bytes": 5704960, "prefetch_depth": 1, "vocab_chunk": 0, "overlap_optim": true,
 *      "clip": "auto", "grad_dtype": "f32", "act_dtype": "f32", "optim_threads": 1,
 *      "blocks": ["offload", "offload", "offload", "keep"], "predicted": {"step_s": ..., ...}}
 * ("act_dtype", st_stream_plan.act_dtype, may be absent in a file from before it: f32.)
 * The model is identified by its shape (arch, n_blocks, n_embd, vocab_size, n_params), not
 * by its name (an init_from directory may move). strata plan's --json adds what a reader
 * does not need ("fits", "profile", "solve_s", "optimal"); with the state on disk, strata plan
 * and strata train add "disk" (st_plan_config_disk_to_json: the store's figures behind
 * "predicted"); a reader accepts those and refuses any other key, so a misspelt key is
 * never ignored. */
#define ST_PLAN_FILE_VERSION 1
#define ST_PLAN_FILE_MAX_BYTES (4u << 20) /* 4096 blocks are about 50 KB of JSON */

typedef struct st_plan_file {
    char model[256];       /* the model's preset name or init_from, as given (not checked) */
    char arch[16];         /* st_arch_ops.name */
    int n_blocks, n_embd, vocab_size;
    size_t n_params;
    int batch, seq;
    size_t device_budget;  /* the budget the plan was made for */
    size_t device_bytes;   /* st_stream_device_bytes of the plan when it was made (0: not given) */
    int has_prediction;    /* 1: pred holds step_s, its five parts and one block's times */
    st_plan_prediction pred;
    st_stream_plan plan;      /* n_layer == n_blocks */
    unsigned long long state_budget; /* "disk": the state store's host budget predicted with (0: none) */
} st_plan_file;

struct json_object;
/* f describing plan p for a at batch B x seq T made within device_budget; pred NULL: no
 * prediction. device_bytes: pred's, else 0. */
void st_plan_file_init(st_plan_file *f, const st_arch *a, const char *model, int B, int T, size_t device_budget,
                    const st_stream_plan *p, const st_plan_prediction *pred);
/* The document as a new json-c object (the caller puts it); more members may be added. */
struct json_object *st_plan_file_to_json(const st_plan_file *f);
/* Write a document (st_plan_file_to_json's, perhaps with more members) to path crash-safely
 * (a temporary, fsync, rename), as JSON_C_TO_STRING_PRETTY text and a newline. */
st_status st_plan_file_save_json(const char *path, struct json_object *doc, st_err *err);
st_status st_plan_file_save(const char *path, const st_plan_file *f, st_err *err);
/* Read and validate a plan file: every key's type and range, the act names, vocab_chunk
 * within vocab_size, the blocks' count. Fails naming path, the key and what to do. */
st_status st_plan_file_load(const char *path, st_plan_file *f, st_err *err);
/* Whether f (read from path) was made for model a at batch B x seq T: fails naming the
 * first key that differs and what to do. */
st_status st_plan_file_check(const char *path, const st_plan_file *f, const st_arch *a, int B, int T, st_err *err);
/* Names in plan files: "keep", "offload", "recompute"; "speculate", "defer", "auto". */
const char *st_plan_act_name(int act);
const char *st_plan_clip_name(int clip);

#endif
