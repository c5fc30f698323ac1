/* AVX-512 VNNI kernels (512-bit vpdpbusd): U8S8 form (GEMM), exact for every operand, and
 * S8U8 form (the convolutions' implicit GEMM, any int8 centered weight).
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

/* 12 rows x 32 columns: 24 zmm accumulators, 2 panel registers, 1 broadcast (27 of 32). A
 * k-group is 2 panel loads and 12 broadcast loads for 24 vpdpbusd; 12 rows rather than 8 cut
 * the panel's loads per multiply-add by a third, measured 4-5 % faster on an Intel Xeon
 * without AMX (--no-amx: 1024^3 1 thread 377 -> 395 GMAC/s, 128x768x3072 349 -> 356; the
 * register-only vpdpbusd ceiling there is 489). The accumulators are named variables, not an
 * array: with `__m512i acc[8][2]` gcc 12 copied all of them between registers and spilled some
 * to the stack on every k-group (81 vmovdqa64 beside 16 vpdpbusd in the loop; 1024^3 313 ->
 * 363 GMAC/s once named). Row r's 4 bytes are the unsigned operand, so they cannot be
 * vpdpbusd's embedded-broadcast source (that is the signed one): one vpbroadcastd load each. */
#define Z_MR 12
#define ZU_ROW(r)                                                                               \
    {                                                                                           \
        int32_t v;                                                                              \
        memcpy(&v, l##r + 4 * g, 4);                                                            \
        const __m512i a = _mm512_set1_epi32(v);                                                 \
        u##r##a = _mm512_dpbusd_epi32(u##r##a, a, b0);                                          \
        u##r##b = _mm512_dpbusd_epi32(u##r##b, a, b1);                                          \
    }
static inline __attribute__((always_inline)) void
avx512vnni_u8s8_body(const void *L, ptrdiff_t ldl, const void *Rpanel, int kp, int rows, __m512i (*acc)[2]) {
    /* missing tail rows re-read row 0; their results are dropped */
#define ZU_PTR(r) const char *l##r = (const char *)L + (r < rows ? r : 0) * ldl;
    ZU_PTR(0) ZU_PTR(1) ZU_PTR(2) ZU_PTR(3) ZU_PTR(4) ZU_PTR(5) ZU_PTR(6) ZU_PTR(7)
    ZU_PTR(8) ZU_PTR(9) ZU_PTR(10) ZU_PTR(11)
#undef ZU_PTR
    const char *R = (const char *)Rpanel;
    __m512i u0a = _mm512_setzero_si512(), u0b = u0a, u1a = u0a, u1b = u0a, u2a = u0a, u2b = u0a,
            u3a = u0a, u3b = u0a, u4a = u0a, u4b = u0a, u5a = u0a, u5b = u0a, u6a = u0a, u6b = u0a,
            u7a = u0a, u7b = u0a, u8a = u0a, u8b = u0a, u9a = u0a, u9b = u0a, u10a = u0a, u10b = u0a,
            u11a = u0a, u11b = u0a;
    const ptrdiff_t groups = kp / 4;
    for (ptrdiff_t g = 0; g < groups; g++) {
        const __m512i b0 = _mm512_loadu_si512((const void *)(R + (size_t)g * 128));
        const __m512i b1 = _mm512_loadu_si512((const void *)(R + (size_t)g * 128 + 64));
        ZU_ROW(0) ZU_ROW(1) ZU_ROW(2) ZU_ROW(3) ZU_ROW(4) ZU_ROW(5) ZU_ROW(6) ZU_ROW(7)
        ZU_ROW(8) ZU_ROW(9) ZU_ROW(10) ZU_ROW(11)
    }
    acc[0][0] = u0a; acc[0][1] = u0b; acc[1][0] = u1a; acc[1][1] = u1b;
    acc[2][0] = u2a; acc[2][1] = u2b; acc[3][0] = u3a; acc[3][1] = u3b;
    acc[4][0] = u4a; acc[4][1] = u4b; acc[5][0] = u5a; acc[5][1] = u5b;
    acc[6][0] = u6a; acc[6][1] = u6b; acc[7][0] = u7a; acc[7][1] = u7b;
    acc[8][0] = u8a; acc[8][1] = u8b; acc[9][0] = u9a; acc[9][1] = u9b;
    acc[10][0] = u10a; acc[10][1] = u10b; acc[11][0] = u11a; acc[11][1] = u11b;
}
#undef ZU_ROW

static void avx512vnni_u8s8(const void *L, ptrdiff_t ldl, const void *Rpanel, int kp,
                            int32_t *C, ptrdiff_t ldc, int rows) {
    __m512i acc[Z_MR][2];
    avx512vnni_u8s8_body(L, ldl, Rpanel, kp, rows, acc);
    for (int r = 0; r < rows; r++) {
        _mm512_storeu_si512((void *)(C + r * ldc), acc[r][0]);
        _mm512_storeu_si512((void *)(C + r * ldc + 16), acc[r][1]);
    }
}

#include "simd_common_avx2.h"
#ifndef QL_SIMDE
#include "simd_common_avx512.h"
#endif

/* avx512vnni-u8s8 with the epilogue fused (kernel_ep: matmuls and the convolutions' exact-form
 * im2col GEMM). Native builds: the 512-bit tile epilogue of simd_common_avx512.h (ql_ep32,
 * amx-u8s8's too) straight from the named accumulators, one row at a time: the U8S8
 * corrections folded into one scalar per row and one vector product per run of equal row
 * zero points (per-tensor zero points: none per element), the requantization on 16 lanes and
 * vpmov[u]sdb stores. The 256-bit tile epilogue it replaces (each zmm split into ymm halves
 * through ql_finish_tile16_avx2, two vpmulld per element and the halves spilled to the stack)
 * was three quarters of this kernel's time at K = 64 (measured: docs/benchmarks.md, "Measurements
 * the C engine's comments cite").
 * Epilogues whose rows are not contiguous (strided outputs, per-element multipliers or zero
 * points along a row), and the emulated build (Debian's SIMDe lacks the 512-bit conversions),
 * take the 256-bit path: each 16-column half of the tile as its two ymm halves through AVX2's
 * tile epilogue (a half without real columns is skipped, one with 1-15 takes
 * ql_epilogue_avx2's tail code). The same bits either way (the tests compare every level to
 * the oracle). */
static void avx512vnni_u8s8_ep(const void *L, ptrdiff_t ldl, const void *Rpanel, int kp,
                               const ql_epilogue *ep, const int32_t *colsum, int i0, int j0, int rows,
                               int cols) {
    __m512i acc[Z_MR][2];
    avx512vnni_u8s8_body(L, ldl, Rpanel, kp, rows, acc);
#ifndef QL_SIMDE
    if (ql_epilogue_rows_contiguous(ep)) {
        ql_ep32 s;
        ql_ep32_init(&s, ep, colsum, j0, cols);
        /* constant indices only: the accumulators stay in registers (no array in memory) */
#define ZU_EP_ROWS(r)                                                                              \
    if (r + 1 < rows)                                                                              \
        ql_ep32_row2(&s, acc[r][0], acc[r][1], acc[r + 1][0], acc[r + 1][1], (ptrdiff_t)i0 + r, j0); \
    else if (r < rows)                                                                             \
        ql_ep32_row(&s, acc[r][0], acc[r][1], (ptrdiff_t)i0 + r, j0);
/* every row pair of the Z_MR = 12-row tile */
_Static_assert(Z_MR == 12, "ZU_EP_ALL names the row pairs of a 12-row tile");
#define ZU_EP_ALL ZU_EP_ROWS(0) ZU_EP_ROWS(2) ZU_EP_ROWS(4) ZU_EP_ROWS(6) ZU_EP_ROWS(8) ZU_EP_ROWS(10)
        if (ql_ep32_usual(&s)) {
            if (s.quantized) {
                s.quantized = 1;
                ZU_EP_ALL
            } else {
                s.quantized = 0;
                ZU_EP_ALL
            }
            return;
        }
        ZU_EP_ALL
#undef ZU_EP_ROWS
#undef ZU_EP_ALL
        return;
    }
#endif
    for (int h = 0; h < 2 && 16 * h < cols; h++) {
        __m256i out[Z_MR][2];
        for (int r = 0; r < rows; r++) {
            out[r][0] = _mm512_castsi512_si256(acc[r][h]);
            out[r][1] = _mm512_extracti64x4_epi64(acc[r][h], 1);
        }
        int hc = cols - 16 * h < 16 ? cols - 16 * h : 16;
        ql_finish_tile16_avx2(out, ep, colsum ? colsum + 16 * h : NULL, i0, j0 + 16 * h, rows, hc);
    }
}

/* The U8S8 R-panel packer of the VNNI levels' 32-column panels (avx512vnni, amx): AVX2's
 * 32-column ymm loop (ql_pack_R_panel_avx2: rows k..k+3 unpacked into 4-byte column groups,
 * vperm2i128 gathering each 16-column group), with the column sums by one vpdpbusd(1, v) per
 * 8 columns instead of vpmaddubsw + vpmaddwd + vpaddd: 1 * s8 products, four summed per
 * column and added in wrap32 (never vpdpbusds), the same sums. int8 b needs no flip (u8 b:
 * ^ 0x80 gives its s8 form), and the main loop runs whole k-groups without the per-row K
 * test. Anything else (narrow panels, strided b or zero points) goes to AVX2's packer. */
#ifndef QL_SIMDE
void ql_pack_R_panel_vnni(const void *src, int type, ptrdiff_t ks, ptrdiff_t cs, int K, int ncols,
                          const int32_t *zp, ptrdiff_t zp_s, int form, int nr, void *dst, int kp,
                          int32_t *colsums) {
    const int pair = ncols == 2 * nr;   /* two panels (ql_gemm_kernel.pack_R_pairs) */
    const int fast = form == QL_FORM_U8S8 && cs == 1 && nr == 32 && (zp_s == 0 || zp_s == 1);
    if (pair && !fast) {   /* one panel at a time */
        ql_pack_R_panel_vnni(src, type, ks, cs, K, nr, zp, zp_s, form, nr, dst, kp, colsums);
        ql_pack_R_panel_vnni((const char *)src + nr * cs, type, ks, cs, K, nr, zp ? zp + nr * zp_s : NULL,
                             zp_s, form, nr, (char *)dst + (size_t)kp * nr * (form == QL_FORM_I16 ? 2 : 1), kp,
                             colsums ? colsums + nr : NULL);
        return;
    }
    if (!fast || (ncols != 32 && !pair)) {
        ql_pack_R_panel_avx2(src, type, ks, cs, K, ncols, zp, zp_s, form, nr, dst, kp, colsums);
        return;
    }
    const uint8_t *s = (const uint8_t *)src;
    const __m256i fv = _mm256_set1_epi8((char)(type == QL_U8 ? 0x80 : 0)), one8 = _mm256_set1_epi8(1);
    __m256i sum[8];
    for (int t = 0; t < 8; t++) sum[t] = _mm256_setzero_si256();
    int8_t *d0 = (int8_t *)dst, *d1 = d0 + (size_t)kp * 32;
    const int kfull = K / 4 * 4;
    /* rows k..k+3, columns c..c+31 into the panel at d, sums into sum[h..h+3] */
#define PACK_STEP(LOAD, c, d, h)                                                                   \
    {                                                                                              \
        __m256i r[4];                                                                              \
        for (int t = 0; t < 4; t++) r[t] = LOAD(c);                                                \
        __m256i a01lo = _mm256_unpacklo_epi8(r[0], r[1]), a01hi = _mm256_unpackhi_epi8(r[0], r[1]); \
        __m256i a23lo = _mm256_unpacklo_epi8(r[2], r[3]), a23hi = _mm256_unpackhi_epi8(r[2], r[3]); \
        __m256i q0 = _mm256_unpacklo_epi16(a01lo, a23lo), q1 = _mm256_unpackhi_epi16(a01lo, a23lo); \
        __m256i q2 = _mm256_unpacklo_epi16(a01hi, a23hi), q3 = _mm256_unpackhi_epi16(a01hi, a23hi); \
        __m256i o[4] = {_mm256_permute2x128_si256(q0, q1, 0x20), _mm256_permute2x128_si256(q2, q3, 0x20), \
                        _mm256_permute2x128_si256(q0, q1, 0x31), _mm256_permute2x128_si256(q2, q3, 0x31)}; \
        int8_t *out = (d) + (ptrdiff_t)(k / 4) * 128;                                              \
        for (int t = 0; t < 4; t++) {                                                              \
            _mm256_storeu_si256((__m256i *)(out + 32 * t), o[t]);                                  \
            sum[(h) + t] = _mm256_dpbusd_epi32(sum[(h) + t], one8, o[t]);                          \
        }                                                                                          \
    }
#define LD_U8(c) _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(s + (ptrdiff_t)(k + t) * ks + (c))), fv)
#define LD_I8(c) _mm256_loadu_si256((const __m256i *)(s + (ptrdiff_t)(k + t) * ks + (c)))
#define LD_TAIL(c) (k + t < K ? LD_U8(c) : _mm256_setzero_si256())
    int k = 0;
    if (pair) {
        /* each row's 64 bytes (a whole line when aligned) read at one k step */
        if (type == QL_U8) {
            for (; k < kfull; k += 4) { PACK_STEP(LD_U8, 0, d0, 0) PACK_STEP(LD_U8, 32, d1, 4) }
        } else {
            for (; k < kfull; k += 4) { PACK_STEP(LD_I8, 0, d0, 0) PACK_STEP(LD_I8, 32, d1, 4) }
        }
        for (; k < kp; k += 4) { PACK_STEP(LD_TAIL, 0, d0, 0) PACK_STEP(LD_TAIL, 32, d1, 4) }
    } else {
        if (type == QL_U8) {
            for (; k < kfull; k += 4) PACK_STEP(LD_U8, 0, d0, 0)
        } else {
            for (; k < kfull; k += 4) PACK_STEP(LD_I8, 0, d0, 0)
        }
        /* the last partial k-group and K's padding: zero rows */
        for (; k < kp; k += 4) PACK_STEP(LD_TAIL, 0, d0, 0)
    }
#undef PACK_STEP
#undef LD_U8
#undef LD_I8
#undef LD_TAIL
    if (colsums)
        for (int t = 0; t < (pair ? 8 : 4); t++) _mm256_storeu_si256((__m256i *)(colsums + 8 * t), sum[t]);
}
#else
/* emulated builds (scripts/emulated_isa.sh): AVX2's packer, the same bytes and sums */
void ql_pack_R_panel_vnni(const void *src, int type, ptrdiff_t ks, ptrdiff_t cs, int K, int ncols,
                          const int32_t *zp, ptrdiff_t zp_s, int form, int nr, void *dst, int kp,
                          int32_t *colsums) {
    if (ncols == 2 * nr) {   /* a pair (pack_R_pairs): two panels, the same bytes and sums */
        ql_pack_R_panel_avx2(src, type, ks, cs, K, nr, zp, zp_s, form, nr, dst, kp, colsums);
        ql_pack_R_panel_avx2((const char *)src + nr * cs, type, ks, cs, K, nr, zp ? zp + nr * zp_s : NULL,
                             zp_s, form, nr, (char *)dst + (size_t)kp * nr * (form == QL_FORM_I16 ? 2 : 1), kp,
                             colsums ? colsums + nr : NULL);
        return;
    }
    ql_pack_R_panel_avx2(src, type, ks, cs, K, ncols, zp, zp_s, form, nr, dst, kp, colsums);
}
#endif

static const ql_gemm_kernel k_avx512vnni = {
    .name = "avx512vnni-u8s8", .mr = Z_MR, .nr = 32, .kpack = 4, .form = QL_FORM_U8S8,
    .kernel = avx512vnni_u8s8, .pack_L = ql_pack_L_avx2, .pack_R = ql_pack_R_panel_vnni,
    .kernel_ep = avx512vnni_u8s8_ep, .conv = {QL_BYTE_PACKERS_AVX512},
    .pack_R_pairs = 1,
};

/* ---------------------------------------------------------------------------------------
 * avx512vnni-s8u8: the convolutions' implicit GEMM (the convolutions' S8U8 form), 16 rows x 16 columns.
 *
 * A k-group's operand is 16 columns x 4 u8-form bytes = 64 bytes: ONE zmm load, which every
 * row's vpdpbusd then uses as its unsigned source, with the row's 4 centered weights (int8)
 * broadcast (vpbroadcastd) as the signed one. Exactness: each lane adds 4 products
 * |u8 * s8| <= 255 * 128 = 32640 to the int32 accumulator, exactly and with wraparound
 * (wrap32), no intermediate saturation (that is vpdpbusds, never used): every int8 weight is
 * safe, s8_bound 128 (AVX2's vpmaddubsw needs |w - zw| <= 64).
 * Why 16 rows (QL_MAX_MR): one accumulator per row, so 16 accumulators + the operand + the
 * broadcast = 18 of the 32 zmm; a k-group is 1 operand load + 16 broadcast loads for 16
 * vpdpbusd, the most rows per operand load the tile interface allows, and 16 independent
 * accumulation chains, more than vpdpbusd's latency x throughput (about 5 cycles x 2 a
 * cycle) needs to keep both pipes busy. Channel counts are multiples of 16 in most networks
 * (12 rows would cut 64 channels into 6 tiles, the last of 4 rows). Row tiles of at most 8
 * rows (a layer's last) run an 8-row body instead of 16 rows of which half are dropped.
 * Tiles of exactly 16 or 8 rows take z_s8u8_body_full (embedded broadcasts, no row-pointer
 * reloads); measured on an Intel Xeon (AVX-512 VNNI + AMX) in docs/engine.md.
 * ------------------------------------------------------------------------------------- */
#define ZS_MR 16
/* the 16 named accumulators of both tile bodies below, and their copy to out[] (the first 8
 * for an 8-row tile) */
#define ZS_ACC_DECL                                                                             \
    __m512i c0 = _mm512_setzero_si512(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0, \
            c8 = c0, c9 = c0, c10 = c0, c11 = c0, c12 = c0, c13 = c0, c14 = c0, c15 = c0;
#define ZS_ACC_OUT                                                                              \
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3; out[4] = c4; out[5] = c5; out[6] = c6; out[7] = c7; \
    if (mr > 8) {                                                                               \
        out[8] = c8; out[9] = c9; out[10] = c10; out[11] = c11;                                 \
        out[12] = c12; out[13] = c13; out[14] = c14; out[15] = c15;                             \
    }
#define ZS_ROW(r)                                                                               \
    memcpy(&v, l[r] + 4 * (g), 4);                                                              \
    c##r = _mm512_dpbusd_epi32(c##r, b_, _mm512_set1_epi32(v));
#define ZS_GROUP(src, g)                                                                        \
    {                                                                                           \
        const __m512i b_ = _mm512_loadu_si512((const void *)(src));                             \
        int32_t v;                                                                              \
        ZS_ROW(0) ZS_ROW(1) ZS_ROW(2) ZS_ROW(3) ZS_ROW(4) ZS_ROW(5) ZS_ROW(6) ZS_ROW(7)         \
        if (mr > 8) {                                                                           \
            ZS_ROW(8) ZS_ROW(9) ZS_ROW(10) ZS_ROW(11) ZS_ROW(12) ZS_ROW(13) ZS_ROW(14) ZS_ROW(15) \
        }                                                                                       \
    }
/* group g's operand at `base + 64 g` (a packed im2col panel, off NULL) or `base + off[g]`
 * (implicit GEMM, prefetched): AVX2's loop (IK_GROUP_LOOP, simd_common_avx2.h). Named
 * accumulators, not an array: gcc 12 then keeps all 16 in registers across the unrolled
 * k-groups (with an array it shuffled and spilled them). */
static inline __attribute__((always_inline)) void
z_s8u8_body(const void *L, ptrdiff_t ldl, const char *base, const ptrdiff_t *off, int groups, int rows,
            __m512i *out, const int mr) {
    const char *l[ZS_MR];
    for (int r = 0; r < mr; r++)   /* missing tail rows re-read row 0; results dropped */
        l[r] = (const char *)L + (r < rows ? r : 0) * ldl;
    ZS_ACC_DECL
    IK_GROUP_LOOP(ZS_GROUP)
    ZS_ACC_OUT
}
#undef ZS_ROW
#undef ZS_GROUP

#ifndef QL_SIMDE
/* The same k-group loop for a tile of exactly 8 or 16 rows (mr), written so that it issues no
 * more loads than the arithmetic needs. Each row's weights are a memory operand of its
 * vpdpbusd with embedded broadcast ({1to16}: the 4 bytes at the address in every lane, the same
 * values _mm512_set1_epi32 gives the intrinsic body above; gcc 12 has no pattern for it, hence
 * the asm), one micro-fused load+multiply-add instead of a vpbroadcastd and a vpdpbusd; and
 * the 16 rows are addressed from two pointers (rows 0-7 at q, 8-15 at q8 = q + 8 ldl) and
 * three strides: row k of a block at q + {0, 1, 2, 4} ldl, q + {1, 2} (3 ldl), q + 5 ldl,
 * q + 7 ldl (x86 base + index * scale), instead of 16 row pointers, of which gcc kept a few on
 * the stack and reloaded them every k-group (about 5 scalar loads a group beside 17 vector
 * ones; measured on an Intel Xeon: docs/engine.md). q and q8 step 4 bytes a group. The
 * accumulators are asm operands ("+v"), so gcc keeps them in zmm registers; the operand b_ is
 * loaded by an intrinsic. Every byte read is within the tile's mr rows' kp bytes. */
#define ZS_DP(c, addr) "vpdpbusd " addr "%{1to16%}, %[b], %[" #c "]\n\t"
#define ZS_ASM8(q, c0, c1, c2, c3, c4, c5, c6, c7)                                                \
    ZS_DP(c0, "(%[" #q "])") ZS_DP(c1, "(%[" #q "],%[s1],1)") ZS_DP(c2, "(%[" #q "],%[s1],2)")       \
    ZS_DP(c3, "(%[" #q "],%[s3],1)") ZS_DP(c4, "(%[" #q "],%[s1],4)") ZS_DP(c5, "(%[" #q "],%[s5],1)") \
    ZS_DP(c6, "(%[" #q "],%[s3],2)") ZS_DP(c7, "(%[" #q "],%[s7],1)")
/* one asm statement per 8 rows ("+v" operands count twice against gcc's limit of 30) */
#define ZS_ASM_BLOCK(q, c0, c1, c2, c3, c4, c5, c6, c7)                                          \
    __asm__(ZS_ASM8(q, c0, c1, c2, c3, c4, c5, c6, c7)                                           \
            : [c0] "+v"(c0), [c1] "+v"(c1), [c2] "+v"(c2), [c3] "+v"(c3), [c4] "+v"(c4),          \
              [c5] "+v"(c5), [c6] "+v"(c6), [c7] "+v"(c7)                                        \
            : [b] "v"(b_), [q] "r"(q), [s1] "r"(s1), [s3] "r"(s3), [s5] "r"(s5), [s7] "r"(s7)    \
            : "memory");
#define ZS_GROUP_ASM(src, g)                                                                    \
    {                                                                                           \
        const __m512i b_ = _mm512_loadu_si512((const void *)(src));                             \
        ZS_ASM_BLOCK(q, c0, c1, c2, c3, c4, c5, c6, c7)                                         \
        if (mr > 8) ZS_ASM_BLOCK(q8, c8, c9, c10, c11, c12, c13, c14, c15)                      \
        q += 4;                                                                                 \
        q8 += 4;                                                                                \
    }
static inline __attribute__((always_inline)) void
z_s8u8_body_full(const void *L, ptrdiff_t ldl, const char *base, const ptrdiff_t *off, int groups,
                 __m512i *out, const int mr) {
    /* q8 only for 16 rows: an 8-row tile's L may end at row 8 */
    const char *q = (const char *)L, *q8 = mr > 8 ? q + 8 * ldl : q;
    const ptrdiff_t s1 = ldl, s3 = 3 * ldl, s5 = 5 * ldl, s7 = 7 * ldl;
    ZS_ACC_DECL
    IK_GROUP_LOOP(ZS_GROUP_ASM)
    ZS_ACC_OUT
}
#undef ZS_DP
#undef ZS_ASM8
#undef ZS_GROUP_ASM
#undef ZS_ASM_BLOCK
#endif

static inline __attribute__((always_inline)) void
z_s8u8_tile(const void *L, ptrdiff_t ldl, const char *base, const ptrdiff_t *off, int groups, int rows,
            __m512i *out) {
#ifndef QL_SIMDE
    if (rows == ZS_MR) {
        z_s8u8_body_full(L, ldl, base, off, groups, out, ZS_MR);
        return;
    }
    if (rows == 8) {
        z_s8u8_body_full(L, ldl, base, off, groups, out, 8);
        return;
    }
#endif
    if (rows > 8)
        z_s8u8_body(L, ldl, base, off, groups, rows, out, ZS_MR);
    else
        z_s8u8_body(L, ldl, base, off, groups, rows, out, 8);
}

static void z_store(const __m512i *out, int32_t *C, ptrdiff_t ldc, int rows) {
    for (int r = 0; r < rows; r++) _mm512_storeu_si512((void *)(C + r * ldc), out[r]);
}

/* a packed 16-column panel (the im2col fallback: a geometry the implicit path declines) */
static void avx512vnni_s8u8(const void *L, ptrdiff_t ldl, const void *Rpanel, int kp,
                            int32_t *C, ptrdiff_t ldc, int rows) {
    __m512i out[ZS_MR];
    z_s8u8_tile(L, ldl, (const char *)Rpanel, NULL, kp / 4, rows, out);
    z_store(out, C, ldc, rows);
}

static void avx512vnni_s8u8_ik(const void *L, ptrdiff_t ldl, const char *base, const ptrdiff_t *off,
                               int groups, int32_t *C, ptrdiff_t ldc, int rows) {
    __m512i out[ZS_MR];
    z_s8u8_tile(L, ldl, base, off, groups, rows, out);
    z_store(out, C, ldc, rows);
}

/* The implicit kernels' epilogue from the accumulators (ql_ikernel_ep_fn), one zmm per row:
 * ql_ik_epilogue_avx2's instructions at 16 lanes, so the same bits as every level's epilogue:
 * vpaddd bias (wrap32), vcvtdq2ps (float32(acc), round to nearest even), vmulps (one float32
 * multiply: nothing to contract, -ffp-contract=off), vmaxps(v, lo) then vminps(., hi) (lo for
 * a NaN v, the second operand, as ql_epilogue_avx2), vcvtps2dq under the default MXCSR (round
 * to nearest even, as nearbyintf), vpaddd zp: int32 within T's range, so vpmovdb's truncation
 * to the low byte is the value itself (int8 as two's complement, uint8 as is), which is what
 * AVX2's saturating packs of in-range values give. A whole-tile run: one 16-byte (int32: one
 * 64-byte) store per row; other runs through a row buffer, as AVX2's. */
static inline __attribute__((always_inline)) void
z_ik_epilogue_b(const __m512i *acc, const ql_epilogue *ep, const ql_ik_runs *rn, int i0, int rows,
                const int add_bias) {
#ifdef QL_SIMDE
    /* Debian's SIMDe lacks some of the 16-lane conversions (vcvtps2dq, vpmovdb): the emulated
     * build hands each row to AVX2's epilogue as its two ymm halves, the same instructions at 8
     * lanes (the 16-lane code is checked natively) */
    __m256i out[ZS_MR][2];
    (void)add_bias;   /* always 1 under SIMDe (avx512vnni_s8u8_ik2_ep) */
    for (int r = 0; r < rows; r++) {
        out[r][0] = _mm512_castsi512_si256(acc[r]);
        out[r][1] = _mm512_extracti64x4_epi64(acc[r], 1);
    }
    ql_ik_epilogue_avx2(out, ep, rn, i0, rows);
#else
    const int32_t *row_bias = add_bias ? ep->row_bias : NULL;
    const ptrdiff_t out_rs = ep->out_rs;
    const int whole = rn->n == 1 && rn->len[0] == QL_IK_NR;
    if (!ep->quantized) {
        int32_t *o = (int32_t *)ep->out + (ptrdiff_t)i0 * out_rs;
        for (int r = 0; r < rows; r++) {
            __m512i a = row_bias ? _mm512_add_epi32(acc[r], _mm512_set1_epi32(row_bias[i0 + r])) : acc[r];
            int32_t *orow = o + r * out_rs;
            if (whole) {
                _mm512_storeu_si512((void *)(orow + rn->pix[0]), a);
                continue;
            }
            int32_t t[QL_IK_NR];
            _mm512_storeu_si512((void *)t, a);
            for (int k = 0; k < rn->n; k++)
                memcpy(orow + rn->pix[k], t + rn->col[k], sizeof(int32_t) * (size_t)rn->len[k]);
        }
        return;
    }
    const float *mult = ep->mult;
    const ptrdiff_t mult_rs = ep->mult_rs;
    char *o = (char *)ep->out + (ptrdiff_t)i0 * out_rs;
    const __m512 lo = _mm512_set1_ps(ep->lo), hi = _mm512_set1_ps(ep->hi);
    const __m512i zp = _mm512_set1_epi32(ep->zp);
    for (int r = 0; r < rows; r++) {
        __m512i a = row_bias ? _mm512_add_epi32(acc[r], _mm512_set1_epi32(row_bias[i0 + r])) : acc[r];
        __m128i p8 = _mm512_cvtepi32_epi8(
            ql_requant16_avx512(a, _mm512_set1_ps(mult[(ptrdiff_t)(i0 + r) * mult_rs]), lo, hi, zp));
        ql_ik_store8(o + r * out_rs, p8, rn, whole);
    }
#endif
}

static inline __attribute__((always_inline)) void
z_ik_epilogue(const __m512i *acc, const ql_epilogue *ep, const ql_ik_runs *rn, int i0, int rows) {
    z_ik_epilogue_b(acc, ep, rn, i0, rows, 1);
}

void ql_ik_epilogue_avx512(const int32_t *C, ptrdiff_t ldc, const ql_epilogue *ep, const ql_ik_runs *rn,
                           int i0, int rows) {
    __m512i acc[ZS_MR];
    for (int r0 = 0; r0 < rows; r0 += ZS_MR) {
        int n = rows - r0 < ZS_MR ? rows - r0 : ZS_MR;
        for (int r = 0; r < n; r++) acc[r] = _mm512_loadu_si512((const void *)(C + (ptrdiff_t)(r0 + r) * ldc));
        z_ik_epilogue(acc, ep, rn, i0 + r0, n);
    }
}

static void avx512vnni_s8u8_ik_ep(const void *L, ptrdiff_t ldl, const char *base, const ptrdiff_t *off,
                                  int groups, const ql_epilogue *ep, const ql_ik_runs *rn, int i0, int rows) {
    __m512i acc[ZS_MR];
    z_s8u8_tile(L, ldl, base, off, groups, rows, acc);
    z_ik_epilogue(acc, ep, rn, i0, rows);
}

/* Two adjacent tiles at once (ikernel2_ep; conv/implicit_run.c pairs a task's two full 16-column tiles of
 * one image): 8 rows x 32 columns per pass, the second tile's operand 64 bytes after the
 * first's. A k-group is then 2 operand loads and 8 weight broadcasts (vpbroadcastd into a
 * register, each used by both tiles' vpdpbusd) for 16 vpdpbusd: 10 loads, against the single
 * tile's 1 + 16 (one embedded broadcast per vpdpbusd) for the same 16, which is what bound the
 * single tile on an AVX-512 VNNI CPU (2 loads and 2 vpdpbusd a cycle). Same operands and
 * products as the single tile (vpdpbusd: u8-form operand unsigned, centered int8 weight
 * signed, wrap32), so the same sums. Rows 0-7 then 8-15 of a 16-row tile; a tile of other
 * row counts (a layer's last) runs the single-tile kernel on each tile. Rows are addressed as
 * q + {0, 1, 2, 3, 4, 5, 6, 7} ldl through the strides s1, s3, s5, s7 (z_s8u8_body_full's
 * scheme): no row pointers to spill. */
#define ZP_ROW(r, addr)                                                                         \
    {                                                                                           \
        int32_t v;                                                                              \
        memcpy(&v, addr, 4);                                                                    \
        const __m512i w = _mm512_set1_epi32(v);                                                 \
        p##r##a = _mm512_dpbusd_epi32(p##r##a, b0, w);                                          \
        p##r##b = _mm512_dpbusd_epi32(p##r##b, b1, w);                                          \
    }
#define ZP_GROUP(src)                                                                           \
    {                                                                                           \
        const char *src_ = (src);                                                               \
        const __m512i b0 = _mm512_loadu_si512((const void *)src_);                              \
        const __m512i b1 = _mm512_loadu_si512((const void *)(src_ + 64));                       \
        ZP_ROW(0, q) ZP_ROW(1, q + s1) ZP_ROW(2, q + 2 * s1) ZP_ROW(3, q + s3)                  \
        ZP_ROW(4, q + 4 * s1) ZP_ROW(5, q + s5) ZP_ROW(6, q + 2 * s3) ZP_ROW(7, q + s7)         \
        q += 4;                                                                                 \
    }
#ifndef QL_SIMDE
/* The same k-group in asm: row r's 4 weight bytes broadcast once into a scratch register (w)
 * and used by both tiles' vpdpbusd (AT&T order: weights, the signed source; the tile's operand,
 * the unsigned one; the accumulator), the operands b0 and b1 the intrinsic ZP_GROUP loads. The
 * accumulators are "+v" operands, 4 rows (8 zmm) per statement (gcc's limit of 30 operands,
 * "+v" counting twice): written with the intrinsics, gcc 12 copied every accumulator to a
 * fresh register and back around each vpdpbusd and spilled two of them to the stack every
 * k-group (3 instructions a product instead of 1; measured on ResNet-50's 1x1 layers, Zen 4).
 * Same instructions on the same operands as ZP_GROUP: the same sums. */
#define ZP_DP2(addr, ca, cb)                                                                    \
    "vpbroadcastd " addr ", %[w]\n\t"                                                            \
    "vpdpbusd %[w], %[b0], %[" #ca "]\n\t"                                                       \
    "vpdpbusd %[w], %[b1], %[" #cb "]\n\t"
#define ZP_ASM4(a0, a1, a2, a3, x0, x1, x2, x3)                                               \
    {                                                                                           \
        __m512i w_;                                                                             \
        __asm__(ZP_DP2(a0, c0, d0) ZP_DP2(a1, c1, d1) ZP_DP2(a2, c2, d2) ZP_DP2(a3, c3, d3)    \
                : [c0] "+v"(p##x0##a), [d0] "+v"(p##x0##b), [c1] "+v"(p##x1##a), [d1] "+v"(p##x1##b), \
                  [c2] "+v"(p##x2##a), [d2] "+v"(p##x2##b), [c3] "+v"(p##x3##a), [d3] "+v"(p##x3##b), \
                  [w] "=&v"(w_)                                                                 \
                : [b0] "v"(b0), [b1] "v"(b1), [q] "r"(q), [s1] "r"(s1), [s3] "r"(s3), [s5] "r"(s5), \
                  [s7] "r"(s7)                                                                  \
                : "memory");                                                                    \
    }
#define ZP_GROUP_ASM(src)                                                                       \
    {                                                                                           \
        const char *src_ = (src);                                                               \
        const __m512i b0 = _mm512_loadu_si512((const void *)src_);                              \
        const __m512i b1 = _mm512_loadu_si512((const void *)(src_ + 64));                       \
        ZP_ASM4("(%[q])", "(%[q],%[s1],1)", "(%[q],%[s1],2)", "(%[q],%[s3],1)", 0, 1, 2, 3)      \
        ZP_ASM4("(%[q],%[s1],4)", "(%[q],%[s5],1)", "(%[q],%[s3],2)", "(%[q],%[s7],1)", 4, 5, 6, 7) \
        q += 4;                                                                                 \
    }
#endif
static inline __attribute__((always_inline)) void
z_pair8(const char *q, ptrdiff_t ldl, const char *base, const ptrdiff_t *off, int groups, const int32_t *bias,
        __m512i *t0, __m512i *t1) {
    const ptrdiff_t s1 = ldl, s3 = 3 * ldl, s5 = 5 * ldl, s7 = 7 * ldl;
    /* the accumulators start at the rows' bias (bias: the 8 rows' terms, or NULL for none): the
     * epilogue's vpaddd moved here, the same wrap32 sum in another order (wrap32 addition is
     * associative and commutative) */
#define ZP_INIT(r) p##r##a = p##r##b = bias ? _mm512_set1_epi32(bias[r]) : _mm512_setzero_si512();
    __m512i p0a, p0b, p1a, p1b, p2a, p2b, p3a, p3b, p4a, p4b, p5a, p5b, p6a, p6b, p7a, p7b;
    ZP_INIT(0) ZP_INIT(1) ZP_INIT(2) ZP_INIT(3) ZP_INIT(4) ZP_INIT(5) ZP_INIT(6) ZP_INIT(7)
#undef ZP_INIT
    const ptrdiff_t ng = groups;
    ptrdiff_t g = 0;
#ifndef QL_SIMDE
#define ZP_GROUP_K ZP_GROUP_ASM
#else
#define ZP_GROUP_K ZP_GROUP
#endif
    for (; g < ng - IK_PREFETCH; g++) {
        const char *pf = base + off[g + IK_PREFETCH];
        _mm_prefetch(pf, _MM_HINT_T0);
        _mm_prefetch(pf + 64, _MM_HINT_T0);
        _mm_prefetch(pf + 127, _MM_HINT_T0);
        ZP_GROUP_K(base + off[g])
    }
    for (; g < ng; g++) ZP_GROUP_K(base + off[g])
#undef ZP_GROUP_K
    t0[0] = p0a; t0[1] = p1a; t0[2] = p2a; t0[3] = p3a; t0[4] = p4a; t0[5] = p5a; t0[6] = p6a; t0[7] = p7a;
    t1[0] = p0b; t1[1] = p1b; t1[2] = p2b; t1[3] = p3b; t1[4] = p4b; t1[5] = p5b; t1[6] = p6b; t1[7] = p7b;
}
#undef ZP_ROW
#undef ZP_GROUP
#ifndef QL_SIMDE
#undef ZP_DP2
#undef ZP_ASM4
#undef ZP_GROUP_ASM
#endif

#ifndef QL_SIMDE
/* The 8-bit epilogue of two adjacent whole tiles whose 32 columns are 32 consecutive output
 * pixels of each row (the common case: a 16-column tile pair inside a plane whose rows are
 * not cut), 8 rows, the bias already in the accumulators (z_pair8): ql_requant16_avx512 on
 * each tile row as z_ik_epilogue does, then the low bytes of 4 tile rows (rows r and r + 1,
 * both tiles) in one zmm: vpackusdw / vpackssdw then vpackuswb / vpacksswb, by the output's
 * signedness. The packs saturate only values outside the output type, and there are none:
 * the clamp to [lo, hi] and the zero point leave values of the type (the int32 -> int16 step
 * keeps every such value, the int16 -> 8-bit step too), so each byte is the value
 * vpmovdb's truncation gives. The packs interleave 4-lane groups per 128-bit lane; one vpermd
 * puts each tile row's 16 bytes in order, and rows r and r + 1 are the low and high 32 bytes
 * (one 32-byte store each instead of two 16-byte ones, and 4 pack/permute operations for 4
 * tile rows instead of 4 vpmovdb of 2 operations each). */
static inline __attribute__((always_inline)) void
z_ik2_epilogue_whole(const __m512i *t0, const __m512i *t1, const ql_epilogue *ep, ptrdiff_t pix, int i0) {
    const float *mult = ep->mult;
    const ptrdiff_t mult_rs = ep->mult_rs, out_rs = ep->out_rs;
    char *o = (char *)ep->out + (ptrdiff_t)i0 * out_rs + pix;
    const __m512 lo = _mm512_set1_ps(ep->lo), hi = _mm512_set1_ps(ep->hi);
    const __m512i zp = _mm512_set1_epi32(ep->zp);
    /* dword k of the packed zmm: lane k / 4's dword k % 4, which holds 4 columns of row (k % 4)
     * / 2's tile (k % 2) (pack order: a, b per lane, then the two rows' words): ordered rows
     * r then r + 1, each tile 0 then tile 1, columns ascending */
    const __m512i perm = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const int is_signed = ep->out_is_signed;
    for (int r = 0; r < 8; r += 2) {
        const __m512 m0 = _mm512_set1_ps(mult[(ptrdiff_t)(i0 + r) * mult_rs]);
        const __m512 m1 = _mm512_set1_ps(mult[(ptrdiff_t)(i0 + r + 1) * mult_rs]);
        __m512i a0 = ql_requant16_avx512(t0[r], m0, lo, hi, zp), b0 = ql_requant16_avx512(t1[r], m0, lo, hi, zp);
        __m512i a1 = ql_requant16_avx512(t0[r + 1], m1, lo, hi, zp), b1 = ql_requant16_avx512(t1[r + 1], m1, lo, hi, zp);
        __m512i v;
        if (is_signed)
            v = _mm512_packs_epi16(_mm512_packs_epi32(a0, b0), _mm512_packs_epi32(a1, b1));
        else
            v = _mm512_packus_epi16(_mm512_packus_epi32(a0, b0), _mm512_packus_epi32(a1, b1));
        v = _mm512_permutexvar_epi32(perm, v);
        _mm256_storeu_si256((__m256i *)(o + r * out_rs), _mm512_castsi512_si256(v));
        _mm256_storeu_si256((__m256i *)(o + (r + 1) * out_rs), _mm512_extracti64x4_epi64(v, 1));
    }
}
#endif

static void avx512vnni_s8u8_ik2_ep(const void *L, ptrdiff_t ldl, const char *base, const ptrdiff_t *off,
                                   int groups, const ql_epilogue *ep, const ql_ik_runs *rn, int i0, int rows) {
    if (rows != 8 && rows != ZS_MR) {
        avx512vnni_s8u8_ik_ep(L, ldl, base, off, groups, ep, &rn[0], i0, rows);
        avx512vnni_s8u8_ik_ep(L, ldl, base + 64, off, groups, ep, &rn[1], i0, rows);
        return;
    }
#ifndef QL_SIMDE
    const int whole2 = ep->quantized && rn[0].n == 1 && rn[0].len[0] == QL_IK_NR && rn[1].n == 1 &&
                       rn[1].len[0] == QL_IK_NR && rn[1].pix[0] == rn[0].pix[0] + QL_IK_NR;
    for (int r0 = 0; r0 < rows; r0 += 8) {
        __m512i t0[8], t1[8];
        z_pair8((const char *)L + (ptrdiff_t)r0 * ldl, ldl, base, off, groups,
                ep->row_bias ? ep->row_bias + i0 + r0 : NULL, t0, t1);
        if (whole2) {
            z_ik2_epilogue_whole(t0, t1, ep, rn[0].pix[0], i0 + r0);
            continue;
        }
        z_ik_epilogue_b(t0, ep, &rn[0], i0 + r0, 8, 0);
        z_ik_epilogue_b(t1, ep, &rn[1], i0 + r0, 8, 0);
    }
#else
    for (int r0 = 0; r0 < rows; r0 += 8) {
        __m512i t0[8], t1[8];
        z_pair8((const char *)L + (ptrdiff_t)r0 * ldl, ldl, base, off, groups, NULL, t0, t1);
        z_ik_epilogue(t0, ep, &rn[0], i0 + r0, 8);
        z_ik_epilogue(t1, ep, &rn[1], i0 + r0, 8);
    }
#endif
}

/* ---------------------------------------------------------------------------------------
 * Dot kernels (ql_dot_fn) for a last tile of at most QL_DOT_NR real columns (a 7x7 plane's
 * 49 = 3*16 + 1, 14x14's 196 = 12*16 + 4): C[r][c] = sum over k of L row r times gathered
 * column c, 64 bytes of k a step: vpdpbusd(acc[r][c], column c (u8 form, the unsigned
 * source), L row r (centered int8 weights, the signed source)), so each lane adds the same 4
 * products |u8 * s8| <= 255 * 128 as the tile kernel's, exactly and with wraparound (no
 * vpdpbusds), any int8 weight; then the 16 lanes added (vpaddd, wrapping). Only the order of
 * the wrap32 additions differs from the tile kernel's, and wrap32 addition is associative and
 * commutative: the same sums. One vpdpbusd per (row, column, 64 bytes of k) is the tile
 * kernel's cost per real column (16 per row per 16 k-groups for 16 columns), against a full
 * tile's 16 columns for 1-8 real ones. Blocks of RB rows x CB columns, RB * CB = 16
 * accumulators (CB = 1, 2 or 4 by ncols: 16 independent chains even for one column, a 7x7
 * plane's 49th). The last kbytes % 64 bytes of each row and column are loaded masked (an L
 * row is read only within kbytes, a column within kbytes rounded up to 32).
 * ------------------------------------------------------------------------------------- */
/* the first rem (< 64) bytes at p, zero-extended to 64: a masked load natively (masked-off
 * bytes are neither read nor able to fault), a zero-padded copy under SIMDe (whose emulation
 * may read the whole 64 bytes) */
static inline __attribute__((always_inline)) __m512i z_load_rem(const char *p, int rem) {
#ifdef QL_SIMDE
    uint8_t b[64] = {0};
    memcpy(b, p, (size_t)rem);
    return _mm512_loadu_si512((const void *)b);
#else
    return _mm512_maskz_loadu_epi8((__mmask64)((1ULL << rem) - 1), (const void *)p);
#endif
}

/* 16 vectors' horizontal sums as one vector, lane e = the sum of a[e]'s 16 lanes: pairs
 * interleaved and added (dwords, then qwords, then 128-bit lanes twice), vpaddd throughout
 * (wrapping: the order of wrap32 additions does not change the sum) */
static inline __attribute__((always_inline)) __m512i z_hsum16(const __m512i *a) {
    __m512i u[8], v[4], w[2];
    for (int i = 0; i < 8; i++)   /* per 128-bit lane: a0 p0, a1 p0, a0 p1, a1 p1 */
        u[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(a[2 * i], a[2 * i + 1]),
                                _mm512_unpackhi_epi32(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 4; i++)   /* per 128-bit lane: the lane's sums of a[4i..4i+3] */
        v[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(u[2 * i], u[2 * i + 1]),
                                _mm512_unpackhi_epi64(u[2 * i], u[2 * i + 1]));
    for (int i = 0; i < 2; i++)   /* lanes 0+1, 2+3 of v[2i], then of v[2i + 1] */
        w[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(v[2 * i], v[2 * i + 1], 0x88),
                                _mm512_shuffle_i32x4(v[2 * i], v[2 * i + 1], 0xDD));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(w[0], w[1], 0x88), _mm512_shuffle_i32x4(w[0], w[1], 0xDD));
}

static inline __attribute__((always_inline)) void
z_dot_block(const char *const *l, const char *const *x, int kbytes, int32_t (*t)[QL_IK_NR], int r0, int c0,
            int rows, int ncols, const int RB, const int CB) {
    __m512i acc[16];
    for (int e = 0; e < 16; e++) acc[e] = _mm512_setzero_si512();
    const int n64 = kbytes / 64, rem = kbytes % 64;
    for (int k = 0; k <= n64; k++) {
        if (k == n64 && !rem) break;
        __m512i xv[4];
        for (int c = 0; c < CB; c++)
            xv[c] = k < n64 ? _mm512_loadu_si512((const void *)(x[c] + 64 * (ptrdiff_t)k))
                            : z_load_rem(x[c] + 64 * (ptrdiff_t)k, rem);
        for (int r = 0; r < RB; r++) {
            __m512i w = k < n64 ? _mm512_loadu_si512((const void *)(l[r] + 64 * (ptrdiff_t)k))
                                : z_load_rem(l[r] + 64 * (ptrdiff_t)k, rem);
            for (int c = 0; c < CB; c++) acc[r * CB + c] = _mm512_dpbusd_epi32(acc[r * CB + c], xv[c], w);
        }
    }
    int32_t sv[16];
    _mm512_storeu_si512((void *)sv, z_hsum16(acc));
    for (int r = 0; r < RB && r0 + r < rows; r++)
        for (int c = 0; c < CB && c0 + c < ncols; c++) t[r0 + r][c0 + c] = sv[r * CB + c];
}

/* The product of rows <= ZS_MR rows and ncols <= QL_DOT_NR columns into t[r][c] (t zeroed by the
 * caller; columns >= ncols stay 0). Missing rows and columns of a block re-read row / column 0;
 * their sums are dropped. */
static inline __attribute__((always_inline)) void
z_dot_body(const void *L, ptrdiff_t ldl, const void *X, ptrdiff_t xs, int kbytes, int ncols,
           int32_t (*t)[QL_IK_NR], int rows, const int CB) {
    const int RB = 16 / CB;
    for (int r0 = 0; r0 < rows; r0 += RB)
        for (int c0 = 0; c0 < ncols; c0 += CB) {
            const char *l[16], *x[4];
            for (int r = 0; r < RB; r++) l[r] = (const char *)L + (r0 + r < rows ? r0 + r : 0) * ldl;
            for (int c = 0; c < CB; c++) x[c] = (const char *)X + (c0 + c < ncols ? c0 + c : 0) * xs;
            z_dot_block(l, x, kbytes, t, r0, c0, rows, ncols, RB, CB);
        }
}

static void z_dot_tile(const void *L, ptrdiff_t ldl, const void *X, ptrdiff_t xs, int kbytes, int ncols,
                       int32_t (*t)[QL_IK_NR], int rows) {
    if (ncols == 1)
        z_dot_body(L, ldl, X, xs, kbytes, ncols, t, rows, 1);
    else if (ncols == 2)
        z_dot_body(L, ldl, X, xs, kbytes, ncols, t, rows, 2);
    else
        z_dot_body(L, ldl, X, xs, kbytes, ncols, t, rows, 4);
}

static void avx512vnni_s8u8_dot(const void *L, ptrdiff_t ldl, const void *X, ptrdiff_t xs, int kbytes, int ncols,
                                int32_t *C, ptrdiff_t ldc, int rows) {
    int32_t t[ZS_MR][QL_IK_NR] = {{0}};
    z_dot_tile(L, ldl, X, xs, kbytes, ncols, t, rows);
    for (int r = 0; r < rows; r++) memcpy(C + r * ldc, t[r], sizeof(int32_t) * (size_t)ncols);
}

/* the dot kernel with the fused epilogue: the sums as the low columns of a tile (runs end
 * before ncols) */
static void avx512vnni_s8u8_dot_ep(const void *L, ptrdiff_t ldl, const void *X, ptrdiff_t xs, int kbytes,
                                   int ncols, const ql_epilogue *ep, const ql_ik_runs *rn, int i0, int rows) {
    int32_t t[ZS_MR][QL_IK_NR] = {{0}};
    z_dot_tile(L, ldl, X, xs, kbytes, ncols, t, rows);
    __m512i acc[ZS_MR];
    for (int r = 0; r < rows; r++) acc[r] = _mm512_loadu_si512((const void *)t[r]);
    z_ik_epilogue(acc, ep, rn, i0, rows);
}

/* No narrow tile kernels (tail_nr 0): the implicit path's narrow last tiles run the dot kernels
 * above, merged tail panels the full tile; no fused im2col epilogue (kernel_ep). */
static const ql_gemm_kernel k_avx512vnni_s8u8 = {
    .name = "avx512vnni-s8u8", .mr = ZS_MR, .nr = 16, .kpack = 4, .form = QL_FORM_S8U8,
    .kernel = avx512vnni_s8u8,
    .conv = {.ikernel = avx512vnni_s8u8_ik, .ikernel_ep = avx512vnni_s8u8_ik_ep,
             .ikernel2_ep = avx512vnni_s8u8_ik2_ep,
             .dot = avx512vnni_s8u8_dot, .dot_ep = avx512vnni_s8u8_dot_ep,
             .s8_bound = 128,   /* vpdpbusd: any int8 weight (above) */
             QL_BYTE_PACKERS_AVX512},
};

const ql_isa ql_isa_avx512vnni = {
    "avx512vnni", &k_avx512vnni, NULL, 1, ql_epilogue_avx2, ql_quantize_avx2, ql_dequantize_avx2,
    &k_avx512vnni_s8u8, ql_dw_rows_avx2, ql_dw_cl_avx2,
    .dw_t16 = ql_dw_t16_avx2, .dw_store32 = ql_dw_store_avx2,
};
#endif
