/* The small per-token operations of a llama-family layer: RMSNorm, RoPE, attention over
 * the KV cache, SwiGLU. Each is tiny on its own; as numpy calls they cost more than the
 * matmuls, so each is one C call here. Plain loops, with AVX2 for the softmax; attention's
 * reads of the cache, in each of its types, are in kvcache.c.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "vec16.h"
#ifdef _OPENMP
#include <omp.h>
#endif

void li_rms_norm(const float *x, const float *w, float *out, int64_t n, int64_t d, float eps) {
    for (int64_t i = 0; i < n; i++) {
        const float *xi = x + i * d;
        float *oi = out + i * d;
        double ss = 0.0; /* as ggml: float squares, summed in double, the rest in float */
        for (int64_t j = 0; j < d; j++) ss += (double)(xi[j] * xi[j]);
        const float mean = (float)(ss / (double)d);
        const float scale = 1.0f / sqrtf(mean + eps);
        for (int64_t j = 0; j < d; j++) oi[j] = xi[j] * scale * w[j];
    }
}

/* x: [n, heads, head_dim], rotated in place; cos/sin: [n_ctx, dims/2] tables. */
void li_rope(float *x, int64_t n, int64_t heads, int64_t head_dim, const int32_t *pos,
             const float *cos_t, const float *sin_t, int64_t dims, int neox) {
    const int64_t half = dims / 2;
    for (int64_t i = 0; i < n; i++) {
        const float *c = cos_t + (int64_t)pos[i] * half, *s = sin_t + (int64_t)pos[i] * half;
        for (int64_t h = 0; h < heads; h++) {
            float *v = x + (i * heads + h) * head_dim;
            for (int64_t j = 0; j < half; j++) {
                const int64_t a = neox ? j : 2 * j, b = neox ? j + half : 2 * j + 1;
                const float x0 = v[a], x1 = v[b];
                v[a] = x0 * c[j] - x1 * s[j];
                v[b] = x0 * s[j] + x1 * c[j];
            }
        }
    }
}

/* e^x for x <= 0, within about 1 ulp, in straight-line code the compiler vectorises
 * (libm's expf is a call per value, and the softmax makes one per cached position).
 * Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, then a degree-7 Taylor polynomial. */
static inline float exp_nonpositive(float x) {
    x = x < -87.0f ? -87.0f : x;
    const float n = rintf(x * 1.44269504f);
    const float r = (x - n * 0.693145752f) - n * 1.42860677e-6f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return p * scale;
}

/* gate = silu(gate) * up = g / (1 + e^-g) * up, with e^-|g| from exp_nonpositive (the loop
 * vectorises; libm's expf is a call per value): for g < 0, g e^g / (1 + e^g). */
static void swiglu_run(float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float g = gate[i], t = exp_nonpositive(-fabsf(g));
        gate[i] = (g >= 0.0f ? g : g * t) / (1.0f + t) * up[i];
    }
}

/* gate = gelu(gate) * up, GELU's tanh approximation as ggml's CPU build evaluates it: the
 * input rounded to fp16, GELU of that in float, the result rounded to fp16 (ggml looks it
 * up in a table of every fp16 value); 0 at or below -10 and the input itself from 10 up. */
static void geglu_run(float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float x = gate[i];
        float g;
        if (x <= -10.0f) g = 0.0f;
        else if (x >= 10.0f) g = x;
        else {
            const float h = li_fp16_to_fp32(li_fp32_to_fp16(x));
            g = li_fp16_to_fp32(li_fp32_to_fp16(0.5f * h * (1.0f + tanhf(0.79788456080286535587989211986876f * h * (1.0f + 0.044715f * h * h)))));
        }
        gate[i] = g * up[i];
    }
}

/* gate = swiglu_oai(gate, up), gpt-oss's clamped SwiGLU as ggml computes it (alpha 1.702,
 * limit 7): x = min(g, 7), y = clamp(u, -7, 7), x / (1 + e^(-1.702 x)) * (y + 1). libm's
 * expf, as ggml's: for very negative x the quotient goes to -0 through an infinite e^. */
static void swiglu_oai_run(float *gate, const float *up, int64_t n) {
    const float alpha = 1.702f, limit = 7.0f;
    for (int64_t i = 0; i < n; i++) {
        const float x = gate[i] < limit ? gate[i] : limit;
        const float y = up[i] < -limit ? -limit : up[i] > limit ? limit : up[i];
        gate[i] = x / (1.0f + expf(alpha * -x)) * (y + 1.0f);
    }
}

/* One thread's gated activation (LI_ACT_*) over n values, for callers already inside a
 * parallel region (moe.c): the same arithmetic as li_swiglu / li_geglu. */
void li_gated_serial(int act, float *gate, const float *up, int64_t n) {
    if (act == LI_ACT_GEGLU) geglu_run(gate, up, n);
    else if (act == LI_ACT_SWIGLU_OAI) swiglu_oai_run(gate, up, n);
    else swiglu_run(gate, up, n);
}

/* A gated activation over n values, in chunks shared by the threads where n is large. */
static void gated(void (*run)(float *, const float *, int64_t), float *gate, const float *up, int64_t n, int nthreads) {
    const int64_t chunk = 4096;
    if (n < 16 * chunk || nthreads < 1) nthreads = 1;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1)
    for (int64_t c = 0; c < n; c += chunk) run(gate + c, up + c, c + chunk < n ? chunk : n - c);
}

