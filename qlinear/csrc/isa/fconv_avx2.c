/* AVX2 tile kernel of the float32 Conv's matrix product (include/fconv.h): up to 6 rows x 16
 * columns, two accumulators of 8 chains per row (with the two input vectors, the broadcast and
 * a product: the 16 YMM registers). Per k and row: a multiply, then a separate add (vmulps,
 * vaddps: the portable kernel's two roundings, never a fused multiply-add; -ffp-contract=off);
 * the bias is added to each finished chain. One unrolled copy per row count. */
#include "fconv.h"

#if QL_X86
#pragma GCC target("avx2")
#include <immintrin.h>

#define AMR 6

static inline __attribute__((always_inline)) void tile(ptrdiff_t K, const float *a, ptrdiff_t lda, const float *b,
                                                       float *c, ptrdiff_t ldc, const float *bias, const int R) {
    __m256 lo[AMR], hi[AMR];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) lo[r] = hi[r] = _mm256_setzero_ps();
    for (ptrdiff_t kk = 0; kk < K; kk++) {
        const __m256 b0 = _mm256_loadu_ps(b + kk * 16), b1 = _mm256_loadu_ps(b + kk * 16 + 8);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const __m256 av = _mm256_broadcast_ss(a + r * lda + kk);
            lo[r] = _mm256_add_ps(lo[r], _mm256_mul_ps(av, b0));
            hi[r] = _mm256_add_ps(hi[r], _mm256_mul_ps(av, b1));
        }
    }
    if (bias) {
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const __m256 bv = _mm256_broadcast_ss(bias + r);
            lo[r] = _mm256_add_ps(lo[r], bv);
            hi[r] = _mm256_add_ps(hi[r], bv);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        _mm256_storeu_ps(c + r * ldc, lo[r]);
        _mm256_storeu_ps(c + r * ldc + 8, hi[r]);
    }
}

#define ROWS(R) \
    static void tile##R(ptrdiff_t K, const float *a, ptrdiff_t lda, const float *b, float *c, ptrdiff_t ldc, \
                        const float *bias) { tile(K, a, lda, b, c, ldc, bias, R); }
ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6)

typedef void (*tile_fn)(ptrdiff_t, const float *, ptrdiff_t, const float *, float *, ptrdiff_t, const float *);
static const tile_fn tiles[AMR + 1] = {NULL, tile1, tile2, tile3, tile4, tile5, tile6};

static void micro_avx2(ptrdiff_t K, const float *a, ptrdiff_t lda, const float *b, float *c, ptrdiff_t ldc,
                       const float *bias, int rows) {
    tiles[rows](K, a, lda, b, c, ldc, bias);
}

/* The depthwise row (include/fconv.h): 32, then 8 outputs at a time, one chain per lane; the
 * last n % 8 by the portable row (the same operations per output). */
static void dw_row_avx2(float *y, ptrdiff_t n, const float *const *src, const float *w, int taps, int accumulate,
                        const float *bias) {
    ptrdiff_t ox = 0;
    for (; ox + 32 <= n; ox += 32) {
        __m256 a[4];
        for (int v = 0; v < 4; v++) a[v] = accumulate ? _mm256_loadu_ps(y + ox + 8 * v) : _mm256_setzero_ps();
        for (int t = 0; t < taps; t++) {
            const __m256 wv = _mm256_broadcast_ss(w + t);
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++)
                a[v] = _mm256_add_ps(a[v], _mm256_mul_ps(wv, _mm256_loadu_ps(src[t] + ox + 8 * v)));
        }
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            if (bias) a[v] = _mm256_add_ps(a[v], _mm256_broadcast_ss(bias));
            _mm256_storeu_ps(y + ox + 8 * v, a[v]);
        }
    }
    for (; ox + 8 <= n; ox += 8) {
        __m256 a0 = accumulate ? _mm256_loadu_ps(y + ox) : _mm256_setzero_ps();
        for (int t = 0; t < taps; t++)
            a0 = _mm256_add_ps(a0, _mm256_mul_ps(_mm256_broadcast_ss(w + t), _mm256_loadu_ps(src[t] + ox)));
        if (bias) a0 = _mm256_add_ps(a0, _mm256_broadcast_ss(bias));
        _mm256_storeu_ps(y + ox, a0);
    }
    if (ox < n) {
        const float *rest[64];   /* taps <= 64 (FDW_TAPS, elementwise/fconv.c) */
        for (int t = 0; t < taps; t++) rest[t] = src[t] + ox;
        ql_fdw_row_portable(y + ox, n - ox, rest, w, taps, accumulate, bias);
    }
}

const ql_fconv_kernels ql_fconv_avx2 = {"avx2", AMR, 16, micro_avx2, dw_row_avx2};

#endif
