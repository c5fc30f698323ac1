/* AVX2 kernels (no FMA: nothing here multiplies floats and adds in one step).
 *
 * - avx2-i16 (exact, any 8-bit operands): centered int16 operands, vpmaddwd. Each pair
 *   product sum is |l0*r0 + l1*r1| <= 2*255*255 < 2^31, exact; vpaddd wraps like wrap32.
 * - avx2-u8s8 (fast path, only where packing proved every s8-form R value is within
 *   [-64, 64]): vpmaddubsw forms l0*r0 + l1*r1 with l in [0, 255]: |sum| <= 2*255*64 = 32640
 *   <= 32767, so its int16 saturation can never trigger; vpmaddwd by 1 widens pairs to int32.
 * - avx2-s8u8 (convolutions' fast path, only where packing proved every centered weight
 *   w - zw is within [-64, 64]): the same instructions with the roles swapped: L (weights,
 *   broadcast) is the signed operand, the im2col panel (u8 form, [0, 255]) the unsigned one;
 *   the same bound 2*255*64 = 32640 holds.
 */
#include "qlinear.h"

#if QL_X86
#pragma GCC target("avx2")
#include <immintrin.h>
#include <string.h>

#include "simd_common_avx2.h"


/* The head of a k-group in both tile kernels (I16_GROUP, S8U8_GROUP): the group's operand
 * vectors at src, b0 and b1 the second 32 bytes (nb == 1, the 8-column tail: only the first
 * 32 bytes are read, b1 is b0), and the ROW macros' temporaries a and v. */
#define IK_GROUP_OPERANDS(src)                                                                  \
    const char *s_ = (src);                                                                     \
    __m256i b0 = _mm256_loadu_si256((const __m256i *)s_),                                       \
            b1 = nb > 1 ? _mm256_loadu_si256((const __m256i *)(s_ + 32)) : b0;                  \
    __m256i a;                                                                                  \
    int32_t v;

/* ---------------------------------------------------------------------------------------
 * avx2-i16: 6 rows x 16 columns, 12 ymm accumulators
 * ------------------------------------------------------------------------------------- */
#define I16_MR 6
/* One k-group of the body: the group's two operand vectors at src, the six rows' k-group g
 * (4 bytes each) broadcast, 12 vpmaddwd into the accumulators (nb == 1, the 8-column tail:
 * only the group's first 32 bytes are read). */
#define I16_GROUP(src, g)                                                                       \
    {                                                                                           \
        IK_GROUP_OPERANDS(src)                                                                  \
        I16_ROW(0, c00, c01, g) I16_ROW(1, c10, c11, g) I16_ROW(2, c20, c21, g)                 \
        I16_ROW(3, c30, c31, g) I16_ROW(4, c40, c41, g) I16_ROW(5, c50, c51, g)                 \
    }
#define I16_ROW(r, x0, x1, g)                                                                   \
    memcpy(&v, l[r] + 4 * (g), 4);                                                              \
    a = _mm256_set1_epi32(v);                                                                   \
    x0 = _mm256_add_epi32(x0, _mm256_madd_epi16(a, b0));                                        \
    if (nb > 1) x1 = _mm256_add_epi32(x1, _mm256_madd_epi16(a, b1));
/* The body of both variants: group g's two operand vectors at `base + 64 g` (a packed panel,
 * off NULL) or at `base + off[g]` (implicit GEMM).
 *
 * The implicit loop is bound by Zen 3's dispatch of 6 macro-ops a cycle, not by its 2
 * vpmaddwd a cycle: a k-group's 12 vpmaddwd take 6 cycles at peak (36 dispatch slots), and
 * they with its 12 vpaddd, 2 operand loads and 6 broadcasts fill 32, so every scalar instruction
 * (offset load, prefetch, index arithmetic, loop test) costs. Hence: the loop is split where
 * the prefetch ends (groups - IK_PREFETCH) instead of testing `off` and the prefetch bound in
 * every k-group, the index is a ptrdiff_t (the broadcasts address l[r] + 4 g directly, no
 * sign extension per row) and the prefetching part is unrolled by 2 (one loop test per two
 * k-groups). gcc 12 -O3: about 50 instructions a k-group before, 38.5 after (77 per unrolled
 * pair): faster on every ResNet-50 layer measured (docs/benchmarks.md, "Batch-8 ResNet-50 layers
 * on the exact path"). The
 * arithmetic is the same instructions on the same operands in the same order. */
static inline __attribute__((always_inline)) void
avx2_i16_body(const void *L, ptrdiff_t ldl, const char *base, const ptrdiff_t *off, int groups,
              int rows, __m256i (*out)[2], const int nb) {
    const char *l[I16_MR];
    for (int r = 0; r < I16_MR; r++)  /* missing tail rows re-read row 0; results dropped */
        l[r] = (const char *)L + (r < rows ? r : 0) * ldl;
    __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
            c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    IK_GROUP_LOOP(I16_GROUP)
    out[0][0] = c00; out[0][1] = c01; out[1][0] = c10; out[1][1] = c11; out[2][0] = c20; out[2][1] = c21;
    out[3][0] = c30; out[3][1] = c31; out[4][0] = c40; out[4][1] = c41; out[5][0] = c50; out[5][1] = c51;
    /* the tail's columns 8..15 (never accumulated: still zero) */
}
#undef I16_ROW
#undef I16_GROUP