void li_swiglu(float *gate, const float *up, int64_t n, int nthreads) { gated(swiglu_run, gate, up, n, nthreads); }
void li_geglu(float *gate, const float *up, int64_t n, int nthreads) { gated(geglu_run, gate, up, n, nthreads); }


/* Attention runs tiled, as flash attention does. A task takes a tile of query rows (the g
 * query heads of one kv head in each) and walks that head's cached positions in blocks of
 * KEY_BLOCK; each block is prepared once (kvcache.c: f16 widened, q4_0 unpacked) and read by
 * every query of the tile while it sits in L1. Each query keeps a running max, the sum of
 * e^(s - max) and the unnormalised output (the online softmax). The cache is so read once
 * per tile, not once per row: a 512-row prefill chunk reads it 16 times, not 512.
 *
 * A row's result must not depend on the rows beside it, bit for bit: speculative decoding
 * verifies drafts as a batch and must get what decode would have. So block boundaries are
 * fixed positions (0, KEY_BLOCK, 2*KEY_BLOCK, ...), each query meets its blocks in order
 * through the same code whatever the tile, and decode is a tile of one row. */
#define KEY_BLOCK 32
#define ROW_TILE 32     /* rows of a tile at most */
/* A row's positions are attended in spans of SPAN, each from a fresh running max, and the
 * spans' results folded in position order (merge_span): so the threads can share one row's
 * long context (flash-decoding), and a row gets the same bits whoever ran its spans. */
#define SPAN 1024
#define TILE_QUERIES 256 /* and query heads: their outputs stay in L2 */

/* Whether any of s[0..n) (n a multiple of LI_KV_LANES) is above mx, and if so the largest in
 * *bm. The lanes' maxima are compared with mx at once, and only reduced to one when one is
 * above it: after a context's first blocks the running max seldom rises. */
static int block_max_above(const float *s, int64_t n, float mx, float *bm) {
    float m = -INFINITY;
    int64_t j = 0;
#if defined(__AVX512F__)
    __m512 m16 = _mm512_set1_ps(-INFINITY);
    for (; j + 16 <= n; j += 16) m16 = _mm512_max_ps(m16, _mm512_loadu_ps(s + j));
    if (!_mm512_cmp_ps_mask(m16, _mm512_set1_ps(mx), _CMP_GT_OQ) && j == n) return 0;
    m = _mm512_reduce_max_ps(m16);
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 m8 = _mm256_set1_ps(-INFINITY);
    for (; j + 8 <= n; j += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(s + j));
    if (!_mm256_movemask_ps(_mm256_cmp_ps(m8, _mm256_set1_ps(mx), _CMP_GT_OQ)) && j == n) return 0;
    float lanes[8];
    _mm256_storeu_ps(lanes, m8);
    for (int l = 0; l < 8; l++) m = lanes[l] > m ? lanes[l] : m;
#endif
    for (; j < n; j++) m = s[j] > m ? s[j] : m;
    *bm = m;
    return m > mx;
}

#if defined(__AVX512F__)
/* exp_shifted sixteen at a time, for j < n rounded down to 16; returns where it stopped */
static int64_t exp_shifted16(float *s, int64_t n, float mx) {
    const __m512 vmx = _mm512_set1_ps(mx), lo = _mm512_set1_ps(-87.0f), log2e = _mm512_set1_ps(1.44269504f);
    const __m512 ln2_hi = _mm512_set1_ps(0.693145752f), ln2_lo = _mm512_set1_ps(1.42860677e-6f);
    const float c[8] = {1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f};
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512 x = _mm512_max_ps(_mm512_sub_ps(_mm512_loadu_ps(s + j), vmx), lo);
        const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m512 r = _mm512_sub_ps(_mm512_sub_ps(x, _mm512_mul_ps(k, ln2_hi)), _mm512_mul_ps(k, ln2_lo));
        __m512 p = _mm512_set1_ps(c[0]);
        for (int i = 1; i < 8; i++) p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(c[i]));
        const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23);
        _mm512_storeu_ps(s + j, _mm512_mul_ps(p, _mm512_castsi512_ps(bits)));
    }
    return j;
}
#endif

/* s[j] = e^(s[j] - mx), for j < n (a multiple of LI_KV_LANES: all of it in vectors); each
 * lane's operations are exp_nonpositive's, so every width gives the same values */
static void exp_shifted(float *s, int64_t n, float mx) {
    int64_t j = 0;
#if defined(__AVX512F__)
    j = exp_shifted16(s, n, mx);
#endif
#if defined(__AVX2__) && defined(__FMA__)
    /* exp_nonpositive, eight at a time */
    const __m256 vmx = _mm256_set1_ps(mx), lo = _mm256_set1_ps(-87.0f), log2e = _mm256_set1_ps(1.44269504f);
    const __m256 ln2_hi = _mm256_set1_ps(0.693145752f), ln2_lo = _mm256_set1_ps(1.42860677e-6f);
    const float c[8] = {1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f};
    for (; j + 8 <= n; j += 8) {
        __m256 x = _mm256_max_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j), vmx), lo);
        const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256 r = _mm256_sub_ps(_mm256_sub_ps(x, _mm256_mul_ps(k, ln2_hi)), _mm256_mul_ps(k, ln2_lo));
        __m256 p = _mm256_set1_ps(c[0]);
        for (int i = 1; i < 8; i++) p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(c[i]));
        const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
        _mm256_storeu_ps(s + j, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
    }
