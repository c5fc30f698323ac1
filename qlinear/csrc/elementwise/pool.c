/* MaxPool over 8-bit planes (ONNX MaxPool on uint8 / int8, NCHW, two spatial axes).
 *
 * A maximum is exact, so the only contract is which input positions a window covers: output
 * (oy, ox) is the maximum over the taps x[oy*sh - pt + ky*dh][ox*sw - pl + kx*dw] that lie
 * inside the plane; padding never wins, and a window with no tap inside gives the type's
 * minimum (what qlinear.backend.max_pool's NumPy formulation computes by padding with it).
 *
 * int8 is handled as uint8 after flipping the sign bit (v ^ 0x80 maps -128..127 onto 0..255
 * in order), so one unsigned code path serves both types and the minimum is 0 inside it.
 *
 * Per block of output rows of a plane, each output row's window rows are first reduced
 * element-wise into one padded row of a scratch block (contiguous, vectorized by the compiler
 * with pmaxub); then the columns: the block, rows laid end to end with a pitch that is a
 * multiple of sw, is split into `sw` phases (phase r holds positions r, r + sw, ...), so every
 * horizontal tap is one long contiguous element-wise maximum over a phase, whatever the row
 * width. A window covering its whole plane (a global MaxPool) is a plain reduction. Planes are
 * shared by the threads.
 */
#include "elementwise.h"

#include <stdlib.h>
#include <string.h>

#include "isa/x86_sse2.h"

typedef struct {
    const ql_ew_kernels *k; /* the row maximum of the selected ISA level */
    const uint8_t *x;
    uint8_t *y;
    ptrdiff_t planes, H, W, OH, OW, kh, kw, sh, sw, dh, dw, pt, pl;
    ptrdiff_t pitch;        /* scratch row length: >= the padded row, a multiple of sw */
    ptrdiff_t block;        /* output rows per scratch block */
    ptrdiff_t tail;         /* phase elements read past a block's last row: (kw - 1) * dw / sw + 1 */
    ptrdiff_t per_task;     /* planes per task */
    int global;             /* every window is the whole plane */
    uint8_t bias;           /* 0x80 for int8, 0 for uint8 */
    int failed;             /* a task could not allocate its scratch */
} mp_ctx;

static void copy_biased(uint8_t *restrict dst, const uint8_t *restrict src, ptrdiff_t n, uint8_t bias) {
    for (ptrdiff_t i = 0; i < n; i++) dst[i] = (uint8_t)(src[i] ^ bias);
}

/* the maximum of n biased bytes (0 for n == 0) */
static uint8_t reduce_max(const uint8_t *v, ptrdiff_t n, uint8_t bias) {
    ptrdiff_t i;
    uint8_t m = ql_vec_reduce_max_biased(v, n, bias, &i);
    for (; i < n; i++) {
        uint8_t b = (uint8_t)(v[i] ^ bias);
        m = m > b ? m : b;
    }
    return m;
}

/* even[j] = row[2j], odd[j] = row[2j + 1] for j < n */
static void deinterleave2(const uint8_t *row, ptrdiff_t n, uint8_t *even, uint8_t *odd) {
    ptrdiff_t j = ql_vec_deinterleave2(row, n, even, odd);
    for (; j < n; j++) {
        even[j] = row[2 * j];
        odd[j] = row[2 * j + 1];
    }
}

