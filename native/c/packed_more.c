/* Packed panels (see packed.c) of the float types and the low-bit types people download:
 * F32, F16, BF16, Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4. packed.c asks here for what it does not
 * pack itself.
 *
 * The same contract as packed.c: panels of 16 weight rows, lane i of every vector is weight
 * row i, a register tile of R activation rows shares each unpacked chunk, and every output
 * is a float accumulator updated block after block, in block order, with the same
 * operations whatever R is (a row's result never depends on the rows beside it; decode
 * equals prefill, bit for bit). A panel block has the bytes of the 16 row blocks it
 * replaces. Per type ("chunk" = 64 bytes, byte 4r+j of a chunk belongs to row r):
 *   F32, F16, BF16  a block is one value (so every k packs): the 16 rows' values of column
 *         b, 16 x 4 bytes (one chunk) or 16 x 2 (two blocks make a chunk). Floats multiply the activations as they
 *         are (vdpbf16ps would round them to bf16): one FMA per column and row, into two
 *         accumulators a row (even and odd columns, added at the end), in tiles of 8 rows
 *         (AVX-512) or 3 (AVX2).
 *   IQ4_NL  d[16] | 4 chunks as Q4_0's: chunk c byte 4r+j = row r's qs[4c+j] (low nibble:
 *         value 4c+j, high: 16+4c+j). The nibbles index kvalues by vpshufb: as value + 128
 *         (unsigned, -128 * sum(a) folded into the integer sum) where vpdpbusd or AVX-VNNI
 *         runs, else signed with the sign moved onto the activations (vpmaddubsw must not
 *         saturate).
 *   MXFP4   e[16] (the rows' E8M0 exponent bytes) | 4 chunks as IQ4_NL's: the same kernel,
 *         with kvalues_mxfp4 (|value| <= 12) and the scale 2^(e - 128) (li_e8m0_half)
 *   IQ4_XS  d[16] | scales_h[16] (u16) | scales_l as a plane of 16 u32 | 8 sub-blocks x 4
 *         chunks: chunk (ib, c) byte 4r+j = row r's qs[16ib+4c+j] (as IQ4_NL's, per 32)
 *   Q2_K  d[16] dmin[16] | the 16 scale bytes as 4 chunks: chunk q byte 4r+t = row r's
 *         scales[4q+t] | qs as 16 chunks: chunk 8n+c byte 4r+t = row r's qs[32n+4c+t], whose
 *         bits 2j..2j+1 are value 128n+32j+4c+t (so a chunk gives four groups of 4 values).
 *         With VNNI, scale times value (<= 45) is one unsigned byte: per sub-block a vpshufb
 *         table of (0, sc, 2sc, 3sc) for each row (four rows in each 128-bit lane) turns the
 *         2-bit values into scaled bytes, and one integer sum a row takes the whole block.
 *         Without, int16 sums a sub-block and vpmaddwd by the scale (lpm_part).
 *   Q3_K  d[16] | the 12 scale bytes as three planes of 16 u32 | high bits: 64 masks of 64
 *         bits, mask 8(4n+j)+c bit 4r+t = row r's hmask bit 4n+j of byte 4c+t (the high bit of
 *         value 128n+32j+4c+t) | qs as Q2_K's. Values u = low2 + 4*hbit (0..7) are summed a
 *         sub-block (lpm_part) and scaled; the -4 offset is folded in per block through the
 *         activations' 16-value sums: sum(sc * (u - 4) * a) = sum(sc * u * a) - 4 * sum(sc * bsum).
 * The sign trick (IQ4 without VNNI) needs |a| <= 127, which kquants.c's and legacy.c's
 * quantizers keep (-127 / max, where ggml's Q8_K uses -128).
 * Rows past the last whole panel stay with the row dots (lowbit.c, legacy.c).
 */
#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "vec16.h"

/* values and bytes of one block of a type packed here (floats: a block of 1 value); 0 if not */
int li_pack_more_block(int type, int *values, int *bytes) {
#ifdef LP_R
    switch (type) {
    case LI_F32: *values = 1; *bytes = 4; return 1;
    case LI_F16:
    case LI_BF16: *values = 1; *bytes = 2; return 1;
    case LI_IQ4_NL: *values = 32; *bytes = 18; return 1;
    case LI_MXFP4: *values = 32; *bytes = 17; return 1;
    case LI_IQ4_XS: *values = 256; *bytes = 136; return 1;
    case LI_Q2_K: *values = 256; *bytes = 84; return 1;
    case LI_Q3_K: *values = 256; *bytes = 110; return 1;
    default: return 0;
    }
#else
    (void)type; (void)values; (void)bytes;
    return 0;
#endif
}

