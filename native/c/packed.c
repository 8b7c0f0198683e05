/* Packed weights: panels of 16 rows interleaved, for products of many activation rows.
 *
 * The row dots (legacy.c, kquants.c) walk one weight row at a time; a prompt's product then
 * re-reads and re-unpacks every block for each tile of activation rows, and spends a
 * horizontal reduction per output. Here each matrix is repacked once, when its op is bound,
 * into panels of 16 rows: block b of a panel holds block b of all 16 rows, with the values
 * interleaved four at a time (row 0's values 4g..4g+3, row 1's, ..., row 15's), which is
 * what one 512-bit vpdpbusd takes: 16 int32 lanes, one per weight row, each summing four
 * products with four activation bytes broadcast to every lane. No horizontal sums at all:
 * lane i of every vector belongs to output row i. A tile of R activation rows shares each
 * unpacked weight vector (the register tile is 16 weight rows x R activation rows).
 * AVX2 runs the same layout as two 256-bit halves (vpmaddubsw + vpmaddwd, or AVX-VNNI).
 *
 * Every output is one float accumulator updated block after block, in block order, with
 * the same operations whatever R is: a row's result never depends on the rows beside it,
 * and decode (R = 1) gives exactly what a prompt or a speculative verify gives.
 *
 * A panel block has the bytes of the 16 row blocks it replaces (the same memory, the same
 * bytes per token for decode): scales first (fp16, one per row, as vectors of 16), then
 * the values as 64-byte chunks. Per type (QK = values per block, B = 16 * block bytes):
 *   Q4_0  d[16] | 4 chunks: chunk c byte 4r+j = row r's qs[4c+j]: low nibbles are
 *         values 4c+j, high nibbles values 16+4c+j (so a chunk gives groups c and c+4)
 *   Q4_1  d[16] m[16] | as Q4_0            Q5_0  d[16] | fifth bits | as Q4_0
 *   Q5_1  d[16] m[16] | fifth bits | as Q4_0   fifth bits: 8 groups x 64 bits, bit 4r+j
 *         of group g = the fifth bit of row r's value 4g+j
 *   Q8_0  d[16] | 8 chunks: chunk g byte 4r+j = row r's value 4g+j (int8)
 *   Q4_K  d[16] dmin[16] | the 12 scale bytes as three planes of 16 u32 | 4 pairs of
 *         sub-blocks x 8 chunks: chunk (p, c) byte 4r+j = row r's qs[32p+4c+j] (low nibble:
 *         sub-block 2p, high: 2p+1)
 *   Q5_K  as Q4_K, each pair's 8 chunks followed by its two sub-blocks' fifth bits (8 groups
 *         x 64 bits each)
 *   Q6_K  d[16] | scales [16 sub-blocks][16 rows] int8 | per sub-block s, 192 bytes: low
 *         nibbles of groups 4s (low) and 4s+1 (high), of groups 4s+2 and 4s+3, then the high
 *         bits: byte 4r+j bits 2t..2t+1 = group 4s+t's value j of row r
 * Each block is read as one forward stream: a kernel that walked two regions of a block at
 * once (values here, their high bits there) streamed from memory at half the speed.
 * Rows past the last whole panel stay with the row dots.
 */
#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "vec16.h"

/* ---- which types pack, and their sizes ---------------------------------------------- */

/* 1 + packed.c's KIND of a legacy type, 0 for the others */
static int lp_legacy_kind(int type) {
    switch (type) {
    case LI_Q4_0: return 1;
    case LI_Q4_1: return 2;
    case LI_Q5_0: return 3;
    case LI_Q5_1: return 4;
    case LI_Q8_0: return 5;
    default: return 0;
    }
}

static int lp_block(int type, int *values, int *bytes) {
    switch (type) {
    case LI_Q4_0: *values = 32; *bytes = 18; return 1;
    case LI_Q4_1: *values = 32; *bytes = 20; return 1;
    case LI_Q5_0: *values = 32; *bytes = 22; return 1;
    case LI_Q5_1: *values = 32; *bytes = 24; return 1;
    case LI_Q8_0: *values = 32; *bytes = 34; return 1;
    case LI_Q4_K: *values = 256; *bytes = 144; return 1;
    case LI_Q5_K: *values = 256; *bytes = 176; return 1;
    case LI_Q6_K: *values = 256; *bytes = 210; return 1;
    default: return li_pack_more_block(type, values, bytes);
    }
}

