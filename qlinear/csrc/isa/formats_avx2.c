/* The newer formats' conversion kernels, vectorized for AVX2 (8 lanes): formats_impl.h under
 * the target pragma; the same arithmetic lane by lane (see that file). The decode table is read
 * by vpgatherdd, 8 codes at a time (the compiler does not emit gathers for the plain loop); float16
 * by F16C's conversions (dispatch.c offers this build only on CPUs with F16C). */
#include "qlinear.h"

#if QL_X86
#pragma GCC target("avx2,f16c")
#include <immintrin.h>

static inline ptrdiff_t qf_gather_avx2(const float *t, const uint8_t *p, ptrdiff_t m, float *b, int codes) {
    ptrdiff_t i = 0;
    if (codes == 16) {   /* float4: the 16 values in two registers, vpermps by the code's low 3
                          * bits, bit 3 choosing; a code past 15 (other bits set) is read from the
                          * table, so every lane is table[code] */
        const __m256 t0 = _mm256_loadu_ps(t), t1 = _mm256_loadu_ps(t + 8);
        const __m256i top = _mm256_set1_epi32(15), eight = _mm256_set1_epi32(8);
        for (; i + 8 <= m; i += 8) {
            __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(p + i)));
            __m256 hi = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(idx, eight), eight));
            __m256 v = _mm256_blendv_ps(_mm256_permutevar8x32_ps(t0, idx), _mm256_permutevar8x32_ps(t1, idx), hi);
            __m256i out = _mm256_cmpgt_epi32(idx, top);
            if (!_mm256_testz_si256(out, out)) v = _mm256_mask_i32gather_ps(v, t, idx, _mm256_castsi256_ps(out), 4);
            _mm256_storeu_ps(b + i, v);
        }
    }
    for (; i + 8 <= m; i += 8) {
        __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(p + i)));
        _mm256_storeu_ps(b + i, _mm256_i32gather_ps(t, idx, 4));
    }
    return i;
}
static inline ptrdiff_t qf_f16_from_avx2(const uint16_t *h, ptrdiff_t m, float *b) {
    ptrdiff_t i = 0;
    for (; i + 8 <= m; i += 8)
        _mm256_storeu_ps(b + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(h + i))));
    return i;
}

static inline ptrdiff_t qf_f16_to_avx2(const float *b, ptrdiff_t m, uint16_t *o) {
    ptrdiff_t i = 0;
    for (; i + 8 <= m; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(o + i), _mm256_cvtps_ph(_mm256_loadu_ps(b + i), _MM_FROUND_TO_NEAREST_INT));
    return i;
}

#define QF_F16_FROM qf_f16_from_avx2
#define QF_F16_TO qf_f16_to_avx2
#define QF_GATHER qf_gather_avx2
#define QF_NAME ql_fmt_avx2
#define QF_LABEL "avx2"
#include "formats/formats_impl.h"
#endif
