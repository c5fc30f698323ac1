/* The implicit GEMM's plan: whether a convolution takes it, the phase planes' geometry and
 * layout, the copy's schedule (shifted planes, images merged or in parallel), tiles and K
 * blocks, then the jobs of implicit_run.c's tasks (ig_run). The GEMM path's overview: driver.c;
 * this path's: implicit.h. */
#include "implicit.h"

/* Images per GEMM on the implicit path. A small plane is a few tiles per image (7x7: 4), so
 * an image at a time streams every L2-sized block of packed weights for those few tiles, with
 * two thread barriers per image; a chunk of images is copied side by side and one GEMM runs
 * over its (image, tile) pairs, each weight block used on all of them. The chunk's copies (per
 * image: per bytes) stay within IG_BATCH_BYTES, Zen 3's L2 (measured: chunks of 1 MiB made a
 * 2048-channel 7x7 pointwise layer 8% slower, its copies then read from L3 by every row
 * block), and within avail (the workspace limit less the scratch and fixed buffers). */
#ifndef IG_BATCH_BYTES
#define IG_BATCH_BYTES ((size_t)512 << 10)
#endif
#define IG_MIN_PAIRS 4
static int64_t ig_batch_images(int64_t N, size_t per, size_t avail)
{
    if (N <= 1) return 1;
    int64_t n = (int64_t)(IG_BATCH_BYTES / per), w = (int64_t)(avail / per);
    if (w < n) n = w;
    if (n > N) n = N;
    return n < 1 ? 1 : n;
}

/* GEMM tasks of a chunk: row blocks x blocks of (image, tile) pairs (ig_gemm_task shares the
 * pairs out evenly), at least 4 tasks per thread, and a multiple of the threads where the pairs
 * allow (tasks of equal work, claimed in turn: none left for one thread; 19 row blocks on 2
 * threads: 38 tasks, not 19, of which one thread would run 10 and the other 9); a chunk of
 * several images keeps at least IG_MIN_PAIRS pairs a task. */
void ig_tile_blocks(ig_ctx *c, int run_threads)
{
    int64_t pairs = c->nimg * (c->tpm ? c->ntiles - 1 : c->ntiles) + (c->u_run1 - c->u_run0) + c->nleft;
    int64_t target = run_threads > 1 ? 4 * run_threads : 1;
    if (pairs == 0) {   /* a chunk whose only tiles are in panels it does not complete */
        c->tile_blocks = 0;
        return;
    }
    /* blocks of whole tile pairs for a kernel that runs two tiles at once (ig_gemm_body) */
    int64_t units = c->kern->conv.ikernel2_ep ? (pairs + 1) / 2 : pairs;
    c->tile_blocks = (target + c->row_blocks - 1) / c->row_blocks;
    if (c->tile_blocks > units) c->tile_blocks = units;
    int64_t most = c->nimg > 1 ? pairs / IG_MIN_PAIRS : units;
    if (most > units) most = units;
    if (run_threads > 1)
        for (int64_t nb = c->tile_blocks; nb <= most; nb++)
            if (c->row_blocks * nb % run_threads == 0) {
                c->tile_blocks = nb;
                break;
            }
}
/* Shifted planes (ig_copy_shift_task) against the standard phase planes. The standard planes
 * are Wph = OW + the kernel's reach wide, so a tile computes Wph - OW dropped columns per
 * output row: 2 of every 16 on a 14x14 plane, and a 7x7 plane ends in a 7-column dot tile.
 * The shifted planes, one per column tap, hold each tap's columns already shifted: rows OW
 * wide, q = oh*OW + ow, every computed column real but the last tile's tail (a 7x7 plane: 3
 * tiles and 1 dot column), for kw / nfw times the copy. Taken where the tiles cost less and
 * that copy stays within IG_SHIFT_COPY_MAX. Measured (1 thread, ResNet-50 3x3 layers, 7-bit
 * and exact): 14x14 and 7x7 planes 7-14% faster, stride 2 3-13%, the 7x7 stride-2 stem 4-7%,
 * 56x56 3% at 7 bits (0.6 MiB copy) but -1% to +2% exact (1.25 MiB, interleaved with
 * onnxruntime: slower); a 112x112 64-channel plane 3% faster at 7 bits (2.4 MiB) but 8%
 * slower exact (4.9 MiB), 224x224 32 channels 2-4% / 14-17% (4.9 / 9.7 MiB): the bound.
 * Tile costs in units of a dot kernel's column pair, a full tile IG_TILE_PAIRS of them
 * (measured, 7-bit 512-channel 7x7 plane: 7 dot columns 17% of the time, 3 tiles 75%). */
#define IG_TILE_PAIRS 6
#define IG_SHIFT_COPY_MAX ((int64_t)1 << 20)
#define IG_SHIFT_MAX_KW 8

/* cost of nt tiles, the last wl columns wide (a dot tile where it has at most QL_DOT_NR) */
static int64_t ig_tiles_cost(int64_t nt, int64_t wl, int dot)
{
    return IG_TILE_PAIRS * (nt - 1) + (dot && wl <= QL_DOT_NR ? (wl + 1) / 2 : IG_TILE_PAIRS);
}

static int ig_shift_pays(const ig_ctx *c, const ql_gemm_kernel *kern, int64_t kw, size_t workspace)
{
    if (kw < 2 || kw > IG_SHIFT_MAX_KW || c->Wph <= c->OW || c->Ro < 2) return 0;
    /* the shifted copy's bytes (ig_run's PL and BS, within 64 bytes a plane; a block's below
     * 2^47 after ig_run's size check, the product compared by division); within half the
     * workspace limit, so that a limit the standard copy fits never sends the convolution to
     * the im2col path instead */
    int64_t nblk = (c->Cg + c->kpk - 1) / c->kpk, block = 4 * c->nfo * kw * (c->Rph * c->OW + 48);
    if (block > IG_SHIFT_COPY_MAX || nblk > IG_SHIFT_COPY_MAX / block || (size_t)(block * nblk) > workspace / 2)
        return 0;
    int dot = kern->conv.dot != NULL;
    int64_t q = (c->Ro - 1) * c->Wph + c->OW, nt = (q + QL_IK_NR - 1) / QL_IK_NR;
    int64_t std = ig_tiles_cost(nt, q - (nt - 1) * QL_IK_NR, dot);
    if (c->OW <= QL_IK_NR && dot) {   /* the row-aligned tiles (ig_run) */
        int64_t r = (QL_IK_NR - c->OW) / c->Wph + 1, ntr = (c->Ro + r - 1) / r;
        int64_t cr = ig_tiles_cost(ntr, (c->Ro - (ntr - 1) * r - 1) * c->Wph + c->OW, dot);
        if (cr < std) std = cr;
    }
    int64_t qs = c->Ro * c->OW, nts = (qs + QL_IK_NR - 1) / QL_IK_NR;
    return ig_tiles_cost(nts, qs - (nts - 1) * QL_IK_NR, dot) < std;
}

