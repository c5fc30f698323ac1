/* Output buffers that return to a small pool when their array dies (qlinear._qlnative.empty).
 *
 * Why: a large output written to fresh memory pays the kernel's page faults and page zeroing
 * on every call (a 64 MiB DequantizeLinear output: about 5 ms of faults on top of 5 ms of
 * work on this machine), while onnxruntime's outputs come from its reused arena. Outputs of
 * at least POOL_MIN bytes are therefore allocated here: a Python object exposing the memory
 * through the buffer protocol (NumPy arrays are views of it); when the last array using it
 * is gone, its block goes back to the pool instead of to the OS, and the next output of a
 * similar size reuses it. Bounded: at most POOL_SLOTS blocks and POOL_BYTES bytes are kept;
 * everything else is freed at once. Nothing is ever shared: a block is in the pool only
 * after its owner was deallocated.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <stdlib.h>

#define POOL_MIN ((size_t)1 << 20)     /* smaller outputs: malloc reuses them well itself */
#define POOL_SLOTS 8
#define POOL_BYTES ((size_t)256 << 20)

typedef struct { void *ptr; size_t size; } slot;
static slot pool[POOL_SLOTS];
static size_t pool_bytes;
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;

typedef struct {
    PyObject_HEAD
    void *ptr;
    size_t size;     /* allocated bytes (rounded up to 4 KiB) */
    Py_ssize_t len;  /* bytes requested */
} QLBuf;

static size_t round_size(size_t n) { return (n + 4095) & ~(size_t)4095; }

/* a block of at least n bytes: the smallest cached block that fits without wasting more than
 * a quarter, else a fresh one */
static void *pool_get(size_t n, size_t *size) {
    int best = -1;
    pthread_mutex_lock(&pool_mu);
    for (int i = 0; i < POOL_SLOTS; i++)
        if (pool[i].ptr && pool[i].size >= n && pool[i].size - n <= n / 4 &&
            (best < 0 || pool[i].size < pool[best].size))
            best = i;
    void *p = NULL;
    if (best >= 0) {
        p = pool[best].ptr;
        *size = pool[best].size;
        pool_bytes -= pool[best].size;
        pool[best].ptr = NULL;
    }
    pthread_mutex_unlock(&pool_mu);
    if (p) return p;
    *size = n;
    return aligned_alloc(64, n);
}

static void pool_put(void *p, size_t size) {
    void *drop = p;
    pthread_mutex_lock(&pool_mu);
    if (size >= POOL_MIN && size <= POOL_BYTES) {
        /* evict cached blocks (lowest slots first) until this one fits */
        for (int i = 0; i < POOL_SLOTS && pool_bytes + size > POOL_BYTES; i++)
            if (pool[i].ptr) {
                free(pool[i].ptr);
                pool_bytes -= pool[i].size;
                pool[i].ptr = NULL;
            }
        int free_slot = -1;
        for (int i = 0; i < POOL_SLOTS; i++)
            if (!pool[i].ptr) { free_slot = i; break; }
        if (free_slot < 0) {  /* full: replace slot 0 */
            free(pool[0].ptr);
            pool_bytes -= pool[0].size;
            free_slot = 0;
        }
        pool[free_slot].ptr = p;
        pool[free_slot].size = size;
        pool_bytes += size;
        drop = NULL;
    }
    pthread_mutex_unlock(&pool_mu);
    free(drop);
}

static void qlbuf_dealloc(QLBuf *self) {
    if (self->ptr) pool_put(self->ptr, self->size);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int qlbuf_getbuffer(QLBuf *self, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)self, self->ptr, self->len, 0, flags);
}

static PyBufferProcs qlbuf_as_buffer = {(getbufferproc)qlbuf_getbuffer, NULL};

static PyTypeObject QLBufType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "qlinear._qlnative.OutputBuffer",
    .tp_basicsize = sizeof(QLBuf),
    .tp_dealloc = (destructor)qlbuf_dealloc,
    .tp_as_buffer = &qlbuf_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Memory of one qlinear output; returns to a bounded pool when released.",
};

/* empty(nbytes): a writable buffer of nbytes (uninitialized) */
PyObject *ql_py_empty(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "n", &n)) return NULL;
    if (n < 0) return PyErr_Format(PyExc_ValueError, "qlinear native: empty(%zd)", n);
    QLBuf *b = PyObject_New(QLBuf, &QLBufType);
    if (!b) return NULL;
    size_t size = round_size(n ? (size_t)n : 1);
    b->ptr = size >= POOL_MIN ? pool_get(size, &size) : aligned_alloc(64, size);
    b->size = size;
    b->len = n;
    if (!b->ptr) {
        b->size = 0;
        Py_DECREF(b);
        return PyErr_NoMemory();
    }
    return (PyObject *)b;
}

/* pool_stats() -> (cached bytes, cached blocks, POOL_MIN, POOL_BYTES) */
PyObject *ql_py_pool_stats(PyObject *self, PyObject *args) {
    (void)self; (void)args;
    int count = 0;
    pthread_mutex_lock(&pool_mu);
    size_t bytes = pool_bytes;
    for (int i = 0; i < POOL_SLOTS; i++) count += pool[i].ptr != NULL;
    pthread_mutex_unlock(&pool_mu);
    return Py_BuildValue("(nini)", (Py_ssize_t)bytes, count, (Py_ssize_t)POOL_MIN, (int)(POOL_BYTES >> 20));
}

/* pool_clear(): free every cached block */
PyObject *ql_py_pool_clear(PyObject *self, PyObject *args) {
    (void)self; (void)args;
    pthread_mutex_lock(&pool_mu);
    for (int i = 0; i < POOL_SLOTS; i++) {
        free(pool[i].ptr);
        pool[i].ptr = NULL;
    }
    pool_bytes = 0;
    pthread_mutex_unlock(&pool_mu);
    Py_RETURN_NONE;
}

int ql_outbuf_init(void) { return PyType_Ready(&QLBufType); }