/* ---- repacking ----------------------------------------------------------------------- */

/* chunk c byte 4r+j = src[r][4c+j], for `chunks` chunks (rows `row_bytes` apart) */
static void lpm_interleave4(uint8_t *dst, const uint8_t *src, int64_t row_bytes, int chunks) {
    for (int c = 0; c < chunks; c++)
        for (int r = 0; r < LP_PANEL; r++) memcpy(dst + c * 64 + 4 * r, src + r * row_bytes + 4 * c, 4);
}

/* the 16 rows' 2-byte field at src + off into dst[16] */
static void lpm_fields16(uint8_t *dst, const uint8_t *src, int64_t row_bytes, int off) {
    for (int r = 0; r < LP_PANEL; r++) memcpy(dst + 2 * r, src + r * row_bytes + off, 2);
}

/* Q3_K's high bits: mask 8(4n+j)+c, bit 4r+t = bit 4n+j of row r's hmask[4c+t] */
static void lpm_q3_hbits(uint8_t *dst, const uint8_t *src, int64_t row_bytes) {
    for (int g = 0; g < 8; g++) /* g = 4n + j */
        for (int c = 0; c < 8; c++) {
            uint64_t m = 0;
            for (int r = 0; r < LP_PANEL; r++)
                for (int t = 0; t < 4; t++) m |= (uint64_t)((src[r * row_bytes + 4 * c + t] >> g) & 1) << (4 * r + t);
            memcpy(dst + 8 * (8 * g + c), &m, 8);
        }
}

/* the 16 rows' values of each of k columns, SIZE bytes each: column c at dst + 16 * SIZE * c */
static inline __attribute__((always_inline)) void lpm_columns(const int SIZE, uint8_t *dst, const uint8_t *src,
                                                              int64_t row_bytes, int64_t k) {
    for (int64_t c = 0; c < k; c++)
        for (int r = 0; r < LP_PANEL; r++) memcpy(dst + (c * LP_PANEL + r) * SIZE, src + r * row_bytes + SIZE * c, SIZE);
}

/* a whole float panel (F32, F16, BF16: a block is one value) in one pass, not a call a column */
void li_pack_more_floats(int type, uint8_t *dst, const uint8_t *src, int64_t row_bytes, int64_t k) {
    if (type == LI_F32) lpm_columns(4, dst, src, row_bytes, k);
    else lpm_columns(2, dst, src, row_bytes, k);
}

/* one panel block of the low-bit types: block b of 16 rows at src (row_bytes apart) into dst (16 * bytes) */
void li_pack_more(int type, uint8_t *dst, const uint8_t *src, int64_t row_bytes) {
    switch (type) {
    case LI_IQ4_NL:
        lpm_fields16(dst, src, row_bytes, 0);
        lpm_interleave4(dst + 32, src + 2, row_bytes, 4);
        break;
    case LI_MXFP4:
        for (int r = 0; r < LP_PANEL; r++) dst[r] = src[r * row_bytes];
        lpm_interleave4(dst + 16, src + 1, row_bytes, 4);
        break;
    case LI_IQ4_XS:
        lpm_fields16(dst, src, row_bytes, 0);
        lpm_fields16(dst + 32, src, row_bytes, 2);
        lpm_interleave4(dst + 64, src + 4, row_bytes, 1);
        lpm_interleave4(dst + 128, src + 8, row_bytes, 32);
        break;
    case LI_Q2_K:
        lpm_fields16(dst, src, row_bytes, 80);
        lpm_fields16(dst + 32, src, row_bytes, 82);
        lpm_interleave4(dst + 64, src, row_bytes, 4);
        lpm_interleave4(dst + 320, src + 16, row_bytes, 16);
        break;
    case LI_Q3_K:
        lpm_fields16(dst, src, row_bytes, 108);
        lpm_interleave4(dst + 32, src + 96, row_bytes, 3);
        lpm_q3_hbits(dst + 224, src, row_bytes);
        lpm_interleave4(dst + 736, src + 32, row_bytes, 16);
        break;
    default: break;
    }
}

#ifdef LP_R
/* ---- helpers beyond vec16.h ------------------------------------------------------------ */

/* ggml's kvalues_iq4nl and kvalues_mxfp4, and the same plus 128 (unsigned) */
static const int8_t lpm_kvalues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
static const uint8_t lpm_kvalues_u[16] = {1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241};
static const int8_t lpm_kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
static const uint8_t lpm_kvalues_mxfp4_u[16] = {128, 129, 130, 131, 132, 134, 136, 140, 128, 127, 126, 125, 124, 122, 120, 116};

