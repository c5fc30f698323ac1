/* AVX-512 VNNI kernels (512-bit vpdpbusd): U8S8 form, exact for every operand.
 *
 * Same arithmetic as kernels_avxvnni.c on 16 int32 lanes: non-saturating vpdpbusd only (MLAS
 * uses the saturating vpdpbusds here; the contract wants wrap32). The epilogue and
 * Quantize/Dequantize use the 256-bit code (they are bound by memory, not arithmetic).
 * With -DQL_SIMDE this file is compiled against SIMDe (scripts/emulated_isa.sh).
 */
#include "qlinear.h"

#if QL_X86
#ifdef QL_SIMDE
#pragma GCC target("avx2")
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <immintrin.h>
#include <simde/x86/avx512.h>
#else
#pragma GCC target("avx2,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")
#include <immintrin.h>
#endif
#include <string.h>

/* 8 rows x 32 columns: 16 zmm accumulators, 2 panel registers, 1 broadcast */
#define Z_MR 8
static void avx512vnni_u8s8(const void *L, ptrdiff_t ldl, const void *Rpanel, int kp,
                            int32_t *C, ptrdiff_t ldc, int rows) {
    const char *l[Z_MR];
    for (int r = 0; r < Z_MR; r++) l[r] = (const char *)L + (r < rows ? r : 0) * ldl;
    const char *R = (const char *)Rpanel;
    __m512i acc[Z_MR][2];
    for (int r = 0; r < Z_MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
    int groups = kp / 4;
    for (int g = 0; g < groups; g++) {
        __m512i b0 = _mm512_loadu_si512((const void *)(R + (size_t)g * 128));
        __m512i b1 = _mm512_loadu_si512((const void *)(R + (size_t)g * 128 + 64));
        for (int r = 0; r < Z_MR; r++) {  /* unrolled by the compiler: constant trip count */
            int32_t v;
            memcpy(&v, l[r] + 4 * g, 4);
            __m512i a = _mm512_set1_epi32(v);
            acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], a, b0);
            acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], a, b1);
        }
    }
    for (int r = 0; r < rows; r++) {
        _mm512_storeu_si512((void *)(C + r * ldc), acc[r][0]);
        _mm512_storeu_si512((void *)(C + r * ldc + 16), acc[r][1]);
    }
}

static const ql_gemm_kernel k_avx512vnni = {"avx512vnni-u8s8", Z_MR, 32, 4, QL_FORM_U8S8,
                                          avx512vnni_u8s8, ql_pack_L_avx2, ql_pack_R_panel_avx2,
                                          .grouped_b_t9 = ql_grouped_b_t9_avx2};

#include "simd_common_avx2.h"

const ql_isa ql_isa_avx512vnni = {
    "avx512vnni", &k_avx512vnni, NULL, 1, ql_epilogue_avx2, ql_quantize_avx2, ql_dequantize_avx2,
    NULL, ql_dw_rows_avx2, ql_dw_cl_avx2,
};
#endif
