/* QLinearMatMul-21 with a float8 operand (docs/contract.md, "QLinearMatMul (21)"): the native
 * steps around the float64 matrix product that qlinear/engines/native/f8mm.py plans.
 *
 * The product itself is a float64 GEMM (OpenBLAS, through NumPy) of the operands' *units*: every
 * centered value (value - zero point) of a float8 format is an integer multiple of 2^e (e = the
 * format's smallest subnormal exponent), of an 8-bit integer a plain integer, so the operands
 * are integer matrices held exactly in float64. Python proves before each product that every
 * partial sum is an integer below 2^53 (f8mm.py: the bound), so the GEMM is exact in any order
 * of summation, with or without FMA; where the bound fails the operands are split into high and
 * low halves, four such exact products are taken and ql_f8mm_combine assembles them here.
 *
 * - ql_f8mm_decode: codes -> float64 units minus the zero point's units, through a 256-entry
 *   table the registry built (qlinear/dtypes: the format's facts are not restated here); also
 *   the largest magnitude along each k (the bound's inputs) and which lines hold a NaN or an
 *   infinity (those enter the product as 0; Python computes the IEEE result of the outputs they
 *   reach and writes it over the exact sum).
 * - ql_f8mm_combine: hh·2^(2s) + (hl + lh)·2^s + ll exactly (int128), rounded to odd at 53 bits,
 *   so that the float32 conversion in finish rounds once, correctly (round-to-odd at p >= q + 2
 *   bits followed by round-to-nearest-even at q bits equals a direct RNE at q bits).
 * - ql_f8mm_finish: acc = float32(S) (one rounding of the exact sum), times 2^(ea+eb) (exact: a
 *   power of two, the result between 2^-34 and 2^127 in magnitude or zero), y = float32(acc · m),
 *   then the output conversion by the formats' own QuantizeLinear kernel (include/formats.h) with
 *   a scale of 1 (x / 1 is x) and the zero point: rne + saturation for uint8/int8, + zero point
 *   and the saturating encoding for float8. */
#include "f8mm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define F8_ROWS 16   /* rows per task (decode of a row-major operand, finish) */

typedef struct {
    const uint8_t *codes;
    ptrdiff_t R, C;
    const double *table, *zp;
    int zp_mode, k_axis;
    double *out, *kmax_t;   /* k_axis 1: one kmax array of C per thread */
    double *kmax;
    uint8_t *bad;
    int threads;
} dec_ctx;

static void dec_task(void *vctx, ptrdiff_t t, int thread) {
    const dec_ctx *c = (const dec_ctx *)vctx;
    ptrdiff_t r0 = t * F8_ROWS, r1 = r0 + F8_ROWS < c->R ? r0 + F8_ROWS : c->R;
    double *km = c->k_axis ? c->kmax_t + (ptrdiff_t)thread * c->C : NULL;
    const double *tab = c->table;
    for (ptrdiff_t r = r0; r < r1; r++) {
        const uint8_t *src = c->codes + r * c->C;
        double *dst = c->out + r * c->C;
        /* the zero point: one per column (stride 1) or one for the row (stride 0) */
        const double *z = c->zp + (c->zp_mode == 2 ? 0 : (c->zp_mode == 1 ? r : 0));
        ptrdiff_t zs = c->zp_mode == 2;
        double rmax = 0.0;
        int rbad = 0;
        for (ptrdiff_t j = 0; j < c->C; j++) {
            double v = tab[src[j]] - z[j * zs];   /* exact: integers below 2^34 */
            int ok = fabs(v) <= 1e300;            /* false for NaN and the infinities */
            v = ok ? v : 0.0;                     /* which enter the product as 0 */
            rbad |= !ok;
            dst[j] = v;
            double a = fabs(v);
            if (c->k_axis) km[j] = a > km[j] ? a : km[j];
            else rmax = a > rmax ? a : rmax;
        }
        if (c->k_axis) {
            if (rbad) c->bad[r] = 1;
        } else {
            c->kmax[r] = rmax;
            if (rbad)   /* which columns: the codes again */
                for (ptrdiff_t j = 0; j < c->C; j++)
                    if (!(fabs(tab[src[j]] - z[j * zs]) <= 1e300)) __atomic_store_n(&c->bad[j], 1, __ATOMIC_RELAXED);
        }
    }
}

