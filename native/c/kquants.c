/* K-quant kernels: Q8_K activation quantizer and Q4_K/Q5_K/Q6_K x Q8_K row dots.
 *
 * Block layouts and value semantics follow ggml's (GGUF) K-quants, QK_K = 256:
 *   Q4_K {fp16 d; fp16 dmin; u8 scales[12]; u8 qs[128]}             value = d*sc*q - dmin*m
 *   Q5_K {fp16 d; fp16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}  value = d*sc*q - dmin*m
 *   Q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; fp16 d}            value = d*sc*(q-32)
 * Q4_K/Q5_K carry 8 sub-blocks of 32 with 6-bit scale and 6-bit min packed in 12 bytes;
 * Q6_K carries 16 sub-blocks of 16 with 8-bit signed scales.
 *
 * Each dot sums integer products per super-block and applies the float scales once
 * per super-block; the mins of Q4_K/Q5_K go through the Q8_K block sums (bsums).
 */
#include "kernels.h"

#include <math.h>
#include <string.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define QK_K LI_QK_K

/* The n-row products take tiles of LI_TILE activation rows (kernels.h). Every row's sums run
 * in the same order for every tile size (and integer sums are exact), so a row's result never
 * depends on the rows beside it: a K-row verify equals decoding. */

#if defined(__GNUC__)
#define KQ_UNUSED __attribute__((unused))
#else
#define KQ_UNUSED
#endif

typedef struct {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qs[QK_K / 2];
} kq_block_q4_K;

typedef struct {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
} kq_block_q5_K;

typedef struct {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    uint16_t d;
} kq_block_q6_K;

_Static_assert(sizeof(kq_block_q4_K) == 144, "q4_K block size");
_Static_assert(sizeof(kq_block_q5_K) == 176, "q5_K block size");
_Static_assert(sizeof(kq_block_q6_K) == 210, "q6_K block size");
_Static_assert(sizeof(li_block_q8_K) == 292, "q8_K block size");

/* ---------------------------------------------------------------- helpers */