/* Group g's operands of the chunk from image n0 on (ig_run): its input, packed weights,
 * epilogue (bias, multipliers, output) and the first image's output. */
static void ig_group(ig_ctx *c, int64_t g, int64_t n0, const void *wpacked, const int32_t *fast_bias, int fused)
{
    const ql_conv_plan *p = c->p;
    int64_t P = c->P;
    size_t esize = p->quantized ? 1 : 4;
    c->xg = (const uint8_t *)p->x + (size_t)((n0 * p->C + g * c->Cg) * c->plane);
    c->L = (const char *)wpacked + (size_t)(g * c->Mg) * (size_t)c->ldl;
    if (c->wr) {   /* wr, wzp: group 0's (ig_run); each group's rows follow */
        c->L = NULL;
        c->wr = c->wr0 + (size_t)(g * c->Mg) * (size_t)c->Kraw;
        c->wzp = c->wzp0 + g * c->Mg;
    }
    plan_epilogue(p, &c->ep);
    if (p->bias) c->ep.row_bias = p->bias + g * c->Mg;
    if (fast_bias) c->ep.row_bias = fast_bias + g * c->Mg;
    if (c->fb_all) {
        c->fb = c->fb_all + g * c->Mg;
        c->bias_g = p->bias ? p->bias + g * c->Mg : NULL;
    }
    c->ep.mult = p->mult + g * c->Mg * p->mult_s;
    c->ep.out = (char *)p->y + (size_t)((n0 * p->M + g * c->Mg) * P) * esize;
    c->ep.out_rs = (ptrdiff_t)P;
    c->out0 = (char *)p->y + (size_t)(g * c->Mg * P) * esize;
    /* what ikernel_ep supports (always so here: the forms have no corrections, the
     * multipliers are per output channel, NCHW rows are contiguous) */
    c->ep_ok = c->ep.out_cs == 1 && c->ep.mult_cs == 0 && !c->ep.row_a;
    c->fused = fused && c->ep_ok;
}

/* Rows of a row block (a multiple of mr, at least mr): at most 256 KiB of packed weights, so a
 * block stays in L2 while the tiles of its columns use it. The blocks ig_run makes are at most
 * this long, which also sizes a plain call's per-thread packing scratch. */
static int ig_block_rows(ptrdiff_t ldl, int mr)
{
    int mc = (int)((256 * 1024) / (size_t)ldl) / mr * mr;
    return mc < mr ? mr : mc;
}

/* Whether no weight of a plain call can lie outside kern's S8U8 bound: every int8 w - z is
 * stored exactly where the bound is 128 (the VNNI levels) and every zero point is the type's
 * center (int8 0, uint8 128: w - z then spans [-128, 127]), so nothing needs proving before
 * the GEMM starts. */
static int trivial_bound(const ql_gemm_kernel *kern, const ql_conv_wraw *raw, int M)
{
    if (kern->conv.s8_bound < 128) return 0;
    int32_t center = raw->w_type == QL_I8 ? 0 : 128;
    for (int i = 0; i < M; i++)
        if (raw->wzp[i] != center) return 0;
    return 1;
}

/* ig_run's schedule (ig_schedule chooses it, ig_buffers and ig_execute use it) */
typedef struct {
    int threads, use_xt, pack_in_copy, pack_first, fused;
    int64_t tpm, nleft, nimg, pk, npanels;
    size_t copy_bytes, region, pregion, xs, xt_bytes, tp_bytes;
    double macs;
    char *copy_mem, *tp_mem;   /* the copies' block (kept between calls), the tail panels */
    int copy_cached;
} ig_sched;

/* The layout of the padded copy: the phases every axis' taps read, the planes and blocks, the
 * tiles (16 q or row-aligned) and the tap offsets of every k-group; *copy_bytes: one image's
 * copy. Returns 1, 0: not taken (the im2col path), or -1 (out of memory). */
