/* localinfer native kernels: the exported ABI, type dispatch and threading.
 *
 * li_matmul computes 1-3 weight matrices sharing k columns against n activation rows in
 * one call: each activation row is quantized once into every 8-bit format the matrices
 * need, then one parallel region splits the rows of all matrices between the threads
 * (fusing q/k/v or gate/up saves a region per matrix). The leading n_fast rows may go
 * through AMX tiles (amx.c) where the CPU has them and every matrix's type runs there;
 * they round differently from the row dots, which take the other rows. The library is
 * loaded with ctypes; nothing here includes Python.h.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#define LI_ABI_VERSION 8

/* ---- legacy.c --------------------------------------------------------------------- */
typedef struct {
    const int8_t *qs;
    const float *d;
    const float *s;
} li_q8a;

typedef void (*li_rows_q8a_fn)(const void *w, int64_t row_bytes, int64_t r0, int64_t r1, int64_t k, const li_q8a *a,
                               int64_t n, float *y, int64_t ldy);
typedef void (*li_rows_f_fn)(const void *w, int64_t row_bytes, int64_t r0, int64_t r1, int64_t k, const float *x,
                             int64_t n, float *y, int64_t ldy);
typedef void (*li_rows_k_fn)(const void *w, int64_t row_bytes, int64_t r0, int64_t r1, int64_t k,
                             const li_block_q8_K *a, int64_t n, float *y, int64_t ldy);

void li_quantize_q8a(const float *x, int64_t k, int8_t *qs, float *d, float *s, int64_t b0, int64_t b1, int layout);
int64_t li_q8a_scale_stride(int64_t k);
void li_rows_q4_0(const void *, int64_t, int64_t, int64_t, int64_t, const li_q8a *, int64_t, float *, int64_t);
void li_rows_q4_1(const void *, int64_t, int64_t, int64_t, int64_t, const li_q8a *, int64_t, float *, int64_t);
void li_rows_q5_0(const void *, int64_t, int64_t, int64_t, int64_t, const li_q8a *, int64_t, float *, int64_t);
void li_rows_q5_1(const void *, int64_t, int64_t, int64_t, int64_t, const li_q8a *, int64_t, float *, int64_t);
void li_rows_q8_0(const void *, int64_t, int64_t, int64_t, int64_t, const li_q8a *, int64_t, float *, int64_t);
void li_rows_f16(const void *, int64_t, int64_t, int64_t, int64_t, const float *, int64_t, float *, int64_t);
void li_rows_f32(const void *, int64_t, int64_t, int64_t, int64_t, const float *, int64_t, float *, int64_t);
void li_rows_q4_K(const void *, int64_t, int64_t, int64_t, int64_t, const li_block_q8_K *, int64_t, float *, int64_t);
void li_rows_q5_K(const void *, int64_t, int64_t, int64_t, int64_t, const li_block_q8_K *, int64_t, float *, int64_t);
void li_rows_q6_K(const void *, int64_t, int64_t, int64_t, int64_t, const li_block_q8_K *, int64_t, float *, int64_t);

/* ---- lowbit.c ----------------------------------------------------------------------- */
void li_rows_q2_K(const void *, int64_t, int64_t, int64_t, int64_t, const li_block_q8_K *, int64_t, float *, int64_t);
void li_rows_q3_K(const void *, int64_t, int64_t, int64_t, int64_t, const li_block_q8_K *, int64_t, float *, int64_t);
void li_rows_iq4_xs(const void *, int64_t, int64_t, int64_t, int64_t, const li_block_q8_K *, int64_t, float *, int64_t);
void li_rows_iq4_nl(const void *, int64_t, int64_t, int64_t, int64_t, const li_q8a *, int64_t, float *, int64_t);
void li_rows_mxfp4(const void *, int64_t, int64_t, int64_t, int64_t, const li_q8a *, int64_t, float *, int64_t);
void li_rows_bf16(const void *, int64_t, int64_t, int64_t, int64_t, const float *, int64_t, float *, int64_t);

/* ---- amx.c --------------------------------------------------------------------------- */
int li_amx_usable(void);
int li_amx_runs(int type);
int64_t li_amx_scratch_bytes(int64_t k);
void li_amx_rows(int type, const uint8_t *w, int64_t row_bytes, int64_t r0, int64_t r1, int64_t k, const int8_t *qs,
                 const float *ad, const float *as, int64_t n, float *y, int64_t ldy, void *scratch);
