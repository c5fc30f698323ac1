/* The newer formats' conversion kernels (include/formats.h), written once in plain C and compiled
 * three times: formats/portable.c (the baseline ISA, always built), isa/formats_avx2.c and
 * isa/formats_avx512.c (the same source under `#pragma GCC target`, so that the compiler's
 * vectorizer turns each loop into 8- or 16-lane code). Every loop is branch-free selects on
 * float32/uint32 values, so the vectorized loops compute what the scalar ones compute, lane by
 * lane: IEEE float32 division, multiplication, addition and subtraction are correctly rounded
 * in any vector width, the build forbids contraction (-ffp-contract=off) and fast-math, and the
 * rest is integer bit manipulation.
 *
 * Work goes through a tile of QF_TILE float32 values on the stack (a few KiB, in L1): widen the
 * input exactly, round to P, divide, round to P, convert and store. Each step is one simple
 * loop. The including file defines QF_NAME (its ql_fmt_kernels variable) and QF_LABEL. */
#include "formats.h"

#include <string.h>

#define QF_TILE 512

static inline uint32_t qf_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float qf_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* float16 -> float32, exact, over a run. Normal: rebias the exponent (15 -> 127) and widen the
 * mantissa. Subnormal m·2^-24: built as 2^-14·(1 + m/1024) minus 2^-14, both exact, so the
 * difference is exact. Inf/NaN: the exponent all ones, the payload kept. The float subtraction
 * runs for every value in a loop of its own: inside the select loop the compiler would move it
 * under the branch that uses it, and a conditional float operation does not vectorize on AVX2.
 * (The same split is made in every conversion below.) */
static void qf_from_f16_run(const uint16_t *h, ptrdiff_t m, float *b) {
#ifdef QF_F16_FROM
    /* the including file's hardware conversion (exact; it quiets a signaling NaN, which the
     * loops below keep: every use divides the value next, which quiets it anyway) */
    ptrdiff_t done = QF_F16_FROM(h, m, b);
    h += done; b += done; m -= done;
#endif
    for (ptrdiff_t i = 0; i < m; i++) {
        uint32_t n = ((uint32_t)(h[i] & 0x7fffu) << 13) + ((uint32_t)(127 - 15) << 23);
        b[i] = qf_float(n + (1u << 23)) - qf_float(113u << 23);
    }
    for (ptrdiff_t i = 0; i < m; i++) {
        uint32_t sign = (uint32_t)(h[i] & 0x8000u) << 16;
        uint32_t o = (uint32_t)(h[i] & 0x7fffu) << 13;
        uint32_t e = o & 0x0f800000u;
        uint32_t n = o + ((uint32_t)(127 - 15) << 23);
        uint32_t inf = n + ((uint32_t)(128 - 16) << 23);
        uint32_t r = e == 0x0f800000u ? inf : (e == 0 ? qf_bits(b[i]) : n);
        b[i] = qf_float(r | sign);
    }
}

/* float32 -> float16, round to nearest even, over a run. Below 2^-14 (half's subnormals): the
 * float32 sum |x| + 0.5 rounds |x| once to a multiple of 2^-24 (the ulp of 0.5), which is the
 * code (a carry to 1024 is the smallest normal). Normal: rebias, then the 13 dropped bits
 * rounded to even; a carry steps the exponent, and past 65504 gives the infinity's code. NaN:
 * quiet, the payload's top bits kept (the hardware conversion's and NumPy's NaN). */
