/* The newer formats' conversion kernels for the baseline ISA (the scalar level's, and every
 * level's where no wider build exists): formats_impl.h compiled without a target pragma. */
#define QF_NAME ql_fmt_portable
#define QF_LABEL "portable"
#include "formats/formats_impl.h"
