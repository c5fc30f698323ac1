/* AVX2 depthwise kernels (qlinear.h's ql_dw_rows_fn and ql_dw_cl_fn). Compiled for AVX2 only (no FMA: the
 * kernel is integer-only anyway); the conv/ files call it (through the level tables) only where the CPU runs AVX2. */
#include "conv.h"

#include <string.h>

#if QL_X86
#pragma GCC push_options
#pragma GCC target("avx2")
#include <immintrin.h>

/* 16 outputs per block. vpunpck{l,h}wd interleave two tap rows within 128-bit lanes, so the
 * low product holds outputs 0-3 and 8-11, the high one 4-7 and 12-15; the accumulators keep
 * that order and are permuted back once per block. vpmaddwd forms w0*r0 + w1*r1 exactly in
 * int32 (|w|, |r| <= 255: the pair sum is below 2^17); vpaddd wraps, which is wrap32. */
void ql_dw_rows_avx2(const int16_t *const *rows, const int16_t *w, int npairs, int32_t *acc,
                     int nblocks, int accumulate)
{
    for (int b = 0; b < nblocks; b++) {
        int i = b * 16;
        __m256i lo, hi;
        if (accumulate) {
            __m256i a0 = _mm256_loadu_si256((const __m256i *)(acc + i));
            __m256i a1 = _mm256_loadu_si256((const __m256i *)(acc + i + 8));
            lo = _mm256_permute2x128_si256(a0, a1, 0x20);
            hi = _mm256_permute2x128_si256(a0, a1, 0x31);
        } else {
            lo = _mm256_setzero_si256();
            hi = _mm256_setzero_si256();
        }
        for (int q = 0; q < npairs; q++) {
            __m256i ra = _mm256_loadu_si256((const __m256i *)(rows[2 * q] + i));
            __m256i rb = _mm256_loadu_si256((const __m256i *)(rows[2 * q + 1] + i));
            uint32_t wp = (uint16_t)w[2 * q] | ((uint32_t)(uint16_t)w[2 * q + 1] << 16);
            __m256i wv = _mm256_set1_epi32((int)wp);
            lo = _mm256_add_epi32(lo, _mm256_madd_epi16(_mm256_unpacklo_epi16(ra, rb), wv));
            hi = _mm256_add_epi32(hi, _mm256_madd_epi16(_mm256_unpackhi_epi16(ra, rb), wv));
        }
        _mm256_storeu_si256((__m256i *)(acc + i), _mm256_permute2x128_si256(lo, hi, 0x20));
        _mm256_storeu_si256((__m256i *)(acc + i + 8), _mm256_permute2x128_si256(lo, hi, 0x31));
    }
}

/* Channels-last depthwise: 16 channels = one ymm of centered int16 per position. Two taps'
 * vectors are interleaved by vpunpck{l,h}wd (within 128-bit lanes: the low product holds
 * channels 0-3 and 8-11, the high one 4-7 and 12-15), multiplied by the weights interleaved the
 * same way with vpmaddwd (|x - zx|, |w - zw| <= 255: a pair sum is below 2^17, exact) and
 * added in int32 (wrap32). The int32 form restores the channel order per output; the fused
 * requantization instead carries bias and multiplier in the accumulators' order, and
 * vpackssdw of the low and high results puts the 16 channels back in order (as int16). */
/* The fused requantization's constants, in the accumulators' lane order (bias 0 and no
 * requantization for int32 output) */
typedef struct { __m256i blo, bhi, zp, qmin; __m256 mlo, mhi, fhi; } dw_qregs;

static inline __attribute__((always_inline)) dw_qregs dw_qregs_load(const ql_dw_q *q)
{
    dw_qregs k;
    k.blo = k.bhi = k.zp = k.qmin = _mm256_setzero_si256();   /* zp, qmin: int16 lanes */
    k.mlo = k.mhi = k.fhi = _mm256_setzero_ps();
    if (q) {
        __m256i b0 = _mm256_loadu_si256((const __m256i *)q->bias), b1 = _mm256_loadu_si256((const __m256i *)(q->bias + 8));
        __m256 m0 = _mm256_loadu_ps(q->mult), m1 = _mm256_loadu_ps(q->mult + 8);
        k.blo = _mm256_permute2x128_si256(b0, b1, 0x20);   /* channels 0-3, 8-11 */
        k.bhi = _mm256_permute2x128_si256(b0, b1, 0x31);   /* channels 4-7, 12-15 */
        k.mlo = _mm256_permute2f128_ps(m0, m1, 0x20);
        k.mhi = _mm256_permute2f128_ps(m0, m1, 0x31);
        k.fhi = _mm256_set1_ps(q->hi);
        k.zp = _mm256_set1_epi16((int16_t)q->zp);
        k.qmin = _mm256_set1_epi16((int16_t)((int32_t)q->lo + q->zp));
    }
    return k;
}

