/* The newer formats' conversion kernels, vectorized for AVX2 (8 lanes): formats_impl.h under
 * the target pragma; the same arithmetic lane by lane (see that file). The decode table is read
 * by vpgatherdd, 8 codes at a time (the compiler does not emit gathers for the plain loop). */
#include "qlinear.h"

#if QL_X86
#pragma GCC target("avx2")
#include <immintrin.h>

static inline ptrdiff_t qf_gather_avx2(const float *t, const uint8_t *p, ptrdiff_t m, float *b) {
    ptrdiff_t i = 0;
    for (; i + 8 <= m; i += 8) {
        __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(p + i)));
        _mm256_storeu_ps(b + i, _mm256_i32gather_ps(t, idx, 4));
    }
    return i;
}
#define QF_GATHER qf_gather_avx2
#define QF_NAME ql_fmt_avx2
#define QF_LABEL "avx2"
#include "formats/formats_impl.h"
#endif
