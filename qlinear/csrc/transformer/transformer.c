/* Gelu, FastGelu and SkipLayerNormalization in float32 in, float32 out, float64 inside: the
 * formulas of qlinear/contrib/transformer.py (its NumPy path is the reference; see its module
 * docstring for why float64: onnxruntime's MLAS float kernels round by instruction set, so no
 * bit pattern of theirs is promised, and the float64 formula is within float32 tolerance of
 * them). Every operation here is one IEEE double operation in the NumPy expression's order
 * (-ffp-contract=off: no fused multiply-add), so:
 * - Gelu is bit-identical to the NumPy path (math.erf is the C library's erf, the divisor the
 *   same double √2);
 * - SkipLayerNormalization is bit-identical to it too: the row sums follow NumPy's pairwise
 *   summation (pairwise_sum in its umath loops: 8 partial sums over blocks of up to 128,
 *   halves above), which np.add.reduce uses along a contiguous last axis;
 * - FastGelu's 0.5 · v · (1 + tanh(u)) is evaluated as v / (1 + exp(-2u)) (the same function;
 *   no cancellation where tanh(u) nears -1, and the C library's exp costs a third of its tanh);
 *   exp is the C library's and v³ is v·v·v, where NumPy uses its own SIMD exp and
 *   pow: the double results can differ in their last bit, which the final rounding to float32
 *   almost always absorbs (the tests compare both with onnxruntime at the float tolerance).
 * No ISA-specific code and rows are independent, so the bits do not depend on the ISA level or
 * the thread count. */
#include "qlinear.h"
#include "transformer.h"

#include <math.h>
#include <stdlib.h>

/* Elements per task: below this many the work stays on the calling thread (a FastGelu of a
 * few thousand elements takes microseconds; a join costs about as much). */
#define QL_TF_CHUNK 16384

typedef struct {
    const float *x;
    const double *bias;
    ptrdiff_t rows, last, n;
    float *y;
    int fast;
} gelu_ctx;

static void gelu_task(void *vctx, ptrdiff_t t, int thread) {
    (void)thread;
    const gelu_ctx *c = (const gelu_ctx *)vctx;
    ptrdiff_t start = t * QL_TF_CHUNK, end = start + QL_TF_CHUNK < c->n ? start + QL_TF_CHUNK : c->n;
    if (!c->fast) {
        const double r2 = sqrt(2.0);
        for (ptrdiff_t i = start; i < end; i++) {
            double v = (double)c->x[i];
            c->y[i] = (float)(0.5 * v * (1.0 + erf(v / r2)));
        }
        return;
    }
    /* math.sqrt(2.0 / math.pi), as the Python expression computes it */
    const double k = sqrt(2.0 / 3.141592653589793);
    /* row by row, so that the bias index is a counter (a division per element, i % last,
     * cost as much as the exp on Zen 4) */
    ptrdiff_t j = start % c->last;
    for (ptrdiff_t i = start; i < end;) {
        ptrdiff_t stop = i + (c->last - j) < end ? i + (c->last - j) : end;
        const double *bias = c->bias ? c->bias + j : NULL;  /* element i's bias */
        for (; i < stop; i++) {
            double v = (double)c->x[i];
            if (bias) v = v + *bias++;
            double u = k * (v + 0.044715 * (v * v * v));
            c->y[i] = (float)(v / (1.0 + exp(-2.0 * u)));
        }
        j = 0;
    }
}

static void gelu_run(gelu_ctx *c) {
    if (c->n <= 0) return;
    ptrdiff_t tasks = (c->n + QL_TF_CHUNK - 1) / QL_TF_CHUNK;
    ql_parallel_for(tasks, tasks > 1 ? ql_num_threads() : 1, gelu_task, c);
}

void ql_gelu_f32(const float *x, ptrdiff_t n, float *y) {
    gelu_ctx c = {x, NULL, 1, n, n, y, 0};
    gelu_run(&c);
}

void ql_fast_gelu_f32(const float *x, const double *bias, ptrdiff_t rows, ptrdiff_t last, float *y) {
    gelu_ctx c = {x, bias, rows, last, rows * last, y, 1};
    gelu_run(&c);
}

/* NumPy's pairwise_sum (numpy/_core/src/umath/loops_utils.h.src) of n doubles, stride 1: below
 * 8 a plain sum from 0.; up to 128 eight partial sums r[j] over i ≡ j (mod 8), combined as
 * ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)), the tail added in order; above, the two halves (the
 * first n/2 rounded down to a multiple of 8) summed the same way and added. */