static void qf_to_f16_run(const float *b, ptrdiff_t m, uint16_t *o) {
#ifdef QF_F16_TO
    /* the including file's hardware conversion, rounding to nearest even by its immediate
     * (whatever MXCSR says): the same bits as the loops below, NaN included */
    ptrdiff_t done = QF_F16_TO(b, m, o);
    b += done; o += done; m -= done;
#endif
    uint32_t sc[QF_TILE];
    for (ptrdiff_t i = 0; i < m; i++) sc[i] = qf_bits(qf_float(qf_bits(b[i]) & 0x7fffffffu) + 0.5f) - 0x3f000000u;
    for (ptrdiff_t i = 0; i < m; i++) {
        uint32_t u = qf_bits(b[i]), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
        uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);
        uint32_t nrm = (a - ((uint32_t)(127 - 15) << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
        uint32_t r = a > 0x7f800000u ? nan : (a >= 0x47800000u ? 0x7c00u : (a < 0x38800000u ? sc[i] : nrm));
        o[i] = (uint16_t)(r | sign);
    }
}

static inline float qf_bf16_to_f32(uint16_t h) { return qf_float((uint32_t)h << 16); }

/* float32 -> bfloat16, round to nearest even on the 16 dropped bits (a carry steps the exponent,
 * to inf past the largest finite); NaN -> 0x7FC0 | sign (ml_dtypes' cast) */
static inline uint16_t qf_f32_to_bf16(float f) {
    uint32_t u = qf_bits(f);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = ((u >> 16) & 0x8000u) | 0x7fc0u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : r);
}

/* one rounding of float32 values (at most QF_TILE) to P (float16 or bfloat16), kept as float32
 * (exact) */
static void qf_round_p(int prec, float *b, ptrdiff_t m) {
    if (prec == QF_F16) {
        uint16_t h[QF_TILE];
        qf_to_f16_run(b, m, h);
        qf_from_f16_run(h, m, b);
    } else if (prec == QF_BF16) {
        for (ptrdiff_t i = 0; i < m; i++) b[i] = qf_bf16_to_f32(qf_f32_to_bf16(b[i]));
    }
}

/* ---- narrow float encoding: the Cast tables, exact round-to-nearest-even on float32 bits
 *
 * With a the magnitude's bits, E = a >> 23 its biased exponent, a format of m mantissa bits,
 * bias b and Emin = 128 - b (float32's biased exponent of the format's smallest normal, 2^(1-b)):
 * - one IEEE float32 addition rounds |x| to the format's precision: with Eb = max(E, Emin) and
 *   M = 2^(Eb - 127 + 23 - m), the ulp of M is 2^(Eb - 127 - m), the spacing of the format's
 *   values at |x|'s exponent (of its subnormals below Emin), and |x| < M / 2, so |x| + M
 *   rounds |x| once, to nearest even, to a multiple of that spacing;
 * - the sum's bits minus M's are those multiples, t: below Emin the code itself (a carry to
 *   2^m is the smallest normal's code); from Emin on 2^m plus the mantissa, and the code is
 *   t + (Eb - Emin) << m (a carry to 2^(m+1) steps the exponent, as it should);
 * - then the specials, by thresholds on a: from the first value that rounds past the largest
 *   finite code on (inf and NaN included), the saturate/overflow code; NaN, the NaN code; the
 *   sign bit everywhere except on a fnuz format's zero (it has no -0) and the finite formats'
 *   NaN (it gives +max).
 * M can pass float32's range only for |x| far past every format's largest value (those lanes
 * take the overflow code); the arithmetic is unsigned or IEEE, never undefined. */
typedef struct {
    uint32_t minnorm, rebias, magic_bits, shift, half_m1, max_code, sign_bit;
    uint32_t ov_base, ov_sign, nan_base, nan_sign, zero_unsigned;
    float magic;
    /* thresholds on the magnitude's bits (all below 2^31, compared as int32: one instruction
     * on every ISA, where an unsigned compare costs three on AVX2): from over_at on, the value
     * rounds past the largest finite code (inf and NaN included); the sign is kept on codes
     * from sign_at to sign_to (fnuz: a value that rounds to 0 is +0; finite formats: NaN is
     * +max) */
    int32_t over_at, sign_at, sign_to;
    uint32_t sign_shift;   /* the float32 sign bit shifted down to the format's */
    uint32_t m_add;        /* (23 - m) << 23: M's exponent above Eb */
} qf_enc;

