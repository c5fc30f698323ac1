/* MatMulNBits, AVX2 level (and AVX-VNNI's, whose byte products would add nothing the exact
 * AVX2 form below lacks at these bit widths).
 *
 * int8 level: a 64-byte line of the prepared weights is two ymm of 8 columns x 4 k. vpmaddubsw
 * multiplies unsigned by signed bytes and adds pairs into a *saturating* int16, so it is used
 * only where the pair sums provably fit: codes of 2 or 4 bits (q <= 15) against activation
 * codes |c| <= 127 give |pair| <= 2 * 15 * 127 = 3810, and the `per` operands of one line are
 * added in int16 before widening (at most 2 * 3810 = 7620 for 4 bits, 4 * 2 * 3 * 127 = 3048
 * for 2 bits). 8-bit codes are split into nibbles q = 16 * hi + lo, each nibble product within
 * the same bound, and recombined exactly in int32 (vpmaddwd by 16 and by 1). Then vpmaddwd by
 * ones widens the pair sums to the column's int32 sum of 4 products: every step exact.
 * The block's float combination is the contract's, as in the AVX-512 file, 8 outputs a ymm.
 *
 * float levels: one float32 accumulator per output, 8 outputs (columns) a ymm, vfmadd231ps over
 * k in increasing order with a[k] broadcast; the weights dequantized per line of codes into a
 * panel of 32 columns, f(f(q - zp) * s) by one vsubps and one vmulps. */
#include "nbits/nbits.h"

#if QL_X86
#pragma GCC target("avx2,fma")
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define QL_INLINE static inline __attribute__((always_inline))

/* ---------------------------------------------------------------------------------------
 * int8 level
 * ------------------------------------------------------------------------------------- */
/* onnxruntime's CompInt8 quantization of one row (the portable ql_nbits_qa_portable, 8 values a
 * ymm; a block's last k % 8 values in scalar code, the same operations): |a| by clearing the sign
 * bit, the block's maximum in any order (exact), f(a * inv) one vmulps, vcvtps2dq rounding by
 * the MXCSR mode as nearbyintf does, 0 where the product is not finite, the code sum exact. */
static void qa_avx2(const float *r, int K, int bs, int nb, int8_t *c, float *sa, int32_t *csum, uint8_t *bad) {
    const __m256i expm = _mm256_set1_epi32(0x7F800000), absm = _mm256_set1_epi32(0x7FFFFFFF);
    __m256i nonfinite = _mm256_setzero_si256();
    int k = 0;
    for (; k + 8 <= K; k += 8)
        nonfinite = _mm256_or_si256(nonfinite, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)(r + k)), expm), expm));
    int isbad = !_mm256_testz_si256(nonfinite, nonfinite);
    for (; k < K; k++) isbad |= !isfinite(r[k]);
    *bad = (uint8_t)isbad;
    memset(c, 0, (size_t)nb * bs);
    if (isbad) {   /* NaN outputs: the codes are not used (the portable values all the same) */
        for (int b = 0; b < nb; b++) sa[b] = 0.0f, csum[b] = 0;
        return;
    }
    for (int b = 0; b < nb; b++) {
        const int k0 = b * bs, k1 = k0 + bs < K ? k0 + bs : K;
        __m256i mx = _mm256_setzero_si256();   /* |a| as integers: the same order as the floats */
        for (k = k0; k + 8 <= k1; k += 8)
            mx = _mm256_max_epu32(mx, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(r + k)), absm));
        uint32_t lanes[8], amax_bits = 0;
        _mm256_storeu_si256((__m256i *)lanes, mx);
        for (int i = 0; i < 8; i++) amax_bits = lanes[i] > amax_bits ? lanes[i] : amax_bits;
        float amax;
        memcpy(&amax, &amax_bits, 4);
        for (int kk = k; kk < k1; kk++) amax = fabsf(r[kk]) > amax ? fabsf(r[kk]) : amax;
        sa[b] = amax / 127.0f;
        const float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
        const __m256 iv = _mm256_set1_ps(inv);
        __m256i sum = _mm256_setzero_si256();
        for (k = k0; k + 8 <= k1; k += 8) {
            const __m256 t = _mm256_mul_ps(_mm256_loadu_ps(r + k), iv);
            const __m256i fin = _mm256_xor_si256(_mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(t), expm), expm),
                                                 _mm256_set1_epi32(-1));
            const __m256i q = _mm256_and_si256(_mm256_cvtps_epi32(t), fin);
            sum = _mm256_add_epi32(sum, q);
            /* |q| <= 127: the int32 -> int16 -> int8 packs are exact (no saturation happens) */
            const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
            _mm_storel_epi64((__m128i *)(c + k), _mm_packs_epi16(w16, w16));
        }
        int32_t lanes_s[8], s = 0;
        _mm256_storeu_si256((__m256i *)lanes_s, sum);
        for (int i = 0; i < 8; i++) s += lanes_s[i];
        for (; k < k1; k++) {
            const float t = r[k] * inv;
            const int32_t q = isfinite(t) ? (int32_t)nearbyintf(t) : 0;
            c[k] = (int8_t)q;
            s += q;
        }
        csum[b] = s;
    }
}

