/* cudnn_attn.cu - causal attention (grouped KV heads) through cuDNN 9's fused
 * scaled-dot-product attention, forward and backward, written against the graph
 * ("backend") C API of cudnn_graph.h: no cudnn_frontend. See cudnn_attn.h for the contract.
 *
 * The graphs are the operation patterns cuDNN's flash-attention runtime-fusion engines
 * recognise, built node by node:
 *   forward   S = Q K^T (fp32) * scale; causal mask (row index >= column index, else
 *             -inf); softmax as max, exp(S - max), sum, P = exp / sum (bf16 for the
 *             second product); the statistics max + log(sum) (our lse); O = P V (bf16).
 *   backward  delta = rowsum(dO * O); P recomputed as exp(mask(Q K^T scale - lse));
 *             dV = P^T dO; dP = dO V^T; dS = (dP - delta) P scale; dK = dS^T Q; dQ = dS K
 *             (through an fp32 accumulator, zeroed first). The transposes are reshape
 *             operations, in bf16.
 * The patterns follow the node order and types cuDNN's own frontend lowers its SDPA nodes
 * to (read, for the order and data types the fused engines expect; not copied).
 * K and V keep their NKV heads; the engine maps query head h to kv head h / (NH / NKV).
 * Documents (doc_start) are not expressed: the backend runs its own kernels for them.
 *
 * Plans are cached per shape (B, T, NH, NKV, hs). libcudnn.so.9 is opened with dlopen at
 * the first call: a machine without cuDNN gets the backend's own kernels, not a strata
 * that fails to start. Whatever fails here (no library, a graph cuDNN refuses, no engine,
 * no plan, an execution error) is returned with its reason; the caller says so once and
 * falls back. Compiled only where CMake found cudnn.h (STRATA_HAVE_CUDNN). */
#include "backend/cuda/cudnn_attn.h"

#include <stdio.h>

#ifdef STRATA_HAVE_CUDNN

#include "backend/cuda/kernels_sdpa_copy.cuh"

#include <cuda_bf16.h>
#include <cudnn_graph.h>
#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include <limits>
#include <new>
#include <vector>

/* ---------------------------------------------------------------- the library, by dlopen */

struct CuDnnApi {
    void *lib = nullptr;
    size_t (*getVersion)(void) = nullptr;
    const char *(*getErrorString)(cudnnStatus_t) = nullptr;
    void (*getLastErrorString)(char *, size_t) = nullptr; /* optional */
    cudnnStatus_t (*create)(cudnnHandle_t *) = nullptr;
    cudnnStatus_t (*destroy)(cudnnHandle_t) = nullptr;
    cudnnStatus_t (*setStream)(cudnnHandle_t, cudaStream_t) = nullptr;
    cudnnStatus_t (*beCreate)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t *) = nullptr;
    cudnnStatus_t (*beDestroy)(cudnnBackendDescriptor_t) = nullptr;
    cudnnStatus_t (*beFinalize)(cudnnBackendDescriptor_t) = nullptr;
    cudnnStatus_t (*beSet)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t,
                           int64_t, const void *) = nullptr;
    cudnnStatus_t (*beGet)(cudnnBackendDescriptor_t const, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t,
                           int64_t, int64_t *, void *) = nullptr;
    cudnnStatus_t (*beExecute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t) = nullptr;
};

static void say(char *why, size_t n, const char *fmt, ...) {
    if (!why || !n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, n, fmt, ap);
    va_end(ap);
}

static bool api_load(CuDnnApi *a, char *why, size_t n) {
    const char *names[] = {"libcudnn.so.9", "libcudnn.so"};
    for (const char *nm : names)
        if ((a->lib = dlopen(nm, RTLD_NOW | RTLD_LOCAL))) break;
#ifdef STRATA_CUDNN_LIBDIR
    if (!a->lib) {
        char path[512];
        snprintf(path, sizeof path, "%s/libcudnn.so.9", STRATA_CUDNN_LIBDIR);
        a->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    }
#endif
    if (!a->lib) {
        const char *e = dlerror();
        say(why, n, "libcudnn.so.9 not loaded (%s): put cuDNN 9 on the library path", e ? e : "not found");
        return false;
    }
#define SYM(field, name)                                                                          \
    if (!(*(void **)&a->field = dlsym(a->lib, name))) {                                           \
        say(why, n, "libcudnn has no %s: cuDNN 9 or later is needed for its graph API", name);   \
        return false;                                                                             \
    }
    SYM(getVersion, "cudnnGetVersion")
    SYM(getErrorString, "cudnnGetErrorString")
    SYM(create, "cudnnCreate")
    SYM(destroy, "cudnnDestroy")
    SYM(setStream, "cudnnSetStream")
    SYM(beCreate, "cudnnBackendCreateDescriptor")
    SYM(beDestroy, "cudnnBackendDestroyDescriptor")
    SYM(beFinalize, "cudnnBackendFinalize")
    SYM(beSet, "cudnnBackendSetAttribute")
    SYM(beGet, "cudnnBackendGetAttribute")
    SYM(beExecute, "cudnnBackendExecute")
#undef SYM
    *(void **)&a->getLastErrorString = dlsym(a->lib, "cudnnGetLastErrorString");
    if (a->getVersion() < 90000) {
        say(why, n, "libcudnn is version %zu: the fused attention needs cuDNN 9", a->getVersion());
        return false;
    }
    return true;
}

