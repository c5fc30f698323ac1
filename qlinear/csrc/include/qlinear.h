/* qlinear native engine: shared types and prototypes (see NATIVE-DESIGN.md, docs/engine.md).
 *
 * Arithmetic rules: accumulators are int32 with two's-complement wrap (done in uint32_t:
 * signed overflow is undefined behaviour in C); the requantization epilogue is
 * v = (float)acc; v = v * m; v = clamp(v, lo, hi); r = rne(v); y = r + zp, never fused
 * (the build passes -ffp-contract=off).
 */
#ifndef QLINEAR_H
#define QLINEAR_H

#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__) || defined(_M_X64)
#define QL_X86 1
#else
#define QL_X86 0
#endif

/* ---------------------------------------------------------------------------------------
 * Operand forms
 * ------------------------------------------------------------------------------------- */
/* QL_FORM_S8U8 (convolutions' fast path): L rows are centered weights w - zw as int8, proven
 * within the kernel's bound when packed (ql_conv_kernels.s8_bound: [-64, 64] on AVX2, all of
 * [-128, 127] on the VNNI levels); R panels are u8-form bytes (uint8 as is, int8 ^ 0x80),
 * [kp/4][nr][4], no column sums (the weights are centered, so only a per-row term remains). */
enum { QL_FORM_I16 = 0, QL_FORM_U8S8 = 1, QL_FORM_S8U8 = 2 };
/* element types of source operands (Python reads them: _qlnative.limits()) */
enum { QL_U8 = 0, QL_I8 = 1, QL_I32 = 2, QL_F32 = 3 };
/* A level's GEMM kernels as the bindings name them (`which`): the exact one, the matmul's fast
 * path (ql_isa.fast), the convolutions' fast path (ql_isa.conv_fast) */
enum { QL_KERNEL_EXACT = 0, QL_KERNEL_FAST = 1, QL_KERNEL_CONV_FAST = 2 };

/* C tile (rows x nr int32, row stride ldc, overwritten) = sum over kp of L rows . R panel.
 * L: `rows` packed rows, row r at (char*)L + r*ldl_bytes, kp elements of the form each.
 * Rpanel: I16: [kp/2][nr][2] int16; U8S8: [kp/4][nr][4] bytes. kp is a multiple of kpack. */
typedef void (*ql_kernel_fn)(const void *L, ptrdiff_t ldl_bytes, const void *Rpanel, int kp,
                             int32_t *C, ptrdiff_t ldc, int rows);

/* Implicit-GEMM micro-kernel (convolutions, conv/'s implicit path): C tile (rows x
 * QL_IK_NR int32, row stride ldc, overwritten) = sum over k-groups g < groups of L rows' group
 * g (kpack elements at L + row*ldl_bytes + g*kpack*esize) times the operand of group g, read
 * at base + off[g] (bytes): QL_IK_NR columns x kpack values in the form, [QL_IK_NR][kpack]
 * (the layout of one group of a packed panel with nr = QL_IK_NR: 64 bytes in both forms).
 * The operand is not packed per tile: the offsets point into a padded copy of the input. */
#define QL_IK_NR 16
typedef void (*ql_ikernel_fn)(const void *L, ptrdiff_t ldl_bytes, const char *base, const ptrdiff_t *off,
                              int groups, int32_t *C, ptrdiff_t ldc, int rows);

/* Dot-product micro-kernel for a few columns: C[r][c] (r < rows <= mr, c < ncols <= QL_DOT_NR,
 * row stride ldc; other columns untouched) = sum over the first kbytes bytes of L row r (at
 * L + r*ldl_bytes, the form's values) times column c's values at X + c*xs_bytes, in wrap32.
 * Column c holds the same k order as the L rows, contiguous, and is readable (zero-padded)
 * up to kbytes rounded up to 32; L rows are read only within their kbytes. */
#define QL_DOT_NR 8
typedef void (*ql_dot_fn)(const void *L, ptrdiff_t ldl_bytes, const void *X, ptrdiff_t xs_bytes,
                          int kbytes, int ncols, int32_t *C, ptrdiff_t ldc, int rows);

struct ql_epilogue;
struct ql_ik_runs;
/* dot with the epilogue applied from the sums, as ikernel_ep does (runs below ncols) */
typedef void (*ql_dot_ep_fn)(const void *L, ptrdiff_t ldl_bytes, const void *X, ptrdiff_t xs_bytes,
                             int kbytes, int ncols, const struct ql_epilogue *ep,
                             const struct ql_ik_runs *runs, int i0, int rows);

/* packers: see ql_pack_L / ql_pack_R_panel below for the contract */
typedef void (*ql_pack_L_fn)(const void *src, int type, ptrdiff_t rs, ptrdiff_t ks, int rows, int K,
                             const int32_t *zp, ptrdiff_t zp_s, int form, void *dst,
                             ptrdiff_t ldl_bytes, int kp, int32_t *rowsums);
typedef void (*ql_pack_R_panel_fn)(const void *src, int type, ptrdiff_t ks, ptrdiff_t cs, int K,
                                   int ncols, const int32_t *zp, ptrdiff_t zp_s, int form, int nr,
                                   void *dst, int kp, int32_t *colsums);

/* Where the QL_IK_NR columns of an implicit tile go: n runs of len[k] columns starting at
 * tile column col[k], output pixel pix[k] (consecutive pixels within a run). */
