// The thread-local statistics behind moe_last_stats(): the Swift backends count what a
// call did (dispatches, command buffers, waits, device allocations) in the calling
// thread's slot, which each call resets first.
#include <string.h>
#include "moe_swift.h"
#include "moe_swift_internal.h"

static _Thread_local moe_stats last_stats = { sizeof(moe_stats), -1, 0, 0, 0, 0, 0, 0, 0 };

moe_stats* moe_internal_stats(void) { return &last_stats; }

moe_status moe_last_stats(moe_stats* out) {
    if (out == NULL) {
        moe_internal_set_error("out is NULL");
        return MOE_ERROR_INVALID_ARGUMENT;
    }
    uint32_t size = out->struct_size;
    if (size < 2 * sizeof(uint32_t)) {
        moe_internal_set_error("out->struct_size must be set to sizeof(moe_stats) first");
        return MOE_ERROR_INVALID_ARGUMENT;
    }
    if (size > sizeof(moe_stats)) size = sizeof(moe_stats);
    moe_stats copy = last_stats;
    copy.struct_size = out->struct_size;
    memcpy(out, &copy, size);
    return MOE_OK;
}
