/* Sixteen 32-bit lanes, for the packed products (packed.c and friends): one 512-bit
 * register with AVX-512 (and VNNI's vpdpbusd), or two 256-bit halves with AVX2 (vpmaddubsw +
 * vpmaddwd, or AVX-VNNI). Lane i of every vector belongs to weight row i of a panel of 16, so
 * kernels written against these helpers never reduce across lanes. LP_R is the register
 * tile's activation rows; it is undefined where the build has neither (nothing packs). */
#ifndef LOCALINFER_VEC16_H
#define LOCALINFER_VEC16_H

#include <stdint.h>
#include <string.h>

#include "kernels.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) && \
    defined(__FMA__) && defined(__F16C__)
#define LP_512 1
#define LP_R 8 /* activation rows per register tile: 32 registers hold 8 rows' int and float sums */
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define LP_256 1
#define LP_R 4
#endif

#define LP_PANEL 16
#define LP_INLINE static inline __attribute__((always_inline))

static inline uint16_t lp_u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static inline uint32_t lp_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

#ifdef LP_R
/* ---- 16 lanes: one zmm, or two ymm ------------------------------------------------------ */

#ifdef LP_512
typedef __m512i vi;
typedef __m512 vf;
typedef __m512i va; /* four activation bytes broadcast */
static inline vi vi_load(const uint8_t *p) { return _mm512_loadu_si512((const void *)p); }
static inline vi vi_set1(int32_t x) { return _mm512_set1_epi32(x); }
static inline vi vi_and(vi a, vi b) { return _mm512_and_si512(a, b); }
static inline vi vi_or(vi a, vi b) { return _mm512_or_si512(a, b); }
static inline vi vi_add(vi a, vi b) { return _mm512_add_epi32(a, b); }
static inline vi vi_sub(vi a, vi b) { return _mm512_sub_epi32(a, b); }
static inline vi vi_mullo(vi a, vi b) { return _mm512_mullo_epi32(a, b); }
#define vi_srli16(a, n) _mm512_srli_epi16(a, n)
#define vi_slli16(a, n) _mm512_slli_epi16(a, n)
#define vi_srli32(a, n) _mm512_srli_epi32(a, n)
#define vi_slli32(a, n) _mm512_slli_epi32(a, n)
static inline va va_bcast(const int8_t *p) { return _mm512_set1_epi32((int32_t)lp_u32((const uint8_t *)p)); }
static inline va va_set1(int32_t x) { return _mm512_set1_epi32(x); }
/* acc + four u8 x s8 products per lane */
static inline vi vi_dpbusd(vi acc, vi u, va a) { return _mm512_dpbusd_epi32(acc, u, a); }
/* acc + two i16 x i16 products per lane */
static inline vi vi_dpwssd(vi acc, vi a, va b) { return _mm512_dpwssd_epi32(acc, a, b); }
/* bit i of m set: byte i of v plus 0x10 */
static inline vi vi_add_0x10(vi v, const uint8_t *m) {
    uint64_t bits;
    memcpy(&bits, m, 8);
    return _mm512_mask_add_epi8(v, (__mmask64)bits, v, _mm512_set1_epi8(0x10));
}
static inline vi vi_cvt_i8(const uint8_t *p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)); }
static inline vf vf_zero(void) { return _mm512_setzero_ps(); }
static inline vf vf_set1(float x) { return _mm512_set1_ps(x); }
static inline vf vf_f16(const uint8_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline vf vf_f32(const uint8_t *p) { return _mm512_loadu_ps((const float *)p); }
static inline vf vf_cvt(vi a) { return _mm512_cvtepi32_ps(a); }
static inline vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vf_fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vf_fnmadd(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }
static inline void vf_store(float *p, vf v) { _mm512_storeu_ps(p, v); }
#define LP_XOR_Q8 1 /* Q8_0 as unsigned (q ^ 0x80 = q + 128) with a -128 * sum(a) correction */
#else
typedef struct { __m256i l, h; } vi;
typedef struct { __m256 l, h; } vf;
typedef __m256i va;
static inline vi vi_load(const uint8_t *p) {
    return (vi){_mm256_loadu_si256((const __m256i *)p), _mm256_loadu_si256((const __m256i *)(p + 32))};
}
static inline vi vi_set1(int32_t x) { return (vi){_mm256_set1_epi32(x), _mm256_set1_epi32(x)}; }
static inline vi vi_and(vi a, vi b) { return (vi){_mm256_and_si256(a.l, b.l), _mm256_and_si256(a.h, b.h)}; }
static inline vi vi_or(vi a, vi b) { return (vi){_mm256_or_si256(a.l, b.l), _mm256_or_si256(a.h, b.h)}; }
static inline vi vi_add(vi a, vi b) { return (vi){_mm256_add_epi32(a.l, b.l), _mm256_add_epi32(a.h, b.h)}; }
static inline vi vi_sub(vi a, vi b) { return (vi){_mm256_sub_epi32(a.l, b.l), _mm256_sub_epi32(a.h, b.h)}; }
static inline vi vi_mullo(vi a, vi b) { return (vi){_mm256_mullo_epi32(a.l, b.l), _mm256_mullo_epi32(a.h, b.h)}; }
#define vi_srli16(a, n) ((vi){_mm256_srli_epi16((a).l, n), _mm256_srli_epi16((a).h, n)})
#define vi_slli16(a, n) ((vi){_mm256_slli_epi16((a).l, n), _mm256_slli_epi16((a).h, n)})
#define vi_srli32(a, n) ((vi){_mm256_srli_epi32((a).l, n), _mm256_srli_epi32((a).h, n)})
#define vi_slli32(a, n) ((vi){_mm256_slli_epi32((a).l, n), _mm256_slli_epi32((a).h, n)})
static inline va va_bcast(const int8_t *p) { return _mm256_set1_epi32((int32_t)lp_u32((const uint8_t *)p)); }
static inline va va_set1(int32_t x) { return _mm256_set1_epi32(x); }
static inline __m256i lp_dp256(__m256i acc, __m256i u, __m256i a) {
#ifdef LI_VNNI
    return li_dpbusd(acc, u, a);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), _mm256_set1_epi16(1)));
