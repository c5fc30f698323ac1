/* Convolution weights for the GEMM paths: packed once (a prepared object) or per call (a plain
 * call, on the threads, proving the fast form's bound while packing), in each kernel's form and
 * in the grouped order the implicit GEMM reads (plan.h: the kernel that packs a layer). */
#include "plan.h"

/* ---------------------------------------------------------------------------------------
 * Weights of the GEMM path: packed once (prepared object), per ISA form
 * ------------------------------------------------------------------------------------- */

const char *ql_conv_kernel_name(const ql_gemm_kernel *k, int64_t K, int64_t taps)
{
    return conv_kernel(k, K, taps)->name;
}

int ql_conv_grouped(const ql_gemm_kernel *k, int64_t K, int64_t taps)
{
    if (taps <= 1 || K % taps) return 0;
    int64_t cg = K / taps, kpk = k->kpack, cb = (cg + kpk - 1) / kpk;
    if (cg % kpk == 0) return 1;
    /* channels padded up to a multiple of kpack (a stem's 3 channels: 4): only for kernels
     * with an implicit variant, which the padding lets read the copy in place, and at most a
     * third more multiply-adds */
    return k->conv.ikernel != NULL && 3 * cb * kpk <= 4 * cg;
}

int64_t ql_conv_wk(const ql_gemm_kernel *k, int64_t K, int64_t taps)
{
    if (!ql_conv_grouped(k, K, taps)) return K;
    int64_t kpk = k->kpack;
    return (K / taps + kpk - 1) / kpk * kpk * taps;   /* <= 4/3 K */
}

size_t ql_conv_w_bytes(const ql_gemm_kernel *k, int M, int K, int64_t taps)
{
    k = conv_kernel(k, K, taps);
    size_t b = (size_t)M * (size_t)w_row_bytes(k, (int)ql_conv_wk(k, K, taps));
    if (k->form != QL_FORM_I16) b += 2 * sizeof(int32_t) * (size_t)M;
    return b;
}

/* sum of n bytes in the u8 form (raw ^ flip), wrap32 (as pack_L's row sums) */
static uint32_t sum_u8form(const uint8_t *s, int64_t n, uint8_t flip)
{
    uint32_t sum = 0;
    int64_t j = ql_vec_sum_u8(s, n, flip, &sum);   /* the vector loop first */
    for (; j < n; j++) sum += (uint8_t)(s[j] ^ flip);
    return sum;
}

/* The fast path's row (S8U8 form) from n source bytes: every w - z in [-bound, min(bound, 127)]
 * (the kernel's s8_bound: 64 on AVX2, 128 on the VNNI levels; else -1, with nothing usable
 * written), d[j] = w - z as int8 (d NULL: the bound and the sum only), *sum = the sum of w - z
 * (wrap32). In the u8 form (u = w ^ flip, zu = z + flip: both in [0, 255]) the bound is u in
 * [zu - bound, zu + min(bound, 127)] (clamped to [0, 255]) and w - z = u - zu, so on x86 16
 * bytes a step: vpmaxub/vpminub clamp (a byte that moves is outside), vpsubb, vpsadbw for the
 * sum. The sum is kept modulo 2^32 (wrap32), not exactly: |sum| <= 128 K, and K may reach 2^29
 * (qlinear/conv.py's _NATIVE_MAX_K), so the exact sum can reach 2^36, past int32. That is all
 * its one use needs: it enters only the per-row term fb = bias - zx' * sum (plan.h's fast_terms,
 * wrap32), which the kernels' int32 accumulators (wrapping too) take in; the output is a sum of
 * products and this term, so modulo 2^32 it depends on the sum only modulo 2^32, and the int32
 * accumulator is defined modulo 2^32 (qlinear.h's arithmetic rules). */
