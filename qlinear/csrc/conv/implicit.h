/* The implicit GEMM's shared state (implicit_plan.c builds it, implicit_run.c's tasks run on
 * it). */
#ifndef QLINEAR_CONV_IMPLICIT_H
#define QLINEAR_CONV_IMPLICIT_H

#include "plan.h"

/* ---------------------------------------------------------------------------------------
 * Implicit GEMM (convolutions of every rank, levels whose kernel has an ikernel)
 *
 * Instead of packing an im2col panel per tile of 16 pixels (K x 16 values written for every
 * tile: 9x the input for a 3x3 kernel), the input of one (image, group) is copied ONCE into
 * the kernel's operand form, padded, with the k-interleave built in: channel blocks of kpack
 * channels (I16: 2 channels as centered int16, S8U8: 4 channels as u8-form bytes), each a set
 * of phase planes of Hph x Wph positions of 4 bytes (kpack values). Phase plane (fh, fw)
 * holds padded positions (fh + sh*i, fw + sw*j), so that the output pixel (oh, ow) and tap
 * (kh, kw) read position (oh + kh*dh / sh, ow + kw*dw / sw) of phase ((kh*dh) % sh,
 * (kw*dw) % sw): unit stride along the output row for every stride and dilation; only the
 * phases some tap reads are built (a 1x1 stride-2 convolution builds one).
 * Output pixels are numbered q = oh*Wph + ow over the phase plane's width; a tile is 16
 * consecutive q, so tap t of channel block b reads the 64 contiguous bytes at position
 * q0 + off(b, t): the kernel's operand for k-group G = b*taps + t (the grouped weight order)
 * with no packing at all. Columns with ow >= OW (the Wph - OW positions at the end of each
 * row, and the tail of the last tile) are computed on whatever the copy holds there and
 * dropped: the epilogue stores only the runs of real pixels.
 * Every rank is this 2-D picture: the last axis makes the rows (w above), and the outer axes
 * (none for 1-D, h for 2-D, d and h for 3-D, ...) are flattened into the planes' rows, each
 * axis with its own phases (a plane per used tuple of outer phases) and a tap's row offset
 * the sum of its per-axis offsets times the phase grid's row strides. From 3-D on the rows
 * between two outer slices (oh >= OH in d's slice) are dropped rows, skipped like dropped
 * columns (ig_runs): a 3x3x3 kernel with pads of 1 on 8x28x28 computes 14% extra columns
 * against the 7% of a 28x28 plane, and no im2col panel is written.
 * Padding holds x's zero point in the form: 0 centered (I16), zx' (S8U8, cancelled by the
 * per-row correction - zx' * sum(w - zw), as in the im2col path). A 1x1 kernel with Cg not a
 * multiple of kpack pads the last block's missing channels the same way; their weights are
 * the packed rows' zero padding, so they add nothing.
 * ------------------------------------------------------------------------------------- */

#define IG_MAX_STRIDE 4                 /* phases per axis: bounded tables */
#define IG_MAX_OPH 16                   /* used phase tuples of the outer axes (2-D: at most 4) */
#define IG_COPY_MAX ((size_t)64 << 20)  /* bytes of one padded copy, whatever the workspace */
#define IG_PW_COPY_MAX ((size_t)512 << 10)  /* ... for a pointwise kernel: Zen 3's L2 */
#define IG_PW_COPY_MAX_S8U8 ((size_t)1 << 20) /* ... on the 7-bit path (see ig_run) */
#ifndef IG_KC_BYTES
#define IG_KC_BYTES 65536               /* a tile's operand per K block (measured: 8-64 KiB alike) */
#endif
/* Reductions of more k-groups than this are cut into K blocks. Below it the whole K runs at
 * once, which lets the epilogue run from the accumulators (ikernel_ep): measured on
 * ResNet-50's 512-channel 3x3 layers (2304 exact k-groups, 144 KiB of a tile's operand),
 * 3-8% faster unblocked than in blocks of 64 KiB (1 thread, best of 40, interleaved builds). */
