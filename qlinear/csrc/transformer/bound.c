/* Transformer nodes on bound constants, each in one call: the graph runtime's bound paths of
 * nodes whose weights and parameters are model constants (qlinear/graph/kernels/contrib.py),
 * checked and kept once by the bindings (python/bind_bound.c).
 *
 * com.microsoft DynamicQuantizeMatMul: DynamicQuantizeLinear of A
 * (ql_dynamic_quantize, onnxruntime's uint8 formula), the integer product with the packed B
 * (ql_matmul_run, exact int32), then y = f(f(acc) · f(a_scale · b_scale_j)) (+ bias_j as a
 * separate float32 addition): the float32 operations of the Python path
 * (qlinear/graph/kernels/contrib.py, DynamicQuantizeMatMul.fast_path), one rounding each
 * (-ffp-contract=off), so the same bits on every ISA level and thread count. */
#include "qlinear.h"
#include "transformer.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

int ql_dqmm_run(const ql_dqmm *d, const float *x, float *y, int threads) {
    const ptrdiff_t mk = (ptrdiff_t)d->M * d->K, mn = (ptrdiff_t)d->M * d->N;
    if (mk <= 0 || mn <= 0) return 0;
    /* the caller bounds M·K and M·N (the sizes of the call the node was bound after) */
    uint8_t *q = (uint8_t *)malloc((size_t)mk);
    int32_t *acc = (int32_t *)malloc(sizeof(int32_t) * (size_t)mn);
    int rc = 0;
    if (!q || !acc) {
        rc = -1;
        goto done;
    }
    float scale;
    int32_t zp;
    if (!ql_dynamic_quantize(d->isa, x, mk, q, &scale, &zp)) goto done;  /* the guarded branch */
    /* the Python path's bound: no float32 product below can overflow (|acc| < 2^31) */
    if (fabs((double)scale) * d->bs_max > 1e28) goto done;
    static const int64_t zero_idx = 0;
    static const float no_mult = 0.0f;
    ql_matmul mm = {0};
    mm.isa = d->isa; mm.kern = d->kern; mm.M = d->M; mm.N = d->N; mm.K = d->K; mm.batches = 1;
    mm.a = q; mm.a_type = QL_U8; mm.a_idx = &zero_idx;
    mm.zpa = &zp; mm.zpa_bs = 0; mm.zpa_rs = 0;
    mm.bpack = d->bpack; mm.bcolsums = d->bcolsums; mm.bzcol = d->bzcol; mm.Bb = 1; mm.b_idx = &zero_idx;
    mm.out = acc; mm.quantized = 0; mm.mult = &no_mult;
    mm.threads = threads;
    if (ql_matmul_run(&mm)) {
        rc = -1;
        goto done;
    }
    const ptrdiff_t N = d->N;
    for (ptrdiff_t i = 0; i < d->M; i++) {
        const int32_t *a = acc + i * N;
        float *o = y + i * N;
        for (ptrdiff_t j = 0; j < N; j++) {
            float s = scale * d->b_scale[d->per_column ? j : 0];  /* f(a_scale · b_scale_j) */
            float v = (float)a[j] * s;
            if (d->bias) v = v + d->bias[j];
            o[j] = v;
        }
    }
    rc = 1;
done:
    free(q);
    free(acc);
    return rc;
}

/* com.microsoft QAttention: the integer product of x (uint8 or int8, zero point zx) with the
 * packed weight, then ql_qattention_qkv and ql_attention_f64: the calls the Python path makes
 * (contrib/transformer.py, PreparedQAttention._lean) on the same values, so the same bits. */
int ql_qattention_bound_run(const ql_qattention_bound *d, const void *x, float sx, int32_t zx, const int32_t *mask,
                            const float *past, float *out, float *present, int threads) {
    const ptrdiff_t rows = (ptrdiff_t)d->batch * d->seq, cols = d->cols;
    if (rows <= 0 || cols <= 0) return 0;
    /* the caller bounds rows · cols · 8 (the sizes of the call the node was bound after) */
    int32_t *acc = (int32_t *)malloc(sizeof(int32_t) * (size_t)(rows * cols));
    double *qkv = (double *)malloc(sizeof(double) * (size_t)(rows * cols));
    int rc = -1;
    if (!acc || !qkv) goto done;
    static const int64_t zero_idx = 0;
    static const float no_mult = 0.0f;
    ql_matmul mm = {0};
    mm.isa = d->isa; mm.kern = d->kern; mm.M = (int)rows; mm.N = (int)cols; mm.K = d->K; mm.batches = 1;
    mm.a = x; mm.a_type = d->x_type; mm.a_idx = &zero_idx;
    mm.zpa = &zx; mm.zpa_bs = 0; mm.zpa_rs = 0;
    mm.bpack = d->bpack; mm.bcolsums = d->bcolsums; mm.bzcol = d->bzcol; mm.Bb = 1; mm.b_idx = &zero_idx;
    mm.out = acc; mm.quantized = 0; mm.mult = &no_mult;
    mm.threads = threads;
    if (ql_matmul_run(&mm)) goto done;
    ql_qattention_qkv(acc, rows, cols, d->weight_scale, d->per_column, sx, d->bias, qkv);
    if (!ql_attention_f64(qkv, d->batch, d->seq, d->heads, d->head, past, d->past_len, mask, d->mask_kind,
                          d->unidirectional, d->scale, d->filter, out, present))
        goto done;
    rc = 1;
done:
    free(acc);
    free(qkv);
    return rc;
}
