/* QLinearConv / ConvInteger bindings: weights packed once per ISA level, then one call per
 * convolution; a plain call (weights as given) in one crossing; the requantization multiplier. */
#include "args.h"

/* Python packs a path's weights naming the path for the kernel (conv_w_bytes, conv_pack_w): the
 * GEMM paths' codes are their kernels' */
_Static_assert((int)QL_CONV_GEMM == (int)QL_KERNEL_EXACT && (int)QL_CONV_GEMM_FAST == (int)QL_KERNEL_CONV_FAST,
               "conv kinds name their kernels");

/* ---------------------------------------------------------------------------------------
 * Convolutions (conv/): weights packed once per ISA level, then one call per convolution
 * ------------------------------------------------------------------------------------- */
static PyObject *m_conv_w_bytes(PyObject *self, PyObject *args) {
    (void)self;
    const char *isa; int which, M, K;
    long long taps;
    if (!PyArg_ParseTuple(args, "siiiL", &isa, &which, &M, &K, &taps)) return NULL;
    if (which != QL_KERNEL_EXACT && which != QL_KERNEL_CONV_FAST)
        return PyErr_Format(PyExc_ValueError, "qlinear native: conv kernel %d", which);
    const ql_gemm_kernel *k = kernel_arg(isa, which, NULL);
    if (!k) return NULL;
    if (M < 0 || K < 1 || taps < 1 || K % taps)
        return PyErr_Format(PyExc_ValueError, "qlinear native: bad conv weights shape");
    return PyLong_FromSize_t(ql_conv_w_bytes(k, M, K, (int64_t)taps));
}

/* conv_pack_w(isa, which (0 exact, 2 fast), w, w_type, M, K, taps, wzp int32[M], dst[, portable]):
 * portable nonzero packs with the kernel's table minus its SIMD grouped-order packers
 * (grouped_*_t9 NULL: conv/pack_w.c's portable loops), so a test can compare both byte for byte. */
static PyObject *m_conv_pack_w(PyObject *self, PyObject *args) {
    (void)self;
    const char *isa; int which, w_type, M, K, portable = 0;
    long long taps;
    PyObject *ow, *oz, *od;
    if (!PyArg_ParseTuple(args, "siOiiiLOO|p", &isa, &which, &ow, &w_type, &M, &K, &taps, &oz, &od, &portable))
        return NULL;
    if (which != QL_KERNEL_EXACT && which != QL_KERNEL_CONV_FAST)
        return PyErr_Format(PyExc_ValueError, "qlinear native: conv kernel %d", which);
    const ql_gemm_kernel *k = kernel_arg(isa, which, NULL);
    if (!k) return NULL;
    ql_gemm_kernel kport;
    if (portable) {
        kport = *k;
        kport.conv.grouped_i16_t9 = NULL;
        kport.conv.grouped_b_t9 = NULL;
        k = &kport;
    }
    if (M < 0 || K < 1 || taps < 1 || K % taps || (w_type != QL_U8 && w_type != QL_I8))
        return PyErr_Format(PyExc_ValueError, "qlinear native: bad conv weights shape");
    Py_buffer w = {0}, z = {0}, d = {0};
    PyObject *ret = NULL;
    if (get_buf(ow, &w, 0, (Py_ssize_t)M * K, "w") < 0 || get_buf(oz, &z, 0, (Py_ssize_t)M * 4, "w_zero_point") < 0 ||
        get_buf(od, &d, 1, (Py_ssize_t)ql_conv_w_bytes(k, M, K, (int64_t)taps), "packed w") < 0)
        goto done;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ql_conv_pack_w(k, w.buf, w_type, M, K, (int64_t)taps, (const int32_t *)z.buf, d.buf);
    Py_END_ALLOW_THREADS
    if (rc == -2) {
        PyErr_NoMemory();
        goto done;
    }
    if (rc) {
        PyErr_SetString(PyExc_ValueError, "qlinear native: conv weights outside the fast path's bound");
        goto done;
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    REL(w); REL(z); REL(d);
    return ret;
}

/* conv_pack_w_auto(isa, w, w_type, M, K, taps, wzp int32[M][, dst]) -> (kind, packed): kind 2, the
 * fast path's form (the weights proven within its bound while packing), or 0, the exact form.
 * A plain call's weights, packed per call into dst (writable, conv_w_bytes of both kernels
 * at least) or, without dst, a new bytes object. */
static PyObject *m_conv_pack_w_auto(PyObject *self, PyObject *args) {
    (void)self;
    const char *isa_name; int w_type, M, K;
    long long taps;
    PyObject *ow, *oz, *od = NULL;
    PyObject *odst = NULL;
    if (!PyArg_ParseTuple(args, "sOiiiLO|O", &isa_name, &ow, &w_type, &M, &K, &taps, &oz, &odst)) return NULL;
    const ql_isa *isa = isa_arg(isa_name);
    if (!isa) return NULL;
    if (M < 0 || K < 1 || taps < 1 || K % taps || (w_type != QL_U8 && w_type != QL_I8))
        return PyErr_Format(PyExc_ValueError, "qlinear native: bad conv weights shape");
    size_t need = ql_conv_w_bytes(isa->exact, M, K, (int64_t)taps);
    if (isa->conv_fast && ql_conv_w_bytes(isa->conv_fast, M, K, (int64_t)taps) > need)
        need = ql_conv_w_bytes(isa->conv_fast, M, K, (int64_t)taps);
    Py_buffer w = {0}, z = {0}, d = {0};
    PyObject *ret = NULL;
    if (get_buf(ow, &w, 0, (Py_ssize_t)M * K, "w") < 0 || get_buf(oz, &z, 0, (Py_ssize_t)M * 4, "w_zero_point") < 0)
        goto done;
    char *dst;
    if (odst) {
        if (get_buf(odst, &d, 1, (Py_ssize_t)need, "packed w") < 0) goto done;
        dst = (char *)d.buf;
        od = odst;
        Py_INCREF(od);
    } else {
        od = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)need);   /* filled here, before anyone sees it */
        if (!od) goto done;
        dst = PyBytes_AS_STRING(od);
    }
    int kind;
    Py_BEGIN_ALLOW_THREADS
    kind = ql_conv_pack_w_auto(isa, w.buf, w_type, M, K, (int64_t)taps, (const int32_t *)z.buf, dst, ql_num_threads());
    Py_END_ALLOW_THREADS
    if (kind == -2) {
        PyErr_NoMemory();
        Py_DECREF(od);
        goto done;
    }
    ret = Py_BuildValue("iN", kind, od);
