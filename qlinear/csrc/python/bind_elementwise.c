/* Element-wise bindings: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear's usual case,
 * QLinearAdd / QLinearMul, byte tables, an exact QDQ Conv's float tail, MaxPool on bytes and the
 * float Conv's helpers. */
#include "args.h"
#include "fconv.h"

/* ---------------------------------------------------------------------------------------
 * QuantizeLinear / DequantizeLinear over x seen as (pre, C, post), parameters per C (or 1)
 * ------------------------------------------------------------------------------------- */
/* quantize(isa, x, x_type, pre, C, post, per_axis, scale, zp, out, out_type) and
 * dequantize(isa, x, x_type, pre, C, post, per_axis, scale, zp, out) */
static PyObject *qd_common(PyObject *args, int quant) {
    const char *isa_name; int x_type, per_axis, out_type = QL_F32;
    Py_ssize_t pre, C, post;
    PyObject *ox, *os, *oz, *oo;
    if (quant) {
        if (!PyArg_ParseTuple(args, "sOinnniOOOi", &isa_name, &ox, &x_type, &pre, &C, &post, &per_axis,
                              &os, &oz, &oo, &out_type))
            return NULL;
    } else if (!PyArg_ParseTuple(args, "sOinnniOOO", &isa_name, &ox, &x_type, &pre, &C, &post, &per_axis,
                                 &os, &oz, &oo)) {
        return NULL;
    }
    const ql_isa *isa = isa_arg(isa_name);
    if (!isa) return NULL;
    if (pre < 0 || C < 0 || post < 0 || x_type < 0 || x_type > QL_F32 || out_type < 0 || out_type > QL_F32)
        return PyErr_Format(PyExc_ValueError, "qlinear native: bad quantize geometry");
    size_t xes = (x_type == QL_U8 || x_type == QL_I8) ? 1 : 4, oes = quant ? 1 : 4;
    Py_ssize_t n = pre * C * post, np = per_axis ? C : 1;
    Py_buffer x = {0}, s = {0}, z = {0}, o = {0};
    PyObject *ret = NULL;
    if (get_buf(ox, &x, 0, n * (Py_ssize_t)xes, "x") < 0 || get_buf(os, &s, 0, np * 4, "scale") < 0 ||
        get_buf(oz, &z, 0, np * 4, "zero point") < 0 || get_buf(oo, &o, 1, n * (Py_ssize_t)oes, "out") < 0)
        goto done;
    Py_BEGIN_ALLOW_THREADS
    ql_quantize_tensor(isa, quant, x.buf, x_type, o.buf, out_type, pre, C, post, per_axis, (const float *)s.buf,
                       (const int32_t *)z.buf);
    Py_END_ALLOW_THREADS
    ret = Py_None;
    Py_INCREF(ret);
done:
    REL(x); REL(s); REL(z); REL(o);
    return ret;
}

static PyObject *m_quantize(PyObject *self, PyObject *args) { (void)self; return qd_common(args, 1); }
static PyObject *m_dequantize(PyObject *self, PyObject *args) { (void)self; return qd_common(args, 0); }

/* dynamic_quantize(isa, x float32[n], n, out uint8[n]) -> (scale, zero_point) or None.
 * DynamicQuantizeLinear's usual case in one call (contrib/gemm.py, dynamic_quantize_linear,
 * has the formulas and the full path): lo = min x, hi = max x; mn = min(lo, 0),
 * mx = max(hi, 0); scale = 1 if mx == mn else f(f(mx - mn) / 255); zp = rne(clamp(f(0 -
 * f(mn / scale)), 0, 255)); out = QuantizeLinear(x, scale, zp), the same kernel `quantize`
 * runs. Returns None, having written nothing, where the Python path takes its guarded branch:
 * a NaN in x, lo <= -1e37 or hi >= 1e37 (compared as doubles, as Python compares; the scale or mn / scale could overflow) or 0 < mx - mn <=
 * 1e-30 (a subnormal-range scale). Each float operation is one float32 operation (C11 with
 * FLT_EVAL_METHOD 0 on x86-64 and aarch64; the build turns contraction off), so the scale and
 * zero point are those NumPy's float32 scalars give; min and max are exact in any order (a
 * signed zero can only change lo or hi between -0 and +0, which changes neither). */