static int ig_layout(ig_ctx *c, const ql_conv_plan *p, const ql_isa *isa, const ql_gemm_kernel *kern,
                     size_t workspace, size_t *copy_bytes)
{
    if (!kern->conv.ikernel || kern->form == QL_FORM_U8S8) return 0;
    c->p = p;
    c->kern = kern;
    c->epilogue = isa->epilogue;
    c->kpk = kern->kpack;
    c->mr = kern->mr;
    c->Cg = p->C / p->group;
    c->taps = prod(p->k, p->nsp);
    int64_t K = c->Cg * c->taps;
    /* the grouped order (or one tap, where both orders are the channel order) */
    if (c->taps > 1 && !ql_conv_grouped(kern, K, c->taps)) return 0;
    /* The last axis makes the rows (W, OW, sw, pw); the outer axes, however many, are
     * flattened into the rows of each phase plane: every rank runs the same geometry. */
    int L = p->nsp - 1;
    int64_t kw = p->k[L], dw = p->dil[L];
    c->W = p->in[L]; c->OW = p->out[L]; c->sw = p->stride[L]; c->pw = p->pad[L];
    c->nout = L;
    c->plane = prod(p->in, p->nsp);
    c->P = prod(p->out, p->nsp);
    if (c->sw > IG_MAX_STRIDE) return 0;
    /* padded extents (what the input and its begin pads cover, and what the windows reach),
     * each below 2^61 (python/bind_conv.c bounds every term by 2^60); phase planes ceil(e / s) along
     * every axis. The copy must stay small: huge pads, strides or dilations (far more
     * positions than the input and the output together) take the im2col path, which never
     * materializes padding. Each extent is bounded by 2^24 and the plane (a product, checked
     * factor by factor against the bound) by 2 (input + output) + 4096 < 2^62 (plane and P are
     * the caller's arrays' sizes), so every product below is below 2^40 or so. */
    int64_t ew = c->W + c->pw, nw = (c->OW - 1) * c->sw + (kw - 1) * dw + 1;
    if (nw > ew) ew = nw;
    c->Wph = (ew + c->sw - 1) / c->sw;
    int64_t limit = 2 * (c->plane + c->P) + 4096;
    if (c->Wph > ((int64_t)1 << 24) || c->Wph > limit) return 0;
    c->Rph = 1;
    c->Ro = 1;
    c->dense = 1;
    for (int ax = 0; ax < L; ax++) {
        int64_t e = p->in[ax] + p->pad[ax], need = (p->out[ax] - 1) * p->stride[ax] + (p->k[ax] - 1) * p->dil[ax] + 1;
        if (need > e) e = need;
        if (p->stride[ax] > IG_MAX_STRIDE) return 0;
        c->oin[ax] = p->in[ax]; c->oout[ax] = p->out[ax];
        c->os[ax] = p->stride[ax]; c->opad[ax] = p->pad[ax];
        c->oext[ax] = (e + p->stride[ax] - 1) / p->stride[ax];
        if (c->oext[ax] > ((int64_t)1 << 24) || c->Rph > limit / c->Wph / c->oext[ax]) return 0;
        c->Rph *= c->oext[ax];
        if (ax > 0 && c->oext[ax] != c->oout[ax]) c->dense = 0;
    }
    for (int64_t ax = L - 1, st = 1; ax >= 0; ax--) {   /* row strides; the rows the outputs span */
        c->rst[ax] = st;
        st *= c->oext[ax];
        c->Ro += (c->oout[ax] - 1) * c->rst[ax];
    }
    int64_t P = c->P;
    /* used phases: the column phases, and the tuples of the outer axes' (the Cartesian
     * product of each axis' used phases, at most IG_MAX_OPH of them, else im2col) */
    int used_w[IG_MAX_STRIDE] = {0}, idx_w[IG_MAX_STRIDE];
    for (int64_t t = 0; t < kw; t++) used_w[(t * dw) % c->sw] = 1;
    for (int f = 0; f < IG_MAX_STRIDE; f++) {
        idx_w[f] = used_w[f] ? c->nfw : -1;
        if (used_w[f]) c->fw[c->nfw++] = f;
    }
    /* per outer axis: idx_o[ax][f] the rank of phase f among the axis' used ones, nused[ax] */
    int idx_o[QL_CONV_MAXD][IG_MAX_STRIDE], nused[QL_CONV_MAXD];
    int64_t fval[QL_CONV_MAXD][IG_MAX_STRIDE];
    c->nfo = 1;
    for (int ax = 0; ax < L; ax++) {
        int used[IG_MAX_STRIDE] = {0};
        for (int64_t t = 0; t < p->k[ax]; t++) used[(t * p->dil[ax]) % c->os[ax]] = 1;
        nused[ax] = 0;
        for (int f = 0; f < IG_MAX_STRIDE; f++) {
            idx_o[ax][f] = used[f] ? nused[ax] : -1;
            if (used[f]) fval[ax][nused[ax]++] = f;
        }
        if (c->nfo * nused[ax] > IG_MAX_OPH) return 0;
        c->nfo *= nused[ax];
    }
    for (int a = 0; a < c->nfo; a++)   /* tuple a: mixed radix over nused, the last axis fastest */
        for (int ax = L - 1, r = a; ax >= 0; ax--) {
            c->fo[a][ax] = fval[ax][r % nused[ax]];
            r /= nused[ax];
        }
    if (ig_shift_pays(c, kern, kw, workspace)) {   /* shifted planes: one per column tap, OW wide */
        c->shift = 1;
        c->Wph = c->OW;
        c->nfw = (int)kw;
        c->sdw = dw;
    }
    /* planes and blocks start on 64-byte lines (16 positions): a tile's operand of one tap
     * is then one aligned line when the tap's offset is (1x1 kernels: every k-group), and
     * the L1 footprint of a tile is not doubled by lines split between k-groups. Rows are
     * interleaved Wr = Wph rounded up to 16 positions at a time (SIMD without tails): the
     * positions past a row's end are the next row's, written after it, or for the plane's
     * last row the plane's own 16-position spare, zeroed after the plane is written. */
    c->Wr = (c->Wph + 15) / 16 * 16;
    c->PL = (c->Rph * c->Wph + 16 + 15) / 16 * 16;
    /* rows that hold the input's rows one after the other, as one run (ig_copy_task): no
     * stride, padding or dropped column along the rows, none along the outer axes but the
     * first (which may have pads: padding rows before and after the run) - a pointwise
     * kernel's whole plane */
    int bulk = c->sw == 1 && c->pw == 0 && c->Wph == c->W && (L == 0 || c->os[0] == 1);
    int64_t inner = 1;
    for (int ax = 1; ax < L; ax++) {
        bulk &= c->os[ax] == 1 && c->opad[ax] == 0 && c->oext[ax] == c->oin[ax];
        inner *= c->oin[ax];
    }
    if (bulk) {
        c->bulk0 = (L ? c->opad[0] : 0) * inner;
        c->bulk1 = c->bulk0 + (L ? c->oin[0] : 1) * inner;
        if (c->bulk1 > c->Rph) c->bulk1 = c->Rph;
    }
    /* ... and an odd number of lines apart (planes of a block, and blocks): a tile reads every
     * block (and its planes) at the same offsets, which at a multiple of 4 KiB apart would all
     * fall in the same sets of the 8-way L1 (4 KiB per way) and evict each other (measured: a
     * 28x28 stride-2 layer with blocks of 4 KiB, 14% slower) */
    if (c->nfo * c->nfw > 1 && c->PL / 16 % 2 == 0) c->PL += 16;
    c->BS = (int64_t)c->nfo * c->nfw * c->PL;
    if (c->BS / 16 % 2 == 0) c->BS += 16;
    c->nblk = (int)((c->Cg + c->kpk - 1) / c->kpk);
    c->Q = (c->Ro - 1) * c->Wph + c->OW;
    c->ntiles = (c->Q + QL_IK_NR - 1) / QL_IK_NR;
    c->tstride = QL_IK_NR;
    /* Row-aligned tiles: on a plane with dropped columns (Wph > OW) and rows of at most 16,
     * a tile may start every r output rows instead of every 16 q, r the most rows whose real
     * columns fit 16 ((r - 1) Wph + OW <= 16); the q between a tile's 16 columns and the next
     * tile's start are dropped columns. Taken when it costs fewer tile-equivalents, a last
     * tile of at most QL_DOT_NR columns counted as half a tile: a 7x7 plane with pads of 1
     * (Wph 9): tiles of rows 0-1, 2-3, 4-5 and 6, the last 7 columns wide (a dot tile),
     * against 16-q tiles whose last has 13 real columns. */
    if (c->Wph > c->OW && c->OW <= QL_IK_NR && kern->conv.dot) {
        int64_t r = (QL_IK_NR - c->OW) / c->Wph + 1, nt = (c->Ro + r - 1) / r;
        int64_t wl = (c->Ro - (nt - 1) * r - 1) * c->Wph + c->OW;
        int64_t wl16 = c->Q - (c->ntiles - 1) * QL_IK_NR;
        int64_t cost = 2 * (nt - 1) + (wl <= QL_DOT_NR ? 1 : 2);
        int64_t cost16 = 2 * (c->ntiles - 1) + (wl16 <= QL_DOT_NR ? 1 : 2);
        if (cost < cost16) {
            c->tstride = r * c->Wph;
            c->ntiles = nt;
        }
    }
    /* computed columns: the Wph - OW dropped positions per row and the last tile's tail,
     * against the im2col path's ceil(P / 16) panels (whose last one is computed whole too):
     * at most a quarter more tiles (a 7x7 plane: 4 tiles, 4 panels; a plane 3 wide with pads
     * of 1, 5 positions a row: too many) */
    if (c->ntiles * 4 > (P + QL_IK_NR - 1) / QL_IK_NR * 5) return 0;
    int Kw = (int)ql_conv_wk(kern, K, c->taps);   /* packed rows: channels padded to nblk * kpk */
    int kp = ql_round_k(kern, Kw);
    c->groups = kp / c->kpk;   /* = nblk * taps in both orders */
    /* tap offsets (positions) within a channel block; the largest read is position
     * (nblk - 1) * BS + max toff + (ntiles - 1) * tstride + 15: the copy is that long (slack
     * zeroed) */
    int64_t toff_max = 0;
    size_t off_bytes = sizeof(ptrdiff_t) * (size_t)c->groups;
    c->off = (ptrdiff_t *)malloc(off_bytes);
    if (!c->off) return -1;
    for (int64_t t = 0; t < c->taps; t++) {
        /* tap t reads, along each axis, phase (k*d) % s from position (k*d) / s on: its outer
         * phase tuple a and row offset, then its column phase (or, shifted, its own plane) */
        int64_t tc[QL_CONV_MAXD], a = 0, rows = 0;
        tap_coords(p, t, tc);
        for (int ax = 0; ax < L; ax++) {
            int64_t rh = tc[ax] * p->dil[ax];
            a = a * nused[ax] + idx_o[ax][rh % c->os[ax]];
            rows += rh / c->os[ax] * c->rst[ax];
        }
        int64_t tw = tc[L], rw = tw * dw;
        int64_t toff = c->shift ? (a * c->nfw + tw) * c->PL + rows * c->Wph
                               : (a * c->nfw + idx_w[rw % c->sw]) * c->PL + rows * c->Wph + rw / c->sw;
        if (toff > toff_max) toff_max = toff;
        /* k-group of block b at tap t in the grouped order (group_of's inverse) */
        for (int64_t b = 0, ch = kchunk_of(kern); b < c->nblk; b++)
            c->off[(b / ch * c->taps + t) * ch + b % ch] = (ptrdiff_t)(4 * (b * c->BS + toff));
    }
    int64_t positions = (int64_t)c->nblk * c->BS,
            reach = (int64_t)(c->nblk - 1) * c->BS + toff_max + (c->ntiles - 1) * c->tstride + QL_IK_NR;
    if (reach > positions) positions = reach;
    *copy_bytes = 4 * (size_t)positions;
    return 1;
}