static int s8u8_row(const ql_gemm_kernel *k, const uint8_t *s, int64_t n, int w_type, int32_t z, int8_t *d,
                    int32_t *sum)
{
    const int bound = k->conv.s8_bound;
    int32_t flip = w_type == QL_I8 ? 128 : 0, zu = z + flip, up = bound < 127 ? bound : 127;
    int32_t lo = zu - bound < 0 ? 0 : zu - bound, hi = zu + up > 255 ? 255 : zu + up;
    uint32_t usum = 0;
    int bad = 0;
    int64_t j = 0;
    if (k->conv.s8u8_row_bulk)   /* the level's wider loop first */
        j = k->conv.s8u8_row_bulk(s, n, (uint8_t)flip, (uint8_t)lo, (uint8_t)hi, (uint8_t)zu, d, &usum, &bad);
    j = ql_vec_s8u8_row(s, j, n, (uint8_t)flip, (uint8_t)lo, (uint8_t)hi, (uint8_t)zu, d, &usum, &bad);
    for (; j < n; j++) {
        int32_t u = (int32_t)(uint8_t)(s[j] ^ (uint8_t)flip);
        bad |= (u < lo) | (u > hi);
        usum += (uint32_t)u;
        if (d) d[j] = (int8_t)(u - zu);
    }
    *sum = (int32_t)(usum - (uint32_t)n * (uint32_t)zu);
    return bad ? -1 : 0;
}

/* w: (M, K) 8-bit row-major, K = Cg * taps in w.reshape(M, -1)'s order (channel outer, taps
 * inner); wzp: M int32 (per output channel, repeated if per tensor).
 * Grouped order (ql_conv_grouped: more than one tap, Cg a multiple of kpack or padded up to
 * one): the row is permuted first to k' = (c / kpack * taps + t) * kpack + c % kpack, so that
 * one k-group of the kernel holds kpack channels at ONE tap, which the implicit GEMM reads as
 * one 4-byte position of its padded copy. Both paths use that order (the im2col packer
 * follows it); the row has K' = ql_conv_wk entries (channels padded with the zero point,
 * centered 0), and the row sums below do not depend on the order or the padding.
 * dst layout: M rows of w_row_bytes, then int32 row_a[M], int32 row_z[M]:
 * - U8S8 form: rows in the u8 form, row_a = rowsum(L') - K*zL', row_z = zL' (the epilogue's
 *   corrections, wrap32);
 * - S8U8 form (fast path): rows = w - wzp as int8, which must lie within the kernel's s8_bound
 *   (else -1, nothing usable written); row_a = sum of the row (wrap32, see s8u8_row), row_z = 0.
 *   The per-call
 *   correction is then one term per row: - zx' * row_a (ql_conv_gemm).
 * Rows [i0, i1) only (the layout is the whole M's), so threads can share the work; w0 is row
 * i0 of the source (rows K apart). Returns 0 or -1 (the fast path's bound). */
int pack_w_rows(const ql_gemm_kernel *k, const void *w0, int w_type, int M, int K,
                       const int32_t *wzp, void *dst, int i0, int i1)
{
    int kp = ql_round_k(k, K);
    ptrdiff_t ldl = w_row_bytes(k, K);
    int32_t *row_a = (int32_t *)((char *)dst + (size_t)M * (size_t)ldl), *row_z = row_a + M;
    if (k->form == QL_FORM_S8U8) {
        for (int i = i0; i < i1; i++) {
            const uint8_t *src = (const uint8_t *)w0 + (size_t)(i - i0) * (size_t)K;
            int8_t *d = (int8_t *)dst + (size_t)i * (size_t)ldl;
            int32_t sum;
            if (s8u8_row(k, src, K, w_type, wzp[i], d, &sum)) return -1;
            for (int kk = K; kk < kp; kk++) d[kk] = 0;
            row_a[i] = sum;
            row_z[i] = 0;
        }
        return 0;
    }
    /* the level's packer (SIMD where it has one; the portable one's output) */
    ql_pack_L_fn pack = k->pack_L ? k->pack_L : ql_pack_L;
    char *d0 = (char *)dst + (size_t)i0 * (size_t)ldl;
    pack(w0, w_type, K, 1, i1 - i0, K, wzp + i0, 1, k->form, d0, ldl, kp,
         k->form == QL_FORM_U8S8 ? row_a + i0 : NULL);
    if (k->form == QL_FORM_U8S8) {
        for (int i = i0; i < i1; i++) {
            int32_t zl = wzp[i] + (w_type == QL_I8 ? 128 : 0);   /* u8 form: int8 + 128 */
            row_z[i] = zl;
            row_a[i] = (int32_t)((uint32_t)row_a[i] - (uint32_t)K * (uint32_t)zl);
        }
    }
    return 0;
}

