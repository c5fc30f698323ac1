/* Diagnostics the tests and `qlinear bench` read: the micro-kernels' peak, which path each
 * call took (counters: runtime/diag.c, gemm.c), the tests' hooks (AMX tile shapes, the streaming
 * threshold). */
#include "args.h"

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
    int r = ql_foreign_tiles(load);
    if (r >= 0) return PyBool_FromLong(r);
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

/* pool_counts() -> (jobs handed to the workers, jobs run on the caller alone, worker sleeps,
 * callers that blocked waiting for a worker, workers that moved off their caller's CPU, callers
 * that lent their CPU to a worker) so far (runtime/threads.c) */
static PyObject *m_pool_counts(PyObject *self, PyObject *args) {
    (void)self; (void)args;
    return Py_BuildValue("(LLLLLL)", __atomic_load_n(&ql_pool_counts[0], __ATOMIC_RELAXED),
                         __atomic_load_n(&ql_pool_counts[1], __ATOMIC_RELAXED),
                         __atomic_load_n(&ql_pool_counts[2], __ATOMIC_RELAXED),
                         __atomic_load_n(&ql_pool_counts[3], __ATOMIC_RELAXED),
                         __atomic_load_n(&ql_pool_counts[4], __ATOMIC_RELAXED),
                         __atomic_load_n(&ql_pool_counts[5], __ATOMIC_RELAXED));
}

/* pool_late_workers(us) -> tasks the workers ran so far; from now on each worker waits us
 * microseconds after a job is posted before it tries to join (tests: a worker whose CPU
 * another process holds; 0 restores the pool) */
static PyObject *m_pool_late_workers(PyObject *self, PyObject *args) {
    (void)self;
    long us;
    if (!PyArg_ParseTuple(args, "l", &us)) return NULL;
    if (us < 0 || us > 10000000) {
        PyErr_Format(PyExc_ValueError, "pool_late_workers: us must be within [0, 10000000], got %ld", us);
        return NULL;
    }
    long long ran = __atomic_load_n(&ql_pool_worker_tasks, __ATOMIC_RELAXED);
    ql_pool_set_late_us(us);
    return PyLong_FromLongLong(ran);
}

/* conv_fused_copy(on=-1) -> implicit runs so far whose pointwise copy ran inside the GEMM
 * tasks; on 0 or 1 first turns that path off or on for later calls (tests, A/B timing) */
static PyObject *m_conv_fused_copy(PyObject *self, PyObject *args) {
    (void)self;
    int on = -1;
    if (!PyArg_ParseTuple(args, "|i", &on)) return NULL;
    return PyLong_FromLongLong(ql_conv_fused_copy(on));
}

/* pool_check(n, max_threads, repeat, nested, busy_us, worker_sleep_us) -> (bad, max thread
 * index): the pool's self-check (runtime/pool_check.c), GIL released */
static PyObject *m_pool_check(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t n, nested;
    int max_threads, repeat;
    long busy_us, sleep_us;
    if (!PyArg_ParseTuple(args, "niinll", &n, &max_threads, &repeat, &nested, &busy_us, &sleep_us)) return NULL;
    if (n < 0 || n > (1 << 24) || nested < 0 || nested > 1024 || max_threads < 1 || repeat < 1 || busy_us < 0 ||
        busy_us > 1000000 || sleep_us < 0 || sleep_us > 1000000)
        return PyErr_Format(PyExc_ValueError, "pool_check: n within [0, 2^24], nested within [0, 1024], "
                            "max_threads and repeat at least 1, busy_us and worker_sleep_us within [0, 10^6]");
    long bad;
    int max_thread = 0;
    Py_BEGIN_ALLOW_THREADS
    bad = ql_pool_check(n, max_threads, repeat, nested, busy_us, sleep_us, &max_thread);
    Py_END_ALLOW_THREADS
    if (bad < 0) return PyErr_NoMemory();
    return Py_BuildValue("(li)", bad, max_thread);
}

