/* DynamicQuantizeMatMul, QAttention and SkipLayerNormalization bound to their constant operands
 * (transformer/bound.c, transformer/transformer.c): dqmm_bind / qattention_bind / sln_bind check
 * and keep the packed weight, its scales, the bias (gamma, beta) once (a capsule holding their
 * buffers), dqmm_run / qattention_run / sln_run then take only the tensors that change between
 * runs and the outputs, so that a graph run pays one argument check per node. */
#include "args.h"
#include "transformer.h"

/* A packed integer weight's buffers (pack_b's packed matrix, column sums, zero-point column
 * terms), its scale (1 or N float32) and an optional float32[N] bias: held for a capsule's life */
typedef struct {
    Py_buffer pk, cs, zc, s, bias;
} bound_weight;

static void weight_release(bound_weight *w) {
    REL(w->pk); REL(w->cs); REL(w->zc); REL(w->s); REL(w->bias);
}

/* the buffers of a K x N weight packed for kernel k, checked for their sizes (names "packed
 * <what>", "<what> colsums", "<what> zcol", "<what>_scale", "bias"); bias may be None where
 * bias_optional. 0, or -1 with the Python error set and nothing held */
static int weight_hold(bound_weight *w, const ql_gemm_kernel *k, int K, int N, PyObject *opk, PyObject *ocs,
                       PyObject *ozc, PyObject *os, int per_column, PyObject *obias, int bias_optional,
                       const char *what) {
    char npk[32], ncs[32], nzc[32], ns[32];
    snprintf(npk, sizeof npk, "packed %s", what);
    snprintf(ncs, sizeof ncs, "%s colsums", what);
    snprintf(nzc, sizeof nzc, "%s zcol", what);
    snprintf(ns, sizeof ns, "%s_scale", what);
    Py_ssize_t npad = (N + k->nr - 1) / k->nr * k->nr;
    if (get_buf(opk, &w->pk, 0, (Py_ssize_t)ql_packed_b_bytes(k, K, N), npk) < 0 ||
        get_buf(ocs, &w->cs, 0, k->form == QL_FORM_U8S8 ? npad * 4 : 0, ncs) < 0 ||
        get_buf(ozc, &w->zc, 0, (Py_ssize_t)N * 4, nzc) < 0 ||
        get_buf(os, &w->s, 0, (per_column ? (Py_ssize_t)N : 1) * 4, ns) < 0 ||
        ((!bias_optional || obias != Py_None) && get_buf(obias, &w->bias, 0, (Py_ssize_t)N * 4, "bias") < 0)) {
        weight_release(w);
        return -1;
    }
    return 0;
}

typedef struct {
    ql_dqmm d;
    bound_weight w;  /* held for the capsule's life: the constants' memory */
} dqmm_bound;

static const char DQMM_NAME[] = "qlinear.dqmm";

static void dqmm_free(PyObject *cap) {
    dqmm_bound *b = (dqmm_bound *)PyCapsule_GetPointer(cap, DQMM_NAME);
    if (!b) return;
    weight_release(&b->w);
    PyMem_Free(b);
}

/* dqmm_bind(isa, which, M, N, K, packed, colsums, zcol, b_scale float32[N or 1], per_column,
 *           bias float32[N] or None, bs_max) -> capsule: B packed by pack_b for kernel `which`
 *           (one matrix, Bb 1) */
static PyObject *m_dqmm_bind(PyObject *self, PyObject *args) {
    (void)self;
    const char *isa_name;
    int which, M, N, K, per_column;
    PyObject *opk, *ocs, *ozc, *obs, *obias;
    double bs_max;
    if (!PyArg_ParseTuple(args, "siiiiOOOOiOd", &isa_name, &which, &M, &N, &K, &opk, &ocs, &ozc, &obs, &per_column,
                          &obias, &bs_max))
        return NULL;
    if (which != QL_KERNEL_EXACT && which != QL_KERNEL_FAST)
        return PyErr_Format(PyExc_ValueError, "qlinear native: matmul kernel %d", which);
    const ql_isa *isa;
    const ql_gemm_kernel *k = kernel_arg(isa_name, which, &isa);
    if (!k) return NULL;
    /* M·K and M·N in bytes and int32s must not overflow (the run allocates them) */
    if (M < 1 || N < 1 || K < 1 || (Py_ssize_t)M > PY_SSIZE_T_MAX / 4 / N || (Py_ssize_t)M > PY_SSIZE_T_MAX / K ||
        !(bs_max == bs_max))
        return PyErr_Format(PyExc_ValueError, "qlinear native: bad dqmm geometry");
    dqmm_bound *b = (dqmm_bound *)PyMem_Calloc(1, sizeof *b);
    if (!b) return PyErr_NoMemory();
    if (weight_hold(&b->w, k, K, N, opk, ocs, ozc, obs, per_column, obias, 1, "b") < 0) {
        PyMem_Free(b);
        return NULL;
    }
    b->d.isa = isa; b->d.kern = k; b->d.M = M; b->d.N = N; b->d.K = K;
    b->d.bpack = b->w.pk.buf; b->d.bcolsums = (const int32_t *)b->w.cs.buf; b->d.bzcol = (const int32_t *)b->w.zc.buf;
    b->d.b_scale = (const float *)b->w.s.buf; b->d.per_column = per_column != 0;
    b->d.bias = obias != Py_None ? (const float *)b->w.bias.buf : NULL;
    b->d.bs_max = bs_max;
    PyObject *cap = PyCapsule_New(b, DQMM_NAME, dqmm_free);
    if (!cap) {
        weight_release(&b->w);
        PyMem_Free(b);
    }
    return cap;
}

