/* The operand forms' row builders, shared by the im2col panel packer (im2col.c) and the
 * implicit GEMM's copies (implicit_run.c): raw 8-bit rows into the I16 form's pairs and the
 * byte forms' groups of 4. Out of line, as the compiler kept them when they shared one file
 * with their callers: the copy loops' code stays what it was. */
#include "plan.h"

/* Two raw rows into one [nr][2] group of the I16 panel: widened, minus x's zero point
 * (|x - zx| <= 255 fits int16), interleaved. */
void pair_i16(const uint8_t *a, const uint8_t *b, int type, int32_t zx, int16_t *d, int nr)
{
    int j = ql_vec_pair_i16(a, b, type, zx, d, nr);   /* the vector loop first */
    for (; j < nr; j++) {
        d[2 * j] = (int16_t)(load8(a + j, type) - zx);
        d[2 * j + 1] = (int16_t)(load8(b + j, type) - zx);
    }
}

/* Four raw rows into one [nr][4] group of a byte-form panel, each byte ^ flip. */
void interleave4(const ql_gemm_kernel *k, const uint8_t *const *src, uint8_t flip, uint8_t *dk, int nr)
{
    int j = k->conv.interleave4_bulk ? k->conv.interleave4_bulk(src, flip, dk, nr) : 0;   /* the level's wider loop */
    j = ql_vec_interleave4(src, flip, dk, j, nr);
    for (; j < nr; j++)
        for (int q = 0; q < 4; q++) dk[4 * j + q] = (uint8_t)(src[q][j] ^ flip);
}
