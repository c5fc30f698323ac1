/* The newer formats' conversion kernels, vectorized for AVX-512 (16 lanes): formats_impl.h
 * under the target pragma; the same arithmetic lane by lane (see that file). The decode table
 * is read by vgatherdps, 16 codes at a time. Offered with the AVX-512 VNNI and AMX levels,
 * whose CPUs have AVX-512 F/BW/DQ/VL (dispatch.c). */
#include "qlinear.h"

#if QL_X86
#pragma GCC target("avx2,avx512f,avx512bw,avx512dq,avx512vl,prefer-vector-width=512")
#include <immintrin.h>

static inline ptrdiff_t qf_gather_avx512(const float *t, const uint8_t *p, ptrdiff_t m, float *b, int codes) {
    ptrdiff_t i = 0;
    /* float4 (16 codes) and float6 (64): the values in registers, vpermps / vpermt2ps by the
     * code's low bits (bit 5 choosing between two 32-value halves for float6); a code past the
     * format's (other bits set) is read from the table, so every lane is table[code] */
    if (codes == 16) {
        const __m512 t0 = _mm512_loadu_ps(t);
        const __m512i top = _mm512_set1_epi32(15);
        for (; i + 16 <= m; i += 16) {
            __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p + i)));
            __m512 v = _mm512_permutexvar_ps(idx, t0);
            __mmask16 out = _mm512_cmpgt_epu32_mask(idx, top);
            if (out) v = _mm512_mask_i32gather_ps(v, out, idx, t, 4);
            _mm512_storeu_ps(b + i, v);
        }
    } else if (codes == 64) {
        const __m512 t0 = _mm512_loadu_ps(t), t1 = _mm512_loadu_ps(t + 16), t2 = _mm512_loadu_ps(t + 32),
                     t3 = _mm512_loadu_ps(t + 48);
        const __m512i top = _mm512_set1_epi32(63), bit5 = _mm512_set1_epi32(32);
        for (; i + 16 <= m; i += 16) {
            __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p + i)));
            __m512 lo = _mm512_permutex2var_ps(t0, idx, t1), hi = _mm512_permutex2var_ps(t2, idx, t3);
            __m512 v = _mm512_mask_blend_ps(_mm512_test_epi32_mask(idx, bit5), lo, hi);
            __mmask16 out = _mm512_cmpgt_epu32_mask(idx, top);
            if (out) v = _mm512_mask_i32gather_ps(v, out, idx, t, 4);
            _mm512_storeu_ps(b + i, v);
        }
    }
    for (; i + 16 <= m; i += 16) {
        __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p + i)));
        _mm512_storeu_ps(b + i, _mm512_i32gather_ps(idx, t, 4));
    }
    return i;
}
/* float16 by AVX-512F's conversions (vcvtph2ps / vcvtps2ph on 16 lanes) */
static inline ptrdiff_t qf_f16_from_avx512(const uint16_t *h, ptrdiff_t m, float *b) {
    ptrdiff_t i = 0;
    for (; i + 16 <= m; i += 16)
        _mm512_storeu_ps(b + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(h + i))));
    return i;
}

static inline ptrdiff_t qf_f16_to_avx512(const float *b, ptrdiff_t m, uint16_t *o) {
    ptrdiff_t i = 0;
    for (; i + 16 <= m; i += 16)
        _mm256_storeu_si256((__m256i *)(void *)(o + i), _mm512_cvtps_ph(_mm512_loadu_ps(b + i), _MM_FROUND_TO_NEAREST_INT));
    return i;
}

#define QF_F16_FROM qf_f16_from_avx512
#define QF_F16_TO qf_f16_to_avx512
#define QF_GATHER qf_gather_avx512
/* masked float operations: the encoder's one-loop form vectorizes (formats_impl.h) */
#define QF_MASKED_FLOAT 1
#define QF_NAME ql_fmt_avx512
#define QF_LABEL "avx512"
#include "formats/formats_impl.h"
#endif