/* Round to nearest, ties to even, for |f| < 2^22 (the same trick ggml uses). */
static inline int kq_nearest_int(float f) {
    float v = f + 12582912.f;
    int32_t i;
    memcpy(&i, &v, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

/* ---------------------------------------------------------------- Q8_K quantizer */

/* One block the way ggml's quantize_row_q8_K_ref does it: the value of largest |x|
 * (the first one, keeping its sign) maps to -127; qs = min(127, round_even(x * iscale)). */
KQ_UNUSED static void kq_quantize_block_q8_K_scalar(const float *x, li_block_q8_K *y) {
    float max = 0.f, amax = 0.f;
    for (int j = 0; j < QK_K; j++) {
        const float ax = fabsf(x[j]);
        if (ax > amax) {
            amax = ax;
            max = x[j];
        }
    }
    if (amax == 0.f) {
        memset(y, 0, sizeof *y);
        return;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < QK_K; j++) {
        const int v = kq_nearest_int(iscale * x[j]);
        y->qs[j] = (int8_t)(v < 127 ? v : 127);
    }
    for (int j = 0; j < QK_K / 16; j++) {
        int sum = 0;
        for (int l = 0; l < 16; l++) sum += y->qs[j * 16 + l];
        y->bsums[j] = (int16_t)sum;
    }
    y->d = 1.f / iscale;
}

#if defined(__AVX2__)
/* Same results as the scalar block: |iscale * x| <= 127 (up to rounding of the product),
 * so the saturating packs clamp exactly like min(127, v), and cvtps rounds to nearest
 * even as the float trick of nearest_int does. */
static void kq_quantize_block_q8_K_avx2(const float *x, li_block_q8_K *y) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 vmax = _mm256_setzero_ps();
    for (int j = 0; j < QK_K; j += 8) vmax = _mm256_max_ps(vmax, _mm256_and_ps(_mm256_loadu_ps(x + j), abs_mask));
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float amax = _mm_cvtss_f32(m);
    if (!(amax > 0.f)) { /* zero (or NaN) block: leave it to the reference */
        kq_quantize_block_q8_K_scalar(x, y);
        return;
    }
    /* the first value whose |x| is amax, with its sign */
    const __m256 va = _mm256_set1_ps(amax);
    int first = 0;
    for (int j = 0; j < QK_K; j += 8) {
        const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), abs_mask), va, _CMP_EQ_OQ));
        if (hit) {
            first = j + __builtin_ctz((unsigned)hit);
            break;
        }
    }
    const float iscale = -127.f / x[first];
    const __m256 vs = _mm256_set1_ps(iscale);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i ones8 = _mm256_set1_epi8(1);
    const __m256i ones16 = _mm256_set1_epi16(1);
    __m256i part[8];
    for (int c = 0; c < 8; c++) {
        const float *xc = x + 32 * c;
        const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(vs, _mm256_loadu_ps(xc)));
        const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(vs, _mm256_loadu_ps(xc + 8)));
        const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(vs, _mm256_loadu_ps(xc + 16)));
        const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(vs, _mm256_loadu_ps(xc + 24)));
        /* packs work per 128-bit lane: dword t of w holds x-group (t % 4) * 8 + (t / 4) * 4 */
        const __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        const __m256i q = _mm256_permutevar8x32_epi32(w, perm);
        _mm256_storeu_si256((__m256i *)(y->qs + 32 * c), q);
        /* 8 int32 (maddubs: unsigned ones times signed q): lanes 0..3 sum bytes 0..15, 4..7 bytes 16..31 */
        part[c] = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16);
    }
    /* hadd twice: per 128-bit lane, one full sum per chunk; low lanes hold even bsums */
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(part[0], part[1]), _mm256_hadd_epi32(part[2], part[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(part[4], part[5]), _mm256_hadd_epi32(part[6], part[7]));
    /* a: low lane bsums 0,2,4,6, high 1,3,5,7; b: the same for 8..15 */
    const __m256i p = _mm256_packs_epi32(a, b); /* low: 0,2,4,6,8,10,12,14  high: 1,3,..,15 */
    const __m128i ev = _mm256_castsi256_si128(p), od = _mm256_extracti128_si256(p, 1);
    _mm_storeu_si128((__m128i *)y->bsums, _mm_unpacklo_epi16(ev, od));
    _mm_storeu_si128((__m128i *)(y->bsums + 8), _mm_unpackhi_epi16(ev, od));
    y->d = 1.f / iscale;
}
#endif

void li_quantize_row_q8_K(const float *x, void *vy, int64_t k) {
    li_block_q8_K *y = (li_block_q8_K *)vy;
    const int64_t nb = k / QK_K;
    for (int64_t i = 0; i < nb; i++) {
#if defined(__AVX2__)
        kq_quantize_block_q8_K_avx2(x + i * QK_K, y + i);
#else
        kq_quantize_block_q8_K_scalar(x + i * QK_K, y + i);
#endif
    }
}

/* ---------------------------------------------------------------- scalar dots */

KQ_UNUSED static float kq_dot_q4_K_scalar(int64_t nb, const kq_block_q4_K *x, const li_block_q8_K *y) {
    float sumf = 0.f;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *q4 = x[i].qs;
        const int8_t *q8 = y[i].qs;
        int32_t sumi = 0, summ = 0;
        for (int j = 0; j < QK_K / 64; j++) {
            int sc0, m0, sc1, m1;
            li_scale_min_k4(2 * j, x[i].scales, &sc0, &m0);
            li_scale_min_k4(2 * j + 1, x[i].scales, &sc1, &m1);
            int32_t s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                s0 += (q4[l] & 0x0f) * q8[l];
                s1 += (q4[l] >> 4) * q8[l + 32];
            }
            sumi += sc0 * s0 + sc1 * s1;
            summ += m0 * (y[i].bsums[4 * j] + y[i].bsums[4 * j + 1]) + m1 * (y[i].bsums[4 * j + 2] + y[i].bsums[4 * j + 3]);
            q4 += 32;
            q8 += 64;
        }
        sumf += y[i].d * (li_fp16_to_fp32(x[i].d) * (float)sumi - li_fp16_to_fp32(x[i].dmin) * (float)summ);
    }
    return sumf;
}