static inline __attribute__((always_inline)) void store_tile(__m256i (*out)[2], int32_t *C, ptrdiff_t ldc, int rows) {
    for (int r = 0; r < rows; r++) {
        _mm256_storeu_si256((__m256i *)(C + r * ldc), out[r][0]);
        _mm256_storeu_si256((__m256i *)(C + r * ldc + 8), out[r][1]);
    }
}

/* Full 16-column tiles, and the 8-column tail (ql_gemm_kernel.tail_nr): a packed panel's last
 * columns when at most 8 of them are real. The tail reads the same operand layout (the first
 * half of each group's 64 bytes) and writes zeros in columns 8..15 of C. (The implicit path's
 * narrow last tiles take the dot kernels below instead.) */
static void avx2_i16(const void *L, ptrdiff_t ldl, const void *Rpanel, int kp,
                     int32_t *C, ptrdiff_t ldc, int rows) {
    __m256i out[I16_MR][2];
    avx2_i16_body(L, ldl, (const char *)Rpanel, NULL, kp / 2, rows, out, 2);
    store_tile(out, C, ldc, rows);
}

static void avx2_i16_t8(const void *L, ptrdiff_t ldl, const void *Rpanel, int kp,
                        int32_t *C, ptrdiff_t ldc, int rows) {
    __m256i out[I16_MR][2];
    avx2_i16_body(L, ldl, (const char *)Rpanel, NULL, kp / 2, rows, out, 1);
    store_tile(out, C, ldc, rows);
}

static void avx2_i16_ik(const void *L, ptrdiff_t ldl, const char *base, const ptrdiff_t *off, int groups,
                        int32_t *C, ptrdiff_t ldc, int rows) {
    __m256i out[I16_MR][2];
    avx2_i16_body(L, ldl, base, off, groups, rows, out, 2);
    store_tile(out, C, ldc, rows);
}

/* ---------------------------------------------------------------------------------------
 * avx2-u8s8 fast path: 4 rows x 16 columns (vpmaddubsw needs a register of 1s and temporaries)
 * ------------------------------------------------------------------------------------- */
#define U8_MR 4
static inline __attribute__((always_inline)) void
avx2_u8s8_body(const void *L, ptrdiff_t ldl, const __m256i *R, int groups, int rows, __m256i (*out)[2],
               const int nb) {
    const char *l[U8_MR];
    for (int r = 0; r < U8_MR; r++) l[r] = (const char *)L + (r < rows ? r : 0) * ldl;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
            c30 = c00, c31 = c00;
    for (int g = 0; g < groups; g++) {
        __m256i b0 = _mm256_loadu_si256(R + 2 * g), b1 = nb > 1 ? _mm256_loadu_si256(R + 2 * g + 1) : b0;
        __m256i a;
        int32_t v;
#define ROW(r, x0, x1)                                                                                \
        memcpy(&v, l[r] + 4 * g, 4);                                                                  \
        a = _mm256_set1_epi32(v);                                                                     \
        x0 = _mm256_add_epi32(x0, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b0), ones));             \
        if (nb > 1) x1 = _mm256_add_epi32(x1, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b1), ones));
        ROW(0, c00, c01) ROW(1, c10, c11) ROW(2, c20, c21) ROW(3, c30, c31)
#undef ROW
    }
    out[0][0] = c00; out[0][1] = c01; out[1][0] = c10; out[1][1] = c11;
    out[2][0] = c20; out[2][1] = c21; out[3][0] = c30; out[3][1] = c31;
}

static void avx2_u8s8(const void *L, ptrdiff_t ldl, const void *Rpanel, int kp,
                      int32_t *C, ptrdiff_t ldc, int rows) {
    __m256i out[U8_MR][2];
    avx2_u8s8_body(L, ldl, (const __m256i *)Rpanel, kp / 4, rows, out, 2);
    store_tile(out, C, ldc, rows);
}

static void avx2_u8s8_t8(const void *L, ptrdiff_t ldl, const void *Rpanel, int kp,
                         int32_t *C, ptrdiff_t ldc, int rows) {
    __m256i out[U8_MR][2];
    avx2_u8s8_body(L, ldl, (const __m256i *)Rpanel, kp / 4, rows, out, 1);
    store_tile(out, C, ldc, rows);
}

/* ---------------------------------------------------------------------------------------
 * avx2-s8u8 (conv fast path): 4 rows x 16 columns; vpmaddubsw(unsigned operand, signed weights)
 * ------------------------------------------------------------------------------------- */
/* One k-group of the body: the group's operand vectors at src (u8 form), the four rows' 4
 * weight bytes broadcast, vpmaddubsw then vpmaddwd by 1 (nb == 1: the first 32 bytes only) */
#define S8U8_GROUP(src, g)                                                                      \
    {                                                                                           \
        IK_GROUP_OPERANDS(src)                                                                  \
        S8U8_ROW(0, c00, c01, g) S8U8_ROW(1, c10, c11, g)                                       \
        S8U8_ROW(2, c20, c21, g) S8U8_ROW(3, c30, c31, g)                                       \
    }
