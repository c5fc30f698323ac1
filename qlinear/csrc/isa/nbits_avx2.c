/* MatMulNBits, AVX2 level (and AVX-VNNI's, whose byte products would add nothing the exact
 * AVX2 form below lacks at these bit widths); its panel and fold also serve AVX-512.
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
 * float levels: an output's 16 lanes are two ymm (lanes 0-7, 8-15); vfmadd231ps per group of
 * 16 k; the fold adds the two halves first (lanes l and l + 8), as the contract orders. */
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
void ql_nbits_fpanel_avx2(const ql_nbits_w *w, int n0, int nc, int j0, int j1, float *p, ptrdiff_t ldp) {
    const int bits = w->bits, per = 8 / bits, nb = w->nb;
    const __m256i mask = _mm256_set1_epi32((1 << bits) - 1);
    /* per and bs are powers of two: shifts, not divisions (a division per group cost more
     * than the group's arithmetic) */
    const int per_log = bits == 8 ? 0 : bits == 4 ? 1 : 2;
    const int bs_log = __builtin_ctz((unsigned)w->bs);
    /* superchunks outermost: each group of 8 columns is read in order */
    for (int j = j0; j < j1; j++) {
        const int sh = bits * (j & (per - 1)), b = (16 * j) >> bs_log;
        __m256i gi0 = _mm256_setzero_si256(), gi1 = gi0;
        if (w->g) {   /* per-lane blocks: the scale and zero point of k's block, gathered */
            gi0 = _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)(w->g + 16 * j)), 3);
            gi1 = _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)(w->g + 16 * j + 8)), 3);
        }
        for (int cc = 0; cc < nc; cc++) {
            const int n = n0 + cc, c = n % QL_NB_FCOLS;
            const ptrdiff_t G = n / QL_NB_FCOLS;
            const float *sfg = w->sf + G * nb * QL_NB_FCOLS, *zfg = w->zf + G * nb * QL_NB_FCOLS;
            const uint8_t *sc = w->wf + G * QL_NB_FCOLS * w->wf_row + ((ptrdiff_t)(j >> per_log) * QL_NB_FCOLS + c) * 16;
            __m256i q0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)sc));
            __m256i q1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 8)));
            __m256 f0 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(q0, sh), mask));
            __m256 f1 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(q1, sh), mask));
            __m256 z0, z1, s0, s1;
            if (w->g) {
                z0 = _mm256_i32gather_ps(zfg + c, gi0, 4); z1 = _mm256_i32gather_ps(zfg + c, gi1, 4);
                s0 = _mm256_i32gather_ps(sfg + c, gi0, 4); s1 = _mm256_i32gather_ps(sfg + c, gi1, 4);
            } else {
                z0 = z1 = _mm256_set1_ps(zfg[b * QL_NB_FCOLS + c]);
                s0 = s1 = _mm256_set1_ps(sfg[b * QL_NB_FCOLS + c]);
            }
            /* f(f((float)q - zp) * s): two float32 operations, no fusion */
            float *pc = p + cc * ldp + (j - j0) * 16;
            _mm256_storeu_ps(pc, _mm256_mul_ps(_mm256_sub_ps(f0, z0), s0));
            _mm256_storeu_ps(pc + 8, _mm256_mul_ps(_mm256_sub_ps(f1, z1), s1));
        }
    }
}

/* the contract's fold, per output: (l, l + 8), (l, l + 4), (l, l + 2), (l, l + 1), + bias */
void ql_nbits_ffold_avx(const float *acc, int count, const float *bias, float *y) {
    for (int o = 0; o < count; o++) {
        __m256 t8 = _mm256_add_ps(_mm256_loadu_ps(acc + o * 16), _mm256_loadu_ps(acc + o * 16 + 8));
        __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
        __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
        __m128 t1 = _mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1));
        if (bias) t1 = _mm_add_ss(t1, _mm_load_ss(bias + o));
        y[o] = _mm_cvtss_f32(t1);
    }
}

QL_INLINE void ftile_t(const float *a, ptrdiff_t lda, const float *p, ptrdiff_t ldp, int j0, int j1, int K,
                       float *acc, ptrdiff_t acc_rs, const int MR, const int NR) {
    __m256 c[2][2][2];
    for (int r = 0; r < MR; r++)
        for (int q = 0; q < NR; q++)
            for (int h = 0; h < 2; h++) c[r][q][h] = _mm256_loadu_ps(acc + (r * acc_rs + q) * 16 + 8 * h);
    int jf = K / 16 < j1 ? K / 16 : j1;
    for (int j = j0; j < jf; j++) {
        __m256 av[2][2];
        for (int r = 0; r < MR; r++)
            for (int h = 0; h < 2; h++) av[r][h] = _mm256_loadu_ps(a + r * lda + 16 * j + 8 * h);
        for (int q = 0; q < NR; q++)
            for (int h = 0; h < 2; h++) {
                const __m256 pv = _mm256_loadu_ps(p + q * ldp + (j - j0) * 16 + 8 * h);
                for (int r = 0; r < MR; r++) c[r][q][h] = _mm256_fmadd_ps(av[r][h], pv, c[r][q][h]);
            }
    }
    if (jf < j1) {   /* the last, partial group: lanes of k >= K keep their value */
        int j = jf, cnt = K - 16 * j;
        for (int h = 0; h < 2; h++) {
            __m256i lanes = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(8 * h));
            __m256i mk = _mm256_cmpgt_epi32(_mm256_set1_epi32(cnt), lanes);
            for (int r = 0; r < MR; r++) {
                __m256 av = _mm256_maskload_ps(a + r * lda + 16 * j + 8 * h, mk);
                for (int q = 0; q < NR; q++) {
                    __m256 f = _mm256_fmadd_ps(av, _mm256_loadu_ps(p + q * ldp + (j - j0) * 16 + 8 * h), c[r][q][h]);
                    c[r][q][h] = _mm256_blendv_ps(c[r][q][h], f, _mm256_castsi256_ps(mk));
                }
            }
        }
    }
    for (int r = 0; r < MR; r++)
        for (int q = 0; q < NR; q++)
            for (int h = 0; h < 2; h++) _mm256_storeu_ps(acc + (r * acc_rs + q) * 16 + 8 * h, c[r][q][h]);
}

static void ftile_avx2(const float *a, ptrdiff_t lda, const float *p, ptrdiff_t ldp, int j0, int j1, int K,
                       float *acc, ptrdiff_t acc_rs, int mr, int nr) {
    for (int r = 0; r < mr; r += 2)
        for (int q = 0; q < nr; q += 2) {
            int r2 = mr - r >= 2, q2 = nr - q >= 2;
            const float *ar = a + r * lda, *pq = p + q * ldp;
            float *ac = acc + (r * acc_rs + q) * 16;
            if (r2 && q2) ftile_t(ar, lda, pq, ldp, j0, j1, K, ac, acc_rs, 2, 2);
            else if (r2) ftile_t(ar, lda, pq, ldp, j0, j1, K, ac, acc_rs, 2, 1);
            else if (q2) ftile_t(ar, lda, pq, ldp, j0, j1, K, ac, acc_rs, 1, 2);
            else ftile_t(ar, lda, pq, ldp, j0, j1, K, ac, acc_rs, 1, 1);
        }
}

const ql_nbits_kernels ql_nbits_avx2 = {"avx2", i8_avx2, 32, ftile_avx2, ql_nbits_fpanel_avx2, ql_nbits_ffold_avx, NULL};
#endif
