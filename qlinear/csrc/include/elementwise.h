/* Element-wise kernels of onnxruntime's com.microsoft operators (QLinearAdd, QLinearMul, and
 * the 256-entry tables of QLinearSigmoid / QLinearLeakyRelu / QLinearConcat / QLinearWhere),
 * bit for bit as onnxruntime 1.32's x86-64 kernels compute them (docs/contract.md).
 *
 * 8-bit data are passed as bytes; `is_signed` says whether they are int8. An operand with
 * stride 0 is one value broadcast over the run, stride 1 a run of n values. */
#ifndef QLINEAR_ELEMENTWISE_H
#define QLINEAR_ELEMENTWISE_H

#include <stddef.h>
#include <stdint.h>

#include "qlinear.h"

/* QLinearAdd: y = sat(cvt(fma(p, rp, fma(q, rq, folded)))); cvt is cvtps2dq (round half to
 * even; NaN or |v| >= 2^31 give INT_MIN, hence the type's minimum after saturation). */
typedef void (*ql_qadd_fn)(const uint8_t *p, ptrdiff_t ps, const uint8_t *q, ptrdiff_t qs,
                           ptrdiff_t n, float rp, float rq, float folded, int is_signed,
                           uint8_t *out);
/* QLinearMul: y = sat(cvt(f(f((a - za)(b - zb)) * r) + zc)), no fused multiply-add. */
typedef void (*ql_qmul_fn)(const uint8_t *a, ptrdiff_t as, const uint8_t *b, ptrdiff_t bs,
                           ptrdiff_t n, int32_t za, int32_t zb, float r, float zc, int is_signed,
                           uint8_t *out);

/* MaxPool's row step (pool.c): dst[i] = max over k < m of (src[k][i] ^ bias) for i < n, bytes
 * compared unsigned (m >= 1; dst overlaps no source) */
typedef void (*ql_maxrows_fn)(uint8_t *dst, const uint8_t *const *src, ptrdiff_t m, ptrdiff_t n,
                              uint8_t bias);

/* The float tail of a QDQ Conv whose float32 result is exact (qlinear.qdq.exact_integer_convs),
 * over one output plane of n values: s = f(f(float)acc * mult) + bias) (both exact there);
 * r = s (act 0), max(s, 0) (act 1, Relu), max(s, f(s * alpha)) (act 2, LeakyRelu with
 * 0 <= alpha <= 1); then QuantizeLinear's sat(rne(f(r / y_scale)) + y_zp) after clamping
 * r / y_scale to [qmin - y_zp, qmax - y_zp] -- each float32 operation the one the float
 * graph's node performs (NumPy's float32 ufuncs, the quantize kernels), in the same order. */
typedef void (*ql_qdqconv_fn)(const int32_t *acc, ptrdiff_t n, float mult, float bias, int act,
                              float alpha, float y_scale, int32_t y_zp, int is_signed,
                              uint8_t *out);

typedef struct ql_ew_kernels {
    const char *name;  /* "scalar", "avx2-fma" */
    ql_qadd_fn qadd;
    ql_qmul_fn qmul;
    ql_maxrows_fn maxrows;
    ql_qdqconv_fn qdqconv;
} ql_ew_kernels;

/* the portable QDQ Conv tail (the scalar level's, and the AVX2 kernel's tail) */
void ql_qdqconv_portable(const int32_t *acc, ptrdiff_t n, float mult, float bias, int act,
                         float alpha, float y_scale, int32_t y_zp, int is_signed, uint8_t *out);

/* the portable row maximum (SSE2 on x86-64, whose baseline it is; C elsewhere) */
void ql_maxrows_portable(uint8_t *dst, const uint8_t *const *src, ptrdiff_t m, ptrdiff_t n, uint8_t bias);

extern const ql_ew_kernels ql_ew_scalar;
#if QL_X86
extern const ql_ew_kernels ql_ew_avx2fma;
#endif

/* dispatch.c: the element-wise kernels for an ISA level (the scalar level gets the portable
 * ones; an x86 level gets AVX2+FMA ones when the CPU has FMA, else the portable ones) */
const ql_ew_kernels *ql_ew_for(const ql_isa *isa);

/* y[i] = table[x[i]] (portable: a byte gather does not vectorize profitably on AVX2) */
void ql_lut_u8(const uint8_t *x, ptrdiff_t n, const uint8_t *table, uint8_t *out);

/* shared by the kernels' tails: cvtps2dq then saturation to [lo, hi] */
static inline int32_t ql_cvt_sat(float v, int32_t lo, int32_t hi) {
    if (!(v > -2147483648.0f && v < 2147483648.0f)) return lo; /* INT_MIN (also NaN) saturates low */
    /* lo and hi are integers: clamping before rounding equals saturating after */
    if (v < (float)lo) v = (float)lo;
    if (v > (float)hi) v = (float)hi;
    return ql_rne(v);
}

#endif
