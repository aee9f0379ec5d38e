/* cpuid.h - what this x86-64 CPU can run: its CPUID feature bits, as far as the OS enables them.
 *
 * A feature counts only when both the CPU reports it and the operating system saves the
 * registers it needs across context switches (XGETBV's XCR0: the YMM state for AVX/AVX2/FMA,
 * the opmask and ZMM states for AVX-512, the tile state for AMX): a hypervisor or a kernel
 * booted without AVX-512 support shows the CPUID bit but faults on the first instruction.
 * Used to check whether the BLAS library picked a kernel far below what the CPU runs
 * (kernels/cpu/cpu_blas.h). Not x86-64 (or not GCC/Clang): no features, vendor "".
 */
#ifndef DT_CPUID_H
#define DT_CPUID_H

#include <stddef.h>
#include <stdint.h>

/* Feature bits of dt_cpuid.features. */
enum {
    DT_CPUF_SSE2 = 1u << 0,
    DT_CPUF_SSE3 = 1u << 1,
    DT_CPUF_SSSE3 = 1u << 2,
    DT_CPUF_SSE41 = 1u << 3,
    DT_CPUF_SSE42 = 1u << 4,
    DT_CPUF_AVX = 1u << 5,
    DT_CPUF_FMA = 1u << 6,
    DT_CPUF_AVX2 = 1u << 7,
    DT_CPUF_AVX512F = 1u << 8,
    DT_CPUF_AVX512DQ = 1u << 9,
    DT_CPUF_AVX512CD = 1u << 10,
    DT_CPUF_AVX512BW = 1u << 11,
    DT_CPUF_AVX512VL = 1u << 12,
    DT_CPUF_AVX512VNNI = 1u << 13,
    DT_CPUF_AVX512BF16 = 1u << 14,
    DT_CPUF_AVX512FP16 = 1u << 15,
    DT_CPUF_AMX_TILE = 1u << 16,
    DT_CPUF_AMX_BF16 = 1u << 17,
};

typedef struct dt_cpuid {
    char vendor[13];   /* "GenuineIntel", "AuthenticAMD", ... ("" off x86-64) */
    char brand[49];    /* "Intel(R) Xeon(R) Platinum 8480+", trimmed */
    int family, model, stepping; /* display values (extended family/model folded in) */
    uint32_t features; /* DT_CPUF_* the CPU reports AND the OS enables */
    uint32_t reported; /* DT_CPUF_* the CPU reports (what /proc/cpuinfo's flags say) */
} dt_cpuid;

/* Reads this CPU's identity and features. Never fails (zeros off x86-64). */
void dt_cpuid_read(dt_cpuid *out);

/* The names of the bits in `features`, lowercase as /proc/cpuinfo spells them
 * ("sse2 ... avx512f avx512bw ..."), into buf; returns buf. */
const char *dt_cpuid_names(uint32_t features, char *buf, size_t cap);

#endif
