/* localinfer native kernels: the contract between the C files.
 *
 * Weight rows are GGUF blocks read in place. Activations are quantized once per matmul
 * to the 8-bit block format the weight type pairs with (as ggml does): Q8_0 for
 * Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, Q8_K for Q4_K/Q5_K/Q6_K; F16/F32 use floats.
 * Each vec_dot computes one weight row (k values) against one quantized activation row.
 */
#ifndef LOCALINFER_KERNELS_H
#define LOCALINFER_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

/* ggml type ids, the same numbers GGUF stores */
enum {
    LI_F32 = 0, LI_F16 = 1, LI_Q4_0 = 2, LI_Q4_1 = 3, LI_Q5_0 = 6, LI_Q5_1 = 7,
    LI_Q8_0 = 8, LI_Q8_1 = 9, LI_Q2_K = 10, LI_Q3_K = 11, LI_Q4_K = 12, LI_Q5_K = 13, LI_Q6_K = 14, LI_Q8_K = 15,
    LI_IQ4_NL = 20, LI_IQ4_XS = 23, LI_BF16 = 30, LI_MXFP4 = 39,
};

/* ---- fp16 <-> fp32 ------------------------------------------------------------- */

static inline float li_fp16_to_fp32_soft(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F;
    uint32_t man = h & 0x3FF;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalize */
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 0x400));
            man &= 0x3FF;
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | (man << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7F800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* round to nearest even, as numpy's astype(float16) and F16C do */
static inline uint16_t li_fp32_to_fp16_soft(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7FFFFFFFu;
    if (ax >= 0x7F800000u) return (uint16_t)(sign | 0x7C00 | (ax > 0x7F800000u ? 0x200 : 0));
    if (ax >= 0x477FF000u) return (uint16_t)(sign | 0x7C00); /* rounds to >= 65520: inf */
    if (ax < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        if (ax < 0x33000000u) return (uint16_t)sign; /* < 2^-25: rounds to zero */
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7FFFFF) | 0x800000;
        uint32_t shift = 126 - e; /* 14 + (113 - e) */
        uint32_t half = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = ((ax >> 13) - (112u << 10));
    uint32_t rem = ax & 0x1FFF;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

static inline float li_fp16_to_fp32(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    return li_fp16_to_fp32_soft(h);
#endif
}

static inline uint16_t li_fp32_to_fp16(float f) {
#if defined(__F16C__)
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
    return li_fp32_to_fp16_soft(f);
#endif
}

/* MXFP4's scale (ggml's GGML_E8M0_TO_FP32_HALF): the E8M0 exponent byte e as 2^(e - 128),
 * half the block's scale because ggml stores the E2M1 values doubled (kvalues_mxfp4); e < 2
 * gives the float32 subnormals 2^-128 and 2^-127 */
static inline float li_e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

#if defined(__AVX2__)
/* the sum of a vector's eight floats */
static inline float li_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

/* ggml's roundf: half away from zero (|v| <= 128 here) */
static inline float li_round_away(float v) {
    float a = v < 0.0f ? -v : v;
    float t = (float)(int32_t)a;
    if (a - t >= 0.5f) t += 1.0f;
    return v < 0.0f ? -t : t;
}

#if defined(__AVX2__)
/* 16 bytes of nibbles -> 32 bytes 0..15: low nibbles (elements 0..15), then high (16..31) */
static inline __m256i li_unpack_nibbles(const uint8_t *p) {
    const __m128i t = _mm_loadu_si128((const __m128i *)p);
    const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

static inline __m256i li_madd1(__m256i v) { return _mm256_madd_epi16(v, _mm256_set1_epi16(1)); }

/* VNNI's vpdpbusd multiplies unsigned by signed bytes and adds each 4 products into an
 * int32 in one instruction, where AVX2 needs vpmaddubsw (to int16 pairs) and vpmaddwd.
 * AVX512-VNNI has it on 256-bit registers with AVX512VL; AVX-VNNI (Alder Lake, Zen 5) too.
 * The build's -march picks it (the compiler defines the macros below). */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define LI_VNNI 1
static inline __m256i li_dpbusd(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
#elif defined(__AVXVNNI__)
#define LI_VNNI 1
static inline __m256i li_dpbusd(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_avx_epi32(acc, u, s); }
#endif

/* unsigned bytes (<= 31) times signed bytes: 8 int32 partial sums */
static inline __m256i li_dot_u8_i8v(__m256i u, __m256i a) {
#ifdef LI_VNNI
    return li_dpbusd(_mm256_setzero_si256(), u, a);
#else
    return li_madd1(_mm256_maddubs_epi16(u, a));
#endif
}

/* signed times signed, by moving w's sign onto a (|w| <= 128 fits the unsigned side) */
static inline __m256i li_dot_i8_i8v(__m256i w, __m256i a) {
    return li_dot_u8_i8v(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
}

static inline __m256i li_dot_u8_i8(__m256i u, const int8_t *a) { return li_dot_u8_i8v(u, _mm256_loadu_si256((const __m256i *)a)); }
static inline __m256i li_dot_i8_i8(__m256i w, const int8_t *a) { return li_dot_i8_i8v(w, _mm256_loadu_si256((const __m256i *)a)); }

/* the sum of a vector's eight int32 */
static inline int32_t li_hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}
#endif

/* The legacy row dots reduce each octet of blocks (8o .. 8o+7) to one register of eight
 * block sums in the order [0 2 4 6 1 3 5 7]: block q of an octet sits in this lane. */
#define LI_OCTET_LANE(q) (((q) & 1) * 4 + ((q) >> 1))

#define LI_QK_K 256

/* Activation rows per tile of the n-row products (legacy.c, kquants.c): each weight block is
 * unpacked once per tile. AVX-512 has 32 vector registers, room for 8 rows' sums; AVX2's 16
 * hold 4. */
#if defined(__AVX512VL__) && defined(__FMA__) && defined(__F16C__)
#define LI_TILE 8
#else
#define LI_TILE 4
#endif

/* the rows of the tile that starts with `left` rows to go: whole tiles, then 4 or fewer */
static inline int64_t li_tile_rows(int64_t left) { return left >= LI_TILE ? LI_TILE : left > 4 ? 4 : left; }
#if LI_TILE == 8
#define LI_Q8K_ROWS_TILE8(DOTS, type, nb, w, ys, out) DOTS(type, 8, nb, w, ys, out)
#else
#define LI_Q8K_ROWS_TILE8(DOTS, type, nb, w, ys, out) ((void)0)
#endif

/* Rows [r0, r1) of a matrix whose dots take Q8_K activations (k/256 blocks a row) against n
 * activation rows, in tiles of li_tile_rows: DOTS(type, R, nb, weight row, ys, out) is an
 * always_inline dot of R rows (a constant in each case, so each tile size is specialised).
 * kquants.c and lowbit.c drive their dots with it. */
#define LI_Q8K_ROWS(DOTS, type, w, row_bytes, r0, r1, k, a, n, y, ldy)                   \
    do {                                                                              \
        const int64_t nb_ = (k) / LI_QK_K;                                            \
        float res_[LI_TILE];                                                          \
        const li_block_q8_K *ys_[LI_TILE];                                            \
        for (int64_t r_ = (r0); r_ < (r1); r_++) {                                    \
            const uint8_t *wr_ = (w) + r_ * (row_bytes);                              \
            li_prefetch_row(wr_, row_bytes);                                          \
            for (int64_t j_ = 0, R_; j_ < (n); j_ += R_) {                            \
                R_ = li_tile_rows((n) - j_);                                          \
                for (int64_t t_ = 0; t_ < R_; t_++) ys_[t_] = (a) + (j_ + t_) * nb_;  \
                switch (R_) {                                                         \
                case 1: DOTS(type, 1, nb_, wr_, ys_, res_); break;                    \
                case 2: DOTS(type, 2, nb_, wr_, ys_, res_); break;                    \
                case 3: DOTS(type, 3, nb_, wr_, ys_, res_); break;                    \
                case 4: DOTS(type, 4, nb_, wr_, ys_, res_); break;                    \
                default: LI_Q8K_ROWS_TILE8(DOTS, type, nb_, wr_, ys_, res_); break;   \
                }                                                                     \
                for (int64_t t_ = 0; t_ < R_; t_++) (y)[(j_ + t_) * (ldy) + r_] = res_[t_]; \
            }                                                                         \
        }                                                                             \
    } while (0)

/* Ask the cache for a weight row LI_PREFETCH bytes ahead of the one about to be read. The
 * hardware prefetcher alone left a matvec streaming from RAM at 15 GB/s where it can take 18
 * on two cores (the Numba set measured the same gap). A prefetch never faults, so reading
 * past the last row is harmless. Always inlined: where GCC 12 left it a call (in packed.c's
 * large kernels) it found the function free of side effects and dropped the calls, and the
 * Q4_K panels streamed from RAM at 20 GB/s a core instead of 38. */
#define LI_PREFETCH 2048
static inline __attribute__((always_inline)) void li_prefetch_row(const uint8_t *row, int64_t row_bytes) {
    for (int64_t o = 0; o < row_bytes; o += 64) __builtin_prefetch(row + LI_PREFETCH + o, 0, 3);
}

/* Q4_K/Q5_K: the 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes. */
static inline void li_scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Q4_0/Q4_1/Q5_0/Q5_1: a block's 32 unsigned values (0..15, or 0..31 with the fifth bits
 * qh; qh = 0 for the 4-bit types): qs[i] low nibble is value i, high nibble value i + 16. */
static inline void li_legacy_values(const uint8_t *qs, uint32_t qh, int8_t *q) {
    for (int i = 0; i < 16; i++) {
        q[i] = (int8_t)((qs[i] & 0x0F) | (((qh >> i) & 1) << 4));
        q[i + 16] = (int8_t)((qs[i] >> 4) | (((qh >> (i + 16)) & 1) << 4));
    }
}

#if defined(__AVX2__)
/* bytes of v chosen by spread (per 128-bit lane), then byte i of each 8 keeps bit i: 0x10 where set.
 * The masked byte is 0 or 1 << i; vpsignb turns it into 0 or 0x10 (0x80 is negative: its
 * byte of the constant is -0x10), one operation less than a compare and a mask. */
static inline __m256i li_bits_to_0x10(__m256i v, __m256i spread) {
    const __m256i sel = _mm256_set1_epi64x(0x8040201008040201LL);
    v = _mm256_and_si256(_mm256_shuffle_epi8(v, spread), sel);
    return _mm256_sign_epi8(_mm256_set1_epi64x((int64_t)0xF010101010101010ULL), v);
}

/* li_legacy_values in one register: the 32 values in natural order (five: add qh's fifth bits) */
static inline __m256i li_legacy_values_v(const uint8_t *qs, uint32_t qh, int five) {
    const __m256i v = li_unpack_nibbles(qs);
    if (!five) return v;
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    return _mm256_mask_add_epi8(v, (__mmask32)qh, v, _mm256_set1_epi8(0x10)); /* bit j: byte j += 0x10 */
#else
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    return _mm256_or_si256(v, li_bits_to_0x10(_mm256_set1_epi32((int)qh), spread));
#endif
}
#endif

/* the three layouts of li_quantize_q8a (legacy.c) */
enum { LI_Q8A_PAIRS = 0, LI_Q8A_PLAIN = 1, LI_Q8A_TILES = 2 };

/* Activations of the packed products of the 32-value types (packed.c): per row, ggml's
 * block_q8_0 values in natural order, each block's scale (fp16-rounded) and the integer sum
 * of its values (which folds the weights' offsets and mins into integer or float terms). */
typedef struct {
    const int8_t *qs; /* [n][k] */
    const float *d;   /* [n][k/32] */
    const int32_t *sum; /* [n][k/32] */
} li_q8s;
void li_quantize_q8s(const float *x, int64_t k, int8_t *qs, float *d, int32_t *sum, int64_t b0, int64_t b1);

/* Q8_K activation block: float scale, 256 int8, and 16 sums of 16 values each
 * (the K-quant dots need those sums for the mins). Layout as ggml's block_q8_K. */
typedef struct {
    float d;
    int8_t qs[LI_QK_K];
    int16_t bsums[LI_QK_K / 16];
} li_block_q8_K;

/* packed.c: matrices repacked into panels of 16 interleaved rows */
int64_t li_pack_bytes(int type, int64_t rows, int64_t k);
int li_pack(int type, const void *w, int64_t rows, int64_t k, void *out);
void li_q8k_pairs(const li_block_q8_K *a, int64_t blocks, int32_t *pairs);
void li_packed_rows_q8s(int type, const uint8_t *packed, int64_t p0, int64_t p1, int64_t k, const li_q8s *a, int64_t n,
                        float *y, int64_t ldy);
void li_packed_rows_q8k(int type, const uint8_t *packed, int64_t p0, int64_t p1, int64_t k, const li_block_q8_K *a,
                        const int32_t *pairs, int64_t n, float *y, int64_t ldy);
/* packed_more.c: the float and low-bit types' panels, for packed.c */
int li_pack_more_block(int type, int *values, int *bytes);
void li_pack_more(int type, uint8_t *dst, const uint8_t *src, int64_t row_bytes);
void li_pack_more_floats(int type, uint8_t *dst, const uint8_t *src, int64_t row_bytes, int64_t k);
void li_packed_rows_more_q8s(int type, const uint8_t *packed, int64_t p0, int64_t p1, int64_t k, const li_q8s *a,
                             int64_t n, float *y, int64_t ldy);
void li_packed_rows_more_q8k(int type, const uint8_t *packed, int64_t p0, int64_t p1, int64_t k,
                             const li_block_q8_K *a, int64_t n, float *y, int64_t ldy);
void li_packed_rows_float(int type, const uint8_t *packed, int64_t p0, int64_t p1, int64_t k, const float *x,
                          int64_t n, float *y, int64_t ldy);

/* kquants.c */
void li_quantize_row_q8_K(const float *x, void *y, int64_t k);
void li_vec_dot_q4_K_q8_K(int64_t k, float *s, const void *w, const void *y);
void li_vec_dot_q5_K_q8_K(int64_t k, float *s, const void *w, const void *y);
void li_vec_dot_q6_K_q8_K(int64_t k, float *s, const void *w, const void *y);

/* legacy.c */
void li_quantize_row_q8_0(const float *x, void *y, int64_t k);

/* matmul.c: an op binds 1-3 matrices sharing k (q/k/v, gate/up) once, in c_kernels.py, so
 * each call passes only the activation and output pointers (ctypes converts few arguments,
 * cheaply). The thread count is read through a pointer the kernel set owns, so set_threads
 * reaches ops that are already bound. */
#define LI_MAXMAT 3
typedef struct {
    int32_t nmat;
    int32_t types[LI_MAXMAT];
    const void *w[LI_MAXMAT];
    const void *packed[LI_MAXMAT]; /* li_pack's panels of w, or 0 */
    int64_t rows[LI_MAXMAT];
    int64_t k;
    const int32_t *nthreads;
} li_op;
int li_matmul_op(const li_op *op, const float *x, int n, float *y0, float *y1, float *y2, int n_fast);

/* matmul.c: products as works, so that moe.c runs many of them in one parallel region. A
 * work is li_work_size() opaque bytes; li_work_init sets it up (the bytes of activation
 * scratch and of each thread's AMX scratch it needs come back), li_work_carve places that
 * scratch, then every thread calls li_works_quantize, waits for the others, and takes
 * chunks of the dots with li_works_dots. li_run_works does all of it in one region. */
int64_t li_work_size(void);
int li_work_init(void *wk, int nmat, const int *types, const void *const *w, const void *const *packed,
                 const int64_t *rows, int64_t k, const float *x, int64_t n, float *const *y, int64_t n_fast,
                 int64_t *scratch, int64_t *amx);
void li_work_carve(void *wk, uint8_t *base, uint8_t *amx, int64_t amx_bytes);
void li_works_quantize(const void *works, int count, int t, int T);
void li_works_dots(const void *works, int count, int chunks_per_work, int *next, int thread);
void li_run_works(void *works, int count, int nthreads);

/* moe.c: a mixture of experts' FFN. Each stacked expert tensor is the file's
 * [n_expert][rows][k] blocks (expert e's rows at w + e * w_stride) with, where packed.c
 * packs it, its panels (expert e's at packed + e * packed_stride) and an optional float
 * bias [n_expert][rows]. The scratch grows to the largest call and is shared by the
 * layers of one model (one call at a time). */
enum { LI_ROUTE_SOFTMAX_NORM = 0, LI_ROUTE_TOPK_SOFTMAX = 1 };
typedef struct {
    int32_t type;
    const uint8_t *w, *packed;
    int64_t rows, k, w_stride, packed_stride;
    const float *bias;
} li_experts;
typedef struct {
    uint8_t *base;
    int64_t bytes;
} li_buffer;
typedef struct {
    li_buffer fixed, works;
} li_moe_scratch;
typedef struct {
    const li_op *router; /* [n_expert][k] */
    const float *router_bias;
    li_experts gate, up, down;
    int32_t n_expert, n_used, gating, activation;
    const int32_t *nthreads;
    li_moe_scratch *scratch;
} li_moe;
int li_moe_ffn(const li_moe *m, const float *x, int64_t n, float *out);
void li_moe_scratch_free(li_moe_scratch *s);

/* ops.c: a layer's small operations */
void li_rms_norm(const float *x, const float *w, float *out, int64_t n, int64_t d, float eps);
void li_rope(float *x, int64_t n, int64_t heads, int64_t head_dim, const int32_t *pos, const float *cos_t,
             const float *sin_t, int64_t dims, int neox);
void li_swiglu(float *gate, const float *up, int64_t n, int nthreads);
enum { LI_ACT_SWIGLU = 0, LI_ACT_GEGLU = 1, LI_ACT_SWIGLU_OAI = 2 };
void li_gated_serial(int act, float *gate, const float *up, int64_t n);
void li_geglu(float *gate, const float *up, int64_t n, int nthreads);
int li_attention(const float *q, const float *k_new, const float *v_new, uint8_t *keys, uint8_t *values, int type_k,
                 int type_v, int64_t rot_k, int64_t rot_v, const int32_t *pos, float *out, int64_t m, int64_t n_head,
                 int64_t n_head_kv, int64_t hd, int64_t n_ctx, float scale, int64_t window, const float *sinks,
                 int causal, int nthreads);

/* encoder.c: an encoder's LayerNorm (after a residual add) and GELU (after a bias) */
void li_layer_norm(const float *x, const float *w, const float *b, float *out, int64_t n, int64_t d, float eps, int nthreads);
void li_add_layer_norm(float *x, const float *y, const float *y_bias, const float *w, const float *b, int64_t n, int64_t d, float eps,
                       int nthreads);
void li_gelu(float *x, const float *bias, int64_t n, int64_t d, int nthreads);

/* kvcache.c: the KV cache's rows in f16, q8_0 or q4_0 (LI_F16, LI_Q8_0, LI_Q4_0) */
#define LI_KV_MAX_HD 512
/* attention's scores are masked and summed this many at a time (ops.c) */
#if defined(__AVX512F__)
#define LI_KV_LANES 16
#else
#define LI_KV_LANES 8
#endif
int64_t li_kv_row_bytes(int type, int64_t hd); /* -1: not a cache type, or hd not a multiple of 32 */
void li_fwht(float *x, int64_t len, int64_t n);
void li_kv_store(int type, const float *x, uint8_t *row, int64_t hd, int64_t rot);
void li_kv_query(int type, const float *q, int64_t g, int64_t hd, int64_t rot, void *qbuf);
/* Attention reads the cache a block of KEY_BLOCK positions at a time, one head's keys or values
 * a few KB: about a page, where the hardware prefetcher stops and must learn the stream again.
 * So each kernel that reads a block asks for the line `ahead` bytes past the one it reads (the
 * next block's, where ahead is a block's bytes; 0: none): deep in a context that took decode's
 * attention from 21 to 37 GB/s of the cache on Zen 5, 2 threads. */
static inline __attribute__((always_inline)) void li_kv_prefetch(const void *p, int64_t ahead) {
    if (ahead) __builtin_prefetch((const uint8_t *)p + ahead, 0, 3);
}
const void *li_kv_block_keys(const uint8_t *rows, int64_t n, int64_t hd, float *buf, int64_t ahead); /* q4_0 keys */
void li_kv_block_values(const uint8_t *rows, int64_t n, int64_t hd, float *buf, int64_t ahead); /* q4_0 values */
void li_kv_scores(const void *query, const void *keys, int64_t n, int64_t hd, float scale, float *s);
/* f16 and q8_0 keys are stored in tiles of LI_KV_TILE positions (the bytes of LI_KV_TILE
 * rows; kvcache.c has the layouts), so that scores are vector products over positions */
#define LI_KV_TILE 16
static inline int li_kv_tiled(int type) { return type == LI_F16 || type == LI_Q8_0; }
void li_kv_store_key_tile(int type, const float *x, uint8_t *tile, int64_t lane, int64_t hd, int64_t rot);
int64_t li_kv_query_stride(int type, int64_t hd);
void li_kv_scores_tiles(int type, const uint8_t *q, int64_t qs, const uint8_t *tiles, int64_t nt, int64_t hd, int64_t g, float scale,
                        float *s, int64_t ss, int64_t ahead);

#endif
