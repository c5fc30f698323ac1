/* MatMulInteger / QLinearMatMul bindings: b packed once (a prepared form) or as given (a plain
 * call), the batched product with its fused epilogue, and the 7-bit proof of plain calls. */
#include "args.h"
#include "gemv.h"

static PyObject *m_packed_b_bytes(PyObject *self, PyObject *args) {
    (void)self;
    const char *isa; int which, K, N;
    if (!PyArg_ParseTuple(args, "siii", &isa, &which, &K, &N)) return NULL;
    if (which != QL_KERNEL_EXACT && which != QL_KERNEL_FAST)
        return PyErr_Format(PyExc_ValueError, "qlinear native: matmul kernel %d", which);
    const ql_gemm_kernel *k = kernel_arg(isa, which, NULL);
    if (!k) return NULL;
    return PyLong_FromSize_t(ql_packed_b_bytes(k, K, N));
}

/* pack_b(isa, which, b, b_type, Bb, K, N, bs, ks, cs, zp, zp_bs, zp_cs, packed, colsums, zcol) */
static PyObject *m_pack_b(PyObject *self, PyObject *args) {
    (void)self;
    const char *isa; int which, b_type, K, N;
    Py_ssize_t Bb, bs, ks, cs, zp_bs, zp_cs;
    PyObject *ob, *ozp, *opk, *ocs, *ozc;
    if (!PyArg_ParseTuple(args, "siOiniinnnOnnOOO", &isa, &which, &ob, &b_type, &Bb, &K, &N, &bs, &ks,
                          &cs, &ozp, &zp_bs, &zp_cs, &opk, &ocs, &ozc))
        return NULL;
    if (which != QL_KERNEL_EXACT && which != QL_KERNEL_FAST)
        return PyErr_Format(PyExc_ValueError, "qlinear native: matmul kernel %d", which);
    const ql_gemm_kernel *k = kernel_arg(isa, which, NULL);
    if (!k) return NULL;
    if (K < 0 || N < 0 || Bb < 0 || (b_type != QL_U8 && b_type != QL_I8))
        return PyErr_Format(PyExc_ValueError, "qlinear native: bad pack_b geometry");
    Py_buffer b = {0}, zp = {0}, pk = {0}, csb = {0}, zc = {0};
    Py_ssize_t npad = (N + k->nr - 1) / k->nr * k->nr;
    Py_ssize_t blast = (Bb && K && N) ? (Bb - 1) * bs + (Py_ssize_t)(K ? K - 1 : 0) * ks + (N ? N - 1 : 0) * cs + 1 : 0;
    Py_ssize_t zlast = (Bb && N) ? (Bb - 1) * zp_bs + (N ? N - 1 : 0) * zp_cs + 1 : 0;
    PyObject *ret = NULL;
    if (get_buf(ob, &b, 0, blast, "b") < 0 || get_buf(ozp, &zp, 0, zlast * 4, "b_zero_point") < 0 ||
        get_buf(opk, &pk, 1, (Py_ssize_t)(Bb * ql_packed_b_bytes(k, K, N)), "packed") < 0 ||
        get_buf(ocs, &csb, 1, k->form == QL_FORM_U8S8 ? Bb * npad * 4 : 0, "colsums") < 0 ||
        get_buf(ozc, &zc, 1, Bb * N * 4, "zcol") < 0)
        goto done;
    if (bs < 0 || ks < 0 || cs < 0 || zp_bs < 0 || zp_cs < 0) {
        PyErr_SetString(PyExc_ValueError, "qlinear native: negative strides");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    ql_pack_b(k, b.buf, b_type, Bb, K, N, bs, ks, cs, (const int32_t *)zp.buf, zp_bs, zp_cs, pk.buf,
              k->form == QL_FORM_U8S8 ? (int32_t *)csb.buf : NULL, (int32_t *)zc.buf, ql_num_threads());
    Py_END_ALLOW_THREADS
    ret = Py_None;
    Py_INCREF(ret);
done:
    REL(b); REL(zp); REL(pk); REL(csb); REL(zc);
    return ret;
}

static int check_idx(const int64_t *idx, Py_ssize_t n, Py_ssize_t limit, const char *what) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (idx[i] < 0 || idx[i] >= limit) {
            PyErr_Format(PyExc_ValueError, "qlinear native: %s index out of range", what);
            return -1;
        }
    return 0;
}

