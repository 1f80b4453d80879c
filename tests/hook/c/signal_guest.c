/* What C runtimes and libraries loaded into a trainer do with signals, for
 * tests/hook/test_signals.py (docs/trainer.md, "Signals"): each function is called from the
 * training script through ctypes, before or after trainprof.Profiler() starts, and the same
 * script runs without trainprof for the baseline. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* ---- a runtime that uses SIGSEGV in normal operation (a JVM, Boehm GC, wasm bounds traps):
 * it maps a PROT_NONE page, catches the fault, makes the page writable and returns, so that
 * the faulting write runs again and succeeds. */

static volatile char *guard_page;
static volatile int faults_fixed;
static volatile int last_code = -1000;
static volatile int gives_back;

static void runtime_segv(int sig, siginfo_t *info, void *ctx) {
    (void)ctx;
    char *addr = (char *)info->si_addr;
    last_code = info->si_code;
    if (!gives_back && guard_page && addr >= (char *)guard_page && addr < (char *)guard_page + 4096) {
        mprotect((void *)guard_page, 4096, PROT_READ | PROT_WRITE);
        faults_fixed++;
        return;
    }
    /* Not ours: give the fault back (the default action, then return: the write runs again
     * and the process dies of it), as runtimes do for a fault outside their pages. */
    signal(sig, SIG_DFL);
}

/* Installs the runtime's SIGSEGV handler; with give_back, every fault is given back. */
int runtime_install(int give_back) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = runtime_segv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    gives_back = give_back;
    return sigaction(SIGSEGV, &sa, NULL);
}

/* Maps the guard page and writes to it once; returns the byte read back (42 when the runtime
 * fixed the page). */
int runtime_touch(void) {
    void *p = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return -1;
    guard_page = p;
    guard_page[7] = 42;
    return guard_page[7];
}

int runtime_faults_fixed(void) { return faults_fixed; }

/* The guard page protected again and written n times: n faults, each fixed by the runtime's
 * handler (bench/signal_fault_cost.py times it); the faults fixed. */
int runtime_fault_loop(int n) {
    if (!guard_page) runtime_touch();
    for (int i = 0; i < n; i++) {
        mprotect((void *)guard_page, 4096, PROT_NONE);
        guard_page[i & 4095] = 1;
    }
    return faults_fixed;
}
/* The si_code the runtime's handler last saw (SEGV_ACCERR = 2 for a real fault; SI_TKILL
 * = -6 for a raise()d copy). */
int runtime_last_code(void) { return last_code; }

/* ---- a runtime that leaves its SIGSEGV handler by siglongjmp (wasm traps, libsigsegv's
 * stack-overflow recovery): installed with SA_NODEFER, jumping back without restoring a mask,
 * so a signal mask left behind by anyone would make the next fault fatal. */

static sigjmp_buf trap_env;

static void trap(int sig, siginfo_t *info, void *ctx) {
    (void)sig;
    (void)info;
    (void)ctx;
    siglongjmp(trap_env, 1);
}

int jumper_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = trap;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGSEGV, &sa, NULL);
}

/* Writes to a PROT_NONE page `times` times, each trapped; the traps counted. */
int jumper_trap(int times) {
    volatile char *p = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return -1;
    volatile int trapped = 0;
    for (int i = 0; i < times; i++) {
        if (sigsetjmp(trap_env, 0) == 0) {
            p[1] = 1;
        } else {
            trapped++;
        }
    }
    return trapped;
}

/* ---- a library ticking a POSIX timer on a real-time signal with its own handler ---------- */

static volatile int ticks;
static void tick(int sig) {
    (void)sig;
    ticks++;
}

/* Installs the tick handler on SIGRTMIN + offset and starts a timer every interval_ms. */
int ticker_start(int offset, int interval_ms) {
    int sig = SIGRTMIN + offset;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = tick;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(sig, &sa, NULL) != 0) return -1;
    struct sigevent sev;
    memset(&sev, 0, sizeof sev);
    sev.sigev_notify = SIGEV_SIGNAL;
    sev.sigev_signo = sig;
    timer_t t;
    if (timer_create(CLOCK_MONOTONIC, &sev, &t) != 0) return -2;
    struct itimerspec its;
    memset(&its, 0, sizeof its);
    its.it_interval.tv_nsec = interval_ms * 1000000L;
    its.it_value.tv_nsec = interval_ms * 1000000L;
    return timer_settime(t, 0, &its, NULL);
}

int ticker_ticks(void) { return ticks; }

/* 1 while the tick handler is still the one installed on SIGRTMIN + offset. */
int ticker_handler_installed(int offset) {
    struct sigaction sa;
    if (sigaction(SIGRTMIN + offset, NULL, &sa) != 0) return -1;
    return sa.sa_handler == tick;
}

/* ---- a handler counting its calls, installed on any signal -------------------------------- */

static volatile int counted[65];
static void count(int sig) {
    if (sig > 0 && sig < 65) counted[sig]++;
}

/* Installs the counting handler on SIGRTMIN + offset (offset >= 0) or SIGRTMAX + offset
 * (offset < 0); returns the signal number. */
int counter_install(int offset) {
    int sig = offset >= 0 ? SIGRTMIN + offset : SIGRTMAX + offset;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = count;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    return sigaction(sig, &sa, NULL) == 0 ? sig : -1;
}

int counter_calls(int sig) { return sig > 0 && sig < 65 ? counted[sig] : -1; }

/* ---- a library that borrows SIGINT around a blocking call (readline's way): its own handler
 * for a while, then the saved disposition put back exactly. */

static volatile int borrowed_calls;
static void borrowed(int sig) {
    (void)sig;
    borrowed_calls++;
}

int sigint_borrow(int ms) {
    struct sigaction sa, saved;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = borrowed;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGINT, &sa, &saved) != 0) return -1;
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
    return sigaction(SIGINT, &saved, NULL);
}

int sigint_borrowed_calls(void) { return borrowed_calls; }

/* ---- a one-shot SIGTERM handler with a mask ------------------------------------------------ */

static volatile int oneshot_calls;
static volatile int oneshot_saw_mask = -1;
static void oneshot(int sig) {
    (void)sig;
    sigset_t now;
    pthread_sigmask(SIG_BLOCK, NULL, &now);
    oneshot_saw_mask = sigismember(&now, SIGUSR2);
    oneshot_calls++;
}

/* SIGTERM handled once (SA_RESETHAND: a second SIGTERM kills), with SIGUSR2 blocked while
 * the handler runs. */
int oneshot_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = oneshot;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGUSR2);
    return sigaction(SIGTERM, &sa, NULL);
}

int oneshot_calls_n(void) { return oneshot_calls; }
/* 1 when SIGUSR2 was blocked while the handler ran, 0 when not, -1 before it ran. */
int oneshot_mask_seen(void) { return oneshot_saw_mask; }
