/* AVX-512 VNNI dot kernel of the matrix-vector products (include/gemv.h): per 64 bytes of k,
 * a's bytes (after the flip to the u8 form) and each column's s8 bytes into vpdpbusd, which
 * adds four u8 x s8 products (each exact in int16 range) to an int32 lane and wraps on
 * overflow (wrap32; not vpdpbusds, which saturates); the sum of a' from vpsadbw's 64-bit lanes.
 * Columns in groups of up to eight accumulators, a loaded once per group and block. */
#include "gemv.h"

#if QL_X86 && !defined(QL_SIMDE)
#pragma GCC target("avx2,avx512f,avx512bw,avx512vnni")
#include <immintrin.h>

#define QL_INLINE static inline __attribute__((always_inline))
#define GROUP 8

/* horizontal sums with the wrapping vector adds (the intrinsics' reduce helpers add as signed
 * C vectors) */
QL_INLINE uint32_t hsum32(__m512i v) {
    __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return (uint32_t)_mm_cvtsi128_si32(s);
}

QL_INLINE uint64_t hsum64(__m512i v) {
    __m256i h = _mm256_add_epi64(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
    __m128i s = _mm_add_epi64(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    s = _mm_add_epi64(s, _mm_unpackhi_epi64(s, s));
    return (uint64_t)_mm_cvtsi128_si64(s);
}

QL_INLINE void group(const uint8_t *a, __m512i vflip, const int8_t *b, ptrdiff_t ldb, ptrdiff_t kbytes,
                     uint32_t *acc, const int C) {
    __m512i s[GROUP];
    for (int j = 0; j < C; j++) s[j] = _mm512_setzero_si512();
    for (ptrdiff_t k = 0; k < kbytes; k += 64) {
        __m512i av = _mm512_xor_si512(_mm512_loadu_si512((const void *)(a + k)), vflip);
        for (int j = 0; j < C; j++)
            s[j] = _mm512_dpbusd_epi32(s[j], av, _mm512_loadu_si512((const void *)(b + j * ldb + k)));
    }
    for (int j = 0; j < C; j++) acc[j] = hsum32(s[j]);
}

static void dot_avx512(const uint8_t *a, uint8_t flip, const int8_t *b, ptrdiff_t ldb, ptrdiff_t kbytes, int n,
                       uint32_t *acc, uint32_t *asum) {
    const __m512i vflip = _mm512_set1_epi8((char)flip);
    __m512i t = _mm512_setzero_si512();
    for (ptrdiff_t k = 0; k < kbytes; k += 64) {
        __m512i av = _mm512_xor_si512(_mm512_loadu_si512((const void *)(a + k)), vflip);
        t = _mm512_add_epi64(t, _mm512_sad_epu8(av, _mm512_setzero_si512()));
    }
    *asum = (uint32_t)hsum64(t);   /* the low 32 bits: the sum mod 2^32 */
    int j = 0;
    for (; j + GROUP <= n; j += GROUP) group(a, vflip, b + j * ldb, ldb, kbytes, acc + j, GROUP);
    switch (n - j) {
    case 7: group(a, vflip, b + j * ldb, ldb, kbytes, acc + j, 7); break;
    case 6: group(a, vflip, b + j * ldb, ldb, kbytes, acc + j, 6); break;
    case 5: group(a, vflip, b + j * ldb, ldb, kbytes, acc + j, 5); break;
    case 4: group(a, vflip, b + j * ldb, ldb, kbytes, acc + j, 4); break;
    case 3: group(a, vflip, b + j * ldb, ldb, kbytes, acc + j, 3); break;
    case 2: group(a, vflip, b + j * ldb, ldb, kbytes, acc + j, 2); break;
    case 1: group(a, vflip, b + j * ldb, ldb, kbytes, acc + j, 1); break;
    default: break;
    }
}

const ql_gemv_kernels ql_gemv_avx512 = {"avx512vnni", dot_avx512};

#endif