typedef struct ql_ik_runs {
    int n;
    int col[QL_IK_NR], len[QL_IK_NR];
    ptrdiff_t pix[QL_IK_NR];
} ql_ik_runs;
struct ql_epilogue;
/* ikernel with the epilogue applied straight from the accumulators: the tile's rows i0..
 * (rows < mr) requantized (or stored as int32) like the level's epilogue would, into the
 * runs' pixels. Only for epilogues without U8S8 corrections, out_cs == 1 and per-row (or
 * broadcast) multipliers. */
typedef void (*ql_ikernel_ep_fn)(const void *L, ptrdiff_t ldl_bytes, const char *base, const ptrdiff_t *off,
                                 int groups, const struct ql_epilogue *ep, const ql_ik_runs *runs, int i0,
                                 int rows);

/* conv/pack_w.c's grouped-order weight packers at 9 taps (ql_gemm_kernel.grouped_*_t9) */
typedef void (*ql_grouped_i16_fn)(const uint8_t *s, int is_signed, int64_t pairs, int32_t z, int16_t *d);
typedef void (*ql_grouped_b_fn)(const uint8_t *s, int64_t blocks, uint8_t fx, uint8_t sub, uint8_t *d);
/* conv/implicit_run.c's byte-form loops, wider (ql_conv_kernels.s8u8_row_bulk / interleave4_bulk): each does
 * the first whole blocks of its loop and returns how many elements it did; conv/ does the
 * rest, so the result is conv/'s own whatever the split */
typedef int64_t (*ql_s8u8_row_bulk_fn)(const uint8_t *s, int64_t n, uint8_t flip, uint8_t lo, uint8_t hi,
                                       uint8_t zu, int8_t *d, uint32_t *usum, int *bad);
typedef int (*ql_interleave4_bulk_fn)(const uint8_t *const *src, uint8_t flip, uint8_t *dk, int nr);
/* the implicit GEMM's stride-2 copy row of the S8U8 form (ql_conv_kernels.ig_s2x4): both column
 * phases of 4 channels' raw rows (raw + q * rs) at once, bytes ^ flip, len positions
 * (conv/implicit_run.c, ig_split_s2, gives the contract and the portable loop) */
typedef void (*ql_ig_s2x4_fn)(const uint8_t *raw, ptrdiff_t rs, uint8_t flip, uint8_t *d0, uint8_t *d1, int64_t len);

/* What the convolution files (conv/) use of a GEMM kernel beyond the GEMM: its implicit-GEMM
 * variants, narrow tails and dot kernels, the fast form's bound, the weight and copy packers,
 * the chunked order. Part of each ql_gemm_kernel (.conv), not a table of its own per level: a
 * level runs convolutions on two kernels of different forms (the exact one, I16 or U8S8, and
 * conv_fast, S8U8), and each form has its own implicit kernels and packers. The GEMM driver
 * (gemm/) never reads it. */
struct ql_gemm_kernel;
typedef struct ql_conv_kernels {
    /* implicit-GEMM variant of `kernel` (I16 and S8U8 forms), or NULL: convolutions then
     * take the im2col path */
    ql_ikernel_fn ikernel;
    ql_ikernel_ep_fn ikernel_ep;   /* optional (NULL: ikernel, then the level's epilogue) */
    /* implicit tiles' narrow tails (ql_gemm_kernel.tail_nr's, which says how they work) */
    ql_ikernel_fn ikernel_tail;
    ql_ikernel_ep_fn ikernel_ep_tail;
    /* Narrowest tiles as dot products (optional): see ql_dot_fn. The implicit path gathers
     * the last tile's few real columns (a 7x7 plane's 49th) and runs this instead of a tile
     * of tail_nr or nr columns: the arithmetic of the real columns only. */
    ql_dot_fn dot;
    ql_dot_ep_fn dot_ep;           /* dot with ikernel_ep's epilogue (optional) */
    /* QL_FORM_S8U8 only: the kernels are exact when every centered weight w - zw lies in
     * [-s8_bound, min(s8_bound, 127)] (the int8 it is stored as caps the top at 127); conv/pack_w.c
     * proves that while packing and keeps the exact form for a layer that fails it.
     * 64 for AVX2's vpmaddubsw (int16 pair sums |2 * 255 * 64| = 32640 <= 32767 never saturate);
     * 128 for vpdpbusd (VNNI levels: 4 products |u8 * s8| <= 255 * 128 summed exactly into the
     * int32 lane with wraparound, no intermediate saturation: any int8 is safe). */
    int s8_bound;
    /* Convolution weights in conv/pack_w.c's grouped order, 3x3 kernels (9 taps), this level's SIMD
     * packer for the kernel's form (conv/pack_w.c's grouped_i16 / grouped_b give the contract), or
     * NULL: conv/pack_w.c's portable loops. Filled where the level's tables are defined, so conv/
     * never infers the ISA; the bytes are the same either way (tests/test_plain.py compares
     * both on every level). I16 form: `pairs` channel pairs w - z as int16; byte forms:
     * `blocks` blocks of 4 channels, (byte ^ fx) - sub. */
    ql_grouped_i16_fn grouped_i16_t9;
    ql_grouped_b_fn grouped_b_t9;
    /* Byte forms: the level's wider loops for conv/pack_w.c's s8u8_row (a weight row's bound check,
     * sum and centered bytes) and interleave4 (4 channels' rows side by side, the activation
     * copies and im2col panels), or NULL: conv/implicit_plan.c's 16-byte loops alone. Same bytes and sums. */
    ql_s8u8_row_bulk_fn s8u8_row_bulk;
    ql_interleave4_bulk_fn interleave4_bulk;
    /* Convolutions' grouped order in chunks (QL_FORM_S8U8 kernels; 0 or 1: none): k-groups
     * come in runs of kchunk channel blocks (kpack channels each) at one tap, a chunk of
     * kchunk * kpack channels at tap 0, then at tap 1, ...: k-group G is block
     * (G / kchunk / taps) * kchunk + G % kchunk at tap (G / kchunk) % taps (conv/plan.h, group_of).
     * amx-s8u8: 16, so that one 64-byte row of a weight tile is 64 channels at one tap and the
     * 16 k-groups of an operand tile are 16 blocks of the padded copy at one tap, equally
     * far apart (one tileloadd with that stride). Such a kernel takes convolutions whose
     * channels per group are a multiple of kchunk * kpack; conv/ hands the others (packing
     * and running alike) to conv_fallback, a kernel of the same form without chunks. */
    int kchunk;
    const struct ql_gemm_kernel *conv_fallback;
    /* Optional: ikernel_ep on two adjacent tiles at once, 2 * QL_IK_NR columns (the second
     * tile's operand of k-group g at base + off[g] + 64), runs rn[0] and rn[1]: an operand-
     * bound kernel then loads its weights once for both (amx-s8u8). conv/implicit_run.c pairs a thread's
     * consecutive full tiles of one image where the whole K runs at once. */
    void (*ikernel2_ep)(const void *L, ptrdiff_t ldl_bytes, const char *base, const ptrdiff_t *off, int groups,
                        const struct ql_epilogue *ep, const ql_ik_runs *rn, int i0, int rows);
    /* QL_FORM_S8U8 kernels: the level's stride-2 copy row for the implicit GEMM, or NULL:
     * conv/implicit_run.c's portable loop. Same bytes. */
    ql_ig_s2x4_fn ig_s2x4;
} ql_conv_kernels;

