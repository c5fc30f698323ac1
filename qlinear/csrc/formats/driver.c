/* The newer formats' QuantizeLinear / DequantizeLinear over a whole tensor on the thread pool
 * (include/formats.h): the tensor is cut into contiguous runs over which the parameters are
 * either one value or one per element, and the runs into tasks of about QF_CHUNK elements.
 *
 * - P2 = post > 1 (per axis or blocked, with elements after the axis): row (p, k) of `post`
 *   elements uses the parameter row (p|0, k / B, :), one per element;
 * - P2 = 1: block (p, j) -- the elements k in [jB, min((j+1)B, D)), all of their `post` -- is one
 *   contiguous run with one parameter (per tensor: one block of everything).
 * The parameters are read where they are: nothing the size of the tensor is allocated. */
#include "formats.h"

#define QF_CHUNK ((ptrdiff_t)1 << 15)

size_t ql_fmt_size(int type) {
    switch (type) {
    case QF_F32: case QF_I32: return 4;
    case QF_F16: case QF_BF16: case QF_U16: case QF_I16: return 2;
    default: return 1;
    }
}

typedef struct {
    ql_fmt_run_fn fn;
    const ql_fmt_op *op;
    const char *x; char *out; size_t xes, oes;
    ptrdiff_t pre, D, post, B, P0, nb, P2;
    const float *s, *z;
    int rows;                 /* 1: units are rows of `post` (P2 = post), 0: blocks */
    ptrdiff_t units, parts, group, len;   /* len: the longest unit */
} qf_ctx;

/* unit u: its first element, length and parameter offset */
static void qf_unit(const qf_ctx *c, ptrdiff_t u, ptrdiff_t *start, ptrdiff_t *len, ptrdiff_t *poff) {
    if (c->rows) {
        ptrdiff_t p = u / c->D, k = u % c->D;
        *start = u * c->post;
        *len = c->post;
        *poff = ((c->P0 > 1 ? p : 0) * c->nb + k / c->B) * c->P2;
    } else {
        ptrdiff_t p = u / c->nb, j = u % c->nb;
        ptrdiff_t k0 = j * c->B, k1 = k0 + c->B < c->D ? k0 + c->B : c->D;
        *start = (p * c->D + k0) * c->post;
        *len = (k1 - k0) * c->post;
        *poff = (c->P0 > 1 ? p : 0) * c->nb + j;
    }
}

static void qf_piece(const qf_ctx *c, ptrdiff_t start, ptrdiff_t off, ptrdiff_t n, ptrdiff_t poff) {
    int pv = c->rows;   /* rows: one parameter per element, from the row's offset */
    const float *s = c->s + poff + (pv ? off : 0);
    const float *z = c->z ? c->z + poff + (pv ? off : 0) : NULL;
    c->fn(c->op, c->x + (start + off) * (ptrdiff_t)c->xes, n, s, pv, z, pv, c->out + (start + off) * (ptrdiff_t)c->oes);
}

static void qf_task(void *vctx, ptrdiff_t t, int thread) {
    (void)thread;
    const qf_ctx *c = (const qf_ctx *)vctx;
    ptrdiff_t start, len, poff;
    if (c->parts > 1) {   /* long units: a part of one */
        ptrdiff_t u = t / c->parts, part = t % c->parts;
        qf_unit(c, u, &start, &len, &poff);
        ptrdiff_t off = part * QF_CHUNK;
        if (off < len) qf_piece(c, start, off, len - off < QF_CHUNK ? len - off : QF_CHUNK, poff);
        return;
    }
    ptrdiff_t u1 = (t + 1) * c->group < c->units ? (t + 1) * c->group : c->units;
    for (ptrdiff_t u = t * c->group; u < u1; u++) {   /* short units: a group of them */
        qf_unit(c, u, &start, &len, &poff);
        if (len) qf_piece(c, start, 0, len, poff);
    }
}

void ql_fmt_tensor(const ql_fmt_kernels *k, int quant, const ql_fmt_op *op, const void *x, void *out,
                   ptrdiff_t pre, ptrdiff_t D, ptrdiff_t post, ptrdiff_t B, ptrdiff_t P0, ptrdiff_t nb,
                   ptrdiff_t P2, const float *s, const float *z) {
    ptrdiff_t n = pre * D * post;
    if (n <= 0) return;
    qf_ctx c = {quant ? k->quantize : k->dequantize, op, (const char *)x, (char *)out,
                ql_fmt_size(op->x_type), ql_fmt_size(op->out_type), pre, D, post, B, P0, nb, P2, s, z,
                P2 > 1, 0, 1, 1, 0};
    if (c.rows) {
        c.units = pre * D;
        c.len = post;
    } else {
        c.units = pre * nb;
        c.len = (B < D ? B : D) * post;
    }
    ptrdiff_t tasks;
    if (c.len >= QF_CHUNK) {
        c.parts = (c.len + QF_CHUNK - 1) / QF_CHUNK;
        tasks = c.units * c.parts;
    } else {
        c.group = QF_CHUNK / (c.len ? c.len : 1);
        tasks = (c.units + c.group - 1) / c.group;
    }
    /* threads from 2^17 elements on (below, waking the pool costs more than it saves) */
    int threads = n >= ((ptrdiff_t)1 << 17) ? ql_num_threads() : 1;
    ql_parallel_for(tasks, threads, qf_task, &c);
}
