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

size_t ql_conv_w_bytes(const ql_gemm_kernel *k, int M, int K)
{
    size_t b = (size_t)M * (size_t)w_row_bytes(k, K);
    if (k->form != QL_FORM_I16) b += 2 * sizeof(int32_t) * (size_t)M;
    return b;
}

/* w: (M, K) 8-bit row-major; wzp: M int32 (per output channel, repeated if per tensor).
 * dst layout: M rows of w_row_bytes, then int32 row_a[M], int32 row_z[M]:
 * - U8S8 form: rows in the u8 form, row_a = rowsum(L') - K*zL', row_z = zL' (the epilogue's
 *   corrections, wrap32);
 * - S8U8 form (fast path): rows = w - wzp as int8, which must lie in [-64, 64] (else -1, nothing
 *   usable written); row_a = sum of the row (|sum| <= 64 K < 2^31), row_z = 0. The per-call
 *   correction is then one term per row: - zx' * row_a (ql_conv_gemm).
 * Rows [i0, i1) only (the layout is the whole M's), so threads can share the work. */
static int pack_w_rows(const ql_gemm_kernel *k, const void *w, int w_type, int M, int K,
                       const int32_t *wzp, void *dst, int i0, int i1)
{
    int kp = ql_round_k(k, K);
    ptrdiff_t ldl = w_row_bytes(k, K);
    int32_t *row_a = (int32_t *)((char *)dst + (size_t)M * (size_t)ldl), *row_z = row_a + M;
    if (k->form == QL_FORM_S8U8) {
        for (int i = i0; i < i1; i++) {
            const uint8_t *src = (const uint8_t *)w + (size_t)i * (size_t)K;
            int8_t *d = (int8_t *)dst + (size_t)i * (size_t)ldl;
            int32_t sum = 0, z = wzp[i];
            int bad = 0;
            /* no early exit: a loop the compiler vectorizes; the verdict comes after the row */
            if (w_type == QL_U8) {
                for (int kk = 0; kk < K; kk++) {
                    int32_t v = (int32_t)src[kk] - z;
                    bad |= (v < -64) | (v > 64);
                    d[kk] = (int8_t)v;
                    sum += v;
                }
            } else {
                const int8_t *si = (const int8_t *)src;
                for (int kk = 0; kk < K; kk++) {
                    int32_t v = (int32_t)si[kk] - z;
                    bad |= (v < -64) | (v > 64);
                    d[kk] = (int8_t)v;
                    sum += v;
                }
            }
            if (bad) return -1;
            for (int kk = K; kk < kp; kk++) d[kk] = 0;
            row_a[i] = sum;
            row_z[i] = 0;
        }
        return 0;
    }
    /* the level's packer (SIMD where it has one; the portable one's output) */
    ql_pack_L_fn pack = k->pack_L ? k->pack_L : ql_pack_L;
    char *d0 = (char *)dst + (size_t)i0 * (size_t)ldl;
    const uint8_t *w0 = (const uint8_t *)w + (size_t)i0 * (size_t)K;
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

int ql_conv_pack_w(const ql_gemm_kernel *k, const void *w, int w_type, int M, int K,
                   const int32_t *wzp, void *dst)
{
    return pack_w_rows(k, w, w_type, M, K, wzp, dst, 0, M);
}

/* A plain call's weights, packed per call in one pass over w: the fast path's form while every
 * row fits its bound (the proof is made while packing; the first row outside stops every
 * thread), else the exact form. Rows shared over the threads in blocks. */
typedef struct {
    const ql_gemm_kernel *k; const void *w; int w_type, M, K; const int32_t *wzp; void *dst;
    int rows_per_task;
    atomic_int outside;
} packw_ctx;

static void packw_task(void *vctx, ptrdiff_t t, int thread)
{
    (void)thread;
    packw_ctx *c = (packw_ctx *)vctx;
    if (atomic_load_explicit(&c->outside, memory_order_relaxed)) return;
    int i0 = (int)t * c->rows_per_task, i1 = i0 + c->rows_per_task < c->M ? i0 + c->rows_per_task : c->M;
    /* blocks of 4 rows, so that a row outside the bound stops the others soon */
    for (int i = i0; i < i1; i += 4) {
        if (pack_w_rows(c->k, c->w, c->w_type, c->M, c->K, c->wzp, c->dst, i, i + 4 < i1 ? i + 4 : i1)) {
            atomic_store_explicit(&c->outside, 1, memory_order_relaxed);
            return;
        }
        if (atomic_load_explicit(&c->outside, memory_order_relaxed)) return;
    }
}

static int pack_w_threads(const ql_gemm_kernel *k, const void *w, int w_type, int M, int K,
                          const int32_t *wzp, void *dst, int threads)
{
    packw_ctx c = {k, w, w_type, M, K, wzp, dst, 0, 0};
    if ((int64_t)M * K < (1 << 18)) threads = 1;   /* below: tens of microseconds */
    int tasks = threads > 1 ? 4 * threads : 1;
    c.rows_per_task = (M + tasks - 1) / tasks;
    if (c.rows_per_task < 1) c.rows_per_task = 1;
    ql_parallel_for((M + c.rows_per_task - 1) / c.rows_per_task, threads, packw_task, &c);
    return atomic_load(&c.outside) ? -1 : 0;
}

int ql_conv_pack_w_auto(const ql_isa *isa, const void *w, int w_type, int M, int K,
                        const int32_t *wzp, void *dst, int threads)
{
    if (isa->conv_fast && pack_w_threads(isa->conv_fast, w, w_type, M, K, wzp, dst, threads) == 0)
        return 2;
    pack_w_threads(isa->exact, w, w_type, M, K, wzp, dst, threads);
    return 0;
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
    const uint8_t *xg;          /* image n, first channel of the group */
    int64_t pix0;               /* output pixel of column 0 of this GEMM call */
    int form, nr, kp, K;
    int64_t taps, plane;        /* taps per channel; input elements per channel plane */
    ptrdiff_t st[QL_CONV_MAXD]; /* element strides of the input plane's axes */
    uint8_t flip;               /* byte forms: raw byte ^ flip = the form's byte */
    uint8_t tail;               /* raw byte that becomes 0 in the form (columns >= ncols) */
    char *scratch;
    size_t scratch_bytes;       /* per thread */
    int use_plans;              /* per-panel tap plans kept (taps * (nr + 1) <= PLAN_MAX) */
    int flat;                   /* pointwise (every kernel extent 1, stride 1, no pads): the
                                   output plane is the input plane, rows run across output rows */
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
static void interleave4(const uint8_t *const *src, uint8_t flip, uint8_t *dk, int nr)
{
    int j = 0;
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
            interleave4(src, c->flip, d + (size_t)k * nr, nr);   /* [k/4][nr][4] */
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

int ql_conv_gemm(const ql_conv_plan *p, const ql_isa *isa, const ql_gemm_kernel *kern,
                 const void *wpacked, size_t workspace)
{
    int64_t Cg = p->C / p->group, Mg = p->M / p->group;
    int64_t taps = prod(p->k, p->nsp);
    int64_t K64 = Cg * taps;
    int64_t P = prod(p->out, p->nsp);
    int64_t plane = prod(p->in, p->nsp);
    if (K64 > INT_MAX / 2 || Mg > INT_MAX) return -2;
    int K = (int)K64;
    int kp = ql_round_k(kern, K);
    ptrdiff_t ldl = w_row_bytes(kern, K);
    size_t esize = p->quantized ? 1 : 4;
    int threads = ql_num_threads();

    im2col_ctx c;
    memset(&c, 0, sizeof c);
    c.p = p;
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
    c.flat = 1;
    for (int a = 0; a < p->nsp; a++)
        if (p->k[a] != 1 || p->stride[a] != 1 || p->pad[a] != 0 || p->out[a] != p->in[a]) c.flat = 0;
    plane_strides(p, c.st);
    im2col_layout(&c);
    if (c.scratch_bytes * (size_t)threads > workspace) return -3;
    c.scratch = (char *)malloc(c.scratch_bytes * (size_t)threads + 64);
    if (!c.scratch) return -1;

    const int32_t *row_a = NULL, *row_z = NULL;
    if (kern->form == QL_FORM_U8S8) {
        row_a = (const int32_t *)((const char *)wpacked + (size_t)p->M * (size_t)ldl);
        row_z = row_a + p->M;
    }
    int32_t col_z = p->x_type == QL_U8 ? p->x_zp - 128 : p->x_zp;   /* zR' */
    /* S8U8 (fast path): C = sum x'(w - zw) over K, padding read as zx'; the result is
     * C - zx' * sum(w - zw): folded with the bias into one per-row term, in wrap32 */
    int32_t *fast_bias = NULL;
    if (kern->form == QL_FORM_S8U8) {
        const int32_t *wsum = (const int32_t *)((const char *)wpacked + (size_t)p->M * (size_t)ldl);
        uint32_t zxu = (uint32_t)(p->x_type == QL_I8 ? p->x_zp + 128 : p->x_zp);   /* zx' */
        fast_bias = (int32_t *)malloc(sizeof(int32_t) * (size_t)p->M);
        if (!fast_bias) { free(c.scratch); return -1; }
        for (int64_t i = 0; i < p->M; i++)
            fast_bias[i] = (int32_t)((p->bias ? (uint32_t)p->bias[i] : 0u) - zxu * (uint32_t)wsum[i]);
    }
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
                gp.threads = threads;
                if (ql_gemm(&gp) != 0) rc = -1;
            }
        }
    }
    free(c.scratch);
    free(fast_bias);
    return rc;
}

