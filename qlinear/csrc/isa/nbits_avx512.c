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
 * float levels: one zmm of 16 lanes per output (lane l takes k = l mod 16, vfmadd231ps), the
 * lanes of a last partial group of 16 masked (vfmadd with a merge mask keeps them); the panel
 * and the fold are the AVX2 file's (the same instructions serve both levels).
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

void ql_nbits_ffold_avx(const float *acc, int count, const float *bias, float *y);

/* ---------------------------------------------------------------------------------------
 * int8 level
 * ------------------------------------------------------------------------------------- */
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
QL_INLINE void ftile_t(const float *a, ptrdiff_t lda, const float *p, ptrdiff_t ldp, int j0, int j1, int K,
                       float *acc, ptrdiff_t acc_rs, const int MR, const int NR) {
    __m512 c[4][4];
    for (int r = 0; r < MR; r++)
        for (int q = 0; q < NR; q++) c[r][q] = _mm512_loadu_ps(acc + (r * acc_rs + q) * 16);
    int jf = K / 16 < j1 ? K / 16 : j1;   /* groups [j0, jf) are whole */
    for (int j = j0; j < jf; j++) {
        __m512 av[4];
        for (int r = 0; r < MR; r++) av[r] = _mm512_loadu_ps(a + r * lda + 16 * j);
        for (int q = 0; q < NR; q++) {
            const __m512 pv = _mm512_loadu_ps(p + q * ldp + (j - j0) * 16);
            for (int r = 0; r < MR; r++) c[r][q] = _mm512_fmadd_ps(av[r], pv, c[r][q]);
        }
    }
    if (jf < j1) {   /* the last, partial group: lanes of k >= K keep their value */
        int j = jf;
        __mmask16 k = (__mmask16)((1u << (K - 16 * j)) - 1);
        for (int r = 0; r < MR; r++) {
            const __m512 av = _mm512_maskz_loadu_ps(k, a + r * lda + 16 * j);
            for (int q = 0; q < NR; q++)
                c[r][q] = _mm512_mask3_fmadd_ps(av, _mm512_loadu_ps(p + q * ldp + (j - j0) * 16), c[r][q], k);
        }
    }
    for (int r = 0; r < MR; r++)
        for (int q = 0; q < NR; q++) _mm512_storeu_ps(acc + (r * acc_rs + q) * 16, c[r][q]);
}

#define FT(MR, NR) case MR * 8 + NR: ftile_t(a, lda, p, ldp, j0, j1, K, acc, acc_rs, MR, NR); break;
static void ftile_avx512(const float *a, ptrdiff_t lda, const float *p, ptrdiff_t ldp, int j0, int j1, int K,
                         float *acc, ptrdiff_t acc_rs, int mr, int nr) {
    switch (mr * 8 + nr) {
        FT(1, 1) FT(1, 2) FT(1, 3) FT(1, 4) FT(2, 1) FT(2, 2) FT(2, 3) FT(2, 4)
        FT(3, 1) FT(3, 2) FT(3, 3) FT(3, 4) FT(4, 1) FT(4, 2) FT(4, 3) FT(4, 4)
        default: break;
    }
}

/* The panel (prefill): the decode kernel's tables, one vpermps per 16 weights; g_idx (per-lane
 * blocks) takes the AVX2 panel's gathers. The same float32 values either way. */
static void fpanel_avx512(const ql_nbits_w *w, int n0, int nc, int j0, int j1, float *p, ptrdiff_t ldp) {
    if (w->g) { ql_nbits_fpanel_avx2(w, n0, nc, j0, j1, p, ldp); return; }
    const int bits = w->bits, per = 8 / bits, nb = w->nb;
    const int per_log = bits == 8 ? 0 : bits == 4 ? 1 : 2, bs_log = __builtin_ctz((unsigned)w->bs);
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i m2 = _mm512_set1_epi32(3), m8 = _mm512_set1_epi32(255);
    for (int cc = 0; cc < nc; cc++) {
        const int n = n0 + cc, c = n % QL_NB_FCOLS;
        const ptrdiff_t G = n / QL_NB_FCOLS;
        const uint8_t *grp = w->wf + G * QL_NB_FCOLS * w->wf_row + c * 16;
        const float *sfg = w->sf + G * nb * QL_NB_FCOLS + c, *zfg = w->zf + G * nb * QL_NB_FCOLS + c;
        float *pc = p + cc * ldp;
        __m512 T = _mm512_setzero_ps(), Z = T, S = T;
        int tb = -1;
        for (int j = j0; j < j1; j++) {
            const int b = (16 * j) >> bs_log;
            if (b != tb) {
                tb = b;
                Z = _mm512_set1_ps(zfg[b * QL_NB_FCOLS]);
                S = _mm512_set1_ps(sfg[b * QL_NB_FCOLS]);
                T = _mm512_mul_ps(_mm512_sub_ps(iota, Z), S);
            }
            __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(grp + (ptrdiff_t)(j >> per_log) * QL_NB_FCOLS * 16)));
            const int sh = bits * (j & (per - 1));
            if (sh) v = _mm512_srli_epi32(v, sh);
            __m512 wv;
            if (bits == 8) wv = _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_and_si512(v, m8)), Z), S);
            else wv = _mm512_permutexvar_ps(bits == 2 ? _mm512_and_si512(v, m2) : v, T);
            _mm512_storeu_ps(pc + (j - j0) * 16, wv);
        }
    }
}

