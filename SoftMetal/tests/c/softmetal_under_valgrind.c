// SoftMetal's kernel harness through its C header (moe_softmetal.h): compile, launch three
// times, an out-of-bounds launch (a fault caught by the SIGSEGV handler), a memory-checked
// launch, free. Run under valgrind: no invalid access in libMoESwift, no definite leak.
#include "moe_softmetal.h"
#include <stdio.h>
#include <string.h>
int main(void) {
    const char* src = "kernel void twice(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) { y[i] = 2.0f * y[i]; }\n"
                      "kernel void oob(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) { y[i + 64] = 1.0f; }\n";
    moe_softmetal_library* lib = NULL;
    int32_t kind = 0;
    if (moe_softmetal_compile(src, &lib, &kind) != MOE_OK) { printf("compile failed %s\n", moe_last_error()); return 1; }
    float y[64];
    for (int i = 0; i < 64; i++) y[i] = (float)i;
    int32_t index = 0; void* data = y; int64_t length = sizeof y;
    moe_softmetal_launch_desc d; memset(&d, 0, sizeof d);
    d.struct_size = sizeof d; d.kernel = "twice"; d.num_buffers = 1; d.buffer_indices = &index; d.buffer_data = &data;
    d.buffer_lengths = &length; d.size[0] = 2; d.size[1] = 1; d.size[2] = 1;
    d.threads_per_threadgroup[0] = 32; d.threads_per_threadgroup[1] = 1; d.threads_per_threadgroup[2] = 1;
    d.poison_threadgroup_memory = 1;
    int failures = 0;
    for (int r = 0; r < 3; r++) if (moe_softmetal_launch(lib, &d, &kind) != MOE_OK) { printf("launch failed %s\n", moe_last_error()); failures++; }
    if (y[3] != 24.0f) { printf("wrong %f\n", y[3]); failures++; }
    d.kernel = "oob";
    if (moe_softmetal_launch(lib, &d, &kind) == MOE_OK || kind != MOE_SOFTMETAL_OUT_OF_BOUNDS) { printf("oob not caught\n"); failures++; }
    d.kernel = "twice"; d.check_memory = 1;
    if (moe_softmetal_launch(lib, &d, &kind) != MOE_OK) { printf("checked launch failed %s\n", moe_last_error()); failures++; }
    moe_softmetal_free(lib);
    printf("%d failures\n", failures);
    return failures;
}
