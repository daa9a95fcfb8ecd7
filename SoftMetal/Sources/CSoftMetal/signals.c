// The signal handlers: a SIGSEGV or SIGBUS in kernel code (a guard page, a stack's guard
// page, a wild address) and a SIGFPE, SIGILL or SIGTRAP (integer division traps,
// __builtin_trap) stop the kernel and jump back to csm_run (run.c) with the fault
// recorded, instead of ending the process; an integer division by zero or INT_MIN / -1
// gets the value Apple's CPUs give, as a GPU does not trap, unless the division check is
// on (SM_FLAG_CHECK_DIVISION). Faults outside kernel code go on to the handler installed
// before SoftMetal's (Python's faulthandler, or the default action).
// Also the queries of the last fault (csm_fault_*) and the alternate signal stack.
#if defined(__linux__)
#include "csoftmetal_internal.h"

#include <dlfcn.h>
#include <string.h>
#include <sys/mman.h>

// MARK: the SIGSEGV handler -------------------------------------------------------------

// The handlers that were installed before SoftMetal's, per signal, to chain to.
static struct sigaction previous_segv, previous_bus, previous_fpe, previous_ill, previous_trap;

static struct sigaction* previous_for(int sig) {
    switch (sig) {
    case SIGBUS: return &previous_bus;
    case SIGFPE: return &previous_fpe;
    case SIGILL: return &previous_ill;
    case SIGTRAP: return &previous_trap;
    default: return &previous_segv;
    }
}

static void chain(int sig, siginfo_t* info, void* context) {
    struct sigaction* prev = previous_for(sig);
    if ((prev->sa_flags & SA_SIGINFO) && prev->sa_sigaction) {
        prev->sa_sigaction(sig, info, context);
    } else if (prev->sa_handler != SIG_DFL && prev->sa_handler != SIG_IGN && prev->sa_handler != NULL) {
        prev->sa_handler(sig);
    } else {
        // Not ours: the default action, as if SoftMetal were not there (the faulting
        // instruction runs again and the process ends with this signal).
        signal(sig, SIG_DFL);
    }
}

// MARK: integer division as a GPU does it
// x86's div and idiv trap (#DE, SIGFPE) on a zero divisor and on INT_MIN / -1; a GPU does
// not, and real kernels compute such quotients and never use them (ggml's soft_max takes
// `i % ne12` with ne12 = 0 when it has no mask). Apple does not document what its GPUs
// give; SoftMetal gives what Apple's CPUs (AArch64 UDIV/SDIV) give, so that the same
// kernel computes the same on an x86 and an arm64 host: x / 0 = 0, x % 0 = x,
// INT_MIN / -1 = INT_MIN, INT_MIN % -1 = 0. The handler decodes the faulting instruction
// (F6/F7 with ModRM reg 6 or 7), writes those results to rax/rdx (al/ah for 8 bits) and
// resumes after it.
#if defined(__x86_64__)
#include <ucontext.h>

static const int gpr_of[16] = {REG_RAX, REG_RCX, REG_RDX, REG_RBX, REG_RSP, REG_RBP, REG_RSI, REG_RDI,
                               REG_R8, REG_R9, REG_R10, REG_R11, REG_R12, REG_R13, REG_R14, REG_R15};

