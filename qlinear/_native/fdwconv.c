/* Float32 depthwise convolution (ONNX Conv with one input channel per group, NCHW, two
 * spatial axes): the backend's float Conv between quantized layers of QDQ models
 * (qlinear/backend_float.py, ``conv``), which NumPy computed as a loop of strided tap
 * products.
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