#define S8U8_ROW(r, x0, x1, g)                                                                  \
    memcpy(&v, l[r] + 4 * (g), 4);                                                              \
    a = _mm256_set1_epi32(v);                                                                   \
    x0 = _mm256_add_epi32(x0, _mm256_madd_epi16(_mm256_maddubs_epi16(b0, a), ones));           \
    if (nb > 1) x1 = _mm256_add_epi32(x1, _mm256_madd_epi16(_mm256_maddubs_epi16(b1, a), ones));
/* The same k-group loop as avx2_i16_body (IK_GROUP_LOOP). */
static inline __attribute__((always_inline)) void
avx2_s8u8_body(const void *L, ptrdiff_t ldl, const char *base, const ptrdiff_t *off, int groups,
               int rows, __m256i (*out)[2], const int nb) {
    const char *l[U8_MR];
    for (int r = 0; r < U8_MR; r++) l[r] = (const char *)L + (r < rows ? r : 0) * ldl;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
            c30 = c00, c31 = c00;
    IK_GROUP_LOOP(S8U8_GROUP)
    out[0][0] = c00; out[0][1] = c01; out[1][0] = c10; out[1][1] = c11;
    out[2][0] = c20; out[2][1] = c21; out[3][0] = c30; out[3][1] = c31;
}
#undef S8U8_ROW
#undef S8U8_GROUP

static void avx2_s8u8(const void *L, ptrdiff_t ldl, const void *Rpanel, int kp,
                      int32_t *C, ptrdiff_t ldc, int rows) {
    __m256i out[U8_MR][2];
    avx2_s8u8_body(L, ldl, (const char *)Rpanel, NULL, kp / 4, rows, out, 2);
    store_tile(out, C, ldc, rows);
}

static void avx2_s8u8_t8(const void *L, ptrdiff_t ldl, const void *Rpanel, int kp,
                         int32_t *C, ptrdiff_t ldc, int rows) {
    __m256i out[U8_MR][2];
    avx2_s8u8_body(L, ldl, (const char *)Rpanel, NULL, kp / 4, rows, out, 1);
    store_tile(out, C, ldc, rows);
}

static void avx2_s8u8_ik(const void *L, ptrdiff_t ldl, const char *base, const ptrdiff_t *off, int groups,
                         int32_t *C, ptrdiff_t ldc, int rows) {
    __m256i out[U8_MR][2];
    avx2_s8u8_body(L, ldl, base, off, groups, rows, out, 2);
    store_tile(out, C, ldc, rows);
}

/* ---------------------------------------------------------------------------------------
 * Dot kernels (ql_dot_fn) for the last few columns of a tile: up to 6 rows x 2 columns a
 * pass, 32 bytes of k at a time from each L row and each gathered column, horizontal sums
 * at the end. The same products as the tile kernels (I16: vpmaddwd; S8U8: vpmaddubsw of the
 * u8-form column and the weights proven within [-64, 64], then vpmaddwd by 1), so the same
 * bounds; only the order of the wrapping int32 additions differs, and wrap32 addition is
 * associative and commutative, so the sums are the same.
 * ------------------------------------------------------------------------------------- */
#define DOT_MR 6
#define DOT_KC 2048                     /* bytes of k per chunk */
static inline __attribute__((always_inline)) __m256i dot_prod(__m256i l, __m256i x, const int s8u8) {
    return s8u8 ? _mm256_madd_epi16(_mm256_maddubs_epi16(x, l), _mm256_set1_epi16(1)) : _mm256_madd_epi16(l, x);
}

static inline __attribute__((always_inline)) int32_t hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* 8 vectors' horizontal sums as one vector: lane j = sum of v[j]'s lanes (vphaddd adds
 * without saturation, wrapping like every other int32 addition here) */
static inline __attribute__((always_inline)) __m256i hsum8(__m256i v0, __m256i v1, __m256i v2, __m256i v3,
                                                          __m256i v4, __m256i v5, __m256i v6, __m256i v7) {
    __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
    __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v4, v5), _mm256_hadd_epi32(v6, v7));
    return _mm256_add_epi32(_mm256_permute2x128_si256(h0, h1, 0x20), _mm256_permute2x128_si256(h0, h1, 0x31));
}

/* Columns x0 and x1 (two; else x0 only) over k-chunk [k0, k1) of 32 bytes each, into the
 * pair's accumulators ap (row r: ap[2r] column x0, ap[2r + 1] column x1) */