/* dqmm_run(capsule, a float32[M·K], y float32[M·N]) -> bool: True with y written; False (y
 * not meaningful) where the caller's general path must run: another ISA level selected since
 * the bind, or ql_dqmm_run's 0 */
static PyObject *m_dqmm_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) return PyErr_Format(PyExc_TypeError, "qlinear native: dqmm_run takes 3 arguments");
    dqmm_bound *b = (dqmm_bound *)PyCapsule_GetPointer(args[0], DQMM_NAME);
    if (!b) return NULL;
    if (b->d.isa != current_isa) Py_RETURN_FALSE;
    Py_buffer a = {0}, y = {0};
    PyObject *ret = NULL;
    if (get_buf(args[1], &a, 0, (Py_ssize_t)b->d.M * b->d.K * 4, "a") < 0 ||
        get_buf(args[2], &y, 1, (Py_ssize_t)b->d.M * b->d.N * 4, "y") < 0)
        goto done;
    int rc, threads = ql_num_threads();
    Py_BEGIN_ALLOW_THREADS
    rc = ql_dqmm_run(&b->d, (const float *)a.buf, (float *)y.buf, threads);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        PyErr_NoMemory();
        goto done;
    }
    ret = PyBool_FromLong(rc);
done:
    REL(a); REL(y);
    return ret;
}

typedef struct {
    ql_qattention_bound d;
    bound_weight w;  /* held for the capsule's life: the constants' memory */
} qattention_bound;

static const char QATT_NAME[] = "qlinear.qattention";

static void qattention_free(PyObject *cap) {
    qattention_bound *b = (qattention_bound *)PyCapsule_GetPointer(cap, QATT_NAME);
    if (!b) return;
    weight_release(&b->w);
    PyMem_Free(b);
}

/* qattention_bind(isa, which, K, cols, x_type, packed, colsums, zcol, weight_scale float32[1 or
 *                 cols], per_column, bias float32[cols], batch, seq, heads, head, past_len,
 *                 mask_kind, unidirectional, scale, mask_filter_value) -> capsule */
static PyObject *m_qattention_bind(PyObject *self, PyObject *args) {
    (void)self;
    const char *isa_name;
    int which, K, cols, x_type, per_column, mask_kind, uni;
    Py_ssize_t batch, seq, heads, head, past_len;
    PyObject *opk, *ocs, *ozc, *ows, *obias;
    double scale, filter;
    if (!PyArg_ParseTuple(args, "siiiiOOOOiOnnnnnipdd", &isa_name, &which, &K, &cols, &x_type, &opk, &ocs, &ozc,
                          &ows, &per_column, &obias, &batch, &seq, &heads, &head, &past_len, &mask_kind, &uni, &scale,
                          &filter))
        return NULL;
    if (which != QL_KERNEL_EXACT && which != QL_KERNEL_FAST)
        return PyErr_Format(PyExc_ValueError, "qlinear native: matmul kernel %d", which);
    const ql_isa *isa;
    const ql_gemm_kernel *k = kernel_arg(isa_name, which, &isa);
    if (!k) return NULL;
    /* every dimension >= 1 (past_len >= 0), cols = 3 · heads · head, and the run's buffers
     * (rows · cols doubles, the scores, present) far below PY_SSIZE_T_MAX */
    double total = (double)past_len + (double)seq;
    if (K < 1 || cols < 1 || batch < 1 || seq < 1 || heads < 1 || head < 1 || past_len < 0 ||
        (x_type != QL_U8 && x_type != QL_I8) || mask_kind < QL_ATT_MASK_NONE || mask_kind > QL_ATT_MASK_END_START ||
        (double)batch * (double)seq * (double)cols * 8.0 >= 1125899906842624.0 ||
        (double)batch * (double)heads * total * (double)head * 8.0 >= 1125899906842624.0 ||
        (double)cols != 3.0 * (double)heads * (double)head || (double)batch * (double)seq > (double)INT_MAX)
        return PyErr_Format(PyExc_ValueError, "qlinear native: bad qattention geometry");
    qattention_bound *b = (qattention_bound *)PyMem_Calloc(1, sizeof *b);
    if (!b) return PyErr_NoMemory();
    if (weight_hold(&b->w, k, K, cols, opk, ocs, ozc, ows, per_column, obias, 0, "weight") < 0) {
        PyMem_Free(b);
        return NULL;
    }
    ql_qattention_bound *d = &b->d;
    d->isa = isa; d->kern = k; d->K = K; d->cols = cols; d->x_type = x_type;
    d->bpack = b->w.pk.buf; d->bcolsums = (const int32_t *)b->w.cs.buf; d->bzcol = (const int32_t *)b->w.zc.buf;
    d->weight_scale = (const float *)b->w.s.buf; d->per_column = per_column != 0; d->bias = (const float *)b->w.bias.buf;
    d->batch = batch; d->seq = seq; d->heads = heads; d->head = head; d->past_len = past_len;
    d->mask_kind = mask_kind; d->unidirectional = uni; d->scale = scale; d->filter = filter;
    PyObject *cap = PyCapsule_New(b, QATT_NAME, qattention_free);
    if (!cap) {
        weight_release(&b->w);
        PyMem_Free(b);
    }
    return cap;
}