/* One output's 16 channels requantized to int16 in channel order (channels 0-7 | 8-15), in
 * [qmin, qmax]. The contract (epilogue.c): v = float32(acc) * mult, clamped to [lo, hi] with
 * NaN to lo, rounded to nearest even, + zp; lo = qmin - zp, hi = qmax - zp are integers in
 * [-255, 255] (qlinear.h). Here: minps(hi, v) first (hi as the FIRST operand: vminps returns
 * its second operand, v, when one is NaN), so every value is at most hi and NaN stays NaN;
 * cvtps2dq rounds to nearest even and gives INT32_MIN for NaN and for anything below -2^31;
 * vpackssdw saturates to int16 (below -32768: -32768, still below lo), + zp saturating
 * (vpaddsw: at most hi + zp = qmax, no overflow), and the lower clamp is done on the integers,
 * vpmaxsw with qmin = lo + zp: for an integer bound, rounding then clamping equals clamping then
 * rounding, and the saturated values (below lo + zp) go to qmin as NaN and -inf must. */
static inline __attribute__((always_inline)) __m256i dw_cl_req16(__m256i lo, __m256i hi, const dw_qregs *k)
{
    __m256 vlo = _mm256_min_ps(k->fhi, _mm256_mul_ps(_mm256_cvtepi32_ps(lo), k->mlo));
    __m256 vhi = _mm256_min_ps(k->fhi, _mm256_mul_ps(_mm256_cvtepi32_ps(hi), k->mhi));
    __m256i p16 = _mm256_packs_epi32(_mm256_cvtps_epi32(vlo), _mm256_cvtps_epi32(vhi));
    return _mm256_max_epi16(_mm256_adds_epi16(p16, k->zp), k->qmin);
}

/* Output ro of a chunk: int32 accumulators in channel order, or the requantized bytes */
static inline __attribute__((always_inline)) void dw_cl_out(__m256i lo, __m256i hi, const dw_qregs *k,
                                                            const ql_dw_q *q, int is_signed, void *out, ptrdiff_t ro)
{
    if (!q) {
        int32_t *acc = (int32_t *)out + 16 * ro;
        _mm256_storeu_si256((__m256i *)acc, _mm256_permute2x128_si256(lo, hi, 0x20));
        _mm256_storeu_si256((__m256i *)(acc + 8), _mm256_permute2x128_si256(lo, hi, 0x31));
        return;
    }
    /* int16 in [qmin, qmax]: the byte pack is exact */
    __m256i p16 = dw_cl_req16(lo, hi, k);
    __m128i a = _mm256_castsi256_si128(p16), b = _mm256_extracti128_si256(p16, 1);
    __m128i p8 = is_signed ? _mm_packs_epi16(a, b) : _mm_packus_epi16(a, b);
    _mm_storeu_si128((__m128i *)((uint8_t *)out + 16 * ro), p8);
}

/* Two outputs at once (ra, rb): one 256-bit byte pack for both, then each half stored */
static inline __attribute__((always_inline)) void dw_cl_out2(__m256i la, __m256i ha, __m256i lb, __m256i hb,
                                                             const dw_qregs *k, const ql_dw_q *q, int is_signed,
                                                             void *out, ptrdiff_t ra, ptrdiff_t rb)
{
    if (!q) {
        dw_cl_out(la, ha, k, q, is_signed, out, ra);
        dw_cl_out(lb, hb, k, q, is_signed, out, rb);
        return;
    }
    __m256i pa = dw_cl_req16(la, ha, k), pb = dw_cl_req16(lb, hb, k);
    /* [a0-7 b0-7 | a8-15 b8-15], then qwords 0 2 1 3: [a0-15 | b0-15] */
    __m256i p8 = is_signed ? _mm256_packs_epi16(pa, pb) : _mm256_packus_epi16(pa, pb);
    p8 = _mm256_permute4x64_epi64(p8, 0xD8);
    _mm_storeu_si128((__m128i *)((uint8_t *)out + 16 * ra), _mm256_castsi256_si128(p8));
    _mm_storeu_si128((__m128i *)((uint8_t *)out + 16 * rb), _mm256_extracti128_si256(p8, 1));
}

