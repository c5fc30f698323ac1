/* AVX2 + FMA element-wise kernels: 16 elements per step, the portable code for the tail.
 * The arithmetic is the portable kernels' (elementwise.c) instruction for instruction:
 * vfmadd231ps is one correctly rounded fused multiply-add like fmaf; vcvtps2dq rounds half
 * to even and gives INT_MIN for NaN or out-of-range values; the saturating packs (int32 ->
 * int16 -> 8-bit) then clamp exactly as ql_cvt_sat does (INT_MIN packs to the type's min). */
#include "elementwise.h"

#if QL_X86
#pragma GCC target("avx2,fma")
#include <immintrin.h>
#include <math.h>

/* 8 bytes at p (or one broadcast byte when the stride is 0) as 8 int32 */
static inline __m256i load8_i32(const uint8_t *p, ptrdiff_t s, int is_signed) {
    if (s == 0) return _mm256_set1_epi32(is_signed ? (int32_t)(int8_t)p[0] : (int32_t)p[0]);
    __m128i b = _mm_loadl_epi64((const __m128i *)p);
    return is_signed ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b);
}

/* two vectors of 8 int32 -> 16 saturated bytes, in order */
static inline void store16(uint8_t *out, __m256i r0, __m256i r1, int is_signed) {
    __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(r0, r1), 0xD8); /* 16 x int16 */
    __m128i lo = _mm256_castsi256_si128(w), hi = _mm256_extracti128_si256(w, 1);
    __m128i b = is_signed ? _mm_packs_epi16(lo, hi) : _mm_packus_epi16(lo, hi);
    _mm_storeu_si128((__m128i *)out, b);
}

static inline int32_t tail_value(const uint8_t *p, int is_signed) {
    return is_signed ? (int32_t)(int8_t)*p : (int32_t)*p;
}

static void qadd_avx2(const uint8_t *p, ptrdiff_t ps, const uint8_t *q, ptrdiff_t qs,
                      ptrdiff_t n, float rp, float rq, float folded, int is_signed,
                      uint8_t *out) {
    const __m256 vrp = _mm256_set1_ps(rp), vrq = _mm256_set1_ps(rq), vf = _mm256_set1_ps(folded);
    ptrdiff_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i r[2];
        for (int h = 0; h < 2; h++) {
            __m256 x = _mm256_cvtepi32_ps(load8_i32(p + (i + 8 * h) * ps, ps, is_signed));
            __m256 y = _mm256_cvtepi32_ps(load8_i32(q + (i + 8 * h) * qs, qs, is_signed));
            __m256 v = _mm256_fmadd_ps(x, vrp, _mm256_fmadd_ps(y, vrq, vf));
            r[h] = _mm256_cvtps_epi32(v);
        }
        store16(out + i, r[0], r[1], is_signed);
    }
    int32_t lo = is_signed ? -128 : 0, hi = is_signed ? 127 : 255;
    for (; i < n; i++) {
        float inner = fmaf((float)tail_value(q + i * qs, is_signed), rq, folded);
        float v = fmaf((float)tail_value(p + i * ps, is_signed), rp, inner);
        out[i] = (uint8_t)ql_cvt_sat(v, lo, hi);
    }
}

static void qmul_avx2(const uint8_t *a, ptrdiff_t as, const uint8_t *b, ptrdiff_t bs,
                      ptrdiff_t n, int32_t za, int32_t zb, float r, float zc, int is_signed,
                      uint8_t *out) {
    const __m256 vr = _mm256_set1_ps(r), vzc = _mm256_set1_ps(zc);
    const __m256i vza = _mm256_set1_epi32(za), vzb = _mm256_set1_epi32(zb);
    ptrdiff_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i res[2];
        for (int h = 0; h < 2; h++) {
            __m256i x = _mm256_sub_epi32(load8_i32(a + (i + 8 * h) * as, as, is_signed), vza);
            __m256i y = _mm256_sub_epi32(load8_i32(b + (i + 8 * h) * bs, bs, is_signed), vzb);
            __m256 prod = _mm256_cvtepi32_ps(_mm256_mullo_epi32(x, y)); /* exact: < 2^24 */
            __m256 v = _mm256_add_ps(_mm256_mul_ps(prod, vr), vzc);     /* two roundings */
            res[h] = _mm256_cvtps_epi32(v);
        }
        store16(out + i, res[0], res[1], is_signed);
    }
    int32_t lo = is_signed ? -128 : 0, hi = is_signed ? 127 : 255;
    for (; i < n; i++) {
        float prod = (float)((tail_value(a + i * as, is_signed) - za) * (tail_value(b + i * bs, is_signed) - zb));
        float v = prod * r;
        v = v + zc;
        out[i] = (uint8_t)ql_cvt_sat(v, lo, hi);
    }
}

const ql_ew_kernels ql_ew_avx2fma = {"avx2-fma", qadd_avx2, qmul_avx2};

#endif
