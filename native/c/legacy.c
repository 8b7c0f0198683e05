/* localinfer native kernels: the "legacy" block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and
 * F32/F16/BF16 rows, against activations.
 *
 * Activations for the legacy types are quantized once per matmul into one internal
 * format, "q8a", kept as three arrays per row (structure of arrays):
 *   qs[k]     int8   round(x / d), rounded half away from zero (ggml's roundf)
 *   d[k/32]   float  amax/127 of each 32-block, rounded to fp16 and widened back
 *   s[k/32]   float  d * sum(qs) of the block (exact: |sum| <= 4064 fits a float)
 * The values (d, qs) are exactly those of ggml's block_q8_0 / block_q8_1; the scales
 * are only kept as float32 so the dots need no conversion, and s is not rounded to
 * fp16 as ggml's q8_1 does. With s every legacy type is an unsigned-by-signed byte dot
 * plus a per-block correction:
 *   Q4_0: d_w*(q-8)   -> d_w*d_a*sum(q*a) - 8*d_w*s      Q4_1: d_w*q+m -> ... + m*s
 *   Q5_0: d_w*(q-16)  -> d_w*d_a*sum(q*a) - 16*d_w*s     Q5_1: d_w*q+m -> ... + m*s
 *   Q8_0: signed by signed (sign trick), no correction.
 * li_quantize_row_q8_0/_q8_1 write ggml's own block layouts, for tests and callers
 * that want them.
 *
 * Each row function computes rows [r0, r1) of one weight matrix against n activation
 * rows: y[j*ldy + r] = dot(w row r, activation row j). Weight rows are the outer loop
 * and activation rows are tiled by up to 4, so every weight block is loaded and
 * unpacked once per tile.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#define QK 32

typedef struct {
    const int8_t *qs; /* [n][k] */
    const float *d;   /* [n][k/32] */
    const float *s;   /* [n][k/32] */
} li_q8a;

static inline uint16_t load_u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static inline uint32_t load_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* ---- AVX2 building blocks ---------------------------------------------------------- */

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define LI_SIMD 1

/* 16 bytes at p in the low lane, 16 bytes at q in the high lane: a load, a broadcast load
 * and a blend (on Zen 3 a vinserti128 from memory takes a whole cycle of a shuffle pipe) */
static inline __m256i load2x128(const uint8_t *p, const uint8_t *q) {
    return _mm256_blend_epi32(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p)),
                              _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)q)), 0xF0);
}

#endif

/* ---- activation quantization ------------------------------------------------------- */

/* Layout of one quantized activation row ("q8a"), private to this file.
 * Portable build: qs in natural order, d[b] and s[b] one float per block.
 * AVX2 build: blocks go in pairs (2p, 2p+1), so one 256-bit register holds 16 values
 * of each block of a pair, matching how the weights' nibbles unpack:
 *   qs of a pair (64 bytes): [b0 0..15 | b1 0..15 | b0 16..31 | b1 16..31]
 * A last unpaired block keeps natural order. The scales (one float per block in d and
 * in s, as in the portable build) are permuted inside each octet of blocks (8o..8o+7)
 * to the order the dots reduce to, blocks [0 2 4 6 1 3 5 7] (LI_OCTET_LANE): one
 * register of 8 int32 block sums then takes one convert and one multiply-add per octet.
 * A last partial octet is laid out as a whole one, its missing blocks' scales 0. */
int64_t li_q8a_scale_stride(int64_t k) {
#ifdef LI_SIMD
    return (k / QK + 7) & ~(int64_t)7;
#else
    return k / QK;
#endif
}

/* where block bl keeps its d and s */
static inline int64_t scale_pos(int64_t bl) {
#ifdef LI_SIMD
    return (bl & ~(int64_t)7) + LI_OCTET_LANE(bl & 7);
#else
    return bl;
#endif
}

/* One 32-block: writes qs[0..15] to lo and qs[16..31] to hi, d = amax/127 to *dout,
 * and returns the sum of the qs. */