#endif
    for (; j < n; j++) s[j] = exp_nonpositive(s[j] - mx);
}

/* The values of one block met by a row's g query heads at once: o_h += sum_{j < n} p_h[j] v_j
 * for every head h. Each v_j is loaded (and widened: f16 and q8_0 rows are read in place) once
 * for all the heads, and the heads' sums are independent chains, so the adds overlap instead
 * of waiting on each other. Every output value gets one fused multiply-add per j, in j order,
 * whatever the heads beside it: a head's result does not depend on its group. */
#ifdef LP_512
#define HEAD_GROUP 8 /* heads sharing one pass over the values: their sums stay in registers */
#define HEAD_WIDTH 2 /* vectors of 16 values per head in a pass */
#else
#define HEAD_GROUP 4
#define HEAD_WIDTH 1
#endif

/* How a block's value rows are read: floats (q4_0's, widened into a buffer first), or the
 * cache's f16 or q8_0 rows in place (a q8_0 value: d*q, one float multiply, as widened ones). */
enum value_form { V_FLOAT, V_F16, V_Q8 };

/* The value rows of a block, vs bytes apart, each line read asking for the one `ahead` bytes on. */
struct value_rows {
    const uint8_t *v;
    int64_t vs, ahead;
    enum value_form form;
};

static inline float value_at(const struct value_rows *r, int64_t j, int64_t e) {
    const uint8_t *row = r->v + j * r->vs;
    if (r->form == V_F16) return li_fp16_to_fp32(lp_u16(row + 2 * e));
    if (r->form == V_Q8) {
        const uint8_t *blk = row + e / 32 * 34;
        return li_fp16_to_fp32(lp_u16(blk)) * (float)(int8_t)blk[2 + e % 32];
    }
    float x;
    memcpy(&x, row + 4 * e, 4);
    return x;
}

#ifdef LP_R
/* values [at, at + 16) of an f16 or float row */
LP_INLINE vf value_lanes(const uint8_t *row, const enum value_form form, int64_t at) {
    return form == V_F16 ? vf_f16(row + 2 * at) : vf_f32(row + 4 * at);
}

/* heads [0, gh) of p (ps floats apart) into o (hd apart), values [c, c + 16w) of each row */
LP_INLINE void heads_lanes(const float *p, int64_t ps, const struct value_rows *r, const enum value_form form, int64_t n, int64_t hd,
                           int64_t c, float *o, const int gh, const int w) {
    vf acc[HEAD_GROUP * HEAD_WIDTH];
    for (int h = 0; h < gh; h++)
        for (int i = 0; i < w; i++) acc[h * w + i] = vf_f32((const uint8_t *)(o + h * hd + c + 16 * i));
    const int64_t line = form == V_F16 ? 2 * c : form == V_Q8 ? c / 32 * 34 : 4 * c; /* where a pass starts in a row */
    for (int64_t j = 0; j < n; j++) {
        const uint8_t *row = r->v + j * r->vs;
        vf vj[HEAD_WIDTH];
        if (form == V_Q8) { /* a pass lies within one block of a row: its scale read once */
            const vf d = vf_set1(li_fp16_to_fp32(lp_u16(row + line)));
            for (int i = 0; i < w; i++) vj[i] = vf_mul(d, vf_cvt(vi_cvt_i8(row + line + 2 + c % 32 + 16 * i)));
        } else
            for (int i = 0; i < w; i++) vj[i] = value_lanes(row, form, c + 16 * i);
        li_kv_prefetch(row + line, r->ahead); /* a pass reads at most a line of a row */
        for (int h = 0; h < gh; h++) {
            const vf pj = vf_set1(p[h * ps + j]);
            for (int i = 0; i < w; i++) acc[h * w + i] = vf_fmadd(pj, vj[i], acc[h * w + i]);
        }
    }
    for (int h = 0; h < gh; h++)
        for (int i = 0; i < w; i++) vf_store(o + h * hd + c + 16 * i, acc[h * w + i]);
}

static void heads(const float *p, int64_t ps, const struct value_rows *r, int64_t n, int64_t hd, int64_t c, float *o, int gh, int w) {
#define HEADS_AS(G, F) \
    w == HEAD_WIDTH ? heads_lanes(p, ps, r, F, n, hd, c, o, G, HEAD_WIDTH) : heads_lanes(p, ps, r, F, n, hd, c, o, G, 1)
#define HEADS(G) \
    case G: r->form == V_F16 ? HEADS_AS(G, V_F16) : r->form == V_Q8 ? HEADS_AS(G, V_Q8) : HEADS_AS(G, V_FLOAT); break;
#ifdef LP_512
    switch (gh) { HEADS(1) HEADS(2) HEADS(3) HEADS(4) HEADS(5) HEADS(6) HEADS(7) HEADS(8) }
#else
    switch (gh) { HEADS(1) HEADS(2) HEADS(3) HEADS(4) }
#endif
#undef HEADS
#undef HEADS_AS
}
#endif

