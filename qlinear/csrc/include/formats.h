/* QuantizeLinear / DequantizeLinear 19-28 for the newer types (docs/contract.md, "versions 19
 * to 28"; docs/engine.md, "The newer formats"): int16/uint16, int4/uint4/int2/uint2 (one element
 * per byte, ml_dtypes' storage), the narrow float formats (float8 x4, float6 x2, float4),
 * float16/bfloat16/float32/int32 inputs, the division precision P (float32, float16, bfloat16),
 * per tensor / per axis / blocked parameters.
 *
 * The arithmetic is the NumPy path's (qlinear/_qdq.py), operation for operation:
 *   Q:  q = x_P / s_P in float32, rounded to P;  integer T: clamp to [lo - z, hi - z] (NaN -> lo - z),
 *       rne, + z;  float T: (q + z) rounded to P when a zero point is added, then the Cast-table
 *       encoding (exact round-to-nearest-even on the float32 bits).
 *   DQ: (float32(x) - z) * s in float32 (x decoded by the registry's table for float formats), then
 *       one rounding to the output type.
 * The format's facts (widths, bias, specials, decode table) come from the registry
 * (qlinear/dtypes) with each call; nothing here restates them. */
#ifndef QLINEAR_FORMATS_H
#define QLINEAR_FORMATS_H

#include <stddef.h>
#include <stdint.h>

#include "qlinear.h"

/* element types (qlinear/engines/native/formats.py: FORMAT_CODES) */
enum {
    QF_F32 = 0, QF_F16 = 1, QF_BF16 = 2, QF_I32 = 3,
    QF_U8 = 4, QF_I8 = 5, QF_U16 = 6, QF_I16 = 7, QF_U4 = 8, QF_I4 = 9, QF_U2 = 10, QF_I2 = 11,
    QF_NF = 12, /* a narrow float format: ql_nfmt */
    QF_NTYPES = 13
};

/* flavours of a narrow float format (qlinear/dtypes/floating.py's FloatFormat.flavour) */
enum { QF_FN = 0, QF_FNUZ = 1, QF_IEEE = 2, QF_FINITE = 3 };

typedef struct {
    int32_t mbits, bias, flavour;
    uint32_t max_code, nan_code, sign_bit;
    const float *table;     /* 256 exact values by code (DequantizeLinear) */
} ql_nfmt;

typedef struct {
    int x_type, out_type;
    int prec;               /* Q: the division precision P (QF_F32, QF_F16, QF_BF16) */
    int saturate;           /* Q to float8: the attribute (float4/float6 always saturate) */
    int add_zero;           /* Q to a float format: a zero point is added in P */
    int32_t lo, hi;         /* Q to integers: the type's range */
    ql_nfmt fmt;            /* the narrow float format of x (DQ) or of the output (Q) */
} ql_fmt_op;

/* One contiguous run of n elements. s, z: the parameters, one for the run (ss / zs = 0) or one
 * per element (1); z NULL: no zero point. */
typedef void (*ql_fmt_run_fn)(const ql_fmt_op *op, const void *x, ptrdiff_t n, const float *s, int ss,
                              const float *z, int zs, void *out);

typedef struct {
    const char *name;       /* "portable", "avx2", "avx512" */
    ql_fmt_run_fn quantize, dequantize;
} ql_fmt_kernels;

extern const ql_fmt_kernels ql_fmt_portable;
#if QL_X86
extern const ql_fmt_kernels ql_fmt_avx2, ql_fmt_avx512;
#endif

/* dispatch.c: the kernels of an ISA level (the scalar level: the portable ones) */
const ql_fmt_kernels *ql_fmt_for(const ql_isa *isa);

/* bytes of one element of a type */
size_t ql_fmt_size(int type);

/* The whole tensor, seen as (pre, D, post) with parameters (P0, nb, P2), P0 in {1, pre}, P2 in
 * {1, post}, nb = ceil(D / B): element (p, k, q) uses parameter (p|0, k / B, q|0). On the thread
 * pool. Never builds the parameters broadcast to the tensor. */
void ql_fmt_tensor(const ql_fmt_kernels *k, int quant, const ql_fmt_op *op, const void *x, void *out,
                   ptrdiff_t pre, ptrdiff_t D, ptrdiff_t post, ptrdiff_t B, ptrdiff_t P0, ptrdiff_t nb,
                   ptrdiff_t P2, const float *s, const float *z);

#endif
