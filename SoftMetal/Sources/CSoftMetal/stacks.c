// Per-thread state: each OS thread that runs kernels (csm_run, run.c) keeps its fiber
// stacks (one per GPU thread of a threadgroup, each with a guard page at its bottom,
// registered so that an overflow is reported as one), its guarded threadgroup memory and
// the runtime's scratch, made once and reused by every dispatch the thread runs, freed
// when the thread ends. Stack blocks are aligned to their power-of-two size, so that the
// runtime finds a lane's state from the stack pointer.
#if defined(__linux__)
#include "csoftmetal_internal.h"

#include <stdlib.h>
#include <sys/mman.h>

CSM_INTERNAL __thread thread_state* current_thread;
static pthread_key_t thread_key;
static pthread_once_t thread_key_once = PTHREAD_ONCE_INIT;

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

CSM_INTERNAL thread_state* get_thread_state(void) {
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

CSM_INTERNAL int ensure_stacks(thread_state* ts, uint32_t count) {
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

#endif
