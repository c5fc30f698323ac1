/* The implicit GEMM's tasks: the padded copies of the input in the kernel's operand form, the
 * tiles (weights packed in the task for a plain call), the gathered dot tails and merged tail
 * panels, and the images-in-parallel chunk task. implicit_plan.c (ig_run) chooses them. */
#include "implicit.h"

/* Rows of a phase plane, whatever the rank: row r's outer coordinates i[] (the phase grid's,
 * last outer axis fastest), the next row's (an odometer: the copy tasks walk every row in
 * order), and the input row it holds in outer phase tuple a (the outer axes of x flattened) or
 * -1 where a coordinate falls in the padding; and the output row of a row r < Ro, -1 for a
 * dropped row (some outer coordinate at or past out[]: only from the 3rd axis on). */
static void ig_row_coords(const ig_ctx *c, int64_t r, int64_t *i)
{
    for (int ax = c->nout - 1; ax >= 0; ax--) {
        i[ax] = r % c->oext[ax];
        r /= c->oext[ax];
    }
}

static inline void ig_row_next(const ig_ctx *c, int64_t *i)
{
    for (int ax = c->nout - 1; ax >= 0; ax--) {
        if (++i[ax] < c->oext[ax]) return;
        i[ax] = 0;
    }
}

static inline int64_t ig_in_row(const ig_ctx *c, int a, const int64_t *i)
{
    int64_t row = 0;
    for (int ax = 0; ax < c->nout; ax++) {
        int64_t x = c->fo[a][ax] + c->os[ax] * i[ax] - c->opad[ax];
        if (x < 0 || x >= c->oin[ax]) return -1;
        row = row * c->oin[ax] + x;
    }
    return row;
}

static int64_t ig_out_row(const ig_ctx *c, int64_t r)
{
    int64_t orow = 0, scale = 1;
    for (int ax = c->nout - 1; ax >= 0; ax--) {
        int64_t o = r % c->oext[ax];
        if (o >= c->oout[ax]) return -1;
        orow += o * scale;
        scale *= c->oout[ax];
        r /= c->oext[ax];
    }
    return orow;
}


/* dst[j] = r[j * step] for j < len (a column phase of a padded raw row): reads r[0, step * len)
 * (len a multiple of 16 for the SIMD step; ig_run sizes the raw rows for fw + sw * Wr bytes) */
static void split_phase(const uint8_t *r, int64_t step, uint8_t *dst, int64_t len)
{
    int64_t j = 0;
    if (step == 2) j = ql_vec_even_bytes(r, 0, 0, len, 2 * len, dst);   /* the vector loop first */
    for (; j < len; j++) dst[j] = r[j * step];
}

/* Stride 2, both column phases, the exact form (I16) at once: from the padded raw rows a and b
 * of a channel pair, position j of phase 0 (raw column 2j) and of phase 1 (2j + 1) as centered
 * int16 pairs (a - zx, b - zx) into d0 and d1, j < len (a multiple of 16; reads a[0, 2 len)).
 * One pass where split_phase then pair_i16 per phase make three: each 16-bit lane of a load
 * holds one even byte (low) and one odd byte (high), widened by mask / shift in place. The
 * values are those pair_i16 writes (x - zx of an 8-bit x and zx: within int16). */
static void pair_i16_s2(const uint8_t *a, const uint8_t *b, int type, int32_t zx, int16_t *d0, int16_t *d1,
                        int64_t len)
{
    int64_t j = ql_vec_pair_i16_s2(a, b, type, zx, d0, d1, len);   /* the vector loop first */
    for (; j < len; j++) {
        d0[2 * j] = (int16_t)(load8(a + 2 * j, type) - zx);
        d0[2 * j + 1] = (int16_t)(load8(b + 2 * j, type) - zx);
        d1[2 * j] = (int16_t)(load8(a + 2 * j + 1, type) - zx);
        d1[2 * j + 1] = (int16_t)(load8(b + 2 * j + 1, type) - zx);
    }
}

/* One row of a copy plane from the block's kpk padded raw rows: every sw-th byte from column
 * col0 (split into the phase rows prow where sw > 1), paired (exact form) or interleaved
 * (byte forms) into Wr positions at drow. */
static void ig_phase_row(const ig_ctx *c, const uint8_t *raw, uint8_t *prow, int64_t col0, char *drow)
{
    const uint8_t *rows[4];
    for (int q = 0; q < c->kpk; q++) {
        const uint8_t *r = raw + (size_t)q * (size_t)c->RW + col0;
        if (c->sw == 1) {
            rows[q] = r;
        } else {
            uint8_t *d = prow + (size_t)q * (size_t)c->Wr;
            split_phase(r, c->sw, d, c->Wr);
            rows[q] = d;
        }
    }
    if (c->kpk == 2) pair_i16(rows[0], rows[1], c->p->x_type, c->p->x_zp, (int16_t *)drow, (int)c->Wr);
    else interleave4(c->kern, rows, c->flip, (uint8_t *)drow, (int)c->Wr);
}