static PyObject *m_dynamic_quantize(PyObject *self, PyObject *args) {
    (void)self;
    const char *isa_name;
    Py_ssize_t n;
    PyObject *ox, *oo;
    if (!PyArg_ParseTuple(args, "sOnO", &isa_name, &ox, &n, &oo)) return NULL;
    const ql_isa *isa = isa_arg(isa_name);
    if (!isa) return NULL;
    if (n < 1 || n > PY_SSIZE_T_MAX / 4)  /* (n * 4 below must not overflow) */
        return PyErr_Format(PyExc_ValueError, "qlinear native: bad dynamic_quantize size");
    Py_buffer x = {0}, o = {0};
    PyObject *ret = NULL;
    if (get_buf(ox, &x, 0, n * 4, "x") < 0 || get_buf(oo, &o, 1, n, "out") < 0) goto done;
    float scale;
    int32_t zp;
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = ql_dynamic_quantize(isa, (const float *)x.buf, n, (uint8_t *)o.buf, &scale, &zp);
    Py_END_ALLOW_THREADS
    if (!ok) {
        ret = Py_None;
        Py_INCREF(ret);
        goto done;
    }
    ret = Py_BuildValue("(di)", (double)scale, (int)zp);
done:
    REL(x); REL(o);
    return ret;
}

/* ---------------------------------------------------------------------------------------
 * Element-wise com.microsoft kernels: QLinearAdd, QLinearMul, 256-entry tables
 * ------------------------------------------------------------------------------------- */
typedef struct {
    const ql_ew_kernels *k; int mul;
    const uint8_t *p, *q; ptrdiff_t ps, qs;
    float f0, f1, f2; int32_t z0, z1; int is_signed;
    const uint8_t *table;
    uint8_t *out; Py_ssize_t n, chunk;
} ew_ctx;

static void ew_task(void *vctx, ptrdiff_t t, int thread) {
    (void)thread;
    ew_ctx *c = (ew_ctx *)vctx;
    Py_ssize_t start = t * c->chunk, len = c->n - start < c->chunk ? c->n - start : c->chunk;
    if (c->table)
        ql_lut_u8(c->p + start, len, c->table, c->out + start);
    else if (c->mul)
        c->k->qmul(c->p + start * c->ps, c->ps, c->q + start * c->qs, c->qs, len, c->z0, c->z1,
                   c->f0, c->f1, c->is_signed, c->out + start);
    else
        c->k->qadd(c->p + start * c->ps, c->ps, c->q + start * c->qs, c->qs, len, c->f0, c->f1,
                   c->f2, c->is_signed, c->out + start);
}

static void ew_run(ew_ctx *c, Py_ssize_t min_parallel) {
    c->chunk = 1 << 16;
    Py_ssize_t tasks = (c->n + c->chunk - 1) / c->chunk;
    int threads = c->n >= min_parallel ? ql_num_threads() : 1;  /* below: a few us on one core */
    if (c->n <= 0) return;
    Py_BEGIN_ALLOW_THREADS
    ql_parallel_for(tasks, threads, ew_task, c);
    Py_END_ALLOW_THREADS
}

/* qbinary(isa, mul, p, p_scalar, q, q_scalar, n, f0, f1, f2, z0, z1, signed, out)
 * add: out = sat(cvt(fma(p, f0, fma(q, f1, f2))));
 * mul: out = sat(cvt(f(f((p - z0)(q - z1)) * f0) + f1)) */
static PyObject *m_qbinary(PyObject *self, PyObject *args) {
    (void)self;
    const char *isa_name; int mul, p_scalar, q_scalar, is_signed; Py_ssize_t n;
    float f0, f1, f2; int z0, z1;
    PyObject *op, *oq, *oo;
    if (!PyArg_ParseTuple(args, "siOpOpnfffiipO", &isa_name, &mul, &op, &p_scalar, &oq, &q_scalar, &n,
                          &f0, &f1, &f2, &z0, &z1, &is_signed, &oo))
        return NULL;
    const ql_isa *isa = isa_arg(isa_name);
    if (!isa) return NULL;
    if (n < 0) return PyErr_Format(PyExc_ValueError, "qlinear native: negative length");
    Py_buffer p = {0}, q = {0}, o = {0};
    PyObject *ret = NULL;
    if (get_buf(op, &p, 0, p_scalar ? 1 : n, "p") < 0 || get_buf(oq, &q, 0, q_scalar ? 1 : n, "q") < 0 ||
        get_buf(oo, &o, 1, n, "out") < 0)
        goto done;
    ew_ctx c = {ql_ew_for(isa), mul, (const uint8_t *)p.buf, (const uint8_t *)q.buf, p_scalar ? 0 : 1,
                q_scalar ? 0 : 1, f0, f1, f2, z0, z1, is_signed, NULL, (uint8_t *)o.buf, n, 0};
    ew_run(&c, 1 << 17);
    ret = Py_None; Py_INCREF(ret);
done:
    REL(p); REL(q); REL(o);
    return ret;
}

