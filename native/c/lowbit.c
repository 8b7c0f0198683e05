/* localinfer native kernels: the low-bit block types people download (Q2_K, Q3_K, IQ4_NL,
 * IQ4_XS, MXFP4), against activations, in the row-dot contract of legacy.c and
 * kquants.c: li_rows_<type>(w, row_bytes, r0, r1, k, activations, n, y, ldy) computes rows
 * [r0, r1) of one weight matrix against n activation rows, y[j*ldy + r] = dot(w row r,
 * activation row j), in tiles of up to LI_TILE activation rows so that each weight block
 * is unpacked once per tile.
 *
 * Block layouts and values follow ggml's (GGUF), QK_K = 256:
 *   Q2_K   {u8 scales[16]; u8 qs[64]; fp16 d; fp16 dmin}          value = d*(sc&15)*q - dmin*(sc>>4)
 *          16 sub-blocks of 16, q 2 bits: value 128n + 32j + l (l < 32) is (qs[32n + l] >> 2j) & 3
 *   Q3_K   {u8 hmask[32]; u8 qs[64]; u8 scales[12]; fp16 d}        value = d*(sc-32)*(q - 4*!hbit)
 *          the same 2-bit order, hbit = bit (4n + j) of hmask[l], 16 six-bit scales
 *   IQ4_NL {fp16 d; u8 qs[16]}                                      value = d*kvalues[nibble]
 *   IQ4_XS {fp16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]}      value = d*(ls-32)*kvalues[nibble]
 *          8 sub-blocks of 32, each as an IQ4_NL block's nibbles, six-bit ls
 *   MXFP4  {u8 e; u8 qs[16]}                                        value = 2^(e-128)*kvalues_mxfp4[nibble]
 *          IQ4_NL's nibbles with another table (E2M1, doubled) and an E8M0 scale (li_e8m0_half)
 * Activations are those ggml pairs them with: Q8_K for Q2_K, Q3_K and IQ4_XS (kquants.c's
 * quantizer, li_block_q8_K), legacy.c's q8a (Q8_0 values) for IQ4_NL and MXFP4 (ggml's
 * ggml_vec_dot_mxfp4_q8_0). (BF16 rows are legacy.c's float rows.)
 *
 * Integer sums are exact, and each row's float operations run in the same order for every
 * tile size, so a row's result never depends on the rows beside it, bit for bit: a K-row
 * speculative verify equals 1-row decoding.
 */
#include <stdint.h>
#include <string.h>

#include "kernels.h"

#define QK_K LI_QK_K
#define QK 32

/* the same condition as legacy.c's LI_SIMD, which decides the q8a layout IQ4_NL reads */
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define LB_SIMD 1
#endif

#if defined(__GNUC__)
#define LB_UNUSED __attribute__((unused))
#else
#define LB_UNUSED
#endif
#define LB_INLINE static inline __attribute__((always_inline))

/* legacy.c's activation rows (see li_quantize_q8a there) */
typedef struct {
    const int8_t *qs;
    const float *d;
    const float *s;
} li_q8a;
int64_t li_q8a_scale_stride(int64_t k);

typedef struct {
    uint8_t scales[QK_K / 16];
    uint8_t qs[QK_K / 4];
    uint16_t d;
    uint16_t dmin;
} lb_block_q2_K;

typedef struct {
    uint8_t hmask[QK_K / 8];
    uint8_t qs[QK_K / 4];
    uint8_t scales[12];
    uint16_t d;
} lb_block_q3_K;

typedef struct {
    uint16_t d;
    uint16_t scales_h;
    uint8_t scales_l[QK_K / 64];
    uint8_t qs[QK_K / 2];
} lb_block_iq4_xs;

_Static_assert(sizeof(lb_block_q2_K) == 84, "q2_K block size");
_Static_assert(sizeof(lb_block_q3_K) == 110, "q3_K block size");
_Static_assert(sizeof(lb_block_iq4_xs) == 136, "iq4_xs block size");

#define IQ4_NL_BYTES 18
#define MXFP4_BYTES 17

