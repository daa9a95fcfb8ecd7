// Guarded memory: buffers and threadgroup memory whose usable bytes end exactly at
// PROT_NONE guard space (64 GiB on each side within a budget of address space, else one
// page), recorded in a registry that the signal handler (signals.c) reads to turn a fault
// in a guard into an out-of-bounds error naming the buffer. A kernel that reads or writes
// past its buffer on a GPU corrupts memory silently; here it faults at once. Also the
// budget of memory mappings that keeps SoftMetal's buffers from exhausting the process's
// vm.max_map_count (past it, buffers are plain, then makeBuffer fails).
#if defined(__linux__)
#include "csoftmetal_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

// MARK: guard registry ------------------------------------------------------------------
// (the entries and their rules: csoftmetal_internal.h)

CSM_INTERNAL region registry[REGISTRY_SIZE];
static int registry_top;  // entries below this index may be live
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;

CSM_INTERNAL void registry_add(uintptr_t lo, uintptr_t hi, uintptr_t data, uintptr_t length, int32_t tag,
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

CSM_INTERNAL int registry_remove(uintptr_t data, region* out) {
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

CSM_INTERNAL int registry_find(uintptr_t address) {
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

CSM_INTERNAL void* guarded_map(size_t length, int32_t tag, int32_t kind) {
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

#endif
