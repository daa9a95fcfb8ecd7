// ---- the memory check (libraries compiled with SM_CHECK_MEMORY) ----
// clang's -fsanitize-coverage=trace-loads,trace-stores makes every load and store of the
// kernel call __sanitizer_cov_load<N>/store<N> (below) with its address. An access from a
// GPU thread must fall in a bound buffer, threadgroup memory (a declared threadgroup
// variable, not the red zone before it), the thread's own stack, or the library's
// constants; anything else is an out-of-bounds access, however far it lands. Buffer and
// threadgroup bytes have shadow cells (sm_shadow: last writer, last reader) that find
// races by what orders two accesses, not by their outcome: threads of one threadgroup
// are ordered by a threadgroup barrier between them (or, in one simdgroup, by a simd
// operation). Threads of different threadgroups only as Apple's memory model orders them
// (device memory): a write is ordered before another threadgroup's access when the writer's
// threadgroup then made a device-scope release (atomic_thread_fence with mem_device, a
// release order and device scope, by the writing thread or after a barrier, then an
// atomic write) and the accessing threadgroup acquired it (an atomic read of that location
// in the release's sequence, then a device-scope acquire fence, by the accessing thread or
// before a barrier). A threadgroup_barrier, whatever its mem_flags, orders nothing across
// threadgroups. Checked threadgroups run one after another, so an atomic read always
// reads the newest value and the releases it synchronises with are those of its location's
// release sequence so far. Atomics on one location never race with each other, but an
// atomic and another thread's plain access of it do unless ordered as two plain ones; an atomic
// load of a value another threadgroup wrote is reported like a plain read when nothing
// orders it (a relaxed load may return the older value: the previous dispatch's).
namespace metal {
namespace __sm {
#ifdef SM_CHECK_MEMORY
constexpr uint64_t ARENA_RED_ZONE = 64;
enum : uint32_t { ATOMIC_NONE = 0, ATOMIC_LOAD = 1, ATOMIC_STORE = 2, ATOMIC_RMW = 3 };
// The checker's own code is not traced (it would call itself).
#define SM_UNTRACED __attribute__((no_sanitize("coverage")))
extern "C" char __ehdr_start __attribute__((visibility("hidden")));
extern "C" char _end __attribute__((visibility("hidden")));
// The dispatch being checked: the host runs checked dispatches one at a time.
static sm_dispatch* checked_;

SM_UNTRACED static inline bool check_begin(sm_dispatch* d) {
    sm_check* c = d->check;
    if (!c) {
        if (d->error) snprintf(d->error, d->error_capacity, "kernel %s: a checked library launched without a check", d->kernel_name);
        d->error_kind = SM_ERROR_RUNTIME;
        return false;
    }
    c->image_start = (uintptr_t)&__ehdr_start;
    c->image_end = (uintptr_t)&_end;
    c->kind = SM_CHECK_NONE;
    checked_ = d;
    return true;
}
SM_UNTRACED static inline void check_threadgroup_begin(sm_dispatch* d) {
    sm_check* c = d->check;
    for (int i = 0; i < SM_MAX_THREADGROUP_MEMORY; i++)
        if (c->tg_shadow[i]) memset(c->tg_shadow[i], 0, d->tg_mem_lengths[i] * sizeof(sm_shadow));
    c->acquire_count = 0;
    if (c->threads) memset(c->threads, 0, (d->max_threads < SM_SYNC_THREADS ? d->max_threads : SM_SYNC_THREADS) * sizeof(sm_thread_sync));
}
SM_UNTRACED static inline void check_arena_allocated(Group* g, uint64_t off, uint64_t size) {
    if (g->d->check->arena_shadow) memset(g->d->check->arena_shadow + off, 0, size * sizeof(sm_shadow));
}

[[noreturn]] SM_UNTRACED static inline void check_report(Group* g, Lane* L, uint32_t kind, int32_t region, uint64_t offset,
                                             uintptr_t a, uint32_t size, bool write, uintptr_t pc) {
    sm_check* c = g->d->check;
    c->kind = kind;
    c->region = region;
    c->offset = offset;
    const sm_dispatch* d = g->d;
    if (region >= 0) c->region_length = d->buffer_lengths[region];
    else if (region != SM_REGION_ARENA && region != SM_REGION_NONE) c->region_length = d->tg_mem_lengths[-region - 1];
    c->address = a;
    c->size = size;
    c->is_write = write;
    c->pc = (uint32_t)(pc - c->image_start);
    c->group = g->id;
    c->thread = L->tid;
    c->epoch = g->epoch;
    fail(g, SM_ERROR_CHECK);
}

// Whether an access of another threadgroup (group, thread, epoch; thread ~0u: some thread
// of it) happens before the running thread's access now: a release of that threadgroup
// made after the access, acquired by this threadgroup before it.
SM_UNTRACED static inline bool synchronized(const sm_check* c, const Group* g, const Lane* L, uint32_t group, uint32_t thread,
                                            uint32_t epoch) {
    if (!c->releases || group == 0 || group > c->group_count) return false;
    if (c->coherent_access && c->coherent_fences) {
        const uint32_t* f = c->coherent_fences + (uint64_t)(group - 1) * (SM_SYNC_THREADS + 1);
        // The writer's own fence in the write's barrier epoch counts as after the write
        // (the shadow keeps no order within an epoch); another thread's only after a barrier.
        if (thread < SM_SYNC_THREADS && f[thread] > epoch) return true;
        if (f[SM_SYNC_THREADS] > epoch + 1) return true;
    }
    const sm_release* r = c->releases + (uint64_t)(group - 1) * SM_RELEASES_PER_GROUP;
    for (uint32_t k = 0; k < SM_RELEASES_PER_GROUP; k++) {
        if (!r[k].location || !(epoch < r[k].epoch || (thread == r[k].thread && epoch == r[k].epoch))) continue;
        for (uint32_t j = 0; j < c->acquire_count; j++) {
            const sm_acquire* q = c->acquires + j;
            if (q->location == r[k].location && q->start <= r[k].clock && r[k].clock <= q->clock &&
                (g->epoch > q->epoch || (L->tid == q->thread && g->epoch == q->epoch)))
                return true;
        }
    }
    return false;
}

// Whether an earlier access (group, thread, epoch, sg_epoch) is unordered with the
// running thread's access now. Callers ask only where one of the two is plain: an atomic
// orders nothing but its own location against other atomics.
SM_UNTRACED static inline bool unordered(Group* g, Lane* L, bool device, uint32_t group, uint32_t thread, uint32_t epoch, uint16_t sg_epoch) {
    thread &= SM_SHADOW_THREAD;
    if (group != g->id) return device && !synchronized(g->d->check, g, L, group, thread, epoch);
    if (thread == L->tid || epoch != g->epoch) return false;
    if (thread / 32 == L->sg && sg_epoch != g->sg_epoch[L->sg]) return false;
    return true;
}

// Whether a plain read recorded in x (one reader, or several of one threadgroup and
// epoch) is unordered with the running thread's write now.
SM_UNTRACED static inline bool readers_unordered(Group* g, Lane* L, const sm_shadow* x, bool device) {
    if (!x->r_group) return false;
    const uint32_t reader = x->r_thread & SM_SHADOW_THREAD;
    if (!(x->r_thread & SM_SHADOW_MANY)) return unordered(g, L, device, x->r_group, reader, x->r_epoch, x->r_sg_epoch);
    if (x->r_group != g->id) return device && !synchronized(g->d->check, g, L, x->r_group, ~0u, x->r_epoch);
    if (x->r_epoch != g->epoch) return false;
    if (x->r_thread & SM_SHADOW_MIXED) return true;  // readers in several simdgroups: one is not this one
    return !(reader / 32 == L->sg && x->r_sg_epoch != g->sg_epoch[L->sg]);
}

// A device byte written by this dispatch (or an atomic) sets its bit in the buffer's
// persistent initialisation bitmap, which later dispatches read.
SM_UNTRACED static inline void mark_initialized(sm_check* c, int32_t region, uint64_t offset, uint32_t size) {
    uint8_t* bits = c->buffer_init[region];
    if (!bits) return;
    for (uint64_t k = c->buffer_init_bit[region] + offset, e = k + size; k < e; k++) bits[k >> 3] |= (uint8_t)(1u << (k & 7));
}
SM_UNTRACED static inline bool initialized(const sm_check* c, int32_t region, uint64_t offset) {
    const uint8_t* bits = c->buffer_init[region];
    if (!bits) return true;
    const uint64_t k = c->buffer_init_bit[region] + offset;
    return (bits[k >> 3] >> (k & 7)) & 1u;
}

// Stale reads: memory gets the byte the dispatch began with, the newer byte is kept to go back.
SM_UNTRACED static inline void serve_stale(sm_check* c, int32_t region, uint64_t offset, uintptr_t a) {
    uint8_t* pending = c->stale_pending[region] + offset;
    if (*pending) return;
    c->stale_newest[region][offset] = *(uint8_t*)a;
    *(uint8_t*)a = c->stale_initial[region][offset];
    *pending = 1;
}
// An ordered read sees the newest byte again; a write replaces it.
SM_UNTRACED static inline void unstale(sm_check* c, int32_t region, uint64_t offset, uintptr_t a, bool write) {
    uint8_t* pending = c->stale_pending[region] + offset;
    if (!*pending) return;
    if (!write) *(uint8_t*)a = c->stale_newest[region][offset];
    *pending = 0;
}

[[noreturn]] SM_UNTRACED static inline void report_race(Group* g, Lane* L, const sm_shadow* x, bool other_is_write, int32_t region,
                                                        uint64_t offset, uintptr_t a, uint32_t size, bool write, uintptr_t pc) {
    sm_check* c = g->d->check;
    c->other_is_write = other_is_write;
    c->other_pc = other_is_write ? x->w_pc : x->r_pc;
    c->other_group = other_is_write ? x->w_group : x->r_group;
    c->other_thread = (other_is_write ? x->w_thread : x->r_thread) & SM_SHADOW_THREAD;
    c->other_epoch = other_is_write ? x->w_epoch : x->r_epoch;
    check_report(g, L, SM_CHECK_RACE, region, offset, a, size, write, pc);
}

// Plain accesses and atomics. Atomic writes record their thread (flagged) and never race;
// an atomic load of device memory is a read that must be ordered after a write of
// another threadgroup, and otherwise changes no cell.
SM_UNTRACED static inline void track(Group* g, Lane* L, sm_shadow* cells, bool device, int32_t region, uint64_t offset,
                         uintptr_t a, uint32_t size, bool write, uintptr_t pc, uint32_t atomic) {
    sm_check* c = g->d->check;
    const bool stale = device && c->stale_reads && c->stale_pending[region];
    c->coherent_access = device && region >= 0 && region < SM_MAX_BUFFERS && c->coherent[region];
    if (atomic == ATOMIC_LOAD && device) {
        c->atomic_read = 1;
        for (uint32_t b = 0; b < size; b++) {
            const sm_shadow* x = cells + b;
            if (c->races && x->w_group && x->w_group != g->id &&
                !synchronized(c, g, L, x->w_group, x->w_thread & SM_SHADOW_THREAD, x->w_epoch)) {
                if (stale) serve_stale(c, region, offset + b, a + b);
                else report_race(g, L, x, true, region, offset + b, a + b, size, false, pc);
            } else if (c->races && x->w_group == g->id && !(x->w_thread & SM_SHADOW_ATOMIC) &&
                       unordered(g, L, device, x->w_group, x->w_thread, x->w_epoch, x->w_sg_epoch)) {
                report_race(g, L, x, true, region, offset + b, a + b, size, false, pc);
            } else if (stale) {
                unstale(c, region, offset + b, a + b, false);
            }
        }
        c->atomic_read = 0;
        return;
    }
    if (device && write) mark_initialized(c, region, offset, size);
    const uint16_t sge = g->sg_epoch[L->sg];
    const uint32_t pc32 = (uint32_t)(pc - c->image_start);
    if (atomic) {
        for (uint32_t b = 0; b < size; b++) {
            sm_shadow* x = cells + b;
            // Atomics never race with atomics; with another thread's plain access they do.
            if (c->races && x->w_group && !(x->w_thread & SM_SHADOW_ATOMIC) &&
                unordered(g, L, device, x->w_group, x->w_thread, x->w_epoch, x->w_sg_epoch))
                report_race(g, L, x, true, region, offset + b, a + b, size, true, pc);
            if (c->races && atomic != ATOMIC_LOAD && readers_unordered(g, L, x, device))
                report_race(g, L, x, false, region, offset + b, a + b, size, true, pc);
            if (stale) unstale(c, region, offset + b, a + b, true);
            x->r_group = 0;
            // A plain write stays the record until a barrier: the writer's own atomic after it
            // does not order it before other threads' atomics.
            if (x->w_group == g->id && !(x->w_thread & SM_SHADOW_ATOMIC) && x->w_epoch == g->epoch) continue;
            x->w_group = g->id;
            x->w_thread = (uint16_t)(L->tid | SM_SHADOW_ATOMIC);
            x->w_epoch = g->epoch;
            x->w_sg_epoch = sge;
            x->w_pc = pc32;
        }
        return;
    }
    for (uint32_t b = 0; b < size; b++) {
        sm_shadow* x = cells + b;
        bool served = false;
        if (x->w_group == 0) {
            if (!write && c->uninitialized && (!device || !initialized(c, region, offset + b)))
                check_report(g, L, SM_CHECK_UNINITIALIZED, region, offset + b, a + b, size, write, pc);
        } else if (c->races && unordered(g, L, device, x->w_group, x->w_thread, x->w_epoch, x->w_sg_epoch)) {
            if (stale && !write && x->w_group != g->id) {
                serve_stale(c, region, offset + b, a + b);
                served = true;
            } else {
                report_race(g, L, x, true, region, offset + b, a + b, size, write, pc);
            }
        }
        if (stale && !served) unstale(c, region, offset + b, a + b, write);
        if (write) {
            if (c->races && readers_unordered(g, L, x, device)) report_race(g, L, x, false, region, offset + b, a + b, size, write, pc);
            x->w_group = g->id;
            x->w_thread = (uint16_t)L->tid;
            x->w_epoch = g->epoch;
            x->w_sg_epoch = sge;
            x->w_pc = pc32;
            x->r_group = 0;
        } else if (x->r_group == g->id && x->r_epoch == g->epoch && (x->r_thread & SM_SHADOW_THREAD) != L->tid) {
            uint16_t flags = (uint16_t)(x->r_thread & (SM_SHADOW_MANY | SM_SHADOW_MIXED)) | SM_SHADOW_MANY;
            if ((x->r_thread & SM_SHADOW_THREAD) / 32 != L->sg || x->r_sg_epoch != sge) flags |= SM_SHADOW_MIXED;
            x->r_thread = (uint16_t)(L->tid | flags);
            x->r_sg_epoch = sge;
            x->r_pc = pc32;
        } else {
            x->r_group = g->id;
            x->r_thread = (uint16_t)L->tid;
            x->r_epoch = g->epoch;
            x->r_sg_epoch = sge;
            x->r_pc = pc32;
        }
    }
}

// The release and acquire bookkeeping of an atomic on device memory at address a.
SM_UNTRACED static inline sm_sync_location* sync_location(sm_check* c, uintptr_t a) {
    if (!c->locations) return nullptr;
    for (uint32_t i = (uint32_t)((a >> 2) * 0x9E3779B1u) % SM_SYNC_LOCATIONS, n = 0; n < SM_SYNC_LOCATIONS; n++, i = (i + 1) % SM_SYNC_LOCATIONS) {
        sm_sync_location* s = c->locations + i;
        if (s->location == a) return s;
        if (!s->location) {
            s->location = a;
            s->start = 0;
            return s;
        }
    }
    return nullptr;  // full: every release counts as in the sequence
}
SM_UNTRACED static inline void sync_atomic(sm_check* c, Group* g, Lane* L, uintptr_t a, uint32_t atomic) {
    if (!c->threads || !c->releases || L->tid >= SM_SYNC_THREADS || g->id == 0 || g->id > c->group_count) return;
    sm_thread_sync* t = c->threads + L->tid;
    sm_sync_location* s = sync_location(c, a);
    if (atomic != ATOMIC_STORE) {  // it reads: a later acquire fence synchronises through it
        t->read_location = a;
        t->read_start = s ? s->start : 0;
        t->read_clock = c->release_clock;
    }
    if (atomic == ATOMIC_LOAD) return;
    if (t->fence_epoch) {
        const uint32_t clock = ++c->release_clock;
        sm_release* r = c->releases + (uint64_t)(g->id - 1) * SM_RELEASES_PER_GROUP;
        sm_release* slot = r;
        for (uint32_t k = 0; k < SM_RELEASES_PER_GROUP; k++) {
            if (r[k].location == a && r[k].epoch == t->fence_epoch - 1 && r[k].thread == L->tid) { slot = r + k; break; }
            if (r[k].clock < slot->clock) slot = r + k;  // else the oldest (or an empty one) gives way
        }
        *slot = sm_release{a, clock, t->fence_epoch - 1, L->tid, 0};
        if (atomic == ATOMIC_STORE && s) s->start = clock;  // a store heads a new release sequence
    } else if (atomic == ATOMIC_STORE && s) {
        s->start = c->release_clock + 1;  // a store that releases nothing ends the sequence
    }
}

SM_UNTRACED static inline void check_access(uintptr_t a, uint32_t size, bool write, uintptr_t pc, uint32_t atomic = ATOMIC_NONE) {
    sm_dispatch* d = checked_;
    if (!d) return;
    const uintptr_t sp = (uintptr_t)__builtin_frame_address(0);
    const uintptr_t stacks = (uintptr_t)d->stacks;
    if (sp < stacks || sp >= stacks + d->stack_size * d->stack_count) return;  // the runtime, not a GPU thread
    sm_check* c = d->check;
    if (c->kind) return;  // reporting already
    Lane* L = cur();
    Group* g = L->g;
    const uintptr_t end = a + size;
    // Thread memory: this thread's stack, and other threads' (the runtime's lane states and
    // simd collectives' operands live there; an overflow of a thread array hits a guard page).
    if (a >= stacks && end <= stacks + d->stack_size * d->stack_count) return;
    if (a >= (uintptr_t)d->scratch && end <= (uintptr_t)d->scratch + d->scratch_size) return;
    if (a >= c->image_start && end <= c->image_end) return;
    if (a >= (uintptr_t)d && end <= (uintptr_t)(d + 1)) return;
    if (a >= (uintptr_t)c && end <= (uintptr_t)(c + 1)) return;
    if (d->error && a >= (uintptr_t)d->error && end <= (uintptr_t)d->error + d->error_capacity) return;
    if (atomic && atomic != ATOMIC_LOAD) write = true;
    for (int i = 0; i < SM_MAX_THREADGROUP_MEMORY; i++) {
        const uintptr_t base = (uintptr_t)d->tg_mem[i];
        if (!base || a < base || a >= base + d->tg_mem_lengths[i]) continue;
        if (end > base + d->tg_mem_lengths[i]) check_report(g, L, SM_CHECK_BOUNDS, -(i + 1), a - base, a, size, write, pc);
        if (c->tg_shadow[i]) track(g, L, c->tg_shadow[i] + (a - base), false, -(i + 1), a - base, a, size, write, pc, atomic);
        return;
    }
    const uintptr_t arena = (uintptr_t)d->tg_static;
    if (arena && a >= arena - ARENA_RED_ZONE && a < arena + d->tg_static_capacity) {
        for (uint32_t s = 0; s < TG_SLOTS; s++) {
            const uintptr_t p = (uintptr_t)g->slot_ptr[s];
            if (!p || a < p || end > p + g->slot_size[s]) continue;
            if (c->arena_shadow) {
                c->region_length = g->slot_size[s];
                track(g, L, c->arena_shadow + (a - arena), false, SM_REGION_ARENA, a - p, a, size, write, pc, atomic);
            }
            return;
        }
        // Named by the variable before it (the usual overflow), else the first one.
        uintptr_t before = 0, first = ~(uintptr_t)0;
        uint64_t before_size = 0, first_size = 0;
        for (uint32_t s = 0; s < TG_SLOTS; s++) {
            const uintptr_t p = (uintptr_t)g->slot_ptr[s];
            if (!p) continue;
            if (p <= a && p > before) { before = p; before_size = g->slot_size[s]; }
            if (p < first) { first = p; first_size = g->slot_size[s]; }
        }
        if (!before) { before = first == ~(uintptr_t)0 ? arena : first; before_size = first_size; }
        c->region_length = before_size;
        check_report(g, L, SM_CHECK_BOUNDS, SM_REGION_ARENA, a - before, a, size, write, pc);
    }
    int32_t partly = -1;
    for (int i = 0; i < SM_MAX_BUFFERS; i++) {
        const uintptr_t base = (uintptr_t)d->buffers[i];
        if (!base || a < base || a >= base + d->buffer_lengths[i]) continue;
        if (end > base + d->buffer_lengths[i]) { partly = i; continue; }
        if (c->buffer_shadow[i]) track(g, L, c->buffer_shadow[i] + (a - base), true, i, a - base, a, size, write, pc, atomic);
        if (atomic) sync_atomic(c, g, L, a, atomic);
        return;
    }
    if (partly >= 0) check_report(g, L, SM_CHECK_BOUNDS, partly, a - (uintptr_t)d->buffers[partly], a, size, write, pc);
    // Nowhere: named by the nearest bound buffer.
    int32_t nearest = SM_REGION_NONE;
    uint64_t best = ~0ull;
    for (int i = 0; i < SM_MAX_BUFFERS; i++) {
        const uintptr_t base = (uintptr_t)d->buffers[i];
        if (!base) continue;
        const uint64_t dist = a < base ? base - a : a - base;
        if (dist < best) { best = dist; nearest = i; }
    }
    c->outside = 1;
    check_report(g, L, SM_CHECK_BOUNDS, nearest, nearest >= 0 ? a - (uintptr_t)d->buffers[nearest] : 0, a, size, write, pc);
}
// pc: the atomic function's return address, in the kernel's code.
SM_UNTRACED static void check_atomic(const void* p, uint32_t size, uintptr_t pc, uint32_t atomic) {
    check_access((uintptr_t)p, size, atomic != ATOMIC_LOAD, pc, atomic);
}
// atomic_thread_fence: with mem_device at device (or system) scope, a release fence makes
// the thread's later atomic writes releases; an acquire fence acquires through the
// thread's last atomic read. Not inlined into the (traced) fence.
__attribute__((noinline)) SM_UNTRACED static void check_fence(bool device_memory, bool device_scope, bool acquire, bool release) {
    sm_dispatch* d = checked_;
    if (!d || !device_memory || !device_scope) return;
    const uintptr_t sp = (uintptr_t)__builtin_frame_address(0);
    const uintptr_t stacks = (uintptr_t)d->stacks;
    if (sp < stacks || sp >= stacks + d->stack_size * d->stack_count) return;
    sm_check* c = d->check;
    Lane* L = cur();
    if (!c->threads || L->tid >= SM_SYNC_THREADS) return;
    sm_thread_sync* t = c->threads + L->tid;
    if (acquire && t->read_location) {
        const uint32_t n = c->acquire_count < SM_ACQUIRES_PER_GROUP ? c->acquire_count++ : SM_ACQUIRES_PER_GROUP - 1;
        c->acquires[n] = sm_acquire{t->read_location, t->read_start, t->read_clock, L->g->epoch, L->tid};
    }
    if (release) {
        t->fence_epoch = L->g->epoch + 1;
        if (c->coherent_fences && L->g->id >= 1 && L->g->id <= c->group_count) {
            uint32_t* f = c->coherent_fences + (uint64_t)(L->g->id - 1) * (SM_SYNC_THREADS + 1);
            f[L->tid] = L->g->epoch + 1;
            if (f[SM_SYNC_THREADS] < L->g->epoch + 1) f[SM_SYNC_THREADS] = L->g->epoch + 1;
        }
    }
}
#endif

}  // namespace __sm
}  // namespace metal