/* qattention_run(capsule, x, input_scale (a finite float), input_zero_point (int), mask int32 or
 * None, past float32 or None, out float32, present float32) -> bool: True with out and present
 * written; False (nothing meaningful written) when another ISA level is selected since the bind
 * or input_scale is not finite. The buffers' sizes are those of the bound geometry. */
static PyObject *m_qattention_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 8) return PyErr_Format(PyExc_TypeError, "qlinear native: qattention_run takes 8 arguments");
    qattention_bound *b = (qattention_bound *)PyCapsule_GetPointer(args[0], QATT_NAME);
    if (!b) return NULL;
    const ql_qattention_bound *d = &b->d;
    double sx = PyFloat_AsDouble(args[2]);
    if (sx == -1.0 && PyErr_Occurred()) return NULL;
    long zx = PyLong_AsLong(args[3]);
    if (zx == -1 && PyErr_Occurred()) return NULL;
    if (zx < (d->x_type == QL_U8 ? 0 : -128) || zx > (d->x_type == QL_U8 ? 255 : 127))
        return PyErr_Format(PyExc_ValueError, "qlinear native: qattention input_zero_point %ld", zx);
    if (d->isa != current_isa || !isfinite(sx) || (float)sx != sx) Py_RETURN_FALSE;
    PyObject *omask = args[4], *opast = args[5];
    if ((d->mask_kind == QL_ATT_MASK_NONE) != (omask == Py_None) || (d->past_len > 0) != (opast != Py_None))
        return PyErr_Format(PyExc_ValueError, "qlinear native: qattention_run mask or past not as bound");
    Py_ssize_t B = d->batch, S = d->seq, N = d->heads, h = d->head, T = d->past_len + S;
    Py_ssize_t mask_n[] = {0, B * T, B * S * T, B, 2 * B};
    Py_buffer x = {0}, mask = {0}, past = {0}, out = {0}, present = {0};
    PyObject *ret = NULL;
    if (get_buf(args[1], &x, 0, B * S * d->K, "x") < 0 || get_buf(args[6], &out, 1, B * S * N * h * 4, "out") < 0 ||
        get_buf(args[7], &present, 1, 2 * B * N * T * h * 4, "present") < 0 ||
        (omask != Py_None && get_buf(omask, &mask, 0, mask_n[d->mask_kind] * 4, "mask") < 0) ||
        (opast != Py_None && get_buf(opast, &past, 0, 2 * B * N * d->past_len * h * 4, "past") < 0))
        goto done;
    int rc, threads = ql_num_threads();
    Py_BEGIN_ALLOW_THREADS
    rc = ql_qattention_bound_run(d, x.buf, (float)sx, (int32_t)zx, mask.obj ? (const int32_t *)mask.buf : NULL,
                                 past.obj ? (const float *)past.buf : NULL, (float *)out.buf, (float *)present.buf,
                                 threads);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        PyErr_NoMemory();
        goto done;
    }
    ret = PyBool_FromLong(rc == 1);
done:
    REL(x); REL(mask); REL(past); REL(out); REL(present);
    return ret;
}

typedef struct {
    Py_ssize_t rows, hidden;
    double eps;
    Py_buffer g, beta, bias;  /* float64 [hidden] each (beta, bias optional) */
} sln_bound;

static const char SLN_NAME[] = "qlinear.skip_layer_norm";

