/* MatMulNBits' native kernels (docs/contract.md, "MatMulNBits"; docs/engine.md, "MatMulNBits").
 *
 * One prepared weight layout, made once by qlinear/engines/native/nbits.py, serves both
 * arithmetics: columns in groups of 16; per group and K-block, bs * bits / 32 lines of 64
 * bytes; line L holds, for each of the 16 columns, 4 bytes; byte t of column c packs the codes
 * of k = L*4*per + s*4 + t for s < per = 8 / bits at bit bits * s. A group's lines are one
 * contiguous stream over k (a block is a whole number of lines), and int32 lane c of a line
 * is column c: one shift and one mask give the 16 columns' codes at any k of the line.
 * - int8 level: one line is `per` vpdpbusd operands (16 columns x 4 consecutive k each), the
 *   k order of the activation codes' dwords. Scales [group][block][16] float32, zero points
 *   [group][block][16] uint8 (or one constant).
 * - float levels: the same codes, one column a lane, read k by k in increasing order (the
 *   contract's one accumulator per output); scales [group][block][16] float32 and zero points
 *   as float32 [group][block][16] (an integer zero point is exact there); g_idx [K] or NULL.
 *
 * Every kernel computes the contract's operations in the contract's order; the ISA levels
 * differ only in how many outputs they carry at once.
 */
#ifndef QLINEAR_NBITS_H
#define QLINEAR_NBITS_H

#include <stddef.h>
#include <stdint.h>

#include "qlinear.h"

/* float levels: columns a panel and a task take (two groups), rows a tile takes at most */
#define QL_NB_NR 32
#define QL_NB_MR 8

typedef struct ql_nbits_w {
    int bits, bs, K, N, nb;       /* nb: K-blocks */
    const uint8_t *w8;            /* [ceil(N/16)][nb][bs*bits/32][64] */
    const float *s8;              /* [ceil(N/16)][nb][16] */
    /* int8 level */
    const uint8_t *z8;            /* [ceil(N/16)][nb][16] or NULL: zconst */
    int zconst;
    /* float levels */
    const float *zf;              /* [ceil(N/16)][nb][16] */
    int zint;                     /* the zero points are integers: q - zp is exact in int32 */
    const int32_t *g;             /* [K] block of each k, or NULL */
    const float *bias;            /* [N] or NULL */
} ql_nbits_w;

/* int8 level: y[m][n] (n in [16*g0, 16*g1) ∩ [0, N), rows [0, M)) from the activation codes
 * (row m at codes + m * lda, kpad = nb*bs bytes, zero past K), s_a [m][nb], Σcodes [m][nb] and
 * bad[m] (1: NaN outputs); y row stride ldy floats. */
typedef void (*ql_nbits_i8_fn)(const ql_nbits_w *w, const int8_t *codes, ptrdiff_t lda, const float *sa,
                               const int32_t *csum, const uint8_t *bad, int M, int g0, int g1, float *y,
                               ptrdiff_t ldy);
/* float levels: P[(k - k0) * QL_NB_NR + c] = f(f32(q - zp) * s) of column n0 + c (c < 32;
 * n0 a multiple of 32; columns past N give 0) for k in [k0, k1) */
typedef void (*ql_nbits_fpanel_fn)(const ql_nbits_w *w, int n0, int k0, int k1, float *p);
/* float levels, one tile: A's rows packed in tiles of QL_NB_MR, ap[k * QL_NB_MR + r] = A[r][k]; for
 * rows r < mr <= QL_NB_MR and the panel's 32 columns c, acc[r * ldc + c] =
 * fma(A[r][k], P[k - k0][c], acc) for k in [k0, k1), in increasing k */
typedef void (*ql_nbits_ftile_fn)(const float *ap, const float *p, int k0, int k1, float *acc, ptrdiff_t ldc,
                                  int mr);
/* float levels, one row (decode): y[n] for n in [n0, n0 + 64) ∩ [0, N) (n0 a multiple of 64),
 * the whole reduction in registers, weights dequantized as they are read (no panel); NULL
 * where the level has none. Returns 0 for weights it does not take (then the panel path);
 * n0 < 0 only asks that. */
typedef int (*ql_nbits_fdec_fn)(const ql_nbits_w *w, const float *a, int n0, float *y);

/* int8 level: onnxruntime's CompInt8 quantization of one row of A (docs/contract.md): codes [kpad]
 * (zero past K), s_a and Σcodes [nb], *bad (1: the row holds NaN or ±inf) */
typedef void (*ql_nbits_qa_fn)(const float *a, int K, int bs, int nb, int8_t *codes, float *sa, int32_t *csum,
                               uint8_t *bad);

typedef struct ql_nbits_kernels {
    const char *name;
    ql_nbits_i8_fn i8;
    int i8_cols;                   /* columns one i8 task should take (a multiple of 16) */
    ql_nbits_ftile_fn ftile;
    ql_nbits_fpanel_fn fpanel;
    ql_nbits_fdec_fn fdec;
    ql_nbits_qa_fn qa;
} ql_nbits_kernels;

extern const ql_nbits_kernels ql_nbits_scalar;
#if QL_X86
extern const ql_nbits_kernels ql_nbits_avx2;
extern const ql_nbits_kernels ql_nbits_avx512;
#endif
void ql_nbits_fpanel_portable(const ql_nbits_w *w, int n0, int k0, int k1, float *p);
void ql_nbits_qa_portable(const float *a, int K, int bs, int nb, int8_t *codes, float *sa, int32_t *csum,
                          uint8_t *bad);

/* dispatch.c: the level's kernels */
const ql_nbits_kernels *ql_nbits_for(const ql_isa *isa);

/* nbits.c: the drivers (the pool's threads; ISA from `k`) */
/* y [M][N] = MatMulNBits(A) (int8 selects the level's arithmetic); 0, or -1 out of memory */
int ql_nbits_run(const ql_nbits_kernels *k, const ql_nbits_w *w, int int8, const float *a, int M, float *y);

#endif
