/* localinfer native kernels: the contract between the C files.
 *
 * Weight rows are GGUF blocks read in place. Activations are quantized once per matmul
 * to the 8-bit block format the weight type pairs with (as ggml does): Q8_0 for
 * Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, Q8_K for Q4_K/Q5_K/Q6_K; F16/F32 use floats.
 * Each vec_dot computes one weight row (k values) against one quantized activation row.
 */
#ifndef LOCALINFER_KERNELS_H
#define LOCALINFER_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

/* ggml type ids, the same numbers GGUF stores */
enum {
    LI_F32 = 0, LI_F16 = 1, LI_Q4_0 = 2, LI_Q4_1 = 3, LI_Q5_0 = 6, LI_Q5_1 = 7,
    LI_Q8_0 = 8, LI_Q8_1 = 9, LI_Q4_K = 12, LI_Q5_K = 13, LI_Q6_K = 14, LI_Q8_K = 15,
};

/* ---- fp16 <-> fp32 ------------------------------------------------------------- */

static inline float li_fp16_to_fp32_soft(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F;
    uint32_t man = h & 0x3FF;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalize */
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 0x400));
            man &= 0x3FF;
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | (man << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7F800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* round to nearest even, as numpy's astype(float16) and F16C do */
static inline uint16_t li_fp32_to_fp16_soft(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7FFFFFFFu;
    if (ax >= 0x7F800000u) return (uint16_t)(sign | 0x7C00 | (ax > 0x7F800000u ? 0x200 : 0));
    if (ax >= 0x477FF000u) return (uint16_t)(sign | 0x7C00); /* rounds to >= 65520: inf */
    if (ax < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        if (ax < 0x33000000u) return (uint16_t)sign; /* < 2^-25: rounds to zero */
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7FFFFF) | 0x800000;
        uint32_t shift = 126 - e; /* 14 + (113 - e) */
        uint32_t half = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = ((ax >> 13) - (112u << 10));
    uint32_t rem = ax & 0x1FFF;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

static inline float li_fp16_to_fp32(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    return li_fp16_to_fp32_soft(h);
#endif
}

static inline uint16_t li_fp32_to_fp16(float f) {
#if defined(__F16C__)
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
    return li_fp32_to_fp16_soft(f);
#endif
}

#if defined(__AVX2__)
/* the sum of a vector's eight floats */
static inline float li_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

#define LI_QK_K 256

/* Q8_K activation block: float scale, 256 int8, and 16 sums of 16 values each
 * (the K-quant dots need those sums for the mins). Layout as ggml's block_q8_K. */
typedef struct {
    float d;
    int8_t qs[LI_QK_K];
    int16_t bsums[LI_QK_K / 16];
} li_block_q8_K;

/* kquants.c */
void li_quantize_row_q8_K(const float *x, void *y, int64_t k);
void li_vec_dot_q4_K_q8_K(int64_t k, float *s, const void *w, const void *y);
void li_vec_dot_q5_K_q8_K(int64_t k, float *s, const void *w, const void *y);
void li_vec_dot_q6_K_q8_K(int64_t k, float *s, const void *w, const void *y);

#endif
