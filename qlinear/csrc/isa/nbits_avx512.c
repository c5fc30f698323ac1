/* MatMulNBits, AVX-512 VNNI level (also the AMX level's: the tiles do not serve these shapes).
 *
 * int8 level: 16 columns per zmm, one int32 lane per column; a 64-byte line of the prepared
 * weights gives `per` operands of 16 columns x 4 consecutive k (one shift and one mask each:
 * codes 0..2^bits - 1 as unsigned bytes), the row's 4 activation codes broadcast as the
 * signed operand. vpdpbusd (never the saturating vpdpbusds) adds the 4 exact products
 * |q * c| <= 255 * 127 to the int32 lane: a block's sum stays below bs * 255 * 127, far inside
 * int32 for every block size qlinear takes natively. The block's zero-point term
 * zp * Σcodes (vpmulld), cvtdq2ps (round to nearest even, exact below 2^24), f(s_a * s_b)
 * (one vmulps), and one vfmadd231ps per block in increasing block order: per output the
 * contract's operations, 16 outputs at a time.
 *
 * float levels: one float32 accumulator per output, 16 outputs (columns) a zmm, advanced by
 * vfmadd231ps over k in increasing order; a[k] broadcast. The weights are dequantized per
 * line of codes (16 columns x 4 * per k) into a panel of 32 columns (prefill) or straight into
 * registers (decode); every weight is f(f32(q - zp) * s) by one vsubps and one vmulps.
 */
#include "nbits/nbits.h"

/* Not built under -DQL_SIMDE: Debian's SIMDe lacks four of its intrinsics (_mm512_cvtepu8_epi32,
 * _mm512_cvtepi32_ps, _mm512_maskz_loadu_ps, _mm512_mask_storeu_ps), so the emulated build's
 * AVX-512 levels take the AVX2 kernels (dispatch.c), which compute the same bits. */
#if QL_X86 && !defined(QL_SIMDE)
#pragma GCC target("avx2,fma,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define QL_INLINE static inline __attribute__((always_inline))

/* ---------------------------------------------------------------------------------------
 * int8 level
 * ------------------------------------------------------------------------------------- */
/* onnxruntime's CompInt8 quantization of one row (the portable ql_nbits_qa_portable, 16 values a
 * zmm): every step is the scalar one per element. |a| by clearing the sign bit, the block's
 * maximum reduced in any order (a maximum is exact), s_a = f(amax / 127) and the inverse as
 * scalars, f(a * inv) one vmulps, vcvtps2dq rounding by the MXCSR mode as nearbyintf does (round
 * to nearest even by default), 0 where the product is not finite (exponent all ones: 127 / amax
 * overflowed), the int32 code sum reduced exactly. A partial last block is masked (lanes past K
 * read as +0 and give code 0). */
static void qa_avx512(const float *r, int K, int bs, int nb, int8_t *c, float *sa, int32_t *csum, uint8_t *bad) {
    const __m512i expm = _mm512_set1_epi32(0x7F800000), absm = _mm512_set1_epi32(0x7FFFFFFF);
    __mmask16 nonfinite = 0;
    int k = 0;
    for (; k + 16 <= K; k += 16)
        nonfinite |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_loadu_si512((const void *)(r + k)), expm), expm);
    if (k < K) {
        const __mmask16 km = (__mmask16)((1u << (K - k)) - 1);
        nonfinite |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_maskz_loadu_epi32(km, r + k), expm), expm);
    }
    *bad = nonfinite != 0;
    if (nonfinite) {   /* NaN outputs: the codes are not used (the portable values all the same) */
        memset(c, 0, (size_t)nb * bs);
        for (int b = 0; b < nb; b++) sa[b] = 0.0f, csum[b] = 0;
        return;
    }
    for (int b = 0; b < nb; b++) {
        const int k0 = b * bs, k1 = k0 + bs < K ? k0 + bs : K;
        __m512i mx = _mm512_setzero_si512();   /* |a| as integers: the same order as the floats */
        for (k = k0; k < k1; k += 16) {
            const __mmask16 km = k1 - k >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (k1 - k)) - 1);
            mx = _mm512_max_epu32(mx, _mm512_and_si512(_mm512_maskz_loadu_epi32(km, r + k), absm));
        }
        const uint32_t amax_bits = (uint32_t)_mm512_reduce_max_epu32(mx);
        float amax;
        memcpy(&amax, &amax_bits, 4);
        sa[b] = amax / 127.0f;
        const float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
        const __m512 iv = _mm512_set1_ps(inv);
        __m512i sum = _mm512_setzero_si512();
        for (k = k0; k < k0 + bs; k += 16) {   /* past K (in the last block): code 0 */
            const __mmask16 km = k >= k1 ? 0 : k1 - k >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (k1 - k)) - 1);
            const __m512 t = _mm512_mul_ps(_mm512_maskz_loadu_ps(km, r + k), iv);
            const __mmask16 fin = _mm512_cmpneq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(t), expm), expm);
            const __m512i q = _mm512_maskz_cvtps_epi32(fin, t);
            sum = _mm512_add_epi32(sum, q);
            _mm_storeu_si128((__m128i *)(c + k), _mm512_cvtepi32_epi8(q));   /* |q| <= 127: exact */
        }
        csum[b] = _mm512_reduce_add_epi32(sum);
    }
}

