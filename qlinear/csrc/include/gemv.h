/* Matrix-vector products (gemm/gemv.c): MatMulInteger / QLinearMatMul / QGemm on a packed b
 * whose few columns would leave much of the GEMM's panels as padding, for an a of one row.
 *
 * Why: the GEMM packs b in panels of nr columns (32 on the AVX-512 levels); a b of 6 columns
 * (a classifier head: K = 36864, N = 6) fills 6 of 32 and a one-row a streams all 32 through
 * the micro-kernel, 5.3 times the bytes of b. A packed b of such a width (ql_gemv_has_form) also
 * keeps its columns as contiguous rows of bytes after its panels (the "gemv form", written by
 * ql_pack_b), and a product whose a has one row per batch entry reads those instead: each column
 * is one dot product over K, every byte of b read once.
 *
 * Arithmetic: the U8S8 form of the byte GEMM kernels (qlinear.h's ql_epilogue): a in the u8
 * form (int8 ^ 0x80: a + 128), b in the s8 form (uint8 ^ 0x80: b - 128), zero points shifted
 * alike (za', zb'), and
 *     acc_j = Σ_k a'_k b'_kj - zb'_j (Σ_k a'_k - K za') - za' Σ_k b'_kj
 * = Σ_k (a_k - za)(b_kj - zb_j), every sum and product in wrap32 (exactly the contract's
 * wrap32 of the exact sum: a sum modulo 2^32 does not depend on where it wrapped). The dot
 * kernels' products are exact: vpdpbusd adds its four u8 x s8 products to the int32 lane
 * without saturating (it is not vpdpbusds), vpmaddwd's pair sums of zero-extended u8 and
 * sign-extended s8 are at most 2 * 255 * 128 in magnitude. The corrections and the
 * requantization are the level's own epilogue (isa->epilogue), as the GEMM applies them. */
#ifndef QLINEAR_GEMV_H
#define QLINEAR_GEMV_H

#include <stddef.h>
#include <stdint.h>

#include "qlinear.h"

/* bytes of k per kernel step: the dot kernels take whole blocks, the driver the rest */
#define QL_GEMV_KBLOCK 64
/* widest b with a gemv form (its bytes are N x K: at most this many columns are kept twice) */
#define QL_GEMV_MAX_N 256

/* acc[j] = Σ_{k < kbytes} (a[k] ^ flip) · b[j * ldb + k] mod 2^32 for j < n (overwritten) and
 * *asum = Σ_{k < kbytes} (a[k] ^ flip) mod 2^32; kbytes a multiple of QL_GEMV_KBLOCK, a the u8
 * form after the flip (flip 0x80 turns int8 bytes into it), b the s8 form. */
typedef void (*ql_gemv_dot_fn)(const uint8_t *a, uint8_t flip, const int8_t *b, ptrdiff_t ldb,
                               ptrdiff_t kbytes, int n, uint32_t *acc, uint32_t *asum);

typedef struct ql_gemv_kernels {
    const char *name;   /* "portable", "avx2", "avx512vnni" */
    ql_gemv_dot_fn dot;
} ql_gemv_kernels;

extern const ql_gemv_kernels ql_gemv_portable;
#if QL_X86
extern const ql_gemv_kernels ql_gemv_avx2;
#ifndef QL_SIMDE   /* the SIMDe-emulated build has no AVX-512 gemv kernel: the AVX2 one serves */
extern const ql_gemv_kernels ql_gemv_avx512;
#endif
#endif

/* dispatch.c: the kernels for a level (AVX-512 VNNI's on the AVX-512 VNNI and AMX levels of a
 * CPU that has it, AVX2's on any other x86 level, else the portable one); every set computes the
 * same sums */
const ql_gemv_kernels *ql_gemv_for(const ql_isa *isa);

/* Whether a b of N columns packed for kern keeps a gemv form: N <= QL_GEMV_MAX_N columns of which
 * the panels' padding makes at least an eighth of the panels' width. */
int ql_gemv_has_form(const ql_gemm_kernel *kern, int N);
/* bytes of one b entry's gemv form (0 without one), and where it starts in the entry's packed
 * bytes (after the panels, 64-byte aligned within the entry) */
size_t ql_gemv_form_bytes(const ql_gemm_kernel *kern, int K, int N);
size_t ql_gemv_form_offset(const ql_gemm_kernel *kern, int K, int N);
/* Write one entry's gemv form at dst: b element (k, n) at b + k*ks + n*cs (type QL_U8 / QL_I8),
 * zero point of column n at zp[n * zp_cs]. */
void ql_gemv_pack(const void *b, int b_type, ptrdiff_t ks, ptrdiff_t cs, int K, int N, const int32_t *zp,
                  ptrdiff_t zp_cs, char *dst);
/* The product of ql_matmul_run's problem when every batch entry of a has one row (M == 1) and b is
 * packed with a gemv form: 0; -1 (b without a gemv form, M != 1): the caller runs the GEMM. */
int ql_gemv_run(const ql_matmul *mm);
/* matrix-vector products run so far (one relaxed add per ql_gemv_run that ran): the tests'
 * proof that their cases took this path */
extern long long ql_gemv_calls;

#endif
