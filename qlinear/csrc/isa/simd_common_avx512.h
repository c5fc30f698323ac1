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

/* The U8S8 GEMM epilogue of a 32-column tile on 512-bit registers (avx512vnni-u8s8's and
 * amx-u8s8's kernel_ep), row by row, for the epilogues whose rows are contiguous
 * (ql_epilogue_rows_contiguous; the callers send the others to the level's epilogue):
 *   acc[i][j] = C[i][j] + (bias[i] - zR'*row_a[i]) - row_z[i]*colsum[j]   (wrap32)
 * with the first correction one scalar per row when zR' is one value (per-tensor b zero
 * point), and the second one vector product per run of rows with the same row_z (all of them
 * for a per-tensor a zero point). wrap32 sums do not depend on their order, so these are the
 * bits of ql_epilogue_avx2's per-element form. The requantization is ql_requant16_avx512;
 * then vpmovsdb / vpmovusdb, which cannot saturate: the clamp leaves values of the output
 * type. Columns at and beyond `cols` are masked off (loads and stores).
 * ql_ep32_init once per tile, then ql_ep32_row for each row with its two accumulators
 * (columns 0-15, 16-31), or ql_ep32_row2 for two rows: both always inlined, so a kernel's named accumulators and these
 * constants stay in registers. */
typedef struct {
    __m512i cs0, cs1, cz0, cz1, p0, p1, zp;
    __m512 lo, hi;
    __mmask16 k0, k1;
    int32_t pz;   /* the row_z of p0, p1 (= row_z * colsum); 0 with p = 0 */
    /* the epilogue's fields in locals: the byte stores may alias anything, so the compiler
     * would otherwise reload them from *ep after each store */
    int quantized, is_signed, stream, col_z_s;
    int32_t col_z0;
    const int32_t *row_bias, *row_a, *row_z;
    const float *mult;
    char *out;
    ptrdiff_t row_s, out_rs, mult_rs, mult_cs;
} ql_ep32;

static inline __attribute__((always_inline)) void
ql_ep32_init(ql_ep32 *s, const ql_epilogue *ep, const int32_t *colsum, int j0, int cols) {
    s->k0 = cols >= 16 ? 0xFFFF : (__mmask16)((1u << cols) - 1);
    s->k1 = cols >= 32 ? 0xFFFF : cols > 16 ? (__mmask16)((1u << (cols - 16)) - 1) : 0;
    s->quantized = ep->quantized;
    s->is_signed = ep->out_is_signed;
    s->stream = ep->stream;
    s->row_bias = ep->row_bias;
    s->row_a = ep->row_a;
    s->row_z = ep->row_z;
    s->row_s = ep->row_s;
    s->col_z_s = ep->col_z_s != 0;
    s->col_z0 = ep->row_a && !ep->col_z_s ? ep->col_z[0] : 0;
    s->out_rs = ep->out_rs;
    s->mult = ep->mult;
    s->mult_rs = ep->mult_rs;
    s->mult_cs = ep->mult_cs;
    s->lo = _mm512_set1_ps(ep->lo);
    s->hi = _mm512_set1_ps(ep->hi);
    s->zp = _mm512_set1_epi32(ep->zp);
    s->cs0 = s->cs1 = s->cz0 = s->cz1 = s->p0 = s->p1 = _mm512_setzero_si512();
    s->pz = 0;
    if (ep->row_a) {
        s->cs0 = _mm512_maskz_loadu_epi32(s->k0, colsum);
        s->cs1 = _mm512_maskz_loadu_epi32(s->k1, colsum + 16);
        if (ep->col_z_s) {
            s->cz0 = _mm512_maskz_loadu_epi32(s->k0, ep->col_z + j0);
            s->cz1 = _mm512_maskz_loadu_epi32(s->k1, ep->col_z + j0 + 16);
        }
    }
    /* column j0 of row 0: rows are i * out_rs further (elements of the output type) */
    s->out = (char *)ep->out + (ptrdiff_t)j0 * (ep->quantized ? 1 : 4);
}

/* The usual matmul epilogue: U8S8 corrections with one b zero point (col_z per tensor), no
 * bias, and a multiplier per tensor or per row (8-bit output) or none (int32). A caller runs
 * its rows once more under `if (ql_ep32_usual(&s))`, which stores these known field values
 * into s (a local whose fields the compiler then treats as constants), so that copy has none
 * of the per-row tests of the general fields. */
static inline __attribute__((always_inline)) int ql_ep32_usual(ql_ep32 *s) {
    if (!s->row_a || s->row_bias || s->col_z_s || s->stream || (s->quantized && s->mult_cs)) return 0;
    s->row_bias = NULL;
    s->col_z_s = 0;
    s->stream = 0;
    s->mult_cs = 0;
    return 1;
}

/* row i's corrections and bias added to its accumulators a0 (columns 0-15), a1 (16-31) */
static inline __attribute__((always_inline)) void
ql_ep32_correct(ql_ep32 *s, __m512i *a0, __m512i *a1, ptrdiff_t i) {
    uint32_t rc = s->row_bias ? (uint32_t)s->row_bias[i] : 0;
    if (s->row_a) {
        const int32_t ra = s->row_a[i * s->row_s], rz = s->row_z[i * s->row_s];
        if (s->col_z_s) {
            const __m512i rav = _mm512_set1_epi32(ra);
            *a0 = _mm512_sub_epi32(*a0, _mm512_mullo_epi32(s->cz0, rav));
            *a1 = _mm512_sub_epi32(*a1, _mm512_mullo_epi32(s->cz1, rav));
        } else {
            rc -= (uint32_t)s->col_z0 * (uint32_t)ra;
        }
        if (rz != s->pz) {
            const __m512i rzv = _mm512_set1_epi32(rz);
            s->p0 = _mm512_mullo_epi32(s->cs0, rzv);
            s->p1 = _mm512_mullo_epi32(s->cs1, rzv);
            s->pz = rz;
        }
        *a0 = _mm512_sub_epi32(*a0, s->p0);
        *a1 = _mm512_sub_epi32(*a1, s->p1);
    }
    const __m512i rcv = _mm512_set1_epi32((int32_t)rc);
    *a0 = _mm512_add_epi32(*a0, rcv);
    *a1 = _mm512_add_epi32(*a1, rcv);
}

