// The thread-local error slot behind moe_last_error(). It lives in C because a C
// `_Thread_local` pointer gives every thread a stable `const char*` that stays valid until
// the thread's next failing call. The whole message is kept (a compiler's output can be
// long); the buffer grows as needed and is freed when the thread exits.
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "moe_swift.h"
#include "moe_swift_internal.h"

static _Thread_local char* last_error;
static _Thread_local size_t capacity;
static pthread_key_t free_at_exit;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

static void make_key(void) { pthread_key_create(&free_at_exit, free); }

const char* moe_last_error(void) { return last_error ? last_error : ""; }

void moe_internal_set_error(const char* message) {
    if (message == NULL) message = "";
    const size_t length = strlen(message);
    if (length + 1 > capacity) {
        char* grown = realloc(last_error, length + 1);
        if (grown == NULL) {
            // Keep what fits: an error message must not fail.
            if (last_error == NULL) return;
            memcpy(last_error, message, capacity - 1);
            last_error[capacity - 1] = '\0';
            return;
        }
        last_error = grown;
        capacity = length + 1;
        pthread_once(&key_once, make_key);
        pthread_setspecific(free_at_exit, last_error);
    }
    memcpy(last_error, message, length + 1);
}