static inline int quantize_block(const float *x, int8_t *lo, int8_t *hi, float *dout) {
#if defined(__AVX2__)
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
    __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
    __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v0, absmask), _mm256_and_ps(v1, absmask)),
                             _mm256_max_ps(_mm256_and_ps(v2, absmask), _mm256_and_ps(v3, absmask)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    *dout = d;
    const __m256 vid = _mm256_set1_ps(id);
    const __m256 signmask = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u));
    const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    __m256i q[4];
    const __m256 vs[4] = {v0, v1, v2, v3};
    for (int i = 0; i < 4; i++) {
        /* round half away from zero: trunc, then one more where the dropped part is >= 1/2 */
        const __m256 v = _mm256_mul_ps(vs[i], vid);
        const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        const __m256 f = _mm256_andnot_ps(signmask, _mm256_sub_ps(v, t));
        const __m256 up = _mm256_and_ps(_mm256_cmp_ps(f, half, _CMP_GE_OQ), _mm256_or_ps(_mm256_and_ps(v, signmask), one));
        q[i] = _mm256_cvttps_epi32(_mm256_add_ps(t, up));
    }
    const __m256i sum32 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum32), _mm256_extracti128_si256(sum32, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
    /* 32 int32 -> 32 int8; the packs work per 128-bit lane, so restore the order after */
    const __m256i p = _mm256_permutevar8x32_epi32(
        _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3])),
        _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm_storeu_si128((__m128i *)lo, _mm256_castsi256_si128(p));
    _mm_storeu_si128((__m128i *)hi, _mm256_extracti128_si256(p, 1));
    return _mm_cvtsi128_si32(s4);
#else
    float amax = 0.0f;
    for (int i = 0; i < QK; i++) {
        const float a = fabsf(x[i]);
        if (a > amax) amax = a;
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    *dout = d;
    int sum = 0;
    for (int i = 0; i < QK; i++) {
        const int q = (int)li_round_away(x[i] * id);
        (i < 16 ? lo : hi - 16)[i] = (int8_t)q;
        sum += q;
    }
    return sum;
#endif
}

/* Blocks [b0, b1) of n rows of k values counted flat (block b is row b / nb), into one of
 * three layouts:
 *   LI_Q8A_PAIRS: the row dots' (above): row j's qs at qs + j*k, its scales at
 *                 d/s + j*li_q8a_scale_stride(k);
 *   LI_Q8A_PLAIN: natural order whatever the build, scales k/32 apart (amx.c's li_amx_rows);
 *   LI_Q8A_TILES: AMX B tiles of 16 rows (amx.c's li_amx_rows_exact): block bl of row
 *                 16t + i has its values g*4 .. g*4+3 at qs + (t*nb + bl)*512 + g*64 + i*4,
 *                 its scales at d/s + (t*nb + bl)*16 + i. */
void li_quantize_q8a(const float *x, int64_t k, int8_t *qs, float *d, float *s, int64_t b0, int64_t b1, int layout) {
    const int64_t nb = k / QK, ss = layout == LI_Q8A_PLAIN ? nb : li_q8a_scale_stride(k);
    for (int64_t b = b0; b < b1; b++) {
        const int64_t j = b / nb, bl = b - j * nb;
        float draw;
        if (layout == LI_Q8A_TILES) {
            int8_t v[QK];
            const int sum = quantize_block(x + b * QK, v, v + 16, &draw);
            const float dv = li_fp16_to_fp32(li_fp32_to_fp16(draw));
            const int64_t at = (j / 16) * nb + bl, i = j % 16;
            for (int g = 0; g < QK / 4; g++) memcpy(qs + at * 512 + g * 64 + i * 4, v + g * 4, 4);
            d[at * 16 + i] = dv;
            s[at * 16 + i] = dv * (float)sum;
            continue;
        }
        int8_t *rq = qs + j * k;
        float *rd = d + j * ss, *rs = s + j * ss;
        int64_t lo, hi;
#ifdef LI_SIMD
        if (layout == LI_Q8A_PAIRS && bl < (nb & ~(int64_t)1)) {
            lo = (bl >> 1) * 64 + (bl & 1) * 16;
            hi = lo + 32;
        } else {
            lo = bl * QK;
            hi = lo + 16;
        }
#else
        lo = bl * QK;
        hi = lo + 16;
#endif
        const int sum = quantize_block(x + b * QK, rq + lo, rq + hi, &draw);
        const float dv = li_fp16_to_fp32(li_fp32_to_fp16(draw));
        const int64_t sc = layout == LI_Q8A_PLAIN ? bl : scale_pos(bl);
        rd[sc] = dv;
        rs[sc] = dv * (float)sum;
        if (layout == LI_Q8A_PAIRS && bl == nb - 1) /* a last partial octet's missing blocks */
            for (int64_t m = nb; m < ss; m++) rd[scale_pos(m)] = rs[scale_pos(m)] = 0.0f;
    }
}