typedef struct ql_gemm_kernel {
    const char *name;       /* "avx512vnni-u8s8", "avx2-i16", "scalar-i16", ... */
    int mr, nr;             /* tile rows (L) and columns (R) */
    int kpack;              /* k values per packed group: 2 (i16 forms) or 4 (byte forms) */
    int form;               /* QL_FORM_I16 or QL_FORM_U8S8 */
    ql_kernel_fn kernel;
    /* packers for this kernel's form (SIMD where the level has them; same output as the
     * portable ql_pack_L / ql_pack_R_panel, which they may call for the cases they skip) */
    ql_pack_L_fn pack_L;
    ql_pack_R_panel_fn pack_R;
    /* optional: `kernel` and the level's epilogue in one call, the tile's accumulators
     * requantized (or stored) straight from the registers; the same result as `kernel` then
     * the level's epilogue on the tile (rows < mr at output row i0, cols <= nr at column j0).
     * Used by the GEMM driver when K is not blocked and the problem allows it (allow_fused). */
    void (*kernel_ep)(const void *L, ptrdiff_t ldl_bytes, const void *Rpanel, int kp,
                      const struct ql_epilogue *ep, const int32_t *colsum, int i0, int j0,
                      int rows, int cols);
    /* Narrow tails (optional; tail_nr 0: none). A tile whose real columns are all below
     * tail_nr (< nr) may run these instead: same arguments and operand layout as kernel /
     * conv.ikernel / conv.ikernel_ep (full nr- or QL_IK_NR-wide panels and groups, of which only the
     * first tail_nr columns are read); columns [0, tail_nr) of C are the product's, columns
     * [tail_nr, nr) are written as 0 (ikernel_ep_tail: runs must end before tail_nr).
     * They save the arithmetic of the dropped columns: a 7x7 plane is 49 = 3*16 + 1 columns.
     * (avx2 has kernel_tail only: its implicit narrow tiles run `dot`, which costs less.) */
    int tail_nr;
    ql_kernel_fn kernel_tail;
    /* K is padded (with zeros, by the packers) to a multiple of this; 0: of kpack. 64 for
     * amx-u8s8, whose tiles take 64 bytes of k per step (ql_round_k) */
    int kalign;
    /* Optional: called by every caller of `kernel` / `kernel_ep` on the thread that runs a
     * task, before its first kernel call and after its last one. For per-thread state the
     * kernels change and other code on the thread may use between tasks: amx-u8s8's tile
     * configuration, which it saves at task_begin and restores at task_end (onnxruntime's
     * AMX kernels, on the same caller thread, fault on shapes they did not load). */
    void (*task_begin)(void);
    void (*task_end)(void);
    /* 1: pack_R also takes ncols = 2 * nr (two whole panels of contiguous columns, from a
     * per-call packer in the GEMM driver): the second panel written at dst +
     * ql_panel_bytes(kp), colsums for all 2 * nr columns. Each row's 2 * nr bytes are then
     * read at once (whole cache lines for nr = 32 bytes of int8 b) instead of half a line per
     * panel, the other half read again for the next panel. */
    int pack_R_pairs;
    /* the convolutions' parts of this kernel (conv/ alone reads them; all zero: none) */
    ql_conv_kernels conv;
} ql_gemm_kernel;

/* ---------------------------------------------------------------------------------------
 * Epilogue: int32 tile -> output (int32, or requantized 8-bit)
 * ------------------------------------------------------------------------------------- */
