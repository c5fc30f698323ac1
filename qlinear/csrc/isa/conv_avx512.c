/* The AVX-512 levels' conv weight packers (ql_conv_kernels hooks, QL_BYTE_PACKERS_AVX512):
 * conv/pack_w.c's s8u8_row check at 64 bytes a step (AVX-512 BW), and the 3x3 grouped order of the
 * byte forms by AVX512-VBMI's two-table byte permute (vpermt2b), 4 blocks a step.
 *
 * A plain call packs its weights on every call: on an Intel Xeon without AMX (--no-amx) a
 * 256-channel 3x3 layer's 590 K weights took 65 us of CPU time in the AVX2 loops (34 us the
 * grouped order: 6 vpshufb per 36-byte block on the one shuffle port; 25 us the check), a
 * quarter of the prepared call's time. Same bytes and sums as conv/pack_w.c's loops (tests/test_plain.py
 * compares the levels' packers with the portable ones).
 *
 * Cascade Lake and Cooper Lake have AVX-512 VNNI without VBMI: dispatch.c picks between
 * ql_grouped_b_t9_vbmi and the AVX2 packer (ql_grouped_b_t9_zmm). With -DQL_SIMDE this file
 * is compiled against SIMDe (scripts/emulated_isa.sh), as kernels_avx512vnni.c.
 */
#include "qlinear.h"

#if QL_X86
#ifdef QL_SIMDE
#pragma GCC target("avx2")
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <immintrin.h>
#include <simde/x86/avx512.h>
#else
#pragma GCC target("avx2,avx512f,avx512bw,avx512dq,avx512vl,avx512vbmi")
#include <immintrin.h>
#endif
#include <string.h>

/* conv/pack_w.c's s8u8_row, 64 bytes a step (ql_s8u8_row_bulk_fn; AVX-512 BW only, no VBMI): u = byte ^
 * flip; a byte outside [lo, hi] (unsigned compares into a mask) makes the row *bad; vpsadbw sums
 * u (eight 64-bit partial sums: at most 255 * n, far below 2^64); d = u - zu (8-bit wrap, the
 * int8 w - z for a byte within the bound). Whole 64-byte blocks only; conv/pack_w.c does the rest. */
int64_t ql_s8u8_row_bulk_avx512(const uint8_t *s, int64_t n, uint8_t flip, uint8_t lo, uint8_t hi, uint8_t zu,
                                int8_t *d, uint32_t *usum, int *bad)
{
    const __m512i fv = _mm512_set1_epi8((char)flip), lov = _mm512_set1_epi8((char)lo),
                  hiv = _mm512_set1_epi8((char)hi), zv = _mm512_set1_epi8((char)zu), zero = _mm512_setzero_si512();
    __m512i acc = zero;
    __mmask64 out = 0;
    int64_t j = 0;
    for (; j + 64 <= n; j += 64) {
        __m512i u = _mm512_xor_si512(_mm512_loadu_si512((const void *)(s + j)), fv);
        out |= _mm512_cmplt_epu8_mask(u, lov) | _mm512_cmpgt_epu8_mask(u, hiv);
        acc = _mm512_add_epi64(acc, _mm512_sad_epu8(u, zero));
        if (d) _mm512_storeu_si512((void *)(d + j), _mm512_sub_epi8(u, zv));
    }
    *bad = out != 0;
    uint64_t part[8];
    _mm512_storeu_si512((void *)part, acc);
    uint64_t total = 0;
    for (int i = 0; i < 8; i++) total += part[i];
    *usum = (uint32_t)total;   /* the low 32 bits: wrap32, as conv/pack_w.c's */
    return j;
}

/* The output's byte o of a 4-block group (144 bytes: block o / 36, entry p = o % 36 = 4t + r,
 * channel r's tap t) comes from source byte 36 (o / 36) + 9 r + t of the group, as conv/pack_w.c's
 * grouped_b. vpermt2b picks from a 128-byte window of two registers: output bytes 0-63 (blocks
 * 0-1, source bytes 0-71) from the window at byte 0, bytes 64-143 (blocks 1-3, source 36-143)
 * from the window at byte 36. The index vectors: built once per call. */
static void t9_index(uint8_t idx[3][64])
{
    for (int v = 0; v < 3; v++)
        for (int e = 0; e < 64; e++) {
            int o = 64 * v + e, base = v == 0 ? 0 : 36;
            if (o >= 144) o = 143;   /* past the group: any in-window index, never stored */
            int b = o / 36, p = o % 36;
            idx[v][e] = (uint8_t)(36 * b + 9 * (p % 4) + p / 4 - base);
        }
}

/* bytes 100-143 of a 4-block group, zero-extended: a masked load natively (masked-off bytes are
 * neither read nor able to fault), a zero-padded copy under SIMDe (whose emulation may read all
 * 64 bytes: past the row) */
static inline __attribute__((always_inline)) __m512i load_tail44(const uint8_t *p)
{
#ifdef QL_SIMDE
    uint8_t b[64] = {0};
    memcpy(b, p, 44);
    return _mm512_loadu_si512((const void *)b);
#else
    return _mm512_maskz_loadu_epi8(((__mmask64)1 << 44) - 1, (const void *)p);
#endif
}

/* conv/pack_w.c's grouped_b at 9 taps (ql_grouped_b_fn), AVX512-VBMI: d[36 q + 4 t + r] = (s[36 q + 9 r
 * + t] ^ fx) - sub (8-bit wrap). 4 blocks a step: 4 loads (the second window's last 44 bytes
 * by a masked load, so nothing past the group is read: the row may end there), 3 vpermt2b,
 * 3 stores (the last one 16 bytes: nothing written past the group, the next rows may be
 * another thread's); the last blocks % 4 by the AVX2 packer. */
void ql_grouped_b_t9_vbmi(const uint8_t *s, int64_t blocks, uint8_t fx, uint8_t sub, uint8_t *d)
{
    uint8_t idx[3][64];
    t9_index(idx);
    const __m512i i0 = _mm512_loadu_si512((const void *)idx[0]), i1 = _mm512_loadu_si512((const void *)idx[1]),
                  i2 = _mm512_loadu_si512((const void *)idx[2]);
    const __m512i fv = _mm512_set1_epi8((char)fx), sv = _mm512_set1_epi8((char)sub);
    int64_t q = 0;
    for (; q + 4 <= blocks; q += 4) {
        const uint8_t *a = s + 36 * q;
        uint8_t *o = d + 36 * q;
        __m512i w0 = _mm512_loadu_si512((const void *)a), w1 = _mm512_loadu_si512((const void *)(a + 64));
        __m512i x0 = _mm512_loadu_si512((const void *)(a + 36)), x1 = load_tail44(a + 100);
        __m512i v0 = _mm512_permutex2var_epi8(w0, i0, w1), v1 = _mm512_permutex2var_epi8(x0, i1, x1),
                v2 = _mm512_permutex2var_epi8(x0, i2, x1);
        _mm512_storeu_si512((void *)o, _mm512_sub_epi8(_mm512_xor_si512(v0, fv), sv));
        _mm512_storeu_si512((void *)(o + 64), _mm512_sub_epi8(_mm512_xor_si512(v1, fv), sv));
        _mm_storeu_si128((__m128i *)(o + 128),
                         _mm512_castsi512_si128(_mm512_sub_epi8(_mm512_xor_si512(v2, fv), sv)));
    }
    if (q < blocks) ql_grouped_b_t9_avx2(s + 36 * q, blocks - q, fx, sub, d + 36 * q);
}

#else
typedef int ql_conv_avx512_empty;   /* ISO C: a translation unit is not empty */
#endif
