/* The KV cache's rows, in each type the cache can hold, and attention's two reads of them.
 *
 * A row is one position of one kv head: hd values.
 *   f16   hd IEEE halves (llama.cpp's default cache)
 *   q8_0  hd/32 blocks {fp16 d; int8 q[32]}, value d*q: ggml's block_q8_0
 *   q4_0  hd/32 blocks {fp16 d; uint8 nib[16]}, value d*(q-8), element i in the low
 *         nibble of byte i and element i+16 in the high one: ggml's block_q4_0
 * The quantizers are ggml's reference ones, so a row holds the bytes llama.cpp's cache holds.
 *
 * Keys of f16 and q8_0 are stored in tiles of LI_KV_TILE positions instead (the bytes of
 * LI_KV_TILE rows, rearranged; layouts below), so that a row's query heads score sixteen
 * positions a vector with no horizontal sums.
 *
 * Attention (ops.c) reads the cache a block of positions at a time, for a tile of queries:
 * tiled keys in place, the others and the values as li_kv_block_keys / li_kv_block_values
 * put them (f16 and q8_0 values are read in place too). Scores against quantized keys are integer
 * dot products, as ggml's vec_dot: each query head is quantized once to q8_0 blocks, and a
 * block's score is d_k*d_q*sum(k*q). Values are widened to floats, d*q (exact in a float).
 *
 * Before a quantized cache stores a row, llama.cpp rotates it by an orthonormal
 * Walsh-Hadamard matrix H, in chunks of n_rot values (its "attention rotation"): the
 * rotation spreads an outlier over the whole chunk, so a block's scale no longer follows
 * one large value. Queries are rotated like the keys (Hq.Hk = q.k), and the output,
 * a sum of rotated values, is rotated back (H is its own inverse). Same here: rot_k and
 * rot_v are the chunk sizes, 0 for none; li_fwht applies H in n log n steps.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "vec16.h"

#define QK 32

static inline int q_block_bytes(int type) { return type == LI_Q8_0 ? 34 : 18; }

int64_t li_kv_row_bytes(int type, int64_t hd) {
    if (type == LI_F16) return 2 * hd;
    if ((type == LI_Q8_0 || type == LI_Q4_0) && hd % QK == 0) return hd / QK * q_block_bytes(type);
    return -1;
}

static inline float load_half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return li_fp16_to_fp32(h);
}

/* ggml's quantize_row_q4_0_ref: d = the value of largest magnitude / -8 */
void li_quantize_row_q4_0(const float *x, void *y, int64_t k) {
    uint8_t *out = (uint8_t *)y;
    for (int64_t b = 0; b < k / QK; b++, out += 18, x += QK) {
        float amax = 0.0f, max = 0.0f;
        for (int i = 0; i < QK; i++)
            if (fabsf(x[i]) > amax) amax = fabsf(x[i]), max = x[i];
        const float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        const uint16_t d16 = li_fp32_to_fp16(d);
        memcpy(out, &d16, 2);
        for (int i = 0; i < 16; i++) {
            const int8_t lo = (int8_t)(x[i] * id + 8.5f), hi = (int8_t)(x[i + 16] * id + 8.5f);
            out[2 + i] = (uint8_t)((lo < 15 ? lo : 15) | (hi < 15 ? hi : 15) << 4);
        }
    }
}

/* x = H x in place, for each chunk of n (a power of two) values of x[0..len) */
void li_fwht(float *x, int64_t len, int64_t n) {
    const float norm = 1.0f / sqrtf((float)n);
    for (int64_t c = 0; c < len; c += n) {
        float *v = x + c;
        for (int64_t h = 1; h < n; h *= 2)
            for (int64_t i = 0; i < n; i += 2 * h)
                for (int64_t j = i; j < i + h; j++) {
                    const float a = v[j], b = v[j + h];
                    v[j] = a + b;
                    v[j + h] = a - b;
                }
        for (int64_t j = 0; j < n; j++) v[j] *= norm;
    }
}

