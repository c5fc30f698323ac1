/* The x86-64 baseline's vector loops (SSE2: every x86-64 CPU has it, so no target attribute
 * and no dispatch), for the convolution, GEMM-driver and element-wise files, which hold no
 * ISA-specific code themselves. Each helper does the whole 16-byte blocks of a loop it can take
 * and returns where it stopped (elsewhere it does nothing and returns its start); the caller's portable
 * loop does the rest, so the result is the caller's own whatever the split. The levels' wider
 * loops (AVX2, AVX-512) come through the kernel tables, never through here.
 * static inline (always_inline on the per-row paths): they sit on the copies' and packers'
 * inner loops, where a call would cost what the vector step saves. */
#ifndef QLINEAR_ISA_X86_SSE2_H
#define QLINEAR_ISA_X86_SSE2_H

#include "qlinear.h"

#include <string.h>
#if QL_X86
#include <emmintrin.h>   /* SSE2: the x86-64 baseline, no target attribute needed */
#endif

#define QL_VEC_INLINE static inline __attribute__((always_inline))

/* Non-temporal stores are weakly ordered: drain them (sfence) before a release store that
 * publishes the values (gemm.c: the end of a task that streamed). No such stores elsewhere. */
QL_VEC_INLINE void ql_store_fence(void)
{
#if QL_X86
    _mm_sfence();
#endif
}

/* The n bytes at src to dst (16-byte moves, the last one overlapping, where n >= 16; else
 * memcpy), inline: the implicit GEMM's rows are short (7 to 56 bytes in ResNet-50), where a
 * libc call costs more than the copy. */
QL_VEC_INLINE void ql_vec_copy_row(uint8_t *dst, const uint8_t *src, int64_t n)
{
#if QL_X86
    if (n >= 16) {
        int64_t j = 0;
        for (; j + 16 <= n; j += 16) _mm_storeu_si128((__m128i *)(dst + j), _mm_loadu_si128((const __m128i *)(src + j)));
        if (j < n) _mm_storeu_si128((__m128i *)(dst + n - 16), _mm_loadu_si128((const __m128i *)(src + n - 16)));
        return;
    }
#endif
    memcpy(dst, src, (size_t)n);
}

/* dst[i] = base[off + 2 i] from i while i + 16 <= end and the 32 bytes read stay below avail
 * (off + 2 i + 32 <= avail): 16 outputs from 32 bytes, even bytes kept (mask, pack). */
QL_VEC_INLINE int64_t ql_vec_even_bytes(const uint8_t *base, ptrdiff_t off, int64_t i, int64_t end, int64_t avail,
                                        uint8_t *dst)
{
#if QL_X86
    const __m128i lo8 = _mm_set1_epi16(0x00FF);
    for (; i + 16 <= end && off + 2 * i + 32 <= avail; i += 16) {
        const uint8_t *q = base + off + 2 * i;
        __m128i v0 = _mm_and_si128(_mm_loadu_si128((const __m128i *)q), lo8);
        __m128i v1 = _mm_and_si128(_mm_loadu_si128((const __m128i *)(q + 16)), lo8);
        _mm_storeu_si128((__m128i *)(dst + i), _mm_packus_epi16(v0, v1));
    }
#else
    (void)base; (void)off; (void)end; (void)avail; (void)dst;
#endif
    return i;
}

/* Two raw 8-bit rows into [j][2] int16 pairs (a[j] - zx, b[j] - zx) for j < nr (|x - zx| <= 255
 * fits int16), 16 positions a step; returns the positions done. */
