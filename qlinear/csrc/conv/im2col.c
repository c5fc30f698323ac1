/* The im2col path's panel packer (ql_pack_R_fn): one panel of nr output pixels at a time,
 * straight from the NCHW input, in the GEMM kernel's operand form. */
#include "plan.h"

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

/* One segment of one tap: x positions off + i*stride (in the channel plane) for the segment's
 * pixels i in [lo, hi), padding elsewhere (lo = hi = 0 when an outer axis reads padding). */
typedef struct seg_plan { ptrdiff_t off; int lo, hi; } seg_plan;

/* Tap plans are computed once per panel (they do not depend on the channel) when
 * taps * (nr + 1) entries stay below this (128 KiB); longer kernels plan per row. */
#define PLAN_MAX 8192

void im2col_layout(im2col_ctx *c)
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
            /* stride 2 (a 7x7 s2 stem): 16 outputs from 32 bytes where they lie inside the
             * channel plane (the vector loop), then one by one */
            if (step == 2) i = (int)ql_vec_even_bytes(xc, plan[g].off, i, hi, (int64_t)c->plane, dd);
            for (; i < hi; i++) dd[i] = xc[plan[g].off + (ptrdiff_t)i * step];
        }
        for (; i < len; i++) dd[i] = padv;
    }
    for (int j = ncols; j < nr; j++) d[j] = c->tail;
    return d;
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
void im2col_pack(void *vctx, int j0, int ncols, void *dst, int32_t *colsums, int thread)
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