void li_kv_store(int type, const float *x, uint8_t *row, int64_t hd, int64_t rot) {
    float rotated[LI_KV_MAX_HD];
    if (rot) {
        memcpy(rotated, x, sizeof(float) * (size_t)hd);
        li_fwht(rotated, hd, rot);
        x = rotated;
    }
    if (type == LI_F16) {
        uint16_t *h = (uint16_t *)row;
        for (int64_t e = 0; e < hd; e++) h[e] = li_fp32_to_fp16(x[e]);
    } else if (type == LI_Q8_0) {
        li_quantize_row_q8_0(x, row, hd);
    } else {
        li_quantize_row_q4_0(x, row, hd);
    }
}

/* ---- a block of n cached positions, prepared once for all the queries of a tile -------- */

/* one q8_0 or q4_0 block's 32 values as int8: q, or the nibble minus 8 */
static inline void block_ints(int type, const uint8_t *blk, int8_t *q) {
    if (type == LI_Q8_0) {
        memcpy(q, blk + 2, QK);
        return;
    }
#if defined(__AVX2__)
    _mm256_storeu_si256((__m256i *)q, _mm256_sub_epi8(li_unpack_nibbles(blk + 2), _mm256_set1_epi8(8)));
#else
    for (int i = 0; i < 16; i++) {
        q[i] = (int8_t)((blk[2 + i] & 0x0F) - 8);
        q[i + 16] = (int8_t)((blk[2 + i] >> 4) - 8);
    }
#endif
}

/* The keys kept in rows, q4_0's (f16 and q8_0 ones are tiled), in the form li_kv_scores
 * reads: q8_0 blocks of the same integers (so the same dot products, without unpacking
 * nibbles for every query). buf: room for n rows of hd floats. */
const void *li_kv_block_keys(const uint8_t *rows, int64_t n, int64_t hd, float *buf, int64_t ahead) {
    uint8_t *out = (uint8_t *)buf;
    for (int64_t b = 0; b < n * hd / QK; b++, out += 34, rows += 18) {
        li_kv_prefetch(rows, ahead);
        memcpy(out, rows, 2);
        block_ints(LI_Q4_0, rows, (int8_t *)(out + 2));
    }
    return buf;
}

/* n q4_0 value rows as floats (hd each) in buf, d*q (f16 and q8_0 rows are read in place) */
void li_kv_block_values(const uint8_t *rows, int64_t n, int64_t hd, float *buf, int64_t ahead) {
    int8_t q[QK];
    for (int64_t b = 0; b < n * hd / QK; b++, rows += 18, buf += QK) {
        li_kv_prefetch(rows, ahead);
        const float d = load_half(rows);
        block_ints(LI_Q4_0, rows, q);
#if defined(__AVX2__)
        for (int i = 0; i < QK; i += 8) {
            const __m256i qi = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + i)));
            _mm256_storeu_ps(buf + i, _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(qi)));
        }
#else
        for (int i = 0; i < QK; i++) buf[i] = d * (float)q[i];
#endif
    }
}

/* ---- scores: s[j] = scale * (q . key_j), for one query head and a block's first n keys ---- */

#if defined(__AVX2__) && defined(__FMA__)
/* eight vectors to one: lane j the sum of a[j]'s lanes */
static inline __m256 hsum8x8(const __m256 *a) {
    const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3); /* lanes: keys 0-3 | 0-3, 4-7 | 4-7 */
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
/* key j's score as eight partial sums: d_k d_q dot per block, fused into acc block by block */
static inline __m256 key_sums_q8_0(const uint8_t *qq, const uint8_t *k, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *kblk = k + b * 34, *qblk = qq + b * 34;
        const __m256i kv = _mm256_loadu_si256((const __m256i *)(kblk + 2));
        const __m256 d = _mm256_set1_ps(load_half(kblk) * load_half(qblk));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(li_dot_i8_i8(kv, (const int8_t *)(qblk + 2))), acc);
    }
    return acc;
}
#endif

/* q4_0 keys as li_kv_block_keys unpacked them (q8_0 blocks) against the query as q8_0 blocks.
 * Eight keys' partial sums are reduced together (hsum8x8), each key's in its own register:
 * the same sum whichever keys are beside it. */