/* Grouped order, packed straight from w (no permuted copy): rows [i0, i1) of w (M x K, channel
 * outer, taps inner; w points at row 0) in the form of kernel k, rows of Kw = ql_conv_wk entries.
 * Entry k' = (q * taps + t) * kpack + r of a row is channel c = q * kpack + r at tap t, i.e.
 * source byte c * taps + t; channels c >= Cg (padding up to kpack) hold the row's zero point,
 * centered 0 in every form. The result is what pack_w_rows makes of the permuted row (the
 * layout, row sums and the fast path's verdict do not depend on the order: sums and the bound
 * are taken over the source row, contiguously, while it is in L1).
 * Interleaving: per block q of kpack channels, chunks of 16 taps; on x86 (the baseline's loop: ql_vec_grouped_*) a
 * chunk is loaded as 16 bytes per channel and interleaved with unpack instructions. A chunk may
 * read past its block (into the same row's later channels) and write past it (into entries the
 * same row's later chunks overwrite); the bounds below keep both inside the row, and what is
 * left (the row's last taps) is done element by element. */

/* I16 form, an odd channel count: the last block's second channel is padding (0) */
static void grouped_i16_odd(const uint8_t *s, int w_type, int64_t cg, int64_t taps, int32_t z, int16_t *d)
{
    int64_t full = cg / 2;
    const uint8_t *a = s + 2 * full * taps;
    int16_t *dq = d + 2 * full * taps;
    for (int64_t t = 0; t < taps; t++) {
        dq[2 * t] = (int16_t)((w_type == QL_U8 ? (int32_t)a[t] : (int32_t)(int8_t)a[t]) - z);
        dq[2 * t + 1] = 0;
    }
}

/* I16 form (kpack 2): d[(q * taps + t) * 2 + r] = w[(2q + r) * taps + t] - z as int16 */
static inline __attribute__((always_inline)) void
grouped_i16_body(const uint8_t *s, int w_type, int64_t cg, int64_t taps, int32_t z, int16_t *d)
{
    int64_t full = cg / 2, cb = (cg + 1) / 2, n_in = cg * taps, n_out = 2 * cb * taps;
    for (int64_t q = 0; q < full; q++) {
        const uint8_t *a = s + 2 * q * taps, *b = a + taps;
        int16_t *dq = d + 2 * q * taps;
        int64_t t = ql_vec_grouped_i16(a, b, dq, w_type, z, q, taps, n_in, n_out);   /* 16-tap chunks first */
        if (t >= taps) continue;
        if (w_type == QL_U8) {
            for (; t < taps; t++) {
                dq[2 * t] = (int16_t)((int32_t)a[t] - z);
                dq[2 * t + 1] = (int16_t)((int32_t)b[t] - z);
            }
        } else {
            for (; t < taps; t++) {
                dq[2 * t] = (int16_t)((int32_t)(int8_t)a[t] - z);
                dq[2 * t + 1] = (int16_t)((int32_t)(int8_t)b[t] - z);
            }
        }
    }
    if (full < cb) grouped_i16_odd(s, w_type, cg, taps, z, d);
}

/* Byte forms, a channel count not a multiple of 4: the last block's channels past Cg are padding */
static void grouped_b_tail(const uint8_t *s, int64_t cg, int64_t taps, uint8_t fx, uint8_t sub, uint8_t pad, uint8_t *d)
{
    int64_t full = cg / 4;
    const uint8_t *a = s + 4 * full * taps;
    uint8_t *dq = d + 4 * full * taps;
    int64_t left = cg - 4 * full;
    for (int64_t t = 0; t < taps; t++)
        for (int64_t r = 0; r < 4; r++) dq[4 * t + r] = r < left ? (uint8_t)((a[r * taps + t] ^ fx) - sub) : pad;
}

/* Byte forms (kpack 4): d[(q * taps + t) * 4 + r] = (w[(4q + r) * taps + t] ^ fx) - sub (8-bit
 * wrap), padding channels pad. U8S8: fx = the u8 form's flip, sub 0; S8U8: fx 0, sub = z (the
 * bound proven first, so the byte is the int8 value w - z). */
