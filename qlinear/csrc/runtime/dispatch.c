/* Runtime ISA dispatch: the ONLY file that names instruction-set levels, beside the levels' own
 * files in isa/ (their tables and kernels) and qlinear.h's declarations of the tables. conv/,
 * gemm/, epilogue/, elementwise/, python/ and runtime/ reach every level-specific kernel through
 * the tables (ql_isa, ql_gemm_kernel, its .conv part, ql_ew_for); check with
 *   grep -rnwE 'amx|avx512vnni|avxvnni|avx2' qlinear/csrc --exclude-dir=isa
 * (comments aside, only this file and those declarations). The x86-64 baseline's SSE2 loops
 * are not a level (every x86-64 CPU has them): isa/x86_sse2.h.
 *
 * CPU features are read once (CPUID for what the CPU implements, XGETBV for what the OS
 * saves on a context switch: a CPU with AVX-512 under an OS that does not save the ZMM state
 * must not run AVX-512 code). The table lists, best first, every level that was compiled in
 * and that this CPU and OS can run; the scalar level is always compiled and always runs.
 *
 * With -DQL_SIMDE (scripts/emulated_isa.sh) the AVX-512 VNNI and AVX-VNNI files are compiled
 * against SIMDe's portable implementations of those intrinsics, so those levels are offered on
 * any CPU with AVX2: a test build, never the shipped one.
 */
#define _GNU_SOURCE   /* syscall() */
#include "qlinear.h"
#include "elementwise.h"
#include "nbits/nbits.h"
#include "island.h"
#include "formats.h"
#include "fconv.h"
#include "gemv.h"

#include <stdio.h>
#include <string.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if QL_X86 && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#define QL_HAVE_CPUID 1
#else
#define QL_HAVE_CPUID 0
#endif

typedef struct {
    int avx2, avxvnni, avx512vnni, fma, amx;
    int vbmi;   /* AVX512-VBMI with the AVX-512 VNNI level: its packers' sub-choice (below) */
    int f16c;   /* F16C (CPUID.1:ECX bit 29): the AVX2 conversion kernels' float16 (formats/) */
} ql_features;

static ql_features feat;
static int feat_done;
static char flags_text[160];

/* AMX's tile data is an XSAVE component Linux enables per process, on request
 * (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); kernel 5.16 and later): without it the
 * first tile instruction raises SIGILL. The permission is process-wide and permanent. Other
 * systems: AMX is not offered. */
static int amx_permission(void) {
#if defined(__linux__) && defined(SYS_arch_prctl)
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
#else
    return 0;
#endif
}

#if QL_HAVE_CPUID
static unsigned long long ql_xgetbv0(void) {
    unsigned int lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}
#endif

static void detect(void) {
    if (feat_done) return;
    memset(&feat, 0, sizeof feat);
#if QL_HAVE_CPUID
    unsigned int a, b, c, d, max_leaf = __get_cpuid_max(0, NULL);
    if (max_leaf >= 7 && __get_cpuid(1, &a, &b, &c, &d)) {
        int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1;
        unsigned long long xcr0 = osxsave ? ql_xgetbv0() : 0;
        int os_ymm = (xcr0 & 0x6) == 0x6;            /* SSE + AVX state */
        int os_zmm = os_ymm && (xcr0 & 0xE0) == 0xE0; /* opmask, ZMM0-15 high, ZMM16-31 */
        unsigned int b7 = 0, c7 = 0, d7 = 0, a71 = 0, t;
        __cpuid_count(7, 0, t, b7, c7, d7);
        if (t >= 1) __cpuid_count(7, 1, a71, b, c, d);
        int avx2 = avx && os_ymm && ((b7 >> 5) & 1);
        feat.avx2 = avx2;
        feat.fma = fma && os_ymm;
        feat.f16c = os_ymm && ((c >> 29) & 1);
        feat.avxvnni = avx2 && ((a71 >> 4) & 1);
        int f = (b7 >> 16) & 1, dq = (b7 >> 17) & 1, bw = (b7 >> 30) & 1, vl = (b7 >> 31) & 1;
        feat.avx512vnni = avx2 && os_zmm && f && dq && bw && vl && ((c7 >> 11) & 1);
        feat.vbmi = feat.avx512vnni && ((c7 >> 1) & 1);   /* CPUID.7.0:ECX bit 1 */
        /* AMX-TILE (EDX bit 24) and AMX-INT8 (bit 25), the OS saving the tile configuration
         * and data (XCR0 bits 17 and 18), and Linux's permission; on top of AVX-512 VNNI,
         * whose kernels the level uses for everything but the GEMM */
        int amx_os = (xcr0 & 0x60000) == 0x60000;
        feat.amx = feat.avx512vnni && ((d7 >> 24) & 1) && ((d7 >> 25) & 1) && amx_os && amx_permission();
    }
#endif
    snprintf(flags_text, sizeof flags_text, "%s%s%s%s%s%s",
             feat.avx2 ? "avx2 " : "", feat.fma ? "fma " : "",
             feat.avxvnni ? "avxvnni " : "", feat.avx512vnni ? "avx512vnni " : "",
             feat.vbmi ? "avx512vbmi " : "", feat.amx ? "amx " : "");
    size_t n = strlen(flags_text);
    if (n && flags_text[n - 1] == ' ') flags_text[n - 1] = 0;
    feat_done = 1;
}