/* Stride 2, both column phases of a channel block at once, in the kernel's operand form (the
 * one primitive of the stride-2 copies, ig_copy_task's and ig_copy_shift_task's): from the
 * block's kpk padded raw rows raw + q * RW (already at the first column), position j of phase
 * 0 (raw column 2j) to d0 and of phase 1 (2j + 1) to d1, j < len, 4 bytes a position; reads
 * raw[q * RW, q * RW + 2 len). The form decides only how: the exact form's int16 pairs
 * (pair_i16_s2: the vector loop, then the portable one); the 7-bit form's 4 channels' bytes ^ flip side by side
 * (the kernel's ig_s2x4, AVX2's on every level with an S8U8 kernel; the portable loop for a
 * byte form elsewhere, the values interleave4 writes of split_phase's rows). len must be a
 * multiple of IG_S2_STEP(kpk), the SIMD step (ig_run rounds the lengths up to it). Measured
 * on ResNet-50's 3x3 stride-2 layers: one pass where a split per phase then a pairing or an
 * interleave make three or four (the 7-bit copy was 9% of the time). Inlined: called once per
 * copied row (as a call, the 7-bit 14x14-output layer's copy was 4% dearer). */

static inline __attribute__((always_inline)) void
ig_split_s2(const ig_ctx *c, const uint8_t *raw, char *d0, char *d1, int64_t len)
{
    if (c->kpk == 2) {
        pair_i16_s2(raw, raw + c->RW, c->p->x_type, c->p->x_zp, (int16_t *)d0, (int16_t *)d1, len);
        return;
    }
    if (c->kern->form == QL_FORM_S8U8 && c->kern->conv.ig_s2x4) {   /* the level's (its kernel table) */
        c->kern->conv.ig_s2x4(raw, (ptrdiff_t)c->RW, c->flip, (uint8_t *)d0, (uint8_t *)d1, len);
        return;
    }
    for (int64_t j = 0; j < len; j++)
        for (int q = 0; q < 4; q++) {
            const uint8_t *r = raw + (size_t)q * (size_t)c->RW + 2 * j;
            ((uint8_t *)d0)[4 * j + q] = (uint8_t)(r[0] ^ c->flip);
            ((uint8_t *)d1)[4 * j + q] = (uint8_t)(r[1] ^ c->flip);
        }
}

static void ig_copy_count(long long split, long long taps)
{
    if (split) __atomic_add_fetch(&ql_ig_copy_rows[0], split, __ATOMIC_RELAXED);
    if (taps) __atomic_add_fetch(&ql_ig_copy_rows[1], taps, __ATOMIC_RELAXED);
}

/* Copy task: channel block b, every used phase, every row.
 * Each input row of the block's kpk channels is copied once into a padded raw row (the padded
 * row's columns u = x's column u - pw; the padding columns hold x's zero point, written once per
 * task: only the valid span is overwritten row after row), split into the used column phases
 * (none to split for stride 1; 16 positions a step for stride 2) and interleaved into each
 * phase plane's row (stride 2 with both phases: both split in one pass straight into their
 * planes' rows, ig_split_s2, Wr positions each: reads 2 Wr <= RW raw bytes). Rows entirely in
 * the padding are the form's zero written directly. */
