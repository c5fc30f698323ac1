/* Portable C: the scalar GEMM micro-kernel (I16 form), the packers every level shares,
 * and QuantizeLinear / DequantizeLinear. Compiles on any platform (aarch64 included). */
#include "qlinear.h"

#include <math.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------
 * Packers
 * ------------------------------------------------------------------------------------- */
static inline int32_t load8(const void *src, int type, ptrdiff_t idx) {
    return type == QL_U8 ? (int32_t)((const uint8_t *)src)[idx] : (int32_t)((const int8_t *)src)[idx];
}

int ql_round_k(const ql_gemm_kernel *k, int K) {
    int a = k->kalign ? k->kalign : k->kpack;
    return (K + a - 1) / a * a;
}

size_t ql_panel_bytes(const ql_gemm_kernel *k, int kp) {
    return (size_t)kp * (size_t)k->nr * (k->form == QL_FORM_I16 ? 2u : 1u);
}

void ql_pack_L(const void *src, int type, ptrdiff_t rs, ptrdiff_t ks, int rows, int K,
               const int32_t *zp, ptrdiff_t zp_s, int form, void *dst, ptrdiff_t ldl_bytes,
               int kp, int32_t *rowsums) {
    for (int r = 0; r < rows; r++) {
        ptrdiff_t base = r * rs;
        if (form == QL_FORM_I16) {
            /* centered values: |v| <= 255, an int16 */
            int16_t *d = (int16_t *)((char *)dst + r * ldl_bytes);
            int32_t z = zp ? zp[r * zp_s] : 0;
            if (type == QL_U8 && ks == 1) {
                const uint8_t *s = (const uint8_t *)src + base;
                for (int k = 0; k < K; k++) d[k] = (int16_t)((int32_t)s[k] - z);
            } else if (type == QL_I8 && ks == 1) {
                const int8_t *s = (const int8_t *)src + base;
                for (int k = 0; k < K; k++) d[k] = (int16_t)((int32_t)s[k] - z);
            } else {
                for (int k = 0; k < K; k++) d[k] = (int16_t)(load8(src, type, base + k * ks) - z);
            }
            for (int k = K; k < kp; k++) d[k] = 0;
        } else {
            /* u8 form: uint8 as is, int8 + 128 (= XOR 0x80) */
            uint8_t *d = (uint8_t *)dst + r * ldl_bytes;
            uint8_t flip = type == QL_I8 ? 0x80 : 0;
            uint32_t sum = 0;
            if (ks == 1) {
                const uint8_t *s = (const uint8_t *)src + base;
                for (int k = 0; k < K; k++) {
                    uint8_t v = s[k] ^ flip;
                    d[k] = v;
                    sum += v;
                }
            } else {
                for (int k = 0; k < K; k++) {
                    uint8_t v = ((const uint8_t *)src)[base + k * ks] ^ flip;
                    d[k] = v;
                    sum += v;
                }
            }
            for (int k = K; k < kp; k++) d[k] = 0;
            if (rowsums) rowsums[r] = (int32_t)sum;
        }
    }
}

/* one k row of a panel: ncols values of type T from src (stride cs) into dst (stride step) */
#define PACK_ROW_I16(T)                                                                      \
    do {                                                                                     \
        const T *s = (const T *)src + base;                                                  \
        if (zp_s == 0) {                                                                     \
            int32_t z = zp ? zp[0] : 0;                                                      \
            for (int c = 0; c < ncols; c++) row[c * 2] = (int16_t)((int32_t)s[c * cs] - z);  \
        } else {                                                                             \
            for (int c = 0; c < ncols; c++)                                                  \
                row[c * 2] = (int16_t)((int32_t)s[c * cs] - zp[c * zp_s]);                   \
        }                                                                                    \
    } while (0)