/* Blocks [b0, b1) of n rows of k values counted flat, for packed.c: values in natural
 * order at qs + j*k, the fp16-rounded scale and the integer sum at d/sum + j*(k/32). */
void li_quantize_q8s(const float *x, int64_t k, int8_t *qs, float *d, int32_t *sum, int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; b++) {
        float draw;
        sum[b] = quantize_block(x + b * QK, qs + b * QK, qs + b * QK + 16, &draw);
        d[b] = li_fp16_to_fp32(li_fp32_to_fp16(draw));
    }
}

/* ggml's block_q8_0 {fp16 d; int8 qs[32]} */
void li_quantize_row_q8_0(const float *x, void *y, int64_t k) {
    uint8_t *out = (uint8_t *)y;
    for (int64_t b = 0; b < k / QK; b++, out += 34) {
        float d;
        quantize_block(x + b * QK, (int8_t *)(out + 2), (int8_t *)(out + 18), &d);
        const uint16_t d16 = li_fp32_to_fp16(d);
        memcpy(out, &d16, 2);
    }
}

/* ggml's block_q8_1 {fp16 d; fp16 s; int8 qs[32]}, s = d * sum(qs) with the fp32 d */
void li_quantize_row_q8_1(const float *x, void *y, int64_t k) {
    uint8_t *out = (uint8_t *)y;
    for (int64_t b = 0; b < k / QK; b++, out += 36) {
        float d;
        const int sum = quantize_block(x + b * QK, (int8_t *)(out + 4), (int8_t *)(out + 20), &d);
        const uint16_t d16 = li_fp32_to_fp16(d), s16 = li_fp32_to_fp16((float)sum * d);
        memcpy(out, &d16, 2);
        memcpy(out + 2, &s16, 2);
    }
}

/* ---- legacy dots: one weight row, R activation rows --------------------------------- */

/* KIND: 0 = Q4_0, 1 = Q4_1, 2 = Q5_0, 3 = Q5_1, 4 = Q8_0 */
#define BSZ(KIND) ((KIND) == 0 ? 18 : (KIND) == 1 ? 20 : (KIND) == 2 ? 22 : (KIND) == 3 ? 24 : 34)
#define QOFF(KIND) ((KIND) == 0 ? 2 : (KIND) == 1 ? 4 : (KIND) == 2 ? 6 : (KIND) == 3 ? 8 : 2)
#define HAS_M(KIND) ((KIND) == 1 || (KIND) == 3)
#define HAS_QH(KIND) ((KIND) == 2 || (KIND) == 3)
/* the per-block correction: value offset times d_w (Q4_0, Q5_0), or m (Q4_1, Q5_1) */
#define CORR(KIND) ((KIND) == 0 ? -8.0f : (KIND) == 2 ? -16.0f : (KIND) == 4 ? 0.0f : 1.0f)

#ifdef LI_SIMD
/* One pair of weight blocks (b0, b0 + BSZ) unpacked as the activations' pair layout:
 * lo = values 0..15 of both blocks, hi = values 16..31 (bytes 0..31 / raw int8 for Q8_0). */
static inline __attribute__((always_inline)) void unpack_pair(const int KIND, const uint8_t *b0, __m256i *lo,
                                                              __m256i *hi) {
    const uint8_t *b1 = b0 + BSZ(KIND);
    if (KIND == 4) {
        *lo = load2x128(b0 + 2, b1 + 2);
        *hi = load2x128(b0 + 18, b1 + 18);
        return;
    }
    const __m256i v = load2x128(b0 + QOFF(KIND), b1 + QOFF(KIND));
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i l = _mm256_and_si256(v, m4);
    __m256i h = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    if (HAS_QH(KIND)) {
        const int qo = KIND == 2 ? 2 : 4;
#if defined(__AVX512BW__) && defined(__AVX512VL__)
        /* AVX-512: the fifth bits are a byte mask as they stand; a masked add sets 0x10 */
        const uint32_t q0 = load_u32(b0 + qo), q1 = load_u32(b1 + qo);
        const __m256i x10 = _mm256_set1_epi8(0x10);
        l = _mm256_mask_add_epi8(l, (__mmask32)((q0 & 0xFFFF) | q1 << 16), l, x10);
        h = _mm256_mask_add_epi8(h, (__mmask32)(q0 >> 16 | (q1 & 0xFFFF0000u)), h, x10);
#else
        int32_t q0, q1; /* qh of b0 in the low lane, of b1 in the high lane: two broadcast loads, a blend */
        memcpy(&q0, b0 + qo, 4);
        memcpy(&q1, b1 + qo, 4);
        const __m256i q = _mm256_blend_epi32(_mm256_set1_epi32(q0), _mm256_set1_epi32(q1), 0xF0);
        l = _mm256_or_si256(l, li_bits_to_0x10(q, _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                                 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)));
        h = _mm256_or_si256(h, li_bits_to_0x10(q, _mm256_setr_epi8(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
                                                                 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3)));
#endif
    }
    *lo = l;
    *hi = h;
}