QL_INLINE void i8_tile(const ql_nbits_w *w, const int8_t *codes, ptrdiff_t lda, const float *sa,
                       const int32_t *csum, const uint8_t *bad, int m0, const int MR, int g, const int NG,
                       const int bits, float *y, ptrdiff_t ldy) {
    const int per = 8 / bits, lines = w->bs * bits / 32, nb = w->nb, bs = w->bs;
    const __m256i maskv = _mm256_set1_epi8((char)(bits == 8 ? 0x0F : (1 << bits) - 1));
    const __m256i ones = _mm256_set1_epi16(1), sixteen = _mm256_set1_epi16(16);
    __m256 facc[2][2][2];
    for (int r = 0; r < MR; r++)
        for (int j = 0; j < NG; j++) facc[r][j][0] = facc[r][j][1] = _mm256_set1_ps(-0.0f);
    for (int b = 0; b < nb; b++) {
        __m256i iacc[2][2][2];
        for (int r = 0; r < MR; r++)
            for (int j = 0; j < NG; j++) iacc[r][j][0] = iacc[r][j][1] = _mm256_setzero_si256();
        for (int L = 0; L < lines; L++) {
            __m256i v[2][2];
            for (int j = 0; j < NG; j++) {
                const uint8_t *ln = w->w8 + (((ptrdiff_t)(g + j) * nb + b) * lines + L) * 64;
                v[j][0] = _mm256_loadu_si256((const __m256i *)ln);
                v[j][1] = _mm256_loadu_si256((const __m256i *)(ln + 32));
            }
            for (int r = 0; r < MR; r++) {
                const int8_t *ar = codes + (m0 + r) * lda + b * bs + L * per * 4;
                for (int j = 0; j < NG; j++)
                    for (int h = 0; h < 2; h++) {
                        __m256i sum;
                        if (bits == 8) {
                            int32_t d4;
                            memcpy(&d4, ar, 4);
                            const __m256i ad = _mm256_set1_epi32(d4);
                            __m256i lo = _mm256_and_si256(v[j][h], maskv);
                            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v[j][h], 4), maskv);
                            sum = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, ad), ones),
                                                   _mm256_madd_epi16(_mm256_maddubs_epi16(hi, ad), sixteen));
                        } else {
                            __m256i p16 = _mm256_setzero_si256();
                            for (int s = 0; s < per; s++) {
                                int32_t d4;
                                memcpy(&d4, ar + s * 4, 4);
                                __m256i u = _mm256_and_si256(_mm256_srli_epi16(v[j][h], bits * s), maskv);
                                p16 = _mm256_add_epi16(p16, _mm256_maddubs_epi16(u, _mm256_set1_epi32(d4)));
                            }
                            sum = _mm256_madd_epi16(p16, ones);
                        }
                        iacc[r][j][h] = _mm256_add_epi32(iacc[r][j][h], sum);
                    }
            }
        }
        for (int j = 0; j < NG; j++) {
            ptrdiff_t o = ((ptrdiff_t)(g + j) * nb + b) * 16;
            for (int h = 0; h < 2; h++) {
                const __m256i zv = w->z8 ? _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(w->z8 + o + 8 * h)))
                                         : _mm256_set1_epi32(w->zconst);
                const __m256 sb = _mm256_loadu_ps(w->s8 + o + 8 * h);
                for (int r = 0; r < MR; r++) {
                    int m = m0 + r;
                    __m256i d = _mm256_sub_epi32(iacc[r][j][h],
                                                 _mm256_mullo_epi32(zv, _mm256_set1_epi32(csum[m * nb + b])));
                    __m256 sab = _mm256_mul_ps(_mm256_set1_ps(sa[m * nb + b]), sb);
                    facc[r][j][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), sab, facc[r][j][h]);
                }
            }
        }
    }
    for (int j = 0; j < NG; j++)
        for (int h = 0; h < 2; h++) {
            int n = (g + j) * 16 + 8 * h;
            if (n >= w->N) break;
            int cnt = w->N - n < 8 ? w->N - n : 8;
            for (int r = 0; r < MR; r++) {
                int m = m0 + r;
                float out[8];
                _mm256_storeu_ps(out, facc[r][j][h]);
                for (int i = 0; i < cnt; i++)
                    y[m * ldy + n + i] = bad[m] ? NAN : (w->bias ? out[i] + w->bias[n + i] : out[i]);
            }
        }
}

