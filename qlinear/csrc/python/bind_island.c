/* Integer-island bindings (island.h): the element-wise island and the per-channel table island. */
#include "args.h"
#include "island.h"

/* one operand: kind 0 absent, 1 uint8 codes, 3 int8 codes, 2 float32; mul / add None or C
 * float32 each */
static int operand_arg(PyObject *ox, int kind, float s, int z, PyObject *omul, PyObject *oadd, Py_ssize_t n,
                       Py_ssize_t C, Py_buffer *bx, Py_buffer *bm, Py_buffer *ba, ql_island_operand *o,
                       const char *what) {
    memset(o, 0, sizeof *o);
    if (kind == 0) return 0;
    if (kind < 1 || kind > 3) {
        PyErr_Format(PyExc_ValueError, "qlinear native: island operand %s: bad kind %d", what, kind);
        return -1;
    }
    if (get_buf(ox, bx, 0, kind == 2 ? n * 4 : n, what) < 0) return -1;
    if (kind == 2) o->f = (const float *)bx->buf;
    else o->q = (const uint8_t *)bx->buf;
    o->is_signed = kind == 3;
    o->s = s;
    o->z = z;
    if (omul != Py_None || oadd != Py_None) {
        if (omul == Py_None || oadd == Py_None || get_buf(omul, bm, 0, C * 4, "mul") < 0 ||
            get_buf(oadd, ba, 0, C * 4, "add") < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "qlinear native: island affine needs mul and add");
            return -1;
        }
        o->mul = (const float *)bm->buf;
        o->add = (const float *)ba->buf;
    }
    return 0;
}

/* island(isa, planes, C, plane, a, a_kind, sa, za, a_mul, a_add, b, b_kind, sb, zb, b_mul, b_add,
 *        relu, signed, out_f, out_q, ys, yz): island.h's job over planes * plane elements,
 *        plane p of channel p % C; out_f / out_q None when not wanted */
static PyObject *m_island(PyObject *self, PyObject *args) {
    (void)self;
    const char *isa_name; Py_ssize_t planes, C, plane;
    PyObject *oa, *oam, *oaa, *ob, *obm, *oba, *oof, *ooq;
    int ak, bk, za, zb, yz, relu, is_signed; float sa, sb, ys;
    if (!PyArg_ParseTuple(args, "snnnOifiOOOifiOOppOOfi", &isa_name, &planes, &C, &plane, &oa, &ak, &sa, &za, &oam,
                          &oaa, &ob, &bk, &sb, &zb, &obm, &oba, &relu, &is_signed, &oof, &ooq, &ys, &yz))
        return NULL;
    const ql_isa *isa = isa_arg(isa_name);
    if (!isa) return NULL;
    if (planes < 0 || C < 1 || plane < 0 || (planes && planes % C) || C > PY_SSIZE_T_MAX / 4 ||
        (plane && planes > PY_SSIZE_T_MAX / 4 / plane) || ak == 0 || (oof == Py_None && ooq == Py_None))
        return PyErr_Format(PyExc_ValueError, "qlinear native: bad island geometry");
    Py_ssize_t n = planes * plane;
    Py_buffer ba = {0}, bam = {0}, baa = {0}, bb = {0}, bbm = {0}, bba = {0}, bof = {0}, boq = {0};
    PyObject *ret = NULL;
    ql_island_job j;
    memset(&j, 0, sizeof j);
    if (operand_arg(oa, ak, sa, za, oam, oaa, n, C, &ba, &bam, &baa, &j.a, "a") < 0 ||
        operand_arg(ob, bk, sb, zb, obm, oba, n, C, &bb, &bbm, &bba, &j.b, "b") < 0)
        goto done;
    if (oof != Py_None) {
        if (get_buf(oof, &bof, 1, n * 4, "out_f") < 0) goto done;
        j.out_f = (float *)bof.buf;
    }
    if (ooq != Py_None) {
        if (get_buf(ooq, &boq, 1, n, "out_q") < 0) goto done;
        j.out_q = (uint8_t *)boq.buf;
    }
    j.has_b = bk != 0;
    j.relu = relu;
    j.is_signed = is_signed;
    j.ys = ys;
    j.yz = yz;
    const ql_island_kernels *k = ql_island_for(isa);
    int threads = ql_num_threads();
    Py_BEGIN_ALLOW_THREADS
    ql_island(k, &j, planes, C, plane, threads);
    Py_END_ALLOW_THREADS
    ret = Py_None;
    Py_INCREF(ret);
done:
    REL(ba); REL(bam); REL(baa); REL(bb); REL(bbm); REL(bba); REL(bof); REL(boq);
    return ret;
}

/* island_lut(isa, x, planes, C, plane, tables, out): tables C * 256 bytes, x and out planes * plane */
static PyObject *m_island_lut(PyObject *self, PyObject *args) {
    (void)self;
    const char *isa_name;
    Py_ssize_t planes, C, plane;
    PyObject *ox, *ot, *oo;
    if (!PyArg_ParseTuple(args, "sOnnnOO", &isa_name, &ox, &planes, &C, &plane, &ot, &oo)) return NULL;
    const ql_isa *isa = isa_arg(isa_name);
    if (!isa) return NULL;
    if (planes < 0 || C < 1 || plane < 0 || (planes && planes % C) || C > PY_SSIZE_T_MAX / 256 ||
        (plane && planes > PY_SSIZE_T_MAX / plane))
        return PyErr_Format(PyExc_ValueError, "qlinear native: bad island_lut geometry");
    Py_ssize_t n = planes * plane;
    Py_buffer x = {0}, t = {0}, o = {0};
    PyObject *ret = NULL;
    if (get_buf(ox, &x, 0, n, "x") < 0 || get_buf(ot, &t, 0, C * 256, "tables") < 0 ||
        get_buf(oo, &o, 1, n, "out") < 0)
        goto done;
    int threads = ql_num_threads();
    Py_BEGIN_ALLOW_THREADS
    ql_island_lut(ql_island_for(isa), (const uint8_t *)x.buf, planes, C, plane, (const uint8_t *)t.buf,
                  (uint8_t *)o.buf, threads);
    Py_END_ALLOW_THREADS
    ret = Py_None;
    Py_INCREF(ret);
done:
    REL(x); REL(t); REL(o);
    return ret;
}

PyMethodDef ql_bind_island_methods[] = {
    {"island", m_island, METH_VARARGS,
     "DequantizeLinear -> (BatchNormalization) -> Add -> (Relu) -> QuantizeLinear in one pass, onnxruntime's float32 operations."},
    {"island_lut", m_island_lut, METH_VARARGS, "Per-channel 256-entry byte tables over NCHW planes."},
    {NULL, NULL, 0, NULL},
};
