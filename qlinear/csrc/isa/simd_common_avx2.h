/* The 256-bit epilogue, QuantizeLinear and DequantizeLinear, and the implicit-GEMM kernels'
 * k-group loop and register epilogue, included (as static functions and macros) by each x86
 * kernel file after its #pragma GCC target, so each level carries its own copy.
 * Bit-identical to epilogue.c / kernels_scalar.c:
 *   cvtdq2ps == (float)int32 (round to nearest even), mulps == one float32 multiply,
 *   maxps(v, lo) returns lo when v is NaN (the second operand), as `!(v >= lo)` does,
 *   cvtps2dq rounds to nearest even under the default MXCSR, as nearbyintf does,
 *   vpmulld keeps the low 32 bits of the product: the wrap32 product.
 * After the clamp, values are integers of T's range, so the saturating packs never saturate. */
#ifndef QL_SIMD_COMMON_AVX2_H
#define QL_SIMD_COMMON_AVX2_H

#include <string.h>

static inline void store8_i32(void *out, int is_signed, __m256i q) {
    __m128i lo4 = _mm256_castsi256_si128(q), hi4 = _mm256_extracti128_si256(q, 1);
    __m128i p16 = _mm_packs_epi32(lo4, hi4);    /* values within [-128, 255]: exact */
    __m128i p8 = is_signed ? _mm_packs_epi16(p16, p16) : _mm_packus_epi16(p16, p16);
    _mm_storel_epi64((__m128i *)out, p8);
}

/* The contract's requantization of 8 int32 sums (../shared/SEMANTICS.md, epilogue.c):
 * float32(acc) times m in ONE float32 multiply (vmulps: nothing to contract into an FMA),
 * clamped to [lo, hi] = [qmin - zp, qmax - zp] before rounding (integer bounds: the same as
 * saturating after; vmaxps(v, lo) returns lo for a NaN v, its second operand), rounded to
 * nearest even by vcvtps2dq (MXCSR's default mode), + zp: int32 within T's range. */
static inline __attribute__((always_inline)) __m256i ql_requant8_avx2(__m256i acc, __m256 m, __m256 lo,
                                                                      __m256 hi, __m256i zp) {
    __m256 v = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc), m), lo), hi);
    return _mm256_add_epi32(_mm256_cvtps_epi32(v), zp);
}

/* 16 requantized values (two ql_requant8_avx2 results, within T's range) as 16 bytes in order:
 * the saturating packs are exact there */
static inline __attribute__((always_inline)) __m128i ql_pack16_avx2(__m256i q0, __m256i q1, int is_signed) {
    __m256i p16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q0, q1), 0xD8);
    __m128i a = _mm256_castsi256_si128(p16), b = _mm256_extracti128_si256(p16, 1);
    return is_signed ? _mm_packs_epi16(a, b) : _mm_packus_epi16(a, b);
}