/* Bytes of the packed panels of a rows x k matrix (its first rows / 16 * 16 rows); 0 where
 * this build has no packed path for the type. */
int64_t li_pack_bytes(int type, int64_t rows, int64_t k) {
#ifdef LP_R
    int values, bytes;
    if (!lp_block(type, &values, &bytes) || k % values) return 0;
    return rows / LP_PANEL * LP_PANEL * (k / values) * bytes;
#else
    (void)type; (void)rows; (void)k;
    return 0;
#endif
}

/* ---- repacking ----------------------------------------------------------------------- */

/* row r's 4-byte words at `src` (stride `row_bytes` between rows) interleaved into 64-byte
 * chunks: chunk c byte 4r+j = src[r][4c+j], for `chunks` chunks */
static void lp_interleave4(uint8_t *dst, const uint8_t *src, int64_t row_bytes, int chunks) {
    for (int c = 0; c < chunks; c++)
        for (int r = 0; r < LP_PANEL; r++) memcpy(dst + c * 64 + 4 * r, src + r * row_bytes + 4 * c, 4);
}

/* 8 groups of 4 values x 16 rows of fifth bits: bit 4r+j of group g = bit (4g+j) of qh[r] */
static void lp_fifth_bits(uint8_t *dst, const uint32_t *qh) {
    for (int g = 0; g < 8; g++) {
        uint64_t m = 0;
        for (int r = 0; r < LP_PANEL; r++) m |= (uint64_t)((qh[r] >> (4 * g)) & 0xF) << (4 * r);
        memcpy(dst + 8 * g, &m, 8);
    }
}

static void lp_pack_legacy(int type, uint8_t *dst, const uint8_t *src, int64_t row_bytes, int bytes) {
    const int has_m = type == LI_Q4_1 || type == LI_Q5_1, has_qh = type == LI_Q5_0 || type == LI_Q5_1;
    uint8_t *o = dst;
    for (int r = 0; r < LP_PANEL; r++) memcpy(o + 2 * r, src + r * row_bytes, 2);
    o += 32;
    if (has_m) {
        for (int r = 0; r < LP_PANEL; r++) memcpy(o + 2 * r, src + r * row_bytes + 2, 2);
        o += 32;
    }
    if (has_qh) {
        uint32_t qh[LP_PANEL];
        for (int r = 0; r < LP_PANEL; r++) qh[r] = lp_u32(src + r * row_bytes + (has_m ? 4 : 2));
        lp_fifth_bits(o, qh);
        o += 64;
    }
    lp_interleave4(o, src + bytes - (type == LI_Q8_0 ? 32 : 16), row_bytes, type == LI_Q8_0 ? 8 : 4);
}

static void lp_pack_q45_K(int q5, uint8_t *dst, const uint8_t *src, int64_t row_bytes) {
    for (int r = 0; r < LP_PANEL; r++) {
        memcpy(dst + 2 * r, src + r * row_bytes, 2);
        memcpy(dst + 32 + 2 * r, src + r * row_bytes + 2, 2);
        for (int w = 0; w < 3; w++) memcpy(dst + 64 + 64 * w + 4 * r, src + r * row_bytes + 4 + 4 * w, 4);
    }
    /* each pair of sub-blocks: its 8 chunks of nibbles, then (Q5_K) the two sub-blocks' fifth
     * bits, so the kernel reads one forward stream (two streams a block held a thread to half
     * the memory's speed) */
    const int64_t qs = q5 ? 48 : 16, pair = q5 ? 640 : 512;
    for (int p = 0; p < 4; p++) {
        uint8_t *o = dst + 256 + pair * p;
        lp_interleave4(o, src + qs + 32 * p, row_bytes, 8);
        for (int s = 2 * p; q5 && s < 2 * p + 2; s++) { /* sub-block s's fifth bits: bit s of qh[l] */
            uint32_t bits[LP_PANEL];
            for (int r = 0; r < LP_PANEL; r++) {
                const uint8_t *qh = src + r * row_bytes + 16;
                bits[r] = 0;
                for (int l = 0; l < 32; l++) bits[r] |= (uint32_t)((qh[l] >> s) & 1) << l;
            }
            lp_fifth_bits(o + 512 + 64 * (s & 1), bits);
        }
    }
}

