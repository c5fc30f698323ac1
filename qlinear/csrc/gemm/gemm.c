/* The portable GEMM driver: blocking, threading, the U8S8 corrections and the fused epilogue.
 *
 * C (M x N) = L (M x K) . R (K x N). L is packed as rows of kp elements; R as panels of nr
 * columns (prepacked, or packed per panel by a callback into per-thread scratch). Work is cut
 * into tasks (row block x column block); each task runs the micro-kernel over its tiles with
 * the full K (no K blocking: one R panel, K x nr, is reused across a row block of L kept in
 * L2), and the epilogue consumes every tile while it is hot in L1.
 */
#include "qlinear.h"
#include "gemv.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "isa/x86_sse2.h"   /* ql_store_fence */

#define L2_BUDGET (256 * 1024)   /* bytes of packed L per row block (Zen 3 L2: 512 KiB): few
                                    row blocks, so the packed R streams from memory few times */
#define KC_BYTES 65536          /* bytes of one K block of a panel: L2-resident (measured: smaller
                                    blocks, L1-sized, were slower on Zen 3) */
#define MIN_TASK_MACS (1 << 20)  /* below this (~15 us of one core), waking a second thread
                                    costs about what it gives (measured on a 2-vCPU VM) */

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline ptrdiff_t pmin(ptrdiff_t a, ptrdiff_t b) { return a < b ? a : b; }

typedef struct {
    const ql_gemm_problem *p;
    int mc, ppt, row_blocks, col_blocks, npanels;
    int kc, nkb;                           /* K block (elements, multiple of kpack) and count */
    int fused;                             /* kernel_ep replaces kernel + epilogue */
    int panel_slots;                       /* per-call packed panels per thread: 1, or 2 (pairs) */
    size_t pbytes;
    char *scratch; size_t scratch_stride;  /* per thread: [packed panel + colsums] [C block] */
    size_t cblock_off, lblock_off;
} gemm_ctx;