static void qf_enc_init(qf_enc *E, const ql_nfmt *F, int saturate) {
    E->minnorm = (uint32_t)(128 - F->bias) << 23;
    E->rebias = (uint32_t)(127 - F->bias) << 23;
    E->magic_bits = (uint32_t)(1 - F->bias - F->mbits + 23 + 127) << 23;
    E->magic = qf_float(E->magic_bits);
    E->shift = (uint32_t)(23 - F->mbits);
    E->half_m1 = (1u << (E->shift - 1)) - 1u;
    E->max_code = F->max_code;
    E->sign_bit = F->sign_bit;
    int fl = F->flavour;
    if (saturate || fl == QF_FINITE) { E->ov_base = F->max_code; E->ov_sign = ~0u; }
    else if (fl == QF_IEEE) { E->ov_base = F->max_code + 1; E->ov_sign = ~0u; }   /* ±inf */
    else if (fl == QF_FN) { E->ov_base = F->nan_code; E->ov_sign = ~0u; }
    else { E->ov_base = F->nan_code; E->ov_sign = 0; }                              /* fnuz: 0x80 */
    if (fl == QF_FINITE) { E->nan_base = F->max_code; E->nan_sign = 0; }           /* NaN -> +max */
    else if (fl == QF_FNUZ) { E->nan_base = F->nan_code; E->nan_sign = 0; }
    else { E->nan_base = F->nan_code; E->nan_sign = ~0u; }
    E->zero_unsigned = fl == QF_FNUZ ? ~0u : 0;
    /* The largest finite code is a normal one in every format, so its float32 bits are the
     * rebias plus the code shifted up; halfway to the next code is the tie, which rounds to
     * the even of the two: past the maximum when the maximum's mantissa is odd. */
    uint32_t max_bits = E->rebias + (F->max_code << E->shift), mid = max_bits + (1u << (E->shift - 1));
    E->over_at = (int32_t)((F->max_code & 1u) ? mid : mid + 1u);
    /* half the smallest subnormal, 2^(-bias-mbits), is a tie that rounds to 0 (even): the first
     * nonzero code starts one float32 ulp above it. A fnuz format's overflow and NaN code is
     * 0x80, the sign bit itself, so keeping the sign there changes nothing. */
    E->sign_at = fl == QF_FNUZ ? (int32_t)(((uint32_t)(127 - F->bias - F->mbits) << 23) + 1u) : 0;
    E->sign_to = fl == QF_FINITE ? 0x7f800000 : 0x7fffffff;
    E->sign_shift = F->sign_bit == 128 ? 24u : F->sign_bit == 32 ? 26u : 28u;
    E->m_add = (uint32_t)(23 - F->mbits) << 23;
}

/* One run of at most QF_TILE values, in two loops: the rounding (integer and float arithmetic
 * on every lane, no select) into a tile of codes, then the specials by integer selects. In one
 * loop the compiler would move the float addition under a select that discards it, and a
 * conditional float operation does not vectorize on AVX2. E by value: a local the byte stores
 * cannot alias, so the loop keeps it in registers. */