/* ggml's kvalues_iq4nl: the 16 values a 4-bit index of IQ4_NL and IQ4_XS stands for */
static const int8_t lb_kvalues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
/* ggml's kvalues_mxfp4: the E2M1 values of MXFP4's 4-bit codes, doubled (the scale is halved) */
static const int8_t lb_kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static inline uint16_t lb_load_u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static inline uint32_t lb_load_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Q3_K: the 16 six-bit scales from 12 bytes, minus 32. Words a, b, c = bytes 0..3, 4..7,
 * 8..11: scales 0..7 take their low 4 bits from the nibbles of a and b, 8..15 from their
 * high nibbles; the top 2 bits of scale s come from bits 2*(s/4) of c's byte s%4. */
static inline void lb_q3_scales(const uint8_t *q, int8_t out[16]) {
    const uint32_t a = lb_load_u32(q), b = lb_load_u32(q + 4), c = lb_load_u32(q + 8);
    const uint32_t lo4 = 0x0f0f0f0fu, hi2 = 0x03030303u;
    const uint32_t w[4] = {
        (a & lo4) | ((c & hi2) << 4),
        (b & lo4) | (((c >> 2) & hi2) << 4),
        ((a >> 4) & lo4) | (((c >> 4) & hi2) << 4),
        ((b >> 4) & lo4) | (((c >> 6) & hi2) << 4),
    };
    uint8_t u[16];
    memcpy(u, w, 16);
    for (int s = 0; s < 16; s++) out[s] = (int8_t)(u[s] - 32);
}

/* IQ4_XS: the six-bit scale of sub-block ib (0..7), minus 32 */
static inline int lb_iq4_xs_scale(const lb_block_iq4_xs *x, int ib) {
    return (((x->scales_l[ib / 2] >> 4 * (ib % 2)) & 0x0F) | (((x->scales_h >> 2 * ib) & 3) << 4)) - 32;
}

/* ---- scalar dots ---------------------------------------------------------------------- */

LB_UNUSED static float lb_dot_q2_K_scalar(int64_t nb, const lb_block_q2_K *x, const li_block_q8_K *y) {
    float sumf = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t isum = 0, summ = 0;
        for (int s = 0; s < 16; s++) summ += (x[i].scales[s] >> 4) * y[i].bsums[s];
        for (int g = 0; g < 8; g++) { /* 32 values: qs[32n .. 32n+31] >> 2j, g = 4n + j */
            const uint8_t *q = x[i].qs + 32 * (g / 4);
            const int shift = 2 * (g % 4);
            const int8_t *a = y[i].qs + 32 * g;
            for (int h = 0; h < 2; h++) { /* two sub-blocks of 16 */
                int32_t sum = 0;
                for (int l = 16 * h; l < 16 * h + 16; l++) sum += ((q[l] >> shift) & 3) * a[l];
                isum += (x[i].scales[2 * g + h] & 0x0F) * sum;
            }
        }
        sumf += y[i].d * (li_fp16_to_fp32(x[i].d) * (float)isum - li_fp16_to_fp32(x[i].dmin) * (float)summ);
    }
    return sumf;
}

LB_UNUSED static float lb_dot_q3_K_scalar(int64_t nb, const lb_block_q3_K *x, const li_block_q8_K *y) {
    float sumf = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int8_t sc[16];
        lb_q3_scales(x[i].scales, sc);
        int32_t isum = 0;
        for (int g = 0; g < 8; g++) {
            const uint8_t *q = x[i].qs + 32 * (g / 4);
            const int shift = 2 * (g % 4);
            const int8_t *a = y[i].qs + 32 * g;
            for (int h = 0; h < 2; h++) {
                int32_t sum = 0;
                for (int l = 16 * h; l < 16 * h + 16; l++) {
                    const int v = ((q[l] >> shift) & 3) - ((x[i].hmask[l] >> g) & 1 ? 0 : 4);
                    sum += v * a[l];
                }
                isum += sc[2 * g + h] * sum;
            }
        }
        sumf += y[i].d * li_fp16_to_fp32(x[i].d) * (float)isum;
    }
    return sumf;
}