static void gemm_task_tiles(void *vctx, ptrdiff_t t, int thread) {
    gemm_ctx *g = (gemm_ctx *)vctx;
    const ql_gemm_problem *p = g->p;
    const ql_gemm_kernel *k = p->kern;
    const int nr = k->nr;
    const size_t es = k->form == QL_FORM_I16 ? 2 : 1;
    int rb = (int)(t % g->row_blocks), cb = (int)(t / g->row_blocks);
    int i_beg = rb * g->mc, i_end = imin(p->M, i_beg + g->mc);
    int p_beg = cb * g->ppt, p_end = imin(g->npanels, p_beg + g->ppt);
    int32_t Ct[QL_MAX_MR * QL_MAX_NR] __attribute__((aligned(64)));
    char *s = g->scratch ? g->scratch + (size_t)thread * g->scratch_stride : NULL;
    int32_t *Cb = s ? (int32_t *)(s + g->cblock_off) : NULL;  /* mc x nr, for K blocking */
    /* row i of the block at Lb + (i - i_beg) * ldl */
    const char *Lb;
    if (p->pack_L) {
        char *dst = s + g->lblock_off;
        p->pack_L(p->pack_L_ctx, i_beg, i_end - i_beg, dst, thread);
        Lb = dst;
    } else {
        Lb = (const char *)p->L + (ptrdiff_t)i_beg * p->ldl_bytes;
    }
    int paired = 0;   /* the next panel was packed with this one (pack_R_pairs) */
    for (int pi = p_beg; pi < p_end; pi++) {
        int j0 = pi * nr, ncols = imin(nr, p->N - j0);
        const char *panel;
        const int32_t *cs = NULL;
        if (p->Rpacked) {
            panel = (const char *)p->Rpacked + (size_t)pi * g->pbytes;
            if (p->R_colsums) cs = p->R_colsums + j0;
        } else {
            int32_t *colsums = (int32_t *)(s + g->panel_slots * g->pbytes);
            if (paired) {
                /* the second panel of a pair, packed with the previous one */
                panel = s + g->pbytes;
                cs = colsums + nr;
                paired = 0;
            } else {
                /* two whole panels at once where the kernel's packer takes pairs: each row's
                 * 2 * nr bytes read in one pass (qlinear.h: pack_R_pairs) */
                paired = g->panel_slots == 2 && pi + 1 < p_end && p->N - j0 >= 2 * nr;
                if (paired) __atomic_add_fetch(&ql_gemm_pair_packs, 1, __ATOMIC_RELAXED);
                p->pack_R(p->pack_ctx, j0, paired ? 2 * nr : ncols, s, colsums, thread);
                panel = s;
                cs = colsums;
            }
        }
        /* a last panel of at most tail_nr real columns: the narrow kernel */
        ql_kernel_fn kfn = k->kernel;
        if (k->kernel_tail && ncols <= k->tail_nr) {
            kfn = k->kernel_tail;
            ql_tail_count(1);
        }
        if (g->nkb <= 1) {
            /* the whole K at once: the tile goes straight to the epilogue */
            for (int i = i_beg; i < i_end; i += k->mr) {
                int rows = imin(k->mr, i_end - i);
                if (g->fused && kfn == k->kernel) {
                    k->kernel_ep(Lb + (ptrdiff_t)(i - i_beg) * p->ldl_bytes, p->ldl_bytes, panel,
                                 p->kp, &p->ep, cs, i, j0, rows, ncols);
                    continue;
                }
                kfn(Lb + (ptrdiff_t)(i - i_beg) * p->ldl_bytes, p->ldl_bytes, panel,
                          p->kp, Ct, nr, rows);
                p->epilogue(&p->ep, Ct, nr, cs, i, j0, rows, ncols);
            }
            continue;
        }
        /* K blocks: one block of the panel (kc x nr) stays in L1 while every row tile of the
         * row block passes over it; partial sums are added (wrapping) into the C block */
        for (int kb = 0; kb < g->nkb; kb++) {
            int k0 = kb * g->kc, kl = imin(g->kc, p->kp - k0);
            const char *pk = panel + (size_t)k0 * nr * es;
            for (int i = i_beg; i < i_end; i += k->mr) {
                int rows = imin(k->mr, i_end - i);
                int32_t *cdst = Cb + (size_t)(i - i_beg) * nr;
                if (kb == 0) {
                    kfn(Lb + (ptrdiff_t)(i - i_beg) * p->ldl_bytes + (size_t)k0 * es,
                              p->ldl_bytes, pk, kl, cdst, nr, rows);
                } else {
                    kfn(Lb + (ptrdiff_t)(i - i_beg) * p->ldl_bytes + (size_t)k0 * es,
                              p->ldl_bytes, pk, kl, Ct, nr, rows);
                    uint32_t *d = (uint32_t *)cdst;
                    const uint32_t *src = (const uint32_t *)Ct;
                    for (int e = 0; e < rows * nr; e++) d[e] += src[e];
                }
            }
        }
        for (int i = i_beg; i < i_end; i += k->mr) {
            int rows = imin(k->mr, i_end - i);
            p->epilogue(&p->ep, Cb + (size_t)(i - i_beg) * nr, nr, cs, i, j0, rows, ncols);
        }
    }
}

/* one task, with the kernel's per-thread state hooks around it (qlinear.h: task_begin) */
static void gemm_task(void *vctx, ptrdiff_t t, int thread) {
    const ql_gemm_problem *p = ((gemm_ctx *)vctx)->p;
    const ql_gemm_kernel *k = p->kern;
    if (k->task_begin) k->task_begin();
    gemm_task_tiles(vctx, t, thread);
    if (k->task_end) k->task_end();
    if (p->ep.stream) {
        /* non-temporal stores are weakly ordered: drain them before the pool's completion
         * signal (a release store), so the caller and other threads read the values */
        ql_store_fence();
        __atomic_add_fetch(&ql_gemm_stream_tasks, 1, __ATOMIC_RELAXED);
    }
}

