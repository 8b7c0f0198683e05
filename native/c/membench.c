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
