/* The float32 Conv's matrix product (fconv/fgemm.c) for qlinear/graph/kernels/float.py: argument
 * and buffer-size checks, the GIL released around the product. */
#include "args.h"
#include "fconv.h"

/* *r = a * b + c for a, b, c >= 0, unless it exceeds 2^62 (then 0) */
static int fits(Py_ssize_t a, Py_ssize_t b, Py_ssize_t c, Py_ssize_t *r) {
    const Py_ssize_t lim = (Py_ssize_t)1 << 62;
    if (a && b > lim / a) return 0;
    if (a * b > lim - c) return 0;
    *r = a * b + c;
    return 1;
}

/* fgemm(w, b or None, x, y, G, N, M, K, P, ldx, xs_n, xs_g): y (N, G*M, P) = per image n and
 * group g, W_g (M x K at w + g*M*K) times the K x P matrix at x + n*xs_n + g*xs_g (rows ldx
 * apart), plus b; on the selected ISA level's kernels and the pool's threads */
static PyObject *m_fgemm(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *ow, *ob, *ox, *oy;
    Py_ssize_t g[8];
    if (!PyArg_ParseTuple(args, "OOOOnnnnnnnn", &ow, &ob, &ox, &oy, &g[0], &g[1], &g[2], &g[3], &g[4], &g[5],
                          &g[6], &g[7]))
        return NULL;
    const Py_ssize_t G = g[0], N = g[1], M = g[2], K = g[3], P = g[4], ldx = g[5], xs_n = g[6], xs_g = g[7];
    const Py_ssize_t lim = (Py_ssize_t)1 << 40;
    for (int i = 0; i < 8; i++)
        if (g[i] < 0 || g[i] > lim)
            return PyErr_Format(PyExc_ValueError, "qlinear native: fgemm geometry value %d out of range (%zd)", i, g[i]);
    if (ldx < P) return PyErr_Format(PyExc_ValueError, "qlinear native: fgemm ldx %zd < P %zd", ldx, P);
    Py_ssize_t wn, bn, yn, xn = 0, t;
    if (!fits(G, M, 0, &bn) || !fits(bn, K, 0, &wn) || !fits(N, bn, 0, &t) || !fits(t, P, 0, &yn))
        return PyErr_Format(PyExc_ValueError, "qlinear native: fgemm sizes overflow");
    if (G && N && K && P) {  /* the last element read, plus one */
        Py_ssize_t a, c;
        if (!fits(N - 1, xs_n, 0, &a) || !fits(G - 1, xs_g, a, &c) || !fits(K - 1, ldx, c + P, &xn))
            return PyErr_Format(PyExc_ValueError, "qlinear native: fgemm sizes overflow");
    }
    Py_buffer w = {0}, b = {0}, x = {0}, y = {0};
    PyObject *ret = NULL;
    if (get_buf(ow, &w, 0, wn * 4, "w") < 0 || (ob != Py_None && get_buf(ob, &b, 0, bn * 4, "b") < 0) ||
        get_buf(ox, &x, 0, xn * 4, "x") < 0 || get_buf(oy, &y, 1, yn * 4, "y") < 0)
        goto done;
    const ql_fconv_kernels *k = ql_fconv_for(current_isa);
    int threads = ql_num_threads(), rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ql_fgemm(k, (const float *)w.buf, ob != Py_None ? (const float *)b.buf : NULL, (const float *)x.buf,
                  (float *)y.buf, G, N, M, K, P, ldx, xs_n, xs_g, threads);
    Py_END_ALLOW_THREADS
    if (rc) PyErr_NoMemory();
    else { ret = Py_None; Py_INCREF(ret); }
done:
    REL(w); REL(b); REL(x); REL(y);
    return ret;
}

/* fconv_kernels(): the name of the selected level's float Conv kernels */
static PyObject *m_fconv_kernels(PyObject *self, PyObject *args) {
    (void)self; (void)args;
    return PyUnicode_FromString(ql_fconv_for(current_isa)->name);
}

PyMethodDef ql_bind_fconv_methods[] = {
    {"fgemm", m_fgemm, METH_VARARGS, "The float32 Conv's matrix product (documented order, every level the same bits)."},
    {"fconv_kernels", m_fconv_kernels, METH_NOARGS, "The selected level's float Conv kernels."},
    {NULL, NULL, 0, NULL},
};