static void ql_epilogue_avx2(const ql_epilogue *ep, const int32_t *C, ptrdiff_t ldc,
                             const int32_t *colsum, int i0, int j0, int rows, int cols) {
    if (!ql_epilogue_rows_contiguous(ep)) {
        ql_epilogue_scalar(ep, C, ldc, colsum, i0, j0, rows, cols);
        return;
    }
    /* every field in a local: the byte stores below may alias anything, so the compiler would
     * otherwise reload the struct after each of them */
    const int quantized = ep->quantized, is_signed = ep->out_is_signed;
    const int32_t *row_bias = ep->row_bias, *row_a = ep->row_a, *row_z = ep->row_z, *col_z = ep->col_z;
    const ptrdiff_t row_s = ep->row_s, col_z_s = ep->col_z_s, out_rs = ep->out_rs;
    const float *mult = ep->mult;
    const ptrdiff_t mult_rs = ep->mult_rs, mult_cs = ep->mult_cs;
    char *out8 = (char *)ep->out;
    int32_t *out32 = (int32_t *)ep->out;
    const __m256 lo = _mm256_set1_ps(ep->lo), hi = _mm256_set1_ps(ep->hi);
    const __m256i zp = _mm256_set1_epi32(ep->zp);
    const __m256i czb = _mm256_set1_epi32(row_a ? col_z[0] : 0);
    for (int r = 0; r < rows; r++) {
        ptrdiff_t i = i0 + r;
        const int32_t *crow = C + r * ldc;
        __m256i bias = _mm256_set1_epi32(row_bias ? row_bias[i] : 0);
        __m256i ra = _mm256_setzero_si256(), rz = ra;
        if (row_a) {
            ra = _mm256_set1_epi32(row_a[i * row_s]);
            rz = _mm256_set1_epi32(row_z[i * row_s]);
        }
        const float *mrow = quantized ? mult + i * mult_rs : NULL;
        __m256 mb = _mm256_set1_ps(mrow ? mrow[0] : 0.0f);
        int c = 0;
        for (; c + 8 <= cols; c += 8) {
            ptrdiff_t j = j0 + c;
            __m256i acc = _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)(crow + c)), bias);
            if (row_a) {
                __m256i cz = col_z_s ? _mm256_loadu_si256((const __m256i *)(col_z + j)) : czb;
                __m256i cs = _mm256_loadu_si256((const __m256i *)(colsum + c));
                acc = _mm256_sub_epi32(acc, _mm256_add_epi32(_mm256_mullo_epi32(cz, ra),
                                                             _mm256_mullo_epi32(rz, cs)));
            }
            if (!quantized) {
                _mm256_storeu_si256((__m256i *)(out32 + i * out_rs + j), acc);
                continue;
            }
            __m256 m = mult_cs ? _mm256_loadu_ps(mrow + j) : mb;
            store8_i32(out8 + i * out_rs + j, is_signed, ql_requant8_avx2(acc, m, lo, hi, zp));
        }
        if (c < cols) {
            /* 1-7 columns left: the same instructions on copies padded to 8 lanes, only the
             * real lanes stored (the implicit conv path's runs end anywhere) */
            int n = cols - c;
            ptrdiff_t j = j0 + c;
            int32_t tcv[8] = {0}, tcs[8] = {0}, tcz[8] = {0}, t32[8];
            float tm[8] = {0};
            uint8_t t8[8];
            memcpy(tcv, crow + c, sizeof(int32_t) * (size_t)n);
            __m256i acc = _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)tcv), bias);
            if (row_a) {
                __m256i cz = czb;
                if (col_z_s) {
                    memcpy(tcz, col_z + j, sizeof(int32_t) * (size_t)n);
                    cz = _mm256_loadu_si256((const __m256i *)tcz);
                }
                memcpy(tcs, colsum + c, sizeof(int32_t) * (size_t)n);
                __m256i cs = _mm256_loadu_si256((const __m256i *)tcs);
                acc = _mm256_sub_epi32(acc, _mm256_add_epi32(_mm256_mullo_epi32(cz, ra),
                                                             _mm256_mullo_epi32(rz, cs)));
            }
            if (!quantized) {
                _mm256_storeu_si256((__m256i *)t32, acc);
                memcpy(out32 + i * out_rs + j, t32, sizeof(int32_t) * (size_t)n);
                continue;
            }
            __m256 m = mb;
            if (mult_cs) {
                memcpy(tm, mrow + j, sizeof(float) * (size_t)n);
                m = _mm256_loadu_ps(tm);
            }
            store8_i32(t8, is_signed, ql_requant8_avx2(acc, m, lo, hi, zp));
            memcpy(out8 + i * out_rs + j, t8, (size_t)n);
        }
    }
}