static void scores_q8_0(const uint8_t *qq, const uint8_t *keys, int64_t n, int64_t hd, float scale, float *s) {
    const int64_t nb = hd / QK;
    int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
    for (; j + 8 <= n; j += 8) {
        __m256 acc[8];
        for (int t = 0; t < 8; t++) acc[t] = key_sums_q8_0(qq, keys + (j + t) * nb * 34, nb);
        _mm256_storeu_ps(s + j, _mm256_mul_ps(hsum8x8(acc), _mm256_set1_ps(scale)));
    }
    for (; j < n; j++) {
        __m256 acc[8] = {key_sums_q8_0(qq, keys + j * nb * 34, nb)};
        for (int t = 1; t < 8; t++) acc[t] = _mm256_setzero_ps();
        s[j] = _mm256_cvtss_f32(_mm256_mul_ps(hsum8x8(acc), _mm256_set1_ps(scale)));
    }
#endif
    for (; j < n; j++) {
        const uint8_t *k = keys + j * nb * 34;
        float sum = 0.0f;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *kblk = k + b * 34, *qblk = qq + b * 34;
            int32_t dot = 0;
            for (int i = 0; i < QK; i++) dot += (int32_t)((const int8_t *)(kblk + 2))[i] * ((const int8_t *)(qblk + 2))[i];
            sum += load_half(kblk) * load_half(qblk) * (float)dot;
        }
        s[j] = sum * scale;
    }
}

/* query: one head as li_kv_query wrote it; keys: what li_kv_block_keys returned (the keys
 * kept in rows; tiled ones take li_kv_scores_tiles). Writes s[0..n). */
void li_kv_scores(const void *query, const void *keys, int64_t n, int64_t hd, float scale, float *s) {
    scores_q8_0((const uint8_t *)query, (const uint8_t *)keys, n, hd, scale, s);
}

/* ---- keys in tiles: scores of a row's g heads against up to two tiles at once ------------
 *
 * An f16 tile holds LI_KV_TILE positions of one kv head element by element: half t[e][lane].
 * A score is then sum_e q[e] * k[e], lane by lane, in e order: one vector FMA per element for
 * sixteen keys, no horizontal sums, and each tile row widened once for all g heads.
 *
 * q8_0 keys in tiles: per block of 32 values, the LI_KV_TILE scales, then the ints four
 * values of a position together: [8][LI_KV_TILE][4], as the packed Q8_0 panels hold them */
#define Q8_TILE_BLOCK (2 * LI_KV_TILE + QK * LI_KV_TILE)

/* Row x of one position into lane `lane` of its tile, in the cache's type (rotated first
 * where rot is not 0, as li_kv_store does). */
void li_kv_store_key_tile(int type, const float *x, uint8_t *tile, int64_t lane, int64_t hd, int64_t rot) {
    if (type == LI_F16) {
        uint16_t *h = (uint16_t *)tile;
        for (int64_t e = 0; e < hd; e++) h[e * LI_KV_TILE + lane] = li_fp32_to_fp16(x[e]);
        return;
    }
    uint8_t row[LI_KV_MAX_HD / QK * 34];
    li_kv_store(LI_Q8_0, x, row, hd, rot);
    for (int64_t b = 0; b < hd / QK; b++) {
        uint8_t *blk = tile + b * Q8_TILE_BLOCK;
        memcpy(blk + 2 * lane, row + b * 34, 2);
        for (int g = 0; g < QK / 4; g++) memcpy(blk + 2 * LI_KV_TILE + g * 4 * LI_KV_TILE + 4 * lane, row + b * 34 + 2 + 4 * g, 4);
    }
}

/* Bytes of one query head as li_kv_query writes it: floats against f16 keys; against
 * quantized ones its q8_0 blocks, then each block's sum of ints (int32, for the tiled
 * scores' unsigned-keys correction). */
int64_t li_kv_query_stride(int type, int64_t hd) { return type == LI_F16 ? 4 * hd : hd / QK * (34 + 4); }

#if defined(__AVX512F__)
/* one tile (a vector of sixteen) against heads [0, gh) of q (hd apart): s[h * ss + key]. Even
 * and odd elements go to separate sums, added at the end, so that one head alone still has two
 * chains of multiply-adds in flight. The order is the same whatever gh: a head's scores do not
 * depend on the heads (or the rows) scored beside it. */
