/* 512-bit pieces shared by the AVX-512 files (kernels_avx512vnni.c, kernels_amx.c), included
 * after their #pragma GCC target (AVX-512 F/BW/DQ/VL), native builds only (Debian's SIMDe
 * lacks the 512-bit conversions: the emulated builds use the 256-bit epilogue instead). */
#ifndef QL_SIMD_COMMON_AVX512_H
#define QL_SIMD_COMMON_AVX512_H

/* The contract's requantization of 16 int32 sums: ql_requant8_avx2's instructions at 16 lanes,
 * so the same bits (vcvtdq2ps rounds to nearest even; one vmulps, nothing contracted into an
 * FMA; vmaxps(v, lo) returns lo, its second operand, for a NaN v, then vminps hi: the clamp to
 * [qmin - zp, qmax - zp] before rounding; vcvtps2dq under the default MXCSR rounding; + zp).
 * The results are values of the output type, so a truncating or saturating narrowing
 * (vpmovdb, vpmovsdb, vpmovusdb) stores them exactly. */
static inline __attribute__((always_inline)) __m512i ql_requant16_avx512(__m512i acc, __m512 m, __m512 lo,
                                                                         __m512 hi, __m512i zp) {
    __m512 v = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc), m), lo), hi);
    return _mm512_add_epi32(_mm512_cvtps_epi32(v), zp);
}

#endif