static inline __attribute__((always_inline)) void dw_cl_body(const int16_t *X, const ptrdiff_t *toff,
                                                             const __m256i *wl, const __m256i *wh, int np,
                                                             ptrdiff_t step, ptrdiff_t row_step, int rows, int ow,
                                                             const ql_dw_q *q, int is_signed, void *out)
{
    /* byte offsets of the taps, in locals: the stores below may alias toff otherwise */
    ptrdiff_t tb[64];
    for (int t = 0; t < 2 * np; t++) tb[t] = toff[t] * 32;
    const char *xb = (const char *)X;
    const ptrdiff_t ostep = step * 32;
    dw_qregs k = dw_qregs_load(q);
    for (int r = 0; r < rows; r++)
    for (int o = 0, ro = r * ow; o < ow; o++, ro++) {
        const char *xo = xb + (ptrdiff_t)r * row_step * 32 + (ptrdiff_t)o * ostep;
        /* the bias starts the sum (wrap32 addition is associative: the same acc + bias) */
        __m256i lo = k.blo, hi = k.bhi;
        for (int j = 0; j < np; j++) {
            __m256i a = _mm256_loadu_si256((const __m256i *)(xo + tb[2 * j]));
            __m256i b = _mm256_loadu_si256((const __m256i *)(xo + tb[2 * j + 1]));
            lo = _mm256_add_epi32(lo, _mm256_madd_epi16(_mm256_unpacklo_epi16(a, b), wl[j]));
            hi = _mm256_add_epi32(hi, _mm256_madd_epi16(_mm256_unpackhi_epi16(a, b), wh[j]));
        }
        dw_cl_out(lo, hi, &k, q, is_signed, out, ro);
    }
}

static inline __attribute__((always_inline)) void dw_cl_np(const int16_t *X, const ptrdiff_t *toff,
                                                           const __m256i *wl, const __m256i *wh, int np,
                                                           ptrdiff_t step, ptrdiff_t row_step, int rows, int ow,
                                                           const ql_dw_q *q, void *out)
{
    if (!q) dw_cl_body(X, toff, wl, wh, np, step, row_step, rows, ow, NULL, 0, out);
    else if (q->is_signed) dw_cl_body(X, toff, wl, wh, np, step, row_step, rows, ow, q, 1, out);
    else dw_cl_body(X, toff, wl, wh, np, step, row_step, rows, ow, q, 0, out);
}

/* 3x3, stride 1, dilation 1, two output rows at a time: rows r and r + 1 read input rows
 * r .. r + 3, so horizontal pairs U(i) = (x[i][o], x[i][o+1]) serve both outputs, and the
 * third column is paired vertically, V(i) = (x[i][o+2], x[i+1][o+2]):
 *   out r     = U(r)·(w00,w01) + U(r+1)·(w10,w11) + U(r+2)·(w20,w21) + V(r)·(w02,w12)   + V(r+2)·(w22,0)
 *   out r + 1 = U(r+1)·(w00,w01) + U(r+2)·(w10,w11) + U(r+3)·(w20,w21) + V(r+1)·(w02,w12) + V(r+2)·(0,w22)
 * 7 interleaved pairs and 12 loads per two outputs instead of 10 and 20; the same vpmaddwd
 * pair sums (|x|, |w| <= 255: below 2^17, exact) and wrap32 additions as dw_cl_body. */