#ifdef LP_512
/* bytes of t chosen by idx within each 128-bit lane */
static inline vi vm_shuffle(vi t, vi idx) { return _mm512_shuffle_epi8(t, idx); }
static inline vi vm_table(const void *p) { return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)p)); }
static inline vi vm_sub16(vi a, vi b) { return _mm512_sub_epi16(a, b); }
/* bit i of m set: byte i of v plus 4 */
static inline vi vm_add_0x04(vi v, const uint8_t *m) {
    uint64_t bits;
    memcpy(&bits, m, 8);
    return _mm512_mask_add_epi8(v, (__mmask64)bits, v, _mm512_set1_epi8(4));
}
static inline vi vm_cvt_u16(const uint8_t *p) { return _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)); }
static inline vf vm_bf16(const uint8_t *p) { return _mm512_castsi512_ps(vi_slli32(vm_cvt_u16(p), 16)); }
static inline vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf vm_as_vf(vi a) { return _mm512_castsi512_ps(a); }
/* each lane's byte offset inside its 128-bit lane, in every byte: a row's pshufb index base */
static inline vi vm_rowoff(void) { return _mm512_set4_epi32(0x0C0C0C0C, 0x08080808, 0x04040404, 0); }
#else
static inline vi vm_shuffle(vi t, vi idx) { return (vi){_mm256_shuffle_epi8(t.l, idx.l), _mm256_shuffle_epi8(t.h, idx.h)}; }
static inline vi vm_table(const void *p) {
    const __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    return (vi){t, t};
}
static inline vi vm_sub16(vi a, vi b) { return (vi){_mm256_sub_epi16(a.l, b.l), _mm256_sub_epi16(a.h, b.h)}; }
/* byte i of each 8 of v's spread bytes keeps bit i: 4 where set (vpsignb: the 0x80 byte is negative) */
static inline __m256i lpm_bits_to_0x04(uint32_t bits) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread),
                                       _mm256_set1_epi64x(0x8040201008040201LL));
    return _mm256_sign_epi8(_mm256_set1_epi64x((int64_t)0xFC04040404040404ULL), v);
}
static inline vi vm_add_0x04(vi v, const uint8_t *m) {
    return (vi){_mm256_or_si256(v.l, lpm_bits_to_0x04(lp_u32(m))), _mm256_or_si256(v.h, lpm_bits_to_0x04(lp_u32(m + 4)))};
}
static inline vi vm_cvt_u16(const uint8_t *p) {
    return (vi){_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)),
                _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + 16)))};
}
static inline vf vm_bf16(const uint8_t *p) {
    const vi v = vi_slli32(vm_cvt_u16(p), 16);
    return (vf){_mm256_castsi256_ps(v.l), _mm256_castsi256_ps(v.h)};
}
static inline vf vf_add(vf a, vf b) { return (vf){_mm256_add_ps(a.l, b.l), _mm256_add_ps(a.h, b.h)}; }
static inline vf vm_as_vf(vi a) { return (vf){_mm256_castsi256_ps(a.l), _mm256_castsi256_ps(a.h)}; }
static inline vi vm_rowoff(void) {
    const __m256i o = _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0C0C0C0C, 0, 0x04040404, 0x08080808, 0x0C0C0C0C);
    return (vi){o, o};
}
#endif

/* The IQ4 values of nibbles (0..15): with LP_XOR_Q8, value + 128 in *w (unsigned; the caller
 * folds -128 * sum(a) into the sum), else signed in *w and |value| in *uw (the sign trick). */
LP_INLINE void vm_kv(vi table, vi nib, vi *w, vi *uw) {
    *w = vm_shuffle(table, nib);
#if LP_XOR_Q8
    *uw = *w;
#else
    *uw = (vi){_mm256_sign_epi8(w->l, w->l), _mm256_sign_epi8(w->h, w->h)};
#endif
}

/* acc + the products of vm_kv's values with four activation bytes a per lane */
LP_INLINE vi vm_kv_dp(vi acc, vi w, vi uw, va a) {
#if LP_XOR_Q8
    (void)uw;
    return vi_dpbusd(acc, w, a);
#else
    const __m256i one = _mm256_set1_epi16(1);
    return (vi){_mm256_add_epi32(acc.l, _mm256_madd_epi16(_mm256_maddubs_epi16(uw.l, _mm256_sign_epi8(a, w.l)), one)),
                _mm256_add_epi32(acc.h, _mm256_madd_epi16(_mm256_maddubs_epi16(uw.h, _mm256_sign_epi8(a, w.h)), one))};
#endif
}