/* o_h += sum_{j < n} p_h[j] v_j for the g heads: p_h at p + h*ps, o_h at o + h*hd; v_j the
 * rows of r. */
static void accumulate_heads(const float *p, int64_t ps, const struct value_rows *r, int64_t n, int64_t hd, float *o, int64_t g) {
#ifdef LP_R
    if (hd % 16 == 0) {
        for (int64_t h0 = 0; h0 < g; h0 += HEAD_GROUP) {
            const int gh = g - h0 < HEAD_GROUP ? (int)(g - h0) : HEAD_GROUP;
            int64_t c = 0;
            for (; c + 16 * HEAD_WIDTH <= hd; c += 16 * HEAD_WIDTH) heads(p + h0 * ps, ps, r, n, hd, c, o + h0 * hd, gh, HEAD_WIDTH);
            if (c < hd) heads(p + h0 * ps, ps, r, n, hd, c, o + h0 * hd, gh, 1);
        }
        return;
    }
#endif
    for (int64_t h = 0; h < g; h++)
        for (int64_t j = 0; j < n; j++)
            for (int64_t e = 0; e < hd; e++) o[h * hd + e] += p[h * ps + j] * value_at(r, j, e);
}

/* lanes[l] += s[j + l] for every j < n (a multiple of LI_KV_LANES) in steps of LI_KV_LANES:
 * a head's sum of weights kept in lanes over a span, reduced once at its end (lane_total) */
static inline void add_lanes(float *lanes, const float *s, int64_t n) {
#if defined(__AVX512F__)
    __m512 acc = _mm512_loadu_ps(lanes);
    for (int64_t j = 0; j < n; j += 16) acc = _mm512_add_ps(acc, _mm512_loadu_ps(s + j));
    _mm512_storeu_ps(lanes, acc);
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 acc = _mm256_loadu_ps(lanes);
    for (int64_t j = 0; j < n; j += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(s + j));
    _mm256_storeu_ps(lanes, acc);
#else
    for (int64_t j = 0; j < n; j += LI_KV_LANES)
        for (int l = 0; l < LI_KV_LANES; l++) lanes[l] += s[j + l];
#endif
}

/* the sum of a head's lanes, in a fixed tree */
static inline float lane_total(const float *lanes) {
#if defined(__AVX512F__)
    return _mm512_reduce_add_ps(_mm512_loadu_ps(lanes));
#elif defined(__AVX2__) && defined(__FMA__)
    return li_hsum8(_mm256_loadu_ps(lanes));
#else
    float total = 0.0f;
    for (int l = 0; l < LI_KV_LANES; l++) total += lanes[l];
    return total;
#endif
}

/* The g query heads of a row meet one block's scores: head h's n scores at s + h * SCORE_ROW
 * (room to round n up to LI_KV_LANES), turned here into the weights e^(s - max) its values
 * are summed with. mx, o: each head's running max and unnormalised output, rescaled by
 * e^(old max - new max) when the block raises the max, as are its lanes (its sum of weights,
 * LI_KV_LANES partial sums apart). The heads go through each step together, so their
 * reductions overlap instead of waiting on each other. */
static void softmax_heads(float *s, int64_t ss, int64_t g, int64_t n, int64_t hd, float *mx, float *lanes, float *o) {
    const int64_t n8 = (n + LI_KV_LANES - 1) & ~(int64_t)(LI_KV_LANES - 1);
    for (int64_t h = 0; h < g; h++) {
        float *sh = s + h * ss;
        for (int64_t j = n; j < n8; j++) sh[j] = -INFINITY; /* past this query's position */
        float bm;
        if (block_max_above(sh, n8, mx[h], &bm)) {
            const float c = mx[h] == -INFINITY ? 0.0f : exp_nonpositive(mx[h] - bm);
            for (int64_t e = 0; e < hd; e++) o[h * hd + e] *= c;
            for (int l = 0; l < LI_KV_LANES; l++) lanes[h * LI_KV_LANES + l] *= c;
            mx[h] = bm;
        }
    }
    for (int64_t h = 0; h < g; h++) {
        float *sh = s + h * ss;
        exp_shifted(sh, n8, mx[h]);
        for (int64_t j = n; j < n8; j++) sh[j] = 0.0f;
        add_lanes(lanes + h * LI_KV_LANES, sh, n8);
    }
}

/* What every task of one li_attention call shares. */
struct attn_job {
    const float *q;                /* [m, n_head, hd] */
    const uint8_t *keys, *values;  /* [n_head_kv, n_ctx] rows of kb / vb bytes */
    const int32_t *pos;            /* [m] */
    float *out;                    /* [m, n_head * hd] */
    int type_k, type_v;
    int64_t rot_k, rot_v, n_head, group, hd, n_ctx, kb, vb;
    int64_t qstride;               /* bytes of one query head as li_kv_query writes it */
    int64_t window;                /* a row at p sees positions (p - window, p]; 0: all up to p */
    int64_t see_to;                /* -1: causal; else every row sees up to this position (an encoder) */
    float scale;
    const float *sinks;            /* [n_head]: each head's sink logit (gpt-oss), or 0 */
};

