// ======================================================================================
// The fiber runtime
// ======================================================================================
namespace metal {
namespace __sm {
enum : uint32_t { RUNNABLE = 0, AT_BARRIER = 1, AT_SIMD = 2, DONE = 3 };
constexpr uint32_t MAX_LANES = 1024;
constexpr uint32_t TG_SLOTS = 128;
constexpr uint64_t APPLE_TG_MEMORY = 32768;
struct Group;
typedef void (*complete_fn)(Group*, uint32_t);
struct Lane {
    void* sp;            // saved stack pointer while switched out
    Group* g;
    uint32_t tid, sg, lane, state;
    uint32_t pos[3];     // thread_position_in_threadgroup
    uint32_t line;       // where it waits (MSL line)
    uint32_t next, prev; // the ring of unfinished lanes, in run order
    uint32_t rank;       // run-ahead: position in its simdgroup's block of Group::order
    const char* op;      // what it waits in
    complete_fn fn;      // which collective (with line: the place)
};
constexpr uintptr_t LANE_RESERVE = 128;
static_assert(sizeof(Lane) <= LANE_RESERVE, "Lane too large");
struct SimdState {
    uint32_t arrived, mask;
    complete_fn complete;
    alignas(64) unsigned char in[32][64];
    alignas(64) unsigned char out[32][64];
    uint32_t arg[32];
    const void* ptr[32][4];
};
struct Group {
    sm_dispatch* d;
    void (*body)(Lane*);
    void* main_sp;
    uint32_t n, live, nsg, bar_arrived, error;
    // Run-ahead schedule: on, simdgroups in reverse order, and the position (in that
    // order) of the simdgroup running now; those before it wait at the barrier or are done.
    uint32_t run_ahead, reverse_sg, ra_pos;
    uint32_t size[3], gpos[3];
    uint32_t sg_live[32];
    uint64_t arena_used, dynamic_tg;
    // For the memory check: which threadgroup (linear number + 1), the barriers it passed,
    // the simd operations each simdgroup completed, the threadgroup variables' extents and
    // their size without the check's red zones (for Apple's 32 KiB).
    uint32_t id, epoch;
    uint16_t sg_epoch[32];
    uint64_t slot_size[TG_SLOTS];
    uint64_t arena_apple;
    Lane* lanes[MAX_LANES];
    uint32_t order[MAX_LANES];
    void* slot_ptr[TG_SLOTS];
    SimdState simd[32];
};
static uintptr_t stack_size_;

__attribute__((always_inline)) static inline Lane* cur() {
    uintptr_t sp = (uintptr_t)__builtin_frame_address(0);
    return (Lane*)((sp & ~(stack_size_ - 1)) + stack_size_ - LANE_RESERVE);
}
}  // namespace __sm
}  // namespace metal

// The context switch: saves the callee-saved registers on the current stack, stores the
// stack pointer in *save, loads `to` and restores the registers saved there. The signal
// mask and the floating-point control registers are not switched (kernels don't change
// them), which is what makes it cheap: a few instructions, no system call.
extern "C" void __sm_switch(void** save, void* to) __attribute__((visibility("hidden")));
extern "C" void __sm_fiber_start() __attribute__((visibility("hidden")));
#if defined(__x86_64__)
__asm__(R"(
    .text
    .p2align 4
    .globl __sm_switch
    .hidden __sm_switch
    .type __sm_switch,@function
__sm_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size __sm_switch, .-__sm_switch
    .p2align 4
    .globl __sm_fiber_start
    .hidden __sm_fiber_start
    .type __sm_fiber_start,@function
__sm_fiber_start:
    callq *%r12
    ud2
    .size __sm_fiber_start, .-__sm_fiber_start
)");
namespace metal { namespace __sm {
// A new fiber's first switch "returns" into __sm_fiber_start with r12 = entry.
static inline void* initial_frame(void* top, void (*entry)()) {
    uintptr_t* sp = (uintptr_t*)top;  // 16-byte aligned
    *--sp = (uintptr_t)&__sm_fiber_start;
    *--sp = 0;                  // rbp
    *--sp = 0;                  // rbx
    *--sp = (uintptr_t)entry;   // r12
    *--sp = 0;                  // r13
    *--sp = 0;                  // r14
    *--sp = 0;                  // r15
    return sp;
}
}}
#elif defined(__aarch64__)
// aarch64 Linux: written to the AAPCS64 but NOT TESTED on hardware.
__asm__(R"(
    .text
    .p2align 4
    .globl __sm_switch
    .hidden __sm_switch
    .type __sm_switch,%function
__sm_switch:
    sub sp, sp, #176
    stp x19, x20, [sp, #0]
    stp x21, x22, [sp, #16]
    stp x23, x24, [sp, #32]
    stp x25, x26, [sp, #48]
    stp x27, x28, [sp, #64]
    stp x29, x30, [sp, #80]
    stp d8, d9, [sp, #96]
    stp d10, d11, [sp, #112]
    stp d12, d13, [sp, #128]
    stp d14, d15, [sp, #144]
    mov x2, sp
    str x2, [x0]
    mov sp, x1
    ldp x19, x20, [sp, #0]
    ldp x21, x22, [sp, #16]
    ldp x23, x24, [sp, #32]
    ldp x25, x26, [sp, #48]
    ldp x27, x28, [sp, #64]
    ldp x29, x30, [sp, #80]
    ldp d8, d9, [sp, #96]
    ldp d10, d11, [sp, #112]
    ldp d12, d13, [sp, #128]
    ldp d14, d15, [sp, #144]
    add sp, sp, #176
    ret
    .size __sm_switch, .-__sm_switch
    .p2align 4
    .globl __sm_fiber_start
    .hidden __sm_fiber_start
    .type __sm_fiber_start,%function
__sm_fiber_start:
    blr x19
    brk #0
    .size __sm_fiber_start, .-__sm_fiber_start
)");
namespace metal { namespace __sm {
static inline void* initial_frame(void* top, void (*entry)()) {
    uintptr_t* sp = (uintptr_t*)top - 22;  // 176 bytes
    for (int i = 0; i < 22; i++) sp[i] = 0;
    sp[0] = (uintptr_t)entry;              // x19
    sp[11] = (uintptr_t)&__sm_fiber_start; // x30
    return sp;
}
}}
#else
#error "SoftMetal fibers: only x86_64 and aarch64"
#endif