int ql_gemm(const ql_gemm_problem *p) {
    const ql_gemm_kernel *k = p->kern;
    if (p->M <= 0 || p->N <= 0) return 0;
    if (p->pack_L && !p->Rpacked) return -1;
    gemm_ctx g;
    memset(&g, 0, sizeof g);
    g.p = p;
    g.npanels = (p->N + k->nr - 1) / k->nr;
    g.pbytes = ql_panel_bytes(k, p->kp);
    int threads = imin(p->threads, ql_num_threads());
    double macs = (double)p->M * p->N * (p->K > 0 ? p->K : 1);
    if (macs < 2.0 * MIN_TASK_MACS) threads = 1;
    if (threads < 1) threads = 1;
    size_t row_bytes = (size_t)p->kp * (k->form == QL_FORM_I16 ? 2 : 1);
    int mc = (int)(L2_BUDGET / (row_bytes ? row_bytes : 1));
    mc = mc / k->mr * k->mr;
    if (mc < k->mr) mc = k->mr;
    if (!p->Rpacked || mc > p->M) mc = (p->M + k->mr - 1) / k->mr * k->mr;
    int target = threads > 1 ? 4 * threads : 1;
    for (;;) {
        g.row_blocks = (p->M + mc - 1) / mc;
        /* L packed per task (pack_L) is packed again by each column block of its rows: cheap
         * (one pass over mc rows) next to streaming all of R once more per extra row block,
         * which a split by rows alone costs (K = 3072, M = 128, 2 threads: 11 row blocks of
         * 12 rows, each reading the whole 4.7 MB of packed R, against 4 x 2 tasks). Only in
         * the I16 form: a U8S8 pack_L also writes the rows' sums, shared by the column blocks */
        int want_cols = p->pack_L && k->form != QL_FORM_I16 ? 1 : (target + g.row_blocks - 1) / g.row_blocks;
        g.col_blocks = imin(g.npanels, want_cols < 1 ? 1 : want_cols);
        g.ppt = (g.npanels + g.col_blocks - 1) / g.col_blocks;
        g.col_blocks = (g.npanels + g.ppt - 1) / g.ppt;
        /* too few tasks for the threads: cut the rows finer (prepacked R only) */
        if (g.row_blocks * g.col_blocks >= (want_cols == 1 && p->pack_L ? target : 2 * threads) || !p->Rpacked || mc <= k->mr) break;
        mc = (mc / 2 + k->mr - 1) / k->mr * k->mr;
    }
    /* equal row blocks: M = 128 with at most 102 rows a block is 66 + 62, not 102 + 26 */
    {
        int blocks = (p->M + mc - 1) / mc;
        int even = (p->M + blocks - 1) / blocks;
        mc = (even + k->mr - 1) / k->mr * k->mr;
    }
    g.mc = mc;
    g.row_blocks = (p->M + mc - 1) / mc;
    /* K block: about 8 KiB of panel (L1 holds it, the C block and a tile's L rows) */
    size_t es = k->form == QL_FORM_I16 ? 2 : 1;
    int kal = k->kalign ? k->kalign : k->kpack;   /* K blocks keep the kernel's alignment */
    g.kc = (int)(KC_BYTES / ((size_t)k->nr * es)) / kal * kal;
    if (g.kc < kal) g.kc = kal;
    g.nkb = p->kp > g.kc + g.kc / 2 ? (p->kp + g.kc - 1) / g.kc : 1;
    /* the fused kernel applies its level's epilogue: only where the caller says `epilogue` is
     * that one (allow_fused) */
    g.fused = g.nkb == 1 && k->kernel_ep != NULL && p->allow_fused;
    if (g.fused) __atomic_add_fetch(&ql_gemm_fused_calls, 1, __ATOMIC_RELAXED);
    g.panel_slots = !p->Rpacked && p->pack_R_pairs && g.nkb <= 1 ? 2 : 1;
    /* pairs: an even count of panels per task, so a task's last panel is not packed alone
     * (the other half of its lines would be read again by the next task's first panel), as
     * long as the threads keep at least 2 tasks each (bert.ffn2's 24 panels on 2 threads: 6
     * tasks of 4 instead of 8 of 3) */
    if (g.panel_slots == 2 && (g.ppt & 1) && g.ppt < g.npanels) {
        int ppt2 = g.ppt + 1, cb2 = (g.npanels + ppt2 - 1) / ppt2;
        if ((ptrdiff_t)g.row_blocks * cb2 >= 2 * (ptrdiff_t)threads) {
            g.ppt = ppt2;
            g.col_blocks = cb2;
        }
    }
    size_t panel_part = p->Rpacked ? 0 : (g.panel_slots * g.pbytes + 2 * (size_t)QL_MAX_NR * sizeof(int32_t) + 63) & ~(size_t)63;
    size_t cblock = g.nkb > 1 ? ((size_t)mc * k->nr * sizeof(int32_t) + 63) & ~(size_t)63 : 0;
    size_t lblock = p->pack_L ? ((size_t)mc * (size_t)p->ldl_bytes + 63) & ~(size_t)63 : 0;
    g.cblock_off = panel_part;
    g.lblock_off = panel_part + cblock;
    g.scratch_stride = panel_part + cblock + lblock;
    int own = 0;
    if (g.scratch_stride) {
        if (p->scratch && g.scratch_stride * (size_t)threads <= p->scratch_bytes) {
            g.scratch = (char *)p->scratch;
        } else {
            g.scratch = aligned_alloc(64, g.scratch_stride * (size_t)threads);
            if (!g.scratch) return -1;
            own = 1;
        }
    }
    ptrdiff_t tasks = (ptrdiff_t)g.row_blocks * g.col_blocks;
    ql_parallel_for(tasks, threads, gemm_task, &g);
    if (own) free(g.scratch);
    return 0;
}

