/* The small per-token operations of a llama-family layer: RMSNorm, RoPE, attention over
 * the KV cache, SwiGLU. Each is tiny on its own; as numpy calls they cost more than the
 * matmuls, so each is one C call here. Plain loops, with AVX2 for attention's inner loops.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#ifdef _OPENMP
#include <omp.h>
#endif

/* The KV cache stores IEEE halves, as llama.cpp's default F16 cache does: half the memory,
 * and half the bytes attention reads. */
static inline float li_round_half(float x) { return li_fp16_to_fp32(li_fp32_to_fp16(x)); }

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

/* gate = silu(gate) * up */
void li_swiglu(float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
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


/* s[j] = e^(s[j] - max s), for j < t (normalised by the caller) */
static void softmax_exp(float *s, int64_t t) {
    float mx = -INFINITY;
    int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 m8 = _mm256_set1_ps(-INFINITY);
    for (; j + 8 <= t; j += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(s + j));
    float lanes[8];
    _mm256_storeu_ps(lanes, m8);
    for (int l = 0; l < 8; l++) mx = lanes[l] > mx ? lanes[l] : mx;
#endif
    for (; j < t; j++) mx = s[j] > mx ? s[j] : mx;
    j = 0;
#if defined(__AVX2__) && defined(__FMA__)
    /* exp_nonpositive, eight at a time */
    const __m256 vmx = _mm256_set1_ps(mx), lo = _mm256_set1_ps(-87.0f), log2e = _mm256_set1_ps(1.44269504f);
    const __m256 ln2_hi = _mm256_set1_ps(0.693145752f), ln2_lo = _mm256_set1_ps(1.42860677e-6f);
    const float c[8] = {1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f};
    for (; j + 8 <= t; j += 8) {
        __m256 x = _mm256_max_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j), vmx), lo);
        const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256 r = _mm256_sub_ps(_mm256_sub_ps(x, _mm256_mul_ps(n, ln2_hi)), _mm256_mul_ps(n, ln2_lo));
        __m256 p = _mm256_set1_ps(c[0]);
        for (int i = 1; i < 8; i++) p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(c[i]));
        const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
        _mm256_storeu_ps(s + j, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
    }
#endif
    for (; j < t; j++) s[j] = exp_nonpositive(s[j] - mx);
}

/* scores[h * t + j] = scale * (q_h . key_j) for the g heads, j < t */
static void group_scores(const float *qg, int64_t g, const uint16_t *keys, int64_t t, int64_t hd, float scale,
                         float *scores) {
#if defined(__AVX2__) && defined(__FMA__)
    if (hd % 16 == 0) {
        for (int64_t j = 0; j < t; j++) {
            const uint16_t *k = keys + j * hd;
            for (int64_t h = 0; h < g; h++) {
                const float *qh = qg + h * hd;
                __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
                for (int64_t e = 0; e < hd; e += 16) {
                    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + e), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + e))), a0);
                    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + e + 8), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + e + 8))), a1);
                }
                scores[h * t + j] = li_hsum8(_mm256_add_ps(a0, a1)) * scale;
            }
        }
        return;
    }
#endif
    for (int64_t j = 0; j < t; j++)
        for (int64_t h = 0; h < g; h++) {
            float s = 0.0f;
            for (int64_t e = 0; e < hd; e++) s += qg[h * hd + e] * li_fp16_to_fp32(keys[j * hd + e]);
            scores[h * t + j] = s * scale;
        }
}

/* out = sum_j p[j] * value_j, for one head: p has t weights */
static void weighted_values(const float *p, const uint16_t *values, int64_t t, int64_t hd, float *out) {
#if defined(__AVX2__) && defined(__FMA__)
    if (hd == 64) { /* the common head size: the whole output row stays in 8 registers */
        __m256 o0 = _mm256_setzero_ps(), o1 = o0, o2 = o0, o3 = o0, o4 = o0, o5 = o0, o6 = o0, o7 = o0;
        for (int64_t j = 0; j < t; j++) {
            const __m128i *v = (const __m128i *)(values + j * 64);
            const __m256 w = _mm256_broadcast_ss(p + j);
            o0 = _mm256_fmadd_ps(w, _mm256_cvtph_ps(_mm_loadu_si128(v)), o0);
            o1 = _mm256_fmadd_ps(w, _mm256_cvtph_ps(_mm_loadu_si128(v + 1)), o1);
            o2 = _mm256_fmadd_ps(w, _mm256_cvtph_ps(_mm_loadu_si128(v + 2)), o2);
            o3 = _mm256_fmadd_ps(w, _mm256_cvtph_ps(_mm_loadu_si128(v + 3)), o3);
            o4 = _mm256_fmadd_ps(w, _mm256_cvtph_ps(_mm_loadu_si128(v + 4)), o4);
            o5 = _mm256_fmadd_ps(w, _mm256_cvtph_ps(_mm_loadu_si128(v + 5)), o5);
            o6 = _mm256_fmadd_ps(w, _mm256_cvtph_ps(_mm_loadu_si128(v + 6)), o6);
            o7 = _mm256_fmadd_ps(w, _mm256_cvtph_ps(_mm_loadu_si128(v + 7)), o7);
        }
        _mm256_storeu_ps(out, o0), _mm256_storeu_ps(out + 8, o1), _mm256_storeu_ps(out + 16, o2), _mm256_storeu_ps(out + 24, o3);
        _mm256_storeu_ps(out + 32, o4), _mm256_storeu_ps(out + 40, o5), _mm256_storeu_ps(out + 48, o6), _mm256_storeu_ps(out + 56, o7);
        return;
    }
#endif
    memset(out, 0, sizeof(float) * (size_t)hd);
    for (int64_t j = 0; j < t; j++)
        for (int64_t e = 0; e < hd; e++) out[e] += p[j] * li_fp16_to_fp32(values[j * hd + e]);
}

