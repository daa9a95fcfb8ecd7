/*
 * csoftmetal.h - the low-level C part of SoftMetal (Linux only; empty elsewhere).
 *
 * - sm_dispatch: the C ABI between the Swift host and the launchers that the MSL
 *   translator generates for each kernel. The runtime header (Runtime/abi.h)
 *   declares the same struct; SM_ABI_VERSION guards the two against drifting apart.
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

#define SM_ABI_VERSION 8
#define SM_MAX_BUFFERS 31
#define SM_MAX_THREADGROUP_MEMORY 31

/* Flags of sm_dispatch.flags */
#define SM_FLAG_POISON 1u      /* fill threadgroup memory with 0xFF before each threadgroup */
#define SM_FLAG_RUN_AHEAD 2u   /* each simdgroup runs to its next threadgroup barrier before the next starts */
#define SM_FLAG_REVERSE_SIMDGROUPS 4u  /* with SM_FLAG_RUN_AHEAD: the last simdgroup first */
#define SM_FLAG_CHECK_DIVISION 8u  /* an integer division by zero or INT_MIN / -1 stops the dispatch (SM_ERROR_TRAP) */

/* Error kinds (sm_dispatch.error_kind, csm_run's result) */
#define SM_OK 0
#define SM_ERROR_OUT_OF_BOUNDS 1  /* fault in a guard page (see csm_fault_*) */
#define SM_ERROR_DIVERGENCE 2     /* barrier / simd divergence or deadlock */
#define SM_ERROR_RUNTIME 3        /* another error found by the runtime (message in error) */
#define SM_ERROR_STACK_OVERFLOW 4 /* fault in the guard page of a fiber stack */
#define SM_ERROR_TIMEOUT 5        /* the watchdog stopped a chunk that ran too long */
#define SM_ERROR_TRAP 6           /* SIGFPE, SIGILL or SIGTRAP in kernel code (see csm_fault_signal) */
#define SM_ERROR_CHECK 7          /* the memory check found something (see sm_check) */

/* One dispatch (or one worker's part of it). Filled by the host; the launcher reads it
 * and writes error_kind / error. Positions: the threadgroups at linear positions
 * [first_group, end_group) run; position p runs threadgroup number (p * order_mul +
 * order_add) % total (order_mul coprime with total), linear numbers in x-major order. */
typedef struct sm_dispatch {
    uint32_t abi_version;
    uint32_t flags;
    const char* kernel_name;
    void* buffers[SM_MAX_BUFFERS];              /* [[buffer(i)]], offset applied; NULL = unbound */
    uint64_t buffer_lengths[SM_MAX_BUFFERS];    /* bytes from the pointer to the end */
    void* tg_mem[SM_MAX_THREADGROUP_MEMORY];    /* [[threadgroup(i)]] for this worker */
    uint64_t tg_mem_lengths[SM_MAX_THREADGROUP_MEMORY];
    void* tg_static;                            /* arena for `threadgroup T x[N];` in kernel bodies */
    uint64_t tg_static_capacity;
    uint32_t threadgroups[3];                   /* threadgroups per grid */
    uint32_t tptg[3];                           /* threads per (full) threadgroup */
    uint32_t grid[3];                           /* threads per grid (edge threadgroups are partial) */
    uint32_t first_group, end_group;
    uint32_t order_mul, order_add;
    uint64_t seed;                              /* lane order: 0 = natural order, else a permutation (run-ahead: within each simdgroup) */
    void* stacks;                               /* stack_count blocks of stack_size bytes, each aligned */
    uint64_t stack_size;                        /*   to stack_size, guard page at the bottom */
    uint32_t stack_count;
    uint32_t error_kind;                        /* out */
    void* scratch;                              /* per worker scratch for the runtime's state */
    uint64_t scratch_size;
    char* error;                                /* out: message, NUL-terminated */
    uint32_t error_capacity;
    uint32_t max_threads;                       /* threads per threadgroup the runtime supports */
    struct sm_check* check;                     /* the memory check, or NULL */
} sm_dispatch;

