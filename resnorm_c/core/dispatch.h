/* The one dispatch decision of the core (dispatch.c), made when resnorm._core is imported. */
#ifndef RESNORM_DISPATCH_H
#define RESNORM_DISPATCH_H
#include "primitives.h"

/* Picks the widest level the CPU (and the OS, via XSAVE) supports, capped by the
 * environment variable RESNORM_CPU (a level name); returns its tables. */
const rn_ops *rn_core_select(void);
/* The name of the level rn_core_select chose ("uninitialised" before it ran). */
const char *rn_core_level_name(void);
/* The names of every level this build has, narrowest first, and how many there are. */
const char *const *rn_core_level_names(int *count);
/* The C compiler flags the core was built with. */
const char *rn_core_build_flags(void);
#endif