static inline __attribute__((always_inline)) void dw_cl_3x3_body(const int16_t *X, const int16_t *wt, ptrdiff_t pitch,
                                                                 int rows, int ow, const ql_dw_q *q,
                                                                 int is_signed, void *out)
{
#define QL_W(t) _mm256_loadu_si256((const __m256i *)(wt + 16 * (t)))
    const __m256i zero = _mm256_setzero_si256();
    __m256i wl[6], wh[6];   /* (w00,w01), (w10,w11), (w20,w21), (w02,w12), (w22,0), (0,w22) */
    for (int kh = 0; kh < 3; kh++) {
        wl[kh] = _mm256_unpacklo_epi16(QL_W(3 * kh), QL_W(3 * kh + 1));
        wh[kh] = _mm256_unpackhi_epi16(QL_W(3 * kh), QL_W(3 * kh + 1));
    }
    wl[3] = _mm256_unpacklo_epi16(QL_W(2), QL_W(5));
    wh[3] = _mm256_unpackhi_epi16(QL_W(2), QL_W(5));
    wl[4] = _mm256_unpacklo_epi16(QL_W(8), zero);
    wh[4] = _mm256_unpackhi_epi16(QL_W(8), zero);
    wl[5] = _mm256_unpacklo_epi16(zero, QL_W(8));
    wh[5] = _mm256_unpackhi_epi16(zero, QL_W(8));
#undef QL_W
    dw_qregs k = dw_qregs_load(q);
    const ptrdiff_t pb = pitch * 32;
    int r = 0;
    for (; r + 1 < rows; r += 2) {
        const char *x0 = (const char *)X + (ptrdiff_t)r * pb;
        for (int o = 0; o < ow; o++) {
            const char *xo = x0 + (ptrdiff_t)o * 32;
            __m256i l0 = k.blo, h0 = k.bhi, l1 = k.blo, h1 = k.bhi;
            __m256i c[4];
            for (int i = 0; i < 4; i++) {
                const char *xi = xo + i * pb;
                __m256i a = _mm256_loadu_si256((const __m256i *)xi);
                __m256i b = _mm256_loadu_si256((const __m256i *)(xi + 32));
                c[i] = _mm256_loadu_si256((const __m256i *)(xi + 64));
                __m256i ul = _mm256_unpacklo_epi16(a, b), uh = _mm256_unpackhi_epi16(a, b);
                if (i < 3) {   /* U(r + i): row i of out r */
                    l0 = _mm256_add_epi32(l0, _mm256_madd_epi16(ul, wl[i]));
                    h0 = _mm256_add_epi32(h0, _mm256_madd_epi16(uh, wh[i]));
                }
                if (i > 0) {   /* row i - 1 of out r + 1 */
                    l1 = _mm256_add_epi32(l1, _mm256_madd_epi16(ul, wl[i - 1]));
                    h1 = _mm256_add_epi32(h1, _mm256_madd_epi16(uh, wh[i - 1]));
                }
            }
            __m256i v0l = _mm256_unpacklo_epi16(c[0], c[1]), v0h = _mm256_unpackhi_epi16(c[0], c[1]);
            __m256i v1l = _mm256_unpacklo_epi16(c[1], c[2]), v1h = _mm256_unpackhi_epi16(c[1], c[2]);
            __m256i v2l = _mm256_unpacklo_epi16(c[2], c[3]), v2h = _mm256_unpackhi_epi16(c[2], c[3]);
            l0 = _mm256_add_epi32(l0, _mm256_madd_epi16(v0l, wl[3]));
            h0 = _mm256_add_epi32(h0, _mm256_madd_epi16(v0h, wh[3]));
            l0 = _mm256_add_epi32(l0, _mm256_madd_epi16(v2l, wl[4]));
            h0 = _mm256_add_epi32(h0, _mm256_madd_epi16(v2h, wh[4]));
            l1 = _mm256_add_epi32(l1, _mm256_madd_epi16(v1l, wl[3]));
            h1 = _mm256_add_epi32(h1, _mm256_madd_epi16(v1h, wh[3]));
            l1 = _mm256_add_epi32(l1, _mm256_madd_epi16(v2l, wl[5]));
            h1 = _mm256_add_epi32(h1, _mm256_madd_epi16(v2h, wh[5]));
            dw_cl_out2(l0, h0, l1, h1, &k, q, is_signed, out, (ptrdiff_t)r * ow + o, (ptrdiff_t)(r + 1) * ow + o);
        }
    }
    if (r < rows) {   /* an odd last row: the general body (taps in t = 3*kh + kw order) */
        static const ptrdiff_t t9[9] = {0, 1, 2, 0, 1, 2, 0, 1, 2};
        ptrdiff_t toff[10];
        for (int t = 0; t < 9; t++) toff[t] = t9[t] + (t / 3) * pitch;
        toff[9] = 0;
        __m256i gl[5], gh[5];
        for (int p = 0; p < 5; p++) {
            __m256i a = _mm256_loadu_si256((const __m256i *)(wt + 32 * p));
            __m256i b = _mm256_loadu_si256((const __m256i *)(wt + 32 * p + 16));
            gl[p] = _mm256_unpacklo_epi16(a, b);
            gh[p] = _mm256_unpackhi_epi16(a, b);
        }
        char *o8 = (char *)out + (ptrdiff_t)r * ow * 16 * (q ? 1 : 4);
        dw_cl_body(X + (ptrdiff_t)r * pitch * 16, toff, gl, gh, 5, 1, pitch, 1, ow, q, is_signed, o8);
    }
}

void ql_dw_cl_avx2(const int16_t *X, const ptrdiff_t *toff, const int16_t *wt, int npairs, ptrdiff_t step,
                   ptrdiff_t row_step, int rows, int ow, const ql_dw_q *q, void *out)
{
    /* dense 3x3 with stride 1 (output rows one input row apart): the two-row body */
    if (npairs == 5 && step == 1 && rows > 1) {
        ptrdiff_t P = row_step;
        int dense = toff[9] == 0;
        for (int t = 0; t < 9; t++) dense &= toff[t] == (t % 3) + (t / 3) * P;
        if (dense) {
            if (!q) dw_cl_3x3_body(X, wt, P, rows, ow, NULL, 0, out);
            else if (q->is_signed) dw_cl_3x3_body(X, wt, P, rows, ow, q, 1, out);
            else dw_cl_3x3_body(X, wt, P, rows, ow, q, 0, out);
            return;
        }
    }
    enum { MAXP = 32 };
    __m256i wl[MAXP], wh[MAXP];
    for (int k = 0; k < npairs && k < MAXP; k++) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(wt + 32 * k));
        __m256i b = _mm256_loadu_si256((const __m256i *)(wt + 32 * k + 16));
        wl[k] = _mm256_unpacklo_epi16(a, b);
        wh[k] = _mm256_unpackhi_epi16(a, b);
    }
    /* 3x3 (5 pairs) and 2x2 / 1x3 / 3x1 (2 pairs) unrolled: tap offsets stay in registers;
     * other kernels loop over their pairs */
    if (npairs == 5) dw_cl_np(X, toff, wl, wh, 5, step, row_step, rows, ow, q, out);
    else if (npairs == 2) dw_cl_np(X, toff, wl, wh, 2, step, row_step, rows, ow, q, out);
    else dw_cl_np(X, toff, wl, wh, npairs < MAXP ? npairs : MAXP, step, row_step, rows, ow, q, out);
}

