/* QLinearMatMul-21 with a float8 operand (f8mm/f8mm.h): qlinear/engines/native/f8mm.py plans each
 * call; this binding checks every buffer's size again and runs with the GIL released. */
#include <limits.h>

#include "args.h"
#include "f8mm/f8mm.h"

/* f8mm_decode(codes, R, C, table, zp, zp_mode, k_axis, threads, out, kmax, bad); threads 0: the pool's */
static PyObject *m_f8mm_decode(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *oc, *ot, *oz, *oo, *ok, *ob;
    Py_ssize_t R, C;
    int zp_mode, k_axis, threads;
    if (!PyArg_ParseTuple(args, "OnnOOiiiOOO", &oc, &R, &C, &ot, &oz, &zp_mode, &k_axis, &threads, &oo, &ok, &ob))
        return NULL;
    Py_ssize_t n;
    if (R < 0 || C < 0 || zp_mode < 0 || zp_mode > 2 || (k_axis != 0 && k_axis != 1) ||
        __builtin_mul_overflow(R, C, &n) || n > PY_SSIZE_T_MAX / 8)
        return PyErr_Format(PyExc_ValueError, "qlinear native: f8mm_decode: bad geometry");
    Py_ssize_t nz = zp_mode == 0 ? 1 : (zp_mode == 1 ? R : C);
    Py_buffer c = {0}, t = {0}, z = {0}, o = {0}, k = {0}, b = {0};
    PyObject *ret = NULL;
    if (get_buf(oc, &c, 0, n, "codes") < 0 || get_buf(ot, &t, 0, 256 * 8, "table") < 0 ||
        get_buf(oz, &z, 0, nz * 8, "zero point") < 0 || get_buf(oo, &o, 1, n * 8, "out") < 0 ||
        get_buf(ok, &k, 1, (k_axis ? C : R) * 8, "kmax") < 0 || get_buf(ob, &b, 1, k_axis ? R : C, "bad") < 0)
        goto done;
    if (threads < 1 || threads > ql_num_threads()) threads = ql_num_threads();
    Py_BEGIN_ALLOW_THREADS
    ql_f8mm_decode((const uint8_t *)c.buf, R, C, (const double *)t.buf, (const double *)z.buf, zp_mode, k_axis,
                   threads, (double *)o.buf, (double *)k.buf, (uint8_t *)b.buf);
    Py_END_ALLOW_THREADS
    ret = Py_None;
    Py_INCREF(ret);
done:
    REL(c); REL(t); REL(z); REL(o); REL(k); REL(b);
    return ret;
}

/* f8mm_combine(hh, hl, lh, ll, n, s, out) -> True, or False when the build cannot */
static PyObject *m_f8mm_combine(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[5];
    Py_ssize_t n;
    int s;
    if (!PyArg_ParseTuple(args, "OOOOniO", &o[0], &o[1], &o[2], &o[3], &n, &s, &o[4])) return NULL;
    if (n < 0 || n > PY_SSIZE_T_MAX / 8 || s < 0 || s > 26)
        return PyErr_Format(PyExc_ValueError, "qlinear native: f8mm_combine: bad size or shift");
    Py_buffer b[5] = {{0}};
    PyObject *ret = NULL;
    for (int i = 0; i < 5; i++)
        if (get_buf(o[i], &b[i], i == 4, n * 8, "part") < 0) goto done;
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = ql_f8mm_combine((const double *)b[0].buf, (const double *)b[1].buf, (const double *)b[2].buf,
                         (const double *)b[3].buf, n, s, (double *)b[4].buf);
    Py_END_ALLOW_THREADS
    ret = PyBool_FromLong(ok);
done:
    for (int i = 0; i < 5; i++) REL(b[i]);
    return ret;
}

/* the output step's conversion (QuantizeLinear of float32 with a scale of 1): out_type QF_U8 or
 * QF_I8 (lo, hi: the range), or QF_NF with fmt = (mbits, bias, flavour, max_code, nan_code,
 * sign_bit) and its decoding table (float8 only); -1 with an exception set when a value is off */
