/* Runtime CPU dispatch: every level of the core is compiled (level_*.c), and the widest one
 * the CPU supports is chosen once, at import, with __builtin_cpu_supports.  RESNORM_CPU=
 * sse2|avx2|avx512 caps the level, for testing and for comparing levels in benchmarks.
 * All levels compute bitwise identical results (vec.h, reduce.h); they differ only in
 * speed. */
#include "rn_base.h"
#include "dispatch.h"

#ifndef RESNORM_BUILD_FLAGS
#define RESNORM_BUILD_FLAGS ""
#endif

#if RN_X86
extern const rn_ops rn_ops_sse2, rn_ops_avx2, rn_ops_avx512, rn_ops_avx512bf16;
/* narrowest first; best_level() returns an index into these */
static const rn_ops *const levels[] = {&rn_ops_sse2, &rn_ops_avx2, &rn_ops_avx512,
                                       &rn_ops_avx512bf16};
static const char *const level_names[] = {"sse2", "avx2", "avx512", "avx512bf16"};

static int best_level(void)
{
    __builtin_cpu_init();
    /* F16C: the float16 conversions of both levels (every AVX-512 CPU has it); AVX512BW and
     * VL: the avx512 level's bfloat16 loads; the avx512bf16 level adds AVX512DQ (its test
     * for subnormals) and AVX512-BF16, which every CPU with AVX512-BF16 has */
    const int f16c = __builtin_cpu_supports("f16c");
    const int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
                       && __builtin_cpu_supports("avx512vl") && f16c;
    if (avx512 && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bf16"))
        return 3;
    if (avx512) return 2;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c) return 1;
    return 0;
}
#else
extern const rn_ops rn_ops_portable;
static const rn_ops *const levels[] = {&rn_ops_portable};
static const char *const level_names[] = {"portable"};

static int best_level(void) { return 0; }
#endif

#define N_LEVELS ((int)(sizeof level_names / sizeof level_names[0]))
static int active_level = -1;

const rn_ops *rn_core_select(void)
{
    int level = best_level();
    const char *cap = getenv("RESNORM_CPU");
    if (cap && *cap) {
        for (int i = 0; i < N_LEVELS; i++) {
            if (strcmp(cap, level_names[i]) == 0 && i < level) level = i;
        }
    }
    active_level = level;
    return levels[level];
}

const char *rn_core_level_name(void)
{
    return active_level < 0 ? "uninitialised" : level_names[active_level];
}

const char *const *rn_core_level_names(int *count)
{
    *count = N_LEVELS;
    return level_names;
}

const char *rn_core_build_flags(void) { return RESNORM_BUILD_FLAGS; }
