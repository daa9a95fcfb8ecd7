// The worker pool of moe_cpu_pool.h.
//
// One job at a time. Its fields are published by an even generation number; an odd one
// means "being rewritten". A worker enters a job by counting itself in `inside` and then
// checking that the generation is still the one it saw, so the caller, which waits for
// `inside` to drop to zero after making the generation odd, never rewrites a job that a
// worker is still reading. Every atomic is sequentially consistent: a job has a handful of
// them against milliseconds of work.
#if defined(__linux__)
#define _GNU_SOURCE  // sched_getaffinity, CPU_COUNT: before any system header
#endif
#include "moe_cpu_pool.h"

#if defined(__linux__)
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

// How long a worker spins after a job, inside a call, before sleeping: the gap between the
// stages of a call is microseconds.
enum { SPIN_NS = 300 * 1000, MAX_WORKERS = 255 };

// After a call (moe_cpu_pool_rest), the host's own work runs: its NumPy/OpenBLAS, torch
// (OpenMP) or MLX threads want the cores, and a worker of ours spinning there takes one
// from them (on 2 cores a 32 MB NumPy product took twice as long right after a call).
// So workers sleep as soon as a call has returned, unless MOE_CPU_SPIN_US asks them to
// spin that long first; the next call's moe_cpu_pool_prepare wakes them while its caller
// routes the tokens.
static int64_t rest_spin_ns;

static struct {
    pthread_mutex_t start_lock;
    int started;
    int workers;
    atomic_flag busy;              // held by the thread whose job is running
    _Atomic uint32_t generation;   // even: job published; odd: job being rewritten
    atomic_int inside;             // workers between entering and leaving a job
    atomic_int sleepers;           // workers in futex_wait
    atomic_int resting;            // 1 between a call's end and the next prepare or job
    // The job.
    moe_cpu_pool_body body;
    void* context;
    int64_t count;
    _Atomic int64_t next;          // next index to claim
    _Atomic int64_t done;          // indices finished
    atomic_int caller_cpu;         // where the calling thread last ran (sched_getcpu), -1: unknown
    cpu_set_t cores;               // the process's CPUs when the workers started
} pool = {.start_lock = PTHREAD_MUTEX_INITIALIZER, .busy = ATOMIC_FLAG_INIT, .caller_cpu = -1};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void run_items(void) {
    for (;;) {
        const int64_t i = atomic_fetch_add(&pool.next, 1);
        if (i >= pool.count) return;
        pool.body(pool.context, i);
        atomic_fetch_add(&pool.done, 1);
    }
}

// A worker woken from its futex is often placed on the core of the thread that woke it
// (the scheduler's wake-affine choice), though another core is idle, and stays there
// until the load balancer moves it, milliseconds later: caller and worker then share one
// core for the whole call. Measured on 2 cores, a one-token call made 10 ms after the
// previous one (a model's attention in between): 5.3-5.8 ms with the worker on the
// caller's core in 25 of 60 calls (the caller preempted 90 times), against 2.6-2.8 ms
// back to back. So a woken worker on the caller's core moves itself off it: its affinity
// without that core (the kernel migrates it at once), then its affinity as before.
static void leave_callers_core(void) {
    const int caller = atomic_load(&pool.caller_cpu);
    if (caller < 0 || caller >= CPU_SETSIZE || sched_getcpu() != caller || CPU_COUNT(&pool.cores) < 2) return;
    cpu_set_t elsewhere = pool.cores;
    CPU_CLR(caller, &elsewhere);
    if (CPU_COUNT(&elsewhere) == 0 || sched_setaffinity(0, sizeof elsewhere, &elsewhere) != 0) return;
    sched_setaffinity(0, sizeof pool.cores, &pool.cores);
}

// Returns the first even generation other than `seen`, spinning, then sleeping: after
// SPIN_NS inside a call, after rest_spin_ns once the call has returned. A wake-up without
// a new job (moe_cpu_pool_prepare) spins again.
static uint32_t wait_for_job(uint32_t seen) {
    int64_t since = now_ns();
    for (int spins = 0;; spins++) {
        const uint32_t g = atomic_load(&pool.generation);
        if (g != seen && (g & 1) == 0) return g;
        // The clock and the flag every 64 pauses: a few microseconds.
        if ((spins & 63) == 63 && now_ns() - since > (atomic_load(&pool.resting) ? rest_spin_ns : SPIN_NS)) {
            atomic_fetch_add(&pool.sleepers, 1);
            // Returns at once if the generation moved on after it was read.
            syscall(SYS_futex, (uint32_t*)&pool.generation, FUTEX_WAIT_PRIVATE, g, NULL, NULL, 0);
            atomic_fetch_sub(&pool.sleepers, 1);
            leave_callers_core();
            since = now_ns();
        } else {
            cpu_relax();
        }
    }
}