/* matmul(isa, which, M, N, K, batches, a, a_type, Ba, a_idx, zpa, zpa_bs, zpa_rs,
 *        bpack, bcolsums, bzcol, Bb, b_idx, out, quantized, out_signed,
 *        mult, m_bs, m_rs, m_cs, lo, hi, yzp): b packed by pack_b (a prepared form);
 * matmul_raw(isa, which, M, N, K, batches, a, a_type, Ba, a_idx, zpa, zpa_bs, zpa_rs,
 *        b, b_type, Bb, b_idx, bzp, bzp_bs, bzp_cs, out, quantized, out_signed,
 *        mult, m_bs, m_rs, m_cs, lo, hi, yzp): b as given, C-contiguous (Bb, K, N), packed
 *        inside the GEMM (a plain call) */
static PyObject *mm_common(PyObject *args, int raw) {
    const char *isa_name; int which, M, N, K, a_type, b_type = QL_U8, quantized, out_signed, yzp;
    Py_ssize_t batches, Ba, zpa_bs, zpa_rs, Bb, m_bs, m_rs, m_cs, bzp_bs = 0, bzp_cs = 0;
    PyObject *oa, *oai, *ozpa, *obp = NULL, *obc = NULL, *obz = NULL, *obi, *oout, *omult;
    float lo, hi;
    if (raw) {
        if (!PyArg_ParseTuple(args, "siiiinOinOOnnOinOOnnOiiOnnnffi", &isa_name, &which, &M, &N, &K,
                              &batches, &oa, &a_type, &Ba, &oai, &ozpa, &zpa_bs, &zpa_rs, &obp, &b_type,
                              &Bb, &obi, &obz, &bzp_bs, &bzp_cs, &oout, &quantized, &out_signed, &omult,
                              &m_bs, &m_rs, &m_cs, &lo, &hi, &yzp))
            return NULL;
    } else if (!PyArg_ParseTuple(args, "siiiinOinOOnnOOOnOOiiOnnnffi", &isa_name, &which, &M, &N, &K, &batches,
                                 &oa, &a_type, &Ba, &oai, &ozpa, &zpa_bs, &zpa_rs, &obp, &obc, &obz, &Bb, &obi,
                                 &oout, &quantized, &out_signed, &omult, &m_bs, &m_rs, &m_cs, &lo, &hi, &yzp)) {
        return NULL;
    }
    const ql_isa *isa;
    if (which != QL_KERNEL_EXACT && which != QL_KERNEL_FAST)
        return PyErr_Format(PyExc_ValueError, "qlinear native: matmul kernel %d", which);
    const ql_gemm_kernel *k = kernel_arg(isa_name, which, &isa);
    if (!k) return NULL;
    if (M < 0 || N < 0 || K < 0 || batches < 0 || Ba < 0 || Bb < 0 || zpa_bs < 0 || zpa_rs < 0 ||
        m_bs < 0 || m_rs < 0 || m_cs < 0 || bzp_bs < 0 || bzp_cs < 0 ||
        (a_type != QL_U8 && a_type != QL_I8) || (b_type != QL_U8 && b_type != QL_I8))
        return PyErr_Format(PyExc_ValueError, "qlinear native: bad matmul geometry");
    Py_buffer a = {0}, ai = {0}, zpa = {0}, bp = {0}, bc = {0}, bz = {0}, bi = {0}, out = {0}, mult = {0};
    PyObject *ret = NULL;
    Py_ssize_t npad = (N + k->nr - 1) / k->nr * k->nr;
    Py_ssize_t zlast = (batches && M) ? (batches - 1) * zpa_bs + (M ? M - 1 : 0) * zpa_rs + 1 : 0;
    Py_ssize_t mlast = (quantized && batches && M && N) ? (batches - 1) * m_bs + (M ? M - 1 : 0) * m_rs + (N ? N - 1 : 0) * m_cs + 1 : 0;
    Py_ssize_t bzlast = (Bb && N) ? (Bb - 1) * bzp_bs + (N - 1) * bzp_cs + 1 : 0;
    if (get_buf(oa, &a, 0, Ba * M * K, "a") < 0 || get_buf(oai, &ai, 0, batches * 8, "a_idx") < 0 ||
        get_buf(ozpa, &zpa, 0, zlast * 4, "a_zero_point") < 0)
        goto done;
    if (raw) {
        if (get_buf(obp, &bp, 0, Bb * K * N, "b") < 0 || get_buf(obz, &bz, 0, bzlast * 4, "b_zero_point") < 0)
            goto done;
    } else if (get_buf(obp, &bp, 0, (Py_ssize_t)(Bb * ql_packed_b_bytes(k, K, N)), "packed b") < 0 ||
               get_buf(obc, &bc, 0, k->form == QL_FORM_U8S8 ? Bb * npad * 4 : 0, "b colsums") < 0 ||
               get_buf(obz, &bz, 0, Bb * N * 4, "b zcol") < 0) {
        goto done;
    }
    if (get_buf(obi, &bi, 0, batches * 8, "b_idx") < 0 ||
        get_buf(oout, &out, 1, batches * M * N * (quantized ? 1 : 4), "out") < 0 ||
        get_buf(omult, &mult, 0, mlast * 4, "multiplier") < 0)
        goto done;
    if (check_idx((const int64_t *)ai.buf, batches, Ba, "a") < 0 ||
        check_idx((const int64_t *)bi.buf, batches, Bb, "b") < 0)
        goto done;
    ql_matmul mm;
    memset(&mm, 0, sizeof mm);
    mm.isa = isa; mm.kern = k; mm.M = M; mm.N = N; mm.K = K; mm.batches = batches;
    mm.a = a.buf; mm.a_type = a_type; mm.a_idx = (const int64_t *)ai.buf;
    mm.zpa = (const int32_t *)zpa.buf; mm.zpa_bs = zpa_bs; mm.zpa_rs = zpa_rs;
    if (raw) {
        mm.braw = bp.buf; mm.b_type = b_type; mm.b_bs = (ptrdiff_t)K * N; mm.b_ks = N;
        mm.bzp = (const int32_t *)bz.buf; mm.bzp_bs = bzp_bs; mm.bzp_cs = bzp_cs;
    } else {
        mm.bpack = bp.buf; mm.bcolsums = (const int32_t *)bc.buf; mm.bzcol = (const int32_t *)bz.buf;
    }
    mm.Bb = Bb;
    mm.b_idx = (const int64_t *)bi.buf; mm.out = out.buf;
    mm.quantized = quantized; mm.out_is_signed = out_signed;
    mm.mult = (const float *)mult.buf; mm.m_bs = m_bs; mm.m_rs = m_rs; mm.m_cs = m_cs;
    mm.lo = lo; mm.hi = hi; mm.yzp = yzp; mm.threads = ql_num_threads();
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ql_matmul_run(&mm);
    Py_END_ALLOW_THREADS
    if (rc) { PyErr_NoMemory(); goto done; }
    ret = Py_None;
    Py_INCREF(ret);
done:
    REL(a); REL(ai); REL(zpa); REL(bp); REL(bc); REL(bz); REL(bi); REL(out); REL(mult);
    return ret;
}