void ig_copy_task(void *vctx, ptrdiff_t b, int thread)
{
    const ig_ctx *c = (const ig_ctx *)vctx;
    const ql_conv_plan *p = c->p;
    uint8_t *raw = (uint8_t *)c->scratch + (size_t)thread * c->scratch_bytes;
    uint8_t padv = (uint8_t)p->x_zp;   /* raw byte of x's zero point (its own type) */
    /* the form's value of a padding position, as a byte filling all 4 of its bytes: I16 0
     * (x - zx centered), S8U8 the zero point's u8-form byte */
    uint8_t zbyte = c->kpk == 2 ? 0 : (uint8_t)(padv ^ c->flip);
    const uint8_t *rows[4];
    int64_t plane = c->plane;
    /* rows [bulk0, bulk1) hold the input's rows one after the other with no padding, stride
     * or dropped column between them (ig_run: a pointwise kernel, say): one run, interleaved
     * straight from x in multiples of 16 positions (the rest through a raw row). Padding rows
     * above are written before the run, those below after it (each one's spill lands in rows
     * written later). */
    int64_t bulk0 = 0, bulk1 = 0;
    long long n_split = 0;   /* rows through ig_split_s2 (ig_copy_count) */
    if (((int64_t)b + 1) * c->kpk <= c->Cg) {
        bulk0 = c->bulk0;
        bulk1 = c->bulk1;
    }
    /* scratch: kpk padded raw rows of RW bytes, then kpk x nfw phase rows of Wr bytes */
    uint8_t *prow = raw + (size_t)c->kpk * (size_t)c->RW;
    for (int q = 0; q < c->kpk; q++) memset(raw + (size_t)q * (size_t)c->RW, padv, (size_t)c->RW);
    for (int a = 0; a < c->nfo; a++) {
        int64_t ix[QL_CONV_MAXD];   /* row i's outer coordinates */
        ig_row_coords(c, 0, ix);
        for (int64_t i = 0; i < c->Rph; i++, ig_row_next(c, ix)) {
            if (i == bulk0 && bulk1 > bulk0) {
                int64_t n = (bulk1 - bulk0) * c->W, n16 = n / 16 * 16;
                char *d0 = c->copy + 4 * (size_t)(b * c->BS + bulk0 * c->Wph);
                for (int q = 0; q < c->kpk; q++) rows[q] = c->xg + ((int64_t)b * c->kpk + q) * plane;
                if (n16 > 0) {
                    if (c->kpk == 2) pair_i16(rows[0], rows[1], p->x_type, p->x_zp, (int16_t *)d0, (int)n16);
                    else interleave4(c->kern, rows, c->flip, (uint8_t *)d0, (int)n16);
                }
                if (n > n16) {
                    for (int q = 0; q < c->kpk; q++) {
                        uint8_t *d = prow + (size_t)q * (size_t)c->Wr;
                        /* the run's last n - n16 (< 16) positions, then padding to 16 */
                        memcpy(d, rows[q] + n16, (size_t)(n - n16));
                        memset(d + (n - n16), padv, (size_t)(16 - (n - n16)));
                        rows[q] = d;
                    }
                    char *d1 = d0 + 4 * (size_t)n16;
                    if (c->kpk == 2) pair_i16(rows[0], rows[1], p->x_type, p->x_zp, (int16_t *)d1, 16);
                    else interleave4(c->kern, rows, c->flip, (uint8_t *)d1, 16);
                }
                i = bulk1 - 1;
                ig_row_coords(c, i, ix);
                continue;
            }
            int64_t ih = ig_in_row(c, a, ix);
            if (ih < 0) {
                for (int e = 0; e < c->nfw; e++)
                    memset(c->copy + 4 * (size_t)(b * c->BS + (a * c->nfw + e) * c->PL + i * c->Wph), zbyte,
                           4 * (size_t)c->Wr);
                continue;
            }
            /* channels past Cg (the last block of a 1x1 kernel) keep their all-padding rows */
            for (int q = 0; q < c->kpk; q++) {
                int64_t ch = (int64_t)b * c->kpk + q;
                if (ch < c->Cg) ql_vec_copy_row(raw + (size_t)q * (size_t)c->RW + c->pw, c->xg + ch * plane + ih * c->W, c->W);
            }
            if (c->sw == 2 && c->nfw == 2) {   /* phases 0 and 1: planes a*2, a*2 + 1 */
                char *d0 = c->copy + 4 * (size_t)(b * c->BS + 2 * a * c->PL + i * c->Wph);
                ig_split_s2(c, raw, d0, d0 + 4 * (size_t)c->PL, c->Wr);
                n_split++;
                continue;
            }
            for (int e = 0; e < c->nfw; e++)
                ig_phase_row(c, raw, prow, c->fw[e],
                             c->copy + 4 * (size_t)(b * c->BS + (a * c->nfw + e) * c->PL + i * c->Wph));
        }
    }
    /* each plane's spare (written past its last row, never read for a kept column) */
    for (int a = 0; a < c->nfo; a++)
        for (int e = 0; e < c->nfw; e++) {
            char *dplane = c->copy + 4 * (size_t)(b * c->BS + (a * c->nfw + e) * c->PL);
            memset(dplane + 4 * (size_t)(c->Rph * c->Wph), 0, 4 * (size_t)(c->PL - c->Rph * c->Wph));
        }
    ig_copy_count(n_split, 0);
}

/* Copy task of the shifted planes (c->shift): channel block b. Plane (a, e) of a block holds
 * outer phase tuple fo[a] and column tap e: position (i, j) = padded input (fo[a] + os*i,
 * sw*j + e*dw) (i: the row's outer coordinates), j < OW, rows OW positions apart (no dropped
 * columns). Each input row of the block's kpk
 * channels is copied once into a padded raw row (as ig_copy_task), then each tap's columns
 * (every sw-th from column e*dw) are interleaved into its plane's row, Wr = OW rounded up to
 * 16 positions at a time: the spill past a row's end is the next row's start, written after
 * it, or the plane's spare. Stride 2: see below. */