int li_amx_exact_runs(int type);
int64_t li_amx_exact_scratch_bytes(int64_t k);
void li_amx_rows_exact(int type, const uint8_t *w, int64_t row_bytes, int64_t r0, int64_t r1, int64_t k,
                       const int8_t *qs, const float *tad, const float *tas, int64_t n, float *y, int64_t ldy,
                       void *scratch);

/* ---- exported info ---------------------------------------------------------------- */

int li_abi_version(void) { return LI_ABI_VERSION; }

const char *li_build_info(void) {
    return ""
#if defined(__AVX512F__)
           "avx512f "
#endif
#if defined(__AVX512VNNI__)
           "avx512vnni "
#endif
#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512F__) && defined(__AVX512BW__) && \
    defined(__AVX512VL__) && defined(__linux__)
           "amx "
#endif
#if defined(__AVXVNNI__)
           "avxvnni "
#endif
#if defined(__AVX2__)
           "avx2 "
#endif
#if defined(__FMA__)
           "fma "
#endif
#if defined(__F16C__)
           "f16c "
#endif
#if defined(__ARM_NEON)
           "neon "
#endif
#if !defined(__AVX2__)
           "scalar "
#endif
#ifdef _OPENMP
           "openmp"
#else
           "serial"
#endif
        ;
}

int li_max_threads(void) {
#ifdef _OPENMP
    return omp_get_num_procs();
#else
    return 1;
#endif
}

/* setuptools' build_ext insists on exporting this symbol on some platforms; the
 * library is never imported as a Python module. */
void *PyInit__ckernels(void) { return 0; }

/* ---- types ----------------------------------------------------------------------- */

enum { FMT_FLOAT = 0, FMT_Q8A = 1, FMT_Q8K = 2 };

typedef struct {
    int block;     /* values per block */
    int bytes;     /* bytes per block */
    int fmt;       /* activation format */
    int cost;      /* relative work per block, for splitting rows between threads */
    li_rows_q8a_fn rows_q8a;
    li_rows_f_fn rows_f;
    li_rows_k_fn rows_k;
} li_type;

static int type_info(int t, li_type *ti) {
    memset(ti, 0, sizeof *ti);
    switch (t) {
    case LI_F32: *ti = (li_type){1, 4, FMT_FLOAT, 4, 0, li_rows_f32, 0}; return 0;
    case LI_F16: *ti = (li_type){1, 2, FMT_FLOAT, 2, 0, li_rows_f16, 0}; return 0;
    case LI_Q4_0: *ti = (li_type){32, 18, FMT_Q8A, 24, li_rows_q4_0, 0, 0}; return 0;
    case LI_Q4_1: *ti = (li_type){32, 20, FMT_Q8A, 26, li_rows_q4_1, 0, 0}; return 0;
    case LI_Q5_0: *ti = (li_type){32, 22, FMT_Q8A, 32, li_rows_q5_0, 0, 0}; return 0;
    case LI_Q5_1: *ti = (li_type){32, 24, FMT_Q8A, 34, li_rows_q5_1, 0, 0}; return 0;
    case LI_Q8_0: *ti = (li_type){32, 34, FMT_Q8A, 36, li_rows_q8_0, 0, 0}; return 0;
    case LI_Q4_K: *ti = (li_type){256, 144, FMT_Q8K, 180, 0, 0, li_rows_q4_K}; return 0;
    case LI_Q5_K: *ti = (li_type){256, 176, FMT_Q8K, 220, 0, 0, li_rows_q5_K}; return 0;
    case LI_Q6_K: *ti = (li_type){256, 210, FMT_Q8K, 250, 0, 0, li_rows_q6_K}; return 0;
    case LI_Q2_K: *ti = (li_type){256, 84, FMT_Q8K, 130, 0, 0, li_rows_q2_K}; return 0;
    case LI_Q3_K: *ti = (li_type){256, 110, FMT_Q8K, 190, 0, 0, li_rows_q3_K}; return 0;
    case LI_IQ4_XS: *ti = (li_type){256, 136, FMT_Q8K, 200, 0, 0, li_rows_iq4_xs}; return 0;
    case LI_IQ4_NL: *ti = (li_type){32, 18, FMT_Q8A, 30, li_rows_iq4_nl, 0, 0}; return 0;
    case LI_MXFP4: *ti = (li_type){32, 17, FMT_Q8A, 30, li_rows_mxfp4, 0, 0}; return 0;
    case LI_BF16: *ti = (li_type){1, 2, FMT_FLOAT, 2, 0, li_rows_bf16, 0}; return 0;
    default: return -1;
    }
}