/* A partial result of nq query heads (a "part"): the unnormalised outputs [nq, hd], then the
 * running maxima [nq] and sums [nq]. */
static inline int64_t part_floats(int64_t nq, int64_t hd) { return nq * (hd + 2); }

/* floats of one query head's scores for a block, with room to round n up to LI_KV_LANES */
#define SCORE_ROW (KEY_BLOCK + LI_KV_LANES)

/* query heads whose scores a block keeps at once: one row's g, or a few rows' where g is
 * small (attend_rows) */
static inline int64_t score_rows(int64_t g) { return g > HEAD_GROUP ? g : HEAD_GROUP; }

/* floats per thread for a tile of nq query heads, g to a row: a span's part and the folded
 * one, the prepared queries, a block of keys and one of values, the scores, the heads' lanes */
static size_t tile_scratch(int64_t nq, int64_t g, int64_t hd) {
    return (size_t)(2 * part_floats(nq, hd) + nq * hd + 2 * KEY_BLOCK * hd + score_rows(g) * SCORE_ROW + nq * LI_KV_LANES);
}

/* The first position a row at `pos` sees. */
static inline int64_t first_seen(const struct attn_job *a, int64_t pos) { return a->window > 0 && pos >= a->window ? pos - a->window + 1 : 0; }

/* The last position row i sees: its own (causal), or the call's last (non-causal: every row
 * of an encoder's sequence sees the whole sequence). */
static inline int64_t last_seen(const struct attn_job *a, int64_t i) { return a->see_to >= 0 ? a->see_to : a->pos[i]; }

/* The first and last positions any of rows [i0, i0 + rows) sees. */
static void rows_seen(const struct attn_job *a, int64_t i0, int64_t rows, int64_t *first, int64_t *last) {
    *last = 0, *first = INT64_MAX;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t l = last_seen(a, i0 + r), f = first_seen(a, l);
        *last = l > *last ? l : *last;
        *first = f < *first ? f : *first;
    }
}

/* The query heads of rows [i0, i0 + rows) of kv head kvh as the scores read them, into qbuf. */
static void prepare_queries(const struct attn_job *a, int64_t i0, int64_t rows, int64_t kvh, uint8_t *qbuf) {
    const int64_t g = a->group;
    for (int64_t r = 0; r < rows; r++)
        li_kv_query(a->type_k, a->q + ((i0 + r) * a->n_head + kvh * g) * a->hd, g, a->hd, a->rot_k, qbuf + r * g * a->qstride);
}

/* One block of a span as attend_rows reads it: its keys (in place if tiled, or prepared),
 * its value rows vs bytes apart, its first position k0, and how far ahead to prefetch. */
struct key_block {
    const void *keys;
    const uint8_t *vrows;
    int64_t k0, vs, k_ahead, v_ahead;
    enum value_form form;
    int tiled;
};

/* Rows [r0, r0 + nrows) of a tile (at i0) meet one block: their heads' scores, softmax and
 * value sums into the part's mx, lanes and o. Rows whose heads together fit one pass over the
 * values (HEAD_GROUP; an encoder has one head per kv head) go together, so each value row is
 * read and widened once for all of them. A row's weights are 0 outside the positions it sees,
 * and a multiply-add of 0 leaves its sums as they were: a row gets the same bits alone. */
static void attend_rows(const struct attn_job *a, const struct key_block *b, int64_t i0, int64_t r0, int64_t nrows, const uint8_t *qbuf,
                        float *s, float *mx, float *lanes, float *o) {
    const int64_t g = a->group, hd = a->hd;
    int64_t from[HEAD_GROUP], to[HEAD_GROUP], lo = KEY_BLOCK, hi = 0; /* the positions [from, to) a row sees */
    for (int64_t rr = 0; rr < nrows; rr++) {
        const int64_t at = last_seen(a, i0 + r0 + rr), seen = at + 1 - b->k0, skip = first_seen(a, at) - b->k0;
        from[rr] = skip <= 0 ? 0 : skip < KEY_BLOCK ? skip : KEY_BLOCK; /* a window: the block's positions before it */
        to[rr] = seen <= from[rr] ? from[rr] : seen < KEY_BLOCK ? seen : KEY_BLOCK; /* causal: up to the row's own */
        if (to[rr] > from[rr]) lo = from[rr] < lo ? from[rr] : lo, hi = to[rr] > hi ? to[rr] : hi;
    }
    if (hi <= lo) return;
    const uint8_t *q = qbuf + r0 * g * a->qstride;
    if (b->tiled)
        li_kv_scores_tiles(a->type_k, q, a->qstride, b->keys, (hi + LI_KV_TILE - 1) / LI_KV_TILE, hd, nrows * g, a->scale, s, SCORE_ROW,
                           r0 ? 0 : b->k_ahead);
    else
        for (int64_t h = 0; h < nrows * g; h++) li_kv_scores(q + h * a->qstride, b->keys, hi, hd, a->scale, s + h * SCORE_ROW);
    for (int64_t rr = 0; rr < nrows; rr++) {
        float *sr = s + rr * g * SCORE_ROW;
        const int64_t i = (r0 + rr) * g, end = to[rr] > from[rr] ? to[rr] : lo;
        if (to[rr] > from[rr]) softmax_heads(sr + from[rr], SCORE_ROW, g, to[rr] - from[rr], hd, mx + i, lanes + i * LI_KV_LANES, o + i * hd);
        for (int64_t h = 0; h < g; h++) {
            for (int64_t j = lo; j < from[rr]; j++) sr[h * SCORE_ROW + j] = 0.0f;
            for (int64_t j = end; j < hi; j++) sr[h * SCORE_ROW + j] = 0.0f;
        }
    }
    const struct value_rows seen = {b->vrows + lo * b->vs, b->vs, b->form != V_FLOAT && !r0 ? b->v_ahead : 0, b->form};
    accumulate_heads(s + lo, SCORE_ROW, &seen, hi - lo, hd, o + r0 * g * hd, nrows * g);
}