/* ---------------------------------------------------------------- graphs */

/* One graph under construction: every descriptor made is kept (and destroyed with it); the
 * first failing call is remembered with what it was doing, and later calls do nothing. */
struct Graph {
    const CuDnnApi *a;
    std::vector<cudnnBackendDescriptor_t> all, ops;
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    char where[160] = "";
    int64_t next_uid = 1000; /* virtual tensors; the real ones have small fixed ids */
    explicit Graph(const CuDnnApi *api) : a(api) {}
    ~Graph() {
        for (size_t i = all.size(); i-- > 0;) a->beDestroy(all[i]);
    }
    bool ok() const { return st == CUDNN_STATUS_SUCCESS; }
    void fail(cudnnStatus_t s, const char *what) {
        if (!ok() || s == CUDNN_STATUS_SUCCESS) return;
        st = s;
        snprintf(where, sizeof where, "%s", what);
    }
    cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t t, const char *what) {
        cudnnBackendDescriptor_t d = nullptr;
        if (!ok()) return nullptr;
        fail(a->beCreate(t, &d), what);
        if (d) all.push_back(d);
        return d;
    }
    void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t n, cudnnBackendAttributeType_t t, int64_t cnt,
             const void *v, const char *what) {
        if (ok()) fail(a->beSet(d, n, t, cnt, v), what);
    }
    void finalize(cudnnBackendDescriptor_t d, const char *what) {
        if (ok()) fail(a->beFinalize(d), what);
    }
    void setd(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t n, cudnnBackendDescriptor_t v, const char *w) {
        set(d, n, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v, w);
    }

    /* a tensor of 4 dims; uid < 0: a virtual one with the next free id */
    cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t dt, const int64_t dims[4], const int64_t strides[4],
                                    bool by_value = false) {
        cudnnBackendDescriptor_t t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor");
        bool virt = uid < 0;
        if (virt) uid = next_uid++;
        int64_t align = 16;
        set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "tensor data type");
        set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims, "tensor dims");
        set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides, "tensor strides");
        set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid");
        set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
        set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt, "tensor virtual");
        if (by_value) set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, "tensor by value");
        finalize(t, "tensor");
        return t;
    }
    /* a virtual fp32 (or dt) tensor of dims, packed row-major */
    cudnnBackendDescriptor_t virt(const int64_t dims[4], cudnnDataType_t dt = CUDNN_DATA_FLOAT) {
        int64_t s[4] = {dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1};
        return tensor(-1, dt, dims, s);
    }
    /* y = mode(x[, b][, t]); axis >= 0 for GEN_INDEX */
    void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                   cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t t = nullptr, int64_t axis = -1,
                   cudnnDataType_t prec = CUDNN_DATA_FLOAT) {
        cudnnBackendDescriptor_t pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise");
        set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
        set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pointwise precision");
        if (axis >= 0) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
        finalize(pw, "pointwise");
        cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise op");
        setd(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw, "pointwise op desc");
        setd(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "pointwise x");
        if (b) setd(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, "pointwise b");
        setd(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "pointwise y");
        if (t) setd(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t, "pointwise t");
        finalize(op, "pointwise op");
        ops.push_back(op);
    }
    void reduce(cudnnReduceTensorOp_t how, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
        cudnnBackendDescriptor_t r = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction");
        cudnnDataType_t f = CUDNN_DATA_FLOAT;
        set(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how, "reduction operator");
        set(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f, "reduction type");
        finalize(r, "reduction");
        cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction op");
        setd(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, r, "reduction op desc");
        setd(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, "reduction x");
        setd(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, "reduction y");
        finalize(op, "reduction op");
        ops.push_back(op);
    }
    void matmul(cudnnBackendDescriptor_t A, cudnnBackendDescriptor_t B, cudnnBackendDescriptor_t C) {
        cudnnBackendDescriptor_t m = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul");
        cudnnDataType_t f = CUDNN_DATA_FLOAT;
        set(m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f, "matmul type");
        finalize(m, "matmul");
        cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul op");
        setd(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, A, "matmul a");
        setd(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, B, "matmul b");
        setd(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, C, "matmul c");
        setd(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, m, "matmul op desc");
        finalize(op, "matmul op");
        ops.push_back(op);
    }
    void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
        cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape op");
        setd(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x, "reshape x");
        setd(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y, "reshape y");
        finalize(op, "reshape op");
        ops.push_back(op);
    }
    /* the causal mask of S (B, H, T, T): entries above the diagonal become `lowest` (row and
     * column indices as int32, compared as booleans, the selection in fp32) */
    cudnnBackendDescriptor_t causal(cudnnBackendDescriptor_t S, const int64_t sd[4], cudnnBackendDescriptor_t lowest) {
        cudnnBackendDescriptor_t row = virt(sd, CUDNN_DATA_INT32), col = virt(sd, CUDNN_DATA_INT32);
        pointwise(CUDNN_POINTWISE_GEN_INDEX, S, nullptr, row, nullptr, 2);
        pointwise(CUDNN_POINTWISE_GEN_INDEX, S, nullptr, col, nullptr, 3);
        cudnnBackendDescriptor_t keep = virt(sd, CUDNN_DATA_BOOLEAN), out = virt(sd);
        pointwise(CUDNN_POINTWISE_CMP_GE, row, col, keep, nullptr, -1, CUDNN_DATA_BOOLEAN);
        pointwise(CUDNN_POINTWISE_BINARY_SELECT, S, lowest, out, keep);
        return out;
    }
};