/* Are a pair's products int32 sums (Q8_0, or any type with VNNI) or int16 (Q4/Q5 on AVX2)? */
#ifdef LI_VNNI
#define SUMS32(KIND) 1
#else
#define SUMS32(KIND) ((KIND) == 4)
#endif

/* A pair's products with one activation pair (64 bytes at y), partly reduced: Q4/Q5 as
 * int16 sums of 4 products (<= 4*31*128, so two of them still fit an int16), or with VNNI
 * int32 sums of 8; Q8_0 as int32 sums of 8. Per 128-bit lane: the block of that lane. */
static inline __attribute__((always_inline)) __m256i pair_products(const int KIND, __m256i lo, __m256i hi,
                                                                   const int8_t *y) {
    if (KIND == 4) return _mm256_add_epi32(li_dot_i8_i8(lo, y), li_dot_i8_i8(hi, y + 32));
#ifdef LI_VNNI
    const __m256i s = li_dpbusd(_mm256_setzero_si256(), lo, _mm256_loadu_si256((const __m256i *)y));
    return li_dpbusd(s, hi, _mm256_loadu_si256((const __m256i *)(y + 32)));
#else
    return _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)y)),
                            _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(y + 32))));
#endif
}

/* two pairs' products (pair_products) -> per lane [sums of pair A's block | of B's]:
 * 4 int16 sums of 8 products (<= 8*31*128) each, or 2 int32 sums (SUMS32).
 * (vphadd costs 2 cycles on Zen 3; two unpacks and an add are cheaper.) */
static inline __attribute__((always_inline)) __m256i hadd_pairs(const int KIND, __m256i a, __m256i b) {
    const __m256i l = _mm256_unpacklo_epi64(a, b), h = _mm256_unpackhi_epi64(a, b);
    return SUMS32(KIND) ? _mm256_add_epi32(l, h) : _mm256_add_epi16(l, h);
}

/* the two halves of an octet (hadd_pairs of pairs 0,1 and of 2,3), as int32 [A A B B]
 * and [C C D D] per lane -> int32 block sums in the octet order [0 2 4 6 1 3 5 7] */
static inline __attribute__((always_inline)) __m256i octet_sums(const int KIND, __m256i h0, __m256i h1) {
    if (!SUMS32(KIND)) {
        h0 = li_madd1(h0);
        h1 = li_madd1(h1);
    }
    const __m256 a = _mm256_castsi256_ps(h0), b = _mm256_castsi256_ps(h1);
    return _mm256_add_epi32(_mm256_castps_si256(_mm256_shuffle_ps(a, b, 0x88)),
                            _mm256_castps_si256(_mm256_shuffle_ps(a, b, 0xDD)));
}

/* fp16 at p + i*stride for i = 0..3, packed in a uint64 */
static inline uint64_t pack4_u16(const uint8_t *p, int64_t stride) {
    uint64_t v = (uint64_t)load_u16(p) | (uint64_t)load_u16(p + stride) << 16 | (uint64_t)load_u16(p + 2 * stride) << 32 |
                 (uint64_t)load_u16(p + 3 * stride) << 48;
#if defined(__GNUC__)
    __asm__("" : "+r"(v)); /* keep it scalar: gcc's vectorized packing costs more vector uops */
#endif
    return v;
}

