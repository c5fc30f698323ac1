/* Convolutions (conv.c, conv_avx2.c): the plan handed over by Python and the entry points. */
#ifndef QLINEAR_CONV_H
#define QLINEAR_CONV_H

#include "qlinear.h"

/* Highest spatial rank the native engine takes (Python falls back to NumPy above). */
#define QL_CONV_MAXD 12

typedef struct ql_conv_plan {
    int nsp;                                  /* spatial rank */
    int64_t N, C, M, group;                   /* x (N, C, in...), w (M, C/group, k...) */
    int64_t in[QL_CONV_MAXD], out[QL_CONV_MAXD], k[QL_CONV_MAXD];
    int64_t stride[QL_CONV_MAXD], dil[QL_CONV_MAXD], pad[QL_CONV_MAXD];  /* pad: at the beginning */
    const void *x; int x_type; int32_t x_zp;  /* contiguous NCHW... input, 8-bit */
    void *y;                                  /* contiguous (N, M, out...) output */
    int quantized;                            /* 0: int32 y, 1: 8-bit y */
    int y_signed; int32_t y_zp; float lo, hi; /* requantization (quantized only) */
    const float *mult; ptrdiff_t mult_s;      /* per output channel (s = 1) or broadcast (0) */
    const int32_t *bias;                      /* [M] or NULL */
} ql_conv_plan;


/* Bytes of packed weights: M rows of K = C/group * taps (as ql_conv_pack_w lays them out) */
size_t ql_conv_w_bytes(const ql_gemm_kernel *k, int M, int K, int64_t taps);
/* Entries per packed row: K, or the grouped order's K with channels padded to kpack */
int64_t ql_conv_wk(const ql_gemm_kernel *k, int64_t K, int64_t taps);
/* Whether weights of K = Cg * taps per row are packed in the grouped order (conv.c) */
int ql_conv_grouped(const ql_gemm_kernel *k, int64_t K, int64_t taps);
/* 0, -1 when k is a QL_FORM_S8U8 kernel and some w - wzp lies outside [-64, 64] (the
 * caller checks first; this is the proof's last line, never a saturating product), -2 when
 * out of memory. taps: kernel taps per channel (K = C/group * taps). */
int ql_conv_pack_w(const ql_gemm_kernel *k, const void *w, int w_type, int M, int K, int64_t taps,
                   const int32_t *wzp, void *dst);
/* A plain call's weights: packed for isa->conv_fast when every w - wzp lies in [-64, 64] (then
 * returns 2), else for isa->exact (returns 0), -2 when out of memory; dst holds
 * max(ql_conv_w_bytes) of the two. */
int ql_conv_pack_w_auto(const ql_isa *isa, const void *w, int w_type, int M, int K, int64_t taps,
                        const int32_t *wzp, void *dst, int threads);
/* The fast part of ql_conv_pack_w_auto: 2 when isa->conv_fast exists and every w - wzp lies
 * within its kernel's s8_bound (dst then holds the weights packed for it), else 0 (dst holds
 * nothing usable), -2 when out of memory */
int ql_conv_pack_w_fast(const ql_isa *isa, const void *w, int w_type, int M, int K, int64_t taps,
                        const int32_t *wzp, void *dst, int threads);
/* 0, -1 (out of memory), -2 (sizes beyond int), -3 (scratch above the workspace limit) */
int ql_conv_gemm(const ql_conv_plan *p, const ql_isa *isa, const ql_gemm_kernel *kern,
                 const void *wpacked, size_t workspace);
/* A plain call's weights as given: (M, K) rows of w_type (K = C/group * taps, the plan's),
 * int32 zero points wzp[M] */
typedef struct ql_conv_wraw { const void *w; int w_type; const int32_t *wzp; } ql_conv_wraw;
/* ql_conv_gemm for a plain call: the weights packed for kern inside the implicit GEMM's tasks,
 * each task its row block into its thread's scratch right before its tiles (I16 form, one image
 * at a time: read once from w, used from L2), else into wbuf first (ql_conv_w_bytes of kern)
 * and run as ql_conv_gemm. Same returns. */