/* The run's schedule, after the layout: what the workspace allows (the weights packed in the
 * tasks or first, the dot tail, merged tail panels, images per GEMM or images in parallel), the
 * row and K blocks, the epilogue. Returns 1, or 0: not taken (the im2col path). */
static int ig_schedule(ig_ctx *c, ig_sched *s, const ql_conv_wraw *raw, int32_t *fast_bias, size_t copy_bytes,
                       size_t workspace)
{
    const ql_conv_plan *p = c->p;
    const ql_gemm_kernel *kern = c->kern;
    int L = p->nsp - 1;
    int64_t kw = p->k[L], dw = p->dil[L], K = c->Cg * c->taps, P = c->P;
    int Kw = (int)ql_conv_wk(kern, K, c->taps);
    int threads = ql_num_threads();
    /* per thread (ig_copy_task): kpk padded raw rows of RW bytes (a column phase fw < sw reads
     * up to fw + sw * Wr bytes, stride 2's SIMD split too; the valid columns end at pw + W <=
     * sw * Wph), then kpk phase rows of Wr bytes */
    c->RW = (int64_t)align64((size_t)(c->sw * (c->Wr + 1)));
    if (c->shift) {   /* tap e's columns start at e*dw; the valid ones end at pw + W */
        int64_t rw = (kw - 1) * dw + c->sw * (c->Wr + 1);
        c->RW = (int64_t)align64((size_t)(rw > c->pw + c->W ? rw : c->pw + c->W));
    }
    c->scratch_bytes = align64((size_t)c->kpk * (size_t)(c->RW + c->Wr));
    if (c->shift && c->sw == 1) {
        /* the shifted copy's stride 1 (ig_copy_shift_task): the block's raw rows interleaved (or
         * paired) once, (kw - 1) * dw + OW positions rounded up to 16 (the row builders' step),
         * from column 0; tap e's row is then OW positions from position e*dw of it. It reads
         * s1len <= RW raw bytes and writes 4 * s1len bytes after the raw rows. */
        c->s1len = ((kw - 1) * dw + c->OW + 15) / 16 * 16;
        if (c->RW < c->s1len) c->RW = (int64_t)align64((size_t)c->s1len);
        size_t need = align64((size_t)c->kpk * (size_t)c->RW + 4 * (size_t)c->s1len);
        if (need > c->scratch_bytes) c->scratch_bytes = need;
    }
    if (c->shift && c->sw == 2) {
        /* the shifted copy's stride 2 (ig_copy_shift_task): each column phase split for OW
         * positions from the largest tap offset (kw - 1) * dw / 2 on, rounded up to
         * ig_split_s2's step; it reads 2 * s2len raw bytes (kept within RW: the bytes past the
         * valid columns are x's zero point, written once per task) and writes 2 phase rows of
         * 4 * s2len bytes after the raw rows (in place of the phase rows of Wr bytes a channel) */
        int64_t step = IG_S2_STEP(c->kpk);
        c->s2len = (c->OW + (kw - 1) * dw / 2 + step - 1) / step * step;
        if (c->RW < 2 * c->s2len) c->RW = (int64_t)align64((size_t)(2 * c->s2len));
        c->scratch_bytes = align64((size_t)c->kpk * (size_t)c->RW + 8 * (size_t)c->s2len);
    }
    /* a pointwise kernel reads each copied byte once per row tile, like a packed panel: a copy
     * larger than L2 costs a round trip through L3 that the im2col path's per-panel packing
     * (read in place, used at once) does not (measured: 256 channels of 56x56, exact: 1.6 MB,
     * slower; 64 channels or 28x28 planes: faster). The 7-bit path does twice the
     * multiply-adds per copied byte (4 channels in 4 bytes, not 2): there 256 channels of
     * 56x56 (784 KiB) are 10% faster than im2col into 64 outputs, the same into 128-512 */
    size_t pw_max = kern->form == QL_FORM_S8U8 ? IG_PW_COPY_MAX_S8U8 : IG_PW_COPY_MAX;
    /* a plain call's weights (raw) packed in the GEMM tasks: per thread, after its copy rows,
     * room for a row block's packed rows (at most mc of them, as the row blocks below), where
     * the workspace limit allows it with the copy; else packed whole first (below) */
    int in_task = 0;
    /* the S8U8 form too where no weight can be outside its bound (trivial_bound), a row block
     * per task then (c->affine, below): its packed rows, row sums and per-row terms are the
     * task's own, written to its thread's scratch and read there, never to memory another core
     * reads; measured against packing the whole matrix first (2 threads, --no-amx) */
    int s8_in_task = raw && kern->form == QL_FORM_S8U8 && trivial_bound(kern, raw, (int)p->M);
    if (raw && (kern->form == QL_FORM_I16 || s8_in_task)) {
        ptrdiff_t ldl0 = w_row_bytes(kern, Kw);
        int rows0 = ig_block_rows(ldl0, c->mr);
        size_t wscr = align64((size_t)rows0 * (size_t)ldl0 + (s8_in_task ? 2 * sizeof(int32_t) * (size_t)rows0 : 0));
        if (copy_bytes + (c->scratch_bytes + wscr) * (size_t)threads <= workspace) {
            c->wscr_off = c->scratch_bytes;
            c->scratch_bytes += wscr;
            in_task = 1;
        }
    }
    if (copy_bytes > IG_COPY_MAX || (c->taps == 1 && copy_bytes > pw_max) ||
        copy_bytes + c->scratch_bytes * (size_t)threads > workspace) {
        return 0;
    }
    /* the dot tail: a last tile of at most QL_DOT_NR columns (only the last can be: a tile
     * stride below 16 is above 8, see the row-aligned tiles), gathered per image (within the
     * workspace limit with the copy and the scratch; else full tiles) */
    c->wlast = c->Q - (c->ntiles - 1) * c->tstride;
    if (c->wlast > QL_IK_NR) c->wlast = QL_IK_NR;
    size_t xs = (4 * (size_t)c->groups + 31) / 32 * 32, xt_bytes = align64((size_t)c->wlast * xs);
    int use_xt = kern->conv.dot && c->wlast <= QL_DOT_NR &&
                 copy_bytes + c->scratch_bytes * (size_t)threads + xt_bytes <= workspace;
    if (!use_xt) xt_bytes = 0;
    /* merged tail panels: a batch whose last tile has at most QL_DOT_NR columns puts those of
     * tpm = 16 / wlast images side by side into one panel, a full tile for the tile kernels,
     * instead of a dot-kernel tile per image (measured: the 7 columns of a 7x7 plane's last
     * row through the dot kernel cost 1.6 times as much a column as a full tile's, 19% of the
     * time of ResNet-50's 512-channel 3x3 layer at batch 8). Panels fill across chunks (packed
     * from each image's copy, run when complete); a last partial panel of fewer than
     * QL_DOT_NR columns leaves its images (nleft) to the dot kernel. One group (the panels'
     * weights); the runs' pixels, offset by whole images from the panel's first image's
     * output, fit an int. */
    size_t fixed = c->scratch_bytes * (size_t)threads, tp_bytes = 64 * (size_t)c->groups;
    int64_t tpm = 0, nleft = 0;
    if (p->N > 1 && p->group == 1 && c->wlast <= QL_DOT_NR) {
        tpm = QL_IK_NR / c->wlast;
        int64_t rem = p->N % tpm;
        nleft = use_xt && rem && rem * c->wlast < QL_DOT_NR ? rem : 0;
        fixed += (size_t)nleft * xt_bytes + 2 * tp_bytes;
        if ((double)tpm * (double)p->M * (double)P > (double)INT_MAX ||
            fixed + copy_bytes + (tp_bytes + (size_t)tpm - 1) / (size_t)tpm > workspace) {
            tpm = nleft = 0;
            fixed = c->scratch_bytes * (size_t)threads;
        }
    }
    /* images per GEMM (ig_batch_images): their copies side by side, and their dot columns or
     * their share of the panels (the ring of panels: at most (chunk - 1) / tpm + 2 at a time),
     * within the workspace limit with the scratch */
    c->cstride = align64(copy_bytes);
    size_t per = c->cstride + (tpm ? (tp_bytes + (size_t)tpm - 1) / (size_t)tpm : xt_bytes);
    int64_t nimg = ig_batch_images(p->N, per, workspace - fixed);
    size_t region = (size_t)(nimg - 1) * c->cstride + copy_bytes;   /* one image: copy_bytes, as ever */
    /* Images in parallel: a batch of at least one image per thread runs each image whole on
     * one thread (ig_chunk_task: its copy into that thread's own region, its GEMM over its
     * tiles row block by row block), the images claimed in turn, instead of one chunk after
     * another with every thread on each (one region for the whole batch, then one for the
     * merged tail panels, against two to four per chunk: each a join where the threads wait
     * for the slower one). Measured on the ResNet-50 batch-8 layers, 2 threads: faster on
     * every layer (docs/benchmarks.md, "Batch-8 ResNet-50 layers on 2 threads: images in
     * parallel"). One
     * image a task, not the chunks of ig_batch_images: chunks of 2-4 images (their copies
     * side by side, each weight block used on all of them) were 5-17% slower than the
     * chunk-after-chunk schedule on the 7x7 and 14x14 layers with 2-4 MiB of weights - a
     * task of several images is too coarse to even out two threads that do not run at the
     * same speed (measured: one 50% slower for a whole call on the shared machine), and the
     * copies of two images with a block of weights overflow L2. Taken with one group (the
     * panels' weights), where the batch's MACs would use the threads at all (ql_gemm's 2^21),
     * with the batch a multiple of the threads or at least 4 images a thread (3 images on 2
     * threads: 2 and 1), and within the workspace limit: a copy per thread and the panels of
     * the whole batch (they fill across the threads' images). */
    int64_t pk = 0, npanels = 0;
    size_t pregion = 0;
    if (threads > 1 && p->group == 1 && p->N >= threads && (p->N % threads == 0 || p->N >= 4 * (int64_t)threads) &&
        (!use_xt || tpm) && (double)p->M * (double)P * (double)K * (double)p->N >= (double)(1 << 21)) {
        pk = 1;
        pregion = c->cstride;   /* align64(copy_bytes) */
        npanels = tpm ? (p->N + tpm - 1) / tpm : 0;
        /* the scratch and the leftover dot columns are in `fixed` (which holds within the
         * limit); the ring of two panels is not needed */
        size_t base = c->scratch_bytes * (size_t)threads + (tpm ? (size_t)nleft * xt_bytes : 0);
        size_t avail = workspace - base;
        if (pregion > avail / (size_t)threads) {
            pk = 0;
        } else {
            avail -= pregion * (size_t)threads;
            if (tpm && (size_t)npanels > avail / tp_bytes) pk = 0;
        }
        if (pk) {
            nimg = 1;
            region = pregion * (size_t)threads;
        }
    }
    /* images in parallel run every row block once per image: a plain call's weights are then
     * packed whole first, as they are when the scratch did not fit; the S8U8 form's (a bound
     * to prove, row sums for fast_bias) in the first copy job where there is one (below) */
    int pack_in_copy = 0;
    if (raw && (!in_task || pk)) {
        if (in_task) c->scratch_bytes = c->wscr_off;
        in_task = 0;
        s8_in_task = 0;
        if (kern->form == QL_FORM_S8U8 && !pk) {
            pack_in_copy = 1;
        } else {
            s->pack_first = 1;   /* ig_run packs them */
        }
    }
    if (in_task) {
        c->wr0 = c->wr = (const uint8_t *)raw->w;
        c->wzp0 = c->wzp = raw->wzp;
        c->w_type = raw->w_type;
        c->Kraw = (int)K;
        c->wgrouped = ql_conv_grouped(kern, K, c->taps);
        if (s8_in_task) {
            c->affine = 1;
            c->fb_all = fast_bias;
            c->zxu = zx_u8form(p);
        }
        __atomic_add_fetch(&ql_ig_calls[7], 1, __ATOMIC_RELAXED);
    }
    c->flip = p->x_type == QL_I8 ? 0x80 : 0;
    c->Mg = (int)(p->M / p->group);
    ptrdiff_t ldl = w_row_bytes(kern, Kw);
    c->ldl = ldl;
    /* threads: none for small convolutions (as ql_gemm: 2^21 MACs, an image's or a chunk's);
     * row blocks of at most 256 KiB of packed weights (L2); enough tasks for every thread */
    double macs = (double)c->Mg * (double)P * (double)K;
    int mc = ig_block_rows(ldl, c->mr);
    c->mgroups = (c->Mg + c->mr - 1) / c->mr;
    c->row_blocks = (c->mgroups + mc / c->mr - 1) / (mc / c->mr);
    if (c->affine && threads > 1) {   /* one task per row block: as many as the threads, or a multiple */
        int rb = (c->row_blocks + threads - 1) / threads * threads;
        c->row_blocks = rb < c->mgroups ? rb : c->mgroups;
    }
    c->mc = (c->mgroups + c->row_blocks - 1) / c->row_blocks * c->mr;   /* the largest block */
    /* K blocks (past IG_KBLOCK_GROUPS): IG_KC_BYTES of a tile's operand (64 bytes per k-group) */
    c->kgroups = IG_KC_BYTES / 64;
    if (c->groups > IG_KBLOCK_GROUPS) {
        int nkb = (c->groups + c->kgroups - 1) / c->kgroups;   /* equal blocks (of whole chunks) */
        int ch = (int)kchunk_of(kern);
        c->kgroups = ((c->groups + nkb - 1) / nkb + ch - 1) / ch * ch;
        c->cblock_bytes = align64(sizeof(int32_t) * QL_IK_NR * (size_t)c->mc);
    } else {
        c->kgroups = c->groups;
    }
    /* the fused epilogue: the whole K at once, the level's own epilogue (which ikernel_ep
     * reproduces), no U8S8 corrections (these forms have none), per-row multipliers */
    int fused = c->kgroups >= c->groups && kern->conv.ikernel_ep != NULL;
    size_t esize = p->quantized ? 1 : 4;
    c->xstride = (size_t)(p->C * c->plane);
    c->ostride = (size_t)(p->M * P) * esize;
    c->img_pix = (ptrdiff_t)(p->M * P);
    s->threads = threads; s->copy_bytes = copy_bytes; s->use_xt = use_xt; s->tpm = tpm; s->nleft = nleft;
    s->nimg = nimg; s->region = region; s->pk = pk; s->pregion = pregion; s->pack_in_copy = pack_in_copy;
    s->xs = xs; s->xt_bytes = xt_bytes; s->tp_bytes = tp_bytes; s->npanels = npanels;
    s->macs = macs; s->fused = fused;
    return 1;
}