done:
    REL(w); REL(z); REL(d);
    return ret;
}

static int int64_tuple(PyObject *t, int n, int64_t *dst, int64_t lo, const char *what) {
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != n) {
        PyErr_Format(PyExc_ValueError, "qlinear native: conv %s must be a tuple of %d ints", what, n);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(t, i));
        if (v == -1 && PyErr_Occurred()) return -1;
        /* positions are formed as o*stride + t*dilation - pad in int64: keep each term small */
        if (v < lo || v > ((int64_t)1 << 60)) {
            PyErr_Format(PyExc_ValueError, "qlinear native: conv %s value %lld out of range", what, v);
            return -1;
        }
        dst[i] = (int64_t)v;
    }
    return 0;
}

/* The geometry arguments of conv / conv_plain into p (dims (N, C, M, group), in, out, kernel,
 * strides, dilations, pads_begin), checked; *taps and *K of the weights. 0 or -1 (raised). */
static int conv_plan_args(ql_conv_plan *p, int depthwise, int x_type, PyObject *odims, PyObject *oin, PyObject *oout,
                          PyObject *ok, PyObject *ost, PyObject *odl, PyObject *opd, int64_t *taps_out,
                          int64_t *K_out, int64_t *plane_out, int64_t *P_out) {
    memset(p, 0, sizeof *p);
    int64_t dims[4];
    if (!PyTuple_Check(oin)) {
        PyErr_Format(PyExc_ValueError, "qlinear native: conv in must be a tuple");
        return -1;
    }
    Py_ssize_t nsp = PyTuple_GET_SIZE(oin);
    if (nsp < 1 || nsp > QL_CONV_MAXD) {
        PyErr_Format(PyExc_ValueError, "qlinear native: conv rank %zd not supported", nsp);
        return -1;
    }
    p->nsp = (int)nsp;
    if (int64_tuple(odims, 4, dims, 0, "dims") < 0 || int64_tuple(oin, p->nsp, p->in, 1, "in") < 0 ||
        int64_tuple(oout, p->nsp, p->out, 1, "out") < 0 || int64_tuple(ok, p->nsp, p->k, 1, "kernel") < 0 ||
        int64_tuple(ost, p->nsp, p->stride, 1, "strides") < 0 || int64_tuple(odl, p->nsp, p->dil, 1, "dilations") < 0 ||
        int64_tuple(opd, p->nsp, p->pad, 0, "pads") < 0)
        return -1;
    p->N = dims[0]; p->C = dims[1]; p->M = dims[2]; p->group = dims[3];
    if (p->group < 1 || p->C % p->group || p->M % p->group || (x_type != QL_U8 && x_type != QL_I8) ||
        (depthwise && p->C != p->group) || p->M > INT_MAX || p->C < 1) {
        PyErr_Format(PyExc_ValueError, "qlinear native: bad conv channels");
        return -1;
    }
    int64_t plane = 1, P = 1, taps = 1;
    for (int a = 0; a < p->nsp; a++) {
        plane *= p->in[a]; P *= p->out[a]; taps *= p->k[a];
        if (plane > ((int64_t)1 << 48) || P > ((int64_t)1 << 48) || taps > ((int64_t)1 << 40)) {
            PyErr_Format(PyExc_ValueError, "qlinear native: conv sizes out of range");
            return -1;
        }
    }
    int64_t K = p->C / p->group * taps;
    if (K > INT_MAX / 2) {
        PyErr_Format(PyExc_ValueError, "qlinear native: conv K out of range");
        return -1;
    }
    *taps_out = taps; *K_out = K; *plane_out = plane; *P_out = P;
    return 0;
}