/* the d (and m) of an octet of weight blocks at w, in the octet order [0 2 4 6 1 3 5 7] */
static inline __attribute__((always_inline)) void octet_scales(const int KIND, const uint8_t *w, __m256 *d8,
                                                               __m256 *m8) {
    const int64_t bs = BSZ(KIND);
    if (HAS_M(KIND)) { /* u32 d|m<<16 per block; [0 2 1 3] and [4 6 5 7] -> shufps picks d's and m's */
        const __m128i p = _mm_set_epi64x((int64_t)(load_u32(w + bs) | (uint64_t)load_u32(w + 3 * bs) << 32),
                                         (int64_t)(load_u32(w) | (uint64_t)load_u32(w + 2 * bs) << 32));
        const __m128i q = _mm_set_epi64x((int64_t)(load_u32(w + 5 * bs) | (uint64_t)load_u32(w + 7 * bs) << 32),
                                         (int64_t)(load_u32(w + 4 * bs) | (uint64_t)load_u32(w + 6 * bs) << 32));
        const __m256 pf = _mm256_cvtph_ps(p), qf = _mm256_cvtph_ps(q);
        *d8 = _mm256_shuffle_ps(pf, qf, 0x88);
        *m8 = _mm256_shuffle_ps(pf, qf, 0xDD);
    } else {
        *d8 = _mm256_cvtph_ps(_mm_set_epi64x((int64_t)pack4_u16(w + bs, 2 * bs), (int64_t)pack4_u16(w, 2 * bs)));
        *m8 = *d8;
    }
}
#endif

#ifdef LI_SIMD
/* a block's 32 values in natural order, as the weights' pairs hold them (unsigned but Q8_0) */
static inline __attribute__((always_inline)) __m256i odd_values(const int KIND, const uint8_t *b) {
    if (KIND == 4) return _mm256_loadu_si256((const __m256i *)(b + 2));
    return li_legacy_values_v(b + QOFF(KIND), HAS_QH(KIND) ? load_u32(b + (KIND == 2 ? 2 : 4)) : 0, HAS_QH(KIND));
}

/* One block's products in a pair's form (pair_products) with the block as the pair's first
 * and a zero second: v holds its 32 values in natural order, a its activations likewise. */
static inline __attribute__((always_inline)) __m256i odd_products(const int KIND, __m256i v, __m256i a) {
    __m256i p;
    if (SUMS32(KIND))
        p = KIND == 4 ? li_dot_i8_i8v(v, a) : li_dot_u8_i8v(v, a);
    else
        p = _mm256_maddubs_epi16(v, a);
    const __m128i l = _mm256_castsi256_si128(p), h = _mm256_extracti128_si256(p, 1);
    return _mm256_zextsi128_si256(SUMS32(KIND) ? _mm_add_epi32(l, h) : _mm_add_epi16(l, h));
}

/* the d (and m) of the first rem (< 8) blocks at w as octet_scales orders them, 0 for the rest */
static inline __attribute__((always_inline)) void tail_scales(const int KIND, const uint8_t *w, int64_t rem, __m256 *d8,
                                                              __m256 *m8) {
    const int64_t bs = BSZ(KIND);
    if (rem <= 2) { /* the common case (576 columns): no loop, which cost a quarter of a matvec */
        const float d0 = li_fp16_to_fp32(load_u16(w)), d1 = rem == 2 ? li_fp16_to_fp32(load_u16(w + bs)) : 0.0f;
        *d8 = _mm256_setr_ps(d0, 0.0f, 0.0f, 0.0f, d1, 0.0f, 0.0f, 0.0f);
        if (!HAS_M(KIND)) {
            *m8 = *d8;
            return;
        }
        const float m0 = li_fp16_to_fp32(load_u16(w + 2)), m1 = rem == 2 ? li_fp16_to_fp32(load_u16(w + bs + 2)) : 0.0f;
        *m8 = _mm256_setr_ps(m0, 0.0f, 0.0f, 0.0f, m1, 0.0f, 0.0f, 0.0f);
        return;
    }
    uint64_t d[2] = {0, 0}, m[2] = {0, 0}; /* even blocks, odd blocks: fp16 in lane order */
    for (int64_t q = 0; q < rem; q++) {
        d[q & 1] |= (uint64_t)load_u16(w + q * bs) << (16 * (q >> 1));
        if (HAS_M(KIND)) m[q & 1] |= (uint64_t)load_u16(w + q * bs + 2) << (16 * (q >> 1));
    }
    *d8 = _mm256_cvtph_ps(_mm_set_epi64x((int64_t)d[1], (int64_t)d[0]));
    *m8 = HAS_M(KIND) ? _mm256_cvtph_ps(_mm_set_epi64x((int64_t)m[1], (int64_t)m[0])) : *d8;
}
/* The blocks after the last octet (rem = nb % 8 of them, starting at wo) as one more octet:
 * the int32 block sums of each of the R rows in octet lane order, and the weights' d and m
 * likewise (tail_scales). Kept out of line: inlined, it cost the octet loop of the 5-bit
 * types a tenth of its speed, even where no row has a tail. */