/* The run's memory: the copies (in the scratch kept between calls), the per-thread scratch, the
 * K blocks' C tiles, the dot columns, the tail panels. 0, or -1: out of memory (ig_release frees
 * what was taken). */
static int ig_buffers(ig_ctx *c, ig_sched *s)
{
    /* the copies in the scratch kept between calls (ql_conv_scratch_get: a fresh block of this size
     * costs page faults on every call, measured 0.2 ms on a 56x56 layer), on a 64-byte line */
    s->copy_mem = ql_conv_scratch_get(s->region + 64, &s->copy_cached);
    c->copy = line_up(s->copy_mem);
    c->scratch_mem = (char *)malloc(c->scratch_bytes * (size_t)s->threads + 64);
    c->scratch = line_up(c->scratch_mem);
    if (!c->copy || !c->scratch) return -1;
    /* the slack past the planes is read only for dropped columns; zeroed so every read is of
     * defined bytes (any value is harmless: columns are independent); the copy tasks never
     * write it, so once for every image's copy */
    for (int64_t r = 0; r < (s->pk ? s->threads : 1); r++)
        for (int64_t j = 0; j < s->nimg; j++)
            memset(c->copy + (size_t)r * s->pregion + (size_t)j * c->cstride + 4 * (size_t)(c->nblk * c->BS), 0,
                   s->copy_bytes - 4 * (size_t)(c->nblk * c->BS));
    if (c->cblock_bytes) {   /* K blocks (ig_schedule): a C tile block per thread */
        c->cblock_mem = (char *)malloc(c->cblock_bytes * (size_t)s->threads + 64);
        c->cblock = line_up(c->cblock_mem);
        if (!c->cblock) return -1;
    }
    if (s->use_xt) {
        c->xs = (ptrdiff_t)s->xs;
        c->xt_bytes = s->xt_bytes;
        c->xt = (char *)malloc((size_t)(s->tpm ? s->nleft : s->nimg) * c->xt_bytes + 64);
        if (!c->xt) return -1;
    }
    if (s->tpm) {
        c->tpm = s->tpm;
        c->tp_bytes = s->tp_bytes;
        c->nbuf = s->pk ? s->npanels : (s->nimg - 1) / s->tpm + 2;   /* images in parallel: every panel at once */
        s->tp_mem = (char *)malloc((size_t)c->nbuf * s->tp_bytes + 64);
        c->offp = (ptrdiff_t *)malloc(sizeof(ptrdiff_t) * (size_t)c->groups);
        if (!s->tp_mem || !c->offp) return -1;
        c->tp = line_up(s->tp_mem);
        memset(c->tp, 0, (size_t)c->nbuf * s->tp_bytes);   /* a partial panel's unused columns: defined bytes */
        for (int g = 0; g < c->groups; g++) c->offp[g] = 64 * (ptrdiff_t)g;
    }
    return 0;
}