typedef struct ql_epilogue {
    int quantized;                 /* 0: int32 output (ConvInteger/MatMulInteger), 1: 8-bit */
    const int32_t *row_bias;       /* per L row (conv bias B) or NULL */
    const float *mult; ptrdiff_t mult_rs, mult_cs;   /* m[i,j] = mult[i*rs + j*cs] (0 = broadcast) */
    float lo, hi; int32_t zp; int out_is_signed;     /* 8-bit output: clamp bounds, zero point, type */
    void *out; ptrdiff_t out_rs, out_cs;             /* element strides of C in the output */
    /* U8S8-form corrections (all NULL in the I16 form), added in wrap32:
     *   acc[i,j] = C[i,j] - col_z[j]*row_a[i] - row_z[i]*colsum[j]
     * row_a[i] = rowsum(L')[i] - K*zL'[i], row_z[i] = zL'[i], col_z[j] = zR'[j];
     * colsum is passed per tile (it belongs to the packed R panel). Strides 0 = broadcast. */
    const int32_t *row_a; const int32_t *row_z; ptrdiff_t row_s;
    const int32_t *col_z; ptrdiff_t col_z_s;
    /* int32 output only: 1 = whole 64-byte-aligned lines of the output may be written with
     * non-temporal stores (the SIMD epilogues; the scalar one ignores it). Set once per call
     * by the matmul driver (gemm.c: ql_gemm_stream_bytes); ql_gemm fences (sfence) at the end
     * of each task that ran with it. Zero everywhere else (conv/plan.h's plan_epilogue memsets them). */
    int stream;
} ql_epilogue;

/* Whether the SIMD epilogues take the problem: contiguous output rows, multipliers per row
 * or broadcast or contiguous along a row, b's zero points broadcast or contiguous (else they
 * hand the tile to a more general epilogue: ql_epilogue_avx2 to the portable one, amx's to
 * ql_epilogue_avx2) */
static inline int ql_epilogue_rows_contiguous(const ql_epilogue *ep) {
    return ep->out_cs == 1 && !(ep->quantized && ep->mult_cs > 1) && !(ep->row_a && ep->col_z_s > 1);
}

/* Requantize/store one tile: C rows [0,rows) x cols [0,cols) of the product, which are output
 * rows i0.. and columns j0..; colsum (U8S8 form only) = colsum(R') for these cols. */
typedef void (*ql_epilogue_fn)(const ql_epilogue *ep, const int32_t *C, ptrdiff_t ldc,
                               const int32_t *colsum, int i0, int j0, int rows, int cols);

/* ---------------------------------------------------------------------------------------
 * Quantize / Dequantize (contiguous runs; per-element parameters with stride 0 or 1)
 * ------------------------------------------------------------------------------------- */
/* y = sat_T(rne(float32(x / scale)) + zp); x float32 or int32 (converted first); NaN -> T's min */
typedef void (*ql_quantize_fn)(const void *x, int x_type, ptrdiff_t n, const float *scale,
                               ptrdiff_t scale_s, const int32_t *zp, ptrdiff_t zp_s,
                               void *out, int out_type);
/* y = float32(float32(x - zp) * scale); x uint8, int8 or int32. stream: the whole output is
 * far larger than the caches, so it may be written with non-temporal stores (no read for
 * ownership of lines that are only overwritten); the values are the same either way. */
typedef void (*ql_dequantize_fn)(const void *x, int x_type, ptrdiff_t n, const float *scale,
                                 ptrdiff_t scale_s, const int32_t *zp, ptrdiff_t zp_s, float *out,
                                 int stream);

/* Depthwise convolution row kernel: acc[i] (+)= sum over pairs q of
 * w[2q]*rows[2q][i] + w[2q+1]*rows[2q+1][i] for i < 16*nblocks (wrap32), rows centered int16,
 * weights centered int16. */
typedef void (*ql_dw_rows_fn)(const int16_t *const *rows, const int16_t *w, int npairs,
                              int32_t *acc, int nblocks, int accumulate);

/* Requantization of one block of 16 channels, fused into the channels-last depthwise kernel:
 * y[c] = sat(rne(float32(wrap32(acc[c] + bias[c])) * mult[c]) + zp), the contract's arithmetic
 * (epilogue.c's, clamped to [lo, hi] = [qmin - zp, qmax - zp] before rounding). Channels
 * beyond the block's end have bias 0 and mult 0 (their outputs are computed and dropped). */
typedef struct ql_dw_q {
    int32_t bias[16];
    float mult[16];
    float lo, hi;
    int32_t zp;
    int is_signed;                 /* int8 output (else uint8) */
} ql_dw_q;

/* Depthwise channels-last kernel (small 2-D planes, blocks of 16 channels): for output row
 * r < rows and column o < ow, acc[r][o][c] = sum over taps t < 2*npairs of
 * wt[t][c] * X[(r*row_step + o*step + toff[t])*16 + c] (wrap32), X centered int16 positions of
 * 16 channels, wt centered int16 (a padding tap has weight 0 and any valid toff). q NULL: out
 * is int32 acc [rows*ow][16]; else out is the requantized bytes [rows*ow][16] (int8 or uint8,
 * q->is_signed). */
typedef void (*ql_dw_cl_fn)(const int16_t *X, const ptrdiff_t *toff, const int16_t *wt, int npairs,
                            ptrdiff_t step, ptrdiff_t row_step, int rows, int ow, const ql_dw_q *q,
                            void *out);

/* ---------------------------------------------------------------------------------------
 * One ISA level: its kernels (the table lives in dispatch.c)
 * ------------------------------------------------------------------------------------- */
