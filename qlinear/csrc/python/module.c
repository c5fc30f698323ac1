/* CPython module qlinear._qlnative: its creation, with each binding file's methods (python/
 * bind_*.c). The bindings parse arguments and buffers (the buffer protocol, no NumPy C API) and
 * release the GIL around every computation. Python (qlinear/_native.py) validates and plans;
 * every buffer's size is checked again in C so that a planning mistake raises instead of reading
 * or writing out of bounds. */
#include "args.h"

/* outbuf.c: the output pool */
int ql_outbuf_init(void);
/* bind_nbits.c: MatMulNBits */
extern PyMethodDef ql_bind_nbits_methods[];
/* bind_fconv.c: the float32 Conv's matrix product */
extern PyMethodDef ql_bind_fconv_methods[];
/* bind_f8mm.c: float8 QLinearMatMul-21 */
extern PyMethodDef ql_bind_f8mm_methods[];
/* bind_attention.c: Attention, QAttention, EmbedLayerNormalization */
extern PyMethodDef ql_bind_attention_methods[];
/* bind_bound.c: DynamicQuantizeMatMul and QAttention on bound constants */
extern PyMethodDef ql_bind_bound_methods[];

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_qlnative", "qlinear's compiled engine.", -1, NULL,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__qlnative(void) {
    current_isa = ql_isa_get(0);
    if (ql_outbuf_init() < 0) return NULL;
    PyObject *m = PyModule_Create(&moddef);
    if (!m) return NULL;
    PyMethodDef *tables[] = {ql_bind_engine_methods, ql_bind_matmul_methods, ql_bind_conv_methods,
                             ql_bind_elementwise_methods, ql_bind_diag_methods, ql_bind_nbits_methods,
                             ql_bind_transformer_methods, ql_bind_island_methods, ql_bind_formats_methods,
                             ql_bind_fconv_methods, ql_bind_f8mm_methods, ql_bind_attention_methods,
                             ql_bind_bound_methods};
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++)
        if (PyModule_AddFunctions(m, tables[i]) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    return m;
}