/* ---------------------------------------------------------------------------------------
 * Depthwise: direct tap sums along output rows
 * ------------------------------------------------------------------------------------- */

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

void ql_dw_cl_scalar(const int16_t *X, const ptrdiff_t *toff, const int16_t *wt, int npairs,
                     ptrdiff_t step, int ow, int32_t *acc)
{
    for (int o = 0; o < ow; o++) {
        const int16_t *xo = X + (ptrdiff_t)o * step * 16;
        for (int c = 0; c < 16; c++) {
            uint32_t sum = 0;
            for (int t = 0; t < 2 * npairs; t++)   /* |w|, |x| <= 255: each product exact */
                sum += (uint32_t)((int32_t)wt[16 * t + c] * xo[toff[t] * 16 + c]);
            acc[16 * o + c] = (int32_t)sum;
        }
    }
}

typedef struct dwcl_ctx {
    const ql_conv_plan *p;
    const ql_isa *isa;
    const int16_t *wc;          /* (M, taps) centered int16 weights */
    int64_t H, W, hp, wp, taps, blocks, P;
    int64_t band, xrows;        /* output rows per band, padded input rows they read */
    int npairs;
    char *scratch;
    size_t scratch_bytes, off_x, off_t, off_w, off_toff, off_acc, off_comp;
} dwcl_ctx;

