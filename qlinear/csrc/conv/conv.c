/* Convolutions on the native engine: QLinearConv and ConvInteger of every rank.
 *
 * Two paths, both exact in int32 (wrap32 only at the end, as the contract says):
 *
 * - GEMM path (any group): per image and group, C (Mg x P) = W (Mg x K) . im2col(x) (K x P)
 *   through the core driver ql_gemm. W is packed once in the prepared object (ql_conv_pack_w);
 *   the R operand is never materialized: im2col_pack writes one panel of nr output pixels at
 *   a time straight from the NCHW input, in the kernel's operand form (I16: centered int16
 *   [kp/2][nr][2]; U8S8: s8-form bytes [kp/4][nr][4] + per-pixel column sums). K runs c outer,
 *   taps inner, i.e. w.reshape(M, -1)'s order. Padded positions read as x's zero point
 *   (centered 0 in the I16 form, zR' in the U8S8 form, whose correction then cancels them).
 * - Depthwise path (one input channel per group, any channel multiplier M/C): direct tap sums
 *   per channel along output rows, on centered int16 rows, two taps per multiply-add
 *   (|x - zx|, |w - zw| <= 255: a pair sum is at most 2 * 255 * 255 < 2^31, exact in int32).
 *
 * Geometry arrives resolved (pads at the beginning, strides, dilations, output shape) from
 * qlinear/_geometry.py. Positions are computed in int64 from the output coordinate, never
 * by walking padded or strided space, so huge pads and strides cost nothing; scratch is per
 * thread, bounded by constants (and the caller's workspace limit), never proportional to the
 * padded input.
 */
#include "qlinear.h"
#include "conv.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#if QL_X86
#include <emmintrin.h>   /* SSE2: the x86-64 baseline, no target attribute needed */
#endif

/* ---------------------------------------------------------------------------------------
 * Shared geometry helpers
 * ------------------------------------------------------------------------------------- */

static int64_t prod(const int64_t *v, int n)
{
    int64_t r = 1;
    for (int i = 0; i < n; i++) r *= v[i];
    return r;
}

/* Value of an 8-bit element as an int. */
static inline int32_t load8(const uint8_t *p, int type)
{
    return type == QL_U8 ? (int32_t)*p : (int32_t)(int8_t)*p;
}

/* Element strides of the spatial axes of one channel plane (innermost = 1). */
static void plane_strides(const ql_conv_plan *p, ptrdiff_t *st)
{
    ptrdiff_t s = 1;
    for (int a = p->nsp - 1; a >= 0; a--) {
        st[a] = s;
        s *= (ptrdiff_t)p->in[a];
    }
}

/* dst[i] = x[pos0 + i*step] - zx for positions inside [0, n), 0 (centered padding) outside;
 * i in [0, len). The valid range is solved arithmetically: no loop over padding or strides. */
static void build_row_i16(const uint8_t *src, int type, int32_t zx, int64_t n, int64_t pos0,
                          int64_t step, int16_t *dst, int64_t len)
{
    int64_t lo, hi;
    if (pos0 >= 0) lo = 0;
    else lo = (-pos0 + step - 1) / step;
    if (pos0 >= n) hi = 0;
    else hi = (n - pos0 + step - 1) / step;
    if (lo > len) lo = len;
    if (hi > len) hi = len;
    if (hi < lo) hi = lo;
    for (int64_t i = 0; i < lo; i++) dst[i] = 0;
    if (hi > lo) {
        const uint8_t *s = src + pos0 + lo * step;
        int16_t *d = dst + lo;
        int64_t cnt = hi - lo;
        if (step == 1) {
            /* contiguous: a plain widening loop the compiler vectorizes */
            if (type == QL_U8) {
                for (int64_t i = 0; i < cnt; i++) d[i] = (int16_t)((int32_t)s[i] - zx);
            } else {
                const int8_t *si = (const int8_t *)s;
                for (int64_t i = 0; i < cnt; i++) d[i] = (int16_t)((int32_t)si[i] - zx);
            }
        } else {
            for (int64_t i = 0; i < cnt; i++) d[i] = (int16_t)(load8(s + i * step, type) - zx);
        }
    }
    for (int64_t i = hi; i < len; i++) dst[i] = 0;
}

/* tap index t -> tap coordinates (last axis fastest) */
static void tap_coords(const ql_conv_plan *p, int64_t t, int64_t *tc)
{
    for (int a = p->nsp - 1; a >= 0; a--) {
        tc[a] = t % p->k[a];
        t /= p->k[a];
    }
}

/* Widen n 8-bit values to centered int16 (contiguous source: a loop the compiler vectorizes). */
static inline void widen_i16(const uint8_t *src, int type, int32_t zx, int16_t *d, int n)
{
    if (type == QL_U8) {
        for (int j = 0; j < n; j++) d[j] = (int16_t)((int32_t)src[j] - zx);
    } else {
        const int8_t *si = (const int8_t *)src;
        for (int j = 0; j < n; j++) d[j] = (int16_t)((int32_t)si[j] - zx);
    }
}

/* ---------------------------------------------------------------------------------------
 * Weights of the GEMM path: packed once (prepared object), per ISA form
 * ------------------------------------------------------------------------------------- */

static ptrdiff_t w_row_bytes(const ql_gemm_kernel *k, int K)
{
    int kp = ql_round_k(k, K);
    return (ptrdiff_t)kp * (k->form == QL_FORM_I16 ? 2 : 1);
}

/* The kernel that packs and runs a convolution of K = Cg * taps weights per row on level
 * kernel k: k itself, or for a kernel with chunks (ql_gemm_kernel.kchunk) whose chunk does
 * not divide Cg, its conv_fallback. Every entry point below maps its kernel through this
 * first, so a layer's weights are packed and run by the same kernel. */
static const ql_gemm_kernel *conv_kernel(const ql_gemm_kernel *k, int64_t K, int64_t taps)
{
    if (k->kchunk > 1 && (taps < 1 || K % taps || (K / taps) % ((int64_t)k->kchunk * k->kpack)))
        return k->conv_fallback;
    return k;
}

/* k-group G of the grouped order (chunks of ch = max(kchunk, 1) blocks, qlinear.h): its
 * channel block and tap */
static inline void group_of(int64_t G, int64_t taps, int64_t ch, int64_t *blk, int64_t *tap)
{
    int64_t q = G / ch;
    *tap = q % taps;
    *blk = q / taps * ch + G % ch;
}

static int64_t kchunk_of(const ql_gemm_kernel *k) { return k->kchunk > 1 ? k->kchunk : 1; }

const char *ql_conv_kernel_name(const ql_gemm_kernel *k, int64_t K, int64_t taps)
{
    return conv_kernel(k, K, taps)->name;
}

/* GEMM convolutions run on a kernel with chunks, and implicit-GEMM tasks that ran tile pairs
 * (ikernel2_ep): a diagnostic the tests read (relaxed atomics, once per call / task) */
static long long chunk_calls[2];

void ql_conv_tile_counts(long long *chunked, long long *paired)
{
    *chunked = __atomic_load_n(&chunk_calls[0], __ATOMIC_RELAXED);
    *paired = __atomic_load_n(&chunk_calls[1], __ATOMIC_RELAXED);
}

int ql_conv_grouped(const ql_gemm_kernel *k, int64_t K, int64_t taps)
{
    if (taps <= 1 || K % taps) return 0;
    int64_t cg = K / taps, kpk = k->kpack, cb = (cg + kpk - 1) / kpk;
    if (cg % kpk == 0) return 1;
    /* channels padded up to a multiple of kpack (a stem's 3 channels: 4): only for kernels
     * with an implicit variant, which the padding lets read the copy in place, and at most a
     * third more multiply-adds */
    return k->ikernel != NULL && 3 * cb * kpk <= 4 * cg;
}

int64_t ql_conv_wk(const ql_gemm_kernel *k, int64_t K, int64_t taps)
{
    if (!ql_conv_grouped(k, K, taps)) return K;
    int64_t kpk = k->kpack;
    return (K / taps + kpk - 1) / kpk * kpk * taps;   /* <= 4/3 K */
}

size_t ql_conv_w_bytes(const ql_gemm_kernel *k, int M, int K, int64_t taps)
{
    k = conv_kernel(k, K, taps);
    size_t b = (size_t)M * (size_t)w_row_bytes(k, (int)ql_conv_wk(k, K, taps));
    if (k->form != QL_FORM_I16) b += 2 * sizeof(int32_t) * (size_t)M;
    return b;
}

/* sum of n bytes in the u8 form (raw ^ flip), wrap32 (as pack_L's row sums) */
static uint32_t sum_u8form(const uint8_t *s, int64_t n, uint8_t flip)
{
    uint32_t sum = 0;
    int64_t j = 0;
#if QL_X86
    const __m128i fv = _mm_set1_epi8((char)flip), zero = _mm_setzero_si128();
    __m128i acc = zero;
    for (; j + 16 <= n; j += 16)   /* vpsadbw: 8-byte sums in 64-bit lanes (low 32 bits: wrap32) */
        acc = _mm_add_epi64(acc, _mm_sad_epu8(_mm_xor_si128(_mm_loadu_si128((const __m128i *)(s + j)), fv), zero));
    sum = (uint32_t)_mm_cvtsi128_si32(acc) + (uint32_t)_mm_cvtsi128_si32(_mm_unpackhi_epi64(acc, acc));
#endif
    for (; j < n; j++) sum += (uint8_t)(s[j] ^ flip);
    return sum;
}

/* The fast path's row (S8U8 form) from n source bytes: every w - z in [-bound, min(bound, 127)]
 * (the kernel's s8_bound: 64 on AVX2, 128 on the VNNI levels; else -1, with nothing usable
 * written), d[j] = w - z as int8 (d NULL: the bound and the sum only), *sum = the sum of w - z
 * (wrap32). In the u8 form (u = w ^ flip, zu = z + flip: both in [0, 255]) the bound is u in
 * [zu - bound, zu + min(bound, 127)] (clamped to [0, 255]) and w - z = u - zu, so on x86 16
 * bytes a step: vpmaxub/vpminub clamp (a byte that moves is outside), vpsubb, vpsadbw for the
 * sum. (|sum| <= 128 K < 2^31: K is below 2^29, module.c.) */
static int s8u8_row(const ql_gemm_kernel *k, const uint8_t *s, int64_t n, int w_type, int32_t z, int8_t *d,
                    int32_t *sum)
{
    const int bound = k->s8_bound;
    int32_t flip = w_type == QL_I8 ? 128 : 0, zu = z + flip, up = bound < 127 ? bound : 127;
    int32_t lo = zu - bound < 0 ? 0 : zu - bound, hi = zu + up > 255 ? 255 : zu + up;
    uint32_t usum = 0;
    int bad = 0;
    int64_t j = 0;
    if (k->s8u8_row_bulk)   /* the level's wider loop first */
        j = k->s8u8_row_bulk(s, n, (uint8_t)flip, (uint8_t)lo, (uint8_t)hi, (uint8_t)zu, d, &usum, &bad);
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
    bad |= _mm_movemask_epi8(_mm_cmpeq_epi8(out, zero)) != 0xFFFF;
    usum += (uint32_t)_mm_cvtsi128_si32(acc) + (uint32_t)_mm_cvtsi128_si32(_mm_unpackhi_epi64(acc, acc));
#endif
    for (; j < n; j++) {
        int32_t u = (int32_t)(uint8_t)(s[j] ^ (uint8_t)flip);
        bad |= (u < lo) | (u > hi);
        usum += (uint32_t)u;
        if (d) d[j] = (int8_t)(u - zu);
    }
    *sum = (int32_t)(usum - (uint32_t)n * (uint32_t)zu);
    return bad ? -1 : 0;
}

/* w: (M, K) 8-bit row-major, K = Cg * taps in w.reshape(M, -1)'s order (channel outer, taps
 * inner); wzp: M int32 (per output channel, repeated if per tensor).
 * Grouped order (ql_conv_grouped: more than one tap, Cg a multiple of kpack or padded up to
 * one): the row is permuted first to k' = (c / kpack * taps + t) * kpack + c % kpack, so that
 * one k-group of the kernel holds kpack channels at ONE tap, which the implicit GEMM reads as
 * one 4-byte position of its padded copy. Both paths use that order (the im2col packer
 * follows it); the row has K' = ql_conv_wk entries (channels padded with the zero point,
 * centered 0), and the row sums below do not depend on the order or the padding.
 * dst layout: M rows of w_row_bytes, then int32 row_a[M], int32 row_z[M]:
 * - U8S8 form: rows in the u8 form, row_a = rowsum(L') - K*zL', row_z = zL' (the epilogue's
 *   corrections, wrap32);
 * - S8U8 form (fast path): rows = w - wzp as int8, which must lie within the kernel's s8_bound
 *   (else -1, nothing usable written); row_a = sum of the row (|sum| <= 128 K < 2^31), row_z = 0.
 *   The per-call
 *   correction is then one term per row: - zx' * row_a (ql_conv_gemm).
 * Rows [i0, i1) only (the layout is the whole M's), so threads can share the work; w0 is row
 * i0 of the source (rows K apart). Returns 0 or -1 (the fast path's bound). */
static int pack_w_rows(const ql_gemm_kernel *k, const void *w0, int w_type, int M, int K,
                       const int32_t *wzp, void *dst, int i0, int i1)
{
    int kp = ql_round_k(k, K);
    ptrdiff_t ldl = w_row_bytes(k, K);
    int32_t *row_a = (int32_t *)((char *)dst + (size_t)M * (size_t)ldl), *row_z = row_a + M;
    if (k->form == QL_FORM_S8U8) {
        for (int i = i0; i < i1; i++) {
            const uint8_t *src = (const uint8_t *)w0 + (size_t)(i - i0) * (size_t)K;
            int8_t *d = (int8_t *)dst + (size_t)i * (size_t)ldl;
            int32_t sum;
            if (s8u8_row(k, src, K, w_type, wzp[i], d, &sum)) return -1;
            for (int kk = K; kk < kp; kk++) d[kk] = 0;
            row_a[i] = sum;
            row_z[i] = 0;
        }
        return 0;
    }
    /* the level's packer (SIMD where it has one; the portable one's output) */
    ql_pack_L_fn pack = k->pack_L ? k->pack_L : ql_pack_L;
    char *d0 = (char *)dst + (size_t)i0 * (size_t)ldl;
    pack(w0, w_type, K, 1, i1 - i0, K, wzp + i0, 1, k->form, d0, ldl, kp,
         k->form == QL_FORM_U8S8 ? row_a + i0 : NULL);
    if (k->form == QL_FORM_U8S8) {
        for (int i = i0; i < i1; i++) {
            int32_t zl = wzp[i] + (w_type == QL_I8 ? 128 : 0);   /* u8 form: int8 + 128 */
            row_z[i] = zl;
            row_a[i] = (int32_t)((uint32_t)row_a[i] - (uint32_t)K * (uint32_t)zl);
        }
    }
    return 0;
}

/* Grouped order, packed straight from w (no permuted copy): rows [i0, i1) of w (M x K, channel
 * outer, taps inner; w points at row 0) in the form of kernel k, rows of Kw = ql_conv_wk entries.
 * Entry k' = (q * taps + t) * kpack + r of a row is channel c = q * kpack + r at tap t, i.e.
 * source byte c * taps + t; channels c >= Cg (padding up to kpack) hold the row's zero point,
 * centered 0 in every form. The result is what pack_w_rows makes of the permuted row (the
 * layout, row sums and the fast path's verdict do not depend on the order: sums and the bound
 * are taken over the source row, contiguously, while it is in L1).
 * Interleaving: per block q of kpack channels, chunks of 16 taps; on x86 (SSE2, the baseline) a
 * chunk is loaded as 16 bytes per channel and interleaved with unpack instructions. A chunk may
 * read past its block (into the same row's later channels) and write past it (into entries the
 * same row's later chunks overwrite); the bounds below keep both inside the row, and what is
 * left (the row's last taps) is done element by element. */

/* I16 form, an odd channel count: the last block's second channel is padding (0) */
static void grouped_i16_odd(const uint8_t *s, int w_type, int64_t cg, int64_t taps, int32_t z, int16_t *d)
{
    int64_t full = cg / 2;
    const uint8_t *a = s + 2 * full * taps;
    int16_t *dq = d + 2 * full * taps;
    for (int64_t t = 0; t < taps; t++) {
        dq[2 * t] = (int16_t)((w_type == QL_U8 ? (int32_t)a[t] : (int32_t)(int8_t)a[t]) - z);
        dq[2 * t + 1] = 0;
    }
}

/* I16 form (kpack 2): d[(q * taps + t) * 2 + r] = w[(2q + r) * taps + t] - z as int16 */
static inline __attribute__((always_inline)) void
grouped_i16_body(const uint8_t *s, int w_type, int64_t cg, int64_t taps, int32_t z, int16_t *d)
{
    int64_t full = cg / 2, cb = (cg + 1) / 2, n_in = cg * taps, n_out = 2 * cb * taps;
#if QL_X86
    const __m128i zv = _mm_set1_epi16((int16_t)z), zero = _mm_setzero_si128();
#endif
    for (int64_t q = 0; q < full; q++) {
        const uint8_t *a = s + 2 * q * taps, *b = a + taps;
        int16_t *dq = d + 2 * q * taps;
        int64_t t = 0;
#if QL_X86
        /* 16 taps a chunk: 16-byte loads of both channels, vpunpck{l,h}bw pairs them, and only the
         * 4-tap quarters holding valid taps are widened and stored */
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
#endif
        if (t >= taps) continue;
        if (w_type == QL_U8) {
            for (; t < taps; t++) {
                dq[2 * t] = (int16_t)((int32_t)a[t] - z);
                dq[2 * t + 1] = (int16_t)((int32_t)b[t] - z);
            }
        } else {
            for (; t < taps; t++) {
                dq[2 * t] = (int16_t)((int32_t)(int8_t)a[t] - z);
                dq[2 * t + 1] = (int16_t)((int32_t)(int8_t)b[t] - z);
            }
        }
    }
    if (full < cb) grouped_i16_odd(s, w_type, cg, taps, z, d);
}

/* Byte forms, a channel count not a multiple of 4: the last block's channels past Cg are padding */
static void grouped_b_tail(const uint8_t *s, int64_t cg, int64_t taps, uint8_t fx, uint8_t sub, uint8_t pad, uint8_t *d)
{
    int64_t full = cg / 4;
    const uint8_t *a = s + 4 * full * taps;
    uint8_t *dq = d + 4 * full * taps;
    int64_t left = cg - 4 * full;
    for (int64_t t = 0; t < taps; t++)
        for (int64_t r = 0; r < 4; r++) dq[4 * t + r] = r < left ? (uint8_t)((a[r * taps + t] ^ fx) - sub) : pad;
}

/* Byte forms (kpack 4): d[(q * taps + t) * 4 + r] = (w[(4q + r) * taps + t] ^ fx) - sub (8-bit
 * wrap), padding channels pad. U8S8: fx = the u8 form's flip, sub 0; S8U8: fx 0, sub = z (the
 * bound proven first, so the byte is the int8 value w - z). */
static inline __attribute__((always_inline)) void
grouped_b_body(const uint8_t *s, int64_t cg, int64_t taps, uint8_t fx, uint8_t sub, uint8_t pad, uint8_t *d)
{
    int64_t full = cg / 4, cb = (cg + 3) / 4, n_in = cg * taps, n_out = 4 * cb * taps;
#if QL_X86
    const __m128i fv = _mm_set1_epi8((char)fx), sv = _mm_set1_epi8((char)sub);
#endif
    for (int64_t q = 0; q < full; q++) {
        const uint8_t *a = s + 4 * q * taps;
        uint8_t *dq = d + 4 * q * taps;
        int64_t t = 0;
#if QL_X86
        /* 16 taps a chunk: 16-byte loads of the 4 channels, interleaved by bytes then by pairs;
         * only the 4-tap quarters holding valid taps are stored */
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
#endif
        for (; t < taps; t++)
            for (int r = 0; r < 4; r++) dq[4 * t + r] = (uint8_t)((a[r * taps + t] ^ fx) - sub);
    }
    if (full < cb) grouped_b_tail(s, cg, taps, fx, sub, pad, d);
}

/* the common kernels' tap counts as constants (3x3, 3, 3x3x3, 7x7): loops the compiler unrolls;
 * 3x3 through the kernel table's SIMD packer where the level has one (t9, ql_gemm_kernel's
 * grouped_*_t9: conv_avx2.c's shuffles, 1.3-1.45 times as fast measured alone, 1 thread,
 * 128-512 channels). A plain call packs its weights on every call: a 512-channel 3x3 layer's
 * 2.4 M weights took about a quarter of the time of its GEMM. */
static void grouped_i16(const uint8_t *s, int w_type, int64_t cg, int64_t taps, int32_t z, int16_t *d,
                        ql_grouped_i16_fn t9)
{
    if (t9 && taps == 9) {
        t9(s, w_type == QL_I8, cg / 2, z, d);
        if (cg & 1) grouped_i16_odd(s, w_type, cg, taps, z, d);
        return;
    }
    switch (taps) {
    case 9: grouped_i16_body(s, w_type, cg, 9, z, d); break;
    case 3: grouped_i16_body(s, w_type, cg, 3, z, d); break;
    case 27: grouped_i16_body(s, w_type, cg, 27, z, d); break;
    case 49: grouped_i16_body(s, w_type, cg, 49, z, d); break;
    default: grouped_i16_body(s, w_type, cg, taps, z, d);
    }
}

static void grouped_b(const uint8_t *s, int64_t cg, int64_t taps, uint8_t fx, uint8_t sub, uint8_t pad, uint8_t *d,
                      ql_grouped_b_fn t9)
{
    if (t9 && taps == 9) {
        t9(s, cg / 4, fx, sub, d);
        if (cg % 4) grouped_b_tail(s, cg, taps, fx, sub, pad, d);
        return;
    }
    switch (taps) {
    case 9: grouped_b_body(s, cg, 9, fx, sub, pad, d); break;
    case 3: grouped_b_body(s, cg, 3, fx, sub, pad, d); break;
    case 27: grouped_b_body(s, cg, 27, fx, sub, pad, d); break;
    case 49: grouped_b_body(s, cg, 49, fx, sub, pad, d); break;
    default: grouped_b_body(s, cg, taps, fx, sub, pad, d);
    }
}

/* The chunked grouped order (kchunk ch > 1: qlinear.h) of one S8U8 row of cg channels (a
 * multiple of 4 ch, conv_kernel) from the blocks' order grouped_b wrote at d: word b * taps + t
 * (4 bytes: block b at tap t) goes to word (b / ch * taps + t) * ch + b % ch. Chunk q's words
 * span [q ch taps, (q + 1) ch taps) in both orders, so each chunk is a ch x taps transpose of
 * words in place, through a buffer of CHUNK_WORDS; longer chunks (kernels of more than 64
 * taps: rare, so grouped_b's row is simply overwritten) are written straight from the source
 * row s instead (byte (4 (q ch + j) + r) taps + t,
 * minus the zero point z, as grouped_b's S8U8 bytes). */
#define CHUNK_WORDS 1024
static void chunk_row(const uint8_t *s, int64_t cg, int64_t taps, int64_t ch, uint8_t z, uint8_t *d)
{
    int64_t nq = cg / (4 * ch);
    if (ch * taps <= CHUNK_WORDS) {
        uint32_t tmp[CHUNK_WORDS];
        for (int64_t q = 0; q < nq; q++) {
            uint8_t *dq = d + 4 * q * ch * taps;
            memcpy(tmp, dq, (size_t)(4 * ch * taps));
            for (int64_t t = 0; t < taps; t++)
                for (int64_t j = 0; j < ch; j++) memcpy(dq + 4 * (t * ch + j), &tmp[j * taps + t], 4);
        }
        return;
    }
    for (int64_t q = 0; q < nq; q++)
        for (int64_t t = 0; t < taps; t++)
            for (int64_t j = 0; j < ch; j++)
                for (int r = 0; r < 4; r++)
                    d[4 * ((q * taps + t) * ch + j) + r] = (uint8_t)(s[(4 * (q * ch + j) + r) * taps + t] - z);
}

/* Rows [i0, i1) of w in the grouped order (above) into dst's layout (pack_w_rows'); 0 or -1 (the
 * fast path's bound, S8U8 form: nothing usable written). */