static void ql_quantize_avx2(const void *x, int x_type, ptrdiff_t n, const float *scale,
                             ptrdiff_t scale_s, const int32_t *zp, ptrdiff_t zp_s,
                             void *out, int out_type) {
    const int sgn = out_type == QL_I8;
    const __m256 qmin = _mm256_set1_ps(sgn ? -128.0f : 0.0f), qmax = _mm256_set1_ps(sgn ? 127.0f : 255.0f);
    __m256 sb = _mm256_set1_ps(scale[0]);
    __m256i zb = _mm256_set1_epi32(zp[0]);
    ptrdiff_t e = 0;
    for (; e + 8 <= n; e += 8) {
        __m256 xv = x_type == QL_F32 ? _mm256_loadu_ps((const float *)x + e)
                  : _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)((const int32_t *)x + e)));
        __m256 s = scale_s ? _mm256_loadu_ps(scale + e) : sb;
        __m256i z = zp_s ? _mm256_loadu_si256((const __m256i *)(zp + e)) : zb;
        __m256 zf = _mm256_cvtepi32_ps(z);
        __m256 v = _mm256_div_ps(xv, s);   /* a true division, as the contract says */
        v = _mm256_max_ps(v, _mm256_sub_ps(qmin, zf));   /* NaN and -inf -> T's min */
        v = _mm256_min_ps(v, _mm256_sub_ps(qmax, zf));
        store8_i32((char *)out + e, sgn, _mm256_add_epi32(_mm256_cvtps_epi32(v), z));
    }
    if (e < n)
        ql_isa_scalar.quantize((const char *)x + e * 4, x_type, n - e, scale + e * scale_s, scale_s,
                               zp + e * zp_s, zp_s, (char *)out + e, out_type);
}

static void ql_dequantize_avx2(const void *x, int x_type, ptrdiff_t n, const float *scale,
                               ptrdiff_t scale_s, const int32_t *zp, ptrdiff_t zp_s, float *out,
                               int stream) {
    __m256 sb = _mm256_set1_ps(scale[0]);
    __m256i zb = _mm256_set1_epi32(zp[0]);
    ptrdiff_t e = 0;
    size_t es = x_type == QL_I32 ? 4 : 1;
    /* non-temporal stores need 32-byte aligned addresses: the scalar path does the head */
    ptrdiff_t head = stream ? (ptrdiff_t)(((32 - ((uintptr_t)out & 31)) & 31) / 4) : 0;
    if (stream && (((uintptr_t)out & 3) == 0) && head < n) {
        if (head)
            ql_isa_scalar.dequantize(x, x_type, head, scale, scale_s, zp, zp_s, out, 0);
        for (e = head; e + 8 <= n; e += 8) {
            __m256i xi;
            if (x_type == QL_I32) {
                xi = _mm256_loadu_si256((const __m256i *)((const int32_t *)x + e));
            } else {
                __m128i b8 = _mm_loadl_epi64((const __m128i *)((const char *)x + e));
                xi = x_type == QL_U8 ? _mm256_cvtepu8_epi32(b8) : _mm256_cvtepi8_epi32(b8);
            }
            __m256i z = zp_s ? _mm256_loadu_si256((const __m256i *)(zp + e)) : zb;
            __m256 s = scale_s ? _mm256_loadu_ps(scale + e) : sb;
            _mm256_stream_ps(out + e, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(xi, z)), s));
        }
        _mm_sfence();  /* order the streamed lines before the caller's (and other threads') reads */
    }
    for (; e + 8 <= n; e += 8) {
        __m256i xi;
        if (x_type == QL_I32) {
            xi = _mm256_loadu_si256((const __m256i *)((const int32_t *)x + e));
        } else {
            __m128i b8 = _mm_loadl_epi64((const __m128i *)((const char *)x + e));
            xi = x_type == QL_U8 ? _mm256_cvtepu8_epi32(b8) : _mm256_cvtepi8_epi32(b8);
        }
        __m256i z = zp_s ? _mm256_loadu_si256((const __m256i *)(zp + e)) : zb;
        __m256 s = scale_s ? _mm256_loadu_ps(scale + e) : sb;
        /* 8-bit: x - zp exact in int32; int32 x: zp is 0 (validated), so x - zp == x */
        _mm256_storeu_ps(out + e, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(xi, z)), s));
    }
    if (e < n)
        ql_isa_scalar.dequantize((const char *)x + e * es, x_type, n - e, scale + e * scale_s,
                                 scale_s, zp + e * zp_s, zp_s, out + e, 0);
}

/* ---------------------------------------------------------------------------------------
 * The implicit-GEMM k-group loop shared by the S8U8/I16 tile kernels of every x86 level
 * ------------------------------------------------------------------------------------- */