KQ_UNUSED static float kq_dot_q5_K_scalar(int64_t nb, const kq_block_q5_K *x, const li_block_q8_K *y) {
    float sumf = 0.f;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *q4 = x[i].qs;
        const uint8_t *qh = x[i].qh;
        const int8_t *q8 = y[i].qs;
        int32_t sumi = 0, summ = 0;
        for (int j = 0; j < QK_K / 64; j++) {
            int sc0, m0, sc1, m1;
            li_scale_min_k4(2 * j, x[i].scales, &sc0, &m0);
            li_scale_min_k4(2 * j + 1, x[i].scales, &sc1, &m1);
            const int u0 = 2 * j, u1 = 2 * j + 1;
            int32_t s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                s0 += ((q4[l] & 0x0f) | (((qh[l] >> u0) & 1) << 4)) * q8[l];
                s1 += ((q4[l] >> 4) | (((qh[l] >> u1) & 1) << 4)) * q8[l + 32];
            }
            sumi += sc0 * s0 + sc1 * s1;
            summ += m0 * (y[i].bsums[4 * j] + y[i].bsums[4 * j + 1]) + m1 * (y[i].bsums[4 * j + 2] + y[i].bsums[4 * j + 3]);
            q4 += 32;
            q8 += 64;
        }
        sumf += y[i].d * (li_fp16_to_fp32(x[i].d) * (float)sumi - li_fp16_to_fp32(x[i].dmin) * (float)summ);
    }
    return sumf;
}

KQ_UNUSED static float kq_dot_q6_K_scalar(int64_t nb, const kq_block_q6_K *x, const li_block_q8_K *y) {
    float sumf = 0.f;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *ql = x[i].ql;
        const uint8_t *qh = x[i].qh;
        const int8_t *sc = x[i].scales;
        const int8_t *q8 = y[i].qs;
        int32_t sumi = 0;
        for (int n = 0; n < QK_K / 128; n++) {
            int32_t s[8] = {0};
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                s[is + 0] += q1 * q8[l];
                s[is + 2] += q2 * q8[l + 32];
                s[is + 4] += q3 * q8[l + 64];
                s[is + 6] += q4 * q8[l + 96];
            }
            for (int t = 0; t < 8; t++) sumi += sc[t] * s[t];
            ql += 64;
            qh += 32;
            sc += 8;
            q8 += 128;
        }
        sumf += y[i].d * li_fp16_to_fp32(x[i].d) * (float)sumi;
    }
    return sumf;
}

/* ---------------------------------------------------------------- AVX2 dots */

#if defined(__AVX2__)


static inline uint32_t kq_load_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Unpack the 12 scale bytes of a Q4_K/Q5_K block: *sc gets the 8 six-bit scales as
 * bytes, *mn the 8 six-bit mins. Words a = bytes 0..3, b = 4..7, c = 8..11:
 *   scales 0..3 = a & 63, scales 4..7 = (c & 15) | (a >> 6) << 4,
 *   mins   0..3 = b & 63, mins   4..7 = (c >> 4) | (b >> 6) << 4. */
static inline void kq_unpack_scales(const uint8_t *q, uint64_t *sc, uint64_t *mn) {
    const uint32_t a = kq_load_u32(q), b = kq_load_u32(q + 4), c = kq_load_u32(q + 8);
    const uint32_t sc_lo = a & 0x3f3f3f3fu;
    const uint32_t sc_hi = (c & 0x0f0f0f0fu) | ((a >> 2) & 0x30303030u);
    const uint32_t mn_lo = b & 0x3f3f3f3fu;
    const uint32_t mn_hi = ((c >> 4) & 0x0f0f0f0fu) | ((b >> 2) & 0x30303030u);
    *sc = (uint64_t)sc_lo | ((uint64_t)sc_hi << 32);
    *mn = (uint64_t)mn_lo | ((uint64_t)mn_hi << 32);
}