/* The memory check (a library compiled with SM_CHECK_MEMORY: every load and store of the
 * kernel calls the runtime). Filled by the host, which runs checked dispatches one at a
 * time on one OS thread; the runtime writes the first finding. */
#define SM_CHECK_NONE 0
#define SM_CHECK_BOUNDS 1         /* an access outside every bound buffer, threadgroup allocation and the thread's own memory */
#define SM_CHECK_RACE 2           /* two threads, one writing, touched a byte with nothing ordering them */
#define SM_CHECK_UNINITIALIZED 3  /* a read of threadgroup memory no thread of the threadgroup wrote, or of buffer bytes never written */
#define SM_REGION_NONE (-1000)
#define SM_REGION_ARENA (-100)    /* threadgroup variables declared in the kernel */
/* The last writer and last reader of one byte (device memory: within the dispatch;
 * threadgroup memory: within the threadgroup). group: linear threadgroup number + 1
 * (0: none); thread: index in the threadgroup (| SM_SHADOW_ATOMIC: by an atomic); epoch:
 * threadgroup barriers the threadgroup had passed; sg_epoch: simd operations the
 * thread's simdgroup had completed; pc: code offset in the library. */
#define SM_SHADOW_ATOMIC 0x8000u  /* w_thread: the write was an atomic's (the thread is the low bits) */
#define SM_SHADOW_THREAD 0x3FFFu
#define SM_SHADOW_MANY 0x8000u    /* r_thread: another thread read too (same group, epoch) */
#define SM_SHADOW_MIXED 0x4000u   /* r_thread: ... from another simdgroup or simd epoch */
typedef struct sm_shadow {
    uint32_t w_group; uint16_t w_thread, w_sg_epoch; uint32_t w_epoch, w_pc;
    uint32_t r_group; uint16_t r_thread, r_sg_epoch; uint32_t r_epoch, r_pc;
} sm_shadow;
/* Apple's memory model across threadgroups (device memory; the runtime's memory_check.h
 * says how they are used). A release: a device-scope release fence of `thread`, in the
 * threadgroup's barrier epoch `epoch`, then an atomic write of `location` at `clock` (the
 * dispatch's count of releases). An acquire: an atomic read of `location` (when its release
 * sequence began at `start`, and `clock` releases had happened), then a device-scope
 * acquire fence of `thread` in `epoch`. */
#define SM_RELEASES_PER_GROUP 4
#define SM_ACQUIRES_PER_GROUP 8
#define SM_SYNC_LOCATIONS 4096
#define SM_SYNC_THREADS 1024
typedef struct sm_release { uintptr_t location; uint32_t clock, epoch, thread, pad; } sm_release;
typedef struct sm_acquire { uintptr_t location; uint32_t start, clock, epoch, thread; } sm_acquire;
typedef struct sm_sync_location { uintptr_t location; uint32_t start, pad; } sm_sync_location;
/* Per thread of the running threadgroup: 1 + the epoch of its last device-scope release
 * fence (0: none), and its last atomic read (read_location 0: none). */