void ql_f8mm_decode(const uint8_t *codes, ptrdiff_t R, ptrdiff_t C, const double *table, const double *zp,
                    int zp_mode, int k_axis, int threads, double *out, double *kmax, uint8_t *bad) {
    dec_ctx c;
    memset(&c, 0, sizeof c);
    c.codes = codes; c.R = R; c.C = C; c.table = table; c.zp = zp; c.zp_mode = zp_mode; c.k_axis = k_axis;
    c.out = out; c.kmax = kmax; c.bad = bad;
    ptrdiff_t tasks = (R + F8_ROWS - 1) / F8_ROWS;
    if (threads < 1) threads = 1;
    if (k_axis) {   /* k along the columns: per-thread maxima, reduced below */
        memset(kmax, 0, (size_t)C * sizeof(double));
        c.kmax_t = threads > 1 ? (double *)calloc((size_t)threads * (size_t)(C > 0 ? C : 1), sizeof(double)) : NULL;
        if (!c.kmax_t) threads = 1, c.kmax_t = kmax;   /* one thread (or no memory): straight into kmax */
    }
    c.threads = threads;
    ql_parallel_for(tasks, threads, dec_task, &c);
    if (k_axis && c.kmax_t != kmax) {
        for (int t = 0; t < threads; t++)
            for (ptrdiff_t j = 0; j < C; j++)
                if (c.kmax_t[(ptrdiff_t)t * C + j] > kmax[j]) kmax[j] = c.kmax_t[(ptrdiff_t)t * C + j];
        free(c.kmax_t);
    }
}

#ifdef __SIZEOF_INT128__
/* v rounded to odd at 53 bits (exact when |v| < 2^53) */
static double round_odd(__int128 v) {
    int neg = v < 0;
    unsigned __int128 u = neg ? -(unsigned __int128)v : (unsigned __int128)v;
    int bits = 0;
    for (unsigned __int128 w = u; w; w >>= 1) bits++;
    double r;
    if (bits <= 53) {
        r = (double)(uint64_t)u;
    } else {
        int sh = bits - 53;
        uint64_t q = (uint64_t)(u >> sh);
        if (u & (((unsigned __int128)1 << sh) - 1)) q |= 1;   /* sticky: odd when inexact */
        r = ldexp((double)q, sh);   /* q < 2^53: exact */
    }
    return neg ? -r : r;
}

int ql_f8mm_combine(const double *hh, const double *hl, const double *lh, const double *ll, ptrdiff_t n, int s,
                    double *out) {
    /* every input is an exact integer below 2^53 (the bound proved it), s <= 26: the total is
     * below 2^(53 + 2s + 2) <= 2^107, inside int128 */
    for (ptrdiff_t i = 0; i < n; i++) {
        __int128 t = ((__int128)(int64_t)hh[i] << (2 * s)) + ((__int128)(int64_t)hl[i] << s) +
                     ((__int128)(int64_t)lh[i] << s) + (__int128)(int64_t)ll[i];
        out[i] = round_odd(t);
    }
    return 1;
}
#else
int ql_f8mm_combine(const double *hh, const double *hl, const double *lh, const double *ll, ptrdiff_t n, int s,
                    double *out) {
    (void)hh; (void)hl; (void)lh; (void)ll; (void)n; (void)s; (void)out;
    return 0;   /* no 128-bit integers: Python assembles the total in its own integers */
}
#endif

typedef struct {
    const double *S;
    ptrdiff_t M, N;
    float unit;
    const float *m;
    int m_rows, m_cols;
    const ql_fmt_kernels *k;
    const ql_fmt_op *op;
    const float *z;
    uint8_t *out;
} fin_ctx;

/* the output of rows [r0, r1) and columns [j0, j1) of S (row stride c->N) */
static void fin_rect(const fin_ctx *c, ptrdiff_t r0, ptrdiff_t r1, ptrdiff_t j0, ptrdiff_t j1) {
    float buf[1024];
    const float one = 1.0f;
    for (ptrdiff_t r = r0; r < r1; r++) {
        const double *s = c->S + r * c->N;
        const float *mr = c->m + (c->m_rows ? r * (c->m_cols ? c->N : 1) : 0);
        for (ptrdiff_t b0 = j0; b0 < j1; b0 += 1024) {
            ptrdiff_t n = j1 - b0 < 1024 ? j1 - b0 : 1024;
            if (c->m_cols) {
                for (ptrdiff_t j = 0; j < n; j++) {
                    float acc = (float)s[b0 + j] * c->unit;   /* -ffp-contract=off: two roundings */
                    buf[j] = acc * mr[b0 + j];
                }
            } else {
                float mv = mr[0];
                for (ptrdiff_t j = 0; j < n; j++) {
                    float acc = (float)s[b0 + j] * c->unit;
                    buf[j] = acc * mv;
                }
            }
            c->k->quantize(c->op, buf, n, &one, 0, c->z, 0, c->out + (r * c->N + b0));
        }
    }
}

static void fin_task(void *vctx, ptrdiff_t t, int thread) {
    (void)thread;
    const fin_ctx *c = (const fin_ctx *)vctx;
    ptrdiff_t r0 = t * F8_ROWS, r1 = r0 + F8_ROWS < c->M ? r0 + F8_ROWS : c->M;
    fin_rect(c, r0, r1, 0, c->N);
}

void ql_f8mm_finish(const ql_isa *isa, const double *S, ptrdiff_t M, ptrdiff_t N, float unit, const float *m,
                    int m_rows, int m_cols, const ql_fmt_op *op, const float *z, int threads, uint8_t *out) {
    fin_ctx c = {S, M, N, unit, m, m_rows, m_cols, ql_fmt_for(isa), op, z, out};
    ql_parallel_for((M + F8_ROWS - 1) / F8_ROWS, threads, fin_task, &c);
}