static double pairwise(const double *a, ptrdiff_t n) {
    if (n < 8) {
        double s = 0.;  /* -0. + 0. = 0.: NumPy's loop starts res at 0. too */
        for (ptrdiff_t i = 0; i < n; i++) s += a[i];
        return s;
    }
    if (n <= 128) {
        double r[8];
        for (int j = 0; j < 8; j++) r[j] = a[j];
        ptrdiff_t i;
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        double s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) s += a[i];
        return s;
    }
    ptrdiff_t n2 = n / 2;
    n2 -= n2 % 8;
    return pairwise(a, n2) + pairwise(a + n2, n - n2);
}

/* np.add.reduce over a contiguous row of n: its identity 0. plus the pairwise sum of the row
 * (checked against NumPy 2: a row of -0. sums to +0.) */
double ql_tf_row_sum(const double *a, ptrdiff_t n) { return 0. + pairwise(a, n); }

void ql_tf_layer_norm_row(double *s, double *d, ptrdiff_t h, const double *gamma, const double *beta, double eps,
                          float *y, double *mean_out, double *inv_out) {
    double mean = ql_tf_row_sum(s, h) / (double)h;
    for (ptrdiff_t i = 0; i < h; i++) {
        d[i] = s[i] - mean;
        s[i] = d[i] * d[i];  /* np.square(d) */
    }
    double var = ql_tf_row_sum(s, h) / (double)h;
    double inv = 1.0 / sqrt(var + eps);
    for (ptrdiff_t i = 0; i < h; i++) {
        double v = d[i] * inv * gamma[i];
        if (beta) v += beta[i];
        y[i] = (float)v;
    }
    *mean_out = mean;
    *inv_out = inv;
}

typedef struct {
    const float *x, *skip;
    const double *gamma, *beta, *bias;
    ptrdiff_t rows, hidden, per_task;
    double eps;
    float *y, *mean, *inv_std, *sum;
    double *work;  /* 2 · hidden doubles per thread */
} sln_ctx;

static void sln_task(void *vctx, ptrdiff_t t, int thread) {
    const sln_ctx *c = (const sln_ctx *)vctx;
    ptrdiff_t h = c->hidden;
    double *s = c->work + (ptrdiff_t)thread * 2 * h, *d = s + h;
    ptrdiff_t r0 = t * c->per_task, r1 = r0 + c->per_task < c->rows ? r0 + c->per_task : c->rows;
    for (ptrdiff_t r = r0; r < r1; r++) {
        const float *x = c->x + r * h, *sk = c->skip + r * h;
        float *s32 = c->sum + r * h, *y = c->y + r * h;
        for (ptrdiff_t i = 0; i < h; i++) {
            double v = (double)x[i] + (double)sk[i];
            if (c->bias) v += c->bias[i];
            s32[i] = (float)v;      /* onnxruntime normalizes the float32 sum */
            s[i] = (double)s32[i];
        }
        double mean, inv;
        ql_tf_layer_norm_row(s, d, h, c->gamma, c->beta, c->eps, y, &mean, &inv);
        c->mean[r] = (float)mean;
        c->inv_std[r] = (float)inv;
    }
}

int ql_skip_layer_norm_f32(const float *x, const float *skip, const double *gamma, const double *beta,
                           const double *bias, ptrdiff_t rows, ptrdiff_t hidden, double epsilon, float *y,
                           float *mean, float *inv_std, float *sum) {
    if (rows <= 0 || hidden <= 0) return 1;
    ptrdiff_t per_task = QL_TF_CHUNK / hidden > 0 ? QL_TF_CHUNK / hidden : 1;
    ptrdiff_t tasks = (rows + per_task - 1) / per_task;
    int threads = tasks > 1 ? ql_num_threads() : 1;
    if (threads < 1) threads = 1;
    /* the caller (bind_transformer.c) bounds rows · hidden · 8; two work rows per thread */
    double *work = (double *)malloc(sizeof(double) * 2 * (size_t)hidden * (size_t)threads);
    if (!work) return 0;
    sln_ctx c = {x, skip, gamma, beta, bias, rows, hidden, per_task, epsilon, y, mean, inv_std, sum, work};
    ql_parallel_for(tasks, threads, sln_task, &c);
    free(work);
    return 1;
}
