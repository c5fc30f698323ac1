/* MatMulNBits' native kernels (docs/contract.md, "MatMulNBits"; docs/engine.md, "MatMulNBits").
 *
 * Two prepared weight layouts, made once by qlinear/engines/native/nbits.py:
 *
 * - int8 level (accuracy_level 4 where the contract quantizes activations): columns in groups
 *   of 16; per group and K-block, bs * bits / 32 lines of 64 bytes; line L holds, for each of
 *   the 16 columns, 4 bytes; byte t of column c packs the codes of k = L*4*per + s*4 + t for
 *   s < per = 8 / bits at bit bits * s. One line is therefore `per` vpdpbusd operands (16
 *   columns x 4 consecutive k each), the k order of the activation codes' dwords. Scales
 *   [group][block][16] float32, zero points [group][block][16] uint8 (or one constant).
 * - float levels: columns in groups of QL_NB_FCOLS (8); per group, per superchunk of 16 * per
 *   k, 16 bytes per column; byte i packs the codes of k = k0 + 16 * s + i at bit bits * s: one
 *   16-byte load widened to 16 int32 lanes gives `per` groups of 16 consecutive k by one shift
 *   and one mask. A group's weights are one contiguous stream, read in order by the decode
 *   kernel (columns in separate rows, read side by side, defeated the prefetchers: several
 *   times slower). Scales and zero points (as float32: an integer zero point is exact there)
 *   [N/8][kblocks][8]; g_idx [kpad] or NULL.
 *
 * Every kernel computes the contract's operations in the contract's order; the ISA levels
 * differ only in how many outputs they carry at once.
 */
#ifndef QLINEAR_NBITS_H
#define QLINEAR_NBITS_H

#include <stddef.h>
#include <stdint.h>

#include "qlinear.h"

#define QL_NB_FCOLS 8

typedef struct ql_nbits_w {
    int bits, bs, K, N, nb;       /* nb: K-blocks */
    /* int8 layout */
    const uint8_t *w8;            /* [ceil(N/16)][nb][bs*bits/32][64] */
    const float *s8;              /* [ceil(N/16)][nb][16] */
    const uint8_t *z8;            /* [ceil(N/16)][nb][16] or NULL: zconst */
    int zconst;
    /* float layout */
    const uint8_t *wf;            /* [ceil(N/8)][kpadf / (16*per)][8][16], kpadf = nb*bs rounded up to 16*per */
    ptrdiff_t wf_row;             /* bytes per column: kpadf * bits / 8 */
    const float *sf, *zf;         /* [ceil(N/8)][nb][8] */
    const int32_t *g;             /* [kpadf] block of each k (0 past K), or NULL */
    const float *bias;            /* [N] or NULL */
} ql_nbits_w;

/* int8 level: y[m][n] (n in [16*g0, 16*g1) ∩ [0, N), rows [0, M)) from the activation codes
 * (row m at codes + m * lda, kpad = nb*bs bytes, zero past K), s_a [m][nb], Σcodes [m][nb] and
 * bad[m] (1: NaN outputs); y row stride ldy floats. */
typedef void (*ql_nbits_i8_fn)(const ql_nbits_w *w, const int8_t *codes, ptrdiff_t lda, const float *sa,
                               const int32_t *csum, const uint8_t *bad, int M, int g0, int g1, float *y,
                               ptrdiff_t ldy);
/* float levels, one tile: acc[r][c][16] (r < mr <= 4, c < nr <= 4; acc + (r * acc_rs + c) * 16)
 * takes lane l += fma over groups j in [j0, j1) of A[r][16j + l] * P[c][(j - j0)*16 + l]
 * (A row r at a + r * lda, P column c at p + c * ldp); lanes of k >= K untouched. */
typedef void (*ql_nbits_ftile_fn)(const float *a, ptrdiff_t lda, const float *p, ptrdiff_t ldp, int j0, int j1,
                                  int K, float *acc, ptrdiff_t acc_rs, int mr, int nr);
/* float levels: P[c][(j - j0)*16 + l] = f(f((float)q - zf) * sf) for columns n0 + c (c < nc),
 * groups j in [j0, j1) */
typedef void (*ql_nbits_fpanel_fn)(const ql_nbits_w *w, int n0, int nc, int j0, int j1, float *p, ptrdiff_t ldp);
/* fold: y = f(((((l[i] + l[i+8]) ...) + bias) for `count` outputs with 16 lanes each */
typedef void (*ql_nbits_ffold_fn)(const float *acc, int count, const float *bias, float *y);

/* float levels, one row (decode): y[n] for n in [n0, n0 + 32) ∩ [0, N) (n0 a multiple of 32),
 * the whole reduction in registers, weights dequantized as they are read (no panel); NULL
 * where the level has none, or returns 0 for what it does not take (then the panel path) */
typedef int (*ql_nbits_fdec_fn)(const ql_nbits_w *w, const float *a, int n0, float *y);

typedef struct ql_nbits_kernels {
    const char *name;
    ql_nbits_i8_fn i8;
    int i8_cols;                   /* columns one i8 task should take (a multiple of 16) */
    ql_nbits_ftile_fn ftile;
    ql_nbits_fpanel_fn fpanel;
    ql_nbits_ffold_fn ffold;
    ql_nbits_fdec_fn fdec;
} ql_nbits_kernels;

extern const ql_nbits_kernels ql_nbits_scalar;
#if QL_X86
extern const ql_nbits_kernels ql_nbits_avx2;
extern const ql_nbits_kernels ql_nbits_avx512;
void ql_nbits_fpanel_avx2(const ql_nbits_w *w, int n0, int nc, int j0, int j1, float *p, ptrdiff_t ldp);
#endif
void ql_nbits_fpanel_portable(const ql_nbits_w *w, int n0, int nc, int j0, int j1, float *p, ptrdiff_t ldp);
void ql_nbits_ffold_portable(const float *acc, int count, const float *bias, float *y);

/* dispatch.c: the level's kernels */
const ql_nbits_kernels *ql_nbits_for(const ql_isa *isa);

/* nbits.c: the drivers (the pool's threads; ISA from `k`) */
/* onnxruntime's CompInt8 quantization of A's rows (docs/contract.md): codes [M][kpad], sa and
 * csum [M][nb], bad [M] */
void ql_nbits_quantize_a(const float *a, ptrdiff_t lda, int M, int K, int bs, int nb, int8_t *codes,
                         float *sa, int32_t *csum, uint8_t *bad);
/* y [M][N] = MatMulNBits(A) (int8 selects the level's arithmetic); 0, or -1 out of memory */
int ql_nbits_run(const ql_nbits_kernels *k, const ql_nbits_w *w, int int8, const float *a, int M, float *y);

#endif