static inline __attribute__((always_inline)) void tile_heads16(const float *q, const uint16_t *t, int64_t hd, float scale, float *s,
                                                               int64_t ss, const int gh, int64_t ahead) {
    __m512 acc[16];
    for (int i = 0; i < 2 * gh; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t e = 0; e < hd; e += 2) { /* hd is even */
        const __m512 k0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(t + e * LI_KV_TILE)));
        const __m512 k1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(t + (e + 1) * LI_KV_TILE)));
        li_kv_prefetch(t + e * LI_KV_TILE, ahead); /* a line holds two tile rows */
        for (int h = 0; h < gh; h++) {
            acc[2 * h] = _mm512_fmadd_ps(_mm512_set1_ps(q[h * hd + e]), k0, acc[2 * h]);
            acc[2 * h + 1] = _mm512_fmadd_ps(_mm512_set1_ps(q[h * hd + e + 1]), k1, acc[2 * h + 1]);
        }
    }
    for (int h = 0; h < gh; h++) _mm512_storeu_ps(s + h * ss, _mm512_mul_ps(_mm512_add_ps(acc[2 * h], acc[2 * h + 1]), _mm512_set1_ps(scale)));
}
#define TILE_GROUP 8
static void tile_heads(const float *q, const uint16_t *t, int64_t hd, float scale, float *s, int64_t ss, int gh, int nt, int64_t ahead) {
    for (int i = 0; i < nt; i++, t += hd * LI_KV_TILE, s += LI_KV_TILE) {
#define TILE_HEADS(G) \
    case G: tile_heads16(q, t, hd, scale, s, ss, G, ahead); break;
        switch (gh) { TILE_HEADS(1) TILE_HEADS(2) TILE_HEADS(3) TILE_HEADS(4) TILE_HEADS(5) TILE_HEADS(6) TILE_HEADS(7) TILE_HEADS(8) }
#undef TILE_HEADS
    }
}
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
/* one tile (two vectors of eight) against heads [0, gh) */
static inline __attribute__((always_inline)) void tile_heads8(const float *q, const uint16_t *t, int64_t hd, float scale, float *s,
                                                              int64_t ss, const int gh, int64_t ahead) {
    __m256 acc[12];
    for (int i = 0; i < 2 * gh; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t e = 0; e < hd; e++) {
        const __m256 k0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(t + e * LI_KV_TILE)));
        const __m256 k1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(t + e * LI_KV_TILE + 8)));
        if (e % 2 == 0) li_kv_prefetch(t + e * LI_KV_TILE, ahead); /* a line holds two tile rows */
        for (int h = 0; h < gh; h++) {
            const __m256 qv = _mm256_broadcast_ss(q + h * hd + e);
            acc[2 * h] = _mm256_fmadd_ps(qv, k0, acc[2 * h]);
            acc[2 * h + 1] = _mm256_fmadd_ps(qv, k1, acc[2 * h + 1]);
        }
    }
    for (int h = 0; h < gh; h++) {
        _mm256_storeu_ps(s + h * ss, _mm256_mul_ps(acc[2 * h], _mm256_set1_ps(scale)));
        _mm256_storeu_ps(s + h * ss + 8, _mm256_mul_ps(acc[2 * h + 1], _mm256_set1_ps(scale)));
    }
}
#define TILE_GROUP 6
static void tile_heads(const float *q, const uint16_t *t, int64_t hd, float scale, float *s, int64_t ss, int gh, int nt, int64_t ahead) {
    for (int i = 0; i < nt; i++, t += hd * LI_KV_TILE, s += LI_KV_TILE) {
#define TILE_HEADS(G) \
    case G: tile_heads8(q, t, hd, scale, s, ss, G, ahead); break;
        switch (gh) { TILE_HEADS(1) TILE_HEADS(2) TILE_HEADS(3) TILE_HEADS(4) TILE_HEADS(5) TILE_HEADS(6) }
#undef TILE_HEADS
    }
}
#else
#define TILE_GROUP 8
static void tile_heads(const float *q, const uint16_t *t, int64_t hd, float scale, float *s, int64_t ss, int gh, int nt, int64_t ahead) {
    (void)ahead;
    for (int h = 0; h < gh; h++)
        for (int64_t j = 0; j < nt * LI_KV_TILE; j++) {
            const uint16_t *tile = t + j / LI_KV_TILE * hd * LI_KV_TILE;
            float sum = 0.0f;
            for (int64_t e = 0; e < hd; e++) sum += q[h * hd + e] * li_fp16_to_fp32(tile[e * LI_KV_TILE + j % LI_KV_TILE]);
            s[h * ss + j] = sum * scale;
        }
}
#endif