#ifdef QL_SIMDE
#define QL_EMULATED 1
#else
#define QL_EMULATED 0
#endif

typedef struct { const ql_isa *(*isa)(void); int (*runs)(void); } ql_entry;

#if QL_X86
static int runs_amx(void) { return QL_EMULATED ? feat.avx2 : feat.amx; }
static int runs_avx512vnni(void) { return QL_EMULATED ? feat.avx2 : feat.avx512vnni; }
static int runs_avxvnni(void) { return QL_EMULATED ? feat.avx2 : feat.avxvnni; }
static int runs_avx2(void) { return feat.avx2; }
#endif
static int runs_always(void) { return 1; }

#if QL_X86
static const ql_isa *isa_avx512vnni(void) { return &ql_isa_avx512vnni; }
static const ql_isa *isa_avxvnni(void) { return &ql_isa_avxvnni; }
static const ql_isa *isa_avx2(void) { return &ql_isa_avx2; }
#endif
static const ql_isa *isa_scalar(void) { return &ql_isa_scalar; }

static const ql_entry table[] = {
#if QL_X86
    {ql_isa_amx, runs_amx},
    {isa_avx512vnni, runs_avx512vnni},
    {isa_avxvnni, runs_avxvnni},
    {isa_avx2, runs_avx2},
#endif
    {isa_scalar, runs_always},
};

static const ql_isa *usable[8];
static int n_usable = -1;

static void build(void) {
    if (n_usable >= 0) return;
    detect();
    int n = 0;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (table[i].runs()) usable[n++] = table[i].isa();
    n_usable = n;
}

int ql_isa_count(void) { build(); return n_usable; }

const ql_isa *ql_isa_get(int i) {
    build();
    return (i >= 0 && i < n_usable) ? usable[i] : NULL;
}

const ql_isa *ql_isa_by_name(const char *name) {
    build();
    for (int i = 0; i < n_usable; i++)
        if (strcmp(usable[i]->name, name) == 0) return usable[i];
    return NULL;
}

const char *ql_isa_compiled_names(void) {
#if QL_X86
    return QL_EMULATED ? "amx(emulated),avx512vnni(simde),avxvnni(simde),avx2,scalar"
                       : "amx,avx512vnni,avxvnni,avx2,scalar";
#else
    return "scalar";
#endif
}

const char *ql_cpu_flags(void) { detect(); return flags_text; }

#if QL_X86
/* The AVX-512 levels' 3x3 byte-form weight packer (QL_BYTE_PACKERS_AVX512): VBMI's two-table byte
 * permute where the CPU has it, else the AVX2 shuffles (Cascade Lake and Cooper Lake have AVX-512
 * VNNI without VBMI). The same bytes either way. The levels are only handed out after detect()
 * (build), so feat is set whenever a kernel runs; emulated builds (SIMDe) take the VBMI code, so
 * scripts/emulated_isa.sh checks it on any AVX2 CPU. */
void ql_grouped_b_t9_zmm(const uint8_t *s, int64_t blocks, uint8_t fx, uint8_t sub, uint8_t *d)
{
    if (QL_EMULATED || feat.vbmi) ql_grouped_b_t9_vbmi(s, blocks, fx, sub, d);
    else ql_grouped_b_t9_avx2(s, blocks, fx, sub, d);
}
#endif

int ql_foreign_tiles(int load) {
#if QL_X86
    if (ql_isa_by_name("amx")) return ql_amx_foreign_tiles(load);
#else
    (void)load;
#endif
    return -1;
}

