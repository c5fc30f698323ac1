/* Transformer float bindings (transformer/transformer.c): gelu, fast_gelu, skip_layer_norm.
 * C-contiguous buffers: tensors float32, parameters (bias, gamma, beta) float64 (the Python
 * path's widened copies); sizes checked against the geometry given. */
#include "args.h"
#include "transformer.h"

/* gelu(x float32[n], n, y float32[n]) */
static PyObject *m_gelu(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *ox, *oy;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "OnO", &ox, &n, &oy)) return NULL;
    if (n < 0 || n > PY_SSIZE_T_MAX / 4) return PyErr_Format(PyExc_ValueError, "qlinear native: bad gelu size");
    Py_buffer x = {0}, y = {0};
    PyObject *ret = NULL;
    if (get_buf(ox, &x, 0, n * 4, "x") < 0 || get_buf(oy, &y, 1, n * 4, "y") < 0) goto done;
    Py_BEGIN_ALLOW_THREADS
    ql_gelu_f32((const float *)x.buf, n, (float *)y.buf);
    Py_END_ALLOW_THREADS
    ret = Py_None;
    Py_INCREF(ret);
done:
    REL(x); REL(y);
    return ret;
}

/* fast_gelu(x float32[rows·last], bias float64[last] or None, rows, last, y float32[rows·last]) */
static PyObject *m_fast_gelu(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *ox, *ob, *oy;
    Py_ssize_t rows, last;
    if (!PyArg_ParseTuple(args, "OOnnO", &ox, &ob, &rows, &last, &oy)) return NULL;
    if (rows < 0 || last < 1 || rows > PY_SSIZE_T_MAX / 4 / last)
        return PyErr_Format(PyExc_ValueError, "qlinear native: bad fast_gelu geometry");
    Py_ssize_t n = rows * last;
    Py_buffer x = {0}, b = {0}, y = {0};
    PyObject *ret = NULL;
    if (get_buf(ox, &x, 0, n * 4, "x") < 0 || get_buf(oy, &y, 1, n * 4, "y") < 0) goto done;
    if (ob != Py_None && get_buf(ob, &b, 0, last * 8, "bias") < 0) goto done;
    Py_BEGIN_ALLOW_THREADS
    ql_fast_gelu_f32((const float *)x.buf, ob != Py_None ? (const double *)b.buf : NULL, rows, last, (float *)y.buf);
    Py_END_ALLOW_THREADS
    ret = Py_None;
    Py_INCREF(ret);
done:
    REL(x); REL(b); REL(y);
    return ret;
}

/* skip_layer_norm(x, skip [rows·hidden] float32, gamma [hidden], beta or None, bias or None
 * (float64), rows, hidden, epsilon, y [rows·hidden], mean [rows], inv_std [rows],
 * sum [rows·hidden] (float32)) */
static PyObject *m_skip_layer_norm(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *ox, *os, *og, *obeta, *obias, *oy, *om, *oi, *osum;
    Py_ssize_t rows, hidden;
    double eps;
    if (!PyArg_ParseTuple(args, "OOOOOnndOOOO", &ox, &os, &og, &obeta, &obias, &rows, &hidden, &eps, &oy, &om,
                          &oi, &osum))
        return NULL;
    /* rows · hidden · 8 (the work rows' bound, too) must not overflow */
    if (rows < 0 || hidden < 1 || rows > PY_SSIZE_T_MAX / 8 / hidden)
        return PyErr_Format(PyExc_ValueError, "qlinear native: bad skip_layer_norm geometry");
    Py_ssize_t n = rows * hidden;
    Py_buffer x = {0}, s = {0}, g = {0}, be = {0}, bi = {0}, y = {0}, m = {0}, iv = {0}, su = {0};
    PyObject *ret = NULL;
    int ok = 0;
    if (get_buf(ox, &x, 0, n * 4, "input") < 0 || get_buf(os, &s, 0, n * 4, "skip") < 0 ||
        get_buf(og, &g, 0, hidden * 8, "gamma") < 0 || get_buf(oy, &y, 1, n * 4, "y") < 0 ||
        get_buf(om, &m, 1, rows * 4, "mean") < 0 || get_buf(oi, &iv, 1, rows * 4, "inv_std") < 0 ||
        get_buf(osum, &su, 1, n * 4, "sum") < 0)
        goto done;
    if (obeta != Py_None && get_buf(obeta, &be, 0, hidden * 8, "beta") < 0) goto done;
    if (obias != Py_None && get_buf(obias, &bi, 0, hidden * 8, "bias") < 0) goto done;
    Py_BEGIN_ALLOW_THREADS
    ok = ql_skip_layer_norm_f32((const float *)x.buf, (const float *)s.buf, (const double *)g.buf,
                                obeta != Py_None ? (const double *)be.buf : NULL,
                                obias != Py_None ? (const double *)bi.buf : NULL, rows, hidden, eps, (float *)y.buf,
                                (float *)m.buf, (float *)iv.buf, (float *)su.buf);
    Py_END_ALLOW_THREADS
    if (!ok) {
        PyErr_NoMemory();
        goto done;
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    REL(x); REL(s); REL(g); REL(be); REL(bi); REL(y); REL(m); REL(iv); REL(su);
    return ret;
}

PyMethodDef ql_bind_transformer_methods[] = {
    {"gelu", m_gelu, METH_VARARGS, "com.microsoft Gelu in float64, rounded once (float32 in and out)"},
    {"fast_gelu", m_fast_gelu, METH_VARARGS, "com.microsoft FastGelu (with its bias) in float64, rounded once"},
    {"skip_layer_norm", m_skip_layer_norm, METH_VARARGS,
     "com.microsoft SkipLayerNormalization in float64 with NumPy's pairwise row sums"},
    {NULL, NULL, 0, NULL}};