void ig_copy_shift_task(void *vctx, ptrdiff_t b, int thread)
{
    const ig_ctx *c = (const ig_ctx *)vctx;
    const ql_conv_plan *p = c->p;
    uint8_t *raw = (uint8_t *)c->scratch + (size_t)thread * c->scratch_bytes;
    uint8_t padv = (uint8_t)p->x_zp;
    uint8_t zbyte = c->kpk == 2 ? 0 : (uint8_t)(padv ^ c->flip);   /* as ig_copy_task */
    int64_t plane = c->plane;
    uint8_t *prow = raw + (size_t)c->kpk * (size_t)c->RW;
    long long n_split = 0, n_taps = 0;   /* ig_copy_count */
    for (int q = 0; q < c->kpk; q++) memset(raw + (size_t)q * (size_t)c->RW, padv, (size_t)c->RW);
    for (int a = 0; a < c->nfo; a++) {
        int64_t ix[QL_CONV_MAXD];   /* row i's outer coordinates */
        ig_row_coords(c, 0, ix);
        for (int64_t i = 0; i < c->Rph; i++, ig_row_next(c, ix)) {
            int64_t ih = ig_in_row(c, a, ix);
            /* row i of plane (a, 0); plane (a, e) is e planes further */
            char *d0 = c->copy + 4 * (size_t)(b * c->BS + (int64_t)a * c->nfw * c->PL + i * c->Wph);
            if (ih < 0) {
                for (int e = 0; e < c->nfw; e++) memset(d0 + 4 * (size_t)(e * c->PL), zbyte, 4 * (size_t)c->Wr);
                continue;
            }
            for (int q = 0; q < c->kpk; q++) {
                int64_t ch = (int64_t)b * c->kpk + q;
                if (ch < c->Cg) ql_vec_copy_row(raw + (size_t)q * (size_t)c->RW + c->pw, c->xg + ch * plane + ih * c->W, c->W);
            }
            if (c->sw == 2) {
                /* stride 2, any form: both column phases of the row split once (ig_split_s2,
                 * s2len positions each), then tap e's row is phase (e*dw) % 2 from position
                 * (e*dw) / 2 on, OW positions (a 3-wide kernel's taps 0 and 2 share phase 0,
                 * one position apart): one pass over the raw rows, not a split per tap. Bounds
                 * (ig_run): the phase rows hold s2len >= (kw-1)*dw / 2 + OW positions, so every
                 * tap's OW are in them; the split reads 2 s2len <= RW raw bytes. A phase row is
                 * the row of the tap that starts it (column 0: tap 0; column 1: tap 1 at
                 * dilation 1), which then needs no copy, where its s2len positions end within
                 * the plane (i*OW + s2len <= PL: past the row's OW they are later rows' and the
                 * spare's, written after it); else (a last row) the scratch after the raw rows.
                 * The other taps copy their OW positions (the plane's row; the rest of Wr would
                 * be later rows' or the spare's) from it. */
                int own = i * c->Wph + c->s2len <= c->PL;
                char *ph[2];
                ph[0] = own ? d0 : (char *)prow;
                ph[1] = own && c->sdw == 1 ? d0 + 4 * (size_t)c->PL : (char *)prow + 4 * (size_t)c->s2len;
                ig_split_s2(c, raw, ph[0], ph[1], c->s2len);
                n_split++;
                for (int e = 0; e < c->nfw; e++) {
                    int64_t col = e * c->sdw;
                    char *de = d0 + 4 * (size_t)(e * c->PL), *src = ph[col & 1] + 4 * (size_t)(col >> 1);
                    if (src == de) continue;   /* the tap's row is its phase row */
                    ql_vec_copy_row((uint8_t *)de, (const uint8_t *)src, 4 * c->OW);
                    n_taps++;
                }
                continue;
            }
            if (c->s1len) {
                /* stride 1: the raw rows interleaved (paired) once for every tap, s1len >=
                 * (kw-1)*dw + OW positions (ig_run), then tap e's OW positions copied from
                 * position e*dw: one row build a row instead of one a tap (the 14x14 3x3
                 * layers' copy was three builds of 16 positions and their calls a row) */
                const uint8_t *rows[4];
                for (int q = 0; q < c->kpk; q++) rows[q] = raw + (size_t)q * (size_t)c->RW;
                if (c->kpk == 2) pair_i16(rows[0], rows[1], p->x_type, p->x_zp, (int16_t *)prow, (int)c->s1len);
                else interleave4(c->kern, rows, c->flip, prow, (int)c->s1len);
                for (int e = 0; e < c->nfw; e++)
                    ql_vec_copy_row((uint8_t *)(d0 + 4 * (size_t)(e * c->PL)), prow + 4 * (size_t)(e * c->sdw),
                                    4 * c->OW);
                continue;
            }
            for (int e = 0; e < c->nfw; e++)
                ig_phase_row(c, raw, prow, e * c->sdw, d0 + 4 * (size_t)(e * c->PL));
        }
    }
    for (int f = 0; f < c->nfo * c->nfw; f++) {   /* the planes' spares (as ig_copy_task) */
        char *dplane = c->copy + 4 * (size_t)(b * c->BS + f * c->PL);
        memset(dplane + 4 * (size_t)(c->Rph * c->Wph), 0, 4 * (size_t)(c->PL - c->Rph * c->Wph));
    }
    ig_copy_count(n_split, n_taps);
}

/* Copy task of a chunk of images: cpt consecutive (image, channel block) pairs, image k / nblk,
 * block k % nblk (ig_copy_task on a view of the context whose copy and input are the image's).
 * Several blocks a task: a block of a small plane is little work (7x7, two channels: 300-odd
 * bytes), less than taking a task costs on two cores. */
void ig_copy_chunk_task(void *vctx, ptrdiff_t task, int thread)
{
    const ig_ctx *c = (const ig_ctx *)vctx;
    void (*copy)(void *, ptrdiff_t, int) = c->shift ? ig_copy_shift_task : ig_copy_task;
    if (c->nimg == 1) {
        copy(vctx, task, thread);
        return;
    }
    ig_ctx v = *c;
    ptrdiff_t k0 = task * c->cpt, k1 = k0 + c->cpt, jv = -1;
    if (k1 > (ptrdiff_t)(c->nimg * c->nblk)) k1 = (ptrdiff_t)(c->nimg * c->nblk);
    for (ptrdiff_t k = k0; k < k1; k++) {
        ptrdiff_t j = k / c->nblk;
        if (j != jv) {
            v.copy = c->copy + (size_t)j * c->cstride;
            v.xg = c->xg + (size_t)j * c->xstride;
            jv = j;
        }
        copy(&v, k % c->nblk, thread);
    }
}