static int pack_w_grouped(const ql_gemm_kernel *k, const void *w, int w_type, int M, int K, int64_t taps,
                          const int32_t *wzp, void *dst, int i0, int i1)
{
    int64_t cg = K / taps, Kw = ql_conv_wk(k, K, taps);
    int kp = ql_round_k(k, (int)Kw);
    ptrdiff_t ldl = w_row_bytes(k, (int)Kw);
    int32_t *row_a = (int32_t *)((char *)dst + (size_t)M * (size_t)ldl), *row_z = row_a + M;
    for (int i = i0; i < i1; i++) {
        const uint8_t *s = (const uint8_t *)w + (size_t)i * (size_t)K;
        char *d = (char *)dst + (size_t)i * (size_t)ldl;
        int32_t z = wzp[i];
        if (k->form == QL_FORM_I16) {
            grouped_i16(s, w_type, cg, taps, z, (int16_t *)d, k->grouped_i16_t9);
            memset(d + 2 * Kw, 0, (size_t)(kp - Kw) * 2);
        } else if (k->form == QL_FORM_S8U8) {
            int32_t sum;
            if (s8u8_row(k, s, K, w_type, z, NULL, &sum)) return -1;
            grouped_b(s, cg, taps, 0, (uint8_t)z, 0, (uint8_t *)d, k->grouped_b_t9);
            if (k->kchunk > 1) chunk_row(s, cg, taps, k->kchunk, (uint8_t)z, (uint8_t *)d);
            memset(d + Kw, 0, (size_t)(kp - Kw));
            row_a[i] = sum;   /* padding adds 0 */
            row_z[i] = 0;
        } else {
            uint8_t flip = w_type == QL_I8 ? 0x80 : 0;
            int32_t zl = z + (w_type == QL_I8 ? 128 : 0);   /* u8 form: int8 + 128; = (raw z) ^ flip */
            grouped_b(s, cg, taps, flip, 0, (uint8_t)zl, (uint8_t *)d, k->grouped_b_t9);
            memset(d + Kw, 0, (size_t)(kp - Kw));
            /* pack_L's row sum over the Kw entries: the source row's plus zl per padding entry */
            uint32_t sum = sum_u8form(s, K, flip) + (uint32_t)(Kw - K) * (uint32_t)zl;
            row_z[i] = zl;
            row_a[i] = (int32_t)(sum - (uint32_t)Kw * (uint32_t)zl);
        }
    }
    return 0;
}

int ql_conv_pack_w(const ql_gemm_kernel *k, const void *w, int w_type, int M, int K, int64_t taps,
                   const int32_t *wzp, void *dst)
{
    k = conv_kernel(k, K, taps);
    if (!ql_conv_grouped(k, K, taps)) return pack_w_rows(k, w, w_type, M, K, wzp, dst, 0, M);
    return pack_w_grouped(k, w, w_type, M, K, taps, wzp, dst, 0, M);
}

/* A plain call's weights, packed per call in one pass over w: the fast path's form while every
 * row fits its bound (the proof is made while packing; the first row outside stops every
 * thread), else the exact form. Rows shared over the threads in blocks (the grouped order
 * packed straight from w, pack_w_grouped). */
typedef struct {
    const ql_gemm_kernel *k; const void *w; int w_type, M, K; const int32_t *wzp; void *dst;
    int rows_per_task;
    atomic_int outside;
    int64_t taps; int grouped;
} packw_ctx;

static void packw_task(void *vctx, ptrdiff_t t, int thread)
{
    (void)thread;
    packw_ctx *c = (packw_ctx *)vctx;
    if (atomic_load_explicit(&c->outside, memory_order_relaxed)) return;
    int i0 = (int)t * c->rows_per_task, i1 = i0 + c->rows_per_task < c->M ? i0 + c->rows_per_task : c->M;
    /* blocks of 4 rows, so that a row outside the bound stops the others soon */
    for (int i = i0; i < i1; i += 4) {
        int ie = i + 4 < i1 ? i + 4 : i1, rc;
        if (c->grouped)
            rc = pack_w_grouped(c->k, c->w, c->w_type, c->M, c->K, c->taps, c->wzp, c->dst, i, ie);
        else
            rc = pack_w_rows(c->k, (const uint8_t *)c->w + (size_t)i * (size_t)c->K, c->w_type, c->M, c->K,
                             c->wzp, c->dst, i, ie);
        if (rc) {
            atomic_store_explicit(&c->outside, 1, memory_order_relaxed);
            return;
        }
        if (atomic_load_explicit(&c->outside, memory_order_relaxed)) return;
    }
}

/* The packing's tasks for `threads` threads (their count: packw_task 0..count-1 then pack every
 * row), in a job of their own (pack_w_threads) or beside the implicit GEMM's first copy tasks
 * (ig_copy_pack_task). */
static ptrdiff_t packw_setup(packw_ctx *c, const ql_gemm_kernel *k, const void *w, int w_type, int M, int K,
                             int64_t taps, const int32_t *wzp, void *dst, int threads)
{
    memset(c, 0, sizeof *c);
    k = conv_kernel(k, K, taps);
    c->k = k; c->w = w; c->w_type = w_type; c->M = M; c->K = K; c->wzp = wzp; c->dst = dst;
    atomic_init(&c->outside, 0);
    c->taps = taps;
    c->grouped = ql_conv_grouped(k, K, taps);
    /* below 2^15 weights (a few microseconds of one core) one thread; from there on both: the
     * pool's workers are still spinning from the last call's GEMM (threads.c) and this call's
     * GEMM wants them next anyway, so sharing costs little. Measured: 2^18 as the bound left
     * a 960x160 layer's 154 K weights to one thread, 25-30 us of a 110-200 us call. */
    if ((int64_t)M * K < (1 << 15)) threads = 1;
    if (threads < 1) threads = 1;
    int tasks = threads > 1 ? 4 * threads : 1;
    c->rows_per_task = (M + tasks - 1) / tasks;
    if (c->rows_per_task < 1) c->rows_per_task = 1;
    return (M + c->rows_per_task - 1) / c->rows_per_task;
}

/* 0, -1 (a row outside the fast bound) */
static int pack_w_threads(const ql_gemm_kernel *k, const void *w, int w_type, int M, int K, int64_t taps,
                          const int32_t *wzp, void *dst, int threads)
{
    packw_ctx c;
    ptrdiff_t tasks = packw_setup(&c, k, w, w_type, M, K, taps, wzp, dst, threads);
    ql_parallel_for(tasks, threads, packw_task, &c);
    return atomic_load(&c.outside) ? -1 : 0;
}

/* S8U8 (fast path): C = sum x'(w - zw) over K, padding read as zx'; the result is
 * C - zx' * sum(w - zw): folded with the bias into one per-row term fb, in wrap32, from the
 * packed weights' row sums (after the packing: a plain call's are packed during the call) */
/* x's zero point in the u8 form zx' (int8 x: x ^ 0x80, so zx + 128) */
static inline uint32_t zx_u8form(const ql_conv_plan *p)
{
    return (uint32_t)(p->x_type == QL_I8 ? p->x_zp + 128 : p->x_zp);
}

/* fb[i] = bias[i] (0 without one) - zx' * wsum[i], wrap32, for n rows */
static void fast_terms(const int32_t *bias, uint32_t zxu, const int32_t *wsum, int64_t n, int32_t *fb)
{
    for (int64_t i = 0; i < n; i++) fb[i] = (int32_t)((bias ? (uint32_t)bias[i] : 0u) - zxu * (uint32_t)wsum[i]);
}

static void fast_bias_fill(const ql_conv_plan *p, const void *wpacked, ptrdiff_t ldl, int32_t *fb)
{
    fast_terms(p->bias, zx_u8form(p), (const int32_t *)((const char *)wpacked + (size_t)p->M * (size_t)ldl), p->M,
               fb);
}

/* whether a convolution of M rows of K weights may run on isa->conv_fast (if its weights fit) */
static int fast_applies(const ql_isa *isa, int64_t M, int64_t K, int64_t taps)
{
    if (!isa->conv_fast) return 0;
    if (taps == 1 && isa->exact_1x1_min_m && M >= isa->exact_1x1_min_m && K >= isa->exact_1x1_min_k &&
        conv_kernel(isa->conv_fast, K, 1) != isa->conv_fast)
        return 0;   /* the level's exact GEMM takes this 1x1 convolution (qlinear.h) */
    return 1;
}

int ql_conv_pack_w_fast(const ql_isa *isa, const void *w, int w_type, int M, int K, int64_t taps,
                        const int32_t *wzp, void *dst, int threads)
{
    if (!fast_applies(isa, M, K, taps)) return 0;
    int rc = pack_w_threads(isa->conv_fast, w, w_type, M, K, taps, wzp, dst, threads);
    return rc == 0 ? 2 : rc == -2 ? -2 : 0;
}

int ql_conv_pack_w_auto(const ql_isa *isa, const void *w, int w_type, int M, int K, int64_t taps,
                        const int32_t *wzp, void *dst, int threads)
{
    int kind = ql_conv_pack_w_fast(isa, w, w_type, M, K, taps, wzp, dst, threads);
    if (kind) return kind;
    return pack_w_threads(isa->exact, w, w_type, M, K, taps, wzp, dst, threads) == -2 ? -2 : 0;
}

/* ---------------------------------------------------------------------------------------
 * The im2col panel packer
 *
 * One panel = nr consecutive output pixels (flat index), cut into segments: runs of pixels on
 * one output row (along the last axis). For a row k = (channel, tap) of the panel, a segment
 * reads one input row: its outer coordinates are the same for every pixel of the segment
 * (valid or entirely padding), and along the last axis the positions are pos0 + j*stride, whose
 * valid range is solved arithmetically. So a row costs O(segments) bookkeeping plus one copy
 * (contiguous for stride 1), never a per-element table. Rows are built as RAW bytes of x
 * (padding = the zero point's raw byte); the form's packer then widens and centers them (I16)
 * or flips them to the form's byte (U8S8, S8U8) while interleaving. A row that is one fully
 * valid contiguous run of x (the whole panel on one output row, stride 1) is not copied at all:
 * the interleaver reads x in place.
 * ------------------------------------------------------------------------------------- */

typedef struct im2col_ctx {
    const ql_conv_plan *p;
    const ql_gemm_kernel *kern;  /* the GEMM's kernel (its interleave4_bulk) */
    const uint8_t *xg;          /* image n, first channel of the group */
    int64_t pix0;               /* output pixel of column 0 of this GEMM call */
    int form, nr, kp, K;
    int64_t taps, plane;        /* taps per channel; input elements per channel plane */
    ptrdiff_t st[QL_CONV_MAXD]; /* element strides of the input plane's axes */
    uint8_t flip;               /* byte forms: raw byte ^ flip = the form's byte */
    uint8_t tail;               /* raw byte that becomes 0 in the form (columns >= ncols) */
    char *scratch, *scratch_mem;   /* scratch: scratch_mem on a 64-byte line */
    size_t scratch_bytes;       /* per thread */
    int use_plans;              /* per-panel tap plans kept (taps * (nr + 1) <= PLAN_MAX) */
    int flat;                   /* pointwise (every kernel extent 1, stride 1, no pads): the
                                   output plane is the input plane, rows run across output rows */
    int grouped;                /* weights in the grouped order (ql_conv_grouped): k-group G =
                                   (channel block, tap) by group_of, kpack channels each */
    int64_t chunk;              /* the kernel's kchunk (at least 1) */
    int64_t Cg;                 /* channels per group (grouped: blocks past it are padding) */
    /* per-thread scratch layout (byte offsets) */
    size_t off_base, off_seg, off_rows, off_plan, off_direct;
} im2col_ctx;

/* One segment of one tap: x positions off + i*stride (in the channel plane) for the segment's
 * pixels i in [lo, hi), padding elsewhere (lo = hi = 0 when an outer axis reads padding). */
typedef struct seg_plan { ptrdiff_t off; int lo, hi; } seg_plan;

/* Tap plans are computed once per panel (they do not depend on the channel) when
 * taps * (nr + 1) entries stay below this (128 KiB); longer kernels plan per row. */
#define PLAN_MAX 8192

static size_t align64(size_t v) { return (v + 63) & ~(size_t)63; }

/* m (a block allocated 64 bytes longer than used) rounded up to a 64-byte line. Per-thread
 * scratch regions (multiples of 64 bytes each) then never share a line: on a block malloc
 * leaves 16-aligned, one thread's last line and the next thread's first would be one line,
 * written by both cores (false sharing: ResNet-50's l2 3x3 s2 copy, whose two threads write
 * their raw and phase rows for every input row, once took 6x its 1-thread CPU time at 2
 * threads) */
static char *line_up(char *m) { return m ? (char *)(((uintptr_t)m + 63) & ~(uintptr_t)63) : NULL; }

static void im2col_layout(im2col_ctx *c)
{
    const ql_conv_plan *p = c->p;
    size_t o = 0;
    c->off_base = o;
    o += align64(sizeof(int64_t) * (size_t)(c->nr + 1) * (size_t)p->nsp);
    c->off_seg = o;
    o += align64(sizeof(int) * (size_t)(c->nr + 2));
    c->off_rows = o;
    o += align64(4 * (size_t)c->nr);   /* up to 4 raw byte rows */
    c->use_plans = c->taps * (c->nr + 1) <= PLAN_MAX;
    c->off_plan = o;
    o += align64(sizeof(seg_plan) * (size_t)(c->use_plans ? c->taps * (c->nr + 1) : c->nr + 1));
    c->off_direct = o;
    o += align64(sizeof(ptrdiff_t) * (size_t)(c->use_plans ? c->taps : 1));
    c->scratch_bytes = o;
}

/* The segment plans of tap tc for this panel (plan[0..nseg)); returns the offset of the
 * tap's row in the plane when it is one fully valid contiguous run of all nr pixels (read in
 * place), else -1. */
static ptrdiff_t plan_tap(const im2col_ctx *c, const char *s, const int64_t *tc, int ncols, seg_plan *plan)
{
    const ql_conv_plan *p = c->p;
    int nsp = p->nsp, L = nsp - 1, nr = c->nr;
    const int64_t *base = (const int64_t *)(s + c->off_base);
    const int *seg = (const int *)(s + c->off_seg);
    int nseg = seg[nr + 1];
    int64_t step = p->stride[L], n = p->in[L];
    for (int g = 0; g < nseg; g++) {
        int j0 = seg[g], len = seg[g + 1] - j0;
        const int64_t *b = base + (size_t)j0 * nsp;
        ptrdiff_t o = 0;
        int valid = 1;
        for (int a = 0; a < L; a++) {
            int64_t pos = b[a] + tc[a] * p->dil[a];
            if (pos < 0 || pos >= p->in[a]) { valid = 0; break; }
            o += (ptrdiff_t)pos * c->st[a];
        }
        plan[g].off = 0; plan[g].lo = 0; plan[g].hi = 0;
        if (!valid) continue;
        /* last axis: positions pos0 + i*step, valid for i in [lo, hi) */
        int64_t pos0 = b[L] + tc[L] * p->dil[L], lo, hi;
        lo = pos0 >= 0 ? 0 : (-pos0 + step - 1) / step;
        hi = pos0 >= n ? 0 : (n - pos0 + step - 1) / step;
        if (lo > len) lo = len;
        if (hi > len) hi = len;
        if (hi < lo) hi = lo;
        plan[g].off = o + (ptrdiff_t)pos0;
        plan[g].lo = (int)lo;
        plan[g].hi = (int)hi;
    }
    if (nseg == 1 && step == 1 && ncols == nr && plan[0].lo == 0 && plan[0].hi == nr) return plan[0].off;
    return -1;
}

/* Row (channel ch, tap t) of the panel as raw bytes of x: a pointer to nr bytes, either x
 * itself (direct >= 0: one fully valid contiguous run) or d, filled from the tap's plans with
 * padding = the zero point's raw byte and columns [ncols, nr) = c->tail. */
static const uint8_t *im2col_row(const im2col_ctx *c, const char *s, int64_t ch, const seg_plan *plan,
                                 ptrdiff_t direct, int ncols, uint8_t *d)
{
    const ql_conv_plan *p = c->p;
    int nr = c->nr;
    const uint8_t *xc = c->xg + ch * c->plane;
    if (direct >= 0) return xc + direct;
    const int *seg = (const int *)(s + c->off_seg);
    int nseg = seg[nr + 1];
    uint8_t padv = (uint8_t)p->x_zp;
    ptrdiff_t step = (ptrdiff_t)p->stride[p->nsp - 1];
    for (int g = 0; g < nseg; g++) {
        int j0 = seg[g], len = seg[g + 1] - j0, lo = plan[g].lo, hi = plan[g].hi;
        uint8_t *dd = d + j0;
        int i = 0;
        for (; i < lo; i++) dd[i] = padv;
        if (step == 1) {
            const uint8_t *src = xc + plan[g].off;   /* valid at [lo, hi) */
            /* 8-byte moves (the last one overlapping), then single bytes */
            if (hi - i >= 8) {
                for (; i + 8 <= hi; i += 8) memcpy(dd + i, src + i, 8);
                if (i < hi) memcpy(dd + hi - 8, src + hi - 8, 8);
                i = hi;
            }
            for (; i < hi; i++) dd[i] = src[i];
        } else {
#if QL_X86
            /* stride 2 (a 7x7 s2 stem): 16 outputs from 32 bytes, even bytes kept (SSE2);
             * only where the 32 bytes lie inside the channel plane */
            if (step == 2) {
                const __m128i lo8 = _mm_set1_epi16(0x00FF);
                for (; i + 16 <= hi && plan[g].off + 2 * (ptrdiff_t)i + 32 <= (ptrdiff_t)c->plane; i += 16) {
                    const uint8_t *q = xc + plan[g].off + 2 * (ptrdiff_t)i;
                    __m128i v0 = _mm_and_si128(_mm_loadu_si128((const __m128i *)q), lo8);
                    __m128i v1 = _mm_and_si128(_mm_loadu_si128((const __m128i *)(q + 16)), lo8);
                    _mm_storeu_si128((__m128i *)(dd + i), _mm_packus_epi16(v0, v1));
                }
            }
#endif
            for (; i < hi; i++) dd[i] = xc[plan[g].off + (ptrdiff_t)i * step];
        }
        for (; i < len; i++) dd[i] = padv;
    }
    for (int j = ncols; j < nr; j++) d[j] = c->tail;
    return d;
}

/* Two raw rows into one [nr][2] group of the I16 panel: widened, minus x's zero point
 * (|x - zx| <= 255 fits int16), interleaved. */
static void pair_i16(const uint8_t *a, const uint8_t *b, int type, int32_t zx, int16_t *d, int nr)
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
static void interleave4(const ql_gemm_kernel *k, const uint8_t *const *src, uint8_t flip, uint8_t *dk, int nr)
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

/* next row k: (channel, tap index, tap coordinates), the last axis fastest */
static inline void next_tap(const ql_conv_plan *p, int64_t *ch, int64_t *t, int64_t *tc, int64_t taps)
{
    for (int a = p->nsp - 1; a >= 0; a--) {
        if (++tc[a] < p->k[a]) break;
        tc[a] = 0;
    }
    if (++*t == taps) { *t = 0; ++*ch; }
}

/* ql_pack_R_fn: pack output pixels [pix0 + j0, + ncols) as one panel. */
static void im2col_pack(void *vctx, int j0, int ncols, void *dst, int32_t *colsums, int thread)
{
    const im2col_ctx *c = (const im2col_ctx *)vctx;
    const ql_conv_plan *p = c->p;
    char *s = c->scratch + (size_t)thread * c->scratch_bytes;
    int nsp = p->nsp, nr = c->nr;
    /* first padded-input position of every pixel along every axis; segments = runs of
     * pixels on one output row (seg[0..nseg], count at seg[nr + 1]) */
    int64_t o[QL_CONV_MAXD];
    int64_t pix = c->pix0 + j0;
    for (int a = nsp - 1; a >= 0; a--) {
        o[a] = pix % p->out[a];
        pix /= p->out[a];
    }
    int64_t *base = (int64_t *)(s + c->off_base);
    int *seg = (int *)(s + c->off_seg);
    int nseg = 0;
    seg[0] = 0;
    for (int j = 0; j < ncols; j++) {
        for (int a = 0; a < nsp; a++) base[(size_t)j * nsp + a] = o[a] * p->stride[a] - p->pad[a];
        if (++o[nsp - 1] == p->out[nsp - 1]) {
            o[nsp - 1] = 0;
            seg[++nseg] = j + 1;
            for (int a = nsp - 2; a >= 0; a--) {
                if (++o[a] < p->out[a]) break;
                o[a] = 0;
            }
        }
    }
    if (seg[nseg] != ncols) seg[++nseg] = ncols;
    seg[nr + 1] = nseg;
    int64_t ch = 0, t = 0, tc[QL_CONV_MAXD];   /* row k = ch * taps + t */
    for (int a = 0; a < nsp; a++) tc[a] = 0;
    seg_plan *plans = (seg_plan *)(s + c->off_plan);
    ptrdiff_t *direct = (ptrdiff_t *)(s + c->off_direct);
    size_t pstride = (size_t)nr + 1;
    if (c->flat && ncols == nr) {
        /* pointwise: one tap, and pixels j0.. are x positions j0.. of every channel */
        plans[0].off = 0; plans[0].lo = 0; plans[0].hi = 0;
        direct[0] = (ptrdiff_t)(c->pix0 + j0);
    } else if (c->use_plans) {
        /* every tap's plans once: rows of all channels reuse them */
        for (int64_t u = 0; u < c->taps; u++) {
            direct[u] = plan_tap(c, s, tc, ncols, plans + (size_t)u * pstride);
            next_tap(p, &ch, &t, tc, c->taps);
        }
        ch = 0;
        t = 0;
    }
    uint8_t *r[4];
    r[0] = (uint8_t *)(s + c->off_rows);
    for (int q = 1; q < 4; q++) r[q] = r[q - 1] + nr;
    const uint8_t *src[4];
    /* row k = (ch, t): with plans, a direct row is a pointer into x and anything else is
     * built from the tap's plans (no coordinates needed); without, planned per row */
#define ROW(dstrow)                                                                                  \
    (c->use_plans ? (direct[t] >= 0 ? c->xg + ch * c->plane + direct[t]                               \
                                    : im2col_row(c, s, ch, plans + (size_t)t * pstride, -1, ncols, dstrow)) \
                  : im2col_row(c, s, ch, plans, plan_tap(c, s, tc, ncols, plans), ncols, dstrow))
#define NEXT()                                                                                       \
    do {                                                                                             \
        if (c->use_plans) { if (++t == c->taps) { t = 0; ++ch; } }                                    \
        else next_tap(p, &ch, &t, tc, c->taps);                                                      \
    } while (0)
    if (c->grouped) {
        /* k-group G: channels kpk*(G / taps) + q (q < kpk; those >= Cg are padding) at tap
         * G % taps; one plan serves the group's kpk rows */
        int kpk = c->form == QL_FORM_I16 ? 2 : 4, sums = c->form == QL_FORM_U8S8;
        if (sums)
            for (int j = 0; j < nr; j++) colsums[j] = 0;
        for (int64_t G = 0; G < (int64_t)c->kp / kpk; G++) {
            int64_t cq, tt;
            group_of(G, c->taps, c->chunk, &cq, &tt);
            const seg_plan *pl;
            ptrdiff_t dr;
            if (c->use_plans) {
                pl = plans + (size_t)tt * pstride;
                dr = direct[tt];
            } else {
                tap_coords(p, tt, tc);
                pl = plans;
                dr = plan_tap(c, s, tc, ncols, plans);
            }
            for (int q = 0; q < kpk; q++) {
                if (cq * kpk + q < c->Cg) {
                    src[q] = im2col_row(c, s, cq * kpk + q, pl, dr, ncols, r[q]);
                } else {   /* a padding channel (zero weights): 0 in the form */
                    memset(r[q], c->tail, (size_t)nr);
                    src[q] = r[q];
                }
            }
            if (kpk == 2) {
                pair_i16(src[0], src[1], p->x_type, p->x_zp, (int16_t *)dst + (size_t)G * 2 * nr, nr);
            } else {
                interleave4(c->kern, src, c->flip, (uint8_t *)dst + (size_t)G * 4 * nr, nr);
                if (sums)
                    for (int j = 0; j < nr; j++)
                        for (int q = 0; q < 4; q++) colsums[j] += (int8_t)(src[q][j] ^ c->flip);
            }
        }
        return;
    }
    if (c->form == QL_FORM_I16) {
        int16_t *d = (int16_t *)dst;
        for (int64_t k = 0; k < c->kp; k += 2) {
            for (int q = 0; q < 2; q++) {
                if (k + q < c->K) {
                    src[q] = ROW(r[q]);
                    NEXT();
                } else {
                    memset(r[q], c->tail, (size_t)nr);   /* 0 once centered */
                    src[q] = r[q];
                }
            }
            pair_i16(src[0], src[1], p->x_type, p->x_zp, d + (size_t)k * nr, nr);   /* [k/2][nr][2] */
        }
    } else {
        uint8_t *d = (uint8_t *)dst;
        int sums = c->form == QL_FORM_U8S8;
        if (sums)
            for (int j = 0; j < nr; j++) colsums[j] = 0;
        for (int64_t k = 0; k < c->kp; k += 4) {
            for (int q = 0; q < 4; q++) {
                if (k + q < c->K) {
                    src[q] = ROW(r[q]);
                    NEXT();
                } else {
                    memset(r[q], c->tail, (size_t)nr);   /* 0 in the form */
                    src[q] = r[q];
                }
            }
            interleave4(c->kern, src, c->flip, d + (size_t)k * nr, nr);   /* [k/4][nr][4] */
            if (sums)   /* U8S8: per-pixel sums of the s8-form values (padding columns: 0) */
                for (int j = 0; j < nr; j++)
                    for (int q = 0; q < 4; q++) colsums[j] += (int8_t)(src[q][j] ^ c->flip);
        }
    }
#undef ROW
#undef NEXT
}

