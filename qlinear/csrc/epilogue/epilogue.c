/* The portable reference epilogue: one tile of int32 accumulators to the output.
 *
 * acc = wrap32(C - col_z*row_a - row_z*colsum + bias)   (uint32_t arithmetic: wraps, no UB)
 * int32 output: acc. 8-bit output: v = (float)acc; v = v * m; v = clamp(v, lo, hi);
 * y = rne(v) + zp. lo = qmin - zp and hi = qmax - zp are integers, so clamping before rounding
 * equals saturating after; |v| <= 510 afterwards, so the conversion to int cannot overflow.
 * No fused multiply-add: the build passes -ffp-contract=off. The SIMD epilogues in the ISA
 * files compute the same values with cvtdq2ps / mulps / maxps / minps / cvtps2dq.
 */
#include "qlinear.h"

#include <math.h>

/* The requantization multiplier float32(float32(x_scale * w_scale) / y_scale) in *m: the C
 * engine's one copy of it (qlinear/_requant.py's is the contract's), for plain calls that form it
 * in C (python/bind_conv.c). 0 when a scale or the result is not finite (inf * 0 is NaN, which
 * has no integer) or y_scale is 0 (the caller's full path then raises its error). float32
 * arithmetic in the contract's order, uncontracted (-ffp-contract=off). */
int ql_multiplier_f32(float xs, float ws, float ys, float *m) {
    float prod = xs * ws;   /* rounded to float32 here, then divided */
    *m = prod / ys;
    return isfinite(xs) && isfinite(ws) && isfinite(ys) && ys != 0.0f && isfinite(*m);
}

int32_t ql_rne(float v) {
    /* nearbyintf rounds to nearest even under the default rounding mode, which Python keeps */
    return (int32_t)nearbyintf(v);
}

void ql_epilogue_scalar(const ql_epilogue *ep, const int32_t *C, ptrdiff_t ldc,
                        const int32_t *colsum, int i0, int j0, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        ptrdiff_t i = i0 + r;
        uint32_t ra = 0, rz = 0, bias = 0;
        if (ep->row_a) {
            ra = (uint32_t)ep->row_a[i * ep->row_s];
            rz = (uint32_t)ep->row_z[i * ep->row_s];
        }
        if (ep->row_bias) bias = (uint32_t)ep->row_bias[i];
        for (int c = 0; c < cols; c++) {
            ptrdiff_t j = j0 + c;
            uint32_t acc = (uint32_t)C[r * ldc + c] + bias;
            if (ep->row_a)
                acc -= (uint32_t)ep->col_z[j * ep->col_z_s] * ra + rz * (uint32_t)colsum[c];
            int32_t a = (int32_t)acc;  /* two's complement (every compiler we build with) */
            ptrdiff_t o = i * ep->out_rs + j * ep->out_cs;
            if (!ep->quantized) {
                ((int32_t *)ep->out)[o] = a;
                continue;
            }
            float v = (float)a;
            v = v * ep->mult[i * ep->mult_rs + j * ep->mult_cs];
            if (!(v >= ep->lo)) v = ep->lo;  /* also sends NaN low (cannot occur: m is finite) */
            if (v > ep->hi) v = ep->hi;
            int32_t y = ql_rne(v) + ep->zp;
            if (ep->out_is_signed)
                ((int8_t *)ep->out)[o] = (int8_t)y;
            else
                ((uint8_t *)ep->out)[o] = (uint8_t)y;
        }
    }
}