QL_VEC_INLINE int ql_vec_pair_i16(const uint8_t *a, const uint8_t *b, int type, int32_t zx, int16_t *d, int nr)
{
    int j = 0;
#if QL_X86
    const __m128i z = _mm_set1_epi16((int16_t)zx);
    for (; j + 16 <= nr; j += 16) {
        __m128i va = _mm_loadu_si128((const __m128i *)(a + j));
        __m128i vb = _mm_loadu_si128((const __m128i *)(b + j));
        __m128i a0, a1, b0, b1;
        if (type == QL_U8) {
            const __m128i zero = _mm_setzero_si128();
            a0 = _mm_unpacklo_epi8(va, zero); a1 = _mm_unpackhi_epi8(va, zero);
            b0 = _mm_unpacklo_epi8(vb, zero); b1 = _mm_unpackhi_epi8(vb, zero);
        } else {  /* sign extension: the byte in the high half, arithmetic shift down */
            a0 = _mm_srai_epi16(_mm_unpacklo_epi8(va, va), 8); a1 = _mm_srai_epi16(_mm_unpackhi_epi8(va, va), 8);
            b0 = _mm_srai_epi16(_mm_unpacklo_epi8(vb, vb), 8); b1 = _mm_srai_epi16(_mm_unpackhi_epi8(vb, vb), 8);
        }
        a0 = _mm_sub_epi16(a0, z); a1 = _mm_sub_epi16(a1, z);
        b0 = _mm_sub_epi16(b0, z); b1 = _mm_sub_epi16(b1, z);
        __m128i *o = (__m128i *)(d + 2 * j);
        _mm_storeu_si128(o, _mm_unpacklo_epi16(a0, b0));
        _mm_storeu_si128(o + 1, _mm_unpackhi_epi16(a0, b0));
        _mm_storeu_si128(o + 2, _mm_unpacklo_epi16(a1, b1));
        _mm_storeu_si128(o + 3, _mm_unpackhi_epi16(a1, b1));
    }
#else
    (void)a; (void)b; (void)type; (void)zx; (void)d; (void)nr;
#endif
    return j;
}

/* Stride 2, both column phases of a channel pair's raw rows a and b at once, the I16 form:
 * d0[2j], d0[2j+1] = a[2j] - zx, b[2j] - zx and d1 the same of a[2j+1], b[2j+1], 8 positions a
 * step from 16 raw bytes per channel (each 16-bit lane holds an even byte, low, and an odd
 * one, high, widened by mask / shift in place); returns the positions done (j + 8 <= len). */
QL_VEC_INLINE int64_t ql_vec_pair_i16_s2(const uint8_t *a, const uint8_t *b, int type, int32_t zx, int16_t *d0,
                                         int16_t *d1, int64_t len)
{
    int64_t j = 0;
#if QL_X86
    const __m128i z = _mm_set1_epi16((int16_t)zx), lo8 = _mm_set1_epi16(0x00FF);
    for (; j + 8 <= len; j += 8) {
        __m128i va = _mm_loadu_si128((const __m128i *)(a + 2 * j));
        __m128i vb = _mm_loadu_si128((const __m128i *)(b + 2 * j));
        __m128i ae, ao, be, bo;
        if (type == QL_U8) {
            ae = _mm_and_si128(va, lo8); ao = _mm_srli_epi16(va, 8);
            be = _mm_and_si128(vb, lo8); bo = _mm_srli_epi16(vb, 8);
        } else {   /* sign extension: the byte in the high half, arithmetic shift down */
            ae = _mm_srai_epi16(_mm_slli_epi16(va, 8), 8); ao = _mm_srai_epi16(va, 8);
            be = _mm_srai_epi16(_mm_slli_epi16(vb, 8), 8); bo = _mm_srai_epi16(vb, 8);
        }
        ae = _mm_sub_epi16(ae, z); ao = _mm_sub_epi16(ao, z);
        be = _mm_sub_epi16(be, z); bo = _mm_sub_epi16(bo, z);
        _mm_storeu_si128((__m128i *)(d0 + 2 * j), _mm_unpacklo_epi16(ae, be));
        _mm_storeu_si128((__m128i *)(d0 + 2 * j + 8), _mm_unpackhi_epi16(ae, be));
        _mm_storeu_si128((__m128i *)(d1 + 2 * j), _mm_unpacklo_epi16(ao, bo));
        _mm_storeu_si128((__m128i *)(d1 + 2 * j + 8), _mm_unpackhi_epi16(ao, bo));
    }
#else
    (void)a; (void)b; (void)type; (void)zx; (void)d0; (void)d1; (void)len;
#endif
    return j;
}

