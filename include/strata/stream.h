/* stream.h - the layer-streaming executor: one training step of any architecture with a
 * block interface (block.h: GPT-2, the Llama family) with only the blocks being computed
 * on the device.
 *
 * The host tier holds the whole training state in fp32: parameters, gradients and the
 * optimizer's moments. The device (a backend with a hard byte budget, see tier.h) holds
 * the final norm and, unless the vocabulary is chunked (below), the embedding and the head
 * (an untied head lives beside the norm), with their gradients;
 * prefetch_depth + 1 weight
 * slots, two gradient slots, the block outputs (every block's input is kept: they are the
 * checkpoints) and block activations as the plan says. The copy engine does every block
 * transfer on its own thread:
 *
 *   forward   block l computes in slot l % (depth+1) while blocks l+1..l+depth arrive;
 *             after it, block l+depth+1 is fetched into its slot.
 *   backward  the last depth+1 blocks are still resident from the forward (not fetched
 *             again); after block l, block l-depth-1 is fetched into its slot, and block
 *             l's gradient slot is drained to host while block l-1 computes.
 *   optimizer with overlap on, a host thread updates block l's parameters as soon as its
 *             gradient has landed, while the device is in backward on earlier blocks.
 * So each block's weights cross to the device at most twice per step (exactly
 * 2L - depth - 1 block fetches) and the embedding/head weights once (after their
 * update), and each gradient crosses back once. The token ids go to the device and the
 * per-row losses come back through the backend's own (synchronous) copies: N ints and N
 * floats per step, not counted in the step's h2d/d2h bytes.
 *
 * Example:
 *
 *     #include "strata/tier.h"
 *
 *     st_err err = {0};
 *     st_backend *cpu = NULL, *dev = NULL;
 *     st_arch *arch = NULL;
 *     st_stream_exec *x = NULL;
 *     st_gpt2_config cfg;
 *     static st_stream_plan plan;                          // one entry per block, ST_STREAM_MAX_LAYERS
 *     static int32_t inputs[4 * 64], targets[4 * 64];   // (B, T) token ids
 *     if (st_backend_cpu_create(&cpu, 0, &err) || st_backend_with_budget(&dev, cpu, 64u << 20, &err) ||
 *         st_gpt2_config_preset("gpt2-tiny", &cfg, &err) ||
 *         st_arch_gpt2(&arch, &cfg, &err)) return 1;     // or st_arch_llama, st_arch_of_model
 *     st_stream_plan_default(&plan, cfg.n_layer);
 *     st_stream_config sc = {.arch = arch, .B = 4, .T = 64, .weight_decay = 0.1f};
 *     if (st_stream_exec_create(&x, &sc, &plan, dev, &err) == ST_OK) {  // fails, naming the bytes
 *         st_stream_init_random(x, 1);                                   // missing, when the plan
 *         st_adamw_params hp = {.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = 1};
 *         st_stream_step_stats st;                                       // does not fit
 *         if (st_stream_step(x, inputs, targets, &hp, 1.0f, &st, &err) == ST_OK)
 *             printf("loss %.3f, overlap %.2f\n", st.loss, st.overlap_efficiency);
 *     }
 *     if (err.msg[0]) fprintf(stderr, "strata: %s\n", err.msg);
 *     st_stream_exec_free(x);
 *     st_arch_free(arch);                               // after the executor
 *     st_backend_free(dev);
 *     st_backend_free(cpu);
 *
 * End of example.
 *
 * Gradient clipping with the optimizer overlapped (the global norm is known only after
 * the last gradient lands). Two exact approaches, chosen by plan.clip:
 *   ST_STREAM_CLIP_SPECULATE: each block is updated as its gradient lands with
 *     clip scale 1 (what the step uses whenever the norm is within max_norm), after
 *     saving that block's parameters and moments to a host backup. The norm's partial
 *     sums are taken as gradients land, per fixed 65536-element chunk of the flat vector
 *     and added in chunk order at the end, so the total is bit-identical to
 *     st_optim_grad_sumsq over the whole gradient. If the norm exceeds max_norm (or is not
 *     finite), every updated block is restored from the backup and the step is redone
 *     with the clip scale (or skipped): the result equals the non-overlapped step
 *     bit for bit, at the cost of a 12-byte-per-parameter backup copy each step and a
 *     non-overlapped redo on clipped steps. Needs fp32 optimizer state.
 *   ST_STREAM_CLIP_DEFER: gradients land and partial norms are summed during backward, and
 *     the update runs after backward with the known scale (no speculation, no overlap
 *     of the update itself).
 *   ST_STREAM_CLIP_AUTO (default): speculate, except after a step that clipped or skipped,
 *     when the next is likely to clip too (early training clips every step) and a
 *     deferred update is cheaper than a rollback and a redo. Both are exact, so the
 *     choice changes only the time. In either speculative mode the embedding and ln_f,
 *     whose gradients land last, are updated after the norm is known, with every core.
 * With overlap off the whole update runs after backward, as the in-memory loop does.
 *
 * Activations per block (plan.act[l]):
 *   ST_STREAM_ACT_KEEP       the block's activations stay on the device until its backward.
 *   ST_STREAM_ACT_RECOMPUTE  only its input is kept; the forward is run again right before
 *                         its backward, with the weights fetched for the backward.
 *   ST_STREAM_ACT_OFFLOAD    its activations are drained to host after its forward and
 *                         fetched back (prefetched one offloaded block ahead) for its
 *                         backward; the last two offloaded blocks stay resident.
 * The recompute blocks share one activation set on the device, so the last of them
 * (normally the last block) still holds its forward at its backward and is not run
 * again. The default recomputes every block.
 *
 * Activations in bf16 (plan.act_dtype ST_BF16): every block computes its forward into one
 * fp32 working set (act_work), which is rounded to bf16 (the backend's to_bf16) into the
 * block's kept set, its offload slot or the shared recompute set; its backward reads the
 * working set widened back from there (from_bf16). Kept, offloaded and recomputed sets hold
 * 2 bytes an element on the device and the offloaded ones on the host (half the bytes
 * cross), for one fp32 working set more. Every block rounds the same way at the same point,
 * so the backward reads the same bits whether a block was kept, offloaded or recomputed:
 * the three give the same step, bit for bit (a different one from fp32's). The forward
 * itself, its block outputs (the checkpoints) and the loss are fp32's unchanged. Needs a
 * backend with from_bf16.
 *
 * Chunked vocabulary (plan.vocab_chunk > 0), for a head that does not fit the device
 * (gpt2-124m: 154 MB, against a budget of 249 MB for one eighth of its state): the
 * embedding (a gather) and its backward (a scatter-add) run on the host, whose copy of
 * the vector is the master; the input embedding crosses to the device, the residual
 * gradient back. The classifier runs two passes over chunks of vocab_chunk head rows
 * (the token embedding when tied, lm_head when not): the first computes each row's
 * running max and sum of exponentials (online softmax, backend ops) and the target
 * logit, and sends the chunk's logits to the host (N x V floats of host memory; on the
 * CPU backend a copy each way costs less than the GEMM that would recompute them; over
 * PCIe the GEMM may be cheaper, a choice to revisit with CUDA); the second (over the
 * chunks in reverse, so the last two are still resident) fetches the chunk's logits
 * back, forms dlogits and accumulates the input gradient and the chunk's head
 * gradient, which is drained to host behind the next chunk. The loss and gradients
 * equal the unchunked ones to float rounding (the order of the sums differs), not bit
 * for bit.
 *
 * A frozen base (st_stream_config.hook with frozen 1: LoRA's adapters, strata/lora.h): the
 * hook runs on the device's blocks, its layer set before each block's forward, recompute and
 * backward; nothing of the arch's is trained, so there are no gradient slots, no embedding or
 * head gradients (the head's backward forms the residual gradient only), no host gradient
 * vector, no optimizer or moments, and nothing is drained. st_stream_hook_grads runs one
 * micro-batch; the caller's optimizer updates the hook's parameters (strata/step.h). The base
 * never changes: blocks 0..depth stay in their slots for the next call. The hook's memory is
 * the host's, so the device must be one whose memory is (the CPU backend). A hook that holds the
 * base's matmul weights in another precision (held_block_bytes > 0, model.h) makes every weight
 * slot a held slab (block.h: the 1-D tensors packed) with the layer's held run beside it: the
 * fp32 matmul weights are neither copied nor counted, and hook->held points at the slot's copy
 * while the executor runs that layer (NULL again after each call).
 *
 * A base whose ends a hook trains (hook with frozen 0: POET-X, strata/poetx.h): the same, except
 * that the hook replaces the block matmuls (W0 read from the device's block, or held: the slot's
 * held run) and the embedding's and head's gradients are formed on the device as a trained
 * base's (its d_pre_g, d_post_g: no block gradient slots, no host gradient vector). The block
 * functions send the norms' and biases' gradients to the hook's grad_at; after each backward the
 * executor copies the embedding's, final norm's and an untied head's gradients to it, tensor by
 * tensor. With vocabulary chunks each chunk's head gradient goes to grad_at at the head's offset
 * plus the chunk's rows, and the embedding's backward runs on the host into grad_at's embedding
 * gradients (which must be laid out as the arch's; a tied head's rows hold the head's gradient
 * first, the scatter adds to them), as the arch's own chunked path. The caller copies the updated
 * trainables into the host vector and calls st_stream_params_changed before the next call
 * (strata/step.h does), and the blocks are fetched again.
 *
 * Why every block's input is a checkpoint (checkpoint every k = 1): recomputing a
 * segment of k blocks before its backward needs all k blocks' weights resident at once
 * (or fetched a third time) and k full activation sets (15 N C floats each), to save
 * (k-1) block inputs (N C floats each); under the two-moves rule that only pays when a
 * model has far more blocks than 15 k. A planner can still mix keep and offload.
 *
 * Not yet: multi-block checkpoint segments, speculative updates of 8-bit moments in host memory
 * (the disk state's are speculated: an abandoned step is never committed).
 */
