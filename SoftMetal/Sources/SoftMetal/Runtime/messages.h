namespace metal {
namespace __sm {

// ---- messages ----
static inline void appendf(Group* g, const char* text) {
    sm_dispatch* d = g->d;
    if (!d->error || !d->error_capacity) return;
    size_t len = 0;
    while (len < d->error_capacity && d->error[len]) len++;
    if (len + 1 >= d->error_capacity) return;
    snprintf(d->error + len, d->error_capacity - len, "%s", text);
}
static inline void append_num(Group* g, const char* fmt, uint64_t a, uint64_t b = 0, uint64_t c = 0) {
    char tmp[160];
    snprintf(tmp, sizeof tmp, fmt, (unsigned long long)a, (unsigned long long)b, (unsigned long long)c);
    appendf(g, tmp);
}
static inline void begin_message(Group* g, const char* what) {
    g->d->error[0] = 0;
    appendf(g, "kernel ");
    appendf(g, g->d->kernel_name ? g->d->kernel_name : "?");
    appendf(g, ": ");
    appendf(g, what);
    append_num(g, " in threadgroup (%llu, %llu, %llu)", g->gpos[0], g->gpos[1], g->gpos[2]);
}
// Appends "lanes 0-15, 17" for the lanes whose predicate holds.
template <class P> static inline void append_lanes(Group* g, P pred) {
    bool any = false;
    uint32_t t = 0;
    int printed = 0;
    while (t < g->n) {
        if (!pred(g->lanes[t])) { t++; continue; }
        uint32_t e = t;
        while (e + 1 < g->n && pred(g->lanes[e + 1])) e++;
        if (printed++ == 8) { appendf(g, ", ..."); break; }
        appendf(g, any ? ", " : "threads ");
        if (e == t) append_num(g, "%llu", t);
        else append_num(g, "%llu-%llu", t, e);
        any = true;
        t = e + 1;
    }
}
// Leaves the threadgroup: back to the dispatch loop, which returns `kind`.
[[noreturn]] static inline void fail(Group* g, uint32_t kind) {
    g->error = kind;
    Lane* L = cur();
    __sm_switch(&L->sp, g->main_sp);
    __builtin_trap();
}
[[noreturn]] static inline void runtime_error(const char* what) {
    Group* g = cur()->g;
    begin_message(g, what);
    fail(g, SM_ERROR_RUNTIME);
}
}  // namespace __sm
}  // namespace metal