typedef struct ql_isa {
    const char *name;                  /* "avx512vnni", "avxvnni", "avx2", "scalar" */
    const ql_gemm_kernel *exact;       /* always exact for 8-bit operands */
    const ql_gemm_kernel *fast;        /* U8S8 kernel needing a proof (|R'| <= 64), or NULL */
    int exact_is_u8s8;                 /* VNNI levels: exact kernel is the byte form */
    ql_epilogue_fn epilogue;
    ql_quantize_fn quantize;
    ql_dequantize_fn dequantize;
    /* convolutions */
    const ql_gemm_kernel *conv_fast;   /* QL_FORM_S8U8 kernel (centered int8 weights as L,
                                          within its s8_bound), or NULL */
    ql_dw_rows_fn dw_rows;             /* depthwise row kernel */
    ql_dw_cl_fn dw_cl;                 /* depthwise channels-last kernel */
    /* 1x1 convolutions (taps 1) with at least exact_1x1_min_m output channels (M) and
     * exact_1x1_min_k input channels per group (K) take the exact GEMM even where conv_fast
     * would serve them (0: never). amx: 96 and 32. Its exact GEMM on AMX tiles (after an im2col
     * that is a re-layout for 1x1) outran avx512vnni's implicit kernel on such layers; on fewer
     * output channels the re-layout, paid per input byte, is spread over too few rows, on
     * fewer input channels K's padding to 64 wastes the tiles, and kernels larger than 1x1
     * pay a real im2col copy (measured per layer: docs/engine.md, "AMX"). Not where the fast
     * kernel takes the layer on tiles itself (amx-s8u8, input channels a multiple of its 64-
     * channel chunk: conv/plan.h's conv_kernel), which outran the exact GEMM on every such ResNet-50
     * and MobileNetV2 1x1 layer measured (docs/engine.md) */
    int exact_1x1_min_m, exact_1x1_min_k;
    /* The channels-last depthwise path's helpers on levels whose dw_cl is AVX2's (NULL:
     * conv/depthwise_cl.c's SSE2 ones): the fill's 16 x 16 transpose (depthwise_cl.c's
     * transpose16_i16 gives the contract) and the store of 32 positions at a time (its
     * dwcl_store_q, cols >= 32). Same values either way. */
    void (*dw_t16)(const uint8_t *src, ptrdiff_t cs, uint8_t flip, int32_t zsub, int16_t *dst, const ptrdiff_t *doff);
    void (*dw_store32)(const uint8_t *Q, int nch, int cols, uint8_t *y, ptrdiff_t P);
} ql_isa;

/* dispatch.c */
int ql_isa_count(void);                       /* levels compiled in and runnable, best first */
const ql_isa *ql_isa_get(int i);
const ql_isa *ql_isa_by_name(const char *name);  /* NULL when not runnable here */
const char *ql_isa_compiled_names(void);     /* comma list of levels compiled in */
const char *ql_cpu_flags(void);               /* detected features, for engine_info */
/* tests: ql_amx_foreign_tiles(load) where the amx level runs, else -1 */
int ql_foreign_tiles(int load);

/* elementwise/quantize.c: QuantizeLinear (quant 1: out_type's bytes) or DequantizeLinear (quant 0:
 * float32) of x seen as C-contiguous (pre, C, post), scale and zp per C (per_axis) or one pair, on
 * the pool's threads; and DynamicQuantizeLinear's usual case (1, or 0 when it declines) */
void ql_quantize_tensor(const ql_isa *isa, int quant, const void *x, int x_type, void *out, int out_type,
                        ptrdiff_t pre, ptrdiff_t C, ptrdiff_t post, int per_axis, const float *scale,
                        const int32_t *zp);
int ql_dynamic_quantize(const ql_isa *isa, const float *x, ptrdiff_t n, uint8_t *out, float *scale_out,
                        int32_t *zp_out);

/* threads.c: persistent pool; the caller participates; tasks claimed with an atomic counter */
typedef void (*ql_task_fn)(void *ctx, ptrdiff_t task, int thread);
/* thread indices passed to fn are < max(1, max_threads) */
void ql_parallel_for(ptrdiff_t n_tasks, int max_threads, ql_task_fn fn, void *ctx);
int ql_num_threads(void);
int ql_set_num_threads(int n);                /* returns 0, or -1 (bad n / cannot start) */
/* diag.c: the pool's counters (diag.c says what each counts; relaxed atomics, one add per job
 * or per sleep) */
extern long long ql_pool_counts[6];
static inline void ql_pool_count(int which) { __atomic_add_fetch(&ql_pool_counts[which], 1, __ATOMIC_RELAXED); }
/* tasks the pool's workers (not the callers) ran, and the tests' late workers (threads.c) */
extern long long ql_pool_worker_tasks;
static inline void ql_pool_worker_tasks_add(ptrdiff_t n) { if (n) __atomic_add_fetch(&ql_pool_worker_tasks, (long long)n, __ATOMIC_RELAXED); }
void ql_pool_set_late_us(long us);
/* tests: the workers' thread ids (up to n; returns how many) */
int ql_pool_worker_tids(int *tids, int n);
/* pool_check.c (tests): `repeat` jobs of n counting tasks (each spinning busy_us; on a worker,
 * sleeping worker_sleep_us; each calling a nested job of `nested` tasks); returns how many
 * tasks ran other than once per job, jobs that returned before their tasks were done and
 * thread indices out of range (0: all well), the largest thread index in *max_thread */
long ql_pool_check(ptrdiff_t n, int max_threads, int repeat, ptrdiff_t nested, long busy_us, long worker_sleep_us,
                   int *max_thread);

