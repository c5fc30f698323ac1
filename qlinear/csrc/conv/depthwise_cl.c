/* Depthwise convolutions, channels-last (2-D, small planes, 16 channels per vector). */
#include "depthwise.h"

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
/* output pixels per epilogue call */
#define DWCL_CHUNK 256

typedef struct dwcl_ctx {
    const ql_conv_plan *p;
    const ql_isa *isa;
    const int16_t *wc;          /* (M, taps) centered int16 weights */
    const int16_t *wcl;         /* their channels-last form [blocks][2*npairs][16], or NULL */
    int64_t H, W, hp, wp, taps, blocks, P;
    int64_t band, xrows;        /* output rows per band, padded input rows they read */
    int64_t group_rows, band_groups;   /* output rows per task (whole bands), groups per plane */
    int npairs;
    ptrdiff_t toff[QL_DWCL_MAX_TAPS];   /* tap offsets in X positions (the padding tap: 0) */
    /* the fill's 16 x 16 transpose: the AVX2 one on levels whose kernel is AVX2 */
    void (*t16)(const uint8_t *src, ptrdiff_t cs, uint8_t flip, int32_t zsub, int16_t *dst, const ptrdiff_t *doff);
    /* X's form: (x ^ flip) - zsub, padding pv (dwcl_fill) */
    uint8_t flip;
    int32_t zsub, zxu;
    int16_t pv;
    /* the store's 32-position transpose on AVX2 levels (NULL: dwcl_store_q's 16 at a time) */
    void (*store32)(const uint8_t *Q, int nch, int cols, uint8_t *y, ptrdiff_t P);
    char *scratch;
    size_t scratch_bytes, off_x, off_w, off_acc, off_comp, off_band;
} dwcl_ctx;


/* Requantized bytes Q [cols][16] (positions of 16 channels) to the output planes: channel c's
 * positions go to y + c*P (c < nch), 16 positions per byte transpose. */
static void dwcl_store_q(const dwcl_ctx *d, const uint8_t *Q, int nch, int cols, uint8_t *y, ptrdiff_t P)
{
    if (d->store32 && cols >= 32) {   /* the level's (its table) */
        d->store32(Q, nch, cols, y, P);
        return;
    }
    if (ql_vec_store_q16(Q, nch, cols, y, P)) return;   /* 16 positions a transpose */
    int j = 0;
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
    if (d->t16 && nch == 16 && W >= 16) {   /* the transposes (none: the loop below) */
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
    if (d->t16 && nch == 16 && len >= 16) {
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
    for (int64_t r = xa; r < xb_; r++) {
        int16_t *dst = X + rowe * (size_t)r + 16 * (size_t)lp;
        if (nch < 16) dwcl_set(dst, pv, (size_t)W);   /* lanes beyond the block (weight 0) */
        for (int c = 0; c < nch; c++) {
            const uint8_t *src = xb + c * plane + (r - xa) * W;
            for (int64_t j = 0; j < W; j++) dst[16 * j + c] = (int16_t)((int32_t)(src[j] ^ flip) - zsub);
        }
    }
}

/* comp[c][j] = acc[j][c] for c < nch, j < cols (4x4 int32 blocks by unpacks where the baseline has them) */
static void dwcl_untranspose(const int32_t *acc, int nch, int cols, int32_t *comp)
{
    int j = ql_vec_untranspose16(acc, nch, cols, comp);   /* 4 x 4 blocks first */
    for (int c = 0; c < nch; c++)
        for (int jj = j; jj < cols; jj++) comp[(size_t)c * cols + jj] = acc[16 * (size_t)jj + c];
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
        if (!ql_vec_colsum16_i16(wt, 2 * d->npairs, sw))
            for (int t = 0; t < 2 * d->npairs; t++)
                for (int c = 0; c < 16; c++) sw[c] += (uint32_t)(int32_t)wt[16 * t + c];
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
int dwcl_run(const ql_conv_plan *p, const ql_isa *isa, const int16_t *wc, size_t w_elems, size_t workspace)
{
    if (p->nsp != 2 || p->M != p->C || p->C < 8 || !isa->dw_cl) return 0;
    dwcl_ctx d;
    memset(&d, 0, sizeof d);
    d.p = p;
    d.isa = isa;
    d.wc = wc;
    d.H = p->in[0];
    d.W = p->in[1];
    d.t16 = isa->dw_t16 ? isa->dw_t16 : QL_VEC_T16;   /* the level's (its table), or the baseline's */
    /* int8 x: x - zx = (x ^ 0x80) - (zx + 128), so both types widen as uint8 (zxu: zx in that
     * form). X holds x - zx (padding 0) for int32 output; for the requantized output the raw
     * uint8 form x ^ flip (padding zxu: a padded tap adds w*zxu, which the bias takes back
     * with every other tap's, dwcl_task): the fill skips the subtraction. Either way
     * |X| <= 255 and |w| <= 255: the kernels' int16 pair sums stay exact. */
    d.flip = p->x_type == QL_I8 ? 0x80 : 0;
    d.zxu = p->x_type == QL_I8 ? p->x_zp + 128 : p->x_zp;
    d.zsub = p->quantized ? 0 : d.zxu;
    d.pv = (int16_t)(p->quantized ? d.zxu : 0);
    d.store32 = isa->dw_store32;
    d.taps = p->k[0] * p->k[1];
    if (d.taps > QL_DWCL_MAX_TAPS) return 0;
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
    d.scratch = ql_conv_scratch_get(d.scratch_bytes * (size_t)threads, &cached);
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
    __atomic_fetch_add(&ql_dw_calls[0], 1, __ATOMIC_RELAXED);
    ql_parallel_for((ptrdiff_t)(p->N * d.blocks * d.band_groups), run_threads, dwcl_task, &d);
    ql_conv_scratch_put(d.scratch, cached);
    return 1;
}