/* Everything ig_layout and ig_buffers took (what they did not take is NULL) */
static void ig_release(ig_ctx *c, ig_sched *s)
{
    if (s->copy_mem) ql_conv_scratch_put(s->copy_mem, s->copy_cached);
    free(c->scratch_mem);
    free(c->off);
    free(c->cblock_mem);
    free(c->xt);
    free(s->tp_mem);
    free(c->offp);
}

/* Whether the chunk's copy runs inside its GEMM tasks (ig_fused_copy), each task copying the
 * columns of its own tiles: one image of one group, a pointwise plane copied as one run (no
 * padding, stride or dropped column: position q is pixel q, ig_layout's bulk rows covering
 * every row), whole channel blocks, 16-column tiles, no merged tails, and one row block, so
 * that no two tasks share a tile (each column is copied once, by the task that reads it). The
 * copy job and its join go, and each thread's copy lands in its own cache, ahead of its tiles
 * (a weights-packing copy job, pack_in_copy, keeps its job). */
static int ig_fuses(const ig_ctx *c, const ig_sched *s, int pack_in_copy)
{
    const ql_conv_plan *p = c->p;
    return __atomic_load_n(&ql_ig_fuse_copy, __ATOMIC_RELAXED) && c->nimg == 1 && p->group == 1 && !s->tpm &&
           !pack_in_copy && c->row_blocks == 1 && c->taps == 1 && !c->shift && c->nfo * c->nfw == 1 &&
           c->bulk0 == 0 && c->bulk1 == c->Rph && c->Rph * c->Wph == c->plane && c->Q == c->plane &&
           c->tstride == QL_IK_NR && c->Cg % c->kpk == 0;
}

