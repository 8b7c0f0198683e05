/* An encoder's (BERT's) own small operations: LayerNorm with a bias, after a residual add,
 * and a plain GELU after a bias. Each is a pass over every row of a forward (hundreds of
 * rows of 768 or 3,072 values), so they run on the threads, not as numpy's several passes.
 * The arithmetic is ggml's CPU build's (ggml_compute_forward_norm_f32, ggml_vec_gelu_f32).
 */
#include <math.h>
#include <stdint.h>

#include "kernels.h"
#ifdef _OPENMP
#include <omp.h>
#endif

/* rows of n * d values worth waking the threads for */
#define PARALLEL_VALUES (1 << 16)

/* out = (x - mean) / sqrt(variance + eps) * w + b for one row of d (out may be x), as ggml_norm
 * then ggml_mul and ggml_add: the sum in double, the mean in float, the centred squares summed
 * in double, each later step rounded to float. */
static void layer_norm_row(const float *x, const float *w, const float *b, float *out, int64_t d, float eps) {
    double s = 0.0;
    for (int64_t j = 0; j < d; j++) s += (double)x[j];
    const float mean = (float)s / (float)d;
    double v = 0.0;
    for (int64_t j = 0; j < d; j++) {
        const float c = x[j] - mean;
        out[j] = c;
        v += (double)(c * c);
    }
    const float scale = 1.0f / sqrtf((float)(v / (double)d) + eps);
    for (int64_t j = 0; j < d; j++) {
        const float y = out[j] * scale, yw = y * w[j];
        out[j] = yw + b[j];
    }
}

/* out[i] = LayerNorm(x[i]) * w + b for x [n, d]; out may be x. */
void li_layer_norm(const float *x, const float *w, const float *b, float *out, int64_t n, int64_t d, float eps, int nthreads) {
    if (n * d < PARALLEL_VALUES || nthreads < 1) nthreads = 1;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1)
    for (int64_t i = 0; i < n; i++) layer_norm_row(x + i * d, w, b, out + i * d, d, eps);
}

/* x[i] = LayerNorm(x[i] + (y[i] + y_bias)) * w + b, in place: a post-norm residual (BERT's),
 * where y is a product's output and y_bias its bias, added first as llama.cpp's graph adds it. */
void li_add_layer_norm(float *x, const float *y, const float *y_bias, const float *w, const float *b, int64_t n, int64_t d, float eps,
                       int nthreads) {
    if (n * d < PARALLEL_VALUES || nthreads < 1) nthreads = 1;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1)
    for (int64_t i = 0; i < n; i++) {
        float *xi = x + i * d;
        const float *yi = y + i * d;
        for (int64_t j = 0; j < d; j++) xi[j] += yi[j] + y_bias[j];
        layer_norm_row(xi, w, b, xi, d, eps);
    }
}

/* GELU (tanh approximation) of every fp16 value, rounded to fp16, as floats: ggml's
 * ggml_table_gelu_f16, made when the library loads (65,536 tanhf, about a millisecond). */
static float gelu_table[1 << 16];

__attribute__((constructor)) static void gelu_table_init(void) {
    for (int i = 0; i < 1 << 16; i++) {
        const float h = li_fp16_to_fp32((uint16_t)i);
        const float g = 0.5f * h * (1.0f + tanhf(0.79788456080286535587989211986876f * h * (1.0f + 0.044715f * h * h)));
        gelu_table[i] = li_fp16_to_fp32(li_fp32_to_fp16(g));
    }
}

/* ggml_vec_gelu_f32: 0 at or below -10, the input itself from 10 up, else the input rounded
 * to fp16 and looked up (NaN and infinite table entries are never reached). */
static inline float gelu_one(float x) { return x <= -10.0f ? 0.0f : x >= 10.0f ? x : gelu_table[li_fp32_to_fp16(x)]; }

/* x[i] = gelu(x[i] + bias) for one row of d (bias may be 0). */
static void gelu_row(float *x, const float *bias, int64_t d) {
    int64_t j = 0;
#if defined(__AVX512F__)
    const __m512 lo = _mm512_set1_ps(-10.0f), hi = _mm512_set1_ps(10.0f);
    for (; j + 16 <= d; j += 16) {
        __m512 v = _mm512_loadu_ps(x + j);
        if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + j));
        const __m512i h = _mm512_cvtepu16_epi32(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        __m512 g = _mm512_i32gather_ps(h, gelu_table, 4);
        g = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, lo, _CMP_LE_OQ), g, _mm512_setzero_ps());
        g = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, hi, _CMP_GE_OQ), g, v);
        _mm512_storeu_ps(x + j, g);
    }
#elif defined(__AVX2__) && defined(__F16C__)
    const __m256 lo = _mm256_set1_ps(-10.0f), hi = _mm256_set1_ps(10.0f);
    for (; j + 8 <= d; j += 8) {
        __m256 v = _mm256_loadu_ps(x + j);
        if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + j));
        const __m256i h = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        __m256 g = _mm256_i32gather_ps(gelu_table, h, 4);
        g = _mm256_blendv_ps(g, _mm256_setzero_ps(), _mm256_cmp_ps(v, lo, _CMP_LE_OQ));
        g = _mm256_blendv_ps(g, v, _mm256_cmp_ps(v, hi, _CMP_GE_OQ));
        _mm256_storeu_ps(x + j, g);
    }
#endif
    for (; j < d; j++) x[j] = gelu_one(bias ? x[j] + bias[j] : x[j]);
}

/* x[i] = gelu(x[i] + bias) for x [n, d], in place; bias [d] or 0. */
void li_gelu(float *x, const float *bias, int64_t n, int64_t d, int nthreads) {
    if (n * d < PARALLEL_VALUES || nthreads < 1) nthreads = 1;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1)
    for (int64_t i = 0; i < n; i++) gelu_row(x + i * d, bias, d);
}