QL_INLINE void i8_tile(const ql_nbits_w *w, const int8_t *codes, ptrdiff_t lda, const float *sa,
                       const int32_t *csum, const uint8_t *bad, int m0, const int MR, int g, const int NG,
                       const int bits, float *y, ptrdiff_t ldy) {
    const int per = 8 / bits, lines = w->bs * bits / 32, nb = w->nb, bs = w->bs;
    const __m512i maskv = _mm512_set1_epi8((char)((1 << bits) - 1));
    __m512 facc[4][4];
    for (int r = 0; r < MR; r++)
        for (int j = 0; j < NG; j++) facc[r][j] = _mm512_set1_ps(-0.0f);
    const int8_t *arow[4];
    for (int r = 0; r < MR; r++) arow[r] = codes + (m0 + r) * lda;
    for (int b = 0; b < nb; b++) {
        __m512i iacc[4][4];
        for (int r = 0; r < MR; r++)
            for (int j = 0; j < NG; j++) iacc[r][j] = _mm512_setzero_si512();
        const uint8_t *blk[4];
        for (int j = 0; j < NG; j++) blk[j] = w->w8 + ((ptrdiff_t)(g + j) * nb + b) * lines * 64;
        const int8_t *ab = NULL;
        (void)ab;
        for (int L = 0; L < lines; L++) {
            __m512i v[4];
            for (int j = 0; j < NG; j++) v[j] = _mm512_loadu_si512((const void *)(blk[j] + L * 64));
            for (int s = 0; s < per; s++) {
                __m512i u[4];
                for (int j = 0; j < NG; j++)
                    u[j] = bits == 8 ? v[j] : _mm512_and_si512(_mm512_srli_epi16(v[j], bits * s), maskv);
                for (int r = 0; r < MR; r++) {
                    int32_t d4;
                    memcpy(&d4, arow[r] + b * bs + (L * per + s) * 4, 4);
                    const __m512i ad = _mm512_set1_epi32(d4);
                    for (int j = 0; j < NG; j++) iacc[r][j] = _mm512_dpbusd_epi32(iacc[r][j], u[j], ad);
                }
            }
        }
        for (int j = 0; j < NG; j++) {
            ptrdiff_t o = ((ptrdiff_t)(g + j) * nb + b) * 16;
            const __m512i zv = w->z8 ? _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(w->z8 + o)))
                                     : _mm512_set1_epi32(w->zconst);
            const __m512 sb = _mm512_loadu_ps(w->s8 + o);
            for (int r = 0; r < MR; r++) {
                int m = m0 + r;
                __m512i d = _mm512_sub_epi32(iacc[r][j], _mm512_mullo_epi32(zv, _mm512_set1_epi32(csum[m * nb + b])));
                __m512 sab = _mm512_mul_ps(_mm512_set1_ps(sa[m * nb + b]), sb);
                facc[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), sab, facc[r][j]);
            }
        }
    }
    for (int j = 0; j < NG; j++) {
        int n = (g + j) * 16;
        if (n >= w->N) break;
        __mmask16 k = w->N - n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (w->N - n)) - 1);
        __m512 bv = w->bias ? _mm512_maskz_loadu_ps(k, w->bias + n) : _mm512_setzero_ps();
        for (int r = 0; r < MR; r++) {
            int m = m0 + r;
            __m512 out = w->bias ? _mm512_add_ps(facc[r][j], bv) : facc[r][j];
            if (bad[m]) out = _mm512_set1_ps(NAN);
            _mm512_mask_storeu_ps(y + m * ldy + n, k, out);
        }
    }
}