/* Four raw rows side by side, dk[4j + q] = src[q][j] ^ flip, from j while j + 16 <= nr;
 * returns where it stopped. */
QL_VEC_INLINE int ql_vec_interleave4(const uint8_t *const *src, uint8_t flip, uint8_t *dk, int j, int nr)
{
#if QL_X86
    const __m128i f = _mm_set1_epi8((char)flip);
    for (; j + 16 <= nr; j += 16) {
        __m128i a = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(src[0] + j)), f);
        __m128i b = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(src[1] + j)), f);
        __m128i c = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(src[2] + j)), f);
        __m128i e = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(src[3] + j)), f);
        __m128i ab0 = _mm_unpacklo_epi8(a, b), ab1 = _mm_unpackhi_epi8(a, b);
        __m128i ce0 = _mm_unpacklo_epi8(c, e), ce1 = _mm_unpackhi_epi8(c, e);
        __m128i *o = (__m128i *)(dk + 4 * j);
        _mm_storeu_si128(o, _mm_unpacklo_epi16(ab0, ce0));
        _mm_storeu_si128(o + 1, _mm_unpackhi_epi16(ab0, ce0));
        _mm_storeu_si128(o + 2, _mm_unpacklo_epi16(ab1, ce1));
        _mm_storeu_si128(o + 3, _mm_unpackhi_epi16(ab1, ce1));
    }
#else
    (void)src; (void)flip; (void)dk; (void)nr;
#endif
    return j;
}

/* *sum += the bytes s[0, j) in the u8 form (s ^ flip), wrap32, for the whole 16-byte blocks of
 * n (psadbw: 8-byte sums in 64-bit lanes; their low 32 bits summed: wrap32); returns j. */
QL_VEC_INLINE int64_t ql_vec_sum_u8(const uint8_t *s, int64_t n, uint8_t flip, uint32_t *sum)
{
    int64_t j = 0;
#if QL_X86
    const __m128i fv = _mm_set1_epi8((char)flip), zero = _mm_setzero_si128();
    __m128i acc = zero;
    for (; j + 16 <= n; j += 16)
        acc = _mm_add_epi64(acc, _mm_sad_epu8(_mm_xor_si128(_mm_loadu_si128((const __m128i *)(s + j)), fv), zero));
    *sum += (uint32_t)_mm_cvtsi128_si32(acc) + (uint32_t)_mm_cvtsi128_si32(_mm_unpackhi_epi64(acc, acc));
#else
    (void)s; (void)n; (void)flip; (void)sum;
#endif
    return j;
}

/* conv/pack_w.c's s8u8_row from j, 16 bytes a step (ql_s8u8_row_bulk_fn's contract with a start):
 * u = s ^ flip; *bad |= some u outside [lo, hi] (pmaxub/pminub clamp: a byte that moves is
 * outside); *usum += sum of u (psadbw, wrap32); d[j] = u - zu (d NULL: not written). */
QL_VEC_INLINE int64_t ql_vec_s8u8_row(const uint8_t *s, int64_t j, int64_t n, uint8_t flip, uint8_t lo, uint8_t hi,
                                      uint8_t zu, int8_t *d, uint32_t *usum, int *bad)
{
#if QL_X86
    const __m128i fv = _mm_set1_epi8((char)flip), lov = _mm_set1_epi8((char)lo), hiv = _mm_set1_epi8((char)hi),
                  zv = _mm_set1_epi8((char)zu), zero = _mm_setzero_si128();
    __m128i acc = zero, out = zero;
    for (; j + 16 <= n; j += 16) {
        __m128i u = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(s + j)), fv);
        out = _mm_or_si128(out, _mm_xor_si128(u, _mm_min_epu8(_mm_max_epu8(u, lov), hiv)));
        acc = _mm_add_epi64(acc, _mm_sad_epu8(u, zero));
        if (d) _mm_storeu_si128((__m128i *)(d + j), _mm_sub_epi8(u, zv));
    }
    *bad |= _mm_movemask_epi8(_mm_cmpeq_epi8(out, zero)) != 0xFFFF;
    *usum += (uint32_t)_mm_cvtsi128_si32(acc) + (uint32_t)_mm_cvtsi128_si32(_mm_unpackhi_epi64(acc, acc));