#define I8_BITS(BITS)                                                                              \
    static void i8_b##BITS(const ql_nbits_w *w, const int8_t *codes, ptrdiff_t lda, const float *sa,  \
                           const int32_t *csum, const uint8_t *bad, int M, int g0, int g1, float *y,  \
                           ptrdiff_t ldy) {                                                        \
        for (int g = g0; g < g1; g += 2) {                                                         \
            int two = g + 2 <= g1, m = 0;                                                          \
            if (two && M == 1) { i8_tile(w, codes, lda, sa, csum, bad, 0, 1, g, 2, BITS, y, ldy); continue; } \
            for (; m + 2 <= M; m += 2) {                                                           \
                i8_tile(w, codes, lda, sa, csum, bad, m, 2, g, 1, BITS, y, ldy);                   \
                if (two) i8_tile(w, codes, lda, sa, csum, bad, m, 2, g + 1, 1, BITS, y, ldy);      \
            }                                                                                      \
            for (; m < M; m++) {                                                                   \
                i8_tile(w, codes, lda, sa, csum, bad, m, 1, g, 1, BITS, y, ldy);                   \
                if (two) i8_tile(w, codes, lda, sa, csum, bad, m, 1, g + 1, 1, BITS, y, ldy);      \
            }                                                                                      \
        }                                                                                          \
    }
I8_BITS(2)
I8_BITS(4)
I8_BITS(8)

static void i8_avx2(const ql_nbits_w *w, const int8_t *codes, ptrdiff_t lda, const float *sa, const int32_t *csum,
                    const uint8_t *bad, int M, int g0, int g1, float *y, ptrdiff_t ldy) {
    if (w->bits == 4) i8_b4(w, codes, lda, sa, csum, bad, M, g0, g1, y, ldy);
    else if (w->bits == 8) i8_b8(w, codes, lda, sa, csum, bad, M, g0, g1, y, ldy);
    else i8_b2(w, codes, lda, sa, csum, bad, M, g0, g1, y, ldy);
}

/* ---------------------------------------------------------------------------------------
 * float levels
 * ------------------------------------------------------------------------------------- */
#define SHIFT_OF(u, bits) (8 * ((u) % 4) + (bits) * ((u) / 4))

/* The panel: per group of 16 columns, two ymm (columns 0-7, 8-15) a k, f(f(q - zp) * s) for k
 * in [k0, k1): the exact conversion of q, one vsubps (exact for an integer zero point), one
 * vmulps, as the AVX-512 kernels compute it. */
QL_INLINE void fpanel_t(const ql_nbits_w *w, int n0, int k0, int k1, float *p, const int bits) {
    const int per = 8 / bits, kl = 4 * per, nb = w->nb, ng = (w->N + 15) / 16;
    const int bs_log = __builtin_ctz((unsigned)w->bs);
    const ptrdiff_t gstride = (ptrdiff_t)nb * w->bs * bits / 32 * 64;
    const __m256i mask = _mm256_set1_epi32((1 << bits) - 1);
    for (int gi = 0; gi < QL_NB_NR / 16; gi++) {
        const int G = n0 / 16 + gi;
        float *pg = p + 16 * gi;
        if (G >= ng) {   /* past the last group: no codes stored */
            for (int k = k0; k < k1; k++) {
                _mm256_storeu_ps(pg + (ptrdiff_t)(k - k0) * QL_NB_NR, _mm256_setzero_ps());
                _mm256_storeu_ps(pg + (ptrdiff_t)(k - k0) * QL_NB_NR + 8, _mm256_setzero_ps());
            }
            continue;
        }
        const uint8_t *grp = w->w8 + G * gstride;
        const float *sg = w->s8 + (ptrdiff_t)G * nb * 16, *zg = w->zf + (ptrdiff_t)G * nb * 16;
        __m256 S0 = _mm256_setzero_ps(), S1 = S0, Z0 = S0, Z1 = S0;
        int tb = -1;
        for (int kb = k0; kb < k1; kb += kl) {   /* k0 is a multiple of 16, so of kl: whole lines */
            const uint8_t *ln = grp + (ptrdiff_t)(kb / kl) * 64;
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)ln), l1 = _mm256_loadu_si256((const __m256i *)(ln + 32));
#pragma GCC unroll 16
            for (int u = 0; u < kl; u++) {
                const int k = kb + u;
                if (k >= k1) break;
                const int b = w->g ? w->g[k] : k >> bs_log;
                if (b != tb) {
                    tb = b;
                    S0 = _mm256_loadu_ps(sg + b * 16), S1 = _mm256_loadu_ps(sg + b * 16 + 8);
                    Z0 = _mm256_loadu_ps(zg + b * 16), Z1 = _mm256_loadu_ps(zg + b * 16 + 8);
                }
                const int sh = SHIFT_OF(u, bits);
                const __m256 q0 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(l0, sh), mask));
                const __m256 q1 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(l1, sh), mask));
                float *pk = pg + (ptrdiff_t)(k - k0) * QL_NB_NR;
                _mm256_storeu_ps(pk, _mm256_mul_ps(_mm256_sub_ps(q0, Z0), S0));
                _mm256_storeu_ps(pk + 8, _mm256_mul_ps(_mm256_sub_ps(q1, Z1), S1));
            }
        }
    }
}

