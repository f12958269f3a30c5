/* The core on CPUs other than x86: one level from the same templates, vectorised for the
 * architecture's baseline by the compiler (e.g. NEON on aarch64). */
#include "rn_base.h"
#if !RN_X86
#define RN_LEVEL 0
#define RN_ISA portable
#define RN_VBYTES 16
#include "level.h"
#endif
