/* AVX2 depthwise kernels (qlinear.h's ql_dw_rows_fn and ql_dw_cl_fn). Compiled for AVX2 only (no FMA: the
 * kernel is integer-only anyway); conv.c calls it only where the CPU runs AVX2. */
#include "conv.h"

#if QL_X86
#pragma GCC push_options
#pragma GCC target("avx2")
#include <immintrin.h>

/* 16 outputs per block. vpunpck{l,h}wd interleave two tap rows within 128-bit lanes, so the
 * low product holds outputs 0-3 and 8-11, the high one 4-7 and 12-15; the accumulators keep
 * that order and are permuted back once per block. vpmaddwd forms w0*r0 + w1*r1 exactly in
 * int32 (|w|, |r| <= 255: the pair sum is below 2^17); vpaddd wraps, which is wrap32. */
void ql_dw_rows_avx2(const int16_t *const *rows, const int16_t *w, int npairs, int32_t *acc,
                     int nblocks, int accumulate)
{
    for (int b = 0; b < nblocks; b++) {
        int i = b * 16;
        __m256i lo, hi;
        if (accumulate) {
            __m256i a0 = _mm256_loadu_si256((const __m256i *)(acc + i));
            __m256i a1 = _mm256_loadu_si256((const __m256i *)(acc + i + 8));
            lo = _mm256_permute2x128_si256(a0, a1, 0x20);
            hi = _mm256_permute2x128_si256(a0, a1, 0x31);
        } else {
            lo = _mm256_setzero_si256();
            hi = _mm256_setzero_si256();
        }
        for (int q = 0; q < npairs; q++) {
            __m256i ra = _mm256_loadu_si256((const __m256i *)(rows[2 * q] + i));
            __m256i rb = _mm256_loadu_si256((const __m256i *)(rows[2 * q + 1] + i));
            uint32_t wp = (uint16_t)w[2 * q] | ((uint32_t)(uint16_t)w[2 * q + 1] << 16);
            __m256i wv = _mm256_set1_epi32((int)wp);
            lo = _mm256_add_epi32(lo, _mm256_madd_epi16(_mm256_unpacklo_epi16(ra, rb), wv));
            hi = _mm256_add_epi32(hi, _mm256_madd_epi16(_mm256_unpackhi_epi16(ra, rb), wv));
        }
        _mm256_storeu_si256((__m256i *)(acc + i), _mm256_permute2x128_si256(lo, hi, 0x20));
        _mm256_storeu_si256((__m256i *)(acc + i + 8), _mm256_permute2x128_si256(lo, hi, 0x31));
    }
}

/* Channels-last depthwise: 16 channels = one ymm of centered int16 per position. Two taps'
 * vectors are interleaved by vpunpck{l,h}wd (within 128-bit lanes: the low product holds
 * channels 0-3 and 8-11, the high one 4-7 and 12-15), multiplied by the weights interleaved the
 * same way with vpmaddwd (|x - zx|, |w - zw| <= 255: a pair sum is below 2^17, exact) and
 * added in int32 (wrap32); the order is restored once per output. */
static inline __attribute__((always_inline)) void dw_cl_body(const int16_t *X, const ptrdiff_t *toff,
                                                             const __m256i *wl, const __m256i *wh, int np,
                                                             ptrdiff_t step, int ow, int32_t *acc)
{
    for (int o = 0; o < ow; o++) {
        const int16_t *xo = X + (ptrdiff_t)o * step * 16;
        __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
        for (int q = 0; q < np; q++) {
            __m256i a = _mm256_loadu_si256((const __m256i *)(xo + toff[2 * q] * 16));
            __m256i b = _mm256_loadu_si256((const __m256i *)(xo + toff[2 * q + 1] * 16));
            lo = _mm256_add_epi32(lo, _mm256_madd_epi16(_mm256_unpacklo_epi16(a, b), wl[q]));
            hi = _mm256_add_epi32(hi, _mm256_madd_epi16(_mm256_unpackhi_epi16(a, b), wh[q]));
        }
        _mm256_storeu_si256((__m256i *)(acc + 16 * o), _mm256_permute2x128_si256(lo, hi, 0x20));
        _mm256_storeu_si256((__m256i *)(acc + 16 * o + 8), _mm256_permute2x128_si256(lo, hi, 0x31));
    }
}

void ql_dw_cl_avx2(const int16_t *X, const ptrdiff_t *toff, const int16_t *wt, int npairs,
                   ptrdiff_t step, int ow, int32_t *acc)
{
    enum { MAXP = 32 };
    __m256i wl[MAXP], wh[MAXP];
    for (int q = 0; q < npairs && q < MAXP; q++) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(wt + 32 * q));
        __m256i b = _mm256_loadu_si256((const __m256i *)(wt + 32 * q + 16));
        wl[q] = _mm256_unpacklo_epi16(a, b);
        wh[q] = _mm256_unpackhi_epi16(a, b);
    }
    /* 3x3 (5 pairs) and 2x2 / 1x3 / 3x1 (2 pairs) unrolled: weights and tap offsets stay in
     * registers; other kernels loop over their pairs */
    if (npairs == 5) dw_cl_body(X, toff, wl, wh, 5, step, ow, acc);
    else if (npairs == 2) dw_cl_body(X, toff, wl, wh, 2, step, ow, acc);
    else dw_cl_body(X, toff, wl, wh, npairs, step, ow, acc);
}

#pragma GCC pop_options
#else
typedef int ql_conv_avx2_empty;   /* ISO C: a translation unit is not empty */
#endif