static void lp_pack_q6_K(uint8_t *dst, const uint8_t *src, int64_t row_bytes) {
    uint8_t *scales = dst + 32, *q = dst + 32 + 256; /* sub-block s: ql[128], then qh[64], at q + 192s */
    for (int r = 0; r < LP_PANEL; r++) {
        const uint8_t *b = src + r * row_bytes;
        memcpy(dst + 2 * r, b + 208, 2);
        uint8_t v[256]; /* the row's 6-bit values, unsigned */
        for (int n = 0; n < 2; n++)
            for (int l = 0; l < 32; l++) {
                const uint8_t lo0 = b[64 * n + l], lo1 = b[64 * n + l + 32], h = b[128 + 32 * n + l];
                v[128 * n + l] = (lo0 & 0xF) | ((h & 3) << 4);
                v[128 * n + l + 32] = (lo1 & 0xF) | (((h >> 2) & 3) << 4);
                v[128 * n + l + 64] = (lo0 >> 4) | (((h >> 4) & 3) << 4);
                v[128 * n + l + 96] = (lo1 >> 4) | (((h >> 6) & 3) << 4);
            }
        for (int s = 0; s < 16; s++) {
            scales[16 * s + r] = b[192 + s];
            for (int j = 0; j < 4; j++) {
                const uint8_t *g = v + 16 * s + j; /* groups 4s+t: values 16s + 4t + j */
                q[192 * s + 4 * r + j] = (g[0] & 0xF) | (g[4] & 0xF) << 4;
                q[192 * s + 64 + 4 * r + j] = (g[8] & 0xF) | (g[12] & 0xF) << 4;
                q[192 * s + 128 + 4 * r + j] = (g[0] >> 4) | (g[4] >> 4) << 2 | (g[8] >> 4) << 4 | (g[12] >> 4) << 6;
            }
        }
    }
}

/* Packs the first rows / 16 * 16 rows of w (rows x k, GGUF rows of `type`) into out
 * (li_pack_bytes). Returns 0, or 1 where the type does not pack. Panels are independent,
 * so threads split them. */
int li_pack(int type, const void *w, int64_t rows, int64_t k, void *out) {
    int values, bytes;
    if (!li_pack_bytes(type, rows, k) || !lp_block(type, &values, &bytes)) return 1;
    const int64_t nb = k / values, row_bytes = nb * bytes, panels = rows / LP_PANEL, pb = LP_PANEL * bytes;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < panels; p++) {
        const uint8_t *src = (const uint8_t *)w + p * LP_PANEL * row_bytes;
        uint8_t *dst = (uint8_t *)out + p * nb * pb;
        if (values == 1) { /* F32, F16, BF16 */
            li_pack_more_floats(type, dst, src, row_bytes, k);
            continue;
        }
        for (int64_t b = 0; b < nb; b++) {
            if (type == LI_Q6_K) lp_pack_q6_K(dst + b * pb, src + b * bytes, row_bytes);
            else if (type != LI_Q4_K && type != LI_Q5_K && !lp_legacy_kind(type)) li_pack_more(type, dst + b * pb, src + b * bytes, row_bytes);
            else if (values == 256) lp_pack_q45_K(type == LI_Q5_K, dst + b * pb, src + b * bytes, row_bytes);
            else lp_pack_legacy(type, dst + b * pb, src + b * bytes, row_bytes, bytes);
        }
    }
    return 0;
}

/* The Q4_K/Q5_K activation pairs: for each Q8_K block, its 8 sums of 32 values (from the
 * 16 sums of 16) as four int32, each two int16 (sub-blocks 2i, 2i+1), for vpmaddwd with
 * the mins. */
