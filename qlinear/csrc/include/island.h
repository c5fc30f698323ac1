/* Integer islands: the float glue between quantized kernels that onnxruntime runs as separate
 * float nodes (DequantizeLinear, BatchNormalization, Add / Sum, Relu, QuantizeLinear), computed
 * in one pass with the float32 operations onnxruntime performs, in its order, hence its bytes
 * (docs/qdq.md, "Integer islands"; the graph rewrite is qlinear/passes/islands.py).
 *
 * Per element, for operands A and (optionally) B:
 *   v_X = X's float32 value, or D(x) = f(float(x - z) * s) for an 8-bit X (onnxruntime's
 *         DequantizeLinear: the difference is an exact small integer), then, with a
 *         per-channel affine (an unfolded BatchNormalization), f(f(v_X * mul[c]) + add[c]);
 *   v   = v_A, or f(v_A + v_B) (Add / Sum of two);
 *   v   = max(v, 0) with Relu;
 * written as float32 (out_f) and / or as onnxruntime's QuantizeLinear (out_q): f(v / ys)
 * clamped to [qmin - yz, qmax - yz] (NaN to the low end), rounded half to even, plus yz.
 *
 * Table island: y = table[c][x] per channel c, the 256-entry tables built by the rewrite (the
 * same per-element arithmetic evaluated on every 8-bit code). */
#ifndef QLINEAR_ISLAND_H
#define QLINEAR_ISLAND_H

#include <stddef.h>
#include <stdint.h>

#include "qlinear.h"

typedef struct ql_island_operand {
    const uint8_t *q;       /* 8-bit codes (is_signed: int8, else uint8), or NULL */
    int is_signed;
    const float *f;         /* float32 values when q is NULL */
    float s;                /* DequantizeLinear's scale and zero point (q only) */
    int32_t z;
    const float *mul, *add; /* per-channel affine after dequantization, or NULL */
} ql_island_operand;

typedef struct ql_island_job {
    ql_island_operand a, b;
    int has_b, relu, is_signed;  /* is_signed: out_q is int8 */
    float *out_f;           /* float32 output, or NULL */
    uint8_t *out_q;         /* 8-bit output, or NULL */
    float ys;               /* QuantizeLinear's scale and zero point (out_q only) */
    int32_t yz;
} ql_island_job;

/* elements [i, i + n) of the job, all of channel c */
typedef void (*ql_island_run_fn)(const ql_island_job *j, ptrdiff_t i, ptrdiff_t n, ptrdiff_t c);

/* y[i] = table[x[i]] for i < n (one 256-byte table) */
typedef void (*ql_island_lut_fn)(const uint8_t *x, ptrdiff_t n, const uint8_t *table, uint8_t *out);

typedef struct ql_island_kernels {
    const char *name;  /* "scalar", "avx2", "avx512vbmi" */
    ql_island_run_fn run;
    ql_island_lut_fn lut;
} ql_island_kernels;

/* the AVX2 run (isa/island_avx2.c; the VBMI kernels' run too) */
void ql_island_run_avx2(const ql_island_job *j, ptrdiff_t i, ptrdiff_t n, ptrdiff_t c);

/* the portable run (the scalar level's, and the AVX2 kernel's tail) */
void ql_island_run_portable(const ql_island_job *j, ptrdiff_t i, ptrdiff_t n, ptrdiff_t c);

extern const ql_island_kernels ql_island_scalar;
#if QL_X86
extern const ql_island_kernels ql_island_avx2;
#ifndef QL_SIMDE
/* the AVX2 run with VBMI's two-table byte permute for the tables (AVX-512 levels on CPUs with
 * AVX512-VBMI; not in the SIMDe-emulated build, where the AVX2 kernels serve every level) */
extern const ql_island_kernels ql_island_avx512vbmi;
#endif
#endif

/* dispatch.c: the island kernels for an ISA level (x86 levels above scalar: AVX2; the AVX-512
 * levels with VBMI: ql_island_avx512vbmi) */
const ql_island_kernels *ql_island_for(const ql_isa *isa);

/* island/island.c: the job over planes * plane elements (plane p has channel p % C; C = 1
 * without an affine), on up to `threads` of the pool's threads (one below ISLAND_PAR_MIN
 * elements: a hand-off costs more than it saves) */
void ql_island(const ql_island_kernels *k, const ql_island_job *j, ptrdiff_t planes, ptrdiff_t C,
               ptrdiff_t plane, int threads);

/* island/island.c: y[p][i] = tables[(p % C) * 256 + x[p][i]] for planes p < planes of `plane`
 * bytes each (NCHW: planes = N * C), on up to `threads` threads */
void ql_island_lut(const ql_island_kernels *k, const uint8_t *x, ptrdiff_t planes, ptrdiff_t C, ptrdiff_t plane,
                   const uint8_t *tables, uint8_t *out, int threads);

#endif