static void fpanel_avx2(const ql_nbits_w *w, int n0, int k0, int k1, float *p) {
    if (w->bits == 4) fpanel_t(w, n0, k0, k1, p, 4);
    else if (w->bits == 2) fpanel_t(w, n0, k0, k1, p, 2);
    else fpanel_t(w, n0, k0, k1, p, 8);
}

/* One tile: MR (<= 4) rows x 16 columns (two ymm per row, 8 accumulators): per k two panel
 * loads, MR broadcasts (A packed side by side), 2 * MR vfmadd231ps, each output's accumulator
 * in increasing k. */
QL_INLINE void ftile_t(const float *ap, const float *p, int k0, int k1, float *acc, ptrdiff_t ldc, const int MR) {
    __m256 c[4][2];
    for (int r = 0; r < MR; r++)
        c[r][0] = _mm256_loadu_ps(acc + r * ldc), c[r][1] = _mm256_loadu_ps(acc + r * ldc + 8);
    const float *pk = p, *ak = ap + (ptrdiff_t)k0 * QL_NB_MR;
    for (int k = k0; k < k1; k++, pk += QL_NB_NR, ak += QL_NB_MR) {
        const __m256 p0 = _mm256_loadu_ps(pk), p1 = _mm256_loadu_ps(pk + 8);
        for (int r = 0; r < MR; r++) {
            const __m256 av = _mm256_broadcast_ss(ak + r);
            c[r][0] = _mm256_fmadd_ps(av, p0, c[r][0]);
            c[r][1] = _mm256_fmadd_ps(av, p1, c[r][1]);
        }
    }
    for (int r = 0; r < MR; r++)
        _mm256_storeu_ps(acc + r * ldc, c[r][0]), _mm256_storeu_ps(acc + r * ldc + 8, c[r][1]);
}

static void ftile_avx2(const float *ap, const float *p, int k0, int k1, float *acc, ptrdiff_t ldc, int mr) {
    for (int h = 0; h < QL_NB_NR; h += 16)
        for (int r = 0; r < mr; r += 4) {
            float *ac = acc + r * ldc + h;
            switch (mr - r < 4 ? mr - r : 4) {
                case 4: ftile_t(ap + r, p + h, k0, k1, ac, ldc, 4); break;
                case 3: ftile_t(ap + r, p + h, k0, k1, ac, ldc, 3); break;
                case 2: ftile_t(ap + r, p + h, k0, k1, ac, ldc, 2); break;
                default: ftile_t(ap + r, p + h, k0, k1, ac, ldc, 1); break;
            }
        }
}

/* Decode (one row): NG groups of 16 columns (two ymm each, one float32 accumulator per output),
 * the whole K in registers, no panel (the AVX-512 decode kernel's order, 8 outputs a ymm): per
 * line of codes (4 * per k), per k one broadcast of a[k] and per half-group the panel's
 * dequantization (shift, mask, exact conversion, vsubps, vmulps: the same values) and one
 * vfmadd231ps; the last, partial line stops at k = K - 1. */
QL_INLINE void fdec_step(const __m256i *ln, const int sh, const __m256i mask, const __m256 av, const __m256 *Z,
                         const __m256 *S, __m256 *acc, const int NG) {
    for (int j = 0; j < 2 * NG; j++) {
        const __m256 q = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(ln[j], sh), mask));
        acc[j] = _mm256_fmadd_ps(av, _mm256_mul_ps(_mm256_sub_ps(q, Z[j]), S[j]), acc[j]);
    }
}