/* pshufb masks that broadcast int16 element s (0..7) of each 128-bit lane. */
#define KQ_W16(s) (char)(2 * (s)), (char)(2 * (s) + 1)
#define KQ_BCAST16(s) KQ_W16(s), KQ_W16(s), KQ_W16(s), KQ_W16(s), KQ_W16(s), KQ_W16(s), KQ_W16(s), KQ_W16(s)
static const char kq_bcast16[8][32] = {
    {KQ_BCAST16(0), KQ_BCAST16(0)}, {KQ_BCAST16(1), KQ_BCAST16(1)}, {KQ_BCAST16(2), KQ_BCAST16(2)},
    {KQ_BCAST16(3), KQ_BCAST16(3)}, {KQ_BCAST16(4), KQ_BCAST16(4)}, {KQ_BCAST16(5), KQ_BCAST16(5)},
    {KQ_BCAST16(6), KQ_BCAST16(6)}, {KQ_BCAST16(7), KQ_BCAST16(7)},
};
#define KQ_SHUF(s) _mm256_loadu_si256((const __m256i *)kq_bcast16[s])

/* pshufb masks over a register holding 8 bytes in each 64-bit quarter:
 * kq_sc16[s] widens byte s to int16 in every lane; kq_dup16 widens bytes 0..7 to
 * int16 pairs (b0,b0,b1,b1,...,b7,b7). */
#define KQ_Z (char)0x80
#define KQ_B16(s) (char)(s), KQ_Z
#define KQ_SC16(s) KQ_B16(s), KQ_B16(s), KQ_B16(s), KQ_B16(s), KQ_B16(s), KQ_B16(s), KQ_B16(s), KQ_B16(s)
static const char kq_sc16[8][32] = {
    {KQ_SC16(0), KQ_SC16(0)}, {KQ_SC16(1), KQ_SC16(1)}, {KQ_SC16(2), KQ_SC16(2)}, {KQ_SC16(3), KQ_SC16(3)},
    {KQ_SC16(4), KQ_SC16(4)}, {KQ_SC16(5), KQ_SC16(5)}, {KQ_SC16(6), KQ_SC16(6)}, {KQ_SC16(7), KQ_SC16(7)},
};
static const char kq_dup16[32] = {
    KQ_B16(0), KQ_B16(0), KQ_B16(1), KQ_B16(1), KQ_B16(2), KQ_B16(2), KQ_B16(3), KQ_B16(3),
    KQ_B16(4), KQ_B16(4), KQ_B16(5), KQ_B16(5), KQ_B16(6), KQ_B16(6), KQ_B16(7), KQ_B16(7),
};
#define KQ_SC(s) _mm256_loadu_si256((const __m256i *)kq_sc16[s])

/* 64 values of a Q4_K block, unpacked (low nibbles lo, high nibbles hi, their scales sl,
 * sh), against row r's q8[0..63]: sumi += the 8 int32 partial sums. */
static inline __m256i kq_q4_products(__m256i lo, __m256i hi, const int8_t *q8, __m256i sl, __m256i sh, __m256i sumi) {
    const __m256i pl = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)q8));
    const __m256i ph = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q8 + 32)));
    return _mm256_add_epi32(sumi, _mm256_add_epi32(_mm256_madd_epi16(pl, sl), _mm256_madd_epi16(ph, sh)));
}

/* d and dmin of a Q4_K/Q5_K block times an activation block's scale: lanes 0 and 1 */
static inline __m128 kq_dd(const uint16_t *d, float yd) {
    return _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128((int)kq_load_u32((const uint8_t *)d))), _mm_set1_ps(yd));
}

/* The mins of a Q4_K/Q5_K block against row r's block sums, into acc. */
static inline __m256 kq_mins(__m256i mins, const li_block_q8_K *y, __m128 dd, __m256 acc) {
    const __m256i pm = _mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)y->bsums));
    return _mm256_fnmadd_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(dd)), _mm256_cvtepi32_ps(pm), acc);
}

