/* The bindings' shared argument helpers (args.c) and the selected ISA level (bind_engine.c).
 * Every binding file of python/ includes this first (Python.h before any system header). */
#ifndef QLINEAR_PY_ARGS_H
#define QLINEAR_PY_ARGS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "qlinear.h"
#include "conv.h"
#include "elementwise.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* bind_engine.c: the level set_isa chose (init: the best this CPU runs) */
extern const ql_isa *current_isa;

/* the level of that name, or NULL with ValueError raised */
const ql_isa *isa_arg(const char *name);
/* its kernel `which` (0 exact, 1 the matmul fast path, 2 the convolutions' fast path), or NULL
 * with ValueError raised; *isa_out (if non-NULL): the level */
const ql_gemm_kernel *kernel_arg(const char *isa_name, int which, const ql_isa **isa_out);
/* a contiguous buffer of at least `need` bytes */
int get_buf(PyObject *obj, Py_buffer *view, int writable, Py_ssize_t need, const char *what);

#define REL(v) do { if ((v).obj) PyBuffer_Release(&(v)); } while (0)

/* Each binding file's methods, added to the module at init (module.c) */
extern PyMethodDef ql_bind_engine_methods[];
extern PyMethodDef ql_bind_matmul_methods[];
extern PyMethodDef ql_bind_conv_methods[];
extern PyMethodDef ql_bind_elementwise_methods[];
extern PyMethodDef ql_bind_diag_methods[];
extern PyMethodDef ql_bind_transformer_methods[];
extern PyMethodDef ql_bind_island_methods[];
extern PyMethodDef ql_bind_formats_methods[];

#endif