#define I8_BITS(BITS)                                                                              \
    static void i8_b##BITS(const ql_nbits_w *w, const int8_t *codes, ptrdiff_t lda, const float *sa,  \
                           const int32_t *csum, const uint8_t *bad, int M, int g0, int g1, float *y,  \
                           ptrdiff_t ldy) {                                                        \
        if (M == 1) {                                                                              \
            int g = g0;                                                                            \
            for (; g + 4 <= g1; g += 4) i8_tile(w, codes, lda, sa, csum, bad, 0, 1, g, 4, BITS, y, ldy); \
            for (; g < g1; g++) i8_tile(w, codes, lda, sa, csum, bad, 0, 1, g, 1, BITS, y, ldy);  \
            return;                                                                                \
        }                                                                                          \
        for (int g = g0; g < g1; g += 2) {                                                         \
            int two = g + 2 <= g1;                                                                 \
            int m = 0;                                                                             \
            for (; m + 4 <= M; m += 4) {                                                           \
                if (two) i8_tile(w, codes, lda, sa, csum, bad, m, 4, g, 2, BITS, y, ldy);          \
                else i8_tile(w, codes, lda, sa, csum, bad, m, 4, g, 1, BITS, y, ldy);              \
            }                                                                                      \
            for (; m < M; m++) {                                                                   \
                if (two) i8_tile(w, codes, lda, sa, csum, bad, m, 1, g, 2, BITS, y, ldy);          \
                else i8_tile(w, codes, lda, sa, csum, bad, m, 1, g, 1, BITS, y, ldy);              \
            }                                                                                      \
        }                                                                                          \
    }
I8_BITS(2)
I8_BITS(4)
I8_BITS(8)

static void i8_avx512(const ql_nbits_w *w, const int8_t *codes, ptrdiff_t lda, const float *sa, const int32_t *csum,
                      const uint8_t *bad, int M, int g0, int g1, float *y, ptrdiff_t ldy) {
    if (w->bits == 4) i8_b4(w, codes, lda, sa, csum, bad, M, g0, g1, y, ldy);
    else if (w->bits == 8) i8_b8(w, codes, lda, sa, csum, bad, M, g0, g1, y, ldy);
    else i8_b2(w, codes, lda, sa, csum, bad, M, g0, g1, y, ldy);
}

/* ---------------------------------------------------------------------------------------
 * float levels
 * ------------------------------------------------------------------------------------- */
/* Lane c's code of k = (line start) + u: byte u % 4 of the lane, bits bits * (u / 4) */
#define SHIFT_OF(u, bits) (8 * ((u) % 4) + (bits) * ((u) / 4))

/* f32(q - zp) for an integer zero point: (q | 2^23's bits) is the float 2^23 + q, and
 * Zm = 2^23 + zp (exact for zp <= 255); their difference is q - zp exactly (one vsubps, both
 * operands in [2^23, 2^24)). The mask and the OR are one vpternlogd (A & B) | C. */
QL_INLINE __m512 qmz_int(__m512i line, const int sh, const int bits, __m512 zm) {
    const __m512i v = sh ? _mm512_srli_epi32(line, (unsigned)sh) : line;
    const __m512i x = _mm512_ternarylogic_epi32(v, _mm512_set1_epi32((1 << bits) - 1), _mm512_set1_epi32(0x4B000000), 0xEA);
    return _mm512_sub_ps(_mm512_castsi512_ps(x), zm);
}

/* f(q - zp) for a float zero point: the exact conversion of q, then one vsubps */
QL_INLINE __m512 qmz_float(__m512i line, const int sh, const int bits, __m512 zf) {
    const __m512i v = sh ? _mm512_srli_epi32(line, (unsigned)sh) : line;
    return _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32((1 << bits) - 1))), zf);
}