/* ---- one call's work ----------------------------------------------------------------- */

typedef struct {
    int nmat;
    int type[LI_MAXMAT];
    li_type ti[LI_MAXMAT];
    const uint8_t *w[LI_MAXMAT];
    int64_t rows[LI_MAXMAT];
    int64_t row_bytes[LI_MAXMAT];
    int64_t row_cost[LI_MAXMAT];
    int64_t total_cost, total_bytes;
    int64_t k, n;
    const float *x;
    float *const *y;
    int need_q8a, need_q8k;
    int exact;          /* every row through amx.c's exact path (legacy types: the row dots' results) */
    int64_t n_fast;     /* else rows [0, n_fast) go through amx.c, rows [n_fast, n) through the row dots */
    li_q8a tiles;       /* the exact path's activations, in AMX tiles of 16 rows */
    li_q8a a;           /* q8a activations of the row dots, rows [n_fast, n) */
    li_block_q8_K *a8k; /* q8_K activations of the row dots, rows [n_fast, n), k/256 blocks each */
    li_q8a fast;        /* plain q8a activations of rows [0, n_fast), room for whole 16-row tiles */
    const uint8_t *packed[LI_MAXMAT]; /* packed.c's panels of the first packed_rows[i] rows, or 0 */
    int64_t packed_rows[LI_MAXMAT];
    int need_q8s, need_pairs;
    li_q8s s8;          /* packed legacy products' activations, rows [n_fast, n) */
    int32_t *pairs;     /* packed Q4_K/Q5_K products' activation sums, 4 per q8_K block */
    uint8_t *amx_scratch; /* li_amx_scratch_bytes(k) per thread */
    int64_t amx_scratch_bytes;
    int64_t q8a_bytes, q8k_bytes, fast_bytes, s8_bytes; /* the scratch's parts, in carving order */
} li_work;

/* first row (matrix *mi, row *ri) whose start cost is >= the boundary of part t of T;
 * rows are aligned to 16 inside a matrix so threads never share an output cache line */
static void split_point(const li_work *wk, int t, int T, int *mi, int64_t *ri) {
    if (t <= 0) { *mi = 0; *ri = 0; return; }
    if (t >= T) { *mi = wk->nmat; *ri = 0; return; }
    int64_t b = (int64_t)((double)wk->total_cost * t / T);
    for (int i = 0; i < wk->nmat; i++) {
        const int64_t c = wk->rows[i] * wk->row_cost[i];
        if (b < c) {
            int64_t r = (b + wk->row_cost[i] - 1) / wk->row_cost[i];
            r = (r + 15) & ~(int64_t)15;
            if (r >= wk->rows[i]) { *mi = i + 1; *ri = 0; } else { *mi = i; *ri = r; }
            return;
        }
        b -= c;
    }
    *mi = wk->nmat;
    *ri = 0;
}

