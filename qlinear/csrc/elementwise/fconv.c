/* The backend's float32 Conv between quantized layers of QDQ models (qlinear/graph/kernels/
 * float.py, ``conv``; NCHW, two spatial axes), besides the matrix product (fconv/fgemm.c):
 *
 * - ql_float_im2col: the im2col matrix of the zero-padded input, (group, C/group * kh * kw,
 *   N * OH * OW), rows in (channel, ky, kx) order: a copy of input values and zeros, nothing
 *   computed; ql_fgemm multiplies it by the weights.
 *
 * - ql_float_dwconv2d: depthwise convolution (one input channel per group, mg output channels
 *   per input channel: output channel o reads input channel o / mg).
 *
 * Arithmetic (docs/qdq.md, "Float Conv"): every output starts at +0.0f, then for each tap in
 * row-major order (ky, kx) acc = acc + (w[o][ky][kx] * x_tap), one rounding per multiply and
 * per add (never fused), x_tap being the zero-padded input (a padding tap multiplies its
 * weight by 0.0f); a bias is added last, acc = acc + b[o]. These are the NumPy formulation's
 * float32 operations in its order, so the results are bit-identical to it, on every level.
 *
 * Per input plane (one task each), the zero-padded plane is laid out in `sw` column phases
 * (phase r of a padded row holds its columns r, r + sw, ...), so for every tap the output row
 * reads one contiguous run, whatever the stride; the level's row kernel (include/fconv.h) runs
 * each output row's taps over those runs, the chains in vector registers.
 */
#include "fconv.h"

#include <string.h>

/* taps per row-kernel call; a kernel of more taps continues the chain in further calls */
#define FDW_TAPS 64

void ql_fdw_row_portable(float *y, ptrdiff_t n, const float *const *src, const float *w, int taps, int accumulate,
                         const float *bias) {
    for (ptrdiff_t ox = 0; ox < n; ox++) {
        float acc = accumulate ? y[ox] : 0.0f;
        for (int t = 0; t < taps; t++) {
            const float p = w[t] * src[t][ox];
            acc = acc + p;
        }
        y[ox] = bias ? acc + *bias : acc;
    }
}

typedef struct {
    const ql_fconv_kernels *k;
    const float *x, *w, *b;
    float *y;
    ptrdiff_t C, H, W, mg, OH, OW, kh, kw, sh, sw, dh, dw, pt, pl;
    ptrdiff_t Hp;      /* padded rows the windows touch */
    ptrdiff_t P;       /* elements of one phase of a padded row (pitch / sw) */
    char *scratch;     /* per thread: the padded plane */
    size_t per_thread;
} fdw_ctx;

static void fdw_task(void *vctx, ptrdiff_t t, int thread) {
    const fdw_ctx *c = (const fdw_ctx *)vctx;
    const ptrdiff_t H = c->H, W = c->W, OW = c->OW, sw = c->sw, P = c->P, row_len = sw * P;
    const ptrdiff_t ci = t % c->C;  /* t = n * C + ci */
    const float *plane = c->x + t * H * W;
    float *buf = (float *)(c->scratch + (size_t)thread * c->per_thread);
    /* the zero-padded plane, each padded row split into its sw phases */
    memset(buf, 0, sizeof(float) * (size_t)(c->Hp * row_len));
    for (ptrdiff_t r = 0; r < c->Hp; r++) {
        ptrdiff_t iy = r - c->pt;
        if (iy < 0 || iy >= H) continue;
        const float *src = plane + iy * W;
        float *dst = buf + r * row_len;
        if (sw == 1) {
            memcpy(dst + c->pl, src, sizeof(float) * (size_t)W);
            continue;
        }
        /* column ix + pl goes to phase (ix + pl) % sw, index (ix + pl) / sw: per phase, the
         * columns ix0, ix0 + sw, ... to consecutive indices from (ix0 + pl) / sw */
        for (ptrdiff_t ph = 0; ph < sw; ph++) {
            const ptrdiff_t ix0 = ((ph - c->pl) % sw + sw) % sw;
            float *d = dst + ph * P + (ix0 + c->pl) / sw;
            for (ptrdiff_t ix = ix0, i = 0; ix < W; ix += sw, i++) d[i] = src[ix];
        }
    }
    const ptrdiff_t taps = c->kh * c->kw;
    const float *src[FDW_TAPS];
    for (ptrdiff_t t0 = 0; t0 < taps; t0 += FDW_TAPS) {
        /* the taps in row-major (ky, kx) order, FDW_TAPS at a time, the bias after the last */
        const int nt = taps - t0 < FDW_TAPS ? (int)(taps - t0) : FDW_TAPS;
        ptrdiff_t off[FDW_TAPS];   /* each tap's first element in the padded plane, output row 0 */
        for (int i = 0; i < nt; i++) {
            const ptrdiff_t ky = (t0 + i) / c->kw, kx = (t0 + i) % c->kw, col = kx * c->dw;
            off[i] = ky * c->dh * row_len + (col % sw) * P + col / sw;
        }
        for (ptrdiff_t j = 0; j < c->mg; j++) {
            const ptrdiff_t n = t / c->C, o = ci * c->mg + j;
            const float *wo = c->w + o * taps + t0;
            const float *bo = c->b && t0 + nt == taps ? c->b + o : NULL;
            float *yo = c->y + (n * c->C * c->mg + o) * c->OH * OW;
            for (ptrdiff_t oy = 0; oy < c->OH; oy++) {
                const float *base = buf + oy * c->sh * row_len;
                for (int i = 0; i < nt; i++) src[i] = base + off[i];
                c->k->dw_row(yo + oy * OW, OW, src, wo, nt, t0 > 0, bo);
            }
        }
    }
}