/* qdqconv(isa, acc int32[planes * n], planes, channels, n, mult float32[channels],
 *         bias float32[channels], act, alpha, y_scale, y_zp, signed, out 8-bit[planes * n]):
 * the float tail of an exact QDQ Conv (elementwise.h, ql_qdqconv_fn), plane p with channel
 * p % channels' multiplier and bias. The caller guarantees |acc| < 2^24 (qlinear.qdq). */
typedef struct {
    const ql_ew_kernels *k; const int32_t *acc; const float *mult, *bias; uint8_t *out;
    Py_ssize_t planes, channels, n, per_task; int act, is_signed; float alpha, y_scale; int32_t y_zp;
} qdqconv_ctx;

static void qdqconv_task(void *vctx, ptrdiff_t t, int thread) {
    (void)thread;
    qdqconv_ctx *c = (qdqconv_ctx *)vctx;
    Py_ssize_t p0 = t * c->per_task, p1 = p0 + c->per_task < c->planes ? p0 + c->per_task : c->planes;
    for (Py_ssize_t p = p0; p < p1; p++) {
        Py_ssize_t ch = p % c->channels;
        c->k->qdqconv(c->acc + p * c->n, c->n, c->mult[ch], c->bias[ch], c->act, c->alpha, c->y_scale,
                      c->y_zp, c->is_signed, c->out + p * c->n);
    }
}

static PyObject *m_qdqconv(PyObject *self, PyObject *args) {
    (void)self;
    const char *isa_name; Py_ssize_t planes, channels, n; int act, y_zp, is_signed;
    float alpha, y_scale;
    PyObject *oa, *om, *ob, *oo;
    if (!PyArg_ParseTuple(args, "sOnnnOOiffipO", &isa_name, &oa, &planes, &channels, &n, &om, &ob,
                          &act, &alpha, &y_scale, &y_zp, &is_signed, &oo))
        return NULL;
    const ql_isa *isa = isa_arg(isa_name);
    if (!isa) return NULL;
    if (planes < 0 || channels < 1 || n < 0 || planes % channels || act < 0 || act > 2 ||
        y_zp < (is_signed ? -128 : 0) || y_zp > (is_signed ? 127 : 255) ||
        (n && planes > PY_SSIZE_T_MAX / 4 / n))
        return PyErr_Format(PyExc_ValueError, "qlinear native: bad qdqconv geometry or parameters");
    Py_buffer a = {0}, m = {0}, b = {0}, o = {0};
    PyObject *ret = NULL;
    if (get_buf(oa, &a, 0, planes * n * 4, "acc") < 0 || get_buf(om, &m, 0, channels * 4, "mult") < 0 ||
        get_buf(ob, &b, 0, channels * 4, "bias") < 0 || get_buf(oo, &o, 1, planes * n, "out") < 0)
        goto done;
    qdqconv_ctx c = {ql_ew_for(isa), (const int32_t *)a.buf, (const float *)m.buf, (const float *)b.buf,
                     (uint8_t *)o.buf, planes, channels, n, 1, act, is_signed, alpha, y_scale, y_zp};
    Py_ssize_t total = planes * n;
    if (total > 0) {
        /* tasks of about 64 Ki values (whole planes); two threads from 128 Ki values on */
        c.per_task = n >= (1 << 16) ? 1 : (1 << 16) / (n ? n : 1);
        Py_ssize_t tasks = (planes + c.per_task - 1) / c.per_task;
        int threads = total >= (1 << 17) ? ql_num_threads() : 1;
        Py_BEGIN_ALLOW_THREADS
        ql_parallel_for(tasks, threads, qdqconv_task, &c);
        Py_END_ALLOW_THREADS
    }
    ret = Py_None; Py_INCREF(ret);
done:
    REL(a); REL(m); REL(b); REL(o);
    return ret;
}

