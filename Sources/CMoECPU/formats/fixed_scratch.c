// The per-thread scratch in which the fixed-point products (avx512_fixed.c, avx2_fixed.c)
// prepare a call's activations.
#include "internal.h"

#include <pthread.h>
#include <stdlib.h>

#ifdef MOE_CPU_FORMATS_X86

// Scratch for one call's prepared activations: per thread, kept between calls (a decode
// step makes a few hundred calls), freed when the thread exits.
static pthread_key_t fixed_scratch_key;
static pthread_once_t fixed_scratch_once = PTHREAD_ONCE_INIT;
typedef struct {
    size_t capacity;
    void* data;
} fixed_scratch;

static void fixed_scratch_free(void* p) {
    fixed_scratch* s = p;
    free(s->data);
    free(s);
}
static void fixed_scratch_key_create(void) { (void)pthread_key_create(&fixed_scratch_key, fixed_scratch_free); }

void* moe_cpu_fixed_scratch(size_t bytes) {
    (void)pthread_once(&fixed_scratch_once, fixed_scratch_key_create);
    fixed_scratch* s = pthread_getspecific(fixed_scratch_key);
    if (s == NULL) {
        if ((s = calloc(1, sizeof *s)) == NULL) return NULL;
        if (pthread_setspecific(fixed_scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (s->capacity < bytes) {
        free(s->data);
        s->capacity = 0;
        const size_t rounded = (bytes + 4095) & ~(size_t)4095;
        if ((s->data = aligned_alloc(64, rounded)) == NULL) return NULL;
        s->capacity = rounded;
    }
    return s->data;
}

#endif