static void qf_encode_run(const float *b, ptrdiff_t m, uint8_t *o, const qf_enc E) {
#ifdef QF_MASKED_FLOAT
    /* an ISA with masked float operations (AVX-512) vectorizes the one loop: one pass */
    for (ptrdiff_t i = 0; i < m; i++) {
        uint32_t u = qf_bits(b[i]);
        int32_t a = (int32_t)(u & 0x7fffffffu);
        uint32_t eb = (uint32_t)a & 0x7f800000u;
        eb = eb > E.minnorm ? eb : E.minnorm;
        uint32_t mb = eb + E.m_add;
        uint32_t code = qf_bits(qf_float((uint32_t)a) + qf_float(mb)) - mb + ((eb - E.minnorm) >> E.shift);
        code = a >= E.over_at ? E.ov_base : code;
        code = a > 0x7f800000 ? E.nan_base : code;
        uint32_t sign = (u >> E.sign_shift) & E.sign_bit;
        o[i] = (uint8_t)(code | ((a >= E.sign_at) & (a <= E.sign_to) ? sign : 0u));
    }
#else
    uint32_t mag[QF_TILE];
    for (ptrdiff_t i = 0; i < m; i++) {
        uint32_t a = qf_bits(b[i]) & 0x7fffffffu, eb = a & 0x7f800000u;
        eb = eb > E.minnorm ? eb : E.minnorm;
        uint32_t mb = eb + E.m_add;
        mag[i] = qf_bits(qf_float(a) + qf_float(mb)) - mb + ((eb - E.minnorm) >> E.shift);
    }
    for (ptrdiff_t i = 0; i < m; i++) {
        uint32_t u = qf_bits(b[i]);
        int32_t a = (int32_t)(u & 0x7fffffffu);
        uint32_t code = a >= E.over_at ? E.ov_base : mag[i];
        code = a > 0x7f800000 ? E.nan_base : code;
        uint32_t sign = (u >> E.sign_shift) & E.sign_bit;
        o[i] = (uint8_t)(code | ((a >= E.sign_at) & (a <= E.sign_to) ? sign : 0u));
    }
#endif
}

/* b[i] = table[p[i]]: the including file may give a vector lookup (QF_GATHER; `codes`: the
 * format's count of codes, 2 * sign_bit, which a table held in registers may cover); else a
 * plain loop */
static void qf_lookup(const float *t, const uint8_t *p, ptrdiff_t m, float *b, int codes) {
    ptrdiff_t i = 0;
#ifdef QF_GATHER
    i = QF_GATHER(t, p, m, b, codes);
#else
    (void)codes;
#endif
    for (; i < m; i++) b[i] = t[p[i]];
}

/* ---- inputs to float32 (exact; int32 rounds once to nearest even above 2^24) */
static void qf_widen(int type, const void *x, ptrdiff_t i0, ptrdiff_t m, const ql_nfmt *F, float *b) {
    switch (type) {
    case QF_F32: memcpy(b, (const float *)x + i0, (size_t)m * 4); break;
    case QF_F16: qf_from_f16_run((const uint16_t *)x + i0, m, b); break;
    case QF_BF16: { const uint16_t *p = (const uint16_t *)x + i0; for (ptrdiff_t i = 0; i < m; i++) b[i] = qf_bf16_to_f32(p[i]); } break;
    case QF_I32: { const int32_t *p = (const int32_t *)x + i0; for (ptrdiff_t i = 0; i < m; i++) b[i] = (float)p[i]; } break;
    case QF_U8: { const uint8_t *p = (const uint8_t *)x + i0; for (ptrdiff_t i = 0; i < m; i++) b[i] = (float)p[i]; } break;
    case QF_I8: { const int8_t *p = (const int8_t *)x + i0; for (ptrdiff_t i = 0; i < m; i++) b[i] = (float)p[i]; } break;
    case QF_U16: { const uint16_t *p = (const uint16_t *)x + i0; for (ptrdiff_t i = 0; i < m; i++) b[i] = (float)p[i]; } break;
    case QF_I16: { const int16_t *p = (const int16_t *)x + i0; for (ptrdiff_t i = 0; i < m; i++) b[i] = (float)p[i]; } break;
    /* sub-byte integers: the value in the low bits (ml_dtypes' storage); signed ones sign-extended
     * from their top bit by an arithmetic shift of the byte moved to the top of an int32 */
    case QF_U4: { const uint8_t *p = (const uint8_t *)x + i0; for (ptrdiff_t i = 0; i < m; i++) b[i] = (float)(p[i] & 15); } break;
    case QF_I4: { const uint8_t *p = (const uint8_t *)x + i0; for (ptrdiff_t i = 0; i < m; i++) b[i] = (float)((int32_t)((uint32_t)p[i] << 28) >> 28); } break;
    case QF_U2: { const uint8_t *p = (const uint8_t *)x + i0; for (ptrdiff_t i = 0; i < m; i++) b[i] = (float)(p[i] & 3); } break;
    case QF_I2: { const uint8_t *p = (const uint8_t *)x + i0; for (ptrdiff_t i = 0; i < m; i++) b[i] = (float)((int32_t)((uint32_t)p[i] << 30) >> 30); } break;
    case QF_NF: qf_lookup(F->table, (const uint8_t *)x + i0, m, b, (int)F->sign_bit * 2); break;
    default: break;
    }
}

