/* moe_softmetal.h - the C ABI of SoftMetal's kernel harness, exported by libMoESwift
 * beside the layer's ABI (moe_swift.h): compile MSL source and launch one kernel on
 * SoftMetal, the software Metal device. Used by the Python harness moe_swift.softmetal
 * (its cffi declarations are read from the CFFI-BEGIN/CFFI-END section below). Not part
 * of the MoE layer's ABI: a program that runs layers needs only moe_swift.h. */
#ifndef MOE_SOFTMETAL_H
#define MOE_SOFTMETAL_H

#include "moe_swift.h"

#ifdef __cplusplus
extern "C" {
#endif

/* CFFI-BEGIN */

/* SoftMetal's checks apply (guard pages, threadgroup-memory poisoning, barrier
 * divergence, the optional race and memory checks). On platforms without SoftMetal every function
 * returns MOE_ERROR_UNAVAILABLE. A failure returns MOE_ERROR_INVALID_ARGUMENT (or another
 * status) and, when error_kind is not NULL, stores a moe_softmetal_error there. */

typedef enum moe_softmetal_error {
    MOE_SOFTMETAL_OK = 0,
    MOE_SOFTMETAL_COMPILE = 1,             /* translation or clang++ error */
    MOE_SOFTMETAL_OUT_OF_BOUNDS = 2,       /* a guard page was touched, or check_memory saw an access outside */
    MOE_SOFTMETAL_BARRIER_DIVERGENCE = 3,  /* barrier / simd divergence or deadlock */
    MOE_SOFTMETAL_RACE = 4,                /* results depend on execution order, or unordered accesses */
    MOE_SOFTMETAL_INVALID_USAGE = 5,       /* unbound buffer, bad sizes, unknown kernel */
    MOE_SOFTMETAL_RUNTIME = 6,             /* another failure while running */
    MOE_SOFTMETAL_UNINITIALIZED_READ = 7   /* check_memory: threadgroup memory read before any write */
} moe_softmetal_error;

typedef struct moe_softmetal_library moe_softmetal_library;  /* opaque */

typedef struct moe_softmetal_launch_desc {
    uint32_t struct_size;                  /* sizeof(moe_softmetal_launch_desc) */
    const char* kernel;
    int32_t num_buffers;
    const int32_t* buffer_indices;         /* [[buffer(i)]] of each buffer */
    void* const* buffer_data;              /* copied into guarded buffers, and back after;
                                              entries whose byte ranges overlap (one array at
                                              several indices, overlapping views) share one
                                              buffer, each bound at its offset in it, as one
                                              MTLBuffer bound twice is: same addresses */
    const int64_t* buffer_lengths;         /* bytes */
    const int32_t* buffer_write_back;      /* 0: input only (not copied back); NULL: all 1 */
    int32_t num_threadgroup_memory;
    const int32_t* threadgroup_memory_indices;
    const int64_t* threadgroup_memory_lengths;  /* multiples of 16 */
    int32_t mode;                          /* 0: dispatchThreadgroups(size), 1: dispatchThreads(size),
                                              2: dispatchThreadgroups(indirectBuffer:) */
    uint32_t size[3];
    uint32_t threads_per_threadgroup[3];
    const void* indirect_data;             /* mode 2: the MTLDispatchThreadgroupsIndirectArguments buffer */
    int64_t indirect_length;
    int64_t indirect_offset;
    int32_t check_races;                   /* the race detector: the memory check's build reporting data
                                              races on shadow memory (both threads, both MSL lines) and
                                              out-of-bounds accesses, not unwritten reads */
    int32_t poison_threadgroup_memory;     /* fill threadgroup memory with 0xFF first */
    double seconds;                        /* out: time from commit to completion */
    int32_t check_memory;                  /* every access checked: bounds, races on shadow memory,
                                              reads of unwritten threadgroup memory */
    int32_t num_constants;                 /* function constants: the kernel is specialised for them
                                              (makeFunction(name:constantValues:)) */
    const int32_t* constant_indices;       /* [[function_constant(i)]] of each, or -1: by name */
    const char* const* constant_names;     /* used where the index is -1 */
    const double* constant_values;         /* converted to each constant's declared type (bool:
                                              != 0); must be exact in it */
    int32_t schedule;                      /* how simdgroups interleave between threadgroup barriers:
                                              0 round robin; 1 run-ahead: each simdgroup runs to its
                                              next barrier before the next starts, in forward then in
                                              reverse order, results compared (MOE_SOFTMETAL_RACE);
                                              2 run-ahead forward only; 3 run-ahead reverse only */
    int32_t stale_reads;                   /* with the memory check (turns it on): a read of device memory
                                              that another threadgroup wrote, unordered by Apple's
                                              memory model, gets the bytes the dispatch began with
                                              instead of an error. A struct_size without this field
                                              means 0. */
    int32_t check_division;                /* an integer division by zero (or INT_MIN / -1) fails the
                                              launch; without it the result is x / 0 = 0, x % 0 = x
                                              (check_memory includes this check) */
    int32_t check_order;                   /* run again with threads and threadgroups permuted and compare
                                              every bound buffer (MOE_SOFTMETAL_RACE if one differs): finds
                                              results that depend on the order of atomics. A struct_size
                                              without this field means 0. */
} moe_softmetal_launch_desc;

/* Translates and compiles MSL source (cached on disk) into *out. */
moe_status moe_softmetal_compile(const char* source, moe_softmetal_library** out, int32_t* error_kind);

/* Preprocessor options of moe_softmetal_compile_with_options (Apple's MTLCompileOptions
 * preprocessorMacros and languageVersion, plus include directories, which only SoftMetal has). */
typedef struct moe_softmetal_compile_options {
    uint32_t struct_size;                  /* sizeof(moe_softmetal_compile_options) */
    int32_t num_include_dirs;
    const char* const* include_dirs;       /* -I: searched after the including file's directory */
    int32_t num_defines;
    const char* const* define_names;
    const char* const* define_values;      /* -Dname=value; NULL array or NULL entry: "1" */
    int32_t metal_version;                 /* __METAL_VERSION__: 200...320 (e.g. 310 = MSL 3.1); 0: 310 */
    double compile_timeout;                /* seconds each clang++ run may take before it is stopped
                                              (a compile error); 0: $SOFTMETAL_COMPILE_TIMEOUT or 600.
                                              Callers built before this field existed pass a smaller
                                              struct_size and get the default. */
} moe_softmetal_compile_options;

/* moe_softmetal_compile with preprocessor options (options may be NULL). */
moe_status moe_softmetal_compile_with_options(const char* source, const moe_softmetal_compile_options* options,
                                              moe_softmetal_library** out, int32_t* error_kind);

/* Runs one dispatch of desc->kernel and waits for it. */
moe_status moe_softmetal_launch(moe_softmetal_library* library, moe_softmetal_launch_desc* desc,
                                int32_t* error_kind);

/* The cost of one fiber switch in ns, measured with the library's context switch. */
moe_status moe_softmetal_fiber_switch_ns(moe_softmetal_library* library, int64_t iterations, double* out);

/* Frees the library handle. NULL is ignored. */
void moe_softmetal_free(moe_softmetal_library* library);

/* CFFI-END */

#ifdef __cplusplus
}
#endif

#endif /* MOE_SOFTMETAL_H */