/* Q4_K and Q5_K (Q5: the fifth bits of qh): rows ys[0..R) against one weight row x. */
static inline __attribute__((always_inline)) void kq_dots_q45_K(const int Q5, const int R, int64_t nb, const void *xv,
                                                                const li_block_q8_K *const *ys, float *out) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m16 = _mm256_set1_epi8(0x10);
    const __m256i dup = _mm256_loadu_si256((const __m256i *)kq_dup16);
    const int64_t bsz = Q5 ? sizeof(kq_block_q5_K) : sizeof(kq_block_q4_K);
    __m256 acc[LI_TILE];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *blk = (const uint8_t *)xv + i * bsz;
        const kq_block_q4_K *x4 = (const kq_block_q4_K *)blk;
        const kq_block_q5_K *x5 = (const kq_block_q5_K *)blk;
        uint64_t sc, mn;
        kq_unpack_scales(Q5 ? x5->scales : x4->scales, &sc, &mn);
        /* mins: 8 mins (each twice) against the 16 block sums */
        const __m256i mins = _mm256_shuffle_epi8(_mm256_set1_epi64x((long long)mn), dup);
        __m128 dd[LI_TILE];
        __m256i sumi[LI_TILE];
        for (int r = 0; r < R; r++) {
            dd[r] = kq_dd(Q5 ? &x5->d : &x4->d, ys[r][i].d);
            acc[r] = kq_mins(mins, &ys[r][i], dd[r], acc[r]);
            sumi[r] = _mm256_setzero_si256();
        }
        const __m256i scb = _mm256_set1_epi64x((long long)sc);
        const uint8_t *q4 = Q5 ? x5->qs : x4->qs;
        /* Q5: sub-block s takes its fifth bit from bit s of qh, moved to bit 4 (16-bit
         * shifts; the 0x10 mask drops whatever crosses from the neighbouring byte) */
        const __m256i h = Q5 ? _mm256_loadu_si256((const __m256i *)x5->qh) : _mm256_setzero_si256();
        for (int step = 0; step < 4; step++) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(q4 + 32 * step));
            __m256i lo = _mm256_and_si256(bits, m4), hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            if (Q5) {
                const int s = 2 * step; /* bit s to bit 4: shift left by 4 - s (right by s - 4) */
                const __m256i hl = s <= 4 ? _mm256_slli_epi16(h, 4 - s) : _mm256_srli_epi16(h, s - 4);
                const __m256i hh = s + 1 <= 4 ? _mm256_slli_epi16(h, 3 - s) : _mm256_srli_epi16(h, s - 3);
                lo = _mm256_or_si256(lo, _mm256_and_si256(hl, m16));
                hi = _mm256_or_si256(hi, _mm256_and_si256(hh, m16));
            }
            const __m256i sl = _mm256_shuffle_epi8(scb, KQ_SC(2 * step)), sh = _mm256_shuffle_epi8(scb, KQ_SC(2 * step + 1));
            for (int r = 0; r < R; r++) sumi[r] = kq_q4_products(lo, hi, ys[r][i].qs + 64 * step, sl, sh, sumi[r]);
        }
        for (int r = 0; r < R; r++) acc[r] = _mm256_fmadd_ps(_mm256_broadcastss_ps(dd[r]), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
    }
    for (int r = 0; r < R; r++) out[r] = li_hsum8(acc[r]);
}

static inline __attribute__((always_inline)) void kq_dots_q6_K(const int R, int64_t nb, const kq_block_q6_K *x,
                                                               const li_block_q8_K *const *ys, float *out) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i m30 = _mm256_set1_epi8(0x30);
    /* 16 scale bytes reordered to evens then odds, so that after widening to int16 the
     * low lane holds scales 0,2,..,14 and the high lane 1,3,..,15: broadcasting element
     * g of each lane gives the pair (2g, 2g+1) for the 32 values of group g. */
    const __m128i evens_odds = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    __m256 acc[LI_TILE];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const float dw = li_fp16_to_fp32(x[i].d);
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)x[i].scales);
        const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
        const __m256i scales = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, evens_odds));
        /* q6 - 32: the -32 goes through the block sums, 32 * sum(scale * bsum). */
        __m256i sumi[LI_TILE];
        for (int r = 0; r < R; r++)
            sumi[r] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                       _mm256_slli_epi32(_mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)ys[r][i].bsums)), 5));
        for (int n = 0; n < 2; n++) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * n));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * n + 32));
            const __m256i h = _mm256_loadu_si256((const __m256i *)(x[i].qh + 32 * n));
            const __m256i q[4] = {
                _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m30)),
                _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m30)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(h, m30)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(h, 2), m30)),
            };
            for (int g = 0; g < 4; g++) {
                const int G = 4 * n + g;
                const __m256i sg = _mm256_shuffle_epi8(scales, KQ_SHUF(G));
                for (int r = 0; r < R; r++) {
                    const __m256i p = _mm256_maddubs_epi16(q[g], _mm256_loadu_si256((const __m256i *)(ys[r][i].qs + 32 * G)));
                    sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(p, sg));
                }
            }
        }
        for (int r = 0; r < R; r++) acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(ys[r][i].d * dw), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
    }
    for (int r = 0; r < R; r++) out[r] = li_hsum8(acc[r]);
}