#else
    (void)s; (void)n; (void)flip; (void)lo; (void)hi; (void)zu; (void)d; (void)usum; (void)bad;
#endif
    return j;
}

/* conv/pack_w.c's grouped I16 order, block q (channels a and b = a + taps) in chunks of 16
 * taps: 16-byte loads of both channels, punpck{l,h}bw pairs them, and only the 4-tap quarters
 * holding valid taps are widened (minus z) and stored at dq. The bounds keep the reads inside
 * the row's n_in source bytes and the writes inside its n_out entries; returns the taps done. */
QL_VEC_INLINE int64_t ql_vec_grouped_i16(const uint8_t *a, const uint8_t *b, int16_t *dq, int w_type, int32_t z,
                                         int64_t q, int64_t taps, int64_t n_in, int64_t n_out)
{
    int64_t t = 0;
#if QL_X86
    const __m128i zv = _mm_set1_epi16((int16_t)z), zero = _mm_setzero_si128();
    for (; t < taps && (2 * q + 1) * taps + t + 16 <= n_in &&
           2 * (q * taps + t) + 8 * ((taps - t < 16 ? taps - t : 16) + 3) / 4 <= n_out; t += 16) {
        __m128i va = _mm_loadu_si128((const __m128i *)(a + t)), vb = _mm_loadu_si128((const __m128i *)(b + t));
        __m128i p[2] = {_mm_unpacklo_epi8(va, vb), _mm_unpackhi_epi8(va, vb)};   /* a0 b0 a1 b1 .. */
        int64_t n = taps - t < 16 ? taps - t : 16;
        for (int h = 0; h < 4 && 4 * h < n; h++) {
            __m128i v = p[h >> 1], wv;
            if (w_type == QL_U8)
                wv = (h & 1) ? _mm_unpackhi_epi8(v, zero) : _mm_unpacklo_epi8(v, zero);
            else   /* each byte doubled into a 16-bit lane, shifted back arithmetically */
                wv = _mm_srai_epi16((h & 1) ? _mm_unpackhi_epi8(v, v) : _mm_unpacklo_epi8(v, v), 8);
            _mm_storeu_si128((__m128i *)(dq + 2 * t + 8 * h), _mm_sub_epi16(wv, zv));   /* |v| <= 255 */
        }
    }
#else
    (void)a; (void)b; (void)dq; (void)w_type; (void)z; (void)q; (void)taps; (void)n_in; (void)n_out;
#endif
    return t;
}

/* The byte forms' grouped order, block q (4 channels at a, taps apart) in chunks of 16 taps:
 * 16-byte loads of the 4 channels interleaved by bytes then by pairs, (byte ^ fx) - sub; only
 * the 4-tap quarters holding valid taps are stored at dq. Bounds as ql_vec_grouped_i16's;
 * returns the taps done. */