/* the fixed tensor ids of both graphs */
enum : int64_t {
    U_Q = 1, U_K, U_V, U_O, U_STATS, U_SCALE, U_LOWEST, U_DO, U_DQ, U_DK, U_DV, U_DELTA, U_DQACC
};

/* A finalized execution plan (one shape, one direction) and its workspace bytes. */
/* The graph's descriptors (tensors, operations, the operation graph, the engine
 * configurations) are kept with it: the plan was finalized from them. */
struct CuPlan {
    int key[6] = {0, 0, 0, 0, 0, -1};
    cudnnBackendDescriptor_t plan = nullptr;
    std::vector<cudnnBackendDescriptor_t> keep;
    int64_t ws = 0;
};
static void plan_drop(const CuDnnApi &a, CuPlan *p) {
    if (p->plan) a.beDestroy(p->plan);
    for (size_t i = p->keep.size(); i-- > 0;) a.beDestroy(p->keep[i]);
    p->plan = nullptr, p->keep.clear(), p->ws = 0;
}

struct CuSdpa {
    CuDnnApi api;
    cudnnHandle_t h = nullptr;
    cudaStream_t stream = nullptr;
    enum { NPLAN = 8 };
    CuPlan plans[NPLAN]; /* forward and backward, by shape; replaced round robin */
    int next_plan = 0;
    /* by-value scalars: the scale, and the masked scores' value (the lowest float before
     * cuDNN 9.10, which prefers it in the softmax's mask; -inf from then on) */
    float scale_host = 1, lowest_host = -std::numeric_limits<float>::infinity();
};

static void status_why(const CuSdpa *s, cudnnStatus_t st, const char *what, char *why, size_t n) {
    char last[256] = "";
    if (s->api.getLastErrorString) s->api.getLastErrorString(last, sizeof last);
    say(why, n, "cuDNN %s: %s%s%s", what, s->api.getErrorString(st), last[0] ? ": " : "", last);
}

/* operation graph -> heuristics (mode A) -> the first engine configuration that
 * finalizes into a plan; the plan descriptor itself outlives the graph */