static __attribute__((noinline)) void tail_sums(const int KIND, const int R, const uint8_t *wo, int64_t rem, int64_t no,
                                                int64_t nb, const int8_t *const *aq, __m256i *sums, __m256 *d8,
                                                __m256 *m8) {
    const int64_t bs = BSZ(KIND);
    tail_scales(KIND, wo, rem, d8, m8);
    if (rem <= 2) { /* one pair or one block: each block's sum into its lane (0, 4) within
                     * its half; the other lanes' sums meet scales of 0 and add nothing */
        __m256i lo, hi;
        if (rem == 2) unpack_pair(KIND, wo, &lo, &hi);
        else lo = hi = odd_values(KIND, wo);
        for (int r = 0; r < R; r++) {
            __m256i p = rem == 2 ? pair_products(KIND, lo, hi, aq[r] + no * 4 * 64)
                                 : odd_products(KIND, lo, _mm256_loadu_si256((const __m256i *)(aq[r] + no * 8 * QK)));
            if (!SUMS32(KIND)) p = li_madd1(p);
            p = _mm256_add_epi32(p, _mm256_shuffle_epi32(p, 0x4E));
            sums[r] = _mm256_add_epi32(p, _mm256_shuffle_epi32(p, 0xB1));
        }
        return;
    }
    /* up to 4 pairs, the missing ones 0, reduced as an octet */
    const __m256i zero = _mm256_setzero_si256();
    __m256i pp[LI_TILE][4];
    for (int r = 0; r < R; r++) pp[r][0] = pp[r][1] = pp[r][2] = pp[r][3] = zero;
    for (int64_t j = 0; j < rem / 2; j++) {
        __m256i lo, hi;
        unpack_pair(KIND, wo + 2 * j * bs, &lo, &hi);
        for (int r = 0; r < R; r++) pp[r][j] = pair_products(KIND, lo, hi, aq[r] + (no * 4 + j) * 64);
    }
    if (rem & 1) { /* a last unpaired block, natural order on both sides: as a pair's first block */
        const __m256i v = odd_values(KIND, wo + (rem - 1) * bs);
        for (int r = 0; r < R; r++)
            pp[r][rem / 2] = odd_products(KIND, v, _mm256_loadu_si256((const __m256i *)(aq[r] + (nb - 1) * QK)));
    }
    for (int r = 0; r < R; r++)
        sums[r] = octet_sums(KIND, hadd_pairs(KIND, pp[r][0], pp[r][1]), hadd_pairs(KIND, pp[r][2], pp[r][3]));
}
#endif