int ql_conv_gemm_raw(const ql_conv_plan *p, const ql_isa *isa, const ql_gemm_kernel *kern,
                     const ql_conv_wraw *raw, void *wbuf, size_t workspace);
/* A plain call on isa->conv_fast, its weights (raw) packed into wbuf during the call (beside the
 * implicit GEMM's first copy tasks where it runs, else first) while proving its bound: 1 (done),
 * 0 (no fast kernel for this convolution, or a weight outside its bound: y untouched, the caller
 * runs the exact form), or ql_conv_gemm's errors; wbuf: ql_conv_w_bytes of isa->conv_fast */
int ql_conv_plain_fast(const ql_conv_plan *p, const ql_isa *isa, const ql_conv_wraw *raw, void *wbuf,
                       size_t workspace);
/* The name of the kernel that packs and runs a convolution of K = C/group * taps on level
 * kernel k (k's, or its conv_fallback's: qlinear.h, kchunk), and the GEMM convolutions run so
 * far on a kernel with chunks and the implicit-GEMM tasks that ran tile pairs (diagnostics) */
const char *ql_conv_kernel_name(const ql_gemm_kernel *k, int64_t K, int64_t taps);
void ql_conv_tile_counts(long long *chunked, long long *paired);
/* ql_conv_gemm_raw runs that packed the weights inside the GEMM tasks, and plain fast-path
 * calls that packed them in the implicit GEMM's first copy job (diagnostics) */
long long ql_conv_in_task_packs(void);
long long ql_conv_copy_job_packs(void);
/* Calls of ql_conv_gemm that ran the implicit GEMM and the im2col path, the implicit path's
 * GEMMs over several images, their images and merged tail panels, the implicit runs on
 * shifted planes and those whose images ran in parallel (diagnostics) */
void ql_conv_path_counts(long long *implicit, long long *im2col, long long *merged, long long *merged_images,
                         long long *merged_tails, long long *shifted,
                         long long *parallel_chunks);
/* Implicit-path copy rows of the stride-2 copies: input rows split into both column phases at
 * once, and shifted tap rows copied from those phase rows (diagnostics) */
void ql_conv_copy_counts(long long *split_rows, long long *tap_rows);
/* Depthwise calls run so far on each path: channels-last, plane, rows (diagnostics) */
void ql_conv_dw_path_counts(long long *cl, long long *plane, long long *rows);
#if QL_X86
/* conv_avx2.c: the channels-last fill's 16 x 16 transpose (conv.c's transpose16_i16) */
void ql_dw_t16_avx2(const uint8_t *src, ptrdiff_t cs, uint8_t flip, int32_t zsub, int16_t *dst, const ptrdiff_t *doff);
/* conv_avx2.c: the channels-last store of 32 positions at a time (conv.c's dwcl_store_q, cols >= 32) */
void ql_dw_store_avx2(const uint8_t *Q, int nch, int cols, uint8_t *y, ptrdiff_t P);
/* conv_avx2.c: the 7-bit path's stride-2 copy row, both column phases of 4 channels at once
 * (conv.c's ig_split_s2; only for the S8U8 form, whose kernel is AVX2's) */
void ql_ig_s2x4_avx2(const uint8_t *raw, ptrdiff_t rs, uint8_t flip, uint8_t *d0, uint8_t *d1, int64_t len);
#endif
/* wc: (M, taps) centered int16 weights, w_elems int16 in all; when 2-D with M == C and at most
 * 64 taps, they may be followed by the channels-last form (ceil(M/16), 2*ceil(taps/2), 16)
 * (channels beyond M and the padding tap 0), used when w_elems covers it */
int ql_conv_depthwise(const ql_conv_plan *p, const ql_isa *isa, const int16_t *wc, size_t w_elems,
                      size_t workspace);

#endif