/* ---------------------------------------------------------------------------------------
 * The GEMM conv driver
 * ------------------------------------------------------------------------------------- */

/* Pixels per ql_gemm call: its sizes are int. */
#define PIX_CHUNK ((int64_t)1 << 30)

static void plan_epilogue(const ql_conv_plan *p, ql_epilogue *ep)
{
    memset(ep, 0, sizeof *ep);
    ep->quantized = p->quantized;
    ep->row_bias = p->bias;
    ep->mult = p->mult;
    ep->mult_rs = p->mult_s;
    ep->mult_cs = 0;
    ep->lo = p->lo;
    ep->hi = p->hi;
    ep->zp = p->y_zp;
    ep->out_is_signed = p->y_signed;
    ep->out_cs = 1;
}

/* ---------------------------------------------------------------------------------------
 * Implicit GEMM (convolutions of every rank, levels whose kernel has an ikernel)
 *
 * Instead of packing an im2col panel per tile of 16 pixels (K x 16 values written for every
 * tile: 9x the input for a 3x3 kernel), the input of one (image, group) is copied ONCE into
 * the kernel's operand form, padded, with the k-interleave built in: channel blocks of kpack
 * channels (I16: 2 channels as centered int16, S8U8: 4 channels as u8-form bytes), each a set
 * of phase planes of Hph x Wph positions of 4 bytes (kpack values). Phase plane (fh, fw)
 * holds padded positions (fh + sh*i, fw + sw*j), so that the output pixel (oh, ow) and tap
 * (kh, kw) read position (oh + kh*dh / sh, ow + kw*dw / sw) of phase ((kh*dh) % sh,
 * (kw*dw) % sw): unit stride along the output row for every stride and dilation; only the
 * phases some tap reads are built (a 1x1 stride-2 convolution builds one).
 * Output pixels are numbered q = oh*Wph + ow over the phase plane's width; a tile is 16
 * consecutive q, so tap t of channel block b reads the 64 contiguous bytes at position
 * q0 + off(b, t): the kernel's operand for k-group G = b*taps + t (the grouped weight order)
 * with no packing at all. Columns with ow >= OW (the Wph - OW positions at the end of each
 * row, and the tail of the last tile) are computed on whatever the copy holds there and
 * dropped: the epilogue stores only the runs of real pixels.
 * Every rank is this 2-D picture: the last axis makes the rows (w above), and the outer axes
 * (none for 1-D, h for 2-D, d and h for 3-D, ...) are flattened into the planes' rows, each
 * axis with its own phases (a plane per used tuple of outer phases) and a tap's row offset
 * the sum of its per-axis offsets times the phase grid's row strides. From 3-D on the rows
 * between two outer slices (oh >= OH in d's slice) are dropped rows, skipped like dropped
 * columns (ig_runs): a 3x3x3 kernel with pads of 1 on 8x28x28 computes 14% extra columns
 * against the 7% of a 28x28 plane, and no im2col panel is written.
 * Padding holds x's zero point in the form: 0 centered (I16), zx' (S8U8, cancelled by the
 * per-row correction - zx' * sum(w - zw), as in the im2col path). A 1x1 kernel with Cg not a
 * multiple of kpack pads the last block's missing channels the same way; their weights are
 * the packed rows' zero padding, so they add nothing.
 * ------------------------------------------------------------------------------------- */

#define IG_MAX_STRIDE 4                 /* phases per axis: bounded tables */
#define IG_MAX_OPH 16                   /* used phase tuples of the outer axes (2-D: at most 4) */
#define IG_COPY_MAX ((size_t)64 << 20)  /* bytes of one padded copy, whatever the workspace */
#define IG_PW_COPY_MAX ((size_t)512 << 10)  /* ... for a pointwise kernel: Zen 3's L2 */
#define IG_PW_COPY_MAX_S8U8 ((size_t)1 << 20) /* ... on the 7-bit path (see ig_run) */
#ifndef IG_KC_BYTES
#define IG_KC_BYTES 65536               /* a tile's operand per K block (measured: 8-64 KiB alike) */
#endif
/* Reductions of more k-groups than this are cut into K blocks. Below it the whole K runs at
 * once, which lets the epilogue run from the accumulators (ikernel_ep): measured on
 * ResNet-50's 512-channel 3x3 layers (2304 exact k-groups, 144 KiB of a tile's operand),
 * 3-8% faster unblocked than in blocks of 64 KiB (1 thread, best of 40, interleaved builds). */
#ifndef IG_KBLOCK_GROUPS
#define IG_KBLOCK_GROUPS 3072
#endif

/* the scratch block kept between calls (defined with the depthwise path, its first user) */
static char *dw_scratch_get(size_t n, int *cached);
static void dw_scratch_put(char *s, int cached);

typedef struct ig_ctx {
    const ql_conv_plan *p;
    const ql_gemm_kernel *kern;
    ql_epilogue_fn epilogue;
    int kpk, groups, mr;
    int64_t taps, Cg;
    /* Rows and columns: the last axis is the row (W, OW, sw, pw); the outer axes (nout of
     * them, none for 1-D) are flattened into rows of a phase plane, Rph of them, their phase
     * extents oext[] (row strides rst[]). Ro: the rows the outputs span ((out - 1) . rst + 1;
     * 1-D 1, 2-D OH): a row r < Ro is real when each of its outer coordinates is below out[],
     * always so for 1-D and 2-D. */
    int64_t W, OW, sw, pw, plane, P;       /* plane, P: input and output positions per channel */
    int nout;
    int64_t oin[QL_CONV_MAXD], oout[QL_CONV_MAXD], os[QL_CONV_MAXD], opad[QL_CONV_MAXD];
    int64_t oext[QL_CONV_MAXD], rst[QL_CONV_MAXD];
    int64_t Rph, Ro, Wph, PL, BS;          /* phase plane rows, columns; positions per plane, per block */
    int64_t Wr;                            /* Wph rounded up to 16: positions interleaved per row */
    int64_t bulk0, bulk1;                  /* rows copied as one run (ig_copy_task), or none */
    int dense;                             /* every row below Ro is real (1-D, 2-D: always) */
    int64_t RW;                            /* bytes of a padded raw row (ig_copy_task) */
    int nblk;                              /* channel blocks */
    int nfo, nfw;                          /* used phases: outer tuples, columns (shifted planes: nfw = kw) */
    int shift;                             /* shifted planes (ig_copy_shift_task) */
    int64_t sdw;                           /* shifted planes: column dilation */
    int64_t s2len;                         /* shifted planes, sw 2: positions of each column phase
                                            * split at once (ig_copy_shift_task) */
    int64_t fo[IG_MAX_OPH][QL_CONV_MAXD];  /* outer phase tuple a: the phase of each outer axis */
    int64_t fw[IG_MAX_STRIDE];
    int64_t Q, ntiles;                     /* flat outputs q < Q; tiles of 16 */
    int64_t tstride;                       /* q between tiles' starts: 16, or r output rows */
    char *copy;                            /* nblk * BS positions + slack, 4 bytes each */
    ptrdiff_t *off;                        /* groups byte offsets */
    const uint8_t *xg;                     /* image n, group g: first channel */
    uint8_t flip;                          /* S8U8: raw byte ^ flip = u8 form */
    /* GEMM tasks */
    const char *L; ptrdiff_t ldl;
    ql_epilogue ep;
    int Mg, mc, row_blocks;                /* mc: the most rows of a row block */
    int mgroups;                           /* row tiles: ceil(Mg / mr), shared out evenly */
    int64_t tile_blocks;                   /* ntiles shared out evenly */
    char *scratch, *scratch_mem; size_t scratch_bytes;   /* per thread (line_up(scratch_mem)): raw and phase rows */
    int kgroups;                           /* k-groups per K block */
    int fused;                             /* ikernel_ep stores the tiles */
    char *cblock, *cblock_mem; size_t cblock_bytes;   /* per thread (line_up(cblock_mem)): mc x 16 int32 partial sums */
    char *xt; size_t xt_bytes; ptrdiff_t xs;   /* the dot tail's gathered columns (shared) */
    int ep_ok;                             /* the epilogue is one ikernel_ep / dot_ep support */
    /* images merged into one GEMM (ig_run): image j of the chunk has its copy at copy + j *
     * cstride, its input at xg + j * xstride, its dot columns at xt + j * xt_bytes and its
     * output at ep.out + j * ostride; the GEMM tasks run over (image, tile) pairs */
    int64_t nimg;
    size_t cstride, xstride, ostride;
    int64_t wlast;                         /* the last tile's columns (the dot tail's width) */
    ptrdiff_t cpt;                         /* copy blocks per task (ig_copy_chunk_task) */
    /* merged tail panels (ig_run: a batch whose last tiles are narrow): panel u holds the last
     * tiles of images u * tpm.. side by side, wlast columns each, groups x 64 bytes (k-group g
     * at offp[g] = 64 g, the layout the tile kernels read), in ring slot u % nbuf of tp; img_pix:
     * output elements between images (image k of a panel: its runs' pixels offset k * img_pix).
     * Per chunk (first image n0): panels [u_run0, u_run1) run; nleft images from left_j0 run
     * their last tile with the dot kernel (a last partial panel of fewer than QL_DOT_NR
     * columns), from xt; out0: the output of image 0 */
    int64_t tpm, nbuf, n0, u_run0, u_run1, nleft, left_j0;
    char *tp; size_t tp_bytes;
    ptrdiff_t *offp;
    ptrdiff_t img_pix;
    char *out0;
    /* images in parallel (ig_run): each chunk of nimg images (one) runs whole on one thread, its
     * copy in that thread's region copy + thread * pregion; nbatch: the images of the call */
    size_t pregion;
    int64_t nbatch;
    /* a plain call's weights packed inside the GEMM tasks (ql_conv_gemm_raw; I16 form, not the
     * images-in-parallel schedule): wr, wzp the group's raw rows and zero points; each task packs
     * its row block into its thread's scratch at wscr_off (at most mc rows) before its tiles */
    const uint8_t *wr, *wr0; const int32_t *wzp, *wzp0; int w_type, Kraw, wgrouped;
    size_t wscr_off;
    /* a plain call's S8U8 weights, packed by npack tasks (packw_task on wjob) in the same job as
     * the first copy tasks (ig_copy_pack_task): one job fewer, and the copy overlaps them */
    packw_ctx *wjob;
    ptrdiff_t npack;
    /* affine: the S8U8 form packed in the tasks, one task per row block, which also fills its
     * rows' per-row terms fb (fb_all + the group's first row: ig_group) from its row sums */
    int affine;
    int32_t *fb_all, *fb;
    const int32_t *bias_g;
    uint32_t zxu;
} ig_ctx;

/* Rows of a phase plane, whatever the rank: row r's outer coordinates i[] (the phase grid's,
 * last outer axis fastest), the next row's (an odometer: the copy tasks walk every row in
 * order), and the input row it holds in outer phase tuple a (the outer axes of x flattened) or
 * -1 where a coordinate falls in the padding; and the output row of a row r < Ro, -1 for a
 * dropped row (some outer coordinate at or past out[]: only from the 3rd axis on). */
static void ig_row_coords(const ig_ctx *c, int64_t r, int64_t *i)
{
    for (int ax = c->nout - 1; ax >= 0; ax--) {
        i[ax] = r % c->oext[ax];
        r /= c->oext[ax];
    }
}

static inline void ig_row_next(const ig_ctx *c, int64_t *i)
{
    for (int ax = c->nout - 1; ax >= 0; ax--) {
        if (++i[ax] < c->oext[ax]) return;
        i[ax] = 0;
    }
}

static inline int64_t ig_in_row(const ig_ctx *c, int a, const int64_t *i)
{
    int64_t row = 0;
    for (int ax = 0; ax < c->nout; ax++) {
        int64_t x = c->fo[a][ax] + c->os[ax] * i[ax] - c->opad[ax];
        if (x < 0 || x >= c->oin[ax]) return -1;
        row = row * c->oin[ax] + x;
    }
    return row;
}

static int64_t ig_out_row(const ig_ctx *c, int64_t r)
{
    int64_t orow = 0, scale = 1;
    for (int ax = c->nout - 1; ax >= 0; ax--) {
        int64_t o = r % c->oext[ax];
        if (o >= c->oout[ax]) return -1;
        orow += o * scale;
        scale *= c->oout[ax];
        r /= c->oext[ax];
    }
    return orow;
}

/* The n bytes at src to dst (SSE2 16-byte moves, the last one overlapping; n >= 16), inline:
 * the rows are short (7 to 56 bytes in ResNet-50), where a libc call costs more than the copy. */
static inline void copy_row(uint8_t *dst, const uint8_t *src, int64_t n)
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

/* dst[j] = r[j * step] for j < len (a column phase of a padded raw row): reads r[0, step * len)
 * (len a multiple of 16 for the SIMD step; ig_run sizes the raw rows for fw + sw * Wr bytes) */
static void split_phase(const uint8_t *r, int64_t step, uint8_t *dst, int64_t len)
{
    int64_t j = 0;
#if QL_X86
    if (step == 2) {   /* 16 outputs from 32 bytes: even bytes kept (SSE2) */
        const __m128i lo8 = _mm_set1_epi16(0x00FF);
        for (; j < len; j += 16) {
            __m128i v0 = _mm_and_si128(_mm_loadu_si128((const __m128i *)(r + 2 * j)), lo8);
            __m128i v1 = _mm_and_si128(_mm_loadu_si128((const __m128i *)(r + 2 * j + 16)), lo8);
            _mm_storeu_si128((__m128i *)(dst + j), _mm_packus_epi16(v0, v1));
        }
        return;
    }
#endif
    for (; j < len; j++) dst[j] = r[j * step];
}

/* Stride 2, both column phases, the exact form (I16) at once: from the padded raw rows a and b
 * of a channel pair, position j of phase 0 (raw column 2j) and of phase 1 (2j + 1) as centered
 * int16 pairs (a - zx, b - zx) into d0 and d1, j < len (a multiple of 16; reads a[0, 2 len)).
 * One pass where split_phase then pair_i16 per phase make three: each 16-bit lane of a load
 * holds one even byte (low) and one odd byte (high), widened by mask / shift in place. The
 * values are those pair_i16 writes (x - zx of an 8-bit x and zx: within int16). */