#ifdef LP_R
/* heads [0, gh) of q (q8_0 query heads, qs bytes apart) against one q8_0 tile: per block, the
 * integer dots of sixteen keys at once (vpdpbusd on the keys as unsigned, q + 128, less 128
 * times the query block's sum; or the sign trick), then scaled by d_k d_q in block order. */
#ifdef LP_512
#define Q8_GROUP 8
#else
#define Q8_GROUP 3
#endif
LP_INLINE void q8_tile_heads(const uint8_t *q, int64_t qs, const uint8_t *tile, int64_t nb, float scale, float *s, int64_t ss,
                             const int gh, int64_t ahead) {
    vf acc[Q8_GROUP];
    for (int h = 0; h < gh; h++) acc[h] = vf_zero();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = tile + b * Q8_TILE_BLOCK, *ints = blk + 2 * LI_KV_TILE;
        li_kv_prefetch(blk, ahead);
        vi isum[Q8_GROUP];
        for (int h = 0; h < gh; h++) isum[h] = vi_set1(0);
        for (int g = 0; g < QK / 4; g++) {
            const vi w = vi_load(ints + g * 4 * LI_KV_TILE);
            li_kv_prefetch(ints + g * 4 * LI_KV_TILE, ahead);
#if LP_XOR_Q8
#ifdef LP_512
            const vi uw = _mm512_xor_si512(w, _mm512_set1_epi8((char)0x80));
#else
            const vi uw = (vi){_mm256_xor_si256(w.l, _mm256_set1_epi8((char)0x80)), _mm256_xor_si256(w.h, _mm256_set1_epi8((char)0x80))};
#endif
            for (int h = 0; h < gh; h++) isum[h] = vi_dpbusd(isum[h], uw, va_bcast((const int8_t *)(q + h * qs + b * 34 + 2 + 4 * g)));
#else
            const __m256i ul = _mm256_sign_epi8(w.l, w.l), uh = _mm256_sign_epi8(w.h, w.h), one = _mm256_set1_epi16(1);
            for (int h = 0; h < gh; h++) {
                const __m256i av = va_bcast((const int8_t *)(q + h * qs + b * 34 + 2 + 4 * g));
                isum[h].l = _mm256_add_epi32(isum[h].l, _mm256_madd_epi16(_mm256_maddubs_epi16(ul, _mm256_sign_epi8(av, w.l)), one));
                isum[h].h = _mm256_add_epi32(isum[h].h, _mm256_madd_epi16(_mm256_maddubs_epi16(uh, _mm256_sign_epi8(av, w.h)), one));
            }
#endif
        }
        const vf dk = vf_f16(blk);
        for (int h = 0; h < gh; h++) {
            const uint8_t *qh = q + h * qs;
#if LP_XOR_Q8
            int32_t sum;
            memcpy(&sum, qh + nb * 34 + 4 * b, 4);
            isum[h] = vi_sub(isum[h], vi_set1(128 * sum));
#endif
            acc[h] = vf_fmadd(vf_cvt(isum[h]), vf_mul(dk, vf_set1(load_half(qh + b * 34))), acc[h]);
        }
    }
    for (int h = 0; h < gh; h++) vf_store(s + h * ss, vf_mul(acc[h], vf_set1(scale)));
}

