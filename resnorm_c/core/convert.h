/* Conversions between an element type and float32 (typed template; element.h includes it
 * after vec.h): whole vectors through the vector loads and stores, the rest element by
 * element through the scalar ones, so both paths of every level are exercised (the tests
 * compare them over every 16-bit pattern).  float32 -> 16 bits rounds to nearest even. */

/* out_i = (float) x_i */
static void RN_NAME(to_float32)(float *out, const RN_T *x, Py_ssize_t n)
{
    Py_ssize_t i = 0;
#if RN_TFLOAT
    for (; i + RN_W <= n; i += RN_W) {
        const RN_VEC v = RN_NAME(vload)(x + i);
        memcpy(out + i, &v, sizeof v);
    }
#endif
    for (; i < n; i++)
        out[i] = (float)RN_LD(x + i);
}

/* out_i = (T) x_i.  stream: non-temporal stores (the output of a pass over a row the
 * caller widened into its own buffer: see resnorm_c/mixed_kernels.pxd), whole vectors
 * from out's first vector boundary, the head and tail element by element. */
static void RN_NAME(from_float32)(RN_T *out, const float *x, Py_ssize_t n, int stream)
{
    Py_ssize_t i = 0;
    (void)stream;   /* float64 never streams: no caller widens float64 rows */
#if RN_TFLOAT
    if (stream) {
#define PF_(k) ((void)0)
#define B_(k) { RN_VEC v_ = {0}; memcpy(&v_, x + (k), n_ * sizeof(float)); RN_PUT(out + (k), v_); }
        RN_ELEMENTWISE(n, out, stream, PF_, B_);
#undef B_
#undef PF_
        return;
    }
    for (; i + RN_W <= n; i += RN_W) {
        RN_VEC v;
        memcpy(&v, x + i, sizeof v);
        RN_NAME(vstore)(out + i, v);
    }
#endif
    for (; i < n; i++)
        RN_ST(out + i, (RN_C)x[i]);
}