LB_UNUSED static float lb_dot_iq4_xs_scalar(int64_t nb, const lb_block_iq4_xs *x, const li_block_q8_K *y) {
    float sumf = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t isum = 0;
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *q = x[i].qs + 16 * ib;
            const int8_t *a = y[i].qs + 32 * ib;
            int32_t sum = 0;
            for (int l = 0; l < 16; l++) sum += lb_kvalues[q[l] & 0x0F] * a[l] + lb_kvalues[q[l] >> 4] * a[l + 16];
            isum += lb_iq4_xs_scale(&x[i], ib) * sum;
        }
        sumf += y[i].d * li_fp16_to_fp32(x[i].d) * (float)isum;
    }
    return sumf;
}

/* ---- AVX2 dots against Q8_K ------------------------------------------------------------ */

#ifdef LB_SIMD

/* acc + the int16 pair products of a and b: one vpdpwssd with VNNI */
static inline __m256i lb_madd_acc(__m256i acc, __m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpwssd_epi32(acc, a, b);
#elif defined(__AVXVNNI__)
    return _mm256_dpwssd_avx_epi32(acc, a, b);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

/* pshufb masks that broadcast int16 element g (0..7) of each 128-bit lane */
#define LB_W16(g) (char)(2 * (g)), (char)(2 * (g) + 1)
#define LB_BCAST16(g) LB_W16(g), LB_W16(g), LB_W16(g), LB_W16(g), LB_W16(g), LB_W16(g), LB_W16(g), LB_W16(g)
static const char lb_bcast16[8][32] = {
    {LB_BCAST16(0), LB_BCAST16(0)}, {LB_BCAST16(1), LB_BCAST16(1)}, {LB_BCAST16(2), LB_BCAST16(2)},
    {LB_BCAST16(3), LB_BCAST16(3)}, {LB_BCAST16(4), LB_BCAST16(4)}, {LB_BCAST16(5), LB_BCAST16(5)},
    {LB_BCAST16(6), LB_BCAST16(6)}, {LB_BCAST16(7), LB_BCAST16(7)},
};

/* 16 byte scales -> int16, the low lane holding sub-blocks 0, 2, .., 14 and the high lane
 * 1, 3, .., 15: broadcasting element g of each lane then gives the scales of group g's two
 * sub-blocks of 16 (2g in the low lane, 2g + 1 in the high), as the values lie */
static inline __m256i lb_group_scales(__m128i sc8, int is_signed) {
    const __m128i evens_odds = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    const __m128i s = _mm_shuffle_epi8(sc8, evens_odds);
    return is_signed ? _mm256_cvtepi8_epi16(s) : _mm256_cvtepu8_epi16(s);
}

static inline __m256i lb_bcast_group(__m256i scales, int g) {
    return _mm256_shuffle_epi8(scales, _mm256_loadu_si256((const __m256i *)lb_bcast16[g]));
}

/* group g's 2-bit values (0..3) of a Q2_K/Q3_K block: bytes l = 0..31 */
static inline __m256i lb_q2_bits(const uint8_t *qs, int g) {
    const __m256i bits = _mm256_loadu_si256((const __m256i *)(qs + 32 * (g / 4)));
    return _mm256_and_si256(_mm256_srli_epi16(bits, 2 * (g % 4)), _mm256_set1_epi8(3));
}

#ifdef LI_VNNI
/* Q2_K with VNNI: scale times value (<= 15 * 3) fits an unsigned byte, so each sub-block's
 * scale is folded into its values by a table lookup (once per tile) and every row takes one
 * vpdpbusd per 32 values. tab[t] holds the tables [0, s, 2s, 3s] of sub-blocks 4t .. 4t+3. */
static inline void lb_q2_tables(const uint8_t *scales, __m256i tab[4]) {
    const __m128i s = _mm_and_si128(_mm_loadu_si128((const __m128i *)scales), _mm_set1_epi8(0x0F));
    const __m128i s2 = _mm_add_epi8(s, s), s3 = _mm_add_epi8(s2, s), z = _mm_setzero_si128();
    const __m128i a = _mm_unpacklo_epi8(z, s), b = _mm_unpacklo_epi8(s2, s3);
    const __m128i c = _mm_unpackhi_epi8(z, s), d = _mm_unpackhi_epi8(s2, s3);
    tab[0] = _mm256_broadcastsi128_si256(_mm_unpacklo_epi16(a, b));
    tab[1] = _mm256_broadcastsi128_si256(_mm_unpackhi_epi16(a, b));
    tab[2] = _mm256_broadcastsi128_si256(_mm_unpacklo_epi16(c, d));
    tab[3] = _mm256_broadcastsi128_si256(_mm_unpackhi_epi16(c, d));
}

/* group g's values times their sub-block's scale: sub-block 2g (low lane) sits at dword
 * (2g) % 4 of its table, 2g + 1 (high lane) at the next */
static inline __m256i lb_q2_scaled(const uint8_t *qs, const __m256i tab[4], int g) {
    const __m256i off = _mm256_setr_epi64x(0, 0, 0x0404040404040404LL, 0x0404040404040404LL);
    const __m256i at = _mm256_add_epi8(off, _mm256_set1_epi8((char)(8 * (g % 2))));
    return _mm256_shuffle_epi8(tab[g / 2], _mm256_or_si256(lb_q2_bits(qs, g), at));
}
#endif

/* the 16 mins of a Q2_K block as int16, in the order of the block sums */
static inline __m256i lb_q2_mins(const lb_block_q2_K *x) {
    const __m128i s = _mm_loadu_si128((const __m128i *)x->scales);
    return _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), _mm_set1_epi8(0x0F)));
}

