/* Library-internal helpers implemented in C; not part of the public ABI. */
#ifndef MOE_SWIFT_INTERNAL_H
#define MOE_SWIFT_INTERNAL_H

#include "moe_swift.h"

/* Stores message (copied, truncated to 1023 bytes) as the calling thread's last error. */
void moe_internal_set_error(const char* message);

/* The calling thread's statistics slot behind moe_last_stats() (reset by each call). */
moe_stats* moe_internal_stats(void);

/* Brackets every exported call that runs work: at process exit, an atexit handler waits
 * for the calls in flight before the libraries' destructors run (exit.c). */
void moe_internal_call_begin(void);
void moe_internal_call_end(void);

#endif