/* Implicit-GEMM operands (off != NULL) are read at base + off[g]: 64 bytes scattered over the
 * padded copy (every tap and channel block elsewhere, four phase planes for stride 2), an
 * address sequence the hardware prefetchers do not follow. The implicit kernels (every x86
 * level's) prefetch group g + IK_PREFETCH's two lines (64 bytes at any alignment) into L1. Prefetches never fault; off
 * is read only within [0, groups). Measured (1 thread, interleaved builds, best of 40):
 * ResNet-50 3x3 stride-2 layers 12-21% faster, stride 1 4-6%; distances 4, 8 and 16 alike
 * within 5%, 16 best on the 512-channel stride-2 layer. */
#define IK_PREFETCH 16

/* The k-group loop of both tile kernels' bodies (avx2_i16_body, avx2_s8u8_body): GROUP(src, g)
 * is one k-group; its operand vectors at `base + 64 g` (a packed panel, off NULL) or at
 * `base + off[g]` (implicit GEMM, prefetched IK_PREFETCH groups ahead). The implicit loop is
 * split where the prefetch ends and unrolled by 2: avx2_i16_body's comment says why. */
#define IK_GROUP_LOOP(GROUP)                                                                    \
    {                                                                                           \
        const ptrdiff_t ng = groups;                                                            \
        if (off) {                                                                              \
            ptrdiff_t g = 0;                                                                    \
            _Pragma("GCC unroll 2")                                                             \
            for (; g < ng - IK_PREFETCH; g++) {                                                 \
                _mm_prefetch(base + off[g + IK_PREFETCH], _MM_HINT_T0);                         \
                _mm_prefetch(base + off[g + IK_PREFETCH] + 63, _MM_HINT_T0);                    \
                GROUP(base + off[g], g)                                                         \
            }                                                                                   \
            for (; g < ng; g++) GROUP(base + off[g], g)                                         \
        } else {                                                                                \
            for (ptrdiff_t g = 0; g < ng; g++) GROUP(base + 64 * g, g)                          \
        }                                                                                       \
    }


/* One tile row's 16 requantized bytes p8 to its output row orow, run by run (the implicit
 * epilogues': AVX2's below, avx512vnni's z_ik_epilogue); whole (one run of the whole tile):
 * one 16-byte store */
static inline void ql_ik_store8(char *orow, __m128i p8, const ql_ik_runs *rn, int whole) {
    if (whole) {
        _mm_storeu_si128((__m128i *)(orow + rn->pix[0]), p8);
        return;
    }
    uint8_t t[QL_IK_NR];
    _mm_storeu_si128((__m128i *)t, p8);
    for (int k = 0; k < rn->n; k++) memcpy(orow + rn->pix[k], t + rn->col[k], (size_t)rn->len[k]);
}

/* ---------------------------------------------------------------------------------------
 * Implicit-GEMM kernels' epilogue from the accumulators (ql_ikernel_ep_fn), AVX2 and the VNNI
 * levels' (avx512vnni hands it each zmm row as two ymm halves):
 * ql_epilogue_avx2's instructions (vpaddd bias, cvtdq2ps, mulps, maxps lo, minps hi,
 * cvtps2dq, vpaddd zp, saturating packs of in-range values) on the 16 columns of each row,
 * then the runs' bytes stored (a whole-tile run: one 16-byte store)
 * ------------------------------------------------------------------------------------- */
