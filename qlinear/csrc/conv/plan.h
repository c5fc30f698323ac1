/* What the convolution files (conv/) share: the geometry helpers, the weight-packing kernel
 * choice, the epilogue plan, the im2col and weight-packing contexts, and the entry points one
 * file calls in another. The helpers are static inline here, not functions of their own file:
 * they sit on the per-row paths of several files (the copies, the panel packer, the
 * depthwise rows), where a call across files would cost what inlining saves today.
 * Functions declared here have external linkage inside the module only (the build hides every
 * symbol but the module's init: -fvisibility=hidden). */
#ifndef QLINEAR_CONV_PLAN_H
#define QLINEAR_CONV_PLAN_H

#include "qlinear.h"
#include "conv.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "isa/x86_sse2.h"   /* the x86-64 baseline's loops: conv/ names no instruction set */

/* ---------------------------------------------------------------------------------------
 * Shared geometry helpers
 * ------------------------------------------------------------------------------------- */

static inline int64_t prod(const int64_t *v, int n)
{
    int64_t r = 1;
    for (int i = 0; i < n; i++) r *= v[i];
    return r;
}

/* Value of an 8-bit element as an int. */
static inline int32_t load8(const uint8_t *p, int type)
{
    return type == QL_U8 ? (int32_t)*p : (int32_t)(int8_t)*p;
}

/* Element strides of the spatial axes of one channel plane (innermost = 1). */
static inline void plane_strides(const ql_conv_plan *p, ptrdiff_t *st)
{
    ptrdiff_t s = 1;
    for (int a = p->nsp - 1; a >= 0; a--) {
        st[a] = s;
        s *= (ptrdiff_t)p->in[a];
    }
}

/* tap index t -> tap coordinates (last axis fastest) */
static inline void tap_coords(const ql_conv_plan *p, int64_t t, int64_t *tc)
{
    for (int a = p->nsp - 1; a >= 0; a--) {
        tc[a] = t % p->k[a];
        t /= p->k[a];
    }
}

static inline ptrdiff_t w_row_bytes(const ql_gemm_kernel *k, int K)
{
    int kp = ql_round_k(k, K);
    return (ptrdiff_t)kp * (k->form == QL_FORM_I16 ? 2 : 1);
}

/* The kernel that packs and runs a convolution of K = Cg * taps weights per row on level
 * kernel k: k itself, or for a kernel with chunks (ql_conv_kernels.kchunk) whose chunk does
 * not divide Cg, its conv_fallback. Every entry point below maps its kernel through this
 * first, so a layer's weights are packed and run by the same kernel. */
static inline const ql_gemm_kernel *conv_kernel(const ql_gemm_kernel *k, int64_t K, int64_t taps)
{
    if (k->conv.kchunk > 1 && (taps < 1 || K % taps || (K / taps) % ((int64_t)k->conv.kchunk * k->kpack)))
        return k->conv.conv_fallback;
    return k;
}

/* k-group G of the grouped order (chunks of ch = max(kchunk, 1) blocks, qlinear.h): its
 * channel block and tap */
static inline void group_of(int64_t G, int64_t taps, int64_t ch, int64_t *blk, int64_t *tap)
{
    int64_t q = G / ch;
    *tap = q % taps;
    *blk = q / taps * ch + G % ch;
}

static inline int64_t kchunk_of(const ql_gemm_kernel *k) { return k->conv.kchunk > 1 ? k->conv.kchunk : 1; }

/* Pixels per ql_gemm call: its sizes are int. */
#define PIX_CHUNK ((int64_t)1 << 30)

static inline void plan_epilogue(const ql_conv_plan *p, ql_epilogue *ep)
{
    memset(ep, 0, sizeof *ep);
    ep->quantized = p->quantized;
    ep->row_bias = p->bias;
    ep->mult = p->mult;
    ep->mult_rs = p->mult_s;
    ep->mult_cs = 0;
    ep->lo = p->lo;
    ep->hi = p->hi;
    ep->zp = p->y_zp;
    ep->out_is_signed = p->y_signed;
    ep->out_cs = 1;
}

/* ---------------------------------------------------------------------------------------
 * Weights (pack_w.c)
 * ------------------------------------------------------------------------------------- */
/* A plain call's weights, packed per call in one pass over w: the fast path's form while every
 * row fits its bound (the proof is made while packing; the first row outside stops every
 * thread), else the exact form. Rows shared over the threads in blocks (the grouped order
 * packed straight from w, pack_w_grouped). */
typedef struct {
    const ql_gemm_kernel *k; const void *w; int w_type, M, K; const int32_t *wzp; void *dst;
    int rows_per_task;
    atomic_int outside;
    int64_t taps; int grouped;
} packw_ctx;

/* S8U8 (fast path): C = sum x'(w - zw) over K, padding read as zx'; the result is
 * C - zx' * sum(w - zw): folded with the bias into one per-row term fb, in wrap32, from the
 * packed weights' row sums (after the packing: a plain call's are packed during the call) */