static bool finish_plan(CuSdpa *s, Graph &g, CuPlan *p, char *why, size_t n) {
    const CuDnnApi &a = s->api;
    if (!s->h) { /* cu_sdpa_selfcheck: the nodes only (an operation graph needs a handle, a handle a GPU) */
        if (!g.ok()) return status_why(s, g.st, g.where, why, n), false;
        p->ws = (int64_t)g.ops.size();
        return true;
    }
    cudnnBackendDescriptor_t og = g.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    g.set(og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, (int64_t)g.ops.size(), g.ops.data(),
          "operation graph ops");
    g.set(og, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &s->h, "operation graph handle");
    g.finalize(og, "operation graph (the pattern is not one cuDNN fuses)");
    cudnnBackendDescriptor_t heur = g.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    g.setd(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, og, "heuristics graph");
    g.set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode");
    g.finalize(heur, "heuristics");
    enum { NCFG = 8 };
    cudnnBackendDescriptor_t cfg[NCFG] = {};
    for (int i = 0; i < NCFG; i++) cfg[i] = g.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine configuration");
    int64_t got = 0;
    if (g.ok())
        g.fail(a.beGet(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, NCFG, &got, cfg),
               "heuristics results");
    if (!g.ok()) return status_why(s, g.st, g.where, why, n), false;
    if (got <= 0) return say(why, n, "cuDNN's heuristics offer no engine for this graph"), false;
    cudnnStatus_t last = CUDNN_STATUS_NOT_SUPPORTED;
    for (int64_t i = 0; i < got && i < NCFG; i++) {
        cudnnBackendDescriptor_t plan = nullptr;
        if ((last = a.beCreate(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan)) != CUDNN_STATUS_SUCCESS) break;
        last = a.beSet(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &s->h);
        if (last == CUDNN_STATUS_SUCCESS)
            last = a.beSet(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg[i]);
        if (last == CUDNN_STATUS_SUCCESS) last = a.beFinalize(plan);
        int64_t ws = 0, cnt = 0;
        if (last == CUDNN_STATUS_SUCCESS)
            last = a.beGet(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &cnt, &ws);
        if (last == CUDNN_STATUS_SUCCESS) {
            plan_drop(a, p);
            p->plan = plan, p->ws = ws;
            p->keep.swap(g.all); /* the graph's descriptors live as long as the plan */
            return true;
        }
        a.beDestroy(plan);
    }
    return status_why(s, last, "execution plan (no engine configuration finalizes)", why, n), false;
}

/* layouts: Q, O, dO, dQ (B, NH, T, hs) and K, V, dK, dV (B, NKV, T, hs) as our packed bf16
 * copies hold them, token-major (B, T, H, hs); the statistics (B, NH, T, 1) as lse */
static void qlayout(int64_t d[4], int64_t s[4], int B, int T, int H, int hs) {
    d[0] = B, d[1] = H, d[2] = T, d[3] = hs;
    s[0] = (int64_t)T * H * hs, s[1] = hs, s[2] = (int64_t)H * hs, s[3] = 1;
}
/* the same tensor seen transposed in its last two dims: (B, H, hs, T) */
static void tlayout(int64_t d[4], int64_t s[4], int B, int T, int H, int hs) {
    d[0] = B, d[1] = H, d[2] = hs, d[3] = T;
    s[0] = (int64_t)T * H * hs, s[1] = hs, s[2] = 1, s[3] = (int64_t)H * hs;
}

static bool build_forward(CuSdpa *s, CuPlan *p, int B, int T, int NH, int NKV, int hs, char *why, size_t n) {
    Graph g(&s->api);
    int64_t d[4], st[4], one[4] = {1, 1, 1, 1};
    qlayout(d, st, B, T, NH, hs);
    cudnnBackendDescriptor_t Q = g.tensor(U_Q, CUDNN_DATA_BFLOAT16, d, st), O = g.tensor(U_O, CUDNN_DATA_BFLOAT16, d, st);
    tlayout(d, st, B, T, NKV, hs);
    cudnnBackendDescriptor_t Kt = g.tensor(U_K, CUDNN_DATA_BFLOAT16, d, st);
    qlayout(d, st, B, T, NKV, hs);
    cudnnBackendDescriptor_t V = g.tensor(U_V, CUDNN_DATA_BFLOAT16, d, st);
    int64_t ld[4] = {B, NH, T, 1}, ls[4] = {(int64_t)NH * T, T, 1, 1};
    cudnnBackendDescriptor_t stats = g.tensor(U_STATS, CUDNN_DATA_FLOAT, ld, ls);
    cudnnBackendDescriptor_t scale = g.tensor(U_SCALE, CUDNN_DATA_FLOAT, one, one, true);
    cudnnBackendDescriptor_t lowest = g.tensor(U_LOWEST, CUDNN_DATA_FLOAT, one, one, true);
    int64_t sd[4] = {B, NH, T, T};
    cudnnBackendDescriptor_t S = g.virt(sd), Ss = g.virt(sd);
    g.matmul(Q, Kt, S);
    g.pointwise(CUDNN_POINTWISE_MUL, S, scale, Ss);
    cudnnBackendDescriptor_t Sm = g.causal(Ss, sd, lowest);
    cudnnBackendDescriptor_t mx = g.virt(ld), sub = g.virt(sd), ex = g.virt(sd), sum = g.virt(ld), lg = g.virt(ld);
    cudnnBackendDescriptor_t P = g.virt(sd, CUDNN_DATA_BFLOAT16); /* the second matmul's A in the i/o type */
    g.reduce(CUDNN_REDUCE_TENSOR_MAX, Sm, mx);
    g.pointwise(CUDNN_POINTWISE_SUB, Sm, mx, sub);
    g.pointwise(CUDNN_POINTWISE_EXP, sub, nullptr, ex);
    g.reduce(CUDNN_REDUCE_TENSOR_ADD, ex, sum);
    g.pointwise(CUDNN_POINTWISE_LOG, sum, nullptr, lg);
    g.pointwise(CUDNN_POINTWISE_ADD, mx, lg, stats);
    g.pointwise(CUDNN_POINTWISE_DIV, ex, sum, P);
    g.matmul(P, V, O);
    return finish_plan(s, g, p, why, n);
}