/* lut(x, table, out): out[i] = table[x[i]] over len(out) bytes */
static PyObject *m_lut(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *ox, *ot, *oo;
    if (!PyArg_ParseTuple(args, "OOO", &ox, &ot, &oo)) return NULL;
    Py_buffer x = {0}, t = {0}, o = {0};
    PyObject *ret = NULL;
    if (get_buf(oo, &o, 1, 0, "out") < 0 || get_buf(ox, &x, 0, o.len, "x") < 0 ||
        get_buf(ot, &t, 0, 256, "table") < 0)
        goto done;
    ew_ctx c = {NULL, 0, (const uint8_t *)x.buf, NULL, 1, 0, 0, 0, 0, 0, 0, 0, (const uint8_t *)t.buf,
                (uint8_t *)o.buf, o.len, 0};
    ew_run(&c, 1 << 19);
    ret = Py_None; Py_INCREF(ret);
done:
    REL(x); REL(t); REL(o);
    return ret;
}

/* maxpool2d(isa, x, y, planes, H, W, OH, OW, kh, kw, sh, sw, dh, dw, pt, pl, signed): MaxPool of
 * 8-bit planes (pool.c); every geometry value is checked here, so any call stays in bounds */
int ql_maxpool2d_u8(const uint8_t *x, uint8_t *y, ptrdiff_t planes, ptrdiff_t H, ptrdiff_t W, ptrdiff_t OH,
                    ptrdiff_t OW, ptrdiff_t kh, ptrdiff_t kw, ptrdiff_t sh, ptrdiff_t sw, ptrdiff_t dh,
                    ptrdiff_t dw, ptrdiff_t pt, ptrdiff_t pl, int is_signed, const ql_ew_kernels *k,
                    int threads);

/* *r = a * b for a, b >= 0, unless it exceeds Py_ssize_t (then 0) */
static int mul_fits(Py_ssize_t a, Py_ssize_t b, Py_ssize_t *r) {
    if (a && b > PY_SSIZE_T_MAX / a) return 0;
    *r = a * b;
    return 1;
}

static PyObject *m_maxpool2d(PyObject *self, PyObject *args) {
    (void)self;
    const char *isa_name;
    PyObject *ox, *oy;
    Py_ssize_t g[13];
    int is_signed;
    if (!PyArg_ParseTuple(args, "sOOnnnnnnnnnnnnnp", &isa_name, &ox, &oy, &g[0], &g[1], &g[2], &g[3], &g[4],
                          &g[5], &g[6], &g[7], &g[8], &g[9], &g[10], &g[11], &g[12], &is_signed))
        return NULL;
    const ql_isa *isa = isa_arg(isa_name);
    if (!isa) return NULL;
    Py_ssize_t planes = g[0], H = g[1], W = g[2], OH = g[3], OW = g[4];
    const Py_ssize_t lim = (Py_ssize_t)1 << 40;  /* far beyond any real plane; no overflow below */
    for (int i = 0; i < 13; i++)
        if (g[i] < (i >= 5 && i < 11 ? 1 : 0) || g[i] > lim)
            return PyErr_Format(PyExc_ValueError, "qlinear native: maxpool2d geometry value %d out of range (%zd)",
                                i, g[i]);
    Py_ssize_t xn, yn, t1, t2;
    /* the buffer sizes and the scratch row's span (OW * sw + kw * dw) must fit Py_ssize_t */
    if (!mul_fits(planes, H, &t1) || !mul_fits(t1, W, &xn) || !mul_fits(planes, OH, &t2) ||
        !mul_fits(t2, OW, &yn) || !mul_fits(OW, g[8], &t1) || !mul_fits(g[6], g[10], &t2) ||
        t1 > ((Py_ssize_t)1 << 60) || t2 > ((Py_ssize_t)1 << 60) || !mul_fits(OH, g[7], &t1) ||
        !mul_fits(g[5], g[9], &t2) || t1 > ((Py_ssize_t)1 << 60) || t2 > ((Py_ssize_t)1 << 60))
        return PyErr_Format(PyExc_ValueError, "qlinear native: maxpool2d sizes overflow");
    Py_buffer x = {0}, y = {0};
    PyObject *ret = NULL;
    if (get_buf(ox, &x, 0, xn, "x") < 0 || get_buf(oy, &y, 1, yn, "y") < 0) goto done;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ql_maxpool2d_u8((const uint8_t *)x.buf, (uint8_t *)y.buf, planes, H, W, OH, OW, g[5], g[6], g[7],
                         g[8], g[9], g[10], g[11], g[12], is_signed, ql_ew_for(isa), ql_num_threads());
    Py_END_ALLOW_THREADS
    if (rc) PyErr_NoMemory();
    else { ret = Py_None; Py_INCREF(ret); }
done:
    REL(x); REL(y);
    return ret;
}