QL_VEC_INLINE int64_t ql_vec_grouped_b(const uint8_t *a, uint8_t *dq, uint8_t fx, uint8_t sub, int64_t q,
                                       int64_t taps, int64_t n_in, int64_t n_out)
{
    int64_t t = 0;
#if QL_X86
    const __m128i fv = _mm_set1_epi8((char)fx), sv = _mm_set1_epi8((char)sub);
    for (; t < taps && (4 * q + 3) * taps + t + 16 <= n_in &&
           4 * (q * taps + t) + 16 * ((taps - t < 16 ? taps - t : 16) + 3) / 4 <= n_out; t += 16) {
        __m128i va = _mm_loadu_si128((const __m128i *)(a + t)), vb = _mm_loadu_si128((const __m128i *)(a + taps + t));
        __m128i vc = _mm_loadu_si128((const __m128i *)(a + 2 * taps + t)),
                vd = _mm_loadu_si128((const __m128i *)(a + 3 * taps + t));
        __m128i ab[2] = {_mm_unpacklo_epi8(va, vb), _mm_unpackhi_epi8(va, vb)};
        __m128i cd[2] = {_mm_unpacklo_epi8(vc, vd), _mm_unpackhi_epi8(vc, vd)};
        int64_t n = taps - t < 16 ? taps - t : 16;
        for (int h = 0; h < 4 && 4 * h < n; h++) {
            __m128i v = (h & 1) ? _mm_unpackhi_epi16(ab[h >> 1], cd[h >> 1])
                                : _mm_unpacklo_epi16(ab[h >> 1], cd[h >> 1]);   /* a0 b0 c0 d0 a1 .. */
            _mm_storeu_si128((__m128i *)(dq + 4 * t + 16 * h), _mm_sub_epi8(_mm_xor_si128(v, fv), sv));
        }
    }
#else
    (void)a; (void)dq; (void)fx; (void)sub; (void)q; (void)taps; (void)n_in; (void)n_out;
#endif
    return t;
}

/* ---- the channels-last depthwise path's transposes (conv/depthwise_cl.c) ---- */

#if QL_X86
/* out[k] byte c = r[c] byte k: a 16 x 16 byte transpose by unpacks */
QL_VEC_INLINE void ql_vec_transpose16_u8(const __m128i r[16], __m128i out[16])
{
    __m128i u[16];
    for (int c = 0; c < 8; c++) {   /* u[c]: bytes 0-7 of rows 2c, 2c+1 interleaved; u[c+8]: 8-15 */
        u[c] = _mm_unpacklo_epi8(r[2 * c], r[2 * c + 1]);
        u[c + 8] = _mm_unpackhi_epi8(r[2 * c], r[2 * c + 1]);
    }
    for (int h = 0; h < 2; h++) {
        __m128i *v = u + 8 * h, a[8], b[8];
        for (int c = 0; c < 4; c++) {   /* a[c]: bytes 0-3 of rows 4c..4c+3; a[c+4]: 4-7 */
            a[c] = _mm_unpacklo_epi16(v[2 * c], v[2 * c + 1]);
            a[c + 4] = _mm_unpackhi_epi16(v[2 * c], v[2 * c + 1]);
        }
        /* b[4g + 2c + e]: bytes 4g + 2e, 4g + 2e + 1 of rows 8c..8c+7 */
        for (int g = 0; g < 2; g++)
            for (int c = 0; c < 2; c++) {
                b[4 * g + 2 * c] = _mm_unpacklo_epi32(a[4 * g + 2 * c], a[4 * g + 2 * c + 1]);
                b[4 * g + 2 * c + 1] = _mm_unpackhi_epi32(a[4 * g + 2 * c], a[4 * g + 2 * c + 1]);
            }
        for (int g = 0; g < 2; g++)
            for (int e = 0; e < 2; e++) {   /* byte k = 8h + 4g + 2e (and k + 1) of all 16 rows */
                out[8 * h + 4 * g + 2 * e] = _mm_unpacklo_epi64(b[4 * g + e], b[4 * g + 2 + e]);
                out[8 * h + 4 * g + 2 * e + 1] = _mm_unpackhi_epi64(b[4 * g + e], b[4 * g + 2 + e]);
            }
    }
}

/* 16 positions x 16 channels (rows src + c*cs, 16 bytes each) to 16 positions of 16 int16,
 * (bytes ^ flip) - zsub: the byte transpose, then widened; bytes ^ flip are uint8 and zsub is
 * 0 or zx in uint8 form, so |x - zsub| <= 255 fits int16. Position k goes to dst + doff[k]
 * (int16 elements), or dst + 16*k when doff is NULL. (ql_isa.dw_t16's contract; the default
 * where a level's table has none.) */