static void run_rows(const li_work *wk, int i, int64_t r0, int64_t r1, int thread) {
    if (r1 <= r0) return;
    const li_type *ti = &wk->ti[i];
    const int64_t ldy = wk->rows[i], n = wk->n - wk->n_fast;
    if (wk->exact) {
        li_amx_rows_exact(wk->type[i], wk->w[i], wk->row_bytes[i], r0, r1, wk->k, wk->tiles.qs, wk->tiles.d,
                          wk->tiles.s, wk->n, wk->y[i], ldy, wk->amx_scratch + thread * wk->amx_scratch_bytes);
        return;
    }
    if (wk->n_fast)
        li_amx_rows(wk->type[i], wk->w[i], wk->row_bytes[i], r0, r1, wk->k, wk->fast.qs, wk->fast.d, wk->fast.s,
                    wk->n_fast, wk->y[i], ldy, wk->amx_scratch + thread * wk->amx_scratch_bytes);
    if (n == 0) return;
    float *y = wk->y[i] + wk->n_fast * ldy;
    if (wk->packed[i] && r0 < wk->packed_rows[i]) { /* split points are multiples of 16 */
        const int64_t p1 = (r1 < wk->packed_rows[i] ? r1 : wk->packed_rows[i]) / 16;
        if (ti->fmt == FMT_FLOAT)
            li_packed_rows_float(wk->type[i], wk->packed[i], r0 / 16, p1, wk->k, wk->x + wk->n_fast * wk->k, n, y, ldy);
        else if (ti->fmt == FMT_Q8A) li_packed_rows_q8s(wk->type[i], wk->packed[i], r0 / 16, p1, wk->k, &wk->s8, n, y, ldy);
        else li_packed_rows_q8k(wk->type[i], wk->packed[i], r0 / 16, p1, wk->k, wk->a8k, wk->pairs, n, y, ldy);
        r0 = p1 * 16;
        if (r0 >= r1) return;
    }
    switch (ti->fmt) {
    case FMT_FLOAT: ti->rows_f(wk->w[i], wk->row_bytes[i], r0, r1, wk->k, wk->x + wk->n_fast * wk->k, n, y, ldy); break;
    case FMT_Q8A: ti->rows_q8a(wk->w[i], wk->row_bytes[i], r0, r1, wk->k, &wk->a, n, y, ldy); break;
    default: ti->rows_k(wk->w[i], wk->row_bytes[i], r0, r1, wk->k, wk->a8k, n, y, ldy); break;
    }
}

/* part t of T of the dots, on thread `thread` */
static void run_part(const li_work *wk, int t, int T, int thread) {
    int m0, m1;
    int64_t r0, r1;
    split_point(wk, t, T, &m0, &r0);
    split_point(wk, t + 1, T, &m1, &r1);
    for (int i = m0; i <= m1 && i < wk->nmat; i++) {
        const int64_t a = i == m0 ? r0 : 0;
        const int64_t b = i == m1 ? r1 : wk->rows[i];
        run_rows(wk, i, a, b, thread);
    }
}

/* part t of T of the activation quantization, split by blocks over the rows */
static void quantize_part(const li_work *wk, int t, int T) {
    const int64_t n = wk->n - wk->n_fast;
    const float *x = wk->x + wk->n_fast * wk->k;
    if (wk->exact) {
        const int64_t total = wk->k / 32 * wk->n;
        li_quantize_q8a(wk->x, wk->k, (int8_t *)wk->tiles.qs, (float *)wk->tiles.d, (float *)wk->tiles.s,
                        total * t / T, total * (t + 1) / T, LI_Q8A_TILES);
    }
    if (wk->n_fast) {
        const int64_t total = wk->k / 32 * wk->n_fast;
        li_quantize_q8a(wk->x, wk->k, (int8_t *)wk->fast.qs, (float *)wk->fast.d, (float *)wk->fast.s, total * t / T,
                        total * (t + 1) / T, LI_Q8A_PLAIN);
    }
    if (wk->need_q8a) {
        const int64_t total = wk->k / 32 * n;
        li_quantize_q8a(x, wk->k, (int8_t *)wk->a.qs, (float *)wk->a.d, (float *)wk->a.s, total * t / T,
                        total * (t + 1) / T, LI_Q8A_PAIRS);
    }
    if (wk->need_q8s) {
        const int64_t total = wk->k / 32 * n;
        li_quantize_q8s(x, wk->k, (int8_t *)wk->s8.qs, (float *)wk->s8.d, (int32_t *)wk->s8.sum, total * t / T,
                        total * (t + 1) / T);
    }
    if (wk->need_q8k) {
        const int64_t total = wk->k / LI_QK_K * n;
        const int64_t b0 = total * t / T, b1 = total * (t + 1) / T;
        if (b1 > b0) li_quantize_row_q8_K(x + b0 * LI_QK_K, wk->a8k + b0, (b1 - b0) * LI_QK_K);
        if (b1 > b0 && wk->need_pairs) li_q8k_pairs(wk->a8k + b0, b1 - b0, wk->pairs + 4 * b0);
    }
}