/* The panel: per group of 16 columns (one zmm a k), f(f32(q - zp) * s) for k in [k0, k1) */
QL_INLINE void fpanel_t(const ql_nbits_w *w, int n0, int k0, int k1, float *p, const int bits, const int zint) {
    const int per = 8 / bits, kl = 4 * per, nb = w->nb, ng = (w->N + 15) / 16;
    const int bs_log = __builtin_ctz((unsigned)w->bs);
    const ptrdiff_t gstride = (ptrdiff_t)nb * w->bs * bits / 32 * 64;
    const __m512 magic = _mm512_set1_ps(8388608.0f);
    for (int gi = 0; gi < QL_NB_NR / 16; gi++) {
        const int G = n0 / 16 + gi;
        float *pg = p + 16 * gi;
        if (G >= ng) {   /* past the last group: no codes stored */
            for (int k = k0; k < k1; k++) _mm512_storeu_ps(pg + (ptrdiff_t)(k - k0) * QL_NB_NR, _mm512_setzero_ps());
            continue;
        }
        const uint8_t *grp = w->w8 + G * gstride;
        const float *sg = w->s8 + (ptrdiff_t)G * nb * 16, *zg = w->zf + (ptrdiff_t)G * nb * 16;
        __m512 S = _mm512_setzero_ps(), Z = S;
        int tb = -1;
        for (int kb = k0; kb < k1; kb += kl) {   /* k0 is a multiple of 16, so of kl: whole lines */
            const __m512i line = _mm512_loadu_si512((const void *)(grp + (ptrdiff_t)(kb / kl) * 64));
#pragma GCC unroll 16
            for (int u = 0; u < kl; u++) {
                const int k = kb + u;
                if (k >= k1) break;
                const int b = w->g ? w->g[k] : k >> bs_log;
                if (b != tb) {
                    tb = b;
                    S = _mm512_loadu_ps(sg + b * 16);
                    Z = _mm512_loadu_ps(zg + b * 16);
                    if (zint) Z = _mm512_add_ps(Z, magic);   /* 2^23 + zp, exact */
                }
                const __m512 d = zint ? qmz_int(line, SHIFT_OF(u, bits), bits, Z) : qmz_float(line, SHIFT_OF(u, bits), bits, Z);
                _mm512_storeu_ps(pg + (ptrdiff_t)(k - k0) * QL_NB_NR, _mm512_mul_ps(d, S));
            }
        }
    }
}

static void fpanel_avx512(const ql_nbits_w *w, int n0, int k0, int k1, float *p) {
    if (w->zint) {
        if (w->bits == 4) fpanel_t(w, n0, k0, k1, p, 4, 1);
        else if (w->bits == 2) fpanel_t(w, n0, k0, k1, p, 2, 1);
        else fpanel_t(w, n0, k0, k1, p, 8, 1);
    } else {
        if (w->bits == 4) fpanel_t(w, n0, k0, k1, p, 4, 0);
        else fpanel_t(w, n0, k0, k1, p, 2, 0);   /* float zero points: 2 and 4 bits only */
    }
}

/* One tile: MR rows x 32 columns, two zmm per row (16 accumulators at MR = 8): per k two panel
 * loads, MR broadcasts of a[r][k] (packed side by side), 2 * MR vfmadd231ps, each output's one
 * accumulator advanced in increasing k. */
QL_INLINE void ftile_t(const float *ap, const float *p, int k0, int k1, float *acc, ptrdiff_t ldc, const int MR) {
    __m512 c[QL_NB_MR][2];
    for (int r = 0; r < MR; r++)
        c[r][0] = _mm512_loadu_ps(acc + r * ldc), c[r][1] = _mm512_loadu_ps(acc + r * ldc + 16);
    const float *pk = p, *ak = ap + (ptrdiff_t)k0 * QL_NB_MR;
    for (int k = k0; k < k1; k++, pk += QL_NB_NR, ak += QL_NB_MR) {
        const __m512 p0 = _mm512_loadu_ps(pk), p1 = _mm512_loadu_ps(pk + 16);
        for (int r = 0; r < MR; r++) {
            const __m512 av = _mm512_set1_ps(ak[r]);
            c[r][0] = _mm512_fmadd_ps(av, p0, c[r][0]);
            c[r][1] = _mm512_fmadd_ps(av, p1, c[r][1]);
        }
    }
    for (int r = 0; r < MR; r++)
        _mm512_storeu_ps(acc + r * ldc, c[r][0]), _mm512_storeu_ps(acc + r * ldc + 16, c[r][1]);
}

#define FT(MR) case MR: ftile_t(ap, p, k0, k1, acc, ldc, MR); break;
static void ftile_avx512(const float *ap, const float *p, int k0, int k1, float *acc, ptrdiff_t ldc, int mr) {
    switch (mr) {
        FT(1) FT(2) FT(3) FT(4) FT(5) FT(6) FT(7) FT(8)
        default: break;
    }
}

/* Decode (one row): NG groups of 16 columns, one zmm accumulator each, the whole K in
 * registers, no panel: per line of the groups (4 * per k), per k one broadcast of a[k] and per
 * group the panel's dequantization (the same operations on the same values) and one
 * vfmadd231ps. The groups' lines are read side by side (NG streams). */
