/* Attention, QAttention and EmbedLayerNormalization bindings (transformer/attention.c,
 * transformer/embed.c). qlinear/contrib/transformer.py validates shapes, dtypes and
 * attributes; here every buffer's size is checked again against the geometry given, and
 * products of dimensions are bounded before any is formed. */
#include "args.h"
#include "transformer.h"

/* each dimension >= 0 (the first `positive` >= 1) and their product (times `unit`) below 2^50 */
static int dims_ok(const Py_ssize_t *d, int count, int positive, double unit) {
    double prod = unit;
    for (int i = 0; i < count; i++) {
        if (d[i] < (i < positive ? 1 : 0)) return 0;
        prod *= (double)d[i];
    }
    return prod < 1125899906842624.0;
}

typedef struct {
    Py_ssize_t batch, seq, heads, head, past_len;
    int mask_kind, unidirectional;
    double scale, filter;
    Py_buffer past, mask, out, present;
} att_args;

/* the buffers of an attention call, checked against its geometry; -1 with an exception set */
static int att_buffers(att_args *a, PyObject *opast, PyObject *omask, PyObject *oout, PyObject *opresent) {
    Py_ssize_t d[5] = {a->batch, a->seq, a->heads, a->head, a->past_len + a->seq};
    if (!dims_ok(d, 5, 4, 8.0) || a->past_len < 0 || a->mask_kind < QL_ATT_MASK_NONE ||
        a->mask_kind > QL_ATT_MASK_END_START || (a->mask_kind == QL_ATT_MASK_NONE) != (omask == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "qlinear native: bad attention geometry");
        return -1;
    }
    Py_ssize_t B = a->batch, S = a->seq, N = a->heads, h = a->head, T = a->past_len + S;
    Py_ssize_t mask_n[] = {0, B * T, B * S * T, B, 2 * B};
    if (get_buf(oout, &a->out, 1, B * S * N * h * 4, "out") < 0) return -1;
    if (opresent != Py_None && get_buf(opresent, &a->present, 1, 2 * B * N * T * h * 4, "present") < 0) return -1;
    if (opast != Py_None && get_buf(opast, &a->past, 0, 2 * B * N * a->past_len * h * 4, "past") < 0) return -1;
    if (opast == Py_None && a->past_len) {
        PyErr_SetString(PyExc_ValueError, "qlinear native: attention past_len without past");
        return -1;
    }
    if (omask != Py_None && get_buf(omask, &a->mask, 0, mask_n[a->mask_kind] * 4, "mask") < 0) return -1;
    return 0;
}

static int att_run(att_args *a, const double *qkv) {
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = ql_attention_f64(qkv, a->batch, a->seq, a->heads, a->head, a->past.obj ? (const float *)a->past.buf : NULL,
                          a->past_len, a->mask.obj ? (const int32_t *)a->mask.buf : NULL, a->mask_kind,
                          a->unidirectional, a->scale, a->filter, (float *)a->out.buf,
                          a->present.obj ? (float *)a->present.buf : NULL);
    Py_END_ALLOW_THREADS
    return ok;
}

static void att_release(att_args *a) {
    REL(a->past); REL(a->mask); REL(a->out); REL(a->present);
}

/* attention(qkv float64 [B·S·3·N·h], B, S, N, h, past float32 or None, past_len, mask int32 or
 * None, mask_kind, unidirectional, scale, mask_filter_value, out float32 [B·S·N·h], present
 * float32 [2·B·N·(past_len+S)·h] or None) */
