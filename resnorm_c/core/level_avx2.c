/* The core compiled for AVX2 (chosen at import when the CPU has it: dispatch.c). */
#include "rn_base.h"
#if RN_X86
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC target("avx2")
#endif
#define RN_LEVEL 2
#define RN_ISA avx2
#define RN_VBYTES 32
#include "level.h"
#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
