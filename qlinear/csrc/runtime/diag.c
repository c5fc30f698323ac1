/* The engine's diagnostic counters that the tests read to prove which path their cases took
 * (the convolution paths, the implicit GEMM's copies and tile pairs, the depthwise paths): the
 * counters and their getters (python/bind_diag.c hands them to Python). Relaxed atomics: calls
 * may come from several threads; each counter is added to once per call or task, never per
 * micro-kernel call. All of the engine's counters live here (the GEMM driver's too); the
 * files that count add to them (qlinear.h and conv.h declare them). */
#include "qlinear.h"
#include "conv.h"

/* GEMM convolutions run on a kernel with chunks, and implicit-GEMM tasks that ran tile pairs
 * (ikernel2_ep): a diagnostic the tests read (relaxed atomics, once per call / task) */
long long ql_conv_chunk_calls[2];

void ql_conv_tile_counts(long long *chunked, long long *paired)
{
    *chunked = __atomic_load_n(&ql_conv_chunk_calls[0], __ATOMIC_RELAXED);
    *paired = __atomic_load_n(&ql_conv_chunk_calls[1], __ATOMIC_RELAXED);
}

/* Copy rows of the stride-2 copies (any form): input rows split into both column phases at
 * once (ig_split_s2), and shifted tap rows copied from those phase rows (ig_copy_shift_task);
 * a diagnostic the tests read to prove these paths ran (added once per copy task, relaxed
 * atomics). */
long long ql_ig_copy_rows[2];

void ql_conv_copy_counts(long long *split_rows, long long *tap_rows)
{
    *split_rows = __atomic_load_n(&ql_ig_copy_rows[0], __ATOMIC_RELAXED);
    *tap_rows = __atomic_load_n(&ql_ig_copy_rows[1], __ATOMIC_RELAXED);
}

/* Calls that took each GEMM path (implicit, im2col), then the implicit path's GEMMs over
 * several images, the images they covered and the merged tail panels their tasks ran (once per
 * row block), the implicit runs on shifted planes (ig_shift_pays) and those whose images ran in
 * parallel, one thread an image (ig_chunk_task): a diagnostic the tests
 * read to prove which path their cases exercised (relaxed atomics: calls may come from several
 * threads). */
long long ql_ig_calls[10];

/* Whether a pointwise layer's copy may run inside its GEMM tasks (implicit_plan.c, ig_fuses):
 * on unless a test or an A/B measurement turns it off (ql_conv_fused_copy) */
int ql_ig_fuse_copy = 1;

long long ql_conv_fused_copy(int on)
{
    if (on >= 0) __atomic_store_n(&ql_ig_fuse_copy, on ? 1 : 0, __ATOMIC_RELAXED);
    return __atomic_load_n(&ql_ig_calls[9], __ATOMIC_RELAXED);
}

long long ql_conv_in_task_packs(void) { return __atomic_load_n(&ql_ig_calls[7], __ATOMIC_RELAXED); }
long long ql_conv_copy_job_packs(void) { return __atomic_load_n(&ql_ig_calls[8], __ATOMIC_RELAXED); }

void ql_conv_path_counts(long long *implicit, long long *im2col, long long *merged, long long *merged_images,
                         long long *merged_tails, long long *shifted, long long *parallel_chunks)
{
    *implicit = __atomic_load_n(&ql_ig_calls[0], __ATOMIC_RELAXED);
    *im2col = __atomic_load_n(&ql_ig_calls[1], __ATOMIC_RELAXED);
    *merged = __atomic_load_n(&ql_ig_calls[2], __ATOMIC_RELAXED);
    *merged_images = __atomic_load_n(&ql_ig_calls[3], __ATOMIC_RELAXED);
    *merged_tails = __atomic_load_n(&ql_ig_calls[4], __ATOMIC_RELAXED);
    *shifted = __atomic_load_n(&ql_ig_calls[5], __ATOMIC_RELAXED);
    *parallel_chunks = __atomic_load_n(&ql_ig_calls[6], __ATOMIC_RELAXED);
}

/* Depthwise calls per path (channels-last, plane, rows): a diagnostic for the tests, as
 * ql_conv_path_counts for the GEMM paths */
long long ql_dw_calls[3];

void ql_conv_dw_path_counts(long long *cl, long long *plane, long long *rows)
{
    *cl = __atomic_load_n(&ql_dw_calls[0], __ATOMIC_RELAXED);
    *plane = __atomic_load_n(&ql_dw_calls[1], __ATOMIC_RELAXED);
    *rows = __atomic_load_n(&ql_dw_calls[2], __ATOMIC_RELAXED);
}

/* The GEMM driver's (gemm/gemm.c; qlinear.h says what each counts): tiles that ran a narrow
 * tail kernel, GEMMs that ran on the fused epilogue, tasks that streamed their output, panel
 * pairs packed per call */
long long ql_tail_calls[3];
long long ql_gemm_fused_calls;
long long ql_gemm_stream_tasks;
long long ql_gemm_pair_packs;

/* The thread pool's (runtime/threads.c): [0] jobs handed to the workers, [1] jobs run on the
 * calling thread alone (one task, one thread, or the pool busy), [2] times a worker blocked
 * (its spin window ran out before the next job), [3] jobs whose caller blocked waiting for a
 * worker (its spin ran out), [4] times a worker moved off the CPU its caller posted from,
 * [5] jobs whose caller lent its CPU to a worker that was not running */
long long ql_pool_counts[6];
long long ql_pool_worker_tasks;
