// ---- The C ABI between the host and the compiled kernels: sm_dispatch and what it refers to ----
// The one copy of these declarations, read by both sides:
// - the kernels: this file is a part of the runtime header (KernelCompiler.runtimeParts),
//   embedded in the SoftMetal module and joined with the other parts into one text, which
//   is written as one file (softmetal_runtime-<hash>.h) beside the compiled libraries and
//   included by every translated source. The parts are not files there, so a part cannot
//   #include another: the shared declarations must be in a part, and this is that part.
// - the host: CSoftMetal's public header (Sources/CSoftMetal/include/csoftmetal.h) includes
//   this file by its path relative to that header, "../../SoftMetal/Runtime/abi.h", which
//   holds wherever CSoftMetal is built (SoftMetal/Package.swift, and the root Package.swift
//   declares the same folders by path), for its C files and for Swift's import of it.
// So it is valid C (the host) and C++17 (the kernels), includes nothing (<stdint.h> and
// <stddef.h> come before it on both sides: prelude.h, csoftmetal.h), and keeps what only
// the kernels need under __SOFTMETAL__, which prelude.h defines and the host never does.
// The runtime still compares the host's SM_ABI_VERSION with its own (scheduler.h).
#ifndef SOFTMETAL_RUNTIME_ABI_H
#define SOFTMETAL_RUNTIME_ABI_H
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

#ifdef __SOFTMETAL__
/* The C library functions the runtime calls, declared here for the kernels' build only
 * (the host includes the C library's own headers). */
int snprintf(char*, unsigned long, const char*, ...);
void* memset(void*, int, unsigned long);
void* memcpy(void*, const void*, unsigned long);
#endif

#ifdef __cplusplus
}
#endif
#endif