static int out_op(ql_fmt_op *op, int out_type, int lo, int hi, PyObject *ofmt, PyObject *otab, int add_zero,
                  Py_buffer *t) {
    memset(op, 0, sizeof *op);
    if ((out_type != QF_U8 && out_type != QF_I8 && out_type != QF_NF) || lo > hi || lo < -128 || hi > 255) {
        PyErr_Format(PyExc_ValueError, "qlinear native: f8mm: bad output type");
        return -1;
    }
    op->x_type = QF_F32; op->out_type = out_type; op->prec = QF_F32; op->saturate = 1; op->add_zero = add_zero != 0;
    op->lo = lo; op->hi = hi;
    if (out_type != QF_NF) return 0;
    int mbits, bias, flavour; unsigned int maxc, nanc, signb;
    if (!PyArg_ParseTuple(ofmt, "iiiIII", &mbits, &bias, &flavour, &maxc, &nanc, &signb)) return -1;
    /* float8 only: 2 or 3 mantissa bits, the sign in bit 7 */
    if (mbits < 2 || mbits > 3 || bias < 1 || bias > 16 || flavour < QF_FN || flavour > QF_FINITE ||
        signb != 128 || maxc >= signb || nanc > 255) {
        PyErr_Format(PyExc_ValueError, "qlinear native: f8mm: bad float format");
        return -1;
    }
    op->fmt.mbits = mbits; op->fmt.bias = bias; op->fmt.flavour = flavour;
    op->fmt.max_code = maxc; op->fmt.nan_code = nanc; op->fmt.sign_bit = signb;
    if (get_buf(otab, t, 0, 256 * 4, "table") < 0) return -1;
    op->fmt.table = (const float *)t->buf;
    return 0;
}

/* f8mm_finish(isa, S, M, N, unit, m, m_rows, m_cols, out_type, lo, hi, fmt, table, add_zero, z, threads, out)
 * out_type: QF_U8, QF_I8 or QF_NF (formats.h); fmt, table: as fmt_convert's (None for integers);
 * z: None or float32[1] */
static PyObject *m_f8mm_finish(PyObject *self, PyObject *args) {
    (void)self;
    const char *isa_name;
    PyObject *os, *om, *ofmt, *otab, *oz, *oo;
    Py_ssize_t M, N;
    float unit;
    int m_rows, m_cols, out_type, lo, hi, add_zero, threads;
    if (!PyArg_ParseTuple(args, "sOnnfOiiiiiOOiOiO", &isa_name, &os, &M, &N, &unit, &om, &m_rows, &m_cols, &out_type,
                          &lo, &hi, &ofmt, &otab, &add_zero, &oz, &threads, &oo))
        return NULL;
    const ql_isa *isa = isa_arg(isa_name);
    if (!isa) return NULL;
    Py_ssize_t n;
    if (M < 0 || N < 0 || __builtin_mul_overflow(M, N, &n) || n > PY_SSIZE_T_MAX / 8 ||
        !(unit > 0.0f) || isinf(unit))
        return PyErr_Format(PyExc_ValueError, "qlinear native: f8mm_finish: bad geometry");
    ql_fmt_op op;
    Py_buffer s = {0}, m = {0}, t = {0}, z = {0}, o = {0};
    PyObject *ret = NULL;
    if (out_op(&op, out_type, lo, hi, ofmt, otab, add_zero, &t) < 0) goto done;
    if (get_buf(os, &s, 0, n * 8, "sums") < 0 ||
        get_buf(om, &m, 0, (m_rows ? M : 1) * (m_cols ? N : 1) * 4, "multiplier") < 0 ||
        (oz != Py_None && get_buf(oz, &z, 0, 4, "zero point") < 0) || get_buf(oo, &o, 1, n, "out") < 0)
        goto done;
    if (threads < 1 || threads > ql_num_threads()) threads = ql_num_threads();
    Py_BEGIN_ALLOW_THREADS
    ql_f8mm_finish(isa, (const double *)s.buf, M, N, unit, (const float *)m.buf, m_rows != 0, m_cols != 0, &op,
                   z.obj ? (const float *)z.buf : NULL, threads, (uint8_t *)o.buf);
    Py_END_ALLOW_THREADS
    ret = Py_None;
    Py_INCREF(ret);
done:
    REL(s); REL(m); REL(t); REL(z); REL(o);
    return ret;
}

/* f8mm_product(isa, gemm, ilp64, a, M, K, table, bad_table, zp, zp_rows, B, N, units, S, unit, m, m_rows, m_cols,
 *              out_type, lo, hi, fmt, table_y, add_zero, z, threads, out) -> True, or False when a holds a
 * code bad_table marks; gemm: the address of a cblas_dgemm (64-bit integers when ilp64) */