/* ---- The whole product for a left operand whose bound needs no look at its values ----------
 * Python proved the bound from a's type and zero points alone (the largest |units| any code can
 * give) and b's per-k maxima, so a is decoded and multiplied without a pass for its maxima: every
 * product and partial sum of the float64 GEMM is an integer below 2^53 and the GEMM is exact in
 * any order, blocking or split (f8mm.py). One job on the pool: the rows of a decoded in row
 * blocks, then the columns split over the threads, each a single-threaded dgemm of all of a with
 * its columns of b (every column's sums come from one call: the split changes no result) followed
 * by the output step of those columns. No other pool runs (OpenBLAS is held at one thread by the
 * caller): two spinning pools on the same cores cost more than the work. */

typedef void (*dgemm64_fn)(int, int, int, int64_t, int64_t, int64_t, double, const double *, int64_t,
                           const double *, int64_t, double, double *, int64_t);
typedef void (*dgemm32_fn)(int, int, int, int, int, int, double, const double *, int, const double *, int,
                           double, double *, int);

typedef struct {
    const uint8_t *a;
    ptrdiff_t M, K, N;
    const double *table, *zp;
    const uint8_t *bad_table;
    int zp_rows;
    const double *B;
    double *units, *S;
    ql_f8mm_dgemm gemm;
    ptrdiff_t col_block;
    fin_ctx fin;
    int bad;
} prod_ctx;

static void prod_decode(void *vctx, ptrdiff_t t, int thread) {
    (void)thread;
    prod_ctx *c = (prod_ctx *)vctx;
    ptrdiff_t r0 = t * F8_ROWS, r1 = r0 + F8_ROWS < c->M ? r0 + F8_ROWS : c->M;
    const double *tab = c->table;
    const uint8_t *bt = c->bad_table;
    unsigned bad = 0;
    for (ptrdiff_t r = r0; r < r1; r++) {
        const uint8_t *src = c->a + r * c->K;
        double *dst = c->units + r * c->K;
        double z = c->zp[c->zp_rows ? r : 0];
        for (ptrdiff_t k = 0; k < c->K; k++) {
            dst[k] = tab[src[k]] - z;   /* exact: integers below 2^34 (a NaN code's entry is 0) */
            bad |= bt[src[k]];
        }
    }
    if (bad) __atomic_store_n(&c->bad, 1, __ATOMIC_RELAXED);
}

static void prod_columns(void *vctx, ptrdiff_t t, int thread) {
    (void)thread;
    prod_ctx *c = (prod_ctx *)vctx;
    ptrdiff_t j0 = t * c->col_block, j1 = j0 + c->col_block < c->N ? j0 + c->col_block : c->N;
    if (j0 >= j1) return;
    double *S = c->S;
    /* row-major (101), no transposes (111): S[:, j0:j1] = 1 * units @ B[:, j0:j1] + 0 */
    if (c->gemm.ilp64)
        ((dgemm64_fn)c->gemm.fn)(101, 111, 111, c->M, j1 - j0, c->K, 1.0, c->units, c->K, c->B + j0, c->N, 0.0,
                                 S + j0, c->N);
    else
        ((dgemm32_fn)c->gemm.fn)(101, 111, 111, (int)c->M, (int)(j1 - j0), (int)c->K, 1.0, c->units, (int)c->K,
                                 c->B + j0, (int)c->N, 0.0, S + j0, (int)c->N);
    fin_rect(&c->fin, 0, c->M, j0, j1);
}

int ql_f8mm_product(const ql_isa *isa, ql_f8mm_dgemm gemm, const uint8_t *a, ptrdiff_t M, ptrdiff_t K,
                    const double *table, const uint8_t *bad_table, const double *zp, int zp_rows, const double *B,
                    ptrdiff_t N, double *units, double *S, float unit, const float *m, int m_rows, int m_cols,
                    const ql_fmt_op *op, const float *z, int threads, uint8_t *out) {
    prod_ctx c;
    memset(&c, 0, sizeof c);
    c.a = a; c.M = M; c.K = K; c.N = N; c.table = table; c.zp = zp; c.bad_table = bad_table;
    c.zp_rows = zp_rows; c.B = B; c.units = units; c.S = S; c.gemm = gemm;
    fin_ctx f = {S, M, N, unit, m, m_rows, m_cols, ql_fmt_for(isa), op, z, out};
    c.fin = f;
    if (threads < 1) threads = 1;
    ql_parallel_for((M + F8_ROWS - 1) / F8_ROWS, threads, prod_decode, &c);
    if (c.bad) return 0;   /* a NaN or an infinity in a: the caller takes the general path */
    /* one block of columns per thread, a multiple of 8 wide (the GEMM's column panels); narrow
     * products in one block */
    ptrdiff_t blocks = N >= 64 * (ptrdiff_t)threads ? threads : 1;
    c.col_block = ((N + blocks - 1) / blocks + 7) / 8 * 8;
    blocks = (N + c.col_block - 1) / c.col_block;
    ql_parallel_for(blocks, threads, prod_columns, &c);
    return 1;
}