/* The first copy job of a plain call's fast path: the weights' packing tasks first (the longer
 * ones: the two threads start on them and share the copy tasks after), then the copy tasks,
 * skipped once a row is outside the bound (full-range weights on AVX2's 7-bit form: found in
 * the first rows, so a failed attempt costs little before the exact form runs). */
void ig_copy_pack_task(void *vctx, ptrdiff_t task, int thread)
{
    const ig_ctx *c = (const ig_ctx *)vctx;
    if (task < c->npack) packw_task(c->wjob, task, thread);
    else if (!atomic_load_explicit(&c->wjob->outside, memory_order_relaxed)) ig_copy_chunk_task(vctx, task - c->npack, thread);
}

/* The runs of tile q0: columns q with ow < OW (and q < Q) in real rows, by output pixel; a run
 * continues across a row's end when the next row follows in both the tile and the output (no
 * dropped column, Wph == OW, and the next row real). */
static void ig_runs(const ig_ctx *c, int64_t q0, ql_ik_runs *rn)
{
    int64_t span = c->tstride < QL_IK_NR ? c->tstride : QL_IK_NR;
    int64_t q = q0, qe = q0 + span < c->Q ? q0 + span : c->Q;
    rn->n = 0;
    while (q < qe) {
        int64_t r = q / c->Wph, ow = q % c->Wph, orow = c->dense ? r : ig_out_row(c, r);
        if (ow >= c->OW || orow < 0) { q = (r + 1) * c->Wph; continue; }
        int64_t len = c->OW - ow < qe - q ? c->OW - ow : qe - q;
        ptrdiff_t pix = (ptrdiff_t)(orow * c->OW + ow);
        int k = rn->n;
        if (k && rn->col[k - 1] + rn->len[k - 1] == (int)(q - q0) && rn->pix[k - 1] + rn->len[k - 1] == pix) {
            rn->len[k - 1] += (int)len;
        } else {
            rn->col[k] = (int)(q - q0);
            rn->len[k] = (int)len;
            rn->pix[k] = pix;
            rn->n++;
        }
        q += len;
    }
}

/* The level's epilogue on one row tile's C, run by run. */
static void ig_store(const ig_ctx *c, const ql_epilogue *ep, const int32_t *Ct, const ql_ik_runs *rn, int i,
                     int rows)
{
    for (int k = 0; k < rn->n; k++)
        c->epilogue(ep, Ct + rn->col[k], QL_IK_NR, NULL, i, (int)rn->pix[k], rows, rn->len[k]);
}

/* The last tile's w real columns as contiguous k runs for the dot kernel: column c, k-group
 * g at xt + c*xs + 4g (both forms hold one k-group of one position in 4 bytes), zero-padded
 * to xs (a multiple of 32 bytes). */
static void ig_gather(const ig_ctx *c, const char *base, int w, char *xt)
{
    for (int j = 0; j < w; j++) {
        char *d = xt + j * c->xs;
        for (int g = 0; g < c->groups; g++) memcpy(d + 4 * (ptrdiff_t)g, base + c->off[g] + 4 * j, 4);
        memset(d + 4 * (ptrdiff_t)c->groups, 0, (size_t)(c->xs - 4 * (ptrdiff_t)c->groups));
    }
}

/* Gather task: image j's narrow last tile (after its copy). */
void ig_gather_task(void *vctx, ptrdiff_t j, int thread)
{
    const ig_ctx *c = (const ig_ctx *)vctx;
    (void)thread;
    ig_gather(c, c->copy + (size_t)j * c->cstride + 4 * (size_t)((c->ntiles - 1) * c->tstride), (int)c->wlast,
              c->xt + (size_t)j * c->xt_bytes);
}

/* Packing task: the chunk's images' last tiles into the panel u = n0 / tpm + task they belong to. */
void ig_tail_task(void *vctx, ptrdiff_t task, int thread)
{
    const ig_ctx *c = (const ig_ctx *)vctx;
    (void)thread;
    int64_t u = c->n0 / c->tpm + task;
    int64_t g0 = u * c->tpm > c->n0 ? u * c->tpm : c->n0;
    int64_t g1 = (u + 1) * c->tpm < c->n0 + c->nimg ? (u + 1) * c->tpm : c->n0 + c->nimg;
    size_t wb = 4 * (size_t)c->wlast, ql = 4 * (size_t)((c->ntiles - 1) * c->tstride);
    char *d = c->tp + (size_t)(u % c->nbuf) * c->tp_bytes;
    for (int g = 0; g < c->groups; g++)
        for (int64_t gi = g0; gi < g1; gi++)
            memcpy(d + 64 * (size_t)g + (size_t)(gi - u * c->tpm) * wb,
                   c->copy + (size_t)(gi - c->n0) * c->cstride + ql + c->off[g], wb);
}

