/* A plain C program with no trainprof calls that replaces itself (or a forked child) with
 * another program while a native window samples it (tests/hook/test_native.py, under
 * LD_PRELOAD + TRAINPROF_AUTOSTART).
 *
 *   exec_in_window exec|fork PROGRAM ARGS...
 *
 * Waits (up to 60 s) until the window has installed its SIGPROF handler, burns 0.3 s of
 * CPU inside it (the sampling timers run), then with `exec` calls execv(PROGRAM, ARGS)
 * itself; with `fork` a child does, the parent waits and exits with the child's status
 * (128 + the signal if a signal ended it). LD_PRELOAD is dropped first, so that the new
 * program runs without the hook: whatever happens to it comes from what exec kept. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) unsigned long trainprof_exec_burn(unsigned long n) {
    volatile unsigned long acc = 0;
    for (unsigned long i = 0; i < n; i++) acc = acc * 6364136223846793005UL + i;
    return acc;
}

static int window_open(void) {
    struct sigaction sa;
    if (sigaction(SIGPROF, NULL, &sa) != 0) return 0;
    return sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: exec_in_window exec|fork PROGRAM ARGS...\n");
        return 2;
    }
    for (int i = 0; i < 6000 && !window_open(); i++) usleep(10000);
    if (!window_open()) {
        fprintf(stderr, "exec_in_window: no window opened\n");
        return 3;
    }
    double end = cpu_now() + 0.3;
    while (cpu_now() < end) trainprof_exec_burn(100000);
    unsetenv("LD_PRELOAD");
    fflush(NULL);
    if (strcmp(argv[1], "fork") == 0) {
        pid_t pid = fork();
        if (pid == 0) {
            execv(argv[2], argv + 2);
            _exit(4);
        }
        int status = 0;
        if (pid < 0 || waitpid(pid, &status, 0) != pid) return 5;
        printf("child %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    execv(argv[2], argv + 2);
    perror("execv");
    return 4;
}