/* conv(isa, kind (0 GEMM exact, 1 depthwise, 2 GEMM fast path), x, x_type, x_zp, (N, C, M, group), in, out, k, strides, dilations,
 *      pads_begin, weights, y, quantized, y_signed, y_zp, lo, hi, mult, mult_s, bias|None,
 *      workspace) */
static PyObject *m_conv(PyObject *self, PyObject *args) {
    (void)self;
    const char *isa_name;
    int kind, x_type, x_zp, quantized, y_signed, y_zp;
    PyObject *ox, *odims, *oin, *oout, *ok, *ost, *odl, *opd, *ow, *oy, *omult, *obias;
    float lo, hi;
    Py_ssize_t mult_s, workspace;
    if (!PyArg_ParseTuple(args, "siOiiOOOOOOOOOiiiffOnOn", &isa_name, &kind, &ox, &x_type, &x_zp, &odims,
                          &oin, &oout, &ok, &ost, &odl, &opd, &ow, &oy, &quantized, &y_signed, &y_zp, &lo, &hi,
                          &omult, &mult_s, &obias, &workspace))
        return NULL;
    if (kind != QL_CONV_GEMM && kind != QL_CONV_DEPTHWISE && kind != QL_CONV_GEMM_FAST)
        return PyErr_Format(PyExc_ValueError, "qlinear native: conv kind %d", kind);
    int depthwise = kind == QL_CONV_DEPTHWISE;
    const ql_isa *isa;
    const ql_gemm_kernel *k = kernel_arg(isa_name, kind == QL_CONV_GEMM_FAST ? QL_KERNEL_CONV_FAST : QL_KERNEL_EXACT, &isa);
    if (!k) return NULL;
    ql_conv_plan p;
    int64_t taps, K, plane, P;
    if (conv_plan_args(&p, depthwise, x_type, odims, oin, oout, ok, ost, odl, opd, &taps, &K, &plane, &P) < 0)
        return NULL;
    Py_buffer x = {0}, w = {0}, y = {0}, mult = {0}, bias = {0};
    PyObject *ret = NULL;
    Py_ssize_t wneed = depthwise ? (Py_ssize_t)(p.M * taps * 2) : (Py_ssize_t)ql_conv_w_bytes(k, (int)p.M, (int)K, taps);
    if (get_buf(ox, &x, 0, (Py_ssize_t)(p.N * p.C * plane), "x") < 0 ||
        get_buf(ow, &w, 0, wneed, "packed w") < 0 ||
        get_buf(oy, &y, 1, (Py_ssize_t)(p.N * p.M * P * (quantized ? 1 : 4)), "y") < 0 ||
        get_buf(omult, &mult, 0, quantized ? (mult_s ? (Py_ssize_t)p.M * 4 : 4) : 0, "multiplier") < 0 ||
        (obias != Py_None && get_buf(obias, &bias, 0, (Py_ssize_t)p.M * 4, "bias") < 0))
        goto done;
    p.x = x.buf; p.x_type = x_type; p.x_zp = x_zp;
    p.y = y.buf; p.quantized = quantized; p.y_signed = y_signed; p.y_zp = y_zp; p.lo = lo; p.hi = hi;
    p.mult = (const float *)mult.buf; p.mult_s = mult_s ? 1 : 0;
    p.bias = obias != Py_None ? (const int32_t *)bias.buf : NULL;
    int rc = 0;
    if (p.N > 0 && p.M > 0) {
        Py_BEGIN_ALLOW_THREADS
        if (depthwise)
            rc = ql_conv_depthwise(&p, isa, (const int16_t *)w.buf, (size_t)w.len / 2, (size_t)workspace);
        else
            rc = ql_conv_gemm(&p, isa, k, w.buf, (size_t)workspace);
        Py_END_ALLOW_THREADS
    }
    if (rc == -1) PyErr_NoMemory();
    else if (rc == -3) PyErr_Format(PyExc_MemoryError, "qlinear: convolution scratch exceeds the workspace limit (%zd bytes)", workspace);
    else if (rc) PyErr_Format(PyExc_ValueError, "qlinear native: conv sizes out of range");
    else { ret = Py_None; Py_INCREF(ret); }
done:
    REL(x); REL(w); REL(y); REL(mult); REL(bias);
    return ret;
}

