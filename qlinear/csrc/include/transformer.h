/* Float kernels of onnxruntime's transformer operators (com.microsoft Gelu, FastGelu,
 * SkipLayerNormalization's normalization): transformer/transformer.c. Each is the float64
 * formula of qlinear/contrib/transformer.py, operation for operation, rounded once to float32;
 * one portable C file (no ISA dispatch), so every ISA level and thread count gives the same bits. */
#ifndef QLINEAR_TRANSFORMER_H
#define QLINEAR_TRANSFORMER_H

#include <stddef.h>
#include <stdint.h>

/* y = f(0.5 · x · (1 + erf(x / √2))), x widened to double; n elements */
void ql_gelu_f32(const float *x, ptrdiff_t n, float *y);

/* v = x + bias (bias NULL or `last` values repeated along each row of `last`; the float32
 * parameters arrive widened to double, as the Python path widens them once), in double;
 * y = f(0.5 · v · (1 + tanh(u))) with u = √(2/π) · (v + 0.044715 · v³), evaluated as
 * f(v / (1 + exp(-2u))); rows × last elements */
void ql_fast_gelu_f32(const float *x, const double *bias, ptrdiff_t rows, ptrdiff_t last, float *y);

/* Per row of `hidden`: s = f(x + skip (+ bias)) (the sum in double, rounded once: out `sum`),
 * then layer normalization of s in double with NumPy's pairwise row sums: mean = Σs / n,
 * d = s - mean, var = Σd² / n, inv = 1 / √(var + eps), y = f(d · inv · gamma (+ beta)); `mean`
 * and `inv_std` (one per row) rounded once. gamma, beta, bias: float32 values widened to double
 * (beta, bias may be NULL). Returns 0, having written nothing, when its work rows cannot be
 * allocated, else 1. */
int ql_skip_layer_norm_f32(const float *x, const float *skip, const double *gamma, const double *beta,
                           const double *bias, ptrdiff_t rows, ptrdiff_t hidden, double epsilon, float *y,
                           float *mean, float *inv_std, float *sum);

/* np.add.reduce of a contiguous row of n doubles: 0. plus NumPy's pairwise sum of it
 * (transformer.c), shared by the kernels that reproduce NumPy's row sums. */
double ql_tf_row_sum(const double *a, ptrdiff_t n);

/* The layer normalization of one row s of h doubles (overwritten; d: h doubles of work), as
 * the NumPy path's _layer_norm: mean = Σs / h, d = s - mean, var = Σd² / h, inv = 1 / √(var +
 * eps), y = f(d · inv · gamma (+ beta)), with ql_tf_row_sum's sums; beta may be NULL. */
void ql_tf_layer_norm_row(double *s, double *d, ptrdiff_t h, const double *gamma, const double *beta, double eps,
                          float *y, double *mean_out, double *inv_out);

/* The forms of an attention mask (int32): none; raw 0/1 (B, total) or (B, S, total), a key
 * kept where its entry is > 0; end positions (B), a key kept below its row's end; end and
 * start positions (2B), kept in [start, end). */
enum { QL_ATT_MASK_NONE = 0, QL_ATT_MASK_2D, QL_ATT_MASK_3D, QL_ATT_MASK_END, QL_ATT_MASK_END_START };

/* Multi-head self-attention (attention.c) of a fused projection qkv (batch, seq, 3 · heads ·
 * head) in double: per batch row and head, scores = (q · kᵀ) · scale (+ 0 or the filter where
 * the mask hides a key) (+ 0 or the filter where `unidirectional` hides a later key), softmax
 * over the keys (max subtracted, exp, divided by the pairwise sum), times v; `out` (batch, seq,
 * heads · head) float32. past (2, batch, heads, past_len, head) float32 or NULL comes before this
 * step's keys and values; `present` (2, batch, heads, past_len + seq, head) gets both (NULL:
 * not written). mask: int32 in the form `mask_kind`, or NULL with QL_ATT_MASK_NONE. Returns 0,
 * having written nothing, when its work rows cannot be allocated, else 1. */
