/* AMX-INT8 kernels (Intel Advanced Matrix Extensions: tile registers and tdpbusd): the U8S8
 * GEMM, exact for every operand, and the convolutions' S8U8 implicit GEMM (amx-s8u8, below)
 * for layers whose channels per group are a multiple of 64. Every other kernel of this level
 * (the other convolutions' implicit GEMM, depthwise, the epilogue, Quantize/Dequantize) is
 * AVX-512 VNNI's or AVX2's: a CPU with AMX-INT8 has both.
 *
 * Arithmetic: tdpbusd tC, tA, tB adds, for each C element, 4 products zext(a) * sext(b) of
 * one dword of A and one of B per k-group to the int32 accumulator, with wraparound (Intel
 * SDM: the products and the sum are 32-bit, no saturation), so the tile holds the wrap32
 * dot products the contract asks for; the U8S8 form (u8 rows, s8 panels, corrections in the
 * epilogue) is the same as the VNNI levels', and the epilogue is the level's own.
 *
 * Layout: the packed operands are the VNNI levels' U8S8 ones. A tile of L is 16 rows x 64
 * bytes (16 k-groups of 4) read at the row stride ldl; a tile of a 32-column panel
 * ([kp/4][32][4]) is 16 k-groups x 16 columns x 4 bytes, read at a 128-byte stride (columns
 * 0-15 at offset 0, 16-31 at offset 64): the panel's rows are the tile's rows, so panels
 * packed for avx512vnni-u8s8 serve as they are. K is padded to a multiple of 64
 * (ql_gemm_kernel.kalign; the packers zero the padding), so every tile step is a full one.
 *
 * Tile shape: 32 rows x 32 columns as 2 x 2 accumulator tiles (tmm0-3) from 2 L tiles (tmm4,
 * tmm5) and 2 panel tiles (tmm6, tmm7): per 64-byte k step, 4 tile loads for 4 tdpbusd (each
 * 16 x 16 x 64 multiply-adds), the fewest loads per product the 8 tile registers allow.
 *
 * Tile configuration: the shapes are per-thread state (ldtilecfg), and loading them costs
 * (measured: 1024^3 on one thread went from 675 to 813 GMAC/s when a task's calls stopped
 * reloading it). Each call needs 16-row tiles, or for a last row tile of fewer rows (rows <
 * 32) tiles of those rows, so no row past the block is ever read. Within a task (nothing
 * else runs on the thread then) the kernel reloads only on a change of shapes. Between tasks
 * the thread may run another library's AMX code: onnxruntime's MLAS runs on its caller's
 * thread too, keeps its shapes loaded across its calls and faults (#UD: tdpbusd on shapes it
 * did not load) if they changed. So each task begins by saving the thread's configuration
 * (sttilecfg) and ends by restoring it (ldtilecfg, or tilerelease when it was the initial
 * state), and assumes nothing about it in between (ql_gemm_kernel.task_begin / task_end).
 *
 * With -DQL_SIMDE (scripts/emulated_isa.sh) the tile instructions are emulated in C below
 * (the same arithmetic on a thread-local tile file), so the level runs on any AVX2 CPU.
 */
#include "qlinear.h"

#if QL_X86
#ifdef QL_SIMDE
#pragma GCC target("avx2")
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <immintrin.h>
#include <simde/x86/avx512.h>
#else
#pragma GCC target("avx2,avx512f,avx512bw,avx512dq,avx512vl,amx-tile,amx-int8")
#include <immintrin.h>
#endif
#include <string.h>

/* the 64-byte tile configuration (palette 1): bytes per row and rows of each tile */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((aligned(64))) amx_cfg;

#ifdef QL_SIMDE
/* ---- emulation: the instructions' semantics (Intel SDM), one thread-local tile file ---- */
static _Thread_local struct { int rows, colsb; uint8_t d[16][64]; } amx_t[8];