/* the -128 * sum(a) of the unsigned values (0 for the signed ones), from int16 activation
 * sums by one vpdpwssd: `weights` holds -128 for each int16 of `sums` that counts */
LP_INLINE vi vm_kv_off(int32_t weights, va sums) {
#if LP_XOR_Q8
    return vi_dpwssd(vi_set1(0), vi_set1(weights), sums);
#else
    (void)weights; (void)sums;
    return vi_set1(0);
#endif
}

/* the 16 values of IQ4_NL (and IQ4_XS) or MXFP4, as vm_kv takes them */
static inline vi vm_kv_table(int type) {
    if (type == LI_MXFP4) return LP_XOR_Q8 ? vm_table(lpm_kvalues_mxfp4_u) : vm_table(lpm_kvalues_mxfp4);
    return LP_XOR_Q8 ? vm_table(lpm_kvalues_u) : vm_table(lpm_kvalues);
}

/* the 16 rows' E8M0 exponent bytes at e as 2^(e - 128): 2^(a - 64) * 2^(b - 64) with a = e >> 1,
 * b = e - a, both normal floats, their product exact (a power of two, subnormal for e < 2) */
static inline vf vm_e8m0_half(const uint8_t *e) {
    const vi v = vi_and(vi_cvt_i8(e), vi_set1(0xFF)), a = vi_srli32(v, 1), bias = vi_set1(63);
    return vf_mul(vm_as_vf(vi_slli32(vi_add(a, bias), 23)), vm_as_vf(vi_slli32(vi_add(vi_sub(v, a), bias), 23)));
}

/* A sub-block's sums of small unsigned values u times activations, then scaled. With VNNI
 * (LP_XOR_Q8 says so): int32 lanes by vpdpbusd, times the scale by vpmulld. Without: the
 * int16 pairs of vpmaddubsw added as int16 (four chunks of u <= 31 cannot overflow), then
 * one vpmaddwd by the scale as int16 in both halves of the lane, and no vpmulld. */
LP_INLINE vi lpm_part(vi part, vi u, va a) {
#if LP_XOR_Q8
    return vi_dpbusd(part, u, a);
#else
    return (vi){_mm256_add_epi16(part.l, _mm256_maddubs_epi16(u.l, a)), _mm256_add_epi16(part.h, _mm256_maddubs_epi16(u.h, a))};
#endif
}

/* sumi + part * sc, sc in int32 lanes (within int16's range) */
LP_INLINE vi lpm_part_scaled(vi sumi, vi part, vi sc) {
#if LP_XOR_Q8
    return vi_add(sumi, vi_mullo(part, sc));
#else
    const vi pair = vi_or(vi_and(sc, vi_set1(0xFFFF)), vi_slli32(sc, 16));
    return (vi){_mm256_add_epi32(sumi.l, _mm256_madd_epi16(part.l, pair.l)),
                _mm256_add_epi32(sumi.h, _mm256_madd_epi16(part.h, pair.h))};
#endif
}

/* ---- F32, F16 and BF16 against float activations ------------------------------------------- */

/* Two accumulators a row, even columns in one and odd in the other (added at the end), so
 * that decode (R = 1) is not held to one FMA's latency a column. Float tiles: AVX-512's 32
 * registers hold 2 x 8 rows; AVX2's 16 hold 2 x 3 rows (two halves each) and a weight. */
#ifdef LP_512
#define LPM_FTILE LP_R
#else
#define LPM_FTILE 3
#endif

enum { LPM_F16 = 0, LPM_BF16 = 1, LPM_F32 = 2 };

/* the 16 rows' weights of column b, the panel in format WF */
LP_INLINE vf lpm_column(const int WF, const uint8_t *pw, int64_t b) {
    return WF == LPM_F32 ? vf_f32(pw + 64 * b) : WF == LPM_BF16 ? vm_bf16(pw + 32 * b) : vf_f16(pw + 32 * b);
}

