/* Sums over rows: the float64 partial rows of the row blocks, added in block order, and
 * the total narrowed to the element type.  narrow is typed (element.h includes this file
 * once per element type); accumulate is untyped and defined once per level (level.h). */

#ifdef RN_UNTYPED
/* acc_i += part_i: folds one block's partial row into the running total (fixed order). */
static void RN_CAT(rn_accumulate_, RN_ISA)(double *acc, const double *part, Py_ssize_t d)
{
    for (Py_ssize_t i = 0; i < d; i++)
        acc[i] += part[i];
}
#else
/* out_i = (T) acc_i, rounded once */
static void RN_NAME(narrow)(RN_T *out, const double *acc, Py_ssize_t d)
{
    for (Py_ssize_t i = 0; i < d; i++)
        RN_NAME(st_double)(out + i, acc[i]);
}
#endif