static inline __attribute__((always_inline)) void
ql_ik_epilogue_avx2(__m256i (*out)[2], const ql_epilogue *ep, const ql_ik_runs *rn, int i0, int rows) {
    const int32_t *row_bias = ep->row_bias;
    const ptrdiff_t out_rs = ep->out_rs;
    const int whole = rn->n == 1 && rn->len[0] == QL_IK_NR;
    if (!ep->quantized) {
        int32_t *o = (int32_t *)ep->out + (ptrdiff_t)i0 * out_rs;
        for (int r = 0; r < rows; r++) {
            __m256i bias = _mm256_set1_epi32(row_bias ? row_bias[i0 + r] : 0);
            __m256i a0 = _mm256_add_epi32(out[r][0], bias), a1 = _mm256_add_epi32(out[r][1], bias);
            int32_t *orow = o + r * out_rs;
            if (whole) {
                _mm256_storeu_si256((__m256i *)(orow + rn->pix[0]), a0);
                _mm256_storeu_si256((__m256i *)(orow + rn->pix[0] + 8), a1);
                continue;
            }
            int32_t t[QL_IK_NR];
            _mm256_storeu_si256((__m256i *)t, a0);
            _mm256_storeu_si256((__m256i *)(t + 8), a1);
            for (int k = 0; k < rn->n; k++)
                memcpy(orow + rn->pix[k], t + rn->col[k], sizeof(int32_t) * (size_t)rn->len[k]);
        }
        return;
    }
    const int is_signed = ep->out_is_signed;
    const float *mult = ep->mult;
    const ptrdiff_t mult_rs = ep->mult_rs;
    char *o = (char *)ep->out + (ptrdiff_t)i0 * out_rs;
    const __m256 lo = _mm256_set1_ps(ep->lo), hi = _mm256_set1_ps(ep->hi);
    const __m256i zp = _mm256_set1_epi32(ep->zp);
    for (int r = 0; r < rows; r++) {
        __m256 m = _mm256_set1_ps(mult[(ptrdiff_t)(i0 + r) * mult_rs]);
        __m256i bias = _mm256_set1_epi32(row_bias ? row_bias[i0 + r] : 0);
        __m128i p8 = ql_pack16_avx2(ql_requant8_avx2(_mm256_add_epi32(out[r][0], bias), m, lo, hi, zp),
                                    ql_requant8_avx2(_mm256_add_epi32(out[r][1], bias), m, lo, hi, zp), is_signed);
        ql_ik_store8(o + r * out_rs, p8, rn, whole);
    }
}


/* ---------------------------------------------------------------------------------------
 * The GEMM kernels' fused epilogue (ql_gemm_kernel.kernel_ep) of a 16-column tile, from the
 * accumulators: AVX2's avx2-i16 / avx2-u8s8 / avx2-s8u8 and the VNNI levels' U8S8 kernels
 * (avx512vnni hands each 16-column half of its 32-column tile as two ymm a row), so every
 * level requantizes a matmul tile with the same instructions as ql_epilogue_avx2
 * (ql_requant8_avx2, ql_pack16_avx2):
 * vpaddd bias, the U8S8 corrections (vpmulld, wrap32), cvtdq2ps, mulps, maxps lo, minps hi,
 * cvtps2dq, vpaddd zp, saturating packs of in-range values; one 16-byte (or two 32-byte)
 * store per row: no int32 tile written and read back.
 * ------------------------------------------------------------------------------------- */
/* The register epilogue of a full 16-column tile (cols == 16, out_cs == 1, multipliers per
 * tensor, row or column, column zero points per tensor or column); the caller checked that.
 * U8S8 form (row_a set): acc -= col_z * row_a + row_z * colsum, vpmulld keeping the low 32
 * bits (wrap32), as ql_epilogue_avx2 computes it. */