LP_INLINE void lpm_float(const int WF, const int R, const uint8_t *pw, int64_t k, const float *x, float *y,
                         int64_t ldy) {
    vf acc[2][LPM_FTILE];
    for (int r = 0; r < R; r++) acc[0][r] = acc[1][r] = vf_zero();
    const int64_t stride = WF == LPM_F32 ? 64 : 32; /* a column's bytes */
    int64_t b = 0;
    for (; b + 2 <= k; b += 2) {
        __builtin_prefetch(pw + stride * b + LI_PREFETCH, 0, 3);
        if (WF == LPM_F32) __builtin_prefetch(pw + stride * b + 64 + LI_PREFETCH, 0, 3);
        for (int s = 0; s < 2; s++) {
            const vf w = lpm_column(WF, pw, b + s);
            for (int r = 0; r < R; r++) acc[s][r] = vf_fmadd(w, vf_set1(x[r * k + b + s]), acc[s][r]);
        }
    }
    if (b < k) {
        const vf w = lpm_column(WF, pw, b);
        for (int r = 0; r < R; r++) acc[0][r] = vf_fmadd(w, vf_set1(x[r * k + b]), acc[0][r]);
    }
    for (int r = 0; r < R; r++) vf_store(y + r * ldy, vf_add(acc[0][r], acc[1][r]));
}

/* ---- IQ4_NL and MXFP4 against q8s activations ---------------------------------------------- */

/* TYPE: LI_IQ4_NL (fp16 scales) or LI_MXFP4 (E8M0 exponents), a constant after inlining */
LP_INLINE void lpm_nl(const int type, const int R, const uint8_t *pw, int64_t nb, const li_q8s *a, int64_t k, float *y,
                      int64_t ldy) {
    const int mx = type == LI_MXFP4, bb = 16 * (mx ? 17 : 18); /* a panel block's bytes */
    const vi m4 = vi_set1(0x0F0F0F0F), kv = vm_kv_table(type);
    vf acc[LP_R];
    for (int r = 0; r < R; r++) acc[r] = vf_zero();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = pw + b * bb, *qs = blk + (mx ? 16 : 32);
        li_prefetch_row(blk, bb);
        const int8_t *ab = a->qs + b * 32;
        vi isum[LP_R];
        for (int r = 0; r < R; r++) /* the int32 sum fits its low int16 (|sum| <= 32 * 128) */
            isum[r] = vm_kv_off(0x0000FF80, va_bcast((const int8_t *)(a->sum + r * nb + b)));
        for (int c = 0; c < 4; c++) {
            const vi v = vi_load(qs + 64 * c);
            vi wl, ul, wh, uh;
            vm_kv(kv, vi_and(v, m4), &wl, &ul);
            vm_kv(kv, vi_and(vi_srli16(v, 4), m4), &wh, &uh);
            for (int r = 0; r < R; r++)
                isum[r] = vm_kv_dp(vm_kv_dp(isum[r], wl, ul, va_bcast(ab + r * k + 4 * c)), wh, uh, va_bcast(ab + r * k + 16 + 4 * c));
        }
        const vf dw = mx ? vm_e8m0_half(blk) : vf_f16(blk);
        for (int r = 0; r < R; r++) acc[r] = vf_fmadd(vf_mul(dw, vf_set1(a->d[r * nb + b])), vf_cvt(isum[r]), acc[r]);
    }
    for (int r = 0; r < R; r++) vf_store(y + r * ldy, acc[r]);
}

/* ---- IQ4_XS against Q8_K -------------------------------------------------------------------- */

LP_INLINE void lpm_iq4_xs(const int R, const uint8_t *pw, int64_t nb, const li_block_q8_K *a, float *y, int64_t ldy) {
    const vi m4 = vi_set1(0x0F0F0F0F), kv = vm_kv_table(LI_IQ4_XS);
    vf acc[LP_R];
    for (int r = 0; r < R; r++) acc[r] = vf_zero();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = pw + b * 16 * 136, *qs = blk + 128;
        li_prefetch_row(blk, 16 * 136);
        const vi sh = vm_cvt_u16(blk + 32), sl = vi_load(blk + 64);
        vi sumi[LP_R];
        for (int r = 0; r < R; r++) sumi[r] = vi_set1(0);
        for (int ib = 0; ib < 8; ib++) {
            vi isum[LP_R];
            for (int r = 0; r < R; r++) isum[r] = vm_kv_off((int32_t)0xFF80FF80, va_bcast((const int8_t *)(a[r * nb + b].bsums + 2 * ib)));
            for (int c = 0; c < 4; c++) {
                const vi v = vi_load(qs + 256 * ib + 64 * c);
                vi wl, ul, wh, uh;
                vm_kv(kv, vi_and(v, m4), &wl, &ul);
                vm_kv(kv, vi_and(vi_srli16(v, 4), m4), &wh, &uh);
                for (int r = 0; r < R; r++) {
                    const int8_t *q8 = a[r * nb + b].qs + 32 * ib + 4 * c;
                    isum[r] = vm_kv_dp(vm_kv_dp(isum[r], wl, ul, va_bcast(q8)), wh, uh, va_bcast(q8 + 16));
                }
            }
            /* the six-bit scale: 4 bits from scales_l (bits 4ib..), 2 from scales_h (bits 2ib..) */
            const vi hi = ib <= 2 ? vi_slli32(sh, 4 - 2 * ib) : vi_srli32(sh, 2 * ib - 4);
            const vi ls = vi_add(vi_or(vi_and(vi_srli32(sl, 4 * ib), vi_set1(0x0F)), vi_and(hi, vi_set1(0x30))), vi_set1(-32));
            for (int r = 0; r < R; r++) sumi[r] = vi_add(sumi[r], vi_mullo(isum[r], ls));
        }
        const vf d = vf_f16(blk);
        for (int r = 0; r < R; r++) acc[r] = vf_fmadd(vf_mul(d, vf_set1(a[r * nb + b].d)), vf_cvt(sumi[r]), acc[r]);
    }
    for (int r = 0; r < R; r++) vf_store(y + r * ldy, acc[r]);
}