/* A product whose matrices are all legacy types goes through AMX, where the CPU has it,
 * from this many rows up (with the row dots' results, so every row may). Below, the row
 * dots are as fast or faster: each AMX block product is stored and scaled by vector code,
 * a fixed cost per weight block that the activation rows of a tile share. Longer rows
 * need more: their tile products outgrow the L1 cache (measured on Sapphire Rapids, 2
 * cores: 576 columns break even at 8 rows, 1536 at 32). */
static int64_t amx_exact_min_rows(int64_t k) { return k <= 768 ? 16 : 32; }

/* below this much weight data a second thread costs more than it saves */
#define LI_PARALLEL_MIN_BYTES (32 * 1024)
/* each thread's share of the rows, in this many chunks */
#define LI_CHUNKS_PER_THREAD 4
/* activation scratch up to this size lives on the stack */
#define LI_STACK_SCRATCH (48 * 1024)

/* q8a activations of `rows` rows, each part 64-byte aligned: qs (k bytes a row), then d
 * and s (k/32 floats a row each) */
static int64_t q8a_qs_bytes(int64_t rows, int64_t k) { return (rows * k + 63) & ~63; }
static int64_t q8a_ds_bytes(int64_t rows, int64_t k) { return (rows * li_q8a_scale_stride(k) * 4 + 63) & ~63; }
static int64_t q8a_bytes(int64_t rows, int64_t k) { return q8a_qs_bytes(rows, k) + 2 * q8a_ds_bytes(rows, k); }

static void carve_q8a(uint8_t *base, li_q8a *a, int64_t rows, int64_t k) {
    const int64_t qs = q8a_qs_bytes(rows, k), ds = q8a_ds_bytes(rows, k);
    a->qs = (const int8_t *)base;
    a->d = (const float *)(base + qs);
    a->s = (const float *)(base + qs + ds);
}

/* Sets up one product's work: wk describes y[i] = x . w[i]^T for nmat matrices of
 * rows[i] x k over n rows of x. *scratch gets the bytes of activation scratch it needs and
 * *amx the AMX scratch of each thread; carve_work then places both. Returns 0 or an error. */
static int init_work(li_work *wk, int nmat, const int *types, const void *const *w, const void *const *packed,
                     const int64_t *rows, int64_t k, const float *x, int64_t n, float *const *y, int64_t n_fast,
                     int64_t *scratch, int64_t *amx) {
    if (nmat < 1 || nmat > LI_MAXMAT || k <= 0 || n < 0 || !types || !w || !rows || !x || !y) return 3;
    memset(wk, 0, sizeof *wk);
    wk->nmat = nmat;
    wk->k = k;
    wk->n = n;
    wk->x = x;
    wk->y = y;
    int all_amx = 1, all_exact = 1;
    for (int i = 0; i < nmat; i++) {
        if (type_info(types[i], &wk->ti[i])) return 1;
        if (k % wk->ti[i].block) return 2;
        if (rows[i] < 0 || !w[i] || !y[i]) return 3;
        wk->type[i] = types[i];
        wk->w[i] = (const uint8_t *)w[i];
        wk->rows[i] = rows[i];
        wk->row_bytes[i] = k / wk->ti[i].block * wk->ti[i].bytes;
        wk->row_cost[i] = k / wk->ti[i].block * wk->ti[i].cost;
        wk->total_cost += rows[i] * wk->row_cost[i];
        wk->total_bytes += rows[i] * wk->row_bytes[i];
        all_amx &= li_amx_runs(types[i]);
        all_exact &= li_amx_exact_runs(types[i]);
    }
    /* legacy types alone take the exact path or the row dots, never the fast path */
    wk->exact = all_exact && n >= amx_exact_min_rows(k) && li_amx_usable();
    wk->n_fast = !all_exact && n_fast > 0 && all_amx && li_amx_usable() ? (n_fast < n ? n_fast : n) : 0;
    for (int i = 0; i < nmat; i++) {
        const int dots = wk->n_fast < n && !wk->exact;
        if (dots && packed && packed[i] && li_pack_bytes(types[i], rows[i], k)) {
            wk->packed[i] = (const uint8_t *)packed[i];
            wk->packed_rows[i] = rows[i] & ~(int64_t)15;
        }
        const int tail = wk->packed_rows[i] < rows[i]; /* rows the row dots still take */
        wk->need_q8a |= wk->ti[i].fmt == FMT_Q8A && dots && tail;
        wk->need_q8s |= wk->ti[i].fmt == FMT_Q8A && dots && wk->packed[i];
        wk->need_q8k |= wk->ti[i].fmt == FMT_Q8K && dots;
        wk->need_pairs |= (types[i] == LI_Q4_K || types[i] == LI_Q5_K) && dots && wk->packed[i];
    }
    /* scratch, each part 64-byte aligned: q8a of the row dots | q8_K | plain q8a of the
     * fast rows, or the exact path's tiles (whole 16-row tiles) | q8s | pairs */
    const int64_t n_dots = n - wk->n_fast, fast_rows = ((wk->exact ? n : wk->n_fast) + 15) & ~(int64_t)15;
    wk->q8a_bytes = wk->need_q8a ? q8a_bytes(n_dots, k) : 0;
    wk->q8k_bytes = wk->need_q8k ? ((int64_t)(n_dots * (k / LI_QK_K) * sizeof(li_block_q8_K)) + 63) & ~63 : 0;
    wk->fast_bytes = wk->n_fast || wk->exact ? q8a_bytes(fast_rows, k) : 0;
    wk->s8_bytes = wk->need_q8s ? q8a_bytes(n_dots, k) : 0; /* qs, then d and sum as q8a has d and s */
    const int64_t pairs = wk->need_pairs ? (n_dots * (k / LI_QK_K) * 16 + 63) & ~63 : 0;
    *scratch = wk->q8a_bytes + wk->q8k_bytes + wk->fast_bytes + wk->s8_bytes + pairs;
    *amx = wk->exact    ? (li_amx_exact_scratch_bytes(k) + 63) & ~63
           : wk->n_fast ? (li_amx_scratch_bytes(k) + 63) & ~63
                        : 0;
    return 0;
}