void ql_pack_R_panel(const void *src, int type, ptrdiff_t ks, ptrdiff_t cs, int K, int ncols,
                     const int32_t *zp, ptrdiff_t zp_s, int form, int nr, void *dst, int kp,
                     int32_t *colsums) {
    if (form == QL_FORM_I16) {
        /* [kp/2][nr][2]: element (k, c) at ((k/2)*nr + c)*2 + k%2; centered values |v| <= 255 */
        int16_t *d = (int16_t *)dst;
        if (ncols < nr || K < kp) memset(d, 0, (size_t)kp * nr * sizeof *d);
        for (int k = 0; k < K; k++) {
            int16_t *row = d + (ptrdiff_t)(k >> 1) * nr * 2 + (k & 1);
            ptrdiff_t base = k * ks;
            if (type == QL_U8)
                PACK_ROW_I16(uint8_t);
            else
                PACK_ROW_I16(int8_t);
        }
    } else {
        /* [kp/4][nr][4] s8 form: int8 as is, uint8 - 128 (= XOR 0x80) */
        int8_t *d = (int8_t *)dst;
        uint8_t flip = type == QL_U8 ? 0x80 : 0;
        if (ncols < nr || K < kp) memset(d, 0, (size_t)kp * nr);
        int32_t sums[QL_MAX_NR] = {0};
        for (int k = 0; k < K; k++) {
            int8_t *row = d + (ptrdiff_t)(k >> 2) * nr * 4 + (k & 3);
            const uint8_t *s = (const uint8_t *)src + k * ks;
            for (int c = 0; c < ncols; c++) {
                int8_t v = (int8_t)(s[c * cs] ^ flip);
                row[c * 4] = v;
                sums[c] += v;
            }
        }
        if (colsums)
            for (int c = 0; c < nr; c++) colsums[c] = c < ncols ? sums[c] : 0;
    }
}

/* ---------------------------------------------------------------------------------------
 * Scalar micro-kernel, I16 form: 4 rows x 8 columns
 * ------------------------------------------------------------------------------------- */
#define SMR 4
#define SNR 8
static void scalar_i16(const void *L, ptrdiff_t ldl_bytes, const void *Rpanel, int kp,
                       int32_t *C, ptrdiff_t ldc, int rows) {
    const int16_t *R = (const int16_t *)Rpanel;
    for (int r = 0; r < rows; r++) {
        const int16_t *l = (const int16_t *)((const char *)L + r * ldl_bytes);
        uint32_t acc[SNR] = {0};
        for (int g = 0; g < kp / 2; g++) {
            int32_t l0 = l[2 * g], l1 = l[2 * g + 1];
            const int16_t *rp = R + (ptrdiff_t)g * SNR * 2;
            for (int c = 0; c < SNR; c++)
                /* |l0*r0 + l1*r1| <= 2*255*255 < 2^31: exact; the sum over k wraps (uint32) */
                acc[c] += (uint32_t)(l0 * rp[2 * c] + l1 * rp[2 * c + 1]);
        }
        for (int c = 0; c < SNR; c++) C[r * ldc + c] = (int32_t)acc[c];
    }
}

/* The implicit-GEMM variant (QL_IK_NR columns; the reference for the AVX2 ones): group g's
 * operand [QL_IK_NR][2] centered int16 at base + off[g]. ncols < QL_IK_NR (the tail): only
 * the first ncols columns are computed, the others written as 0. */
static inline void scalar_i16_ik_n(const void *L, ptrdiff_t ldl_bytes, const char *base, const ptrdiff_t *off,
                                   int groups, int32_t *C, ptrdiff_t ldc, int rows, int ncols) {
    for (int r = 0; r < rows; r++) {
        const int16_t *l = (const int16_t *)((const char *)L + r * ldl_bytes);
        uint32_t acc[QL_IK_NR] = {0};
        for (int g = 0; g < groups; g++) {
            int32_t l0 = l[2 * g], l1 = l[2 * g + 1];
            int16_t rp[2 * QL_IK_NR];
            /* the operand need not be 2-byte aligned; a tail reads only its columns */
            memcpy(rp, base + off[g], sizeof(int16_t) * 2 * (size_t)ncols);
            for (int c = 0; c < ncols; c++)
                /* |l0*r0 + l1*r1| <= 2*255*255 < 2^31: exact; the sum over k wraps (uint32) */
                acc[c] += (uint32_t)(l0 * rp[2 * c] + l1 * rp[2 * c + 1]);
        }
        for (int c = 0; c < QL_IK_NR; c++) C[r * ldc + c] = (int32_t)acc[c];
    }
}

static void scalar_i16_ik(const void *L, ptrdiff_t ldl_bytes, const char *base, const ptrdiff_t *off,
                          int groups, int32_t *C, ptrdiff_t ldc, int rows) {
    scalar_i16_ik_n(L, ldl_bytes, base, off, groups, C, ldc, rows, QL_IK_NR);
}

static void scalar_i16_ik_t8(const void *L, ptrdiff_t ldl_bytes, const char *base, const ptrdiff_t *off,
                             int groups, int32_t *C, ptrdiff_t ldc, int rows) {
    scalar_i16_ik_n(L, ldl_bytes, base, off, groups, C, ldc, rows, 8);
}

/* packed panels are already 8 wide (no packed tail); the implicit tiles have an 8-column one */
static const ql_gemm_kernel k_scalar_i16 = {
    .name = "scalar-i16", .mr = SMR, .nr = SNR, .kpack = 2, .form = QL_FORM_I16, .kernel = scalar_i16,
    .pack_L = ql_pack_L, .pack_R = ql_pack_R_panel, .tail_nr = 8,
    .conv = {.ikernel = scalar_i16_ik, .ikernel_tail = scalar_i16_ik_t8},
};