static bool build_backward(CuSdpa *s, CuPlan *p, int B, int T, int NH, int NKV, int hs, char *why, size_t n) {
    Graph g(&s->api);
    int64_t d[4], st[4], one[4] = {1, 1, 1, 1};
    qlayout(d, st, B, T, NH, hs);
    cudnnBackendDescriptor_t Q = g.tensor(U_Q, CUDNN_DATA_BFLOAT16, d, st), O = g.tensor(U_O, CUDNN_DATA_BFLOAT16, d, st);
    cudnnBackendDescriptor_t dO = g.tensor(U_DO, CUDNN_DATA_BFLOAT16, d, st);
    cudnnBackendDescriptor_t dQ = g.tensor(U_DQ, CUDNN_DATA_BFLOAT16, d, st);
    int64_t od[4] = {B, NH, T, hs}, os[4] = {(int64_t)NH * T * hs, (int64_t)T * hs, hs, 1};
    cudnnBackendDescriptor_t dQacc = g.tensor(U_DQACC, CUDNN_DATA_FLOAT, od, os); /* (B, NH, T, hs) packed */
    tlayout(d, st, B, T, NKV, hs);
    cudnnBackendDescriptor_t Kt = g.tensor(U_K, CUDNN_DATA_BFLOAT16, d, st);
    cudnnBackendDescriptor_t Vt = g.tensor(U_V, CUDNN_DATA_BFLOAT16, d, st);
    qlayout(d, st, B, T, NKV, hs);
    cudnnBackendDescriptor_t K = g.tensor(-1, CUDNN_DATA_BFLOAT16, d, st); /* Kt seen as (B, NKV, T, hs) */
    cudnnBackendDescriptor_t dK = g.tensor(U_DK, CUDNN_DATA_BFLOAT16, d, st);
    cudnnBackendDescriptor_t dV = g.tensor(U_DV, CUDNN_DATA_BFLOAT16, d, st);
    int64_t ld[4] = {B, NH, T, 1}, ls[4] = {(int64_t)NH * T, T, 1, 1};
    cudnnBackendDescriptor_t stats = g.tensor(U_STATS, CUDNN_DATA_FLOAT, ld, ls);
    cudnnBackendDescriptor_t delta = g.tensor(U_DELTA, CUDNN_DATA_FLOAT, ld, ls);
    cudnnBackendDescriptor_t scale = g.tensor(U_SCALE, CUDNN_DATA_FLOAT, one, one, true);
    cudnnBackendDescriptor_t lowest = g.tensor(U_LOWEST, CUDNN_DATA_FLOAT, one, one, true);
    int64_t sd[4] = {B, NH, T, T};
    int64_t tsd[4] = {B, NH, T, T}, tss[4] = {(int64_t)NH * T * T, (int64_t)T * T, 1, T}; /* (kv, q): transposed */
    /* delta = rowsum(dO * O) */
    cudnnBackendDescriptor_t dOO = g.virt(od);
    g.pointwise(CUDNN_POINTWISE_MUL, dO, O, dOO);
    g.reduce(CUDNN_REDUCE_TENSOR_ADD, dOO, delta);
    /* P = exp(mask(Q K^T scale - lse)) */
    cudnnBackendDescriptor_t S = g.virt(sd), Ss = g.virt(sd), sub = g.virt(sd), P = g.virt(sd);
    g.matmul(Q, Kt, S);
    g.pointwise(CUDNN_POINTWISE_MUL, S, scale, Ss);
    g.pointwise(CUDNN_POINTWISE_SUB, Ss, stats, sub);
    cudnnBackendDescriptor_t subm = g.causal(sub, sd, lowest);
    g.pointwise(CUDNN_POINTWISE_EXP, subm, nullptr, P);
    /* dV = P^T dO; with grouped KV heads a matmul's batch dims are the larger of its
     * operands' (NH): dV and dK come as (B, NH, T, hs) and are summed over each group's
     * query heads into (B, NKV, T, hs). The transposes and the full-head products are in
     * the i/o type (bf16), as cuDNN's fused engines take them. */
    cudnnBackendDescriptor_t Pt = g.tensor(-1, CUDNN_DATA_BFLOAT16, tsd, tss);
    g.reshape(P, Pt);
    cudnnBackendDescriptor_t dVf = NH == NKV ? dV : g.tensor(-1, CUDNN_DATA_BFLOAT16, od, os);
    g.matmul(Pt, dO, dVf);
    if (dVf != dV) g.reduce(CUDNN_REDUCE_TENSOR_ADD, dVf, dV);
    /* dS = (dO V^T - delta) P scale */
    cudnnBackendDescriptor_t dP = g.virt(sd), dPm = g.virt(sd), dS0 = g.virt(sd), dS = g.virt(sd);
    g.matmul(dO, Vt, dP);
    g.pointwise(CUDNN_POINTWISE_SUB, dP, delta, dPm);
    g.pointwise(CUDNN_POINTWISE_MUL, dPm, P, dS0);
    g.pointwise(CUDNN_POINTWISE_MUL, dS0, scale, dS);
    /* dK = dS^T Q */
    cudnnBackendDescriptor_t dSt = g.tensor(-1, CUDNN_DATA_BFLOAT16, tsd, tss);
    g.reshape(dS, dSt);
    cudnnBackendDescriptor_t dKf = NH == NKV ? dK : g.tensor(-1, CUDNN_DATA_BFLOAT16, od, os);
    g.matmul(dSt, Q, dKf);
    if (dKf != dK) g.reduce(CUDNN_REDUCE_TENSOR_ADD, dKf, dK);
    /* dQ = dS K, through the fp32 accumulator */
    g.reshape(Kt, K);
    g.matmul(dS, K, dQacc);
    g.pointwise(CUDNN_POINTWISE_IDENTITY, dQacc, nullptr, dQ);
    return finish_plan(s, g, p, why, n);
}