static inline __attribute__((always_inline)) void
ql_tile_epilogue16_avx2(__m256i (*out)[2], const ql_epilogue *ep, const int32_t *colsum, int i0, int j0, int rows) {
    const int32_t *row_bias = ep->row_bias, *row_a = ep->row_a, *row_z = ep->row_z;
    const ptrdiff_t out_rs = ep->out_rs, row_s = ep->row_s;
    __m256i cz0 = _mm256_setzero_si256(), cz1 = cz0, cs0 = cz0, cs1 = cz0;
    if (row_a) {
        if (ep->col_z_s) {
            cz0 = _mm256_loadu_si256((const __m256i *)(ep->col_z + j0));
            cz1 = _mm256_loadu_si256((const __m256i *)(ep->col_z + j0 + 8));
        } else {
            cz0 = cz1 = _mm256_set1_epi32(ep->col_z[0]);
        }
        cs0 = _mm256_loadu_si256((const __m256i *)colsum);
        cs1 = _mm256_loadu_si256((const __m256i *)(colsum + 8));
    }
    for (int r = 0; r < rows; r++) {
        ptrdiff_t i = i0 + r;
        __m256i bias = _mm256_set1_epi32(row_bias ? row_bias[i] : 0);
        out[r][0] = _mm256_add_epi32(out[r][0], bias);
        out[r][1] = _mm256_add_epi32(out[r][1], bias);
        if (row_a) {
            __m256i ra = _mm256_set1_epi32(row_a[i * row_s]), rz = _mm256_set1_epi32(row_z[i * row_s]);
            out[r][0] = _mm256_sub_epi32(out[r][0], _mm256_add_epi32(_mm256_mullo_epi32(cz0, ra),
                                                                     _mm256_mullo_epi32(rz, cs0)));
            out[r][1] = _mm256_sub_epi32(out[r][1], _mm256_add_epi32(_mm256_mullo_epi32(cz1, ra),
                                                                     _mm256_mullo_epi32(rz, cs1)));
        }
    }
    if (!ep->quantized) {
        int32_t *o = (int32_t *)ep->out + (ptrdiff_t)i0 * out_rs + j0;
        for (int r = 0; r < rows; r++) {
            if (ep->stream && !((uintptr_t)(o + r * out_rs) & 63)) {
                /* one whole line (ql_epilogue.stream: the driver fences) */
                _mm256_stream_si256((__m256i *)(o + r * out_rs), out[r][0]);
                _mm256_stream_si256((__m256i *)(o + r * out_rs + 8), out[r][1]);
                continue;
            }
            _mm256_storeu_si256((__m256i *)(o + r * out_rs), out[r][0]);
            _mm256_storeu_si256((__m256i *)(o + r * out_rs + 8), out[r][1]);
        }
        return;
    }
    const int is_signed = ep->out_is_signed;
    const float *mult = ep->mult;
    const ptrdiff_t mult_rs = ep->mult_rs, mult_cs = ep->mult_cs;
    char *o = (char *)ep->out + (ptrdiff_t)i0 * out_rs + j0;
    const __m256 lo = _mm256_set1_ps(ep->lo), hi = _mm256_set1_ps(ep->hi);
    const __m256i zp = _mm256_set1_epi32(ep->zp);
    for (int r = 0; r < rows; r++) {
        const float *mrow = mult + (ptrdiff_t)(i0 + r) * mult_rs;
        __m256 m0, m1;
        if (mult_cs) {   /* per column (mult_cs == 1) */
            m0 = _mm256_loadu_ps(mrow + j0);
            m1 = _mm256_loadu_ps(mrow + j0 + 8);
        } else {
            m0 = m1 = _mm256_set1_ps(mrow[0]);
        }
        __m128i p8 = ql_pack16_avx2(ql_requant8_avx2(out[r][0], m0, lo, hi, zp),
                                    ql_requant8_avx2(out[r][1], m1, lo, hi, zp), is_signed);
        _mm_storeu_si128((__m128i *)(o + r * out_rs), p8);
    }
}

/* whether ql_tile_epilogue16_avx2 applies; else the tile is stored and ql_epilogue_avx2 runs */
static inline int ql_tile_epilogue16_ok(const ql_epilogue *ep, int cols) {
    return cols == 16 && ep->out_cs == 1 && (!ep->quantized || ep->mult_cs <= 1) &&
           (!ep->row_a || ep->col_z_s <= 1);
}

/* The fused kernels' epilogue of a tile of rows <= QL_MAX_MR accumulator rows and cols <= 16
 * real columns (j0..): ql_tile_epilogue16_avx2 where it applies, else the tile stored and
 * ql_epilogue_avx2 (narrow last tiles, strided outputs, per-element multipliers) */
static inline __attribute__((always_inline)) void
ql_finish_tile16_avx2(__m256i (*out)[2], const ql_epilogue *ep, const int32_t *colsum, int i0, int j0, int rows, int cols) {
    if (!ql_tile_epilogue16_ok(ep, cols)) {
        int32_t Ct[QL_MAX_MR * 16] __attribute__((aligned(32)));
        for (int r = 0; r < rows; r++) {
            _mm256_storeu_si256((__m256i *)(Ct + r * 16), out[r][0]);
            _mm256_storeu_si256((__m256i *)(Ct + r * 16 + 8), out[r][1]);
        }
        ql_epilogue_avx2(ep, Ct, 16, colsum, i0, j0, rows, cols);
        return;
    }
    ql_tile_epilogue16_avx2(out, ep, colsum, i0, j0, rows);
}


#endif