static inline void ql_vec_transpose16_i16(const uint8_t *src, ptrdiff_t cs, uint8_t flip, int32_t zsub, int16_t *dst,
                                   const ptrdiff_t *doff)
{
    const __m128i f = _mm_set1_epi8((char)flip), z = _mm_set1_epi16((int16_t)zsub), zero = _mm_setzero_si128();
    __m128i r[16], t[16];
    for (int c = 0; c < 16; c++) r[c] = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(src + c * cs)), f);
    ql_vec_transpose16_u8(r, t);
    for (int k = 0; k < 16; k++) {
        int16_t *o = dst + (doff ? doff[k] : 16 * k);
        _mm_storeu_si128((__m128i *)o, _mm_sub_epi16(_mm_unpacklo_epi8(t[k], zero), z));
        _mm_storeu_si128((__m128i *)(o + 8), _mm_sub_epi16(_mm_unpackhi_epi8(t[k], zero), z));
    }
}
#define QL_VEC_T16 ql_vec_transpose16_i16
#else
#define QL_VEC_T16 NULL   /* no vector transpose: conv/depthwise_cl.c's portable fill */
#endif

/* Requantized bytes Q [cols][16] (positions of 16 channels) to the output planes, channel c's
 * positions at y + c*P (c < nch), 16 positions per byte transpose (the last 16 overlapping:
 * the same bytes again). Returns 1 when done (cols >= 16), else 0: the caller's loop. */
QL_VEC_INLINE int ql_vec_store_q16(const uint8_t *Q, int nch, int cols, uint8_t *y, ptrdiff_t P)
{
#if QL_X86
    if (cols < 16) return 0;
    __m128i r[16], t[16];
    for (int j = 0; j < cols; j += 16) {
        if (j + 16 > cols) j = cols - 16;
        for (int k = 0; k < 16; k++) r[k] = _mm_loadu_si128((const __m128i *)(Q + 16 * (size_t)(j + k)));
        ql_vec_transpose16_u8(r, t);
        for (int c = 0; c < nch; c++) _mm_storeu_si128((__m128i *)(y + c * P + j), t[c]);
    }
    return 1;
#else
    (void)Q; (void)nch; (void)cols; (void)y; (void)P;
    return 0;
#endif
}

/* comp[c][j] = acc[j][c] for 16 channels, 4 x 4 int32 blocks by unpacks, j + 4 <= cols;
 * returns the positions done (0 unless nch == 16). */
QL_VEC_INLINE int ql_vec_untranspose16(const int32_t *acc, int nch, int cols, int32_t *comp)
{
    int j = 0;
#if QL_X86
    if (nch == 16)
        for (; j + 4 <= cols; j += 4)
            for (int c = 0; c < 16; c += 4) {
                __m128i r0 = _mm_loadu_si128((const __m128i *)(acc + 16 * j + c));
                __m128i r1 = _mm_loadu_si128((const __m128i *)(acc + 16 * (j + 1) + c));
                __m128i r2 = _mm_loadu_si128((const __m128i *)(acc + 16 * (j + 2) + c));
                __m128i r3 = _mm_loadu_si128((const __m128i *)(acc + 16 * (j + 3) + c));
                __m128i t0 = _mm_unpacklo_epi32(r0, r1), t1 = _mm_unpackhi_epi32(r0, r1);
                __m128i t2 = _mm_unpacklo_epi32(r2, r3), t3 = _mm_unpackhi_epi32(r2, r3);
                _mm_storeu_si128((__m128i *)(comp + (size_t)c * cols + j), _mm_unpacklo_epi64(t0, t2));
                _mm_storeu_si128((__m128i *)(comp + (size_t)(c + 1) * cols + j), _mm_unpackhi_epi64(t0, t2));
                _mm_storeu_si128((__m128i *)(comp + (size_t)(c + 2) * cols + j), _mm_unpacklo_epi64(t1, t3));
                _mm_storeu_si128((__m128i *)(comp + (size_t)(c + 3) * cols + j), _mm_unpackhi_epi64(t1, t3));
            }
#else
    (void)acc; (void)nch; (void)cols; (void)comp;
#endif
    return j;
}