static void q8_tile(const uint8_t *q, int64_t qs, const uint8_t *tile, int64_t nb, float scale, float *s, int64_t ss, int gh, int64_t ahead) {
#define Q8_HEADS(G) \
    case G: q8_tile_heads(q, qs, tile, nb, scale, s, ss, G, ahead); break;
#ifdef LP_512
    switch (gh) { Q8_HEADS(1) Q8_HEADS(2) Q8_HEADS(3) Q8_HEADS(4) Q8_HEADS(5) Q8_HEADS(6) Q8_HEADS(7) Q8_HEADS(8) }
#else
    switch (gh) { Q8_HEADS(1) Q8_HEADS(2) Q8_HEADS(3) }
#endif
#undef Q8_HEADS
}
#else
#define Q8_GROUP 1
static void q8_tile(const uint8_t *q, int64_t qs, const uint8_t *tile, int64_t nb, float scale, float *s, int64_t ss, int gh, int64_t ahead) {
    (void)gh, (void)ahead;
    for (int64_t j = 0; j < LI_KV_TILE; j++) {
        float sum = 0.0f;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = tile + b * Q8_TILE_BLOCK;
            int32_t dot = 0;
            for (int i = 0; i < QK; i++) dot += (int32_t)(int8_t)blk[2 * LI_KV_TILE + i / 4 * 4 * LI_KV_TILE + 4 * j + i % 4] * (int8_t)q[b * 34 + 2 + i];
            sum += load_half(blk + 2 * j) * load_half(q + b * 34) * (float)dot;
        }
        s[j] = sum * scale;
    }
    (void)ss;
}
#endif

/* The g query heads of a row (as li_kv_query wrote them, qs bytes apart) against nt (1 or
 * 2) consecutive tiles of keys of `type` (f16 or q8_0): head h's scores at s[h * ss + key],
 * for nt * LI_KV_TILE keys; each line read asks for the one `ahead` bytes on (li_kv_prefetch). */
void li_kv_scores_tiles(int type, const uint8_t *q, int64_t qs, const uint8_t *tiles, int64_t nt, int64_t hd, int64_t g, float scale,
                        float *s, int64_t ss, int64_t ahead) {
    if (type == LI_F16) {
        for (int64_t h0 = 0; h0 < g; h0 += TILE_GROUP) {
            const int gh = g - h0 < TILE_GROUP ? (int)(g - h0) : TILE_GROUP;
            tile_heads((const float *)q + h0 * hd, (const uint16_t *)tiles, hd, scale, s + h0 * ss, ss, gh, (int)nt, ahead);
        }
        return;
    }
    const int64_t nb = hd / QK;
    for (int64_t t = 0; t < nt; t++)
        for (int64_t h0 = 0; h0 < g; h0 += Q8_GROUP) {
            const int gh = g - h0 < Q8_GROUP ? (int)(g - h0) : Q8_GROUP;
            q8_tile(q + h0 * qs, qs, tiles + t * LI_KV_TILE * nb * 34, nb, scale, s + h0 * ss + t * LI_KV_TILE, ss, gh, ahead);
        }
}

/* The g query heads (floats, g*hd) in the form li_kv_scores reads for keys of `type`:
 * f16-rounded floats, or q8_0 blocks (ggml's vec_dot_type of q8_0 and q4_0) of the heads
 * rotated as the keys were (rot). Needs g*hd*4 bytes at qbuf. */
void li_kv_query(int type, const float *q, int64_t g, int64_t hd, int64_t rot, void *qbuf) {
    if (type == LI_F16) {
        float *out = (float *)qbuf;
        for (int64_t e = 0; e < g * hd; e++) out[e] = li_fp16_to_fp32(li_fp32_to_fp16(q[e]));
        return;
    }
    float rotated[LI_KV_MAX_HD];
    for (int64_t h = 0; h < g; h++) {
        const float *qh = q + h * hd;
        if (rot) {
            memcpy(rotated, qh, sizeof(float) * (size_t)hd);
            li_fwht(rotated, hd, rot);
            qh = rotated;
        }
        uint8_t *out = (uint8_t *)qbuf + h * li_kv_query_stride(type, hd);
        li_quantize_row_q8_0(qh, out, hd);
        for (int64_t b = 0; b < hd / QK; b++) {
            int32_t sum = 0;
            for (int i = 0; i < QK; i++) sum += ((const int8_t *)(out + b * 34 + 2))[i];
            memcpy(out + hd / QK * 34 + 4 * b, &sum, 4);
        }
    }
}