static inline __attribute__((always_inline)) void
dot_pair(const char *const *l, const __m256i *ltail, int n32, const char *x0, const char *x1, int k0, int k1,
         __m256i *ap, const int s8u8, const int two) {
    __m256i a00 = ap[0], a01 = ap[1], a10 = ap[2], a11 = ap[3], a20 = ap[4], a21 = ap[5],
            a30 = ap[6], a31 = ap[7], a40 = ap[8], a41 = ap[9], a50 = ap[10], a51 = ap[11];
    for (int k = k0; k < k1; k++) {
        /* columns are zero-padded to a multiple of 32 bytes: the last load is in bounds */
        __m256i v0 = _mm256_loadu_si256((const __m256i *)(x0 + 32 * (ptrdiff_t)k));
        __m256i v1 = two ? _mm256_loadu_si256((const __m256i *)(x1 + 32 * (ptrdiff_t)k)) : v0;
        __m256i w;
#define ROW(r, y0, y1)                                                                     \
        w = k < n32 ? _mm256_loadu_si256((const __m256i *)(l[r] + 32 * (ptrdiff_t)k)) : ltail[r]; \
        y0 = _mm256_add_epi32(y0, dot_prod(w, v0, s8u8));                                   \
        if (two) y1 = _mm256_add_epi32(y1, dot_prod(w, v1, s8u8));
        ROW(0, a00, a01) ROW(1, a10, a11) ROW(2, a20, a21)
        ROW(3, a30, a31) ROW(4, a40, a41) ROW(5, a50, a51)
#undef ROW
    }
    ap[0] = a00; ap[1] = a01; ap[2] = a10; ap[3] = a11; ap[4] = a20; ap[5] = a21;
    ap[6] = a30; ap[7] = a31; ap[8] = a40; ap[9] = a41; ap[10] = a50; ap[11] = a51;
}

/* The product of up to DOT_MR rows and ncols <= 8 columns into t[r][c] (t zeroed by the
 * caller; columns >= ncols stay 0). */
static inline __attribute__((always_inline)) void
avx2_dot_body(const void *L, ptrdiff_t ldl, const void *X, ptrdiff_t xs, int kbytes, int ncols,
              int32_t (*t)[8], int rows, const int s8u8) {
    const char *l[DOT_MR];
    for (int r = 0; r < DOT_MR; r++)  /* missing rows re-read row 0; results dropped */
        l[r] = (const char *)L + (r < rows ? r : 0) * ldl;
    int n32 = kbytes / 32, rem = kbytes % 32;
    /* the rows' last partial 32 bytes, zero-padded (an L row is read only within kbytes) */
    __m256i ltail[DOT_MR];
    for (int r = 0; r < DOT_MR; r++) {
        uint8_t b[32] = {0};
        if (rem) memcpy(b, l[r] + (ptrdiff_t)n32 * 32, (size_t)rem);
        ltail[r] = _mm256_loadu_si256((const __m256i *)b);
    }
    /* k in chunks of DOT_KC bytes, every column pair over a chunk before the next one: the
     * chunk of the 6 rows (12 KiB) stays in L1 across the pairs (a 3x3 512-channel row is
     * 9 KiB: 6 of them do not fit); the pairs' accumulators wait in acc between chunks */
    __m256i acc[QL_DOT_NR / 2][2 * DOT_MR];
    for (int p = 0; p < QL_DOT_NR / 2; p++)
        for (int e = 0; e < 2 * DOT_MR; e++) acc[p][e] = _mm256_setzero_si256();
    const int nk = n32 + (rem != 0);
    for (int k0 = 0; k0 < nk; k0 += DOT_KC / 32) {
        const int k1 = nk - k0 < DOT_KC / 32 ? nk : k0 + DOT_KC / 32;
        for (int c0 = 0; c0 < ncols; c0 += 2) {
            const char *x0 = (const char *)X + c0 * xs;
            /* an odd last column alone: half the products of a pair (a 7x7 plane's 49th) */
            if (c0 + 1 < ncols)
                dot_pair(l, ltail, n32, x0, x0 + xs, k0, k1, acc[c0 / 2], s8u8, 1);
            else
                dot_pair(l, ltail, n32, x0, x0, k0, k1, acc[c0 / 2], s8u8, 0);
        }
    }
    for (int c0 = 0; c0 < ncols; c0 += 2) {
        const int two = c0 + 1 < ncols;
        const __m256i *ap = acc[c0 / 2];
        int32_t sv[16];
        const __m256i z = _mm256_setzero_si256();
        _mm256_storeu_si256((__m256i *)sv, hsum8(ap[0], ap[1], ap[2], ap[3], ap[4], ap[5], ap[6], ap[7]));
        _mm256_storeu_si256((__m256i *)(sv + 8), hsum8(ap[8], ap[9], ap[10], ap[11], z, z, z, z));
        for (int r = 0; r < rows; r++) {
            t[r][c0] = sv[2 * r];
            if (two) t[r][c0 + 1] = sv[2 * r + 1];
        }
    }
}

static inline __attribute__((always_inline)) void
avx2_dot_store(const void *L, ptrdiff_t ldl, const void *X, ptrdiff_t xs, int kbytes, int ncols,
               int32_t *C, ptrdiff_t ldc, int rows, const int s8u8) {
    int32_t t[DOT_MR][8] = {{0}};
    avx2_dot_body(L, ldl, X, xs, kbytes, ncols, t, rows, s8u8);
    for (int r = 0; r < rows; r++) memcpy(C + r * ldc, t[r], sizeof(int32_t) * (size_t)ncols);
}

static void avx2_i16_dot(const void *L, ptrdiff_t ldl, const void *X, ptrdiff_t xs, int kbytes, int ncols,
                         int32_t *C, ptrdiff_t ldc, int rows) {
    avx2_dot_store(L, ldl, X, xs, kbytes, ncols, C, ldc, rows, 0);
}