#ifndef STRATA_STREAM_H
#define STRATA_STREAM_H

#include "strata/backend.h"
#include "strata/block.h"
#include "strata/core.h"
#include "strata/model.h"
#include "strata/optim.h"
#include "strata/tensor.h"

#define ST_STREAM_MAX_LAYERS 4096

typedef enum st_stream_act { ST_STREAM_ACT_KEEP = 0, ST_STREAM_ACT_RECOMPUTE = 1, ST_STREAM_ACT_OFFLOAD = 2 } st_stream_act;
typedef enum st_stream_clip { ST_STREAM_CLIP_SPECULATE = 0, ST_STREAM_CLIP_DEFER = 1, ST_STREAM_CLIP_AUTO = 2 } st_stream_clip;

typedef struct st_stream_plan {
    int prefetch_depth;   /* >= 1: blocks fetched ahead of the one computing */
    int overlap_optim;    /* 1: update each block on the host as its gradient lands */
    st_stream_clip clip;     /* how overlap meets global-norm clipping (above) */
    st_dtype grad_dtype;  /* drained block gradient dtype: ST_F32, or ST_BF16 (rounded on the
                             device, half the bytes; the optimizer reads bf16 natively) */
    int optim_threads;    /* OpenMP threads of the overlapped optimizer (<= 0: 1) */
    int vocab_chunk;      /* > 0: the classifier streams the head in chunks of this many rows
                             (two passes, online softmax); 0: the head lives on the device */
    int resident;         /* 1: every weight and gradient is the host vectors themselves (the
                             blocks', the embedding's, the head's): nothing is fetched or
                             drained, the schedule is the same. For a device whose memory is
                             the host's (the CPU backend, no budget): the in-memory step as
                             this executor. Needs an fp32 drain and no vocabulary chunks;
                             prefetch_depth is then unused. */
    st_dtype act_dtype;   /* the activation sets saved for the backward: ST_F32, or ST_BF16
                             (kept, offloaded and recomputed sets alike, 2 bytes an element;
                             see "Activations in bf16" above) */
    int n_layer;          /* entries of act used */
    unsigned char act[ST_STREAM_MAX_LAYERS]; /* st_stream_act per block */
} st_stream_plan;

