/* Integer islands (island.h): the portable add-island run and the threaded drivers. */
#include "island.h"
#include "elementwise.h"

/* onnxruntime's QuantizeLinear on one float32 value (MlasQuantizeLinear: a true division, the
 * clamp before rounding, NaN to the low end; lo and hi are small integers, so clamping before
 * the round-half-even equals saturating after) */
static inline int32_t quantize1(float v, float ys, float lo, float hi, int32_t yz) {
    float q = v / ys;
    if (!(q >= lo)) q = lo;
    if (q > hi) q = hi;
    return ql_rne(q) + yz;
}

static inline float operand(const ql_island_operand *o, ptrdiff_t i, ptrdiff_t c) {
    float v;
    if (o->q) {
        int32_t x = o->is_signed ? (int32_t)(int8_t)o->q[i] : (int32_t)o->q[i];
        v = (float)(x - o->z) * o->s;  /* |x - z| <= 255 converts exactly; one rounded product */
    } else {
        v = o->f[i];
    }
    if (o->mul) {
        v = v * o->mul[c];             /* BatchNormalization: two rounded operations */
        v = v + o->add[c];
    }
    return v;
}

void ql_island_run_portable(const ql_island_job *j, ptrdiff_t i0, ptrdiff_t n, ptrdiff_t c) {
    /* qmin - yz and qmax - yz: small integers, exact */
    const float lo = (j->is_signed ? -128.0f : 0.0f) - (float)j->yz, hi = (j->is_signed ? 127.0f : 255.0f) - (float)j->yz;
    for (ptrdiff_t i = i0; i < i0 + n; i++) {
        float v = operand(&j->a, i, c);
        if (j->has_b) v = v + operand(&j->b, i, c);  /* Add / Sum of two */
        if (j->relu) v = v < 0.0f ? 0.0f : v;  /* onnxruntime's Relu: -0 and NaN kept (measured) */
        if (j->out_f) j->out_f[i] = v;
        if (j->out_q) {
            int32_t q = quantize1(v, j->ys, lo, hi, j->yz);
            j->out_q[i] = j->is_signed ? (uint8_t)(int8_t)q : (uint8_t)q;
        }
    }
}

const ql_island_kernels ql_island_scalar = {"scalar", ql_island_run_portable, ql_lut_u8};

/* tasks of ISLAND_CHUNK elements; threads from ISLAND_PAR_MIN elements on (below, a few tens of
 * microseconds on one core: waking a worker that may be busy elsewhere costs more) */
#define ISLAND_CHUNK ((ptrdiff_t)1 << 15)
#define ISLAND_PAR_MIN ((ptrdiff_t)1 << 17)

typedef struct {
    const ql_island_kernels *k;
    const ql_island_job *j;
    ptrdiff_t n, C, plane;
} job_ctx;

/* elements [t * ISLAND_CHUNK, ...) of the flat tensor, plane by plane (a task may span planes) */
static void job_task(void *vctx, ptrdiff_t t, int thread) {
    (void)thread;
    job_ctx *c = (job_ctx *)vctx;
    ptrdiff_t i = t * ISLAND_CHUNK, end = c->n - i < ISLAND_CHUNK ? c->n : i + ISLAND_CHUNK;
    while (i < end) {
        ptrdiff_t p = i / c->plane, stop = (p + 1) * c->plane < end ? (p + 1) * c->plane : end;
        c->k->run(c->j, i, stop - i, p % c->C);
        i = stop;
    }
}

void ql_island(const ql_island_kernels *k, const ql_island_job *j, ptrdiff_t planes, ptrdiff_t C,
               ptrdiff_t plane, int threads) {
    if (planes <= 0 || plane <= 0 || C <= 0) return;
    job_ctx c = {k, j, planes * plane, C, plane};
    ptrdiff_t tasks = (c.n + ISLAND_CHUNK - 1) / ISLAND_CHUNK;
    ql_parallel_for(tasks, c.n >= ISLAND_PAR_MIN ? threads : 1, job_task, &c);
}

typedef struct {
    const ql_island_kernels *k;
    const uint8_t *x, *tables;
    uint8_t *out;
    ptrdiff_t n, C, plane;
} lut_ctx;

/* elements [t * ISLAND_CHUNK, ...) of the flat tensor, plane by plane (a task may span planes) */
static void lut_task(void *vctx, ptrdiff_t t, int thread) {
    (void)thread;
    lut_ctx *c = (lut_ctx *)vctx;
    ptrdiff_t i = t * ISLAND_CHUNK, end = c->n - i < ISLAND_CHUNK ? c->n : i + ISLAND_CHUNK;
    while (i < end) {
        ptrdiff_t p = i / c->plane, stop = (p + 1) * c->plane < end ? (p + 1) * c->plane : end;
        c->k->lut(c->x + i, stop - i, c->tables + (p % c->C) * 256, c->out + i);
        i = stop;
    }
}

void ql_island_lut(const ql_island_kernels *k, const uint8_t *x, ptrdiff_t planes, ptrdiff_t C, ptrdiff_t plane,
                   const uint8_t *tables, uint8_t *out, int threads) {
    if (planes <= 0 || plane <= 0 || C <= 0) return;
    lut_ctx c = {k, x, tables, out, planes * plane, C, plane};
    ptrdiff_t tasks = (c.n + ISLAND_CHUNK - 1) / ISLAND_CHUNK;
    ql_parallel_for(tasks, c.n >= ISLAND_PAR_MIN ? threads : 1, lut_task, &c);
}