static void pair_i16_s2(const uint8_t *a, const uint8_t *b, int type, int32_t zx, int16_t *d0, int16_t *d1,
                        int64_t len)
{
    int64_t j = 0;
#if QL_X86
    const __m128i z = _mm_set1_epi16((int16_t)zx), lo8 = _mm_set1_epi16(0x00FF);
    for (; j < len; j += 8) {   /* 8 positions of each phase from 16 raw bytes per channel */
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
#endif
    for (; j < len; j++) {
        d0[2 * j] = (int16_t)(load8(a + 2 * j, type) - zx);
        d0[2 * j + 1] = (int16_t)(load8(b + 2 * j, type) - zx);
        d1[2 * j] = (int16_t)(load8(a + 2 * j + 1, type) - zx);
        d1[2 * j + 1] = (int16_t)(load8(b + 2 * j + 1, type) - zx);
    }
}

/* One row of a copy plane from the block's kpk padded raw rows: every sw-th byte from column
 * col0 (split into the phase rows prow where sw > 1), paired (exact form) or interleaved
 * (byte forms) into Wr positions at drow. */
static void ig_phase_row(const ig_ctx *c, const uint8_t *raw, uint8_t *prow, int64_t col0, char *drow)
{
    const uint8_t *rows[4];
    for (int q = 0; q < c->kpk; q++) {
        const uint8_t *r = raw + (size_t)q * (size_t)c->RW + col0;
        if (c->sw == 1) {
            rows[q] = r;
        } else {
            uint8_t *d = prow + (size_t)q * (size_t)c->Wr;
            split_phase(r, c->sw, d, c->Wr);
            rows[q] = d;
        }
    }
    if (c->kpk == 2) pair_i16(rows[0], rows[1], c->p->x_type, c->p->x_zp, (int16_t *)drow, (int)c->Wr);
    else interleave4(c->kern, rows, c->flip, (uint8_t *)drow, (int)c->Wr);
}

/* Stride 2, both column phases of a channel block at once, in the kernel's operand form (the
 * one primitive of the stride-2 copies, ig_copy_task's and ig_copy_shift_task's): from the
 * block's kpk padded raw rows raw + q * RW (already at the first column), position j of phase
 * 0 (raw column 2j) to d0 and of phase 1 (2j + 1) to d1, j < len, 4 bytes a position; reads
 * raw[q * RW, q * RW + 2 len). The form decides only how: the exact form's int16 pairs
 * (pair_i16_s2, SSE2 and portable); the 7-bit form's 4 channels' bytes ^ flip side by side
 * (ql_ig_s2x4_avx2: every level with an S8U8 kernel runs AVX2; the portable loop for a
 * byte form elsewhere, the values interleave4 writes of split_phase's rows). len must be a
 * multiple of IG_S2_STEP(kpk), the SIMD step (ig_run rounds the lengths up to it). Measured
 * on ResNet-50's 3x3 stride-2 layers: one pass where a split per phase then a pairing or an
 * interleave make three or four (the 7-bit copy was 9% of the time). Inlined: called once per
 * copied row (as a call, the 7-bit 14x14-output layer's copy was 4% dearer). */
#define IG_S2_STEP(kpk) ((kpk) == 2 ? 8 : 16)

static inline __attribute__((always_inline)) void
ig_split_s2(const ig_ctx *c, const uint8_t *raw, char *d0, char *d1, int64_t len)
{
    if (c->kpk == 2) {
        pair_i16_s2(raw, raw + c->RW, c->p->x_type, c->p->x_zp, (int16_t *)d0, (int16_t *)d1, len);
        return;
    }
#if QL_X86
    if (c->kern->form == QL_FORM_S8U8) {
        ql_ig_s2x4_avx2(raw, (ptrdiff_t)c->RW, c->flip, (uint8_t *)d0, (uint8_t *)d1, len);
        return;
    }
#endif
    for (int64_t j = 0; j < len; j++)
        for (int q = 0; q < 4; q++) {
            const uint8_t *r = raw + (size_t)q * (size_t)c->RW + 2 * j;
            ((uint8_t *)d0)[4 * j + q] = (uint8_t)(r[0] ^ c->flip);
            ((uint8_t *)d1)[4 * j + q] = (uint8_t)(r[1] ^ c->flip);
        }
}

/* Copy rows of the stride-2 copies (any form): input rows split into both column phases at
 * once (ig_split_s2), and shifted tap rows copied from those phase rows (ig_copy_shift_task);
 * a diagnostic the tests read to prove these paths ran (added once per copy task, relaxed
 * atomics). */
static long long ig_copy_rows[2];

void ql_conv_copy_counts(long long *split_rows, long long *tap_rows)
{
    *split_rows = __atomic_load_n(&ig_copy_rows[0], __ATOMIC_RELAXED);
    *tap_rows = __atomic_load_n(&ig_copy_rows[1], __ATOMIC_RELAXED);
}

static void ig_copy_count(long long split, long long taps)
{
    if (split) __atomic_add_fetch(&ig_copy_rows[0], split, __ATOMIC_RELAXED);
    if (taps) __atomic_add_fetch(&ig_copy_rows[1], taps, __ATOMIC_RELAXED);
}

/* Copy task: channel block b, every used phase, every row.
 * Each input row of the block's kpk channels is copied once into a padded raw row (the padded
 * row's columns u = x's column u - pw; the padding columns hold x's zero point, written once per
 * task: only the valid span is overwritten row after row), split into the used column phases
 * (none to split for stride 1; 16 positions a step for stride 2) and interleaved into each
 * phase plane's row (stride 2 with both phases: both split in one pass straight into their
 * planes' rows, ig_split_s2, Wr positions each: reads 2 Wr <= RW raw bytes). Rows entirely in
 * the padding are the form's zero written directly. */
static void ig_copy_task(void *vctx, ptrdiff_t b, int thread)
{
    const ig_ctx *c = (const ig_ctx *)vctx;
    const ql_conv_plan *p = c->p;
    uint8_t *raw = (uint8_t *)c->scratch + (size_t)thread * c->scratch_bytes;
    uint8_t padv = (uint8_t)p->x_zp;   /* raw byte of x's zero point (its own type) */
    /* the form's value of a padding position, as a byte filling all 4 of its bytes: I16 0
     * (x - zx centered), S8U8 the zero point's u8-form byte */
    uint8_t zbyte = c->kpk == 2 ? 0 : (uint8_t)(padv ^ c->flip);
    const uint8_t *rows[4];
    int64_t plane = c->plane;
    /* rows [bulk0, bulk1) hold the input's rows one after the other with no padding, stride
     * or dropped column between them (ig_run: a pointwise kernel, say): one run, interleaved
     * straight from x in multiples of 16 positions (the rest through a raw row). Padding rows
     * above are written before the run, those below after it (each one's spill lands in rows
     * written later). */
    int64_t bulk0 = 0, bulk1 = 0;
    long long n_split = 0;   /* rows through ig_split_s2 (ig_copy_count) */
    if (((int64_t)b + 1) * c->kpk <= c->Cg) {
        bulk0 = c->bulk0;
        bulk1 = c->bulk1;
    }
    /* scratch: kpk padded raw rows of RW bytes, then kpk x nfw phase rows of Wr bytes */
    uint8_t *prow = raw + (size_t)c->kpk * (size_t)c->RW;
    for (int q = 0; q < c->kpk; q++) memset(raw + (size_t)q * (size_t)c->RW, padv, (size_t)c->RW);
    for (int a = 0; a < c->nfo; a++) {
        int64_t ix[QL_CONV_MAXD];   /* row i's outer coordinates */
        ig_row_coords(c, 0, ix);
        for (int64_t i = 0; i < c->Rph; i++, ig_row_next(c, ix)) {
            if (i == bulk0 && bulk1 > bulk0) {
                int64_t n = (bulk1 - bulk0) * c->W, n16 = n / 16 * 16;
                char *d0 = c->copy + 4 * (size_t)(b * c->BS + bulk0 * c->Wph);
                for (int q = 0; q < c->kpk; q++) rows[q] = c->xg + ((int64_t)b * c->kpk + q) * plane;
                if (n16 > 0) {
                    if (c->kpk == 2) pair_i16(rows[0], rows[1], p->x_type, p->x_zp, (int16_t *)d0, (int)n16);
                    else interleave4(c->kern, rows, c->flip, (uint8_t *)d0, (int)n16);
                }
                if (n > n16) {
                    for (int q = 0; q < c->kpk; q++) {
                        uint8_t *d = prow + (size_t)q * (size_t)c->Wr;
                        /* the run's last n - n16 (< 16) positions, then padding to 16 */
                        memcpy(d, rows[q] + n16, (size_t)(n - n16));
                        memset(d + (n - n16), padv, (size_t)(16 - (n - n16)));
                        rows[q] = d;
                    }
                    char *d1 = d0 + 4 * (size_t)n16;
                    if (c->kpk == 2) pair_i16(rows[0], rows[1], p->x_type, p->x_zp, (int16_t *)d1, 16);
                    else interleave4(c->kern, rows, c->flip, (uint8_t *)d1, 16);
                }
                i = bulk1 - 1;
                ig_row_coords(c, i, ix);
                continue;
            }
            int64_t ih = ig_in_row(c, a, ix);
            if (ih < 0) {
                for (int e = 0; e < c->nfw; e++)
                    memset(c->copy + 4 * (size_t)(b * c->BS + (a * c->nfw + e) * c->PL + i * c->Wph), zbyte,
                           4 * (size_t)c->Wr);
                continue;
            }
            /* channels past Cg (the last block of a 1x1 kernel) keep their all-padding rows */
            for (int q = 0; q < c->kpk; q++) {
                int64_t ch = (int64_t)b * c->kpk + q;
                if (ch < c->Cg) copy_row(raw + (size_t)q * (size_t)c->RW + c->pw, c->xg + ch * plane + ih * c->W, c->W);
            }
            if (c->sw == 2 && c->nfw == 2) {   /* phases 0 and 1: planes a*2, a*2 + 1 */
                char *d0 = c->copy + 4 * (size_t)(b * c->BS + 2 * a * c->PL + i * c->Wph);
                ig_split_s2(c, raw, d0, d0 + 4 * (size_t)c->PL, c->Wr);
                n_split++;
                continue;
            }
            for (int e = 0; e < c->nfw; e++)
                ig_phase_row(c, raw, prow, c->fw[e],
                             c->copy + 4 * (size_t)(b * c->BS + (a * c->nfw + e) * c->PL + i * c->Wph));
        }
    }
    /* each plane's spare (written past its last row, never read for a kept column) */
    for (int a = 0; a < c->nfo; a++)
        for (int e = 0; e < c->nfw; e++) {
            char *dplane = c->copy + 4 * (size_t)(b * c->BS + (a * c->nfw + e) * c->PL);
            memset(dplane + 4 * (size_t)(c->Rph * c->Wph), 0, 4 * (size_t)(c->PL - c->Rph * c->Wph));
        }
    ig_copy_count(n_split, 0);
}

/* Copy task of the shifted planes (c->shift): channel block b. Plane (a, e) of a block holds
 * outer phase tuple fo[a] and column tap e: position (i, j) = padded input (fo[a] + os*i,
 * sw*j + e*dw) (i: the row's outer coordinates), j < OW, rows OW positions apart (no dropped
 * columns). Each input row of the block's kpk
 * channels is copied once into a padded raw row (as ig_copy_task), then each tap's columns
 * (every sw-th from column e*dw) are interleaved into its plane's row, Wr = OW rounded up to
 * 16 positions at a time: the spill past a row's end is the next row's start, written after
 * it, or the plane's spare. Stride 2: see below. */
static void ig_copy_shift_task(void *vctx, ptrdiff_t b, int thread)
{
    const ig_ctx *c = (const ig_ctx *)vctx;
    const ql_conv_plan *p = c->p;
    uint8_t *raw = (uint8_t *)c->scratch + (size_t)thread * c->scratch_bytes;
    uint8_t padv = (uint8_t)p->x_zp;
    uint8_t zbyte = c->kpk == 2 ? 0 : (uint8_t)(padv ^ c->flip);   /* as ig_copy_task */
    int64_t plane = c->plane;
    uint8_t *prow = raw + (size_t)c->kpk * (size_t)c->RW;
    long long n_split = 0, n_taps = 0;   /* ig_copy_count */
    for (int q = 0; q < c->kpk; q++) memset(raw + (size_t)q * (size_t)c->RW, padv, (size_t)c->RW);
    for (int a = 0; a < c->nfo; a++) {
        int64_t ix[QL_CONV_MAXD];   /* row i's outer coordinates */
        ig_row_coords(c, 0, ix);
        for (int64_t i = 0; i < c->Rph; i++, ig_row_next(c, ix)) {
            int64_t ih = ig_in_row(c, a, ix);
            /* row i of plane (a, 0); plane (a, e) is e planes further */
            char *d0 = c->copy + 4 * (size_t)(b * c->BS + (int64_t)a * c->nfw * c->PL + i * c->Wph);
            if (ih < 0) {
                for (int e = 0; e < c->nfw; e++) memset(d0 + 4 * (size_t)(e * c->PL), zbyte, 4 * (size_t)c->Wr);
                continue;
            }
            for (int q = 0; q < c->kpk; q++) {
                int64_t ch = (int64_t)b * c->kpk + q;
                if (ch < c->Cg) copy_row(raw + (size_t)q * (size_t)c->RW + c->pw, c->xg + ch * plane + ih * c->W, c->W);
            }
            if (c->sw == 2) {
                /* stride 2, any form: both column phases of the row split once (ig_split_s2,
                 * s2len positions each), then tap e's row is phase (e*dw) % 2 from position
                 * (e*dw) / 2 on, OW positions (a 3-wide kernel's taps 0 and 2 share phase 0,
                 * one position apart): one pass over the raw rows, not a split per tap. Bounds
                 * (ig_run): the phase rows hold s2len >= (kw-1)*dw / 2 + OW positions, so every
                 * tap's OW are in them; the split reads 2 s2len <= RW raw bytes. A phase row is
                 * the row of the tap that starts it (column 0: tap 0; column 1: tap 1 at
                 * dilation 1), which then needs no copy, where its s2len positions end within
                 * the plane (i*OW + s2len <= PL: past the row's OW they are later rows' and the
                 * spare's, written after it); else (a last row) the scratch after the raw rows.
                 * The other taps copy their OW positions (the plane's row; the rest of Wr would
                 * be later rows' or the spare's) from it. */
                int own = i * c->Wph + c->s2len <= c->PL;
                char *ph[2];
                ph[0] = own ? d0 : (char *)prow;
                ph[1] = own && c->sdw == 1 ? d0 + 4 * (size_t)c->PL : (char *)prow + 4 * (size_t)c->s2len;
                ig_split_s2(c, raw, ph[0], ph[1], c->s2len);
                n_split++;
                for (int e = 0; e < c->nfw; e++) {
                    int64_t col = e * c->sdw;
                    char *de = d0 + 4 * (size_t)(e * c->PL), *src = ph[col & 1] + 4 * (size_t)(col >> 1);
                    if (src == de) continue;   /* the tap's row is its phase row */
                    copy_row((uint8_t *)de, (const uint8_t *)src, 4 * c->OW);
                    n_taps++;
                }
                continue;
            }
            for (int e = 0; e < c->nfw; e++)
                ig_phase_row(c, raw, prow, e * c->sdw, d0 + 4 * (size_t)(e * c->PL));
        }
    }
    for (int f = 0; f < c->nfo * c->nfw; f++) {   /* the planes' spares (as ig_copy_task) */
        char *dplane = c->copy + 4 * (size_t)(b * c->BS + f * c->PL);
        memset(dplane + 4 * (size_t)(c->Rph * c->Wph), 0, 4 * (size_t)(c->PL - c->Rph * c->Wph));
    }
    ig_copy_count(n_split, n_taps);
}

/* Copy task of a chunk of images: cpt consecutive (image, channel block) pairs, image k / nblk,
 * block k % nblk (ig_copy_task on a view of the context whose copy and input are the image's).
 * Several blocks a task: a block of a small plane is little work (7x7, two channels: 300-odd
 * bytes), less than taking a task costs on two cores. */
static void ig_copy_chunk_task(void *vctx, ptrdiff_t task, int thread)
{
    const ig_ctx *c = (const ig_ctx *)vctx;
    void (*copy)(void *, ptrdiff_t, int) = c->shift ? ig_copy_shift_task : ig_copy_task;
    if (c->nimg == 1) {
        copy(vctx, task, thread);
        return;
    }
    ig_ctx v = *c;
    ptrdiff_t k0 = task * c->cpt, k1 = k0 + c->cpt, jv = -1;
    if (k1 > (ptrdiff_t)(c->nimg * c->nblk)) k1 = (ptrdiff_t)(c->nimg * c->nblk);
    for (ptrdiff_t k = k0; k < k1; k++) {
        ptrdiff_t j = k / c->nblk;
        if (j != jv) {
            v.copy = c->copy + (size_t)j * c->cstride;
            v.xg = c->xg + (size_t)j * c->xstride;
            jv = j;
        }
        copy(&v, k % c->nblk, thread);
    }
}

/* The first copy job of a plain call's fast path: the weights' packing tasks first (the longer
 * ones: the two threads start on them and share the copy tasks after), then the copy tasks,
 * skipped once a row is outside the bound (full-range weights on AVX2's 7-bit form: found in
 * the first rows, so a failed attempt costs little before the exact form runs). */
static void ig_copy_pack_task(void *vctx, ptrdiff_t task, int thread)
{
    const ig_ctx *c = (const ig_ctx *)vctx;
    if (task < c->npack) packw_task(c->wjob, task, thread);
    else if (!atomic_load_explicit(&c->wjob->outside, memory_order_relaxed)) ig_copy_chunk_task(vctx, task - c->npack, thread);
}

/* The runs of tile q0: columns q with ow < OW (and q < Q) in real rows, by output pixel; a run
 * continues across a row's end when the next row follows in both the tile and the output (no
 * dropped column, Wph == OW, and the next row real). */
static void ig_runs(const ig_ctx *c, int64_t q0, ql_ik_runs *rn)
{
    int64_t span = c->tstride < QL_IK_NR ? c->tstride : QL_IK_NR;
    int64_t q = q0, qe = q0 + span < c->Q ? q0 + span : c->Q;
    rn->n = 0;
    while (q < qe) {
        int64_t r = q / c->Wph, ow = q % c->Wph, orow = c->dense ? r : ig_out_row(c, r);
        if (ow >= c->OW || orow < 0) { q = (r + 1) * c->Wph; continue; }
        int64_t len = c->OW - ow < qe - q ? c->OW - ow : qe - q;
        ptrdiff_t pix = (ptrdiff_t)(orow * c->OW + ow);
        int k = rn->n;
        if (k && rn->col[k - 1] + rn->len[k - 1] == (int)(q - q0) && rn->pix[k - 1] + rn->len[k - 1] == pix) {
            rn->len[k - 1] += (int)len;
        } else {
            rn->col[k] = (int)(q - q0);
            rn->len[k] = (int)len;
            rn->pix[k] = pix;
            rn->n++;
        }
        q += len;
    }
}

/* The level's epilogue on one row tile's C, run by run. */
static void ig_store(const ig_ctx *c, const ql_epilogue *ep, const int32_t *Ct, const ql_ik_runs *rn, int i,
                     int rows)
{
    for (int k = 0; k < rn->n; k++)
        c->epilogue(ep, Ct + rn->col[k], QL_IK_NR, NULL, i, (int)rn->pix[k], rows, rn->len[k]);
}

/* The last tile's w real columns as contiguous k runs for the dot kernel: column c, k-group
 * g at xt + c*xs + 4g (both forms hold one k-group of one position in 4 bytes), zero-padded
 * to xs (a multiple of 32 bytes). */
static void ig_gather(const ig_ctx *c, const char *base, int w, char *xt)
{
    for (int j = 0; j < w; j++) {
        char *d = xt + j * c->xs;
        for (int g = 0; g < c->groups; g++) memcpy(d + 4 * (ptrdiff_t)g, base + c->off[g] + 4 * j, 4);
        memset(d + 4 * (ptrdiff_t)c->groups, 0, (size_t)(c->xs - 4 * (ptrdiff_t)c->groups));
    }
}

/* Gather task: image j's narrow last tile (after its copy). */
static void ig_gather_task(void *vctx, ptrdiff_t j, int thread)
{
    const ig_ctx *c = (const ig_ctx *)vctx;
    (void)thread;
    ig_gather(c, c->copy + (size_t)j * c->cstride + 4 * (size_t)((c->ntiles - 1) * c->tstride), (int)c->wlast,
              c->xt + (size_t)j * c->xt_bytes);
}

/* Calls that took each GEMM path (implicit, im2col), then the implicit path's GEMMs over
 * several images, the images they covered and the merged tail panels their tasks ran (once per
 * row block), the implicit runs on shifted planes (ig_shift_pays) and those whose images ran in
 * parallel, one thread an image (ig_chunk_task): a diagnostic the tests
 * read to prove which path their cases exercised (relaxed atomics: calls may come from several
 * threads). */
static long long ig_calls[9];

/* Packing task: the chunk's images' last tiles into the panel u = n0 / tpm + task they belong to. */
static void ig_tail_task(void *vctx, ptrdiff_t task, int thread)
{
    const ig_ctx *c = (const ig_ctx *)vctx;
    (void)thread;
    int64_t u = c->n0 / c->tpm + task;
    int64_t g0 = u * c->tpm > c->n0 ? u * c->tpm : c->n0;
    int64_t g1 = (u + 1) * c->tpm < c->n0 + c->nimg ? (u + 1) * c->tpm : c->n0 + c->nimg;
    size_t wb = 4 * (size_t)c->wlast, ql = 4 * (size_t)((c->ntiles - 1) * c->tstride);
    char *d = c->tp + (size_t)(u % c->nbuf) * c->tp_bytes;
    for (int g = 0; g < c->groups; g++)
        for (int64_t gi = g0; gi < g1; gi++)
            memcpy(d + 64 * (size_t)g + (size_t)(gi - u * c->tpm) * wb,
                   c->copy + (size_t)(gi - c->n0) * c->cstride + ql + c->off[g], wb);
}

/* Gather task: leftover image left_j0 + k's last tile, from its panel, for the dot kernel. */
static void ig_left_task(void *vctx, ptrdiff_t k, int thread)
{
    const ig_ctx *c = (const ig_ctx *)vctx;
    (void)thread;
    int64_t gi = c->left_j0 + k, u = gi / c->tpm;
    ig_ctx v = *c;
    v.off = c->offp;   /* the panel's layout */
    ig_gather(&v, c->tp + (size_t)(u % c->nbuf) * c->tp_bytes + 4 * (size_t)((gi - u * c->tpm) * c->wlast),
              (int)c->wlast, c->xt + (size_t)k * c->xt_bytes);
}

/* GEMM task: row block x block of (image, tile) pairs; each tile's C goes to the epilogue in runs of real
 * output pixels (straight from the accumulators where the kernel has ikernel_ep). K blocks of
 * at most c->kgroups k-groups: the operand a tile reads (64 bytes per k-group, scattered over
 * the copy) stays in L1 while every row tile passes over it; partial sums add (wrapping)
 * into the thread's C block. */
static void ig_gemm_body(const ig_ctx *c, ptrdiff_t task, int thread)
{
    int rb = (int)(task % c->row_blocks);
    int64_t tb = task / c->row_blocks;
    /* row tiles [rb G / rbs, (rb + 1) G / rbs) and (image, tile) pairs likewise: blocks differ
     * by at most one row tile (pair), so that the tasks the threads share out are alike (the
     * last row block of a 512-row layer was 8 rows against 24: a thread idled while the other
     * ran a task) */
    int i_beg = (int)((int64_t)rb * c->mgroups / c->row_blocks) * c->mr;
    int i_end = (int)((int64_t)(rb + 1) * c->mgroups / c->row_blocks) * c->mr;
    if (i_end > c->Mg) i_end = c->Mg;
    int64_t tiles = c->tpm ? c->ntiles - 1 : c->ntiles;   /* per image, merged tails apart */
    int64_t npan = c->u_run1 - c->u_run0;
    int64_t pairs = c->nimg * tiles + npan + c->nleft;
    /* blocks of whole tile pairs for a kernel that runs two tiles at once (ig_tile_blocks) */
    int64_t unit = c->kern->ikernel2_ep ? 2 : 1, units = (pairs + unit - 1) / unit;
    int64_t t_beg = tb * units / c->tile_blocks * unit, t_end = (tb + 1) * units / c->tile_blocks * unit;
    if (t_end > pairs) t_end = pairs;
    int32_t Ct[QL_MAX_MR * QL_IK_NR] __attribute__((aligned(64)));
    int32_t *Cb = (int32_t *)(c->cblock + (size_t)thread * c->cblock_bytes);
    size_t es = c->kern->form == QL_FORM_I16 ? 2 : 1;
    /* the row block's packed rows: row i at Lb + (i - ib) * ldl (the prepared weights, or the
     * task's own packing of a plain call's rows, used while they are in L2) */
    const char *Lb = c->L;
    int ib = 0;
    if (c->wr && t_beg < t_end && i_beg < i_end) {
        char *d = c->scratch + (size_t)thread * c->scratch_bytes + c->wscr_off;
        const uint8_t *src = c->wr + (size_t)i_beg * (size_t)c->Kraw;
        int rows = i_end - i_beg;
        if (c->wgrouped)
            pack_w_grouped(c->kern, src, c->w_type, rows, c->Kraw, c->taps, c->wzp + i_beg, d, 0, rows);
        else
            pack_w_rows(c->kern, src, c->w_type, rows, c->Kraw, c->wzp + i_beg, d, 0, rows);
        if (c->fb)   /* S8U8: the per-row terms of this task's rows, from their sums */
            fast_terms(c->bias_g ? c->bias_g + i_beg : NULL, c->zxu,
                       (const int32_t *)(d + (size_t)rows * (size_t)c->ldl), rows, c->fb + i_beg);
        Lb = d;
        ib = i_beg;
    }
    ql_ik_runs rn, rn2[2];
    int paired = 0;
    ql_epilogue epj = c->ep;   /* image j's: its output */
    const ql_epilogue *ep = &epj;
    for (int64_t pt = t_beg; pt < t_end; pt++) {
        const char *base, *xt = NULL;
        const ptrdiff_t *off = c->off;
        int64_t wt, j = tiles ? pt / tiles : 0, t = tiles ? pt % tiles : 0;
        int merged = pt >= c->nimg * tiles && pt < c->nimg * tiles + npan;
        if (pt >= c->nimg * tiles + npan) {
            /* a leftover image's last tile: the dot kernel, on its columns gathered from its panel */
            int64_t k = pt - c->nimg * tiles - npan;
            epj.out = c->out0 + (size_t)(c->left_j0 + k) * c->ostride;
            ig_runs(c, (c->ntiles - 1) * c->tstride, &rn);
            xt = c->xt + (size_t)k * c->xt_bytes;
            base = NULL;
            wt = c->wlast;
        } else if (merged) {
            /* a merged tail panel: image k's runs moved to columns k * wlast.. and to its output */
            int64_t u = c->u_run0 + (pt - c->nimg * tiles), j0 = u * c->tpm;
            int64_t jn = c->p->N - j0 < c->tpm ? c->p->N - j0 : c->tpm;
            ql_ik_runs r1;
            ig_runs(c, (c->ntiles - 1) * c->tstride, &r1);
            rn.n = 0;
            for (int64_t k = 0; k < jn; k++)
                for (int e = 0; e < r1.n; e++) {
                    rn.col[rn.n] = r1.col[e] + (int)(k * c->wlast);
                    rn.len[rn.n] = r1.len[e];
                    rn.pix[rn.n] = r1.pix[e] + (ptrdiff_t)k * c->img_pix;
                    rn.n++;
                }
            epj.out = c->out0 + (size_t)j0 * c->ostride;
            base = c->tp + (size_t)(u % c->nbuf) * c->tp_bytes;
            off = c->offp;
            wt = jn * c->wlast;
            __atomic_add_fetch(&ig_calls[4], 1, __ATOMIC_RELAXED);
        } else {
            epj.out = (char *)c->ep.out + (size_t)j * c->ostride;
            int64_t q0 = t * c->tstride;
            base = c->copy + (size_t)j * c->cstride + 4 * (size_t)q0;
            ig_runs(c, q0, &rn);
            /* the tile's columns: 16, fewer for row-aligned tiles, and the last tile's rest */
            wt = c->tstride < QL_IK_NR ? c->tstride : QL_IK_NR;
            if (c->Q - q0 < wt) wt = c->Q - q0;
            if (c->xt) xt = c->xt + (size_t)j * c->xt_bytes;   /* gathered after the copy */
            /* this tile and the image's next one (this thread's too) at once, where the
             * kernel can (ikernel2_ep): both 16 columns apart, the next not a narrow one */
            int64_t w2 = c->Q - q0 - QL_IK_NR < QL_IK_NR ? c->Q - q0 - QL_IK_NR : QL_IK_NR;
            if (c->kern->ikernel2_ep && c->fused && c->tstride == QL_IK_NR && wt == QL_IK_NR && t + 1 < tiles &&
                pt + 1 < t_end && !(c->xt && w2 <= QL_DOT_NR) && !(c->kern->ikernel_tail && w2 <= c->kern->tail_nr)) {
                rn2[0] = rn;
                ig_runs(c, q0 + QL_IK_NR, &rn2[1]);
                for (int i = i_beg; i < i_end; i += c->mr) {
                    int rows = i_end - i < c->mr ? i_end - i : c->mr;
                    c->kern->ikernel2_ep(Lb + (ptrdiff_t)(i - ib) * c->ldl, c->ldl, base, off, c->groups, ep, rn2, i,
                                         rows);
                }
                pt++;
                paired = 1;
                continue;
            }
        }
        /* a tile with at most tail_nr or QL_DOT_NR columns: the narrow kernels (the runs lie
         * within them); a 7x7 plane's 49 = 3*16 + 1 */
        if (xt && wt <= QL_DOT_NR && !merged) {
            /* gathered once, then dot products of the row block's rows with them over the
             * whole K (K blocks or not: the gathered columns are contiguous), the level's
             * epilogue on the runs */
            int w = (int)wt;
            for (int i = i_beg; i < i_end; i += c->mr) {
                int rows = i_end - i < c->mr ? i_end - i : c->mr;
                const char *Li = Lb + (ptrdiff_t)(i - ib) * c->ldl;
                if (c->ep_ok && c->kern->dot_ep) {
                    c->kern->dot_ep(Li, c->ldl, xt, c->xs, 4 * c->groups, w, ep, &rn, i, rows);
                    continue;
                }
                c->kern->dot(Li, c->ldl, xt, c->xs, 4 * c->groups, w, Ct, QL_IK_NR, rows);
                ig_store(c, ep, Ct, &rn, i, rows);
            }
            ql_tail_count(2);
            continue;
        }
        ql_ikernel_fn ik = c->kern->ikernel;
        ql_ikernel_ep_fn ike = c->kern->ikernel_ep;
        if (wt <= c->kern->tail_nr && c->kern->ikernel_tail) {
            ik = c->kern->ikernel_tail;
            ike = c->kern->ikernel_ep_tail;
            ql_tail_count(0);
        }
        if (c->kgroups >= c->groups) {
            for (int i = i_beg; i < i_end; i += c->mr) {
                int rows = i_end - i < c->mr ? i_end - i : c->mr;
                if (c->fused && ike) {
                    ike(Lb + (ptrdiff_t)(i - ib) * c->ldl, c->ldl, base, off, c->groups, ep, &rn, i, rows);
                    continue;
                }
                ik(Lb + (ptrdiff_t)(i - ib) * c->ldl, c->ldl, base, off, c->groups, Ct, QL_IK_NR, rows);
                ig_store(c, ep, Ct, &rn, i, rows);
            }
            continue;
        }
        for (int g0 = 0; g0 < c->groups; g0 += c->kgroups) {
            int gn = c->groups - g0 < c->kgroups ? c->groups - g0 : c->kgroups;
            const char *Lk = Lb + (size_t)g0 * (size_t)c->kpk * es;
            for (int i = i_beg; i < i_end; i += c->mr) {
                int rows = i_end - i < c->mr ? i_end - i : c->mr;
                int32_t *cb = Cb + (size_t)(i - i_beg) * QL_IK_NR;
                if (g0 == 0) {
                    ik(Lk + (ptrdiff_t)(i - ib) * c->ldl, c->ldl, base, off, gn, cb, QL_IK_NR, rows);
                } else {
                    ik(Lk + (ptrdiff_t)(i - ib) * c->ldl, c->ldl, base, off + g0, gn, Ct, QL_IK_NR, rows);
                    uint32_t *d = (uint32_t *)cb;
                    const uint32_t *src = (const uint32_t *)Ct;
                    for (int e = 0; e < rows * QL_IK_NR; e++) d[e] += src[e];
                }
            }
        }
        for (int i = i_beg; i < i_end; i += c->mr) {
            int rows = i_end - i < c->mr ? i_end - i : c->mr;
            ig_store(c, ep, Cb + (size_t)(i - i_beg) * QL_IK_NR, &rn, i, rows);
        }
    }
    if (paired) __atomic_add_fetch(&chunk_calls[1], 1, __ATOMIC_RELAXED);
}

/* ig_gemm_body with the kernel's per-thread state hooks around it (qlinear.h: task_begin) */
static void ig_gemm_task(void *vctx, ptrdiff_t task, int thread)
{
    const ig_ctx *c = (const ig_ctx *)vctx;
    if (c->kern->task_begin) c->kern->task_begin();
    ig_gemm_body(c, task, thread);
    if (c->kern->task_end) c->kern->task_end();
}

long long ql_conv_in_task_packs(void) { return __atomic_load_n(&ig_calls[7], __ATOMIC_RELAXED); }
long long ql_conv_copy_job_packs(void) { return __atomic_load_n(&ig_calls[8], __ATOMIC_RELAXED); }

void ql_conv_path_counts(long long *implicit, long long *im2col, long long *merged, long long *merged_images,
                         long long *merged_tails, long long *shifted, long long *parallel_chunks)
{
    *implicit = __atomic_load_n(&ig_calls[0], __ATOMIC_RELAXED);
    *im2col = __atomic_load_n(&ig_calls[1], __ATOMIC_RELAXED);
    *merged = __atomic_load_n(&ig_calls[2], __ATOMIC_RELAXED);
    *merged_images = __atomic_load_n(&ig_calls[3], __ATOMIC_RELAXED);
    *merged_tails = __atomic_load_n(&ig_calls[4], __ATOMIC_RELAXED);
    *shifted = __atomic_load_n(&ig_calls[5], __ATOMIC_RELAXED);
    *parallel_chunks = __atomic_load_n(&ig_calls[6], __ATOMIC_RELAXED);
}

/* Images per GEMM on the implicit path. A small plane is a few tiles per image (7x7: 4), so
 * an image at a time streams every L2-sized block of packed weights for those few tiles, with
 * two thread barriers per image; a chunk of images is copied side by side and one GEMM runs
 * over its (image, tile) pairs, each weight block used on all of them. The chunk's copies (per
 * image: per bytes) stay within IG_BATCH_BYTES, Zen 3's L2 (measured: chunks of 1 MiB made a
 * 2048-channel 7x7 pointwise layer 8% slower, its copies then read from L3 by every row
 * block), and within avail (the workspace limit less the scratch and fixed buffers). */
#ifndef IG_BATCH_BYTES
#define IG_BATCH_BYTES ((size_t)512 << 10)
#endif
#define IG_MIN_PAIRS 4
static int64_t ig_batch_images(int64_t N, size_t per, size_t avail)
{
    if (N <= 1) return 1;
    int64_t n = (int64_t)(IG_BATCH_BYTES / per), w = (int64_t)(avail / per);
    if (w < n) n = w;
    if (n > N) n = N;
    return n < 1 ? 1 : n;
}

/* GEMM tasks of a chunk: row blocks x blocks of (image, tile) pairs (ig_gemm_task shares the
 * pairs out evenly), at least 4 tasks per thread, and a multiple of the threads where the pairs
 * allow (tasks of equal work, claimed in turn: none left for one thread; 19 row blocks on 2
 * threads: 38 tasks, not 19, of which one thread would run 10 and the other 9); a chunk of
 * several images keeps at least IG_MIN_PAIRS pairs a task. */
static void ig_tile_blocks(ig_ctx *c, int run_threads)
{
    int64_t pairs = c->nimg * (c->tpm ? c->ntiles - 1 : c->ntiles) + (c->u_run1 - c->u_run0) + c->nleft;
    int64_t target = run_threads > 1 ? 4 * run_threads : 1;
    if (pairs == 0) {   /* a chunk whose only tiles are in panels it does not complete */
        c->tile_blocks = 0;
        return;
    }
    /* blocks of whole tile pairs for a kernel that runs two tiles at once (ig_gemm_body) */
    int64_t units = c->kern->ikernel2_ep ? (pairs + 1) / 2 : pairs;
    c->tile_blocks = (target + c->row_blocks - 1) / c->row_blocks;
    if (c->tile_blocks > units) c->tile_blocks = units;
    int64_t most = c->nimg > 1 ? pairs / IG_MIN_PAIRS : units;
    if (most > units) most = units;
    if (run_threads > 1)
        for (int64_t nb = c->tile_blocks; nb <= most; nb++)
            if (c->row_blocks * nb % run_threads == 0) {
                c->tile_blocks = nb;
                break;
            }
}

/* Chunk task of the images-in-parallel schedule (ig_run, which makes every chunk one image):
 * chunk `task` (images task * nimg..) run whole on this thread - its copy into the thread's
 * own region, its last tiles into their panels (shared: each image's columns are its own bytes
 * of the panel; the panels run after every chunk, ig_run), its GEMM over its (image, tile)
 * pairs row block by row block - the same task functions the threads share on the other
 * schedule, called in order: the same kernels on the same operands. */
static void ig_chunk_task(void *vctx, ptrdiff_t task, int thread)
{
    const ig_ctx *c = (const ig_ctx *)vctx;
    ig_ctx v = *c;
    int64_t n0 = (int64_t)task * c->nimg;
    v.nimg = c->nbatch - n0 < c->nimg ? c->nbatch - n0 : c->nimg;
    v.n0 = n0;
    v.copy = c->copy + (size_t)thread * c->pregion;
    v.xg = c->xg + (size_t)n0 * c->xstride;
    v.ep.out = (char *)c->ep.out + (size_t)n0 * c->ostride;
    v.u_run0 = v.u_run1 = v.nleft = 0;   /* the panels: after every chunk */
    v.cpt = 1;
    for (ptrdiff_t k = 0; k < (ptrdiff_t)(v.nimg * v.nblk); k++) ig_copy_chunk_task(&v, k, thread);
    if (v.tpm)
        for (ptrdiff_t k = 0; k < (ptrdiff_t)((n0 + v.nimg - 1) / v.tpm - n0 / v.tpm + 1); k++) ig_tail_task(&v, k, thread);
    ig_tile_blocks(&v, 1);
    for (ptrdiff_t k = 0; k < (ptrdiff_t)(v.row_blocks * v.tile_blocks); k++) ig_gemm_task(&v, k, thread);
    if (v.nimg > 1) {
        __atomic_add_fetch(&ig_calls[2], 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&ig_calls[3], v.nimg, __ATOMIC_RELAXED);
    }
}

/* Shifted planes (ig_copy_shift_task) against the standard phase planes. The standard planes
 * are Wph = OW + the kernel's reach wide, so a tile computes Wph - OW dropped columns per
 * output row: 2 of every 16 on a 14x14 plane, and a 7x7 plane ends in a 7-column dot tile.
 * The shifted planes, one per column tap, hold each tap's columns already shifted: rows OW
 * wide, q = oh*OW + ow, every computed column real but the last tile's tail (a 7x7 plane: 3
 * tiles and 1 dot column), for kw / nfw times the copy. Taken where the tiles cost less and
 * that copy stays within IG_SHIFT_COPY_MAX. Measured (1 thread, ResNet-50 3x3 layers, 7-bit
 * and exact): 14x14 and 7x7 planes 7-14% faster, stride 2 3-13%, the 7x7 stride-2 stem 4-7%,
 * 56x56 3% at 7 bits (0.6 MiB copy) but -1% to +2% exact (1.25 MiB, interleaved with
 * onnxruntime: slower); a 112x112 64-channel plane 3% faster at 7 bits (2.4 MiB) but 8%
 * slower exact (4.9 MiB), 224x224 32 channels 2-4% / 14-17% (4.9 / 9.7 MiB): the bound.
 * Tile costs in units of a dot kernel's column pair, a full tile IG_TILE_PAIRS of them
 * (measured, 7-bit 512-channel 7x7 plane: 7 dot columns 17% of the time, 3 tiles 75%). */
#define IG_TILE_PAIRS 6
#define IG_SHIFT_COPY_MAX ((int64_t)1 << 20)
#define IG_SHIFT_MAX_KW 8

/* cost of nt tiles, the last wl columns wide (a dot tile where it has at most QL_DOT_NR) */
static int64_t ig_tiles_cost(int64_t nt, int64_t wl, int dot)
{
    return IG_TILE_PAIRS * (nt - 1) + (dot && wl <= QL_DOT_NR ? (wl + 1) / 2 : IG_TILE_PAIRS);
}

static int ig_shift_pays(const ig_ctx *c, const ql_gemm_kernel *kern, int64_t kw, size_t workspace)
{
    if (kw < 2 || kw > IG_SHIFT_MAX_KW || c->Wph <= c->OW || c->Ro < 2) return 0;
    /* the shifted copy's bytes (ig_run's PL and BS, within 64 bytes a plane; a block's below
     * 2^47 after ig_run's size check, the product compared by division); within half the
     * workspace limit, so that a limit the standard copy fits never sends the convolution to
     * the im2col path instead */
    int64_t nblk = (c->Cg + c->kpk - 1) / c->kpk, block = 4 * c->nfo * kw * (c->Rph * c->OW + 48);
    if (block > IG_SHIFT_COPY_MAX || nblk > IG_SHIFT_COPY_MAX / block || (size_t)(block * nblk) > workspace / 2)
        return 0;
    int dot = kern->dot != NULL;
    int64_t q = (c->Ro - 1) * c->Wph + c->OW, nt = (q + QL_IK_NR - 1) / QL_IK_NR;
    int64_t std = ig_tiles_cost(nt, q - (nt - 1) * QL_IK_NR, dot);
    if (c->OW <= QL_IK_NR && dot) {   /* the row-aligned tiles (ig_run) */
        int64_t r = (QL_IK_NR - c->OW) / c->Wph + 1, ntr = (c->Ro + r - 1) / r;
        int64_t cr = ig_tiles_cost(ntr, (c->Ro - (ntr - 1) * r - 1) * c->Wph + c->OW, dot);
        if (cr < std) std = cr;
    }
    int64_t qs = c->Ro * c->OW, nts = (qs + QL_IK_NR - 1) / QL_IK_NR;
    return ig_tiles_cost(nts, qs - (nts - 1) * QL_IK_NR, dot) < std;
}

/* Group g's operands of the chunk from image n0 on (ig_run): its input, packed weights,
 * epilogue (bias, multipliers, output) and the first image's output. */
static void ig_group(ig_ctx *c, int64_t g, int64_t n0, const void *wpacked, const int32_t *fast_bias, int fused)
{
    const ql_conv_plan *p = c->p;
    int64_t P = c->P;
    size_t esize = p->quantized ? 1 : 4;
    c->xg = (const uint8_t *)p->x + (size_t)((n0 * p->C + g * c->Cg) * c->plane);
    c->L = (const char *)wpacked + (size_t)(g * c->Mg) * (size_t)c->ldl;
    if (c->wr) {   /* wr, wzp: group 0's (ig_run); each group's rows follow */
        c->L = NULL;
        c->wr = c->wr0 + (size_t)(g * c->Mg) * (size_t)c->Kraw;
        c->wzp = c->wzp0 + g * c->Mg;
    }
    plan_epilogue(p, &c->ep);
    if (p->bias) c->ep.row_bias = p->bias + g * c->Mg;
    if (fast_bias) c->ep.row_bias = fast_bias + g * c->Mg;
    if (c->fb_all) {
        c->fb = c->fb_all + g * c->Mg;
        c->bias_g = p->bias ? p->bias + g * c->Mg : NULL;
    }
    c->ep.mult = p->mult + g * c->Mg * p->mult_s;
    c->ep.out = (char *)p->y + (size_t)((n0 * p->M + g * c->Mg) * P) * esize;
    c->ep.out_rs = (ptrdiff_t)P;
    c->out0 = (char *)p->y + (size_t)(g * c->Mg * P) * esize;
    /* what ikernel_ep supports (always so here: the forms have no corrections, the
     * multipliers are per output channel, NCHW rows are contiguous) */
    c->ep_ok = c->ep.out_cs == 1 && c->ep.mult_cs == 0 && !c->ep.row_a;
    c->fused = fused && c->ep_ok;
}

/* Rows of a row block (a multiple of mr, at least mr): at most 256 KiB of packed weights, so a
 * block stays in L2 while the tiles of its columns use it. The blocks ig_run makes are at most
 * this long, which also sizes a plain call's per-thread packing scratch. */
static int ig_block_rows(ptrdiff_t ldl, int mr)
{
    int mc = (int)((256 * 1024) / (size_t)ldl) / mr * mr;
    return mc < mr ? mr : mc;
}

/* Whether no weight of a plain call can lie outside kern's S8U8 bound: every int8 w - z is
 * stored exactly where the bound is 128 (the VNNI levels) and every zero point is the type's
 * center (int8 0, uint8 128: w - z then spans [-128, 127]), so nothing needs proving before
 * the GEMM starts. */
static int trivial_bound(const ql_gemm_kernel *kern, const ql_conv_wraw *raw, int M)
{
    if (kern->s8_bound < 128) return 0;
    int32_t center = raw->w_type == QL_I8 ? 0 : 128;
    for (int i = 0; i < M; i++)
        if (raw->wzp[i] != center) return 0;
    return 1;
}

/* Runs the convolution on the implicit path when it applies: returns 1 (done), 0 (not taken:
 * the caller runs the im2col path) or -1 (out of memory). fast_bias: the S8U8 per-row term. */
static int ig_run(const ql_conv_plan *p, const ql_isa *isa, const ql_gemm_kernel *kern, void *wpacked,
                  const ql_conv_wraw *raw, int32_t *fast_bias, size_t workspace)
{
    if (!kern->ikernel || kern->form == QL_FORM_U8S8) return 0;
    ig_ctx c;
    memset(&c, 0, sizeof c);
    c.p = p;
    c.kern = kern;
    c.epilogue = isa->epilogue;
    c.kpk = kern->kpack;
    c.mr = kern->mr;
    c.Cg = p->C / p->group;
    c.taps = prod(p->k, p->nsp);
    int64_t K = c.Cg * c.taps;
    /* the grouped order (or one tap, where both orders are the channel order) */
    if (c.taps > 1 && !ql_conv_grouped(kern, K, c.taps)) return 0;
    /* The last axis makes the rows (W, OW, sw, pw); the outer axes, however many, are
     * flattened into the rows of each phase plane: every rank runs the same geometry. */
    int L = p->nsp - 1;
    int64_t kw = p->k[L], dw = p->dil[L];
    c.W = p->in[L]; c.OW = p->out[L]; c.sw = p->stride[L]; c.pw = p->pad[L];
    c.nout = L;
    c.plane = prod(p->in, p->nsp);
    c.P = prod(p->out, p->nsp);
    if (c.sw > IG_MAX_STRIDE) return 0;
    /* padded extents (what the input and its begin pads cover, and what the windows reach),
     * each below 2^61 (module.c bounds every term by 2^60); phase planes ceil(e / s) along
     * every axis. The copy must stay small: huge pads, strides or dilations (far more
     * positions than the input and the output together) take the im2col path, which never
     * materializes padding. Each extent is bounded by 2^24 and the plane (a product, checked
     * factor by factor against the bound) by 2 (input + output) + 4096 < 2^62 (plane and P are
     * the caller's arrays' sizes), so every product below is below 2^40 or so. */
    int64_t ew = c.W + c.pw, nw = (c.OW - 1) * c.sw + (kw - 1) * dw + 1;
    if (nw > ew) ew = nw;
    c.Wph = (ew + c.sw - 1) / c.sw;
    int64_t limit = 2 * (c.plane + c.P) + 4096;
    if (c.Wph > ((int64_t)1 << 24) || c.Wph > limit) return 0;
    c.Rph = 1;
    c.Ro = 1;
    c.dense = 1;
    for (int ax = 0; ax < L; ax++) {
        int64_t e = p->in[ax] + p->pad[ax], need = (p->out[ax] - 1) * p->stride[ax] + (p->k[ax] - 1) * p->dil[ax] + 1;
        if (need > e) e = need;
        if (p->stride[ax] > IG_MAX_STRIDE) return 0;
        c.oin[ax] = p->in[ax]; c.oout[ax] = p->out[ax];
        c.os[ax] = p->stride[ax]; c.opad[ax] = p->pad[ax];
        c.oext[ax] = (e + p->stride[ax] - 1) / p->stride[ax];
        if (c.oext[ax] > ((int64_t)1 << 24) || c.Rph > limit / c.Wph / c.oext[ax]) return 0;
        c.Rph *= c.oext[ax];
        if (ax > 0 && c.oext[ax] != c.oout[ax]) c.dense = 0;
    }
    for (int64_t ax = L - 1, st = 1; ax >= 0; ax--) {   /* row strides; the rows the outputs span */
        c.rst[ax] = st;
        st *= c.oext[ax];
        c.Ro += (c.oout[ax] - 1) * c.rst[ax];
    }
    int64_t P = c.P;
    /* used phases: the column phases, and the tuples of the outer axes' (the Cartesian
     * product of each axis' used phases, at most IG_MAX_OPH of them, else im2col) */
    int used_w[IG_MAX_STRIDE] = {0}, idx_w[IG_MAX_STRIDE];
    for (int64_t t = 0; t < kw; t++) used_w[(t * dw) % c.sw] = 1;
    for (int f = 0; f < IG_MAX_STRIDE; f++) {
        idx_w[f] = used_w[f] ? c.nfw : -1;
        if (used_w[f]) c.fw[c.nfw++] = f;
    }
    /* per outer axis: idx_o[ax][f] the rank of phase f among the axis' used ones, nused[ax] */
    int idx_o[QL_CONV_MAXD][IG_MAX_STRIDE], nused[QL_CONV_MAXD];
    int64_t fval[QL_CONV_MAXD][IG_MAX_STRIDE];
    c.nfo = 1;
    for (int ax = 0; ax < L; ax++) {
        int used[IG_MAX_STRIDE] = {0};
        for (int64_t t = 0; t < p->k[ax]; t++) used[(t * p->dil[ax]) % c.os[ax]] = 1;
        nused[ax] = 0;
        for (int f = 0; f < IG_MAX_STRIDE; f++) {
            idx_o[ax][f] = used[f] ? nused[ax] : -1;
            if (used[f]) fval[ax][nused[ax]++] = f;
        }
        if (c.nfo * nused[ax] > IG_MAX_OPH) return 0;
        c.nfo *= nused[ax];
    }
    for (int a = 0; a < c.nfo; a++)   /* tuple a: mixed radix over nused, the last axis fastest */
        for (int ax = L - 1, r = a; ax >= 0; ax--) {
            c.fo[a][ax] = fval[ax][r % nused[ax]];
            r /= nused[ax];
        }
    if (ig_shift_pays(&c, kern, kw, workspace)) {   /* shifted planes: one per column tap, OW wide */
        c.shift = 1;
        c.Wph = c.OW;
        c.nfw = (int)kw;
        c.sdw = dw;
    }
    /* planes and blocks start on 64-byte lines (16 positions): a tile's operand of one tap
     * is then one aligned line when the tap's offset is (1x1 kernels: every k-group), and
     * the L1 footprint of a tile is not doubled by lines split between k-groups. Rows are
     * interleaved Wr = Wph rounded up to 16 positions at a time (SIMD without tails): the
     * positions past a row's end are the next row's, written after it, or for the plane's
     * last row the plane's own 16-position spare, zeroed after the plane is written. */
    c.Wr = (c.Wph + 15) / 16 * 16;
    c.PL = (c.Rph * c.Wph + 16 + 15) / 16 * 16;
    /* rows that hold the input's rows one after the other, as one run (ig_copy_task): no
     * stride, padding or dropped column along the rows, none along the outer axes but the
     * first (which may have pads: padding rows before and after the run) - a pointwise
     * kernel's whole plane */
    int bulk = c.sw == 1 && c.pw == 0 && c.Wph == c.W && (L == 0 || c.os[0] == 1);
    int64_t inner = 1;
    for (int ax = 1; ax < L; ax++) {
        bulk &= c.os[ax] == 1 && c.opad[ax] == 0 && c.oext[ax] == c.oin[ax];
        inner *= c.oin[ax];
    }
    if (bulk) {
        c.bulk0 = (L ? c.opad[0] : 0) * inner;
        c.bulk1 = c.bulk0 + (L ? c.oin[0] : 1) * inner;
        if (c.bulk1 > c.Rph) c.bulk1 = c.Rph;
    }
    /* ... and an odd number of lines apart (planes of a block, and blocks): a tile reads every
     * block (and its planes) at the same offsets, which at a multiple of 4 KiB apart would all
     * fall in the same sets of the 8-way L1 (4 KiB per way) and evict each other (measured: a
     * 28x28 stride-2 layer with blocks of 4 KiB, 14% slower) */
    if (c.nfo * c.nfw > 1 && c.PL / 16 % 2 == 0) c.PL += 16;
    c.BS = (int64_t)c.nfo * c.nfw * c.PL;
    if (c.BS / 16 % 2 == 0) c.BS += 16;
    c.nblk = (int)((c.Cg + c.kpk - 1) / c.kpk);
    c.Q = (c.Ro - 1) * c.Wph + c.OW;
    c.ntiles = (c.Q + QL_IK_NR - 1) / QL_IK_NR;
    c.tstride = QL_IK_NR;
    /* Row-aligned tiles: on a plane with dropped columns (Wph > OW) and rows of at most 16,
     * a tile may start every r output rows instead of every 16 q, r the most rows whose real
     * columns fit 16 ((r - 1) Wph + OW <= 16); the q between a tile's 16 columns and the next
     * tile's start are dropped columns. Taken when it costs fewer tile-equivalents, a last
     * tile of at most QL_DOT_NR columns counted as half a tile: a 7x7 plane with pads of 1
     * (Wph 9): tiles of rows 0-1, 2-3, 4-5 and 6, the last 7 columns wide (a dot tile),
     * against 16-q tiles whose last has 13 real columns. */
    if (c.Wph > c.OW && c.OW <= QL_IK_NR && kern->dot) {
        int64_t r = (QL_IK_NR - c.OW) / c.Wph + 1, nt = (c.Ro + r - 1) / r;
        int64_t wl = (c.Ro - (nt - 1) * r - 1) * c.Wph + c.OW;
        int64_t wl16 = c.Q - (c.ntiles - 1) * QL_IK_NR;
        int64_t cost = 2 * (nt - 1) + (wl <= QL_DOT_NR ? 1 : 2);
        int64_t cost16 = 2 * (c.ntiles - 1) + (wl16 <= QL_DOT_NR ? 1 : 2);
        if (cost < cost16) {
            c.tstride = r * c.Wph;
            c.ntiles = nt;
        }
    }
    /* computed columns: the Wph - OW dropped positions per row and the last tile's tail,
     * against the im2col path's ceil(P / 16) panels (whose last one is computed whole too):
     * at most a quarter more tiles (a 7x7 plane: 4 tiles, 4 panels; a plane 3 wide with pads
     * of 1, 5 positions a row: too many) */
    if (c.ntiles * 4 > (P + QL_IK_NR - 1) / QL_IK_NR * 5) return 0;
    int Kw = (int)ql_conv_wk(kern, K, c.taps);   /* packed rows: channels padded to nblk * kpk */
    int kp = ql_round_k(kern, Kw);
    c.groups = kp / c.kpk;   /* = nblk * taps in both orders */
    /* tap offsets (positions) within a channel block; the largest read is position
     * (nblk - 1) * BS + max toff + (ntiles - 1) * tstride + 15: the copy is that long (slack
     * zeroed) */
    int64_t toff_max = 0;
    size_t off_bytes = sizeof(ptrdiff_t) * (size_t)c.groups;
    c.off = (ptrdiff_t *)malloc(off_bytes);
    if (!c.off) return -1;
    for (int64_t t = 0; t < c.taps; t++) {
        /* tap t reads, along each axis, phase (k*d) % s from position (k*d) / s on: its outer
         * phase tuple a and row offset, then its column phase (or, shifted, its own plane) */
        int64_t tc[QL_CONV_MAXD], a = 0, rows = 0;
        tap_coords(p, t, tc);
        for (int ax = 0; ax < L; ax++) {
            int64_t rh = tc[ax] * p->dil[ax];
            a = a * nused[ax] + idx_o[ax][rh % c.os[ax]];
            rows += rh / c.os[ax] * c.rst[ax];
        }
        int64_t tw = tc[L], rw = tw * dw;
        int64_t toff = c.shift ? (a * c.nfw + tw) * c.PL + rows * c.Wph
                               : (a * c.nfw + idx_w[rw % c.sw]) * c.PL + rows * c.Wph + rw / c.sw;
        if (toff > toff_max) toff_max = toff;
        /* k-group of block b at tap t in the grouped order (group_of's inverse) */
        for (int64_t b = 0, ch = kchunk_of(kern); b < c.nblk; b++)
            c.off[(b / ch * c.taps + t) * ch + b % ch] = (ptrdiff_t)(4 * (b * c.BS + toff));
    }
    int64_t positions = (int64_t)c.nblk * c.BS,
            reach = (int64_t)(c.nblk - 1) * c.BS + toff_max + (c.ntiles - 1) * c.tstride + QL_IK_NR;
    if (reach > positions) positions = reach;
    size_t copy_bytes = 4 * (size_t)positions;
    int threads = ql_num_threads();
    /* per thread (ig_copy_task): kpk padded raw rows of RW bytes (a column phase fw < sw reads
     * up to fw + sw * Wr bytes, stride 2's SIMD split too; the valid columns end at pw + W <=
     * sw * Wph), then kpk phase rows of Wr bytes */
    c.RW = (int64_t)align64((size_t)(c.sw * (c.Wr + 1)));
    if (c.shift) {   /* tap e's columns start at e*dw; the valid ones end at pw + W */
        int64_t rw = (kw - 1) * dw + c.sw * (c.Wr + 1);
        c.RW = (int64_t)align64((size_t)(rw > c.pw + c.W ? rw : c.pw + c.W));
    }
    c.scratch_bytes = align64((size_t)c.kpk * (size_t)(c.RW + c.Wr));
    if (c.shift && c.sw == 2) {
        /* the shifted copy's stride 2 (ig_copy_shift_task): each column phase split for OW
         * positions from the largest tap offset (kw - 1) * dw / 2 on, rounded up to
         * ig_split_s2's step; it reads 2 * s2len raw bytes (kept within RW: the bytes past the
         * valid columns are x's zero point, written once per task) and writes 2 phase rows of
         * 4 * s2len bytes after the raw rows (in place of the phase rows of Wr bytes a channel) */
        int64_t step = IG_S2_STEP(c.kpk);
        c.s2len = (c.OW + (kw - 1) * dw / 2 + step - 1) / step * step;
        if (c.RW < 2 * c.s2len) c.RW = (int64_t)align64((size_t)(2 * c.s2len));
        c.scratch_bytes = align64((size_t)c.kpk * (size_t)c.RW + 8 * (size_t)c.s2len);
    }
    /* a pointwise kernel reads each copied byte once per row tile, like a packed panel: a copy
     * larger than L2 costs a round trip through L3 that the im2col path's per-panel packing
     * (read in place, used at once) does not (measured: 256 channels of 56x56, exact: 1.6 MB,
     * slower; 64 channels or 28x28 planes: faster). The 7-bit path does twice the
     * multiply-adds per copied byte (4 channels in 4 bytes, not 2): there 256 channels of
     * 56x56 (784 KiB) are 10% faster than im2col into 64 outputs, the same into 128-512 */
    size_t pw_max = kern->form == QL_FORM_S8U8 ? IG_PW_COPY_MAX_S8U8 : IG_PW_COPY_MAX;
    /* a plain call's weights (raw) packed in the GEMM tasks: per thread, after its copy rows,
     * room for a row block's packed rows (at most mc of them, as the row blocks below), where
     * the workspace limit allows it with the copy; else packed whole first (below) */
    int in_task = 0;
    /* the S8U8 form too where no weight can be outside its bound (trivial_bound), a row block
     * per task then (c.affine, below): its packed rows, row sums and per-row terms are the
     * task's own, written to its thread's scratch and read there, never to memory another core
     * reads; measured against packing the whole matrix first (2 threads, --no-amx) */
    int s8_in_task = raw && kern->form == QL_FORM_S8U8 && trivial_bound(kern, raw, (int)p->M);
    if (raw && (kern->form == QL_FORM_I16 || s8_in_task)) {
        ptrdiff_t ldl0 = w_row_bytes(kern, Kw);
        int rows0 = ig_block_rows(ldl0, c.mr);
        size_t wscr = align64((size_t)rows0 * (size_t)ldl0 + (s8_in_task ? 2 * sizeof(int32_t) * (size_t)rows0 : 0));
        if (copy_bytes + (c.scratch_bytes + wscr) * (size_t)threads <= workspace) {
            c.wscr_off = c.scratch_bytes;
            c.scratch_bytes += wscr;
            in_task = 1;
        }
    }
    if (copy_bytes > IG_COPY_MAX || (c.taps == 1 && copy_bytes > pw_max) ||
        copy_bytes + c.scratch_bytes * (size_t)threads > workspace) {
        free(c.off);
        return 0;
    }
    /* the dot tail: a last tile of at most QL_DOT_NR columns (only the last can be: a tile
     * stride below 16 is above 8, see the row-aligned tiles), gathered per image (within the
     * workspace limit with the copy and the scratch; else full tiles) */
    c.wlast = c.Q - (c.ntiles - 1) * c.tstride;
    if (c.wlast > QL_IK_NR) c.wlast = QL_IK_NR;
    size_t xs = (4 * (size_t)c.groups + 31) / 32 * 32, xt_bytes = align64((size_t)c.wlast * xs);
    int use_xt = kern->dot && c.wlast <= QL_DOT_NR &&
                 copy_bytes + c.scratch_bytes * (size_t)threads + xt_bytes <= workspace;
    if (!use_xt) xt_bytes = 0;
    /* merged tail panels: a batch whose last tile has at most QL_DOT_NR columns puts those of
     * tpm = 16 / wlast images side by side into one panel, a full tile for the tile kernels,
     * instead of a dot-kernel tile per image (measured: the 7 columns of a 7x7 plane's last
     * row through the dot kernel cost 1.6 times as much a column as a full tile's, 19% of the
     * time of ResNet-50's 512-channel 3x3 layer at batch 8). Panels fill across chunks (packed
     * from each image's copy, run when complete); a last partial panel of fewer than
     * QL_DOT_NR columns leaves its images (nleft) to the dot kernel. One group (the panels'
     * weights); the runs' pixels, offset by whole images from the panel's first image's
     * output, fit an int. */
    size_t fixed = c.scratch_bytes * (size_t)threads, tp_bytes = 64 * (size_t)c.groups;
    int64_t tpm = 0, nleft = 0;
    if (p->N > 1 && p->group == 1 && c.wlast <= QL_DOT_NR) {
        tpm = QL_IK_NR / c.wlast;
        int64_t rem = p->N % tpm;
        nleft = use_xt && rem && rem * c.wlast < QL_DOT_NR ? rem : 0;
        fixed += (size_t)nleft * xt_bytes + 2 * tp_bytes;
        if ((double)tpm * (double)p->M * (double)P > (double)INT_MAX ||
            fixed + copy_bytes + (tp_bytes + (size_t)tpm - 1) / (size_t)tpm > workspace) {
            tpm = nleft = 0;
            fixed = c.scratch_bytes * (size_t)threads;
        }
    }
    /* images per GEMM (ig_batch_images): their copies side by side, and their dot columns or
     * their share of the panels (the ring of panels: at most (chunk - 1) / tpm + 2 at a time),
     * within the workspace limit with the scratch */
    c.cstride = align64(copy_bytes);
    size_t per = c.cstride + (tpm ? (tp_bytes + (size_t)tpm - 1) / (size_t)tpm : xt_bytes);
    int64_t nimg = ig_batch_images(p->N, per, workspace - fixed);
    size_t region = (size_t)(nimg - 1) * c.cstride + copy_bytes;   /* one image: copy_bytes, as ever */
    /* Images in parallel: a batch of at least one image per thread runs each image whole on
     * one thread (ig_chunk_task: its copy into that thread's own region, its GEMM over its
     * tiles row block by row block), the images claimed in turn, instead of one chunk after
     * another with every thread on each (one region for the whole batch, then one for the
     * merged tail panels, against two to four per chunk: each a join where the threads wait
     * for the slower one). Measured on the ResNet-50 batch-8 layers, 2 threads, alternating
     * in one process (docs/benchmarks.md, branch b8w): 0-45% faster, geometric mean 10%. One
     * image a task, not the chunks of ig_batch_images: chunks of 2-4 images (their copies
     * side by side, each weight block used on all of them) were 5-17% slower than the
     * chunk-after-chunk schedule on the 7x7 and 14x14 layers with 2-4 MiB of weights - a
     * task of several images is too coarse to even out two threads that do not run at the
     * same speed (measured: one 50% slower for a whole call on the shared machine), and the
     * copies of two images with a block of weights overflow L2. Taken with one group (the
     * panels' weights), where the batch's MACs would use the threads at all (ql_gemm's 2^21),
     * with the batch a multiple of the threads or at least 4 images a thread (3 images on 2
     * threads: 2 and 1), and within the workspace limit: a copy per thread and the panels of
     * the whole batch (they fill across the threads' images). */
    int64_t pk = 0, npanels = 0;
    size_t pregion = 0;
    if (threads > 1 && p->group == 1 && p->N >= threads && (p->N % threads == 0 || p->N >= 4 * (int64_t)threads) &&
        (!use_xt || tpm) && (double)p->M * (double)P * (double)K * (double)p->N >= (double)(1 << 21)) {
        pk = 1;
        pregion = c.cstride;   /* align64(copy_bytes) */
        npanels = tpm ? (p->N + tpm - 1) / tpm : 0;
        /* the scratch and the leftover dot columns are in `fixed` (which holds within the
         * limit); the ring of two panels is not needed */
        size_t base = c.scratch_bytes * (size_t)threads + (tpm ? (size_t)nleft * xt_bytes : 0);
        size_t avail = workspace - base;
        if (pregion > avail / (size_t)threads) {
            pk = 0;
        } else {
            avail -= pregion * (size_t)threads;
            if (tpm && (size_t)npanels > avail / tp_bytes) pk = 0;
        }
        if (pk) {
            nimg = 1;
            region = pregion * (size_t)threads;
        }
    }
    /* images in parallel run every row block once per image: a plain call's weights are then
     * packed whole first, as they are when the scratch did not fit; the S8U8 form's (a bound
     * to prove, row sums for fast_bias) in the first copy job where there is one (below) */
    int pack_in_copy = 0;
    packw_ctx wjob;
    if (raw && (!in_task || pk)) {
        if (in_task) c.scratch_bytes = c.wscr_off;
        in_task = 0;
        s8_in_task = 0;
        if (kern->form == QL_FORM_S8U8 && !pk) {
            pack_in_copy = 1;
        } else {
            if (pack_w_threads(kern, raw->w, raw->w_type, (int)p->M, (int)K, c.taps, raw->wzp, wpacked, threads) != 0) {
                free(c.off);
                return -4;   /* a weight outside the S8U8 form's bound (the only form with one) */
            }
            if (fast_bias) fast_bias_fill(p, wpacked, w_row_bytes(kern, Kw), fast_bias);
        }
    }
    if (in_task) {
        c.wr0 = c.wr = (const uint8_t *)raw->w;
        c.wzp0 = c.wzp = raw->wzp;
        c.w_type = raw->w_type;
        c.Kraw = (int)K;
        c.wgrouped = ql_conv_grouped(kern, K, c.taps);
        if (s8_in_task) {
            c.affine = 1;
            c.fb_all = fast_bias;
            c.zxu = zx_u8form(p);
        }
        __atomic_add_fetch(&ig_calls[7], 1, __ATOMIC_RELAXED);
    }
    /* the copies in the scratch kept between calls (dw_scratch_get: a fresh block of this size
     * costs page faults on every call, measured 0.2 ms on a 56x56 layer), on a 64-byte line */
    int copy_cached;
    char *copy_mem = dw_scratch_get(region + 64, &copy_cached);
    c.copy = line_up(copy_mem);
    c.scratch_mem = (char *)malloc(c.scratch_bytes * (size_t)threads + 64);
    c.scratch = line_up(c.scratch_mem);
    if (!c.copy || !c.scratch) {
        if (copy_mem) dw_scratch_put(copy_mem, copy_cached);
        free(c.scratch_mem);
        free(c.off);
        return -1;
    }
    /* the slack past the planes is read only for dropped columns; zeroed so every read is of
     * defined bytes (any value is harmless: columns are independent); the copy tasks never
     * write it, so once for every image's copy */
    for (int64_t r = 0; r < (pk ? threads : 1); r++)
        for (int64_t j = 0; j < nimg; j++)
            memset(c.copy + (size_t)r * pregion + (size_t)j * c.cstride + 4 * (size_t)(c.nblk * c.BS), 0,
                   copy_bytes - 4 * (size_t)(c.nblk * c.BS));
    c.flip = p->x_type == QL_I8 ? 0x80 : 0;
    c.Mg = (int)(p->M / p->group);
    ptrdiff_t ldl = w_row_bytes(kern, Kw);
    c.ldl = ldl;
    /* threads: none for small convolutions (as ql_gemm: 2^21 MACs, an image's or a chunk's);
     * row blocks of at most 256 KiB of packed weights (L2); enough tasks for every thread */
    double macs = (double)c.Mg * (double)P * (double)K;
    int mc = ig_block_rows(ldl, c.mr);
    c.mgroups = (c.Mg + c.mr - 1) / c.mr;
    c.row_blocks = (c.mgroups + mc / c.mr - 1) / (mc / c.mr);
    if (c.affine && threads > 1) {   /* one task per row block: as many as the threads, or a multiple */
        int rb = (c.row_blocks + threads - 1) / threads * threads;
        c.row_blocks = rb < c.mgroups ? rb : c.mgroups;
    }
    c.mc = (c.mgroups + c.row_blocks - 1) / c.row_blocks * c.mr;   /* the largest block */
    /* K blocks (past IG_KBLOCK_GROUPS): IG_KC_BYTES of a tile's operand (64 bytes per k-group) */
    c.kgroups = IG_KC_BYTES / 64;
    if (c.groups > IG_KBLOCK_GROUPS) {
        int nkb = (c.groups + c.kgroups - 1) / c.kgroups;   /* equal blocks (of whole chunks) */
        int ch = (int)kchunk_of(kern);
        c.kgroups = ((c.groups + nkb - 1) / nkb + ch - 1) / ch * ch;
        c.cblock_bytes = align64(sizeof(int32_t) * QL_IK_NR * (size_t)c.mc);
        c.cblock_mem = (char *)malloc(c.cblock_bytes * (size_t)threads + 64);
        c.cblock = line_up(c.cblock_mem);
        if (!c.cblock) { dw_scratch_put(copy_mem, copy_cached); free(c.scratch_mem); free(c.off); return -1; }
    } else {
        c.kgroups = c.groups;
    }
    if (use_xt) {
        c.xs = (ptrdiff_t)xs;
        c.xt_bytes = xt_bytes;
        c.xt = (char *)malloc((size_t)(tpm ? nleft : nimg) * c.xt_bytes + 64);
        if (!c.xt) { dw_scratch_put(copy_mem, copy_cached); free(c.scratch_mem); free(c.off); free(c.cblock_mem); return -1; }
    }
    char *tp_mem = NULL;
    if (tpm) {
        c.tpm = tpm;
        c.tp_bytes = tp_bytes;
        c.nbuf = pk ? npanels : (nimg - 1) / tpm + 2;   /* images in parallel: every panel at once */
        tp_mem = (char *)malloc((size_t)c.nbuf * tp_bytes + 64);
        c.offp = (ptrdiff_t *)malloc(sizeof(ptrdiff_t) * (size_t)c.groups);
        if (!tp_mem || !c.offp) {
            dw_scratch_put(copy_mem, copy_cached);
            free(c.scratch_mem); free(c.off); free(c.cblock_mem); free(c.xt); free(tp_mem); free(c.offp);
            return -1;
        }
        c.tp = line_up(tp_mem);
        memset(c.tp, 0, (size_t)c.nbuf * tp_bytes);   /* a partial panel's unused columns: defined bytes */
        for (int g = 0; g < c.groups; g++) c.offp[g] = 64 * (ptrdiff_t)g;
    }
    /* the fused epilogue: the whole K at once, the level's own epilogue (which ikernel_ep
     * reproduces), no U8S8 corrections (these forms have none), per-row multipliers */
    int fused = c.kgroups >= c.groups && kern->ikernel_ep != NULL;
    size_t esize = p->quantized ? 1 : 4;
    c.xstride = (size_t)(p->C * c.plane);
    c.ostride = (size_t)(p->M * P) * esize;
    c.img_pix = (ptrdiff_t)(p->M * P);
    if (pk) {
        /* images in parallel (above): one region for every image, then the merged tail panels
         * (and a last partial panel's images on the dot kernel) with the threads sharing them */
        ig_group(&c, 0, 0, wpacked, fast_bias, fused);
        c.nimg = pk;
        c.nbatch = p->N;
        c.pregion = pregion;
        ql_parallel_for((ptrdiff_t)((p->N + pk - 1) / pk), threads, ig_chunk_task, &c);
        __atomic_add_fetch(&ig_calls[6], 1, __ATOMIC_RELAXED);
        if (tpm) {
            c.nimg = 0;
            c.n0 = p->N;
            c.u_run0 = 0;
            c.u_run1 = p->N / tpm + (p->N % tpm && !nleft);
            c.nleft = nleft;
            c.left_j0 = p->N - nleft;
            int run_threads = (double)c.Mg * (double)K * (double)(16 * (c.u_run1 - c.u_run0) + nleft * c.wlast) <
                              (double)(1 << 21) ? 1 : threads;
            if (c.nleft) ql_parallel_for((ptrdiff_t)c.nleft, run_threads, ig_left_task, &c);
            ig_tile_blocks(&c, run_threads);
            ql_parallel_for((ptrdiff_t)(c.row_blocks * c.tile_blocks), run_threads, ig_gemm_task, &c);
        }
    }
    int64_t u_done = 0;   /* panels run so far */
    int result = 1;
    for (int64_t n0 = 0; n0 < p->N && !pk && result == 1; n0 += nimg) {
        c.nimg = p->N - n0 < nimg ? p->N - n0 : nimg;
        c.n0 = n0;
        if (tpm) {
            /* the panels this chunk completes; the last chunk: also a last partial panel, or
             * the dot kernel for its images */
            int64_t end = n0 + c.nimg;
            c.u_run0 = u_done;
            c.u_run1 = end / tpm;
            if (end == p->N && p->N % tpm) {
                if (nleft) { c.nleft = nleft; c.left_j0 = p->N - nleft; }
                else c.u_run1++;
            }
            u_done = c.u_run1;
        }
        int run_threads = macs * (double)c.nimg < (double)(1 << 21) ? 1 : threads;
        ig_tile_blocks(&c, run_threads);
        if (c.affine && c.tile_blocks > 1) c.tile_blocks = 1;   /* each row block packed once */
        for (int64_t g = 0; g < p->group; g++) {
            ig_group(&c, g, n0, wpacked, fast_bias, fused);
            /* one image: a task per block, as ever; a chunk: about 16 tasks per thread */
            ptrdiff_t ncopy = (ptrdiff_t)(c.nimg * c.nblk);
            c.cpt = c.nimg > 1 ? (ncopy + 16 * run_threads - 1) / (16 * run_threads) : 1;
            ncopy = (ncopy + c.cpt - 1) / c.cpt;
            if (pack_in_copy) {
                /* every group's rows (the first group's job), then the per-row terms: the
                 * GEMM tasks below are the first to read either */
                c.npack = packw_setup(&wjob, kern, raw->w, raw->w_type, (int)p->M, (int)K, c.taps, raw->wzp, wpacked,
                                      run_threads);
                c.wjob = &wjob;
                ptrdiff_t n = c.npack + ncopy;
                ql_parallel_for(n, n > 1 ? run_threads : 1, ig_copy_pack_task, &c);
                c.npack = 0;
                c.wjob = NULL;
                pack_in_copy = 0;
                if (atomic_load(&wjob.outside)) {
                    result = -4;   /* a weight outside the bound: nothing written to y yet */
                    break;
                }
                __atomic_add_fetch(&ig_calls[8], 1, __ATOMIC_RELAXED);
                fast_bias_fill(p, wpacked, ldl, fast_bias);
            } else {
                ql_parallel_for(ncopy, ncopy > 1 ? run_threads : 1, ig_copy_chunk_task, &c);
            }
            /* the narrow last tile's columns, gathered once per image for every task */
            if (tpm) {   /* the chunk's last tiles into their panels (those it touches) */
                ql_parallel_for((ptrdiff_t)((n0 + c.nimg - 1) / tpm - n0 / tpm + 1), run_threads, ig_tail_task, &c);
                if (c.nleft) ql_parallel_for((ptrdiff_t)c.nleft, run_threads, ig_left_task, &c);
            } else if (c.xt) {
                ql_parallel_for((ptrdiff_t)c.nimg, run_threads, ig_gather_task, &c);
            }
            ql_parallel_for((ptrdiff_t)(c.row_blocks * c.tile_blocks), run_threads, ig_gemm_task, &c);
        }
        if (c.nimg > 1 && result == 1) {
            __atomic_add_fetch(&ig_calls[2], 1, __ATOMIC_RELAXED);
            __atomic_add_fetch(&ig_calls[3], c.nimg, __ATOMIC_RELAXED);
        }
    }
    dw_scratch_put(copy_mem, copy_cached);
    free(c.scratch_mem);
    free(c.off);
    free(c.cblock_mem);
    free(c.xt);
    free(tp_mem);
    free(c.offp);
    if (c.shift && result == 1) __atomic_add_fetch(&ig_calls[5], 1, __ATOMIC_RELAXED);
    return result;
}

/* The GEMM convolution on packed weights (wpacked), or with raw: a plain call's weights as
 * given, packed inside the implicit GEMM's tasks where that applies (ig_run), else into wpacked
 * first (ql_conv_w_bytes of kern) */
static int conv_gemm(const ql_conv_plan *p, const ql_isa *isa, const ql_gemm_kernel *kern, void *wpacked,
                     const ql_conv_wraw *raw, size_t workspace)
{
    int64_t Cg = p->C / p->group, Mg = p->M / p->group;
    int64_t taps = prod(p->k, p->nsp);
    int64_t K64 = Cg * taps;
    int64_t P = prod(p->out, p->nsp);
    int64_t plane = prod(p->in, p->nsp);
    if (K64 > INT_MAX / 2 || Mg > INT_MAX) return -2;
    kern = conv_kernel(kern, K64, taps);
    if (kern->kchunk > 1) __atomic_add_fetch(&chunk_calls[0], 1, __ATOMIC_RELAXED);
    int K = (int)ql_conv_wk(kern, K64, taps);   /* the packed rows' length (<= 4/3 K64) */
    int kp = ql_round_k(kern, K);
    ptrdiff_t ldl = w_row_bytes(kern, K);
    size_t esize = p->quantized ? 1 : 4;
    int threads = ql_num_threads();

    im2col_ctx c;
    memset(&c, 0, sizeof c);
    c.p = p;
    c.kern = kern;
    c.form = kern->form;
    c.nr = kern->nr;
    c.kp = kp;
    c.K = K;
    c.taps = taps;
    c.plane = plane;
    /* byte forms: U8S8 wants s8-form bytes (uint8 ^ 0x80), S8U8 u8-form ones (int8 ^ 0x80);
     * the I16 form centers on x's zero point, so its "zero" raw byte is that zero point */
    c.flip = (p->x_type == QL_U8) != (kern->form == QL_FORM_S8U8) ? 0x80 : 0;
    c.tail = kern->form == QL_FORM_I16 ? (uint8_t)p->x_zp : c.flip;
    c.grouped = ql_conv_grouped(kern, K64, taps);
    c.chunk = kchunk_of(kern);
    c.Cg = Cg;
    c.flat = 1;
    for (int a = 0; a < p->nsp; a++)
        if (p->k[a] != 1 || p->stride[a] != 1 || p->pad[a] != 0 || p->out[a] != p->in[a]) c.flat = 0;
    plane_strides(p, c.st);
    im2col_layout(&c);
    if (c.scratch_bytes * (size_t)threads > workspace) return -3;
    c.scratch_mem = (char *)malloc(c.scratch_bytes * (size_t)threads + 64);
    c.scratch = line_up(c.scratch_mem);
    if (!c.scratch) return -1;

    const int32_t *row_a = NULL, *row_z = NULL;
    if (kern->form == QL_FORM_U8S8) {
        row_a = (const int32_t *)((const char *)wpacked + (size_t)p->M * (size_t)ldl);
        row_z = row_a + p->M;
    }
    int32_t col_z = p->x_type == QL_U8 ? p->x_zp - 128 : p->x_zp;   /* zR' */
    /* S8U8 (fast path): the bias and the row sums' term (fast_bias_fill), once the weights are
     * packed: now, or in ig_run / below for a plain call's (raw) */
    int32_t *fast_bias = NULL;
    if (kern->form == QL_FORM_S8U8) {
        fast_bias = (int32_t *)malloc(sizeof(int32_t) * (size_t)p->M);
        if (!fast_bias) { free(c.scratch_mem); return -1; }
        if (!raw) fast_bias_fill(p, wpacked, ldl, fast_bias);
    }
    {
        int ig = ig_run(p, isa, kern, wpacked, raw, fast_bias, workspace);
        if (ig && ig != -4) __atomic_add_fetch(&ig_calls[0], 1, __ATOMIC_RELAXED);
        if (ig) {
            free(c.scratch_mem);
            free(fast_bias);
            return ig == 1 ? 0 : ig == -4 ? -4 : -1;
        }
    }
    if (raw) {
        if (pack_w_threads(kern, raw->w, raw->w_type, (int)p->M, (int)K64, taps, raw->wzp, wpacked, threads) != 0) {
            free(c.scratch_mem);
            free(fast_bias);
            return -4;   /* a weight outside the S8U8 form's bound (the only form with one) */
        }
        if (fast_bias) fast_bias_fill(p, wpacked, ldl, fast_bias);
    }
    __atomic_add_fetch(&ig_calls[1], 1, __ATOMIC_RELAXED);   /* the im2col path runs (counted once it can) */
    int rc = 0;
    for (int64_t n = 0; n < p->N && rc == 0; n++) {
        for (int64_t g = 0; g < p->group && rc == 0; g++) {
            for (int64_t q0 = 0; q0 < P && rc == 0; q0 += PIX_CHUNK) {
                int64_t np = P - q0 < PIX_CHUNK ? P - q0 : PIX_CHUNK;
                ql_gemm_problem gp;
                memset(&gp, 0, sizeof gp);
                gp.kern = kern;
                gp.M = (int)Mg;
                gp.N = (int)np;
                gp.K = K;
                gp.kp = kp;
                gp.L = (const char *)wpacked + (size_t)(g * Mg) * (size_t)ldl;
                gp.ldl_bytes = ldl;
                c.xg = (const uint8_t *)p->x + (size_t)((n * p->C + g * Cg) * plane);
                c.pix0 = q0;
                gp.pack_R = im2col_pack;
                gp.pack_ctx = &c;
                plan_epilogue(p, &gp.ep);
                if (p->bias) gp.ep.row_bias = p->bias + g * Mg;
                if (fast_bias) gp.ep.row_bias = fast_bias + g * Mg;
                gp.ep.mult = p->mult + g * Mg * p->mult_s;
                gp.ep.out = (char *)p->y + (size_t)((n * p->M + g * Mg) * P + q0) * esize;
                gp.ep.out_rs = (ptrdiff_t)P;
                if (kern->form == QL_FORM_U8S8) {
                    gp.ep.row_a = row_a + g * Mg;
                    gp.ep.row_z = row_z + g * Mg;
                    gp.ep.row_s = 1;
                    gp.ep.col_z = &col_z;
                    gp.ep.col_z_s = 0;
                }
                gp.epilogue = isa->epilogue;
                gp.allow_fused = 1;   /* the level's own epilogue: kernel_ep may apply it */
                gp.threads = threads;
                if (ql_gemm(&gp) != 0) rc = -1;
            }
        }
    }
    free(c.scratch_mem);
    free(fast_bias);
    return rc;
}

int ql_conv_gemm(const ql_conv_plan *p, const ql_isa *isa, const ql_gemm_kernel *kern,
                 const void *wpacked, size_t workspace)
{
    return conv_gemm(p, isa, kern, (void *)wpacked, NULL, workspace);   /* only read without raw */
}

int ql_conv_gemm_raw(const ql_conv_plan *p, const ql_isa *isa, const ql_gemm_kernel *kern,
                     const ql_conv_wraw *raw, void *wbuf, size_t workspace)
{
    if (kern->form == QL_FORM_U8S8) {   /* packed whole first (the corrections' row sums) */
        int64_t taps = prod(p->k, p->nsp), K64 = p->C / p->group * taps;
        if (K64 > INT_MAX / 2) return -2;
        if (pack_w_threads(kern, raw->w, raw->w_type, (int)p->M, (int)K64, taps, raw->wzp, wbuf,
                           ql_num_threads()) != 0)
            return -1;
        return conv_gemm(p, isa, kern, wbuf, NULL, workspace);
    }
    return conv_gemm(p, isa, kern, wbuf, raw, workspace);
}

int ql_conv_plain_fast(const ql_conv_plan *p, const ql_isa *isa, const ql_conv_wraw *raw, void *wbuf,
                       size_t workspace)
{
    int64_t taps = prod(p->k, p->nsp), K64 = p->C / p->group * taps;
    if (K64 > INT_MAX / 2) return -2;
    if (!fast_applies(isa, p->M, K64, taps)) return 0;
    int rc = conv_gemm(p, isa, isa->conv_fast, wbuf, raw, workspace);
    return rc == 0 ? 1 : rc == -4 ? 0 : rc;
}

/* ---------------------------------------------------------------------------------------
 * Depthwise: direct tap sums along output rows
 * ------------------------------------------------------------------------------------- */

/* The depthwise paths' scratch and the implicit GEMM's padded copy: kept between calls
 * (ql_conv_scratch, threads.c), with 64 bytes of slack past the last buffer. */
static char *dw_scratch_get(size_t n, int *cached)
{
    return ql_scratch_get(&ql_conv_scratch, n + 64, cached);
}

static void dw_scratch_put(char *s, int cached)
{
    ql_scratch_put(&ql_conv_scratch, s, cached);
}

/* Depthwise convolutions of at least this many MACs use every thread (as ql_gemm does).
 * Overridable at build time for measurements (-DDW_MIN_PAR=...). */
#ifndef DW_MIN_PAR
#define DW_MIN_PAR ((int64_t)1 << 21)
#endif

/* Rows collected before one pass of the row kernel (accumulators stay in registers). */
#define DW_MAX_ROWS 32
/* Output columns per segment (rounded to 16, the row kernels' block). */
#define DW_SEG 256
/* Stride-1 rows share one centered input row per outer tap when the last axis's dilated
 * kernel extent is at most this; otherwise every tap gathers its own row. */
#define DW_MAX_SPAN 1024
/* Plane mode: padded planes of at most this many elements (int16: 128 KiB per thread), flat
 * outputs per kernel pass. */
#define DW_PLANE_MAX 65536
#define DW_CHUNK 2048
/* ... with strides at most this (outer strides: their product, the rows computed per output row) */
#define DW_PLANE_MAX_STRIDE 4

void ql_dw_rows_scalar(const int16_t *const *rows, const int16_t *w, int npairs, int32_t *acc,
                       int nblocks, int accumulate)
{
    int n = nblocks * 16;
    for (int i = 0; i < n; i++) {
        uint32_t s = accumulate ? (uint32_t)acc[i] : 0u;
        for (int q = 0; q < npairs; q++) {
            /* |w|, |r| <= 255: the pair sum is below 2^17 in magnitude, exact in int32 */
            int32_t v = (int32_t)w[2 * q] * rows[2 * q][i] + (int32_t)w[2 * q + 1] * rows[2 * q + 1][i];
            s += (uint32_t)v;
        }
        acc[i] = (int32_t)s;
    }
}

typedef struct dw_ctx {
    const ql_conv_plan *p;
    const ql_isa *isa;
    ql_dw_rows_fn rows_fn;
    const int16_t *wc;          /* (M, taps) centered int16 weights */
    int64_t mult, taps, ktaps_outer, kw, orows, ow, plane, P, row_blocks, rows_per_task;
    int shared;                 /* stride-1 shared-row mode */
    int64_t seg, segr, span, buflen;
    ptrdiff_t st[QL_CONV_MAXD];
    char *scratch;
    size_t scratch_bytes;
    size_t off_bufs, off_acc, off_w, off_ptr, off_tap;
    /* plane mode: the channel's centered, zero-padded plane, flat outputs q = sum o[a]*ps[a] */
    int plane_mode;
    int64_t ep_[QL_CONV_MAXD], ps[QL_CONV_MAXD], plane_len, qmax, chunk;
    int64_t phases, phase_len;  /* last-axis stride s: s phase planes of phase_len elements */
    size_t off_plane, off_toff, off_comp;
} dw_ctx;

static void dw_flush(const dw_ctx *d, char *s, int nrows, int64_t c, int first, int nblocks)
{
    const ql_conv_plan *p = d->p;
    const int16_t **rows = (const int16_t **)(s + d->off_ptr);
    const int64_t *tap = (const int64_t *)(s + d->off_tap);
    int16_t *w = (int16_t *)(s + d->off_w);
    int32_t *acc = (int32_t *)(s + d->off_acc);
    int npairs = (nrows + 1) / 2;
    if (nrows & 1) rows[nrows] = rows[0];   /* pairs with a zero weight */
    (void)p;
    for (int64_t j = 0; j < d->mult; j++) {
        const int16_t *wo = d->wc + (size_t)((c * d->mult + j) * d->taps);
        for (int r = 0; r < nrows; r++) w[r] = wo[tap[r]];
        if (nrows & 1) w[nrows] = 0;
        d->rows_fn(rows, w, npairs, acc + (size_t)j * (size_t)d->segr, nblocks, !first);
    }
}

static void dw_task(void *vctx, ptrdiff_t task, int thread)
{
    dw_ctx *d = (dw_ctx *)vctx;
    const ql_conv_plan *p = d->p;
    int nsp = p->nsp, L = nsp - 1;
    char *s = d->scratch + (size_t)thread * d->scratch_bytes;
    int64_t rb = task % d->row_blocks;
    int64_t nc = task / d->row_blocks;           /* n * C + c */
    int64_t c = nc % p->C, n = nc / p->C;
    const uint8_t *xc = (const uint8_t *)p->x + (size_t)(nc * d->plane);
    int16_t *bufs = (int16_t *)(s + d->off_bufs);
    const int16_t **rows = (const int16_t **)(s + d->off_ptr);
    int64_t *tap = (int64_t *)(s + d->off_tap);
    int32_t *acc = (int32_t *)(s + d->off_acc);
    size_t esize = p->quantized ? 1 : 4;
    ql_epilogue ep;
    plan_epilogue(p, &ep);
    ep.out_rs = (ptrdiff_t)d->P;
    int64_t r0 = rb * d->rows_per_task;
    int64_t r1 = r0 + d->rows_per_task < d->orows ? r0 + d->rows_per_task : d->orows;
    int64_t in_last = p->in[L], s_last = p->stride[L], d_last = p->dil[L], pad_last = p->pad[L];
    for (int64_t r = r0; r < r1; r++) {
        /* outer output coordinates of row r */
        int64_t o[QL_CONV_MAXD];
        int64_t rr = r;
        for (int a = L - 1; a >= 0; a--) {
            o[a] = rr % p->out[a];
            rr /= p->out[a];
        }
        for (int64_t ow0 = 0; ow0 < d->ow; ow0 += d->seg) {
            int64_t len = d->ow - ow0 < d->seg ? d->ow - ow0 : d->seg;
            int nblocks = (int)((len + 15) / 16);
            int nrows = 0, nbufs = 0, first = 1;
            int64_t tc[QL_CONV_MAXD];
            for (int a = 0; a < L; a++) tc[a] = 0;
            for (int64_t ot = 0; ot < d->ktaps_outer; ot++) {
                /* input row of this outer tap; a padded row contributes nothing */
                ptrdiff_t roff = 0;
                int valid = 1;
                for (int a = 0; a < L; a++) {
                    int64_t pos = o[a] * p->stride[a] + tc[a] * p->dil[a] - p->pad[a];
                    if (pos < 0 || pos >= p->in[a]) { valid = 0; break; }
                    roff += (ptrdiff_t)pos * d->st[a];
                }
                if (valid) {
                    const uint8_t *xrow = xc + roff;
                    int64_t add = d->shared ? d->kw : 1;
                    if (d->shared) {
                        if (nrows + add > DW_MAX_ROWS) {
                            dw_flush(d, s, nrows, c, first, nblocks);
                            first = 0;
                            nrows = nbufs = 0;
                        }
                        int16_t *b = bufs + (size_t)nbufs++ * (size_t)d->buflen;
                        build_row_i16(xrow, p->x_type, p->x_zp, in_last, ow0 - pad_last, 1, b,
                                      d->buflen);
                        for (int64_t t = 0; t < d->kw; t++) {
                            rows[nrows] = b + t * d_last;
                            tap[nrows++] = ot * d->kw + t;
                        }
                    } else {
                        for (int64_t t = 0; t < d->kw; t++) {
                            if (nrows + 1 > DW_MAX_ROWS) {
                                dw_flush(d, s, nrows, c, first, nblocks);
                                first = 0;
                                nrows = nbufs = 0;
                            }
                            int16_t *b = bufs + (size_t)nbufs++ * (size_t)d->buflen;
                            build_row_i16(xrow, p->x_type, p->x_zp, in_last,
                                          ow0 * s_last + t * d_last - pad_last, s_last, b, d->segr);
                            rows[nrows] = b;
                            tap[nrows++] = ot * d->kw + t;
                        }
                    }
                }
                for (int a = L - 1; a >= 0; a--) {
                    if (++tc[a] < p->k[a]) break;
                    tc[a] = 0;
                }
            }
            if (nrows > 0) {
                dw_flush(d, s, nrows, c, first, nblocks);
                first = 0;
            }
            if (first) memset(acc, 0, sizeof(int32_t) * (size_t)d->segr * (size_t)d->mult);
            ep.out = (char *)p->y + (size_t)((n * p->M) * d->P + r * d->ow + ow0) * esize;
            d->isa->epilogue(&ep, acc, (ptrdiff_t)d->segr, NULL, (int)(c * d->mult), 0,
                             (int)d->mult, (int)len);
        }
    }
}


/* Plane mode (stride 1 on every axis, small padded plane): the channel is widened once into a
 * centered int16 plane zero-padded to extents ep_ (row-major strides ps); output o and tap t
 * then read plane[q(o) + toff(t)] with q(o) = sum o[a]*ps[a]: every tap is one shifted
 * contiguous row over a chunk of flat outputs, whatever the rank. Flat positions whose last
 * coordinate lies beyond the output (the padded columns) are computed and dropped. */
static void dw_plane_task(void *vctx, ptrdiff_t task, int thread)
{
    dw_ctx *d = (dw_ctx *)vctx;
    const ql_conv_plan *p = d->p;
    int nsp = p->nsp, L = nsp - 1;
    char *s = d->scratch + (size_t)thread * d->scratch_bytes;
    int64_t nc = task;                          /* n * C + c */
    int64_t c = nc % p->C, n = nc / p->C;
    const uint8_t *xc = (const uint8_t *)p->x + (size_t)(nc * d->plane);
    int16_t *pl = (int16_t *)(s + d->off_plane);
    const int64_t *toff = (const int64_t *)(s + d->off_toff);
    const int16_t **rows = (const int16_t **)(s + d->off_ptr);
    int64_t *tap = (int64_t *)(s + d->off_tap);
    int32_t *acc = (int32_t *)(s + d->off_acc);
    size_t esize = p->quantized ? 1 : 4;
    /* the plane: zero, then every input row widened into place (outer coordinates walked
     * as an odometer: no division per row) */
    memset(pl, 0, sizeof(int16_t) * (size_t)d->plane_len);
    int64_t in_rows = prod(p->in, L);
    int64_t ic[QL_CONV_MAXD], dst = p->pad[L];
    for (int a = 0; a < L; a++) {
        ic[a] = 0;
        dst += p->pad[a] * d->ps[a];
    }
    int64_t sl = d->phases;
    for (int64_t r = 0; r < in_rows; r++) {
        const uint8_t *src = xc + r * p->in[L];
        if (sl == 1) {
            widen_i16(src, p->x_type, p->x_zp, pl + dst, (int)p->in[L]);
        } else {
            /* padded column pc goes to phase pc % s, position pc / s (dst counts the pad) */
            int64_t pc = p->pad[L], base = dst - p->pad[L];
            int64_t ph = pc % sl, pos = pc / sl, i = 0;
            if (sl == 2) {
                /* stride 2: de-interleave even and odd padded columns (a loop the compiler
                 * vectorizes), after at most one leading odd column */
                if (ph == 1 && p->in[L] > 0) {
                    pl[d->phase_len + base + pos] = (int16_t)(load8(src, p->x_type) - p->x_zp);
                    i = 1; ph = 0; ++pos;
                }
                int64_t npair = (p->in[L] - i) / 2;
                int16_t *d0 = pl + base + pos, *d1 = pl + d->phase_len + base + pos;
                const uint8_t *s0 = src + i;
                int32_t zx = p->x_zp;
                if (p->x_type == QL_U8) {
                    for (int64_t j = 0; j < npair; j++) {
                        d0[j] = (int16_t)((int32_t)s0[2 * j] - zx);
                        d1[j] = (int16_t)((int32_t)s0[2 * j + 1] - zx);
                    }
                } else {
                    const int8_t *si = (const int8_t *)s0;
                    for (int64_t j = 0; j < npair; j++) {
                        d0[j] = (int16_t)((int32_t)si[2 * j] - zx);
                        d1[j] = (int16_t)((int32_t)si[2 * j + 1] - zx);
                    }
                }
                i += 2 * npair;
                pos += npair;
            }
            for (; i < p->in[L]; i++) {
                pl[ph * d->phase_len + base + pos] = (int16_t)(load8(src + i, p->x_type) - p->x_zp);
                if (++ph == sl) { ph = 0; ++pos; }
            }
        }
        for (int a = L - 1; a >= 0; a--) {
            dst += d->ps[a];
            if (++ic[a] < p->in[a]) break;
            dst -= ic[a] * d->ps[a];
            ic[a] = 0;
        }
    }
    ql_epilogue ep;
    plan_epilogue(p, &ep);
    ep.out_rs = (ptrdiff_t)d->P;
    char *yimg = (char *)p->y + (size_t)(n * p->M * d->P) * esize;
    int32_t *comp = (int32_t *)(s + d->off_comp);
    /* output rows (outer coordinates oc, flat start q_row in the plane, index orow) */
    int64_t oc[QL_CONV_MAXD], q_row = 0, orow = 0, ow = p->out[L];
    for (int a = 0; a < L; a++) oc[a] = 0;
    for (int64_t q0 = 0; q0 < d->qmax; q0 += d->chunk) {
        int64_t len = d->qmax - q0 < d->chunk ? d->qmax - q0 : d->chunk;
        int64_t q1 = q0 + len;
        int nblocks = (int)((len + 15) / 16);
        for (int64_t t0 = 0; t0 < d->taps; t0 += DW_MAX_ROWS) {
            int nrows = d->taps - t0 < DW_MAX_ROWS ? (int)(d->taps - t0) : DW_MAX_ROWS;
            for (int r = 0; r < nrows; r++) {
                rows[r] = pl + q0 + toff[t0 + r];
                tap[r] = t0 + r;
            }
            dw_flush(d, s, nrows, c, t0 == 0, nblocks);
        }
        /* the chunk's outputs are one run of consecutive outputs: compact them (dropping the
         * padded columns) and requantize/store them with one epilogue call */
        int64_t cnt = 0, first = -1;
        while (orow < d->orows && q_row < q1) {
            int64_t a0 = q_row > q0 ? q_row : q0;
            int64_t a1 = q_row + ow < q1 ? q_row + ow : q1;
            if (a1 > a0) {
                if (first < 0) first = orow * ow + (a0 - q_row);
                for (int64_t j = 0; j < d->mult; j++)
                    memcpy(comp + j * d->segr + cnt, acc + j * d->segr + (a0 - q0), sizeof(int32_t) * (size_t)(a1 - a0));
                cnt += a1 - a0;
            }
            if (q_row + ow > q1) break;       /* the row continues in the next chunk */
            orow++;
            for (int a = L - 1; a >= 0; a--) {
                q_row += p->stride[a] * d->ps[a];
                if (++oc[a] < p->out[a]) break;
                q_row -= oc[a] * p->stride[a] * d->ps[a];
                oc[a] = 0;
            }
        }
        if (cnt > 0) {
            ep.out = yimg + (size_t)first * esize;
            d->isa->epilogue(&ep, comp, (ptrdiff_t)d->segr, NULL, (int)(c * d->mult), 0, (int)d->mult, (int)cnt);
        }
    }
}

/* ---------------------------------------------------------------------------------------
 * Depthwise, channels-last (2-D, one output channel per input channel, small planes): the
 * NCHW planes of 16 channels are transposed once into a zero-padded plane of positions of 16
 * centered int16 (X), so that the kernel works on 16 channels per vector whatever the plane's
 * width, and per output row the accumulators [ow][16] are transposed back for the epilogue.
 * Per-channel work (widening a 7x7 plane, one epilogue call) was what bounded the NCHW path on
 * small planes.
 * ------------------------------------------------------------------------------------- */

/* X holds at most this many padded positions (32 bytes each, 128 KiB): the whole plane, or
 * bands of output rows for taller planes; taps <= 2*32 */
#define DWCL_MAX_POS 4096
#define DWCL_MAX_TAPS 64
/* output pixels per epilogue call */
#define DWCL_CHUNK 256

void ql_dw_cl_scalar(const int16_t *X, const ptrdiff_t *toff, const int16_t *wt, int npairs, ptrdiff_t step,
                     ptrdiff_t row_step, int rows, int ow, const ql_dw_q *q, void *out)
{
    for (int ro = 0; ro < rows * ow; ro++) {
        int r = ro / ow, o = ro % ow;
        const int16_t *xo = X + ((ptrdiff_t)r * row_step + (ptrdiff_t)o * step) * 16;
        for (int c = 0; c < 16; c++) {
            uint32_t sum = 0;
            for (int t = 0; t < 2 * npairs; t++)   /* |w|, |x| <= 255: each product exact */
                sum += (uint32_t)((int32_t)wt[16 * t + c] * xo[toff[t] * 16 + c]);
            if (!q) {
                ((int32_t *)out)[16 * ro + c] = (int32_t)sum;
                continue;
            }
            /* epilogue.c's arithmetic: wrap32 bias, one float32 multiply, clamp, nearest even */
            sum += (uint32_t)q->bias[c];
            float v = (float)(int32_t)sum * q->mult[c];
            if (!(v >= q->lo)) v = q->lo;
            if (v > q->hi) v = q->hi;
            ((uint8_t *)out)[16 * ro + c] = (uint8_t)(ql_rne(v) + q->zp);   /* in T's range */
        }
    }
}

typedef struct dwcl_ctx {
    const ql_conv_plan *p;
    const ql_isa *isa;
    const int16_t *wc;          /* (M, taps) centered int16 weights */
    const int16_t *wcl;         /* their channels-last form [blocks][2*npairs][16], or NULL */
    int64_t H, W, hp, wp, taps, blocks, P;
    int64_t band, xrows;        /* output rows per band, padded input rows they read */
    int64_t group_rows, band_groups;   /* output rows per task (whole bands), groups per plane */
    int npairs;
    ptrdiff_t toff[DWCL_MAX_TAPS];   /* tap offsets in X positions (the padding tap: 0) */
    /* the fill's 16 x 16 transpose: the AVX2 one on levels whose kernel is AVX2 */
    void (*t16)(const uint8_t *src, ptrdiff_t cs, uint8_t flip, int32_t zsub, int16_t *dst, const ptrdiff_t *doff);
    /* X's form: (x ^ flip) - zsub, padding pv (dwcl_fill) */
    uint8_t flip;
    int32_t zsub, zxu;
    int16_t pv;
    /* the store's 32-position transpose on AVX2 levels (NULL: the SSE2 one of dwcl_store_q) */
    void (*store32)(const uint8_t *Q, int nch, int cols, uint8_t *y, ptrdiff_t P);
    char *scratch;
    size_t scratch_bytes, off_x, off_w, off_acc, off_comp, off_band;
} dwcl_ctx;

#if QL_X86
/* out[k] byte c = r[c] byte k: a 16 x 16 byte transpose by SSE2 unpacks */
static inline void transpose16_u8(const __m128i r[16], __m128i out[16])
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
 * (int16 elements), or dst + 16*k when doff is NULL. */
static void transpose16_i16(const uint8_t *src, ptrdiff_t cs, uint8_t flip, int32_t zsub, int16_t *dst,
                            const ptrdiff_t *doff)
{
    const __m128i f = _mm_set1_epi8((char)flip), z = _mm_set1_epi16((int16_t)zsub), zero = _mm_setzero_si128();
    __m128i r[16], t[16];
    for (int c = 0; c < 16; c++) r[c] = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(src + c * cs)), f);
    transpose16_u8(r, t);
    for (int k = 0; k < 16; k++) {
        int16_t *o = dst + (doff ? doff[k] : 16 * k);
        _mm_storeu_si128((__m128i *)o, _mm_sub_epi16(_mm_unpacklo_epi8(t[k], zero), z));
        _mm_storeu_si128((__m128i *)(o + 8), _mm_sub_epi16(_mm_unpackhi_epi8(t[k], zero), z));
    }
}
#endif