/* The channels-last fill (conv/depthwise_cl.c's transpose16_i16, same contract): 16 positions x 16
 * channels of bytes (rows src + c*cs) to 16 positions of 16 int16 (bytes ^ flip) - zsub, position
 * k at dst + doff[k] (int16 elements; doff NULL: dst + 16*k). Channels c and c + 8 share a ymm
 * (lanes 0 and 1), so each in-lane unpack stage transposes both halves at once: three stages
 * leave, per lane, one position's 8 channels per qword, which widening against zero turns into
 * that position's 16 int16 (lane 0: channels 0-7, lane 1: 8-15). bytes ^ flip are uint8, zsub
 * 0 or zx in uint8 form: |x - zsub| <= 255 fits int16. The xor and the subtraction are left
 * out when they do nothing (uint8 x; the raw form). */
static inline __attribute__((always_inline)) void dw_t16(const uint8_t *src, ptrdiff_t cs, uint8_t flip, int32_t zsub,
                                                         int16_t *dst, const ptrdiff_t *doff, int do_flip, int do_sub,
                                                         int do_off)
{
    const __m256i f = _mm256_set1_epi8((char)flip), z = _mm256_set1_epi16((int16_t)zsub), zero = _mm256_setzero_si256();
    __m256i r[8], a[8], b[8];
    for (int i = 0; i < 8; i++) {
        __m256i v = _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(src + i * cs)));
        v = _mm256_inserti128_si256(v, _mm_loadu_si128((const __m128i *)(src + (i + 8) * cs)), 1);
        r[i] = do_flip ? _mm256_xor_si256(v, f) : v;
    }
    /* a[j] (a[j + 4]): positions 0-7 (8-15) of channels 2j, 2j + 1, a word per position */
    for (int j = 0; j < 4; j++) {
        a[j] = _mm256_unpacklo_epi8(r[2 * j], r[2 * j + 1]);
        a[j + 4] = _mm256_unpackhi_epi8(r[2 * j], r[2 * j + 1]);
    }
    /* b[4h + 2g + m]: positions 8h + 4g .. + 3 of channels 4m .. 4m + 3, a dword per position */
    for (int h = 0; h < 2; h++)
        for (int m = 0; m < 2; m++) {
            b[4 * h + m] = _mm256_unpacklo_epi16(a[4 * h + 2 * m], a[4 * h + 2 * m + 1]);
            b[4 * h + 2 + m] = _mm256_unpackhi_epi16(a[4 * h + 2 * m], a[4 * h + 2 * m + 1]);
        }
    for (int h = 0; h < 2; h++)
        for (int g = 0; g < 2; g++) {
            /* qwords: positions k, k + 1 (and k + 2, k + 3) of channels 0-7, k = 8h + 4g */
            __m256i lo = _mm256_unpacklo_epi32(b[4 * h + 2 * g], b[4 * h + 2 * g + 1]);
            __m256i hi = _mm256_unpackhi_epi32(b[4 * h + 2 * g], b[4 * h + 2 * g + 1]);
            __m256i v[4] = {_mm256_unpacklo_epi8(lo, zero), _mm256_unpackhi_epi8(lo, zero),
                            _mm256_unpacklo_epi8(hi, zero), _mm256_unpackhi_epi8(hi, zero)};
            int k = 8 * h + 4 * g;
            for (int e = 0; e < 4; e++) {
                int16_t *o = dst + (do_off ? doff[k + e] : 16 * (k + e));
                _mm256_storeu_si256((__m256i *)o, do_sub ? _mm256_sub_epi16(v[e], z) : v[e]);
            }
        }
}

void ql_dw_t16_avx2(const uint8_t *src, ptrdiff_t cs, uint8_t flip, int32_t zsub, int16_t *dst, const ptrdiff_t *doff)
{
    /* the raw uint8 form (no xor, no subtraction) is the requantized output's common case */
    if (!flip && !zsub) {
        if (doff) dw_t16(src, cs, flip, zsub, dst, doff, 0, 0, 1);
        else dw_t16(src, cs, flip, zsub, dst, doff, 0, 0, 0);
    } else if (doff) {
        dw_t16(src, cs, flip, zsub, dst, doff, 1, 1, 1);
    } else {
        dw_t16(src, cs, flip, zsub, dst, doff, 1, 1, 0);
    }
}

/* The channels-last store (conv/depthwise_cl.c's dwcl_store_q, same contract, cols >= 32): requantized
 * bytes Q [cols][16] to the planes y + c*P (c < nch). Two 16 x 16 byte transposes per pass,
 * one per 128-bit lane (the in-lane unpacks of transpose16_u8): lane 0 takes positions j..j+15,
 * lane 1 j+16..j+31, so channel c's 32 positions leave as one store; the last pass overlaps
 * the one before (the same bytes written twice). */
