/* AVX2 + FMA element-wise kernels: 32 elements per step, the portable code for the tail.
 * The arithmetic is the portable kernels' (elementwise.c) instruction for instruction:
 * vfmadd231ps is one correctly rounded fused multiply-add like fmaf; vcvtps2dq rounds half
 * to even and gives INT_MIN for NaN or out-of-range values; the saturating packs (int32 ->
 * int16 -> 8-bit) then clamp exactly as ql_cvt_sat does (INT_MIN packs to the type's min).
 *
 * Each kernel is one always-inlined body instantiated per operand form (both operands runs,
 * or one of them a broadcast scalar) and signedness, so the loops carry no per-vector branch.
 * A broadcast operand's part of the arithmetic is computed once, with the same instructions
 * on the same values, hence the same bits: QLinearAdd's inner fma(q, rq, folded) when q is
 * the scalar, QLinearMul's (b - zb) when b is. */
#include "elementwise.h"

#if QL_X86
#pragma GCC target("avx2,fma")
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define QL_INLINE static inline __attribute__((always_inline))

/* 8 bytes at p as 8 int32 (vpmovsxbd / vpmovzxbd straight from memory) */
QL_INLINE __m256i load8_i32(const uint8_t *p, int is_signed) {
    __m128i b = _mm_loadl_epi64((const __m128i *)p);
    return is_signed ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b);
}

QL_INLINE __m256i splat_i32(const uint8_t *p, int is_signed) {
    return _mm256_set1_epi32(is_signed ? (int32_t)(int8_t)p[0] : (int32_t)p[0]);
}

/* four vectors of 8 int32 (elements 0-7, 8-15, 16-23, 24-31) -> 32 saturated bytes, in order.
 * vpackssdw and vpacksswb / vpackuswb work per 128-bit lane, which leaves the eight 4-byte
 * groups in the order 0 2 4 6 | 1 3 5 7; one vpermd puts them back. */
QL_INLINE void store32(uint8_t *out, __m256i r0, __m256i r1, __m256i r2, __m256i r3, int is_signed) {
    __m256i w01 = _mm256_packs_epi32(r0, r1), w23 = _mm256_packs_epi32(r2, r3);
    __m256i b = is_signed ? _mm256_packs_epi16(w01, w23) : _mm256_packus_epi16(w01, w23);
    b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)out, b);
}

QL_INLINE int32_t tail_value(const uint8_t *p, int is_signed) {
    return is_signed ? (int32_t)(int8_t)*p : (int32_t)*p;
}

/* forms: 0 both operands are runs, 1 p is a broadcast scalar, 2 q is a broadcast scalar
 * (both scalar: every output is the same value, computed once by the tail code and copied) */
QL_INLINE void qadd_body(const uint8_t *p, const uint8_t *q, ptrdiff_t n, float rp, float rq, float folded,
                         int is_signed, int form, uint8_t *out) {
    const __m256 vrp = _mm256_set1_ps(rp), vrq = _mm256_set1_ps(rq), vf = _mm256_set1_ps(folded);
    const __m256 xs = _mm256_cvtepi32_ps(splat_i32(p, is_signed));                      /* form 1 */
    const __m256 inner_s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(splat_i32(q, is_signed)), vrq, vf); /* form 2 */
    ptrdiff_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i r[4];
        for (int h = 0; h < 4; h++) {
            __m256 x = form == 1 ? xs : _mm256_cvtepi32_ps(load8_i32(p + i + 8 * h, is_signed));
            __m256 inner = form == 2 ? inner_s
                : _mm256_fmadd_ps(_mm256_cvtepi32_ps(load8_i32(q + i + 8 * h, is_signed)), vrq, vf);
            r[h] = _mm256_cvtps_epi32(_mm256_fmadd_ps(x, vrp, inner));
        }
        store32(out + i, r[0], r[1], r[2], r[3], is_signed);
    }
    int32_t lo = is_signed ? -128 : 0, hi = is_signed ? 127 : 255;
    for (; i < n; i++) {
        const uint8_t *pi = form == 1 ? p : p + i, *qi = form == 2 ? q : q + i;
        float inner = fmaf((float)tail_value(qi, is_signed), rq, folded);
        float v = fmaf((float)tail_value(pi, is_signed), rp, inner);
        out[i] = (uint8_t)ql_cvt_sat(v, lo, hi);
    }
}

