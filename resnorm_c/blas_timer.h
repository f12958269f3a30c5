/* Optional wall-clock accounting of the time spent inside BLAS (gemm), for benchmarks that
 * report the share of a training step spent outside BLAS.  Off by default: then a gemm call
 * costs one branch more.  One counter per extension module (static), which is fine because
 * only resnorm._layers calls BLAS. */
#ifndef RESNORM_BLAS_TIMER_H
#define RESNORM_BLAS_TIMER_H

#ifdef _WIN32
#include <windows.h>
static double rn_now(void)
{
    LARGE_INTEGER f, c;
    QueryPerformanceFrequency(&f);
    QueryPerformanceCounter(&c);
    return (double)c.QuadPart / (double)f.QuadPart;
}
#else
#include <time.h>
static double rn_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
#endif

static int rn_blas_timing = 0;
static double rn_blas_seconds = 0.0;

static inline double rn_blas_clock(void) { return rn_blas_timing ? rn_now() : 0.0; }

static inline void rn_blas_charge(double t0)
{
    if (rn_blas_timing) {
        double dt = rn_now() - t0;
#ifdef _OPENMP
#pragma omp atomic
#endif
        rn_blas_seconds += dt;
    }
}

#endif
