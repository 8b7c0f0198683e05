/* Products of many rows through AMX tiles (Intel Xeon Sapphire Rapids and later).
 *
 * AMX multiplies a 16 x K tile of int8 rows by a K x 16 tile of int8 columns into
 * 16 x 16 int32 sums in one instruction: 16 times the work of a 512-bit VNNI dot.
 * Every block format here has a float scale per 16 or 32 values, so each tile product
 * covers one block (K = 32, Q6_K: 16) and its exact int32 sums are scaled into float
 * accumulators before the next block:
 *   y[j][r] += (float)sum_block(a_j * w_r) * (d_w[r] * d_a[j]) + m_w[r] * s_a[j]
 * where the weight block is unpacked to int8 values v and a float scale (and for
 * Q4_1/Q5_1/Q4_K/Q5_K a min m), so that w = d_w * v + m_w, and s_a = d_a * sum(a).
 *
 * Two paths, which differ in how they add those float terms:
 * - exact (li_amx_rows_exact, the legacy types Q4_0 .. Q8_0): in the row dots' order
 *   (legacy.c's dot_legacy: eight lanes of block sums, then their sum), so every result
 *   equals the row dots' bit for bit, and matmul.c sends every row of a legacy product
 *   here once there are enough of them. Weights are the A tile (a panel of 16 rows by one
 *   block, unpacked as the row dots unpack them), activations the B tile.
 * - fast (li_amx_rows, the K-quants, or legacy types fused with them): one accumulator per
 *   output, block after block. Not bit-identical to the row dots, though still a
 *   function of the one activation row alone (never of the rows beside it, nor of how
 *   many there are). matmul.c sends only the leading n_fast rows here, and the forward
 *   pass makes those the rows whose logits nobody reads (prompt rows): every row that
 *   produces logits (decode, speculative verify) still goes through the row dots, so a
 *   verify equals decoding bit for bit. Weights are unpacked a panel of 16 rows at a time
 *   into the B tile layout (four consecutive values of each of the 16 rows side by side),
 *   then every tile of 16 activation rows runs against the panel.
 *
 * Linux hands out the AMX register state only on request (arch_prctl); li_amx_usable()
 * asks once, and says no where that fails.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512F__) && defined(__AVX512BW__) && \
    defined(__AVX512VL__) && defined(__linux__)
#define LI_HAVE_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#ifdef LI_HAVE_AMX

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define PANEL 16 /* weight rows per panel: AMX's N */
#define TILE_M 16 /* activation rows per tile: AMX's M */

typedef struct {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

int li_amx_usable(void) {
    static int state = -1; /* -1 unknown, 0 no, 1 yes */
    if (state < 0) {
        const char *env = getenv("LOCALINFER_AMX");
        if (env && env[0] == '0') state = 0;
        else state = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    }
    return state;
}

/* values per scale: 32, 16 for Q6_K; 0 where AMX does not run the type */
static int scale_block(int type) {
    switch (type) {
    case LI_Q4_0: case LI_Q4_1: case LI_Q5_0: case LI_Q5_1: case LI_Q8_0: case LI_Q4_K: case LI_Q5_K: return 32;
    case LI_Q6_K: return 16;
    default: return 0;
    }
}

int li_amx_runs(int type) { return scale_block(type) != 0; }

static inline float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return li_fp16_to_fp32(h);
}

/* bytes per legacy block; 0 for the other types */
static int legacy_bytes(int type) {
    switch (type) {
    case LI_Q4_0: return 18;
    case LI_Q4_1: return 20;
    case LI_Q5_0: return 22;
    case LI_Q5_1: return 24;
    case LI_Q8_0: return 34;
    default: return 0;
    }
}

/* One weight row of k values to int8 v[k], scales d[b] and mins m[b] (one per block of
 * scale_block(type) values; m stays untouched for the types without mins). */