static PyObject *m_f8mm_product(PyObject *self, PyObject *args) {
    (void)self;
    const char *isa_name;
    unsigned long long gemm_addr;
    PyObject *oa, *ot, *obt, *oz, *ob, *ou, *os, *om, *ofmt, *otab, *oy, *oo;
    Py_ssize_t M, K, N;
    float unit;
    int ilp64, zp_rows, m_rows, m_cols, out_type, lo, hi, add_zero, threads;
    if (!PyArg_ParseTuple(args, "sKiOnnOOOiOnOOfOiiiiiOOiOiO", &isa_name, &gemm_addr, &ilp64, &oa, &M, &K, &ot, &obt,
                          &oz, &zp_rows, &ob, &N, &ou, &os, &unit, &om, &m_rows, &m_cols, &out_type, &lo, &hi, &ofmt,
                          &otab, &add_zero, &oy, &threads, &oo))
        return NULL;
    const ql_isa *isa = isa_arg(isa_name);
    if (!isa) return NULL;
    Py_ssize_t na, nb, ns;
    /* the 32-bit interface takes every dimension and leading dimension as an int */
    if (M < 1 || K < 1 || N < 1 || gemm_addr == 0 || __builtin_mul_overflow(M, K, &na) ||
        __builtin_mul_overflow(K, N, &nb) || __builtin_mul_overflow(M, N, &ns) || na > PY_SSIZE_T_MAX / 8 ||
        nb > PY_SSIZE_T_MAX / 8 || ns > PY_SSIZE_T_MAX / 8 || !(unit > 0.0f) || isinf(unit) ||
        (!ilp64 && (M > INT_MAX || K > INT_MAX || N > INT_MAX)))
        return PyErr_Format(PyExc_ValueError, "qlinear native: f8mm_product: bad geometry");
    ql_fmt_op op;
    Py_buffer a = {0}, t = {0}, bt = {0}, z = {0}, b = {0}, u = {0}, s = {0}, m = {0}, ty = {0}, y = {0}, o = {0};
    PyObject *ret = NULL;
    if (out_op(&op, out_type, lo, hi, ofmt, otab, add_zero, &ty) < 0) goto done;
    if (get_buf(oa, &a, 0, na, "a") < 0 || get_buf(ot, &t, 0, 256 * 8, "table") < 0 ||
        get_buf(obt, &bt, 0, 256, "bad table") < 0 || get_buf(oz, &z, 0, (zp_rows ? M : 1) * 8, "zero point") < 0 ||
        get_buf(ob, &b, 0, nb * 8, "b") < 0 || get_buf(ou, &u, 1, na * 8, "units") < 0 ||
        get_buf(os, &s, 1, ns * 8, "sums") < 0 ||
        get_buf(om, &m, 0, (m_rows ? M : 1) * (m_cols ? N : 1) * 4, "multiplier") < 0 ||
        (oy != Py_None && get_buf(oy, &y, 0, 4, "zero point") < 0) || get_buf(oo, &o, 1, ns, "out") < 0)
        goto done;
    if (threads < 1 || threads > ql_num_threads()) threads = ql_num_threads();
    ql_f8mm_dgemm gemm = {(void *)(uintptr_t)gemm_addr, ilp64 != 0};
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = ql_f8mm_product(isa, gemm, (const uint8_t *)a.buf, M, K, (const double *)t.buf, (const uint8_t *)bt.buf,
                         (const double *)z.buf, zp_rows != 0, (const double *)b.buf, N, (double *)u.buf,
                         (double *)s.buf, unit, (const float *)m.buf, m_rows != 0, m_cols != 0, &op,
                         y.obj ? (const float *)y.buf : NULL, threads, (uint8_t *)o.buf);
    Py_END_ALLOW_THREADS
    ret = PyBool_FromLong(ok);
done:
    REL(a); REL(t); REL(bt); REL(z); REL(b); REL(u); REL(s); REL(m); REL(ty); REL(y); REL(o);
    return ret;
}

PyMethodDef ql_bind_f8mm_methods[] = {
    {"f8mm_decode", m_f8mm_decode, METH_VARARGS, "Float8 QLinearMatMul: operand codes to float64 units."},
    {"f8mm_combine", m_f8mm_combine, METH_VARARGS, "Float8 QLinearMatMul: four exact partial products."},
    {"f8mm_finish", m_f8mm_finish, METH_VARARGS, "Float8 QLinearMatMul: the output step."},
    {"f8mm_product", m_f8mm_product, METH_VARARGS, "Float8 QLinearMatMul: decode, exact product and output."},
    {NULL, NULL, 0, NULL}};
