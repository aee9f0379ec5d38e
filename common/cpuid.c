/* cpuid.c - see cpuid.h. */
#include "common/cpuid.h"

#include <stdbool.h>
#include <string.h>

#include "common/util.h"

static const struct {
    uint32_t bit;
    const char *name;
} feature_names[] = {
    {DT_CPUF_SSE2, "sse2"},           {DT_CPUF_SSE3, "sse3"},
    {DT_CPUF_SSSE3, "ssse3"},         {DT_CPUF_SSE41, "sse4_1"},
    {DT_CPUF_SSE42, "sse4_2"},        {DT_CPUF_AVX, "avx"},
    {DT_CPUF_FMA, "fma"},             {DT_CPUF_AVX2, "avx2"},
    {DT_CPUF_AVX512F, "avx512f"},     {DT_CPUF_AVX512DQ, "avx512dq"},
    {DT_CPUF_AVX512CD, "avx512cd"},   {DT_CPUF_AVX512BW, "avx512bw"},
    {DT_CPUF_AVX512VL, "avx512vl"},   {DT_CPUF_AVX512VNNI, "avx512_vnni"},
    {DT_CPUF_AVX512BF16, "avx512_bf16"}, {DT_CPUF_AVX512FP16, "avx512_fp16"},
    {DT_CPUF_AMX_TILE, "amx_tile"},   {DT_CPUF_AMX_BF16, "amx_bf16"},
};

const char *dt_cpuid_names(uint32_t features, char *buf, size_t cap)
{
    size_t n = 0;
    if (cap)
        buf[0] = '\0';
    for (size_t i = 0; i < DT_ARRAY_LEN(feature_names); i++) {
        if (!(features & feature_names[i].bit))
            continue;
        size_t len = strlen(feature_names[i].name);
        if (n + len + 2 > cap)
            break;
        if (n)
            buf[n++] = ' ';
        memcpy(buf + n, feature_names[i].name, len + 1);
        n += len;
    }
    return buf;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>

static bool leaf(unsigned int l, unsigned int sub, unsigned int r[4])
{
    return __get_cpuid_count(l, sub, &r[0], &r[1], &r[2], &r[3]) != 0;
}

static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

void dt_cpuid_read(dt_cpuid *out)
{
    memset(out, 0, sizeof *out);
    unsigned int r[4] = {0}, max = __get_cpuid_max(0, NULL);
    if (max == 0)
        return;
    leaf(0, 0, r);
    memcpy(out->vendor, &r[1], 4);
    memcpy(out->vendor + 4, &r[3], 4);
    memcpy(out->vendor + 8, &r[2], 4);
    uint32_t f = 0;
    bool osxsave = false;
    if (leaf(1, 0, r)) {
        unsigned int base_family = (r[0] >> 8) & 0xf, base_model = (r[0] >> 4) & 0xf;
        out->stepping = (int)(r[0] & 0xf);
        out->family = (int)base_family + (base_family == 0xf ? (int)((r[0] >> 20) & 0xff) : 0);
        out->model = (int)base_model +
                     (base_family == 6 || base_family == 0xf ? (int)((r[0] >> 16) & 0xf) << 4 : 0);
        if (r[3] & (1u << 26))
            f |= DT_CPUF_SSE2;
        if (r[2] & (1u << 0))
            f |= DT_CPUF_SSE3;
        if (r[2] & (1u << 9))
            f |= DT_CPUF_SSSE3;
        if (r[2] & (1u << 12))
            f |= DT_CPUF_FMA;
        if (r[2] & (1u << 19))
            f |= DT_CPUF_SSE41;
        if (r[2] & (1u << 20))
            f |= DT_CPUF_SSE42;
        if (r[2] & (1u << 28))
            f |= DT_CPUF_AVX;
        osxsave = (r[2] & (1u << 27)) != 0;
    }
    if (max >= 7 && leaf(7, 0, r)) {
        static const struct {
            int reg, bit;
            uint32_t f;
        } l7[] = {
            {1, 5, DT_CPUF_AVX2},         {1, 16, DT_CPUF_AVX512F},     {1, 17, DT_CPUF_AVX512DQ},
            {1, 28, DT_CPUF_AVX512CD},    {1, 30, DT_CPUF_AVX512BW},    {1, 31, DT_CPUF_AVX512VL},
            {2, 11, DT_CPUF_AVX512VNNI},  {3, 22, DT_CPUF_AMX_BF16},    {3, 23, DT_CPUF_AVX512FP16},
            {3, 24, DT_CPUF_AMX_TILE},
        };
        for (size_t i = 0; i < DT_ARRAY_LEN(l7); i++)
            if (r[l7[i].reg] & (1u << l7[i].bit))
                f |= l7[i].f;
        unsigned int sub_max = r[0];
        if (sub_max >= 1 && leaf(7, 1, r) && (r[0] & (1u << 5)))
            f |= DT_CPUF_AVX512BF16;
    }
    out->reported = f;
    /* what the OS saves: XCR0 bits 1-2 (SSE, AVX), 5-7 (opmask, ZMM_Hi256, Hi16_ZMM), 17-18
     * (tile config and data) */
    uint64_t xcr0 = osxsave ? xgetbv0() : 0;
    const uint32_t avx_family = DT_CPUF_AVX | DT_CPUF_FMA | DT_CPUF_AVX2;
    const uint32_t avx512_family = DT_CPUF_AVX512F | DT_CPUF_AVX512DQ | DT_CPUF_AVX512CD |
                                   DT_CPUF_AVX512BW | DT_CPUF_AVX512VL | DT_CPUF_AVX512VNNI |
                                   DT_CPUF_AVX512BF16 | DT_CPUF_AVX512FP16;
    if ((xcr0 & 0x6) != 0x6)
        f &= ~(avx_family | avx512_family);
    if ((xcr0 & 0xe6) != 0xe6)
        f &= ~avx512_family;
    if ((xcr0 & 0x60000) != 0x60000)
        f &= ~(DT_CPUF_AMX_TILE | DT_CPUF_AMX_BF16);
    out->features = f;
    if (__get_cpuid_max(0x80000000u, NULL) >= 0x80000004u) {
        char b[49] = {0};
        for (unsigned int i = 0; i < 3; i++) {
            leaf(0x80000002u + i, 0, r);
            memcpy(b + 16 * i, r, 16);
        }
        dt_strlcpy(out->brand, dt_trim(b), sizeof out->brand);
    }
}

#else

void dt_cpuid_read(dt_cpuid *out) { memset(out, 0, sizeof *out); }

#endif