static void mp_task(void *vctx, ptrdiff_t t, int thread) {
    (void)thread;
    mp_ctx *c = (mp_ctx *)vctx;
    ptrdiff_t p0 = t * c->per_task, p1 = p0 + c->per_task < c->planes ? p0 + c->per_task : c->planes;
    const ptrdiff_t W = c->W, OW = c->OW, sw = c->sw, pitch = c->pitch, P = pitch / sw;
    if (c->global) {
        for (ptrdiff_t p = p0; p < p1; p++)
            c->y[p] = (uint8_t)(reduce_max(c->x + p * c->H * W, c->H * W, c->bias) ^ c->bias);
        return;
    }
    /* scratch: the block's padded rows (block * pitch; the padding columns stay 0, the
     * minimum), their phases (each block * P + tail long: the taps read past the last row),
     * the block's results (block * P) */
    const ptrdiff_t rows_len = c->block * pitch, phase_len = c->block * P + c->tail;
    uint8_t *buf = malloc((size_t)(rows_len + sw * phase_len + c->block * P));
    const uint8_t **srcs = malloc(sizeof *srcs * (size_t)(c->kh > c->kw ? c->kh : c->kw));
    if (!buf || !srcs) {
        free(buf);
        free(srcs);
        c->failed = 1;
        return;
    }
    uint8_t *hp = buf, *ph = hp + rows_len, *acc = ph + sw * phase_len;
    memset(hp, 0, (size_t)(rows_len + sw * phase_len));
    for (ptrdiff_t p = p0; p < p1; p++) {
        const uint8_t *plane = c->x + p * c->H * W;
        for (ptrdiff_t o0 = 0; o0 < c->OH; o0 += c->block) {
            ptrdiff_t nb = c->OH - o0 < c->block ? c->OH - o0 : c->block;
            /* rows: each output row's window rows inside the plane, reduced into its padded row */
            for (ptrdiff_t b = 0; b < nb; b++) {
                uint8_t *row = hp + b * pitch + c->pl;
                ptrdiff_t m = 0;
                for (ptrdiff_t ky = 0; ky < c->kh; ky++) {
                    ptrdiff_t iy = (o0 + b) * c->sh - c->pt + ky * c->dh;
                    if (iy >= 0 && iy < c->H) srcs[m++] = plane + iy * W;
                }
                if (m) c->k->maxrows(row, srcs, m, W, c->bias);
                else memset(row, 0, (size_t)W);  /* no row inside: the minimum */
            }
            /* columns: phases of the rows laid end to end, then one maximum per tap */
            const uint8_t *phase0 = hp;
            ptrdiff_t stride = phase_len;
            if (sw == 1) {
                stride = 0;
            } else if (sw == 2) {
                deinterleave2(hp, nb * P, ph, ph + phase_len);
                phase0 = ph;
            } else {
                for (ptrdiff_t j = 0; j < nb * P; j++)
                    for (ptrdiff_t r = 0; r < sw; r++) ph[r * phase_len + j] = hp[j * sw + r];
                phase0 = ph;
            }
            for (ptrdiff_t kx = 0; kx < c->kw; kx++) {
                ptrdiff_t tap = kx * c->dw;
                srcs[kx] = phase0 + (tap % sw) * stride + tap / sw;
            }
            c->k->maxrows(acc, srcs, c->kw, nb * P, 0);
            uint8_t *out = c->y + (p * c->OH + o0) * OW;
            for (ptrdiff_t b = 0; b < nb; b++) {
                if (c->bias) copy_biased(out + b * OW, acc + b * P, OW, c->bias);
                else memcpy(out + b * OW, acc + b * P, (size_t)OW);
            }
        }
    }
    free(buf);
    free(srcs);
}

int ql_maxpool2d_u8(const uint8_t *x, uint8_t *y, ptrdiff_t planes, ptrdiff_t H, ptrdiff_t W, ptrdiff_t OH,
                    ptrdiff_t OW, ptrdiff_t kh, ptrdiff_t kw, ptrdiff_t sh, ptrdiff_t sw, ptrdiff_t dh,
                    ptrdiff_t dw, ptrdiff_t pt, ptrdiff_t pl, int is_signed, const ql_ew_kernels *k,
                    int threads) {
    if (planes <= 0 || OH <= 0 || OW <= 0) return 0;
    mp_ctx c = {k, x, y, planes, H, W, OH, OW, kh, kw, sh, sw, dh, dw, pt, pl, 0, 0, 0, 0, 0,
                (uint8_t)(is_signed ? 0x80 : 0), 0};
    /* one window over the whole plane, nothing else: a reduction (W, H >= 1: else no tap) */
    c.global = OH == 1 && OW == 1 && pt == 0 && pl == 0 && dh == 1 && dw == 1 && kh >= H && kw >= W &&
               H > 0 && W > 0;
    /* a padded row spans every column its windows touch, (OW - 1) * sw + (kw - 1) * dw + 1,
     * and the copied row, pl + W; with sw == 1 the taps read up to `tail` past it */
    ptrdiff_t span = (OW - 1) * sw + (kw - 1) * dw + 1;
    if (span < c.pl + W) span = c.pl + W;
    c.pitch = (span + sw - 1) / sw * sw;
    c.tail = (kw - 1) * dw / sw + 1;
    /* blocks of about 16 KiB of rows */
    c.block = c.pitch >= (1 << 14) ? 1 : (1 << 14) / c.pitch;
    if (c.block > OH) c.block = OH;
    ptrdiff_t work = H * W + OH * c.pitch;
    /* tasks of about 64 KiB of work, at least one plane each */
    c.per_task = work >= (1 << 16) ? 1 : (1 << 16) / (work > 0 ? work : 1);
    ptrdiff_t tasks = (planes + c.per_task - 1) / c.per_task;
    /* threads from 256 KiB of work on (below, about 40 us on one core: a hand-off to a core
     * that is busy elsewhere costs more than it saves) */
    if ((double)planes * work < (double)(1 << 18)) threads = 1;
    ql_parallel_for(tasks, tasks > 1 ? threads : 1, mp_task, &c);
    return c.failed ? -1 : 0;
}
