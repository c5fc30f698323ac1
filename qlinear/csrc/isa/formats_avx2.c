/* The newer formats' conversion kernels, vectorized for AVX2 (8 lanes): formats_impl.h under
 * the target pragma; the same arithmetic lane by lane (see that file). */
#include "qlinear.h"

#if QL_X86
#pragma GCC target("avx2")
#define QF_NAME ql_fmt_avx2
#define QF_LABEL "avx2"
#include "formats/formats_impl.h"
#endif