/* ---- Q2_K against Q8_K ---------------------------------------------------------------------- */

/* bytes [b0 b1 b2 b3] of each lane -> the int16 pairs (b0, b1) (half 0) or (b2, b3) (half 1) */
LP_INLINE vi lpm_pair16(vi v, int half) {
    const vi b0 = vi_set1(0xFF), b2 = vi_set1(0xFF0000);
    return half ? vi_or(vi_and(vi_srli32(v, 16), b0), vi_and(vi_srli32(v, 8), b2))
                : vi_or(vi_and(v, b0), vi_and(vi_slli32(v, 8), b2));
}

LP_INLINE void lpm_q2_K(const int R, const uint8_t *pw, int64_t nb, const li_block_q8_K *a, float *y, int64_t ldy) {
    const vi m3 = vi_set1(0x03030303), rowoff = vm_rowoff();
    vf acc[LP_R];
    for (int r = 0; r < R; r++) acc[r] = vf_zero();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = pw + b * 16 * 84, *scales = blk + 64, *qs = blk + 320;
        li_prefetch_row(blk, 16 * 84);
        vi sumi[LP_R];
        for (int r = 0; r < R; r++) sumi[r] = vi_set1(0);
        for (int g = 0; g < 8; g++) { /* g = 4n + j: sub-blocks 2g (chunks 8n..8n+3) and 2g+1 */
            const int n2 = g >> 2, j = g & 3;
            for (int h = 0; h < 2; h++) {
                const int s = 2 * g + h;
                const vi sc = vi_and(vi_srli32(vi_load(scales + 64 * (s >> 2)), 8 * (s & 3)), vi_set1(0x0F));
#if LP_XOR_Q8 /* VNNI: the scale folded into the values, one sum a row for the block */
                const vi tab = vi_mullo(sc, vi_set1(0x03020100)); /* (0, sc, 2sc, 3sc) */
#pragma GCC unroll 4
                for (int cc = 0; cc < 4; cc++) { /* constant trips: unrolled, the sums stay put */
                    const int c = 4 * h + cc;
                    const vi q = vi_or(vi_and(vi_srli16(vi_load(qs + 64 * (8 * n2 + c)), 2 * j), m3), rowoff);
                    const vi u = vm_shuffle(tab, q);
                    for (int r = 0; r < R; r++) sumi[r] = vi_dpbusd(sumi[r], u, va_bcast(a[r * nb + b].qs + 32 * g + 4 * c));
                }
#else /* int16 sums of the sub-block, scaled by vpmaddwd */
                (void)rowoff;
                vi part[LP_R];
                for (int r = 0; r < R; r++) part[r] = vi_set1(0);
#pragma GCC unroll 4
                for (int cc = 0; cc < 4; cc++) {
                    const int c = 4 * h + cc;
                    const vi u = vi_and(vi_srli16(vi_load(qs + 64 * (8 * n2 + c)), 2 * j), m3);
                    for (int r = 0; r < R; r++) part[r] = lpm_part(part[r], u, va_bcast(a[r * nb + b].qs + 32 * g + 4 * c));
                }
                for (int r = 0; r < R; r++) sumi[r] = lpm_part_scaled(sumi[r], part[r], sc);
#endif
            }
        }
        /* the mins (high nibbles) as int16 pairs of sub-blocks (2i, 2i+1), against the bsums */
        vi mp[8];
        for (int q = 0; q < 4; q++) {
            const vi m = vi_and(vi_srli32(vi_load(scales + 64 * q), 4), vi_set1(0x0F0F0F0F));
            mp[2 * q] = lpm_pair16(m, 0);
            mp[2 * q + 1] = lpm_pair16(m, 1);
        }
        const vf d = vf_f16(blk), dmin = vf_f16(blk + 32);
        for (int r = 0; r < R; r++) {
            const li_block_q8_K *ar = a + r * nb + b;
            vi summ = vi_set1(0);
            for (int i = 0; i < 8; i++) summ = vi_dpwssd(summ, mp[i], va_bcast((const int8_t *)(ar->bsums + 2 * i)));
            const vf da = vf_set1(ar->d);
            acc[r] = vf_fmadd(vf_mul(d, da), vf_cvt(sumi[r]), acc[r]);
            acc[r] = vf_fnmadd(vf_mul(dmin, da), vf_cvt(summ), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) vf_store(y + r * ldy, acc[r]);
}

/* ---- Q3_K against Q8_K ---------------------------------------------------------------------- */

/* the 16 six-bit scales (unsigned, 0..63) as four vectors: byte t of w[q] = scale 4q+t */
LP_INLINE void lpm_q3_scales(const uint8_t *planes, vi w[4]) {
    const vi A = vi_load(planes), B = vi_load(planes + 64), C = vi_load(planes + 128);
    const vi lo4 = vi_set1(0x0F0F0F0F), hi2 = vi_set1(0x30303030);
    w[0] = vi_or(vi_and(A, lo4), vi_and(vi_slli32(C, 4), hi2));
    w[1] = vi_or(vi_and(B, lo4), vi_and(vi_slli32(C, 2), hi2));
    w[2] = vi_or(vi_and(vi_srli32(A, 4), lo4), vi_and(C, hi2));
    w[3] = vi_or(vi_and(vi_srli32(B, 4), lo4), vi_and(vi_srli32(C, 2), hi2));
}

LP_INLINE void lpm_q3_K(const int R, const uint8_t *pw, int64_t nb, const li_block_q8_K *a, float *y, int64_t ldy) {
    const vi m3 = vi_set1(0x03030303);
    vf acc[LP_R];
    for (int r = 0; r < R; r++) acc[r] = vf_zero();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = pw + b * 16 * 110, *hb = blk + 224, *qs = blk + 736;
        li_prefetch_row(blk, 16 * 110);
        vi w[4];
        lpm_q3_scales(blk + 32, w);
        /* the offset first: -4 * sum(sc * bsum) = sum((128 - 4 * scale) * bsum), int16 pairs */
        vi sumi[LP_R];
        for (int r = 0; r < R; r++) sumi[r] = vi_set1(0);
        for (int i = 0; i < 8; i++) {
            const vi p = vm_sub16(vi_set1(0x00800080), vi_slli16(lpm_pair16(w[i >> 1], i & 1), 2));
            for (int r = 0; r < R; r++) sumi[r] = vi_dpwssd(sumi[r], p, va_bcast((const int8_t *)(a[r * nb + b].bsums + 2 * i)));
        }
        for (int g = 0; g < 8; g++) { /* g = 4n + j */
            const int n2 = g >> 2, j = g & 3;
            for (int h = 0; h < 2; h++) {
                const int s = 2 * g + h;
                vi isum[LP_R];
                for (int r = 0; r < R; r++) isum[r] = vi_set1(0);
#pragma GCC unroll 4
                for (int cc = 0; cc < 4; cc++) {
                    const int c = 4 * h + cc;
                    const vi q = vi_and(vi_srli16(vi_load(qs + 64 * (8 * n2 + c)), 2 * j), m3);
                    const vi u = vm_add_0x04(q, hb + 8 * (8 * g + c));
                    for (int r = 0; r < R; r++) isum[r] = lpm_part(isum[r], u, va_bcast(a[r * nb + b].qs + 32 * g + 4 * c));
                }
                const vi sc = vi_add(vi_and(vi_srli32(w[s >> 2], 8 * (s & 3)), vi_set1(0xFF)), vi_set1(-32));
                for (int r = 0; r < R; r++) sumi[r] = lpm_part_scaled(sumi[r], isum[r], sc);
            }
        }
        const vf d = vf_f16(blk);
        for (int r = 0; r < R; r++) acc[r] = vf_fmadd(vf_mul(d, vf_set1(a[r * nb + b].d)), vf_cvt(sumi[r]), acc[r]);
    }
    for (int r = 0; r < R; r++) vf_store(y + r * ldy, acc[r]);
}