/* sw[c] = sum over t < rows of wt[16 t + c] (int16, sign-extended: unpack with itself, >> 16),
 * wrap32, 16 channels in four int32 vectors. Returns 1 when done, else 0: the caller's loop. */
QL_VEC_INLINE int ql_vec_colsum16_i16(const int16_t *wt, int rows, uint32_t *sw)
{
#if QL_X86
    __m128i s4[4] = {_mm_setzero_si128(), _mm_setzero_si128(), _mm_setzero_si128(), _mm_setzero_si128()};
    for (int t = 0; t < rows; t++) {
        __m128i a = _mm_loadu_si128((const __m128i *)(wt + 16 * t));
        __m128i b = _mm_loadu_si128((const __m128i *)(wt + 16 * t + 8));
        s4[0] = _mm_add_epi32(s4[0], _mm_srai_epi32(_mm_unpacklo_epi16(a, a), 16));
        s4[1] = _mm_add_epi32(s4[1], _mm_srai_epi32(_mm_unpackhi_epi16(a, a), 16));
        s4[2] = _mm_add_epi32(s4[2], _mm_srai_epi32(_mm_unpacklo_epi16(b, b), 16));
        s4[3] = _mm_add_epi32(s4[3], _mm_srai_epi32(_mm_unpackhi_epi16(b, b), 16));
    }
    for (int i = 0; i < 4; i++) _mm_storeu_si128((__m128i *)(sw + 4 * i), s4[i]);
    return 1;
#else
    (void)wt; (void)rows; (void)sw;
    return 0;
#endif
}

/* ---- the element-wise files' loops (elementwise/: MaxPool, the row maximum, DynamicQuantize) */

/* The maximum of the biased bytes v[0 .. i) for the whole 16-byte blocks from 0 (i returned
 * through *done; 0 and nothing read elsewhere): a maximum is exact in any order. */
QL_VEC_INLINE uint8_t ql_vec_reduce_max_biased(const uint8_t *v, ptrdiff_t n, uint8_t bias, ptrdiff_t *done)
{
    ptrdiff_t i = 0;
    uint8_t m = 0;
#if QL_X86
    const __m128i vb = _mm_set1_epi8((char)bias);
    __m128i acc = _mm_setzero_si128();
    for (; i + 16 <= n; i += 16)
        acc = _mm_max_epu8(acc, _mm_xor_si128(_mm_loadu_si128((const __m128i *)(v + i)), vb));
    acc = _mm_max_epu8(acc, _mm_srli_si128(acc, 8));
    acc = _mm_max_epu8(acc, _mm_srli_si128(acc, 4));
    acc = _mm_max_epu8(acc, _mm_srli_si128(acc, 2));
    acc = _mm_max_epu8(acc, _mm_srli_si128(acc, 1));
    m = (uint8_t)_mm_cvtsi128_si32(acc);
#else
    (void)v; (void)n; (void)bias;
#endif
    *done = i;
    return m;
}

/* even[j] = row[2j], odd[j] = row[2j + 1] from j = 0 in blocks of 16; returns where it stopped.
 * 16-bit lanes hold (even, odd) byte pairs: the low bytes are the evens, the high the odds;
 * both fit 0..255, so the unsigned saturating pack keeps them unchanged. */
QL_VEC_INLINE ptrdiff_t ql_vec_deinterleave2(const uint8_t *row, ptrdiff_t n, uint8_t *even, uint8_t *odd)
{
    ptrdiff_t j = 0;
#if QL_X86
    const __m128i lo = _mm_set1_epi16(0x00FF);
    for (; j + 16 <= n; j += 16) {
        __m128i a = _mm_loadu_si128((const __m128i *)(row + 2 * j));
        __m128i b = _mm_loadu_si128((const __m128i *)(row + 2 * j + 16));
        _mm_storeu_si128((__m128i *)(even + j), _mm_packus_epi16(_mm_and_si128(a, lo), _mm_and_si128(b, lo)));
        _mm_storeu_si128((__m128i *)(odd + j), _mm_packus_epi16(_mm_srli_epi16(a, 8), _mm_srli_epi16(b, 8)));
    }
#else
    (void)row; (void)n; (void)even; (void)odd;
#endif
    return j;
}

