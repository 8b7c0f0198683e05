/* Memory read bandwidth: the ceiling a decode step (one pass over every weight byte) can
 * reach, measured as bench/bandwidth.py reports it.
 *
 * li_read_bandwidth sums a buffer as 64-bit integers with the widest loads this build has
 * (AVX-512, AVX2, NEON; scalar otherwise), split into one contiguous slice per thread, all
 * threads reading at once. Integer adds, not float ones: one add per load never limits
 * the rate, and the sum is exact, so a caller can check that every byte was read.
 */
#include <stdint.h>
#include <time.h>

#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif
#if defined(__ARM_NEON)
#include <arm_neon.h>
#endif

/* Tells the compiler that memory may have changed, so that it reads the buffer again on
 * every pass instead of reusing the first pass's sum. */
#if defined(__GNUC__) || defined(__clang__)
#define LI_REREAD() __asm__ volatile("" ::: "memory")
#elif defined(_MSC_VER)
#include <intrin.h>
#define LI_REREAD() _ReadWriteBarrier()
#else
#define LI_REREAD() ((void)0)
#endif

/* The wrapping sum of n 64-bit words. Four independent accumulators, so that the adds
 * never wait on each other and only the loads set the pace. */
static uint64_t sum_words(const uint64_t *p, int64_t n) {
    int64_t i = 0;
    uint64_t total = 0;
#if defined(__AVX512F__)
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm512_add_epi64(a0, _mm512_loadu_si512((const void *)(p + i)));
        a1 = _mm512_add_epi64(a1, _mm512_loadu_si512((const void *)(p + i + 8)));
        a2 = _mm512_add_epi64(a2, _mm512_loadu_si512((const void *)(p + i + 16)));
        a3 = _mm512_add_epi64(a3, _mm512_loadu_si512((const void *)(p + i + 24)));
    }
    total = (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
#elif defined(__AVX2__)
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_add_epi64(a0, _mm256_loadu_si256((const __m256i *)(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_loadu_si256((const __m256i *)(p + i + 4)));
        a2 = _mm256_add_epi64(a2, _mm256_loadu_si256((const __m256i *)(p + i + 8)));
        a3 = _mm256_add_epi64(a3, _mm256_loadu_si256((const __m256i *)(p + i + 12)));
    }
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
    total = lanes[0] + lanes[1] + lanes[2] + lanes[3];
#elif defined(__ARM_NEON)
    uint64x2_t a0 = vdupq_n_u64(0), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 8 <= n; i += 8) {
        a0 = vaddq_u64(a0, vld1q_u64(p + i));
        a1 = vaddq_u64(a1, vld1q_u64(p + i + 2));
        a2 = vaddq_u64(a2, vld1q_u64(p + i + 4));
        a3 = vaddq_u64(a3, vld1q_u64(p + i + 6));
    }
    total = vaddvq_u64(vaddq_u64(vaddq_u64(a0, a1), vaddq_u64(a2, a3)));
#endif
    for (; i < n; i++) total += p[i];
    return total;
}

static double now_seconds(void) {
#ifdef _OPENMP
    return omp_get_wtime();
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
#endif
}

/* Reads `bytes` (a multiple of 8) of `buf` `reps` times with `nthreads` threads and
 * returns the rate in GB/s (1e9 bytes per second). *checksum gets the wrapping sum of
 * every 64-bit word read (reps times the buffer's sum), so a caller can check that each
 * pass read everything. Returns -1 for bad arguments, -2 for nthreads > 1 in a build
 * without OpenMP. */
double li_read_bandwidth(const void *buf, int64_t bytes, int nthreads, int reps, uint64_t *checksum) {
    if (!buf || bytes <= 0 || bytes % 8 || nthreads < 1 || reps < 1 || !checksum) return -1.0;
#ifndef _OPENMP
    if (nthreads > 1) return -2.0;
#endif
    const uint64_t *words = (const uint64_t *)buf;
    const int64_t n = bytes / 8;
    uint64_t total = 0;
    double start = now_seconds();
#ifdef _OPENMP
#pragma omp parallel num_threads(nthreads) reduction(+ : total)
#endif
    {
        int t = 0, nt = 1;
#ifdef _OPENMP
        t = omp_get_thread_num();
        nt = omp_get_num_threads();
#endif
        /* slices of whole 64-byte lines, so no two threads share a cache line */
        const int64_t lines = (n + 7) / 8, per = (lines + nt - 1) / nt;
        int64_t w0 = (int64_t)t * per * 8, w1 = w0 + per * 8;
        if (w0 > n) w0 = n;
        if (w1 > n) w1 = n;
        uint64_t mine = 0;
        for (int r = 0; r < reps; r++) {
            mine += sum_words(words + w0, w1 - w0);
            LI_REREAD();
        }
        total += mine;
    }
    double seconds = now_seconds() - start;
    *checksum = total;
    return seconds > 0 ? (double)bytes * (double)reps / seconds / 1e9 : -1.0;
}