void ql_dw_store_avx2(const uint8_t *Q, int nch, int cols, uint8_t *y, ptrdiff_t P)
{
    for (int j = 0;; j += 32) {
        if (j + 32 > cols) j = cols - 32;
        __m256i r[16], u[16], a[8], b[8], t[16];
        for (int k = 0; k < 16; k++) {
            __m256i v = _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(Q + 16 * (size_t)(j + k))));
            r[k] = _mm256_inserti128_si256(v, _mm_loadu_si128((const __m128i *)(Q + 16 * (size_t)(j + 16 + k))), 1);
        }
        for (int c = 0; c < 8; c++) {   /* u[c]: channels 0-7 of positions 2c, 2c+1 interleaved; u[c+8]: 8-15 */
            u[c] = _mm256_unpacklo_epi8(r[2 * c], r[2 * c + 1]);
            u[c + 8] = _mm256_unpackhi_epi8(r[2 * c], r[2 * c + 1]);
        }
        for (int h = 0; h < 2; h++) {
            __m256i *v = u + 8 * h;
            for (int c = 0; c < 4; c++) {
                a[c] = _mm256_unpacklo_epi16(v[2 * c], v[2 * c + 1]);
                a[c + 4] = _mm256_unpackhi_epi16(v[2 * c], v[2 * c + 1]);
            }
            for (int g = 0; g < 2; g++)
                for (int c = 0; c < 2; c++) {
                    b[4 * g + 2 * c] = _mm256_unpacklo_epi32(a[4 * g + 2 * c], a[4 * g + 2 * c + 1]);
                    b[4 * g + 2 * c + 1] = _mm256_unpackhi_epi32(a[4 * g + 2 * c], a[4 * g + 2 * c + 1]);
                }
            for (int g = 0; g < 2; g++)
                for (int e = 0; e < 2; e++) {   /* channel k = 8h + 4g + 2e (and k + 1) */
                    t[8 * h + 4 * g + 2 * e] = _mm256_unpacklo_epi64(b[4 * g + e], b[4 * g + 2 + e]);
                    t[8 * h + 4 * g + 2 * e + 1] = _mm256_unpackhi_epi64(b[4 * g + e], b[4 * g + 2 + e]);
                }
        }
        for (int c = 0; c < nch; c++) _mm256_storeu_si256((__m256i *)(y + c * P + j), t[c]);
        if (j + 32 >= cols) break;
    }
}

/* The 7-bit path's stride-2 copy (conv/implicit_run.c's ig_split_s2, for both copy tasks; S8U8 form):
 * from 4 padded raw rows raw + q*rs (channels q < 4), position j < len (a multiple of 16) of
 * column phase 0 (raw byte 2j) to d0 and of phase 1 (byte 2j + 1) to d1, each as the 4
 * channels' bytes ^ flip side by side (4 bytes a position: conv/rows.c's interleave4 of
 * split_phase's rows, in one pass; reads raw[q*rs, q*rs + 2 len)). A 32-byte load holds 16
 * positions of both phases, 8 per lane; vpshufb gathers each lane's even bytes into its low
 * and the odd bytes into its high qword, so the unpacks of two channels' low (high) qwords
 * interleave phase 0 (1), and those of the channel pairs give, per lane, 4 positions per
 * xmm: lane 0 positions 0-7, lane 1 8-15, put back in order by vperm2i128. */
void ql_ig_s2x4_avx2(const uint8_t *raw, ptrdiff_t rs, uint8_t flip, uint8_t *d0, uint8_t *d1, int64_t len)
{
    const __m256i f = _mm256_set1_epi8((char)flip);
    const __m256i sel = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                         0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    for (int64_t j = 0; j < len; j += 16) {
        __m256i v[4];
        for (int q = 0; q < 4; q++)
            v[q] = _mm256_shuffle_epi8(_mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(raw + q * rs + 2 * j)), f),
                                       sel);
        __m256i ab0 = _mm256_unpacklo_epi8(v[0], v[1]), ab1 = _mm256_unpackhi_epi8(v[0], v[1]);
        __m256i cd0 = _mm256_unpacklo_epi8(v[2], v[3]), cd1 = _mm256_unpackhi_epi8(v[2], v[3]);
        __m256i e0 = _mm256_unpacklo_epi16(ab0, cd0), e1 = _mm256_unpackhi_epi16(ab0, cd0);
        __m256i o0 = _mm256_unpacklo_epi16(ab1, cd1), o1 = _mm256_unpackhi_epi16(ab1, cd1);
        _mm256_storeu_si256((__m256i *)(d0 + 4 * j), _mm256_permute2x128_si256(e0, e1, 0x20));
        _mm256_storeu_si256((__m256i *)(d0 + 4 * j + 32), _mm256_permute2x128_si256(e0, e1, 0x31));
        _mm256_storeu_si256((__m256i *)(d1 + 4 * j), _mm256_permute2x128_si256(o0, o1, 0x20));
        _mm256_storeu_si256((__m256i *)(d1 + 4 * j + 32), _mm256_permute2x128_si256(o0, o1, 0x31));
    }
}