typedef struct sm_thread_sync { uint32_t fence_epoch, read_start, read_clock, pad; uintptr_t read_location; } sm_thread_sync;
typedef struct sm_check {
    sm_shadow* buffer_shadow[SM_MAX_BUFFERS];  /* one cell per byte of buffers[i] (NULL: no race tracking) */
    sm_shadow* tg_shadow[SM_MAX_THREADGROUP_MEMORY];
    sm_shadow* arena_shadow;                   /* tg_static_capacity cells */
    uint32_t races;                            /* report races (else the shadow only tracks initialisation) */
    uint32_t uninitialized;                    /* report reads of unwritten threadgroup memory */
    uintptr_t image_start, image_end;          /* out: the library's own image (constants) */
    /* out: the first finding */
    uint32_t kind;
    uint32_t size;                             /* bytes of the access */
    uint32_t is_write, other_is_write;
    int32_t region;                            /* buffer index, -(i + 1) for threadgroup(i), SM_REGION_* */
    uint64_t offset;                           /* in the region (buffer: from the bound pointer; arena: in the variable) */
    uint64_t region_length;                    /* bytes of the region (bound bytes, the variable's size) */
    uint32_t outside;                          /* in no region: `region` is the nearest buffer */
    uintptr_t address;
    uint32_t pc, other_pc;
    uint32_t group, other_group;               /* linear threadgroup number + 1 */
    uint32_t thread, other_thread;
    uint32_t epoch, other_epoch;
    /* One bit per byte of the buffer bound at i (bit 0: the bound pointer), persistent across
     * dispatches: set once host or kernel wrote it. NULL: every byte counts as written. */
    uint8_t* buffer_init[SM_MAX_BUFFERS];
    uint64_t buffer_init_bit[SM_MAX_BUFFERS];   /* the bound pointer's bit in buffer_init[i] */
    /* The memory model across threadgroups (NULL tables: not tracked, every cross-threadgroup
     * pair unordered). */
    sm_release* releases;                      /* SM_RELEASES_PER_GROUP per threadgroup, by linear number */
    uint32_t group_count;
    uint32_t release_clock;
    sm_thread_sync* threads;                   /* SM_SYNC_THREADS */
    sm_sync_location* locations;               /* SM_SYNC_LOCATIONS, open addressing */
    uint32_t acquire_count;                    /* of the running threadgroup */
    uint32_t atomic_read;                      /* out: the finding's read is an atomic load */
    sm_acquire acquires[SM_ACQUIRES_PER_GROUP];
    /* Stale reads: a cross-threadgroup read that nothing orders after the write gets the byte
     * the dispatch began with (initial) instead of a report; the byte it displaced (newest)
     * goes back after the dispatch or at the next ordered read (pending: one byte per byte,
     * 1 while memory holds the stale value). By buffer index, offsets applied. */
    uint32_t stale_reads;
    uint8_t* stale_initial[SM_MAX_BUFFERS];
    uint8_t* stale_newest[SM_MAX_BUFFERS];
    uint8_t* stale_pending[SM_MAX_BUFFERS];
    /* coherent(device) buffers (MSL 3.2), by index: a write to one is ordered before another
     * threadgroup's access once the writing thread (or, after a barrier, any thread of its
     * threadgroup) made a device-scope release fence. */
    uint8_t coherent[SM_MAX_BUFFERS];
    uint32_t coherent_access;                  /* the access being tracked is to such a buffer */
    uint32_t* coherent_fences;                 /* SM_SYNC_THREADS + 1 per threadgroup, by linear number:
                                                  1 + the epoch of each thread's last device-scope release
                                                  fence, then the largest (NULL: none bound) */
} sm_check;

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

/* Parameter reflection generated per kernel: __sm_info_<kernel>() returns this. */
#define SM_PARAM_BUFFER 1
#define SM_PARAM_THREADGROUP 2
#define SM_PARAM_BUILTIN 3
typedef struct sm_param_info {
    int32_t kind;
    int32_t index;        /* buffer / threadgroup index; -1 for built-ins */
    int64_t elem_size;    /* sizeof the pointee / referenced type */
    int32_t is_reference; /* `constant T& x [[buffer(i)]]` */
    const char* type;     /* as written, address space removed */
    const char* name;
    const char* attribute;
} sm_param_info;
typedef struct sm_kernel_info {
    int32_t abi_version;
    int32_t param_count;
    const sm_param_info* params;
    int32_t max_total_threads;  /* [[max_total_threads_per_threadgroup(n)]] or 0 */
} sm_kernel_info;
typedef const sm_kernel_info* (*sm_info_fn)(void);

/* Guarded memory: a mapping whose `length` usable bytes end exactly at PROT_NONE guard
 * space (start aligned to the largest power of two <= 16 dividing length), with more guard
 * space before the first usable page: 64 GiB on each side (every address a 32-bit index of
 * 16-byte elements can form from the buffer faults) while SoftMetal's budget of address
 * space allows, else one page. Zero-filled. NULL on failure.
 * Region tags: buffers > 0; threadgroup(i) memory -(i + 1); threadgroup variables -100. */
void* csm_guarded_alloc(size_t length, int32_t tag);
/* A buffer's memory within SoftMetal's budget of memory mappings (csoftmetal.c): guarded
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