static void avx2_s8u8_dot(const void *L, ptrdiff_t ldl, const void *X, ptrdiff_t xs, int kbytes, int ncols,
                          int32_t *C, ptrdiff_t ldc, int rows) {
    avx2_dot_store(L, ldl, X, xs, kbytes, ncols, C, ldc, rows, 1);
}

/* ---------------------------------------------------------------------------------------
 * Packers (used by every x86 level): the portable ones' output, 16 or 32 values a step
 * ------------------------------------------------------------------------------------- */
void ql_pack_L_avx2(const void *src, int type, ptrdiff_t rs, ptrdiff_t ks, int rows, int K,
                    const int32_t *zp, ptrdiff_t zp_s, int form, void *dst, ptrdiff_t ldl_bytes,
                    int kp, int32_t *rowsums) {
    if (ks != 1) {
        ql_pack_L(src, type, rs, ks, rows, K, zp, zp_s, form, dst, ldl_bytes, kp, rowsums);
        return;
    }
    for (int r = 0; r < rows; r++) {
        const uint8_t *s = (const uint8_t *)src + r * rs;
        int k = 0;
        if (form == QL_FORM_I16) {
            /* centered int16: widen 16 bytes, subtract the row's zero point (|v| <= 255) */
            int16_t *d = (int16_t *)((char *)dst + r * ldl_bytes);
            int32_t z = zp ? zp[r * zp_s] : 0;
            __m256i zv = _mm256_set1_epi16((int16_t)z);
            for (; k + 16 <= K; k += 16) {
                __m128i b = _mm_loadu_si128((const __m128i *)(s + k));
                __m256i w = type == QL_U8 ? _mm256_cvtepu8_epi16(b) : _mm256_cvtepi8_epi16(b);
                _mm256_storeu_si256((__m256i *)(d + k), _mm256_sub_epi16(w, zv));
            }
            for (; k < K; k++)
                d[k] = (int16_t)((type == QL_U8 ? (int32_t)s[k] : (int32_t)(int8_t)s[k]) - z);
            for (; k < kp; k++) d[k] = 0;
        } else {
            /* u8 form (int8 ^ 0x80), row sum by vpsadbw against zero (exact: |sum| < 2^31) */
            uint8_t *d = (uint8_t *)dst + r * ldl_bytes;
            uint8_t flip = type == QL_I8 ? 0x80 : 0;
            __m256i fv = _mm256_set1_epi8((char)flip), acc = _mm256_setzero_si256();
            for (; k + 32 <= K; k += 32) {
                __m256i v = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(s + k)), fv);
                _mm256_storeu_si256((__m256i *)(d + k), v);
                acc = _mm256_add_epi64(acc, _mm256_sad_epu8(v, _mm256_setzero_si256()));
            }
            uint64_t lanes[4];
            _mm256_storeu_si256((__m256i *)lanes, acc);
            uint32_t sum = (uint32_t)(lanes[0] + lanes[1] + lanes[2] + lanes[3]);
            for (; k < K; k++) {
                uint8_t v = s[k] ^ flip;
                d[k] = v;
                sum += v;
            }
            for (; k < kp; k++) d[k] = 0;
            if (rowsums) rowsums[r] = (int32_t)sum;
        }
    }
}