#endif /* __AVX2__ */

/* ---------------------------------------------------------------- entry points */

/* R rows (1..LI_TILE, a constant after inlining) of activations against weight row w */
static inline __attribute__((always_inline)) void kq_dots(int type, const int R, int64_t nb, const void *w,
                                                          const li_block_q8_K *const *ys, float *out) {
#if defined(__AVX2__)
    if (type == LI_Q6_K) kq_dots_q6_K(R, nb, (const kq_block_q6_K *)w, ys, out);
    else kq_dots_q45_K(type == LI_Q5_K, R, nb, w, ys, out);
#else
    for (int r = 0; r < R; r++)
        out[r] = type == LI_Q4_K ? kq_dot_q4_K_scalar(nb, (const kq_block_q4_K *)w, ys[r])
                 : type == LI_Q5_K ? kq_dot_q5_K_scalar(nb, (const kq_block_q5_K *)w, ys[r])
                                   : kq_dot_q6_K_scalar(nb, (const kq_block_q6_K *)w, ys[r]);
#endif
}

/* rows [r0, r1) of a K-quant matrix against n activation rows in Q8_K form (k/256 blocks each) */
static inline __attribute__((always_inline)) void kq_rows(int type, const uint8_t *w, int64_t row_bytes, int64_t r0,
                                                          int64_t r1, int64_t k, const li_block_q8_K *a, int64_t n,
                                                          float *y, int64_t ldy) {
    LI_Q8K_ROWS(kq_dots, type, w, row_bytes, r0, r1, k, a, n, y, ldy);
}

void li_rows_q4_K(const void *w, int64_t row_bytes, int64_t r0, int64_t r1, int64_t k, const li_block_q8_K *a,
                  int64_t n, float *y, int64_t ldy) {
    kq_rows(LI_Q4_K, (const uint8_t *)w, row_bytes, r0, r1, k, a, n, y, ldy);
}

void li_rows_q5_K(const void *w, int64_t row_bytes, int64_t r0, int64_t r1, int64_t k, const li_block_q8_K *a,
                  int64_t n, float *y, int64_t ldy) {
    kq_rows(LI_Q5_K, (const uint8_t *)w, row_bytes, r0, r1, k, a, n, y, ldy);
}

void li_rows_q6_K(const void *w, int64_t row_bytes, int64_t r0, int64_t r1, int64_t k, const li_block_q8_K *a,
                  int64_t n, float *y, int64_t ldy) {
    kq_rows(LI_Q6_K, (const uint8_t *)w, row_bytes, r0, r1, k, a, n, y, ldy);
}

void li_vec_dot_q4_K_q8_K(int64_t k, float *s, const void *w, const void *y) {
    const li_block_q8_K *ys[1] = {(const li_block_q8_K *)y};
    kq_dots(LI_Q4_K, 1, k / QK_K, w, ys, s);
}

void li_vec_dot_q5_K_q8_K(int64_t k, float *s, const void *w, const void *y) {
    const li_block_q8_K *ys[1] = {(const li_block_q8_K *)y};
    kq_dots(LI_Q5_K, 1, k / QK_K, w, ys, s);
}

void li_vec_dot_q6_K_q8_K(int64_t k, float *s, const void *w, const void *y) {
    const li_block_q8_K *ys[1] = {(const li_block_q8_K *)y};
    kq_dots(LI_Q6_K, 1, k / QK_K, w, ys, s);
}