/* Requantized bytes Q [cols][16] (positions of 16 channels) to the output planes: channel c's
 * positions go to y + c*P (c < nch), 16 positions per byte transpose. */
static void dwcl_store_q(const dwcl_ctx *d, const uint8_t *Q, int nch, int cols, uint8_t *y, ptrdiff_t P)
{
    int j = 0;
#if QL_X86
    if (d->store32 && cols >= 32) {
        d->store32(Q, nch, cols, y, P);
        return;
    }
    __m128i r[16], t[16];
    for (; j < cols && cols >= 16; j += 16) {
        if (j + 16 > cols) j = cols - 16;   /* the last 16 (overlapping: the same bytes again) */
        for (int k = 0; k < 16; k++) r[k] = _mm_loadu_si128((const __m128i *)(Q + 16 * (size_t)(j + k)));
        transpose16_u8(r, t);
        for (int c = 0; c < nch; c++) _mm_storeu_si128((__m128i *)(y + c * P + j), t[c]);
    }
    if (cols >= 16) return;
#endif
    for (int c = 0; c < nch; c++)
        for (int jj = j; jj < cols; jj++) y[c * P + jj] = Q[16 * (size_t)jj + c];
}

/* count positions of 16 int16 lanes, all v */
static void dwcl_set(int16_t *dst, int16_t v, size_t count)
{
    if (v == 0) {
        memset(dst, 0, sizeof(int16_t) * 16 * count);
        return;
    }
    for (size_t i = 0; i < 16 * count; i++) dst[i] = v;
}

