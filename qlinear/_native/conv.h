/* Convolutions (conv.c, conv_avx2.c): the plan handed over by Python and the entry points. */
#ifndef QLINEAR_CONV_H
#define QLINEAR_CONV_H

#include "qlinear.h"

/* Highest spatial rank the native engine takes (Python falls back to NumPy above). */
#define QL_CONV_MAXD 12

typedef struct ql_conv_plan {
    int nsp;                                  /* spatial rank */
    int64_t N, C, M, group;                   /* x (N, C, in...), w (M, C/group, k...) */
    int64_t in[QL_CONV_MAXD], out[QL_CONV_MAXD], k[QL_CONV_MAXD];
    int64_t stride[QL_CONV_MAXD], dil[QL_CONV_MAXD], pad[QL_CONV_MAXD];  /* pad: at the beginning */
    const void *x; int x_type; int32_t x_zp;  /* contiguous NCHW... input, 8-bit */
    void *y;                                  /* contiguous (N, M, out...) output */
    int quantized;                            /* 0: int32 y, 1: 8-bit y */
    int y_signed; int32_t y_zp; float lo, hi; /* requantization (quantized only) */
    const float *mult; ptrdiff_t mult_s;      /* per output channel (s = 1) or broadcast (0) */
    const int32_t *bias;                      /* [M] or NULL */
} ql_conv_plan;

/* Depthwise row kernel: acc[i] (+)= sum over pairs q of w[2q]*rows[2q][i] + w[2q+1]*rows[2q+1][i]
 * for i < 16*nblocks (wrap32), rows centered int16, weights centered int16. */
typedef void (*ql_dw_rows_fn)(const int16_t *const *rows, const int16_t *w, int npairs,
                              int32_t *acc, int nblocks, int accumulate);

void ql_dw_rows_scalar(const int16_t *const *rows, const int16_t *w, int npairs, int32_t *acc,
                       int nblocks, int accumulate);
#if QL_X86
void ql_dw_rows_avx2(const int16_t *const *rows, const int16_t *w, int npairs, int32_t *acc,
                     int nblocks, int accumulate);
ql_dw_rows_fn ql_conv_dw_rows(const ql_isa *isa);   /* the row kernel for an ISA level */

#endif

size_t ql_conv_w_bytes(const ql_gemm_kernel *k, int M, int K);
void ql_conv_pack_w(const ql_gemm_kernel *k, const void *w, int w_type, int M, int K,
                    const int32_t *wzp, void *dst);
/* 0, -1 (out of memory), -2 (sizes beyond int), -3 (scratch above the workspace limit) */
int ql_conv_gemm(const ql_conv_plan *p, const ql_isa *isa, const ql_gemm_kernel *kern,
                 const void *wpacked, size_t workspace);
int ql_conv_depthwise(const ql_conv_plan *p, const ql_isa *isa, ql_dw_rows_fn rows_fn,
                      const int16_t *wc, size_t workspace);

ql_dw_rows_fn ql_conv_dw_rows(const ql_isa *isa);   /* the row kernel for an ISA level */

#endif