static inline __attribute__((always_inline)) void
grouped_b_body(const uint8_t *s, int64_t cg, int64_t taps, uint8_t fx, uint8_t sub, uint8_t pad, uint8_t *d)
{
    int64_t full = cg / 4, cb = (cg + 3) / 4, n_in = cg * taps, n_out = 4 * cb * taps;
    for (int64_t q = 0; q < full; q++) {
        const uint8_t *a = s + 4 * q * taps;
        uint8_t *dq = d + 4 * q * taps;
        int64_t t = ql_vec_grouped_b(a, dq, fx, sub, q, taps, n_in, n_out);   /* 16-tap chunks first */
        for (; t < taps; t++)
            for (int r = 0; r < 4; r++) dq[4 * t + r] = (uint8_t)((a[r * taps + t] ^ fx) - sub);
    }
    if (full < cb) grouped_b_tail(s, cg, taps, fx, sub, pad, d);
}

/* the common kernels' tap counts as constants (3x3, 3, 3x3x3, 7x7): loops the compiler unrolls;
 * 3x3 through the kernel table's SIMD packer where the level has one (t9, ql_conv_kernels'
 * grouped_*_t9: conv_avx2.c's shuffles, 1.3-1.45 times as fast measured alone, 1 thread,
 * 128-512 channels). A plain call packs its weights on every call: a 512-channel 3x3 layer's
 * 2.4 M weights took about a quarter of the time of its GEMM. */
static void grouped_i16(const uint8_t *s, int w_type, int64_t cg, int64_t taps, int32_t z, int16_t *d,
                        ql_grouped_i16_fn t9)
{
    if (t9 && taps == 9) {
        t9(s, w_type == QL_I8, cg / 2, z, d);
        if (cg & 1) grouped_i16_odd(s, w_type, cg, taps, z, d);
        return;
    }
    switch (taps) {
    case 9: grouped_i16_body(s, w_type, cg, 9, z, d); break;
    case 3: grouped_i16_body(s, w_type, cg, 3, z, d); break;
    case 27: grouped_i16_body(s, w_type, cg, 27, z, d); break;
    case 49: grouped_i16_body(s, w_type, cg, 49, z, d); break;
    default: grouped_i16_body(s, w_type, cg, taps, z, d);
    }
}

static void grouped_b(const uint8_t *s, int64_t cg, int64_t taps, uint8_t fx, uint8_t sub, uint8_t pad, uint8_t *d,
                      ql_grouped_b_fn t9)
{
    if (t9 && taps == 9) {
        t9(s, cg / 4, fx, sub, d);
        if (cg % 4) grouped_b_tail(s, cg, taps, fx, sub, pad, d);
        return;
    }
    switch (taps) {
    case 9: grouped_b_body(s, cg, 9, fx, sub, pad, d); break;
    case 3: grouped_b_body(s, cg, 3, fx, sub, pad, d); break;
    case 27: grouped_b_body(s, cg, 27, fx, sub, pad, d); break;
    case 49: grouped_b_body(s, cg, 49, fx, sub, pad, d); break;
    default: grouped_b_body(s, cg, taps, fx, sub, pad, d);
    }
}

/* The chunked grouped order (kchunk ch > 1: qlinear.h) of one S8U8 row of cg channels (a
 * multiple of 4 ch, conv_kernel) from the blocks' order grouped_b wrote at d: word b * taps + t
 * (4 bytes: block b at tap t) goes to word (b / ch * taps + t) * ch + b % ch. Chunk q's words
 * span [q ch taps, (q + 1) ch taps) in both orders, so each chunk is a ch x taps transpose of
 * words in place, through a buffer of CHUNK_WORDS; longer chunks (kernels of more than 64
 * taps: rare, so grouped_b's row is simply overwritten) are written straight from the source
 * row s instead (byte (4 (q ch + j) + r) taps + t,
 * minus the zero point z, as grouped_b's S8U8 bytes). */
#define CHUNK_WORDS 1024
static void chunk_row(const uint8_t *s, int64_t cg, int64_t taps, int64_t ch, uint8_t z, uint8_t *d)
{
    int64_t nq = cg / (4 * ch);
    if (ch * taps <= CHUNK_WORDS) {
        uint32_t tmp[CHUNK_WORDS];
        for (int64_t q = 0; q < nq; q++) {
            uint8_t *dq = d + 4 * q * ch * taps;
            memcpy(tmp, dq, (size_t)(4 * ch * taps));
            for (int64_t t = 0; t < taps; t++)
                for (int64_t j = 0; j < ch; j++) memcpy(dq + 4 * (t * ch + j), &tmp[j * taps + t], 4);
        }
        return;
    }
    for (int64_t q = 0; q < nq; q++)
        for (int64_t t = 0; t < taps; t++)
            for (int64_t j = 0; j < ch; j++)
                for (int r = 0; r < 4; r++)
                    d[4 * ((q * taps + t) * ch + j) + r] = (uint8_t)(s[(4 * (q * ch + j) + r) * taps + t] - z);
}