static _Thread_local amx_cfg amx_cur;   /* the configuration loaded (palette 0: none) */
static void amx_loadcfg(const amx_cfg *c) {
    amx_cur = *c;
    for (int t = 0; t < 8; t++) {
        amx_t[t].rows = c->palette ? c->rows[t] : 0;
        amx_t[t].colsb = c->palette ? c->colsb[t] : 0;
        memset(amx_t[t].d, 0, sizeof amx_t[t].d);   /* ldtilecfg zeroes the tiles */
    }
}
static void amx_storecfg(amx_cfg *c) { *c = amx_cur; }
static void amx_release(void) {
    amx_cfg none;
    memset(&none, 0, sizeof none);
    amx_loadcfg(&none);
}
static void amx_load(int t, const void *p, ptrdiff_t stride) {
    for (int r = 0; r < amx_t[t].rows; r++)
        memcpy(amx_t[t].d[r], (const char *)p + r * stride, (size_t)amx_t[t].colsb);
}
static void amx_store(int t, void *p, ptrdiff_t stride) {
    for (int r = 0; r < amx_t[t].rows; r++)
        memcpy((char *)p + r * stride, amx_t[t].d[r], (size_t)amx_t[t].colsb);
}
/* tdpbusd (a_signed 0): C[m][n] += sum over k-groups g, i < 4 of zext(A[m][4g+i]) *
 * sext(B[g][4n+i]); tdpbsud (a_signed 1): sext(A) * zext(B) */
static void amx_dp(int c, int a, int b, int a_signed) {
    for (int m = 0; m < amx_t[c].rows; m++)
        for (int n = 0; n < amx_t[c].colsb / 4; n++) {
            uint32_t acc;
            memcpy(&acc, &amx_t[c].d[m][4 * n], 4);
            for (int g = 0; g < amx_t[a].colsb / 4; g++)
                for (int i = 0; i < 4; i++) {
                    uint8_t x = amx_t[a].d[m][4 * g + i], y = amx_t[b].d[g][4 * n + i];
                    int32_t xa = a_signed ? (int32_t)(int8_t)x : (int32_t)x;
                    int32_t yb = a_signed ? (int32_t)y : (int32_t)(int8_t)y;
                    acc += (uint32_t)(xa * yb);
                }
            memcpy(&amx_t[c].d[m][4 * n], &acc, 4);
        }
}
#define AMX_LOADCFG(c) amx_loadcfg(c)
#define AMX_LOAD(t, p, s) amx_load(t, p, s)
#define AMX_STORE(t, p, s) amx_store(t, p, s)
#define AMX_DP(c, a, b) amx_dp(c, a, b, 0)
#define AMX_DPSU(c, a, b) amx_dp(c, a, b, 1)
#define AMX_ZERO(t) memset(amx_t[t].d, 0, sizeof amx_t[t].d)
#define AMX_STORECFG(c) amx_storecfg(c)
#define AMX_RELEASE() amx_release()
#else
/* The memory operands written out in full, not gcc 12's intrinsics: its _tile_loadconfig and
 * _tile_storeconfig declare an 8-byte operand for the 64-byte configuration (the compiler
 * then dropped the stores of a configuration's row counts as dead: ldtilecfg faulted on
 * what was left), and its _tile_loadd declares no memory read at all (stores of the
 * operand could legally move past it). ldtilecfg / sttilecfg name the whole structure;
 * tileloadd and tilestored clobber memory. */
#define AMX_LOADCFG(c) __asm__ volatile("ldtilecfg %0" ::"m"(*(const amx_cfg *)(c)))
#define AMX_STORECFG(c) __asm__ volatile("sttilecfg %0" : "=m"(*(amx_cfg *)(c)))
#define AMX_LOAD(t, p, s)                                                                       \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"((const void *)(p)), "r"((long)(s)) : "memory")
#define AMX_STORE(t, p, s)                                                                      \
    __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"((void *)(p)), "r"((long)(s)) : "memory")
