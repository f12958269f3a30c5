/* How many cores a call may use (launch.pxi's thread rule).
 *
 * rn_cores(): the cores this process may run on (its CPU affinity; all online CPUs where
 * that is unknown).
 *
 * rn_free_cores(): of those, the ones other processes are not keeping busy, measured from
 * /proc/stat over this process's CPUs: (their busy time - this process's own CPU time) /
 * wall time is the number of cores others use.  Sampled at most every RN_FREE_PERIOD_NS;
 * the first call, and systems without /proc/stat, count every core as free.  Why: a team
 * thread that shares its core with another busy process must wait for the scheduler before
 * the parallel region's closing barrier can finish, and the whole call waits with it (a
 * (512, 1024) rms_norm went from tens of microseconds to milliseconds: see
 * benchmarks/thread_contention.py); a team sized to the free cores does not wait.
 * Called with the GIL held, so the sampling state needs no lock.
 */
#ifndef RESNORM_CORES_H
#define RESNORM_CORES_H

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef __linux__
#include <sched.h>
#include <sys/resource.h>
#endif

#define RN_FREE_PERIOD_NS 50000000LL

static int rn_cores(void)
{
#ifdef __linux__
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

#ifdef __linux__
static long long rn_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Busy clock ticks of this process's CPUs since boot (-1: /proc/stat unreadable). */
static long long rn_busy_ticks(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0)
        return -1;
    FILE *f = fopen("/proc/stat", "r");
    if (!f)
        return -1;
    char line[512];
    long long busy = 0;
    int seen = 0;
    while (fgets(line, sizeof line, f)) {
        int cpu;
        unsigned long long user, nice, system, idle, iowait, irq, softirq, steal;
        if (strncmp(line, "cpu", 3) != 0 || line[3] < '0' || line[3] > '9')
            continue;
        if (sscanf(line + 3, "%d %llu %llu %llu %llu %llu %llu %llu %llu", &cpu, &user, &nice,
                   &system, &idle, &iowait, &irq, &softirq, &steal) != 9)
            continue;
        if (cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &set))
            continue;
        busy += (long long)(user + nice + system + irq + softirq + steal);
        seen = 1;
    }
    fclose(f);
    return seen ? busy : -1;
}

/* This process's CPU time (all threads), in seconds. */
static double rn_own_seconds(void)
{
    struct rusage u;
    if (getrusage(RUSAGE_SELF, &u) != 0)
        return 0.0;
    return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec)
           + 1e-6 * (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}
#endif

static int rn_free_cores(void)
{
#ifdef __linux__
    static long long last_ns = 0, last_busy = -1;
    static double last_own = 0.0;
    static int free_cores = 0;
    long long now = rn_now_ns();
    /* between samples, the last count (at most the cores of the affinity then: a change of
     * affinity counts from the next sample; rn_cores is a system call, too slow for every
     * call of a few microseconds) */
    if (free_cores > 0 && now - last_ns < RN_FREE_PERIOD_NS)
        return free_cores;
    int cores = rn_cores();
    long long busy = rn_busy_ticks();
    double own = rn_own_seconds();
    free_cores = cores;
    if (busy >= 0 && last_busy >= 0 && now > last_ns) {
        double others = ((double)(busy - last_busy) / (double)sysconf(_SC_CLK_TCK)
                         - (own - last_own)) / (1e-9 * (double)(now - last_ns));
        int f = (int)(cores - others + 0.5);
        free_cores = f < 1 ? 1 : (f > cores ? cores : f);
    }
    last_ns = now;
    last_busy = busy;
    last_own = own;
    return free_cores;
#else
    return rn_cores();
#endif
}

#endif /* RESNORM_CORES_H */