/* Rows [i0, i1) of w in the grouped order (above) into dst's layout (pack_w_rows'); 0 or -1 (the
 * fast path's bound, S8U8 form: nothing usable written). */
int pack_w_grouped(const ql_gemm_kernel *k, const void *w, int w_type, int M, int K, int64_t taps,
                          const int32_t *wzp, void *dst, int i0, int i1)
{
    int64_t cg = K / taps, Kw = ql_conv_wk(k, K, taps);
    int kp = ql_round_k(k, (int)Kw);
    ptrdiff_t ldl = w_row_bytes(k, (int)Kw);
    int32_t *row_a = (int32_t *)((char *)dst + (size_t)M * (size_t)ldl), *row_z = row_a + M;
    for (int i = i0; i < i1; i++) {
        const uint8_t *s = (const uint8_t *)w + (size_t)i * (size_t)K;
        char *d = (char *)dst + (size_t)i * (size_t)ldl;
        int32_t z = wzp[i];
        if (k->form == QL_FORM_I16) {
            grouped_i16(s, w_type, cg, taps, z, (int16_t *)d, k->conv.grouped_i16_t9);
            memset(d + 2 * Kw, 0, (size_t)(kp - Kw) * 2);
        } else if (k->form == QL_FORM_S8U8) {
            int32_t sum;
            if (s8u8_row(k, s, K, w_type, z, NULL, &sum)) return -1;
            grouped_b(s, cg, taps, 0, (uint8_t)z, 0, (uint8_t *)d, k->conv.grouped_b_t9);
            if (k->conv.kchunk > 1) chunk_row(s, cg, taps, k->conv.kchunk, (uint8_t)z, (uint8_t *)d);
            memset(d + Kw, 0, (size_t)(kp - Kw));
            row_a[i] = sum;   /* padding adds 0 */
            row_z[i] = 0;
        } else {
            uint8_t flip = w_type == QL_I8 ? 0x80 : 0;
            int32_t zl = z + (w_type == QL_I8 ? 128 : 0);   /* u8 form: int8 + 128; = (raw z) ^ flip */
            grouped_b(s, cg, taps, flip, 0, (uint8_t)zl, (uint8_t *)d, k->conv.grouped_b_t9);
            memset(d + Kw, 0, (size_t)(kp - Kw));
            /* pack_L's row sum over the Kw entries: the source row's plus zl per padding entry */
            uint32_t sum = sum_u8form(s, K, flip) + (uint32_t)(Kw - K) * (uint32_t)zl;
            row_z[i] = zl;
            row_a[i] = (int32_t)(sum - (uint32_t)Kw * (uint32_t)zl);
        }
    }
    return 0;
}

int ql_conv_pack_w(const ql_gemm_kernel *k, const void *w, int w_type, int M, int K, int64_t taps,
                   const int32_t *wzp, void *dst)
{
    k = conv_kernel(k, K, taps);
    if (!ql_conv_grouped(k, K, taps)) return pack_w_rows(k, w, w_type, M, K, wzp, dst, 0, M);
    return pack_w_grouped(k, w, w_type, M, K, taps, wzp, dst, 0, M);
}

void packw_task(void *vctx, ptrdiff_t t, int thread)
{
    (void)thread;
    packw_ctx *c = (packw_ctx *)vctx;
    if (atomic_load_explicit(&c->outside, memory_order_relaxed)) return;
    int i0 = (int)t * c->rows_per_task, i1 = i0 + c->rows_per_task < c->M ? i0 + c->rows_per_task : c->M;
    /* blocks of 4 rows, so that a row outside the bound stops the others soon */
    for (int i = i0; i < i1; i += 4) {
        int ie = i + 4 < i1 ? i + 4 : i1, rc;
        if (c->grouped)
            rc = pack_w_grouped(c->k, c->w, c->w_type, c->M, c->K, c->taps, c->wzp, c->dst, i, ie);
        else
            rc = pack_w_rows(c->k, (const uint8_t *)c->w + (size_t)i * (size_t)c->K, c->w_type, c->M, c->K,
                             c->wzp, c->dst, i, ie);
        if (rc) {
            atomic_store_explicit(&c->outside, 1, memory_order_relaxed);
            return;
        }
        if (atomic_load_explicit(&c->outside, memory_order_relaxed)) return;
    }
}

