/* Portable element-wise kernels (elementwise.h): the reference every SIMD version must equal.
 * fmaf is the C library's correctly rounded fused multiply-add, as vfmadd231ps is; the build's
 * -ffp-contract=off keeps every other product and sum separately rounded. */
#include "elementwise.h"

#include <math.h>

#include "isa/x86_sse2.h"

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

/* dst[i] = max over k < m of (src[k][i] ^ bias) for i < n (m >= 1): one pass, each source
 * read once, the destination written once */
void ql_maxrows_portable(uint8_t *restrict dst, const uint8_t *const *src, ptrdiff_t m, ptrdiff_t n, uint8_t bias) {
    ptrdiff_t i = ql_vec_maxrows(dst, src, m, n, bias);
    for (; i < n; i++) {
        uint8_t v = (uint8_t)(src[0][i] ^ bias);
        for (ptrdiff_t k = 1; k < m; k++) {
            uint8_t w = (uint8_t)(src[k][i] ^ bias);
            v = v > w ? v : w;
        }
        dst[i] = v;
    }
}

void ql_qdqconv_portable(const int32_t *acc, ptrdiff_t n, float mult, float bias, int act,
                         float alpha, float y_scale, int32_t y_zp, int is_signed, uint8_t *out) {
    /* qmin - y_zp and qmax - y_zp: small integers, exact (quantize_scalar's bounds) */
    float lo = (is_signed ? -128.0f : 0.0f) - (float)y_zp, hi = (is_signed ? 127.0f : 255.0f) - (float)y_zp;
    for (ptrdiff_t i = 0; i < n; i++) {
        float s = (float)acc[i] * mult;  /* the caller's bound: |acc| < 2^24, both exact */
        s = s + bias;
        float r = s;
        if (act == 1) {
            r = s > 0.0f ? s : 0.0f;     /* np.maximum(s, 0); the sign of a zero is lost below */
        } else if (act == 2) {
            float y = s * alpha;         /* leaky_relu's float32 product */
            r = s >= y ? s : y;          /* np.maximum(s, y) (no NaN: s is finite) */
        }
        float v = r / y_scale;           /* QuantizeLinear's true float32 division */
        if (!(v >= lo)) v = lo;
        if (v > hi) v = hi;
        int32_t q = ql_rne(v) + y_zp;
        out[i] = is_signed ? (uint8_t)(int8_t)q : (uint8_t)q;
    }
}

const ql_ew_kernels ql_ew_scalar = {"scalar", qadd_scalar, qmul_scalar, ql_maxrows_portable,
                                    ql_qdqconv_portable};
