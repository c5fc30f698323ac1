/* AVX-512 tile kernel of the float32 Conv's matrix product (include/fconv.h): up to 16 rows x
 * 16 columns, one accumulator of 16 chains per row. Per k: one input vector, then per row a
 * broadcast weight, a multiply and a separate add (vmulps, vaddps: the same two float32
 * roundings as the portable kernel, never a fused multiply-add; the build's -ffp-contract=off
 * keeps the compiler from fusing them); the bias is added to each finished chain. Measured on
 * Zen 4 (multiplies and adds issue on different pipes there): 16 x 16 and 12 x 16 run at the
 * pipes' limit, ~16 multiply-adds per cycle; two vectors per row (8 x 32, 6 x 32) reached only
 * 2/3 of it. One unrolled copy per row count, so a panel of fewer rows computes no padding. */
#include "fconv.h"

#if QL_X86 && !defined(QL_SIMDE)
#pragma GCC target("avx2,avx512f")
#include <immintrin.h>

#define FMR 16

static inline __attribute__((always_inline)) void tile(ptrdiff_t K, const float *a, ptrdiff_t lda, const float *b,
                                                       float *c, ptrdiff_t ldc, const float *bias, const int R) {
    __m512 acc[FMR];
#pragma GCC unroll 16
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (ptrdiff_t kk = 0; kk < K; kk++) {
        const __m512 bv = _mm512_loadu_ps(b + kk * 16);
#pragma GCC unroll 16
        for (int r = 0; r < R; r++)
            acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(_mm512_set1_ps(a[r * lda + kk]), bv));
    }
    if (bias) {
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) acc[r] = _mm512_add_ps(acc[r], _mm512_set1_ps(bias[r]));
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; r++) _mm512_storeu_ps(c + r * ldc, acc[r]);
}

#define ROWS(R) \
    static void tile##R(ptrdiff_t K, const float *a, ptrdiff_t lda, const float *b, float *c, ptrdiff_t ldc, \
                        const float *bias) { tile(K, a, lda, b, c, ldc, bias, R); }
ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6) ROWS(7) ROWS(8)
ROWS(9) ROWS(10) ROWS(11) ROWS(12) ROWS(13) ROWS(14) ROWS(15) ROWS(16)

typedef void (*tile_fn)(ptrdiff_t, const float *, ptrdiff_t, const float *, float *, ptrdiff_t, const float *);
static const tile_fn tiles[FMR + 1] = {NULL, tile1, tile2, tile3, tile4, tile5, tile6, tile7, tile8,
                                       tile9, tile10, tile11, tile12, tile13, tile14, tile15, tile16};

static void micro_avx512(ptrdiff_t K, const float *a, ptrdiff_t lda, const float *b, float *c, ptrdiff_t ldc,
                         const float *bias, int rows) {
    tiles[rows](K, a, lda, b, c, ldc, bias);
}

/* The depthwise row (include/fconv.h): 32, then 16 outputs at a time, one chain per lane, the
 * last n % 16 through masked loads and stores (nothing read or written past n). */
static void dw_row_avx512(float *y, ptrdiff_t n, const float *const *src, const float *w, int taps, int accumulate,
                          const float *bias) {
    ptrdiff_t ox = 0;
    for (; ox + 32 <= n; ox += 32) {
        __m512 a0 = accumulate ? _mm512_loadu_ps(y + ox) : _mm512_setzero_ps();
        __m512 a1 = accumulate ? _mm512_loadu_ps(y + ox + 16) : _mm512_setzero_ps();
        for (int t = 0; t < taps; t++) {
            const __m512 wv = _mm512_set1_ps(w[t]);
            a0 = _mm512_add_ps(a0, _mm512_mul_ps(wv, _mm512_loadu_ps(src[t] + ox)));
            a1 = _mm512_add_ps(a1, _mm512_mul_ps(wv, _mm512_loadu_ps(src[t] + ox + 16)));
        }
        if (bias) {
            a0 = _mm512_add_ps(a0, _mm512_set1_ps(*bias));
            a1 = _mm512_add_ps(a1, _mm512_set1_ps(*bias));
        }
        _mm512_storeu_ps(y + ox, a0);
        _mm512_storeu_ps(y + ox + 16, a1);
    }
    for (; ox < n; ox += 16) {
        const __mmask16 m = n - ox >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - ox)) - 1);
        __m512 a0 = accumulate ? _mm512_maskz_loadu_ps(m, y + ox) : _mm512_setzero_ps();
        for (int t = 0; t < taps; t++)
            a0 = _mm512_add_ps(a0, _mm512_mul_ps(_mm512_set1_ps(w[t]), _mm512_maskz_loadu_ps(m, src[t] + ox)));
        if (bias) a0 = _mm512_add_ps(a0, _mm512_set1_ps(*bias));
        _mm512_mask_storeu_ps(y + ox, m, a0);
    }
}

const ql_fconv_kernels ql_fconv_avx512 = {"avx512", FMR, 16, micro_avx512, dw_row_avx512};

#endif