static void unpack_row(int type, const uint8_t *w, int64_t k, int8_t *v, float *d, float *m) {
    switch (type) {
    case LI_Q4_0: case LI_Q4_1: case LI_Q5_0: case LI_Q5_1: case LI_Q8_0: {
        const int bytes = legacy_bytes(type);
        for (int64_t b = 0; b < k / 32; b++, w += bytes, v += 32) {
            d[b] = f16(w);
            if (type == LI_Q8_0) {
                memcpy(v, w + 2, 32);
                continue;
            }
            const int has_min = type == LI_Q4_1 || type == LI_Q5_1, five = type == LI_Q5_0 || type == LI_Q5_1;
            if (has_min) m[b] = f16(w + 2);
            uint32_t qh = 0;
            if (five) memcpy(&qh, w + 2 + 2 * has_min, 4);
            const uint8_t *qs = w + 2 + 2 * has_min + 4 * five;
            const int offset = has_min ? 0 : five ? 16 : 8;
            li_legacy_values(qs, qh, v);
            for (int i = 0; i < 32; i++) v[i] = (int8_t)(v[i] - offset);
        }
        return;
    }
    case LI_Q4_K: case LI_Q5_K: {
        const int five = type == LI_Q5_K, bytes = five ? 176 : 144;
        for (int64_t s = 0; s < k / LI_QK_K; s++, w += bytes, v += LI_QK_K, d += 8, m += 8) {
            const float dd = f16(w), dmin = f16(w + 2);
            const uint8_t *scales = w + 4, *qh = w + 16, *qs = w + 16 + 32 * five;
            for (int j = 0; j < 4; j++) {
                int sc0, m0, sc1, m1;
                li_scale_min_k4(2 * j, scales, &sc0, &m0);
                li_scale_min_k4(2 * j + 1, scales, &sc1, &m1);
                d[2 * j] = dd * (float)sc0;
                m[2 * j] = -dmin * (float)m0;
                d[2 * j + 1] = dd * (float)sc1;
                m[2 * j + 1] = -dmin * (float)m1;
                for (int l = 0; l < 32; l++) {
                    const int h0 = five ? ((qh[l] >> (2 * j)) & 1) << 4 : 0, h1 = five ? ((qh[l] >> (2 * j + 1)) & 1) << 4 : 0;
                    v[64 * j + l] = (int8_t)((qs[32 * j + l] & 15) | h0);
                    v[64 * j + 32 + l] = (int8_t)((qs[32 * j + l] >> 4) | h1);
                }
            }
        }
        return;
    }
    case LI_Q6_K:
        for (int64_t s = 0; s < k / LI_QK_K; s++, w += 210, v += LI_QK_K, d += 16) {
            const float dd = f16(w + 208);
            const int8_t *scales = (const int8_t *)(w + 192);
            for (int i = 0; i < 16; i++) d[i] = dd * (float)scales[i];
            for (int half = 0; half < 2; half++) {
                const uint8_t *ql = w + 64 * half, *qh = w + 128 + 32 * half;
                int8_t *o = v + 128 * half;
                for (int l = 0; l < 32; l++) {
                    o[l] = (int8_t)(((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32);
                    o[l + 32] = (int8_t)(((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32);
                    o[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                    o[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
                }
            }
        }
        return;
    }
}

/* One thread's room for a panel of rows of k values: values in tile layout [k/4][16][4],
 * scales and mins [k/16][16] each, and one unpacked row with its scales and mins. */
int64_t li_amx_scratch_bytes(int64_t k) { return 16 * k + 2 * k * 4 + k + 2 * (k / 16) * 4 + 64; }

/* Rows [r0, r1) of one weight matrix against activation rows [0, n) in the plain q8a
 * layout (qs natural order with room for whole 16-row tiles, d and s one float per
 * 32-block): y[j*ldy + r]. scratch: li_amx_scratch_bytes(k), 64-byte aligned. */
void li_amx_rows(int type, const uint8_t *w, int64_t row_bytes, int64_t r0, int64_t r1, int64_t k, const int8_t *qs,
                 const float *ad, const float *as, int64_t n, float *y, int64_t ldy, void *scratch) {
    const int bs = scale_block(type);
    const int has_min = type == LI_Q4_1 || type == LI_Q5_1 || type == LI_Q4_K || type == LI_Q5_K;
    const int64_t nb = k / bs, na = k / 32;
    int8_t *panel = (int8_t *)scratch;
    float *pd = (float *)(panel + 16 * k), *pm = pd + 16 * nb;
    int8_t *row = (int8_t *)(pm + 16 * nb);
    float *rd = (float *)(row + k), *rm = rd + nb;

    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    cfg.rows[0] = TILE_M; cfg.colsb[0] = 64;         /* C: 16 x 16 int32 */
    cfg.rows[1] = TILE_M; cfg.colsb[1] = (uint16_t)bs; /* A: 16 activation rows x one block */
    cfg.rows[2] = (uint8_t)(bs / 4); cfg.colsb[2] = 64; /* B: one block of 16 weight rows */
    _tile_loadconfig(&cfg);
    _Alignas(64) int32_t c[TILE_M][16];

    for (int64_t p0 = r0; p0 < r1; p0 += PANEL) {
        const int nr = r1 - p0 < PANEL ? (int)(r1 - p0) : PANEL;
        if (nr < PANEL) {
            memset(panel, 0, (size_t)(16 * k));
            memset(pd, 0, (size_t)(2 * 16 * nb * 4));
        }
        for (int r = 0; r < nr; r++) {
            memset(rm, 0, (size_t)nb * 4);
            unpack_row(type, w + (p0 + r) * row_bytes, k, row, rd, rm);
            for (int64_t e = 0; e < k; e += 4) memcpy(panel + (e >> 2) * 64 + r * 4, row + e, 4);
            for (int64_t b = 0; b < nb; b++) {
                pd[b * 16 + r] = rd[b];
                pm[b * 16 + r] = rm[b];
            }
        }
        const __mmask16 keep = (__mmask16)((1u << nr) - 1);
        for (int64_t j0 = 0; j0 < n; j0 += TILE_M) {
            const int mv = n - j0 < TILE_M ? (int)(n - j0) : TILE_M;
            __m512 acc[TILE_M];
            for (int i = 0; i < TILE_M; i++) acc[i] = _mm512_setzero_ps();
            for (int64_t b = 0; b < nb; b++) {
                _tile_loadd(1, qs + j0 * k + b * bs, k);
                _tile_loadd(2, panel + b * bs * 16, 64);
                _tile_zero(0);
                _tile_dpbssd(0, 1, 2);
                _tile_stored(0, c, 64);
                const __m512 dw = _mm512_loadu_ps(pd + b * 16), mw = _mm512_loadu_ps(pm + b * 16);
                const int64_t ab = b * bs / 32;
                for (int i = 0; i < mv; i++) {
                    const float *da = ad + (j0 + i) * na, *sa = as + (j0 + i) * na;
                    const __m512 prod = _mm512_cvtepi32_ps(_mm512_load_si512(c[i]));
                    acc[i] = _mm512_fmadd_ps(prod, _mm512_mul_ps(dw, _mm512_set1_ps(da[ab])), acc[i]);
                    if (has_min) acc[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sa[ab]), acc[i]);
                }
            }
            for (int i = 0; i < mv; i++) _mm512_mask_storeu_ps(y + (j0 + i) * ldy + p0, keep, acc[i]);
        }
    }
    _tile_release();
}

/* ---- legacy types, bit for bit as the row dots ------------------------------------------ */

int li_amx_exact_runs(int type) { return legacy_bytes(type) != 0; }

/* Room per thread for a panel of 16 rows of k values: values [k/32][16][32], their scales
 * d and m [k/32][16], and the int32 products of one tile of 16 activation rows against
 * the panel [k/32][16][16]. */
int64_t li_amx_exact_scratch_bytes(int64_t k) { return k / 32 * (512 + 2 * 64 + 1024) + 64; }

/* Rows [p0, p0 + nr) of a legacy matrix as the row dots read them: each block's 32 values
 * in natural order at panel + b*512 + r*32, unsigned (0..15, 0..31) for Q4/Q5 and signed
 * for Q8_0; its d at pd[b*16 + r] and m at pm[b*16 + r] (d where the type has no min). */
static inline __attribute__((always_inline)) void unpack_panel(const int type, const uint8_t *w, int64_t row_bytes,
                                                               int nr, int64_t nb, int8_t *panel, float *pd, float *pm) {
    const int has_min = type == LI_Q4_1 || type == LI_Q5_1, five = type == LI_Q5_0 || type == LI_Q5_1;
    const int64_t bs = legacy_bytes(type);
    for (int r = 0; r < nr; r++) {
        const uint8_t *wr = w + r * row_bytes;
        li_prefetch_row(wr, row_bytes);
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = wr + b * bs;
            int8_t *v = panel + b * 512 + r * 32;
            const float d = f16(blk);
            pd[b * 16 + r] = d;
            pm[b * 16 + r] = has_min ? f16(blk + 2) : d;
            uint32_t qh = 0;
            if (five) memcpy(&qh, blk + 2 + 2 * has_min, 4);
            _mm256_store_si256((__m256i *)v, type == LI_Q8_0 ? _mm256_loadu_si256((const __m256i *)(blk + 2))
                                                              : li_legacy_values_v(blk + 2 + 2 * has_min + 4 * five, qh, five));
        }
    }
}

/* the float terms of one block of one weight row against a tile's 16 activation rows,
 * into lane l: dot_legacy's multiply and multiply-adds, 16 activation rows at a time */
#define EXACT_BLOCK(b, l)                                                                                      \
    do {                                                                                                       \
        const __m512 s_ = _mm512_cvtepi32_ps(_mm512_load_si512(cbuf + ((b) * 16 + r) * 16));                 \
        acc[l] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(pd[(b) * 16 + r]), _mm512_loadu_ps(ad + (b) * 16)), \
                                 s_, acc[l]);                                                                  \
        if (corr) accc[l] = _mm512_fmadd_ps(_mm512_set1_ps(pm[(b) * 16 + r]), _mm512_loadu_ps(as + (b) * 16), accc[l]); \
    } while (0)

/* Rows [r0, r1) of one legacy matrix against n activation rows in the tile layout
 * (li_quantize_q8a's LI_Q8A_TILES): y[j*ldy + r] equal to the row dots' bit for bit.
 *
 * The weights are the A tile (16 rows by one block), the activations the B tile (one
 * block of 16 rows, four values of each row side by side), so the unpacked weight rows
 * need no interleaving. Each output then takes the row dots' float operations in their
 * order: block b's terms into lane LI_OCTET_LANE(b % 8) of eight, the blocks after the
 * last octet as one more, then the eight lanes summed as li_hsum8 sums them. The
 * vectors run across activation rows, where the row dots' run across blocks. */
void li_amx_rows_exact(int type, const uint8_t *w, int64_t row_bytes, int64_t r0, int64_t r1, int64_t k,
                       const int8_t *qs, const float *tad, const float *tas, int64_t n, float *y, int64_t ldy,
                       void *scratch) {
    const int64_t nb = k / 32, no = nb / 8, rem = nb % 8, tiles = (n + 15) / 16;
    const int corr = type != LI_Q8_0;
    const float c = type == LI_Q4_0 ? -8.0f : type == LI_Q5_0 ? -16.0f : 1.0f;
    int8_t *panel = (int8_t *)scratch;
    float *pd = (float *)(panel + nb * 512), *pm = pd + nb * 16;
    int32_t *cbuf = (int32_t *)(pm + nb * 16);

    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int i = 0; i < 6; i += 3) { /* two blocks in flight: tiles 0-2 and 3-5 */
        cfg.rows[i] = 16; cfg.colsb[i] = 64;        /* C: 16 weight rows x 16 activation rows, int32 */
        cfg.rows[i + 1] = 16; cfg.colsb[i + 1] = 32; /* A: 16 weight rows x one block */
        cfg.rows[i + 2] = 8; cfg.colsb[i + 2] = 64;  /* B: one block of 16 activation rows, 4 values a row side by side */
    }
    _tile_loadconfig(&cfg);
    const __m512i rowstep = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                               _mm512_set1_epi32((int)ldy));

    for (int64_t p0 = r0; p0 < r1; p0 += PANEL) {
        const int nr = r1 - p0 < PANEL ? (int)(r1 - p0) : PANEL;
        /* rows past nr stay as they were: their products are never read */
        const uint8_t *wp = w + p0 * row_bytes;
        switch (type) {
        case LI_Q4_0: unpack_panel(LI_Q4_0, wp, row_bytes, nr, nb, panel, pd, pm); break;
        case LI_Q4_1: unpack_panel(LI_Q4_1, wp, row_bytes, nr, nb, panel, pd, pm); break;
        case LI_Q5_0: unpack_panel(LI_Q5_0, wp, row_bytes, nr, nb, panel, pd, pm); break;
        case LI_Q5_1: unpack_panel(LI_Q5_1, wp, row_bytes, nr, nb, panel, pd, pm); break;
        default: unpack_panel(LI_Q8_0, wp, row_bytes, nr, nb, panel, pd, pm); break;
        }
        for (int64_t t = 0; t < tiles; t++) {
            const int8_t *aq = qs + t * nb * 512;
            const float *ad = tad + t * nb * 16, *as = tas + t * nb * 16;
            int64_t b = 0;
            for (; b + 2 <= nb; b += 2) {
                _tile_loadd(1, panel + b * 512, 32);
                _tile_loadd(2, aq + b * 512, 64);
                _tile_loadd(4, panel + b * 512 + 512, 32);
                _tile_loadd(5, aq + b * 512 + 512, 64);
                _tile_zero(0);
                _tile_zero(3);
                _tile_dpbssd(0, 1, 2);
                _tile_dpbssd(3, 4, 5);
                _tile_stored(0, cbuf + b * 256, 64);
                _tile_stored(3, cbuf + b * 256 + 256, 64);
            }
            if (b < nb) {
                _tile_loadd(1, panel + b * 512, 32);
                _tile_loadd(2, aq + b * 512, 64);
                _tile_zero(0);
                _tile_dpbssd(0, 1, 2);
                _tile_stored(0, cbuf + b * 256, 64);
            }
            const int mv = n - t * 16 < 16 ? (int)(n - t * 16) : 16;
            const __mmask16 keep = (__mmask16)((1u << mv) - 1);
            for (int r = 0; r < nr; r++) {
                __m512 acc[8], accc[8];
                for (int l = 0; l < 8; l++) acc[l] = accc[l] = _mm512_setzero_ps();
                for (int64_t o = 0; o < no; o++) {
                    const int64_t b = o * 8;
                    EXACT_BLOCK(b, 0); EXACT_BLOCK(b + 1, 4); EXACT_BLOCK(b + 2, 1); EXACT_BLOCK(b + 3, 5);
                    EXACT_BLOCK(b + 4, 2); EXACT_BLOCK(b + 5, 6); EXACT_BLOCK(b + 6, 3); EXACT_BLOCK(b + 7, 7);
                }
                /* the last blocks: lanes without a block are left as they are (the row dots add a
                 * product with a zero scale there, which changes nothing: a lane is never -0) */
                switch (rem) {
                case 7: EXACT_BLOCK(no * 8 + 6, 3); /* fall through */
                case 6: EXACT_BLOCK(no * 8 + 5, 6); /* fall through */
                case 5: EXACT_BLOCK(no * 8 + 4, 2); /* fall through */
                case 4: EXACT_BLOCK(no * 8 + 3, 5); /* fall through */
                case 3: EXACT_BLOCK(no * 8 + 2, 1); /* fall through */
                case 2: EXACT_BLOCK(no * 8 + 1, 4); /* fall through */
                case 1: EXACT_BLOCK(no * 8, 0); /* fall through */
                default: break;
                }
                if (corr) {
                    const __m512 cv = _mm512_set1_ps(c);
                    for (int l = 0; l < 8; l++) acc[l] = _mm512_fmadd_ps(cv, accc[l], acc[l]);
                }
                const __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[4]), _mm512_add_ps(acc[2], acc[6])),
                                                 _mm512_add_ps(_mm512_add_ps(acc[1], acc[5]), _mm512_add_ps(acc[3], acc[7])));
                _mm512_mask_i32scatter_ps(y + t * 16 * ldy + p0 + r, keep, rowstep, sum, 4);
            }
        }
    }
    _tile_release();
}

