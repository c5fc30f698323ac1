/* MatMulNBits binding: one call runs the prepared weights (qlinear/engines/native/nbits.py
 * makes the layouts, nbits/nbits.h describes them) on float32 activations. */
#include "args.h"
#include "nbits/nbits.h"

static int opt_buf(PyObject *o, Py_buffer *v, Py_ssize_t need, const char *what) {
    if (o == Py_None) return 0;
    return get_buf(o, v, 0, need, what);
}

/* nbits_run(isa, int8, bits, block_size, K, N, w8, s8, z8, zconst, zf, zint, g, bias, a, M, y):
 * y [M][N] float32 = MatMulNBits(a [M][K] float32). w8 and s8: the codes and scales in the
 * kernels' layout (both levels); int8: z8 or None with zconst; else zf (float32 zero points),
 * zint (1: they are integers) and g or None; unused buffers may be None; bias None or [N]. */
static PyObject *m_nbits_run(PyObject *self, PyObject *args) {
    (void)self;
    const char *isa_name;
    int int8, bits, bs, K, N, zconst, zint, M;
    PyObject *ow8, *os8, *oz8, *ozf, *og, *ob, *oa, *oy;
    if (!PyArg_ParseTuple(args, "spiiiiOOOiOpOOOiO", &isa_name, &int8, &bits, &bs, &K, &N, &ow8, &os8, &oz8,
                          &zconst, &ozf, &zint, &og, &ob, &oa, &M, &oy))
        return NULL;
    const ql_isa *isa = isa_arg(isa_name);
    if (!isa) return NULL;
    if ((bits != 2 && bits != 4 && bits != 8) || bs < 16 || (bs & (bs - 1)) || bs > (1 << 16) || K < 1 || N < 1 ||
        M < 0 || zconst < 0 || zconst > 255)
        return PyErr_Format(PyExc_ValueError, "qlinear native: bad nbits geometry");
    int nb = (K + bs - 1) / bs;
    Py_ssize_t ng = (N + 15) / 16;
    ql_nbits_w w;
    memset(&w, 0, sizeof w);
    w.bits = bits; w.bs = bs; w.K = K; w.N = N; w.nb = nb; w.zconst = zconst; w.zint = zint;
    Py_buffer w8 = {0}, s8 = {0}, z8 = {0}, zf = {0}, g = {0}, b = {0}, a = {0}, y = {0};
    PyObject *ret = NULL;
    int rc = 0;
    if (get_buf(ow8, &w8, 0, ng * nb * (bs * bits / 32) * 64, "w8") < 0 ||
        get_buf(os8, &s8, 0, ng * nb * 16 * 4, "s8") < 0)
        goto done;
    w.w8 = (const uint8_t *)w8.buf; w.s8 = (const float *)s8.buf;
    if (int8) {
        if (opt_buf(oz8, &z8, ng * nb * 16, "z8") < 0) goto done;
        w.z8 = z8.obj ? (const uint8_t *)z8.buf : NULL;
    } else {
        if (get_buf(ozf, &zf, 0, ng * nb * 16 * 4, "zf") < 0 || opt_buf(og, &g, (Py_ssize_t)K * 4, "g") < 0)
            goto done;
        if (g.obj) {   /* every block index in range: the kernels read the scales through it */
            const int32_t *gi = (const int32_t *)g.buf;
            for (Py_ssize_t i = 0; i < K; i++)
                if (gi[i] < 0 || gi[i] >= nb)
                    { PyErr_Format(PyExc_ValueError, "qlinear native: g_idx out of range"); goto done; }
        }
        /* zint (integer zero points in [0, 255], as qlinear/engines/native/nbits.py makes them)
         * only selects an exact shortcut for q - zp; it is not checked per call (a wrong flag
         * gives wrong values, never an access out of bounds) */
        if (!zint && bits == 8) {
            PyErr_Format(PyExc_ValueError, "qlinear native: float zero points with 8-bit weights");
            goto done;
        }
        w.zf = (const float *)zf.buf;
        w.g = g.obj ? (const int32_t *)g.buf : NULL;
    }
    if (opt_buf(ob, &b, (Py_ssize_t)N * 4, "bias") < 0 || get_buf(oa, &a, 0, (Py_ssize_t)M * K * 4, "a") < 0 ||
        get_buf(oy, &y, 1, (Py_ssize_t)M * N * 4, "y") < 0)
        goto done;
    w.bias = b.obj ? (const float *)b.buf : NULL;
    if (M > 0) {
        const ql_nbits_kernels *k = ql_nbits_for(isa);
        Py_BEGIN_ALLOW_THREADS
        rc = ql_nbits_run(k, &w, int8, (const float *)a.buf, M, (float *)y.buf);
        Py_END_ALLOW_THREADS
    }
    if (rc < 0) { PyErr_NoMemory(); goto done; }
    ret = Py_None;
    Py_INCREF(ret);
done:
    REL(w8); REL(s8); REL(z8); REL(zf); REL(g); REL(b); REL(a); REL(y);
    return ret;
}

/* nbits_kernels(isa) -> the name of the kernel set the level runs (tests, engine_info) */
static PyObject *m_nbits_kernels(PyObject *self, PyObject *args) {
    (void)self;
    const char *isa_name;
    if (!PyArg_ParseTuple(args, "s", &isa_name)) return NULL;
    const ql_isa *isa = isa_arg(isa_name);
    if (!isa) return NULL;
    return PyUnicode_FromString(ql_nbits_for(isa)->name);
}

PyMethodDef ql_bind_nbits_methods[] = {
    {"nbits_run", m_nbits_run, METH_VARARGS, "MatMulNBits on prepared weights."},
    {"nbits_kernels", m_nbits_kernels, METH_VARARGS, "The MatMulNBits kernel set of an ISA level."},
    {NULL, NULL, 0, NULL},
};
