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

const ql_fconv_kernels ql_fconv_avx2 = {"avx2", AMR, 16, micro_avx2};

#endif