/* ---- Peak arithmetic throughput -------------------------------------------------------
 *
 * The ceiling a product's inner loop can reach: how many int8 or fp32 multiply-adds per
 * second the cores retire when nothing but the multiply instructions run, the figure
 * bench/prefill_profile.py sets each kernel against. One kind per instruction (sequence)
 * the kernels use:
 *   LI_PEAK_AVX2     vpmaddubsw + vpmaddwd + vpaddd on 256 bits: 32 u8 x s8 MACs
 *   LI_PEAK_VNNI256  vpdpbusd on 256 bits (AVX512-VL VNNI or AVX-VNNI): 32 MACs
 *   LI_PEAK_VNNI512  vpdpbusd on 512 bits (AVX512-VNNI): 64 MACs
 *   LI_PEAK_FMA256   vfmadd231ps on 8 fp32 lanes: 8 MACs (16 flops)
 *   LI_PEAK_FMA512   vfmadd231ps on 16 fp32 lanes: 16 MACs
 * Each loop runs 12 or 16 independent accumulator chains (more than latency x issue width
 * of any x86 core we know), so throughput, not latency, sets the pace. The loop bodies are
 * inline assembly: with intrinsics GCC 12 copies every vpdpbusd accumulator to another
 * register (and one to the stack) each iteration, which would measure its register
 * allocation, not the core. The operands' values do not change the speed. */
#include "kernels.h"
#include "vec16.h"

enum { LI_PEAK_AVX2 = 0, LI_PEAK_VNNI256 = 1, LI_PEAK_VNNI512 = 2, LI_PEAK_FMA256 = 3, LI_PEAK_FMA512 = 4, LI_PEAK_KINDS = 5 };

#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
#define LI_PEAK_ASM 1 /* AT&T syntax, the compilers' default */
#endif

static volatile int64_t li_peak_sink; /* the chains' results go here, so no loop is dead code */

/* "op %src2, %src1, %acc": one instruction on accumulator operand i (AT&T order) */
#define LI_ASM3(op, i, src1, src2) op " %" #src2 ", %" #src1 ", %" #i "\n\t"

#if defined(LI_PEAK_ASM) && defined(__AVX2__)
/* six chains: 6 sums + 6 products + 3 inputs fit AVX2's 16 registers; vpaddd's 1-cycle
 * latency is the only one a chain carries, the two multiplies of an iteration are fresh */
static int64_t peak_avx2(int64_t iters) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, t0, t1, t2, t3, t4, t5;
    const __m256i u = _mm256_set1_epi8(3), s = _mm256_set1_epi8(-2), ones = _mm256_set1_epi16(1);
#define LI_MADD(i, t) LI_ASM3("vpmaddubsw", t, 12, 13) LI_ASM3("vpmaddwd", t, t, 14) LI_ASM3("vpaddd", i, i, t)
    for (int64_t it = 0; it < iters; it++)
        __asm__ volatile(LI_MADD(0, 6) LI_MADD(1, 7) LI_MADD(2, 8) LI_MADD(3, 9) LI_MADD(4, 10) LI_MADD(5, 11)
                         : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5),
                           "=&x"(t0), "=&x"(t1), "=&x"(t2), "=&x"(t3), "=&x"(t4), "=&x"(t5)
                         : "x"(u), "x"(s), "x"(ones));
#undef LI_MADD
    const __m256i t = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3)), _mm256_add_epi32(a4, a5));
    li_peak_sink = li_hsum_i32(t);
    return iters * 6 * 32;
}
#endif

/* The accumulators are named variables, never an array: an array passed to asm stays in
 * memory, and every iteration would store and reload it. Chains come in sets of eight,
 * p0..p7, one asm statement a set (an asm takes at most 30 operands; "+" counts twice). */
#define LI_CHAINS8(OP) OP(0) OP(1) OP(2) OP(3) OP(4) OP(5) OP(6) OP(7)
#define LI_CHAINS4(OP) OP(0) OP(1) OP(2) OP(3)
#define LI_ACC8(r, p) "+" r(p##0), "+" r(p##1), "+" r(p##2), "+" r(p##3), "+" r(p##4), "+" r(p##5), "+" r(p##6), "+" r(p##7)
#define LI_ACC4(r, p) "+" r(p##0), "+" r(p##1), "+" r(p##2), "+" r(p##3)
#define LI_SUM8(add, p) add(add(add(p##0, p##1), add(p##2, p##3)), add(add(p##4, p##5), add(p##6, p##7)))
#define LI_SUM4(add, p) add(add(p##0, p##1), add(p##2, p##3))

