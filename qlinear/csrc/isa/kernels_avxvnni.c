/* AVX-VNNI kernels (256-bit vpdpbusd, VEX encoded): U8S8 form (GEMM), exact for every operand,
 * and S8U8 form (the convolutions' implicit GEMM, any int8 centered weight).
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
static inline __attribute__((always_inline)) void
avxvnni_u8s8_body(const void *L, ptrdiff_t ldl, const void *Rpanel, int kp, int rows, __m256i (*out)[2]) {
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
    out[0][0] = c00; out[0][1] = c01; out[1][0] = c10; out[1][1] = c11; out[2][0] = c20; out[2][1] = c21;
    out[3][0] = c30; out[3][1] = c31; out[4][0] = c40; out[4][1] = c41; out[5][0] = c50; out[5][1] = c51;
}

static void avxvnni_u8s8(const void *L, ptrdiff_t ldl, const void *Rpanel, int kp,
                         int32_t *C, ptrdiff_t ldc, int rows) {
    __m256i out[VNNI_MR][2];
    avxvnni_u8s8_body(L, ldl, Rpanel, kp, rows, out);
    for (int r = 0; r < rows; r++) {
        _mm256_storeu_si256((__m256i *)(C + r * ldc), out[r][0]);
        _mm256_storeu_si256((__m256i *)(C + r * ldc + 8), out[r][1]);
    }
}

#include "simd_common_avx2.h"

/* avxvnni-u8s8 with the epilogue fused (kernel_ep: matmuls and the convolutions' exact-form
 * im2col GEMM): the U8S8 corrections and the requantization from the accumulators through
 * AVX2's tile epilogue (ql_finish_tile16_avx2), the same instructions as every level's */
static void avxvnni_u8s8_ep(const void *L, ptrdiff_t ldl, const void *Rpanel, int kp,
                            const ql_epilogue *ep, const int32_t *colsum, int i0, int j0, int rows, int cols) {
    __m256i out[VNNI_MR][2];
    avxvnni_u8s8_body(L, ldl, Rpanel, kp, rows, out);
    ql_finish_tile16_avx2(out, ep, colsum, i0, j0, rows, cols);
}

static const ql_gemm_kernel k_avxvnni = {
    .name = "avxvnni-u8s8", .mr = VNNI_MR, .nr = 16, .kpack = 4, .form = QL_FORM_U8S8,
    .kernel = avxvnni_u8s8, .pack_L = ql_pack_L_avx2, .pack_R = ql_pack_R_panel_avx2,
    .kernel_ep = avxvnni_u8s8_ep, .conv = {QL_BYTE_PACKERS_AVX2},
};

/* ---------------------------------------------------------------------------------------
 * avxvnni-s8u8: the convolutions' implicit GEMM (the convolutions' S8U8 form), 6 rows x 16 columns.
 *
 * AVX2's avx2-s8u8 with its vpmaddubsw + vpmaddwd(1) + vpaddd replaced by one vpdpbusd: the
 * operand (u8 form, [0, 255]) is vpdpbusd's unsigned source, the centered weight w - zw (int8,
 * broadcast) its signed one. Each lane adds 4 products |u8 * s8| <= 255 * 128 = 32640 to the
 * int32 accumulator exactly, with wraparound (wrap32) and no intermediate saturation (that is
 * vpdpbusds, never used), so EVERY int8 weight is safe: s8_bound 128, not vpmaddubsw's 64.
 * Registers: 12 accumulators (2 per row), the group's 2 operand vectors and 1 broadcast = 15
 * of the 16 ymm, as avx2-i16. A k-group: 2 operand loads, 6 broadcasts, 12 vpdpbusd (against
 * AVX2's 12 vpmaddubsw + 12 vpmaddwd + 12 vpaddd at 7 bits).
 * ------------------------------------------------------------------------------------- */
#define VS_MR 6
#define VS_ROW(r, x0, x1, g)                                                                    \
    memcpy(&v, l[r] + 4 * (g), 4);                                                              \
    a = _mm256_set1_epi32(v);                                                                   \
    x0 = QL_DPBUSD256(x0, b0, a);                                                               \
    x1 = QL_DPBUSD256(x1, b1, a);