LB_INLINE void lb_dots_q2_K(const int R, int64_t nb, const lb_block_q2_K *x, const li_block_q8_K *const *ys,
                            float *out) {
    __m256 acc[LI_TILE];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const float dw = li_fp16_to_fp32(x[i].d), mw = li_fp16_to_fp32(x[i].dmin);
        const __m256i mins = lb_q2_mins(&x[i]);
        __m256i sumi[LI_TILE];
        for (int r = 0; r < R; r++) sumi[r] = _mm256_setzero_si256();
#ifdef LI_VNNI
        __m256i tab[4];
        lb_q2_tables(x[i].scales, tab);
        for (int g = 0; g < 8; g++) {
            const __m256i u = lb_q2_scaled(x[i].qs, tab, g);
            for (int r = 0; r < R; r++) sumi[r] = li_dpbusd(sumi[r], u, _mm256_loadu_si256((const __m256i *)(ys[r][i].qs + 32 * g)));
        }
#else
        const __m256i scales = lb_group_scales(_mm_and_si128(_mm_loadu_si128((const __m128i *)x[i].scales), _mm_set1_epi8(0x0F)), 0);
        for (int g = 0; g < 8; g++) {
            const __m256i q = lb_q2_bits(x[i].qs, g), sg = lb_bcast_group(scales, g);
            for (int r = 0; r < R; r++) {
                const __m256i p = _mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i *)(ys[r][i].qs + 32 * g)));
                sumi[r] = lb_madd_acc(sumi[r], p, sg);
            }
        }
#endif
        for (int r = 0; r < R; r++) {
            const float yd = ys[r][i].d;
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(yd * dw), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
            const __m256i summ = _mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)ys[r][i].bsums));
            acc[r] = _mm256_fnmadd_ps(_mm256_set1_ps(yd * mw), _mm256_cvtepi32_ps(summ), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = li_hsum8(acc[r]);
}

/* Q3_K: values 0..7 (the 2 low bits and the high bit), whose offset of -4 goes through the
 * block sums: sum(sc * (u - 4) * a) = sum(sc * u * a) - 4 * sum(sc * bsum) */