/* ---------------------------------------------------------------------------------------
 * b packing
 * ------------------------------------------------------------------------------------- */
size_t ql_packed_b_bytes(const ql_gemm_kernel *kern, int K, int N) {
    /* a narrow b also keeps its gemv form after the panels (include/gemv.h) */
    if (ql_gemv_has_form(kern, N)) return ql_gemv_form_offset(kern, K, N) + ql_gemv_form_bytes(kern, K, N);
    size_t npanels = (size_t)(N + kern->nr - 1) / kern->nr;
    return npanels * ql_panel_bytes(kern, ql_round_k(kern, K));
}

typedef struct {
    const ql_gemm_kernel *kern;
    const void *b; int b_type; int K, N, kp, npanels;
    ptrdiff_t bs, ks, cs;
    const int32_t *zp; ptrdiff_t zp_bs, zp_cs;
    char *packed; size_t entry_bytes, pbytes;
    int32_t *colsums; int32_t *zcol;
} packb_ctx;

static void packb_task(void *vctx, ptrdiff_t t, int thread) {
    (void)thread;
    packb_ctx *c = (packb_ctx *)vctx;
    const ql_gemm_kernel *k = c->kern;
    ptrdiff_t e = t / c->npanels;
    int pi = (int)(t % c->npanels);
    int j0 = pi * k->nr, ncols = imin(k->nr, c->N - j0);
    int npad = c->npanels * k->nr;
    const char *src = (const char *)c->b + (e * c->bs + (ptrdiff_t)j0 * c->cs);  /* bytes = elements */
    const int32_t *zp = c->zp + e * c->zp_bs + (ptrdiff_t)j0 * c->zp_cs;
    int32_t *cs = c->colsums ? c->colsums + e * npad + j0 : NULL;
    k->pack_R(src, c->b_type, c->ks, c->cs, c->K, ncols, zp, c->zp_cs, k->form, k->nr,
                    c->packed + e * c->entry_bytes + (size_t)pi * c->pbytes, c->kp, cs);
    if (c->zcol) {
        int shift = (k->form == QL_FORM_U8S8 && c->b_type == QL_U8) ? 128 : 0;
        for (int j = 0; j < ncols; j++) c->zcol[e * c->N + j0 + j] = zp[j * c->zp_cs] - shift;
    }
}

void ql_pack_b(const ql_gemm_kernel *kern, const void *b, int b_type, ptrdiff_t Bb, int K, int N,
               ptrdiff_t bs, ptrdiff_t ks, ptrdiff_t cs, const int32_t *zp, ptrdiff_t zp_bs,
               ptrdiff_t zp_cs, void *packed, int32_t *colsums, int32_t *zcol, int threads) {
    if (N <= 0) return;
    packb_ctx c = {kern, b, b_type, K, N, ql_round_k(kern, K), (N + kern->nr - 1) / kern->nr,
                   bs, ks, cs, zp, zp_bs, zp_cs, (char *)packed, ql_packed_b_bytes(kern, K, N),
                   ql_panel_bytes(kern, ql_round_k(kern, K)), colsums, zcol};
    ptrdiff_t tasks = Bb * c.npanels;
    if ((double)Bb * K * N < (1 << 18)) threads = 1;
    ql_parallel_for(tasks, threads, packb_task, &c);
    if (ql_gemv_has_form(kern, N)) {
        size_t off = ql_gemv_form_offset(kern, K, N);
        for (ptrdiff_t e = 0; e < Bb; e++)
            ql_gemv_pack((const char *)b + e * bs, b_type, ks, cs, K, N, zp + e * zp_bs, zp_cs,
                         (char *)packed + e * c.entry_bytes + off);
    }
}