#define AMX_DP(c, a, b) _tile_dpbusd(c, a, b)
#define AMX_DPSU(c, a, b) _tile_dpbsud(c, a, b)
#define AMX_ZERO(t) _tile_zero(t)
#define AMX_RELEASE() _tile_release()
#endif

#define AMX_MR 32
#define AMX_NR 32

/* tiles: 0 = C rows 0-15 x cols 0-15, 1 = rows 0-15 x cols 16-31, 2 and 3 = rows 16-31;
 * 4 = L rows 0-15, 5 = L rows 16-31; 6 = panel cols 0-15, 7 = panel cols 16-31 */
static void amx_config(amx_cfg *c, int r0, int r1) {
    memset(c, 0, sizeof *c);
    c->palette = 1;
    for (int t = 0; t < 8; t++) c->colsb[t] = 64;
    c->rows[0] = c->rows[1] = c->rows[4] = (uint8_t)r0;
    c->rows[2] = c->rows[3] = c->rows[5] = (uint8_t)r1;
    c->rows[6] = c->rows[7] = 16;
    if (r1 == 0) c->colsb[2] = c->colsb[3] = c->colsb[5] = 0;   /* unused tiles */
}

/* within a task: the tile shapes this thread loaded last (r0 * 32 + r1), -1: none yet */
static _Thread_local int amx_loaded = -1;
static _Thread_local amx_cfg amx_saved;   /* the thread's configuration before the task */

static void amx_task_begin(void) {
    AMX_STORECFG(&amx_saved);   /* all zero (palette 0) in the initial state */
    amx_loaded = -1;
}

static void amx_task_end(void) {
    if (amx_loaded < 0) return;   /* nothing loaded: the configuration is the saved one */
    if (amx_saved.palette)
        AMX_LOADCFG(&amx_saved);
    else
        AMX_RELEASE();
    amx_loaded = -1;
}

/* C (rows x 32 int32, row stride ldc) = L rows (rows <= 32, kp bytes each, stride ldl) times
 * the 32-column panel; kp is a multiple of 64 (kalign) */
/* the shapes for a tile of r0 + r1 rows (r0 <= 16), loaded unless they are already */
static inline void amx_shapes(int r0, int r1) {
    if (amx_loaded != r0 * 32 + r1) {
        amx_cfg cfg;
        amx_config(&cfg, r0, r1);
        AMX_LOADCFG(&cfg);
        amx_loaded = r0 * 32 + r1;
    }
}

static void amx_u8s8(const void *L, ptrdiff_t ldl, const void *Rpanel, int kp, int32_t *C,
                     ptrdiff_t ldc, int rows) {
    int r0 = rows < 16 ? rows : 16, r1 = rows - r0;
    amx_shapes(r0, r1);
    AMX_ZERO(0);
    AMX_ZERO(1);
    if (r1) {
        AMX_ZERO(2);
        AMX_ZERO(3);
    }
    const char *a = (const char *)L, *b = (const char *)Rpanel;
    const ptrdiff_t bs = 4 * AMX_NR;    /* bytes of one k-group row of the panel */
    if (r1) {
        for (int k = 0; k < kp; k += 64) {
            const char *bk = b + (ptrdiff_t)(k / 4) * bs;
            AMX_LOAD(4, a + k, ldl);
            AMX_LOAD(5, a + 16 * ldl + k, ldl);
            AMX_LOAD(6, bk, bs);
            AMX_LOAD(7, bk + 64, bs);
            AMX_DP(0, 4, 6);
            AMX_DP(1, 4, 7);
            AMX_DP(2, 5, 6);
            AMX_DP(3, 5, 7);
        }
    } else {
        for (int k = 0; k < kp; k += 64) {
            const char *bk = b + (ptrdiff_t)(k / 4) * bs;
            AMX_LOAD(4, a + k, ldl);
            AMX_LOAD(6, bk, bs);
            AMX_LOAD(7, bk + 64, bs);
            AMX_DP(0, 4, 6);
            AMX_DP(1, 4, 7);
        }
    }
    const ptrdiff_t cs = ldc * (ptrdiff_t)sizeof(int32_t);
    AMX_STORE(0, C, cs);
    AMX_STORE(1, C + 16, cs);
    if (r1) {
        AMX_STORE(2, C + 16 * ldc, cs);
        AMX_STORE(3, C + 16 * ldc + 16, cs);
    }
}