static CuPlan *get_plan(CuSdpa *s, int dir, int B, int T, int NH, int NKV, int hs, char *why, size_t n) {
    int key[6] = {dir, B, T, NH, NKV, hs};
    for (CuPlan &p : s->plans)
        if (p.plan && !memcmp(p.key, key, sizeof key)) return &p;
    CuPlan *p = &s->plans[s->next_plan];
    s->next_plan = (s->next_plan + 1) % CuSdpa::NPLAN;
    plan_drop(s->api, p);
    memset(p->key, 0, sizeof p->key), p->key[5] = -1; /* invalid until built */
    bool ok = dir == 0 ? build_forward(s, p, B, T, NH, NKV, hs, why, n) : build_backward(s, p, B, T, NH, NKV, hs, why, n);
    if (!ok) return nullptr;
    memcpy(p->key, key, sizeof key);
    return p;
}

static bool execute(CuSdpa *s, CuPlan *p, int nt, const int64_t *uids, void **ptrs, void *ws, char *why, size_t n) {
    Graph g(&s->api);
    cudnnBackendDescriptor_t vp = g.make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variant pack");
    g.set(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, nt, uids, "variant pack ids");
    g.set(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, nt, ptrs, "variant pack pointers");
    g.set(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws, "variant pack workspace");
    g.finalize(vp, "variant pack");
    if (g.ok()) g.fail(s->api.beExecute(s->h, p->plan, vp), "execute");
    if (!g.ok()) return status_why(s, g.st, g.where, why, n), false;
    return true;
}

/* the fp32 <-> bf16 copies around cuDNN: kernels_sdpa_copy.cuh (checked under the emulation) */

static size_t up256(size_t b) { return (b + 255) & ~(size_t)255; }

/* scratch from the stream's pool; NULL (with why) when the pool has none */
static char *scratch(CuSdpa *s, size_t bytes, char *why, size_t n) {
    void *p = nullptr;
    cudaError_t e = cudaMallocAsync(&p, bytes, s->stream);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* an allocation failure is not the backend's error */
        say(why, n, "no %zu bytes of device scratch for cuDNN beside the arena (%s)", bytes, cudaGetErrorString(e));
        return nullptr;
    }
    return (char *)p;
}

/* ---------------------------------------------------------------- the entries */

int cu_sdpa_version(const CuSdpa *s) { return s && s->api.getVersion ? (int)s->api.getVersion() : 0; }

