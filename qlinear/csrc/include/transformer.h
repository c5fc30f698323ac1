/* Float kernels of onnxruntime's transformer operators (com.microsoft Gelu, FastGelu,
 * SkipLayerNormalization's normalization): transformer/transformer.c. Each is the float64
 * formula of qlinear/contrib/transformer.py, operation for operation, rounded once to float32;
 * one portable C file (no ISA dispatch), so every ISA level and thread count gives the same bits. */
#ifndef QLINEAR_TRANSFORMER_H
#define QLINEAR_TRANSFORMER_H

#include <stddef.h>

/* y = f(0.5 · x · (1 + erf(x / √2))), x widened to double; n elements */
void ql_gelu_f32(const float *x, ptrdiff_t n, float *y);

/* v = x + bias (bias NULL or `last` values repeated along each row of `last`; the float32
 * parameters arrive widened to double, as the Python path widens them once), in double;
 * y = f(0.5 · v · (1 + tanh(√(2/π) · (v + 0.044715 · v³)))); rows × last elements */
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

#endif
