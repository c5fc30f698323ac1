/* AVX2 kernels (no FMA: nothing here multiplies floats and adds in one step).
 *
 * - avx2-i16 (exact, any 8-bit operands): centered int16 operands, vpmaddwd. Each pair
 *   product sum is |l0*r0 + l1*r1| <= 2*255*255 < 2^31, exact; vpaddd wraps like wrap32.
 * - avx2-u8s8 (fast path, only where packing proved every s8-form R value is within
 *   [-64, 64]): vpmaddubsw forms l0*r0 + l1*r1 with l in [0, 255]: |sum| <= 2*255*64 = 32640
 *   <= 32767, so its int16 saturation can never trigger; vpmaddwd by 1 widens pairs to int32.
 */
#include "qlinear.h"

#if QL_X86
#pragma GCC target("avx2")
#include <immintrin.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------
 * avx2-i16: 6 rows x 16 columns, 12 ymm accumulators
 * ------------------------------------------------------------------------------------- */
#define I16_MR 6
static void avx2_i16(const void *L, ptrdiff_t ldl, const void *Rpanel, int kp,
                     int32_t *C, ptrdiff_t ldc, int rows) {
    const char *l[I16_MR];
    for (int r = 0; r < I16_MR; r++)  /* missing tail rows re-read row 0; results dropped */
        l[r] = (const char *)L + (r < rows ? r : 0) * ldl;
    const __m256i *R = (const __m256i *)Rpanel;
    __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
            c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    int groups = kp / 2;
    for (int g = 0; g < groups; g++) {
        __m256i b0 = _mm256_loadu_si256(R + 2 * g), b1 = _mm256_loadu_si256(R + 2 * g + 1);
        __m256i a;
        int32_t v;
#define ROW(r, x0, x1)                                              \
        memcpy(&v, l[r] + 4 * g, 4);                                \
        a = _mm256_set1_epi32(v);                                   \
        x0 = _mm256_add_epi32(x0, _mm256_madd_epi16(a, b0));        \
        x1 = _mm256_add_epi32(x1, _mm256_madd_epi16(a, b1));
        ROW(0, c00, c01) ROW(1, c10, c11) ROW(2, c20, c21)
        ROW(3, c30, c31) ROW(4, c40, c41) ROW(5, c50, c51)
#undef ROW
    }
    __m256i out[I16_MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    for (int r = 0; r < rows; r++) {
        _mm256_storeu_si256((__m256i *)(C + r * ldc), out[r][0]);
        _mm256_storeu_si256((__m256i *)(C + r * ldc + 8), out[r][1]);
    }
}

/* ---------------------------------------------------------------------------------------
 * avx2-u8s8 fast path: 4 rows x 16 columns (vpmaddubsw needs a register of 1s and temporaries)
 * ------------------------------------------------------------------------------------- */
#define U8_MR 4
static void avx2_u8s8(const void *L, ptrdiff_t ldl, const void *Rpanel, int kp,
                      int32_t *C, ptrdiff_t ldc, int rows) {
    const char *l[U8_MR];
    for (int r = 0; r < U8_MR; r++) l[r] = (const char *)L + (r < rows ? r : 0) * ldl;
    const __m256i *R = (const __m256i *)Rpanel;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
            c30 = c00, c31 = c00;
    int groups = kp / 4;
    for (int g = 0; g < groups; g++) {
        __m256i b0 = _mm256_loadu_si256(R + 2 * g), b1 = _mm256_loadu_si256(R + 2 * g + 1);
        __m256i a;
        int32_t v;
#define ROW(r, x0, x1)                                                                        \
        memcpy(&v, l[r] + 4 * g, 4);                                                          \
        a = _mm256_set1_epi32(v);                                                             \
        x0 = _mm256_add_epi32(x0, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b0), ones));     \
        x1 = _mm256_add_epi32(x1, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b1), ones));
        ROW(0, c00, c01) ROW(1, c10, c11) ROW(2, c20, c21) ROW(3, c30, c31)
#undef ROW
    }
    __m256i out[U8_MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}};
    for (int r = 0; r < rows; r++) {
        _mm256_storeu_si256((__m256i *)(C + r * ldc), out[r][0]);
        _mm256_storeu_si256((__m256i *)(C + r * ldc + 8), out[r][1]);
    }
}

static const ql_gemm_kernel k_avx2_i16 = {"avx2-i16", I16_MR, 16, 2, QL_FORM_I16, avx2_i16};
static const ql_gemm_kernel k_avx2_u8s8 = {"avx2-u8s8", U8_MR, 16, 4, QL_FORM_U8S8, avx2_u8s8};

#include "simd_common_avx2.h"

const ql_isa ql_isa_avx2 = {
    "avx2", &k_avx2_i16, &k_avx2_u8s8, 0, ql_epilogue_avx2, ql_quantize_avx2, ql_dequantize_avx2,
};
#endif
