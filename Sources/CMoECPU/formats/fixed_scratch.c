// The per-thread scratch in which the fixed-point products (avx512_fixed.c, avx2_fixed.c)
// prepare a call's activations, and what it holds.
#include "internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#ifdef MOE_CPU_FORMATS_X86

// Scratch for one call's prepared activations: per thread, kept between calls (a decode
// step makes a few hundred calls), freed when the thread exits. With it, the rows last
// prepared there: their key and a copy of their floats. A decode step's gate and up
// products take the same token row in every call (96 calls for 8 experts of Qwen3-30B-A3B
// in 128-row blocks), and preparing it cost a tenth of each call; comparing the floats
// costs a few hundred cycles. The copy makes the reuse exact whatever the caller did with
// its buffer in between.
static pthread_key_t fixed_scratch_key;
static pthread_once_t fixed_scratch_once = PTHREAD_ONCE_INIT;
typedef struct {
    size_t capacity;
    void* data;
    fixed_key held;        // held.rows == 0: nothing held
    float* source;         // held.rows rows of held.cols floats
    size_t source_capacity;
} fixed_scratch;

static void fixed_scratch_free(void* p) {
    fixed_scratch* s = p;
    free(s->data);
    free(s->source);
    free(s);
}
static void fixed_scratch_key_create(void) { (void)pthread_key_create(&fixed_scratch_key, fixed_scratch_free); }

static fixed_scratch* this_thread(void) {
    (void)pthread_once(&fixed_scratch_once, fixed_scratch_key_create);
    fixed_scratch* s = pthread_getspecific(fixed_scratch_key);
    if (s == NULL) {
        if ((s = calloc(1, sizeof *s)) == NULL) return NULL;
        if (pthread_setspecific(fixed_scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    return s;
}

void* moe_cpu_fixed_scratch(size_t bytes) {
    fixed_scratch* s = this_thread();
    if (s == NULL) return NULL;
    if (s->capacity < bytes) {
        free(s->data);
        s->capacity = 0;
        s->held.rows = 0;
        const size_t rounded = (bytes + 4095) & ~(size_t)4095;
        if ((s->data = aligned_alloc(64, rounded)) == NULL) return NULL;
        s->capacity = rounded;
    }
    return s->data;
}

int moe_cpu_fixed_scratch_holds(const fixed_key* key, const float* a, int64_t lda) {
    const fixed_scratch* s = this_thread();
    if (s == NULL || s->held.rows == 0 || memcmp(&s->held, key, sizeof *key) != 0) return 0;
    for (int64_t i = 0; i < key->rows; i++)
        if (memcmp(s->source + i * key->cols, a + i * lda, (size_t)key->cols * sizeof(float)) != 0) return 0;
    return 1;
}

void moe_cpu_fixed_scratch_prepared(const fixed_key* key, const float* a, int64_t lda) {
    fixed_scratch* s = this_thread();
    if (s == NULL) return;
    s->held.rows = 0;
    if (key == NULL) return;
    const size_t count = (size_t)(key->rows * key->cols);
    if (s->source_capacity < count) {
        free(s->source);
        s->source_capacity = 0;
        if ((s->source = malloc(count * sizeof(float))) == NULL) return;
        s->source_capacity = count;
    }
    for (int64_t i = 0; i < key->rows; i++)
        memcpy(s->source + i * key->cols, a + i * lda, (size_t)key->cols * sizeof(float));
    s->held = *key;
}

#endif
