/* The KV cache's rows, in each type the cache can hold, and attention's two reads of them.
 *
 * A row is one position of one kv head: hd values.
 *   f16   hd IEEE halves (llama.cpp's default cache)
 *   q8_0  hd/32 blocks {fp16 d; int8 q[32]}, value d*q: ggml's block_q8_0
 *   q4_0  hd/32 blocks {fp16 d; uint8 nib[16]}, value d*(q-8), element i in the low
 *         nibble of byte i and element i+16 in the high one: ggml's block_q4_0
 * The quantizers are ggml's reference ones, so a row holds the bytes llama.cpp's cache holds.
 *
 * Attention (ops.c) reads the cache a block of positions at a time, for a tile of queries:
 * li_kv_block_keys / li_kv_block_values put the block in the form every query of the tile
 * then reads. Scores against quantized keys are integer dot products, as ggml's vec_dot:
 * each query head is quantized once to q8_0 blocks, and a block's score is
 * d_k*d_q*sum(k*q). Values are widened to floats, d*q (exact in a float).
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

/* n halves to floats (exact) */
static void widen_f16(const uint16_t *h, int64_t n, float *out) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + i))));
#endif
#if defined(__F16C__) && defined(__AVX2__)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
#endif
    for (; i < n; i++) out[i] = li_fp16_to_fp32(h[i]);
}

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

/* Keys in the form li_kv_scores reads: q8_0 rows in place; q4_0 rows as q8_0 blocks of the
 * same integers (so the same dot products, without unpacking nibbles for every query); f16
 * rows widened to floats, then zero rows up to a multiple of LI_KV_LANES (the float scores
 * go that many keys at a time). buf: room for n rounded up to LI_KV_LANES rows of hd floats. */
const void *li_kv_block_keys(int type, const uint8_t *rows, int64_t n, int64_t hd, float *buf) {
    if (type == LI_Q8_0) return rows;
    if (type == LI_Q4_0) {
        uint8_t *out = (uint8_t *)buf;
        for (int64_t b = 0; b < n * hd / QK; b++, out += 34, rows += 18) {
            memcpy(out, rows, 2);
            block_ints(LI_Q4_0, rows, (int8_t *)(out + 2));
        }
        return buf;
    }
    widen_f16((const uint16_t *)rows, n * hd, buf);
    memset(buf + n * hd, 0, sizeof(float) * (size_t)((((n + LI_KV_LANES - 1) & ~(LI_KV_LANES - 1)) - n) * hd));
    return buf;
}