/* x's zero point in the u8 form zx' (int8 x: x ^ 0x80, so zx + 128) */
static inline uint32_t zx_u8form(const ql_conv_plan *p)
{
    return (uint32_t)(p->x_type == QL_I8 ? p->x_zp + 128 : p->x_zp);
}

/* fb[i] = bias[i] (0 without one) - zx' * wsum[i], wrap32, for n rows */
static inline void fast_terms(const int32_t *bias, uint32_t zxu, const int32_t *wsum, int64_t n, int32_t *fb)
{
    for (int64_t i = 0; i < n; i++) fb[i] = (int32_t)((bias ? (uint32_t)bias[i] : 0u) - zxu * (uint32_t)wsum[i]);
}

/* pack_w.c */
int pack_w_rows(const ql_gemm_kernel *k, const void *w0, int w_type, int M, int K, const int32_t *wzp, void *dst,
                int i0, int i1);
int pack_w_grouped(const ql_gemm_kernel *k, const void *w, int w_type, int M, int K, int64_t taps,
                   const int32_t *wzp, void *dst, int i0, int i1);
void packw_task(void *vctx, ptrdiff_t t, int thread);
ptrdiff_t packw_setup(packw_ctx *c, const ql_gemm_kernel *k, const void *w, int w_type, int M, int K,
                      int64_t taps, const int32_t *wzp, void *dst, int threads);
int pack_w_threads(const ql_gemm_kernel *k, const void *w, int w_type, int M, int K, int64_t taps,
                   const int32_t *wzp, void *dst, int threads);
void fast_bias_fill(const ql_conv_plan *p, const void *wpacked, ptrdiff_t ldl, int32_t *fb);
int fast_applies(const ql_isa *isa, int64_t M, int64_t K, int64_t taps);

/* ---------------------------------------------------------------------------------------
 * The im2col panel packer (im2col.c)
 * ------------------------------------------------------------------------------------- */
typedef struct im2col_ctx {
    const ql_conv_plan *p;
    const ql_gemm_kernel *kern;  /* the GEMM's kernel (its interleave4_bulk) */
    const uint8_t *xg;          /* image n, first channel of the group */
    int64_t pix0;               /* output pixel of column 0 of this GEMM call */
    int form, nr, kp, K;
    int64_t taps, plane;        /* taps per channel; input elements per channel plane */
    ptrdiff_t st[QL_CONV_MAXD]; /* element strides of the input plane's axes */
    uint8_t flip;               /* byte forms: raw byte ^ flip = the form's byte */
    uint8_t tail;               /* raw byte that becomes 0 in the form (columns >= ncols) */
    char *scratch, *scratch_mem;   /* scratch: scratch_mem on a 64-byte line */
    size_t scratch_bytes;       /* per thread */
    int use_plans;              /* per-panel tap plans kept (taps * (nr + 1) <= PLAN_MAX) */
    int flat;                   /* pointwise (every kernel extent 1, stride 1, no pads): the
                                   output plane is the input plane, rows run across output rows */
    int grouped;                /* weights in the grouped order (ql_conv_grouped): k-group G =
                                   (channel block, tap) by group_of, kpack channels each */
    int64_t chunk;              /* the kernel's kchunk (at least 1) */
    int64_t Cg;                 /* channels per group (grouped: blocks past it are padding) */
    /* per-thread scratch layout (byte offsets) */
    size_t off_base, off_seg, off_rows, off_plan, off_direct;
} im2col_ctx;

static inline size_t align64(size_t v) { return (v + 63) & ~(size_t)63; }

/* m (a block allocated 64 bytes longer than used) rounded up to a 64-byte line. Per-thread
 * scratch regions (multiples of 64 bytes each) then never share a line: on a block malloc
 * leaves 16-aligned, one thread's last line and the next thread's first would be one line,
 * written by both cores (false sharing: ResNet-50's l2 3x3 s2 copy, whose two threads write
 * their raw and phase rows for every input row, once took 6x its 1-thread CPU time at 2
 * threads) */
static inline char *line_up(char *m) { return m ? (char *)(((uintptr_t)m + 63) & ~(uintptr_t)63) : NULL; }

void im2col_layout(im2col_ctx *c);
void im2col_pack(void *vctx, int j0, int ncols, void *dst, int32_t *colsums, int thread);

/* rows.c: the operand forms' row builders (im2col.c, implicit_run.c) */
void pair_i16(const uint8_t *a, const uint8_t *b, int type, int32_t zx, int16_t *d, int nr);
void interleave4(const ql_gemm_kernel *k, const uint8_t *const *src, uint8_t flip, uint8_t *dk, int nr);

/* implicit_plan.c: the implicit GEMM when it applies (1 done, 0 not taken, negative: error) */
int ig_run(const ql_conv_plan *p, const ql_isa *isa, const ql_gemm_kernel *kern, void *wpacked,
           const ql_conv_wraw *raw, int32_t *fast_bias, size_t workspace);

#endif