void li_q8k_pairs(const li_block_q8_K *a, int64_t blocks, int32_t *pairs) {
    for (int64_t b = 0; b < blocks; b++)
        for (int i = 0; i < 4; i++) {
            const int lo = a[b].bsums[4 * i] + a[b].bsums[4 * i + 1], hi = a[b].bsums[4 * i + 2] + a[b].bsums[4 * i + 3];
            pairs[4 * b + i] = (int32_t)((uint32_t)(uint16_t)lo | (uint32_t)(uint16_t)hi << 16);
        }
}

#ifdef LP_R
/* ---- the legacy types against q8s activations ------------------------------------------- */

/* KIND: 0 = Q4_0, 1 = Q4_1, 2 = Q5_0, 3 = Q5_1, 4 = Q8_0 */
#define LP_BSZ(KIND) ((KIND) == 0 ? 18 : (KIND) == 1 ? 20 : (KIND) == 2 ? 22 : (KIND) == 3 ? 24 : 34)
#define LP_HAS_M(KIND) ((KIND) == 1 || (KIND) == 3)
#define LP_HAS_QH(KIND) ((KIND) == 2 || (KIND) == 3)
/* the value offset folded into the integer sums: sum((q + off) * a) = sum(q * a) + off * sum(a) */
#define LP_OFF(KIND) ((KIND) == 0 ? -8 : (KIND) == 2 ? -16 : (KIND) == 4 && LP_XOR_Q8 ? -128 : 0)

/* R activation rows (qs[k], d[k/32], sum[k/32] each) against one panel of nb blocks: out[r]
 * gets the panel's 16 results for row r. */
