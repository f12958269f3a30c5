/* Runtime CPU dispatch for the row primitives in rowops.h.
 *
 * The default build targets baseline x86-64 (SSE2).  rowops.h is compiled a second and a
 * third time under __attribute__((target("avx2"))) and target("avx512f"), and the widest
 * level the CPU (and the OS, via XSAVE) supports is chosen once, at import, with
 * __builtin_cpu_supports.  RESNORM_CPU=sse2|avx2|avx512 caps the level, for testing and
 * for comparing levels in benchmarks.  All levels compute bitwise identical results (see
 * the lane discussion in rowops.h); they differ only in speed.
 *
 * Needs GCC or Clang (vector extensions).  On other architectures (aarch64, ...) a single
 * portable level is built from the same template and the compiler picks the vector ISA.
 */
#ifndef RESNORM_CPU_H
#define RESNORM_CPU_H

#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__) || defined(_M_X64)
#define RN_X86 1
#include <immintrin.h>
#define rn_sfence() _mm_sfence()
#else
#define RN_X86 0
#define rn_sfence() ((void)0)
#endif

/* `stream` argument of the elementwise primitives: 0 = ordinary stores, 1 = non-temporal
 * stores then a store fence, RN_STREAM_UNFENCED = non-temporal stores, the caller fences. */
#define RN_STREAM_UNFENCED 2

/* Prefetch hint for the next row: 2 = into L2 (measured best here), 3 = into L1. */
#ifndef RN_PF_LOCALITY
#define RN_PF_LOCALITY 2
#endif

#ifndef RESNORM_BUILD_FLAGS
#define RESNORM_BUILD_FLAGS ""
#endif

#define RN_CAT_(a, b) a##b
#define RN_CAT(a, b) RN_CAT_(a, b)
#define RN_CAT3(a, b, c) RN_CAT(RN_CAT(RN_CAT(rn_, a), RN_CAT(_, b)), RN_CAT(_, c))


/* One table of row primitives per element type; member names match rowops.h. */
#define RN_OPS_STRUCT(T, TS)                                                                  \
    typedef struct {                                                                          \
        double (*sum)(const T *, Py_ssize_t);                                                 \
        double (*sumsq)(const T *, Py_ssize_t);                                               \
        double (*sumsqdev)(const T *, Py_ssize_t, double);                                    \
        double (*rms_bwd_dot)(const T *, const T *, const T *, double, Py_ssize_t);           \
        void (*ln_bwd_sums)(double *, double *, const T *, const T *, const T *, double,      \
                            double, Py_ssize_t);                                              \
        void (*rms_apply)(T *, const T *, const T *, double, Py_ssize_t, int);                \
        void (*ln_apply)(T *, const T *, const T *, const T *, double, double, Py_ssize_t,    \
                         int);                                                                \
        void (*rms_bwd_apply)(T *, double *, const T *, const T *, const T *, double, double,  \
                              Py_ssize_t, int);                                               \
        void (*ln_bwd_apply)(T *, double *, double *, const T *, const T *, const T *, double, \
                             double, double, double, Py_ssize_t, int);                        \
        void (*accumulate)(double *, const double *, Py_ssize_t);                             \
        void (*narrow)(T *, const double *, Py_ssize_t);                                      \
        void (*residual_add)(T *, const T *, const T *, const T *, const uint8_t *, Py_ssize_t, \
                             double, Py_ssize_t, int);                                        \
        void (*residual_bwd)(T *, T *, double *, const T *, const T *, const T *, const T *,   \
                             const uint8_t *, Py_ssize_t, double, Py_ssize_t, int);           \
        double (*residual_reduce)(const T *, const T *, const T *, const uint8_t *, Py_ssize_t,\
                                  double, Py_ssize_t, int, double);                           \
        void (*residual_norm_apply)(T *, T *, const T *, const T *, const T *, const uint8_t *,\
                                    Py_ssize_t, double, const T *, const T *, double, double, \
                                    Py_ssize_t, int);                                         \
        void (*sigmoid)(T *, T *, const T *, Py_ssize_t);                                     \
        /* element-type independent (the same function in both tables): philox.h */          \
        void (*philox_uniforms)(uint32_t *, uint64_t, uint64_t, Py_ssize_t);                  \
        void (*dropout_keep)(uint8_t *, uint64_t, uint64_t, Py_ssize_t, uint32_t);            \
        void (*dropout_bits)(uint64_t *, uint64_t, uint64_t, Py_ssize_t, uint32_t);           \
    } rn_ops_##TS;
RN_OPS_STRUCT(float, f32)
RN_OPS_STRUCT(double, f64)