/* Runs the schedule: the copies, the gathered or merged tails and the GEMM tasks, images in
 * parallel or chunk after chunk. 1, or -4: a weight outside the S8U8 form's bound (found while
 * packing in the first copy job; nothing written to y). */
static int ig_execute(ig_ctx *c, const ig_sched *s, const ql_conv_wraw *raw, void *wpacked, int32_t *fast_bias)
{
    const ql_conv_plan *p = c->p;
    const ql_gemm_kernel *kern = c->kern;
    const int threads = s->threads, fused = s->fused;
    const int64_t K = c->Cg * c->taps, tpm = s->tpm, nleft = s->nleft, pk = s->pk, nimg = s->nimg;
    const size_t pregion = s->pregion;
    const double macs = s->macs;
    const ptrdiff_t ldl = c->ldl;
    int pack_in_copy = s->pack_in_copy;
    packw_ctx wjob;
    if (pk) {
        /* images in parallel (above): one region for every image, then the merged tail panels
         * (and a last partial panel's images on the dot kernel) with the threads sharing them */
        ig_group(c, 0, 0, wpacked, fast_bias, fused);
        c->nimg = pk;
        c->nbatch = p->N;
        c->pregion = pregion;
        ql_parallel_for((ptrdiff_t)((p->N + pk - 1) / pk), threads, ig_chunk_task, c);
        __atomic_add_fetch(&ql_ig_calls[6], 1, __ATOMIC_RELAXED);
        if (tpm) {
            c->nimg = 0;
            c->n0 = p->N;
            c->u_run0 = 0;
            c->u_run1 = p->N / tpm + (p->N % tpm && !nleft);
            c->nleft = nleft;
            c->left_j0 = p->N - nleft;
            int run_threads = (double)c->Mg * (double)K * (double)(16 * (c->u_run1 - c->u_run0) + nleft * c->wlast) <
                              (double)(1 << 21) ? 1 : threads;
            if (c->nleft) ql_parallel_for((ptrdiff_t)c->nleft, run_threads, ig_left_task, c);
            ig_tile_blocks(c, run_threads);
            ql_parallel_for((ptrdiff_t)(c->row_blocks * c->tile_blocks), run_threads, ig_gemm_task, c);
        }
    }
    int64_t u_done = 0;   /* panels run so far */
    int result = 1;
    for (int64_t n0 = 0; n0 < p->N && !pk && result == 1; n0 += nimg) {
        c->nimg = p->N - n0 < nimg ? p->N - n0 : nimg;
        c->n0 = n0;
        if (tpm) {
            /* the panels this chunk completes; the last chunk: also a last partial panel, or
             * the dot kernel for its images */
            int64_t end = n0 + c->nimg;
            c->u_run0 = u_done;
            c->u_run1 = end / tpm;
            if (end == p->N && p->N % tpm) {
                if (nleft) { c->nleft = nleft; c->left_j0 = p->N - nleft; }
                else c->u_run1++;
            }
            u_done = c->u_run1;
        }
        int run_threads = macs * (double)c->nimg < (double)(1 << 21) ? 1 : threads;
        ig_tile_blocks(c, run_threads);
        if (c->affine && c->tile_blocks > 1) c->tile_blocks = 1;   /* each row block packed once */
        c->fuse_copy = ig_fuses(c, s, pack_in_copy);
        for (int64_t g = 0; g < p->group; g++) {
            ig_group(c, g, n0, wpacked, fast_bias, fused);
            if (c->fuse_copy) {   /* the copy and the gathered tail inside the GEMM tasks */
                ql_parallel_for((ptrdiff_t)(c->row_blocks * c->tile_blocks), run_threads, ig_gemm_task, c);
                __atomic_add_fetch(&ql_ig_calls[9], 1, __ATOMIC_RELAXED);
                continue;
            }
            /* one image: a task per block, as ever; a chunk: about 16 tasks per thread */
            ptrdiff_t ncopy = (ptrdiff_t)(c->nimg * c->nblk);
            c->cpt = c->nimg > 1 ? (ncopy + 16 * run_threads - 1) / (16 * run_threads) : 1;
            ncopy = (ncopy + c->cpt - 1) / c->cpt;
            if (pack_in_copy) {
                /* every group's rows (the first group's job), then the per-row terms: the
                 * GEMM tasks below are the first to read either */
                c->npack = packw_setup(&wjob, kern, raw->w, raw->w_type, (int)p->M, (int)K, c->taps, raw->wzp, wpacked,
                                      run_threads);
                c->wjob = &wjob;
                ptrdiff_t n = c->npack + ncopy;
                ql_parallel_for(n, n > 1 ? run_threads : 1, ig_copy_pack_task, c);
                c->npack = 0;
                c->wjob = NULL;
                pack_in_copy = 0;
                if (atomic_load(&wjob.outside)) {
                    result = -4;   /* a weight outside the bound: nothing written to y yet */
                    break;
                }
                __atomic_add_fetch(&ql_ig_calls[8], 1, __ATOMIC_RELAXED);
                fast_bias_fill(p, wpacked, ldl, fast_bias);
            } else {
                ql_parallel_for(ncopy, ncopy > 1 ? run_threads : 1, ig_copy_chunk_task, c);
            }
            /* the narrow last tile's columns, gathered once per image for every task */
            if (tpm) {   /* the chunk's last tiles into their panels (those it touches) */
                ql_parallel_for((ptrdiff_t)((n0 + c->nimg - 1) / tpm - n0 / tpm + 1), run_threads, ig_tail_task, c);
                if (c->nleft) ql_parallel_for((ptrdiff_t)c->nleft, run_threads, ig_left_task, c);
            } else if (c->xt) {
                ql_parallel_for((ptrdiff_t)c->nimg, run_threads, ig_gather_task, c);
            }
            ql_parallel_for((ptrdiff_t)(c->row_blocks * c->tile_blocks), run_threads, ig_gemm_task, c);
        }
        if (c->nimg > 1 && result == 1) {
            __atomic_add_fetch(&ql_ig_calls[2], 1, __ATOMIC_RELAXED);
            __atomic_add_fetch(&ql_ig_calls[3], c->nimg, __ATOMIC_RELAXED);
        }
    }
    if (c->shift && result == 1) __atomic_add_fetch(&ql_ig_calls[5], 1, __ATOMIC_RELAXED);
    return result;
}