/* ---------------------------------------------------------------------------------------
 * MatMulInteger / QLinearMatMul
 * ------------------------------------------------------------------------------------- */
/* Non-temporal stores for int32 outputs of 32 MiB or more (all batch entries of the call),
 * decided once per call. An ordinary store first reads its line (read for ownership); a
 * streaming store does not, but it sends the line to memory, so whatever reads the output
 * next (the consumer) reads it from DRAM instead of the caches. Measured on an AVX-512 VNNI +
 * AMX Xeon (docs/benchmarks.md, "MatMulInteger's int32 output and plain matmul packing"):
 * streaming slowed outputs of 4-16 MiB and sped up 48-64 MiB ones, and the call plus a
 * consumer reading the output broke even near 24-32 MiB and gained above. Below that the
 * output stays in the last-level cache and ordinary stores win. 8-bit outputs are
 * never streamed: a tile writes 32 bytes of a row (half a line), and a partly written line
 * is flushed from the write-combining buffer in pieces. */
long long ql_gemm_stream_bytes = 32LL << 20;

typedef struct {
    const ql_matmul *mm;
    int stream;                            /* ql_epilogue.stream for every batch entry */
    int kp; size_t ldl; size_t lbytes;     /* packed a: M rows of ldl bytes */
    char *scratch; size_t scratch_stride;  /* per thread: packed a + rowsums + row_a + row_z
                                              (+ zR' per column: raw b, U8S8 form) */
    size_t zcol_off;
    size_t gemm_off, gemm_bytes;           /* per thread: room for ql_gemm's own scratch (a
                                              single-thread GEMM of a raw b: its panels) */
    int inner_threads;
} mm_ctx;

/* raw b (a plain call): one panel packed by the GEMM task that uses it */
typedef struct {
    const ql_gemm_kernel *kern;
    const char *b; int b_type; ptrdiff_t ks; int K, kp;
    const int32_t *zp; ptrdiff_t zp_cs;
} rawb_ctx;

static void rawb_panel(void *vctx, int j0, int ncols, void *dst, int32_t *colsums, int thread) {
    (void)thread;
    const rawb_ctx *c = (const rawb_ctx *)vctx;
    const ql_gemm_kernel *k = c->kern;
    k->pack_R(c->b + j0, c->b_type, c->ks, 1, c->K, ncols, c->zp + (ptrdiff_t)j0 * c->zp_cs, c->zp_cs,
              k->form, k->nr, dst, c->kp, colsums);
}

typedef struct {
    const ql_matmul *mm; const void *a; const int32_t *zpa; char *Lp; size_t ldl; int kp;
    int32_t *rowsums, *row_a, *row_z; int rows_per_task;
} packa_ctx;

/* pack rows r0.. of a into dst (row r0 at dst); U8S8: their rowsums, row_a, row_z */
static void packa_rows_to(const packa_ctx *c, int r0, int rows, char *dst) {
    const ql_matmul *mm = c->mm;
    int form = mm->kern->form;
    const char *src = (const char *)c->a + (ptrdiff_t)r0 * mm->K;
    const int32_t *zp = c->zpa + (ptrdiff_t)r0 * mm->zpa_rs;
    mm->kern->pack_L(src, mm->a_type, mm->K, 1, rows, mm->K, zp, mm->zpa_rs, form,
              dst, (ptrdiff_t)c->ldl, c->kp,
              form == QL_FORM_U8S8 ? c->rowsums + r0 : NULL);
    if (form == QL_FORM_U8S8) {
        int shift = mm->a_type == QL_I8 ? 128 : 0;
        for (int r = r0; r < r0 + rows; r++) {
            int32_t zl = c->zpa[(ptrdiff_t)r * mm->zpa_rs] + shift;   /* zL' */
            c->row_z[r] = zl;
            c->row_a[r] = (int32_t)((uint32_t)c->rowsums[r] - (uint32_t)mm->K * (uint32_t)zl);
        }
    }
}

