/* What the two depthwise files share (depthwise.c: rows and planes, and the entry point;
 * depthwise_cl.c: channels-last). */
#ifndef QLINEAR_CONV_DEPTHWISE_H
#define QLINEAR_CONV_DEPTHWISE_H

#include "plan.h"

/* Depthwise convolutions of at least this many MACs use every thread (as ql_gemm does).
 * Overridable at build time for measurements (-DDW_MIN_PAR=...). */
#ifndef DW_MIN_PAR
#define DW_MIN_PAR ((int64_t)1 << 21)
#endif

/* depthwise_cl.c: the channels-last path when it applies (returns 1 after running it, 0 to take
 * the others, negative on error) */
int dwcl_run(const ql_conv_plan *p, const ql_isa *isa, const int16_t *wc, size_t w_elems, size_t workspace);

#endif
