// ---- scheduling ----
// Run-ahead: the first runnable lane from simdgroup position g->ra_pos on, in run order
// within each simdgroup (after `self` in its own), or null. Each simdgroup's lanes are
// the block order[32 * sg ...] (launch keeps lane permutations inside simdgroups).
namespace metal {
namespace __sm {
static inline Lane* run_ahead_next(Group* g, Lane* self) {
    for (uint32_t k = g->ra_pos; k < g->nsg; k++) {
        const uint32_t sg = g->reverse_sg ? g->nsg - 1 - k : k;
        const uint32_t base = sg * 32, count = g->n - base < 32 ? g->n - base : 32;
        const uint32_t start = self && self->sg == sg ? self->rank + 1 : 0;
        for (uint32_t j = 0; j < count; j++) {
            Lane* L = g->lanes[g->order[base + (start + j) % count]];
            if (L->state == RUNNABLE) {
                g->ra_pos = k;
                return L;
            }
        }
    }
    return nullptr;
}

// Switches from `self` (blocked or finished) to the next runnable lane in run order, or
// back to the dispatch loop when none is runnable (all finished, or a deadlock).
static inline void switch_from(Lane* self) {
    Group* g = self->g;
    if (g->run_ahead) {
        Lane* L = g->live ? run_ahead_next(g, self) : nullptr;
        if (L != self) __sm_switch(&self->sp, L ? L->sp : g->main_sp);
        return;
    }
    if (g->live) {
        uint32_t i = self->next;
        for (uint32_t c = 0; c <= g->n; c++) {
            Lane* L = g->lanes[i];
            if (L->state == RUNNABLE) {
                if (L != self) __sm_switch(&self->sp, L->sp);
                return;
            }
            i = L->next;
        }
    }
    __sm_switch(&self->sp, g->main_sp);
}

static inline void describe_waiting(Group* g, uint32_t first_state, uint32_t sg_only) {
    // Groups the waiting lanes by (operation, line).
    bool seen[MAX_LANES];
    for (uint32_t t = 0; t < g->n; t++) seen[t] = false;
    int groups = 0;
    for (uint32_t t = 0; t < g->n; t++) {
        Lane* L = g->lanes[t];
        if (seen[t] || L->state == DONE || L->state == RUNNABLE) continue;
        if (sg_only != ~0u && L->sg != sg_only) continue;
        (void)first_state;
        uint32_t line = L->line;
        const char* op = L->op;
        complete_fn fn = L->fn;
        uint32_t state = L->state;
        auto same = [&](Lane* M) {
            return M->state == state && M->line == line && M->fn == fn && M->op == op &&
                   (sg_only == ~0u || M->sg == sg_only);
        };
        for (uint32_t u = t; u < g->n; u++) if (same(g->lanes[u])) seen[u] = true;
        appendf(g, groups++ ? "; " : ": ");
        append_lanes(g, same);
        appendf(g, " wait in ");
        appendf(g, op);
        append_num(g, " at line %llu", line);
    }
}

// All live lanes wait at the barrier (the caller is one of them, or just finished).
static inline void barrier_release(Group* g) {
    uint32_t line = 0;
    bool first = true, diverged = false;
    for (uint32_t t = 0; t < g->n; t++) {
        Lane* L = g->lanes[t];
        if (L->state != AT_BARRIER) continue;
        if (first) { line = L->line; first = false; }
        else if (L->line != line) diverged = true;
    }
    if (diverged) {
        begin_message(g, "barrier divergence");
        describe_waiting(g, AT_BARRIER, ~0u);
        appendf(g, " (every thread still running must reach the same threadgroup_barrier)");
        fail(g, SM_ERROR_DIVERGENCE);
    }
    for (uint32_t t = 0; t < g->n; t++)
        if (g->lanes[t]->state == AT_BARRIER) g->lanes[t]->state = RUNNABLE;
    g->bar_arrived = 0;
    g->epoch++;
    g->ra_pos = 0;
}

static inline void barrier(uint32_t line, const char* op) {
    Lane* L = cur();
    Group* g = L->g;
    L->line = line;
    L->op = op;
    L->fn = nullptr;
    L->state = AT_BARRIER;
    if (++g->bar_arrived == g->live) {
        barrier_release(g);
        // Run-ahead: after the barrier the first simdgroup in the order goes first again,
        // not the one whose lane happened to arrive last.
        if (g->run_ahead) {
            Lane* first = run_ahead_next(g, nullptr);
            if (first != L) __sm_switch(&L->sp, first->sp);
        }
        return;
    }
    switch_from(L);
}

static inline void simd_complete(Group* g, uint32_t sg) {
    SimdState& s = g->simd[sg];
    Lane* first = nullptr;
    bool diverged = false;
    for (uint32_t l = 0; l < 32; l++) {
        if (!(s.mask & (1u << l))) continue;
        Lane* L = g->lanes[sg * 32 + l];
        if (!first) first = L;
        else if (L->line != first->line || L->fn != first->fn) diverged = true;
    }
    if (diverged) {
        begin_message(g, "simd divergence");
        append_num(g, ", simdgroup %llu", sg);
        describe_waiting(g, AT_SIMD, sg);
        appendf(g, " (a simd operation must be reached by all active threads of the simdgroup at the same place)");
        fail(g, SM_ERROR_DIVERGENCE);
    }
    s.complete(g, sg);
    g->sg_epoch[sg]++;
    for (uint32_t l = 0; l < 32; l++)
        if (s.mask & (1u << l)) g->lanes[sg * 32 + l]->state = RUNNABLE;
    s.arrived = 0;
    s.mask = 0;
}

// A lane arrives at a simd collective: `fill` stores its operands; the last active lane of
// the simdgroup to arrive completes it for all of them.
template <class Fill>
static inline void simd_arrive(uint32_t line, const char* op, complete_fn complete, Fill fill) {
    Lane* L = cur();
    Group* g = L->g;
    SimdState& s = g->simd[L->sg];
    fill(s, L->lane);
    L->line = line;
    L->op = op;
    L->fn = complete;
    L->state = AT_SIMD;
    if (s.arrived == 0) s.complete = complete;
    s.arrived++;
    s.mask |= 1u << L->lane;
    if (s.arrived == g->sg_live[L->sg]) {
        simd_complete(g, L->sg);
        return;
    }
    switch_from(L);
}

extern "C" __attribute__((visibility("hidden"), used)) inline void __sm_lane_main() {
    Lane* L = cur();
    Group* g = L->g;
    g->body(L);
    L->state = DONE;
    g->live--;
    g->lanes[L->prev]->next = L->next;
    g->lanes[L->next]->prev = L->prev;
    g->sg_live[L->sg]--;
    SimdState& s = g->simd[L->sg];
    if (s.arrived && s.arrived == g->sg_live[L->sg]) simd_complete(g, L->sg);
    if (g->bar_arrived && g->bar_arrived == g->live) barrier_release(g);
    switch_from(L);
    __builtin_trap();
}

static inline uint64_t splitmix(uint64_t& x) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Runs the threadgroups of d->first_group ..< d->end_group on this OS thread.
static inline int32_t launch(sm_dispatch* d, void (*body)(Lane*)) {
    if (d->abi_version != SM_ABI_VERSION) {
        if (d->error) snprintf(d->error, d->error_capacity, "runtime ABI version %d, host %u", SM_ABI_VERSION, d->abi_version);
        return d->error_kind = SM_ERROR_RUNTIME;
    }
    if (d->scratch_size < sizeof(Group)) {
        if (d->error) snprintf(d->error, d->error_capacity, "scratch too small");
        return d->error_kind = SM_ERROR_RUNTIME;
    }
    stack_size_ = (uintptr_t)d->stack_size;
    Group* g = (Group*)d->scratch;
#ifdef SM_CHECK_MEMORY
    if (!check_begin(d)) return d->error_kind;
#endif
    g->d = d;
    g->body = body;
    const uint32_t tx = d->threadgroups[0], ty = d->threadgroups[1], tz = d->threadgroups[2];
    const uint64_t total = (uint64_t)tx * ty * tz;
    uint64_t dyn = 0;
    for (int i = 0; i < SM_MAX_THREADGROUP_MEMORY; i++) dyn += d->tg_mem_lengths[i];
    g->dynamic_tg = dyn;
    for (uint32_t p = d->first_group; p < d->end_group; p++) {
        uint64_t linear = ((uint64_t)p * d->order_mul + d->order_add) % total;
        g->gpos[0] = (uint32_t)(linear % tx);
        g->gpos[1] = (uint32_t)((linear / tx) % ty);
        g->gpos[2] = (uint32_t)(linear / ((uint64_t)tx * ty));
        uint32_t n = 1;
        for (int k = 0; k < 3; k++) {
            uint32_t start = g->gpos[k] * d->tptg[k];
            uint32_t left = d->grid[k] > start ? d->grid[k] - start : 0;
            g->size[k] = left < d->tptg[k] ? left : d->tptg[k];
            n *= g->size[k];
        }
        if (n == 0) continue;
        if (n > MAX_LANES || n > d->stack_count) {
            if (d->error) snprintf(d->error, d->error_capacity, "kernel %s: %u threads per threadgroup, at most %u", d->kernel_name, n, MAX_LANES);
            return d->error_kind = SM_ERROR_RUNTIME;
        }
        g->n = n;
        g->live = n;
        g->nsg = (n + 31) / 32;
        g->bar_arrived = 0;
        g->error = 0;
        g->run_ahead = (d->flags & SM_FLAG_RUN_AHEAD) ? 1 : 0;
        g->reverse_sg = (d->flags & SM_FLAG_REVERSE_SIMDGROUPS) ? 1 : 0;
        g->ra_pos = 0;
        g->arena_used = 0;
        g->arena_apple = 0;
        g->id = (uint32_t)linear + 1;
        g->epoch = 0;
        for (uint32_t s = 0; s < g->nsg; s++) {
            g->sg_live[s] = (s + 1) * 32 <= n ? 32 : n - s * 32;
            g->simd[s].arrived = 0;
            g->simd[s].mask = 0;
            g->sg_epoch[s] = 0;
        }
        for (uint32_t i = 0; i < TG_SLOTS; i++) g->slot_ptr[i] = nullptr;
        // Threadgroup memory starts poisoned (0xFF: NaN as float, -1 as int), or zeroed
        // when poisoning is off, never with what the previous threadgroup left.
        for (int i = 0; i < SM_MAX_THREADGROUP_MEMORY; i++)
            if (d->tg_mem[i]) memset(d->tg_mem[i], (d->flags & SM_FLAG_POISON) ? 0xff : 0, d->tg_mem_lengths[i]);
#ifdef SM_CHECK_MEMORY
        check_threadgroup_begin(d);
#endif
        for (uint32_t t = 0; t < n; t++) {
            char* block = (char*)d->stacks + (uint64_t)t * d->stack_size;
            char* top = block + d->stack_size - LANE_RESERVE;
            Lane* L = (Lane*)top;
            L->g = g;
            L->tid = t;
            L->sg = t / 32;
            L->lane = t % 32;
            L->state = RUNNABLE;
            L->pos[0] = t % g->size[0];
            L->pos[1] = (t / g->size[0]) % g->size[1];
            L->pos[2] = t / (g->size[0] * g->size[1]);
            L->line = 0;
            L->op = "";
            L->fn = nullptr;
            L->sp = initial_frame(top, &__sm_lane_main);
            g->lanes[t] = L;
            g->order[t] = t;
        }
        if (d->seed) {
            uint64_t x = d->seed ^ (linear * 0x9e3779b97f4a7c15ull);
            // Run-ahead orders whole simdgroups itself: lanes are shuffled within theirs.
            const uint32_t block = g->run_ahead ? 32 : n;
            for (uint32_t base = 0; base < n; base += block) {
                const uint32_t end = base + block < n ? base + block : n;
                for (uint32_t t = end - 1; t > base; t--) {
                    uint32_t j = base + (uint32_t)(splitmix(x) % (t - base + 1));
                    uint32_t tmp = g->order[t];
                    g->order[t] = g->order[j];
                    g->order[j] = tmp;
                }
            }
        }
        for (uint32_t i = 0; i < n; i++) {
            g->lanes[g->order[i]]->next = g->order[(i + 1) % n];
            g->lanes[g->order[i]]->prev = g->order[(i + n - 1) % n];
            g->lanes[g->order[i]]->rank = i % 32;
        }
        __sm_switch(&g->main_sp, (g->run_ahead ? run_ahead_next(g, nullptr) : g->lanes[g->order[0]])->sp);
        if (g->error) return d->error_kind = g->error;
        if (g->live) {
            begin_message(g, "barrier divergence (deadlock)");
            describe_waiting(g, 0, ~0u);
            appendf(g, "; threads that are still running never reach the same barrier or simd operation");
            return d->error_kind = SM_ERROR_DIVERGENCE;
        }
    }
    return d->error_kind = SM_OK;
}

// `threadgroup T x[N];` in a kernel body: one allocation per threadgroup from the arena,
// shared by its threads, poisoned (0xFF) or zeroed when first reached.
static inline void* tg_var(uint32_t slot, uint64_t size, uint64_t align) {
    Lane* L = cur();
    Group* g = L->g;
    if (slot >= TG_SLOTS) runtime_error("too many threadgroup variables");
    if (!g->slot_ptr[slot]) {
        if (align < 16) align = 16;
        const uint64_t apple = (g->arena_apple + align - 1) / align * align + size;
        if (apple + g->dynamic_tg > APPLE_TG_MEMORY) {
            begin_message(g, "threadgroup memory");
            append_num(g, ": %llu bytes of threadgroup variables plus %llu bytes set by setThreadgroupMemoryLength exceed the 32768 bytes of Apple GPUs",
                       apple, g->dynamic_tg);
            fail(g, SM_ERROR_RUNTIME);
        }
        g->arena_apple = apple;
        uint64_t off = (g->arena_used + align - 1) / align * align;
#ifdef SM_CHECK_MEMORY
        off = (g->arena_used + ARENA_RED_ZONE + align - 1) / align * align;  // a red zone before each
#endif
        if (off + size > g->d->tg_static_capacity) runtime_error("threadgroup variables larger than the arena");
        g->arena_used = off + size;
        char* p = (char*)g->d->tg_static + off;
        memset(p, (g->d->flags & SM_FLAG_POISON) ? 0xff : 0, size);
        g->slot_ptr[slot] = p;
        g->slot_size[slot] = size;
#ifdef SM_CHECK_MEMORY
        check_arena_allocated(g, off, size);
#endif
    }
    return g->slot_ptr[slot];
}
}  // namespace __sm
}  // namespace metal
