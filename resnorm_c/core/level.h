/* The whole core at one level: each level_<name>.c defines RN_LEVEL (3 avx512 | 2 avx2 |
 * 1 sse2 | 0 portable), RN_ISA (the name) and RN_VBYTES (native vector bytes), and may
 * define RN_BF16_CVT (1: the CPU's bfloat16 conversion, at RN_LEVEL 3), puts the level's
 * target attribute in force, and includes this file.  It instantiates every
 * template and defines the level's table of primitives, rn_ops_<name>, filled by member
 * name (primitives.h). */

#include "rn_base.h"
#include "primitives.h"

#ifndef RN_BF16_CVT
#define RN_BF16_CVT 0
#endif

/* the untyped primitives */
#include "philox.h"
#define RN_UNTYPED
#include "partials.h"
#undef RN_UNTYPED

/* the typed primitives, once per element type of primitives.py's ELEMENT_TYPES */
#define RN_T float
#define RN_C float
#define RN_TS f32
#define RN_TFLOAT 1
#define RN_HALF 0
#include "element.h"
#undef RN_T
#undef RN_C
#undef RN_TS
#undef RN_TFLOAT
#undef RN_HALF

#define RN_T double
#define RN_C double
#define RN_TS f64
#define RN_TFLOAT 0
#define RN_HALF 0
#include "element.h"
#undef RN_T
#undef RN_C
#undef RN_TS
#undef RN_TFLOAT
#undef RN_HALF

/* the 16-bit types (rn_half.h): computed in float */
#define RN_T rn_bf16
#define RN_C float
#define RN_TS bf16
#define RN_TFLOAT 1
#define RN_HALF RN_BF16
#include "element.h"
#undef RN_T
#undef RN_C
#undef RN_TS
#undef RN_TFLOAT
#undef RN_HALF

#define RN_T rn_f16
#define RN_C float
#define RN_TS f16
#define RN_TFLOAT 1
#define RN_HALF RN_F16
#include "element.h"
#undef RN_T
#undef RN_C
#undef RN_TS
#undef RN_TFLOAT
#undef RN_HALF

#define RN_EXPAND_(M, A) M(A)
const rn_ops RN_CAT(rn_ops_, RN_ISA) = RN_EXPAND_(RN_LEVEL_TABLE, RN_ISA);
#undef RN_EXPAND_
