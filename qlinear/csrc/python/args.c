/* The bindings' shared argument helpers: ISA level and kernel by name, buffers checked for
 * their size (a planning mistake raises instead of reading or writing out of bounds). */
#include "args.h"

const ql_isa *isa_arg(const char *name) {
    const ql_isa *isa = ql_isa_by_name(name);
    if (!isa) PyErr_Format(PyExc_ValueError, "qlinear native: ISA level '%s' is not available on this CPU", name);
    return isa;
}

const ql_gemm_kernel *kernel_arg(const char *isa_name, int which, const ql_isa **isa_out) {
    const ql_isa *isa = isa_arg(isa_name);
    if (!isa) return NULL;
    /* which: the exact kernel, the matmul fast path, the convolutions' fast path (S8U8 form) */
    const ql_gemm_kernel *k = which == QL_KERNEL_CONV_FAST ? isa->conv_fast : which ? isa->fast : isa->exact;
    if (!k) {
        PyErr_Format(PyExc_ValueError, "qlinear native: ISA level '%s' has no %s kernel", isa_name,
                     which == QL_KERNEL_CONV_FAST ? "conv fast" : which ? "fast" : "exact");
        return NULL;
    }
    if (isa_out) *isa_out = isa;
    return k;
}

/* a contiguous buffer of at least `need` bytes */
int get_buf(PyObject *obj, Py_buffer *view, int writable, Py_ssize_t need, const char *what) {
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
