/* The operand forms' row builders, shared by the im2col panel packer (im2col.c) and the
 * implicit GEMM's copies (implicit_run.c): raw 8-bit rows into the I16 form's pairs and the
 * byte forms' groups of 4. Out of line, as the compiler kept them when they shared one file
 * with their callers: the copy loops' code stays what it was. */
#include "plan.h"

/* Two raw rows into one [nr][2] group of the I16 panel: widened, minus x's zero point
 * (|x - zx| <= 255 fits int16), interleaved. */
void pair_i16(const uint8_t *a, const uint8_t *b, int type, int32_t zx, int16_t *d, int nr)
{
    int j = 0;
#if QL_X86
    const __m128i z = _mm_set1_epi16((int16_t)zx);   /* SSE2: the x86-64 baseline */
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
#endif
    for (; j < nr; j++) {
        d[2 * j] = (int16_t)(load8(a + j, type) - zx);
        d[2 * j + 1] = (int16_t)(load8(b + j, type) - zx);
    }
}

/* Four raw rows into one [nr][4] group of a byte-form panel, each byte ^ flip. */
void interleave4(const ql_gemm_kernel *k, const uint8_t *const *src, uint8_t flip, uint8_t *dk, int nr)
{
    int j = k->interleave4_bulk ? k->interleave4_bulk(src, flip, dk, nr) : 0;   /* the level's wider loop */
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
#endif
    for (; j < nr; j++)
        for (int q = 0; q < 4; q++) dk[4 * j + q] = (uint8_t)(src[q][j] ^ flip);
}