static void packa_rows(const packa_ctx *c, int r0, int rows) {
    packa_rows_to(c, r0, rows, c->Lp + (size_t)r0 * c->ldl);
}

static void packa_block(void *vctx, int i0, int rows, void *dst, int thread) {
    (void)thread;
    packa_rows_to((const packa_ctx *)vctx, i0, rows, (char *)dst);
}

static void packa_task(void *vctx, ptrdiff_t t, int thread) {
    (void)thread;
    packa_ctx *c = (packa_ctx *)vctx;
    int r0 = (int)t * c->rows_per_task;
    packa_rows(c, r0, imin(c->rows_per_task, c->mm->M - r0));
}

static int mm_batch(mm_ctx *x, ptrdiff_t bi, int thread, int threads) {
    const ql_matmul *mm = x->mm;
    const ql_gemm_kernel *k = mm->kern;
    char *s = x->scratch + (size_t)thread * x->scratch_stride;
    int32_t *rowsums = (int32_t *)(s + x->lbytes);
    int32_t *row_a = rowsums + mm->M, *row_z = row_a + mm->M;
    int64_t ai = mm->a_idx[bi], bidx = mm->b_idx[bi];
    packa_ctx pc = {mm, (const char *)mm->a + (size_t)ai * mm->M * mm->K * 1,
                    mm->zpa + bi * mm->zpa_bs, s, x->ldl, x->kp, rowsums, row_a, row_z, 0};
    /* a tall a: each task packs its own row block (once, into L2) instead of a pass over all
     * of a first, whose packed copy would no longer fit in cache */
    size_t row_bytes = x->ldl;
    int in_task = (size_t)mm->M * row_bytes > 2 * (size_t)L2_BUDGET && mm->N > 0 && mm->bpack;
    if (in_task) {
        /* packed inside ql_gemm */
    } else if (threads > 1 && (double)mm->M * mm->K > (1 << 17)) {
        pc.rows_per_task = (mm->M + 4 * threads - 1) / (4 * threads);
        ql_parallel_for((mm->M + pc.rows_per_task - 1) / pc.rows_per_task, threads, packa_task, &pc);
    } else {
        packa_rows(&pc, 0, mm->M);
    }
    int npad = (mm->N + k->nr - 1) / k->nr * k->nr;
    ql_gemm_problem p;
    memset(&p, 0, sizeof p);
    p.kern = k;
    p.M = mm->M; p.N = mm->N; p.K = mm->K; p.kp = x->kp;
    p.L = in_task ? NULL : s; p.ldl_bytes = (ptrdiff_t)x->ldl;
    if (in_task) { p.pack_L = packa_block; p.pack_L_ctx = &pc; }
    rawb_ctx rb;
    if (mm->bpack) {
        p.Rpacked = (const char *)mm->bpack + (size_t)bidx * ql_packed_b_bytes(k, mm->K, mm->N);
    } else {
        rb.kern = k; rb.b = (const char *)mm->braw + bidx * mm->b_bs; rb.b_type = mm->b_type;
        rb.ks = mm->b_ks; rb.K = mm->K; rb.kp = x->kp;
        rb.zp = mm->bzp + bidx * mm->bzp_bs; rb.zp_cs = mm->bzp_cs;
        p.pack_R = rawb_panel; p.pack_ctx = &rb;
        p.pack_R_pairs = k->pack_R_pairs;   /* rawb_panel hands ncols to the kernel's packer */
    }
    p.epilogue = mm->isa->epilogue;
    p.allow_fused = 1;   /* the level's own epilogue, which kernel_ep applies */
    p.threads = threads;
    if (x->gemm_bytes) { p.scratch = s + x->gemm_off; p.scratch_bytes = x->gemm_bytes; }
    ql_epilogue *ep = &p.ep;
    ep->quantized = mm->quantized;
    size_t out_es = mm->quantized ? 1 : 4;
    ep->out = (char *)mm->out + (size_t)bi * mm->M * mm->N * out_es;
    ep->out_rs = mm->N; ep->out_cs = 1;
    ep->stream = x->stream;
    if (mm->quantized) {
        ep->mult = mm->mult + bi * mm->m_bs;
        ep->mult_rs = mm->m_rs; ep->mult_cs = mm->m_cs;
        ep->lo = mm->lo; ep->hi = mm->hi; ep->zp = mm->yzp;
        ep->out_is_signed = mm->out_is_signed;
    }
    if (k->form == QL_FORM_U8S8) {
        ep->row_a = row_a; ep->row_z = row_z; ep->row_s = 1;
        if (mm->bpack) {
            p.R_colsums = mm->bcolsums + (size_t)bidx * npad;
            ep->col_z = mm->bzcol + (size_t)bidx * mm->N; ep->col_z_s = 1;
        } else {
            /* zR' = zR - 128 for uint8 b (its s8 form), zR for int8 b; colsums come per panel */
            int32_t *zc = (int32_t *)(s + x->zcol_off);
            int shift = mm->b_type == QL_U8 ? 128 : 0;
            int nz = mm->bzp_cs ? mm->N : 1;
            for (int j = 0; j < nz; j++) zc[j] = rb.zp[(ptrdiff_t)j * mm->bzp_cs] - shift;
            ep->col_z = zc; ep->col_z_s = mm->bzp_cs ? 1 : 0;
        }
    }
    return ql_gemm(&p);
}