void ql_pack_R_panel_avx2(const void *src, int type, ptrdiff_t ks, ptrdiff_t cs, int K, int ncols,
                          const int32_t *zp, ptrdiff_t zp_s, int form, int nr, void *dst, int kp,
                          int32_t *colsums) {
    /* full 16-column panels of contiguous rows; anything else takes the portable packer */
    if (cs != 1 || nr % 16 != 0 || ncols != nr || (zp_s != 0 && zp_s != 1)) {
        ql_pack_R_panel(src, type, ks, cs, K, ncols, zp, zp_s, form, nr, dst, kp, colsums);
        return;
    }
    const uint8_t *s = (const uint8_t *)src;
    if (form == QL_FORM_I16) {
        if (nr != 16) {
            ql_pack_R_panel(src, type, ks, cs, K, ncols, zp, zp_s, form, nr, dst, kp, colsums);
            return;
        }
        /* rows k, k+1 widened, centered, interleaved into 16 (k, k+1) pairs: [nr][2] int16 */
        __m256i zv;
        if (zp_s == 0) {
            zv = _mm256_set1_epi16((int16_t)(zp ? zp[0] : 0));
        } else {
            __m256i z0 = _mm256_loadu_si256((const __m256i *)zp), z1 = _mm256_loadu_si256((const __m256i *)(zp + 8));
            zv = _mm256_permute4x64_epi64(_mm256_packs_epi32(z0, z1), 0xD8);  /* zp in int8/uint8 range */
        }
        int16_t *d = (int16_t *)dst;
        for (int k = 0; k < kp; k += 2) {
            __m256i r0 = _mm256_setzero_si256(), r1 = r0;
            if (k < K) {
                __m128i b = _mm_loadu_si128((const __m128i *)(s + (ptrdiff_t)k * ks));
                r0 = _mm256_sub_epi16(type == QL_U8 ? _mm256_cvtepu8_epi16(b) : _mm256_cvtepi8_epi16(b), zv);
            }
            if (k + 1 < K) {
                __m128i b = _mm_loadu_si128((const __m128i *)(s + (ptrdiff_t)(k + 1) * ks));
                r1 = _mm256_sub_epi16(type == QL_U8 ? _mm256_cvtepu8_epi16(b) : _mm256_cvtepi8_epi16(b), zv);
            }
            __m256i lo = _mm256_unpacklo_epi16(r0, r1), hi = _mm256_unpackhi_epi16(r0, r1);
            _mm256_storeu_si256((__m256i *)(d + (ptrdiff_t)k * 16), _mm256_permute2x128_si256(lo, hi, 0x20));
            _mm256_storeu_si256((__m256i *)(d + (ptrdiff_t)k * 16 + 16), _mm256_permute2x128_si256(lo, hi, 0x31));
        }
        return;
    }
    /* U8S8: rows k..k+3 (s8 form) interleaved into 16-column groups of 4 bytes; column sums
     * by vpmaddubsw(1, v) (|pair| <= 256) and vpmaddwd(1): exact */
    const __m128i fv = _mm_set1_epi8((char)(type == QL_U8 ? 0x80 : 0)), one8 = _mm_set1_epi8(1),
                  one16 = _mm_set1_epi16(1);
    int8_t *d = (int8_t *)dst;
    int c0 = 0;
    /* 32 columns a step on ymm (the VNNI and AMX panels are 32 wide): the same unpacks per
     * 128-bit lane (lane 0 = columns c0..c0+15, lane 1 = c0+16..c0+31), then vperm2i128
     * gathers each 16-column group's four 16-byte quarters; the same bytes and sums as the
     * 16-column loop below, in half the instructions */
    const __m256i fv2 = _mm256_set1_epi8((char)(type == QL_U8 ? 0x80 : 0)), one8x = _mm256_set1_epi8(1),
                  one16x = _mm256_set1_epi16(1);
    for (; c0 + 32 <= nr; c0 += 32) {
        __m256i sum[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                          _mm256_setzero_si256()};
        for (int k = 0; k < kp; k += 4) {
            __m256i r[4];
            for (int t = 0; t < 4; t++)
                r[t] = k + t < K ? _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(s + (ptrdiff_t)(k + t) * ks + c0)), fv2)
                                 : _mm256_setzero_si256();
            __m256i a01lo = _mm256_unpacklo_epi8(r[0], r[1]), a01hi = _mm256_unpackhi_epi8(r[0], r[1]);
            __m256i a23lo = _mm256_unpacklo_epi8(r[2], r[3]), a23hi = _mm256_unpackhi_epi8(r[2], r[3]);
            /* per lane: q0 = columns 0-3 of the lane's 16 (4 bytes each), q1 = 4-7, q2 = 8-11, q3 = 12-15 */
            __m256i q0 = _mm256_unpacklo_epi16(a01lo, a23lo), q1 = _mm256_unpackhi_epi16(a01lo, a23lo);
            __m256i q2 = _mm256_unpacklo_epi16(a01hi, a23hi), q3 = _mm256_unpackhi_epi16(a01hi, a23hi);
            __m256i o[4] = {_mm256_permute2x128_si256(q0, q1, 0x20), _mm256_permute2x128_si256(q2, q3, 0x20),
                            _mm256_permute2x128_si256(q0, q1, 0x31), _mm256_permute2x128_si256(q2, q3, 0x31)};
            int8_t *out = d + (ptrdiff_t)(k / 4) * nr * 4 + c0 * 4;
            for (int t = 0; t < 4; t++) {
                _mm256_storeu_si256((__m256i *)(out + 32 * t), o[t]);
                sum[t] = _mm256_add_epi32(sum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(one8x, o[t]), one16x));
            }
        }
        if (colsums)
            for (int t = 0; t < 4; t++) _mm256_storeu_si256((__m256i *)(colsums + c0 + 8 * t), sum[t]);
    }
    for (; c0 < nr; c0 += 16) {
        __m128i sum[4] = {_mm_setzero_si128(), _mm_setzero_si128(), _mm_setzero_si128(), _mm_setzero_si128()};
        for (int k = 0; k < kp; k += 4) {
            __m128i r[4];
            for (int t = 0; t < 4; t++)
                r[t] = k + t < K ? _mm_xor_si128(_mm_loadu_si128((const __m128i *)(s + (ptrdiff_t)(k + t) * ks + c0)), fv)
                                 : _mm_setzero_si128();
            __m128i a01lo = _mm_unpacklo_epi8(r[0], r[1]), a01hi = _mm_unpackhi_epi8(r[0], r[1]);
            __m128i a23lo = _mm_unpacklo_epi8(r[2], r[3]), a23hi = _mm_unpackhi_epi8(r[2], r[3]);
            __m128i q[4] = {_mm_unpacklo_epi16(a01lo, a23lo), _mm_unpackhi_epi16(a01lo, a23lo),
                            _mm_unpacklo_epi16(a01hi, a23hi), _mm_unpackhi_epi16(a01hi, a23hi)};
            int8_t *o = d + (ptrdiff_t)(k / 4) * nr * 4 + c0 * 4;
            for (int t = 0; t < 4; t++) {
                _mm_storeu_si128((__m128i *)(o + 16 * t), q[t]);
                sum[t] = _mm_add_epi32(sum[t], _mm_madd_epi16(_mm_maddubs_epi16(one8, q[t]), one16));
            }
        }
        if (colsums)
            for (int t = 0; t < 4; t++) _mm_storeu_si128((__m128i *)(colsums + c0 + 4 * t), sum[t]);
    }
}