static PyObject *m_matmul(PyObject *self, PyObject *args) { (void)self; return mm_common(args, 0); }
static PyObject *m_matmul_raw(PyObject *self, PyObject *args) { (void)self; return mm_common(args, 1); }

/* bytes_within(x, type, lo, hi) -> bool: every byte of x, in the u8 form, within [lo, hi] */
static PyObject *m_bytes_within(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *ox; int type, lo, hi;
    if (!PyArg_ParseTuple(args, "Oiii", &ox, &type, &lo, &hi)) return NULL;
    if (type != QL_U8 && type != QL_I8) return PyErr_Format(PyExc_ValueError, "qlinear native: bytes_within type %d", type);
    Py_buffer x = {0};
    if (get_buf(ox, &x, 0, 0, "x") < 0) return NULL;
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = ql_bytes_within(x.buf, type, x.len, lo, hi, ql_num_threads());
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&x);
    return PyBool_FromLong(ok);
}

/* gemv_count() -> matrix-vector products run on a packed b's gemv form so far (gemm/gemv.c) */
static PyObject *m_gemv_count(PyObject *self, PyObject *args) {
    (void)self; (void)args;
    return PyLong_FromLongLong(__atomic_load_n(&ql_gemv_calls, __ATOMIC_RELAXED));
}

PyMethodDef ql_bind_matmul_methods[] = {
    {"packed_b_bytes", m_packed_b_bytes, METH_VARARGS, "Bytes of one packed b entry."},
    {"pack_b", m_pack_b, METH_VARARGS, "Pack matmul b for a kernel."},
    {"matmul", m_matmul, METH_VARARGS, "Batched matmul on packed b, fused epilogue."},
    {"matmul_raw", m_matmul_raw, METH_VARARGS, "Batched matmul on b as given (packed inside the GEMM)."},
    {"bytes_within", m_bytes_within, METH_VARARGS, "Whether every byte (u8 form) lies in [lo, hi]."},
    {"gemv_count", m_gemv_count, METH_NOARGS, "Matrix-vector products run on a packed b's gemv form so far."},
    {NULL, NULL, 0, NULL},
};