LB_INLINE void lb_dots_q3_K(const int R, int64_t nb, const lb_block_q3_K *x, const li_block_q8_K *const *ys,
                            float *out) {
    __m256 acc[LI_TILE];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        int8_t sc[16];
        lb_q3_scales(x[i].scales, sc);
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)sc);
        const __m256i scales = lb_group_scales(sc8, 1), sc16 = _mm256_cvtepi8_epi16(sc8);
        __m256i sumi[LI_TILE];
        for (int r = 0; r < R; r++) /* -4 * sum(sc * bsum) */
            sumi[r] = _mm256_slli_epi32(_mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)ys[r][i].bsums)), 2);
        for (int r = 0; r < R; r++) sumi[r] = _mm256_sub_epi32(_mm256_setzero_si256(), sumi[r]);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)x[i].hmask);
        for (int g = 0; g < 8; g++) {
            /* the high bit g of each byte, moved to bit 2 (masked first: 16-bit shifts carry nothing across) */
            const __m256i hb = _mm256_and_si256(hm, _mm256_set1_epi8((char)(1 << g)));
            const __m256i h4 = g >= 2 ? _mm256_srli_epi16(hb, g - 2) : _mm256_slli_epi16(hb, 2 - g);
            const __m256i u = _mm256_or_si256(lb_q2_bits(x[i].qs, g), h4), sg = lb_bcast_group(scales, g);
            for (int r = 0; r < R; r++) {
                const __m256i p = _mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)(ys[r][i].qs + 32 * g)));
                sumi[r] = lb_madd_acc(sumi[r], p, sg);
            }
        }
        const float dw = li_fp16_to_fp32(x[i].d);
        for (int r = 0; r < R; r++) acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(ys[r][i].d * dw), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
    }
    for (int r = 0; r < R; r++) out[r] = li_hsum8(acc[r]);
}

/* a 16-value table (IQ4_NL/IQ4_XS's, MXFP4's) in both lanes, for pshufb */
static inline __m256i lb_table_v(const int8_t *table) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)table));
}

/* IQ4_XS: the signed values by pshufb, their signs moved onto the activations (|v| <= 127) */
LB_INLINE void lb_dots_iq4_xs(const int R, int64_t nb, const lb_block_iq4_xs *x, const li_block_q8_K *const *ys,
                              float *out) {
    const __m256i kv = lb_table_v(lb_kvalues);
    __m256 acc[LI_TILE];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        __m256i sumi[LI_TILE];
        for (int r = 0; r < R; r++) sumi[r] = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ib++) {
            const __m256i v = _mm256_shuffle_epi8(kv, li_unpack_nibbles(x[i].qs + 16 * ib));
            const __m256i av = _mm256_sign_epi8(v, v), sb = _mm256_set1_epi16((short)lb_iq4_xs_scale(&x[i], ib));
            for (int r = 0; r < R; r++) {
                const __m256i a = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(ys[r][i].qs + 32 * ib)), v);
                sumi[r] = lb_madd_acc(sumi[r], _mm256_maddubs_epi16(av, a), sb);
            }
        }
        const float dw = li_fp16_to_fp32(x[i].d);
        for (int r = 0; r < R; r++) acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(ys[r][i].d * dw), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
    }
    for (int r = 0; r < R; r++) out[r] = li_hsum8(acc[r]);
}

#endif /* LB_SIMD */

/* ---- the Q8_K types' rows --------------------------------------------------------------- */

/* R rows (1..LI_TILE, a constant after inlining) of activations against weight row w */
LB_INLINE void lb_dots_k(const int type, const int R, int64_t nb, const void *w, const li_block_q8_K *const *ys,
                         float *out) {
#ifdef LB_SIMD
    if (type == LI_Q2_K) lb_dots_q2_K(R, nb, (const lb_block_q2_K *)w, ys, out);
    else if (type == LI_Q3_K) lb_dots_q3_K(R, nb, (const lb_block_q3_K *)w, ys, out);
    else lb_dots_iq4_xs(R, nb, (const lb_block_iq4_xs *)w, ys, out);
#else
    for (int r = 0; r < R; r++)
        out[r] = type == LI_Q2_K   ? lb_dot_q2_K_scalar(nb, (const lb_block_q2_K *)w, ys[r])
                 : type == LI_Q3_K ? lb_dot_q3_K_scalar(nb, (const lb_block_q3_K *)w, ys[r])
                                   : lb_dot_iq4_xs_scalar(nb, (const lb_block_iq4_xs *)w, ys[r]);
#endif
}

LB_INLINE void lb_rows_k(const int type, const uint8_t *w, int64_t row_bytes, int64_t r0, int64_t r1, int64_t k,
                         const li_block_q8_K *a, int64_t n, float *y, int64_t ldy) {
    LI_Q8K_ROWS(lb_dots_k, type, w, row_bytes, r0, r1, k, a, n, y, ldy);
}

void li_rows_q2_K(const void *w, int64_t row_bytes, int64_t r0, int64_t r1, int64_t k, const li_block_q8_K *a,
                  int64_t n, float *y, int64_t ldy) {
    lb_rows_k(LI_Q2_K, (const uint8_t *)w, row_bytes, r0, r1, k, a, n, y, ldy);
}