/* multiplier(x_scale, w_scale, y_scale) -> ql_multiplier_f32's multiplier (epilogue/epilogue.c)
 * as a Python float, or None. Scales arrive as float32 values (exact as doubles). For the lean
 * paths of plain calls: no NumPy temporaries, no error-state context. */

static PyObject *m_multiplier(PyObject *self, PyObject *args) {
    (void)self;
    float xs, ws, ys, m;
    if (!PyArg_ParseTuple(args, "fff", &xs, &ws, &ys)) return NULL;
    if (!ql_multiplier_f32(xs, ws, ys, &m)) Py_RETURN_NONE;
    return PyFloat_FromDouble((double)m);
}

/* conv_plain(isa, depthwise, x, x_type, x_zp, (N, C, M, group), in, out, k, strides, dilations, pads_begin,
 *            w, w_type, w_zero_point|None, y, quantized, y_signed, y_zp, lo, hi,
 *            x_scale, w_scale|None, y_scale, bias|None, workspace) -> kind | None
 * A plain call (weights given, nothing prepared) in one crossing: w (M, C/group, k...) raw and
 * contiguous, its zero point raw (w's type, 1 or M elements; None: 0), w_scale float32 (1 or M
 * elements; None for ConvInteger). The multiplier float32(float32(x_scale * w_scale) / y_scale)
 * is formed here in float32 (the contract's order; no contraction: -ffp-contract=off), and when
 * a scale or the multiplier is not finite (or y_scale is 0) nothing is computed and None is
 * returned: the caller's full path then raises its error. Otherwise the weights are packed
 * (ql_conv_pack_w_auto: the 7-bit path when they are proven within its bound, else exact; the
 * depthwise path: centered int16 taps) and the convolution runs; returns the kind that ran
 * (0 exact GEMM, 1 depthwise, 2 the GEMM's 7-bit path). */
