/* A mixture of experts' FFN in one call, in llama.cpp's order (build_moe_ffn).
 *
 * The router's product picks each row's experts and weights (route_row). The (row, slot)
 * pairs are then sorted by expert, stable by row, and each chosen expert runs as two works
 * of matmul.c (gate and up together, then down) over just the rows that chose it, reading
 * only its slices of the stacked tensors: a decode token reads its k experts and no other.
 * Every expert's works run in one parallel region, the threads taking chunks of all of
 * them, so both threads stay busy however few experts a token picks, and a layer costs one
 * fork and join for its experts instead of two per expert. A row's weighted outputs are
 * summed in slot order, each product rounded before its add (ggml's separate mul and add
 * nodes). Rows are independent in every step, so a row's result never depends on the rows
 * beside it: a speculative verify equals decoding, bit for bit.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* w * y + s must round the product before the add, as ggml's graph does */
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

/* ggml_clamp's floor on the sum of the chosen weights before they are divided by it */
#define WEIGHT_SUM_FLOOR 6.103515625e-5f
#define CHUNKS_PER_THREAD 4

/* the k largest of v[0..n), largest first, ties to the lower index (NaN never wins) */
static void top_k(const float *v, int64_t n, int64_t k, int32_t *ids) {
    for (int64_t j = 0; j < k; j++) {
        int64_t best = -1;
        for (int64_t e = 0; e < n; e++) {
            int taken = 0;
            for (int64_t i = 0; i < j && !taken; i++) taken = ids[i] == e;
            if (taken) continue;
            if (best < 0 || v[e] > v[best] || (v[best] != v[best] && v[e] == v[e])) best = e;
        }
        ids[j] = (int32_t)best;
    }
}

/* ggml's soft_max on the CPU: e^(x - max), the sum in double, times 1/sum */
static void softmax(float *v, int64_t n) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) mx = v[i] > mx ? v[i] : mx;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        v[i] = expf(v[i] - mx);
        sum += v[i];
    }
    const float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) v[i] *= inv;
}

/* One row's experts and weights from its router logits (overwritten). softmax_norm
 * (qwen3moe): a softmax over every expert, the k most probable, their weights divided by
 * their sum. topk_softmax (gpt-oss): the k largest logits, a softmax over those alone. */
static void route_row(int gating, float *logits, int64_t n_expert, int64_t k, int32_t *ids, float *w) {
    if (gating == LI_ROUTE_TOPK_SOFTMAX) {
        top_k(logits, n_expert, k, ids);
        for (int64_t j = 0; j < k; j++) w[j] = logits[ids[j]];
        softmax(w, k);
        return;
    }
    softmax(logits, n_expert);
    top_k(logits, n_expert, k, ids);
    double sum = 0.0;
    for (int64_t j = 0; j < k; j++) sum += w[j] = logits[ids[j]];
    const float total = (float)sum > WEIGHT_SUM_FLOOR ? (float)sum : WEIGHT_SUM_FLOOR;
    for (int64_t j = 0; j < k; j++) w[j] /= total;
}

static int grow(li_buffer *b, int64_t bytes) {
    if (bytes <= b->bytes) return 0;
    free(b->base);
    b->base = aligned_alloc(64, (size_t)((bytes + 63) & ~63));
    b->bytes = b->base ? bytes : 0;
    return b->base ? 0 : 4;
}

int li_moe_size(void) { return (int)sizeof(li_moe); }

void li_moe_scratch_free(li_moe_scratch *s) {
    free(s->fixed.base);
    free(s->works.base);
    memset(s, 0, sizeof *s);
}

/* a call's arrays, carved from the fixed scratch */
typedef struct {
    float *logits, *weights;      /* [n][n_expert], [n][k] */
    int32_t *ids, *where;         /* [n][k]: each pair's expert, and its place in expert order */
    int64_t *start, *fill;        /* [n_expert + 1]: each expert's first place; a cursor each */
    int32_t *rows;                /* per place: the row it came from */
    float *xs, *gate, *up, *ys;   /* per place: the input row, gate/up outputs, down output */
    uint8_t *works;               /* 2 per chosen expert: its gate/up, then its down */
    float **outs;                 /* the works' output pointers: 3 per chosen expert */
    int32_t *chosen;              /* the experts with rows, ascending */
    int64_t *scratch, *amx;       /* each work's scratch bytes, and AMX bytes per thread */
} moe_call;

static int64_t up64(int64_t b) { return (b + 63) & ~(int64_t)63; }