/* X (xr rows of wp positions): padded rows pr0 .. pr0 + xr - 1 of channels c0..c0+nch-1 of
 * image n, (x ^ flip) - zsub with d->pv at the padding (only the padding is written besides
 * the input positions): centered values (x - zx, padding 0), or, for the requantized output,
 * the raw uint8 form (x ^ flip, padding zx ^ flip: dwcl_task folds zx into the bias). Rows of
 * at least 16 positions are transposed straight into place, 16 positions at a time (the last
 * block of a row overlaps the one before: the same values written twice); narrower rows are
 * one flat run of each channel plane, whose blocks of 16 positions are transposed and
 * scattered to their rows; channel blocks of fewer than 16 go element by element. */
static void dwcl_fill(const dwcl_ctx *d, int64_t n, int64_t c0, int nch, int64_t pr0, int64_t xr, int16_t *X,
                      int64_t *band)
{
    const ql_conv_plan *p = d->p;
    const size_t rowe = 16 * (size_t)d->wp;   /* int16 elements per X row */
    int64_t plane = d->H * d->W, W = d->W;
    int64_t ih_a = pr0 - p->pad[0], ih_b = pr0 + xr - p->pad[0];
    const int16_t pv = d->pv;
    const uint8_t flip = d->flip;
    const int32_t zsub = d->zsub;
    if (ih_a < 0) ih_a = 0;
    if (ih_b > d->H) ih_b = d->H;
    if (ih_b <= ih_a) {
        dwcl_set(X, pv, (size_t)d->wp * (size_t)xr);
        band[0] = -1;
        return;
    }
    /* X rows xa..xb-1 hold input rows ih_a..ih_b-1; their columns pad[1]..pad[1]+W-1 */
    int64_t xa = ih_a + p->pad[0] - pr0, xb_ = ih_b + p->pad[0] - pr0, lp = p->pad[1], rp = d->wp - lp - W;
    /* the padding, unless this thread's X holds it already: nothing else writes there, so it
     * stays from the last fill of the same band in this call (band: that fill's pr0, xr; the
     * scatter offsets below are kept with it) */
    int fresh = band[0] != pr0 || band[1] != xr;
    if (fresh) {
        dwcl_set(X, pv, (size_t)d->wp * (size_t)xa);
        dwcl_set(X + rowe * (size_t)xb_, pv, (size_t)d->wp * (size_t)(xr - xb_));
        for (int64_t r = xa; r < xb_; r++) {
            dwcl_set(X + rowe * (size_t)r, pv, (size_t)lp);
            dwcl_set(X + rowe * (size_t)r + 16 * (size_t)(lp + W), pv, (size_t)rp);
        }
        band[0] = pr0;
        band[1] = xr;
    }
    int64_t len = (ih_b - ih_a) * W;
    const uint8_t *xb = (const uint8_t *)p->x + (size_t)((n * p->C + c0) * plane + ih_a * W);
#if QL_X86
    if (nch == 16 && W >= 16) {
        for (int64_t r = xa; r < xb_; r++) {
            const uint8_t *src = xb + (r - xa) * W;
            int16_t *dst = X + rowe * (size_t)r + 16 * (size_t)lp;
            for (int64_t w0 = 0;; w0 += 16) {
                if (w0 + 16 > W) w0 = W - 16;
                d->t16(src + w0, (ptrdiff_t)plane, flip, zsub, dst + 16 * w0, NULL);
                if (w0 + 16 >= W) break;
            }
        }
        return;
    }
    if (nch == 16 && len >= 16) {
        /* flat position q lands in X row xa + q / W, column lp + q % W: doff[q] (int16
         * elements), the same for every block of the band */
        ptrdiff_t *doff = (ptrdiff_t *)(band + 2);
        if (fresh) {
            int64_t r = xa, c = 0;
            for (int64_t q = 0; q < len; q++) {
                doff[q] = (ptrdiff_t)(rowe * (size_t)r + 16 * (size_t)(lp + c));
                if (++c == W) { c = 0; r++; }
            }
        }
        for (int64_t q = 0;; q += 16) {
            if (q + 16 > len) q = len - 16;   /* the last 16 (overlapping the block before) */
            d->t16(xb + q, (ptrdiff_t)plane, flip, zsub, X, doff + q);
            if (q + 16 >= len) break;
        }
        return;
    }
#endif
    for (int64_t r = xa; r < xb_; r++) {
        int16_t *dst = X + rowe * (size_t)r + 16 * (size_t)lp;
        if (nch < 16) dwcl_set(dst, pv, (size_t)W);   /* lanes beyond the block (weight 0) */
        for (int c = 0; c < nch; c++) {
            const uint8_t *src = xb + c * plane + (r - xa) * W;
            for (int64_t j = 0; j < W; j++) dst[16 * j + c] = (int16_t)((int32_t)(src[j] ^ flip) - zsub);
        }
    }
}

