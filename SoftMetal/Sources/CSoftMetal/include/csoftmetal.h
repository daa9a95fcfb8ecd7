/*
 * csoftmetal.h - the low-level C part of SoftMetal (Linux only; empty elsewhere).
 *
 * - sm_dispatch: the C ABI between the Swift host and the launchers that the MSL
 *   translator generates for each kernel, declared once in the runtime header's part
 *   Runtime/abi.h, which this header includes; SM_ABI_VERSION guards against a kernel
 *   library built with another version of it.
 * - guarded memory: buffer storage whose end touches PROT_NONE guard space (64 GiB on each
 *   side within a budget of address space, else a page), registered so that the SIGSEGV
 *   handler recognises faults in it;
 * - csm_run: runs a launcher on the calling thread with a per-thread fiber stack pool,
 *   guarded threadgroup memory, an alternate signal stack and a sigsetjmp recovery point;
 * - csm_spawn_wait: runs the compiler (posix_spawn) with stderr sent to a file.
 */
#ifndef CSOFTMETAL_H
#define CSOFTMETAL_H

#include <stdint.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* sm_dispatch, sm_check, sm_kernel_info and their constants (SM_*): the C ABI that the
 * compiled kernels share, declared once, in the runtime header's part Runtime/abi.h, which
 * is included here by its path relative to this file (why there: see its first lines). */
#include "../../SoftMetal/Runtime/abi.h"

typedef int32_t (*sm_launcher)(sm_dispatch*);

/* Field setters for Swift (C arrays import as tuples). */
static inline void csm_set_buffer(sm_dispatch* d, int32_t i, void* p, uint64_t length) {
    d->buffers[i] = p;
    d->buffer_lengths[i] = length;
}
/* Bytes of the per-thread arena for `threadgroup` variables declared in kernels. */
#define SM_THREADGROUP_ARENA_CAPACITY (64 * 1024)
static inline void csm_check_set_buffer_shadow(sm_check* c, int32_t i, sm_shadow* shadow) { c->buffer_shadow[i] = shadow; }
static inline void csm_check_set_buffer_init(sm_check* c, int32_t i, uint8_t* bits, uint64_t bit) {
    c->buffer_init[i] = bits;
    c->buffer_init_bit[i] = bit;
}
static inline void csm_check_set_stale(sm_check* c, int32_t i, uint8_t* initial, uint8_t* newest, uint8_t* pending) {
    c->stale_initial[i] = initial;
    c->stale_newest[i] = newest;
    c->stale_pending[i] = pending;
}
static inline void csm_check_set_threadgroup_shadow(sm_check* c, int32_t i, sm_shadow* shadow) { c->tg_shadow[i] = shadow; }
static inline void csm_set_threadgroup_length(sm_dispatch* d, int32_t i, uint64_t length) {
    d->tg_mem_lengths[i] = length;
}
static inline void csm_set_dims(sm_dispatch* d, uint32_t gx, uint32_t gy, uint32_t gz, uint32_t tx, uint32_t ty,
                                uint32_t tz, uint32_t nx, uint32_t ny, uint32_t nz) {
    d->threadgroups[0] = gx; d->threadgroups[1] = gy; d->threadgroups[2] = gz;
    d->tptg[0] = tx; d->tptg[1] = ty; d->tptg[2] = tz;
    d->grid[0] = nx; d->grid[1] = ny; d->grid[2] = nz;
}

typedef const sm_kernel_info* (*sm_info_fn)(void);

/* Guarded memory: a mapping whose `length` usable bytes end exactly at PROT_NONE guard
 * space (start aligned to the largest power of two <= 16 dividing length), with more guard
 * space before the first usable page: 64 GiB on each side (every address a 32-bit index of
 * 16-byte elements can form from the buffer faults) while SoftMetal's budget of address
 * space allows, else one page. Zero-filled. NULL on failure.
 * Region tags: buffers > 0; threadgroup(i) memory -(i + 1); threadgroup variables -100. */
void* csm_guarded_alloc(size_t length, int32_t tag);
/* A buffer's memory within SoftMetal's budget of memory mappings (guarded_memory.c): guarded
 * (*guarded = 1) while the budget allows, else plain; NULL when the budget or memory is
 * exhausted. Freed with csm_buffer_free(data, length, *guarded). */
