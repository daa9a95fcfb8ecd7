// Running a launcher: csm_run runs one kernel launcher (a dispatch, or one worker's chunk
// of it) on the calling thread, with the thread's stacks and guarded threadgroup memory
// (stacks.c), SoftMetal's signal handlers in place (signals.c) and a sigsetjmp recovery
// point that a fault or the watchdog (watchdog.c) jumps back to, so that a failing kernel
// becomes an error of its dispatch, not the end of the process.
#if defined(__linux__)
#include "csoftmetal_internal.h"

#include <stdio.h>

// MARK: running a launcher --------------------------------------------------------------

static void set_error(sm_dispatch* d, const char* message) {
    if (d->error && d->error_capacity) snprintf(d->error, d->error_capacity, "%s", message);
}

double csm_now(void) { return now_seconds(); }

int32_t csm_run(sm_launcher launcher, sm_dispatch* d, uint32_t lanes_needed, double deadline) {
    thread_state* ts = get_thread_state();
    if (!ts || !ensure_stacks(ts, lanes_needed)) {
        set_error(d, "out of memory for fiber stacks or threadgroup memory");
        return d->error_kind = SM_ERROR_RUNTIME;
    }
    install_handler();
    ensure_altstack(ts);
    for (int i = 0; i < SM_MAX_THREADGROUP_MEMORY; i++) {
        uint64_t want = d->tg_mem_lengths[i];
        if (ts->tg_length[i] != want) {
            csm_guarded_free(ts->tg[i], ts->tg_length[i]);
            ts->tg[i] = want ? guarded_map(want, -(i + 1), KIND_THREADGROUP) : NULL;
            ts->tg_length[i] = ts->tg[i] ? want : 0;
            if (want && !ts->tg[i]) {
                set_error(d, "out of memory for threadgroup memory");
                return d->error_kind = SM_ERROR_RUNTIME;
            }
        }
        d->tg_mem[i] = ts->tg[i];
    }
    d->tg_static = ts->tg_static;
    d->tg_static_capacity = TG_STATIC_CAPACITY;
    d->stacks = ts->stacks;
    d->stack_size = ts->stack_size;
    d->stack_count = (uint32_t)ts->stack_count;
    d->scratch = ts->scratch;
    d->scratch_size = SCRATCH_SIZE;
    d->error_kind = SM_OK;

    double timeout = csm_timeout_seconds();
    if (timeout > 0) {
        // Dispatch's worker threads block asynchronous signals; unblocked before sigsetjmp,
        // which saves the mask that siglongjmp restores.
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, WATCHDOG_SIGNAL);
        pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    }
    if (timeout > 0 && deadline > 0 && now_seconds() >= deadline) {
        set_error(d, "timeout");  // the dispatch's time ran out before this chunk started
        return d->error_kind = SM_ERROR_TIMEOUT;
    }
    ts->deadline = timeout > 0 ? (deadline > 0 ? deadline : now_seconds() + timeout) : 1e300;
    int jumped = sigsetjmp(ts->jmp, 1);
    if (jumped) {
        ts->running = 0;
        set_error(d, jumped == SM_ERROR_STACK_OVERFLOW ? "stack overflow in a GPU thread"
                     : jumped == SM_ERROR_TIMEOUT ? "timeout"
                     : jumped == SM_ERROR_TRAP ? "trap in kernel code" : "out-of-bounds access");
        return d->error_kind = (uint32_t)jumped;
    }

    ts->check_division = (d->flags & SM_FLAG_CHECK_DIVISION) != 0;
    ts->running = 1;
    int32_t result = launcher(d);
    ts->running = 0;
    return result;
}

#endif