static void* worker_main(void* unused) {
    (void)unused;
    // Named, so that top -H, a profiler or a test tells them from the host's threads.
    pthread_setname_np(pthread_self(), "moe_swift-cpu");
    uint32_t seen = atomic_load(&pool.generation);
    for (;;) {
        const uint32_t g = wait_for_job(seen);
        seen = g;
        atomic_fetch_add(&pool.inside, 1);
        if (atomic_load(&pool.generation) == g) run_items();
        atomic_fetch_sub(&pool.inside, 1);
    }
    return NULL;
}

// A forked child has the memory of the pool but none of its threads.
static void forget_workers_in_child(void) {
    pool.started = 0;
    pool.workers = 0;
    atomic_store(&pool.generation, 0);  // even: a fork inside a job may have left it odd
    atomic_store(&pool.inside, 0);
    atomic_store(&pool.sleepers, 0);
    atomic_flag_clear(&pool.busy);
    pthread_mutex_init(&pool.start_lock, NULL);
}

static int usable_cores(void) {
    if (sched_getaffinity(0, sizeof pool.cores, &pool.cores) == 0) return CPU_COUNT(&pool.cores);
    CPU_ZERO(&pool.cores);  // unknown: workers never move themselves
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

// A non-negative integer from the environment, or `otherwise`.
static long env_count(const char* name, long otherwise) {
    const char* text = getenv(name);
    if (text == NULL || *text == 0) return otherwise;
    char* end;
    const long v = strtol(text, &end, 10);
    return *end == 0 && v >= 0 ? v : otherwise;
}

static void start_workers(void) {
    pthread_mutex_lock(&pool.start_lock);
    if (!pool.started) {
        static int registered;
        if (!registered) registered = pthread_atfork(NULL, NULL, forget_workers_in_child) == 0;
        // MOE_CPU_THREADS: the threads of a call, the caller's included (default: every
        // core this process may run on), e.g. fewer to leave cores to the host's pool.
        const long threads = env_count("MOE_CPU_THREADS", 0);
        const int cores = usable_cores();  // also records them for leave_callers_core
        int want = (threads > 0 ? (int)(threads < MAX_WORKERS ? threads : MAX_WORKERS) : cores) - 1;
        if (want > MAX_WORKERS) want = MAX_WORKERS;
        rest_spin_ns = env_count("MOE_CPU_SPIN_US", 0) * 1000;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        for (int i = 0; i < want; i++) {
            pthread_t thread;
            if (pthread_create(&thread, &attr, worker_main, NULL) != 0) break;  // fewer workers
            pool.workers++;
        }
        pthread_attr_destroy(&attr);
        pool.started = 1;
    }
    pthread_mutex_unlock(&pool.start_lock);
}

void moe_cpu_pool_prepare(void) {
    atomic_store(&pool.resting, 0);
    atomic_store(&pool.caller_cpu, sched_getcpu());
    if (pool.started && atomic_load(&pool.sleepers) > 0)
        syscall(SYS_futex, (uint32_t*)&pool.generation, FUTEX_WAKE_PRIVATE, pool.workers, NULL, NULL, 0);
}

void moe_cpu_pool_rest(void) { atomic_store(&pool.resting, 1); }

int moe_cpu_pool_run(int64_t count, void* context, moe_cpu_pool_body body) {
    if (atomic_flag_test_and_set(&pool.busy)) return 0;
    if (!pool.started) start_workers();
    atomic_store(&pool.resting, 0);
    atomic_store(&pool.caller_cpu, sched_getcpu());
    // Retire the previous job: make it unenterable, then wait for the workers still in it.
    const uint32_t g = atomic_load(&pool.generation);
    atomic_store(&pool.generation, g + 1);
    while (atomic_load(&pool.inside) > 0) cpu_relax();
    pool.body = body;
    pool.context = context;
    pool.count = count;
    atomic_store(&pool.next, 0);
    atomic_store(&pool.done, 0);
    atomic_store(&pool.generation, g + 2);
    if (atomic_load(&pool.sleepers) > 0)
        syscall(SYS_futex, (uint32_t*)&pool.generation, FUTEX_WAKE_PRIVATE, pool.workers, NULL, NULL, 0);
    run_items();
    while (atomic_load(&pool.done) < count) cpu_relax();
    atomic_flag_clear(&pool.busy);
    return 1;
}

#else

void moe_cpu_pool_prepare(void) {}

void moe_cpu_pool_rest(void) {}

int moe_cpu_pool_run(int64_t count, void* context, moe_cpu_pool_body body) {
    (void)count, (void)context, (void)body;
    return 0;
}

#endif