int ql_attention_f64(const double *qkv, ptrdiff_t batch, ptrdiff_t seq, ptrdiff_t heads, ptrdiff_t head,
                     const float *past, ptrdiff_t past_len, const int32_t *mask, int mask_kind, int unidirectional,
                     double scale, double mask_filter_value, float *out, float *present);

/* QAttention's projection: qkv = f(f(acc) · f(weight_scale_j · input_scale)) + bias_j in
 * float32 operations, widened to double; acc int32 (rows, cols), weight_scale one value or one
 * per column (`per_column`), bias float32 (cols). */
void ql_qattention_qkv(const int32_t *acc, ptrdiff_t rows, ptrdiff_t cols, const float *weight_scale,
                       int per_column, float input_scale, const float *bias, double *qkv);

/* com.microsoft EmbedLayerNormalization (embed.c) on rows = batch · seq tokens: e = word[ids]
 * + position[pos] (+ segment[seg]) in double (each float32 table value widened), out `sum`
 * f(e); y = f(layer normalization of e) as ql_skip_layer_norm_f32 normalizes (NumPy's pairwise
 * sums; gamma, beta widened to double). pos: NULL for 0..seq-1 in each batch row, else int64
 * or int32 (`pos64`) per token; seg NULL or int32 per token. Returns 1 done; 0 no memory; -1,
 * -2, -3 an index of ids, pos, seg outside its table (nothing meaningful written). */
int ql_embed_layer_norm_f32(const int32_t *ids, const void *pos, int pos64, const int32_t *seg, ptrdiff_t batch,
                            ptrdiff_t seq, const float *word, ptrdiff_t word_rows, const float *position,
                            ptrdiff_t position_rows, const float *segment, ptrdiff_t segment_rows,
                            ptrdiff_t hidden, const double *gamma, const double *beta, double epsilon, float *y,
                            float *sum);

/* DynamicQuantizeMatMul with a constant packed B (bound.c): A (M × K float32) quantized as
 * DynamicQuantizeLinear quantizes it (uint8), acc = the exact int32 product with B (packed for
 * `kern` at level `isa`, its zero point in the packing), y (M × N float32) = f(f(acc) ·
 * f(a_scale · b_scale_j)) (+ bias_j in a separate float32 addition). b_scale: one value or N
 * (`per_column`); bias: N or NULL; bs_max: max |b_scale| (not NaN). */
typedef struct ql_dqmm {
    const struct ql_isa *isa;
    const struct ql_gemm_kernel *kern;
    int M, N, K;
    const void *bpack;
    const int32_t *bcolsums, *bzcol;
    const float *b_scale;
    int per_column;
    const float *bias;
    double bs_max;
} ql_dqmm;
/* 1 done; 0 (y not meaningful) where the Python path takes its general branch: A's range needs
 * DynamicQuantizeLinear's guarded path (a NaN, |x| >= 1e37, a subnormal scale) or |a_scale| ·
 * bs_max > 1e28; -1 no memory */
int ql_dqmm_run(const ql_dqmm *d, const float *x, float *y, int threads);

/* QAttention with a constant packed weight (bound.c) for one geometry: x (batch · seq × K, of
 * `x_type` QL_U8 or QL_I8) times the weight (K × cols, packed for `kern` at `isa`, its zero
 * point in the packing), with x's zero point zx; then ql_qattention_qkv (weight_scale one value
 * or cols, bias cols) and ql_attention_f64 with these attributes. */
typedef struct ql_qattention_bound {
    const struct ql_isa *isa;
    const struct ql_gemm_kernel *kern;
    int K, cols, x_type;
    const void *bpack;
    const int32_t *bcolsums, *bzcol;
    const float *weight_scale, *bias;
    int per_column;
    ptrdiff_t batch, seq, heads, head, past_len;
    int mask_kind, unidirectional;
    double scale, filter;
} ql_qattention_bound;
/* 1 done, -1 no memory (out and present not meaningful) */
int ql_qattention_bound_run(const ql_qattention_bound *d, const void *x, float sx, int32_t zx, const int32_t *mask,
                            const float *past, float *out, float *present, int threads);

#endif