void li_rows_q3_K(const void *w, int64_t row_bytes, int64_t r0, int64_t r1, int64_t k, const li_block_q8_K *a,
                  int64_t n, float *y, int64_t ldy) {
    lb_rows_k(LI_Q3_K, (const uint8_t *)w, row_bytes, r0, r1, k, a, n, y, ldy);
}

void li_rows_iq4_xs(const void *w, int64_t row_bytes, int64_t r0, int64_t r1, int64_t k, const li_block_q8_K *a,
                    int64_t n, float *y, int64_t ldy) {
    lb_rows_k(LI_IQ4_XS, (const uint8_t *)w, row_bytes, r0, r1, k, a, n, y, ldy);
}

/* ---- IQ4_NL and MXFP4 against q8a ---------------------------------------------------------- */

/* The two types are one kernel: 32 values a block, their nibbles (the block's last 16 bytes)
 * indexing a 16-value int8 table, one scale a block. TYPE (LI_IQ4_NL or LI_MXFP4, a constant
 * after inlining) picks the block's bytes, its table and how its scale reads. */
#define LB_NL_BYTES(type) ((type) == LI_MXFP4 ? MXFP4_BYTES : IQ4_NL_BYTES)
#define LB_NL_TABLE(type) ((type) == LI_MXFP4 ? lb_kvalues_mxfp4 : lb_kvalues)

/* a block's scale: IQ4_NL's fp16 d, MXFP4's E8M0 exponent */
static inline float lb_nl_scale(int type, const uint8_t *blk) {
    return type == LI_MXFP4 ? li_e8m0_half(blk[0]) : li_fp16_to_fp32(lb_load_u16(blk));
}

#ifdef LB_SIMD
/* One pair of blocks (b0, b0 + bytes) in the activations' pair layout (legacy.c): lo =
 * values 0..15 of both blocks, hi = values 16..31; signed, by pshufb from table kv. */
static inline void lb_nl_pair(const uint8_t *b0, int64_t bytes, __m256i kv, __m256i *lo, __m256i *hi) {
    const __m256i v = _mm256_blend_epi32(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(b0 + bytes - 16))),
                                         _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b0 + 2 * bytes - 16))), 0xF0);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    *lo = _mm256_shuffle_epi8(kv, _mm256_and_si256(v, m4));
    *hi = _mm256_shuffle_epi8(kv, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
}

/* 32 signed weight values (w, and |w| in aw) times 32 activations: 8 int32 partial sums */
static inline __m256i lb_dot_signed(__m256i w, __m256i aw, const int8_t *y) {
    return li_dot_u8_i8v(aw, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)y), w));
}

/* two pairs' products -> per lane [sums of pair A's block | of B's], 2 int32 each */
static inline __m256i lb_hadd_pairs(__m256i a, __m256i b) {
    return _mm256_add_epi32(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
}

/* the two halves of an octet (lb_hadd_pairs of pairs 0,1 and 2,3) -> its 8 block sums in
 * the order of the activations' scales, [0 2 4 6 1 3 5 7] (LI_OCTET_LANE) */
static inline __m256i lb_octet_sums(__m256i h0, __m256i h1) {
    const __m256 a = _mm256_castsi256_ps(h0), b = _mm256_castsi256_ps(h1);
    return _mm256_add_epi32(_mm256_castps_si256(_mm256_shuffle_ps(a, b, 0x88)), _mm256_castps_si256(_mm256_shuffle_ps(a, b, 0xDD)));
}

/* 8 E8M0 exponents (int32 lanes) as 2^(e - 128): 2^(a - 64) * 2^(b - 64) with a = e >> 1,
 * b = e - a, both normal floats, and their product exact (a power of two, subnormal for e < 2) */
static inline __m256 lb_e8m0_half8(__m256i e) {
    const __m256i a = _mm256_srli_epi32(e, 1), b = _mm256_sub_epi32(e, a), bias = _mm256_set1_epi32(63);
    return _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(a, bias), 23)),
                         _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(b, bias), 23)));
}