/* n value rows as floats (hd each) in buf: halves widened, blocks as d*q */
void li_kv_block_values(int type, const uint8_t *rows, int64_t n, int64_t hd, float *buf) {
    if (type == LI_F16) {
        widen_f16((const uint16_t *)rows, n * hd, buf);
        return;
    }
    const int64_t kb = q_block_bytes(type);
    int8_t q[QK];
    for (int64_t b = 0; b < n * hd / QK; b++, rows += kb, buf += QK) {
        const float d = load_half(rows);
        block_ints(type, rows, q);
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

#if defined(__AVX512F__)
/* four vectors to one: 128-bit lane L holds the sums of lane L's four floats of a[0..3] */
static inline __m512 hsum4x4_lanes(const __m512 *a) {
    const __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(a[0], a[1]), _mm512_unpackhi_ps(a[0], a[1]));
    const __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(a[2], a[3]), _mm512_unpackhi_ps(a[2], a[3]));
    return _mm512_add_ps(_mm512_shuffle_ps(t0, t1, _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_ps(t0, t1, _MM_SHUFFLE(3, 2, 3, 2)));
}

/* sixteen vectors to one: lane j the sum of a[j]'s lanes */
static inline __m512 hsum16x16(const __m512 *a) {
    const __m512 v0 = hsum4x4_lanes(a), v1 = hsum4x4_lanes(a + 4), v2 = hsum4x4_lanes(a + 8), v3 = hsum4x4_lanes(a + 12);
    const __m512 w0 = _mm512_add_ps(_mm512_shuffle_f32x4(v0, v1, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_f32x4(v0, v1, _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512 w1 = _mm512_add_ps(_mm512_shuffle_f32x4(v2, v3, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_f32x4(v2, v3, _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_f32x4(w0, w1, _MM_SHUFFLE(3, 1, 3, 1)));
}
#endif

/* Widened f16 keys (li_kv_block_keys) against q already rounded to f16, as llama.cpp's flash
 * attention takes it. LI_KV_LANES keys at a time, each in its own register over the head, so
 * a key's score is the same sum whichever keys beside it: writes s up to n rounded up to
 * LI_KV_LANES. */
static void scores_f32(const float *q, const float *keys, int64_t n, int64_t hd, float scale, float *s) {
#if defined(__AVX512F__)
    if (hd % 16 == 0) {
        for (int64_t j0 = 0; j0 < n; j0 += 16) {
            const float *k = keys + j0 * hd;
            __m512 acc[16];
            for (int j = 0; j < 16; j++) acc[j] = _mm512_setzero_ps();
            for (int64_t e = 0; e < hd; e += 16) {
                const __m512 qv = _mm512_loadu_ps(q + e);
                for (int j = 0; j < 16; j++) acc[j] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k + j * hd + e), acc[j]);
            }
            _mm512_storeu_ps(s + j0, _mm512_mul_ps(hsum16x16(acc), _mm512_set1_ps(scale)));
        }
        return;
    }
#endif
#if defined(__AVX2__) && defined(__FMA__)
    if (hd % 8 == 0) {
        for (int64_t j0 = 0; j0 < n; j0 += 8) {
            const float *k = keys + j0 * hd;
            __m256 acc[8];
            for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
            for (int64_t e = 0; e < hd; e += 8) {
                const __m256 qv = _mm256_loadu_ps(q + e);
                for (int j = 0; j < 8; j++) acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + j * hd + e), acc[j]);
            }
            _mm256_storeu_ps(s + j0, _mm256_mul_ps(hsum8x8(acc), _mm256_set1_ps(scale)));
        }
        return;
    }
#endif
    for (int64_t j = 0; j < n; j++) {
        float sum = 0.0f;
        for (int64_t e = 0; e < hd; e++) sum += q[e] * keys[j * hd + e];
        s[j] = sum * scale;
    }
}

/* q8_0 keys (q4_0 ones as li_kv_block_keys unpacked them) against the query as q8_0 blocks */
static void scores_q8_0(const uint8_t *qq, const uint8_t *keys, int64_t n, int64_t hd, float scale, float *s) {
    const int64_t nb = hd / QK;
    for (int64_t j = 0; j < n; j++) {
        const uint8_t *k = keys + j * nb * 34;
#if defined(__AVX2__) && defined(__FMA__)
        __m256 acc = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *kblk = k + b * 34, *qblk = qq + b * 34;
            const __m256i kv = _mm256_loadu_si256((const __m256i *)(kblk + 2));
            const __m256 d = _mm256_set1_ps(load_half(kblk) * load_half(qblk));
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(li_dot_i8_i8(kv, (const int8_t *)(qblk + 2))), acc);
        }
        s[j] = li_hsum8(acc) * scale;
#else
        float sum = 0.0f;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *kblk = k + b * 34, *qblk = qq + b * 34;
            int32_t dot = 0;
            for (int i = 0; i < QK; i++) dot += (int32_t)((const int8_t *)(kblk + 2))[i] * ((const int8_t *)(qblk + 2))[i];
            sum += load_half(kblk) * load_half(qblk) * (float)dot;
        }
        s[j] = sum * scale;
#endif
    }
}

/* query: one head as li_kv_query wrote it; keys: what li_kv_block_keys returned. Writes
 * s[0..n), and for f16 keys maybe up to n rounded up to 8 (s needs that room). */
void li_kv_scores(int type, const void *query, const void *keys, int64_t n, int64_t hd, float scale, float *s) {
    if (type == LI_F16)
        scores_f32((const float *)query, (const float *)keys, n, hd, scale, s);
    else
        scores_q8_0((const uint8_t *)query, (const uint8_t *)keys, n, hd, scale, s);
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
        li_quantize_row_q8_0(qh, (uint8_t *)qbuf + h * (hd / QK) * 34, hd);
    }
}
