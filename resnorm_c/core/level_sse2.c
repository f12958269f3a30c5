/* The core at the x86-64 baseline, SSE2: no target attribute needed. */
#include "rn_base.h"
#if RN_X86
#define RN_LEVEL 1
#define RN_ISA sse2
#define RN_VBYTES 16
#include "level.h"
#endif
