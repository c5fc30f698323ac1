/* AVX-512 VBMI table lookup for the table islands (island.h): 64 bytes per step, the table's
 * four 64-byte quarters in registers; vpermi2b picks from the lower or the upper 128 bytes by
 * the low 7 bits of each index, bit 7 (the byte's sign bit, vpmovb2m) chooses between the two
 * results. A lookup is exact whatever the method: the same bytes as ql_lut_u8. The tail is a
 * masked load and store of the last n % 64 bytes (nothing read or written past n). */
#include "island.h"

#if QL_X86 && !defined(QL_SIMDE)
#pragma GCC target("avx2,avx512f,avx512bw,avx512vbmi")
#include <immintrin.h>

static void lut_vbmi(const uint8_t *x, ptrdiff_t n, const uint8_t *table, uint8_t *out) {
    const __m512i t0 = _mm512_loadu_si512((const void *)table), t1 = _mm512_loadu_si512((const void *)(table + 64));
    const __m512i t2 = _mm512_loadu_si512((const void *)(table + 128)), t3 = _mm512_loadu_si512((const void *)(table + 192));
    ptrdiff_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512i v = _mm512_loadu_si512((const void *)(x + i));
        __m512i lo = _mm512_permutex2var_epi8(t0, v, t1), hi = _mm512_permutex2var_epi8(t2, v, t3);
        _mm512_storeu_si512((void *)(out + i), _mm512_mask_blend_epi8(_mm512_movepi8_mask(v), lo, hi));
    }
    if (i < n) {
        __mmask64 m = (__mmask64)(~0ULL >> (64 - (n - i)));
        __m512i v = _mm512_maskz_loadu_epi8(m, x + i);
        __m512i lo = _mm512_permutex2var_epi8(t0, v, t1), hi = _mm512_permutex2var_epi8(t2, v, t3);
        _mm512_mask_storeu_epi8(out + i, m, _mm512_mask_blend_epi8(_mm512_movepi8_mask(v), lo, hi));
    }
}

const ql_island_kernels ql_island_avx512vbmi = {"avx512vbmi", ql_island_run_avx2, lut_vbmi};

#endif