/* depth 1, overlap on, speculative clipping, f32 drain, recompute every block. */
void st_stream_plan_default(st_stream_plan *p, int n_layer);
/* Every block the same policy. */
void st_stream_plan_set_all(st_stream_plan *p, st_stream_act a);
/* The in-memory step's plan (step.c), which the memory account reads too (plan.h's
 * st_plan_memory): every block resident in the host vectors and its activations kept, the
 * clip deferred (no speculative backups). */
void st_stream_plan_resident(st_stream_plan *p, int n_layer);

typedef struct st_stream_config {
    const st_arch *arch;      /* the model (block.h); outlives the executor */
    float *host_params, *host_grads; /* the host tier's vectors (n_params each, host memory,
                                 e.g. an st_model's on the CPU backend, whose save, load and
                                 init then act on the streamed run); NULL: the executor's own */
    int B, T;                 /* batch and sequence length of every step */
    int grad_accum;           /* the most micro-batches a step will take (0, 1: one); > 1
                                 allocates one more fp32 gradient on the host */
    float weight_decay;       /* matmul weights and embeddings; 0 for biases and norms */
    st_backend *host_be;      /* runs the chunked classifier's host side (the embedding);
                                 NULL: the device backend (right for the CPU backend) */
    st_optim_state_format state_format; /* the moments in host memory: fp32 (default) or 8-bit
                                 blockwise; 8-bit never speculates (its moments cannot be
                                 restored from a cheap copy): the norm is summed as gradients
                                 land and the update runs after backward with every core */
    st_optim *optim;          /* the caller's optimizer over the arch's tensors, in their order
                                 (it keeps it, its state and format; state_format must match);
                                 NULL: the executor makes its own */
    int external_optimizer;   /* 1: the master weights and moments live in a state store
                                 (st_stream_attach_store); no moments in host memory */
    int store_beside;         /* 1: the store's step runs beside the backward (below) where
                                 the plan speculates; 0: after the backward. Beside pays where
                                 the device computes on cores of its own; on the CPU backend
                                 the store's CRCs, copies and update take the compute's cores
                                 (measured slower: docs/BENCHMARKS.md), so strata train sets it
                                 from the measured profile (plan_profile.host_work_slowdown) */
    st_linear_hook *hook;     /* NULL: none. Else called at each block matmul on the device's
                                 blocks (model.h), its layer set before each block's forward,
                                 recompute and backward. With hook->frozen (LoRA over a frozen
                                 base, strata/lora.h) the executor trains nothing of the arch's:
                                 no gradient slots, no embedding, head or block gradients, no
                                 host gradient vector (host_grads ignored), no optimizer or
                                 moments; the step is st_stream_hook_grads, the hook's own
                                 gradients are the caller's (its optimizer updates them). The
                                 hook's memory is the caller's: a device whose memory is the
                                 host's (the CPU backend) where it is host memory. With
                                 frozen 0 (POET-X, strata/poetx.h) likewise, except that the
                                 embedding's, norms', biases' and head's gradients are formed
                                 and go to the hook's grad_at (above), the head whole or in
                                 vocabulary chunks. */
} st_stream_config;