/* Decode (one row): 8 columns (one layout group) at a time, 8 accumulators, the whole K in
 * registers, no panel. 2- and 4-bit codes: a block's 16 possible weights of column c,
 * T[q] = f(f(q - zp) * s), are one zmm, built once per block (vsubps, vmulps: the panel's two
 * operations on the same values) and looked up with vpermps, which reads the low 4 bits of
 * each lane's index: W = T[code] is the same float32 the panel would hold, for one
 * instruction per 16 weights. 8-bit codes: the panel's conversion, subtraction and product. */
QL_INLINE void fdec_group(const ql_nbits_w *w, const float *a, int G, float *y, int nc, const int bits) {
    const int per = 8 / bits, nb = w->nb, K = w->K;
    const int per_log = bits == 8 ? 0 : bits == 4 ? 1 : 2, bs_log = __builtin_ctz((unsigned)w->bs);
    const uint8_t *grp = w->wf + (ptrdiff_t)G * QL_NB_FCOLS * w->wf_row;
    const float *sfg = w->sf + (ptrdiff_t)G * nb * QL_NB_FCOLS, *zfg = w->zf + (ptrdiff_t)G * nb * QL_NB_FCOLS;
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i m2 = _mm512_set1_epi32(3), m8 = _mm512_set1_epi32(255);
    __m512 acc[8], T[8], S[8];
    for (int c = 0; c < 8; c++) acc[c] = _mm512_set1_ps(-0.0f), T[c] = S[c] = _mm512_setzero_ps();
    const int Gk = (K + 15) / 16;
    for (int j = 0; j < Gk; j++) {
        if (((16 * j) & (w->bs - 1)) == 0) {   /* a new block: its tables (or scale, zero point) */
            const int b = (16 * j) >> bs_log;
            for (int c = 0; c < 8; c++) {
                const __m512 z = _mm512_set1_ps(zfg[b * QL_NB_FCOLS + c]), sc = _mm512_set1_ps(sfg[b * QL_NB_FCOLS + c]);
                if (bits == 8) T[c] = z, S[c] = sc;
                else T[c] = _mm512_mul_ps(_mm512_sub_ps(iota, z), sc);
            }
        }
        const int sh = bits * (j & (per - 1));
        const uint8_t *scs = grp + (ptrdiff_t)(j >> per_log) * QL_NB_FCOLS * 16;
        const int whole = 16 * j + 16 <= K;
        const __mmask16 km = whole ? (__mmask16)0xFFFF : (__mmask16)((1u << (K - 16 * j)) - 1);
        const __m512 av = _mm512_maskz_loadu_ps(km, a + 16 * j);
        for (int c = 0; c < 8; c++) {
            __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(scs + c * 16)));
            if (sh) v = _mm512_srli_epi32(v, sh);
            __m512 wv;
            if (bits == 8) wv = _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_and_si512(v, m8)), T[c]), S[c]);
            else wv = _mm512_permutexvar_ps(bits == 2 ? _mm512_and_si512(v, m2) : v, T[c]);
            acc[c] = whole ? _mm512_fmadd_ps(av, wv, acc[c]) : _mm512_mask3_fmadd_ps(av, wv, acc[c], km);
        }
    }
    float tmp[8 * 16];
    for (int c = 0; c < 8; c++) _mm512_storeu_ps(tmp + 16 * c, acc[c]);
    ql_nbits_ffold_avx(tmp, nc, w->bias ? w->bias + G * QL_NB_FCOLS : NULL, y + G * QL_NB_FCOLS);
}

static int fdec_avx512(const ql_nbits_w *w, const float *a, int n0, float *y) {
    if (w->g) return 0;   /* per-lane blocks: the panel path */
    for (int G = n0 / QL_NB_FCOLS; G * QL_NB_FCOLS < n0 + 32 && G * QL_NB_FCOLS < w->N; G++) {
        int nc = w->N - G * QL_NB_FCOLS < QL_NB_FCOLS ? w->N - G * QL_NB_FCOLS : QL_NB_FCOLS;
        if (w->bits == 4) fdec_group(w, a, G, y, nc, 4);
        else if (w->bits == 2) fdec_group(w, a, G, y, nc, 2);
        else fdec_group(w, a, G, y, nc, 8);
    }
    return 1;
}

const ql_nbits_kernels ql_nbits_avx512 = {"avx512vnni", i8_avx512, 64, ftile_avx512, fpanel_avx512,
                                          ql_nbits_ffold_avx, fdec_avx512};
#endif
