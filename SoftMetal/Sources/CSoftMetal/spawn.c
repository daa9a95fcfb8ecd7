// Running the compiler: clang++ as a child process (posix_spawn) with its output to a
// file, without a time limit (csm_spawn_wait) or with one and in its own process group
// (csm_spawn_wait_limited), and the interrupt scopes that make Ctrl-C stop a compile
// (killing the group) and still reach the process's own SIGINT handler. In C because the
// SIGINT observer is a signal handler (only async-signal-safe calls) and SoftMetal does not
// import Foundation. It shares nothing with the other parts (csoftmetal_internal.h).
#if defined(__linux__)
#define _GNU_SOURCE
#include "csoftmetal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char** environ;

// MARK: the compiler --------------------------------------------------------------------

// Children of csm_spawn_wait_limited, so that a SIGINT that ends the process (SIG_DFL) can
// take their process groups with it: they are not in ours, so the terminal's Ctrl-C no
// longer reaches them.
#define MAX_CHILDREN 64
static pid_t active_children[MAX_CHILDREN];

static pthread_mutex_t interrupt_lock = PTHREAD_MUTEX_INITIALIZER;
static int interrupt_scopes;            // open scopes (under interrupt_lock)
static int interrupt_pending;           // atomic: SIGINT seen while a scope was open
static struct sigaction previous_sigint;  // what SIGINT did before the first scope opened

static void sigint_observer(int sig, siginfo_t* info, void* context) {
    int saved = errno;
    if (!(previous_sigint.sa_flags & SA_SIGINFO) && previous_sigint.sa_handler == SIG_IGN) {
        errno = saved;
        return;  // the process asked for Ctrl-C to do nothing: compiles go on
    }
    __atomic_store_n(&interrupt_pending, 1, __ATOMIC_SEQ_CST);
    if (previous_sigint.sa_flags & SA_SIGINFO) {
        if (previous_sigint.sa_sigaction) previous_sigint.sa_sigaction(sig, info, context);
    } else if (previous_sigint.sa_handler == SIG_DFL) {
        for (int i = 0; i < MAX_CHILDREN; i++) {
            pid_t pid = __atomic_load_n(&active_children[i], __ATOMIC_ACQUIRE);
            if (pid > 0) kill(-pid, SIGKILL);
        }
        sigaction(SIGINT, &previous_sigint, NULL);
        raise(SIGINT);  // delivered when this handler returns: the process ends as without us
    } else {
        previous_sigint.sa_handler(sig);
    }
    errno = saved;
}

void csm_interrupt_scope_begin(void) {
    pthread_mutex_lock(&interrupt_lock);
    if (interrupt_scopes++ == 0) {
        struct sigaction observer;
        memset(&observer, 0, sizeof observer);
        observer.sa_sigaction = sigint_observer;
        observer.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&observer.sa_mask);
        __atomic_store_n(&interrupt_pending, 0, __ATOMIC_SEQ_CST);
        struct sigaction current;
        sigaction(SIGINT, NULL, &current);
        // Never our own handler as the one to forward to (it would call itself).
        if (!((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == sigint_observer)) {
            previous_sigint = current;
            sigaction(SIGINT, &observer, NULL);
        }
    }
    pthread_mutex_unlock(&interrupt_lock);
}

void csm_interrupt_scope_end(void) {
    pthread_mutex_lock(&interrupt_lock);
    if (interrupt_scopes > 0 && --interrupt_scopes == 0) {
        struct sigaction current;
        sigaction(SIGINT, NULL, &current);
        // Someone who replaced the observer meanwhile (Python's signal.signal) keeps theirs.
        if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == sigint_observer)
            sigaction(SIGINT, &previous_sigint, NULL);
        __atomic_store_n(&interrupt_pending, 0, __ATOMIC_SEQ_CST);
    }
    pthread_mutex_unlock(&interrupt_lock);
}

int32_t csm_interrupt_pending(void) { return __atomic_load_n(&interrupt_pending, __ATOMIC_SEQ_CST); }

static int32_t exit_code(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

static int32_t spawn_child(const char* const* argv, const char* output_path, int own_group, pid_t* pid) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, output_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    if (own_group) {
        posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
        posix_spawnattr_setpgroup(&attributes, 0);
    }
    int rc = posix_spawnp(pid, argv[0], &actions, &attributes, (char* const*)argv, environ);
    posix_spawnattr_destroy(&attributes);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) {
        errno = rc;
        return -1;
    }
    return 0;
}

int32_t csm_spawn_wait(const char* const* argv, const char* output_path) {
    pid_t pid;
    if (spawn_child(argv, output_path, 0, &pid) != 0) return CSM_SPAWN_FAILED;
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) return CSM_SPAWN_FAILED;
    }
    return exit_code(status);
}

int32_t csm_spawn_wait_limited(const char* const* argv, const char* output_path, double timeout_seconds) {
    if (csm_interrupt_pending()) return CSM_SPAWN_INTERRUPTED;
    pid_t pid;
    if (spawn_child(argv, output_path, 1, &pid) != 0) return CSM_SPAWN_FAILED;
    int slot = -1;
    for (int i = 0; i < MAX_CHILDREN && slot < 0; i++) {
        pid_t expected = 0;
        if (__atomic_compare_exchange_n(&active_children[i], &expected, pid, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) slot = i;
    }
    double deadline = timeout_seconds > 0 ? csm_now() + timeout_seconds : 0;
    // A pidfd wakes the wait the moment the child ends; where the kernel has none, short
    // sleeps (growing to 20 ms) do. Either way the flags are looked at every 20 ms at most,
    // since SIGINT may be delivered to any thread, not necessarily this one.
    int pidfd = -1;
#ifdef SYS_pidfd_open
    pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
#endif
    int status = 0, reason = 0;
    long sleep_ns = 1000000;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) break;
        if (r < 0 && errno != EINTR) {
            reason = CSM_SPAWN_FAILED;
            break;
        }
        if (csm_interrupt_pending()) reason = CSM_SPAWN_INTERRUPTED;
        else if (deadline > 0 && csm_now() >= deadline) reason = CSM_SPAWN_TIMED_OUT;
        if (reason) {
            // The whole group: the driver's own children (the linker) with it.
            kill(-pid, SIGKILL);
            while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
            break;
        }
        if (pidfd >= 0) {
            struct pollfd p = {.fd = pidfd, .events = POLLIN};
            poll(&p, 1, 20);
        } else {
            struct timespec t = {0, sleep_ns};
            nanosleep(&t, NULL);
            if (sleep_ns < 20000000) sleep_ns *= 2;
        }
    }
    if (pidfd >= 0) close(pidfd);
    if (slot >= 0) __atomic_store_n(&active_children[slot], 0, __ATOMIC_RELEASE);
    return reason ? reason : exit_code(status);
}

#endif
