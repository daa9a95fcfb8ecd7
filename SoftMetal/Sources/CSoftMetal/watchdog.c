// The watchdog: a thread that stops kernels running past their deadline. GPU threads are
// fibers here that run until they block, so a kernel that spins waiting for another thread
// would hang the process (on a GPU the other thread runs beside it). The watchdog signals
// the worker, whose handler (on_watchdog) jumps back to csm_run (run.c), which reports
// SM_ERROR_TIMEOUT; SOFTMETAL_TIMEOUT_S sets the time (csm_timeout_seconds).
#if defined(__linux__)
#include "csoftmetal_internal.h"

#include <stdlib.h>
#include <time.h>

// MARK: the watchdog
// GPU threads are fibers that run until they block, so a kernel that spins waiting for
// another thread (or loops forever) would hang the process. A watchdog thread sends
// WATCHDOG_SIGNAL to a worker whose csm_run passed its deadline; the handler siglongjmps
// back to csm_run, which reports SM_ERROR_TIMEOUT.
#define MAX_WATCHED 1024
static thread_state* volatile watched_threads[MAX_WATCHED];
static pthread_mutex_t watch_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t watchdog_once = PTHREAD_ONCE_INIT;

CSM_INTERNAL double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

double csm_timeout_seconds(void) {
    static double timeout = -1;
    if (timeout < 0) {
        const char* env = getenv("SOFTMETAL_TIMEOUT_S");
        double t = env ? atof(env) : 60.0;
        timeout = t > 0 ? t : 0;
    }
    return timeout;
}

static void* watchdog_main(void* unused) {
    (void)unused;
    for (;;) {
        struct timespec pause = {0, 100 * 1000 * 1000};
        nanosleep(&pause, NULL);
        double now = now_seconds();
        pthread_mutex_lock(&watch_lock);
        for (int i = 0; i < MAX_WATCHED; i++) {
            thread_state* ts = watched_threads[i];
            if (ts && ts->running && now > ts->deadline) pthread_kill(ts->thread, WATCHDOG_SIGNAL);
        }
        pthread_mutex_unlock(&watch_lock);
    }
    return NULL;
}

static void start_watchdog(void) {
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_create(&t, &attr, watchdog_main, NULL);
    pthread_attr_destroy(&attr);
}

CSM_INTERNAL void watch(thread_state* ts) {
    pthread_mutex_lock(&watch_lock);
    for (int i = 0; i < MAX_WATCHED; i++) {
        if (!watched_threads[i]) {
            watched_threads[i] = ts;
            ts->watched = i + 1;
            break;
        }
    }
    pthread_mutex_unlock(&watch_lock);
}

CSM_INTERNAL void unwatch(thread_state* ts) {
    if (!ts->watched) return;
    pthread_mutex_lock(&watch_lock);
    watched_threads[ts->watched - 1] = NULL;
    ts->watched = 0;
    pthread_mutex_unlock(&watch_lock);
}

CSM_INTERNAL void start_watchdog_once(void) { pthread_once(&watchdog_once, start_watchdog); }

CSM_INTERNAL void on_watchdog(int sig, siginfo_t* info, void* context) {
    (void)sig; (void)info; (void)context;
    thread_state* ts = current_thread;
    if (ts && ts->running && now_seconds() > ts->deadline) {
        ts->running = 0;
        siglongjmp(ts->jmp, SM_ERROR_TIMEOUT);
    }
}

#endif