/* Implicit-GEMM kernels with the epilogue applied from the accumulators: ql_ik_epilogue_avx2
 * (simd_common_avx2.h) */
static void avx2_i16_ik_ep(const void *L, ptrdiff_t ldl, const char *base, const ptrdiff_t *off, int groups,
                           const ql_epilogue *ep, const ql_ik_runs *rn, int i0, int rows) {
    __m256i out[I16_MR][2];
    avx2_i16_body(L, ldl, base, off, groups, rows, out, 2);
    ql_ik_epilogue_avx2(out, ep, rn, i0, rows);
}

static void avx2_s8u8_ik_ep(const void *L, ptrdiff_t ldl, const char *base, const ptrdiff_t *off, int groups,
                            const ql_epilogue *ep, const ql_ik_runs *rn, int i0, int rows) {
    __m256i out[U8_MR][2];
    avx2_s8u8_body(L, ldl, base, off, groups, rows, out, 2);
    ql_ik_epilogue_avx2(out, ep, rn, i0, rows);
}

/* the dot kernels with the fused epilogue: the sums as the low 8 columns of a tile */
static inline __attribute__((always_inline)) void
avx2_dot_ep(const void *L, ptrdiff_t ldl, const void *X, ptrdiff_t xs, int kbytes, int ncols,
            const ql_epilogue *ep, const ql_ik_runs *rn, int i0, int rows, const int s8u8) {
    int32_t t[DOT_MR][8] = {{0}};
    avx2_dot_body(L, ldl, X, xs, kbytes, ncols, t, rows, s8u8);
    __m256i out[DOT_MR][2];
    for (int r = 0; r < DOT_MR; r++) {
        out[r][0] = _mm256_loadu_si256((const __m256i *)t[r]);
        out[r][1] = _mm256_setzero_si256();
    }
    ql_ik_epilogue_avx2(out, ep, rn, i0, rows);
}

static void avx2_i16_dot_ep(const void *L, ptrdiff_t ldl, const void *X, ptrdiff_t xs, int kbytes, int ncols,
                            const ql_epilogue *ep, const ql_ik_runs *rn, int i0, int rows) {
    avx2_dot_ep(L, ldl, X, xs, kbytes, ncols, ep, rn, i0, rows, 0);
}

static void avx2_s8u8_dot_ep(const void *L, ptrdiff_t ldl, const void *X, ptrdiff_t xs, int kbytes, int ncols,
                             const ql_epilogue *ep, const ql_ik_runs *rn, int i0, int rows) {
    avx2_dot_ep(L, ldl, X, xs, kbytes, ncols, ep, rn, i0, rows, 1);
}

static void avx2_i16_ep(const void *L, ptrdiff_t ldl, const void *Rpanel, int kp,
                        const ql_epilogue *ep, const int32_t *colsum, int i0, int j0, int rows, int cols);

static const ql_gemm_kernel k_avx2_i16 = {
    .name = "avx2-i16", .mr = I16_MR, .nr = 16, .kpack = 2, .form = QL_FORM_I16, .kernel = avx2_i16,
    .pack_L = ql_pack_L_avx2, .pack_R = ql_pack_R_panel_avx2, .kernel_ep = avx2_i16_ep, .tail_nr = 8,
    .kernel_tail = avx2_i16_t8,
    .conv = {.ikernel = avx2_i16_ik, .ikernel_ep = avx2_i16_ik_ep, .dot = avx2_i16_dot, .dot_ep = avx2_i16_dot_ep,
             .grouped_i16_t9 = ql_grouped_i16_t9_avx2},
};
static void avx2_u8s8_ep(const void *L, ptrdiff_t ldl, const void *Rpanel, int kp,
                         const ql_epilogue *ep, const int32_t *colsum, int i0, int j0, int rows, int cols);
static const ql_gemm_kernel k_avx2_u8s8 = {
    .name = "avx2-u8s8", .mr = U8_MR, .nr = 16, .kpack = 4, .form = QL_FORM_U8S8, .kernel = avx2_u8s8,
    .pack_L = ql_pack_L_avx2, .pack_R = ql_pack_R_panel_avx2, .kernel_ep = avx2_u8s8_ep, .tail_nr = 8,
    .kernel_tail = avx2_u8s8_t8, .conv = {QL_BYTE_PACKERS_AVX2},
};

/* conv fast path: L and R packed by conv/ (centered int8 weights, u8-form im2col panels) */
static void avx2_s8u8_ep(const void *L, ptrdiff_t ldl, const void *Rpanel, int kp,
                         const ql_epilogue *ep, const int32_t *colsum, int i0, int j0, int rows, int cols);