#define VS_GROUP(src, g)                                                                        \
    {                                                                                           \
        const char *s_ = (src);                                                                 \
        __m256i b0 = _mm256_loadu_si256((const __m256i *)s_),                                   \
                b1 = _mm256_loadu_si256((const __m256i *)(s_ + 32));                            \
        __m256i a;                                                                              \
        int32_t v;                                                                              \
        VS_ROW(0, c00, c01, g) VS_ROW(1, c10, c11, g) VS_ROW(2, c20, c21, g)                    \
        VS_ROW(3, c30, c31, g) VS_ROW(4, c40, c41, g) VS_ROW(5, c50, c51, g)                    \
    }
/* group g's operand at `base + 64 g` (a packed im2col panel, off NULL) or `base + off[g]`
 * (implicit GEMM): AVX2's loop (IK_GROUP_LOOP, simd_common_avx2.h) */
static inline __attribute__((always_inline)) void
avxvnni_s8u8_body(const void *L, ptrdiff_t ldl, const char *base, const ptrdiff_t *off, int groups,
                  int rows, __m256i (*out)[2]) {
    const char *l[VS_MR];
    for (int r = 0; r < VS_MR; r++)  /* missing tail rows re-read row 0; results dropped */
        l[r] = (const char *)L + (r < rows ? r : 0) * ldl;
    __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
            c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    IK_GROUP_LOOP(VS_GROUP)
    out[0][0] = c00; out[0][1] = c01; out[1][0] = c10; out[1][1] = c11; out[2][0] = c20; out[2][1] = c21;
    out[3][0] = c30; out[3][1] = c31; out[4][0] = c40; out[4][1] = c41; out[5][0] = c50; out[5][1] = c51;
}
#undef VS_ROW
#undef VS_GROUP

static void vs_store(__m256i (*out)[2], int32_t *C, ptrdiff_t ldc, int rows) {
    for (int r = 0; r < rows; r++) {
        _mm256_storeu_si256((__m256i *)(C + r * ldc), out[r][0]);
        _mm256_storeu_si256((__m256i *)(C + r * ldc + 8), out[r][1]);
    }
}

/* a packed 16-column panel (the im2col fallback: a geometry the implicit path declines) */
static void avxvnni_s8u8(const void *L, ptrdiff_t ldl, const void *Rpanel, int kp,
                         int32_t *C, ptrdiff_t ldc, int rows) {
    __m256i out[VS_MR][2];
    avxvnni_s8u8_body(L, ldl, (const char *)Rpanel, NULL, kp / 4, rows, out);
    vs_store(out, C, ldc, rows);
}

static void avxvnni_s8u8_ik(const void *L, ptrdiff_t ldl, const char *base, const ptrdiff_t *off, int groups,
                            int32_t *C, ptrdiff_t ldc, int rows) {
    __m256i out[VS_MR][2];
    avxvnni_s8u8_body(L, ldl, base, off, groups, rows, out);
    vs_store(out, C, ldc, rows);
}

/* with the epilogue from the accumulators: AVX2's (ql_ik_epilogue_avx2), the same instructions */
static void avxvnni_s8u8_ik_ep(const void *L, ptrdiff_t ldl, const char *base, const ptrdiff_t *off, int groups,
                               const ql_epilogue *ep, const ql_ik_runs *rn, int i0, int rows) {
    __m256i out[VS_MR][2];
    avxvnni_s8u8_body(L, ldl, base, off, groups, rows, out);
    ql_ik_epilogue_avx2(out, ep, rn, i0, rows);
}

/* No narrow tails or dot kernels (optional fields): a tile of few real columns runs the full
 * 16-column kernel and drops the rest; no fused im2col epilogue (kernel_ep). */
static const ql_gemm_kernel k_avxvnni_s8u8 = {
    .name = "avxvnni-s8u8", .mr = VS_MR, .nr = 16, .kpack = 4, .form = QL_FORM_S8U8,
    .kernel = avxvnni_s8u8,
    .conv = {.ikernel = avxvnni_s8u8_ik, .ikernel_ep = avxvnni_s8u8_ik_ep,
             .s8_bound = 128,   /* vpdpbusd: any int8 weight (above) */
             QL_BYTE_PACKERS_AVX2},
};

const ql_isa ql_isa_avxvnni = {
    "avxvnni", &k_avxvnni, NULL, 1, ql_epilogue_avx2, ql_quantize_avx2, ql_dequantize_avx2,
    &k_avxvnni_s8u8, ql_dw_rows_avx2, ql_dw_cl_avx2,
    .dw_t16 = ql_dw_t16_avx2, .dw_store32 = ql_dw_store_avx2,
};
#endif