#define RN_OPS_TABLE(TS, ISA)                                                                 \
    {                                                                                         \
        RN_CAT3(sum, TS, ISA), RN_CAT3(sumsq, TS, ISA), RN_CAT3(sumsqdev, TS, ISA),           \
        RN_CAT3(rms_bwd_dot, TS, ISA), RN_CAT3(ln_bwd_sums, TS, ISA), RN_CAT3(rms_apply, TS, ISA),   \
        RN_CAT3(ln_apply, TS, ISA), RN_CAT3(rms_bwd_apply, TS, ISA),                          \
        RN_CAT3(ln_bwd_apply, TS, ISA), RN_CAT3(accumulate, TS, ISA),                         \
        RN_CAT3(narrow, TS, ISA),                                                             \
        RN_CAT3(residual_add, TS, ISA), RN_CAT3(residual_bwd, TS, ISA),                       \
        RN_CAT3(residual_reduce, TS, ISA), RN_CAT3(residual_norm_apply, TS, ISA),             \
        RN_CAT3(sigmoid, TS, ISA),                                                            \
        RN_CAT(rn_philox_uniforms_, ISA), RN_CAT(rn_dropout_keep_, ISA),                      \
        RN_CAT(rn_dropout_bits_, ISA)                                                         \
    }

#if RN_X86
/* ---- level 1: SSE2, the x86-64 baseline (no target attribute needed) ---- */
#define RN_LEVEL 1
#define RN_ISA sse2
#define RN_VBYTES 16
#include "cpu_level.h"
#undef RN_LEVEL
#undef RN_ISA
#undef RN_VBYTES

/* ---- level 2: AVX2 ---- */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2")
#endif
#define RN_LEVEL 2
#define RN_ISA avx2
#define RN_VBYTES 32
#include "cpu_level.h"
#undef RN_LEVEL
#undef RN_ISA
#undef RN_VBYTES
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* ---- level 3: AVX-512F ---- */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f")
#endif
#define RN_LEVEL 3
#define RN_ISA avx512
#define RN_VBYTES 64
#include "cpu_level.h"
#undef RN_LEVEL
#undef RN_ISA
#undef RN_VBYTES
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* Dispatch levels, narrowest first; rn_best_level() returns an index into these arrays. */
static const char *const rn_level_names[] = {"sse2", "avx2", "avx512"};
static const rn_ops_f32 rn_tables_f32[] = {RN_OPS_TABLE(f32, sse2), RN_OPS_TABLE(f32, avx2),
                                           RN_OPS_TABLE(f32, avx512)};
static const rn_ops_f64 rn_tables_f64[] = {RN_OPS_TABLE(f64, sse2), RN_OPS_TABLE(f64, avx2),
                                           RN_OPS_TABLE(f64, avx512)};

static int rn_best_level(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return 2;
    if (__builtin_cpu_supports("avx2")) return 1;
    return 0;
}
#else /* not x86: one portable level */
#define RN_LEVEL 0
#define RN_ISA portable
#define RN_VBYTES 16
#include "cpu_level.h"
#undef RN_LEVEL
#undef RN_ISA
#undef RN_VBYTES

static const char *const rn_level_names[] = {"portable"};
static const rn_ops_f32 rn_tables_f32[] = {RN_OPS_TABLE(f32, portable)};
static const rn_ops_f64 rn_tables_f64[] = {RN_OPS_TABLE(f64, portable)};

static int rn_best_level(void) { return 0; }
#endif

/* The active tables of this extension module, chosen by rn_cpu_init(). */
static rn_ops_f32 RN_F32;
static rn_ops_f64 RN_F64;
static int rn_active_level = -1;

/* Picks the widest supported level, capped by RESNORM_CPU (a level name); returns its index. */
static int rn_cpu_init(void)
{
    int level = rn_best_level();
    const char *cap = getenv("RESNORM_CPU");
    if (cap && *cap) {
        for (int i = 0; i < (int)(sizeof rn_level_names / sizeof rn_level_names[0]); i++) {
            if (strcmp(cap, rn_level_names[i]) == 0 && i < level) level = i;
        }
    }
    RN_F32 = rn_tables_f32[level];
    RN_F64 = rn_tables_f64[level];
    rn_active_level = level;
    return level;
}

static const char *rn_level_name(void)
{
    return rn_active_level < 0 ? "uninitialised" : rn_level_names[rn_active_level];
}

static const char *rn_build_flags(void) { return RESNORM_BUILD_FLAGS; }

#endif /* RESNORM_CPU_H */
