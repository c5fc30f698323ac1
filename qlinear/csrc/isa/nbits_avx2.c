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

const ql_nbits_kernels ql_nbits_avx2 = {"avx2", i8_avx2, 32, ftile_avx2, fpanel_avx2, NULL};
#endif