/* The common cases in one pass, without the tile (the same operations in the same order as the
 * tile path below): float32 x with P = float32 to an integer type, and an integer x of at most
 * 16 bits to float32. S / Z: the run's parameter or the element's. */
#define QF_Q_INT_BODY(S, Z) \
    for (ptrdiff_t i = 0; i < n; i++) { \
        float l = lo - (Z), h = hi - (Z), v = xs[i] / (S); \
        v = v > l ? v : l; \
        v = v < h ? v : h; \
        v = (v + rmagic) - rmagic; \
        uint32_t q = (uint32_t)((int32_t)v + (int32_t)(Z)) & mask; \
        if (wide) o16[i] = (uint16_t)q; else o8[i] = (uint8_t)q; \
    }

static void qf_quantize_f32_int(const ql_fmt_op *op, const float *xs, ptrdiff_t n, const float *s, int ss,
                                const float *z, int zs, void *out) {
    const float lo = (float)op->lo, hi = (float)op->hi, rmagic = 12582912.0f;
    const int wide = op->out_type == QF_U16 || op->out_type == QF_I16;
    const uint32_t mask = wide ? 0xffffu : (op->out_type == QF_U4 || op->out_type == QF_I4) ? 15u
                          : (op->out_type == QF_U2 || op->out_type == QF_I2) ? 3u : 0xffu;
    uint16_t *o16 = (uint16_t *)out;
    uint8_t *o8 = (uint8_t *)out;
    const float s0 = s[0], z0 = z ? z[0] : 0.0f;
    if (ss && z && zs) { QF_Q_INT_BODY(s[i], z[i]) }
    else if (ss) { QF_Q_INT_BODY(s[i], z0) }
    else if (z && zs) { QF_Q_INT_BODY(s0, z[i]) }
    else { QF_Q_INT_BODY(s0, z0) }
}

#define QF_DQ_INT_LOOP(VAL) \
    do { \
        if (ss && z && zs) for (ptrdiff_t i = 0; i < n; i++) o[i] = ((float)(VAL) - z[i]) * s[i]; \
        else if (ss && z) for (ptrdiff_t i = 0; i < n; i++) o[i] = ((float)(VAL) - z0) * s[i]; \
        else if (ss) for (ptrdiff_t i = 0; i < n; i++) o[i] = (float)(VAL) * s[i]; \
        else if (z && zs) for (ptrdiff_t i = 0; i < n; i++) o[i] = ((float)(VAL) - z[i]) * s0; \
        else if (z) for (ptrdiff_t i = 0; i < n; i++) o[i] = ((float)(VAL) - z0) * s0; \
        else for (ptrdiff_t i = 0; i < n; i++) o[i] = (float)(VAL) * s0; \
    } while (0)

