// What the parts of CSoftMetal share (private: not in include/, so neither Swift nor the
// users of csoftmetal.h see it). The parts, one file each:
//   guarded_memory.c  guard registry, guarded mappings, buffers within the mapping budget
//   watchdog.c        the thread that stops kernels running past their deadline
//   stacks.c          per-thread state: fiber stacks, threadgroup memory, scratch
//   signals.c         the SIGSEGV / SIGBUS / SIGFPE / SIGILL / SIGTRAP handler, fault queries
//   run.c             csm_run: one launcher run on the calling thread
//   spawn.c           running the compiler (time limit, SIGINT), needs nothing from here
// Everything declared here was `static` while CSoftMetal was one file; shared between the
// parts it is hidden (CSM_INTERNAL), so that it is never exported from the library the
// parts are linked into (libMoESwift, whose exported names are the public csm_* ones).
// Linux only, as the parts are.
#ifndef CSOFTMETAL_INTERNAL_H
#define CSOFTMETAL_INTERNAL_H
#if defined(__linux__)
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "csoftmetal.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>

#define CSM_INTERNAL __attribute__((visibility("hidden")))

// MARK: the guard registry (guarded_memory.c) -------------------------------------------
// Readers (the signal handler) scan without locks; writers hold `registry_lock`. An entry
// is live while `hi` is non-zero; it is written last on insert and cleared first on remove.

enum { KIND_BUFFER = 1, KIND_THREADGROUP = 2, KIND_STACKS = 3 };
#define REGISTRY_SIZE 65536

typedef struct region {
    uintptr_t lo, hi;           // the whole mapping, guard pages included
    uintptr_t data, length;     // the usable bytes
    int32_t tag, kind;
    size_t stack_size;          // KIND_STACKS: the block size (guard page at each block's bottom)
    size_t wide;                // bytes of the wide-guard budget this region holds (0: page guards)
} region;

// Read by the signal handler (signals.c) for the region a fault hit.
CSM_INTERNAL extern region registry[REGISTRY_SIZE];

CSM_INTERNAL void registry_add(uintptr_t lo, uintptr_t hi, uintptr_t data, uintptr_t length, int32_t tag,
                               int32_t kind, size_t stack_size, size_t wide);
CSM_INTERNAL int registry_remove(uintptr_t data, region* out);
// The live entry whose mapping holds `address` (for stacks: only a block's guard page), or -1.
CSM_INTERNAL int registry_find(uintptr_t address);
// A guarded, registered mapping of `length` usable bytes (csm_guarded_alloc of any kind).
CSM_INTERNAL void* guarded_map(size_t length, int32_t tag, int32_t kind);

static inline size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

// MARK: per-thread state (stacks.c) -----------------------------------------------------

typedef struct thread_state {
    sigjmp_buf jmp;
    volatile int running;
    uintptr_t fault_address, fault_start, fault_length;
    int32_t fault_tag, fault_kind, fault_signal, fault_code;
    int check_division;         // SM_FLAG_CHECK_DIVISION of the running dispatch
    // fiber stacks
    char* stacks;
    size_t stack_size, stack_count, stacks_map_length;
    char* stacks_map;
    // threadgroup memory, by index, and the static arena
    void* tg[SM_MAX_THREADGROUP_MEMORY];
    uint64_t tg_length[SM_MAX_THREADGROUP_MEMORY];
    void* tg_static;
    void* scratch;
    int altstack_done;
    pthread_t thread;
    volatile double deadline;   // CLOCK_MONOTONIC seconds; the watchdog stops the run after it
    int watched;                // slot in `watched_threads` + 1
} thread_state;

#define TG_STATIC_CAPACITY SM_THREADGROUP_ARENA_CAPACITY
#define SCRATCH_SIZE (2u << 20)

// The calling thread's state once get_thread_state made it (read by the signal handlers).
CSM_INTERNAL extern __thread thread_state* current_thread;
CSM_INTERNAL thread_state* get_thread_state(void);
// At least `count` fiber stacks for the thread (0: out of memory).
CSM_INTERNAL int ensure_stacks(thread_state* ts, uint32_t count);

// MARK: the watchdog (watchdog.c) -------------------------------------------------------

#define WATCHDOG_SIGNAL (SIGRTMIN + 7)

CSM_INTERNAL double now_seconds(void);
CSM_INTERNAL void watch(thread_state* ts);
CSM_INTERNAL void unwatch(thread_state* ts);
// The watchdog thread, started once per process.
CSM_INTERNAL void start_watchdog_once(void);
// WATCHDOG_SIGNAL's handler: stops the running kernel of a thread past its deadline.
CSM_INTERNAL void on_watchdog(int sig, siginfo_t* info, void* context);

// MARK: signals (signals.c) -------------------------------------------------------------

// Keeps SoftMetal's fault handlers installed (and the watchdog's); called at every csm_run.
CSM_INTERNAL void install_handler(void);
// An alternate signal stack for the thread, so that a stack overflow can be handled.
CSM_INTERNAL void ensure_altstack(thread_state* ts);

#endif
#endif
