/* The float32 Conv's matrix product (include/fconv.h) on the engine's thread pool, and the
 * portable tile kernel.
 *
 * A task is one column panel (NR columns of one image and group) and a run of MR-row panels:
 * it copies the panel's K x NR inputs once into its scratch (contiguous, zero past the last
 * column: a tile at the right edge reads zeros, whose results are not stored) and runs the tile
 * kernel down its rows. The weights are read in place (row r at w + r * K; a bottom panel of
 * fewer than MR rows reads only its rows). Right-edge tiles are computed into a scratch tile
 * and their valid columns copied; the tile kernel adds the bias to each finished chain.
 * Each output's chain of K multiply-adds is whole inside one tile call, so neither the tiling
 * nor the thread split changes a bit of the result (include/fconv.h).
 *
 * Threads follow the work: one below FGEMM_MIN_MACS multiply-adds (the pool's hand-off costs
 * more than it saves there), otherwise enough tasks for every thread to take several (the pool
 * hands them out one at a time, so a late thread takes fewer). */
#include "fconv.h"

#include <string.h>

/* ~5 us of one core's work: below it a product runs on the calling thread */
#define FGEMM_MIN_MACS ((double)(1 << 18))
/* at least this many tasks per thread where the rows can be split that far */
#define FGEMM_TASKS_PER_THREAD 4

typedef struct {
    const ql_fconv_kernels *k;
    const float *w, *b, *x;
    float *y;
    ptrdiff_t G, N, M, K, P, ldx, xs_n, xs_g;
    ptrdiff_t ncol, mp, mper, chunks;   /* column panels, row panels, row panels per task, per unit */
    char *scratch;
    size_t per_thread;                  /* bytes of scratch per thread */
} fgemm_ctx;

static void fgemm_task(void *vctx, ptrdiff_t t, int thread) {
    const fgemm_ctx *c = (const fgemm_ctx *)vctx;
    const int MR = c->k->mr, NR = c->k->nr;
    const ptrdiff_t K = c->K, P = c->P, M = c->M;
    const ptrdiff_t chunk = t % c->chunks, unit = t / c->chunks;
    const ptrdiff_t jp = unit % c->ncol, ng = unit / c->ncol, g = ng % c->G, n = ng / c->G;
    const ptrdiff_t p0 = jp * NR, nr = P - p0 < NR ? P - p0 : NR;
    float *bp = (float *)(c->scratch + (size_t)thread * c->per_thread);   /* K x NR */
    float *ct = bp + K * NR;                                              /* MR x NR */
    const float *x = c->x + n * c->xs_n + g * c->xs_g + p0;
    for (ptrdiff_t kk = 0; kk < K; kk++) {
        float *dst = bp + kk * NR;
        memcpy(dst, x + kk * c->ldx, sizeof(float) * (size_t)nr);
        for (ptrdiff_t j = nr; j < NR; j++) dst[j] = 0.0f;
    }
    const float *wg = c->w + g * M * K;
    const float *bg = c->b ? c->b + g * M : NULL;
    float *yg = c->y + (n * c->G + g) * M * P + p0;
    ptrdiff_t r_end = (chunk + 1) * c->mper;
    if (r_end > c->mp) r_end = c->mp;
    for (ptrdiff_t rp = chunk * c->mper; rp < r_end; rp++) {
        const ptrdiff_t r0 = rp * MR;
        const int mr = M - r0 < MR ? (int)(M - r0) : MR;
        float *yt = yg + r0 * P;
        if (nr == NR) {
            c->k->micro(K, wg + r0 * K, K, bp, yt, P, bg ? bg + r0 : NULL, mr);
        } else {
            c->k->micro(K, wg + r0 * K, K, bp, ct, NR, bg ? bg + r0 : NULL, mr);
            for (int r = 0; r < mr; r++) memcpy(yt + r * P, ct + r * NR, sizeof(float) * (size_t)nr);
        }
    }
}

int ql_fgemm(const ql_fconv_kernels *k, const float *w, const float *b, const float *x, float *y,
             ptrdiff_t G, ptrdiff_t N, ptrdiff_t M, ptrdiff_t K, ptrdiff_t P, ptrdiff_t ldx,
             ptrdiff_t xs_n, ptrdiff_t xs_g, int threads) {
    if (G <= 0 || N <= 0 || M <= 0 || P <= 0) return 0;
    if (K <= 0) {   /* an empty sum: +0.0, plus the bias */
        for (ptrdiff_t ng = 0; ng < N * G; ng++)
            for (ptrdiff_t o = 0; o < M; o++) {
                float v = b ? 0.0f + b[(ng % G) * M + o] : 0.0f;
                for (ptrdiff_t p = 0; p < P; p++) y[(ng * M + o) * P + p] = v;
            }
        return 0;
    }
    fgemm_ctx c = {k, w, b, x, y, G, N, M, K, P, ldx, xs_n, xs_g, 0, 0, 0, 0, NULL, 0};
    c.ncol = (P + k->nr - 1) / k->nr;
    c.mp = (M + k->mr - 1) / k->mr;
    double macs = (double)G * N * M * K * P;
    if (threads < 1 || macs < FGEMM_MIN_MACS) threads = 1;
    ptrdiff_t units = N * G * c.ncol, want = (ptrdiff_t)threads * FGEMM_TASKS_PER_THREAD;
    ptrdiff_t split = threads > 1 && units < want ? (want + units - 1) / units : 1;
    if (split > c.mp) split = c.mp;
    c.mper = (c.mp + split - 1) / split;
    c.chunks = (c.mp + c.mper - 1) / c.mper;
    ptrdiff_t tasks = units * c.chunks;
    if (threads > tasks) threads = (int)tasks;
    /* per thread: the input panel and an edge tile; 64-byte multiples */
    c.per_thread = ((sizeof(float) * (size_t)(K * k->nr + k->mr * k->nr)) + 63) & ~(size_t)63;
    int cached;
    c.scratch = ql_conv_scratch_get(c.per_thread * (size_t)threads, &cached);
    if (!c.scratch) return -1;
    ql_parallel_for(tasks, threads, fgemm_task, &c);
    ql_conv_scratch_put(c.scratch, cached);
    return 0;
}

/* ------------------------------------------------------------------ the portable tile kernel */

#define PMR 4
#define PNR 8

/* rows x PNR chains side by side; the compiler may vectorize the j loop (a multiply, then an
 * add, per element: the same two roundings) */
static void micro_portable(ptrdiff_t K, const float *a, ptrdiff_t lda, const float *b, float *c, ptrdiff_t ldc,
                           const float *bias, int rows) {
    float acc[PMR][PNR];
    for (int r = 0; r < PMR; r++)
        for (int j = 0; j < PNR; j++) acc[r][j] = 0.0f;
    for (ptrdiff_t kk = 0; kk < K; kk++) {
        const float *bk = b + kk * PNR;
        for (int r = 0; r < rows; r++) {
            const float av = a[r * lda + kk];
            for (int j = 0; j < PNR; j++) {
                const float p = av * bk[j];
                acc[r][j] = acc[r][j] + p;
            }
        }
    }
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < PNR; j++) c[r * ldc + j] = bias ? acc[r][j] + bias[r] : acc[r][j];
}

const ql_fconv_kernels ql_fconv_portable = {"portable", PMR, PNR, micro_portable, ql_fdw_row_portable};
