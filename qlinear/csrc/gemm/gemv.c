/* Matrix-vector products on a packed b's gemv form (include/gemv.h says when and why): the
 * form, its packer, the portable dot kernel and the driver (threads over blocks of k, the
 * U8S8 corrections and the requantization by the level's epilogue). */
#include "gemv.h"

#include <stdlib.h>
#include <string.h>

long long ql_gemv_calls;

/* below this many multiply-adds (one core: ~15 us) the call runs on one thread (gemm.c's
 * MIN_TASK_MACS rule: a hand-off to the pool costs about what a second core gives) */
#define GEMV_PAR_MACS (1 << 21)
/* bytes of k per threaded task, at least */
#define GEMV_MIN_CHUNK 4096
#define GEMV_MAX_TASKS 16

static size_t round64(size_t n) { return (n + 63) & ~(size_t)63; }
static size_t kpad_of(int K) { return ((size_t)K + QL_GEMV_KBLOCK - 1) / QL_GEMV_KBLOCK * QL_GEMV_KBLOCK; }

int ql_gemv_has_form(const ql_gemm_kernel *kern, int N) {
    if (N <= 0 || N > QL_GEMV_MAX_N) return 0;
    int npad = (N + kern->nr - 1) / kern->nr * kern->nr;
    return (npad - N) * 8 >= npad;
}

size_t ql_gemv_form_offset(const ql_gemm_kernel *kern, int K, int N) {
    size_t npanels = (size_t)(N + kern->nr - 1) / kern->nr;
    return round64(npanels * ql_panel_bytes(kern, ql_round_k(kern, K)));
}

/* [colsum: N int32][zb': N int32], 64-aligned, then N rows of kpad s8-form bytes (zero-padded) */
size_t ql_gemv_form_bytes(const ql_gemm_kernel *kern, int K, int N) {
    if (!ql_gemv_has_form(kern, N)) return 0;
    return round64(8 * (size_t)N) + round64((size_t)N * kpad_of(K));
}

void ql_gemv_pack(const void *b, int b_type, ptrdiff_t ks, ptrdiff_t cs, int K, int N, const int32_t *zp,
                  ptrdiff_t zp_cs, char *dst) {
    int32_t *colsum = (int32_t *)dst, *zcol = colsum + N;
    int8_t *rows = (int8_t *)(dst + round64(8 * (size_t)N));
    size_t kpad = kpad_of(K);
    const uint8_t *src = (const uint8_t *)b;
    uint8_t flip = b_type == QL_U8 ? 0x80 : 0;   /* the s8 form: uint8 - 128, int8 as is */
    for (int j = 0; j < N; j++) {
        int8_t *row = rows + (size_t)j * kpad;
        uint32_t sum = 0;   /* wrap32, as the corrections it enters */
        for (int k = 0; k < K; k++) {
            int8_t v = (int8_t)(src[(ptrdiff_t)k * ks + (ptrdiff_t)j * cs] ^ flip);
            row[k] = v;
            sum += (uint32_t)(int32_t)v;
        }
        memset(row + K, 0, kpad - (size_t)K);
        colsum[j] = (int32_t)sum;
        zcol[j] = zp[(ptrdiff_t)j * zp_cs] - (b_type == QL_U8 ? 128 : 0);
    }
}

/* the portable dot kernel (gemv.h: ql_gemv_dot_fn); also the reference the others must equal */
static void dot_portable(const uint8_t *a, uint8_t flip, const int8_t *b, ptrdiff_t ldb, ptrdiff_t kbytes,
                         int n, uint32_t *acc, uint32_t *asum) {
    uint32_t s = 0;
    for (ptrdiff_t k = 0; k < kbytes; k++) s += (uint8_t)(a[k] ^ flip);
    *asum = s;
    for (int j = 0; j < n; j++) {
        const int8_t *bj = b + (ptrdiff_t)j * ldb;
        uint32_t t = 0;
        /* |u8 * s8| <= 255 * 128: exact in int32; the sum wraps in uint32 */
        for (ptrdiff_t k = 0; k < kbytes; k++) t += (uint32_t)((int32_t)(uint8_t)(a[k] ^ flip) * (int32_t)bj[k]);
        acc[j] = t;
    }
}

const ql_gemv_kernels ql_gemv_portable = {"portable", dot_portable};

typedef struct {
    const ql_matmul *mm;
    const ql_gemv_kernels *gk;
    size_t entry_bytes, form_off, kpad;
    ptrdiff_t kfull, chunk;   /* k bytes the kernels take (whole blocks), per task */
    int chunks;
    uint32_t *part;           /* per task: N sums, then the sum of a' */
} gemv_ctx;

static const int8_t *form_rows(const gemv_ctx *c, ptrdiff_t bi) {
    const ql_matmul *mm = c->mm;
    const char *form = (const char *)mm->bpack + (size_t)mm->b_idx[bi] * c->entry_bytes + c->form_off;
    return (const int8_t *)(form + round64(8 * (size_t)mm->N));
}

static void gemv_task(void *vctx, ptrdiff_t t, int thread) {
    (void)thread;
    gemv_ctx *c = (gemv_ctx *)vctx;
    const ql_matmul *mm = c->mm;
    ptrdiff_t bi = t / c->chunks, k0 = (t % c->chunks) * c->chunk;
    ptrdiff_t kl = c->kfull - k0 < c->chunk ? c->kfull - k0 : c->chunk;
    uint32_t *part = c->part + (size_t)t * ((size_t)mm->N + 1);
    if (kl <= 0) {
        memset(part, 0, ((size_t)mm->N + 1) * sizeof(uint32_t));
        return;
    }
    const uint8_t *a = (const uint8_t *)mm->a + (size_t)mm->a_idx[bi] * (size_t)mm->K + k0;
    c->gk->dot(a, mm->a_type == QL_I8 ? 0x80 : 0, form_rows(c, bi) + k0, (ptrdiff_t)c->kpad, kl, mm->N,
               part, part + mm->N);
}

