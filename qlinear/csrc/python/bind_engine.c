/* Engine bindings: the levels this CPU runs, the selected level and threads, kernel facts, the
 * output pool (outbuf.c), and the engine's limits and codes (limits()), which Python reads
 * instead of copying them. */
#include "args.h"

/* outbuf.c: pooled output buffers */
PyObject *ql_py_empty(PyObject *self, PyObject *args);
PyObject *ql_py_pool_stats(PyObject *self, PyObject *args);
PyObject *ql_py_pool_clear(PyObject *self, PyObject *args);

const ql_isa *current_isa;

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
    const ql_gemm_kernel *k = which == QL_KERNEL_CONV_FAST ? is->conv_fast : which ? is->fast : is->exact;
    if (!k) Py_RETURN_NONE;
    return Py_BuildValue("{s:s,s:i,s:i,s:i,s:i,s:s,s:i,s:i,s:i,s:O,s:O}", "name", k->name, "mr", k->mr, "nr", k->nr,
                         "kpack", k->kpack, "kchunk", k->conv.kchunk > 1 ? k->conv.kchunk : 1, "form",
                         k->form == QL_FORM_I16 ? "i16" : k->form == QL_FORM_S8U8 ? "s8u8" : "u8s8",
                         "s8_bound", k->conv.s8_bound,
                         /* 1x1 convolutions this level runs on its exact GEMM (qlinear.h) */
                         "exact_1x1_min_m", which == QL_KERNEL_CONV_FAST ? is->exact_1x1_min_m : 0,
                         "exact_1x1_min_k", which == QL_KERNEL_CONV_FAST ? is->exact_1x1_min_k : 0,
                         "grouped_t9", (k->conv.grouped_i16_t9 || k->conv.grouped_b_t9) ? Py_True : Py_False,
                         "fused", k->kernel_ep ? Py_True : Py_False);
}

/* limits() -> dict: the engine's limits and codes, the values of its headers, so that Python
 * reads them instead of copying them: conv_max_rank (QL_CONV_MAXD), dw_cl_max_taps
 * (QL_DWCL_MAX_TAPS), max_dim (the C int sizes of matmul and pack_b: INT_MAX), conv_kinds
 * (QL_CONV_*), kernels (QL_KERNEL_*: `which`), types (QL_U8 ...) */
static PyObject *m_limits(PyObject *self, PyObject *args) {
    (void)self; (void)args;
    return Py_BuildValue("{s:i,s:i,s:i,s:{s:i,s:i,s:i},s:{s:i,s:i,s:i},s:{s:i,s:i,s:i,s:i}}",
                         "conv_max_rank", QL_CONV_MAXD, "dw_cl_max_taps", QL_DWCL_MAX_TAPS, "max_dim", INT_MAX,
                         "conv_kinds", "gemm", QL_CONV_GEMM, "depthwise", QL_CONV_DEPTHWISE, "gemm_fast",
                         QL_CONV_GEMM_FAST, "kernels", "exact", QL_KERNEL_EXACT, "fast", QL_KERNEL_FAST, "conv_fast",
                         QL_KERNEL_CONV_FAST, "types", "uint8", QL_U8, "int8", QL_I8, "int32", QL_I32, "float32",
                         QL_F32);
}

PyMethodDef ql_bind_engine_methods[] = {
    {"limits", m_limits, METH_NOARGS, "The engine's limits and codes (its headers' values)."},
    {"info", m_info, METH_NOARGS, "ISA levels this CPU runs (best first), compiler, threads."},
    {"set_isa", m_set_isa, METH_VARARGS, "Select the ISA level by name."},
    {"get_isa", m_get_isa, METH_NOARGS, "The selected ISA level."},
    {"set_threads", m_set_threads, METH_VARARGS, "Set the thread pool size."},
    {"get_threads", m_get_threads, METH_NOARGS, "The thread pool size."},
    {"kernel_info", m_kernel_info, METH_VARARGS, "GEMM kernel of an ISA (which: 0 exact, 1 fast)."},
    {"empty", ql_py_empty, METH_VARARGS, "An output buffer of n bytes from the bounded output pool."},
    {"pool_stats", ql_py_pool_stats, METH_NOARGS, "(cached bytes, cached blocks, min bytes, max MiB) of the output pool."},
    {"pool_clear", ql_py_pool_clear, METH_NOARGS, "Free the output pool's cached blocks."},
    {NULL, NULL, 0, NULL},
};