static int emulate_division(ucontext_t* uc) {
    greg_t* r = uc->uc_mcontext.gregs;
    const uint8_t* p = (const uint8_t*)r[REG_RIP];
    int opsize16 = 0, rex = 0, n = 0;
    for (;; n++) {  // legacy prefixes
        uint8_t b = p[n];
        if (b == 0x66) opsize16 = 1;
        else if (!(b == 0x67 || b == 0xF0 || b == 0xF2 || b == 0xF3 || b == 0x2E || b == 0x36 ||
                   b == 0x3E || b == 0x26 || b == 0x64 || b == 0x65)) break;
        if (n > 4) return 0;
    }
    if ((p[n] & 0xF0) == 0x40) rex = p[n++];
    uint8_t op = p[n++];
    if (op != 0xF6 && op != 0xF7) return 0;
    uint8_t modrm = p[n++];
    int mod = modrm >> 6, reg = (modrm >> 3) & 7, rm = modrm & 7;
    if (reg != 6 && reg != 7) return 0;
    int is_signed = reg == 7;
    int bits = op == 0xF6 ? 8 : (rex & 8) ? 64 : opsize16 ? 16 : 32;
    uint64_t divisor;
    uint64_t mask = bits == 64 ? ~0ull : (1ull << bits) - 1;
    if (mod == 3) {
        int index = rm | ((rex & 1) << 3);
        if (bits == 8 && !rex && rm >= 4) divisor = ((uint64_t)r[gpr_of[rm - 4]] >> 8) & 0xFF;  // ah ch dh bh
        else divisor = (uint64_t)r[gpr_of[index]] & mask;
    } else {
        uint64_t address = 0;
        int has_sib = rm == 4;
        uint8_t sib = has_sib ? p[n++] : 0;
        int base = has_sib ? (sib & 7) : rm;
        int rip_relative = !has_sib && mod == 0 && rm == 5;
        int32_t disp = 0;
        int disp_size = mod == 1 ? 1 : mod == 2 ? 4 : (rip_relative || (has_sib && mod == 0 && base == 5)) ? 4 : 0;
        if (disp_size == 1) disp = (int8_t)p[n];
        else if (disp_size == 4) memcpy(&disp, p + n, 4);
        n += disp_size;
        if (rip_relative) {
            address = (uint64_t)r[REG_RIP] + (uint64_t)n + (uint64_t)(int64_t)disp;
        } else {
            if (!(has_sib && mod == 0 && base == 5)) address = (uint64_t)r[gpr_of[base | ((rex & 1) << 3)]];
            if (has_sib) {
                int index = ((sib >> 3) & 7) | ((rex & 2) << 2);
                if (index != 4) address += (uint64_t)r[gpr_of[index]] << (sib >> 6);
            }
            address += (uint64_t)(int64_t)disp;
        }
        divisor = 0;
        memcpy(&divisor, (const void*)(uintptr_t)address, (size_t)(bits / 8));
    }
    // The dividend as the C code has it: the low half of dx:ax (sign- or zero-extended there).
    uint64_t dividend = bits == 8 ? (uint64_t)r[REG_RAX] & 0xFF : (uint64_t)r[REG_RAX] & mask;
    uint64_t quotient, remainder;
    if (divisor == 0) {
        quotient = 0;
        remainder = dividend;
    } else if (is_signed && divisor == mask) {  // INT_MIN / -1 (the only other #DE a compiler's code meets)
        quotient = dividend;
        remainder = 0;
    } else {
        return 0;  // a quotient too wide for its register: not code a compiler makes
    }
    if (bits == 8) {
        r[REG_RAX] = (greg_t)(((uint64_t)r[REG_RAX] & ~0xFFFFull) | (remainder << 8) | quotient);
    } else if (bits == 16) {
        r[REG_RAX] = (greg_t)(((uint64_t)r[REG_RAX] & ~0xFFFFull) | quotient);
        r[REG_RDX] = (greg_t)(((uint64_t)r[REG_RDX] & ~0xFFFFull) | remainder);
    } else {  // a 32-bit result zero-extends into the 64-bit register, as the instruction would
        r[REG_RAX] = (greg_t)quotient;
        r[REG_RDX] = (greg_t)remainder;
    }
    r[REG_RIP] += n;
    return 1;
}
#else
static int emulate_division(void* uc) { (void)uc; return 0; }
#endif