typedef struct { mm_ctx *x; atomic_int failed; } mm_tasks;

static void mm_batch_task(void *vctx, ptrdiff_t t, int thread) {
    mm_tasks *m = (mm_tasks *)vctx;
    if (mm_batch(m->x, t, thread, 1) != 0) atomic_store(&m->failed, 1);
}

/* Raw b packed whole before the GEMMs (as a prepared form does) instead of panel by panel in
 * the tasks: when a is tall, the in-task form would stream all of the packed a once per panel
 * (the row blocks share the panel); when b entries are reused by several output batch entries
 * with few rows each, they would be packed again for each. */
#define RAW_L_MAX (1 << 20)    /* bytes of packed a above which b is packed first */

static int raw_prepacked(const ql_matmul *mm, size_t ldl) {
    if ((size_t)mm->M * ldl > RAW_L_MAX) return 1;
    return mm->batches > mm->Bb && mm->M < 32;
}

int ql_matmul_run(const ql_matmul *mm) {
    const ql_gemm_kernel *k = mm->kern;
    if (mm->batches <= 0 || mm->M <= 0 || mm->N <= 0) return 0;
    mm_ctx x;
    memset(&x, 0, sizeof x);
    x.mm = mm;
    x.kp = ql_round_k(k, mm->K);
    x.stream = !mm->quantized &&
               (double)mm->batches * mm->M * mm->N * sizeof(int32_t) >=
                   (double)__atomic_load_n(&ql_gemm_stream_bytes, __ATOMIC_RELAXED);
    size_t es = k->form == QL_FORM_I16 ? 2 : 1;
    x.ldl = ((size_t)x.kp * es + 15) & ~(size_t)15;
    if (x.ldl == 0) x.ldl = 16;
    x.lbytes = ((size_t)mm->M * x.ldl + 63) & ~(size_t)63;
    x.zcol_off = x.lbytes + 3 * (size_t)mm->M * sizeof(int32_t);
    x.gemm_off = (x.zcol_off + (size_t)mm->N * sizeof(int32_t) + 63) & ~(size_t)63;
    if (!mm->bpack) {
        /* a plain call's GEMMs pack b's panels into ql_gemm's per-thread scratch: room for a
         * pair of panels and their column sums (ql_gemm's panel part, without K blocks), so
         * the GEMMs (one per batch entry) do not allocate and free it each (ql_gemm checks it and
         * allocates its own when this does not hold what it needs) */
        x.gemm_bytes = (2 * ql_panel_bytes(k, x.kp) + 2 * (size_t)QL_MAX_NR * sizeof(int32_t) + 63) & ~(size_t)63;
    }
    x.scratch_stride = x.gemm_off + x.gemm_bytes;
    int threads = imin(mm->threads, ql_num_threads());
    if (threads < 1) threads = 1;
    ql_matmul pre;           /* raw b packed first (raw_prepacked): the prepared form's call */
    void *packed = NULL;
    int32_t *colsums = NULL, *zcol = NULL;
    if (!mm->bpack && raw_prepacked(mm, x.ldl)) {
        int npad = (mm->N + k->nr - 1) / k->nr * k->nr;
        packed = malloc(mm->Bb * ql_packed_b_bytes(k, mm->K, mm->N) + 1);
        colsums = malloc(sizeof(int32_t) * (size_t)(mm->Bb * npad) + 1);
        zcol = malloc(sizeof(int32_t) * (size_t)(mm->Bb * mm->N) + 1);
        if (!packed || !colsums || !zcol) { free(packed); free(colsums); free(zcol); return -1; }
        ql_pack_b(k, mm->braw, mm->b_type, mm->Bb, mm->K, mm->N, mm->b_bs, mm->b_ks, 1, mm->bzp,
                  mm->bzp_bs, mm->bzp_cs, packed, k->form == QL_FORM_U8S8 ? colsums : NULL, zcol,
                  threads);
        pre = *mm;
        pre.bpack = packed; pre.bcolsums = colsums; pre.bzcol = zcol;
        mm = &pre;
        x.mm = mm;
    }
    /* one row of a per batch entry times a narrow packed b: its gemv form (include/gemv.h) */
    if (mm->M == 1 && mm->bpack) {
        int g = ql_gemv_run(mm);
        if (g != -1) {
            free(packed); free(colsums); free(zcol);
            return g == 0 ? 0 : -1;
        }
    }
    /* many small products: one batch entry per task; otherwise threads inside each GEMM */
    double per = (double)mm->M * mm->N * (mm->K ? mm->K : 1);
    int by_batch = threads > 1 && mm->batches >= 2 * threads && per < (1 << 22);
    int slots = by_batch ? threads : 1;
    int rc = 0;
    x.scratch = aligned_alloc(64, x.scratch_stride * (size_t)slots);
    if (!x.scratch) {
        rc = -1;
    } else if (by_batch) {
        mm_tasks t = {&x, 0};
        ql_parallel_for(mm->batches, threads, mm_batch_task, &t);
        rc = atomic_load(&t.failed) ? -1 : 0;
    } else {
        for (ptrdiff_t bi = 0; bi < mm->batches && rc == 0; bi++) rc = mm_batch(&x, bi, 0, threads);
    }
    free(x.scratch);
    free(packed); free(colsums); free(zcol);
    return rc;
}

