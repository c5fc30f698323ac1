/* Convolutions on the native engine: QLinearConv and ConvInteger of every rank.
 *
 * Two paths, both exact in int32 (wrap32 only at the end, as the contract says):
 *
 * - GEMM path (any group): per image and group, C (Mg x P) = W (Mg x K) . im2col(x) (K x P)
 *   through the core driver ql_gemm. W is packed once in the prepared object (ql_conv_pack_w);
 *   the R operand is never materialized: im2col_pack writes one panel of nr output pixels at
 *   a time straight from the NCHW input, in the kernel's operand form (I16: centered int16
 *   [kp/2][nr][2]; U8S8: s8-form bytes [kp/4][nr][4] + per-pixel column sums). K runs c outer,
 *   taps inner, i.e. w.reshape(M, -1)'s order. Padded positions read as x's zero point
 *   (centered 0 in the I16 form, zR' in the U8S8 form, whose correction then cancels them).
 * - Depthwise path (one input channel per group, any channel multiplier M/C): direct tap sums
 *   per channel along output rows, on centered int16 rows, two taps per multiply-add
 *   (|x - zx|, |w - zw| <= 255: a pair sum is at most 2 * 255 * 255 < 2^31, exact in int32).
 *
 * Geometry arrives resolved (pads at the beginning, strides, dilations, output shape) from
 * qlinear/_geometry.py. Positions are computed in int64 from the output coordinate, never
 * by walking padded or strided space, so huge pads and strides cost nothing; scratch is per
 * thread, bounded by constants (and the caller's workspace limit), never proportional to the
 * padded input.
 *
 * The files of conv/: driver.c (this one: the entry points, which pick the path), plan.h (what
 * they share), pack_w.c (the weights), im2col.c and rows.c (the im2col panels), implicit.h,
 * implicit_plan.c and implicit_run.c (the implicit GEMM), depthwise.h, depthwise.c and
 * depthwise_cl.c (the depthwise paths).
 */
#include "plan.h"

/* ---------------------------------------------------------------------------------------
 * The GEMM conv driver
 * ------------------------------------------------------------------------------------- */

/* The GEMM convolution on packed weights (wpacked), or with raw: a plain call's weights as
 * given, packed inside the implicit GEMM's tasks where that applies (ig_run), else into wpacked
 * first (ql_conv_w_bytes of kern) */
