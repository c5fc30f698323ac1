/* Depthwise convolutions (one input channel per group, any channel multiplier): the entry
 * point, which takes the channels-last path (depthwise_cl.c) where it applies, else direct tap
 * sums along output rows, on centered int16 rows or padded planes. */
#include "depthwise.h"

/* ---------------------------------------------------------------------------------------
 * Depthwise: direct tap sums along output rows
 * ------------------------------------------------------------------------------------- */

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
    d.scratch = ql_conv_scratch_get(d.scratch_bytes * (size_t)threads, &cached);
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
        __atomic_fetch_add(&ql_dw_calls[1], 1, __ATOMIC_RELAXED);
        ql_parallel_for((ptrdiff_t)(p->N * p->C), run_threads, dw_plane_task, &d);
        ql_conv_scratch_put(d.scratch, cached);
        return 0;
    }
    /* tasks: (image, channel, block of output rows); enough blocks for every thread */
    int64_t planes = p->N * p->C;
    int64_t want = 4 * (int64_t)threads;
    int64_t blocks = planes >= want ? 1 : (want + planes - 1) / planes;
    if (blocks > d.orows) blocks = d.orows;
    d.rows_per_task = (d.orows + blocks - 1) / blocks;
    d.row_blocks = (d.orows + d.rows_per_task - 1) / d.rows_per_task;
    __atomic_fetch_add(&ql_dw_calls[2], 1, __ATOMIC_RELAXED);
    ql_parallel_for((ptrdiff_t)(planes * d.row_blocks), run_threads, dw_task, &d);
    ql_conv_scratch_put(d.scratch, cached);
    return 0;
}
