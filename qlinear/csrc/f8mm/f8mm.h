/* QLinearMatMul-21 with a float8 operand: the native steps around the exact float64 product
 * (f8mm.c says why each is exact). */
#ifndef QLINEAR_F8MM_H
#define QLINEAR_F8MM_H

#include <stddef.h>
#include <stdint.h>

#include "qlinear.h"
#include "formats.h"

/* codes (R x C, row-major) -> out = table[code] - zero point (zp_mode 0: zp[0]; 1: zp[row];
 * 2: zp[column]), float64. k_axis 1 (the left operand, k along the columns): kmax[C] = the
 * largest |out| of each column, bad[R] = 1 for rows holding a non-finite value; k_axis 0 (the
 * right operand, k along the rows): kmax[R] per row, bad[C] per column. Non-finite values are
 * written as 0. bad must come zeroed. On up to `threads` of the pool's threads. */
void ql_f8mm_decode(const uint8_t *codes, ptrdiff_t R, ptrdiff_t C, const double *table, const double *zp,
                    int zp_mode, int k_axis, int threads, double *out, double *kmax, uint8_t *bad);

/* out[i] = hh·2^(2s) + (hl + lh)·2^s + ll (exact integers below 2^53 each, s <= 26), rounded to
 * odd at 53 bits; 1, or 0 when the build has no 128-bit integers (nothing written) */
int ql_f8mm_combine(const double *hh, const double *hl, const double *lh, const double *ll, ptrdiff_t n, int s,
                    double *out);

/* out (M x N, the output type's bytes) = convert(float32(float32(S) · unit) · m) on the pool's
 * threads (at most `threads`); m is (m_rows ? M : 1) x (m_cols ? N : 1); op: the QuantizeLinear of float32 to the
 * output type (prec float32), z: NULL or the zero point (one value) */
void ql_f8mm_finish(const ql_isa *isa, const double *S, ptrdiff_t M, ptrdiff_t N, float unit, const float *m,
                    int m_rows, int m_cols, const ql_fmt_op *op, const float *z, int threads, uint8_t *out);

/* A dgemm of the BLAS NumPy uses (cblas_dgemm's arguments; 64-bit integers when ilp64), found by
 * Python (qlinear/_blas.py); called single-threaded from the pool's threads. */
typedef struct {
    void *fn;
    int ilp64;
} ql_f8mm_dgemm;

/* out (M x N) = the output step (as ql_f8mm_finish) of units(a) @ B in one pool job, for an a
 * whose bound Python proved from its type and zero points: a (M x K codes) decoded through
 * table (float64 units, 0 for a non-finite code) minus zp (zp_rows: one per row, else zp[0])
 * into units (M x K scratch), S (M x N scratch) = units @ B (K x N float64 units) by `gemm`
 * on column blocks, then each block's output. 0 (out not written) when a holds a code that
 * bad_table marks (NaN or an infinity): the caller takes the general path. */
int ql_f8mm_product(const ql_isa *isa, ql_f8mm_dgemm gemm, const uint8_t *a, ptrdiff_t M, ptrdiff_t K,
                    const double *table, const uint8_t *bad_table, const double *zp, int zp_rows, const double *B,
                    ptrdiff_t N, double *units, double *S, float unit, const float *m, int m_rows, int m_cols,
                    const ql_fmt_op *op, const float *z, int threads, uint8_t *out);

#endif
