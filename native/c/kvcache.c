/* The KV cache's rows, in each type the cache can hold, and attention's two reads of them.
 *
 * A row is one position of one kv head: hd values.
 *   f16   hd IEEE halves (llama.cpp's default cache)
 *   q8_0  hd/32 blocks {fp16 d; int8 q[32]}, value d*q: ggml's block_q8_0
 *   q4_0  hd/32 blocks {fp16 d; uint8 nib[16]}, value d*(q-8), element i in the low
 *         nibble of byte i and element i+16 in the high one: ggml's block_q4_0
 * The quantizers are ggml's reference ones, so a row holds the bytes llama.cpp's cache holds.
 *
 * Scores against quantized keys are integer dot products, as ggml's vec_dot: each query
 * head is quantized once to q8_0 blocks, and a block's score is d_k*d_q*sum(k*q).
 * Values are accumulated from their blocks, d*q times the softmax weight.
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

/* ---- scores: scores[h * t + j] = scale * (q_h . key_j), for g heads and t keys ---------- */

/* f16 keys against queries already rounded to f16 (as llama.cpp's flash attention takes them) */
static void scores_f16(const float *qg, int64_t g, const uint16_t *keys, int64_t t, int64_t hd, float scale,
                       float *scores) {
#if defined(__AVX2__) && defined(__FMA__)
    if (hd == 64) { /* the common head size: a key row converted once, into 8 registers, for all g heads */
        for (int64_t j = 0; j < t; j++) {
            const __m128i *k = (const __m128i *)(keys + j * 64);
            __m256 kf[8];
            for (int e = 0; e < 8; e++) kf[e] = _mm256_cvtph_ps(_mm_loadu_si128(k + e));
            for (int64_t h = 0; h < g; h++) {
                const float *qh = qg + h * 64;
                __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
                for (int e = 0; e < 8; e += 2) { /* the same sums, in the same order, as the loop below */
                    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + 8 * e), kf[e], a0);
                    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + 8 * e + 8), kf[e + 1], a1);
                }
                scores[h * t + j] = li_hsum8(_mm256_add_ps(a0, a1)) * scale;
            }
        }
        return;
    }
    if (hd % 16 == 0) {
        for (int64_t j = 0; j < t; j++) {
            const uint16_t *k = keys + j * hd;
            for (int64_t h = 0; h < g; h++) {
                const float *qh = qg + h * hd;
                __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
                for (int64_t e = 0; e < hd; e += 16) {
                    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + e), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + e))), a0);
                    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + e + 8), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + e + 8))), a1);
                }
                scores[h * t + j] = li_hsum8(_mm256_add_ps(a0, a1)) * scale;
            }
        }
        return;
    }
#endif
    for (int64_t j = 0; j < t; j++)
        for (int64_t h = 0; h < g; h++) {
            float s = 0.0f;
            for (int64_t e = 0; e < hd; e++) s += qg[h * hd + e] * li_fp16_to_fp32(keys[j * hd + e]);
            scores[h * t + j] = s * scale;
        }
}

/* q8_0 or q4_0 keys against the g query heads as q8_0 rows (qq: g rows of hd/32 blocks) */
static void scores_quantized(int type, const uint8_t *qq, int64_t g, const uint8_t *keys, int64_t t, int64_t hd,
                             float scale, float *scores) {
    const int64_t nb = hd / QK, kb = q_block_bytes(type), rb = nb * kb, qb = nb * 34;
    for (int64_t j = 0; j < t; j++) {
        const uint8_t *k = keys + j * rb;
        for (int64_t h = 0; h < g; h++) {
            const uint8_t *q = qq + h * qb;
#if defined(__AVX2__) && defined(__FMA__)
            __m256 acc = _mm256_setzero_ps();
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *kblk = k + b * kb, *qblk = q + b * 34;
                const __m256i kv = type == LI_Q8_0 ? _mm256_loadu_si256((const __m256i *)(kblk + 2))
                                                   : _mm256_sub_epi8(li_unpack_nibbles(kblk + 2), _mm256_set1_epi8(8));
                const __m256 d = _mm256_set1_ps(load_half(kblk) * load_half(qblk));
                acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(li_dot_i8_i8(kv, (const int8_t *)(qblk + 2))), acc);
            }
            scores[h * t + j] = li_hsum8(acc) * scale;
#else
            float s = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *kblk = k + b * kb, *qblk = q + b * 34;
                const int8_t *qs = (const int8_t *)(qblk + 2);
                int32_t sum = 0;
                if (type == LI_Q8_0) {
                    for (int i = 0; i < QK; i++) sum += (int32_t)((const int8_t *)(kblk + 2))[i] * qs[i];
                } else {
                    for (int i = 0; i < 16; i++)
                        sum += ((kblk[2 + i] & 0x0F) - 8) * qs[i] + ((kblk[2 + i] >> 4) - 8) * qs[i + 16];
                }
                s += load_half(kblk) * load_half(qblk) * (float)sum;
            }
            scores[h * t + j] = s * scale;