static void on_fault(int sig, siginfo_t* info, void* context) {
    thread_state* ts = current_thread;
    if (ts && ts->running && sig == SIGFPE && !ts->check_division && emulate_division(context)) return;
    if (ts && ts->running && (sig == SIGFPE || sig == SIGILL || sig == SIGTRAP)) {
        // Integer division by zero or INT_MIN / -1, __builtin_trap(), a breakpoint: on a
        // GPU these give garbage or stop the kernel; here the kernel is stopped and the
        // dispatch reports it, instead of the signal ending the process.
        ts->fault_address = (uintptr_t)info->si_addr;
        ts->fault_signal = sig;
        ts->fault_code = info->si_code;
        ts->running = 0;
        siglongjmp(ts->jmp, SM_ERROR_TRAP);
    }
    if (ts && ts->running) {
        uintptr_t address = (uintptr_t)info->si_addr;
        int i = registry_find(address);
        if (i >= 0) {
            ts->fault_address = address;
            ts->fault_start = registry[i].data;
            ts->fault_length = registry[i].length;
            ts->fault_tag = registry[i].tag;
            ts->fault_kind = registry[i].kind;
            ts->running = 0;
            siglongjmp(ts->jmp, registry[i].kind == KIND_STACKS ? SM_ERROR_STACK_OVERFLOW : SM_ERROR_OUT_OF_BOUNDS);
        }
        // A fault elsewhere while this thread runs kernel code: a wild address (an index
        // far out of range, e.g. read from poisoned memory) or a misaligned vector access.
        // The kernel holds no locks, so it is stopped and reported like a guard-page fault.
        ts->fault_address = address;
        ts->fault_start = 0;
        ts->fault_length = 0;
        ts->fault_tag = 0;
        ts->fault_kind = 0;
        ts->running = 0;
        siglongjmp(ts->jmp, SM_ERROR_OUT_OF_BOUNDS);
    }
    chain(sig, info, context);
}

static pthread_mutex_t handler_lock = PTHREAD_MUTEX_INITIALIZER;

// (Re)installs the handler for one signal if another one replaced it since (e.g. Python's
// faulthandler enabled later), keeping the replacement as the one to chain to. Never
// records itself as the previous handler.
static void install_one(int sig, struct sigaction* previous) {
    struct sigaction current;
    if (sigaction(sig, NULL, &current) != 0) return;
    if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_fault) return;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_fault;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    struct sigaction old;
    if (sigaction(sig, &action, &old) == 0) *previous = old;
}

// Called at every csm_run: one sigaction query per signal (a system call) keeps the handler in
// place while kernels run even if someone else installed a handler after SoftMetal.
CSM_INTERNAL void install_handler(void) {
    pthread_mutex_lock(&handler_lock);
    install_one(SIGSEGV, &previous_segv);
    install_one(SIGBUS, &previous_bus);
    install_one(SIGFPE, &previous_fpe);
    install_one(SIGILL, &previous_ill);
    install_one(SIGTRAP, &previous_trap);
    static int watchdog_installed;
    if (!watchdog_installed && csm_timeout_seconds() > 0) {
        struct sigaction action;
        memset(&action, 0, sizeof action);
        action.sa_sigaction = on_watchdog;
        action.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&action.sa_mask);
        sigaction(WATCHDOG_SIGNAL, &action, NULL);
        watchdog_installed = 1;
    }
    pthread_mutex_unlock(&handler_lock);
    if (csm_timeout_seconds() > 0) start_watchdog_once();
}

CSM_INTERNAL void ensure_altstack(thread_state* ts) {
    if (ts->altstack_done) return;
    ts->altstack_done = 1;
    stack_t old;
    if (sigaltstack(NULL, &old) == 0 && !(old.ss_flags & SS_DISABLE) && old.ss_size >= 16384) return;
    size_t size = 64 * 1024;
    void* mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return;
    stack_t ss = {.ss_sp = mem, .ss_size = size, .ss_flags = 0};
    sigaltstack(&ss, NULL);  // kept for the thread's life
}

uintptr_t csm_fault_address(void) { return current_thread ? current_thread->fault_address : 0; }
uintptr_t csm_fault_region_start(void) { return current_thread ? current_thread->fault_start : 0; }
uintptr_t csm_fault_region_length(void) { return current_thread ? current_thread->fault_length : 0; }
int32_t csm_fault_region_tag(void) { return current_thread ? current_thread->fault_tag : 0; }
const char* csm_code_object(uintptr_t address, uintptr_t* base) {
    Dl_info info;
    if (!dladdr((void*)address, &info) || !info.dli_fname) return NULL;
    *base = (uintptr_t)info.dli_fbase;
    return info.dli_fname;
}
int32_t csm_fault_signal(void) { return current_thread ? current_thread->fault_signal : 0; }
int32_t csm_fault_code(void) { return current_thread ? current_thread->fault_code : 0; }

#endif
