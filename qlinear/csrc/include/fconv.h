/* The backend's float32 convolutions as matrix products (fconv/fgemm.c): the 1x1 Conv and the
 * im2col matrix of any other non-depthwise Conv times the weights, on the engine's own thread
 * pool (NumPy's OpenBLAS brought a second pool whose spinning workers fought the engine's for
 * the two cores between quantized layers).
 *
 * Arithmetic (docs/qdq.md, "Float Conv"): every output y[o][p] = sum over k of w[o][k] * x[k][p]
 * is computed as acc = +0.0f, then for k = 0, 1, ..., K-1 in that order acc = acc + w[o][k] *
 * x[k][p], one float32 rounding for the product and one for the sum (never a fused
 * multiply-add: the build's -ffp-contract=off, and the kernels use separate multiply and add
 * instructions); with a bias, y = acc + b[o] last. Every output is one such chain whatever the
 * ISA level, the tile it falls in or the thread that computes it, so the result is the same
 * bits on every level and thread count. The kernels below only choose how many chains run
 * side by side in registers. */
#ifndef QLINEAR_FCONV_H
#define QLINEAR_FCONV_H

#include <stddef.h>

#include "qlinear.h"

/* One tile of `rows` (1 <= rows <= MR) rows x NR columns: c[r * ldc + j] (r < rows, j < NR) = the
 * chain above over k < K, then + bias[r] when bias is not NULL, with a[r * lda + k] the weight
 * of row r (the weights as they are: only `rows` rows are read) and b[k * NR + j] the input of
 * column j (packed by the driver). */
typedef void (*ql_fgemm_micro_fn)(ptrdiff_t K, const float *a, ptrdiff_t lda, const float *b, float *c,
                                  ptrdiff_t ldc, const float *bias, int rows);

/* One output row of a depthwise Conv (elementwise/fconv.c): for ox < n,
 * y[ox] = (((a + w[0] * src[0][ox]) + w[1] * src[1][ox]) + ...) over the taps t < taps in the
 * order given (the kernel's row-major (ky, kx) order), a = +0.0f, or y[ox] itself when
 * `accumulate` (the chain continued from an earlier call's taps), then + *bias when bias is not
 * NULL: the same two roundings per tap, hence the same bits, on every level. */
typedef void (*ql_fdw_row_fn)(float *y, ptrdiff_t n, const float *const *src, const float *w, int taps,
                              int accumulate, const float *bias);

typedef struct ql_fconv_kernels {
    const char *name;   /* "portable", "avx2", "avx512" */
    int mr, nr;         /* the tile (mr <= 16, nr <= 32) */
    ql_fgemm_micro_fn micro;
    ql_fdw_row_fn dw_row;
} ql_fconv_kernels;

/* the portable depthwise row (also the vector kernels' tail) */
void ql_fdw_row_portable(float *y, ptrdiff_t n, const float *const *src, const float *w, int taps, int accumulate,
                         const float *bias);

/* elementwise/fconv.c: the depthwise Conv of N x C planes (H x W) with mg output channels per
 * input channel, kernel kh x kw, strides, dilations, top and left padding (the bottom and right
 * ones follow from OH and OW); y is (N, C * mg, OH, OW). Returns 0, or -1 out of memory. */
int ql_float_dwconv2d(const ql_fconv_kernels *k, const float *x, const float *w, const float *b, float *y,
                      ptrdiff_t N, ptrdiff_t C, ptrdiff_t H, ptrdiff_t W, ptrdiff_t mg, ptrdiff_t OH, ptrdiff_t OW,
                      ptrdiff_t kh, ptrdiff_t kw, ptrdiff_t sh, ptrdiff_t sw, ptrdiff_t dh, ptrdiff_t dw,
                      ptrdiff_t pt, ptrdiff_t pl, int threads);

extern const ql_fconv_kernels ql_fconv_portable;
#if QL_X86
extern const ql_fconv_kernels ql_fconv_avx2, ql_fconv_avx512;
#endif

/* dispatch.c: the kernels for an ISA level */
const ql_fconv_kernels *ql_fconv_for(const ql_isa *isa);

/* Y = W . X (+ b) for G groups and N images. Group g's weights are the M x K matrix at
 * w + g * M * K (row-major); image n's input for group g is the K x P matrix at
 * x + n * xs_n + g * xs_g with rows ldx apart; its output the M x P matrix at
 * y + (n * G + g) * M * P (contiguous: y is (N, G * M, P)). b: G * M values or NULL.
 * Threads: up to `threads`, fewer for small products. Returns 0, or -1 when scratch memory
 * cannot be allocated (y is then unspecified). */
int ql_fgemm(const ql_fconv_kernels *k, const float *w, const float *b, const float *x, float *y,
             ptrdiff_t G, ptrdiff_t N, ptrdiff_t M, ptrdiff_t K, ptrdiff_t P, ptrdiff_t ldx,
             ptrdiff_t xs_n, ptrdiff_t xs_g, int threads);

#endif
