// The low-level C part of SoftMetal: guarded memory and its registry, the SIGSEGV
// (and SIGBUS / SIGFPE / SIGILL / SIGTRAP) handler that turns faults in guard pages into errors, per-thread fiber stacks and
// threadgroup memory, and running the compiler. Linux only (empty elsewhere).
#if defined(__linux__)
#define _GNU_SOURCE
#include "csoftmetal.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char** environ;

// MARK: guard registry ------------------------------------------------------------------
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

static region registry[REGISTRY_SIZE];
static int registry_top;  // entries below this index may be live
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;

static void registry_add(uintptr_t lo, uintptr_t hi, uintptr_t data, uintptr_t length, int32_t tag,
                         int32_t kind, size_t stack_size, size_t wide) {
    pthread_mutex_lock(&registry_lock);
    for (int i = 0; i < REGISTRY_SIZE; i++) {
        if (__atomic_load_n(&registry[i].hi, __ATOMIC_ACQUIRE) == 0) {
            registry[i].lo = lo;
            registry[i].wide = wide;
            registry[i].data = data;
            registry[i].length = length;
            registry[i].tag = tag;
            registry[i].kind = kind;
            registry[i].stack_size = stack_size;
            __atomic_store_n(&registry[i].hi, hi, __ATOMIC_RELEASE);
            if (i >= registry_top) __atomic_store_n(&registry_top, i + 1, __ATOMIC_RELEASE);
            break;
        }
    }
    pthread_mutex_unlock(&registry_lock);
}

