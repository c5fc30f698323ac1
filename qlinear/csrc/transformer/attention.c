/* The attention of com.microsoft Attention and QAttention after their Q/K/V projection, and
 * QAttention's projection scaling: the float64 formulas of qlinear/contrib/transformer.py
 * (_attention_core, _qkv) in one portable file.
 *
 * Why float64 and not onnxruntime's bits: onnxruntime multiplies q·kᵀ and probs·v with MLAS
 * SGEMM (blocking and the order of its sums depend on the instruction set and the shape) and
 * exponentiates with MLAS's vectorized exp, so there is no fixed float32 pattern to reproduce;
 * the float64 formula rounded once to float32 is within the documented tolerance of it
 * (docs/contract.md). The NumPy path multiplies with BLAS dgemm, whose order of sums is not
 * fixed either, so this file is not bit-identical to it; it is the same formula with a fixed
 * order (plain ascending sums for the products, NumPy's pairwise sum for the softmax's
 * denominator), within one float32 rounding of it. What is exact: QAttention's projection
 * f(f(acc) · m_j) + bias_j (float32 operations, as NumPy's, -ffp-contract=off) and `present`
 * (copies of past and of the projection's k and v).
 *
 * Heads are independent tasks and nothing here is ISA-specific, so the bits depend neither on
 * the ISA level nor on the thread count. */
#include "qlinear.h"
#include "transformer.h"

#include <math.h>
#include <stdlib.h>

/* Multiply-adds of q·kᵀ and probs·v below which the heads run on the calling thread (a
 * GPT-2 decoding step's heads take about a microsecond each; a join costs as much). */
#define QL_ATT_PARALLEL_MIN 65536

typedef struct {
    const double *qkv;
    const float *past;
    const int32_t *mask;
    ptrdiff_t batch, seq, heads, head, past_len, mask_kind;
    int unidirectional;
    double scale, filter;
    float *out, *present;
    double *work; /* `total` doubles per thread */
} att_ctx;

/* keep key j of query i of batch row b (the mask's condition; `kind` as ql_attention_f64) */
static int mask_keeps(const att_ctx *c, ptrdiff_t b, ptrdiff_t i, ptrdiff_t j, ptrdiff_t total) {
    switch (c->mask_kind) {
    case QL_ATT_MASK_2D: return c->mask[b * total + j] > 0;
    case QL_ATT_MASK_3D: return c->mask[(b * c->seq + i) * total + j] > 0;
    case QL_ATT_MASK_END: return j < c->mask[b];
    default: return j < c->mask[b] && j >= c->mask[c->batch + b]; /* QL_ATT_MASK_END_START */
    }
}