/* dst[i] = max over k < m of (src[k][i] ^ bias) for every i < n when n >= 16 (32-byte steps,
 * then 16-byte steps, the last one overlapping what is done: the same maxima written again,
 * dst never overlapping a source); returns where it stopped (0 elsewhere or for n < 16). */
QL_VEC_INLINE ptrdiff_t ql_vec_maxrows(uint8_t *restrict dst, const uint8_t *const *src, ptrdiff_t m, ptrdiff_t n,
                                       uint8_t bias)
{
    ptrdiff_t i = 0;
#if QL_X86
    const __m128i vb = _mm_set1_epi8((char)bias);
    for (; i + 32 <= n; i += 32) {
        __m128i a = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(src[0] + i)), vb);
        __m128i b = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(src[0] + i + 16)), vb);
        for (ptrdiff_t k = 1; k < m; k++) {
            a = _mm_max_epu8(a, _mm_xor_si128(_mm_loadu_si128((const __m128i *)(src[k] + i)), vb));
            b = _mm_max_epu8(b, _mm_xor_si128(_mm_loadu_si128((const __m128i *)(src[k] + i + 16)), vb));
        }
        _mm_storeu_si128((__m128i *)(dst + i), a);
        _mm_storeu_si128((__m128i *)(dst + i + 16), b);
    }
    while (i < n && n >= 16) {
        if (i + 16 > n) i = n - 16;
        __m128i a = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(src[0] + i)), vb);
        for (ptrdiff_t k = 1; k < m; k++)
            a = _mm_max_epu8(a, _mm_xor_si128(_mm_loadu_si128((const __m128i *)(src[k] + i)), vb));
        _mm_storeu_si128((__m128i *)(dst + i), a);
        i += 16;
    }
#else
    (void)dst; (void)src; (void)m; (void)n; (void)bias;
#endif
    return i;
}

/* DynamicQuantizeLinear's scan of xs[0 .. i) in blocks of 8 (n >= 8; i returned, 0 elsewhere):
 * *lo, *hi and *nan updated. Four lanes, two accumulators each: minps(v, lo) is
 * v < lo ? v : lo and maxps(v, hi) is v > hi ? v : hi, exactly the scalar tail's comparisons
 * (a NaN is flagged by the unordered compare and the caller declines anyway). */
QL_VEC_INLINE ptrdiff_t ql_vec_minmax_f32(const float *xs, ptrdiff_t n, float *lo, float *hi, int *nan)
{
    ptrdiff_t i = 0;
#if QL_X86
    if (n >= 8) {
        __m128 l0 = _mm_loadu_ps(xs), l1 = l0, h0 = l0, h1 = l0, u = _mm_setzero_ps();
        for (; i + 8 <= n; i += 8) {
            __m128 a = _mm_loadu_ps(xs + i), b = _mm_loadu_ps(xs + i + 4);
            u = _mm_or_ps(u, _mm_or_ps(_mm_cmpunord_ps(a, a), _mm_cmpunord_ps(b, b)));
            l0 = _mm_min_ps(a, l0); l1 = _mm_min_ps(b, l1);
            h0 = _mm_max_ps(a, h0); h1 = _mm_max_ps(b, h1);
        }
        float ls[8], hs[8];
        _mm_storeu_ps(ls, l0); _mm_storeu_ps(ls + 4, l1);
        _mm_storeu_ps(hs, h0); _mm_storeu_ps(hs + 4, h1);
        *nan |= _mm_movemask_ps(u) != 0;
        for (int j = 0; j < 8; j++) {
            *lo = ls[j] < *lo ? ls[j] : *lo;
            *hi = hs[j] > *hi ? hs[j] : *hi;
        }
    }
#else
    (void)xs; (void)n; (void)lo; (void)hi; (void)nan;
#endif
    return i;
}

#endif