static void qf_dequantize_int_f32(int type, const void *x, ptrdiff_t n, const float *s, int ss, const float *z,
                                  int zs, float *o) {
    const float s0 = s[0], z0 = z ? z[0] : 0.0f;
    const uint8_t *u8 = (const uint8_t *)x;
    const int8_t *i8 = (const int8_t *)x;
    const uint16_t *u16 = (const uint16_t *)x;
    const int16_t *i16 = (const int16_t *)x;
    switch (type) {
    case QF_U8: QF_DQ_INT_LOOP(u8[i]); break;
    case QF_I8: QF_DQ_INT_LOOP(i8[i]); break;
    case QF_U16: QF_DQ_INT_LOOP(u16[i]); break;
    case QF_I16: QF_DQ_INT_LOOP(i16[i]); break;
    case QF_U4: QF_DQ_INT_LOOP(u8[i] & 15); break;
    case QF_I4: QF_DQ_INT_LOOP((int32_t)((uint32_t)u8[i] << 28) >> 28); break;
    case QF_U2: QF_DQ_INT_LOOP(u8[i] & 3); break;
    case QF_I2: QF_DQ_INT_LOOP((int32_t)((uint32_t)u8[i] << 30) >> 30); break;
    default: break;
    }
}

/* QuantizeLinear over one run (include/formats.h has the formula) */
static void qf_quantize(const ql_fmt_op *op, const void *x, ptrdiff_t n, const float *s, int ss, const float *z,
                        int zs, void *out) {
    if (op->x_type == QF_F32 && op->prec == QF_F32 && op->out_type >= QF_U8 && op->out_type <= QF_I2) {
        qf_quantize_f32_int(op, (const float *)x, n, s, ss, z, zs, out);
        return;
    }
    float b[QF_TILE];
    qf_enc E = {0};
    if (op->out_type == QF_NF) qf_enc_init(&E, &op->fmt, op->saturate);
    const float lo = (float)op->lo, hi = (float)op->hi;
    /* 1.5 * 2^23: |v| + this lies in [2^23, 2^24), whose ulp is 1, so the float32 addition
     * rounds v to an integer, ties to even (the magic is even); the subtraction is exact. The
     * values are clamped to the 16-bit types' bounds first, far inside |v| < 2^22. */
    const float rmagic = 12582912.0f;
    for (ptrdiff_t i0 = 0; i0 < n; i0 += QF_TILE) {
        ptrdiff_t m = n - i0 < QF_TILE ? n - i0 : QF_TILE;
        /* a float32 x with P = float32 is divided where it is (no copy into the tile first) */
        const float *xb = b;
        if (op->x_type == QF_F32 && op->prec == QF_F32) {
            xb = (const float *)x + i0;
        } else {
            qf_widen(op->x_type, x, i0, m, &op->fmt, b);
            if (op->prec != QF_F32) qf_round_p(op->prec, b, m);
        }
        if (ss) {
            const float *sv = s + i0;
            for (ptrdiff_t i = 0; i < m; i++) b[i] = xb[i] / sv[i];
        } else {
            const float s0 = s[0];
            for (ptrdiff_t i = 0; i < m; i++) b[i] = xb[i] / s0;
        }
        if (op->prec != QF_F32) qf_round_p(op->prec, b, m);
        if (op->out_type == QF_NF) {
            uint8_t *o = (uint8_t *)out + i0;
            if (op->add_zero && z) {
                if (zs) { const float *zv = z + i0; for (ptrdiff_t i = 0; i < m; i++) b[i] = b[i] + zv[i]; }
                else { const float z0 = z[0]; for (ptrdiff_t i = 0; i < m; i++) b[i] = b[i] + z0; }
                if (op->prec != QF_F32) qf_round_p(op->prec, b, m);
            }
            qf_encode_run(b, m, o, E);
            continue;
        }
        /* integers: clamp to [lo - z, hi - z] (a NaN fails v > l and takes l: the type's
         * minimum), round (exact for these integer bounds: rounding then clamping is the same),
         * add z. z is an integer of the type, so lo - z and hi - z are exact. */
        int32_t *qi = (int32_t *)(void *)b;   /* the tile reused for the int32 results */
        if (z && zs) {
            const float *zv = z + i0;
            for (ptrdiff_t i = 0; i < m; i++) {
                float l = lo - zv[i], h = hi - zv[i], v = b[i];
                v = v > l ? v : l;
                v = v < h ? v : h;
                v = (v + rmagic) - rmagic;
                qi[i] = (int32_t)v + (int32_t)zv[i];
            }
        } else {
            const float z0 = z ? z[0] : 0.0f, l = lo - z0, h = hi - z0;
            const int32_t zi = (int32_t)z0;
            for (ptrdiff_t i = 0; i < m; i++) {
                float v = b[i];
                v = v > l ? v : l;
                v = v < h ? v : h;
                v = (v + rmagic) - rmagic;
                qi[i] = (int32_t)v + zi;
            }
        }
        switch (op->out_type) {
        case QF_U8: case QF_I8: { uint8_t *o = (uint8_t *)out + i0; for (ptrdiff_t i = 0; i < m; i++) o[i] = (uint8_t)qi[i]; } break;
        case QF_U16: case QF_I16: { uint16_t *o = (uint16_t *)out + i0; for (ptrdiff_t i = 0; i < m; i++) o[i] = (uint16_t)qi[i]; } break;
        /* sub-byte: the two's-complement low bits (ml_dtypes stores int4 -1 as 0x0F) */
        case QF_U4: case QF_I4: { uint8_t *o = (uint8_t *)out + i0; for (ptrdiff_t i = 0; i < m; i++) o[i] = (uint8_t)(qi[i] & 15); } break;
        case QF_U2: case QF_I2: { uint8_t *o = (uint8_t *)out + i0; for (ptrdiff_t i = 0; i < m; i++) o[i] = (uint8_t)(qi[i] & 3); } break;
        default: break;
        }
    }
}