/* Gather task: leftover image left_j0 + k's last tile, from its panel, for the dot kernel. */
void ig_left_task(void *vctx, ptrdiff_t k, int thread)
{
    const ig_ctx *c = (const ig_ctx *)vctx;
    (void)thread;
    int64_t gi = c->left_j0 + k, u = gi / c->tpm;
    ig_ctx v = *c;
    v.off = c->offp;   /* the panel's layout */
    ig_gather(&v, c->tp + (size_t)(u % c->nbuf) * c->tp_bytes + 4 * (size_t)((gi - u * c->tpm) * c->wlast),
              (int)c->wlast, c->xt + (size_t)k * c->xt_bytes);
}

/* The copy of tiles [t0, t1) inside the GEMM task that runs them (c->fuse_copy: one image, one
 * row block, a pointwise plane, ig_execute): the same bytes ig_copy_task's run writes at those
 * positions - position q of block b is pixel q of the block's kpk channels, paired (exact
 * form) or interleaved (byte forms) - and, by the task with the last tile, each block's spare
 * past the plane zeroed (the last tile's dropped columns read it) and the narrow last tile
 * gathered for the dot kernel. One job where the copy and the GEMM made two (a join fewer),
 * and each thread copies the columns it then reads, while they are in its cache. */
static void ig_fused_copy(const ig_ctx *c, int64_t t0, int64_t t1)
{
    const ql_conv_plan *p = c->p;
    int64_t q0 = t0 * c->tstride, q1 = t1 * c->tstride < c->Q ? t1 * c->tstride : c->Q;
    const uint8_t *rows[4];
    for (int64_t b = 0; b < c->nblk; b++) {
        char *d = c->copy + 4 * (size_t)(b * c->BS + q0);
        for (int q = 0; q < c->kpk; q++) rows[q] = c->xg + (b * c->kpk + q) * c->plane + q0;
        if (q1 > q0) {
            if (c->kpk == 2) pair_i16(rows[0], rows[1], p->x_type, p->x_zp, (int16_t *)d, (int)(q1 - q0));
            else interleave4(c->kern, rows, c->flip, (uint8_t *)d, (int)(q1 - q0));
        }
        if (t1 == c->ntiles)
            memset(c->copy + 4 * (size_t)(b * c->BS + c->Q), 0, 4 * (size_t)(c->PL - c->Q));
    }
    if (t1 == c->ntiles && c->xt) ig_gather_task((void *)c, 0, 0);
}

/* GEMM task: row block x block of (image, tile) pairs; each tile's C goes to the epilogue in runs of real
 * output pixels (straight from the accumulators where the kernel has ikernel_ep). K blocks of
 * at most c->kgroups k-groups: the operand a tile reads (64 bytes per k-group, scattered over
 * the copy) stays in L1 while every row tile passes over it; partial sums add (wrapping)
 * into the thread's C block. */