/* ---- drivers ---------------------------------------------------------------------------------- */

void li_packed_rows_more_q8s(int type, const uint8_t *packed, int64_t p0, int64_t p1, int64_t k, const li_q8s *a,
                             int64_t n, float *y, int64_t ldy) {
    if (type != LI_IQ4_NL && type != LI_MXFP4) return;
    const int64_t nb = k / 32, panel_bytes = nb * 16 * (type == LI_MXFP4 ? 17 : 18);
    for (int64_t p = p0; p < p1; p++) {
        const uint8_t *pw = packed + p * panel_bytes;
#define LP_CALL(R)                                                                                        \
    do {                                                                                                  \
        const li_q8s t = {a->qs + j * k, a->d + j * nb, a->sum + j * nb};                                \
        if (type == LI_MXFP4) lpm_nl(LI_MXFP4, R, pw, nb, &t, k, y + j * ldy + 16 * p, ldy);             \
        else lpm_nl(LI_IQ4_NL, R, pw, nb, &t, k, y + j * ldy + 16 * p, ldy);                             \
    } while (0)
        LP_TILES(LP_CALL)
#undef LP_CALL
    }
}

void li_packed_rows_more_q8k(int type, const uint8_t *packed, int64_t p0, int64_t p1, int64_t k,
                             const li_block_q8_K *a, int64_t n, float *y, int64_t ldy) {
    if (type != LI_Q2_K && type != LI_Q3_K && type != LI_IQ4_XS) return;
    const int64_t nb = k / LI_QK_K, panel_bytes = nb * 16 * (type == LI_Q2_K ? 84 : type == LI_Q3_K ? 110 : 136);
    for (int64_t p = p0; p < p1; p++) {
        const uint8_t *pw = packed + p * panel_bytes;
#define LP_CALL(R)                                                                              \
    do {                                                                                        \
        if (type == LI_Q2_K) lpm_q2_K(R, pw, nb, a + j * nb, y + j * ldy + 16 * p, ldy);        \
        else if (type == LI_Q3_K) lpm_q3_K(R, pw, nb, a + j * nb, y + j * ldy + 16 * p, ldy);   \
        else lpm_iq4_xs(R, pw, nb, a + j * nb, y + j * ldy + 16 * p, ldy);                      \
    } while (0)
        LP_TILES(LP_CALL)
#undef LP_CALL
    }
}