static int carve_call(const li_moe *m, int64_t n, moe_call *c) {
    const int64_t E = m->n_expert, P = n * m->n_used, d = m->gate.k, f = m->gate.rows, ws = li_work_size();
    const int64_t sizes[] = {n * E * 4,  P * 4,     P * 4,     P * 4,     (E + 1) * 8,   (E + 1) * 8,
                             P * 4,      P * d * 4, P * f * 4, P * f * 4, P * d * 4,     2 * E * ws,
                             3 * E * (int64_t)sizeof(float *), E * 4, 2 * E * 8, 2 * E * 8};
    void **parts[] = {(void **)&c->logits, (void **)&c->weights, (void **)&c->ids,   (void **)&c->where,
                      (void **)&c->start,  (void **)&c->fill,    (void **)&c->rows,  (void **)&c->xs,
                      (void **)&c->gate,   (void **)&c->up,      (void **)&c->ys,    (void **)&c->works,
                      (void **)&c->outs,   (void **)&c->chosen,  (void **)&c->scratch, (void **)&c->amx};
    int64_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) total += up64(sizes[i]);
    if (grow(&m->scratch->fixed, total)) return 4;
    uint8_t *p = m->scratch->fixed.base;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        *parts[i] = p;
        p += up64(sizes[i]);
    }
    return 0;
}

/* Routes every row and sorts the (row, slot) pairs by expert (a counting sort, rows
 * ascending within each expert). Returns how many experts were chosen, or a negative error. */
static int route_all(const li_moe *m, const float *x, int64_t n, moe_call *c) {
    const int64_t E = m->n_expert, K = m->n_used, P = n * K;
    const int rc = li_matmul_op(m->router, x, (int)n, c->logits, 0, 0, 0); /* a prompt row routes as alone */
    if (rc) return -rc;
    for (int64_t r = 0; r < n; r++) {
        float *l = c->logits + r * E;
        if (m->router_bias)
            for (int64_t e = 0; e < E; e++) l[e] += m->router_bias[e];
        route_row(m->gating, l, E, K, c->ids + r * K, c->weights + r * K);
    }
    memset(c->start, 0, (size_t)(E + 1) * 8);
    for (int64_t p = 0; p < P; p++) c->start[c->ids[p] + 1]++;
    int chosen = 0;
    for (int64_t e = 0; e < E; e++) {
        if (c->start[e + 1]) c->chosen[chosen++] = (int32_t)e;
        c->start[e + 1] += c->start[e];
        c->fill[e] = c->start[e];
    }
    for (int64_t p = 0; p < P; p++) {
        const int64_t at = c->fill[c->ids[p]]++;
        c->where[p] = (int32_t)at;
        c->rows[at] = (int32_t)(p / K);
    }
    return chosen;
}

static const uint8_t *slice(const uint8_t *base, int64_t stride, int e) { return base ? base + e * stride : 0; }

/* Sets up each chosen expert's two works, its gate/up over its rows' inputs (works
 * [0, chosen)) and its down over their activations (works [chosen, 2 chosen)), and their
 * scratch; returns 0 or an error. */
static int plan_works(const li_moe *m, int chosen, moe_call *c, int nthreads) {
    const int64_t d = m->gate.k, f = m->gate.rows, ws = li_work_size();
    int64_t total = 0, amx = 0;
    for (int i = 0; i < chosen; i++) {
        const int e = c->chosen[i];
        const int64_t at = c->start[e], count = c->start[e + 1] - at;
        const int64_t fast = 0; /* see li_moe_ffn */
        float **outs = c->outs + 3 * i;
        outs[0] = c->gate + at * f;
        outs[1] = c->up + at * f;
        outs[2] = c->ys + at * d;
        const int gu_types[2] = {m->gate.type, m->up.type};
        const void *gu_w[2] = {slice(m->gate.w, m->gate.w_stride, e), slice(m->up.w, m->up.w_stride, e)};
        const void *gu_p[2] = {slice(m->gate.packed, m->gate.packed_stride, e),
                               slice(m->up.packed, m->up.packed_stride, e)};
        const int64_t gu_rows[2] = {f, m->up.rows};
        int rc = li_work_init(c->works + i * ws, 2, gu_types, gu_w, gu_p, gu_rows, d, c->xs + at * d, count, outs,
                              fast, &c->scratch[i], &c->amx[i]);
        const int dn_type = m->down.type;
        const void *dn_w = slice(m->down.w, m->down.w_stride, e), *dn_p = slice(m->down.packed, m->down.packed_stride, e);
        const int64_t dn_rows = m->down.rows;
        if (!rc)
            rc = li_work_init(c->works + (chosen + i) * ws, 1, &dn_type, &dn_w, &dn_p, &dn_rows, m->down.k,
                              c->gate + at * f, count, outs + 2, fast, &c->scratch[chosen + i], &c->amx[chosen + i]);
        if (rc) return rc;
    }
    for (int i = 0; i < 2 * chosen; i++) {
        total += up64(c->scratch[i]);
        amx = c->amx[i] > amx ? c->amx[i] : amx;
    }
    if (grow(&m->scratch->works, total + nthreads * amx)) return 4;
    uint8_t *p = m->scratch->works.base, *amx_base = p + total;
    for (int i = 0; i < 2 * chosen; i++) {
        li_work_carve(c->works + i * ws, p, amx_base, amx);
        p += up64(c->scratch[i]);
    }
    return 0;
}

/* part t of T of [0, count) */
static int64_t part(int64_t count, int t, int T) { return count * t / T; }