/* ---------------------------------------------------------------------------------------
 * kernel_ep: the tile through a 512-bit epilogue. The tile leaves the tile registers through
 * memory either way (tilestored); what kernel_ep saves is the epilogue's arithmetic, which at
 * K = 768 cost about as much as the tile's tdpbusd (the 256-bit epilogue multiplies both
 * U8S8 corrections per element with vpmulld). Here, per tile:
 *   acc[i][j] = C[i][j] + (bias[i] - zR'*row_a[i]) - row_z[i]*colsum[j]   (wrap32)
 * with the first correction one scalar per row when zR' is one value (per-tensor b zero
 * point), and the second one vector product per run of rows with the same row_z (all of them
 * for a per-tensor a zero point). wrap32 sums do not depend on their order, so these are the
 * bits of ql_epilogue_avx2's per-element form. The requantization is ql_requant8_avx2's
 * instructions on 16 lanes (vcvtdq2ps, one vmulps, vmaxps lo then vminps hi: lo for a NaN,
 * vcvtps2dq under the default rounding, vpaddd zp), then vpmovsdb / vpmovusdb, which cannot
 * saturate: the clamp leaves values of the output type (two rows of a whole tile: packs and
 * one vpermd, ql_ep32_row2). This is ql_ep32 (simd_common_avx512.h), which avx512vnni-u8s8
 * runs on its accumulators too. Cases it does not take (strided outputs, per-element
 * multipliers or zero points along a row) go to the level's epilogue.
 * ------------------------------------------------------------------------------------- */
#ifndef QL_SIMDE
#include "simd_common_avx512.h"

static void amx_epilogue(const ql_epilogue *ep, const int32_t *C, const int32_t *colsum, int i0, int j0,
                         int rows, int cols) {
    if (!ql_epilogue_rows_contiguous(ep)) {
        ql_isa_avx512vnni.epilogue(ep, C, AMX_NR, colsum, i0, j0, rows, cols);
        return;
    }
    ql_ep32 s;
    ql_ep32_init(&s, ep, colsum, j0, cols);
#define AMX_C(r, h) _mm512_loadu_si512((const void *)(C + (r) * AMX_NR + 16 * (h)))
#define AMX_EP_ROWS                                                                                \
    {                                                                                              \
        int r = 0;                                                                                 \
        for (; r + 1 < rows; r += 2)                                                               \
            ql_ep32_row2(&s, AMX_C(r, 0), AMX_C(r, 1), AMX_C(r + 1, 0), AMX_C(r + 1, 1), (ptrdiff_t)i0 + r, j0); \
        if (r < rows) ql_ep32_row(&s, AMX_C(r, 0), AMX_C(r, 1), (ptrdiff_t)i0 + r, j0);             \
    }
    if (!s.quantized) {
        for (int r = 0; r < rows; r++) ql_ep32_row(&s, AMX_C(r, 0), AMX_C(r, 1), (ptrdiff_t)i0 + r, j0);
        return;
    }
    if (ql_ep32_usual(&s)) {   /* the usual matmul epilogue, its fields constants */
        s.quantized = 1;
        AMX_EP_ROWS
        return;
    }
    AMX_EP_ROWS
#undef AMX_EP_ROWS
#undef AMX_C
}

#else
/* Debian's SIMDe lacks most of the 512-bit masked loads, stores and conversions above: the
 * emulated build (a check of the tile logic) hands the tile to the level's 256-bit epilogue,
 * which the 512-bit one reproduces bit for bit natively (tests on the amx level compare both
 * to the oracle). */