/* A conv weight row's channel pairs in the I16 form's grouped order (conv/pack_w.c's grouped_i16, 3x3
 * kernels: 9 taps): pair q's 18 source bytes a0..a8 b0..b8 (channels 2q, 2q+1) become the 18
 * int16 a0-z b0-z a1-z .. a8-z b8-z. Two 16-byte loads (bytes 0-15 and 2-17: both inside the
 * pair's 18, so no read past the row), vpshufb picks a0 b0 .. a7 b7 (b7 = byte 16 is in the
 * second load only) and a8 b8; widened (zero- or sign-extended as w's type) and centered:
 * |w - z| <= 255, an int16. Stores: 32 bytes, then the last 4 bytes alone, so nothing is
 * written past the pair (rows may belong to another thread). */
void ql_grouped_i16_t9_avx2(const uint8_t *s, int is_signed, int64_t pairs, int32_t z, int16_t *d)
{
    const __m128i m0 = _mm_setr_epi8(0, 9, 1, 10, 2, 11, 3, 12, 4, 13, 5, 14, 6, 15, 7, -128);
    const __m128i m1 = _mm_setr_epi8(-128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128,
                                     -128, -128, -128, 14);
    const __m128i m2 = _mm_setr_epi8(6, 15, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128,
                                     -128, -128, -128);
    const __m256i zv = _mm256_set1_epi16((int16_t)z);
    const __m128i zv1 = _mm_set1_epi16((int16_t)z);
    for (int64_t q = 0; q < pairs; q++) {
        const uint8_t *a = s + 18 * q;
        int16_t *o = d + 18 * q;
        __m128i v0 = _mm_loadu_si128((const __m128i *)a), v1 = _mm_loadu_si128((const __m128i *)(a + 2));
        __m128i lo = _mm_or_si128(_mm_shuffle_epi8(v0, m0), _mm_shuffle_epi8(v1, m1));
        __m128i hi = _mm_shuffle_epi8(v1, m2);
        __m256i wl = is_signed ? _mm256_cvtepi8_epi16(lo) : _mm256_cvtepu8_epi16(lo);
        __m128i wh = is_signed ? _mm_cvtepi8_epi16(hi) : _mm_cvtepu8_epi16(hi);
        _mm256_storeu_si256((__m256i *)o, _mm256_sub_epi16(wl, zv));
        int32_t last = _mm_cvtsi128_si32(_mm_sub_epi16(wh, zv1));
        memcpy(o + 16, &last, 4);
    }
}

/* The byte forms' grouped order (conv/pack_w.c's grouped_b), 9 taps: block q's 36 source bytes (4
 * channels of 9 taps, channel r's tap t at 9r + t) become d[4t + r] = (byte ^ fx) - sub (8-bit
 * wrap). Three 16-byte loads (bytes 0-15, 16-31, 20-35: inside the block, no read past the
 * row), each in both lanes; vpshufb per lane picks taps 0-3 (low lane) and 4-7 (high lane) of
 * the 4 channels, the three picks ORed (a lane a mask leaves out is zeroed by its -128s); tap
 * 8's 4 bytes by the same picks at 128 bits, stored alone so nothing is written past the
 * block (the next rows may be another thread's). */
void ql_grouped_b_t9_avx2(const uint8_t *s, int64_t blocks, uint8_t fx, uint8_t sub, uint8_t *d)
{
    const __m256i mA = _mm256_setr_epi8(0, 9, -128, -128, 1, 10, -128, -128, 2, 11, -128, -128, 3, 12, -128, -128,
                                        4, 13, -128, -128, 5, 14, -128, -128, 6, 15, -128, -128, 7, -128, -128, -128);
    const __m256i mB = _mm256_setr_epi8(-128, -128, 2, 11, -128, -128, 3, 12, -128, -128, 4, 13, -128, -128, 5, 14,
                                        -128, -128, 6, 15, -128, -128, 7, -128, -128, -128, 8, -128, -128, 0, 9, -128);
    const __m256i mC = _mm256_setr_epi8(-128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128,
                                        -128, -128, -128, -128,
                                        -128, -128, -128, -128, -128, -128, -128, 12, -128, -128, -128, 13,
                                        -128, -128, -128, 14);
    const __m128i tA = _mm_setr_epi8(8, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128,
                                     -128, -128);
    const __m128i tB = _mm_setr_epi8(-128, 1, 10, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128,
                                     -128, -128);
    const __m128i tC = _mm_setr_epi8(-128, -128, -128, 15, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128,
                                     -128, -128);
    const __m256i fv = _mm256_set1_epi8((char)fx), sv = _mm256_set1_epi8((char)sub);
    for (int64_t q = 0; q < blocks; q++) {
        const uint8_t *a = s + 36 * q;
        uint8_t *o = d + 36 * q;
        __m128i A = _mm_loadu_si128((const __m128i *)a), B = _mm_loadu_si128((const __m128i *)(a + 16)),
                Cc = _mm_loadu_si128((const __m128i *)(a + 20));
        __m256i A2 = _mm256_broadcastsi128_si256(A), B2 = _mm256_broadcastsi128_si256(B),
                C2 = _mm256_broadcastsi128_si256(Cc);
        __m256i v = _mm256_or_si256(_mm256_or_si256(_mm256_shuffle_epi8(A2, mA), _mm256_shuffle_epi8(B2, mB)),
                                    _mm256_shuffle_epi8(C2, mC));
        _mm256_storeu_si256((__m256i *)o, _mm256_sub_epi8(_mm256_xor_si256(v, fv), sv));
        __m128i t = _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(A, tA), _mm_shuffle_epi8(B, tB)), _mm_shuffle_epi8(Cc, tC));
        int32_t last = _mm_cvtsi128_si32(_mm_sub_epi8(_mm_xor_si128(t, _mm256_castsi256_si128(fv)),
                                                      _mm256_castsi256_si128(sv)));
        memcpy(o + 32, &last, 4);
    }
}