/* ---------------------------------------------------------------------------------------
 * QuantizeLinear / DequantizeLinear
 * ------------------------------------------------------------------------------------- */
static void quantize_scalar(const void *x, int x_type, ptrdiff_t n, const float *scale,
                            ptrdiff_t scale_s, const int32_t *zp, ptrdiff_t zp_s,
                            void *out, int out_type) {
    float qmin = out_type == QL_I8 ? -128.0f : 0.0f, qmax = out_type == QL_I8 ? 127.0f : 255.0f;
    for (ptrdiff_t e = 0; e < n; e++) {
        float xv = x_type == QL_F32 ? ((const float *)x)[e] : (float)((const int32_t *)x)[e];
        int32_t z = zp[e * zp_s];
        float lo = qmin - (float)z, hi = qmax - (float)z;  /* small integers: exact */
        float v = xv / scale[e * scale_s];                 /* a true float32 division */
        if (!(v >= lo)) v = lo;                            /* -inf and NaN -> T's min */
        if (v > hi) v = hi;
        int32_t y = ql_rne(v) + z;
        if (out_type == QL_I8)
            ((int8_t *)out)[e] = (int8_t)y;
        else
            ((uint8_t *)out)[e] = (uint8_t)y;
    }
}

static void dequantize_scalar(const void *x, int x_type, ptrdiff_t n, const float *scale,
                              ptrdiff_t scale_s, const int32_t *zp, ptrdiff_t zp_s, float *out,
                              int stream) {
    (void)stream;
    for (ptrdiff_t e = 0; e < n; e++) {
        int64_t xv = x_type == QL_U8 ? ((const uint8_t *)x)[e]
                   : x_type == QL_I8 ? ((const int8_t *)x)[e] : ((const int32_t *)x)[e];
        /* x - zp exact in integers, one rounding to float32, one float32 multiply */
        out[e] = (float)(xv - zp[e * zp_s]) * scale[e * scale_s];
    }
}

/* The depthwise kernels (conv/depthwise.c, conv/depthwise_cl.c call them through the table) */
void ql_dw_rows_scalar(const int16_t *const *rows, const int16_t *w, int npairs, int32_t *acc,
                       int nblocks, int accumulate)
{
    int n = nblocks * 16;
    for (int i = 0; i < n; i++) {
        uint32_t s = accumulate ? (uint32_t)acc[i] : 0u;
        for (int q = 0; q < npairs; q++) {
            /* |w|, |r| <= 255: the pair sum is below 2^17 in magnitude, exact in int32 */
            int32_t v = (int32_t)w[2 * q] * rows[2 * q][i] + (int32_t)w[2 * q + 1] * rows[2 * q + 1][i];
            s += (uint32_t)v;
        }
        acc[i] = (int32_t)s;
    }
}

void ql_dw_cl_scalar(const int16_t *X, const ptrdiff_t *toff, const int16_t *wt, int npairs, ptrdiff_t step,
                     ptrdiff_t row_step, int rows, int ow, const ql_dw_q *q, void *out)
{
    for (int ro = 0; ro < rows * ow; ro++) {
        int r = ro / ow, o = ro % ow;
        const int16_t *xo = X + ((ptrdiff_t)r * row_step + (ptrdiff_t)o * step) * 16;
        for (int c = 0; c < 16; c++) {
            uint32_t sum = 0;
            for (int t = 0; t < 2 * npairs; t++)   /* |w|, |x| <= 255: each product exact */
                sum += (uint32_t)((int32_t)wt[16 * t + c] * xo[toff[t] * 16 + c]);
            if (!q) {
                ((int32_t *)out)[16 * ro + c] = (int32_t)sum;
                continue;
            }
            /* epilogue.c's arithmetic: wrap32 bias, one float32 multiply, clamp, nearest even */
            sum += (uint32_t)q->bias[c];
            float v = (float)(int32_t)sum * q->mult[c];
            if (!(v >= q->lo)) v = q->lo;
            if (v > q->hi) v = q->hi;
            ((uint8_t *)out)[16 * ro + c] = (uint8_t)(ql_rne(v) + q->zp);   /* in T's range */
        }
    }
}

const ql_isa ql_isa_scalar = {
    "scalar", &k_scalar_i16, NULL, 0, ql_epilogue_scalar, quantize_scalar, dequantize_scalar,
    NULL, ql_dw_rows_scalar, ql_dw_cl_scalar,
};