#ifndef IG_KBLOCK_GROUPS
#define IG_KBLOCK_GROUPS 3072
#endif

typedef struct ig_ctx {
    const ql_conv_plan *p;
    const ql_gemm_kernel *kern;
    ql_epilogue_fn epilogue;
    int kpk, groups, mr;
    int64_t taps, Cg;
    /* Rows and columns: the last axis is the row (W, OW, sw, pw); the outer axes (nout of
     * them, none for 1-D) are flattened into rows of a phase plane, Rph of them, their phase
     * extents oext[] (row strides rst[]). Ro: the rows the outputs span ((out - 1) . rst + 1;
     * 1-D 1, 2-D OH): a row r < Ro is real when each of its outer coordinates is below out[],
     * always so for 1-D and 2-D. */
    int64_t W, OW, sw, pw, plane, P;       /* plane, P: input and output positions per channel */
    int nout;
    int64_t oin[QL_CONV_MAXD], oout[QL_CONV_MAXD], os[QL_CONV_MAXD], opad[QL_CONV_MAXD];
    int64_t oext[QL_CONV_MAXD], rst[QL_CONV_MAXD];
    int64_t Rph, Ro, Wph, PL, BS;          /* phase plane rows, columns; positions per plane, per block */
    int64_t Wr;                            /* Wph rounded up to 16: positions interleaved per row */
    int64_t bulk0, bulk1;                  /* rows copied as one run (ig_copy_task), or none */
    int dense;                             /* every row below Ro is real (1-D, 2-D: always) */
    int64_t RW;                            /* bytes of a padded raw row (ig_copy_task) */
    int nblk;                              /* channel blocks */
    int nfo, nfw;                          /* used phases: outer tuples, columns (shifted planes: nfw = kw) */
    int shift;                             /* shifted planes (ig_copy_shift_task) */
    int64_t sdw;                           /* shifted planes: column dilation */
    int64_t s1len;                         /* shifted planes, sw 1: positions of the block's row
                                            * interleaved once (ig_copy_shift_task) */
    int64_t s2len;                         /* shifted planes, sw 2: positions of each column phase
                                            * split at once (ig_copy_shift_task) */
    int64_t fo[IG_MAX_OPH][QL_CONV_MAXD];  /* outer phase tuple a: the phase of each outer axis */
    int64_t fw[IG_MAX_STRIDE];
    int64_t Q, ntiles;                     /* flat outputs q < Q; tiles of 16 */
    int64_t tstride;                       /* q between tiles' starts: 16, or r output rows */
    char *copy;                            /* nblk * BS positions + slack, 4 bytes each */
    ptrdiff_t *off;                        /* groups byte offsets */
    const uint8_t *xg;                     /* image n, group g: first channel */
    uint8_t flip;                          /* S8U8: raw byte ^ flip = u8 form */
    /* GEMM tasks */
    const char *L; ptrdiff_t ldl;
    ql_epilogue ep;
    int Mg, mc, row_blocks;                /* mc: the most rows of a row block */
    int mgroups;                           /* row tiles: ceil(Mg / mr), shared out evenly */
    int64_t tile_blocks;                   /* ntiles shared out evenly */
    char *scratch, *scratch_mem; size_t scratch_bytes;   /* per thread (line_up(scratch_mem)): raw and phase rows */
    int kgroups;                           /* k-groups per K block */
    int fused;                             /* ikernel_ep stores the tiles */
    char *cblock, *cblock_mem; size_t cblock_bytes;   /* per thread (line_up(cblock_mem)): mc x 16 int32 partial sums */
    char *xt; size_t xt_bytes; ptrdiff_t xs;   /* the dot tail's gathered columns (shared) */
    int ep_ok;                             /* the epilogue is one ikernel_ep / dot_ep support */
    /* images merged into one GEMM (ig_run): image j of the chunk has its copy at copy + j *
     * cstride, its input at xg + j * xstride, its dot columns at xt + j * xt_bytes and its
     * output at ep.out + j * ostride; the GEMM tasks run over (image, tile) pairs */
    int64_t nimg;
    size_t cstride, xstride, ostride;
    int64_t wlast;                         /* the last tile's columns (the dot tail's width) */
    ptrdiff_t cpt;                         /* copy blocks per task (ig_copy_chunk_task) */
    int fuse_copy;                         /* each GEMM task copies its own tiles' columns first
                                            * (ig_fused_copy; ig_execute says when) */
    /* merged tail panels (ig_run: a batch whose last tiles are narrow): panel u holds the last
     * tiles of images u * tpm.. side by side, wlast columns each, groups x 64 bytes (k-group g
     * at offp[g] = 64 g, the layout the tile kernels read), in ring slot u % nbuf of tp; img_pix:
     * output elements between images (image k of a panel: its runs' pixels offset k * img_pix).
     * Per chunk (first image n0): panels [u_run0, u_run1) run; nleft images from left_j0 run
     * their last tile with the dot kernel (a last partial panel of fewer than QL_DOT_NR
     * columns), from xt; out0: the output of image 0 */
    int64_t tpm, nbuf, n0, u_run0, u_run1, nleft, left_j0;
    char *tp; size_t tp_bytes;
    ptrdiff_t *offp;
    ptrdiff_t img_pix;
    char *out0;
    /* images in parallel (ig_run): each chunk of nimg images (one) runs whole on one thread, its
     * copy in that thread's region copy + thread * pregion; nbatch: the images of the call */
    size_t pregion;
    int64_t nbatch;
    /* a plain call's weights packed inside the GEMM tasks (ql_conv_gemm_raw; I16 form, not the
     * images-in-parallel schedule): wr, wzp the group's raw rows and zero points; each task packs
     * its row block into its thread's scratch at wscr_off (at most mc rows) before its tiles */
    const uint8_t *wr, *wr0; const int32_t *wzp, *wzp0; int w_type, Kraw, wgrouped;
    size_t wscr_off;
    /* a plain call's S8U8 weights, packed by npack tasks (packw_task on wjob) in the same job as
     * the first copy tasks (ig_copy_pack_task): one job fewer, and the copy overlaps them */
    packw_ctx *wjob;
    ptrdiff_t npack;
    /* affine: the S8U8 form packed in the tasks, one task per row block, which also fills its
     * rows' per-row terms fb (fb_all + the group's first row: ig_group) from its row sums */
    int affine;
    int32_t *fb_all, *fb;
    const int32_t *bias_g;
    uint32_t zxu;
} ig_ctx;

/* the stride-2 copies' SIMD step in positions (implicit_run.c: ig_split_s2; ig_run rounds the
 * phase rows' lengths up to it) */
#define IG_S2_STEP(kpk) ((kpk) == 2 ? 8 : 16)

/* implicit_run.c: the tasks */
void ig_copy_task(void *vctx, ptrdiff_t b, int thread);
void ig_copy_shift_task(void *vctx, ptrdiff_t b, int thread);
void ig_copy_chunk_task(void *vctx, ptrdiff_t task, int thread);
void ig_copy_pack_task(void *vctx, ptrdiff_t task, int thread);
void ig_gather_task(void *vctx, ptrdiff_t j, int thread);
void ig_tail_task(void *vctx, ptrdiff_t task, int thread);
void ig_left_task(void *vctx, ptrdiff_t k, int thread);
void ig_gemm_task(void *vctx, ptrdiff_t task, int thread);
void ig_chunk_task(void *vctx, ptrdiff_t task, int thread);
/* implicit_plan.c: GEMM tasks of a chunk (ig_chunk_task plans its own) */
void ig_tile_blocks(ig_ctx *c, int run_threads);

#endif
