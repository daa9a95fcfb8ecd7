// ---- the memory check (libraries compiled with SM_CHECK_MEMORY) ----
// clang's -fsanitize-coverage=trace-loads,trace-stores makes every load and store of the
// kernel call __sanitizer_cov_load<N>/store<N> (below) with its address. An access from a
// GPU thread must fall in a bound buffer, threadgroup memory (a declared threadgroup
// variable, not the red zone before it), the thread's own stack, or the library's
// constants; anything else is an out-of-bounds access, however far it lands. Buffer and
// threadgroup bytes have shadow cells (sm_shadow: last writer, last reader) that find
// races by what orders two accesses, not by their outcome: threads of one threadgroup
// are ordered by a threadgroup barrier between them (or, in one simdgroup, by a simd
// operation), threads of different threadgroups never (atomics aside).
namespace metal {
namespace __sm {
#ifdef SM_CHECK_MEMORY
constexpr uint64_t ARENA_RED_ZONE = 64;
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
    for (int i = 0; i < SM_MAX_THREADGROUP_MEMORY; i++)
        if (d->check->tg_shadow[i]) memset(d->check->tg_shadow[i], 0, d->tg_mem_lengths[i] * sizeof(sm_shadow));
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

// Whether an earlier access (group, thread, epoch, sg_epoch) is unordered with the
// running thread's access now.
SM_UNTRACED static inline bool unordered(Group* g, Lane* L, bool device, uint32_t group, uint32_t thread, uint32_t epoch, uint16_t sg_epoch) {
    if (thread == SM_SHADOW_ATOMIC) return false;
    if (group != g->id) return device;
    if (thread == L->tid || epoch != g->epoch) return false;
    if (thread / 32 == L->sg && sg_epoch != g->sg_epoch[L->sg]) return false;
    return true;
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

// An atomic marks its bytes written (so later reads are initialised) and never races.
SM_UNTRACED static inline void track(Group* g, Lane* L, sm_shadow* cells, bool device, int32_t region, uint64_t offset,
                         uintptr_t a, uint32_t size, bool write, uintptr_t pc, bool atomic) {
    sm_check* c = g->d->check;
    if (device && write) mark_initialized(c, region, offset, size);
    if (atomic) {
        for (uint32_t b = 0; b < size; b++) {
            cells[b].w_group = g->id;
            cells[b].w_thread = SM_SHADOW_ATOMIC;
        }
        return;
    }
    const uint16_t sge = g->sg_epoch[L->sg];
    for (uint32_t b = 0; b < size; b++) {
        sm_shadow* x = cells + b;
        if (x->w_group == 0) {
            if (!write && c->uninitialized && (!device || !initialized(c, region, offset + b)))
                check_report(g, L, SM_CHECK_UNINITIALIZED, region, offset + b, a + b, size, write, pc);
        } else if (c->races && unordered(g, L, device, x->w_group, x->w_thread, x->w_epoch, x->w_sg_epoch)) {
            c->other_is_write = 1;
            c->other_pc = x->w_pc;
            c->other_group = x->w_group;
            c->other_thread = x->w_thread;
            c->other_epoch = x->w_epoch;
            check_report(g, L, SM_CHECK_RACE, region, offset + b, a + b, size, write, pc);
        }
        const uint32_t pc32 = (uint32_t)(pc - c->image_start);
        if (write) {
            if (c->races && x->r_group) {
                const uint32_t reader = x->r_thread & 0x3FFFu;
                bool race;
                if (!(x->r_thread & SM_SHADOW_MANY)) race = unordered(g, L, device, x->r_group, reader, x->r_epoch, x->r_sg_epoch);
                else if (x->r_group != g->id) race = device;
                else if (x->r_epoch != g->epoch) race = false;
                else if (x->r_thread & SM_SHADOW_MIXED) race = true;  // readers in several simdgroups: one is not this one
                else race = !(reader / 32 == L->sg && x->r_sg_epoch != sge);
                if (race) {
                    c->other_is_write = 0;
                    c->other_pc = x->r_pc;
                    c->other_group = x->r_group;
                    c->other_thread = reader;
                    c->other_epoch = x->r_epoch;
                    check_report(g, L, SM_CHECK_RACE, region, offset + b, a + b, size, write, pc);
                }
            }
            x->w_group = g->id;
            x->w_thread = (uint16_t)L->tid;
            x->w_epoch = g->epoch;
            x->w_sg_epoch = sge;
            x->w_pc = pc32;
            x->r_group = 0;
        } else if (x->r_group == g->id && x->r_epoch == g->epoch && (x->r_thread & 0x3FFFu) != L->tid) {
            uint16_t flags = (uint16_t)(x->r_thread & (SM_SHADOW_MANY | SM_SHADOW_MIXED)) | SM_SHADOW_MANY;
            if ((x->r_thread & 0x3FFFu) / 32 != L->sg || x->r_sg_epoch != sge) flags |= SM_SHADOW_MIXED;
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

SM_UNTRACED static inline void check_access(uintptr_t a, uint32_t size, bool write, uintptr_t pc, bool atomic = false) {
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
    if (atomic) write = true;
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
SM_UNTRACED static void check_atomic(const void* p, uint32_t size) {
    check_access((uintptr_t)p, size, true, (uintptr_t)__builtin_return_address(0), true);
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
#endif