static void amx_epilogue(const ql_epilogue *ep, const int32_t *C, const int32_t *colsum, int i0, int j0,
                         int rows, int cols) {
    ql_isa_avx512vnni.epilogue(ep, C, AMX_NR, colsum, i0, j0, rows, cols);
}
#endif

static void amx_u8s8_ep(const void *L, ptrdiff_t ldl, const void *Rpanel, int kp, const ql_epilogue *ep,
                        const int32_t *colsum, int i0, int j0, int rows, int cols) {
    int32_t C[AMX_MR * AMX_NR] __attribute__((aligned(64)));
    amx_u8s8(L, ldl, Rpanel, kp, C, AMX_NR, rows);
    amx_epilogue(ep, C, colsum, i0, j0, rows, cols);
}

static const ql_gemm_kernel k_amx = {
    .name = "amx-u8s8", .mr = AMX_MR, .nr = AMX_NR, .kpack = 4, .kalign = 64, .form = QL_FORM_U8S8,
    .kernel = amx_u8s8, .kernel_ep = amx_u8s8_ep, .pack_L = ql_pack_L_avx2, .pack_R = ql_pack_R_panel_vnni,
    .conv = {QL_BYTE_PACKERS_AVX512}, .task_begin = amx_task_begin,
    .task_end = amx_task_end,
    .pack_R_pairs = 1,
};

/* ---------------------------------------------------------------------------------------
 * amx-s8u8: the convolutions' implicit GEMM (the convolutions' S8U8 form: centered int8 weights as L,
 * u8-form bytes of the padded copy as the operand), 32 rows x 16 columns.
 *
 * Arithmetic: tdpbsud adds 4 products sext(a) * zext(b) per k-group to each int32 element
 * with wraparound, no saturation (Intel SDM), so every int8 weight is safe (s8_bound 128), as
 * for avx512vnni-s8u8's vpdpbusd with the operands' roles swapped.
 *
 * Layout: a tile step is 16 k-groups. The weights come in conv/pack_w.c's chunked grouped order
 * (kchunk 16: qlinear.h), so a weight tile is 16 rows x 64 bytes of 64 channels at one tap,
 * read at the row stride ldl; the operand tile is those 16 channel blocks at that tap, 16
 * columns x 4 bytes each: one 64-byte row per block, the blocks equally far apart in the copy
 * (conv/implicit_plan.c's block stride; 64 bytes in a packed panel), so one tileloadd at stride off[g + 1]
 * - off[g] (conv/implicit_plan.c builds off[] in the chunked order: that difference is the same for the 16
 * k-groups of a step). groups is a multiple of 16: conv/plan.h's conv_kernel gives this kernel only layers whose
 * channels per group are a multiple of 64 (conv_kernel) and K blocks of whole chunks; the
 * others run on conv_fallback, avx512vnni-s8u8.
 *
 * Tiles (amx_config's, shared with amx-u8s8): 0 = C rows 0-15, 2 = C rows 16-31, 4 and 5 = the
 * weight tiles of those rows, 6 = the operand. Per step 3 tile loads for 2 tdpbsud: the
 * interface's tile is 16 columns (QL_IK_NR), so the operand tile is used by 2 weight tiles.
 * ------------------------------------------------------------------------------------- */
#define AMXC_MR 32

/* C (rows x 16 int32, row stride ldc) = L rows (rows <= 32) times the operand: k-group step g
 * at base + off[g] (stride off[g + 1] - off[g]), or with off NULL a packed panel's (base +
 * 64 g, stride 64) */