typedef struct st_stream_exec st_stream_exec;

/* Device bytes the plan needs (every allocation rounded as the arena rounds it);
 * st_stream_exec_create fails with ST_ERR_NOMEM, naming the bytes missing, above the
 * budget's free bytes. */
size_t st_stream_device_bytes(const st_stream_config *c, const st_stream_plan *p);
/* Host bytes the executor holds for the plan: the host vectors (parameters and gradients,
 * the caller's or its own), every buffer st_stream_exec_create allocates in host memory (one
 * table: the count and the allocation cannot differ), the chunked vocabulary's host
 * bindings, and the optimizer's moments unless the state is external (c->state_format). */
size_t st_stream_host_bytes(const st_stream_config *c, const st_stream_plan *p);
/* Host bytes of the weights' bf16 copy (2 a parameter), held besides st_stream_host_bytes
 * where the device's bf16 matmuls read one (the CPU backend under matmul bf16,
 * st_backend_bf16_weights_read), allocated at the first step or eval that reads it: kept
 * equal to the host weights rounded to bf16, written by the optimizer's pass as it updates
 * them (rounded whole only after the weights changed otherwise: st_stream_set_params,
 * st_stream_params_changed, a rollback, the disk state's update), so the forward's and the
 * backward's matmuls read bf16 weights without rounding them at each use, bit for bit the
 * same products. Not for the ranks' step (rounded at each use there). */
size_t st_stream_bf16_weight_bytes(const st_stream_config *c);

/* The order the disk state's store updates element ranges in beside the backward (a key for
 * st_store_step_args.order_key, the smaller first): a range within the blocks' parameters
 * [blocks_first, blocks_end) as its gradient lands, the last block's first (-end); a range
 * holding the embedding's or the head's gradient after every block (first). The executor
 * runs by it and the planner predicts the store's cache by it. */
double st_stream_store_order(size_t first, size_t end, size_t blocks_first, size_t blocks_end);
/* dev: the device backend (a budgeted one reports its arena; any backend works). */
st_status st_stream_exec_create(st_stream_exec **out, const st_stream_config *c, const st_stream_plan *p, st_backend *dev,
                             st_err *err);
void st_stream_exec_free(st_stream_exec *x);

/* The host tier's fp32 vectors (the arch's layout, n_params elements) and the arch. With
 * a bf16 drain the block ranges of st_stream_grads are not written (the bf16 copies are
 * internal). */
