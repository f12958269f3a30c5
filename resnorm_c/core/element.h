/* Instantiates the typed templates for one element type at one level: level.h includes it
 * once per element type, with RN_T, RN_C, RN_TS, RN_TFLOAT and RN_HALF defined (see vec.h). */
#include "vec.h"
#include "reduce.h"
#include "residual_rows.h"
#include "apply.h"
#include "backward.h"
#include "partials.h"
#include "convert.h"
#include "vmath.h"

/* vec.h's names, defined again for the next element type */
#undef RN_PFV_OUT
#undef RN_ELEMENTWISE
#undef RN_LD
#undef RN_ST
#undef RN_GET
#undef RN_PUT
#undef RN_F32_
#undef RN_GETP
#undef RN_PUTP
#undef RN_VLOADP
#undef RN_LDP
#undef RN_ADD_WIDENED
#undef RN_RESIDUAL_BRANCH
#undef RN_RESIDUAL_SUM
#undef RN_ITYPE
#undef RN_NHALF
#undef RN_HVEC
#undef RN_DVEC
#undef RN_VEC
#undef RN_NACC
#undef RN_DW
#undef RN_SBYTES
#undef RN_W
#undef RN_NAME