/* DequantizeLinear over one run: (float32(x) - z) * s, one rounding to the output type */
static void qf_dequantize(const ql_fmt_op *op, const void *x, ptrdiff_t n, const float *s, int ss, const float *z,
                          int zs, void *out) {
    if (op->out_type == QF_F32 && op->x_type >= QF_U8 && op->x_type <= QF_I2) {
        qf_dequantize_int_f32(op->x_type, x, n, s, ss, z, zs, (float *)out);
        return;
    }
    float b[QF_TILE];
    for (ptrdiff_t i0 = 0; i0 < n; i0 += QF_TILE) {
        ptrdiff_t m = n - i0 < QF_TILE ? n - i0 : QF_TILE;
        qf_widen(op->x_type, x, i0, m, &op->fmt, b);
        /* integers up to 16 bits and their zero point are exact in float32, and so is the
         * difference; a float format's difference is one float32 subtraction */
        if (z && zs) { const float *zv = z + i0; for (ptrdiff_t i = 0; i < m; i++) b[i] = b[i] - zv[i]; }
        else if (z) { const float z0 = z[0]; for (ptrdiff_t i = 0; i < m; i++) b[i] = b[i] - z0; }
        if (op->out_type == QF_F32) {
            float *o = (float *)out + i0;
            if (ss) { const float *sv = s + i0; for (ptrdiff_t i = 0; i < m; i++) o[i] = b[i] * sv[i]; }
            else { const float s0 = s[0]; for (ptrdiff_t i = 0; i < m; i++) o[i] = b[i] * s0; }
            continue;
        }
        if (ss) { const float *sv = s + i0; for (ptrdiff_t i = 0; i < m; i++) b[i] = b[i] * sv[i]; }
        else { const float s0 = s[0]; for (ptrdiff_t i = 0; i < m; i++) b[i] = b[i] * s0; }
        uint16_t *o = (uint16_t *)out + i0;
        if (op->out_type == QF_F16) qf_to_f16_run(b, m, o);
        else for (ptrdiff_t i = 0; i < m; i++) o[i] = qf_f32_to_bf16(b[i]);
    }
}

const ql_fmt_kernels QF_NAME = {QF_LABEL, qf_quantize, qf_dequantize};