/* conv/pack_w.c's s8u8_row, 32 bytes a step (ql_s8u8_row_bulk_fn): u = byte ^ flip; a byte that
 * vpmaxub/vpminub to [lo, hi] moves is outside the bound (*bad); vpsadbw sums u (four 64-bit
 * partial sums: at most 255 * n, far below 2^64); d = u - zu (8-bit wrap, the int8 w - z for
 * a byte within the bound). Whole 32-byte blocks only. */
int64_t ql_s8u8_row_bulk_avx2(const uint8_t *s, int64_t n, uint8_t flip, uint8_t lo, uint8_t hi, uint8_t zu,
                              int8_t *d, uint32_t *usum, int *bad)
{
    const __m256i fv = _mm256_set1_epi8((char)flip), lov = _mm256_set1_epi8((char)lo),
                  hiv = _mm256_set1_epi8((char)hi), zv = _mm256_set1_epi8((char)zu), zero = _mm256_setzero_si256();
    __m256i acc = zero, out = zero;
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
        __m256i u = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(s + j)), fv);
        out = _mm256_or_si256(out, _mm256_xor_si256(u, _mm256_min_epu8(_mm256_max_epu8(u, lov), hiv)));
        acc = _mm256_add_epi64(acc, _mm256_sad_epu8(u, zero));
        if (d) _mm256_storeu_si256((__m256i *)(d + j), _mm256_sub_epi8(u, zv));
    }
    *bad = !_mm256_testz_si256(out, out);
    __m128i a = _mm_add_epi64(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    *usum = (uint32_t)_mm_cvtsi128_si32(a) + (uint32_t)_mm_cvtsi128_si32(_mm_unpackhi_epi64(a, a));
    return j;
}

/* conv/rows.c's interleave4, 32 positions a step (ql_interleave4_bulk_fn): dk[4j + q] = src[q][j] ^
 * flip. The byte and word unpacks work within 128-bit lanes, so lane 0 holds positions 0-15
 * and lane 1 positions 16-31 in four 4-position groups each; vperm2i128 puts them in order. */
int ql_interleave4_bulk_avx2(const uint8_t *const *src, uint8_t flip, uint8_t *dk, int nr)
{
    const __m256i f = _mm256_set1_epi8((char)flip);
    int j = 0;
    for (; j + 32 <= nr; j += 32) {
        __m256i a = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(src[0] + j)), f);
        __m256i b = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(src[1] + j)), f);
        __m256i c = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(src[2] + j)), f);
        __m256i e = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(src[3] + j)), f);
        __m256i ab0 = _mm256_unpacklo_epi8(a, b), ab1 = _mm256_unpackhi_epi8(a, b);
        __m256i ce0 = _mm256_unpacklo_epi8(c, e), ce1 = _mm256_unpackhi_epi8(c, e);
        __m256i q0 = _mm256_unpacklo_epi16(ab0, ce0), q1 = _mm256_unpackhi_epi16(ab0, ce0);
        __m256i q2 = _mm256_unpacklo_epi16(ab1, ce1), q3 = _mm256_unpackhi_epi16(ab1, ce1);
        __m256i *o = (__m256i *)(dk + 4 * j);
        _mm256_storeu_si256(o, _mm256_permute2x128_si256(q0, q1, 0x20));
        _mm256_storeu_si256(o + 1, _mm256_permute2x128_si256(q2, q3, 0x20));
        _mm256_storeu_si256(o + 2, _mm256_permute2x128_si256(q0, q1, 0x31));
        _mm256_storeu_si256(o + 3, _mm256_permute2x128_si256(q2, q3, 0x31));
    }
    return j;
}

#pragma GCC pop_options
#else
typedef int ql_conv_avx2_empty;   /* ISO C: a translation unit is not empty */
#endif
