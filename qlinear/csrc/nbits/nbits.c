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
void ql_nbits_qa_portable(const float *r, int K, int bs, int nb, int8_t *c, float *sa, int32_t *csum,
                          uint8_t *bad) {
    int isbad = 0;
    for (int k = 0; k < K; k++)
        if (!isfinite(r[k])) { isbad = 1; break; }
    *bad = (uint8_t)isbad;
    memset(c, 0, (size_t)nb * bs);
    for (int b = 0; b < nb; b++) {
        int k0 = b * bs, k1 = k0 + bs < K ? k0 + bs : K;
        float amax = 0.0f;
        if (!isbad)
            for (int k = k0; k < k1; k++) {
                float v = fabsf(r[k]);
                if (v > amax) amax = v;   /* a maximum is exact in any order */
            }
        sa[b] = amax / 127.0f;
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
        csum[b] = s;
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

static void ftile_scalar(const float *ap, const float *p, int k0, int k1, float *acc, ptrdiff_t ldc, int mr) {
    for (int r = 0; r < mr; r++)
        for (int c = 0; c < QL_NB_NR; c++) {
            float t = acc[r * ldc + c];
            for (int k = k0; k < k1; k++)
                t = fmaf(ap[(ptrdiff_t)k * QL_NB_MR + r], p[(ptrdiff_t)(k - k0) * QL_NB_NR + c], t);
            acc[r * ldc + c] = t;
        }
}

void ql_nbits_fpanel_portable(const ql_nbits_w *w, int n0, int k0, int k1, float *p) {
    const int bits = w->bits, per = 8 / bits, nb = w->nb, ng = (w->N + 15) / 16;
    const unsigned mask = (1u << bits) - 1;
    const ptrdiff_t gstride = (ptrdiff_t)nb * w->bs * bits / 32 * 64;   /* bytes of a group's stream */
    for (int c = 0; c < QL_NB_NR; c++) {
        const int n = n0 + c, G = n / 16, cl = n % 16;
        if (G >= ng) {   /* past the last group: no codes stored */
            for (int k = k0; k < k1; k++) p[(ptrdiff_t)(k - k0) * QL_NB_NR + c] = 0.0f;
            continue;
        }
        const uint8_t *grp = w->w8 + G * gstride;
        const float *sg = w->s8 + (ptrdiff_t)G * nb * 16, *zg = w->zf + (ptrdiff_t)G * nb * 16;
        for (int k = k0; k < k1; k++) {
            const int b = w->g ? w->g[k] : k / w->bs, u = k % (4 * per);
            const unsigned byte = grp[(ptrdiff_t)(k / (4 * per)) * 64 + cl * 4 + u % 4];
            const float q = (float)((byte >> (bits * (u / 4))) & mask);
            /* f(f(q - zp) * s): the difference exact for an integer zero point */
            p[(ptrdiff_t)(k - k0) * QL_NB_NR + c] = (q - zg[b * 16 + cl]) * sg[b * 16 + cl];
        }
    }
}

const ql_nbits_kernels ql_nbits_scalar = {"scalar", i8_scalar, 16, ftile_scalar, ql_nbits_fpanel_portable, NULL,
                                          ql_nbits_qa_portable};

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
    const float *ap; int m0, mc;         /* the row block, packed */
    int dec;                             /* M = 1 on the decode kernel */
    int nt;                              /* columns a task */
} nb_ctx;

static void qa_task(void *vc, ptrdiff_t t, int thread) {
    (void)thread;
    nb_ctx *c = (nb_ctx *)vc;
    const ql_nbits_w *w = c->w;
    ptrdiff_t kpad = (ptrdiff_t)w->nb * w->bs;
    c->k->qa(c->a + t * w->K, w->K, w->bs, w->nb, (int8_t *)c->codes + t * kpad, (float *)c->sa + t * w->nb,
             (int32_t *)c->csum + t * w->nb, (uint8_t *)c->bad + t);
}

static void i8_task(void *vc, ptrdiff_t t, int thread) {
    (void)thread;
    nb_ctx *c = (nb_ctx *)vc;
    const ql_nbits_w *w = c->w;
    int ng = (w->N + 15) / 16, g0 = (int)t * c->gpt, g1 = g0 + c->gpt < ng ? g0 + c->gpt : ng;
    c->k->i8(w, c->codes, (ptrdiff_t)w->nb * w->bs, c->sa, c->csum, c->bad, c->M, g0, g1, c->y, w->N);
}

/* float levels: a task is c->nt columns (a multiple of QL_NB_NR; FT_DEC for the decode kernel).
 * The rows go in blocks of at most FT_MC, each packed once into tiles of QL_NB_MR rows
 * (ap[tile][k][r]: a tile's k-th values side by side, one stream instead of QL_NB_MR rows a
 * multiple of 4 KiB apart, which share L1 sets). Per task and FT_KC k: the block's packed rows
 * (128 KiB at 128 rows) stay in L2 while each 32-column panel (32 KiB) is dequantized and the
 * tiles go over it; the accumulators (the block's rows x the task's columns, 64 KiB at most)
 * live in a per-thread buffer between chunks of k. */
#define FT_KC 256
#define FT_MC 128
#define FT_NT 128
#define FT_DEC 64

static void f_task(void *vc, ptrdiff_t t, int thread) {
    nb_ctx *c = (nb_ctx *)vc;
    const ql_nbits_w *w = c->w;
    const ql_nbits_kernels *k = c->k;
    if (c->dec) {
        k->fdec(w, c->a, (int)t * FT_DEC, c->y);
        return;
    }
    float *panel = c->scratch + (size_t)thread * c->per_thread;
    float *acc = panel + FT_KC * QL_NB_NR;
    const int m0 = c->m0, mc = c->mc, n0 = (int)t * c->nt, ldc = c->nt;
    const int nc = w->N - n0 < c->nt ? w->N - n0 : c->nt;
    for (size_t i = 0; i < (size_t)mc * ldc; i++) acc[i] = -0.0f;   /* the identity of + */
    for (int k0 = 0; k0 < w->K; k0 += FT_KC) {
        const int k1 = w->K - k0 < FT_KC ? w->K : k0 + FT_KC;
        for (int j = 0; j < nc; j += QL_NB_NR) {
            k->fpanel(w, n0 + j, k0, k1, panel);
            for (int r = 0; r < mc; r += QL_NB_MR)
                k->ftile(c->ap + (ptrdiff_t)(r / QL_NB_MR) * w->K * QL_NB_MR, panel, k0, k1,
                         acc + (ptrdiff_t)r * ldc + j, ldc, mc - r < QL_NB_MR ? mc - r : QL_NB_MR);
        }
    }
    for (int r = 0; r < mc; r++) {
        float *yr = c->y + (ptrdiff_t)(m0 + r) * w->N + n0;
        const float *ar = acc + (ptrdiff_t)r * ldc;
        for (int i = 0; i < nc; i++) yr[i] = w->bias ? ar[i] + w->bias[n0 + i] : ar[i];
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
    /* one row and a decode kernel that takes these weights: no panel, no packing */
    c.dec = M == 1 && k->fdec && k->fdec(w, NULL, -1, NULL);
    /* task columns: FT_NT, fewer (down to one panel) while that leaves under 4 tasks a thread */
    int NT = FT_NT;
    while (NT > QL_NB_NR && (w->N + NT - 1) / NT < 4 * threads) NT /= 2;
    if (c.dec) NT = FT_DEC;
    c.nt = NT;
    /* rows a block: FT_MC, fewer where the packed rows (MC * K floats) would pass ~3 % of the
     * float32 weights (N / 32 rows) and 256 KiB; at least one tile */
    ptrdiff_t lim = w->N / 32 > 65536 / w->K ? w->N / 32 : 65536 / w->K;
    int MC = lim < FT_MC ? (int)(lim / QL_NB_MR * QL_NB_MR) : FT_MC;
    if (MC < QL_NB_MR) MC = QL_NB_MR;
    int mcap = M < MC ? (M + QL_NB_MR - 1) / QL_NB_MR * QL_NB_MR : MC;
    c.per_thread = (size_t)FT_KC * QL_NB_NR + (size_t)mcap * NT + 16;
    c.scratch = (float *)malloc(c.per_thread * sizeof(float) * (size_t)(threads > 0 ? threads : 1) +
                                (c.dec ? 0 : (size_t)mcap * w->K * sizeof(float)));
    if (!c.scratch) return -1;
    float *ap = c.scratch + c.per_thread * (size_t)(threads > 0 ? threads : 1);
    c.ap = ap;
    for (int m0 = 0; m0 < M; m0 += MC) {
        const int mc = M - m0 < MC ? M - m0 : MC;
        c.m0 = m0; c.mc = mc;
        if (!c.dec) {
            for (int t = 0; t < mc; t += QL_NB_MR) {
                float *tile = ap + (ptrdiff_t)(t / QL_NB_MR) * w->K * QL_NB_MR;
                for (int kk = 0; kk < w->K; kk++)
                    for (int r = 0; r < QL_NB_MR; r++)
                        tile[(ptrdiff_t)kk * QL_NB_MR + r] = t + r < mc ? a[(ptrdiff_t)(m0 + t + r) * w->K + kk] : 0.0f;
            }
        }
        ql_parallel_for((w->N + NT - 1) / NT, threads, f_task, &c);
    }
    free(c.scratch);
    return 0;
}