int ql_float_dwconv2d(const ql_fconv_kernels *k, const float *x, const float *w, const float *b, float *y,
                      ptrdiff_t N, ptrdiff_t C, ptrdiff_t H, ptrdiff_t W, ptrdiff_t mg, ptrdiff_t OH, ptrdiff_t OW,
                      ptrdiff_t kh, ptrdiff_t kw, ptrdiff_t sh, ptrdiff_t sw, ptrdiff_t dh, ptrdiff_t dw,
                      ptrdiff_t pt, ptrdiff_t pl, int threads) {
    if (N <= 0 || C <= 0 || mg <= 0 || OH <= 0 || OW <= 0) return 0;
    fdw_ctx c = {k, x, w, b, y, C, H, W, mg, OH, OW, kh, kw, sh, sw, dh, dw, pt, pl, 0, 0, NULL, 0};
    /* the rows and columns the windows touch, and at least the plane itself (its copy) */
    c.Hp = (OH - 1) * sh + (kh - 1) * dh + 1;
    if (c.Hp < pt + H) c.Hp = pt + H;
    ptrdiff_t span = (OW - 1) * sw + (kw - 1) * dw + 1;
    if (span < pl + W) span = pl + W;
    c.P = (span + sw - 1) / sw;
    /* threads from about 64 Ki multiply-adds on (below, the hand-off costs more than it saves) */
    double work = (double)N * C * mg * OH * OW * kh * kw;
    if (work < (double)(1 << 16) || threads < 1) threads = 1;
    if (threads > N * C) threads = (int)(N * C);
    c.per_thread = (sizeof(float) * (size_t)(c.Hp * sw * c.P) + 63) & ~(size_t)63;
    int cached;
    c.scratch = ql_conv_scratch_get(c.per_thread * (size_t)threads, &cached);
    if (!c.scratch) return -1;
    ql_parallel_for(N * C, threads, fdw_task, &c);
    ql_conv_scratch_put(c.scratch, cached);
    return 0;
}


typedef struct {
    const float *x;
    float *cols;
    ptrdiff_t N, C, H, W, OH, OW, kh, kw, sh, sw, dh, dw, pt, pl;
} im2col_ctx;

/* row t of the matrix: input channel c = t / (kh * kw), tap (ky, kx); its N * OH * OW columns */
static void im2col_task(void *vctx, ptrdiff_t t, int thread) {
    (void)thread;
    const im2col_ctx *c = (const im2col_ctx *)vctx;
    const ptrdiff_t taps = c->kh * c->kw, ch = t / taps, ky = t % taps / c->kw, kx = t % c->kw;
    const ptrdiff_t OW = c->OW, W = c->W, sw = c->sw;
    float *out = c->cols + t * c->N * c->OH * OW;
    /* the output columns whose input column ox * sw - pl + kx * dw lies inside [0, W) */
    const ptrdiff_t x0 = kx * c->dw - c->pl;
    ptrdiff_t lo = x0 >= 0 ? 0 : (-x0 + sw - 1) / sw;
    ptrdiff_t hi = x0 < W ? (W - 1 - x0) / sw + 1 : 0;
    if (hi > OW) hi = OW;
    if (lo > hi) lo = hi;
    for (ptrdiff_t n = 0; n < c->N; n++) {
        const float *plane = c->x + (n * c->C + ch) * c->H * W;
        for (ptrdiff_t oy = 0; oy < c->OH; oy++, out += OW) {
            const ptrdiff_t iy = oy * c->sh - c->pt + ky * c->dh;
            if (iy < 0 || iy >= c->H || lo == hi) {
                memset(out, 0, sizeof(float) * (size_t)OW);
                continue;
            }
            const float *row = plane + iy * W;  /* columns x0 + ox * sw, in [0, W) for lo <= ox < hi */
            for (ptrdiff_t ox = 0; ox < lo; ox++) out[ox] = 0.0f;
            if (sw == 1) {
                memcpy(out + lo, row + x0 + lo, sizeof(float) * (size_t)(hi - lo));
            } else {
                for (ptrdiff_t ox = lo; ox < hi; ox++) out[ox] = row[x0 + ox * sw];
            }
            for (ptrdiff_t ox = hi; ox < OW; ox++) out[ox] = 0.0f;
        }
    }
}

void ql_float_im2col(const float *x, float *cols, ptrdiff_t N, ptrdiff_t C, ptrdiff_t H, ptrdiff_t W,
                     ptrdiff_t OH, ptrdiff_t OW, ptrdiff_t kh, ptrdiff_t kw, ptrdiff_t sh, ptrdiff_t sw,
                     ptrdiff_t dh, ptrdiff_t dw, ptrdiff_t pt, ptrdiff_t pl, int threads) {
    if (N <= 0 || C <= 0 || OH <= 0 || OW <= 0) return;
    im2col_ctx c = {x, cols, N, C, H, W, OH, OW, kh, kw, sh, sw, dh, dw, pt, pl};
    /* rows of the matrix are laid out group by group, channel by channel, tap by tap: the
     * input channel order, so one task per (channel, tap) row fills them all in place;
     * threads from about 256 KiB of copying on */
    double bytes = 4.0 * (double)N * C * kh * kw * OH * OW;
    ql_parallel_for(C * kh * kw, bytes >= (double)(1 << 18) ? threads : 1, im2col_task, &c);
}