/* the scales of the first m (<= 8) blocks at w in octet lane order, 0 for the rest */
static inline __m256 lb_nl_scales(const int type, const uint8_t *w, int64_t m) {
    if (type == LI_MXFP4) {
        uint64_t e = 0; /* byte LI_OCTET_LANE(q) = block q's exponent */
        for (int64_t q = 0; q < m; q++) e |= (uint64_t)w[q * MXFP4_BYTES] << (8 * LI_OCTET_LANE(q));
        const __m256 d = lb_e8m0_half8(_mm256_cvtepu8_epi32(_mm_set_epi64x(0, (int64_t)e)));
        const __m256i held = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)m), _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
        return _mm256_and_ps(d, _mm256_castsi256_ps(held));
    }
    uint64_t d[2] = {0, 0}; /* even blocks, odd blocks */
    for (int64_t q = 0; q < m; q++) d[q & 1] |= (uint64_t)lb_load_u16(w + q * IQ4_NL_BYTES) << (16 * (q >> 1));
    return _mm256_cvtph_ps(_mm_set_epi64x((int64_t)d[1], (int64_t)d[0]));
}

/* the blocks after the last octet (rem = nb % 8, starting with block 8*no at wo): each
 * row's block sums in octet lane order, 0 for the missing blocks. Pairs lie in the pair
 * layout, a last unpaired block in natural order (legacy.c's li_quantize_q8a). */
static __attribute__((noinline)) void lb_nl_tail(const int R, const uint8_t *wo, int64_t bytes, int64_t rem, int64_t no,
                                                 int64_t nb, const int8_t *const *aq, __m256i kv, __m256i *sums) {
    int32_t s[LI_TILE][8];
    memset(s, 0, sizeof s);
    for (int64_t q = 0; q < rem; q += 2) {
        int32_t part[8];
        if (q + 1 < rem) {
            __m256i lo, hi;
            lb_nl_pair(wo + q * bytes, bytes, kv, &lo, &hi);
            const __m256i alo = _mm256_sign_epi8(lo, lo), ahi = _mm256_sign_epi8(hi, hi);
            for (int r = 0; r < R; r++) {
                const int8_t *y = aq[r] + (no * 4 + q / 2) * 64;
                _mm256_storeu_si256((__m256i *)part, _mm256_add_epi32(lb_dot_signed(lo, alo, y), lb_dot_signed(hi, ahi, y + 32)));
                s[r][LI_OCTET_LANE(q)] = part[0] + part[1] + part[2] + part[3];
                s[r][LI_OCTET_LANE(q + 1)] = part[4] + part[5] + part[6] + part[7];
            }
        } else {
            const __m256i v = _mm256_shuffle_epi8(kv, li_unpack_nibbles(wo + (q + 1) * bytes - 16)), av = _mm256_sign_epi8(v, v);
            for (int r = 0; r < R; r++) s[r][LI_OCTET_LANE(q)] = li_hsum_i32(lb_dot_signed(v, av, aq[r] + (nb - 1) * QK));
        }
    }
    for (int r = 0; r < R; r++) sums[r] = _mm256_loadu_si256((const __m256i *)s[r]);
}
#endif