/* threads.c: scratch memory kept between calls. One block per cache, grown to the largest size
 * asked for up to the cache's limit, taken by one call at a time: a concurrent call (another
 * Python thread) or a larger request gets a malloc'd block of its own. Why: blocks of a few
 * hundred KiB to a few MiB freed after every call go back to the OS and come back as page
 * faults on the next call, which cost small layers more than their arithmetic. Only memory
 * is reused, never contents. Under AddressSanitizer every call gets a fresh block of exactly
 * its size, so a read past what it asked for is reported, not hidden in a larger kept block. */
typedef struct ql_scratch_cache ql_scratch_cache;
extern ql_scratch_cache ql_conv_scratch;     /* depthwise scratch, implicit GEMM's padded copy */
extern ql_scratch_cache ql_plain_scratch;    /* a plain call's packed weights and parameters */
char *ql_scratch_get(ql_scratch_cache *c, size_t n, int *cached);   /* NULL: out of memory */
void ql_scratch_put(ql_scratch_cache *c, char *s, int cached);
/* ql_conv_scratch's blocks with 64 bytes of slack past n (the convolution files' scratch) */
char *ql_conv_scratch_get(size_t n, int *cached);
void ql_conv_scratch_put(char *s, int cached);

/* ---------------------------------------------------------------------------------------
 * Packers (portable, form-driven; kernels_scalar.c)
 * ------------------------------------------------------------------------------------- */
/* Pack `rows` rows of L (element (r,k) at src + r*rs + k*ks, in elements of `type` u8/i8) into
 * dst (row r at dst + r*ldl_bytes, kp elements). I16: value - zp[r*zp_s], padding 0.
 * U8S8: u8 form (int8 ^ 0x80), padding 0; rowsums[r] = sum of the packed bytes (if non-NULL). */
void ql_pack_L(const void *src, int type, ptrdiff_t rs, ptrdiff_t ks, int rows, int K,
               const int32_t *zp, ptrdiff_t zp_s, int form, void *dst, ptrdiff_t ldl_bytes,
               int kp, int32_t *rowsums);
/* Pack up to nr columns (ncols) of R (element (k,c) at src + k*ks + c*cs) into one panel of
 * the form: I16 [kp/2][nr][2] centered int16 (value - zp[c*zp_s]), U8S8 [kp/4][nr][4] s8 form
 * (uint8 ^ 0x80); padding rows/columns are 0. colsums[c] = sum of the packed s8 values (U8S8,
 * if non-NULL; zero for padding columns). */
void ql_pack_R_panel(const void *src, int type, ptrdiff_t ks, ptrdiff_t cs, int K, int ncols,
                     const int32_t *zp, ptrdiff_t zp_s, int form, int nr, void *dst, int kp,
                     int32_t *colsums);
size_t ql_panel_bytes(const ql_gemm_kernel *k, int kp);   /* one packed R panel */
#if QL_X86
/* AVX2 packers (kernels_avx2.c), shared by every x86 level (each of them implies AVX2) */
void ql_pack_L_avx2(const void *src, int type, ptrdiff_t rs, ptrdiff_t ks, int rows, int K,
                    const int32_t *zp, ptrdiff_t zp_s, int form, void *dst, ptrdiff_t ldl_bytes,
                    int kp, int32_t *rowsums);
void ql_pack_R_panel_avx2(const void *src, int type, ptrdiff_t ks, ptrdiff_t cs, int K, int ncols,
                          const int32_t *zp, ptrdiff_t zp_s, int form, int nr, void *dst, int kp,
                          int32_t *colsums);
/* the VNNI levels' U8S8 panel packer (kernels_avx512vnni.c: avx512vnni-u8s8, amx-u8s8) */
void ql_pack_R_panel_vnni(const void *src, int type, ptrdiff_t ks, ptrdiff_t cs, int K, int ncols,
                          const int32_t *zp, ptrdiff_t zp_s, int form, int nr, void *dst, int kp,
                          int32_t *colsums);
/* depthwise row kernels (conv_avx2.c; portable one in kernels_scalar.c) */
void ql_dw_rows_avx2(const int16_t *const *rows, const int16_t *w, int npairs, int32_t *acc,
                     int nblocks, int accumulate);
void ql_dw_cl_avx2(const int16_t *X, const ptrdiff_t *toff, const int16_t *wt, int npairs, ptrdiff_t step,
                   ptrdiff_t row_step, int rows, int ow, const ql_dw_q *q, void *out);
/* conv_avx2.c: the grouped-order weight packers at 9 taps (ql_gemm_kernel.grouped_*_t9) */
void ql_grouped_i16_t9_avx2(const uint8_t *s, int is_signed, int64_t pairs, int32_t z, int16_t *d);
void ql_grouped_b_t9_avx2(const uint8_t *s, int64_t blocks, uint8_t fx, uint8_t sub, uint8_t *d);
int64_t ql_s8u8_row_bulk_avx2(const uint8_t *s, int64_t n, uint8_t flip, uint8_t lo, uint8_t hi, uint8_t zu,
                              int8_t *d, uint32_t *usum, int *bad);
int ql_interleave4_bulk_avx2(const uint8_t *const *src, uint8_t flip, uint8_t *dk, int nr);
void ql_ig_s2x4_avx2(const uint8_t *raw, ptrdiff_t rs, uint8_t flip, uint8_t *d0, uint8_t *d1, int64_t len);
/* conv_avx2.c: the channels-last depthwise fill's 16 x 16 transpose and store of 32 positions
 * (ql_isa.dw_t16, dw_store32) */