#if defined(LI_PEAK_ASM) && defined(LI_VNNI)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define LI_DP256_8(i) LI_ASM3("vpdpbusd", i, 8, 9) /* EVEX, as _mm256_dpbusd_epi32 */
#define LI_DP256_4(i) LI_ASM3("vpdpbusd", i, 4, 5)
#else
#define LI_DP256_8(i) LI_ASM3("%{vex%} vpdpbusd", i, 8, 9) /* AVX-VNNI */
#define LI_DP256_4(i) LI_ASM3("%{vex%} vpdpbusd", i, 4, 5)
#endif
/* twelve chains: 12 sums + 2 inputs fit the 16 registers of a CPU without AVX-512 */
static int64_t peak_vnni256(int64_t iters) {
    const __m256i z = _mm256_setzero_si256(), u = _mm256_set1_epi8(3), s = _mm256_set1_epi8(-2);
    __m256i a0 = z, a1 = z, a2 = z, a3 = z, a4 = z, a5 = z, a6 = z, a7 = z, b0 = z, b1 = z, b2 = z, b3 = z;
    for (int64_t it = 0; it < iters; it++) {
        __asm__ volatile(LI_CHAINS8(LI_DP256_8) : LI_ACC8("x", a) : "x"(u), "x"(s));
        __asm__ volatile(LI_CHAINS4(LI_DP256_4) : LI_ACC4("x", b) : "x"(u), "x"(s));
    }
    li_peak_sink = li_hsum_i32(_mm256_add_epi32(LI_SUM8(_mm256_add_epi32, a), LI_SUM4(_mm256_add_epi32, b)));
    return iters * 12 * 32;
}
#undef LI_DP256_8
#undef LI_DP256_4
#endif

#if defined(LI_PEAK_ASM) && defined(__AVX512F__) && defined(__AVX512VNNI__)
static int64_t peak_vnni512(int64_t iters) {
    const __m512i z = _mm512_setzero_si512(), u = _mm512_set1_epi8(3), s = _mm512_set1_epi8(-2);
    __m512i a0 = z, a1 = z, a2 = z, a3 = z, a4 = z, a5 = z, a6 = z, a7 = z;
    __m512i b0 = z, b1 = z, b2 = z, b3 = z, b4 = z, b5 = z, b6 = z, b7 = z;
#define LI_DP512(i) LI_ASM3("vpdpbusd", i, 8, 9)
    for (int64_t it = 0; it < iters; it++) {
        __asm__ volatile(LI_CHAINS8(LI_DP512) : LI_ACC8("v", a) : "v"(u), "v"(s));
        __asm__ volatile(LI_CHAINS8(LI_DP512) : LI_ACC8("v", b) : "v"(u), "v"(s));
    }
#undef LI_DP512
    li_peak_sink = _mm512_reduce_add_epi32(_mm512_add_epi32(LI_SUM8(_mm512_add_epi32, a), LI_SUM8(_mm512_add_epi32, b)));
    return iters * 16 * 64;
}
#endif

/* acc += m * b: the sums grow by 1e-3 an iteration, never near overflow, never subnormal */
#if defined(LI_PEAK_ASM) && defined(__AVX2__) && defined(__FMA__)
static int64_t peak_fma256(int64_t iters) {
    const __m256 z = _mm256_setzero_ps(), m = _mm256_set1_ps(0.5f), b = _mm256_set1_ps(2e-3f);
    __m256 a0 = z, a1 = z, a2 = z, a3 = z, a4 = z, a5 = z, a6 = z, a7 = z, c0 = z, c1 = z, c2 = z, c3 = z;
#define LI_FMA256_8(i) LI_ASM3("vfmadd231ps", i, 8, 9)
#define LI_FMA256_4(i) LI_ASM3("vfmadd231ps", i, 4, 5)
    for (int64_t it = 0; it < iters; it++) {
        __asm__ volatile(LI_CHAINS8(LI_FMA256_8) : LI_ACC8("x", a) : "x"(m), "x"(b));
        __asm__ volatile(LI_CHAINS4(LI_FMA256_4) : LI_ACC4("x", c) : "x"(m), "x"(b));
    }
#undef LI_FMA256_8
#undef LI_FMA256_4
    li_peak_sink = (int64_t)li_hsum8(_mm256_add_ps(LI_SUM8(_mm256_add_ps, a), LI_SUM4(_mm256_add_ps, c)));
    return iters * 12 * 8;
}
#endif