/* Every query head of the rows against the blocks of span [k_lo, k_lo + SPAN) that its row
 * sees, from a fresh running max: the part p. `blocks`: a block of keys, one of values, the
 * scores, then each query head's LI_KV_LANES partial sums of its weights. */
static void attend_span(const struct attn_job *a, int64_t i0, int64_t rows, int64_t kvh, const uint8_t *qbuf, int64_t first,
                        int64_t last, int64_t k_lo, float *p, float *blocks) {
    const int64_t g = a->group, hd = a->hd, nq = rows * g;
    float *o = p, *mx = p + nq * hd, *sum = mx + nq;
    float *kbuf = blocks, *vbuf = kbuf + KEY_BLOCK * hd, *s = vbuf + KEY_BLOCK * hd; /* s: the scores of a row's heads (or a few rows') */
    float *lanes = s + score_rows(g) * SCORE_ROW;
    const int64_t per = g >= HEAD_GROUP ? 1 : HEAD_GROUP / g; /* rows whose heads share a pass over the values */
    /* f16 and q8_0 values are read in place, widened as they are summed; q4_0's first widened */
    const enum value_form form = a->type_v == LI_F16 ? V_F16 : a->type_v == LI_Q8_0 ? V_Q8 : V_FLOAT;
    const int tiled = li_kv_tiled(a->type_k); /* keys in tiles, scored in place for all g heads */
    const int64_t k_ahead = KEY_BLOCK * a->kb, v_ahead = KEY_BLOCK * a->vb; /* the next block's lines, asked for as these are read */
    for (int64_t i = 0; i < nq; i++) mx[i] = -INFINITY;
    memset(lanes, 0, sizeof(float) * (size_t)(nq * LI_KV_LANES));
    memset(o, 0, sizeof(float) * (size_t)(nq * hd));
    const uint8_t *keys = a->keys + kvh * a->n_ctx * a->kb, *values = a->values + kvh * a->n_ctx * a->vb;
    const int64_t k_end = last < k_lo + SPAN - 1 ? last : k_lo + SPAN - 1;
    for (int64_t k0 = first / KEY_BLOCK * KEY_BLOCK > k_lo ? first / KEY_BLOCK * KEY_BLOCK : k_lo; k0 <= k_end; k0 += KEY_BLOCK) {
        const int64_t n = last + 1 - k0 < KEY_BLOCK ? last + 1 - k0 : KEY_BLOCK;
        const void *kblk = tiled ? (const void *)(keys + k0 * a->kb) : li_kv_block_keys(keys + k0 * a->kb, n, hd, kbuf, k_ahead);
        const uint8_t *vrows = form == V_FLOAT ? (const uint8_t *)vbuf : values + k0 * a->vb;
        const int64_t vs = form == V_FLOAT ? 4 * hd : a->vb;
        if (form == V_FLOAT) li_kv_block_values(values + k0 * a->vb, n, hd, vbuf, v_ahead);
        const struct key_block b = {kblk, vrows, k0, vs, k_ahead, v_ahead, form, tiled};
        for (int64_t r0 = 0; r0 < rows; r0 += per) attend_rows(a, &b, i0, r0, rows - r0 < per ? rows - r0 : per, qbuf, s, mx, lanes, o);
    }
    for (int64_t i = 0; i < nq; i++) sum[i] = lane_total(lanes + i * LI_KV_LANES);
}

/* Folds part p into acc, both rescaled to the larger max; an empty acc (max -inf) takes p
 * as it is. Spans are folded in position order, whoever computed them. */
static void merge_span(float *acc, const float *p, int64_t nq, int64_t hd) {
    float *o = acc, *mx = acc + nq * hd, *sum = mx + nq;
    const float *po = p, *pmx = p + nq * hd, *psum = pmx + nq;
    for (int64_t i = 0; i < nq; i++) {
        if (pmx[i] == -INFINITY) continue;
        if (mx[i] == -INFINITY) {
            memcpy(o + i * hd, po + i * hd, sizeof(float) * (size_t)hd);
            mx[i] = pmx[i], sum[i] = psum[i];
            continue;
        }
        const float m = mx[i] > pmx[i] ? mx[i] : pmx[i];
        const float c = mx[i] == m ? 1.0f : exp_nonpositive(mx[i] - m), cp = pmx[i] == m ? 1.0f : exp_nonpositive(pmx[i] - m);
        for (int64_t e = 0; e < hd; e++) o[i * hd + e] = o[i * hd + e] * c + po[i * hd + e] * cp;
        sum[i] = sum[i] * c + psum[i] * cp;
        mx[i] = m;
    }
}