static void ig_gemm_body(const ig_ctx *c, ptrdiff_t task, int thread)
{
    int rb = (int)(task % c->row_blocks);
    int64_t tb = task / c->row_blocks;
    /* row tiles [rb G / rbs, (rb + 1) G / rbs) and (image, tile) pairs likewise: blocks differ
     * by at most one row tile (pair), so that the tasks the threads share out are alike (the
     * last row block of a 512-row layer was 8 rows against 24: a thread idled while the other
     * ran a task) */
    int i_beg = (int)((int64_t)rb * c->mgroups / c->row_blocks) * c->mr;
    int i_end = (int)((int64_t)(rb + 1) * c->mgroups / c->row_blocks) * c->mr;
    if (i_end > c->Mg) i_end = c->Mg;
    int64_t tiles = c->tpm ? c->ntiles - 1 : c->ntiles;   /* per image, merged tails apart */
    int64_t npan = c->u_run1 - c->u_run0;
    int64_t pairs = c->nimg * tiles + npan + c->nleft;
    /* blocks of whole tile pairs for a kernel that runs two tiles at once (ig_tile_blocks) */
    int64_t unit = c->kern->conv.ikernel2_ep ? 2 : 1, units = (pairs + unit - 1) / unit;
    int64_t t_beg = tb * units / c->tile_blocks * unit, t_end = (tb + 1) * units / c->tile_blocks * unit;
    if (t_end > pairs) t_end = pairs;
    if (c->fuse_copy && t_beg < t_end) ig_fused_copy(c, t_beg, t_end);
    int32_t Ct[QL_MAX_MR * QL_IK_NR] __attribute__((aligned(64)));
    int32_t *Cb = (int32_t *)(c->cblock + (size_t)thread * c->cblock_bytes);
    size_t es = c->kern->form == QL_FORM_I16 ? 2 : 1;
    /* the row block's packed rows: row i at Lb + (i - ib) * ldl (the prepared weights, or the
     * task's own packing of a plain call's rows, used while they are in L2) */
    const char *Lb = c->L;
    int ib = 0;
    if (c->wr && t_beg < t_end && i_beg < i_end) {
        char *d = c->scratch + (size_t)thread * c->scratch_bytes + c->wscr_off;
        const uint8_t *src = c->wr + (size_t)i_beg * (size_t)c->Kraw;
        int rows = i_end - i_beg;
        if (c->wgrouped)
            pack_w_grouped(c->kern, src, c->w_type, rows, c->Kraw, c->taps, c->wzp + i_beg, d, 0, rows);
        else
            pack_w_rows(c->kern, src, c->w_type, rows, c->Kraw, c->wzp + i_beg, d, 0, rows);
        if (c->fb)   /* S8U8: the per-row terms of this task's rows, from their sums */
            fast_terms(c->bias_g ? c->bias_g + i_beg : NULL, c->zxu,
                       (const int32_t *)(d + (size_t)rows * (size_t)c->ldl), rows, c->fb + i_beg);
        Lb = d;
        ib = i_beg;
    }
    ql_ik_runs rn, rn2[2];
    int paired = 0;
    ql_epilogue epj = c->ep;   /* image j's: its output */
    const ql_epilogue *ep = &epj;
    for (int64_t pt = t_beg; pt < t_end; pt++) {
        const char *base, *xt = NULL;
        const ptrdiff_t *off = c->off;
        int64_t wt, j = tiles ? pt / tiles : 0, t = tiles ? pt % tiles : 0;
        int merged = pt >= c->nimg * tiles && pt < c->nimg * tiles + npan;
        if (pt >= c->nimg * tiles + npan) {
            /* a leftover image's last tile: the dot kernel, on its columns gathered from its panel */
            int64_t k = pt - c->nimg * tiles - npan;
            epj.out = c->out0 + (size_t)(c->left_j0 + k) * c->ostride;
            ig_runs(c, (c->ntiles - 1) * c->tstride, &rn);
            xt = c->xt + (size_t)k * c->xt_bytes;
            base = NULL;
            wt = c->wlast;
        } else if (merged) {
            /* a merged tail panel: image k's runs moved to columns k * wlast.. and to its output */
            int64_t u = c->u_run0 + (pt - c->nimg * tiles), j0 = u * c->tpm;
            int64_t jn = c->p->N - j0 < c->tpm ? c->p->N - j0 : c->tpm;
            ql_ik_runs r1;
            ig_runs(c, (c->ntiles - 1) * c->tstride, &r1);
            rn.n = 0;
            for (int64_t k = 0; k < jn; k++)
                for (int e = 0; e < r1.n; e++) {
                    rn.col[rn.n] = r1.col[e] + (int)(k * c->wlast);
                    rn.len[rn.n] = r1.len[e];
                    rn.pix[rn.n] = r1.pix[e] + (ptrdiff_t)k * c->img_pix;
                    rn.n++;
                }
            epj.out = c->out0 + (size_t)j0 * c->ostride;
            base = c->tp + (size_t)(u % c->nbuf) * c->tp_bytes;
            off = c->offp;
            wt = jn * c->wlast;
            __atomic_add_fetch(&ql_ig_calls[4], 1, __ATOMIC_RELAXED);
        } else {
            epj.out = (char *)c->ep.out + (size_t)j * c->ostride;
            int64_t q0 = t * c->tstride;
            base = c->copy + (size_t)j * c->cstride + 4 * (size_t)q0;
            ig_runs(c, q0, &rn);
            /* the tile's columns: 16, fewer for row-aligned tiles, and the last tile's rest */
            wt = c->tstride < QL_IK_NR ? c->tstride : QL_IK_NR;
            if (c->Q - q0 < wt) wt = c->Q - q0;
            if (c->xt) xt = c->xt + (size_t)j * c->xt_bytes;   /* gathered after the copy */
            /* this tile and the image's next one (this thread's too) at once, where the
             * kernel can (ikernel2_ep): both 16 columns apart, the next not a narrow one */
            int64_t w2 = c->Q - q0 - QL_IK_NR < QL_IK_NR ? c->Q - q0 - QL_IK_NR : QL_IK_NR;
            if (c->kern->conv.ikernel2_ep && c->fused && c->tstride == QL_IK_NR && wt == QL_IK_NR && t + 1 < tiles &&
                pt + 1 < t_end && !(c->xt && w2 <= QL_DOT_NR) && !(c->kern->conv.ikernel_tail && w2 <= c->kern->tail_nr)) {
                rn2[0] = rn;
                ig_runs(c, q0 + QL_IK_NR, &rn2[1]);
                for (int i = i_beg; i < i_end; i += c->mr) {
                    int rows = i_end - i < c->mr ? i_end - i : c->mr;
                    c->kern->conv.ikernel2_ep(Lb + (ptrdiff_t)(i - ib) * c->ldl, c->ldl, base, off, c->groups, ep, rn2, i,
                                         rows);
                }
                pt++;
                paired = 1;
                continue;
            }
        }
        /* a tile with at most tail_nr or QL_DOT_NR columns: the narrow kernels (the runs lie
         * within them); a 7x7 plane's 49 = 3*16 + 1 */
        if (xt && wt <= QL_DOT_NR && !merged) {
            /* gathered once, then dot products of the row block's rows with them over the
             * whole K (K blocks or not: the gathered columns are contiguous), the level's
             * epilogue on the runs */
            int w = (int)wt;
            for (int i = i_beg; i < i_end; i += c->mr) {
                int rows = i_end - i < c->mr ? i_end - i : c->mr;
                const char *Li = Lb + (ptrdiff_t)(i - ib) * c->ldl;
                if (c->ep_ok && c->kern->conv.dot_ep) {
                    c->kern->conv.dot_ep(Li, c->ldl, xt, c->xs, 4 * c->groups, w, ep, &rn, i, rows);
                    continue;
                }
                c->kern->conv.dot(Li, c->ldl, xt, c->xs, 4 * c->groups, w, Ct, QL_IK_NR, rows);
                ig_store(c, ep, Ct, &rn, i, rows);
            }
            ql_tail_count(2);
            continue;
        }
        ql_ikernel_fn ik = c->kern->conv.ikernel;
        ql_ikernel_ep_fn ike = c->kern->conv.ikernel_ep;
        if (wt <= c->kern->tail_nr && c->kern->conv.ikernel_tail) {
            ik = c->kern->conv.ikernel_tail;
            ike = c->kern->conv.ikernel_ep_tail;
            ql_tail_count(0);
        }
        if (c->kgroups >= c->groups) {
            for (int i = i_beg; i < i_end; i += c->mr) {
                int rows = i_end - i < c->mr ? i_end - i : c->mr;
                if (c->fused && ike) {
                    ike(Lb + (ptrdiff_t)(i - ib) * c->ldl, c->ldl, base, off, c->groups, ep, &rn, i, rows);
                    continue;
                }
                ik(Lb + (ptrdiff_t)(i - ib) * c->ldl, c->ldl, base, off, c->groups, Ct, QL_IK_NR, rows);
                ig_store(c, ep, Ct, &rn, i, rows);
            }
            continue;
        }
        for (int g0 = 0; g0 < c->groups; g0 += c->kgroups) {
            int gn = c->groups - g0 < c->kgroups ? c->groups - g0 : c->kgroups;
            const char *Lk = Lb + (size_t)g0 * (size_t)c->kpk * es;
            for (int i = i_beg; i < i_end; i += c->mr) {
                int rows = i_end - i < c->mr ? i_end - i : c->mr;
                int32_t *cb = Cb + (size_t)(i - i_beg) * QL_IK_NR;
                if (g0 == 0) {
                    ik(Lk + (ptrdiff_t)(i - ib) * c->ldl, c->ldl, base, off, gn, cb, QL_IK_NR, rows);
                } else {
                    ik(Lk + (ptrdiff_t)(i - ib) * c->ldl, c->ldl, base, off + g0, gn, Ct, QL_IK_NR, rows);
                    uint32_t *d = (uint32_t *)cb;
                    const uint32_t *src = (const uint32_t *)Ct;
                    for (int e = 0; e < rows * QL_IK_NR; e++) d[e] += src[e];
                }
            }
        }
        for (int i = i_beg; i < i_end; i += c->mr) {
            int rows = i_end - i < c->mr ? i_end - i : c->mr;
            ig_store(c, ep, Cb + (size_t)(i - i_beg) * QL_IK_NR, &rn, i, rows);
        }
    }
    if (paired) __atomic_add_fetch(&ql_conv_chunk_calls[1], 1, __ATOMIC_RELAXED);
}