#if QL_X86
/* 16 positions x 16 channels (rows src + c*cs, 16 bytes each) to 16 positions of 16 centered
 * int16 (dst, 32 bytes apart): a byte transpose by SSE2 unpacks, then widened; bytes ^ flip
 * are uint8, minus zxu (|x - zx| <= 255 fits int16) */
static void transpose16_i16(const uint8_t *src, ptrdiff_t cs, uint8_t flip, int32_t zxu, int16_t *dst)
{
    const __m128i f = _mm_set1_epi8((char)flip), z = _mm_set1_epi16((int16_t)zxu), zero = _mm_setzero_si128();
    __m128i r[16], u[16];
    for (int c = 0; c < 16; c++) r[c] = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(src + c * cs)), f);
    for (int c = 0; c < 8; c++) {   /* u[c]: positions 0-7 of channels 2c, 2c+1; u[c+8]: 8-15 */
        u[c] = _mm_unpacklo_epi8(r[2 * c], r[2 * c + 1]);
        u[c + 8] = _mm_unpackhi_epi8(r[2 * c], r[2 * c + 1]);
    }
    for (int h = 0; h < 2; h++) {
        __m128i *v = u + 8 * h, a[8], b[8];
        for (int c = 0; c < 4; c++) {   /* a[c]: positions 0-3 of channels 4c..4c+3; a[c+4]: 4-7 */
            a[c] = _mm_unpacklo_epi16(v[2 * c], v[2 * c + 1]);
            a[c + 4] = _mm_unpackhi_epi16(v[2 * c], v[2 * c + 1]);
        }
        /* b[4g + 2c + e]: positions 4g + 2e, 4g + 2e + 1 of channels 8c..8c+7 */
        for (int g = 0; g < 2; g++)
            for (int c = 0; c < 2; c++) {
                b[4 * g + 2 * c] = _mm_unpacklo_epi32(a[4 * g + 2 * c], a[4 * g + 2 * c + 1]);
                b[4 * g + 2 * c + 1] = _mm_unpackhi_epi32(a[4 * g + 2 * c], a[4 * g + 2 * c + 1]);
            }
        for (int g = 0; g < 2; g++)
            for (int e = 0; e < 2; e++) {
                __m128i p0 = _mm_unpacklo_epi64(b[4 * g + e], b[4 * g + 2 + e]);   /* one position, 16 ch */
                __m128i p1 = _mm_unpackhi_epi64(b[4 * g + e], b[4 * g + 2 + e]);
                int16_t *o0 = dst + 16 * (8 * h + 4 * g + 2 * e), *o1 = o0 + 16;
                _mm_storeu_si128((__m128i *)o0, _mm_sub_epi16(_mm_unpacklo_epi8(p0, zero), z));
                _mm_storeu_si128((__m128i *)(o0 + 8), _mm_sub_epi16(_mm_unpackhi_epi8(p0, zero), z));
                _mm_storeu_si128((__m128i *)o1, _mm_sub_epi16(_mm_unpacklo_epi8(p1, zero), z));
                _mm_storeu_si128((__m128i *)(o1 + 8), _mm_sub_epi16(_mm_unpackhi_epi8(p1, zero), z));
            }
    }
}
#endif