static void empty_part(float *p, int64_t nq, int64_t hd) {
    memset(p, 0, sizeof(float) * (size_t)part_floats(nq, hd));
    for (int64_t i = 0; i < nq; i++) p[nq * hd + i] = -INFINITY;
}

/* The rows' outputs from their folded part: each head's sink met last, o / sum, rotated
 * back where the values were stored rotated. */
static void finish_rows(const struct attn_job *a, int64_t i0, int64_t rows, int64_t kvh, float *acc) {
    const int64_t g = a->group, hd = a->hd, nq = rows * g;
    float *o = acc, *mx = acc + nq * hd, *sum = mx + nq;
    for (int64_t r = 0; r < rows; r++) {
        float *dst = a->out + ((i0 + r) * a->n_head + kvh * g) * hd;
        for (int64_t h = 0; h < g; h++) {
            float *src = o + (r * g + h) * hd, total = sum[r * g + h];
            if (a->sinks) { /* a raw logit with no value row, met after every position (ggml's order) */
                const float sink = a->sinks[kvh * g + h], m = mx[r * g + h];
                if (sink > m) {
                    const float ms = m == -INFINITY ? 0.0f : exp_nonpositive(m - sink);
                    for (int64_t e = 0; e < hd; e++) src[e] *= ms;
                    total = total * ms + 1.0f;
                } else total += exp_nonpositive(sink - m);
            }
            const float inv = 1.0f / total;
            for (int64_t e = 0; e < hd; e++) dst[h * hd + e] = src[e] * inv;
        }
        if (a->rot_v) li_fwht(dst, g * hd, a->rot_v); /* the values were stored rotated */
    }
}

/* Rows [i0, i0 + rows) of kv head kvh, whole: span after span, folded as they come. */
static void attend_tile(const struct attn_job *a, int64_t i0, int64_t rows, int64_t kvh, float *scratch) {
    const int64_t nq = rows * a->group, hd = a->hd;
    float *acc = scratch, *p = acc + part_floats(nq, hd), *blocks = p + part_floats(nq, hd) + nq * hd;
    uint8_t *qbuf = (uint8_t *)(p + part_floats(nq, hd));
    int64_t first, last;
    prepare_queries(a, i0, rows, kvh, qbuf);
    rows_seen(a, i0, rows, &first, &last);
    empty_part(acc, nq, hd);
    for (int64_t k_lo = first / SPAN * SPAN; k_lo <= last; k_lo += SPAN) {
        attend_span(a, i0, rows, kvh, qbuf, first, last, k_lo, p, blocks);
        merge_span(acc, p, nq, hd);
    }
    finish_rows(a, i0, rows, kvh, acc);
}

/* Every span of every (row tile, kv head) as a task of its own, into parts; then each
 * tile's parts folded in position order and finished. Spans [span0, span0 + n_span): those
 * any row sees (a sliding window sees only the last few). Each tile's queries are prepared
 * once, before its spans, not once a span. */
static int attend_spans(const struct attn_job *a, int64_t m, int64_t rows, int64_t n_kv, int64_t span0, int64_t n_span, float *scratch,
                        size_t per_thread, int nthreads) {
    const int64_t tiles = (m + rows - 1) / rows, pf = part_floats(rows * a->group, a->hd), qb = rows * a->group * a->qstride;
    float *parts = malloc(sizeof(float) * (size_t)(tiles * n_kv * n_span * pf) + (size_t)(tiles * n_kv * qb));
    if (!parts) return 4;
    uint8_t *queries = (uint8_t *)(parts + tiles * n_kv * n_span * pf); /* tile tk's at tk * qb */
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
    {
        int thread = 0;
#ifdef _OPENMP
        thread = omp_get_thread_num();
#endif
        float *mine = scratch + (size_t)thread * per_thread;
#pragma omp for schedule(static)
        for (int64_t tk = 0; tk < tiles * n_kv; tk++) {
            const int64_t i0 = tk / n_kv * rows;
            prepare_queries(a, i0, i0 + rows <= m ? rows : m - i0, tk % n_kv, queries + tk * qb);
        }
        /* static: each thread a run of neighbouring spans, whose bytes follow each other, so
         * the prefetch a block ahead carries on from one span into the next (dynamic handed
         * them out alternately: 5-7 % slower at 16k) */
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles * n_kv * n_span; t++) {
            const int64_t tk = t / n_span, i0 = tk / n_kv * rows, r = i0 + rows <= m ? rows : m - i0;
            int64_t first, last;
            rows_seen(a, i0, r, &first, &last);
            attend_span(a, i0, r, tk % n_kv, queries + tk * qb, first, last, (span0 + t % n_span) * SPAN, parts + t * pf, mine);
        }
#pragma omp for schedule(static)
        for (int64_t tk = 0; tk < tiles * n_kv; tk++) {
            const int64_t i0 = tk / n_kv * rows, kvh = tk % n_kv, r = i0 + rows <= m ? rows : m - i0, nq = r * a->group;
            empty_part(mine, nq, a->hd);
            for (int64_t span = 0; span < n_span; span++) merge_span(mine, parts + (tk * n_span + span) * pf, nq, a->hd);
            finish_rows(a, i0, r, kvh, mine);
        }
    }
    free(parts);
    return 0;
}