QL_INLINE void qmul_body(const uint8_t *a, const uint8_t *b, ptrdiff_t n, int32_t za, int32_t zb, float r,
                         float zc, int is_signed, int form, uint8_t *out) {
    const __m256 vr = _mm256_set1_ps(r), vzc = _mm256_set1_ps(zc);
    const __m256i vza = _mm256_set1_epi32(za), vzb = _mm256_set1_epi32(zb);
    const __m256i xs = _mm256_sub_epi32(splat_i32(a, is_signed), vza);  /* form 1 */
    const __m256i ys = _mm256_sub_epi32(splat_i32(b, is_signed), vzb);  /* form 2 */
    ptrdiff_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i res[4];
        for (int h = 0; h < 4; h++) {
            __m256i x = form == 1 ? xs : _mm256_sub_epi32(load8_i32(a + i + 8 * h, is_signed), vza);
            __m256i y = form == 2 ? ys : _mm256_sub_epi32(load8_i32(b + i + 8 * h, is_signed), vzb);
            __m256 prod = _mm256_cvtepi32_ps(_mm256_mullo_epi32(x, y)); /* exact: < 2^24 */
            __m256 v = _mm256_add_ps(_mm256_mul_ps(prod, vr), vzc);     /* two roundings */
            res[h] = _mm256_cvtps_epi32(v);
        }
        store32(out + i, res[0], res[1], res[2], res[3], is_signed);
    }
    int32_t lo = is_signed ? -128 : 0, hi = is_signed ? 127 : 255;
    for (; i < n; i++) {
        const uint8_t *ai = form == 1 ? a : a + i, *bi = form == 2 ? b : b + i;
        float prod = (float)((tail_value(ai, is_signed) - za) * (tail_value(bi, is_signed) - zb));
        float v = prod * r;
        v = v + zc;
        out[i] = (uint8_t)ql_cvt_sat(v, lo, hi);
    }
}

/* one instantiation per (signedness, form) */
#define QADD_FORM(S, F)                                                                            \
    static void qadd_##S##F(const uint8_t *p, const uint8_t *q, ptrdiff_t n, float rp, float rq,  \
                            float folded, uint8_t *out) {                                         \
        qadd_body(p, q, n, rp, rq, folded, S, F, out);                                            \
    }
#define QMUL_FORM(S, F)                                                                            \
    static void qmul_##S##F(const uint8_t *a, const uint8_t *b, ptrdiff_t n, int32_t za, int32_t zb, \
                            float r, float zc, uint8_t *out) {                                    \
        qmul_body(a, b, n, za, zb, r, zc, S, F, out);                                             \
    }
QADD_FORM(0, 0) QADD_FORM(0, 1) QADD_FORM(0, 2) QADD_FORM(1, 0) QADD_FORM(1, 1) QADD_FORM(1, 2)
QMUL_FORM(0, 0) QMUL_FORM(0, 1) QMUL_FORM(0, 2) QMUL_FORM(1, 0) QMUL_FORM(1, 1) QMUL_FORM(1, 2)

static int form_of(ptrdiff_t ps, ptrdiff_t qs) { return qs == 0 ? 2 : ps == 0 ? 1 : 0; }

/* both operands broadcast: one value (the tail code's arithmetic), then copied */
static void fill(uint8_t *out, ptrdiff_t n) {
    if (n > 1) memset(out + 1, out[0], (size_t)(n - 1));
}

static void qadd_avx2(const uint8_t *p, ptrdiff_t ps, const uint8_t *q, ptrdiff_t qs,
                      ptrdiff_t n, float rp, float rq, float folded, int is_signed,
                      uint8_t *out) {
    typedef void (*fn)(const uint8_t *, const uint8_t *, ptrdiff_t, float, float, float, uint8_t *);
    static const fn table[2][3] = {{qadd_00, qadd_01, qadd_02}, {qadd_10, qadd_11, qadd_12}};
    if (ps == 0 && qs == 0 && n > 0) {
        table[is_signed != 0][2](p, q, 1, rp, rq, folded, out);
        fill(out, n);
        return;
    }
    table[is_signed != 0][form_of(ps, qs)](p, q, n, rp, rq, folded, out);
}

static void qmul_avx2(const uint8_t *a, ptrdiff_t as, const uint8_t *b, ptrdiff_t bs,
                      ptrdiff_t n, int32_t za, int32_t zb, float r, float zc, int is_signed,
                      uint8_t *out) {
    typedef void (*fn)(const uint8_t *, const uint8_t *, ptrdiff_t, int32_t, int32_t, float, float, uint8_t *);
    static const fn table[2][3] = {{qmul_00, qmul_01, qmul_02}, {qmul_10, qmul_11, qmul_12}};
    if (as == 0 && bs == 0 && n > 0) {
        table[is_signed != 0][2](a, b, 1, za, zb, r, zc, out);
        fill(out, n);
        return;
    }
    table[is_signed != 0][form_of(as, bs)](a, b, n, za, zb, r, zc, out);
}

