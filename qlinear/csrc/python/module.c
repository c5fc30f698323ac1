/* CPython module qlinear._qlnative: argument parsing and buffers (the buffer protocol, no
 * NumPy C API), the GIL released around every computation. Python (qlinear/_native.py)
 * validates and plans; every buffer's size is checked here again so that a planning mistake
 * raises instead of reading or writing out of bounds. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "qlinear.h"
#include "conv.h"
#include "elementwise.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

static const ql_isa *current_isa;

static const ql_isa *isa_arg(const char *name) {
    const ql_isa *isa = ql_isa_by_name(name);
    if (!isa) PyErr_Format(PyExc_ValueError, "qlinear native: ISA level '%s' is not available on this CPU", name);
    return isa;
}

static const ql_gemm_kernel *kernel_arg(const char *isa_name, int which, const ql_isa **isa_out) {
    const ql_isa *isa = isa_arg(isa_name);
    if (!isa) return NULL;
    /* which: 0 exact, 1 the matmul fast path, 2 the convolutions' fast path (S8U8 form) */
    const ql_gemm_kernel *k = which == 2 ? isa->conv_fast : which ? isa->fast : isa->exact;
    if (!k) {
        PyErr_Format(PyExc_ValueError, "qlinear native: ISA level '%s' has no %s kernel", isa_name,
                     which == 2 ? "conv fast" : which ? "fast" : "exact");
        return NULL;
    }
    if (isa_out) *isa_out = isa;
    return k;
}

/* a contiguous buffer of at least `need` bytes */
static int get_buf(PyObject *obj, Py_buffer *view, int writable, Py_ssize_t need, const char *what) {
    if (PyObject_GetBuffer(obj, view, (writable ? PyBUF_WRITABLE : 0) | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (view->len < need) {
        PyErr_Format(PyExc_ValueError, "qlinear native: buffer %s has %zd bytes, needs %zd", what,
                     view->len, need);
        PyBuffer_Release(view);
        view->obj = NULL;
        return -1;
    }
    return 0;
}

#define REL(v) do { if ((v).obj) PyBuffer_Release(&(v)); } while (0)

static PyObject *m_info(PyObject *self, PyObject *args) {
    (void)self; (void)args;
    PyObject *isas = PyList_New(0);
    if (!isas) return NULL;
    for (int i = 0; i < ql_isa_count(); i++) {
        PyObject *s = PyUnicode_FromString(ql_isa_get(i)->name);
        if (!s || PyList_Append(isas, s) < 0) { Py_XDECREF(s); Py_DECREF(isas); return NULL; }
        Py_DECREF(s);
    }
#if defined(__clang__)
    const char *cc = "clang " __clang_version__;
#elif defined(__GNUC__)
    const char *cc = "gcc " __VERSION__;
#else
    const char *cc = "unknown";
#endif
#ifdef QL_SIMDE
    int emulated = 1;
#else
    int emulated = 0;
#endif
    return Py_BuildValue("{s:N,s:s,s:s,s:s,s:i,s:O}", "isas", isas, "compiled", ql_isa_compiled_names(),
                         "cpu_flags", ql_cpu_flags(), "compiler", cc, "threads", ql_num_threads(),
                         "emulated", emulated ? Py_True : Py_False);
}

static PyObject *m_set_isa(PyObject *self, PyObject *args) {
    (void)self;
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name)) return NULL;
    const ql_isa *isa = isa_arg(name);
    if (!isa) return NULL;
    current_isa = isa;
    Py_RETURN_NONE;
}

static PyObject *m_get_isa(PyObject *self, PyObject *args) {
    (void)self; (void)args;
    if (!current_isa) current_isa = ql_isa_get(0);
    return PyUnicode_FromString(current_isa->name);
}

static PyObject *m_set_threads(PyObject *self, PyObject *args) {
    (void)self;
    int n;
    if (!PyArg_ParseTuple(args, "i", &n)) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ql_set_num_threads(n);
    Py_END_ALLOW_THREADS
    if (rc) return PyErr_Format(PyExc_ValueError, "qlinear: the number of threads must be in [1, 1024]; got %d", n);
    Py_RETURN_NONE;
}