/* comp[c][j] = acc[j][c] for c < nch, j < cols (4x4 int32 blocks by SSE2 unpacks) */
static void dwcl_untranspose(const int32_t *acc, int nch, int cols, int32_t *comp)
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
#endif
    for (int c = 0; c < nch; c++)
        for (int jj = j; jj < cols; jj++) comp[(size_t)c * cols + jj] = acc[16 * (size_t)jj + c];
}

/* Depthwise calls per path (channels-last, plane, rows): a diagnostic for the tests, as
 * ql_conv_path_counts for the GEMM paths */
static long long dw_calls[3];

void ql_conv_dw_path_counts(long long *cl, long long *plane, long long *rows)
{
    *cl = __atomic_load_n(&dw_calls[0], __ATOMIC_RELAXED);
    *plane = __atomic_load_n(&dw_calls[1], __ATOMIC_RELAXED);
    *rows = __atomic_load_n(&dw_calls[2], __ATOMIC_RELAXED);
}

static void dwcl_task(void *vctx, ptrdiff_t task, int thread)
{
    const dwcl_ctx *d = (const dwcl_ctx *)vctx;
    const ql_conv_plan *p = d->p;
    char *s = d->scratch + (size_t)thread * d->scratch_bytes;
    /* task: (image, block of 16 channels, group of bands) */
    int64_t bg = task % d->band_groups, blk = task / d->band_groups % d->blocks;
    int64_t n = task / d->band_groups / d->blocks, c0 = blk * 16;
    int nch = (int)(p->C - c0 < 16 ? p->C - c0 : 16);
    int16_t *X = (int16_t *)(s + d->off_x);
    int32_t *acc = (int32_t *)(s + d->off_acc), *comp = (int32_t *)(s + d->off_comp);
    /* the block's weights [2*npairs][16] (channel tails and the padding tap are 0): in the
     * channels-last form when the caller passed it, else gathered from (M, taps) */
    const int16_t *wt;
    if (d->wcl) {
        wt = d->wcl + (size_t)blk * 32 * (size_t)d->npairs;
    } else {
        int16_t *wg = (int16_t *)(s + d->off_w);
        memset(wg, 0, sizeof(int16_t) * 32 * (size_t)d->npairs);
        for (int c = 0; c < nch; c++)
            for (int64_t t = 0; t < d->taps; t++) wg[16 * t + c] = d->wc[(c0 + c) * d->taps + t];
        wt = wg;
    }
    ql_epilogue ep;
    size_t esize = p->quantized ? 1 : 4;
    if (!p->quantized) {
        plan_epilogue(p, &ep);
        ep.out_rs = (ptrdiff_t)d->P;
        ep.out = (char *)p->y + (size_t)(n * p->M * d->P) * esize;
    }
    /* 8-bit output: the requantization runs in the kernel (channels beyond nch: bias 0,
     * multiplier 0), which writes bytes [pixel][16] for dwcl_store_q */
    ql_dw_q q, *qp = NULL;
    if (p->quantized) {
        /* X holds x in uint8 form (raw, dwcl_fill): sum w*(x - zx) = sum w*x - zx*sum w, and
         * zx*sum w joins the bias (wrap32: the same sum modulo 2^32). Taps outer: the
         * compiler vectorizes the 16 channels. */
        uint32_t sw[16] = {0};
#if QL_X86
        /* 16 channels in four int32 vectors (int16 sign-extended: unpack with itself, >> 16) */
        __m128i s4[4] = {_mm_setzero_si128(), _mm_setzero_si128(), _mm_setzero_si128(), _mm_setzero_si128()};
        for (int t = 0; t < 2 * d->npairs; t++) {
            __m128i a = _mm_loadu_si128((const __m128i *)(wt + 16 * t));
            __m128i b = _mm_loadu_si128((const __m128i *)(wt + 16 * t + 8));
            s4[0] = _mm_add_epi32(s4[0], _mm_srai_epi32(_mm_unpacklo_epi16(a, a), 16));
            s4[1] = _mm_add_epi32(s4[1], _mm_srai_epi32(_mm_unpackhi_epi16(a, a), 16));
            s4[2] = _mm_add_epi32(s4[2], _mm_srai_epi32(_mm_unpacklo_epi16(b, b), 16));
            s4[3] = _mm_add_epi32(s4[3], _mm_srai_epi32(_mm_unpackhi_epi16(b, b), 16));
        }
        for (int i = 0; i < 4; i++) _mm_storeu_si128((__m128i *)(sw + 4 * i), s4[i]);
#else
        for (int t = 0; t < 2 * d->npairs; t++)
            for (int c = 0; c < 16; c++) sw[c] += (uint32_t)(int32_t)wt[16 * t + c];
#endif
        for (int c = 0; c < 16; c++) {
            uint32_t b = c < nch && p->bias ? (uint32_t)p->bias[c0 + c] : 0u;
            q.bias[c] = (int32_t)(b - (uint32_t)d->zxu * sw[c]);
            q.mult[c] = c < nch ? p->mult[(c0 + c) * p->mult_s] : 0.0f;
        }
        q.lo = p->lo;
        q.hi = p->hi;
        q.zp = p->y_zp;
        q.is_signed = p->y_signed;
        qp = &q;
    }
    uint8_t *ych = (uint8_t *)p->y + (size_t)((n * p->M + c0) * d->P);
    int64_t OH = p->out[0], OW = p->out[1];
    /* chunks of whole output rows, at most DWCL_CHUNK pixels (at least one row) */
    int64_t rows_per = DWCL_CHUNK / OW;
    if (rows_per < 1) rows_per = 1;
    int64_t g0 = bg * d->group_rows, g1 = g0 + d->group_rows < OH ? g0 + d->group_rows : OH;
    for (int64_t b0 = g0; b0 < g1; b0 += d->band) {
        /* a band of output rows and the padded input rows it reads (halo rows read twice) */
        int64_t b1 = g1 - b0 < d->band ? g1 : b0 + d->band, pr0 = b0 * p->stride[0];
        int64_t xr = (b1 - 1 - b0) * p->stride[0] + (p->k[0] - 1) * p->dil[0] + 1;
        dwcl_fill(d, n, c0, nch, pr0, xr, X, (int64_t *)(s + d->off_band));
        for (int64_t oh0 = b0; oh0 < b1; oh0 += rows_per) {
            int64_t nrow = b1 - oh0 < rows_per ? b1 - oh0 : rows_per;
            const int16_t *xrow = X + 16 * (size_t)(oh0 * p->stride[0] - pr0) * (size_t)d->wp;
            d->isa->dw_cl(xrow, d->toff, wt, d->npairs, (ptrdiff_t)p->stride[1], (ptrdiff_t)(p->stride[0] * d->wp),
                          (int)nrow, (int)OW, qp, acc);   /* int32 or bytes */
            int cols = (int)(nrow * OW);
            if (qp) {
                dwcl_store_q(d, (const uint8_t *)acc, nch, cols, ych + oh0 * OW, (ptrdiff_t)d->P);
                continue;
            }
            dwcl_untranspose(acc, nch, cols, comp);
            d->isa->epilogue(&ep, comp, cols, NULL, (int)c0, (int)(oh0 * OW), nch, cols);
        }
    }
}