/* R activation rows (1..LI_TILE) at a: row r's qs at a->qs + r*k, its scales at + r*ss */
static inline __attribute__((always_inline)) void dot_legacy(const int KIND, const int R, int64_t k, int64_t ss,
                                                             const uint8_t *w, const li_q8a *a, float *out) {
    const int64_t nb = k / QK;
    const int8_t *aq[LI_TILE];
    const float *ad[LI_TILE], *as[LI_TILE];
    for (int r = 0; r < R; r++) {
        aq[r] = a->qs + r * k;
        ad[r] = a->d + r * ss;
        as[r] = a->s + r * ss;
    }
#ifdef LI_SIMD
    /* acc: the products; accc: the corrections (d_w or m times s), kept apart (two short
     * dependency chains). Every R sums in the same order, so a row's result never depends
     * on the rows beside it: a K-row speculative verify matches 1-row decoding bit for bit. */
    const __m256 c = _mm256_set1_ps(CORR(KIND));
    __m256 acc[LI_TILE], accc[LI_TILE];
    for (int r = 0; r < R; r++) acc[r] = accc[r] = _mm256_setzero_ps();
    const int64_t bs = BSZ(KIND), no = nb / 8;
    for (int64_t o = 0; o < no; o++) {
        const uint8_t *wo = w + o * 8 * bs;
        __m256i h[LI_TILE][2];
        for (int half = 0; half < 2; half++) {
            __m256i lo, hi, pa[LI_TILE];
            const int64_t p = o * 4 + half * 2;
            unpack_pair(KIND, wo + half * 4 * bs, &lo, &hi);
            for (int r = 0; r < R; r++) pa[r] = pair_products(KIND, lo, hi, aq[r] + p * 64);
            unpack_pair(KIND, wo + (half * 4 + 2) * bs, &lo, &hi);
            for (int r = 0; r < R; r++) h[r][half] = hadd_pairs(KIND, pa[r], pair_products(KIND, lo, hi, aq[r] + p * 64 + 64));
        }
        __m256 d8, m8;
        octet_scales(KIND, wo, &d8, &m8);
        for (int r = 0; r < R; r++) {
            const __m256 sums = _mm256_cvtepi32_ps(octet_sums(KIND, h[r][0], h[r][1]));
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d8, _mm256_loadu_ps(ad[r] + o * 8)), sums, acc[r]);
            if (KIND != 4) accc[r] = _mm256_fmadd_ps(m8, _mm256_loadu_ps(as[r] + o * 8), accc[r]);
        }
    }
    /* The blocks after the last octet (nb % 8 of them) as one more, the missing blocks'
     * scales 0: the same operations as a whole octet's, so every output is one
     * sum of eight lanes, each block's float terms added to its lane as the octets add
     * them. (amx.c's exact path repeats these operations.) */
    const int64_t rem = nb - no * 8;
    if (rem) {
        __m256 d8, m8;
        __m256i sums[LI_TILE];
        tail_sums(KIND, R, w + no * 8 * bs, rem, no, nb, aq, sums, &d8, &m8);
        for (int r = 0; r < R; r++) {
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d8, _mm256_loadu_ps(ad[r] + no * 8)), _mm256_cvtepi32_ps(sums[r]), acc[r]);
            if (KIND != 4) accc[r] = _mm256_fmadd_ps(m8, _mm256_loadu_ps(as[r] + no * 8), accc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = li_hsum8(KIND != 4 ? _mm256_fmadd_ps(c, accc[r], acc[r]) : acc[r]);
#else
    float acc[LI_TILE] = {0}, corr[LI_TILE] = {0};
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * BSZ(KIND);
        const float dw = li_fp16_to_fp32(load_u16(blk));
        const float mw = HAS_M(KIND) ? li_fp16_to_fp32(load_u16(blk + 2)) : 0.0f;
        int8_t q[QK];
        if (KIND == 4) {
            memcpy(q, blk + 2, QK);
        } else {
            li_legacy_values(blk + QOFF(KIND), HAS_QH(KIND) ? load_u32(blk + (KIND == 2 ? 2 : 4)) : 0, q);
        }
        for (int r = 0; r < R; r++) {
            const int8_t *y = aq[r] + b * QK;
            int32_t sum = 0;
            for (int i = 0; i < QK; i++) sum += (int32_t)q[i] * (int32_t)y[i];
            acc[r] += dw * ad[r][b] * (float)sum;
            corr[r] += (HAS_M(KIND) ? mw : dw) * as[r][b];
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r] + CORR(KIND) * corr[r];
#endif
}

/* rows [r0, r1) of a legacy matrix against n quantized activation rows */
static inline __attribute__((always_inline)) void rows_legacy(const int KIND, const uint8_t *w, int64_t row_bytes,
                                                              int64_t r0, int64_t r1, int64_t k, const li_q8a *a,
                                                              int64_t n, float *y, int64_t ldy) {
    const int64_t ss = li_q8a_scale_stride(k);
    float res[LI_TILE];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = w + r * row_bytes;
        li_prefetch_row(wr, row_bytes);
        if (n == 1) {
            dot_legacy(KIND, 1, k, ss, wr, a, res);
            y[r] = res[0];
            continue;
        }
        for (int64_t j = 0, R; j < n; j += R) {
            const li_q8a t = {a->qs + j * k, a->d + j * ss, a->s + j * ss};
            R = li_tile_rows(n - j);
            switch (R) {
            case 1: dot_legacy(KIND, 1, k, ss, wr, &t, res); break;
            case 2: dot_legacy(KIND, 2, k, ss, wr, &t, res); break;
            case 3: dot_legacy(KIND, 3, k, ss, wr, &t, res); break;
            case 4: dot_legacy(KIND, 4, k, ss, wr, &t, res); break;
#if LI_TILE == 8
            default: dot_legacy(KIND, 8, k, ss, wr, &t, res); break;
#endif
            }
            for (int64_t i = 0; i < R; i++) y[(j + i) * ldy + r] = res[i];
        }
    }
}

#define LI_ROWS_FN(name, KIND)                                                                                  \
    void name(const void *w, int64_t row_bytes, int64_t r0, int64_t r1, int64_t k, const li_q8a *a, int64_t n, \
              float *y, int64_t ldy) {                                                                          \
        rows_legacy(KIND, (const uint8_t *)w, row_bytes, r0, r1, k, a, n, y, ldy);                             \
    }

