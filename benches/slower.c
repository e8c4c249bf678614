/* slower CPU FRACTION PARENT: take FRACTION of processor CPU's time away from everything else, for as long as it runs.
 *
 * Pinned to CPU, at real-time priority (SCHED_FIFO: it preempts every ordinary process), it spins for FRACTION of
 * every 10 ms and sleeps the rest; what runs beside it gets the other 1 - FRACTION of that core, however many
 * threads it has there. One per core makes the machine a uniformly slower one: FRACTION = 1 - 1/FACTOR runs CPU-bound
 * work FACTOR times as long, while sleeps, timeouts and the network keep their real durations, as on a slower
 * processor. benches/slower.sh starts one per core and stops them. Linux only; needs root (or CAP_SYS_NICE). */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <signal.h>
#include <unistd.h>
#include <time.h>

#define PERIOD_NS 10000000L

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: slower CPU FRACTION PARENT (0 < FRACTION < 0.9; PARENT: the starting script's pid)\n");
        return 2;
    }
    /* never outlive what started it (benches/slower.sh, even killed with -9): a real-time spinner left behind would
     * slow the machine for good. PARENT, the script's own pid, also catches a script that died before the prctl. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != (pid_t)atol(argv[3]))
        return 1;
    int cpu = atoi(argv[1]);
    double fraction = atof(argv[2]);
    if (!(fraction > 0 && fraction < 0.9)) {  /* the kernel leaves real-time tasks 95 % at most; keep well below */
        fprintf(stderr, "slower: FRACTION %s is not in (0, 0.9)\n", argv[2]);
        return 2;
    }
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    struct sched_param fifo = {.sched_priority = 1};
    if (sched_setaffinity(0, sizeof one, &one) != 0 || sched_setscheduler(0, SCHED_FIFO, &fifo) != 0) {
        fprintf(stderr, "slower: cannot run on CPU %d at real-time priority: %s\n", cpu, strerror(errno));
        return 1;
    }
    long long busy_ns = (long long)(fraction * PERIOD_NS), start = now_ns();
    for (;;) {
        while (now_ns() - start < busy_ns) {
        }
        start += PERIOD_NS;
        struct timespec wake = {.tv_sec = start / 1000000000LL, .tv_nsec = start % 1000000000LL};
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &wake, NULL);
        long long late = now_ns() - start;
        if (late > PERIOD_NS)  /* suspended, or starved: start a new period from now rather than catch up */
            start = now_ns();
    }
}