QL_INLINE void fdec_t(const ql_nbits_w *w, const float *a, int G0, float *y, const int NG, const int bits,
                      const int zint) {
    const int per = 8 / bits, kl = 4 * per, nb = w->nb, K = w->K;
    const int bs_log = __builtin_ctz((unsigned)w->bs);
    const ptrdiff_t gstride = (ptrdiff_t)nb * w->bs * bits / 32 * 64;
    const __m512 magic = _mm512_set1_ps(8388608.0f);
    const uint8_t *grp = w->w8 + G0 * gstride;
    const float *sg = w->s8 + (ptrdiff_t)G0 * nb * 16, *zg = w->zf + (ptrdiff_t)G0 * nb * 16;
    __m512 acc[4], S[4], Z[4];
    for (int g = 0; g < NG; g++) acc[g] = _mm512_set1_ps(-0.0f), S[g] = Z[g] = _mm512_setzero_ps();
    const int lines = K / kl;   /* whole lines; then the last, partial one */
    for (int L = 0; L <= lines; L++) {
        const int kb = L * kl, cnt = L < lines ? kl : K - kb;
        if (cnt == 0) break;
        if ((kb & (w->bs - 1)) == 0) {   /* a new block (a block is a whole number of lines) */
            const int b = kb >> bs_log;
            for (int g = 0; g < NG; g++) {
                S[g] = _mm512_loadu_ps(sg + ((ptrdiff_t)g * nb + b) * 16);
                Z[g] = _mm512_loadu_ps(zg + ((ptrdiff_t)g * nb + b) * 16);
                if (zint) Z[g] = _mm512_add_ps(Z[g], magic);
            }
        }
        __m512i ln[4];
        for (int g = 0; g < NG; g++) ln[g] = _mm512_loadu_si512((const void *)(grp + g * gstride + (ptrdiff_t)L * 64));
        if (cnt == kl) {
#pragma GCC unroll 16
            for (int u = 0; u < kl; u++) {
                const __m512 av = _mm512_set1_ps(a[kb + u]);
                for (int g = 0; g < NG; g++) {
                    const __m512 d = zint ? qmz_int(ln[g], SHIFT_OF(u, bits), bits, Z[g])
                                          : qmz_float(ln[g], SHIFT_OF(u, bits), bits, Z[g]);
                    acc[g] = _mm512_fmadd_ps(av, _mm512_mul_ps(d, S[g]), acc[g]);
                }
            }
        } else {
#pragma GCC unroll 16
            for (int u = 0; u < kl; u++) {
                if (u >= cnt) break;
                const __m512 av = _mm512_set1_ps(a[kb + u]);
                for (int g = 0; g < NG; g++) {
                    const __m512 d = zint ? qmz_int(ln[g], SHIFT_OF(u, bits), bits, Z[g])
                                          : qmz_float(ln[g], SHIFT_OF(u, bits), bits, Z[g]);
                    acc[g] = _mm512_fmadd_ps(av, _mm512_mul_ps(d, S[g]), acc[g]);
                }
            }
        }
    }
    for (int g = 0; g < NG; g++) {
        const int n = (G0 + g) * 16;
        if (n >= w->N) break;
        const __mmask16 km = w->N - n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (w->N - n)) - 1);
        __m512 out = acc[g];
        if (w->bias) out = _mm512_add_ps(out, _mm512_maskz_loadu_ps(km, w->bias + n));
        _mm512_mask_storeu_ps(y + n, km, out);
    }
}

#define FDEC_NG(BITS, ZI)                                                                          \
    switch (ngc) {                                                                                 \
        case 4: fdec_t(w, a, G0, y, 4, BITS, ZI); break;                                           \
        case 3: fdec_t(w, a, G0, y, 3, BITS, ZI); break;                                           \
        case 2: fdec_t(w, a, G0, y, 2, BITS, ZI); break;                                           \
        default: fdec_t(w, a, G0, y, 1, BITS, ZI); break;                                          \
    }

static int fdec_avx512(const ql_nbits_w *w, const float *a, int n0, float *y) {
    if (w->g) return 0;   /* per-k blocks: the panel path */
    if (n0 < 0) return 1;
    const int G0 = n0 / 16, ng = (w->N + 15) / 16, ngc = ng - G0 < 4 ? ng - G0 : 4;
    if (w->zint) {
        if (w->bits == 4) { FDEC_NG(4, 1) }
        else if (w->bits == 2) { FDEC_NG(2, 1) }
        else { FDEC_NG(8, 1) }
    } else {
        if (w->bits == 4) { FDEC_NG(4, 0) }
        else { FDEC_NG(2, 0) }
    }
    return 1;
}

const ql_nbits_kernels ql_nbits_avx512 = {"avx512vnni", i8_avx512, 64, ftile_avx512, fpanel_avx512, fdec_avx512,
                                          qa_avx512};
#endif
