/* AVX-VNNI kernels (256-bit vpdpbusd, VEX encoded): U8S8 form, exact for every operand.
 *
 * vpdpbusd multiplies 4 unsigned bytes (L, u8 form) by 4 signed bytes (R, s8 form), sums the
 * four products exactly and adds them to an int32 lane with wraparound: wrap32, as the
 * contract says. Never vpdpbusds (it saturates at the int32 limits instead of wrapping).
 * With -DQL_SIMDE this file is compiled against SIMDe (scripts/emulated_isa.sh) to check
 * its logic on CPUs without AVX-VNNI.
 */
#include "qlinear.h"

#if QL_X86
#ifdef QL_SIMDE
#pragma GCC target("avx2")
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <immintrin.h>
#include <simde/x86/avx512.h>
#define QL_DPBUSD256(acc, a, b) simde_mm256_dpbusd_epi32(acc, a, b)
#else
#pragma GCC target("avx2,avxvnni")
#include <immintrin.h>
#define QL_DPBUSD256(acc, a, b) _mm256_dpbusd_avx_epi32(acc, a, b)
#endif
#include <string.h>

/* 6 rows x 16 columns: 12 ymm accumulators, 2 panel registers, 1 broadcast */
#define VNNI_MR 6
static void avxvnni_u8s8(const void *L, ptrdiff_t ldl, const void *Rpanel, int kp,
                         int32_t *C, ptrdiff_t ldc, int rows) {
    const char *l[VNNI_MR];
    for (int r = 0; r < VNNI_MR; r++) l[r] = (const char *)L + (r < rows ? r : 0) * ldl;
    const __m256i *R = (const __m256i *)Rpanel;
    __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
            c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    int groups = kp / 4;
    for (int g = 0; g < groups; g++) {
        __m256i b0 = _mm256_loadu_si256(R + 2 * g), b1 = _mm256_loadu_si256(R + 2 * g + 1);
        __m256i a;
        int32_t v;
#define ROW(r, x0, x1)                          \
        memcpy(&v, l[r] + 4 * g, 4);            \
        a = _mm256_set1_epi32(v);               \
        x0 = QL_DPBUSD256(x0, a, b0);           \
        x1 = QL_DPBUSD256(x1, a, b1);
        ROW(0, c00, c01) ROW(1, c10, c11) ROW(2, c20, c21)
        ROW(3, c30, c31) ROW(4, c40, c41) ROW(5, c50, c51)
#undef ROW
    }
    __m256i out[VNNI_MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    for (int r = 0; r < rows; r++) {
        _mm256_storeu_si256((__m256i *)(C + r * ldc), out[r][0]);
        _mm256_storeu_si256((__m256i *)(C + r * ldc + 8), out[r][1]);
    }
}

static const ql_gemm_kernel k_avxvnni = {"avxvnni-u8s8", VNNI_MR, 16, 4, QL_FORM_U8S8, avxvnni_u8s8,
                                       ql_pack_L_avx2, ql_pack_R_panel_avx2,
                                          .grouped_b_t9 = ql_grouped_b_t9_avx2};

#include "simd_common_avx2.h"

const ql_isa ql_isa_avxvnni = {
    "avxvnni", &k_avxvnni, NULL, 1, ql_epilogue_avx2, ql_quantize_avx2, ql_dequantize_avx2,
    NULL, ql_dw_rows_avx2, ql_dw_cl_avx2,
};
#endif