CuSdpa *cu_sdpa_open(cudaStream_t st, char *why, size_t n) {
    CuSdpa *s = new (std::nothrow) CuSdpa();
    if (!s) return say(why, n, "out of host memory"), nullptr;
    s->stream = st;
    if (!api_load(&s->api, why, n)) return cu_sdpa_close(s), nullptr;
    if (s->api.getVersion() < 91000) s->lowest_host = std::numeric_limits<float>::lowest();
    /* the scratch comes from the device's default pool every call: keep what it frees
     * (the default threshold 0 hands it back to the driver at every synchronisation, and
     * each step would allocate again); best effort */
    int dev = 0;
    cudaMemPool_t pool;
    if (cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetDefaultMemPool(&pool, dev) == cudaSuccess) {
        uint64_t keep = UINT64_MAX;
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    }
    cudaGetLastError();
    cudnnStatus_t e = s->api.create(&s->h);
    if (e == CUDNN_STATUS_SUCCESS) e = s->api.setStream(s->h, st);
    if (e != CUDNN_STATUS_SUCCESS) {
        status_why(s, e, "cudnnCreate", why, n);
        cu_sdpa_close(s);
        return nullptr;
    }
    return s;
}

void cu_sdpa_close(CuSdpa *s) {
    if (!s) return;
    for (CuPlan &p : s->plans)
        plan_drop(s->api, &p);
    if (s->h) s->api.destroy(s->h);
    if (s->api.lib) dlclose(s->api.lib);
    delete s;
}

int cu_sdpa_selfcheck(int B, int T, int NH, int NKV, int hs, int *nodes, char *why, size_t n) {
    CuSdpa *s = new (std::nothrow) CuSdpa();
    if (!s) return say(why, n, "out of host memory"), -1;
    int rc = 0;
    if (!api_load(&s->api, why, n)) rc = -1;
    for (int dir = 0; dir < 2 && rc == 0; dir++) {
        CuPlan p;
        char w[200] = "";
        bool ok = dir == 0 ? build_forward(s, &p, B, T, NH, NKV, hs, w, sizeof w)
                           : build_backward(s, &p, B, T, NH, NKV, hs, w, sizeof w);
        if (!ok) rc = 1, say(why, n, "%s graph: %s", dir ? "backward" : "forward", w);
        nodes[dir] = (int)p.ws;
    }
    cu_sdpa_close(s);
    return rc;
}

static bool shape_ok(int B, int T, int NH, int NKV, int hs, char *why, size_t n) {
    if (hs % 8 || hs > 256 || NKV <= 0 || NH % NKV)
        return say(why, n, "head size %d / heads %d over %d kv heads: cuDNN's fused attention wants a head size of a "
                   "multiple of 8 up to 256 and whole groups", hs, NH, NKV), false;
    (void)B, (void)T;
    return true;
}

int cu_sdpa_forward(CuSdpa *s, float *out, float *lse, const float *q, const float *k, const float *v, int ld, int B,
                    int T, int NH, int NKV, int hs, char *why, size_t n) {
    if (!shape_ok(B, T, NH, NKV, hs, why, n)) return 1;
    CuPlan *p = get_plan(s, 0, B, T, NH, NKV, hs, why, n);
    if (!p) return 1;
    size_t rows = (size_t)B * T, nq = rows * NH * hs, nk = rows * NKV * hs;
    size_t oq = 0, ok_ = oq + up256(nq * 2), ov = ok_ + up256(nk * 2), oo = ov + up256(nk * 2),
           ows = oo + up256(nq * 2), total = ows + up256((size_t)p->ws);
    char *m = scratch(s, total, why, n);
    if (!m) return 1;
    __nv_bfloat16 *bq = (__nv_bfloat16 *)(m + oq), *bk = (__nv_bfloat16 *)(m + ok_), *bv = (__nv_bfloat16 *)(m + ov),
                  *bo = (__nv_bfloat16 *)(m + oo);
    cu_sdpa_pack(bq, q, rows, NH, hs, ld, s->stream);
    cu_sdpa_pack(bk, k, rows, NKV, hs, ld, s->stream);
    cu_sdpa_pack(bv, v, rows, NKV, hs, ld, s->stream);
    s->scale_host = 1.0f / sqrtf((float)hs);
    int64_t uids[] = {U_Q, U_K, U_V, U_O, U_STATS, U_SCALE, U_LOWEST};
    void *ptrs[] = {bq, bk, bv, bo, lse, &s->scale_host, &s->lowest_host};
    bool ok = execute(s, p, 7, uids, ptrs, p->ws ? m + ows : nullptr, why, n);
    if (ok) cu_sdpa_unpack(out, bo, rows, NH, hs, NH * hs, 0, s->stream);
    cudaFreeAsync(m, s->stream);
    cudaError_t e = cudaGetLastError();
    if (ok && e != cudaSuccess) return say(why, n, "a copy kernel around cuDNN: %s", cudaGetErrorString(e)), 2;
    return ok ? 0 : 1;
}