void* csm_buffer_alloc(size_t length, int32_t tag, int32_t* guarded);
void csm_buffer_free(void* data, size_t length, int32_t guarded);
void csm_guarded_free(void* data, size_t length);
/* The bytes of PROT_NONE guard on each side of the guarded memory at `data` (at least that
 * much after its end and before its first page): 64 GiB or one page; 0 if `data` is not
 * guarded memory. */
size_t csm_guard_width(const void* data);
/* The system page size. */
size_t csm_page_size(void);

/* The last fault recorded on the calling thread by csm_run (valid after it returned
 * SM_ERROR_OUT_OF_BOUNDS / SM_ERROR_STACK_OVERFLOW). */
uintptr_t csm_fault_address(void);
/* The usable range of the guarded region whose guard pages contain the fault (start 0:
 * the fault was not in a SoftMetal guard page). */
uintptr_t csm_fault_region_start(void);
uintptr_t csm_fault_region_length(void);
int32_t csm_fault_region_tag(void);
/* The path of the shared object holding code address `address` and its load base (dladdr);
 * NULL if none. */
const char* csm_code_object(uintptr_t address, uintptr_t* base);
/* After SM_ERROR_TRAP: the signal and its si_code (e.g. SIGFPE / FPE_INTDIV). */
int32_t csm_fault_signal(void);
int32_t csm_fault_code(void);

/* Runs launcher(d) on the calling thread: fills the per-thread fields of a copy of *d
 * (stacks, scratch, threadgroup memory with the lengths in d->tg_mem_lengths, guarded),
 * installs the SIGSEGV handler once per process, catches faults in guard pages.
 * Returns an SM_ERROR_* (0 = ok); copies the message into d->error. */
int32_t csm_run(sm_launcher launcher, sm_dispatch* d, uint32_t lanes_needed, double deadline);
/* CLOCK_MONOTONIC seconds: csm_run's deadline is csm_now() + csm_timeout_seconds(), taken
 * once per dispatch, so that a dispatch of many chunks stops at its timeout, not at a
 * timeout per chunk (deadline 0: none). */
double csm_now(void);

/* Seconds a csm_run may take before the watchdog stops it (SM_ERROR_TIMEOUT): from
 * $SOFTMETAL_TIMEOUT_S (default 60; 0 = no watchdog). */
double csm_timeout_seconds(void);

/* posix_spawn(argv[0] found on PATH if it has no '/'), stdout and stderr to output_path;
 * returns the exit status, or -1 with errno text in output_path's place when it cannot
 * start. No time limit; not stopped by SIGINT (see csm_spawn_wait_limited). */
int32_t csm_spawn_wait(const char* const* argv, const char* output_path);

enum { CSM_SPAWN_FAILED = -1, CSM_SPAWN_INTERRUPTED = -2, CSM_SPAWN_TIMED_OUT = -3 };

/* csm_spawn_wait in its own process group, which is killed (SIGKILL) and reaped when
 * timeout_seconds pass (> 0; CSM_SPAWN_TIMED_OUT) or when SIGINT arrives inside an
 * interrupt scope (CSM_SPAWN_INTERRUPTED; also returned without spawning when one is
 * pending). Exit status as csm_spawn_wait. */
int32_t csm_spawn_wait_limited(const char* const* argv, const char* output_path, double timeout_seconds);

/* An interrupt scope: while one is open (scopes nest and may be open on several threads),
 * SIGINT marks the scopes' compiles interrupted, then goes on to the handler that was
 * installed before (Python's, which raises KeyboardInterrupt once the call returns; with
 * SIG_DFL the compilers are killed and the process ends as it would have; with SIG_IGN
 * nothing happens). The last scope to close restores that handler and clears the mark. */
void csm_interrupt_scope_begin(void);
void csm_interrupt_scope_end(void);
/* 1 when SIGINT arrived since the open scopes began. */
int32_t csm_interrupt_pending(void);

#ifdef __cplusplus
}
#endif
#endif