/* Runs the convolution on the implicit path when it applies: returns 1 (done), 0 (not taken:
 * the caller runs the im2col path), -1 (out of memory) or -4 (a weight outside the S8U8 form's
 * bound, the only form with one). fast_bias: the S8U8 per-row term. The plan is built first
 * (ig_layout, ig_schedule), then the memory taken (ig_buffers) and the plan run (ig_execute). */
int ig_run(const ql_conv_plan *p, const ql_isa *isa, const ql_gemm_kernel *kern, void *wpacked,
                  const ql_conv_wraw *raw, int32_t *fast_bias, size_t workspace)
{
    ig_ctx c;
    ig_sched s;
    memset(&c, 0, sizeof c);
    memset(&s, 0, sizeof s);
    size_t copy_bytes = 0;
    int r = ig_layout(&c, p, isa, kern, workspace, &copy_bytes);
    if (r == 1) r = ig_schedule(&c, &s, raw, fast_bias, copy_bytes, workspace);
    if (r == 1 && s.pack_first) {
        /* a plain call's weights whole, before the copies (ig_schedule says when) */
        int64_t K = c.Cg * c.taps;
        if (pack_w_threads(kern, raw->w, raw->w_type, (int)p->M, (int)K, c.taps, raw->wzp, wpacked, s.threads) != 0)
            r = -4;
        else if (fast_bias)
            fast_bias_fill(p, wpacked, w_row_bytes(kern, (int)ql_conv_wk(kern, K, c.taps)), fast_bias);
    }
    if (r == 1 && ig_buffers(&c, &s) != 0) r = -1;
    if (r == 1) r = ig_execute(&c, &s, raw, wpacked, fast_bias);
    ig_release(&c, &s);
    return r;
}