static PyObject *m_get_threads(PyObject *self, PyObject *args) {
    (void)self; (void)args;
    return PyLong_FromLong(ql_num_threads());
}

static PyObject *m_kernel_info(PyObject *self, PyObject *args) {
    (void)self;
    const char *isa; int which;
    if (!PyArg_ParseTuple(args, "si", &isa, &which)) return NULL;
    const ql_isa *is = isa_arg(isa);
    if (!is) return NULL;
    const ql_gemm_kernel *k = which == 2 ? is->conv_fast : which ? is->fast : is->exact;
    if (!k) Py_RETURN_NONE;
    return Py_BuildValue("{s:s,s:i,s:i,s:i,s:i,s:s,s:i,s:i,s:i,s:O,s:O}", "name", k->name, "mr", k->mr, "nr", k->nr,
                         "kpack", k->kpack, "kchunk", k->kchunk > 1 ? k->kchunk : 1, "form",
                         k->form == QL_FORM_I16 ? "i16" : k->form == QL_FORM_S8U8 ? "s8u8" : "u8s8",
                         "s8_bound", k->s8_bound,
                         /* 1x1 convolutions this level runs on its exact GEMM (qlinear.h) */
                         "exact_1x1_min_m", which == 2 ? is->exact_1x1_min_m : 0,
                         "exact_1x1_min_k", which == 2 ? is->exact_1x1_min_k : 0,
                         "grouped_t9", (k->grouped_i16_t9 || k->grouped_b_t9) ? Py_True : Py_False,
                         "fused", k->kernel_ep ? Py_True : Py_False);
}