LP_INLINE void lp_legacy(const int KIND, const int R, const uint8_t *pw, int64_t nb, const li_q8s *a, int64_t k,
                         float *y, int64_t ldy) {
    const int64_t pb = 16 * LP_BSZ(KIND), nsb = k / 32;
    const vi m4 = vi_set1(0x0F0F0F0F);
    vf acc[LP_R];
    for (int r = 0; r < R; r++) acc[r] = vf_zero();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = pw + b * pb;
        li_prefetch_row(blk, pb);
        const uint8_t *qh = blk + (LP_HAS_M(KIND) ? 64 : 32), *qs = qh + (LP_HAS_QH(KIND) ? 64 : 0);
        vi isum[LP_R];
        for (int r = 0; r < R; r++) isum[r] = vi_set1(LP_OFF(KIND) * a->sum[r * nsb + b]);
        const int8_t *ab = a->qs + b * 32;
        if (KIND == 4) {
            for (int g = 0; g < 8; g++) {
                const vi w = vi_load(qs + 64 * g);
#if LP_XOR_Q8
                const vi uw =
#ifdef LP_512
                    _mm512_xor_si512(w, _mm512_set1_epi8((char)0x80));
#else
                    (vi){_mm256_xor_si256(w.l, _mm256_set1_epi8((char)0x80)), _mm256_xor_si256(w.h, _mm256_set1_epi8((char)0x80))};
#endif
                for (int r = 0; r < R; r++) isum[r] = vi_dpbusd(isum[r], uw, va_bcast(ab + r * k + 4 * g));
#else
                const __m256i ul = _mm256_sign_epi8(w.l, w.l), uh = _mm256_sign_epi8(w.h, w.h);
                for (int r = 0; r < R; r++) {
                    const __m256i av = va_bcast(ab + r * k + 4 * g), one = _mm256_set1_epi16(1);
                    isum[r].l = _mm256_add_epi32(isum[r].l, _mm256_madd_epi16(_mm256_maddubs_epi16(ul, _mm256_sign_epi8(av, w.l)), one));
                    isum[r].h = _mm256_add_epi32(isum[r].h, _mm256_madd_epi16(_mm256_maddubs_epi16(uh, _mm256_sign_epi8(av, w.h)), one));
                }
#endif
            }
        } else {
            for (int c = 0; c < 4; c++) {
                const vi v = vi_load(qs + 64 * c);
                vi lo = vi_and(v, m4), hi = vi_and(vi_srli16(v, 4), m4);
                if (LP_HAS_QH(KIND)) {
                    lo = vi_add_0x10(lo, qh + 8 * c);
                    hi = vi_add_0x10(hi, qh + 8 * (c + 4));
                }
                for (int r = 0; r < R; r++)
                    isum[r] = vi_dpbusd(vi_dpbusd(isum[r], lo, va_bcast(ab + r * k + 4 * c)), hi, va_bcast(ab + r * k + 16 + 4 * c));
            }
        }
        const vf dw = vf_f16(blk);
        for (int r = 0; r < R; r++) {
            const float da = a->d[r * nsb + b];
            acc[r] = vf_fmadd(vf_mul(dw, vf_set1(da)), vf_cvt(isum[r]), acc[r]);
            if (LP_HAS_M(KIND)) acc[r] = vf_fmadd(vf_f16(blk + 32), vf_set1(da * (float)a->sum[r * nsb + b]), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) vf_store(y + r * ldy, acc[r]);
}

/* ---- Q4_K and Q5_K against Q8_K ------------------------------------------------------------ */

/* byte j (0..3) of each u32 lane, as int32 */
#define LP_BYTE(v, j) vi_and(vi_srli32(v, 8 * (j)), vi_set1(0xFF))

LP_INLINE void lp_q45_K(const int Q5, const int R, const uint8_t *pw, int64_t nb, const li_block_q8_K *a,
                        const int32_t *pairs, float *y, int64_t ldy) {
    const int64_t pb = Q5 ? 16 * 176 : 16 * 144;
    const vi m4 = vi_set1(0x0F0F0F0F), m6 = vi_set1(0x3F3F3F3F), m30 = vi_set1(0x30303030);
    vf acc[LP_R];
    for (int r = 0; r < R; r++) acc[r] = vf_zero();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = pw + b * pb, *q = blk + 256;
        const int64_t pair = Q5 ? 640 : 512;
        li_prefetch_row(blk, pb);
        const vi A = vi_load(blk + 64), C = vi_load(blk + 192);
        const vi sc_lo = vi_and(A, m6), sc_hi = vi_or(vi_and(C, m4), vi_and(vi_srli32(A, 2), m30));
        vi sumi[LP_R];
        for (int r = 0; r < R; r++) sumi[r] = vi_set1(0);
        for (int s = 0; s < 8; s++) {
            vi isum[LP_R];
            for (int r = 0; r < R; r++) isum[r] = vi_set1(0);
            for (int c = 0; c < 8; c++) {
                const vi v = vi_load(q + pair * (s >> 1) + 64 * c);
                vi u = (s & 1) ? vi_and(vi_srli16(v, 4), m4) : vi_and(v, m4);
                if (Q5) u = vi_add_0x10(u, q + pair * (s >> 1) + 512 + 64 * (s & 1) + 8 * c);
                for (int r = 0; r < R; r++) isum[r] = vi_dpbusd(isum[r], u, va_bcast(a[r * nb + b].qs + 32 * s + 4 * c));
            }
            const vi sc = LP_BYTE(s < 4 ? sc_lo : sc_hi, s & 3);
            for (int r = 0; r < R; r++) sumi[r] = vi_add(sumi[r], vi_mullo(isum[r], sc));
        }
        /* the mins as int16 pairs (2i, 2i+1) against the activations' sums of 32 */
        const vi B = vi_load(blk + 128);
        const vi mn_lo = vi_and(B, m6), mn_hi = vi_or(vi_and(vi_srli32(C, 4), m4), vi_and(vi_srli32(B, 2), m30));
        const vi b0 = vi_set1(0xFF), b2 = vi_set1(0xFF0000); /* bytes [m0 m1 m2 m3] -> words (m0, m1), (m2, m3) */
        const vi mp[4] = {vi_or(vi_and(mn_lo, b0), vi_and(vi_slli32(mn_lo, 8), b2)),
                          vi_or(vi_and(vi_srli32(mn_lo, 16), b0), vi_and(vi_srli32(mn_lo, 8), b2)),
                          vi_or(vi_and(mn_hi, b0), vi_and(vi_slli32(mn_hi, 8), b2)),
                          vi_or(vi_and(vi_srli32(mn_hi, 16), b0), vi_and(vi_srli32(mn_hi, 8), b2))};
        const vf d = vf_f16(blk), dmin = vf_f16(blk + 32);
        for (int r = 0; r < R; r++) {
            const int32_t *pr = pairs + (r * nb + b) * 4;
            vi summ = vi_dpwssd(vi_set1(0), mp[0], va_set1(pr[0]));
            summ = vi_dpwssd(summ, mp[1], va_set1(pr[1]));
            summ = vi_dpwssd(summ, mp[2], va_set1(pr[2]));
            summ = vi_dpwssd(summ, mp[3], va_set1(pr[3]));
            const vf da = vf_set1(a[r * nb + b].d);
            acc[r] = vf_fmadd(vf_mul(d, da), vf_cvt(sumi[r]), acc[r]);
            acc[r] = vf_fnmadd(vf_mul(dmin, da), vf_cvt(summ), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) vf_store(y + r * ldy, acc[r]);
}

/* ---- Q6_K against Q8_K ------------------------------------------------------------------------ */

LP_INLINE void lp_q6_K(const int R, const uint8_t *pw, int64_t nb, const li_block_q8_K *a, float *y, int64_t ldy) {
    const int64_t pb = 16 * 210;
    const vi m4 = vi_set1(0x0F0F0F0F), m30 = vi_set1(0x30303030), lo16 = vi_set1(0xFFFF);
    vf acc[LP_R];
    for (int r = 0; r < R; r++) acc[r] = vf_zero();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = pw + b * pb, *scales = blk + 32, *q = blk + 288;
        li_prefetch_row(blk, pb);
        vi sumi[LP_R];
        for (int r = 0; r < R; r++) sumi[r] = vi_set1(0);
        for (int s = 0; s < 16; s++) {
            const vi l0 = vi_load(q + 192 * s), l1 = vi_load(q + 192 * s + 64), h = vi_load(q + 192 * s + 128);
            const vi g0 = vi_or(vi_and(l0, m4), vi_and(vi_slli16(h, 4), m30));
            const vi g1 = vi_or(vi_and(vi_srli16(l0, 4), m4), vi_and(vi_slli16(h, 2), m30));
            const vi g2 = vi_or(vi_and(l1, m4), vi_and(h, m30));
            const vi g3 = vi_or(vi_and(vi_srli16(l1, 4), m4), vi_and(vi_srli16(h, 2), m30));
            const vi sc = vi_cvt_i8(scales + 16 * s);
            for (int r = 0; r < R; r++) {
                const int8_t *q8 = a[r * nb + b].qs + 16 * s;
                vi isum = vi_dpbusd(vi_set1(0), g0, va_bcast(q8));
                isum = vi_dpbusd(isum, g1, va_bcast(q8 + 4));
                isum = vi_dpbusd(isum, g2, va_bcast(q8 + 8));
                isum = vi_dpbusd(isum, g3, va_bcast(q8 + 12));
                sumi[r] = vi_add(sumi[r], vi_mullo(isum, sc));
            }
        }
        /* the values are stored as q + 32: take 32 * sum_s scale_s * bsums_s once per block, the
           scales as int16 pairs (s = 2i, 2i + 1) against the activations' int16 sums of 16 */
        vi sp[8];
        for (int i = 0; i < 8; i++)
            sp[i] = vi_or(vi_and(vi_cvt_i8(scales + 32 * i), lo16), vi_slli32(vi_cvt_i8(scales + 32 * i + 16), 16));
        const vf d = vf_f16(blk);
        for (int r = 0; r < R; r++) {
            const li_block_q8_K *ar = a + r * nb + b;
            vi off = vi_set1(0);
            for (int i = 0; i < 8; i++) off = vi_dpwssd(off, sp[i], va_bcast((const int8_t *)(ar->bsums + 2 * i)));
            sumi[r] = vi_sub(sumi[r], vi_slli32(off, 5));
            acc[r] = vf_fmadd(vf_mul(d, vf_set1(ar->d)), vf_cvt(sumi[r]), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) vf_store(y + r * ldy, acc[r]);
}

/* ---- drivers ---------------------------------------------------------------------------------- */

/* One panel against activation rows [0, n) in tiles of LP_R (then the rest as one tile). */
LP_INLINE void lp_rows_legacy(const int KIND, const uint8_t *packed, int64_t p0, int64_t p1, int64_t k,
                              const li_q8s *a, int64_t n, float *y, int64_t ldy) {
    const int64_t nb = k / 32, panel_bytes = nb * 16 * LP_BSZ(KIND);
    for (int64_t p = p0; p < p1; p++) {
        const uint8_t *pw = packed + p * panel_bytes;
#define LP_CALL(R)                                                                                        \
    do {                                                                                                  \
        const li_q8s t = {a->qs + j * k, a->d + j * nb, a->sum + j * nb};                                \
        lp_legacy(KIND, R, pw, nb, &t, k, y + j * ldy + 16 * p, ldy);                                     \
    } while (0)
        LP_TILES(LP_CALL)
#undef LP_CALL
    }
}

void li_packed_rows_q8s(int type, const uint8_t *packed, int64_t p0, int64_t p1, int64_t k, const li_q8s *a, int64_t n,
                        float *y, int64_t ldy) {
    switch (type) {
    case LI_Q4_0: lp_rows_legacy(0, packed, p0, p1, k, a, n, y, ldy); break;
    case LI_Q4_1: lp_rows_legacy(1, packed, p0, p1, k, a, n, y, ldy); break;
    case LI_Q5_0: lp_rows_legacy(2, packed, p0, p1, k, a, n, y, ldy); break;
    case LI_Q5_1: lp_rows_legacy(3, packed, p0, p1, k, a, n, y, ldy); break;
    case LI_Q8_0: lp_rows_legacy(4, packed, p0, p1, k, a, n, y, ldy); break;
    default: li_packed_rows_more_q8s(type, packed, p0, p1, k, a, n, y, ldy); break;
    }
}

void li_packed_rows_q8k(int type, const uint8_t *packed, int64_t p0, int64_t p1, int64_t k, const li_block_q8_K *a,
                        const int32_t *pairs, int64_t n, float *y, int64_t ldy) {
    if (type != LI_Q4_K && type != LI_Q5_K && type != LI_Q6_K) {
        li_packed_rows_more_q8k(type, packed, p0, p1, k, a, n, y, ldy);
        return;
    }
    const int64_t nb = k / 256;
    int values, bytes;
    lp_block(type, &values, &bytes);
    const int64_t panel_bytes = nb * 16 * bytes;
    for (int64_t p = p0; p < p1; p++) {
        const uint8_t *pw = packed + p * panel_bytes;
#define LP_CALL(R)                                                                                                   \
    do {                                                                                                             \
        if (type == LI_Q6_K) lp_q6_K(R, pw, nb, a + j * nb, y + j * ldy + 16 * p, ldy);                             \
        else if (type == LI_Q5_K) lp_q45_K(1, R, pw, nb, a + j * nb, pairs + j * nb * 4, y + j * ldy + 16 * p, ldy); \
        else lp_q45_K(0, R, pw, nb, a + j * nb, pairs + j * nb * 4, y + j * ldy + 16 * p, ldy);                     \
    } while (0)
        LP_TILES(LP_CALL)
#undef LP_CALL
    }
}

#else /* no SIMD: nothing packs, li_pack_bytes says 0 */

void li_packed_rows_q8s(int type, const uint8_t *packed, int64_t p0, int64_t p1, int64_t k, const li_q8s *a, int64_t n,
                        float *y, int64_t ldy) {
    (void)type; (void)packed; (void)p0; (void)p1; (void)k; (void)a; (void)n; (void)y; (void)ldy;
}

void li_packed_rows_q8k(int type, const uint8_t *packed, int64_t p0, int64_t p1, int64_t k, const li_block_q8_K *a,
                        const int32_t *pairs, int64_t n, float *y, int64_t ldy) {
    (void)type; (void)packed; (void)p0; (void)p1; (void)k; (void)a; (void)pairs; (void)n; (void)y; (void)ldy;
}

#endif