#else /* no AMX in this build */

int li_amx_usable(void) { return 0; }
int li_amx_runs(int type) { (void)type; return 0; }
int li_amx_exact_runs(int type) { (void)type; return 0; }
int64_t li_amx_scratch_bytes(int64_t k) { (void)k; return 0; }
int64_t li_amx_exact_scratch_bytes(int64_t k) { (void)k; return 0; }
void li_amx_rows_exact(int type, const uint8_t *w, int64_t row_bytes, int64_t r0, int64_t r1, int64_t k,
                       const int8_t *qs, const float *tad, const float *tas, int64_t n, float *y, int64_t ldy,
                       void *scratch) {
    (void)type; (void)w; (void)row_bytes; (void)r0; (void)r1; (void)k; (void)qs; (void)tad; (void)tas; (void)n; (void)y;
    (void)ldy; (void)scratch;
}
void li_amx_rows(int type, const uint8_t *w, int64_t row_bytes, int64_t r0, int64_t r1, int64_t k, const int8_t *qs,
                 const float *ad, const float *as, int64_t n, float *y, int64_t ldy, void *scratch) {
    (void)type; (void)w; (void)row_bytes; (void)r0; (void)r1; (void)k; (void)qs; (void)ad; (void)as; (void)n; (void)y;
    (void)ldy; (void)scratch;
}

#endif