/* R activation rows (1..LI_TILE) at a: row r's qs at a->qs + r*k, its scales at + r*ss */
LB_INLINE void lb_dot_nl(const int type, const int R, int64_t k, int64_t ss, const uint8_t *w, const li_q8a *a,
                         float *out) {
    const int64_t nb = k / QK, bytes = LB_NL_BYTES(type);
    const int8_t *aq[LI_TILE];
    const float *ad[LI_TILE];
    for (int r = 0; r < R; r++) {
        aq[r] = a->qs + r * k;
        ad[r] = a->d + r * ss;
    }
#ifdef LB_SIMD
    const __m256i kv = lb_table_v(LB_NL_TABLE(type));
    __m256 acc[LI_TILE];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    const int64_t no = nb / 8;
    for (int64_t o = 0; o < no; o++) {
        const uint8_t *wo = w + o * 8 * bytes;
        __m256i h[LI_TILE][2];
        for (int half = 0; half < 2; half++) {
            __m256i pa[LI_TILE];
            for (int p = 0; p < 2; p++) {
                __m256i lo, hi;
                lb_nl_pair(wo + (half * 4 + p * 2) * bytes, bytes, kv, &lo, &hi);
                const __m256i alo = _mm256_sign_epi8(lo, lo), ahi = _mm256_sign_epi8(hi, hi);
                for (int r = 0; r < R; r++) {
                    const int8_t *y = aq[r] + (o * 4 + half * 2 + p) * 64;
                    const __m256i prod = _mm256_add_epi32(lb_dot_signed(lo, alo, y), lb_dot_signed(hi, ahi, y + 32));
                    if (p == 0) pa[r] = prod;
                    else h[r][half] = lb_hadd_pairs(pa[r], prod);
                }
            }
        }
        const __m256 d8 = lb_nl_scales(type, wo, 8);
        for (int r = 0; r < R; r++)
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d8, _mm256_loadu_ps(ad[r] + o * 8)), _mm256_cvtepi32_ps(lb_octet_sums(h[r][0], h[r][1])), acc[r]);
    }
    const int64_t rem = nb - no * 8;
    if (rem) { /* one more octet, its missing blocks' scales 0 */
        __m256i sums[LI_TILE];
        const uint8_t *wo = w + no * 8 * bytes;
        lb_nl_tail(R, wo, bytes, rem, no, nb, aq, kv, sums);
        const __m256 d8 = lb_nl_scales(type, wo, rem);
        for (int r = 0; r < R; r++)
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d8, _mm256_loadu_ps(ad[r] + no * 8)), _mm256_cvtepi32_ps(sums[r]), acc[r]);
    }
    for (int r = 0; r < R; r++) out[r] = li_hsum8(acc[r]);
#else
    const int8_t *table = LB_NL_TABLE(type);
    float acc[LI_TILE] = {0};
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * bytes, *qs = blk + bytes - 16;
        const float dw = lb_nl_scale(type, blk);
        int8_t q[QK];
        for (int i = 0; i < 16; i++) {
            q[i] = table[qs[i] & 0x0F];
            q[i + 16] = table[qs[i] >> 4];
        }
        for (int r = 0; r < R; r++) {
            const int8_t *y = aq[r] + b * QK;
            int32_t sum = 0;
            for (int i = 0; i < QK; i++) sum += (int32_t)q[i] * (int32_t)y[i];
            acc[r] += dw * ad[r][b] * (float)sum;
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
#endif
}

LB_INLINE void lb_rows_nl(const int type, const void *w, int64_t row_bytes, int64_t r0, int64_t r1, int64_t k,
                          const li_q8a *a, int64_t n, float *y, int64_t ldy) {
    const int64_t ss = li_q8a_scale_stride(k);
    float res[LI_TILE];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = (const uint8_t *)w + r * row_bytes;
        li_prefetch_row(wr, row_bytes);
        for (int64_t j = 0, R; j < n; j += R) {
            const li_q8a t = {a->qs + j * k, a->d + j * ss, a->s + j * ss};
            R = li_tile_rows(n - j);
            switch (R) {
            case 1: lb_dot_nl(type, 1, k, ss, wr, &t, res); break;
            case 2: lb_dot_nl(type, 2, k, ss, wr, &t, res); break;
            case 3: lb_dot_nl(type, 3, k, ss, wr, &t, res); break;
            case 4: lb_dot_nl(type, 4, k, ss, wr, &t, res); break;
#if LI_TILE == 8
            default: lb_dot_nl(type, 8, k, ss, wr, &t, res); break;
#endif
            }
            for (int64_t i = 0; i < R; i++) y[(j + i) * ldy + r] = res[i];
        }
    }
}

void li_rows_iq4_nl(const void *w, int64_t row_bytes, int64_t r0, int64_t r1, int64_t k, const li_q8a *a, int64_t n,
                    float *y, int64_t ldy) {
    lb_rows_nl(LI_IQ4_NL, w, row_bytes, r0, r1, k, a, n, y, ldy);
}

void li_rows_mxfp4(const void *w, int64_t row_bytes, int64_t r0, int64_t r1, int64_t k, const li_q8a *a, int64_t n,
                   float *y, int64_t ldy) {
    lb_rows_nl(LI_MXFP4, w, row_bytes, r0, r1, k, a, n, y, ldy);
}