static PyObject *m_conv_plain(PyObject *self, PyObject *args) {
    (void)self;
    const char *isa_name;
    int depthwise, x_type, x_zp, w_type, quantized, y_signed, y_zp;
    PyObject *ox, *odims, *oin, *oout, *ok, *ost, *odl, *opd, *ow, *owz, *oy, *ows, *obias;
    float lo, hi, xs, ys;
    Py_ssize_t workspace;
    if (!PyArg_ParseTuple(args, "siOiiOOOOOOOOiOOiiifffOfOn", &isa_name, &depthwise, &ox, &x_type, &x_zp, &odims,
                          &oin, &oout, &ok, &ost, &odl, &opd, &ow, &w_type, &owz, &oy, &quantized, &y_signed, &y_zp,
                          &lo, &hi, &xs, &ows, &ys, &obias, &workspace))
        return NULL;
    const ql_isa *isa = isa_arg(isa_name);
    if (!isa) return NULL;
    if (w_type != QL_U8 && w_type != QL_I8) return PyErr_Format(PyExc_ValueError, "qlinear native: bad w type");
    ql_conv_plan p;
    int64_t taps, K, plane, P;
    if (conv_plan_args(&p, depthwise, x_type, odims, oin, oout, ok, ost, odl, opd, &taps, &K, &plane, &P) < 0)
        return NULL;
    int M = (int)p.M;
    Py_buffer x = {0}, w = {0}, wz = {0}, y = {0}, ws = {0}, bias = {0};
    PyObject *ret = NULL;
    char *scratch = NULL;
    int cached = 0;
    if (get_buf(ox, &x, 0, (Py_ssize_t)(p.N * p.C * plane), "x") < 0 ||
        get_buf(ow, &w, 0, (Py_ssize_t)(p.M * K), "w") < 0 ||
        (owz != Py_None && get_buf(owz, &wz, 0, 1, "w_zero_point") < 0) ||
        get_buf(oy, &y, 1, (Py_ssize_t)(p.N * p.M * P * (quantized ? 1 : 4)), "y") < 0 ||
        (quantized && get_buf(ows, &ws, 0, 4, "w_scale") < 0) ||
        (obias != Py_None && get_buf(obias, &bias, 0, (Py_ssize_t)p.M * 4, "bias") < 0))
        goto done;
    if ((wz.obj && wz.len != 1 && wz.len != M) || (quantized && ws.len != 4 && ws.len != 4 * (Py_ssize_t)M)) {
        PyErr_Format(PyExc_ValueError, "qlinear native: conv_plain zero point / scale sizes");
        goto done;
    }
    int ws_n = quantized ? (int)(ws.len / 4) : 0;
    /* scratch: int32 zero points [M], multipliers [M], then the packed weights (64-byte aligned) */
    size_t head = ((size_t)M * 8 + 63) & ~(size_t)63, wbytes;
    /* depthwise, 2-D, one channel per group, at most QL_DWCL_MAX_TAPS taps (conv.h): the
     * centered taps followed by the channels-last kernel's form, as a prepared form keeps them
     * (conv.h: blocks of 16 channels, taps padded to pairs, [block][tap][channel], zeros beyond) */
    int64_t cl_taps = taps + (taps & 1), cl_blocks = (p.M + 15) / 16;
    int with_cl = depthwise && p.nsp == 2 && p.M == p.group && taps <= QL_DWCL_MAX_TAPS;
    if (depthwise) {
        wbytes = (size_t)p.M * (size_t)taps * 2 + (with_cl ? (size_t)(cl_blocks * 16 * cl_taps) * 2 : 0);
    } else {
        wbytes = ql_conv_w_bytes(isa->exact, M, (int)K, taps);
        if (isa->conv_fast && ql_conv_w_bytes(isa->conv_fast, M, (int)K, taps) > wbytes)
            wbytes = ql_conv_w_bytes(isa->conv_fast, M, (int)K, taps);
    }
    scratch = ql_scratch_get(&ql_plain_scratch, head + wbytes + 64, &cached);
    if (!scratch) {
        PyErr_NoMemory();
        goto done;
    }
    int32_t *wzp = (int32_t *)scratch;
    float *mult = (float *)(scratch + (size_t)M * 4);
    char *wp = (char *)(((uintptr_t)scratch + head + 63) & ~(uintptr_t)63);
    if (quantized) {
        /* the multiplier, per output channel or per tensor; one not finite: None, the full
         * path raises */
        int ok_m = 1;
        for (int i = 0; ok_m && i < ws_n; i++)
            ok_m = ql_multiplier_f32(xs, ((const float *)ws.buf)[i], ys, &mult[i]);
        if (!ok_m) {
            ret = Py_None;
            Py_INCREF(ret);
            goto done;
        }
    }
    {
        const uint8_t *zr = (const uint8_t *)wz.buf;
        Py_ssize_t zn = wz.obj ? wz.len : 0;
        for (int i = 0; i < M; i++) {
            uint8_t b = zn ? zr[zn == 1 ? 0 : i] : 0;
            wzp[i] = w_type == QL_I8 ? (int32_t)(int8_t)b : (int32_t)b;
        }
    }
    p.x = x.buf; p.x_type = x_type; p.x_zp = x_zp;
    p.y = y.buf; p.quantized = quantized; p.y_signed = y_signed; p.y_zp = y_zp; p.lo = lo; p.hi = hi;
    p.mult = mult; p.mult_s = ws_n > 1 ? 1 : 0;
    p.bias = obias != Py_None ? (const int32_t *)bias.buf : NULL;
    int rc = 0, kind = depthwise ? QL_CONV_DEPTHWISE : QL_CONV_GEMM;
    Py_BEGIN_ALLOW_THREADS
    if (depthwise) {
        /* centered taps: |w - zp| <= 255, exact in int16 */
        int16_t *wc = (int16_t *)wp;
        const uint8_t *wr = (const uint8_t *)w.buf;
        for (int i = 0; i < M; i++) {
            int32_t z = wzp[i];
            const uint8_t *s = wr + (size_t)i * (size_t)taps;
            int16_t *d = wc + (size_t)i * (size_t)taps;
            if (w_type == QL_U8)
                for (int64_t t = 0; t < taps; t++) d[t] = (int16_t)((int32_t)s[t] - z);
            else
                for (int64_t t = 0; t < taps; t++) d[t] = (int16_t)((int32_t)(int8_t)s[t] - z);
        }
        size_t w_elems = (size_t)p.M * (size_t)taps;
        if (with_cl) {
            int16_t *cl = wc + w_elems;
            memset(cl, 0, (size_t)(cl_blocks * 16 * cl_taps) * 2);
            for (int64_t b = 0; b < cl_blocks; b++) {
                int nch = M - 16 * b < 16 ? (int)(M - 16 * b) : 16;
                for (int64_t t = 0; t < taps; t++) {
                    int16_t *d = cl + ((size_t)b * (size_t)cl_taps + (size_t)t) * 16;
                    const int16_t *s = wc + (size_t)(16 * b) * (size_t)taps + (size_t)t;
                    for (int c = 0; c < nch; c++) d[c] = s[(size_t)c * (size_t)taps];
                }
            }
            w_elems += (size_t)(cl_blocks * 16 * cl_taps);
        }
        if (p.N > 0 && p.M > 0) rc = ql_conv_depthwise(&p, isa, wc, w_elems, (size_t)workspace);
    } else {
        /* the 7-bit form where the weights fit it (packed whole while proving the bound), else
         * the exact form, packed inside the GEMM's tasks where the path allows it (conv.h) */
        ql_conv_wraw raw = {w.buf, w_type, wzp};
        if (p.N > 0 && p.M > 0) {
            rc = ql_conv_plain_fast(&p, isa, &raw, wp, (size_t)workspace);
            if (rc == 1) {
                kind = QL_CONV_GEMM_FAST;
                rc = 0;
            } else if (rc == 0) {
                rc = ql_conv_gemm_raw(&p, isa, isa->exact, &raw, wp, (size_t)workspace);
            }
        }
    }
    Py_END_ALLOW_THREADS
    if (rc == -1) PyErr_NoMemory();
    else if (rc == -3) PyErr_Format(PyExc_MemoryError, "qlinear: convolution scratch exceeds the workspace limit (%zd bytes)", workspace);
    else if (rc) PyErr_Format(PyExc_ValueError, "qlinear native: conv sizes out of range");
    else ret = PyLong_FromLong(kind);
done:
    if (scratch) ql_scratch_put(&ql_plain_scratch, scratch, cached);
    REL(x); REL(w); REL(wz); REL(y); REL(ws); REL(bias);
    return ret;
}

PyMethodDef ql_bind_conv_methods[] = {
    {"conv_w_bytes", m_conv_w_bytes, METH_VARARGS, "Bytes of packed conv weights."},
    {"conv_pack_w", m_conv_pack_w, METH_VARARGS, "Pack conv weights (M, K) for an ISA's exact kernel."},
    {"conv_pack_w_auto", m_conv_pack_w_auto, METH_VARARGS, "Pack a plain call's conv weights: the 7-bit form if they fit, else exact."},
    {"conv", m_conv, METH_VARARGS, "QLinearConv / ConvInteger on packed weights, fused epilogue."},
    {"multiplier", m_multiplier, METH_VARARGS, "float32(float32(x_scale * w_scale) / y_scale), or None if not finite."},
    {"conv_plain", m_conv_plain, METH_VARARGS, "A plain QLinearConv / ConvInteger: multiplier, packing and convolution in one call."},
    {NULL, NULL, 0, NULL},
};