#ifdef SM_CHECK_MEMORY
// The instrumentation's entry points (see above), outside the namespaces: clang calls them by
// their C names.
#define SM_TRACE(N, T)                                                                                 \
    extern "C" __attribute__((visibility("hidden"), no_sanitize("coverage"))) void __sanitizer_cov_load##N(T* p) {  \
        ::metal::__sm::check_access((uintptr_t)p, N, false, (uintptr_t)__builtin_return_address(0));    \
    }                                                                                                   \
    extern "C" __attribute__((visibility("hidden"), no_sanitize("coverage"))) void __sanitizer_cov_store##N(T* p) { \
        ::metal::__sm::check_access((uintptr_t)p, N, true, (uintptr_t)__builtin_return_address(0));     \
    }
SM_TRACE(1, uint8_t)
SM_TRACE(2, uint16_t)
SM_TRACE(4, uint32_t)
SM_TRACE(8, uint64_t)
SM_TRACE(16, __int128)
#undef SM_TRACE
// The memory intrinsics of traced code, which the build rewrites into calls of these
// (Compiler/CheckedIR.swift): the bytes are checked in pieces of at most 16, as the traced
// loads and stores of a copy would be, all reads before the writes, from the call's line
// (its return address less one: the return address may be the next statement's, or the
// caller's when the copy ends the kernel).
namespace metal {
namespace __sm {
SM_UNTRACED static inline void check_range(const void* p, uint64_t n, bool write, uintptr_t pc) {
    for (uint64_t k = 0; k < n; k += 16)
        check_access((uintptr_t)p + k, (uint32_t)(n - k < 16 ? n - k : 16), write, pc);
}
}  // namespace __sm
}  // namespace metal
extern "C" __attribute__((visibility("hidden"), used, noinline, no_sanitize("coverage"))) void __sm_memcpy_checked(void* d, const void* s, uint64_t n) {
    const uintptr_t pc = (uintptr_t)__builtin_return_address(0) - 1;
    ::metal::__sm::check_range(s, n, false, pc);
    ::metal::__sm::check_range(d, n, true, pc);
    __builtin_memcpy(d, s, n);
}
extern "C" __attribute__((visibility("hidden"), used, noinline, no_sanitize("coverage"))) void __sm_memmove_checked(void* d, const void* s, uint64_t n) {
    const uintptr_t pc = (uintptr_t)__builtin_return_address(0) - 1;
    ::metal::__sm::check_range(s, n, false, pc);
    ::metal::__sm::check_range(d, n, true, pc);
    __builtin_memmove(d, s, n);
}
extern "C" __attribute__((visibility("hidden"), used, noinline, no_sanitize("coverage"))) void __sm_memset_checked(void* d, uint8_t v, uint64_t n) {
    ::metal::__sm::check_range(d, n, true, (uintptr_t)__builtin_return_address(0) - 1);
    __builtin_memset(d, v, n);
}
#endif