int ql_gemv_run(const ql_matmul *mm) {
    const ql_gemm_kernel *k = mm->kern;
    if (!mm->bpack || mm->M != 1 || mm->K <= 0 || !ql_gemv_has_form(k, mm->N)) return -1;
    const int N = mm->N, K = mm->K;
    gemv_ctx c;
    memset(&c, 0, sizeof c);
    c.mm = mm;
    c.gk = ql_gemv_for(mm->isa);
    c.entry_bytes = ql_packed_b_bytes(k, K, N);
    c.form_off = ql_gemv_form_offset(k, K, N);
    c.kpad = kpad_of(K);
    c.kfull = (ptrdiff_t)K / QL_GEMV_KBLOCK * QL_GEMV_KBLOCK;
    int threads = mm->threads < ql_num_threads() ? mm->threads : ql_num_threads();
    if ((double)mm->batches * N * K < GEMV_PAR_MACS || threads < 1) threads = 1;
    /* one task per batch entry, or, for few entries, each entry's k cut into blocks (the
     * partial sums are added below, in wrap32: the same sums in any order) */
    c.chunks = 1;
    if (threads > 1 && mm->batches < 2 * threads) {
        ptrdiff_t want = (2 * threads) / (mm->batches > 0 ? mm->batches : 1);
        ptrdiff_t most = c.kfull / GEMV_MIN_CHUNK;
        if (want > most) want = most;
        if (want > GEMV_MAX_TASKS) want = GEMV_MAX_TASKS;
        if (want > 1) c.chunks = (int)want;
    }
    ptrdiff_t per = (c.kfull + c.chunks - 1) / c.chunks;
    c.chunk = (per + QL_GEMV_KBLOCK - 1) / QL_GEMV_KBLOCK * QL_GEMV_KBLOCK;
    ptrdiff_t tasks = mm->batches * c.chunks;
    c.part = malloc((size_t)tasks * ((size_t)N + 1) * sizeof(uint32_t));
    if (!c.part) return -2;
    ql_parallel_for(tasks, threads, gemv_task, &c);
    __atomic_add_fetch(&ql_gemv_calls, 1, __ATOMIC_RELAXED);

    uint32_t acc[QL_GEMV_MAX_N];
    int32_t tile[QL_MAX_NR], cs[QL_MAX_NR];
    const uint8_t flip = mm->a_type == QL_I8 ? 0x80 : 0;
    size_t out_es = mm->quantized ? 1 : 4;
    for (ptrdiff_t bi = 0; bi < mm->batches; bi++) {
        const uint32_t *part = c.part + (size_t)bi * c.chunks * ((size_t)N + 1);
        uint32_t asum = 0;
        for (int j = 0; j < N; j++) acc[j] = 0;
        for (int ch = 0; ch < c.chunks; ch++, part += N + 1) {
            for (int j = 0; j < N; j++) acc[j] += part[j];
            asum += part[N];
        }
        /* the last K % 64 bytes of k: the portable kernel's arithmetic */
        const uint8_t *a = (const uint8_t *)mm->a + (size_t)mm->a_idx[bi] * (size_t)K;
        const int8_t *rows = form_rows(&c, bi);
        for (ptrdiff_t kk = c.kfull; kk < K; kk++) {
            uint8_t av = (uint8_t)(a[kk] ^ flip);
            asum += av;
            for (int j = 0; j < N; j++)
                acc[j] += (uint32_t)((int32_t)av * (int32_t)rows[(size_t)j * c.kpad + (size_t)kk]);
        }
        /* the U8S8 corrections (ql_epilogue): row_a = Σ a' - K za', row_z = za' */
        const char *form = (const char *)rows - round64(8 * (size_t)N);
        const int32_t *colsum = (const int32_t *)form, *zcol = colsum + N;
        int32_t za = mm->zpa[bi * mm->zpa_bs] + (mm->a_type == QL_I8 ? 128 : 0);
        int32_t row_a = (int32_t)(asum - (uint32_t)K * (uint32_t)za), row_z = za;
        ql_epilogue ep;
        memset(&ep, 0, sizeof ep);
        ep.quantized = mm->quantized;
        ep.out = (char *)mm->out + (size_t)bi * (size_t)N * out_es;
        ep.out_rs = N; ep.out_cs = 1;
        if (mm->quantized) {
            ep.mult = mm->mult + bi * mm->m_bs;
            ep.mult_rs = mm->m_rs; ep.mult_cs = mm->m_cs;
            ep.lo = mm->lo; ep.hi = mm->hi; ep.zp = mm->yzp;
            ep.out_is_signed = mm->out_is_signed;
        }
        ep.row_a = &row_a; ep.row_z = &row_z; ep.row_s = 0;
        ep.col_z = zcol; ep.col_z_s = 1;
        /* tiles of at most QL_MAX_NR columns, the column sums zero-padded to the tile's width
         * (the SIMD epilogues may read whole vectors of them) */
        for (int j0 = 0; j0 < N; j0 += QL_MAX_NR) {
            int cols = N - j0 < QL_MAX_NR ? N - j0 : QL_MAX_NR;
            memset(cs, 0, sizeof cs);
            memset(tile, 0, sizeof tile);
            for (int j = 0; j < cols; j++) {
                tile[j] = (int32_t)acc[j0 + j];
                cs[j] = colsum[j0 + j];
            }
            mm->isa->epilogue(&ep, tile, QL_MAX_NR, cs, 0, j0, 1, cols);
        }
    }
    free(c.part);
    return 0;
}