int cu_sdpa_backward(CuSdpa *s, float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                     const float *v, const float *out, const float *lse, int ld, int B, int T, int NH, int NKV, int hs,
                     char *why, size_t n) {
    if (!shape_ok(B, T, NH, NKV, hs, why, n)) return 1;
    CuPlan *p = get_plan(s, 1, B, T, NH, NKV, hs, why, n);
    if (!p) return 1;
    size_t rows = (size_t)B * T, nq = rows * NH * hs, nk = rows * NKV * hs, nl = (size_t)B * NH * T;
    size_t o[12], at = 0;
    size_t sizes[11] = {nq * 2, nk * 2, nk * 2, nq * 2, nq * 2, nq * 2, nk * 2, nk * 2, nl * 4, nq * 4, (size_t)p->ws};
    for (int i = 0; i < 11; i++) o[i] = at, at += up256(sizes[i]);
    char *m = scratch(s, at, why, n);
    if (!m) return 1;
    __nv_bfloat16 *bq = (__nv_bfloat16 *)(m + o[0]), *bk = (__nv_bfloat16 *)(m + o[1]),
                  *bv = (__nv_bfloat16 *)(m + o[2]), *bo = (__nv_bfloat16 *)(m + o[3]),
                  *bdo = (__nv_bfloat16 *)(m + o[4]), *bdq = (__nv_bfloat16 *)(m + o[5]),
                  *bdk = (__nv_bfloat16 *)(m + o[6]), *bdv = (__nv_bfloat16 *)(m + o[7]);
    float *delta = (float *)(m + o[8]), *dqacc = (float *)(m + o[9]);
    int C = NH * hs;
    cu_sdpa_pack(bq, q, rows, NH, hs, ld, s->stream);
    cu_sdpa_pack(bk, k, rows, NKV, hs, ld, s->stream);
    cu_sdpa_pack(bv, v, rows, NKV, hs, ld, s->stream);
    cu_sdpa_pack(bo, out, rows, NH, hs, C, s->stream);
    cu_sdpa_pack(bdo, dout, rows, NH, hs, C, s->stream);
    cudaMemsetAsync(dqacc, 0, nq * 4, s->stream);
    s->scale_host = 1.0f / sqrtf((float)hs);
    int64_t uids[] = {U_Q, U_K, U_V, U_O, U_DO, U_STATS, U_SCALE, U_LOWEST, U_DQ, U_DK, U_DV, U_DELTA, U_DQACC};
    void *ptrs[] = {bq, bk, bv, bo, bdo, (void *)lse, &s->scale_host, &s->lowest_host, bdq, bdk, bdv, delta, dqacc};
    bool ok = execute(s, p, 13, uids, ptrs, p->ws ? m + o[10] : nullptr, why, n);
    if (ok) {
        cu_sdpa_unpack(dq, bdq, rows, NH, hs, ld, 1, s->stream);
        cu_sdpa_unpack(dk, bdk, rows, NKV, hs, ld, 1, s->stream);
        cu_sdpa_unpack(dv, bdv, rows, NKV, hs, ld, 1, s->stream);
    }
    cudaFreeAsync(m, s->stream);
    cudaError_t e = cudaGetLastError();
    if (ok && e != cudaSuccess) return say(why, n, "a copy kernel around cuDNN: %s", cudaGetErrorString(e)), 2;
    return ok ? 0 : 1;
}

#else /* no cudnn.h at build time: every call says so, and the backend runs its own kernels */

int cu_sdpa_version(const CuSdpa *) { return 0; }
CuSdpa *cu_sdpa_open(cudaStream_t, char *why, size_t n) {
    if (why && n) snprintf(why, n, "this strata was built without cuDNN (CMake found no cudnn.h)");
    return nullptr;
}
void cu_sdpa_close(CuSdpa *) {}
int cu_sdpa_selfcheck(int, int, int, int, int, int *, char *why, size_t n) {
    if (why && n) snprintf(why, n, "this strata was built without cuDNN (CMake found no cudnn.h)");
    return -1;
}
int cu_sdpa_forward(CuSdpa *, float *, float *, const float *, const float *, const float *, int, int, int, int, int,
                    int, char *, size_t) {
    return 1;
}
int cu_sdpa_backward(CuSdpa *, float *, float *, float *, const float *, const float *, const float *, const float *,
                     const float *, const float *, int, int, int, int, int, int, char *, size_t) {
    return 1;
}

#endif