LI_ROWS_FN(li_rows_q4_0, 0)
LI_ROWS_FN(li_rows_q4_1, 1)
LI_ROWS_FN(li_rows_q5_0, 2)
LI_ROWS_FN(li_rows_q5_1, 3)
LI_ROWS_FN(li_rows_q8_0, 4)

/* ---- float rows: F32, F16 and BF16 weights against float activations ---------------- */

enum { W_F32 = 0, W_F16 = 1, W_BF16 = 2 };

static inline float bf16_to_fp32(uint16_t h) {
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* WF: the weights' format, W_F32, W_F16 or W_BF16 */
static inline __attribute__((always_inline)) void dot_float(const int WF, const int R, int64_t k, const void *w,
                                                            const float *x, float *out) {
    const uint16_t *wh = (const uint16_t *)w;
    const float *wf = (const float *)w;
    int64_t i = 0;
#ifdef LI_SIMD
    /* four accumulators a row, summed alike for every R: a row's result never depends on
     * the rows beside it (a speculative verify must match decoding bit for bit) */
    __m256 acc[2][4];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < 4; j++) acc[r][j] = _mm256_setzero_ps();
#define LOADW(off)                                                                                                \
    (WF == W_F16    ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wh + i + (off))))                          \
     : WF == W_BF16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(wh + i + (off)))), 16)) \
                    : _mm256_loadu_ps(wf + i + (off)))
    for (; i + 32 <= k; i += 32) {
        const __m256 w0 = LOADW(0), w1 = LOADW(8), w2 = LOADW(16), w3 = LOADW(24);
        for (int r = 0; r < R; r++) {
            const float *xr = x + r * k + i;
            acc[r][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xr), acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xr + 8), acc[r][1]);
            acc[r][2] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xr + 16), acc[r][2]);
            acc[r][3] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xr + 24), acc[r][3]);
        }
    }
    for (; i + 8 <= k; i += 8) {
        const __m256 w0 = LOADW(0);
        for (int r = 0; r < R; r++) acc[r][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * k + i), acc[r][0]);
    }
#undef LOADW
    for (int r = 0; r < R; r++)
        out[r] = li_hsum8(_mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]), _mm256_add_ps(acc[r][2], acc[r][3])));
#else
    for (int r = 0; r < R; r++) out[r] = 0.0f;
#endif
    for (; i < k; i++) {
        const float wv = WF == W_F16 ? li_fp16_to_fp32(wh[i]) : WF == W_BF16 ? bf16_to_fp32(wh[i]) : wf[i];
        for (int r = 0; r < R; r++) out[r] += wv * x[r * k + i];
    }
}

static inline __attribute__((always_inline)) void rows_float(const int WF, const void *w, int64_t row_bytes,
                                                             int64_t r0, int64_t r1, int64_t k, const float *x,
                                                             int64_t n, float *y, int64_t ldy) {
    float res[4];
    for (int64_t r = r0; r < r1; r++) {
        const void *wr = (const uint8_t *)w + r * row_bytes;
        li_prefetch_row(wr, row_bytes);
        if (n == 1) {
            dot_float(WF, 1, k, wr, x, res);
            y[r] = res[0];
            continue;
        }
        for (int64_t j = 0; j < n; j += 2) { /* tiles of 2: four accumulators a row fill the registers */
            const float *xt = x + j * k;
            const int64_t R = n - j < 2 ? n - j : 2;
            if (R == 1)
                dot_float(WF, 1, k, wr, xt, res);
            else
                dot_float(WF, 2, k, wr, xt, res);
            for (int64_t i = 0; i < R; i++) y[(j + i) * ldy + r] = res[i];
        }
    }
}

void li_rows_f16(const void *w, int64_t row_bytes, int64_t r0, int64_t r1, int64_t k, const float *x, int64_t n,
                 float *y, int64_t ldy) {
    rows_float(W_F16, w, row_bytes, r0, r1, k, x, n, y, ldy);
}

void li_rows_f32(const void *w, int64_t row_bytes, int64_t r0, int64_t r1, int64_t k, const float *x, int64_t n,
                 float *y, int64_t ldy) {
    rows_float(W_F32, w, row_bytes, r0, r1, k, x, n, y, ldy);
}

void li_rows_bf16(const void *w, int64_t row_bytes, int64_t r0, int64_t r1, int64_t k, const float *x, int64_t n,
                  float *y, int64_t ldy) {
    rows_float(W_BF16, w, row_bytes, r0, r1, k, x, n, y, ldy);
}