/* The channels-last path when it applies (returns 1 after running it, 0 to take the others,
 * negative on error). */
static int dwcl_run(const ql_conv_plan *p, const ql_isa *isa, const int16_t *wc, size_t w_elems, size_t workspace)
{
    if (p->nsp != 2 || p->M != p->C || p->C < 8 || !isa->dw_cl) return 0;
    dwcl_ctx d;
    memset(&d, 0, sizeof d);
    d.p = p;
    d.isa = isa;
    d.wc = wc;
    d.H = p->in[0];
    d.W = p->in[1];
#if QL_X86
    d.t16 = isa->dw_cl == ql_dw_cl_avx2 ? ql_dw_t16_avx2 : transpose16_i16;
#endif
    /* int8 x: x - zx = (x ^ 0x80) - (zx + 128), so both types widen as uint8 (zxu: zx in that
     * form). X holds x - zx (padding 0) for int32 output; for the requantized output the raw
     * uint8 form x ^ flip (padding zxu: a padded tap adds w*zxu, which the bias takes back
     * with every other tap's, dwcl_task): the fill skips the subtraction. Either way
     * |X| <= 255 and |w| <= 255: the kernels' int16 pair sums stay exact. */
    d.flip = p->x_type == QL_I8 ? 0x80 : 0;
    d.zxu = p->x_type == QL_I8 ? p->x_zp + 128 : p->x_zp;
    d.zsub = p->quantized ? 0 : d.zxu;
    d.pv = (int16_t)(p->quantized ? d.zxu : 0);
#if QL_X86
    d.store32 = isa->dw_cl == ql_dw_cl_avx2 ? ql_dw_store_avx2 : NULL;
#endif
    d.taps = p->k[0] * p->k[1];
    if (d.taps > DWCL_MAX_TAPS) return 0;
    d.npairs = (int)((d.taps + 1) / 2);
    /* padded extents: what the input and its begin pads cover, and what the windows reach */
    int64_t e[2];
    for (int a = 0; a < 2; a++) {
        int64_t need = (p->out[a] - 1) * p->stride[a] + (p->k[a] - 1) * p->dil[a] + 1;
        e[a] = p->in[a] + p->pad[a];
        if (need > e[a]) e[a] = need;
    }
    if (e[1] > DWCL_MAX_POS || (p->k[0] - 1) * p->dil[0] + 1 > DWCL_MAX_POS) return 0;
    d.hp = e[0];
    d.wp = e[1];
    /* bands of output rows whose padded input rows fit DWCL_MAX_POS positions (at least one
     * output row; the whole plane when it fits) */
    int64_t span = (p->k[0] - 1) * p->dil[0] + 1;
    if (span * d.wp > DWCL_MAX_POS) return 0;
    d.band = (DWCL_MAX_POS / d.wp - span) / p->stride[0] + 1;
    if (d.band > p->out[0]) d.band = p->out[0];
    d.xrows = (d.band - 1) * p->stride[0] + span;
    d.P = p->out[0] * p->out[1];
    d.blocks = (p->C + 15) / 16;
    /* the channels-last weights, when the caller passed them after wc (conv.h) */
    size_t wct = (size_t)(p->M * d.taps), wcl = (size_t)d.blocks * 32 * (size_t)d.npairs;
    d.wcl = w_elems >= wct + wcl ? wc + wct : NULL;
    for (int64_t t = 0; t < 2 * d.npairs; t++) {
        int64_t tt = t < d.taps ? t : 0, kh = tt / p->k[1], kw = tt % p->k[1];
        d.toff[t] = (ptrdiff_t)(kh * p->dil[0] * d.wp + kw * p->dil[1]);
    }
    int64_t chunk = DWCL_CHUNK > p->out[1] ? DWCL_CHUNK / p->out[1] * p->out[1] : p->out[1];
    size_t o = 0;
    d.off_x = o;
    o += align64(sizeof(int16_t) * 16 * (size_t)(d.xrows * d.wp));
    d.off_w = o;
    o += align64(sizeof(int16_t) * 32 * (size_t)d.npairs);
    d.off_acc = o;
    o += align64(sizeof(int32_t) * 16 * (size_t)chunk);
    d.off_comp = o;
    o += align64(sizeof(int32_t) * 16 * (size_t)chunk);
    d.off_band = o;   /* the band whose padding X holds (dwcl_fill): none yet; the scatter offsets */
    o += align64(sizeof(int64_t) * 2 + (d.W < 16 ? sizeof(ptrdiff_t) * (size_t)(d.xrows * d.W) : 0));
    d.scratch_bytes = o;
    int threads = ql_num_threads();
    if (d.scratch_bytes * (size_t)threads > workspace) return 0;
    int cached;
    d.scratch = dw_scratch_get(d.scratch_bytes * (size_t)threads, &cached);
    if (!d.scratch) return -1;
    for (int th = 0; th < threads; th++) ((int64_t *)(d.scratch + (size_t)th * d.scratch_bytes + d.off_band))[0] = -1;
    int run_threads = p->N * p->M * d.P * d.taps < DW_MIN_PAR ? 1 : threads;
    /* tasks: (image, channel block, group of output rows); the rows are split only when there
     * are too few blocks to keep every thread busy to the end: at least 8 tasks per thread,
     * so that a worker that starts late (its wake-up takes tens of microseconds) or a thread
     * slowed by other load leaves at most a small task to the others (each split re-reads the
     * kernel's halo rows: 2 rows of a 3x3 kernel, a few percent of the fill) */
    d.group_rows = p->out[0];
    if (run_threads > 1 && p->N * d.blocks < 8 * (int64_t)run_threads) {
        int64_t parts = (8 * (int64_t)run_threads + p->N * d.blocks - 1) / (p->N * d.blocks);
        d.group_rows = (p->out[0] + parts - 1) / parts;
        if (d.group_rows < d.band) d.band = d.group_rows;
    }
    d.band_groups = (p->out[0] + d.group_rows - 1) / d.group_rows;
    __atomic_fetch_add(&dw_calls[0], 1, __ATOMIC_RELAXED);
    ql_parallel_for((ptrdiff_t)(p->N * d.blocks * d.band_groups), run_threads, dwcl_task, &d);
    dw_scratch_put(d.scratch, cached);
    return 1;
}

int ql_conv_depthwise(const ql_conv_plan *p, const ql_isa *isa, const int16_t *wc, size_t w_elems,
                      size_t workspace)
{
    {
        int rc = dwcl_run(p, isa, wc, w_elems, workspace);
        if (rc) return rc < 0 ? rc : 0;
    }
    dw_ctx d;
    memset(&d, 0, sizeof d);
    int nsp = p->nsp, L = nsp - 1;
    d.p = p;
    d.isa = isa;
    d.rows_fn = isa->dw_rows;   /* the level's row kernel (its table, dispatch.c) */
    d.wc = wc;
    d.mult = p->M / p->C;
    d.taps = prod(p->k, nsp);
    d.kw = p->k[L];
    d.ktaps_outer = d.taps / d.kw;
    d.ow = p->out[L];
    d.orows = prod(p->out, L);
    d.plane = prod(p->in, nsp);
    d.P = prod(p->out, nsp);
    plane_strides(p, d.st);
    if (p->M > INT_MAX) return -2;
    d.span = (d.kw - 1) * p->dil[L];
    d.shared = p->stride[L] == 1 && d.kw <= DW_MAX_ROWS && d.span <= DW_MAX_SPAN;
    /* plane mode: a padded plane of at most DW_PLANE_MAX elements, the last axis split into
     * `stride` phases (so that every tap reads a contiguous row), and outer strides small
     * (rows between output rows are computed and dropped) */
    int64_t plane_len = 1, outer_waste = 1;
    d.plane_mode = 1;
    for (int a = 0; a < nsp; a++) {
        int64_t need = (p->out[a] - 1) * p->stride[a] + (p->k[a] - 1) * p->dil[a] + 1;
        int64_t e = p->in[a] + p->pad[a];
        if (need > e) e = need;
        d.ep_[a] = e;
        if (a < L) outer_waste *= p->stride[a];
        if (e > DW_PLANE_MAX || p->stride[a] > DW_PLANE_MAX_STRIDE) d.plane_mode = 0;
        else if (d.plane_mode) {
            plane_len *= a == L ? (e + p->stride[a] - 1) / p->stride[a] : e;
            if (plane_len > DW_PLANE_MAX) d.plane_mode = 0;
        }
    }
    if (outer_waste > DW_PLANE_MAX_STRIDE) d.plane_mode = 0;
    /* segment: up to DW_SEG columns (plane mode: DW_CHUNK flat outputs), fewer when the
     * channel multiplier's accumulators grow */
    int64_t seg = d.plane_mode ? DW_CHUNK : DW_SEG;
    while (seg > 16 && d.mult * seg > 16384) seg /= 2;
    if (d.plane_mode) {
        /* phase planes: rows of ceil(e_L / s_L) elements */
        d.phases = p->stride[L];
        for (int a = nsp - 1; a >= 0; a--)
            d.ps[a] = a == nsp - 1 ? 1 : d.ps[a + 1] * (a + 1 == L ? (d.ep_[L] + d.phases - 1) / d.phases : d.ep_[a + 1]);
        d.qmax = 0;   /* one past the flat index of the last output */
        for (int a = 0; a < L; a++) d.qmax += (p->out[a] - 1) * p->stride[a] * d.ps[a];
        d.qmax += p->out[L];
        if (seg > d.qmax) seg = d.qmax;
        d.chunk = seg;
        /* reads reach q + toff + 15 < qmax + max toff + 16 <= phase plane + 16 */
        d.phase_len = plane_len + 32;
        d.plane_len = d.phases * d.phase_len + 16;
    } else if (seg > d.ow) {
        seg = d.ow;
    }
    d.seg = seg;
    d.segr = (seg + 15) / 16 * 16;
    /* a shared row serves the taps' shifted windows: segr + span, + 16 spare */
    d.buflen = d.plane_mode ? 0 : d.shared ? d.segr + d.span + 16 : d.segr;
    d.off_bufs = 0;
    size_t o = align64(sizeof(int16_t) * (size_t)DW_MAX_ROWS * (size_t)d.buflen);
    d.off_acc = o;
    o += align64(sizeof(int32_t) * (size_t)d.segr * (size_t)d.mult);
    d.off_w = o;
    o += align64(sizeof(int16_t) * (DW_MAX_ROWS + 2));
    d.off_ptr = o;
    o += align64(sizeof(void *) * (DW_MAX_ROWS + 2));
    d.off_tap = o;
    o += align64(sizeof(int64_t) * (DW_MAX_ROWS + 2));
    if (d.plane_mode) {
        d.off_plane = o;
        o += align64(sizeof(int16_t) * (size_t)d.plane_len);
        d.off_toff = o;
        o += align64(sizeof(int64_t) * (size_t)d.taps);
        d.off_comp = o;
        o += align64(sizeof(int32_t) * (size_t)d.segr * (size_t)d.mult);
        d.off_bufs = o;   /* unused in plane mode */
    }
    d.scratch_bytes = o;
    int threads = ql_num_threads();
    if (d.scratch_bytes * (size_t)threads > workspace) return -3;
    int cached;
    d.scratch = dw_scratch_get(d.scratch_bytes * (size_t)threads, &cached);
    if (!d.scratch) return -1;
    /* small convolutions stay on the calling thread (as ql_gemm does below 2^21 MACs) */
    int run_threads = p->N * p->M * d.P * d.taps < DW_MIN_PAR ? 1 : threads;
    if (d.plane_mode) {
        /* tap offsets in the plane, the same for every thread */
        int64_t *toff = (int64_t *)(d.scratch + d.off_toff);
        for (int64_t t = 0; t < d.taps; t++) {
            int64_t tc[QL_CONV_MAXD], off = 0;
            tap_coords(p, t, tc);
            for (int a = 0; a < L; a++) off += tc[a] * p->dil[a] * d.ps[a];
            /* last axis: column o*s + t*d = (o + t*d / s)*s + (t*d % s): phase t*d % s */
            int64_t col = tc[L] * p->dil[L];
            off += col / d.phases + (col % d.phases) * d.phase_len;
            toff[t] = off;
        }
        for (int th = 1; th < threads; th++)
            memcpy(d.scratch + (size_t)th * d.scratch_bytes + d.off_toff, toff, sizeof(int64_t) * (size_t)d.taps);
        __atomic_fetch_add(&dw_calls[1], 1, __ATOMIC_RELAXED);
        ql_parallel_for((ptrdiff_t)(p->N * p->C), run_threads, dw_plane_task, &d);
        dw_scratch_put(d.scratch, cached);
        return 0;
    }
    /* tasks: (image, channel, block of output rows); enough blocks for every thread */
    int64_t planes = p->N * p->C;
    int64_t want = 4 * (int64_t)threads;
    int64_t blocks = planes >= want ? 1 : (want + planes - 1) / planes;
    if (blocks > d.orows) blocks = d.orows;
    d.rows_per_task = (d.orows + blocks - 1) / blocks;
    d.row_blocks = (d.orows + d.rows_per_task - 1) / d.rows_per_task;
    __atomic_fetch_add(&dw_calls[2], 1, __ATOMIC_RELAXED);
    ql_parallel_for((ptrdiff_t)(planes * d.row_blocks), run_threads, dw_task, &d);
    dw_scratch_put(d.scratch, cached);
    return 0;
}