static void amx_s8u8_tile(const void *L, ptrdiff_t ldl, const char *base, const ptrdiff_t *off, int groups,
                          int32_t *C, ptrdiff_t ldc, int rows) {
    int r0 = rows < 16 ? rows : 16, r1 = rows - r0;
    amx_shapes(r0, r1);
    AMX_ZERO(0);
    const char *a = (const char *)L;
    if (r1) {
        AMX_ZERO(2);
        for (int g = 0; g < groups; g += 16) {
            const char *b = off ? base + off[g] : base + 64 * (ptrdiff_t)g;
            ptrdiff_t bs = off ? off[g + 1] - off[g] : 64;
            AMX_LOAD(6, b, bs);
            AMX_LOAD(4, a + 4 * (ptrdiff_t)g, ldl);
            AMX_LOAD(5, a + 16 * ldl + 4 * (ptrdiff_t)g, ldl);
            AMX_DPSU(0, 4, 6);
            AMX_DPSU(2, 5, 6);
        }
    } else {
        for (int g = 0; g < groups; g += 16) {
            const char *b = off ? base + off[g] : base + 64 * (ptrdiff_t)g;
            ptrdiff_t bs = off ? off[g + 1] - off[g] : 64;
            AMX_LOAD(6, b, bs);
            AMX_LOAD(4, a + 4 * (ptrdiff_t)g, ldl);
            AMX_DPSU(0, 4, 6);
        }
    }
    const ptrdiff_t cs = ldc * (ptrdiff_t)sizeof(int32_t);
    AMX_STORE(0, C, cs);
    if (r1) AMX_STORE(2, C + 16 * ldc, cs);
}

/* Two adjacent tiles (ikernel2_ep): C (rows x 32 int32, row stride ldc), the second tile's
 * operand 64 bytes after the first's: amx-u8s8's 2 x 2 accumulator tiles, 4 tile loads for 4
 * tdpbsud per step (the weight tiles used twice) */
static void amx_s8u8_tile2(const void *L, ptrdiff_t ldl, const char *base, const ptrdiff_t *off, int groups,
                           int32_t *C, ptrdiff_t ldc, int rows) {
    int r0 = rows < 16 ? rows : 16, r1 = rows - r0;
    amx_shapes(r0, r1);
    AMX_ZERO(0);
    AMX_ZERO(1);
    const char *a = (const char *)L;
    if (r1) {
        AMX_ZERO(2);
        AMX_ZERO(3);
        for (int g = 0; g < groups; g += 16) {
            const char *b = base + off[g];
            ptrdiff_t bs = off[g + 1] - off[g];
            AMX_LOAD(4, a + 4 * (ptrdiff_t)g, ldl);
            AMX_LOAD(6, b, bs);
            AMX_LOAD(7, b + 64, bs);
            AMX_LOAD(5, a + 16 * ldl + 4 * (ptrdiff_t)g, ldl);
            AMX_DPSU(0, 4, 6);
            AMX_DPSU(1, 4, 7);
            AMX_DPSU(2, 5, 6);
            AMX_DPSU(3, 5, 7);
        }
    } else {
        for (int g = 0; g < groups; g += 16) {
            const char *b = base + off[g];
            ptrdiff_t bs = off[g + 1] - off[g];
            AMX_LOAD(4, a + 4 * (ptrdiff_t)g, ldl);
            AMX_LOAD(6, b, bs);
            AMX_LOAD(7, b + 64, bs);
            AMX_DPSU(0, 4, 6);
            AMX_DPSU(1, 4, 7);
        }
    }
    const ptrdiff_t cs = ldc * (ptrdiff_t)sizeof(int32_t);
    AMX_STORE(0, C, cs);
    AMX_STORE(1, C + 16, cs);
    if (r1) {
        AMX_STORE(2, C + 16 * ldc, cs);
        AMX_STORE(3, C + 16 * ldc + 16, cs);
    }
}

static void amx_s8u8_ik2_ep(const void *L, ptrdiff_t ldl, const char *base, const ptrdiff_t *off, int groups,
                            const ql_epilogue *ep, const ql_ik_runs *rn, int i0, int rows) {
    int32_t C[AMXC_MR * 2 * QL_IK_NR] __attribute__((aligned(64)));
    amx_s8u8_tile2(L, ldl, base, off, groups, C, 2 * QL_IK_NR, rows);
    ql_ik_epilogue_avx512(C, 2 * QL_IK_NR, ep, &rn[0], i0, rows);
    ql_ik_epilogue_avx512(C + QL_IK_NR, 2 * QL_IK_NR, ep, &rn[1], i0, rows);
}

