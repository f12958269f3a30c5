/* Instantiates philox.h once and rowops.h for float and double at the level (RN_LEVEL,
 * RN_ISA, RN_VBYTES) defined by the includer, cpu.h.  No include guard: it is included
 * once per level. */
#include "philox.h"
#define RN_T float
#define RN_TS f32
#define RN_TFLOAT 1
#include "rowops.h"
#undef RN_T
#undef RN_TS
#undef RN_TFLOAT
#define RN_T double
#define RN_TS f64
#define RN_TFLOAT 0
#include "rowops.h"
#undef RN_T
#undef RN_TS
#undef RN_TFLOAT
