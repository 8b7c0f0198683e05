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
void li_swiglu(float *gate, const float *up, int64_t n, int nthreads) {
    const int64_t chunk = 4096;
    if (n < 16 * chunk || nthreads < 1) nthreads = 1;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1)
    for (int64_t c = 0; c < n; c += chunk) {
        const int64_t end = c + chunk < n ? c + chunk : n;
        for (int64_t i = c; i < end; i++) {
            const float g = gate[i], t = exp_nonpositive(-fabsf(g));
            gate[i] = (g >= 0.0f ? g : g * t) / (1.0f + t) * up[i];
        }
    }
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

/* The g query heads of one row that share a kv head, against its positions [0, t):
 * qbuf: the heads as li_kv_query prepared them, scores: [g, t] scratch, out: g rows of hd. */
static void attend_group(int type_k, int type_v, const void *qbuf, int64_t g, const uint8_t *keys,
                         const uint8_t *values, int64_t t, int64_t hd, float scale, float *scores, float *out) {
    li_kv_scores(type_k, qbuf, g, keys, t, hd, scale, scores);
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
        li_kv_weighted(type_v, s, values, t, hd, out + h * hd);
    }
}

/* Store m new keys/values ([m, n_head_kv, hd]) in the cache's types (kvcache.c), rotated
 * in chunks of rot_k / rot_v values where those are not 0, at their positions of one
 * sequence's cache ([n_head_kv, n_ctx] rows per layer), then causal
 * grouped-query attention of the m queries ([m, n_head, hd]) into out ([m, n_head*hd]).
 * Query head h reads kv head h / (n_head / n_head_kv), as llama.cpp broadcasts. */
int li_attention(const float *q, const float *k_new, const float *v_new, uint8_t *keys, uint8_t *values,
                 int type_k, int type_v, int64_t rot_k, int64_t rot_v, const int32_t *pos, float *out, int64_t m,
                 int64_t n_head, int64_t n_head_kv, int64_t hd, int64_t n_ctx, float scale, int nthreads) {
    const int64_t kb = li_kv_row_bytes(type_k, hd), vb = li_kv_row_bytes(type_v, hd);
    if (kb < 0 || vb < 0 || hd > LI_KV_MAX_HD) return 2;
    if ((rot_k && (hd % rot_k || (rot_k & (rot_k - 1)))) || (rot_v && (hd % rot_v || (rot_v & (rot_v - 1))))) return 2;
    for (int64_t i = 0; i < m; i++) {
        if (pos[i] < 0 || pos[i] >= n_ctx) return 3;
        for (int64_t h = 0; h < n_head_kv; h++) {
            const int64_t at = (int64_t)h * n_ctx + pos[i], src = (i * n_head_kv + h) * hd;
            li_kv_store(type_k, k_new + src, keys + at * kb, hd, rot_k);
            li_kv_store(type_v, v_new + src, values + at * vb, hd, rot_v);
        }
    }
    int64_t longest = 0;
    for (int64_t i = 0; i < m; i++) longest = pos[i] + 1 > longest ? pos[i] + 1 : longest;
    const int64_t group = n_head / n_head_kv, tasks = m * n_head_kv;
    if (group > 64) return 3;
    /* Decode attends over a few hundred positions: not worth waking threads for. */
    if (m * n_head * longest * hd < (1 << 18)) nthreads = 1;
    if (nthreads < 1) nthreads = 1;
    /* per thread: the group's queries (g*hd floats' room, li_kv_query), then its scores */
    float *scratch = malloc(sizeof(float) * (size_t)group * (size_t)(longest + hd) * (size_t)nthreads);
    if (!scratch) return 4;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads) if (nthreads > 1)
    for (int64_t task = 0; task < tasks; task++) {
        int thread = 0;
#ifdef _OPENMP
        thread = omp_get_thread_num();
#endif
        const int64_t i = task / n_head_kv, kvh = task % n_head_kv;
        float *qbuf = scratch + (size_t)thread * (size_t)group * (size_t)(longest + hd), *scores = qbuf + group * hd;
        float *o = out + (i * n_head + kvh * group) * hd;
        li_kv_query(type_k, q + (i * n_head + kvh * group) * hd, group, hd, rot_k, qbuf);
        attend_group(type_k, type_v, qbuf, group, keys + kvh * n_ctx * kb, values + kvh * n_ctx * vb,
                     (int64_t)pos[i] + 1, hd, scale, scores, o);
        if (rot_v) li_fwht(o, group * hd, rot_v); /* the values were stored rotated */
    }
    free(scratch);
    return 0;
}