/* a packed 16-column panel (the im2col path: a geometry the implicit path declines) */
static void amx_s8u8(const void *L, ptrdiff_t ldl, const void *Rpanel, int kp, int32_t *C, ptrdiff_t ldc,
                     int rows) {
    amx_s8u8_tile(L, ldl, (const char *)Rpanel, NULL, kp / 4, C, ldc, rows);
}

static void amx_s8u8_ik(const void *L, ptrdiff_t ldl, const char *base, const ptrdiff_t *off, int groups,
                        int32_t *C, ptrdiff_t ldc, int rows) {
    amx_s8u8_tile(L, ldl, base, off, groups, C, ldc, rows);
}

/* the tile through avx512vnni-s8u8's implicit epilogue (the same bits as the level's) */
static void amx_s8u8_ik_ep(const void *L, ptrdiff_t ldl, const char *base, const ptrdiff_t *off, int groups,
                           const ql_epilogue *ep, const ql_ik_runs *rn, int i0, int rows) {
    int32_t C[AMXC_MR * QL_IK_NR] __attribute__((aligned(64)));
    amx_s8u8_tile(L, ldl, base, off, groups, C, QL_IK_NR, rows);
    ql_ik_epilogue_avx512(C, QL_IK_NR, ep, rn, i0, rows);
}

/* No dot kernels: a tile of 16 columns costs the tiles no more than one of a few columns, and
 * less than avx512vnni's dot products of those columns (so no row-aligned tiles either, and a
 * batch's narrow last tiles go into merged panels of full tiles). conv_fallback is set where
 * the level is built (ql_isa_amx): avx512vnni's table is not a constant expression here. */
static ql_gemm_kernel k_amx_s8u8 = {
    .name = "amx-s8u8", .mr = AMXC_MR, .nr = QL_IK_NR, .kpack = 4, .kalign = 64, .form = QL_FORM_S8U8,
    .kernel = amx_s8u8, .task_begin = amx_task_begin, .task_end = amx_task_end,
    .conv = {.ikernel = amx_s8u8_ik, .ikernel_ep = amx_s8u8_ik_ep, .ikernel2_ep = amx_s8u8_ik2_ep,
             .s8_bound = 128,   /* tdpbsud: any int8 weight (above) */
             QL_BYTE_PACKERS_AVX512, .kchunk = 16},
};

/* A test's stand-in for another library's AMX code on this thread (only where the level
 * runs): load = 1 loads a configuration of other shapes (every tile 1 row x 4 bytes) and
 * returns 1; load = 0 returns whether the thread's configuration is that one. */
int ql_amx_foreign_tiles(int load) {
    amx_cfg c, now;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.colsb[t] = 4;
        c.rows[t] = 1;
    }
    if (load) {
        AMX_LOADCFG(&c);
        return 1;
    }
    AMX_STORECFG(&now);
    return memcmp(&c, &now, sizeof c) == 0;
}

/* The level: avx512vnni's table with this GEMM kernel (every CPU with AMX-INT8 so far has
 * AVX-512 VNNI; dispatch.c offers this level only where both run). Built at run time from
 * that table, so every other kernel is literally avx512vnni's. dispatch.c calls this once,
 * before any other thread can ask for levels. */
const ql_isa *ql_isa_amx(void) {
    static ql_isa isa;
    if (!isa.name) {
        isa = ql_isa_avx512vnni;
        isa.exact = &k_amx;
        k_amx_s8u8.conv.conv_fallback = ql_isa_avx512vnni.conv_fast;
        isa.conv_fast = &k_amx_s8u8;
        isa.exact_1x1_min_m = 96;     /* wide 1x1 convolutions on the tiles (qlinear.h) */
        isa.exact_1x1_min_k = 32;
        isa.name = "amx";
    }
    return &isa;
}
#endif