static PyObject *m_packed_b_bytes(PyObject *self, PyObject *args) {
    (void)self;
    const char *isa; int which, K, N;
    if (!PyArg_ParseTuple(args, "siii", &isa, &which, &K, &N)) return NULL;
    if (which != 0 && which != 1) return PyErr_Format(PyExc_ValueError, "qlinear native: matmul kernel %d", which);
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
    if (which != 0 && which != 1) return PyErr_Format(PyExc_ValueError, "qlinear native: matmul kernel %d", which);
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
    if (which != 0 && which != 1) return PyErr_Format(PyExc_ValueError, "qlinear native: matmul kernel %d", which);
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

/* ---------------------------------------------------------------------------------------
 * QuantizeLinear / DequantizeLinear over x seen as (pre, C, post), parameters per C (or 1)
 * ------------------------------------------------------------------------------------- */
typedef struct {
    const ql_isa *isa; int quant;
    const char *x; int x_type; size_t xes;
    char *out; int out_type; size_t oes;
    Py_ssize_t pre, C, post, chunk;   /* tasks: chunks of `chunk` elements of one (pre, c) run */
    Py_ssize_t runs_per_row;
    const float *scale; const int32_t *zp; int per_axis;
    int stream;                       /* dequantize: non-temporal stores (huge outputs) */
} qd_ctx;

static void qd_task(void *vctx, ptrdiff_t t, int thread) {
    (void)thread;
    qd_ctx *q = (qd_ctx *)vctx;
    Py_ssize_t run_len, start, pc = 0;
    const float *s; const int32_t *z; ptrdiff_t ss = 0;
    if (q->per_axis && q->post == 1) {
        /* axis last: runs of C elements with per-element parameters */
        Py_ssize_t row = t / q->runs_per_row, part = t % q->runs_per_row;
        start = row * q->C + part * q->chunk;
        run_len = q->C - part * q->chunk < q->chunk ? q->C - part * q->chunk : q->chunk;
        s = q->scale + part * q->chunk; z = q->zp + part * q->chunk; ss = 1;
    } else if (q->per_axis) {
        Py_ssize_t row = t / q->runs_per_row, part = t % q->runs_per_row;  /* row = pre*C + c */
        pc = row % q->C;
        start = row * q->post + part * q->chunk;
        run_len = q->post - part * q->chunk < q->chunk ? q->post - part * q->chunk : q->chunk;
        s = q->scale + pc; z = q->zp + pc;
    } else {
        Py_ssize_t total = q->pre * q->C * q->post;
        start = t * q->chunk;
        run_len = total - start < q->chunk ? total - start : q->chunk;
        s = q->scale; z = q->zp;
    }
    if (q->quant)
        q->isa->quantize(q->x + start * q->xes, q->x_type, run_len, s, ss, z, ss,
                         q->out + start * q->oes, q->out_type);
    else
        q->isa->dequantize(q->x + start * q->xes, q->x_type, run_len, s, ss, z, ss,
                           (float *)(q->out + start * q->oes), q->stream);
}

/* quantize(isa, x, x_type, pre, C, post, per_axis, scale, zp, out, out_type) and
 * dequantize(isa, x, x_type, pre, C, post, per_axis, scale, zp, out) */
/* Quantize/Dequantize tasks: runs of QD_CHUNK elements; threads from QD_PAR_MIN elements on
 * (below, about 30 us on one core: not worth waking the pool) */
#define QD_CHUNK ((Py_ssize_t)1 << 14)
static int qd_threads(Py_ssize_t n) { return n >= ((Py_ssize_t)1 << 18) ? ql_num_threads() : 1; }

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
    if (n > 0) {
        qd_ctx q = {isa, quant, (const char *)x.buf, x_type, xes, (char *)o.buf, out_type, oes,
                    pre, C, post, 0, 1, (const float *)s.buf, (const int32_t *)z.buf, per_axis && np > 1,
                    /* an output of 16 MiB or more does not stay in the caches anyway: stream it */
                    !quant && n * (Py_ssize_t)oes >= ((Py_ssize_t)16 << 20)};
        Py_ssize_t tasks;
        const Py_ssize_t chunk = QD_CHUNK;
        int threads = qd_threads(n);
        if (q.per_axis) {
            Py_ssize_t len = post == 1 ? C : post;
            q.chunk = len < chunk ? len : chunk;
            q.runs_per_row = (len + q.chunk - 1) / q.chunk;
            tasks = (post == 1 ? pre : pre * C) * q.runs_per_row;
        } else {
            q.chunk = chunk;
            tasks = (n + chunk - 1) / chunk;
        }
        Py_BEGIN_ALLOW_THREADS
        ql_parallel_for(tasks, threads, qd_task, &q);
        Py_END_ALLOW_THREADS
    }
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
    const float *xs = (const float *)x.buf;
    float lo = xs[0], hi = xs[0];
    int nan = 0;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t i = 0;
#if defined(__SSE2__)
    /* four lanes of SSE2 (baseline on x86-64), two accumulators each: minps(v, lo) is
     * v < lo ? v : lo and maxps(v, hi) is v > hi ? v : hi, exactly the scalar tail's
     * comparisons (a NaN is flagged by the unordered compare and the call declines anyway) */
    if (n >= 8) {
        __m128 l0 = _mm_loadu_ps(xs), l1 = l0, h0 = l0, h1 = l0, u = _mm_setzero_ps();
        for (; i + 8 <= n; i += 8) {
            __m128 a = _mm_loadu_ps(xs + i), b = _mm_loadu_ps(xs + i + 4);
            u = _mm_or_ps(u, _mm_or_ps(_mm_cmpunord_ps(a, a), _mm_cmpunord_ps(b, b)));
            l0 = _mm_min_ps(a, l0); l1 = _mm_min_ps(b, l1);
            h0 = _mm_max_ps(a, h0); h1 = _mm_max_ps(b, h1);
        }
        float ls[8], hs[8];
        _mm_storeu_ps(ls, l0); _mm_storeu_ps(ls + 4, l1);
        _mm_storeu_ps(hs, h0); _mm_storeu_ps(hs + 4, h1);
        nan = _mm_movemask_ps(u) != 0;
        for (int j = 0; j < 8; j++) {
            lo = ls[j] < lo ? ls[j] : lo;
            hi = hs[j] > hi ? hs[j] : hi;
        }
    }
#endif
    for (; i < n; i++) {
        float v = xs[i];
        nan |= v != v;
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    Py_END_ALLOW_THREADS
    const float zero = 0.0f;
    float mn = zero < lo ? zero : lo, mx = zero > hi ? zero : hi;
    if (nan || !(-1e37 < (double)lo && (double)hi < 1e37 && (mx == mn || mx - mn > 1e-30f))) {
        ret = Py_None;
        Py_INCREF(ret);
        goto done;
    }
    float scale = mx == mn ? 1.0f : (mx - mn) / 255.0f;
    float initial = zero - mn / scale;
    /* initial is finite here (|mn / scale| <= 255-ish); round half to even, as Python's round */
    float clamped = initial < zero ? zero : (initial > 255.0f ? 255.0f : initial);
    int32_t zp = (int32_t)nearbyintf(clamped);
    qd_ctx q = {isa, 1, (const char *)xs, QL_F32, 4, (char *)o.buf, QL_U8, 1, 1, 1, n, QD_CHUNK, 1,
                &scale, &zp, 0, 0};
    Py_ssize_t tasks = (n + q.chunk - 1) / q.chunk;
    int threads = qd_threads(n);
    Py_BEGIN_ALLOW_THREADS
    ql_parallel_for(tasks, threads, qd_task, &q);
    Py_END_ALLOW_THREADS
    ret = Py_BuildValue("(di)", (double)scale, (int)zp);
done:
    REL(x); REL(o);
    return ret;
}


/* ---------------------------------------------------------------------------------------
 * Convolutions (conv.c): weights packed once per ISA level, then one call per convolution
 * ------------------------------------------------------------------------------------- */
static PyObject *m_conv_w_bytes(PyObject *self, PyObject *args) {
    (void)self;
    const char *isa; int which, M, K;
    long long taps;
    if (!PyArg_ParseTuple(args, "siiiL", &isa, &which, &M, &K, &taps)) return NULL;
    if (which != 0 && which != 2) return PyErr_Format(PyExc_ValueError, "qlinear native: conv kernel %d", which);
    const ql_gemm_kernel *k = kernel_arg(isa, which, NULL);
    if (!k) return NULL;
    if (M < 0 || K < 1 || taps < 1 || K % taps)
        return PyErr_Format(PyExc_ValueError, "qlinear native: bad conv weights shape");
    return PyLong_FromSize_t(ql_conv_w_bytes(k, M, K, (int64_t)taps));
}

/* conv_pack_w(isa, which (0 exact, 2 fast), w, w_type, M, K, taps, wzp int32[M], dst[, portable]):
 * portable nonzero packs with the kernel's table minus its SIMD grouped-order packers
 * (grouped_*_t9 NULL: conv.c's portable loops), so a test can compare both byte for byte. */
static PyObject *m_conv_pack_w(PyObject *self, PyObject *args) {
    (void)self;
    const char *isa; int which, w_type, M, K, portable = 0;
    long long taps;
    PyObject *ow, *oz, *od;
    if (!PyArg_ParseTuple(args, "siOiiiLOO|p", &isa, &which, &ow, &w_type, &M, &K, &taps, &oz, &od, &portable))
        return NULL;
    if (which != 0 && which != 2) return PyErr_Format(PyExc_ValueError, "qlinear native: conv kernel %d", which);
    const ql_gemm_kernel *k = kernel_arg(isa, which, NULL);
    if (!k) return NULL;
    ql_gemm_kernel kport;
    if (portable) {
        kport = *k;
        kport.grouped_i16_t9 = NULL;
        kport.grouped_b_t9 = NULL;
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
    if (kind < 0 || kind > 2) return PyErr_Format(PyExc_ValueError, "qlinear native: conv kind %d", kind);
    int depthwise = kind == 1;
    const ql_isa *isa;
    const ql_gemm_kernel *k = kernel_arg(isa_name, kind == 2 ? 2 : 0, &isa);
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


/* The requantization multiplier float32(float32(x_scale * w_scale) / y_scale) in *m; 0 when a
 * scale or the result is not finite (inf * 0 is NaN, which has no integer) or y_scale is 0 (the
 * caller's full path then raises its error). float32 arithmetic in the contract's order,
 * uncontracted (-ffp-contract=off).
 * multiplier(x_scale, w_scale, y_scale) -> that multiplier as a Python float, or None. Scales
 * arrive as float32 values (exact as doubles). For the lean paths of plain calls: no NumPy
 * temporaries, no error-state context. */
static int multiplier_f32(float xs, float ws, float ys, float *m) {
    float prod = xs * ws;   /* rounded to float32 here, then divided */
    *m = prod / ys;
    return isfinite(xs) && isfinite(ws) && isfinite(ys) && ys != 0.0f && isfinite(*m);
}

static PyObject *m_multiplier(PyObject *self, PyObject *args) {
    (void)self;
    float xs, ws, ys, m;
    if (!PyArg_ParseTuple(args, "fff", &xs, &ws, &ys)) return NULL;
    if (!multiplier_f32(xs, ws, ys, &m)) Py_RETURN_NONE;
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
    /* depthwise, 2-D, one channel per group, at most 64 taps (conv.c's DWCL_MAX_TAPS): the
     * centered taps followed by the channels-last kernel's form, as a prepared form keeps them
     * (conv.h: blocks of 16 channels, taps padded to pairs, [block][tap][channel], zeros beyond) */
    int64_t cl_taps = taps + (taps & 1), cl_blocks = (p.M + 15) / 16;
    int with_cl = depthwise && p.nsp == 2 && p.M == p.group && taps <= 64;
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
            ok_m = multiplier_f32(xs, ((const float *)ws.buf)[i], ys, &mult[i]);
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
    int rc = 0, kind = depthwise ? 1 : 0;
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
                kind = 2;
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
 * depthwise Conv (fconv.c); every geometry value and buffer size is checked here, and the
 * kernel's padded scratch spans every window, so any call stays in bounds */
int ql_float_dwconv2d(const float *x, const float *w, const float *b, float *y, ptrdiff_t N, ptrdiff_t C,
                      ptrdiff_t H, ptrdiff_t W, ptrdiff_t mg, ptrdiff_t OH, ptrdiff_t OW, ptrdiff_t kh,
                      ptrdiff_t kw, ptrdiff_t sh, ptrdiff_t sw, ptrdiff_t dh, ptrdiff_t dw, ptrdiff_t pt,
                      ptrdiff_t pl, int threads);

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
    rc = ql_float_dwconv2d((const float *)x.buf, (const float *)w.buf, ob != Py_None ? (const float *)b.buf : NULL,
                           (float *)y.buf, N, C, H, W, mg, OH, OW, g[7], g[8], g[9], g[10], g[11], g[12], g[13],
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

/* kernel_peak(isa, which, reps, tasks, threads) -> multiply-adds done (peak.c) */
long long ql_kernel_peak(const ql_gemm_kernel *k, long reps, int tasks, int threads);
static PyObject *m_kernel_peak(PyObject *self, PyObject *args) {
    (void)self;
    const char *isa; int which, tasks, threads; long reps;
    if (!PyArg_ParseTuple(args, "silii", &isa, &which, &reps, &tasks, &threads)) return NULL;
    const ql_gemm_kernel *k = kernel_arg(isa, which, NULL);
    if (!k) return NULL;
    if (reps < 1 || tasks < 1 || threads < 1)
        return PyErr_Format(PyExc_ValueError, "qlinear native: kernel_peak needs positive counts");
    long long macs;
    Py_BEGIN_ALLOW_THREADS
    macs = ql_kernel_peak(k, reps, tasks, threads);
    Py_END_ALLOW_THREADS
    return PyLong_FromLongLong(macs);
}

/* outbuf.c: pooled output buffers */
PyObject *ql_py_empty(PyObject *self, PyObject *args);
PyObject *ql_py_pool_stats(PyObject *self, PyObject *args);
PyObject *ql_py_pool_clear(PyObject *self, PyObject *args);
int ql_outbuf_init(void);

/* conv_path_counts() -> (implicit, im2col, merged, merged images, merged tails, shifted,
 * parallel chunks): GEMM-path convolutions run so far on each path, then the implicit path's
 * GEMMs over several images, their images and the merged tail panels their tasks ran, then the
 * implicit runs on shifted planes and those whose images ran in parallel (one thread an image) */
static PyObject *m_conv_path_counts(PyObject *self, PyObject *args) {
    (void)self; (void)args;
    long long a, b, m, mi, mt, sh, pc;
    ql_conv_path_counts(&a, &b, &m, &mi, &mt, &sh, &pc);
    return Py_BuildValue("(LLLLLLL)", a, b, m, mi, mt, sh, pc);
}

/* conv_tile_counts() -> (chunked, paired): GEMM convolutions run so far on a kernel with chunks
 * (amx-s8u8) and implicit-GEMM tasks that ran tile pairs (ikernel2_ep) */
static PyObject *m_conv_tile_counts(PyObject *self, PyObject *args) {
    (void)self; (void)args;
    long long a, b;
    ql_conv_tile_counts(&a, &b);
    return Py_BuildValue("(LL)", a, b);
}

/* conv_kernel_name(isa, which, K, taps) -> the name of the kernel that packs and runs a
 * convolution of K = C/group * taps weights per row on that level's kernel `which` (kernel_arg's) */
static PyObject *m_conv_kernel_name(PyObject *self, PyObject *args) {
    (void)self;
    const char *isa_name; int which; long long K, taps;
    if (!PyArg_ParseTuple(args, "siLL", &isa_name, &which, &K, &taps)) return NULL;
    if (K < 1 || taps < 1) return PyErr_Format(PyExc_ValueError, "qlinear native: conv_kernel_name K %lld taps %lld", K, taps);
    const ql_gemm_kernel *k = kernel_arg(isa_name, which, NULL);
    if (!k) return NULL;
    return PyUnicode_FromString(ql_conv_kernel_name(k, (int64_t)K, (int64_t)taps));
}

/* conv_copy_counts() -> (split rows, tap rows): implicit-path stride-2 copy rows so far, input
 * rows split into both column phases at once, and shifted tap rows copied from those phase rows */
static PyObject *m_conv_copy_counts(PyObject *self, PyObject *args) {
    (void)self; (void)args;
    long long a, b;
    ql_conv_copy_counts(&a, &b);
    return Py_BuildValue("(LL)", a, b);
}

/* conv_dw_path_counts() -> (channels-last, plane, rows): depthwise convolutions run so far on
 * each path */
static PyObject *m_conv_dw_path_counts(PyObject *self, PyObject *args) {
    (void)self; (void)args;
    long long a, b, c;
    ql_conv_dw_path_counts(&a, &b, &c);
    return Py_BuildValue("(LLL)", a, b, c);
}

/* conv_in_task_packs() -> plain convolutions whose weights were packed in the GEMM's tasks */
static PyObject *m_conv_in_task_packs(PyObject *self, PyObject *args) {
    (void)self; (void)args;
    return PyLong_FromLongLong(ql_conv_in_task_packs());
}

/* conv_copy_job_packs() -> plain fast-path convolutions whose weights were packed in the implicit
 * GEMM's first copy job */
static PyObject *m_conv_copy_job_packs(PyObject *self, PyObject *args) {
    (void)self; (void)args;
    return PyLong_FromLongLong(ql_conv_copy_job_packs());
}

/* tail_counts() -> (implicit tiles, packed panels, implicit dot tiles) that ran a narrow
 * tail kernel so far */
static PyObject *m_tail_counts(PyObject *self, PyObject *args) {
    (void)self; (void)args;
    return Py_BuildValue("(LLL)", __atomic_load_n(&ql_tail_calls[0], __ATOMIC_RELAXED),
                         __atomic_load_n(&ql_tail_calls[1], __ATOMIC_RELAXED),
                         __atomic_load_n(&ql_tail_calls[2], __ATOMIC_RELAXED));
}

/* amx_foreign_tiles(load) -> bool: load = 1 loads other tile shapes on this thread, as
 * another library's AMX code would; load = 0: whether they are still loaded (tests of
 * amx-u8s8's task_begin / task_end); an error where the amx level does not run */
static PyObject *m_amx_foreign_tiles(PyObject *self, PyObject *args) {
    (void)self;
    int load;
    if (!PyArg_ParseTuple(args, "p", &load)) return NULL;
#if QL_X86
    if (ql_isa_by_name("amx")) return PyBool_FromLong(ql_amx_foreign_tiles(load));
#endif
    PyErr_SetString(PyExc_RuntimeError, "qlinear: the amx level does not run here");
    return NULL;
}

/* gemm_fused_count() -> GEMMs that ran on their kernel's fused epilogue (kernel_ep) so far */
static PyObject *m_gemm_fused_count(PyObject *self, PyObject *args) {
    (void)self; (void)args;
    return PyLong_FromLongLong(__atomic_load_n(&ql_gemm_fused_calls, __ATOMIC_RELAXED));
}

/* gemm_stream(bytes=-1) -> (threshold before, GEMM tasks streamed so far): tests lower the
 * int32-output size from which MatMulInteger streams its output (gemm.c), and read the count */
static PyObject *m_gemm_stream(PyObject *self, PyObject *args) {
    (void)self;
    long long bytes = -1;
    if (!PyArg_ParseTuple(args, "|L", &bytes)) return NULL;
    long long before = __atomic_load_n(&ql_gemm_stream_bytes, __ATOMIC_RELAXED);
    if (bytes >= 0) __atomic_store_n(&ql_gemm_stream_bytes, bytes, __ATOMIC_RELAXED);
    return Py_BuildValue("LL", before, __atomic_load_n(&ql_gemm_stream_tasks, __ATOMIC_RELAXED));
}

/* gemm_pair_count() -> panel pairs packed in one pass by plain matmuls' per-call packers */
static PyObject *m_gemm_pair_count(PyObject *self, PyObject *args) {
    (void)self; (void)args;
    return PyLong_FromLongLong(__atomic_load_n(&ql_gemm_pair_packs, __ATOMIC_RELAXED));
}

static PyMethodDef methods[] = {
    {"amx_foreign_tiles", m_amx_foreign_tiles, METH_VARARGS, "Tests: load other AMX tile shapes on this thread."},
    {"gemm_stream", m_gemm_stream, METH_VARARGS, "Tests: (threshold, tasks streamed); sets the int32-output bytes from which MatMulInteger streams its output."},
    {"gemm_pair_count", m_gemm_pair_count, METH_NOARGS, "Panel pairs packed in one pass by plain matmuls (pack_R_pairs)."},
    {"gemm_fused_count", m_gemm_fused_count, METH_NOARGS, "GEMMs whose tiles ran on the kernel's fused epilogue (kernel_ep)."},
    {"conv_in_task_packs", m_conv_in_task_packs, METH_NOARGS, "Plain convolutions whose weights were packed inside the implicit GEMM's tasks."},
    {"conv_copy_job_packs", m_conv_copy_job_packs, METH_NOARGS, "Plain fast-path convolutions whose weights were packed in the implicit GEMM's first copy job."},
    {"tail_counts", m_tail_counts, METH_NOARGS, "Implicit tiles, packed panels and implicit dot-kernel tiles that ran a narrow tail kernel."},
    {"conv_tile_counts", m_conv_tile_counts, METH_NOARGS, "GEMM convolutions run on a kernel with chunks (amx-s8u8), implicit-GEMM tasks that ran tile pairs."},
    {"conv_kernel_name", m_conv_kernel_name, METH_VARARGS, "The kernel that packs and runs a convolution of K weights per row and taps taps on a level's kernel."},
    {"conv_path_counts", m_conv_path_counts, METH_NOARGS, "GEMM convolutions run on the implicit and im2col paths, implicit GEMMs over several images, their images and merged tail panels, implicit runs on shifted planes and implicit runs whose images ran in parallel."},
    {"conv_copy_counts", m_conv_copy_counts, METH_NOARGS, "Implicit-path stride-2 copy rows: input rows split into both column phases at once, and shifted tap rows copied from those phase rows."},
    {"conv_dw_path_counts", m_conv_dw_path_counts, METH_NOARGS, "Depthwise convolutions run on the channels-last, plane and rows paths."},
    {"kernel_peak", m_kernel_peak, METH_VARARGS, "Run a micro-kernel on L1-resident operands (peak rate)."},
    {"empty", ql_py_empty, METH_VARARGS, "An output buffer of n bytes from the bounded output pool."},
    {"pool_stats", ql_py_pool_stats, METH_NOARGS, "(cached bytes, cached blocks, min bytes, max MiB) of the output pool."},
    {"pool_clear", ql_py_pool_clear, METH_NOARGS, "Free the output pool's cached blocks."},
    {"info", m_info, METH_NOARGS, "ISA levels this CPU runs (best first), compiler, threads."},
    {"set_isa", m_set_isa, METH_VARARGS, "Select the ISA level by name."},
    {"get_isa", m_get_isa, METH_NOARGS, "The selected ISA level."},
    {"set_threads", m_set_threads, METH_VARARGS, "Set the thread pool size."},
    {"get_threads", m_get_threads, METH_NOARGS, "The thread pool size."},
    {"kernel_info", m_kernel_info, METH_VARARGS, "GEMM kernel of an ISA (which: 0 exact, 1 fast)."},
    {"packed_b_bytes", m_packed_b_bytes, METH_VARARGS, "Bytes of one packed b entry."},
    {"pack_b", m_pack_b, METH_VARARGS, "Pack matmul b for a kernel."},
    {"matmul", m_matmul, METH_VARARGS, "Batched matmul on packed b, fused epilogue."},
    {"matmul_raw", m_matmul_raw, METH_VARARGS, "Batched matmul on b as given (packed inside the GEMM)."},
    {"bytes_within", m_bytes_within, METH_VARARGS, "Whether every byte (u8 form) lies in [lo, hi]."},
    {"quantize", m_quantize, METH_VARARGS, "QuantizeLinear."},
    {"dequantize", m_dequantize, METH_VARARGS, "DequantizeLinear."},
    {"dynamic_quantize", m_dynamic_quantize, METH_VARARGS, "DynamicQuantizeLinear's usual case (uint8): parameters and quantization in one call, or None."},
    {"conv_w_bytes", m_conv_w_bytes, METH_VARARGS, "Bytes of packed conv weights."},
    {"conv_pack_w", m_conv_pack_w, METH_VARARGS, "Pack conv weights (M, K) for an ISA's exact kernel."},
    {"conv_pack_w_auto", m_conv_pack_w_auto, METH_VARARGS, "Pack a plain call's conv weights: the 7-bit form if they fit, else exact."},
    {"conv", m_conv, METH_VARARGS, "QLinearConv / ConvInteger on packed weights, fused epilogue."},
    {"multiplier", m_multiplier, METH_VARARGS, "float32(float32(x_scale * w_scale) / y_scale), or None if not finite."},
    {"conv_plain", m_conv_plain, METH_VARARGS, "A plain QLinearConv / ConvInteger: multiplier, packing and convolution in one call."},
    {"qbinary", m_qbinary, METH_VARARGS, "QLinearAdd / QLinearMul (com.microsoft) on bytes."},
    {"fdwconv2d", m_fdwconv2d, METH_VARARGS, "Float32 depthwise Conv (the backend's float glue), NumPy's order of operations."},
    {"fim2col", m_fim2col, METH_VARARGS, "The im2col matrix of a float32 Conv (the backend's float glue)."},
    {"qdqconv", m_qdqconv, METH_VARARGS, "The float tail (scale, bias, Relu / LeakyRelu, QuantizeLinear) of an exact QDQ Conv."},
    {"lut", m_lut, METH_VARARGS, "Byte table lookup (QLinearSigmoid, QLinearLeakyRelu, requantization)."},
    {"maxpool2d", m_maxpool2d, METH_VARARGS, "MaxPool of uint8 / int8 planes (two spatial axes)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_qlnative", "qlinear's compiled engine.", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__qlnative(void) {
    current_isa = ql_isa_get(0);
    if (ql_outbuf_init() < 0) return NULL;
    return PyModule_Create(&moddef);
}
