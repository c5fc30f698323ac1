/* The int8 peak of this CPU as the engine's own micro-kernels reach it (qlinear bench).
 *
 * Each task runs one ISA's GEMM micro-kernel (exact or fast) `reps` times on operands that
 * stay in L1 (one mr-row L block and one R panel of kp = 256: at most 16 KiB together), so
 * the rate is that of the multiply-add instructions themselves (vpmaddwd for avx2-i16,
 * vpmaddubsw for avx2-u8s8, vpdpbusd for the VNNI levels), with no memory traffic: the
 * ceiling against which bench reports "% of peak". The values are arbitrary (timing only).
 */
#include "qlinear.h"

#include <string.h>

#define PEAK_KP 256

typedef struct { const ql_gemm_kernel *k; long reps; } peak_ctx;

static void peak_task(void *vctx, ptrdiff_t t, int thread) {
    (void)t; (void)thread;
    const peak_ctx *c = (const peak_ctx *)vctx;
    const ql_gemm_kernel *k = c->k;
    /* L: mr rows of kp elements (int16 at most: 2 bytes); R: one panel kp x nr */
    static _Thread_local unsigned char L[QL_MAX_MR * PEAK_KP * 2] __attribute__((aligned(64)));
    static _Thread_local unsigned char R[PEAK_KP * QL_MAX_NR * 2] __attribute__((aligned(64)));
    int32_t Ct[QL_MAX_MR * QL_MAX_NR] __attribute__((aligned(64)));
    const size_t es = k->form == QL_FORM_I16 ? 2 : 1;
    memset(L, 1, sizeof L);
    memset(R, 1, sizeof R);
    if (k->task_begin) k->task_begin();
    for (long r = 0; r < c->reps; r++)
        k->kernel(L, (ptrdiff_t)(PEAK_KP * es), R, PEAK_KP, Ct, k->nr, k->mr);
    if (k->task_end) k->task_end();
}

long long ql_kernel_peak(const ql_gemm_kernel *k, long reps, int tasks, int threads) {
    peak_ctx c = {k, reps};
    ql_parallel_for(tasks, threads, peak_task, &c);
    return (long long)tasks * reps * k->mr * k->nr * PEAK_KP;
}