static void sln_free(PyObject *cap) {
    sln_bound *b = (sln_bound *)PyCapsule_GetPointer(cap, SLN_NAME);
    if (!b) return;
    REL(b->g); REL(b->beta); REL(b->bias);
    PyMem_Free(b);
}

/* sln_bind(gamma float64[hidden], beta float64[hidden] or None, bias float64[hidden] or None,
 *          rows, hidden, epsilon) -> capsule */
static PyObject *m_sln_bind(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *og, *obeta, *obias;
    Py_ssize_t rows, hidden;
    double eps;
    if (!PyArg_ParseTuple(args, "OOOnnd", &og, &obeta, &obias, &rows, &hidden, &eps)) return NULL;
    /* rows · hidden · 8 (the work rows' bound, too) must not overflow */
    if (rows < 1 || hidden < 1 || rows > PY_SSIZE_T_MAX / 8 / hidden)
        return PyErr_Format(PyExc_ValueError, "qlinear native: bad skip_layer_norm geometry");
    sln_bound *b = (sln_bound *)PyMem_Calloc(1, sizeof *b);
    if (!b) return PyErr_NoMemory();
    if (get_buf(og, &b->g, 0, hidden * 8, "gamma") < 0 ||
        (obeta != Py_None && get_buf(obeta, &b->beta, 0, hidden * 8, "beta") < 0) ||
        (obias != Py_None && get_buf(obias, &b->bias, 0, hidden * 8, "bias") < 0)) {
        REL(b->g); REL(b->beta); REL(b->bias);
        PyMem_Free(b);
        return NULL;
    }
    b->rows = rows; b->hidden = hidden; b->eps = eps;
    PyObject *cap = PyCapsule_New(b, SLN_NAME, sln_free);
    if (!cap) {
        REL(b->g); REL(b->beta); REL(b->bias);
        PyMem_Free(b);
    }
    return cap;
}

/* sln_run(capsule, x, skip float32 [rows·hidden], y [rows·hidden], mean [rows], inv_std [rows],
 * sum [rows·hidden] float32): skip_layer_norm on the bound parameters and geometry */
static PyObject *m_sln_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 7) return PyErr_Format(PyExc_TypeError, "qlinear native: sln_run takes 7 arguments");
    sln_bound *b = (sln_bound *)PyCapsule_GetPointer(args[0], SLN_NAME);
    if (!b) return NULL;
    Py_ssize_t n = b->rows * b->hidden;
    Py_buffer x = {0}, sk = {0}, y = {0}, m = {0}, iv = {0}, su = {0};
    PyObject *ret = NULL;
    int ok = 0;
    if (get_buf(args[1], &x, 0, n * 4, "input") < 0 || get_buf(args[2], &sk, 0, n * 4, "skip") < 0 ||
        get_buf(args[3], &y, 1, n * 4, "y") < 0 || get_buf(args[4], &m, 1, b->rows * 4, "mean") < 0 ||
        get_buf(args[5], &iv, 1, b->rows * 4, "inv_std") < 0 || get_buf(args[6], &su, 1, n * 4, "sum") < 0)
        goto done;
    Py_BEGIN_ALLOW_THREADS
    ok = ql_skip_layer_norm_f32((const float *)x.buf, (const float *)sk.buf, (const double *)b->g.buf,
                                b->beta.obj ? (const double *)b->beta.buf : NULL,
                                b->bias.obj ? (const double *)b->bias.buf : NULL, b->rows, b->hidden, b->eps,
                                (float *)y.buf, (float *)m.buf, (float *)iv.buf, (float *)su.buf);
    Py_END_ALLOW_THREADS
    if (!ok) {
        PyErr_NoMemory();
        goto done;
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    REL(x); REL(sk); REL(y); REL(m); REL(iv); REL(su);
    return ret;
}

PyMethodDef ql_bind_bound_methods[] = {
    {"dqmm_bind", m_dqmm_bind, METH_VARARGS, "DynamicQuantizeMatMul's constant operands checked and kept (a capsule)."},
    {"dqmm_run", (PyCFunction)(void (*)(void))m_dqmm_run, METH_FASTCALL,
     "DynamicQuantizeMatMul on bound constants: quantize A, integer product, float32 scaling."},
    {"qattention_bind", m_qattention_bind, METH_VARARGS, "QAttention's constant operands and geometry checked and kept (a capsule)."},
    {"qattention_run", (PyCFunction)(void (*)(void))m_qattention_run, METH_FASTCALL,
     "QAttention on bound constants: integer product, projection, attention."},
    {"sln_bind", m_sln_bind, METH_VARARGS, "SkipLayerNormalization's float64 parameters and geometry kept (a capsule)."},
    {"sln_run", (PyCFunction)(void (*)(void))m_sln_run, METH_FASTCALL,
     "SkipLayerNormalization on bound parameters (float64 inside, rounded once)."},
    {NULL, NULL, 0, NULL},
};
