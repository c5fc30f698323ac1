/* The backend's float32 Conv between quantized layers of QDQ models (qlinear/backend_float.py,
 * ``conv``; NCHW, two spatial axes), where NumPy's strided passes were the cost:
 *
 * - ql_float_im2col: the im2col matrix of the zero-padded input, (group, C/group * kh * kw,
 *   N * OH * OW) in the row and column order of the NumPy formulation's strided view. A copy
 *   of input values and zeros, nothing computed: the matrix product that follows (NumPy's
 *   BLAS, unchanged) sees the same matrix, so the results are the same bits.
 *
 * - ql_float_dwconv2d: depthwise convolution (one input channel per group), which NumPy
 *   computed as a loop of strided tap products.
 *
 * Arithmetic: the same float32 operations in the same order as that NumPy formulation, so the
 * results are bit-identical to it: every output starts at +0.0f, then for each tap in
 * row-major order (ky, kx) acc = acc + (w[o][ky][kx] * x_tap), one rounding per multiply and
 * per add (the build's -ffp-contract=off keeps the compiler from fusing them), x_tap being the
 * zero-padded input (a padding tap multiplies its weight by 0.0f, as the NumPy formulation
 * does on its padded copy); a bias is added last, acc = acc + b[o]. Output channel o reads
 * input channel o / mg (mg output channels per group).
 *
 * Per input plane (one task each), the zero-padded plane is laid out in `sw` column phases
 * (phase r of a padded row holds its columns r, r + sw, ...), so for every tap the output row
 * reads one contiguous run, whatever the stride; the inner loop is a plain multiply-add over
 * that run, which the compiler vectorizes.
 */
#include "qlinear.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    const float *x, *w, *b;
    float *y;
    ptrdiff_t C, H, W, mg, OH, OW, kh, kw, sh, sw, dh, dw, pt, pl;
    ptrdiff_t Hp;      /* padded rows the windows touch */
    ptrdiff_t P;       /* elements of one phase of a padded row (pitch / sw) */
    int failed;        /* a task could not allocate its scratch */
} fdw_ctx;

static void fdw_task(void *vctx, ptrdiff_t t, int thread) {
    (void)thread;
    fdw_ctx *c = (fdw_ctx *)vctx;
    const ptrdiff_t H = c->H, W = c->W, OW = c->OW, sw = c->sw, P = c->P, row_len = sw * P;
    const ptrdiff_t ci = t % c->C;  /* t = n * C + ci */
    const float *plane = c->x + t * H * W;
    float *buf = malloc(sizeof(float) * (size_t)(c->Hp * row_len));
    if (!buf) {
        c->failed = 1;
        return;
    }
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
        /* column ix + pl goes to phase (ix + pl) % sw, index (ix + pl) / sw: counters, no
         * division per element */
        ptrdiff_t ph = c->pl % sw, idx = c->pl / sw;
        for (ptrdiff_t ix = 0; ix < W; ix++) {
            dst[ph * P + idx] = src[ix];
            if (++ph == sw) {
                ph = 0;
                idx++;
            }
        }
    }
    const ptrdiff_t taps = c->kh * c->kw;
    for (ptrdiff_t j = 0; j < c->mg; j++) {
        const ptrdiff_t n = t / c->C, o = ci * c->mg + j;
        const float *wo = c->w + o * taps;
        float *yo = c->y + (n * c->C * c->mg + o) * c->OH * OW;
        for (ptrdiff_t oy = 0; oy < c->OH; oy++) {
            float *restrict acc = yo + oy * OW;
            for (ptrdiff_t ox = 0; ox < OW; ox++) acc[ox] = 0.0f;
            for (ptrdiff_t ky = 0; ky < c->kh; ky++) {
                const float *row = buf + (oy * c->sh + ky * c->dh) * row_len;
                for (ptrdiff_t kx = 0; kx < c->kw; kx++) {
                    const float wv = wo[ky * c->kw + kx];
                    const ptrdiff_t col = kx * c->dw;
                    const float *restrict src = row + (col % sw) * P + col / sw;
                    for (ptrdiff_t ox = 0; ox < OW; ox++) {
                        const float p = wv * src[ox];
                        acc[ox] = acc[ox] + p;
                    }
                }
            }
            if (c->b) {
                const float bv = c->b[o];
                for (ptrdiff_t ox = 0; ox < OW; ox++) acc[ox] = acc[ox] + bv;
            }
        }
    }
    free(buf);
}

int ql_float_dwconv2d(const float *x, const float *w, const float *b, float *y, ptrdiff_t N, ptrdiff_t C,
                      ptrdiff_t H, ptrdiff_t W, ptrdiff_t mg, ptrdiff_t OH, ptrdiff_t OW, ptrdiff_t kh,
                      ptrdiff_t kw, ptrdiff_t sh, ptrdiff_t sw, ptrdiff_t dh, ptrdiff_t dw, ptrdiff_t pt,
                      ptrdiff_t pl, int threads) {
    if (N <= 0 || C <= 0 || mg <= 0 || OH <= 0 || OW <= 0) return 0;
    fdw_ctx c = {x, w, b, y, C, H, W, mg, OH, OW, kh, kw, sh, sw, dh, dw, pt, pl, 0, 0, 0};
    /* the rows and columns the windows touch, and at least the plane itself (its copy) */
    c.Hp = (OH - 1) * sh + (kh - 1) * dh + 1;
    if (c.Hp < pt + H) c.Hp = pt + H;
    ptrdiff_t span = (OW - 1) * sw + (kw - 1) * dw + 1;
    if (span < pl + W) span = pl + W;
    c.P = (span + sw - 1) / sw;
    /* threads from about 64 Ki multiply-adds on (below, the hand-off costs more than it saves) */
    double work = (double)N * C * mg * OH * OW * kh * kw;
    ql_parallel_for(N * C, work >= (double)(1 << 16) ? threads : 1, fdw_task, &c);
    return c.failed ? -1 : 0;
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