void ql_dw_t16_avx2(const uint8_t *src, ptrdiff_t cs, uint8_t flip, int32_t zsub, int16_t *dst, const ptrdiff_t *doff);
void ql_dw_store_avx2(const uint8_t *Q, int nch, int cols, uint8_t *y, ptrdiff_t P);
/* every AVX2-and-up byte-form kernel's conv packers (a designated-initializer list) */
#define QL_BYTE_PACKERS_AVX2                                                                    \
    .grouped_b_t9 = ql_grouped_b_t9_avx2, .s8u8_row_bulk = ql_s8u8_row_bulk_avx2,               \
    .interleave4_bulk = ql_interleave4_bulk_avx2, .ig_s2x4 = ql_ig_s2x4_avx2
/* conv_avx512.c: the AVX-512 levels' (AVX-512 BW; the grouped order with AVX512-VBMI) */
int64_t ql_s8u8_row_bulk_avx512(const uint8_t *s, int64_t n, uint8_t flip, uint8_t lo, uint8_t hi, uint8_t zu,
                                int8_t *d, uint32_t *usum, int *bad);
void ql_grouped_b_t9_vbmi(const uint8_t *s, int64_t blocks, uint8_t fx, uint8_t sub, uint8_t *d);
/* dispatch.c: ql_grouped_b_t9_vbmi where the CPU has AVX512-VBMI, else ql_grouped_b_t9_avx2 */
void ql_grouped_b_t9_zmm(const uint8_t *s, int64_t blocks, uint8_t fx, uint8_t sub, uint8_t *d);
/* every AVX-512 byte-form kernel's conv packers */
#define QL_BYTE_PACKERS_AVX512                                                                  \
    .grouped_b_t9 = ql_grouped_b_t9_zmm, .s8u8_row_bulk = ql_s8u8_row_bulk_avx512,              \
    .interleave4_bulk = ql_interleave4_bulk_avx2, .ig_s2x4 = ql_ig_s2x4_avx2
#endif
void ql_dw_cl_scalar(const int16_t *X, const ptrdiff_t *toff, const int16_t *wt, int npairs, ptrdiff_t step,
                   ptrdiff_t row_step, int rows, int ow, const ql_dw_q *q, void *out);
void ql_dw_rows_scalar(const int16_t *const *rows, const int16_t *w, int npairs, int32_t *acc,
                       int nblocks, int accumulate);
int ql_round_k(const ql_gemm_kernel *k, int K);            /* kp: K rounded up to kalign (or kpack) */

/* ---------------------------------------------------------------------------------------
 * The GEMM driver (gemm.c): C (M x N) = L (M x K) . R (K x N), epilogue fused per tile
 * ------------------------------------------------------------------------------------- */
/* Per-call R panel packer (conv im2col, plain matmul): pack columns [j0, j0+ncols) (ncols <=
 * nr) as one panel into dst, U8S8 colsums into colsums[0..nr). `thread` indexes scratch. */
typedef void (*ql_pack_R_fn)(void *ctx, int j0, int ncols, void *dst, int32_t *colsums,
                             int thread);

typedef struct ql_gemm_problem {
    const ql_gemm_kernel *kern;
    int M, N, K, kp;
    const void *L; ptrdiff_t ldl_bytes;         /* packed L rows */
    /* R: prepacked panels (panel p at Rpacked + p*ql_panel_bytes, colsums[N rounded to nr])
     * or a packer called per panel (Rpacked NULL) */
    const void *Rpacked; const int32_t *R_colsums;
    ql_pack_R_fn pack_R; void *pack_ctx;
    /* optional (with Rpacked only): L packed per row block inside the task that uses it (L
     * NULL), so a block is packed once and stays in L2: pack_L(ctx, i0, rows, dst, thread)
     * writes rows i0.. with dst = row i0, row stride ldl_bytes. Each task packs its
     * rows (a row block split by columns packs them once per column block). */
    void (*pack_L)(void *ctx, int i0, int rows, void *dst, int thread); void *pack_L_ctx;
    ql_epilogue ep;
    ql_epilogue_fn epilogue;
    int allow_fused;                            /* 1: the kernel's kernel_ep may replace kernel +
                                                   `epilogue` (which must be the level's own) */
    int threads;                                /* max threads for this call (<= pool size) */
    int pack_R_pairs;                           /* 1: pack_R also takes ncols = 2 * nr (two
                                                   whole panels, as ql_gemm_kernel.pack_R_pairs) */
    /* optional: the caller's memory for the per-thread scratch (64-byte aligned), used when
     * it holds what this call needs, else ql_gemm allocates its own (the matmul driver hands
     * each batch entry's single-thread GEMM its slot: no malloc / free per entry) */
    void *scratch; size_t scratch_bytes;
} ql_gemm_problem;

/* Tiles that ran a narrow tail kernel so far, [0] implicit-GEMM tiles (conv/implicit_run.c), [1] packed
 * panels (gemm.c), [2] implicit-GEMM tiles on the dot kernel (conv/implicit_run.c): a diagnostic the tests read to prove their cases reached the tails
 * (relaxed atomics; one add per tail tile or panel, not per micro-kernel call). */
extern long long ql_tail_calls[3];
static inline void ql_tail_count(int which) { __atomic_add_fetch(&ql_tail_calls[which], 1, __ATOMIC_RELAXED); }
/* GEMMs (ql_gemm calls) that ran their tiles on the kernel's kernel_ep (the fused epilogue) so
 * far: a diagnostic the tests read to prove the fused path ran on each level (one relaxed add
 * per ql_gemm call) */
extern long long ql_gemm_fused_calls;
/* MatMulInteger outputs (int32, all batch entries) of at least this many bytes are written
 * with non-temporal stores (ql_epilogue.stream; gemm.c says why 32 MiB); tests lower it to
 * reach the path with small products. ql_gemm_stream_tasks counts GEMM tasks that ran with it
 * (one relaxed add per task): the tests' proof that the path ran. */