const ql_ew_kernels *ql_ew_for(const ql_isa *isa) {
    detect();
#if QL_X86
    /* every x86 level above scalar implies AVX2; the FMA kernels also need FMA3 (always
     * present with AVX2 on shipped CPUs, but the CPUID bit is separate) */
    if (isa && isa != &ql_isa_scalar && feat.avx2 && feat.fma) return &ql_ew_avx2fma;
#else
    (void)isa;
#endif
    return &ql_ew_scalar;
}

/* MatMulNBits' kernels for a level (nbits/): the AVX-512 ones on the AVX-512 VNNI and AMX
 * levels, the AVX2+FMA ones on AVX-VNNI and AVX2 (with FMA3, its float levels' fused
 * multiply-add), else the portable ones. Every set computes the same bits. */
const ql_nbits_kernels *ql_nbits_for(const ql_isa *isa) {
    detect();
#if QL_X86
#ifndef QL_SIMDE   /* the emulated build has no AVX-512 MatMulNBits kernels (isa/nbits_avx512.c) */
    if (isa && (strcmp(isa->name, "avx512vnni") == 0 || strcmp(isa->name, "amx") == 0)) return &ql_nbits_avx512;
#endif
    if (isa && isa != &ql_isa_scalar && feat.avx2 && feat.fma) return &ql_nbits_avx2;
#else
    (void)isa;
#endif
    return &ql_nbits_scalar;
}

const ql_island_kernels *ql_island_for(const ql_isa *isa) {
    detect();
#if QL_X86
    /* every x86 level above scalar implies AVX2; the AVX-512 levels (avx512vnni, amx) add VBMI's
     * byte permute where the CPU has it */
#ifndef QL_SIMDE
    if (isa && (isa == &ql_isa_avx512vnni || isa == ql_isa_amx()) && feat.vbmi) return &ql_island_avx512vbmi;
#endif
    if (isa && isa != &ql_isa_scalar && feat.avx2) return &ql_island_avx2;
#else
    (void)isa;
#endif
    return &ql_island_scalar;
}

/* The newer formats' conversion kernels for an ISA level (formats/): the AVX-512 build with the
 * AVX-512 levels on a CPU that has AVX-512 F/BW/DQ/VL (never under the SIMDe emulation, which
 * offers those levels on AVX2 CPUs), the AVX2 build (it uses F16C) with any other x86 level, else
 * portable. */
const ql_fmt_kernels *ql_fmt_for(const ql_isa *isa) {
    detect();
#if QL_X86
    if (isa && isa != &ql_isa_scalar && feat.avx2) {
        if (!QL_EMULATED && feat.avx512vnni && (isa == &ql_isa_avx512vnni || isa == ql_isa_amx()))
            return &ql_fmt_avx512;
        if (feat.f16c) return &ql_fmt_avx2;   /* (every AVX2 CPU made has it; checked all the same) */
    }
#else
    (void)isa;
#endif
    return &ql_fmt_portable;
}

/* The float32 Conv's kernels (fconv/): the AVX-512 ones on the AVX-512 levels of a CPU with
 * AVX-512 F (never under the SIMDe emulation), the AVX2 + FMA3 ones on any other x86 level of a
 * CPU with FMA3, else the portable ones. All three compute the same bits (include/fconv.h). */
const ql_fconv_kernels *ql_fconv_for(const ql_isa *isa) {
    detect();
#if QL_X86
    if (isa && isa != &ql_isa_scalar && feat.avx2 && feat.fma) {
        if (!QL_EMULATED && feat.avx512vnni && (isa == &ql_isa_avx512vnni || isa == ql_isa_amx()))
            return &ql_fconv_avx512;
        return &ql_fconv_avx2;
    }
#else
    (void)isa;
#endif
    return &ql_fconv_portable;
}

/* The matrix-vector products' dot kernel (gemm/gemv.c): AVX-512 VNNI's on the AVX-512 VNNI and AMX
 * levels of a CPU that has it (never under the SIMDe emulation, which offers those levels on AVX2
 * CPUs), AVX2's on any other x86 level, else the portable one. The same sums on every level. */
const ql_gemv_kernels *ql_gemv_for(const ql_isa *isa) {
    detect();
#if QL_X86
    if (isa && isa != &ql_isa_scalar && feat.avx2) {
#ifndef QL_SIMDE
        if (feat.avx512vnni && (isa == &ql_isa_avx512vnni || isa == ql_isa_amx())) return &ql_gemv_avx512;
#endif
        return &ql_gemv_avx2;
    }
#else
    (void)isa;
#endif
    return &ql_gemv_portable;
}