static PyObject *m_attention(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *oqkv, *opast, *omask, *oout, *opresent;
    att_args a = {0};
    if (!PyArg_ParseTuple(args, "OnnnnOnOipddOO", &oqkv, &a.batch, &a.seq, &a.heads, &a.head, &opast, &a.past_len,
                          &omask, &a.mask_kind, &a.unidirectional, &a.scale, &a.filter, &oout, &opresent))
        return NULL;
    Py_buffer qkv = {0};
    PyObject *ret = NULL;
    if (att_buffers(&a, opast, omask, oout, opresent) < 0) goto done;
    if (get_buf(oqkv, &qkv, 0, a.batch * a.seq * 3 * a.heads * a.head * 8, "qkv") < 0) goto done;
    if (!att_run(&a, (const double *)qkv.buf)) {
        PyErr_NoMemory();
        goto done;
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    REL(qkv);
    att_release(&a);
    return ret;
}

/* qattention(acc int32 [B·S·3·N·h], weight_scale float32 [1 or 3·N·h], per_column, input_scale,
 * bias float32 [3·N·h], then attention's arguments from B on) */
static PyObject *m_qattention(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *oacc, *ows, *obias, *opast, *omask, *oout, *opresent;
    int per_column;
    float sx;
    att_args a = {0};
    if (!PyArg_ParseTuple(args, "OOpfOnnnnOnOipddOO", &oacc, &ows, &per_column, &sx, &obias, &a.batch, &a.seq,
                          &a.heads, &a.head, &opast, &a.past_len, &omask, &a.mask_kind, &a.unidirectional, &a.scale,
                          &a.filter, &oout, &opresent))
        return NULL;
    Py_buffer acc = {0}, ws = {0}, bias = {0};
    PyObject *ret = NULL;
    double *qkv = NULL;
    if (att_buffers(&a, opast, omask, oout, opresent) < 0) goto done;
    Py_ssize_t rows = a.batch * a.seq, cols = 3 * a.heads * a.head;
    if (get_buf(oacc, &acc, 0, rows * cols * 4, "acc") < 0 || get_buf(ows, &ws, 0, (per_column ? cols : 1) * 4,
                                                                      "weight_scale") < 0 ||
        get_buf(obias, &bias, 0, cols * 4, "bias") < 0)
        goto done;
    qkv = (double *)malloc(sizeof(double) * (size_t)(rows * cols > 0 ? rows * cols : 1));
    if (!qkv) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    ql_qattention_qkv((const int32_t *)acc.buf, rows, cols, (const float *)ws.buf, per_column, sx,
                      (const float *)bias.buf, qkv);
    Py_END_ALLOW_THREADS
    if (!att_run(&a, qkv)) {
        PyErr_NoMemory();
        goto done;
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    free(qkv);
    REL(acc); REL(ws); REL(bias);
    att_release(&a);
    return ret;
}

/* embed_layer_norm(ids int32 [B·S], pos (int64 or int32 [B·S]) or None, pos64, seg int32 [B·S] or
 * None, B, S, word float32 [word_rows·H], word_rows, position [position_rows·H], position_rows,
 * segment [segment_rows·H] or None, segment_rows, H, gamma float64 [H], beta float64 [H] or None,
 * epsilon, y float32 [B·S·H], sum float32 [B·S·H]) -> 1 done, -1/-2/-3 ids/pos/seg index out of
 * its table */
static PyObject *m_embed_layer_norm(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *oids, *opos, *oseg, *oword, *oposition, *osegment, *og, *obeta, *oy, *osum;
    int pos64;
    Py_ssize_t B, S, word_rows, position_rows, segment_rows, H;
    double eps;
    if (!PyArg_ParseTuple(args, "OOpOnnOnOnOnnOOdOO", &oids, &opos, &pos64, &oseg, &B, &S, &oword, &word_rows,
                          &oposition, &position_rows, &osegment, &segment_rows, &H, &og, &obeta, &eps, &oy, &osum))
        return NULL;
    Py_ssize_t d1[3] = {B, S, H}, dw[2] = {word_rows, H}, dp[2] = {position_rows, H}, ds[2] = {segment_rows, H};
    if (!dims_ok(d1, 3, 0, 8.0) || H < 1 || !dims_ok(dw, 2, 0, 4.0) || !dims_ok(dp, 2, 0, 4.0) ||
        !dims_ok(ds, 2, 0, 4.0))
        return PyErr_Format(PyExc_ValueError, "qlinear native: bad embed_layer_norm geometry");
    Py_ssize_t rows = B * S;
    Py_buffer ids = {0}, pos = {0}, seg = {0}, word = {0}, position = {0}, segment = {0}, g = {0}, be = {0}, y = {0},
              su = {0};
    PyObject *ret = NULL;
    int got = 0;
    if (get_buf(oids, &ids, 0, rows * 4, "ids") < 0 || get_buf(oword, &word, 0, word_rows * H * 4, "word") < 0 ||
        get_buf(oposition, &position, 0, position_rows * H * 4, "position") < 0 ||
        get_buf(og, &g, 0, H * 8, "gamma") < 0 || get_buf(oy, &y, 1, rows * H * 4, "y") < 0 ||
        get_buf(osum, &su, 1, rows * H * 4, "sum") < 0)
        goto done;
    if (opos != Py_None && get_buf(opos, &pos, 0, rows * (pos64 ? 8 : 4), "pos") < 0) goto done;
    if (oseg != Py_None && get_buf(oseg, &seg, 0, rows * 4, "seg") < 0) goto done;
    if (oseg != Py_None && get_buf(osegment, &segment, 0, segment_rows * H * 4, "segment") < 0) goto done;
    if (obeta != Py_None && get_buf(obeta, &be, 0, H * 8, "beta") < 0) goto done;
    Py_BEGIN_ALLOW_THREADS
    got = ql_embed_layer_norm_f32((const int32_t *)ids.buf, pos.obj ? pos.buf : NULL, pos64,
                                  seg.obj ? (const int32_t *)seg.buf : NULL, B, S, (const float *)word.buf, word_rows,
                                  (const float *)position.buf, position_rows,
                                  segment.obj ? (const float *)segment.buf : NULL, segment_rows, H,
                                  (const double *)g.buf, be.obj ? (const double *)be.buf : NULL, eps, (float *)y.buf,
                                  (float *)su.buf);
    Py_END_ALLOW_THREADS
    if (!got) {
        PyErr_NoMemory();
        goto done;
    }
    ret = PyLong_FromLong(got);
done:
    REL(ids); REL(pos); REL(seg); REL(word); REL(position); REL(segment); REL(g); REL(be); REL(y); REL(su);
    return ret;
}

PyMethodDef ql_bind_attention_methods[] = {
    {"attention", m_attention, METH_VARARGS, "multi-head attention of a float64 Q/K/V projection (float64 inside)"},
    {"qattention", m_qattention, METH_VARARGS,
     "QAttention's scaled projection from its int32 accumulators, then the attention"},
    {"embed_layer_norm", m_embed_layer_norm, METH_VARARGS,
     "com.microsoft EmbedLayerNormalization in float64 with NumPy's pairwise row sums"},
    {NULL, NULL, 0, NULL}};