float *st_stream_params(st_stream_exec *x);
float *st_stream_grads(st_stream_exec *x);
const st_arch *st_stream_arch(const st_stream_exec *x);
st_optim *st_stream_optim(st_stream_exec *x); /* NULL with an external optimizer */

/* The disk tier under streaming (external_optimizer = 1): each step's update is
 * st_store_step over the host gradients (a bf16 drain's blocks read as bf16), writing the
 * fp32 host weights as its working copy, committed with `blob` (read at every step: the
 * caller updates it in place before st_stream_step). With store_beside, overlap_optim and a clip
 * policy that speculates (and a store that is not in place), the store's step runs on its own thread
 * beside the backward: its reads start during the forward, each subgroup is updated with
 * clip scale 1 as soon as its gradients have landed (the blocks' from the last to the first,
 * the embedding's and the head's last), and the step is committed only when it turns out
 * neither clipped nor skipped; otherwise it is abandoned whole (the store keeps its last
 * step) and redone with the clip scale, or, skipped, the host weights are read back from the
 * store (stats.store_beside, rolled_back). A skipped step commits nothing: the caller
 * commits its blob. */
struct st_store;
st_status st_stream_attach_store(st_stream_exec *x, struct st_store *store, const void *blob, size_t blob_bytes,
                              st_err *err);
/* The architecture's initialisation (as the model's init_random, same seed, same values), or a copy
 * (host_params may be st_stream_params(x) itself after editing it in place). Either sends
 * the device-resident parameters again. */
void st_stream_init_random(st_stream_exec *x, uint64_t seed);
void st_stream_set_params(st_stream_exec *x, const float *host_params);

typedef struct st_stream_step_stats {
    float loss;
    double loss_sum;   /* the same, unrounded: the micro-batches' shares summed in double
                          (st_step_micro_loss), as the step reports it */
    double grad_norm;
    int clipped, skipped, rolled_back; /* rolled_back: a speculative update was undone */
    uint64_t h2d_bytes, d2h_bytes;     /* submitted to the copy engine during the step */
    uint64_t h2d_act_bytes, d2h_act_bytes; /* of those, offloaded activations and the
                                              chunked classifier's logits (the rest:
                                              weights, gradients, embeddings, targets) */
    size_t device_peak_bytes, device_budget_bytes; /* arena high-water mark (0: no arena) */
    double compute_s;  /* device compute queued by the step thread (forward, recompute, backward):
                          the device's own time where it has timing marks (CUDA events), else the
                          host's clock around the ops (compute_on_device says which) */
    double wall_s;     /* the whole step, optimizer included */
    double overlap_efficiency; /* compute_s / wall_s */
    double wait_s;     /* the step thread waiting on copies */
    double optim_tail_s; /* after backward: waiting for or running the optimizer */
    int store_beside;    /* the disk state's update ran beside the backward (then rolled_back:
                            abandoned, nothing committed, and redone with the clip scale) */
    int compute_on_device; /* compute_s (and the trace's compute spans, on its GPU track) timed by
                              the device's marks (backend timer_mark) */
} st_stream_step_stats;

/* One training step: forward (mean loss over targets >= 0, dloss 1/(B*T)), backward,
 * global-norm clip to max_norm (<= 0: none), AdamW with hp (hp->grad_scale ignored; the
 * clip scale is used). A non-finite gradient skips the update (stats->skipped). */
st_status st_stream_step(st_stream_exec *x, const int32_t *inputs, const int32_t *targets, const st_adamw_params *hp,
                      float max_norm, st_stream_step_stats *stats, st_err *err);

/* A step over n_micro micro-batches of (B, T) (inputs and targets: n_micro x B x T,
 * micro-batch after micro-batch), dloss 1/(n_micro B T) each: the one accumulation rule
 * of strata's executors (strata train in memory does the same): each micro-batch's
 * gradient is computed fresh from zero, and the gradients are summed in micro-batch order,
 * ((g1 + g2) + g3) + ..., element by element, so a run with grad_accum A equals, bit for
 * bit, the same run in memory, and N data-parallel ranks with A micro-batches each can
 * equal N A micro-batches in one process. Needs stream_config.grad_accum >= n_micro (one
 * more fp32 gradient on the host) and an fp32 drain. The loss is the mean of the
 * micro-batches' losses. Each micro-batch streams the blocks as a step does, except that
 * blocks 0..depth (and the first two head chunks) stay in their slots from one
 * micro-batch's backward to the next one's forward. */