/* fdwconv2d(x, w, b or None, y, N, C, H, W, mg, OH, OW, kh, kw, sh, sw, dh, dw, pt, pl): float32
 * depthwise Conv (fconv.c, the selected level's row kernel); every geometry value and buffer
 * size is checked here, and the kernel's padded scratch spans every window, so any call stays
 * in bounds */
static PyObject *m_fdwconv2d(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *ox, *ow, *ob, *oy;
    Py_ssize_t g[15];
    if (!PyArg_ParseTuple(args, "OOOOnnnnnnnnnnnnnnn", &ox, &ow, &ob, &oy, &g[0], &g[1], &g[2], &g[3],
                          &g[4], &g[5], &g[6], &g[7], &g[8], &g[9], &g[10], &g[11], &g[12], &g[13], &g[14]))
        return NULL;
    /* N, C, H, W, mg, OH, OW >= 0 (mg >= 1); kh, kw, sh, sw, dh, dw >= 1; pt, pl >= 0; each
     * at most 2^31, so the spans below (products of two of them plus a sum) fit in 64 bits */
    const Py_ssize_t lim = (Py_ssize_t)1 << 31;
    for (int i = 0; i < 15; i++)
        if (g[i] < (i == 4 || (i >= 7 && i < 13) ? 1 : 0) || g[i] > lim)
            return PyErr_Format(PyExc_ValueError, "qlinear native: fdwconv2d geometry value %d out of range (%zd)",
                                i, g[i]);
    Py_ssize_t N = g[0], C = g[1], H = g[2], W = g[3], mg = g[4], OH = g[5], OW = g[6];
    Py_ssize_t xn, yn, wn, t1, t2, cm;
    if (!mul_fits(N, C, &t1) || !mul_fits(t1, H, &t2) || !mul_fits(t2, W, &xn) || !mul_fits(C, mg, &cm) ||
        !mul_fits(cm, g[7], &t1) || !mul_fits(t1, g[8], &wn) || !mul_fits(N, cm, &t1) ||
        !mul_fits(t1, OH, &t2) || !mul_fits(t2, OW, &yn) || xn > PY_SSIZE_T_MAX / 8 ||
        wn > PY_SSIZE_T_MAX / 8 || yn > PY_SSIZE_T_MAX / 8)
        return PyErr_Format(PyExc_ValueError, "qlinear native: fdwconv2d sizes overflow");
    Py_buffer x = {0}, w = {0}, b = {0}, y = {0};
    PyObject *ret = NULL;
    if (get_buf(ox, &x, 0, xn * 4, "x") < 0 || get_buf(ow, &w, 0, wn * 4, "w") < 0 ||
        (ob != Py_None && get_buf(ob, &b, 0, cm * 4, "b") < 0) || get_buf(oy, &y, 1, yn * 4, "y") < 0)
        goto done;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ql_float_dwconv2d(ql_fconv_for(current_isa), (const float *)x.buf, (const float *)w.buf,
                           ob != Py_None ? (const float *)b.buf : NULL, (float *)y.buf, N, C, H, W, mg, OH, OW, g[7], g[8], g[9], g[10], g[11], g[12], g[13],
                           g[14], ql_num_threads());
    Py_END_ALLOW_THREADS
    if (rc) PyErr_NoMemory();
    else { ret = Py_None; Py_INCREF(ret); }
done:
    REL(x); REL(w); REL(b); REL(y);
    return ret;
}