/* the requantized values of row i's corrected accumulators (quantized epilogues) */
static inline __attribute__((always_inline)) void
ql_ep32_requant(const ql_ep32 *s, __m512i *a0, __m512i *a1, ptrdiff_t i, int j0) {
    const float *mrow = s->mult + i * s->mult_rs;
    __m512 m0, m1;
    if (s->mult_cs) {
        m0 = _mm512_maskz_loadu_ps(s->k0, mrow + j0);
        m1 = _mm512_maskz_loadu_ps(s->k1, mrow + j0 + 16);
    } else {
        m0 = m1 = _mm512_set1_ps(mrow[0]);
    }
    *a0 = ql_requant16_avx512(*a0, m0, s->lo, s->hi, s->zp);
    *a1 = ql_requant16_avx512(*a1, m1, s->lo, s->hi, s->zp);
}

/* store row i's corrected int32 accumulators (MatMulInteger, ConvInteger) */
static inline __attribute__((always_inline)) void
ql_ep32_store32(const ql_ep32 *s, __m512i a0, __m512i a1, ptrdiff_t i) {
    int32_t *o = (int32_t *)s->out + i * s->out_rs;
    if (s->stream && s->k1 == 0xFFFF && !((uintptr_t)o & 63)) {
        /* two whole lines (ql_epilogue.stream: the driver fences) */
        _mm512_stream_si512((void *)o, a0);
        _mm512_stream_si512((void *)(o + 16), a1);
        return;
    }
    _mm512_mask_storeu_epi32(o, s->k0, a0);
    _mm512_mask_storeu_epi32(o + 16, s->k1, a1);
}

/* store row i's requantized values (masked to the tile's columns) */
static inline __attribute__((always_inline)) void
ql_ep32_store8(const ql_ep32 *s, __m512i q0, __m512i q1, ptrdiff_t i) {
    char *o = s->out + i * s->out_rs;
    if (s->is_signed) {
        _mm512_mask_cvtsepi32_storeu_epi8(o, s->k0, q0);
        _mm512_mask_cvtsepi32_storeu_epi8(o + 16, s->k1, q1);
    } else {
        _mm512_mask_cvtusepi32_storeu_epi8(o, s->k0, q0);
        _mm512_mask_cvtusepi32_storeu_epi8(o + 16, s->k1, q1);
    }
}

/* output row i (columns j0..j0+31, masked to the tile's cols) from its accumulators a0, a1 */
static inline __attribute__((always_inline)) void
ql_ep32_row(ql_ep32 *s, __m512i a0, __m512i a1, ptrdiff_t i, int j0) {
    ql_ep32_correct(s, &a0, &a1, i);
    if (!s->quantized) {
        ql_ep32_store32(s, a0, a1, i);
        return;
    }
    ql_ep32_requant(s, &a0, &a1, i, j0);
    ql_ep32_store8(s, a0, a1, i);
}

/* rows i and i + 1 (accumulators a0, a1 and b0, b1). 8-bit outputs of a whole tile (32
 * columns) are narrowed together: vpackssdw then vpackuswb / vpacksswb, whose saturation
 * cannot trigger (the requantized values already lie in the output type's range), and one
 * vpermd putting each row's 32 bytes in order, stored as two 32-byte halves: 4 shuffles for
 * 64 outputs where vpmov[u]sdb takes 2 shuffle uops (and a store) per 16 */
static inline __attribute__((always_inline)) void
ql_ep32_row2(ql_ep32 *s, __m512i a0, __m512i a1, __m512i b0, __m512i b1, ptrdiff_t i, int j0) {
    if (!s->quantized || s->k1 != 0xFFFF) {
        ql_ep32_row(s, a0, a1, i, j0);
        ql_ep32_row(s, b0, b1, i + 1, j0);
        return;
    }
    ql_ep32_correct(s, &a0, &a1, i);
    ql_ep32_correct(s, &b0, &b1, i + 1);
    ql_ep32_requant(s, &a0, &a1, i, j0);
    ql_ep32_requant(s, &b0, &b1, i + 1, j0);
    /* per 128-bit lane l: [a0 l | a1 l] and [b0 l | b1 l] as int16, then as bytes
     * [a0 l | a1 l | b0 l | b1 l], 4 bytes (one dword) each */
    const __m512i wa = _mm512_packs_epi32(a0, a1), wb = _mm512_packs_epi32(b0, b1);
    const __m512i v = s->is_signed ? _mm512_packs_epi16(wa, wb) : _mm512_packus_epi16(wa, wb);
    /* dword 4l + t of v: t = 0 a0's, 1 a1's, 2 b0's, 3 b1's columns 4l..4l+3 of that half */
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m512i rows = _mm512_permutexvar_epi32(idx, v);
    char *o = s->out + i * s->out_rs;
    _mm256_storeu_si256((__m256i *)o, _mm512_castsi512_si256(rows));
    _mm256_storeu_si256((__m256i *)(o + s->out_rs), _mm512_extracti64x4_epi64(rows, 1));
}

#endif
