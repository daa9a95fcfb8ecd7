/* The CPU backend's worker threads (Linux).
 *
 * A decode call is little work split over a few stages; waking libdispatch's parked
 * workers for each stage costs a large share of such a call (docs/cpu-backend.md).
 * These workers spin for a while after each job inside a call, so its stages start
 * without a wake-up, and sleep on a futex once the call has returned (moe_cpu_pool_rest):
 * the host's own threads get the cores between calls. Knobs (read once, at the first
 * call): MOE_CPU_THREADS (the threads of a call, the caller's included; default every
 * usable core) and MOE_CPU_SPIN_US (how long workers spin after a call before sleeping;
 * default 0). Which thread runs which index never changes a result: callers split work into
 * items whose boundaries depend only on the shapes.
 */
#ifndef MOE_CPU_POOL_H
#define MOE_CPU_POOL_H

#include <stdint.h>

typedef void (*moe_cpu_pool_body)(void* context, int64_t index);

/* Runs body(context, i) for every i in [0, count) on the calling thread and the pool's
 * workers, and returns 1 when all have returned. Returns 0 without running anything when
 * the pool cannot serve this call: another thread is using it (calls may come from several
 * threads at once; a nested call from inside a body lands here too), or this platform has
 * no pool (everything but Linux). The caller then runs the loop some other way. */
__attribute__((visibility("hidden")))
int moe_cpu_pool_run(int64_t count, void* context, moe_cpu_pool_body body);

/* Wakes workers that sleep, without a job: they spin for a while, so that a job a caller
 * is about to start (after some serial work of its own) finds them awake. */
__attribute__((visibility("hidden")))
void moe_cpu_pool_prepare(void);

/* A call has returned: the host's own work comes next, so the workers go to sleep instead
 * of spinning on cores the host's threads want (after MOE_CPU_SPIN_US microseconds of
 * spinning, 0 by default). The next moe_cpu_pool_prepare or job wakes them. */
__attribute__((visibility("hidden")))
void moe_cpu_pool_rest(void);

#endif