/* fim2col(x, cols, N, C, H, W, OH, OW, kh, kw, sh, sw, dh, dw, pt, pl): the im2col matrix of a
 * float32 Conv (fconv.c); every input row and column read is checked against the plane there,
 * the sizes here */
void ql_float_im2col(const float *x, float *cols, ptrdiff_t N, ptrdiff_t C, ptrdiff_t H, ptrdiff_t W,
                     ptrdiff_t OH, ptrdiff_t OW, ptrdiff_t kh, ptrdiff_t kw, ptrdiff_t sh, ptrdiff_t sw,
                     ptrdiff_t dh, ptrdiff_t dw, ptrdiff_t pt, ptrdiff_t pl, int threads);

static PyObject *m_fim2col(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *ox, *oc;
    Py_ssize_t g[14];
    if (!PyArg_ParseTuple(args, "OOnnnnnnnnnnnnnn", &ox, &oc, &g[0], &g[1], &g[2], &g[3], &g[4], &g[5],
                          &g[6], &g[7], &g[8], &g[9], &g[10], &g[11], &g[12], &g[13]))
        return NULL;
    /* N, C, H, W, OH, OW >= 0; kh, kw, sh, sw, dh, dw >= 1; pt, pl >= 0; each at most 2^31 */
    const Py_ssize_t lim = (Py_ssize_t)1 << 31;
    for (int i = 0; i < 14; i++)
        if (g[i] < (i >= 6 && i < 12 ? 1 : 0) || g[i] > lim)
            return PyErr_Format(PyExc_ValueError, "qlinear native: fim2col geometry value %d out of range (%zd)",
                                i, g[i]);
    Py_ssize_t xn, cn, t1, t2;
    if (!mul_fits(g[0], g[1], &t1) || !mul_fits(t1, g[2], &t2) || !mul_fits(t2, g[3], &xn) ||
        !mul_fits(t1, g[6], &t2) || !mul_fits(t2, g[7], &t1) || !mul_fits(t1, g[4], &t2) ||
        !mul_fits(t2, g[5], &cn) || xn > PY_SSIZE_T_MAX / 8 || cn > PY_SSIZE_T_MAX / 8)
        return PyErr_Format(PyExc_ValueError, "qlinear native: fim2col sizes overflow");
    Py_buffer x = {0}, c = {0};
    PyObject *ret = NULL;
    if (get_buf(ox, &x, 0, xn * 4, "x") < 0 || get_buf(oc, &c, 1, cn * 4, "cols") < 0) goto done;
    Py_BEGIN_ALLOW_THREADS
    ql_float_im2col((const float *)x.buf, (float *)c.buf, g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8],
                    g[9], g[10], g[11], g[12], g[13], ql_num_threads());
    Py_END_ALLOW_THREADS
    ret = Py_None; Py_INCREF(ret);
done:
    REL(x); REL(c);
    return ret;
}

PyMethodDef ql_bind_elementwise_methods[] = {
    {"quantize", m_quantize, METH_VARARGS, "QuantizeLinear."},
    {"dequantize", m_dequantize, METH_VARARGS, "DequantizeLinear."},
    {"dynamic_quantize", m_dynamic_quantize, METH_VARARGS, "DynamicQuantizeLinear's usual case (uint8): parameters and quantization in one call, or None."},
    {"qbinary", m_qbinary, METH_VARARGS, "QLinearAdd / QLinearMul (com.microsoft) on bytes."},
    {"qdqconv", m_qdqconv, METH_VARARGS, "The float tail (scale, bias, Relu / LeakyRelu, QuantizeLinear) of an exact QDQ Conv."},
    {"lut", m_lut, METH_VARARGS, "Byte table lookup (QLinearSigmoid, QLinearLeakyRelu, requantization)."},
    {"maxpool2d", m_maxpool2d, METH_VARARGS, "MaxPool of uint8 / int8 planes (two spatial axes)."},
    {"fdwconv2d", m_fdwconv2d, METH_VARARGS, "Float32 depthwise Conv (the backend's float glue), NumPy's order of operations."},
    {"fim2col", m_fim2col, METH_VARARGS, "The im2col matrix of a float32 Conv (the backend's float glue)."},
    {NULL, NULL, 0, NULL},
};
