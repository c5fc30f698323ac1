/* Convolutions (conv/, isa/conv_avx2.c): the plan handed over by Python and the entry points. */
#ifndef QLINEAR_CONV_H
#define QLINEAR_CONV_H

#include "qlinear.h"

/* Highest spatial rank the native engine takes (Python falls back to NumPy above). */
#define QL_CONV_MAXD 12
/* The channels-last depthwise path's most taps (conv/depthwise_cl.c: its tap offset table) */
#define QL_DWCL_MAX_TAPS 64
/* The convolution paths a prepared form packs its weights for and a call names (python/
 * bind_conv.c's conv and conv_plain): the exact GEMM, the depthwise kernel, the GEMM's fast path
 * (QL_FORM_S8U8; ql_conv_pack_w_auto's 2). Python reads them (_qlnative.limits()). */
enum { QL_CONV_GEMM = 0, QL_CONV_DEPTHWISE = 1, QL_CONV_GEMM_FAST = 2 };

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
/* Whether weights of K = Cg * taps per row are packed in the grouped order (conv/pack_w.c) */
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
/* Implicit runs whose input copy ran inside the GEMM tasks (a pointwise layer's, ig_fuses);
 * on >= 0 first turns that path on (1) or off (0) for later calls (diagnostics, A/B) */
long long ql_conv_fused_copy(int on);
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
/* runtime/diag.c: the counters behind these getters, added to by the conv/ files (relaxed
 * atomics): chunked GEMM convolutions and paired tiles; split and tap copy rows; the GEMM
 * paths' calls (implicit, im2col, merged, merged images, merged tails, shifted, parallel
 * chunks, in-task packs, copy-job packs, fused copies); depthwise calls (channels-last, plane, rows) */
extern long long ql_conv_chunk_calls[2];
extern long long ql_ig_copy_rows[2];
extern long long ql_ig_calls[10];
extern int ql_ig_fuse_copy;
extern long long ql_dw_calls[3];
/* wc: (M, taps) centered int16 weights, w_elems int16 in all; when 2-D with M == C and at most
 * 64 taps, they may be followed by the channels-last form (ceil(M/16), 2*ceil(taps/2), 16)
 * (channels beyond M and the padding tap 0), used when w_elems covers it */
int ql_conv_depthwise(const ql_conv_plan *p, const ql_isa *isa, const int16_t *wc, size_t w_elems,
                      size_t workspace);

#endif