#endif
        }
    }
}

/* qbuf: f16-rounded floats (f16 keys) or q8_0 blocks (quantized keys), as li_kv_query wrote */
void li_kv_scores(int type, const void *qbuf, int64_t g, const uint8_t *keys, int64_t t, int64_t hd, float scale,
                  float *scores) {
    if (type == LI_F16)
        scores_f16((const float *)qbuf, g, (const uint16_t *)keys, t, hd, scale, scores);
    else
        scores_quantized(type, (const uint8_t *)qbuf, g, keys, t, hd, scale, scores);
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

/* ---- values: out = sum_j p[j] * value_j, for one head ------------------------------------ */

static void weighted_f16(const float *p, const uint16_t *values, int64_t t, int64_t hd, float *out) {
#if defined(__AVX2__) && defined(__FMA__)
    if (hd == 64) { /* the common head size: the whole output row stays in 8 registers */
        __m256 o0 = _mm256_setzero_ps(), o1 = o0, o2 = o0, o3 = o0, o4 = o0, o5 = o0, o6 = o0, o7 = o0;
        for (int64_t j = 0; j < t; j++) {
            const __m128i *v = (const __m128i *)(values + j * 64);
            const __m256 w = _mm256_broadcast_ss(p + j);
            o0 = _mm256_fmadd_ps(w, _mm256_cvtph_ps(_mm_loadu_si128(v)), o0);
            o1 = _mm256_fmadd_ps(w, _mm256_cvtph_ps(_mm_loadu_si128(v + 1)), o1);
            o2 = _mm256_fmadd_ps(w, _mm256_cvtph_ps(_mm_loadu_si128(v + 2)), o2);
            o3 = _mm256_fmadd_ps(w, _mm256_cvtph_ps(_mm_loadu_si128(v + 3)), o3);
            o4 = _mm256_fmadd_ps(w, _mm256_cvtph_ps(_mm_loadu_si128(v + 4)), o4);
            o5 = _mm256_fmadd_ps(w, _mm256_cvtph_ps(_mm_loadu_si128(v + 5)), o5);
            o6 = _mm256_fmadd_ps(w, _mm256_cvtph_ps(_mm_loadu_si128(v + 6)), o6);
            o7 = _mm256_fmadd_ps(w, _mm256_cvtph_ps(_mm_loadu_si128(v + 7)), o7);
        }
        _mm256_storeu_ps(out, o0), _mm256_storeu_ps(out + 8, o1), _mm256_storeu_ps(out + 16, o2), _mm256_storeu_ps(out + 24, o3);
        _mm256_storeu_ps(out + 32, o4), _mm256_storeu_ps(out + 40, o5), _mm256_storeu_ps(out + 48, o6), _mm256_storeu_ps(out + 56, o7);
        return;
    }
#endif
    memset(out, 0, sizeof(float) * (size_t)hd);
    for (int64_t j = 0; j < t; j++)
        for (int64_t e = 0; e < hd; e++) out[e] += p[j] * li_fp16_to_fp32(values[j * hd + e]);
}

static void weighted_quantized(int type, const float *p, const uint8_t *values, int64_t t, int64_t hd, float *out) {
    const int64_t nb = hd / QK, kb = q_block_bytes(type), rb = nb * kb;
    memset(out, 0, sizeof(float) * (size_t)hd);
    for (int64_t j = 0; j < t; j++) {
        const uint8_t *row = values + j * rb;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = row + b * kb;
            const float w = p[j] * load_half(blk);
            float *o = out + b * QK;
#if defined(__AVX2__) && defined(__FMA__)
            const __m256i v = type == LI_Q8_0 ? _mm256_loadu_si256((const __m256i *)(blk + 2))
                                              : _mm256_sub_epi8(li_unpack_nibbles(blk + 2), _mm256_set1_epi8(8));
            const __m256 vw = _mm256_set1_ps(w);
            const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
            const __m256i parts[4] = {_mm256_cvtepi8_epi32(lo), _mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)),
                                      _mm256_cvtepi8_epi32(hi), _mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))};
            for (int i = 0; i < 4; i++)
                _mm256_storeu_ps(o + 8 * i, _mm256_fmadd_ps(vw, _mm256_cvtepi32_ps(parts[i]), _mm256_loadu_ps(o + 8 * i)));
#else
            if (type == LI_Q8_0) {
                for (int i = 0; i < QK; i++) o[i] += w * (float)((const int8_t *)(blk + 2))[i];
            } else {
                for (int i = 0; i < 16; i++) {
                    o[i] += w * (float)((blk[2 + i] & 0x0F) - 8);
                    o[i + 16] += w * (float)((blk[2 + i] >> 4) - 8);
                }
            }
#endif
        }
    }
}

void li_kv_weighted(int type, const float *p, const uint8_t *values, int64_t t, int64_t hd, float *out) {
    if (type == LI_F16)
        weighted_f16(p, (const uint16_t *)values, t, hd, out);
    else
        weighted_quantized(type, p, values, t, hd, out);
}
