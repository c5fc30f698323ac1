/* MatMulNBits: the drivers (activation quantization, task split over the pool's threads,
 * scratch) and the portable kernels (the scalar level; the SIMD levels' tails).
 *
 * Threads split N only (whole outputs), so every output is computed by one thread with the
 * same operations whatever the thread count; decode (M = 1) has N / 16 or N / 32 tasks, enough
 * for both threads. The arithmetic of each output is the contract's (docs/contract.md,
 * "MatMulNBits"); the build compiles without contraction (-ffp-contract=off), and the float
 * levels' fused multiply-adds are explicit (fmaf here, vfmadd in the SIMD files). */
#include "nbits/nbits.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------
 * Activation quantization (onnxruntime's QuantizeARow_CompInt8, bit for bit)
 * ------------------------------------------------------------------------------------- */
void ql_nbits_quantize_a(const float *a, ptrdiff_t lda, int M, int K, int bs, int nb, int8_t *codes,
                         float *sa, int32_t *csum, uint8_t *bad) {
    ptrdiff_t kpad = (ptrdiff_t)nb * bs;
    for (int m = 0; m < M; m++) {
        const float *r = a + m * lda;
        int8_t *c = codes + m * kpad;
        int isbad = 0;
        for (int k = 0; k < K; k++)
            if (!isfinite(r[k])) { isbad = 1; break; }
        bad[m] = (uint8_t)isbad;
        memset(c, 0, (size_t)kpad);
        for (int b = 0; b < nb; b++) {
            int k0 = b * bs, k1 = k0 + bs < K ? k0 + bs : K;
            float amax = 0.0f;
            if (!isbad)
                for (int k = k0; k < k1; k++) {
                    float v = fabsf(r[k]);
                    if (v > amax) amax = v;   /* a maximum is exact in any order */
                }
            sa[m * nb + b] = amax / 127.0f;
            float inv = amax != 0.0f ? 127.0f / amax : 0.0f;   /* may overflow to inf (tiny amax) */
            int32_t s = 0;
            if (!isbad)
                for (int k = k0; k < k1; k++) {
                    float t = r[k] * inv;
                    /* |t| <= 127 (1 + 2^-23) rounds into int8; an infinite or NaN t (127 / amax
                     * overflowed) is code 0, as onnxruntime's AVX-512 kernel gives */
                    int32_t q = isfinite(t) ? (int32_t)nearbyintf(t) : 0;
                    c[k] = (int8_t)q;
                    s += q;
                }
            csum[m * nb + b] = s;
        }
    }
}

/* ---------------------------------------------------------------------------------------
 * Portable kernels
 * ------------------------------------------------------------------------------------- */
static void i8_scalar(const ql_nbits_w *w, const int8_t *codes, ptrdiff_t lda, const float *sa,
                      const int32_t *csum, const uint8_t *bad, int M, int g0, int g1, float *y, ptrdiff_t ldy) {
    const int bits = w->bits, per = 8 / bits, lines = w->bs * bits / 32, nb = w->nb;
    const unsigned mask = (1u << bits) - 1;
    for (int g = g0; g < g1; g++) {
        for (int c = 0; c < 16; c++) {
            int n = g * 16 + c;
            if (n >= w->N) break;
            for (int m = 0; m < M; m++) {
                const int8_t *a = codes + m * lda;
                float acc = -0.0f;
                for (int b = 0; b < nb; b++) {
                    const uint8_t *blk = w->w8 + ((ptrdiff_t)g * nb + b) * lines * 64;
                    int32_t dot = 0;
                    for (int L = 0; L < lines; L++)
                        for (int t = 0; t < 4; t++) {
                            unsigned byte = blk[L * 64 + c * 4 + t];
                            for (int s = 0; s < per; s++)
                                dot += (int32_t)((byte >> (bits * s)) & mask) *
                                       a[b * w->bs + L * 4 * per + s * 4 + t];
                        }
                    int32_t z = w->z8 ? w->z8[((ptrdiff_t)g * nb + b) * 16 + c] : w->zconst;
                    int32_t d = dot - z * csum[m * nb + b];
                    float sab = sa[m * nb + b] * w->s8[((ptrdiff_t)g * nb + b) * 16 + c];
                    acc = fmaf((float)d, sab, acc);
                }
                if (w->bias) acc = acc + w->bias[n];
                y[m * ldy + n] = bad[m] ? NAN : acc;
            }
        }
    }
}

static void ftile_scalar(const float *a, ptrdiff_t lda, const float *p, ptrdiff_t ldp, int j0, int j1, int K,
                         float *acc, ptrdiff_t acc_rs, int mr, int nr) {
    for (int r = 0; r < mr; r++)
        for (int c = 0; c < nr; c++) {
            float *l = acc + (r * acc_rs + c) * 16;
            const float *ar = a + r * lda, *pc = p + c * ldp;
            for (int j = j0; j < j1; j++) {
                int cnt = K - 16 * j < 16 ? K - 16 * j : 16;   /* lanes of k >= K stay */
                for (int i = 0; i < cnt; i++) l[i] = fmaf(ar[16 * j + i], pc[(j - j0) * 16 + i], l[i]);
            }
        }
}

void ql_nbits_fpanel_portable(const ql_nbits_w *w, int n0, int nc, int j0, int j1, float *p, ptrdiff_t ldp) {
    const int bits = w->bits, per = 8 / bits, nb = w->nb;
    const unsigned mask = (1u << bits) - 1;
    for (int cc = 0; cc < nc; cc++) {
        const int n = n0 + cc, c = n % QL_NB_FCOLS;
        const ptrdiff_t G = n / QL_NB_FCOLS;
        const uint8_t *grp = w->wf + G * QL_NB_FCOLS * w->wf_row;
        const float *sf = w->sf + G * nb * QL_NB_FCOLS, *zf = w->zf + G * nb * QL_NB_FCOLS;
        for (int j = j0; j < j1; j++) {
            const uint8_t *sc = grp + ((ptrdiff_t)(j / per) * QL_NB_FCOLS + c) * 16;
            int s = j % per;
            for (int i = 0; i < 16; i++) {
                int k = 16 * j + i;
                int b = w->g ? w->g[k] : k / w->bs;
                float q = (float)((sc[i] >> (bits * s)) & mask);
                float d = q - zf[b * QL_NB_FCOLS + c];
                p[cc * ldp + (j - j0) * 16 + i] = d * sf[b * QL_NB_FCOLS + c];
            }
        }
    }
}

void ql_nbits_ffold_portable(const float *acc, int count, const float *bias, float *y) {
    for (int o = 0; o < count; o++) {
        float t[16];
        memcpy(t, acc + o * 16, sizeof t);
        for (int h = 8; h >= 1; h >>= 1)
            for (int l = 0; l < h; l++) t[l] = t[l] + t[l + h];
        y[o] = bias ? t[0] + bias[o] : t[0];
    }
}

const ql_nbits_kernels ql_nbits_scalar = {"scalar", i8_scalar, 16, ftile_scalar, ql_nbits_fpanel_portable,
                                          ql_nbits_ffold_portable, NULL};

/* ---------------------------------------------------------------------------------------
 * Drivers
 * ------------------------------------------------------------------------------------- */
typedef struct {
    const ql_nbits_kernels *k;
    const ql_nbits_w *w;
    const float *a;
    int M;
    float *y;
    /* int8 */
    const int8_t *codes; const float *sa; const int32_t *csum; const uint8_t *bad;
    int gpt;                      /* column groups per task */
    /* float */
    float *scratch; size_t per_thread;   /* floats */
} nb_ctx;

static void qa_task(void *vc, ptrdiff_t t, int thread) {
    (void)thread;
    nb_ctx *c = (nb_ctx *)vc;
    const ql_nbits_w *w = c->w;
    ptrdiff_t kpad = (ptrdiff_t)w->nb * w->bs;
    ql_nbits_quantize_a(c->a + t * w->K, w->K, 1, w->K, w->bs, w->nb, (int8_t *)c->codes + t * kpad,
                        (float *)c->sa + t * w->nb, (int32_t *)c->csum + t * w->nb, (uint8_t *)c->bad + t);
}

static void i8_task(void *vc, ptrdiff_t t, int thread) {
    (void)thread;
    nb_ctx *c = (nb_ctx *)vc;
    const ql_nbits_w *w = c->w;
    int ng = (w->N + 15) / 16, g0 = (int)t * c->gpt, g1 = g0 + c->gpt < ng ? g0 + c->gpt : ng;
    c->k->i8(w, c->codes, (ptrdiff_t)w->nb * w->bs, c->sa, c->csum, c->bad, c->M, g0, g1, c->y, w->N);
}

/* float levels: a task is FT_NT columns; the panel holds FT_JC groups of 16 k of them (64 KiB,
 * L2; a column quad's 8 KiB stay in L1 while FT_MC rows go by), the accumulators (16 lanes per
 * output: 256 KiB, L2) FT_MC rows of them at a time. Measured under load against onnxruntime on
 * the Zen 4: JC 16 rows-outer 1.6x its time, columns-outer 1.4x, JC 8 2.0x, JC 32 1.0-1.2x. */
#define FT_NT 32
#define FT_JC 32
#define FT_MC 128

static void f_task(void *vc, ptrdiff_t t, int thread) {
    nb_ctx *c = (nb_ctx *)vc;
    const ql_nbits_w *w = c->w;
    const ql_nbits_kernels *k = c->k;
    if (c->M == 1 && k->fdec && k->fdec(w, c->a, (int)t * FT_NT, c->y)) return;
    float *panel = c->scratch + (size_t)thread * c->per_thread;
    float *acc = panel + FT_NT * FT_JC * 16;
    const ptrdiff_t ldp = FT_JC * 16;
    int n0 = (int)t * FT_NT, nc = w->N - n0 < FT_NT ? w->N - n0 : FT_NT;
    int G = (w->K + 15) / 16;
    for (int m0 = 0; m0 < c->M; m0 += FT_MC) {
        int mc = c->M - m0 < FT_MC ? c->M - m0 : FT_MC;
        for (size_t i = 0; i < (size_t)mc * FT_NT * 16; i++) acc[i] = -0.0f;   /* the identity of + */
        for (int j0 = 0; j0 < G; j0 += FT_JC) {
            int j1 = j0 + FT_JC < G ? j0 + FT_JC : G;
            k->fpanel(w, n0, nc, j0, j1, panel, ldp);
            /* columns outer: a quad's panel rows stay in L1 while the rows go by */
            for (int q = 0; q < nc; q += 4) {
                int nr = nc - q < 4 ? nc - q : 4;
                for (int r = 0; r < mc; r += 4) {
                    int mr = mc - r < 4 ? mc - r : 4;
                    k->ftile(c->a + (ptrdiff_t)(m0 + r) * w->K, w->K, panel + q * ldp, ldp, j0, j1, w->K,
                             acc + ((ptrdiff_t)r * FT_NT + q) * 16, FT_NT, mr, nr);
                }
            }
        }
        for (int r = 0; r < mc; r++)
            k->ffold(acc + (ptrdiff_t)r * FT_NT * 16, nc, w->bias ? w->bias + n0 : NULL,
                     c->y + (ptrdiff_t)(m0 + r) * w->N + n0);
    }
}

int ql_nbits_run(const ql_nbits_kernels *k, const ql_nbits_w *w, int int8, const float *a, int M, float *y) {
    nb_ctx c;
    memset(&c, 0, sizeof c);
    c.k = k; c.w = w; c.a = a; c.M = M; c.y = y;
    int threads = ql_num_threads();
    if (int8) {
        ptrdiff_t kpad = (ptrdiff_t)w->nb * w->bs;
        size_t bytes = (size_t)M * kpad + (size_t)M * w->nb * 8 + (size_t)M + 64;
        char *buf = (char *)malloc(bytes);
        if (!buf) return -1;
        c.sa = (const float *)buf;
        c.csum = (const int32_t *)(buf + (size_t)M * w->nb * 4);
        c.codes = (const int8_t *)(buf + (size_t)M * w->nb * 8);
        c.bad = (const uint8_t *)(buf + (size_t)M * w->nb * 8 + (size_t)M * kpad);
        /* rows in parallel when there are enough of them to pay for waking the pool */
        ql_parallel_for(M, (ptrdiff_t)M * w->K >= (1 << 16) ? threads : 1, qa_task, &c);
        int ng = (w->N + 15) / 16;
        c.gpt = k->i8_cols / 16;
        if (c.gpt < 1) c.gpt = 1;
        /* at least 4 tasks per thread where N allows, so a thread slowed by other load takes fewer */
        while (c.gpt > 1 && (ng + c.gpt - 1) / c.gpt < 4 * threads) c.gpt /= 2;
        ql_parallel_for((ng + c.gpt - 1) / c.gpt, threads, i8_task, &c);
        free(buf);
        return 0;
    }
    int mc = M < FT_MC ? M : FT_MC;
    c.per_thread = (size_t)FT_NT * FT_JC * 16 + (size_t)mc * FT_NT * 16 + 16;
    c.scratch = (float *)malloc(c.per_thread * sizeof(float) * (size_t)(threads > 0 ? threads : 1));
    if (!c.scratch) return -1;
    ql_parallel_for((w->N + FT_NT - 1) / FT_NT, threads, f_task, &c);
    free(c.scratch);
    return 0;
}