/* Places a work's scratch at `base` (64-byte aligned, the bytes init_work asked for) and
 * its threads' AMX scratch at `amx` (amx_bytes each). */
static void carve_work(li_work *wk, uint8_t *base, uint8_t *amx, int64_t amx_bytes) {
    const int64_t k = wk->k, n = wk->n, n_dots = n - wk->n_fast;
    const int64_t fast_rows = ((wk->exact ? n : wk->n_fast) + 15) & ~(int64_t)15;
    uint8_t *fast = base + wk->q8a_bytes + wk->q8k_bytes, *s8 = fast + wk->fast_bytes;
    carve_q8a(base, &wk->a, n_dots, k);
    wk->a8k = (li_block_q8_K *)(base + wk->q8a_bytes);
    if (wk->n_fast) {
        carve_q8a(fast, &wk->fast, fast_rows, k);
        memset((int8_t *)wk->fast.qs + wk->n_fast * k, 0, (size_t)((fast_rows - wk->n_fast) * k));
    }
    if (wk->exact) {
        carve_q8a(fast, &wk->tiles, fast_rows, k);
        if (n < fast_rows) { /* the last tile's missing rows: zero values and scales */
            const int64_t nb = k / 32;
            memset((int8_t *)wk->tiles.qs + (fast_rows - 16) * k, 0, (size_t)(16 * k));
            memset((float *)wk->tiles.d + (fast_rows - 16) * nb, 0, (size_t)(16 * nb * 4));
            memset((float *)wk->tiles.s + (fast_rows - 16) * nb, 0, (size_t)(16 * nb * 4));
        }
    }
    if (wk->need_q8s) { /* li_q8a's carving fits: int32 sums where q8a has float s */
        li_q8a t;
        carve_q8a(s8, &t, n_dots, k);
        wk->s8 = (li_q8s){t.qs, t.d, (const int32_t *)t.s};
    }
    wk->pairs = (int32_t *)(s8 + wk->s8_bytes);
    wk->amx_scratch = amx;
    wk->amx_scratch_bytes = amx_bytes;
}

/* y[i] = x . w[i]^T for nmat matrices of rows[i] x k. Rows [0, n_fast) of x may go
 * through AMX (see amx.c for what that changes); pass 0 for the row dots alone. */