/* MaxPool's row step, 64 then 32 bytes a step (vpmaxub); the rest as the portable code does it
 * in 16-byte steps, the last one overlapping (the same maxima written again) */
static void maxrows_avx2(uint8_t *restrict dst, const uint8_t *const *src, ptrdiff_t m, ptrdiff_t n,
                         uint8_t bias) {
    const __m256i vb = _mm256_set1_epi8((char)bias);
    ptrdiff_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m256i a = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(src[0] + i)), vb);
        __m256i b = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(src[0] + i + 32)), vb);
        for (ptrdiff_t k = 1; k < m; k++) {
            a = _mm256_max_epu8(a, _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(src[k] + i)), vb));
            b = _mm256_max_epu8(b, _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(src[k] + i + 32)), vb));
        }
        _mm256_storeu_si256((__m256i *)(dst + i), a);
        _mm256_storeu_si256((__m256i *)(dst + i + 32), b);
    }
    for (; i + 32 <= n; i += 32) {
        __m256i a = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(src[0] + i)), vb);
        for (ptrdiff_t k = 1; k < m; k++)
            a = _mm256_max_epu8(a, _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(src[k] + i)), vb));
        _mm256_storeu_si256((__m256i *)(dst + i), a);
    }
    if (i < n) {
        const uint8_t *rest[64];
        if (m <= 64) {  /* the sources moved to the rest (the common case: kernels of a few taps) */
            for (ptrdiff_t k = 0; k < m; k++) rest[k] = src[k] + i;
            ql_maxrows_portable(dst + i, rest, m, n - i, bias);
        } else {
            for (; i < n; i++) {
                uint8_t v = (uint8_t)(src[0][i] ^ bias);
                for (ptrdiff_t k = 1; k < m; k++) {
                    uint8_t w = (uint8_t)(src[k][i] ^ bias);
                    v = v > w ? v : w;
                }
                dst[i] = v;
            }
        }
    }
}

/* ql_qdqconv_portable, 8 values a vector, the same float32 operations in the same order:
 * vcvtdq2ps is exact for |acc| < 2^24 (the caller's bound), vmulps / vaddps / vdivps round as
 * the C operators do (no contraction), vmaxps is the portable selects on finite values (no
 * NaN reaches it; only the sign of a zero may differ, which the quantization drops), the
 * clamp to [lo, hi] then vcvtps2dq (round half to even, the MXCSR default) is quantize's,
 * and the packs cannot saturate (values already in range). */
QL_INLINE __m256i qdqconv8(const int32_t *acc, __m256 vm, __m256 vb, int act, __m256 va,
                           __m256 vs, __m256 lo, __m256 hi, __m256i vz) {
    __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)acc)), vm);
    s = _mm256_add_ps(s, vb);
    if (act == 1)
        s = _mm256_max_ps(s, _mm256_setzero_ps());
    else if (act == 2)
        s = _mm256_max_ps(s, _mm256_mul_ps(s, va));
    __m256 v = _mm256_div_ps(s, vs);
    v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
    return _mm256_add_epi32(_mm256_cvtps_epi32(v), vz);
}

static void qdqconv_avx2(const int32_t *acc, ptrdiff_t n, float mult, float bias, int act,
                         float alpha, float y_scale, int32_t y_zp, int is_signed, uint8_t *out) {
    const __m256 vm = _mm256_set1_ps(mult), vb = _mm256_set1_ps(bias), va = _mm256_set1_ps(alpha);
    const __m256 vs = _mm256_set1_ps(y_scale);
    const __m256 lo = _mm256_set1_ps((is_signed ? -128.0f : 0.0f) - (float)y_zp);
    const __m256 hi = _mm256_set1_ps((is_signed ? 127.0f : 255.0f) - (float)y_zp);
    const __m256i vz = _mm256_set1_epi32(y_zp);
    ptrdiff_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i r0 = qdqconv8(acc + i, vm, vb, act, va, vs, lo, hi, vz);
        __m256i r1 = qdqconv8(acc + i + 8, vm, vb, act, va, vs, lo, hi, vz);
        __m256i r2 = qdqconv8(acc + i + 16, vm, vb, act, va, vs, lo, hi, vz);
        __m256i r3 = qdqconv8(acc + i + 24, vm, vb, act, va, vs, lo, hi, vz);
        store32(out + i, r0, r1, r2, r3, is_signed);
    }
    if (i < n)
        ql_qdqconv_portable(acc + i, n - i, mult, bias, act, alpha, y_scale, y_zp, is_signed, out + i);
}

const ql_ew_kernels ql_ew_avx2fma = {"avx2-fma", qadd_avx2, qmul_avx2, maxrows_avx2, qdqconv_avx2};

#endif