void li_packed_rows_float(int type, const uint8_t *packed, int64_t p0, int64_t p1, int64_t k, const float *x,
                          int64_t n, float *y, int64_t ldy) {
    if (type != LI_F32 && type != LI_F16 && type != LI_BF16) return;
    const int64_t panel_bytes = k * 16 * (type == LI_F32 ? 4 : 2);
    for (int64_t p = p0; p < p1; p++) {
        const uint8_t *pw = packed + p * panel_bytes;
#define LP_CALL(R)                                                                      \
    do {                                                                                \
        float *yt = y + j * ldy + 16 * p;                                               \
        if (type == LI_F32) lpm_float(LPM_F32, R, pw, k, x + j * k, yt, ldy);           \
        else if (type == LI_BF16) lpm_float(LPM_BF16, R, pw, k, x + j * k, yt, ldy);    \
        else lpm_float(LPM_F16, R, pw, k, x + j * k, yt, ldy);                          \
    } while (0)
#ifdef LP_512
        LP_TILES(LP_CALL)
#else
        for (int64_t j = 0; j < n; j += LPM_FTILE) {
            if (n - j >= 3) LP_CALL(3);
            else if (n - j == 2) LP_CALL(2);
            else LP_CALL(1);
        }
#endif
#undef LP_CALL
    }
}

#else /* no SIMD: nothing packs (li_pack_more_block says 0) */

void li_packed_rows_more_q8s(int type, const uint8_t *packed, int64_t p0, int64_t p1, int64_t k, const li_q8s *a,
                             int64_t n, float *y, int64_t ldy) {
    (void)type; (void)packed; (void)p0; (void)p1; (void)k; (void)a; (void)n; (void)y; (void)ldy;
}

void li_packed_rows_more_q8k(int type, const uint8_t *packed, int64_t p0, int64_t p1, int64_t k,
                             const li_block_q8_K *a, int64_t n, float *y, int64_t ldy) {
    (void)type; (void)packed; (void)p0; (void)p1; (void)k; (void)a; (void)n; (void)y; (void)ldy;
}

void li_packed_rows_float(int type, const uint8_t *packed, int64_t p0, int64_t p1, int64_t k, const float *x,
                          int64_t n, float *y, int64_t ldy) {
    (void)type; (void)packed; (void)p0; (void)p1; (void)k; (void)x; (void)n; (void)y; (void)ldy;
}

#endif