/* pool_worker_tids() -> the pool's workers' thread ids (empty before the first parallel call) */
static PyObject *m_pool_worker_tids(PyObject *self, PyObject *args) {
    (void)self; (void)args;
    int tids[1024];
    int n = ql_pool_worker_tids(tids, 1024);
    PyObject *out = PyList_New(0);
    for (int i = 0; out && i < n; i++) {
        PyObject *v = PyLong_FromLong(tids[i]);
        if (!v || PyList_Append(out, v) != 0) { Py_XDECREF(v); Py_DECREF(out); return NULL; }
        Py_DECREF(v);
    }
    return out;
}

PyMethodDef ql_bind_diag_methods[] = {
    {"pool_check", m_pool_check, METH_VARARGS, "Tests: the pool's self-check, (bad, largest thread index) over repeat jobs of counting tasks."},
    {"pool_worker_tids", m_pool_worker_tids, METH_NOARGS, "Tests: the thread pool's workers' thread ids."},
    {"pool_late_workers", m_pool_late_workers, METH_VARARGS, "Tests: tasks the pool's workers ran so far; sets how many microseconds each worker waits after a job is posted before it tries to join."},
    {"kernel_peak", m_kernel_peak, METH_VARARGS, "Run a micro-kernel on L1-resident operands (peak rate)."},
    {"conv_path_counts", m_conv_path_counts, METH_NOARGS, "GEMM convolutions run on the implicit and im2col paths, implicit GEMMs over several images, their images and merged tail panels, implicit runs on shifted planes and implicit runs whose images ran in parallel."},
    {"conv_tile_counts", m_conv_tile_counts, METH_NOARGS, "GEMM convolutions run on a kernel with chunks (amx-s8u8), implicit-GEMM tasks that ran tile pairs."},
    {"conv_kernel_name", m_conv_kernel_name, METH_VARARGS, "The kernel that packs and runs a convolution of K weights per row and taps taps on a level's kernel."},
    {"conv_copy_counts", m_conv_copy_counts, METH_NOARGS, "Implicit-path stride-2 copy rows: input rows split into both column phases at once, and shifted tap rows copied from those phase rows."},
    {"conv_dw_path_counts", m_conv_dw_path_counts, METH_NOARGS, "Depthwise convolutions run on the channels-last, plane and rows paths."},
    {"conv_in_task_packs", m_conv_in_task_packs, METH_NOARGS, "Plain convolutions whose weights were packed inside the implicit GEMM's tasks."},
    {"conv_fused_copy", m_conv_fused_copy, METH_VARARGS, "Implicit runs whose pointwise input copy ran inside the GEMM tasks; an argument 0 or 1 first turns that path off or on."},
    {"conv_copy_job_packs", m_conv_copy_job_packs, METH_NOARGS, "Plain fast-path convolutions whose weights were packed in the implicit GEMM's first copy job."},
    {"tail_counts", m_tail_counts, METH_NOARGS, "Implicit tiles, packed panels and implicit dot-kernel tiles that ran a narrow tail kernel."},
    {"amx_foreign_tiles", m_amx_foreign_tiles, METH_VARARGS, "Tests: load other AMX tile shapes on this thread."},
    {"gemm_fused_count", m_gemm_fused_count, METH_NOARGS, "GEMMs whose tiles ran on the kernel's fused epilogue (kernel_ep)."},
    {"gemm_stream", m_gemm_stream, METH_VARARGS, "Tests: (threshold, tasks streamed); sets the int32-output bytes from which MatMulInteger streams its output."},
    {"pool_counts", m_pool_counts, METH_NOARGS, "The thread pool's jobs handed to the workers, jobs run on the caller alone, worker sleeps, callers that blocked on a worker, workers that moved off their caller's CPU, callers that lent their CPU to a worker."},
    {"gemm_pair_count", m_gemm_pair_count, METH_NOARGS, "Panel pairs packed in one pass by plain matmuls (pack_R_pairs)."},
    {NULL, NULL, 0, NULL},
};