/* ---------------------------------------------------------------------------------------
 * The 7-bit proofs of plain calls
 * ------------------------------------------------------------------------------------- */
#define WITHIN_BLOCK 16384

typedef struct {
    const uint8_t *x; ptrdiff_t n; uint8_t flip, lo, hi;
    atomic_int outside;
} within_ctx;

static void within_task(void *vctx, ptrdiff_t t, int thread) {
    (void)thread;
    within_ctx *c = (within_ctx *)vctx;
    if (atomic_load_explicit(&c->outside, memory_order_relaxed)) return;
    ptrdiff_t b = t * WITHIN_BLOCK, e = pmin(c->n, b + WITHIN_BLOCK);
    /* running minimum and maximum: a loop the compiler vectorizes (pminub / pmaxub) */
    uint8_t mn = 255, mx = 0;
    for (ptrdiff_t i = b; i < e; i++) {
        uint8_t v = (uint8_t)(c->x[i] ^ c->flip);
        mn = v < mn ? v : mn;
        mx = v > mx ? v : mx;
    }
    if (mn < c->lo || mx > c->hi) atomic_store_explicit(&c->outside, 1, memory_order_relaxed);
}

int ql_bytes_within(const void *x, int type, ptrdiff_t n, int lo, int hi, int threads) {
    if (n <= 0) return 1;
    if (lo > hi || hi < 0 || lo > 255) return 0;
    within_ctx c = {(const uint8_t *)x, n, (uint8_t)(type == QL_I8 ? 0x80 : 0),
                    (uint8_t)(lo < 0 ? 0 : lo), (uint8_t)(hi > 255 ? 255 : hi), 0};
    if (n < (1 << 20)) threads = 1;   /* below: tens of microseconds on one core */
    ql_parallel_for((n + WITHIN_BLOCK - 1) / WITHIN_BLOCK, threads, within_task, &c);
    return !atomic_load(&c.outside);
}