/* thread t of T: each place's input row */
static void gather(const li_moe *m, const float *x, int64_t places, const moe_call *c, int t, int T) {
    const int64_t d = m->gate.k;
    for (int64_t p = part(places, t, T); p < part(places, t + 1, T); p++)
        memcpy(c->xs + p * d, x + (int64_t)c->rows[p] * d, (size_t)d * 4);
}

/* thread t of T: each place's gate and up biases, then the activation, into gate */
static void activate(const li_moe *m, int chosen, const moe_call *c, int t, int T) {
    const int64_t f = m->gate.rows, p0 = part(c->start[m->n_expert], t, T), p1 = part(c->start[m->n_expert], t + 1, T);
    for (int i = 0; i < chosen; i++) {
        const int e = c->chosen[i];
        const int64_t a = c->start[e] > p0 ? c->start[e] : p0, b = c->start[e + 1] < p1 ? c->start[e + 1] : p1;
        for (int64_t p = a; p < b; p++) {
            float *g = c->gate + p * f, *u = c->up + p * f;
            if (m->gate.bias)
                for (int64_t j = 0; j < f; j++) g[j] += m->gate.bias[e * f + j];
            if (m->up.bias)
                for (int64_t j = 0; j < f; j++) u[j] += m->up.bias[e * f + j];
            li_gated_serial(m->activation, g, u, f);
        }
    }
}

/* thread t of T: out[r] = w0 (y0 + b) + w1 (y1 + b) + ..., slot after slot */
static void combine(const li_moe *m, int64_t n, float *out, const moe_call *c, int t, int T) {
    const int64_t d = m->down.rows, K = m->n_used;
    for (int64_t r = part(n, t, T); r < part(n, t + 1, T); r++) {
        float *o = out + r * d;
        for (int64_t j = 0; j < K; j++) {
            const float *y = c->ys + (int64_t)c->where[r * K + j] * d, w = c->weights[r * K + j];
            const float *b = m->down.bias ? m->down.bias + (int64_t)c->ids[r * K + j] * d : 0;
            for (int64_t i = 0; i < d; i++) {
                const float v = (b ? y[i] + b[i] : y[i]) * w;
                o[i] = j ? o[i] + v : v;
            }
        }
    }
}

/* Each work's parts: CHUNKS_PER_THREAD a thread over all the works together, so that a
 * thread streams long runs of one expert's rows (a stream that starts over every few
 * hundred rows waits for the prefetcher each time), and at least one a work. */
static int chunks_per_work(int works, int T) {
    const int c = (CHUNKS_PER_THREAD * T + works - 1) / works;
    return c > 0 ? c : 1;
}

/* thread t of T's share of the experts, the others alongside (barriers between steps) */
static void run_experts(const li_moe *m, const float *x, int64_t n, float *out, int chosen, const moe_call *c,
                        int *next, int t, int T) {
    const int64_t places = c->start[m->n_expert], ws = li_work_size();
    gather(m, x, places, c, t, T);
#pragma omp barrier
    li_works_quantize(c->works, chosen, t, T);
#pragma omp barrier
    li_works_dots(c->works, chosen, chunks_per_work(chosen, T), &next[0], t);
#pragma omp barrier
    activate(m, chosen, c, t, T);
#pragma omp barrier
    li_works_quantize(c->works + chosen * ws, chosen, t, T);
#pragma omp barrier
    li_works_dots(c->works + chosen * ws, chosen, chunks_per_work(chosen, T), &next[1], t);
#pragma omp barrier
    combine(m, n, out, c, t, T);
}

/* out [n][down.rows] = the experts' FFN of x [n][gate.k]. Returns 0, or matmul.c's error
 * codes. There is no n_fast: every row goes through the row dots or the panels, never the
 * AMX fast path, which reads the file's layout; so the experts' mapped pages can go once
 * packed (c_kernels.py) and the experts, most of the model, are in memory once. */
int li_moe_ffn(const li_moe *m, const float *x, int64_t n, float *out) {
    if (!m || !m->scratch || !x || !out || n < 0 || m->n_used < 1 || m->n_used > m->n_expert) return 3;
    if (m->gate.rows != m->up.rows || m->down.k != m->gate.rows || m->up.k != m->gate.k) return 3;
    if (n == 0) return 0;
    moe_call c;
    int rc = carve_call(m, n, &c);
    if (rc) return rc;
    const int chosen = route_all(m, x, n, &c);
    if (chosen < 0) return -chosen;
    int nthreads = m->nthreads && *m->nthreads > 1 ? *m->nthreads : 1;
    if ((rc = plan_works(m, chosen, &c, nthreads))) return rc;
    int next[2] = {0, 0};
#ifdef _OPENMP
    if (nthreads > 1) {
#pragma omp parallel num_threads(nthreads)
        run_experts(m, x, n, out, chosen, &c, next, omp_get_thread_num(), omp_get_num_threads());
        return 0;
    }
#endif
    run_experts(m, x, n, out, chosen, &c, next, 0, 1);
    return 0;
}