#if defined(LI_PEAK_ASM) && defined(__AVX512F__)
static int64_t peak_fma512(int64_t iters) {
    const __m512 z = _mm512_setzero_ps(), m = _mm512_set1_ps(0.5f), b = _mm512_set1_ps(2e-3f);
    __m512 a0 = z, a1 = z, a2 = z, a3 = z, a4 = z, a5 = z, a6 = z, a7 = z;
    __m512 c0 = z, c1 = z, c2 = z, c3 = z, c4 = z, c5 = z, c6 = z, c7 = z;
#define LI_FMA512(i) LI_ASM3("vfmadd231ps", i, 8, 9)
    for (int64_t it = 0; it < iters; it++) {
        __asm__ volatile(LI_CHAINS8(LI_FMA512) : LI_ACC8("v", a) : "v"(m), "v"(b));
        __asm__ volatile(LI_CHAINS8(LI_FMA512) : LI_ACC8("v", c) : "v"(m), "v"(b));
    }
#undef LI_FMA512
    li_peak_sink = (int64_t)_mm512_reduce_add_ps(_mm512_add_ps(LI_SUM8(_mm512_add_ps, a), LI_SUM8(_mm512_add_ps, c)));
    return iters * 16 * 16;
}
#endif

typedef int64_t (*li_peak_fn)(int64_t iters);

static li_peak_fn peak_kernel(int kind) {
    switch (kind) {
#if defined(LI_PEAK_ASM) && defined(__AVX2__)
    case LI_PEAK_AVX2: return peak_avx2;
#endif
#if defined(LI_PEAK_ASM) && defined(LI_VNNI)
    case LI_PEAK_VNNI256: return peak_vnni256;
#endif
#if defined(LI_PEAK_ASM) && defined(__AVX512F__) && defined(__AVX512VNNI__)
    case LI_PEAK_VNNI512: return peak_vnni512;
#endif
#if defined(LI_PEAK_ASM) && defined(__AVX2__) && defined(__FMA__)
    case LI_PEAK_FMA256: return peak_fma256;
#endif
#if defined(LI_PEAK_ASM) && defined(__AVX512F__)
    case LI_PEAK_FMA512: return peak_fma512;
#endif
    default: return 0;
    }
}

/* Multiply-adds per second, in billions (GMAC/s; an fp32 FMA is one MAC, two flops), of
 * `kind` run `iters` loop iterations on each of `nthreads` threads at once. Returns 0 where
 * this build lacks the kind's instructions, -1 for bad arguments, -2 for nthreads > 1 in a
 * build without OpenMP. The first call also starts the thread pool: time a warm-up first. */
double li_peak_gmacs(int kind, int nthreads, int64_t iters) {
    if (kind < 0 || kind >= LI_PEAK_KINDS || nthreads < 1 || iters < 1) return -1.0;
#ifndef _OPENMP
    if (nthreads > 1) return -2.0;
#endif
    const li_peak_fn fn = peak_kernel(kind);
    if (!fn) return 0.0;
    int64_t macs = 0;
    double start = now_seconds();
#ifdef _OPENMP
#pragma omp parallel num_threads(nthreads) reduction(+ : macs)
#endif
    macs += fn(iters);
    double seconds = now_seconds() - start;
    return seconds > 0 ? (double)macs / seconds / 1e9 : -1.0;
}

/* The kind (LI_PEAK_*) whose throughput bounds each path of this build's products, or -1
 * where that path is scalar or absent:
 *   0 the int8 row dots (legacy.c, kquants.c)      1 the int8 packed panels (packed.c)
 *   2 the float row dots (F16, BF16, F32)          3 the float packed panels */
int li_peak_kind(int path) {
    switch (path) {
    case 0:
#if defined(LI_VNNI)
        return LI_PEAK_VNNI256;
#elif defined(__AVX2__)
        return LI_PEAK_AVX2;
#else
        return -1;
#endif
    case 1:
#if defined(LP_512)
        return LI_PEAK_VNNI512;
#elif defined(LP_256) && defined(LI_VNNI)
        return LI_PEAK_VNNI256;
#elif defined(LP_256)
        return LI_PEAK_AVX2;
#else
        return -1;
#endif
    case 2:
#if defined(__AVX2__) && defined(__FMA__)
        return LI_PEAK_FMA256;
#else
        return -1;
#endif
    case 3:
#if defined(LP_512)
        return LI_PEAK_FMA512;
#elif defined(LP_256)
        return LI_PEAK_FMA256;
#else
        return -1;
#endif
    default:
        return -1;
    }
}
