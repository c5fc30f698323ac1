/* Portable element-wise kernels (elementwise.h): the reference every SIMD version must equal.
 * fmaf is the C library's correctly rounded fused multiply-add, as vfmadd231ps is; the build's
 * -ffp-contract=off keeps every other product and sum separately rounded. */
#include "elementwise.h"

#include <math.h>

static inline float byte_value(const uint8_t *p, ptrdiff_t i, int is_signed) {
    return is_signed ? (float)(int8_t)p[i] : (float)p[i];
}

static inline int32_t byte_int(const uint8_t *p, ptrdiff_t i, int is_signed) {
    return is_signed ? (int32_t)(int8_t)p[i] : (int32_t)p[i];
}

static void qadd_scalar(const uint8_t *p, ptrdiff_t ps, const uint8_t *q, ptrdiff_t qs,
                        ptrdiff_t n, float rp, float rq, float folded, int is_signed,
                        uint8_t *out) {
    int32_t lo = is_signed ? -128 : 0, hi = is_signed ? 127 : 255;
    for (ptrdiff_t i = 0; i < n; i++) {
        float inner = fmaf(byte_value(q, i * qs, is_signed), rq, folded);
        float v = fmaf(byte_value(p, i * ps, is_signed), rp, inner);
        out[i] = (uint8_t)ql_cvt_sat(v, lo, hi);
    }
}

static void qmul_scalar(const uint8_t *a, ptrdiff_t as, const uint8_t *b, ptrdiff_t bs,
                        ptrdiff_t n, int32_t za, int32_t zb, float r, float zc, int is_signed,
                        uint8_t *out) {
    int32_t lo = is_signed ? -128 : 0, hi = is_signed ? 127 : 255;
    for (ptrdiff_t i = 0; i < n; i++) {
        /* |(a - za)(b - zb)| <= 255 * 255 < 2^24: exact in float32 */
        float prod = (float)((byte_int(a, i * as, is_signed) - za) * (byte_int(b, i * bs, is_signed) - zb));
        float v = prod * r;
        v = v + zc;
        out[i] = (uint8_t)ql_cvt_sat(v, lo, hi);
    }
}

void ql_lut_u8(const uint8_t *x, ptrdiff_t n, const uint8_t *table, uint8_t *out) {
    ptrdiff_t i = 0;
    for (; i + 4 <= n; i += 4) {
        uint8_t a = table[x[i]], b = table[x[i + 1]], c = table[x[i + 2]], d = table[x[i + 3]];
        out[i] = a; out[i + 1] = b; out[i + 2] = c; out[i + 3] = d;
    }
    for (; i < n; i++) out[i] = table[x[i]];
}

const ql_ew_kernels ql_ew_scalar = {"scalar", qadd_scalar, qmul_scalar};
