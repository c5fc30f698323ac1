/* DynamicQuantizeMatMul bound to its constant operands (transformer/dqmm.c): dqmm_bind checks
 * and keeps the packed B, b_scale and bias once (a capsule holding their buffers), dqmm_run
 * then takes only A and the output, so that a graph run pays one argument check per node. */
#include "args.h"
#include "transformer.h"

typedef struct {
    ql_dqmm d;
    Py_buffer pk, cs, zc, bs, bias;  /* held for the capsule's life: the constants' memory */
} dqmm_bound;

static const char DQMM_NAME[] = "qlinear.dqmm";

static void dqmm_free(PyObject *cap) {
    dqmm_bound *b = (dqmm_bound *)PyCapsule_GetPointer(cap, DQMM_NAME);
    if (!b) return;
    REL(b->pk); REL(b->cs); REL(b->zc); REL(b->bs); REL(b->bias);
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
    Py_ssize_t npad = (N + k->nr - 1) / k->nr * k->nr;
    if (get_buf(opk, &b->pk, 0, (Py_ssize_t)ql_packed_b_bytes(k, K, N), "packed b") < 0 ||
        get_buf(ocs, &b->cs, 0, k->form == QL_FORM_U8S8 ? npad * 4 : 0, "b colsums") < 0 ||
        get_buf(ozc, &b->zc, 0, (Py_ssize_t)N * 4, "b zcol") < 0 ||
        get_buf(obs, &b->bs, 0, (per_column ? (Py_ssize_t)N : 1) * 4, "b_scale") < 0 ||
        (obias != Py_None && get_buf(obias, &b->bias, 0, (Py_ssize_t)N * 4, "bias") < 0)) {
        REL(b->pk); REL(b->cs); REL(b->zc); REL(b->bs); REL(b->bias);
        PyMem_Free(b);
        return NULL;
    }
    b->d.isa = isa; b->d.kern = k; b->d.M = M; b->d.N = N; b->d.K = K;
    b->d.bpack = b->pk.buf; b->d.bcolsums = (const int32_t *)b->cs.buf; b->d.bzcol = (const int32_t *)b->zc.buf;
    b->d.b_scale = (const float *)b->bs.buf; b->d.per_column = per_column != 0;
    b->d.bias = obias != Py_None ? (const float *)b->bias.buf : NULL;
    b->d.bs_max = bs_max;
    PyObject *cap = PyCapsule_New(b, DQMM_NAME, dqmm_free);
    if (!cap) {
        REL(b->pk); REL(b->cs); REL(b->zc); REL(b->bs); REL(b->bias);
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

PyMethodDef ql_bind_dqmm_methods[] = {
    {"dqmm_bind", m_dqmm_bind, METH_VARARGS, "DynamicQuantizeMatMul's constant operands checked and kept (a capsule)."},
    {"dqmm_run", (PyCFunction)(void (*)(void))m_dqmm_run, METH_FASTCALL,
     "DynamicQuantizeMatMul on bound constants: quantize A, integer product, float32 scaling."},
    {NULL, NULL, 0, NULL},
};
