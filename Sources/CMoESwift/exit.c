// Calls in flight at process exit.
//
// Python does not wait for daemon threads: exit() runs while they may be inside a native
// call whose work items run BLAS on Dispatch workers, and OpenBLAS's destructor frees the
// buffers those products use (SIGSEGV in 8 of 12 runs here). An atexit handler, which
// runs before the libraries' destructors, waits for the calls in flight (at most 10 s);
// calls that try to start after it began wait forever, as a daemon thread would for the GIL.
#include "moe_swift_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

static long active_calls;
static int exiting;
static pthread_once_t installed = PTHREAD_ONCE_INIT;

static void wait_for_calls_in_flight(void) {
    __atomic_store_n(&exiting, 1, __ATOMIC_SEQ_CST);
    for (int ms = 0; ms < 10000 && __atomic_load_n(&active_calls, __ATOMIC_SEQ_CST) > 0; ms++) usleep(1000);
}

static void install(void) { atexit(wait_for_calls_in_flight); }

void moe_internal_call_begin(void) {
    pthread_once(&installed, install);
    __atomic_add_fetch(&active_calls, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&exiting, __ATOMIC_SEQ_CST)) {
        __atomic_sub_fetch(&active_calls, 1, __ATOMIC_SEQ_CST);
        for (;;) pause();
    }
}

void moe_internal_call_end(void) { __atomic_sub_fetch(&active_calls, 1, __ATOMIC_SEQ_CST); }