/* ig_gemm_body with the kernel's per-thread state hooks around it (qlinear.h: task_begin) */
void ig_gemm_task(void *vctx, ptrdiff_t task, int thread)
{
    const ig_ctx *c = (const ig_ctx *)vctx;
    if (c->kern->task_begin) c->kern->task_begin();
    ig_gemm_body(c, task, thread);
    if (c->kern->task_end) c->kern->task_end();
}

/* Chunk task of the images-in-parallel schedule (ig_run, which makes every chunk one image):
 * chunk `task` (images task * nimg..) run whole on this thread - its copy into the thread's
 * own region, its last tiles into their panels (shared: each image's columns are its own bytes
 * of the panel; the panels run after every chunk, ig_run), its GEMM over its (image, tile)
 * pairs row block by row block - the same task functions the threads share on the other
 * schedule, called in order: the same kernels on the same operands. */
void ig_chunk_task(void *vctx, ptrdiff_t task, int thread)
{
    const ig_ctx *c = (const ig_ctx *)vctx;
    ig_ctx v = *c;
    int64_t n0 = (int64_t)task * c->nimg;
    v.nimg = c->nbatch - n0 < c->nimg ? c->nbatch - n0 : c->nimg;
    v.n0 = n0;
    v.copy = c->copy + (size_t)thread * c->pregion;
    v.xg = c->xg + (size_t)n0 * c->xstride;
    v.ep.out = (char *)c->ep.out + (size_t)n0 * c->ostride;
    v.u_run0 = v.u_run1 = v.nleft = 0;   /* the panels: after every chunk */
    v.cpt = 1;
    for (ptrdiff_t k = 0; k < (ptrdiff_t)(v.nimg * v.nblk); k++) ig_copy_chunk_task(&v, k, thread);
    if (v.tpm)
        for (ptrdiff_t k = 0; k < (ptrdiff_t)((n0 + v.nimg - 1) / v.tpm - n0 / v.tpm + 1); k++) ig_tail_task(&v, k, thread);
    ig_tile_blocks(&v, 1);
    for (ptrdiff_t k = 0; k < (ptrdiff_t)(v.row_blocks * v.tile_blocks); k++) ig_gemm_task(&v, k, thread);
    if (v.nimg > 1) {
        __atomic_add_fetch(&ql_ig_calls[2], 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&ql_ig_calls[3], v.nimg, __ATOMIC_RELAXED);
    }
}