/* The g query heads of one row that share a kv head, against its positions [0, t):
 * qg: [g, hd] (float16-rounded), scores: [g, t] scratch, out: g rows of hd. */
static void attend_group(const float *qg, int64_t g, const uint16_t *keys, const uint16_t *values, int64_t t,
                         int64_t hd, float scale, float *scores, float *out) {
    group_scores(qg, g, keys, t, hd, scale, scores);
    for (int64_t h = 0; h < g; h++) {
        float *s = scores + h * t;
        softmax_exp(s, t);
        float partial[8] = {0}, sum = 0.0f;
        int64_t j = 0;
        for (; j + 8 <= t; j += 8)
            for (int l = 0; l < 8; l++) partial[l] += s[j + l];
        for (int l = 0; l < 8; l++) sum += partial[l];
        for (; j < t; j++) sum += s[j];
        const float inv = 1.0f / sum;
        for (j = 0; j < t; j++) s[j] *= inv;
        weighted_values(s, values, t, hd, out + h * hd);
    }
}

/* Store m new keys/values ([m, n_head_kv, hd]) as float16 at their positions of one
 * sequence's cache ([n_head_kv, n_ctx, hd] halves per layer), then causal
 * grouped-query attention of the m queries ([m, n_head, hd]) into out ([m, n_head*hd]).
 * Query head h reads kv head h / (n_head / n_head_kv), as llama.cpp broadcasts. */
int li_attention(const float *q, const float *k_new, const float *v_new, uint16_t *keys, uint16_t *values,
                 const int32_t *pos, float *out, int64_t m, int64_t n_head, int64_t n_head_kv,
                 int64_t hd, int64_t n_ctx, float scale, int nthreads) {
    for (int64_t i = 0; i < m; i++) {
        if (pos[i] < 0 || pos[i] >= n_ctx) return 3;
        for (int64_t h = 0; h < n_head_kv; h++) {
            const float *ks = k_new + (i * n_head_kv + h) * hd, *vs = v_new + (i * n_head_kv + h) * hd;
            uint16_t *kd = keys + (h * n_ctx + pos[i]) * hd, *vd = values + (h * n_ctx + pos[i]) * hd;
            for (int64_t e = 0; e < hd; e++) {
                kd[e] = li_fp32_to_fp16(ks[e]);
                vd[e] = li_fp32_to_fp16(vs[e]);
            }
        }
    }
    int64_t longest = 0;
    for (int64_t i = 0; i < m; i++) longest = pos[i] + 1 > longest ? pos[i] + 1 : longest;
    const int64_t group = n_head / n_head_kv, tasks = m * n_head_kv;
    if (hd > 512 || group > 64) return 3;
    /* Decode attends over a few hundred positions: not worth waking threads for. */
    if (m * n_head * longest * hd < (1 << 18)) nthreads = 1;
    if (nthreads < 1) nthreads = 1;
    float *scratch = malloc(sizeof(float) * (size_t)group * (size_t)(longest + hd) * (size_t)nthreads);
    if (!scratch) return 4;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads) if (nthreads > 1)
    for (int64_t task = 0; task < tasks; task++) {
        int thread = 0;
#ifdef _OPENMP
        thread = omp_get_thread_num();
#endif
        const int64_t i = task / n_head_kv, kvh = task % n_head_kv;
        float *qg = scratch + (size_t)thread * (size_t)group * (size_t)(longest + hd), *scores = qg + group * hd;
        const float *qi = q + (i * n_head + kvh * group) * hd;
        for (int64_t e = 0; e < group * hd; e++) qg[e] = li_round_half(qi[e]);
        attend_group(qg, group, keys + kvh * n_ctx * hd, values + kvh * n_ctx * hd, (int64_t)pos[i] + 1, hd, scale,
                     scores, out + (i * n_head + kvh * group) * hd);
    }
    free(scratch);
    return 0;
}