/* Store m new keys/values ([m, n_head_kv, hd]) in the cache's types (kvcache.c), rotated
 * in chunks of rot_k / rot_v values where those are not 0, at their positions of one
 * sequence's cache ([n_head_kv, n_ctx] rows per layer), then causal
 * grouped-query attention of the m queries ([m, n_head, hd]) into out ([m, n_head*hd]):
 * each over every position up to its own, or with a window only over the last `window`.
 * Not `causal` (an encoder; no window): every row over every position up to the largest of
 * the call's rows, so the rows of one whole sequence all see each other.
 * Query head h reads kv head h / (n_head / n_head_kv), as llama.cpp broadcasts. With
 * `sinks` ([n_head], or 0), head h's softmax also meets the logit sinks[h] (unscaled, no
 * value row): attention that can go nowhere. */
int li_attention(const float *q, const float *k_new, const float *v_new, uint8_t *keys, uint8_t *values,
                 int type_k, int type_v, int64_t rot_k, int64_t rot_v, const int32_t *pos, float *out, int64_t m,
                 int64_t n_head, int64_t n_head_kv, int64_t hd, int64_t n_ctx, float scale, int64_t window,
                 const float *sinks, int causal, int nthreads) {
    const int64_t kb = li_kv_row_bytes(type_k, hd), vb = li_kv_row_bytes(type_v, hd);
    if (kb < 0 || vb < 0 || hd > LI_KV_MAX_HD) return 2;
    if ((rot_k && (hd % rot_k || (rot_k & (rot_k - 1)))) || (rot_v && (hd % rot_v || (rot_v & (rot_v - 1))))) return 2;
    if (li_kv_tiled(type_k) && n_ctx % LI_KV_TILE) return 2; /* tiled keys: whole tiles */
    if (!causal && window) return 2;
    for (int64_t i = 0; i < m; i++) {
        if (pos[i] < 0 || pos[i] >= n_ctx) return 3;
        for (int64_t h = 0; h < n_head_kv; h++) {
            const int64_t at = (int64_t)h * n_ctx + pos[i], src = (i * n_head_kv + h) * hd;
            if (li_kv_tiled(type_k))
                li_kv_store_key_tile(type_k, k_new + src, keys + (at - pos[i] % LI_KV_TILE) * kb, pos[i] % LI_KV_TILE, hd, rot_k);
            else
                li_kv_store(type_k, k_new + src, keys + at * kb, hd, rot_k);
            li_kv_store(type_v, v_new + src, values + at * vb, hd, rot_v);
        }
    }
    int64_t longest = 0;
    for (int64_t i = 0; i < m; i++) longest = pos[i] + 1 > longest ? pos[i] + 1 : longest;
    const int64_t group = n_head / n_head_kv;
    if (group > 64) return 3;
    /* Decode attends over a few hundred positions: not worth waking threads for. */
    if (m * n_head * longest * hd < (1 << 18)) nthreads = 1;
    if (nthreads < 1) nthreads = 1;
    /* Rows per tile: fewer where whole tiles would leave a thread without a task (no row's
     * result depends on it). */
    const int64_t most = ROW_TILE * group > TILE_QUERIES ? TILE_QUERIES / group : ROW_TILE;
    int64_t rows = (m * n_head_kv + 2 * nthreads - 1) / (2 * nthreads);
    rows = rows > most ? most : rows < 1 ? 1 : rows;
    const int64_t tiles = (m + rows - 1) / rows, tasks = tiles * n_head_kv;
    const size_t per_thread = tile_scratch(rows * group, group, hd);
    float *scratch = malloc(sizeof(float) * per_thread * (size_t)nthreads);
    if (!scratch) return 4;
    const struct attn_job job = {q, keys, values, pos, out, type_k, type_v, rot_k, rot_v, n_head, group, hd, n_ctx, kb, vb,
                                 li_kv_query_stride(type_k, hd), window, causal ? -1 : longest - 1, scale, sinks};
    int64_t earliest = INT64_MAX; /* the positions any row sees: [earliest, longest) */
    for (int64_t i = 0; i < m; i++) {
        const int64_t f = first_seen(&job, last_seen(&job, i));
        earliest = f < earliest ? f : earliest;
    }
    const int64_t span0 = earliest / SPAN, n_span = (longest - 1) / SPAN - span0 + 1;
    if (n_span > 1 && tasks < 2 * nthreads) { /* decode deep in a context: the threads split its spans */
        const int rc = attend_spans(&job, m, rows, n_head_kv, span0, n_span, scratch, per_thread, nthreads);
        free(scratch);
        return rc;
    }
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads) if (nthreads > 1)
    for (int64_t task = 0; task < tasks; task++) {
        int thread = 0;
#ifdef _OPENMP
        thread = omp_get_thread_num();
#endif
        const int64_t t = tasks - 1 - task; /* the last rows first: in a prefill they see the most positions */
        const int64_t i0 = t / n_head_kv * rows, kvh = t % n_head_kv;
        attend_tile(&job, i0, i0 + rows <= m ? rows : m - i0, kvh, scratch + (size_t)thread * per_thread);
    }
    free(scratch);
    return 0;
}
