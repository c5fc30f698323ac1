/* AVX2 island run (island.h): 8 elements per step, the portable code for the tail, the
 * portable run's float32 operations instruction for instruction: vpmovzxbd / vpmovsxbd and
 * vpsubd give the exact x - z, vcvtdq2ps converts it exactly (|x - z| <= 255), vmulps /
 * vaddps / vdivps round as the C operators (the build does not contract), vmaxps(0, v) is the
 * portable `v < 0 ? 0 : v` (vmaxps returns its second operand for NaN and for two zeros, so
 * NaN and -0 are kept), vmaxps / vminps with the bounds put NaN at the low end as the portable
 * `!(q >= lo)` does, vcvtps2dq rounds half to even (the MXCSR default), and the packs cannot
 * saturate (values already in range). */
#include "island.h"
#include "elementwise.h"

#if QL_X86
#pragma GCC target("avx2")
#include <immintrin.h>

#define QL_INLINE static inline __attribute__((always_inline))

QL_INLINE __m256 operand8(const ql_island_operand *o, ptrdiff_t i, __m256i vz, __m256 vs, __m256 vmul,
                          __m256 vadd) {
    __m256 v;
    if (o->q) {
        __m128i b = _mm_loadl_epi64((const __m128i *)(o->q + i));
        __m256i x = o->is_signed ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b);
        v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(x, vz)), vs);
    } else {
        v = _mm256_loadu_ps(o->f + i);
    }
    if (o->mul) v = _mm256_add_ps(_mm256_mul_ps(v, vmul), vadd);
    return v;
}

QL_INLINE void run_body(const ql_island_job *j, ptrdiff_t i0, ptrdiff_t n, ptrdiff_t c, int is_signed) {
    const ql_island_operand *a = &j->a, *b = &j->b;
    const __m256 vsa = _mm256_set1_ps(a->s), vsb = _mm256_set1_ps(b->s), vys = _mm256_set1_ps(j->ys);
    const __m256i vza = _mm256_set1_epi32(a->z), vzb = _mm256_set1_epi32(b->z), vyz = _mm256_set1_epi32(j->yz);
    const __m256 ma = _mm256_set1_ps(a->mul ? a->mul[c] : 0.0f), aa = _mm256_set1_ps(a->add ? a->add[c] : 0.0f);
    const __m256 mb = _mm256_set1_ps(b->mul ? b->mul[c] : 0.0f), ab = _mm256_set1_ps(b->add ? b->add[c] : 0.0f);
    const __m256 lo = _mm256_set1_ps((is_signed ? -128.0f : 0.0f) - (float)j->yz);
    const __m256 hi = _mm256_set1_ps((is_signed ? 127.0f : 255.0f) - (float)j->yz);
    const __m256 zero = _mm256_setzero_ps();
    ptrdiff_t i = i0, end = i0 + n;
    for (; i + 8 <= end; i += 8) {
        __m256 v = operand8(a, i, vza, vsa, ma, aa);
        if (j->has_b) v = _mm256_add_ps(v, operand8(b, i, vzb, vsb, mb, ab));
        if (j->relu) v = _mm256_max_ps(zero, v);
        if (j->out_f) _mm256_storeu_ps(j->out_f + i, v);
        if (j->out_q) {
            __m256 q = _mm256_min_ps(_mm256_max_ps(_mm256_div_ps(v, vys), lo), hi);
            __m256i r = _mm256_add_epi32(_mm256_cvtps_epi32(q), vyz);
            __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
            w = is_signed ? _mm_packs_epi16(w, w) : _mm_packus_epi16(w, w);
            _mm_storel_epi64((__m128i *)(j->out_q + i), w);
        }
    }
    if (i < end) ql_island_run_portable(j, i, end - i, c);
}

/* one instantiation per output signedness (the other flags are loop invariants the compiler
 * unswitches) */
static void run_avx2(const ql_island_job *j, ptrdiff_t i0, ptrdiff_t n, ptrdiff_t c) {
    if (j->is_signed) run_body(j, i0, n, c, 1);
    else run_body(j, i0, n, c, 0);
}

/* the AVX2 run, shared with the VBMI kernels (island_avx512.c) */
void ql_island_run_avx2(const ql_island_job *j, ptrdiff_t i0, ptrdiff_t n, ptrdiff_t c) { run_avx2(j, i0, n, c); }

/* a byte gather does not vectorize profitably on AVX2: the portable lookup */
const ql_island_kernels ql_island_avx2 = {"avx2", run_avx2, ql_lut_u8};

#endif