/* The packing's tasks for `threads` threads (their count: packw_task 0..count-1 then pack every
 * row), in a job of their own (pack_w_threads) or beside the implicit GEMM's first copy tasks
 * (ig_copy_pack_task). */
ptrdiff_t packw_setup(packw_ctx *c, const ql_gemm_kernel *k, const void *w, int w_type, int M, int K,
                             int64_t taps, const int32_t *wzp, void *dst, int threads)
{
    memset(c, 0, sizeof *c);
    k = conv_kernel(k, K, taps);
    c->k = k; c->w = w; c->w_type = w_type; c->M = M; c->K = K; c->wzp = wzp; c->dst = dst;
    atomic_init(&c->outside, 0);
    c->taps = taps;
    c->grouped = ql_conv_grouped(k, K, taps);
    /* below 2^15 weights (a few microseconds of one core) one thread; from there on both: the
     * pool's workers are still spinning from the last call's GEMM (threads.c) and this call's
     * GEMM wants them next anyway, so sharing costs little. Measured: 2^18 as the bound left
     * a 960x160 layer's 154 K weights to one thread, 25-30 us of a 110-200 us call. */
    if ((int64_t)M * K < (1 << 15)) threads = 1;
    if (threads < 1) threads = 1;
    int tasks = threads > 1 ? 4 * threads : 1;
    c->rows_per_task = (M + tasks - 1) / tasks;
    if (c->rows_per_task < 1) c->rows_per_task = 1;
    return (M + c->rows_per_task - 1) / c->rows_per_task;
}

/* 0, -1 (a row outside the fast bound) */
int pack_w_threads(const ql_gemm_kernel *k, const void *w, int w_type, int M, int K, int64_t taps,
                          const int32_t *wzp, void *dst, int threads)
{
    packw_ctx c;
    ptrdiff_t tasks = packw_setup(&c, k, w, w_type, M, K, taps, wzp, dst, threads);
    ql_parallel_for(tasks, threads, packw_task, &c);
    return atomic_load(&c.outside) ? -1 : 0;
}

void fast_bias_fill(const ql_conv_plan *p, const void *wpacked, ptrdiff_t ldl, int32_t *fb)
{
    fast_terms(p->bias, zx_u8form(p), (const int32_t *)((const char *)wpacked + (size_t)p->M * (size_t)ldl), p->M,
               fb);
}

/* whether a convolution of M rows of K weights may run on isa->conv_fast (if its weights fit) */
int fast_applies(const ql_isa *isa, int64_t M, int64_t K, int64_t taps)
{
    if (!isa->conv_fast) return 0;
    if (taps == 1 && isa->exact_1x1_min_m && M >= isa->exact_1x1_min_m && K >= isa->exact_1x1_min_k &&
        conv_kernel(isa->conv_fast, K, 1) != isa->conv_fast)
        return 0;   /* the level's exact GEMM takes this 1x1 convolution (qlinear.h) */
    return 1;
}

int ql_conv_pack_w_fast(const ql_isa *isa, const void *w, int w_type, int M, int K, int64_t taps,
                        const int32_t *wzp, void *dst, int threads)
{
    if (!fast_applies(isa, M, K, taps)) return 0;
    int rc = pack_w_threads(isa->conv_fast, w, w_type, M, K, taps, wzp, dst, threads);
    return rc == 0 ? 2 : rc == -2 ? -2 : 0;
}

int ql_conv_pack_w_auto(const ql_isa *isa, const void *w, int w_type, int M, int K, int64_t taps,
                        const int32_t *wzp, void *dst, int threads)
{
    int kind = ql_conv_pack_w_fast(isa, w, w_type, M, K, taps, wzp, dst, threads);
    if (kind) return kind;
    return pack_w_threads(isa->exact, w, w_type, M, K, taps, wzp, dst, threads) == -2 ? -2 : 0;
}