/* X (xr rows of wp positions): padded rows pr0 .. pr0 + xr - 1 of channels c0..c0+nch-1 of
 * image n, centered (x - zx), 0 at padding. The band's input rows are one flat run of each
 * channel plane: transposed 16 positions at a time (rows of any width) into T, then T's rows
 * are placed into X. */
static void dwcl_fill(const dwcl_ctx *d, int64_t n, int64_t c0, int nch, int64_t pr0, int64_t xr,
                      int16_t *X, int16_t *T)
{
    const ql_conv_plan *p = d->p;
    memset(X, 0, sizeof(int16_t) * 16 * (size_t)(xr * d->wp));
    int64_t plane = d->H * d->W;
    int64_t ih_a = pr0 - p->pad[0], ih_b = pr0 + xr - p->pad[0];
    if (ih_a < 0) ih_a = 0;
    if (ih_b > d->H) ih_b = d->H;
    if (ih_b <= ih_a) return;
    int64_t q0 = ih_a * d->W, len = (ih_b - ih_a) * d->W;
    const uint8_t *xb = (const uint8_t *)p->x + (size_t)((n * p->C + c0) * plane + q0);
    /* int8 x: x - zx = (x ^ 0x80) - (zx + 128), so both types widen as uint8 */
    uint8_t flip = p->x_type == QL_I8 ? 0x80 : 0;
    int32_t zxu = p->x_type == QL_I8 ? p->x_zp + 128 : p->x_zp;
    int64_t q = 0;
#if QL_X86
    if (nch == 16)
        for (; q + 16 <= len; q += 16) transpose16_i16(xb + q, (ptrdiff_t)plane, flip, zxu, T + 16 * q);
#endif
    if (q < len) {
        memset(T + 16 * q, 0, sizeof(int16_t) * 16 * (size_t)(len - q));
        for (int c = 0; c < nch; c++) {
            const uint8_t *src = xb + c * plane;
            for (int64_t j = q; j < len; j++) T[16 * j + c] = (int16_t)((int32_t)(src[j] ^ flip) - zxu);
        }
    }
    for (int64_t ih = ih_a; ih < ih_b; ih++)
        memcpy(X + 16 * (size_t)((ih + p->pad[0] - pr0) * d->wp + p->pad[1]), T + 16 * (size_t)((ih - ih_a) * d->W),
               sizeof(int16_t) * 16 * (size_t)d->W);
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

static void dwcl_task(void *vctx, ptrdiff_t task, int thread)
{
    const dwcl_ctx *d = (const dwcl_ctx *)vctx;
    const ql_conv_plan *p = d->p;
    char *s = d->scratch + (size_t)thread * d->scratch_bytes;
    int64_t n = task / d->blocks, c0 = (task % d->blocks) * 16;
    int nch = (int)(p->C - c0 < 16 ? p->C - c0 : 16);
    int16_t *X = (int16_t *)(s + d->off_x);
    int16_t *wt = (int16_t *)(s + d->off_w);
    ptrdiff_t *toff = (ptrdiff_t *)(s + d->off_toff);
    int32_t *acc = (int32_t *)(s + d->off_acc), *comp = (int32_t *)(s + d->off_comp);
    /* weights [2*npairs][16]: channel tails and the padding tap are 0 */
    memset(wt, 0, sizeof(int16_t) * 32 * (size_t)d->npairs);
    for (int c = 0; c < nch; c++)
        for (int64_t t = 0; t < d->taps; t++) wt[16 * t + c] = d->wc[(c0 + c) * d->taps + t];
    for (int64_t t = 0; t < 2 * d->npairs; t++) {
        int64_t tt = t < d->taps ? t : 0, kh = tt / p->k[1], kw = tt % p->k[1];
        toff[t] = (ptrdiff_t)(kh * p->dil[0] * d->wp + kw * p->dil[1]);
    }
    ql_epilogue ep;
    plan_epilogue(p, &ep);
    ep.out_rs = (ptrdiff_t)d->P;
    size_t esize = p->quantized ? 1 : 4;
    ep.out = (char *)p->y + (size_t)(n * p->M * d->P) * esize;
    int64_t OH = p->out[0], OW = p->out[1];
    /* chunks of whole output rows, at most DWCL_CHUNK pixels (at least one row) */
    int64_t rows_per = DWCL_CHUNK / OW;
    if (rows_per < 1) rows_per = 1;
    for (int64_t b0 = 0; b0 < OH; b0 += d->band) {
        /* a band of output rows and the padded input rows it reads (halo rows read twice) */
        int64_t b1 = OH - b0 < d->band ? OH : b0 + d->band, pr0 = b0 * p->stride[0];
        int64_t xr = (b1 - 1 - b0) * p->stride[0] + (p->k[0] - 1) * p->dil[0] + 1;
        dwcl_fill(d, n, c0, nch, pr0, xr, X, (int16_t *)(s + d->off_t));
        for (int64_t oh0 = b0; oh0 < b1; oh0 += rows_per) {
            int64_t nrow = b1 - oh0 < rows_per ? b1 - oh0 : rows_per;
            for (int64_t r = 0; r < nrow; r++) {
                const int16_t *xrow = X + 16 * (size_t)((oh0 + r) * p->stride[0] - pr0) * (size_t)d->wp;
                d->isa->dw_cl(xrow, toff, wt, d->npairs, (ptrdiff_t)p->stride[1], (int)OW, acc + 16 * (size_t)(r * OW));
            }
            int cols = (int)(nrow * OW);
            dwcl_untranspose(acc, nch, cols, comp);
            d->isa->epilogue(&ep, comp, cols, NULL, (int)c0, (int)(oh0 * OW), nch, cols);
        }
    }
}

/* The channels-last path when it applies (returns 1 after running it, 0 to take the others,
 * negative on error). */
static int dwcl_run(const ql_conv_plan *p, const ql_isa *isa, const int16_t *wc, size_t workspace)
{
    if (p->nsp != 2 || p->M != p->C || p->C < 8 || !isa->dw_cl) return 0;
    dwcl_ctx d;
    memset(&d, 0, sizeof d);
    d.p = p;
    d.isa = isa;
    d.wc = wc;
    d.H = p->in[0];
    d.W = p->in[1];
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
    int64_t chunk = DWCL_CHUNK > p->out[1] ? DWCL_CHUNK / p->out[1] * p->out[1] : p->out[1];
    size_t o = 0;
    d.off_x = o;
    o += align64(sizeof(int16_t) * 16 * (size_t)(d.xrows * d.wp));
    d.off_t = o;
    o += align64(sizeof(int16_t) * 16 * (size_t)(d.xrows * d.W));
    d.off_w = o;
    o += align64(sizeof(int16_t) * 32 * (size_t)d.npairs);
    d.off_toff = o;
    o += align64(sizeof(ptrdiff_t) * 2 * (size_t)d.npairs);
    d.off_acc = o;
    o += align64(sizeof(int32_t) * 16 * (size_t)chunk);
    d.off_comp = o;
    o += align64(sizeof(int32_t) * 16 * (size_t)chunk);
    d.scratch_bytes = o;
    int threads = ql_num_threads();
    if (d.scratch_bytes * (size_t)threads > workspace) return 0;
    d.scratch = (char *)malloc(d.scratch_bytes * (size_t)threads + 64);
    if (!d.scratch) return -1;
    int run_threads = p->N * p->M * d.P * d.taps < ((int64_t)1 << 21) ? 1 : threads;
    ql_parallel_for((ptrdiff_t)(p->N * d.blocks), run_threads, dwcl_task, &d);
    free(d.scratch);
    return 1;
}

int ql_conv_depthwise(const ql_conv_plan *p, const ql_isa *isa, const int16_t *wc, size_t workspace)
{
    {
        int rc = dwcl_run(p, isa, wc, workspace);
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
    d.scratch = (char *)malloc(d.scratch_bytes * (size_t)threads + 64);
    if (!d.scratch) return -1;
    /* small convolutions stay on the calling thread (as ql_gemm does below 2^21 MACs) */
    int run_threads = p->N * p->M * d.P * d.taps < ((int64_t)1 << 21) ? 1 : threads;
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
        ql_parallel_for((ptrdiff_t)(p->N * p->C), run_threads, dw_plane_task, &d);
        free(d.scratch);
        return 0;
    }
    /* tasks: (image, channel, block of output rows); enough blocks for every thread */
    int64_t planes = p->N * p->C;
    int64_t want = 4 * (int64_t)threads;
    int64_t blocks = planes >= want ? 1 : (want + planes - 1) / planes;
    if (blocks > d.orows) blocks = d.orows;
    d.rows_per_task = (d.orows + blocks - 1) / blocks;
    d.row_blocks = (d.orows + d.rows_per_task - 1) / d.rows_per_task;
    ql_parallel_for((ptrdiff_t)(planes * d.row_blocks), run_threads, dw_task, &d);
    free(d.scratch);
    return 0;
}