QL_INLINE void fdec_t(const ql_nbits_w *w, const float *a, int G0, float *y, const int NG, const int bits) {
    const int per = 8 / bits, kl = 4 * per, nb = w->nb, K = w->K;
    const int bs_log = __builtin_ctz((unsigned)w->bs);
    const ptrdiff_t gstride = (ptrdiff_t)nb * w->bs * bits / 32 * 64;
    const __m256i mask = _mm256_set1_epi32((1 << bits) - 1);
    const uint8_t *grp = w->w8 + G0 * gstride;
    const float *sg = w->s8 + (ptrdiff_t)G0 * nb * 16, *zg = w->zf + (ptrdiff_t)G0 * nb * 16;
    __m256 acc[4], S[4], Z[4];   /* [2 * group + half] */
    for (int j = 0; j < 2 * NG; j++) acc[j] = _mm256_set1_ps(-0.0f), S[j] = Z[j] = _mm256_setzero_ps();
    const int lines = K / kl;   /* whole lines; then the last, partial one */
    for (int L = 0; L <= lines; L++) {
        const int kb = L * kl, cnt = L < lines ? kl : K - kb;
        if (cnt == 0) break;
        if ((kb & (w->bs - 1)) == 0) {   /* a new block (a block is a whole number of lines) */
            const int b = kb >> bs_log;
            for (int j = 0; j < 2 * NG; j++) {
                S[j] = _mm256_loadu_ps(sg + ((ptrdiff_t)(j / 2) * nb + b) * 16 + 8 * (j % 2));
                Z[j] = _mm256_loadu_ps(zg + ((ptrdiff_t)(j / 2) * nb + b) * 16 + 8 * (j % 2));
            }
        }
        __m256i ln[4];
        for (int j = 0; j < 2 * NG; j++)
            ln[j] = _mm256_loadu_si256((const __m256i *)(grp + (j / 2) * gstride + (ptrdiff_t)L * 64 + 32 * (j % 2)));
        if (cnt == kl) {
#pragma GCC unroll 16
            for (int u = 0; u < kl; u++)
                fdec_step(ln, SHIFT_OF(u, bits), mask, _mm256_broadcast_ss(a + kb + u), Z, S, acc, NG);
        } else {
#pragma GCC unroll 16
            for (int u = 0; u < kl; u++) {
                if (u >= cnt) break;
                fdec_step(ln, SHIFT_OF(u, bits), mask, _mm256_broadcast_ss(a + kb + u), Z, S, acc, NG);
            }
        }
    }
    for (int j = 0; j < 2 * NG; j++) {
        const int n = (G0 + j / 2) * 16 + 8 * (j % 2);
        if (n >= w->N) break;
        __m256 out = acc[j];
        if (w->N - n >= 8) {
            if (w->bias) out = _mm256_add_ps(out, _mm256_loadu_ps(w->bias + n));
            _mm256_storeu_ps(y + n, out);
        } else {
            float o[8];
            _mm256_storeu_ps(o, out);
            for (int i = 0; i < w->N - n; i++) y[n + i] = w->bias ? o[i] + w->bias[n + i] : o[i];
        }
    }
}

/* Groups two at a time (8 ymm accumulators, scales and zero points): a 64-column task in two
 * passes, each reading two streams of codes. */
#define FDEC_BITS(BITS)                                                                            \
    for (int g = 0; g < ngc; g += 2) {                                                             \
        if (ngc - g >= 2) fdec_t(w, a, G0 + g, y, 2, BITS);                                        \
        else fdec_t(w, a, G0 + g, y, 1, BITS);                                                     \
    }

static int fdec_avx2(const ql_nbits_w *w, const float *a, int n0, float *y) {
    if (w->g) return 0;   /* per-k blocks: the panel path */
    if (n0 < 0) return 1;
    const int G0 = n0 / 16, ng = (w->N + 15) / 16, ngc = ng - G0 < 4 ? ng - G0 : 4;
    if (w->bits == 4) { FDEC_BITS(4) }
    else if (w->bits == 2) { FDEC_BITS(2) }
    else { FDEC_BITS(8) }
    return 1;
}

const ql_nbits_kernels ql_nbits_avx2 = {"avx2", i8_avx2, 32, ftile_avx2, fpanel_avx2, fdec_avx2, qa_avx2};
#endif