static int registry_remove(uintptr_t data, region* out) {
    int found = 0;
    pthread_mutex_lock(&registry_lock);
    for (int i = 0; i < registry_top; i++) {
        if (registry[i].hi != 0 && registry[i].data == data) {
            if (out) *out = registry[i];
            __atomic_store_n(&registry[i].hi, 0, __ATOMIC_RELEASE);
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&registry_lock);
    return found;
}

static int registry_find(uintptr_t address) {
    int top = __atomic_load_n(&registry_top, __ATOMIC_ACQUIRE);
    for (int i = 0; i < top; i++) {
        uintptr_t hi = __atomic_load_n(&registry[i].hi, __ATOMIC_ACQUIRE);
        if (hi != 0 && address >= registry[i].lo && address < hi) {
            if (registry[i].kind == KIND_STACKS) {
                // Only the guard page at the bottom of each stack block.
                size_t offset = (address - registry[i].data) % registry[i].stack_size;
                if (address < registry[i].data || offset >= (size_t)sysconf(_SC_PAGESIZE)) continue;
            }
            return i;
        }
    }
    return -1;
}

size_t csm_page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

static size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

// MARK: wide guards
// A page of guard catches an index just past the end, but not one far out: a kernel that
// writes 4 MB past a 4 KB buffer would land in whatever the process has mapped there (the
// interpreter's heap) and corrupt it silently, the process dying later or never. A kernel
// forms its addresses from 32-bit indices (uint or int), so how far it can reach is
// bounded: 2^32 elements of a 16-byte type (float4, int4) is 64 GiB either way (a uint
// index goes forward, `p - i` or a negative int index backward). Each guarded region is
// therefore placed in a reservation with WIDE_GUARD bytes of PROT_NONE on each side, so
// that every such access faults and is reported with its kernel and buffer. Reserving
// address space with PROT_NONE and MAP_NORESERVE costs no memory and no page tables, and
// it is still three mappings (guard, data, guard), but the address space is finite
// (x86_64: 128 TiB for the process): the reservations stay within a budget
// (SOFTMETAL_GUARD_SPACE_GB, default 32 TiB = about 250 live buffers), beyond which,
// under a finite RLIMIT_AS, or where mmap refuses the reservation, a region gets page guards.
#define WIDE_GUARD ((size_t)1 << 36)

static size_t wide_in_use;  // bytes of address space the live wide reservations take

static size_t wide_budget(void) {
    static size_t budget = (size_t)-1;
    size_t b = __atomic_load_n(&budget, __ATOMIC_RELAXED);
    if (b == (size_t)-1) {
        b = sizeof(void*) < 8 ? 0 : (size_t)32 << 40;
        const char* env = getenv("SOFTMETAL_GUARD_SPACE_GB");
        if (env && *env) b = (size_t)strtoull(env, NULL, 10) << 30;
        // Under a limit on address space (ulimit -v), reservations would count against it
        // and starve the process's own allocations: page guards only.
        struct rlimit limit;
        if (getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) b = 0;
        __atomic_store_n(&budget, b, __ATOMIC_RELAXED);
    }
    return b;
}

static void* guarded_map(size_t length, int32_t tag, int32_t kind) {
    size_t page = csm_page_size();
    size_t data_pages = round_up(length, page) / page;
    size_t guard = page, wide = 0;
    size_t wide_total = 2 * WIDE_GUARD + data_pages * page;
    char* base = MAP_FAILED;
    // Charged before the mmap (so that concurrent allocations cannot overshoot the
    // budget together) and given back when the reservation is not made.
    if (wide_total <= wide_budget()) {
        if (__atomic_add_fetch(&wide_in_use, wide_total, __ATOMIC_RELAXED) <= wide_budget())
            base = mmap(NULL, wide_total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (base != MAP_FAILED) {
            guard = WIDE_GUARD;
            wide = wide_total;
        } else {
            __atomic_sub_fetch(&wide_in_use, wide_total, __ATOMIC_RELAXED);
        }
    }
    if (base == MAP_FAILED) {
        base = mmap(NULL, (data_pages + 2) * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (base == MAP_FAILED) return NULL;
    }
    size_t total = 2 * guard + data_pages * page;
    // The data pages are mapped again without MAP_NORESERVE, so they are charged to the
    // process like malloc'd memory: an impossible size fails here (makeBuffer returns nil,
    // as Metal does) instead of growing until the OOM killer ends the process.
    if (data_pages > 0 && mmap(base + guard, data_pages * page, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) {
        munmap(base, total);
        if (wide) __atomic_sub_fetch(&wide_in_use, wide, __ATOMIC_RELAXED);
        return NULL;
    }
    // The usable bytes end at the trailing guard. Since the alignment divides the
    // length, the start keeps that alignment.
    char* end = base + guard + data_pages * page;
    char* data = end - length;
    registry_add((uintptr_t)base, (uintptr_t)(base + total), (uintptr_t)data, length, tag, kind, 0, wide);
    return data;
}

void* csm_guarded_alloc(size_t length, int32_t tag) { return guarded_map(length, tag, KIND_BUFFER); }

void csm_guarded_free(void* data, size_t length) {
    (void)length;
    if (data == NULL) return;
    region r;
    if (registry_remove((uintptr_t)data, &r)) {
        munmap((void*)r.lo, r.hi - r.lo);
        if (r.wide) __atomic_sub_fetch(&wide_in_use, r.wide, __ATOMIC_RELAXED);
    }
}

size_t csm_guard_width(const void* data) {
    size_t width = 0;
    pthread_mutex_lock(&registry_lock);
    for (int i = 0; i < registry_top; i++) {
        if (registry[i].hi != 0 && registry[i].data == (uintptr_t)data && registry[i].kind != KIND_STACKS) {
            width = registry[i].wide ? WIDE_GUARD : csm_page_size();
            break;
        }
    }
    pthread_mutex_unlock(&registry_lock);
    return width;
}

// MARK: buffers within a budget of memory mappings ---------------------------------------
// A guarded buffer costs the process three memory mappings (guard, data, guard). Linux
// allows vm.max_map_count (65530 by default) per process, and when they run out every
// later mmap fails - thread stacks included, so the process hangs rather than erring.
// SoftMetal's buffers use at most a budget of half of that: guarded up to half of the
// budget, then plain (one mapping, no guard pages) up to the budget, then makeBuffer fails
// (nil, as Metal's does: the caller's MemoryError). SOFTMETAL_MAX_MAPPINGS sets the budget.

static long mappings_in_use;

static long mapping_budget(void) {
    static long budget = -1;
    long b = __atomic_load_n(&budget, __ATOMIC_RELAXED);
    if (b < 0) {
        const char* env = getenv("SOFTMETAL_MAX_MAPPINGS");
        if (env && atol(env) > 0) {
            b = atol(env);
        } else {
            long max = 65530;
            FILE* f = fopen("/proc/sys/vm/max_map_count", "r");
            if (f) {
                if (fscanf(f, "%ld", &max) != 1) max = 65530;
                fclose(f);
            }
            b = max / 2;
        }
        __atomic_store_n(&budget, b, __ATOMIC_RELAXED);
    }
    return b;
}

void* csm_buffer_alloc(size_t length, int32_t tag, int32_t* guarded) {
    const long budget = mapping_budget();
    if (__atomic_add_fetch(&mappings_in_use, 3, __ATOMIC_RELAXED) <= budget / 2) {
        void* p = guarded_map(length, tag, KIND_BUFFER);
        if (p) {
            *guarded = 1;
            return p;
        }
        __atomic_sub_fetch(&mappings_in_use, 3, __ATOMIC_RELAXED);
        return NULL;
    }
    if (__atomic_sub_fetch(&mappings_in_use, 2, __ATOMIC_RELAXED) > budget) {
        __atomic_sub_fetch(&mappings_in_use, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    void* p = mmap(NULL, round_up(length ? length : 1, csm_page_size()), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        __atomic_sub_fetch(&mappings_in_use, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    *guarded = 0;
    return p;
}

void csm_buffer_free(void* data, size_t length, int32_t guarded) {
    if (data == NULL) return;
    if (guarded) {
        csm_guarded_free(data, length);
        __atomic_sub_fetch(&mappings_in_use, 3, __ATOMIC_RELAXED);
    } else {
        munmap(data, round_up(length ? length : 1, csm_page_size()));
        __atomic_sub_fetch(&mappings_in_use, 1, __ATOMIC_RELAXED);
    }
}

// MARK: per-thread state ----------------------------------------------------------------

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

// MARK: the watchdog
// GPU threads are fibers that run until they block, so a kernel that spins waiting for
// another thread (or loops forever) would hang the process. A watchdog thread sends
// WATCHDOG_SIGNAL to a worker whose csm_run passed its deadline; the handler siglongjmps
// back to csm_run, which reports SM_ERROR_TIMEOUT.
#define WATCHDOG_SIGNAL (SIGRTMIN + 7)
#define MAX_WATCHED 1024
static thread_state* volatile watched_threads[MAX_WATCHED];
static pthread_mutex_t watch_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t watchdog_once = PTHREAD_ONCE_INIT;

static double now_seconds(void) {
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

static void watch(thread_state* ts) {
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

static void unwatch(thread_state* ts) {
    if (!ts->watched) return;
    pthread_mutex_lock(&watch_lock);
    watched_threads[ts->watched - 1] = NULL;
    ts->watched = 0;
    pthread_mutex_unlock(&watch_lock);
}

static __thread thread_state* current_thread;
static pthread_key_t thread_key;
static pthread_once_t thread_key_once = PTHREAD_ONCE_INIT;

#define TG_STATIC_CAPACITY SM_THREADGROUP_ARENA_CAPACITY
#define SCRATCH_SIZE (2u << 20)

static void thread_state_free(void* p) {
    thread_state* ts = p;
    if (ts == NULL) return;
    unwatch(ts);
    for (int i = 0; i < SM_MAX_THREADGROUP_MEMORY; i++) csm_guarded_free(ts->tg[i], ts->tg_length[i]);
    csm_guarded_free(ts->tg_static, TG_STATIC_CAPACITY);
    if (ts->stacks_map) {
        registry_remove((uintptr_t)ts->stacks, NULL);
        munmap(ts->stacks_map, ts->stacks_map_length);
    }
    free(ts->scratch);
    free(ts);
}

static void make_thread_key(void) { pthread_key_create(&thread_key, thread_state_free); }

static thread_state* get_thread_state(void) {
    if (current_thread) return current_thread;
    pthread_once(&thread_key_once, make_thread_key);
    thread_state* ts = calloc(1, sizeof *ts);
    if (!ts) return NULL;
    ts->scratch = aligned_alloc(64, SCRATCH_SIZE);
    ts->tg_static = guarded_map(TG_STATIC_CAPACITY, -100, KIND_THREADGROUP);
    if (!ts->scratch || !ts->tg_static) { thread_state_free(ts); return NULL; }
    pthread_setspecific(thread_key, ts);
    ts->thread = pthread_self();
    current_thread = ts;
    watch(ts);
    return ts;
}

static size_t configured_stack_size(void) {
    static size_t size;
    if (size == 0) {
        size_t kb = 64;
        const char* env = getenv("SOFTMETAL_STACK_KB");
        if (env && atoi(env) >= 16) kb = (size_t)atoi(env);
        size_t s = 16 * 1024;
        while (s < kb * 1024) s *= 2;  // a power of two: lanes find their state from sp
        size = s;
    }
    return size;
}

static int ensure_stacks(thread_state* ts, uint32_t count) {
    if (ts->stacks && ts->stack_count >= count) return 1;
    if (ts->stacks_map) {
        registry_remove((uintptr_t)ts->stacks, NULL);
        munmap(ts->stacks_map, ts->stacks_map_length);
        ts->stacks_map = NULL;
        ts->stacks = NULL;
    }
    size_t size = configured_stack_size();
    size_t n = count < 32 ? 32 : count;
    size_t length = (n + 1) * size;
    char* map = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (map == MAP_FAILED) return 0;
    char* first = (char*)round_up((uintptr_t)map, size);
    size_t page = csm_page_size();
    for (size_t i = 0; i < n; i++) mprotect(first + i * size, page, PROT_NONE);
    ts->stacks_map = map;
    ts->stacks_map_length = length;
    ts->stacks = first;
    ts->stack_size = size;
    ts->stack_count = n;
    registry_add((uintptr_t)first, (uintptr_t)(first + n * size), (uintptr_t)first, n * size, -1, KIND_STACKS, size, 0);
    return 1;
}

// MARK: the SIGSEGV handler -------------------------------------------------------------

// The handlers that were installed before SoftMetal's, per signal, to chain to.
static struct sigaction previous_segv, previous_bus, previous_fpe, previous_ill, previous_trap;

static struct sigaction* previous_for(int sig) {
    switch (sig) {
    case SIGBUS: return &previous_bus;
    case SIGFPE: return &previous_fpe;
    case SIGILL: return &previous_ill;
    case SIGTRAP: return &previous_trap;
    default: return &previous_segv;
    }
}

static void chain(int sig, siginfo_t* info, void* context) {
    struct sigaction* prev = previous_for(sig);
    if ((prev->sa_flags & SA_SIGINFO) && prev->sa_sigaction) {
        prev->sa_sigaction(sig, info, context);
    } else if (prev->sa_handler != SIG_DFL && prev->sa_handler != SIG_IGN && prev->sa_handler != NULL) {
        prev->sa_handler(sig);
    } else {
        // Not ours: the default action, as if SoftMetal were not there (the faulting
        // instruction runs again and the process ends with this signal).
        signal(sig, SIG_DFL);
    }
}

// MARK: integer division as a GPU does it
// x86's div and idiv trap (#DE, SIGFPE) on a zero divisor and on INT_MIN / -1; a GPU does
// not, and real kernels compute such quotients and never use them (ggml's soft_max takes
// `i % ne12` with ne12 = 0 when it has no mask). Apple does not document what its GPUs
// give; SoftMetal gives what Apple's CPUs (AArch64 UDIV/SDIV) give, so that the same
// kernel computes the same on an x86 and an arm64 host: x / 0 = 0, x % 0 = x,
// INT_MIN / -1 = INT_MIN, INT_MIN % -1 = 0. The handler decodes the faulting instruction
// (F6/F7 with ModRM reg 6 or 7), writes those results to rax/rdx (al/ah for 8 bits) and
// resumes after it.
#if defined(__x86_64__)
#include <ucontext.h>

static const int gpr_of[16] = {REG_RAX, REG_RCX, REG_RDX, REG_RBX, REG_RSP, REG_RBP, REG_RSI, REG_RDI,
                               REG_R8, REG_R9, REG_R10, REG_R11, REG_R12, REG_R13, REG_R14, REG_R15};

static int emulate_division(ucontext_t* uc) {
    greg_t* r = uc->uc_mcontext.gregs;
    const uint8_t* p = (const uint8_t*)r[REG_RIP];
    int opsize16 = 0, rex = 0, n = 0;
    for (;; n++) {  // legacy prefixes
        uint8_t b = p[n];
        if (b == 0x66) opsize16 = 1;
        else if (!(b == 0x67 || b == 0xF0 || b == 0xF2 || b == 0xF3 || b == 0x2E || b == 0x36 ||
                   b == 0x3E || b == 0x26 || b == 0x64 || b == 0x65)) break;
        if (n > 4) return 0;
    }
    if ((p[n] & 0xF0) == 0x40) rex = p[n++];
    uint8_t op = p[n++];
    if (op != 0xF6 && op != 0xF7) return 0;
    uint8_t modrm = p[n++];
    int mod = modrm >> 6, reg = (modrm >> 3) & 7, rm = modrm & 7;
    if (reg != 6 && reg != 7) return 0;
    int is_signed = reg == 7;
    int bits = op == 0xF6 ? 8 : (rex & 8) ? 64 : opsize16 ? 16 : 32;
    uint64_t divisor;
    uint64_t mask = bits == 64 ? ~0ull : (1ull << bits) - 1;
    if (mod == 3) {
        int index = rm | ((rex & 1) << 3);
        if (bits == 8 && !rex && rm >= 4) divisor = ((uint64_t)r[gpr_of[rm - 4]] >> 8) & 0xFF;  // ah ch dh bh
        else divisor = (uint64_t)r[gpr_of[index]] & mask;
    } else {
        uint64_t address = 0;
        int has_sib = rm == 4;
        uint8_t sib = has_sib ? p[n++] : 0;
        int base = has_sib ? (sib & 7) : rm;
        int rip_relative = !has_sib && mod == 0 && rm == 5;
        int32_t disp = 0;
        int disp_size = mod == 1 ? 1 : mod == 2 ? 4 : (rip_relative || (has_sib && mod == 0 && base == 5)) ? 4 : 0;
        if (disp_size == 1) disp = (int8_t)p[n];
        else if (disp_size == 4) memcpy(&disp, p + n, 4);
        n += disp_size;
        if (rip_relative) {
            address = (uint64_t)r[REG_RIP] + (uint64_t)n + (uint64_t)(int64_t)disp;
        } else {
            if (!(has_sib && mod == 0 && base == 5)) address = (uint64_t)r[gpr_of[base | ((rex & 1) << 3)]];
            if (has_sib) {
                int index = ((sib >> 3) & 7) | ((rex & 2) << 2);
                if (index != 4) address += (uint64_t)r[gpr_of[index]] << (sib >> 6);
            }
            address += (uint64_t)(int64_t)disp;
        }
        divisor = 0;
        memcpy(&divisor, (const void*)(uintptr_t)address, (size_t)(bits / 8));
    }
    // The dividend as the C code has it: the low half of dx:ax (sign- or zero-extended there).
    uint64_t dividend = bits == 8 ? (uint64_t)r[REG_RAX] & 0xFF : (uint64_t)r[REG_RAX] & mask;
    uint64_t quotient, remainder;
    if (divisor == 0) {
        quotient = 0;
        remainder = dividend;
    } else if (is_signed && divisor == mask) {  // INT_MIN / -1 (the only other #DE a compiler's code meets)
        quotient = dividend;
        remainder = 0;
    } else {
        return 0;  // a quotient too wide for its register: not code a compiler makes
    }
    if (bits == 8) {
        r[REG_RAX] = (greg_t)(((uint64_t)r[REG_RAX] & ~0xFFFFull) | (remainder << 8) | quotient);
    } else if (bits == 16) {
        r[REG_RAX] = (greg_t)(((uint64_t)r[REG_RAX] & ~0xFFFFull) | quotient);
        r[REG_RDX] = (greg_t)(((uint64_t)r[REG_RDX] & ~0xFFFFull) | remainder);
    } else {  // a 32-bit result zero-extends into the 64-bit register, as the instruction would
        r[REG_RAX] = (greg_t)quotient;
        r[REG_RDX] = (greg_t)remainder;
    }
    r[REG_RIP] += n;
    return 1;
}
#else
static int emulate_division(void* uc) { (void)uc; return 0; }
#endif

static void on_fault(int sig, siginfo_t* info, void* context) {
    thread_state* ts = current_thread;
    if (ts && ts->running && sig == SIGFPE && !ts->check_division && emulate_division(context)) return;
    if (ts && ts->running && (sig == SIGFPE || sig == SIGILL || sig == SIGTRAP)) {
        // Integer division by zero or INT_MIN / -1, __builtin_trap(), a breakpoint: on a
        // GPU these give garbage or stop the kernel; here the kernel is stopped and the
        // dispatch reports it, instead of the signal ending the process.
        ts->fault_address = (uintptr_t)info->si_addr;
        ts->fault_signal = sig;
        ts->fault_code = info->si_code;
        ts->running = 0;
        siglongjmp(ts->jmp, SM_ERROR_TRAP);
    }
    if (ts && ts->running) {
        uintptr_t address = (uintptr_t)info->si_addr;
        int i = registry_find(address);
        if (i >= 0) {
            ts->fault_address = address;
            ts->fault_start = registry[i].data;
            ts->fault_length = registry[i].length;
            ts->fault_tag = registry[i].tag;
            ts->fault_kind = registry[i].kind;
            ts->running = 0;
            siglongjmp(ts->jmp, registry[i].kind == KIND_STACKS ? SM_ERROR_STACK_OVERFLOW : SM_ERROR_OUT_OF_BOUNDS);
        }
        // A fault elsewhere while this thread runs kernel code: a wild address (an index
        // far out of range, e.g. read from poisoned memory) or a misaligned vector access.
        // The kernel holds no locks, so it is stopped and reported like a guard-page fault.
        ts->fault_address = address;
        ts->fault_start = 0;
        ts->fault_length = 0;
        ts->fault_tag = 0;
        ts->fault_kind = 0;
        ts->running = 0;
        siglongjmp(ts->jmp, SM_ERROR_OUT_OF_BOUNDS);
    }
    chain(sig, info, context);
}

static void on_watchdog(int sig, siginfo_t* info, void* context) {
    (void)sig; (void)info; (void)context;
    thread_state* ts = current_thread;
    if (ts && ts->running && now_seconds() > ts->deadline) {
        ts->running = 0;
        siglongjmp(ts->jmp, SM_ERROR_TIMEOUT);
    }
}

static pthread_mutex_t handler_lock = PTHREAD_MUTEX_INITIALIZER;

// (Re)installs the handler for one signal if another one replaced it since (e.g. Python's
// faulthandler enabled later), keeping the replacement as the one to chain to. Never
// records itself as the previous handler.
static void install_one(int sig, struct sigaction* previous) {
    struct sigaction current;
    if (sigaction(sig, NULL, &current) != 0) return;
    if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_fault) return;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_fault;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    struct sigaction old;
    if (sigaction(sig, &action, &old) == 0) *previous = old;
}

// Called at every csm_run: one sigaction query per signal (a system call) keeps the handler in
// place while kernels run even if someone else installed a handler after SoftMetal.
static void install_handler(void) {
    pthread_mutex_lock(&handler_lock);
    install_one(SIGSEGV, &previous_segv);
    install_one(SIGBUS, &previous_bus);
    install_one(SIGFPE, &previous_fpe);
    install_one(SIGILL, &previous_ill);
    install_one(SIGTRAP, &previous_trap);
    static int watchdog_installed;
    if (!watchdog_installed && csm_timeout_seconds() > 0) {
        struct sigaction action;
        memset(&action, 0, sizeof action);
        action.sa_sigaction = on_watchdog;
        action.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&action.sa_mask);
        sigaction(WATCHDOG_SIGNAL, &action, NULL);
        watchdog_installed = 1;
    }
    pthread_mutex_unlock(&handler_lock);
    if (csm_timeout_seconds() > 0) pthread_once(&watchdog_once, start_watchdog);
}

static void ensure_altstack(thread_state* ts) {
    if (ts->altstack_done) return;
    ts->altstack_done = 1;
    stack_t old;
    if (sigaltstack(NULL, &old) == 0 && !(old.ss_flags & SS_DISABLE) && old.ss_size >= 16384) return;
    size_t size = 64 * 1024;
    void* mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return;
    stack_t ss = {.ss_sp = mem, .ss_size = size, .ss_flags = 0};
    sigaltstack(&ss, NULL);  // kept for the thread's life
}

uintptr_t csm_fault_address(void) { return current_thread ? current_thread->fault_address : 0; }
uintptr_t csm_fault_region_start(void) { return current_thread ? current_thread->fault_start : 0; }
uintptr_t csm_fault_region_length(void) { return current_thread ? current_thread->fault_length : 0; }
int32_t csm_fault_region_tag(void) { return current_thread ? current_thread->fault_tag : 0; }
const char* csm_code_object(uintptr_t address, uintptr_t* base) {
    Dl_info info;
    if (!dladdr((void*)address, &info) || !info.dli_fname) return NULL;
    *base = (uintptr_t)info.dli_fbase;
    return info.dli_fname;
}
int32_t csm_fault_signal(void) { return current_thread ? current_thread->fault_signal : 0; }
int32_t csm_fault_code(void) { return current_thread ? current_thread->fault_code : 0; }

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

// MARK: the compiler --------------------------------------------------------------------

// Children of csm_spawn_wait_limited, so that a SIGINT that ends the process (SIG_DFL) can
// take their process groups with it: they are not in ours, so the terminal's Ctrl-C no
// longer reaches them.
#define MAX_CHILDREN 64
static pid_t active_children[MAX_CHILDREN];

static pthread_mutex_t interrupt_lock = PTHREAD_MUTEX_INITIALIZER;
static int interrupt_scopes;            // open scopes (under interrupt_lock)
static int interrupt_pending;           // atomic: SIGINT seen while a scope was open
static struct sigaction previous_sigint;  // what SIGINT did before the first scope opened

static void sigint_observer(int sig, siginfo_t* info, void* context) {
    int saved = errno;
    if (!(previous_sigint.sa_flags & SA_SIGINFO) && previous_sigint.sa_handler == SIG_IGN) {
        errno = saved;
        return;  // the process asked for Ctrl-C to do nothing: compiles go on
    }
    __atomic_store_n(&interrupt_pending, 1, __ATOMIC_SEQ_CST);
    if (previous_sigint.sa_flags & SA_SIGINFO) {
        if (previous_sigint.sa_sigaction) previous_sigint.sa_sigaction(sig, info, context);
    } else if (previous_sigint.sa_handler == SIG_DFL) {
        for (int i = 0; i < MAX_CHILDREN; i++) {
            pid_t pid = __atomic_load_n(&active_children[i], __ATOMIC_ACQUIRE);
            if (pid > 0) kill(-pid, SIGKILL);
        }
        sigaction(SIGINT, &previous_sigint, NULL);
        raise(SIGINT);  // delivered when this handler returns: the process ends as without us
    } else {
        previous_sigint.sa_handler(sig);
    }
    errno = saved;
}

void csm_interrupt_scope_begin(void) {
    pthread_mutex_lock(&interrupt_lock);
    if (interrupt_scopes++ == 0) {
        struct sigaction observer;
        memset(&observer, 0, sizeof observer);
        observer.sa_sigaction = sigint_observer;
        observer.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&observer.sa_mask);
        __atomic_store_n(&interrupt_pending, 0, __ATOMIC_SEQ_CST);
        struct sigaction current;
        sigaction(SIGINT, NULL, &current);
        // Never our own handler as the one to forward to (it would call itself).
        if (!((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == sigint_observer)) {
            previous_sigint = current;
            sigaction(SIGINT, &observer, NULL);
        }
    }
    pthread_mutex_unlock(&interrupt_lock);
}

void csm_interrupt_scope_end(void) {
    pthread_mutex_lock(&interrupt_lock);
    if (interrupt_scopes > 0 && --interrupt_scopes == 0) {
        struct sigaction current;
        sigaction(SIGINT, NULL, &current);
        // Someone who replaced the observer meanwhile (Python's signal.signal) keeps theirs.
        if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == sigint_observer)
            sigaction(SIGINT, &previous_sigint, NULL);
        __atomic_store_n(&interrupt_pending, 0, __ATOMIC_SEQ_CST);
    }
    pthread_mutex_unlock(&interrupt_lock);
}

int32_t csm_interrupt_pending(void) { return __atomic_load_n(&interrupt_pending, __ATOMIC_SEQ_CST); }

static int32_t exit_code(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

static int32_t spawn_child(const char* const* argv, const char* output_path, int own_group, pid_t* pid) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, output_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    if (own_group) {
        posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
        posix_spawnattr_setpgroup(&attributes, 0);
    }
    int rc = posix_spawnp(pid, argv[0], &actions, &attributes, (char* const*)argv, environ);
    posix_spawnattr_destroy(&attributes);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) {
        errno = rc;
        return -1;
    }
    return 0;
}

int32_t csm_spawn_wait(const char* const* argv, const char* output_path) {
    pid_t pid;
    if (spawn_child(argv, output_path, 0, &pid) != 0) return CSM_SPAWN_FAILED;
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) return CSM_SPAWN_FAILED;
    }
    return exit_code(status);
}

int32_t csm_spawn_wait_limited(const char* const* argv, const char* output_path, double timeout_seconds) {
    if (csm_interrupt_pending()) return CSM_SPAWN_INTERRUPTED;
    pid_t pid;
    if (spawn_child(argv, output_path, 1, &pid) != 0) return CSM_SPAWN_FAILED;
    int slot = -1;
    for (int i = 0; i < MAX_CHILDREN && slot < 0; i++) {
        pid_t expected = 0;
        if (__atomic_compare_exchange_n(&active_children[i], &expected, pid, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) slot = i;
    }
    double deadline = timeout_seconds > 0 ? csm_now() + timeout_seconds : 0;
    // A pidfd wakes the wait the moment the child ends; where the kernel has none, short
    // sleeps (growing to 20 ms) do. Either way the flags are looked at every 20 ms at most,
    // since SIGINT may be delivered to any thread, not necessarily this one.
    int pidfd = -1;
#ifdef SYS_pidfd_open
    pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
#endif
    int status = 0, reason = 0;
    long sleep_ns = 1000000;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) break;
        if (r < 0 && errno != EINTR) {
            reason = CSM_SPAWN_FAILED;
            break;
        }
        if (csm_interrupt_pending()) reason = CSM_SPAWN_INTERRUPTED;
        else if (deadline > 0 && csm_now() >= deadline) reason = CSM_SPAWN_TIMED_OUT;
        if (reason) {
            // The whole group: the driver's own children (the linker) with it.
            kill(-pid, SIGKILL);
            while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
            break;
        }
        if (pidfd >= 0) {
            struct pollfd p = {.fd = pidfd, .events = POLLIN};
            poll(&p, 1, 20);
        } else {
            struct timespec t = {0, sleep_ns};
            nanosleep(&t, NULL);
            if (sleep_ns < 20000000) sleep_ns *= 2;
        }
    }
    if (pidfd >= 0) close(pidfd);
    if (slot >= 0) __atomic_store_n(&active_children[slot], 0, __ATOMIC_RELEASE);
    return reason ? reason : exit_code(status);
}

#endif