static void att_task(void *vctx, ptrdiff_t t, int thread) {
    const att_ctx *c = (const att_ctx *)vctx;
    ptrdiff_t b = t / c->heads, n = t % c->heads, h = c->head, S = c->seq, P = c->past_len, total = P + S;
    ptrdiff_t hidden = c->heads * h, row = 3 * hidden;
    double *s = c->work + (ptrdiff_t)thread * total;
    const double *q0 = c->qkv + b * S * row + n * h;
    const double *k0 = q0 + hidden, *v0 = q0 + 2 * hidden;
    const float *pk = c->past ? c->past + ((b * c->heads + n) * P) * h : NULL;
    const float *pv = c->past ? pk + c->batch * c->heads * P * h : NULL;
    /* present (2, B, N, total, h): past first, then this step's k and v rounded to float32
     * (exact: a QAttention's k and v are float32 values; an Attention's are rounded here, as
     * the NumPy path's astype rounds them) */
    if (c->present) {
        float *ok = c->present + ((b * c->heads + n) * total) * h;
        float *ov = ok + c->batch * c->heads * total * h;
        for (ptrdiff_t j = 0; j < P * h; j++) {
            ok[j] = pk[j];
            ov[j] = pv[j];
        }
        for (ptrdiff_t j = 0; j < S; j++)
            for (ptrdiff_t d = 0; d < h; d++) {
                ok[(P + j) * h + d] = (float)k0[j * row + d];
                ov[(P + j) * h + d] = (float)v0[j * row + d];
            }
    }
    for (ptrdiff_t i = 0; i < S; i++) {
        const double *q = q0 + i * row;
        for (ptrdiff_t j = 0; j < total; j++) {
            double acc = 0.0;
            if (j < P) {
                const float *k = pk + j * h;
                for (ptrdiff_t d = 0; d < h; d++) acc += q[d] * (double)k[d];
            } else {
                const double *k = k0 + (j - P) * row;
                for (ptrdiff_t d = 0; d < h; d++) acc += q[d] * k[d];
            }
            double v = acc * c->scale;
            /* the NumPy path's additions, in its order: the mask's 0 or filter, then the
             * causal mask's (0 + 0 turns a -0 score into +0 there too) */
            if (c->mask_kind != QL_ATT_MASK_NONE) v += mask_keeps(c, b, i, j, total) ? 0.0 : c->filter;
            if (c->unidirectional) v += j > P + i ? c->filter : 0.0;
            s[j] = v;
        }
        float *out = c->out + (b * S + i) * hidden + n * h;
        if (total == 0) {
            for (ptrdiff_t d = 0; d < h; d++) out[d] = 0.0f;
            continue;
        }
        /* np.maximum.reduce: NaN wins */
        double mx = s[0];
        for (ptrdiff_t j = 1; j < total && mx == mx; j++)
            if (s[j] != s[j] || s[j] > mx) mx = s[j];
        for (ptrdiff_t j = 0; j < total; j++) s[j] = exp(s[j] - mx);
        double sum = ql_tf_row_sum(s, total);
        for (ptrdiff_t j = 0; j < total; j++) s[j] = s[j] / sum;
        for (ptrdiff_t d = 0; d < h; d++) {
            double acc = 0.0;
            for (ptrdiff_t j = 0; j < P; j++) acc += s[j] * (double)pv[j * h + d];
            for (ptrdiff_t j = 0; j < S; j++) acc += s[P + j] * v0[j * row + d];
            out[d] = (float)acc;
        }
    }
}

int ql_attention_f64(const double *qkv, ptrdiff_t batch, ptrdiff_t seq, ptrdiff_t heads, ptrdiff_t head,
                     const float *past, ptrdiff_t past_len, const int32_t *mask, int mask_kind, int unidirectional,
                     double scale, double mask_filter_value, float *out, float *present) {
    ptrdiff_t tasks = batch * heads, total = past_len + seq;
    if (tasks <= 0 || seq <= 0) return 1;
    double work_size = (double)tasks * (double)seq * (double)total * (double)head * 2.0;
    int threads = work_size >= QL_ATT_PARALLEL_MIN && tasks > 1 ? ql_num_threads() : 1;
    if (threads < 1) threads = 1;
    /* the caller (bind_attention.c) bounds batch · heads · seq · total · 8 */
    double *work = (double *)malloc(sizeof(double) * ((size_t)total + 1) * (size_t)threads);
    if (!work) return 0;
    att_ctx c = {qkv, past, mask, batch, seq, heads, head, past_len, mask_kind, unidirectional,
                 scale, mask_filter_value, out, present, work};
    if (threads == 1)
        for (ptrdiff_t t = 0; t < tasks; t++) att_task(&c, t, 0);
    else
        ql_parallel_for(tasks, threads, att_task, &c);
    free(work);
    return 1;
}

void ql_qattention_qkv(const int32_t *acc, ptrdiff_t rows, ptrdiff_t cols, const float *weight_scale,
                       int per_column, float input_scale, const float *bias, double *qkv) {
    for (ptrdiff_t r = 0; r < rows; r++) {
        const int32_t *a = acc + r * cols;
        double *o = qkv + r * cols;
        for (ptrdiff_t j = 0; j < cols; j++) {
            /* f(f(acc) · f(ws_j · sx)) + bias_j: float32 operations, as NumPy's (overflow gives
             * ±inf there too) */
            float m = weight_scale[per_column ? j : 0] * input_scale;
            float y = (float)a[j] * m;
            o[j] = (double)(y + bias[j]);
        }
    }
}
