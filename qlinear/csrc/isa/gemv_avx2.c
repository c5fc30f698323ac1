/* AVX2 dot kernel of the matrix-vector products (include/gemv.h): per 32 bytes of k, a's bytes
 * (after the flip to the u8 form) zero-extended to int16 (vpmovzxbw) and each column's s8 bytes
 * sign-extended (vpmovsxbw), vpmaddwd's pair sums (|2 * 255 * 128| < 2^31: exact) added into
 * int32 lanes with vpaddd (wraps: wrap32); the sum of a' from vpsadbw's 64-bit lanes. Columns in
 * groups of four, so a group's accumulators and a's two halves stay in registers. */
#include "gemv.h"

#if QL_X86
#pragma GCC target("avx2")
#include <immintrin.h>

#define QL_INLINE static inline __attribute__((always_inline))

QL_INLINE uint32_t hsum32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return (uint32_t)_mm_cvtsi128_si32(s);
}

/* columns b[0..C) of the group: their sums over kbytes */
QL_INLINE void group(const uint8_t *a, __m256i vflip, const int8_t *b, ptrdiff_t ldb, ptrdiff_t kbytes,
                     uint32_t *acc, const int C) {
    __m256i s[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                    _mm256_setzero_si256()};
    for (ptrdiff_t k = 0; k < kbytes; k += 32) {
        __m256i av = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(a + k)), vflip);
        __m256i alo = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(av));
        __m256i ahi = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(av, 1));
        for (int j = 0; j < C; j++) {
            __m256i bv = _mm256_loadu_si256((const __m256i *)(b + j * ldb + k));
            __m256i blo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(bv));
            __m256i bhi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(bv, 1));
            s[j] = _mm256_add_epi32(s[j], _mm256_madd_epi16(alo, blo));
            s[j] = _mm256_add_epi32(s[j], _mm256_madd_epi16(ahi, bhi));
        }
    }
    for (int j = 0; j < C; j++) acc[j] = hsum32(s[j]);
}

static void dot_avx2(const uint8_t *a, uint8_t flip, const int8_t *b, ptrdiff_t ldb, ptrdiff_t kbytes, int n,
                     uint32_t *acc, uint32_t *asum) {
    const __m256i vflip = _mm256_set1_epi8((char)flip);
    __m256i t = _mm256_setzero_si256();
    for (ptrdiff_t k = 0; k < kbytes; k += 32) {
        __m256i av = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(a + k)), vflip);
        t = _mm256_add_epi64(t, _mm256_sad_epu8(av, _mm256_setzero_si256()));
    }
    __m128i t2 = _mm_add_epi64(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    t2 = _mm_add_epi64(t2, _mm_unpackhi_epi64(t2, t2));
    *asum = (uint32_t)_mm_cvtsi128_si64(t2);   /* the low 32 bits: the sum mod 2^32 */
    int j = 0;
    for (; j + 4 <= n; j += 4) group(a, vflip, b + j * ldb, ldb, kbytes, acc + j, 4);
    switch (n - j) {
    case 3: group(a, vflip, b + j * ldb, ldb, kbytes, acc + j, 3); break;
    case 2: group(a, vflip, b + j * ldb, ldb, kbytes, acc + j, 2); break;
    case 1: group(a, vflip, b + j * ldb, ldb, kbytes, acc + j, 1); break;
    default: break;
    }
}

const ql_gemv_kernels ql_gemv_avx2 = {"avx2", dot_avx2};

#endif
