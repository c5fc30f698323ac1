/* The newer formats' QuantizeLinear / DequantizeLinear (include/formats.h): qlinear/engines/native/formats.py
 * plans the call from the validated parameters (qlinear/_qdq.py) and the registry's facts; this
 * binding checks every buffer's size and the geometry again, then runs with the GIL released. */
#include "args.h"
#include "formats.h"

/* fmt_convert(isa, quant, x, x_type, out, out_type, prec, saturate, add_zero, lo, hi, fmt, table,
 *             (pre, D, post, B, P0, nb, P2), scale, zero)
 * fmt: None or (mbits, bias, flavour, max_code, nan_code, sign_bit) of the narrow float format of
 * x (quant 0) or of the output (quant 1); table: None or its 256 float32 values by code; scale:
 * float32[P0 * nb * P2]; zero: None or float32 of the same size. */
static PyObject *m_fmt_convert(PyObject *self, PyObject *args) {
    (void)self;
    const char *isa_name;
    int quant, x_type, out_type, prec, saturate, add_zero, lo, hi;
    PyObject *ox, *oo, *ofmt, *otab, *os, *oz;
    Py_ssize_t g[7];
    if (!PyArg_ParseTuple(args, "siOiOiiiiiiOO(nnnnnnn)OO", &isa_name, &quant, &ox, &x_type, &oo, &out_type, &prec,
                          &saturate, &add_zero, &lo, &hi, &ofmt, &otab, &g[0], &g[1], &g[2], &g[3], &g[4], &g[5],
                          &g[6], &os, &oz))
        return NULL;
    const ql_isa *isa = isa_arg(isa_name);
    if (!isa) return NULL;
    ql_fmt_op op;
    memset(&op, 0, sizeof op);
    op.x_type = x_type; op.out_type = out_type; op.prec = prec; op.saturate = saturate != 0;
    op.add_zero = add_zero != 0; op.lo = lo; op.hi = hi;
    int xok = quant ? (x_type >= QF_F32 && x_type <= QF_I32) : (x_type >= QF_I32 && x_type <= QF_NF);
    int ook = quant ? (out_type >= QF_U8 && out_type <= QF_NF) : (out_type >= QF_F32 && out_type <= QF_BF16);
    int nf = quant ? out_type == QF_NF : x_type == QF_NF;
    if (!xok || !ook || prec < QF_F32 || prec > QF_BF16 || lo > hi || lo < -32768 || hi > 65535)
        return PyErr_Format(PyExc_ValueError, "qlinear native: fmt_convert: bad types (%d, %d, %d) or range", x_type,
                            out_type, prec);
    ptrdiff_t pre = g[0], D = g[1], post = g[2], B = g[3], P0 = g[4], nb = g[5], P2 = g[6];
    Py_ssize_t n, np;
    if (pre < 0 || D < 0 || post < 0 || B < 1 || (P0 != 1 && P0 != pre) || (P2 != 1 && P2 != post) ||
        (nb != (D + B - 1) / B && !(D == 0 && nb <= 1)) || __builtin_mul_overflow(pre, D, &n) ||
        __builtin_mul_overflow(n, post, &n) || n > PY_SSIZE_T_MAX / 8 || __builtin_mul_overflow(P0, nb, &np) ||
        __builtin_mul_overflow(np, P2, &np) || np > PY_SSIZE_T_MAX / 8)
        return PyErr_Format(PyExc_ValueError, "qlinear native: fmt_convert: bad geometry");
    Py_buffer x = {0}, o = {0}, t = {0}, s = {0}, z = {0};
    PyObject *ret = NULL;
    if (nf) {
        int mbits, bias, flavour; unsigned int maxc, nanc, signb;
        if (!PyArg_ParseTuple(ofmt, "iiiIII", &mbits, &bias, &flavour, &maxc, &nanc, &signb)) return NULL;
        /* the shapes the encoder's shifts and magic numbers assume: every format here has 1-3
         * mantissa bits, a bias of 1-16 and its sign in bit 3, 5 or 7 */
        if (mbits < 1 || mbits > 3 || bias < 1 || bias > 16 || flavour < QF_FN || flavour > QF_FINITE ||
            (signb != 8 && signb != 32 && signb != 128) || maxc >= signb || nanc > 255)
            return PyErr_Format(PyExc_ValueError, "qlinear native: fmt_convert: bad float format");
        op.fmt.mbits = mbits; op.fmt.bias = bias; op.fmt.flavour = flavour;
        op.fmt.max_code = maxc; op.fmt.nan_code = nanc; op.fmt.sign_bit = signb;
        if (get_buf(otab, &t, 0, 256 * 4, "table") < 0) goto done;
        op.fmt.table = (const float *)t.buf;
    }
    if (get_buf(ox, &x, 0, n * (Py_ssize_t)ql_fmt_size(x_type), "x") < 0 ||
        get_buf(oo, &o, 1, n * (Py_ssize_t)ql_fmt_size(out_type), "out") < 0 ||
        get_buf(os, &s, 0, np * 4, "scale") < 0 || (oz != Py_None && get_buf(oz, &z, 0, np * 4, "zero point") < 0))
        goto done;
    const ql_fmt_kernels *k = ql_fmt_for(isa);
    Py_BEGIN_ALLOW_THREADS
    ql_fmt_tensor(k, quant, &op, x.buf, o.buf, pre, D, post, B, P0, nb, P2, (const float *)s.buf,
                  z.obj ? (const float *)z.buf : NULL);
    Py_END_ALLOW_THREADS
    ret = Py_None;
    Py_INCREF(ret);
done:
    REL(x); REL(o); REL(t); REL(s); REL(z);
    return ret;
}

/* fmt_kernels(isa) -> the name of the conversion kernels the level runs ("avx512", "avx2", "portable") */
static PyObject *m_fmt_kernels(PyObject *self, PyObject *args) {
    (void)self;
    const char *isa_name;
    if (!PyArg_ParseTuple(args, "s", &isa_name)) return NULL;
    const ql_isa *isa = isa_arg(isa_name);
    if (!isa) return NULL;
    return PyUnicode_FromString(ql_fmt_for(isa)->name);
}

PyMethodDef ql_bind_formats_methods[] = {
    {"fmt_convert", m_fmt_convert, METH_VARARGS, "QuantizeLinear/DequantizeLinear 19-28, the newer types."},
    {"fmt_kernels", m_fmt_kernels, METH_VARARGS, "The conversion kernels an ISA level runs."},
    {NULL, NULL, 0, NULL}};
