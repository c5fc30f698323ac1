/* com.microsoft EmbedLayerNormalization: the float64 formula of qlinear/contrib/transformer.py
 * (embed_layer_normalization) token by token: the gathered float32 table rows widened and
 * added in double in the NumPy path's order (word + position, then + segment), the layer
 * normalization of that double row by ql_tf_layer_norm_row (NumPy's pairwise sums), so the
 * same bits as the NumPy path; no ISA-specific code, tokens independent. onnxruntime adds and
 * normalizes in float32 with its own loop order, so its bits are not promised (the tolerance of
 * docs/contract.md). The indices are checked here, before anything is read: an index outside
 * its table returns which one, and the caller raises the named error. */
#include "qlinear.h"
#include "transformer.h"

#include <stdint.h>
#include <stdlib.h>

int ql_embed_layer_norm_f32(const int32_t *ids, const void *pos, int pos64, const int32_t *seg, ptrdiff_t batch,
                            ptrdiff_t seq, const float *word, ptrdiff_t word_rows, const float *position,
                            ptrdiff_t position_rows, const float *segment, ptrdiff_t segment_rows,
                            ptrdiff_t hidden, const double *gamma, const double *beta, double epsilon, float *y,
                            float *sum) {
    ptrdiff_t rows = batch * seq;
    if (rows <= 0 || hidden <= 0) return 1;
    /* every index checked before anything is read, in the NumPy path's order (ids, then
     * positions, then segments), so the caller's fallback reports the one it reports */
    for (ptrdiff_t r = 0; r < rows; r++)
        if (ids[r] < 0 || ids[r] >= word_rows) return -1;
    for (ptrdiff_t r = 0; r < rows; r++) {
        int64_t p = pos ? (pos64 ? ((const int64_t *)pos)[r] : (int64_t)((const int32_t *)pos)[r]) : r % seq;
        if (p < 0 || p >= position_rows) return -2;
    }
    for (ptrdiff_t r = 0; seg && r < rows; r++)
        if (seg[r] < 0 || seg[r] >= segment_rows) return -3;
    /* two work rows of hidden doubles; the caller bounds rows · hidden · 8 */
    double *s = (double *)malloc(sizeof(double) * 2 * (size_t)hidden);
    if (!s) return 0;
    double *d = s + hidden;
    for (ptrdiff_t r = 0; r < rows; r++) {
        int64_t p = pos ? (pos64 ? ((const int64_t *)pos)[r] : (int64_t)((const int32_t *)pos)[r]) : r % seq;
        const float *w = word + (ptrdiff_t)ids[r] * hidden, *q = position + (ptrdiff_t)p * hidden;
        const float *g = seg ? segment + (ptrdiff_t)seg[r] * hidden : NULL;
        float *o = sum + r * hidden;
        for (ptrdiff_t i = 0; i < hidden; i++) {
            double v = (double)w[i] + (double)q[i];
            if (g) v = v + (double)g[i];
            s[i] = v;
            o[i] = (float)v;
        }
        double mean, inv;
        ql_tf_layer_norm_row(s, d, hidden, gamma, beta, epsilon, y + r * hidden, &mean, &inv);
    }
    free(s);
    return 1;
}