st_status st_stream_step_accum(st_stream_exec *x, int n_micro, const int32_t *inputs, const int32_t *targets,
                            const st_adamw_params *hp, float max_norm, st_stream_step_stats *stats, st_err *err);

/* Data parallel (strata/step.h runs the ranks' step): one micro-batch's gradient, fresh
 * from zero, in st_stream_grads(x) (fp32), and its mean loss; every micro-batch's dloss is
 * given (the step's, over all ranks); no norm, no update, no state touched. grad_hook is
 * called as each block's gradient has landed on the host, from the last block down (on
 * the optimizer thread when the plan overlaps it); the embedding's and the rest's have
 * landed when it returns. weight_hook (NULL: none) is called before the host weights of
 * [offset, offset + n) are first read: the embeddings, each block as it is fetched, then
 * the rest. Needs an fp32 drain and stream_config.grad_accum 1 (st_stream_can_hand_grads).
 * After the caller changes the host weights (its update), st_stream_params_changed: the
 * device copies of the embedding and head are sent again before their next use. */
int st_stream_can_hand_grads(const st_stream_exec *x);
/* A hook's executor (st_stream_config.hook; frozen, or POET-X's that trains the ends: those
 * gradients handed to its grad_at too, the embedding's and head's copied over, not added, so the
 * caller zeroes them before each call as st_step does; and the caller copies the updated
 * trainables into the host vector and calls st_stream_params_changed before the next call): one micro-batch's
 * forward and backward, the hook's gradients accumulated (+=) wherever the hook keeps them, with dloss given (the
 * step's: 1 / its targets >= 0 over every micro-batch); its mean loss. No gradient of the
 * arch's, no norm, no update (the caller's optimizer updates the hook's parameters, then
 * nothing is sent again: the base does not change). The same bits as the model's own forward
 * and backward with the hook (the blocks, the head and its dres in the same order), except
 * with a chunked vocabulary (float rounding, as st_stream_step's). ST_ERR_INVALID from an
 * executor without a hook; st_stream_step on a hook's one is refused the same way. */
st_status st_stream_hook_grads(st_stream_exec *x, const int32_t *inputs, const int32_t *targets, float dloss,
                               float *loss, st_stream_step_stats *stats, st_err *err);
/* 1 when x runs a hook's base (st_stream_config.hook: its step is st_stream_hook_grads). */
int st_stream_hook_base(const st_stream_exec *x);
st_status st_stream_micro_grads(st_stream_exec *x, const int32_t *inputs, const int32_t *targets, float dloss,
                             void (*grad_hook)(void *ctx, size_t offset, size_t n), void *grad_ctx,
                             void (*weight_hook)(void *ctx, size_t offset, size_t n), void *weight_ctx, float *loss,
                             st_stream_step_stats *stats, st_err *err);
void st_stream_params_changed(st_stream_exec *x);

/* Packed documents (strata/model.h, st_model_set_docs): positions and doc_start
 * (n_micro x B x T int32 each) of the micro-batches of the following st_stream_step_accum,
 * st_stream_micro_grads (the first) and st_stream_eval (the first), read when they run: the
 * caller keeps the arrays and refills them with the inputs. Each micro-batch's are set on
 * the executor's blocks (the device's, and the host's that embed a chunked vocabulary)
 * before its forward, so its recompute and backward see the same: the same bits as the
 * step in memory. NULL, NULL: one sequence a row (as before any call). Malformed ones are
 * refused by the call that reads them (ST_ERR_INVALID naming the row and position). */
void st_stream_set_docs(st_stream_exec *x, const int32_t *positions_all, const int32_t *doc_start_all);
/* Each micro-batch's per-row losses (model.h's st_row_loss_hook) after its forward in
 * st_stream_step_accum (k: the micro-batch); NULL: none. st_stream_row_losses: the last
 * forward's (host, B x T), as st_stream_micro_grads and st_stream_eval leave them. */
void st_stream_set_row_hook(st_stream_exec *x, st_row_loss_hook hook, void *ctx);
const float *st_stream_row_losses(const st_stream_exec *x);

/* Forward only (validation): the mean loss over targets >= 0 of one (B, T) batch with the
 * current weights, streamed as the step streams them. Changes no parameter, gradient,
 * moment or clipping state: the steps after it are bit-identical to those without it. */
st_status st_stream_eval(st_stream_exec *x, const int32_t *inputs, const int32_t *targets, float *loss, st_err *err);

#endif
