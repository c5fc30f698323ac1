/* QuantizeLinear / DequantizeLinear over a tensor seen as (pre, C, post) on the thread pool, the
 * level's kernels on contiguous runs (parameters per C, or one pair), and DynamicQuantizeLinear's
 * usual case (its min/max scan, parameters and quantization in one call). The bindings
 * (python/bind_elementwise.c) check the buffers and release the GIL around these. */
#include "qlinear.h"

#include <math.h>
#include "isa/x86_sse2.h"

typedef struct {
    const ql_isa *isa; int quant;
    const char *x; int x_type; size_t xes;
    char *out; int out_type; size_t oes;
    ptrdiff_t pre, C, post, chunk;   /* tasks: chunks of `chunk` elements of one (pre, c) run */
    ptrdiff_t runs_per_row;
    const float *scale; const int32_t *zp; int per_axis;
    int stream;                       /* dequantize: non-temporal stores (huge outputs) */
} qd_ctx;

static void qd_task(void *vctx, ptrdiff_t t, int thread) {
    (void)thread;
    qd_ctx *q = (qd_ctx *)vctx;
    ptrdiff_t run_len, start, pc = 0;
    const float *s; const int32_t *z; ptrdiff_t ss = 0;
    if (q->per_axis && q->post == 1) {
        /* axis last: runs of C elements with per-element parameters */
        ptrdiff_t row = t / q->runs_per_row, part = t % q->runs_per_row;
        start = row * q->C + part * q->chunk;
        run_len = q->C - part * q->chunk < q->chunk ? q->C - part * q->chunk : q->chunk;
        s = q->scale + part * q->chunk; z = q->zp + part * q->chunk; ss = 1;
    } else if (q->per_axis) {
        ptrdiff_t row = t / q->runs_per_row, part = t % q->runs_per_row;  /* row = pre*C + c */
        pc = row % q->C;
        start = row * q->post + part * q->chunk;
        run_len = q->post - part * q->chunk < q->chunk ? q->post - part * q->chunk : q->chunk;
        s = q->scale + pc; z = q->zp + pc;
    } else {
        ptrdiff_t total = q->pre * q->C * q->post;
        start = t * q->chunk;
        run_len = total - start < q->chunk ? total - start : q->chunk;
        s = q->scale; z = q->zp;
    }
    if (q->quant)
        q->isa->quantize(q->x + start * q->xes, q->x_type, run_len, s, ss, z, ss,
                         q->out + start * q->oes, q->out_type);
    else
        q->isa->dequantize(q->x + start * q->xes, q->x_type, run_len, s, ss, z, ss,
                           (float *)(q->out + start * q->oes), q->stream);
}

/* Quantize/Dequantize tasks: runs of QD_CHUNK elements; threads from QD_PAR_MIN elements on
 * (below, about 30 us on one core: not worth waking the pool) */
#define QD_CHUNK ((ptrdiff_t)1 << 14)
static int qd_threads(ptrdiff_t n) { return n >= ((ptrdiff_t)1 << 18) ? ql_num_threads() : 1; }

void ql_quantize_tensor(const ql_isa *isa, int quant, const void *x, int x_type, void *out, int out_type,
                        ptrdiff_t pre, ptrdiff_t C, ptrdiff_t post, int per_axis, const float *scale,
                        const int32_t *zp)
{
    size_t xes = (x_type == QL_U8 || x_type == QL_I8) ? 1 : 4, oes = quant ? 1 : 4;
    ptrdiff_t n = pre * C * post, np = per_axis ? C : 1;
    if (n <= 0) return;
    qd_ctx q = {isa, quant, (const char *)x, x_type, xes, (char *)out, out_type, oes,
                pre, C, post, 0, 1, scale, zp, per_axis && np > 1,
                /* an output of 16 MiB or more does not stay in the caches anyway: stream it */
                !quant && n * (ptrdiff_t)oes >= ((ptrdiff_t)16 << 20)};
    ptrdiff_t tasks;
    const ptrdiff_t chunk = QD_CHUNK;
    int threads = qd_threads(n);
    if (q.per_axis) {
        ptrdiff_t len = post == 1 ? C : post;
        q.chunk = len < chunk ? len : chunk;
        q.runs_per_row = (len + q.chunk - 1) / q.chunk;
        tasks = (post == 1 ? pre : pre * C) * q.runs_per_row;
    } else {
        q.chunk = chunk;
        tasks = (n + chunk - 1) / chunk;
    }
    ql_parallel_for(tasks, threads, qd_task, &q);
}

/* DynamicQuantizeLinear's usual case (the binding's comment, python/bind_elementwise.c, has the
 * formulas): 1 with out, *scale_out and *zp_out written, or 0 (nothing written) where the
 * Python path takes its guarded branch. x: n >= 1 float32. */
int ql_dynamic_quantize(const ql_isa *isa, const float *xs, ptrdiff_t n, uint8_t *out, float *scale_out,
                        int32_t *zp_out)
{
    float lo = xs[0], hi = xs[0];
    int nan = 0;
    ptrdiff_t i = ql_vec_minmax_f32(xs, n, &lo, &hi, &nan);
    for (; i < n; i++) {
        float v = xs[i];
        nan |= v != v;
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    const float zero = 0.0f;
    float mn = zero < lo ? zero : lo, mx = zero > hi ? zero : hi;
    if (nan || !(-1e37 < (double)lo && (double)hi < 1e37 && (mx == mn || mx - mn > 1e-30f))) return 0;
    float scale = mx == mn ? 1.0f : (mx - mn) / 255.0f;
    float initial = zero - mn / scale;
    /* initial is finite here (|mn / scale| <= 255-ish); round half to even, as Python's round */
    float clamped = initial < zero ? zero : (initial > 255.0f ? 255.0f : initial);
    int32_t zp = (int32_t)nearbyintf(clamped);
    qd_ctx q = {isa, 1, (const char *)xs, QL_F32, 4, (char *)out, QL_U8, 1, 1, 1, n, QD_CHUNK, 1,
                &scale, &zp, 0, 0};
    ptrdiff_t tasks = (n + q.chunk - 1) / q.chunk;
    int threads = qd_threads(n);
    ql_parallel_for(tasks, threads, qd_task, &q);
    *scale_out = scale;
    *zp_out = zp;
    return 1;
}