int li_matmul(int nmat, const int *types, const void *const *w, const void *const *packed, const int64_t *rows,
              int64_t k, const float *x, int64_t n, float *const *y, int nthreads, int64_t n_fast) {
    li_work wk;
    int64_t scratch, amx;
    const int rc = init_work(&wk, nmat, types, w, packed, rows, k, x, n, y, n_fast, &scratch, &amx);
    if (rc || n == 0) return rc;
    if (nthreads < 1) nthreads = 1;
    if (wk.total_bytes * n < LI_PARALLEL_MIN_BYTES) nthreads = 1;
    const size_t need = (size_t)(scratch + nthreads * amx) + 64;
    _Alignas(64) uint8_t stack[LI_STACK_SCRATCH];
    void *heap = 0;
    uint8_t *base = stack;
    if (need > LI_STACK_SCRATCH) {
        heap = malloc(need);
        if (!heap) return 4;
        base = (uint8_t *)(((uintptr_t)heap + 63) & ~(uintptr_t)63);
    }
    carve_work(&wk, base, base + scratch, amx);
    li_run_works(&wk, 1, nthreads);
    free(heap);
    return 0;
}

/* ---- many products in one parallel region (moe.c) ------------------------------------ */

int64_t li_work_size(void) { return (int64_t)sizeof(li_work); }

int li_work_init(void *wk, int nmat, const int *types, const void *const *w, const void *const *packed,
                 const int64_t *rows, int64_t k, const float *x, int64_t n, float *const *y, int64_t n_fast,
                 int64_t *scratch, int64_t *amx) {
    return init_work((li_work *)wk, nmat, types, w, packed, rows, k, x, n, y, n_fast, scratch, amx);
}

void li_work_carve(void *wk, uint8_t *base, uint8_t *amx, int64_t amx_bytes) {
    carve_work((li_work *)wk, base, amx, amx_bytes);
}

/* Thread t of T quantizes its part of every work's activations. */
void li_works_quantize(const void *works, int count, int t, int T) {
    const li_work *wk = (const li_work *)works;
    for (int i = 0; i < count; i++)
        if (wk[i].n) quantize_part(&wk[i], t, T);
}

/* Takes chunks of the works' dots from the shared counter until none is left: each work
 * in chunks_per_work parts of equal estimated cost. */
void li_works_dots(const void *works, int count, int chunks_per_work, int *next, int thread) {
    const li_work *wk = (const li_work *)works;
    const int total = count * chunks_per_work;
    for (;;) {
        const int c = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED);
        if (c >= total) break;
        const li_work *w = &wk[c / chunks_per_work];
        if (w->n) run_part(w, c % chunks_per_work, chunks_per_work, thread);
    }
}

/* Runs `count` works carved with li_work_carve: one parallel region quantizes every
 * activation, then the threads take the dots in chunks. Rows go out in chunks taken in
 * turn: on a shared machine a thread that loses its core for a while leaves its share to
 * the other instead of holding the whole call up. */
void li_run_works(void *works, int count, int nthreads) {
#ifdef _OPENMP
    if (nthreads > 1) {
        int next_chunk = 0;
#pragma omp parallel num_threads(nthreads)
        {
            const int T = omp_get_num_threads(), t = omp_get_thread_num();
            li_works_quantize(works, count, t, T);
#pragma omp barrier
            li_works_dots(works, count, LI_CHUNKS_PER_THREAD * T, &next_chunk, t);
        }
        return;
    }
#endif
    int next_chunk = 0;
    li_works_quantize(works, count, 0, 1);
    li_works_dots(works, count, 1, &next_chunk, 0);
}

/* li_op (kernels.h): the per-token entry, bound once by c_kernels.py. */
int li_op_size(void) { return (int)sizeof(li_op); }

int li_matmul_op(const li_op *op, const float *x, int n, float *y0, float *y1, float *y2, int n_fast) {
    float *y[LI_MAXMAT] = {y0, y1, y2};
    int types[LI_MAXMAT];
    for (int i = 0; i < LI_MAXMAT; i++) types[i] = op->types[i];
    return li_matmul(op->nmat, types, op->w, op->packed, op->rows, op->k, x, n, y, op->nthreads ? *op->nthreads : 1,
                     n_fast);
}
