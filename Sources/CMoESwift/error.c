// The thread-local error slot behind moe_last_error(). It lives in C because a C
// `_Thread_local` buffer gives every thread a stable `const char*` without allocation.
#include <string.h>
#include "moe_swift.h"
#include "moe_swift_internal.h"

static _Thread_local char last_error[1024];

const char* moe_last_error(void) { return last_error; }

void moe_internal_set_error(const char* message) {
    if (message == NULL) message = "";
    strncpy(last_error, message, sizeof last_error - 1);
    last_error[sizeof last_error - 1] = '\0';
}