static int conv_gemm(const ql_conv_plan *p, const ql_isa *isa, const ql_gemm_kernel *kern, void *wpacked,
                     const ql_conv_wraw *raw, size_t workspace)
{
    int64_t Cg = p->C / p->group, Mg = p->M / p->group;
    int64_t taps = prod(p->k, p->nsp);
    int64_t K64 = Cg * taps;
    int64_t P = prod(p->out, p->nsp);
    int64_t plane = prod(p->in, p->nsp);
    if (K64 > INT_MAX / 2 || Mg > INT_MAX) return -2;
    kern = conv_kernel(kern, K64, taps);
    if (kern->conv.kchunk > 1) __atomic_add_fetch(&ql_conv_chunk_calls[0], 1, __ATOMIC_RELAXED);
    int K = (int)ql_conv_wk(kern, K64, taps);   /* the packed rows' length (<= 4/3 K64) */
    int kp = ql_round_k(kern, K);
    ptrdiff_t ldl = w_row_bytes(kern, K);
    size_t esize = p->quantized ? 1 : 4;
    int threads = ql_num_threads();

    im2col_ctx c;
    memset(&c, 0, sizeof c);
    c.p = p;
    c.kern = kern;
    c.form = kern->form;
    c.nr = kern->nr;
    c.kp = kp;
    c.K = K;
    c.taps = taps;
    c.plane = plane;
    /* byte forms: U8S8 wants s8-form bytes (uint8 ^ 0x80), S8U8 u8-form ones (int8 ^ 0x80);
     * the I16 form centers on x's zero point, so its "zero" raw byte is that zero point */
    c.flip = (p->x_type == QL_U8) != (kern->form == QL_FORM_S8U8) ? 0x80 : 0;
    c.tail = kern->form == QL_FORM_I16 ? (uint8_t)p->x_zp : c.flip;
    c.grouped = ql_conv_grouped(kern, K64, taps);
    c.chunk = kchunk_of(kern);
    c.Cg = Cg;
    c.flat = 1;
    for (int a = 0; a < p->nsp; a++)
        if (p->k[a] != 1 || p->stride[a] != 1 || p->pad[a] != 0 || p->out[a] != p->in[a]) c.flat = 0;
    plane_strides(p, c.st);
    im2col_layout(&c);
    if (c.scratch_bytes * (size_t)threads > workspace) return -3;
    c.scratch_mem = (char *)malloc(c.scratch_bytes * (size_t)threads + 64);
    c.scratch = line_up(c.scratch_mem);
    if (!c.scratch) return -1;

    const int32_t *row_a = NULL, *row_z = NULL;
    if (kern->form == QL_FORM_U8S8) {
        row_a = (const int32_t *)((const char *)wpacked + (size_t)p->M * (size_t)ldl);
        row_z = row_a + p->M;
    }
    int32_t col_z = p->x_type == QL_U8 ? p->x_zp - 128 : p->x_zp;   /* zR' */
    /* S8U8 (fast path): the bias and the row sums' term (fast_bias_fill), once the weights are
     * packed: now, or in ig_run / below for a plain call's (raw) */
    int32_t *fast_bias = NULL;
    if (kern->form == QL_FORM_S8U8) {
        fast_bias = (int32_t *)malloc(sizeof(int32_t) * (size_t)p->M);
        if (!fast_bias) { free(c.scratch_mem); return -1; }
        if (!raw) fast_bias_fill(p, wpacked, ldl, fast_bias);
    }
    {
        int ig = ig_run(p, isa, kern, wpacked, raw, fast_bias, workspace);
        if (ig && ig != -4) __atomic_add_fetch(&ql_ig_calls[0], 1, __ATOMIC_RELAXED);
        if (ig) {
            free(c.scratch_mem);
            free(fast_bias);
            return ig == 1 ? 0 : ig == -4 ? -4 : -1;
        }
    }
    if (raw) {
        if (pack_w_threads(kern, raw->w, raw->w_type, (int)p->M, (int)K64, taps, raw->wzp, wpacked, threads) != 0) {
            free(c.scratch_mem);
            free(fast_bias);
            return -4;   /* a weight outside the S8U8 form's bound (the only form with one) */
        }
        if (fast_bias) fast_bias_fill(p, wpacked, ldl, fast_bias);
    }
    __atomic_add_fetch(&ql_ig_calls[1], 1, __ATOMIC_RELAXED);   /* the im2col path runs (counted once it can) */
    int rc = 0;
    for (int64_t n = 0; n < p->N && rc == 0; n++) {
        for (int64_t g = 0; g < p->group && rc == 0; g++) {
            for (int64_t q0 = 0; q0 < P && rc == 0; q0 += PIX_CHUNK) {
                int64_t np = P - q0 < PIX_CHUNK ? P - q0 : PIX_CHUNK;
                ql_gemm_problem gp;
                memset(&gp, 0, sizeof gp);
                gp.kern = kern;
                gp.M = (int)Mg;
                gp.N = (int)np;
                gp.K = K;
                gp.kp = kp;
                gp.L = (const char *)wpacked + (size_t)(g * Mg) * (size_t)ldl;
                gp.ldl_bytes = ldl;
                c.xg = (const uint8_t *)p->x + (size_t)((n * p->C + g * Cg) * plane);
                c.pix0 = q0;
                gp.pack_R = im2col_pack;
                gp.pack_ctx = &c;
                plan_epilogue(p, &gp.ep);
                if (p->bias) gp.ep.row_bias = p->bias + g * Mg;
                if (fast_bias) gp.ep.row_bias = fast_bias + g * Mg;
                gp.ep.mult = p->mult + g * Mg * p->mult_s;
                gp.ep.out = (char *)p->y + (size_t)((n * p->M + g * Mg) * P + q0) * esize;
                gp.ep.out_rs = (ptrdiff_t)P;
                if (kern->form == QL_FORM_U8S8) {
                    gp.ep.row_a = row_a + g * Mg;
                    gp.ep.row_z = row_z + g * Mg;
                    gp.ep.row_s = 1;
                    gp.ep.col_z = &col_z;
                    gp.ep.col_z_s = 0;
                }
                gp.epilogue = isa->epilogue;
                gp.allow_fused = 1;   /* the level's own epilogue: kernel_ep may apply it */
                gp.threads = threads;
                if (ql_gemm(&gp) != 0) rc = -1;
            }
        }
    }
    free(c.scratch_mem);
    free(fast_bias);
    return rc;
}

int ql_conv_gemm(const ql_conv_plan *p, const ql_isa *isa, const ql_gemm_kernel *kern,
                 const void *wpacked, size_t workspace)
{
    return conv_gemm(p, isa, kern, (void *)wpacked, NULL, workspace);   /* only read without raw */
}

int ql_conv_gemm_raw(const ql_conv_plan *p, const ql_isa *isa, const ql_gemm_kernel *kern,
                     const ql_conv_wraw *raw, void *wbuf, size_t workspace)
{
    if (kern->form == QL_FORM_U8S8) {   /* packed whole first (the corrections' row sums) */
        int64_t taps = prod(p->k, p->nsp), K64 = p->C / p->group * taps;
        if (K64 > INT_MAX / 2) return -2;
        if (pack_w_threads(kern, raw->w, raw->w_type, (int)p->M, (int)K64, taps, raw->wzp, wbuf,
                           ql_num_threads()) != 0)
            return -1;
        return conv_gemm(p, isa, kern, wbuf, NULL, workspace);
    }
    return conv_gemm(p, isa, kern, wbuf, raw, workspace);
}

int ql_conv_plain_fast(const ql_conv_plan *p, const ql_isa *isa, const ql_conv_wraw *raw, void *wbuf,
                       size_t workspace)
{
    int64_t taps = prod(p->k, p->nsp), K64 = p->C / p->group * taps;
    if (K64 > INT_MAX / 2) return -2;
    if (!fast_applies(isa, p->M, K64, taps)) return 0;
    int rc = conv_gemm(p, isa, isa->conv_fast, wbuf, raw, workspace);
    return rc == 0 ? 1 : rc == -4 ? 0 : rc;
}

