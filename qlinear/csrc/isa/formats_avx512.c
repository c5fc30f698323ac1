/* The newer formats' conversion kernels, vectorized for AVX-512 (16 lanes, masked tails):
 * formats_impl.h under the target pragma; the same arithmetic lane by lane (see that file).
 * Offered with the AVX-512 VNNI and AMX levels, whose CPUs have AVX-512 F/BW/DQ/VL. */
#include "qlinear.h"

#if QL_X86
#pragma GCC target("avx2,avx512f,avx512bw,avx512dq,avx512vl,prefer-vector-width=512")
#define QF_NAME ql_fmt_avx512
#define QF_LABEL "avx512"
#include "formats/formats_impl.h"
#endif
