/* The compiled core as the other extension modules see it: the dispatched tables of
 * primitives, imported once per module from resnorm._core (as NumPy's C API is imported:
 * a capsule), so that the core is compiled, and its level chosen, once. */
#ifndef RESNORM_CORE_H
#define RESNORM_CORE_H
#include "rn_base.h"
#include "primitives.h"

#define RN_CORE_CAPSULE "resnorm._core._ops"

/* this module's pointer to the tables of the level resnorm._core chose */
static const rn_ops *RN_OPS = NULL;

/* 0 on success; -1 with a Python exception set (the core could not be imported). */
static int rn_import_core(void)
{
    RN_OPS = (const rn_ops *)PyCapsule_Import(RN_CORE_CAPSULE, 0);
    return RN_OPS ? 0 : -1;
}
#endif