#endif
}
/* only for u <= 63 without VNNI (vpmaddubsw saturates its int16 pairs) */
static inline vi vi_dpbusd(vi acc, vi u, va a) { return (vi){lp_dp256(acc.l, u.l, a), lp_dp256(acc.h, u.h, a)}; }
static inline vi vi_dpwssd(vi acc, vi a, va b) {
    return (vi){_mm256_add_epi32(acc.l, _mm256_madd_epi16(a.l, b)), _mm256_add_epi32(acc.h, _mm256_madd_epi16(a.h, b))};
}
static inline vi vi_add_0x10(vi v, const uint8_t *m) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    return (vi){_mm256_or_si256(v.l, li_bits_to_0x10(_mm256_set1_epi32((int)lp_u32(m)), spread)),
                _mm256_or_si256(v.h, li_bits_to_0x10(_mm256_set1_epi32((int)lp_u32(m + 4)), spread))};
}
static inline vi vi_cvt_i8(const uint8_t *p) {
    return (vi){_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)),
                _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8)))};
}
static inline vf vf_zero(void) { return (vf){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
static inline vf vf_set1(float x) { return (vf){_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
static inline vf vf_f16(const uint8_t *p) {
    return (vf){_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16)))};
}
static inline vf vf_f32(const uint8_t *p) { return (vf){_mm256_loadu_ps((const float *)p), _mm256_loadu_ps((const float *)(p + 32))}; }
static inline vf vf_cvt(vi a) { return (vf){_mm256_cvtepi32_ps(a.l), _mm256_cvtepi32_ps(a.h)}; }
static inline vf vf_mul(vf a, vf b) { return (vf){_mm256_mul_ps(a.l, b.l), _mm256_mul_ps(a.h, b.h)}; }
static inline vf vf_fmadd(vf a, vf b, vf c) { return (vf){_mm256_fmadd_ps(a.l, b.l, c.l), _mm256_fmadd_ps(a.h, b.h, c.h)}; }
static inline vf vf_fnmadd(vf a, vf b, vf c) { return (vf){_mm256_fnmadd_ps(a.l, b.l, c.l), _mm256_fnmadd_ps(a.h, b.h, c.h)}; }
static inline void vf_store(float *p, vf v) {
    _mm256_storeu_ps(p, v.l);
    _mm256_storeu_ps(p + 8, v.h);
}
#ifdef LI_VNNI
#define LP_XOR_Q8 1
#else
#define LP_XOR_Q8 0 /* the sign trick: |w| times a with w's sign (|w|, |a| <= 127: no saturation) */
#endif
#endif


/* Run CALL(R) over activation rows [0, n) in tiles of LP_R, then the rest as one tile
 * (CALL sees j, the tile's first row). */
#if LP_R == 8
#define LP_TAIL_BIG(CALL) case 4: CALL(4); break; case 5: CALL(5); break; case 6: CALL(6); break; default: CALL(7); break;
#else
#define LP_TAIL_BIG(CALL) default: break;
#endif
#define LP_TILES(CALL)                                                       \
    for (int64_t j = 0; j < n;) {                                            \
        const int64_t left = n - j;                                          \
        if (left >= LP_R) {                                                  \
            CALL(LP_R);                                                      \
            j += LP_R;                                                       \
            continue;                                                        \
        }                                                                    \
        switch (left) {                                                      \
        case 1: CALL(1); break;                                              \
        case 2: CALL(2); break;                                              \
        case 3: CALL(3); break;                                              \
        LP_TAIL_BIG(CALL)                                                    \
        }                                                                    \
        j = n;                                                               \
    }

#endif /* LP_R */

#endif