static const ql_gemm_kernel k_avx2_s8u8 = {
    .name = "avx2-s8u8", .mr = U8_MR, .nr = 16, .kpack = 4, .form = QL_FORM_S8U8, .kernel = avx2_s8u8,
    .kernel_ep = avx2_s8u8_ep, .tail_nr = 8, .kernel_tail = avx2_s8u8_t8,
    .conv = {.ikernel = avx2_s8u8_ik, .ikernel_ep = avx2_s8u8_ik_ep, .dot = avx2_s8u8_dot, .dot_ep = avx2_s8u8_dot_ep,
             .s8_bound = 64 /* vpmaddubsw */, QL_BYTE_PACKERS_AVX2},
};


/* ---------------------------------------------------------------------------------------
 * avx2-i16 with the epilogue fused (kernel_ep, matmuls): the tile's accumulators go through
 * ql_epilogue_avx2's instructions (vpaddd bias, cvtdq2ps, mulps, maxps lo, minps hi,
 * cvtps2dq, vpaddd zp, saturating packs of in-range values) straight from the registers, one
 * 16-byte (or two 32-byte) store per row: no int32 tile written and read back. Short tiles
 * (the last rows of M) run a 4- or 2-row body instead of 6 rows of which some are dropped.
 * ------------------------------------------------------------------------------------- */
static inline __attribute__((always_inline)) void
i16_rows_body(const char *L, ptrdiff_t ldl, const char *R, int groups, const int mr, int rows,
              __m256i (*out)[2]) {
    const char *l[I16_MR];
    __m256i c[I16_MR][2];
    for (int r = 0; r < mr; r++) {
        l[r] = L + (r < rows ? r : 0) * ldl;   /* a missing row re-reads row 0; dropped */
        c[r][0] = c[r][1] = _mm256_setzero_si256();
    }
    for (int g = 0; g < groups; g++) {
        __m256i b0 = _mm256_loadu_si256((const __m256i *)(R + (ptrdiff_t)64 * g));
        __m256i b1 = _mm256_loadu_si256((const __m256i *)(R + (ptrdiff_t)64 * g + 32));
        for (int r = 0; r < mr; r++) {
            int32_t v;
            memcpy(&v, l[r] + 4 * g, 4);
            __m256i a = _mm256_set1_epi32(v);
            c[r][0] = _mm256_add_epi32(c[r][0], _mm256_madd_epi16(a, b0));
            c[r][1] = _mm256_add_epi32(c[r][1], _mm256_madd_epi16(a, b1));
        }
    }
    for (int r = 0; r < mr; r++) {
        out[r][0] = c[r][0];
        out[r][1] = c[r][1];
    }
}

/* (the tile's epilogue: ql_finish_tile16_avx2, simd_common_avx2.h, shared with the VNNI levels) */
_Static_assert(I16_MR <= QL_MAX_MR, "ql_finish_tile16_avx2's tile holds any kernel's rows");

static void avx2_i16_ep(const void *L, ptrdiff_t ldl, const void *Rpanel, int kp,
                        const ql_epilogue *ep, const int32_t *colsum, int i0, int j0, int rows, int cols) {
    __m256i out[I16_MR][2];
    int groups = kp / 2;
    if (rows > 4)
        avx2_i16_body(L, ldl, (const char *)Rpanel, NULL, groups, rows, out, 2);
    else if (rows > 2)
        i16_rows_body((const char *)L, ldl, (const char *)Rpanel, groups, 4, rows, out);
    else
        i16_rows_body((const char *)L, ldl, (const char *)Rpanel, groups, 2, rows, out);
    ql_finish_tile16_avx2(out, ep, colsum, i0, j0, rows, cols);
}

/* avx2-u8s8 (the 7-bit fast path) with the epilogue fused, its U8S8 corrections included */
static void avx2_u8s8_ep(const void *L, ptrdiff_t ldl, const void *Rpanel, int kp,
                         const ql_epilogue *ep, const int32_t *colsum, int i0, int j0, int rows, int cols) {
    __m256i out[U8_MR][2];
    avx2_u8s8_body(L, ldl, (const __m256i *)Rpanel, kp / 4, rows, out, 2);
    ql_finish_tile16_avx2(out, ep, colsum, i0, j0, rows, cols);
}

/* avx2-s8u8 (the convolutions' 7-bit fast path, im2col panels) with the epilogue fused: the
 * S8U8 form has no U8S8 corrections (row_a NULL: its one per-row term is folded into the bias) */
static void avx2_s8u8_ep(const void *L, ptrdiff_t ldl, const void *Rpanel, int kp,
                         const ql_epilogue *ep, const int32_t *colsum, int i0, int j0, int rows, int cols) {
    __m256i out[U8_MR][2];
    avx2_s8u8_body(L, ldl, (const char *)Rpanel, NULL, kp / 4, rows, out, 2);
    ql_finish_tile16_avx2(out, ep, colsum, i0, j0, rows, cols);
}

const ql_isa ql_isa_avx2 = {
    "avx2", &k_avx2_i16, &k_avx2_u8s8, 0, ql_epilogue_avx2, ql_quantize_avx2, ql_dequantize_avx2,
    &k_avx2_s8u8, ql_dw_rows_avx2, ql_dw_cl_avx2,
    .dw_t16 = ql_dw_t16_avx2, .dw_store32 = ql_dw_store_avx2,
};
#endif