extern long long ql_gemm_stream_bytes;
extern long long ql_gemm_stream_tasks;
/* Panel pairs packed by per-call packers (pack_R_pairs) so far: the tests' proof that the
 * paired packing ran (one relaxed add per pair) */
extern long long ql_gemm_pair_packs;

/* Runs the problem (threads from the pool). Returns 0, or -1 when scratch cannot be allocated. */
int ql_gemm(const ql_gemm_problem *p);

#define QL_MAX_MR 32   /* amx-u8s8: 2 x 16-row tiles */
#define QL_MAX_NR 64

/* ---------------------------------------------------------------------------------------
 * MatMulInteger / QLinearMatMul (gemm.c): batches of a (packed per call) times packed b
 * ------------------------------------------------------------------------------------- */
/* Pack b (Bb entries, element (e,k,n) at b + e*bs + k*ks + n*cs) for kernel kern:
 * packed + e*ql_packed_b_bytes: ceil(N/nr) panels; colsums + e*Npad (Npad = N rounded up to nr,
 * U8S8 only; may be NULL for I16); zcol + e*N = zR' (the zero point in the form's terms:
 * zR - 128 for uint8 b in U8S8, zR otherwise). zp element (e, n) at zp[e*zp_bs + n*zp_cs]. */
size_t ql_packed_b_bytes(const ql_gemm_kernel *kern, int K, int N);
void ql_pack_b(const ql_gemm_kernel *kern, const void *b, int b_type, ptrdiff_t Bb, int K, int N,
               ptrdiff_t bs, ptrdiff_t ks, ptrdiff_t cs, const int32_t *zp, ptrdiff_t zp_bs,
               ptrdiff_t zp_cs, void *packed, int32_t *colsums, int32_t *zcol, int threads);

typedef struct ql_matmul {
    const ql_isa *isa;
    const ql_gemm_kernel *kern;
    int M, N, K;
    ptrdiff_t batches;                 /* output batch entries */
    const void *a; int a_type;         /* C-contiguous (Ba, M, K) */
    const int64_t *a_idx;              /* a entry of each output batch entry */
    const int32_t *zpa; ptrdiff_t zpa_bs, zpa_rs;   /* zL of (batch, row) */
    const void *bpack; const int32_t *bcolsums; const int32_t *bzcol;  /* from ql_pack_b */
    /* or (bpack NULL) b as given, a plain call's: entry e element (k, n) at
     * braw + e*b_bs + k*b_ks + n, zero point (e, n) at bzp[e*bzp_bs + n*bzp_cs]. Its panels are
     * then packed inside the GEMM tasks, each by the thread that uses it, into that thread's
     * cache-resident scratch (no packed copy of b is written and read back); ql_matmul_run
     * packs it whole first where that is cheaper (a tall a, b entries reused across batches). */
    const void *braw; int b_type; ptrdiff_t b_bs, b_ks; const int32_t *bzp; ptrdiff_t bzp_bs, bzp_cs;
    ptrdiff_t Bb;                      /* b entries (raw b) */
    const int64_t *b_idx;              /* b entry of each output batch entry */
    void *out;                         /* C-contiguous (batches, M, N), int32 or 8-bit */
    int quantized, out_is_signed;
    const float *mult; ptrdiff_t m_bs, m_rs, m_cs;
    float lo, hi; int32_t yzp;
    int threads;
} ql_matmul;
int ql_matmul_run(const ql_matmul *mm);  /* 0, or -1 when scratch cannot be allocated */

/* Whether every byte of the contiguous n-byte buffer, in the u8 form (uint8 as is, int8 ^ 0x80),
 * lies in [lo, hi]: the 7-bit proofs of plain calls (b in [-64, 64] as s8: [64, 192] as u8),
 * one pass, stopping at the first block outside, on up to `threads` threads. */
int ql_bytes_within(const void *x, int type, ptrdiff_t n, int lo, int hi, int threads);

/* epilogue.c: the portable reference epilogue */
void ql_epilogue_scalar(const ql_epilogue *ep, const int32_t *C, ptrdiff_t ldc,
                        const int32_t *colsum, int i0, int j0, int rows, int cols);
/* rne(v) for |v| < 2^31, under the default rounding mode (nearbyintf) */
int32_t ql_rne(float v);
/* float32(float32(xs * ws) / ys) in *m; 0 when a scale or the result is not finite or ys is 0 */
int ql_multiplier_f32(float xs, float ws, float ys, float *m);

/* per-ISA tables (each kernels_*.c defines its own; NULL-free only where compiled) */
extern const ql_isa ql_isa_scalar;
#if QL_X86
extern const ql_isa ql_isa_avx2;
extern const ql_isa ql_isa_avxvnni;
extern const ql_isa ql_isa_avx512vnni;
const ql_isa *ql_isa_amx(void);   /* avx512vnni's table with the AMX GEMM kernel */
/* avx512vnni-s8u8's implicit epilogue (ql_ikernel_ep_fn's) on a stored tile: C rows (rows <=
 * QL_MAX_MR) x QL_IK_NR int32, row stride ldc (kernels_avx512vnni.c) */
void ql_ik_epilogue_avx512(const int32_t *C, ptrdiff_t ldc, const ql_epilogue *ep, const ql_ik_runs *rn,
                           int i0, int rows);
int ql_amx_foreign_tiles(int load);  /* tests: another library's tile shapes on this thread */
#endif

#endif
