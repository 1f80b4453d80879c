/*
 * fork() while the hook runs: the children must be inert and must not touch the
 * parent's files, and the parent must lose nothing.
 *
 * Run by hook-ffi/tests/abi.rs as `fork <children> <child_ms>` with SMPROFILER_CONFIG_PATH
 * set. The parent records events from its main thread and from a second thread that
 * never stops while the children are forked (so the queue, the name table and the window
 * lock may be in use at fork time). Every child calls every export in a loop for
 * <child_ms> ms, expects TRAINPROF_STATUS_FORKED_CHILD from each status-returning one,
 * and leaves with exit(0), so that the library's atexit handler runs in the child too.
 * Child 0 also forks a grandchild that does the same.
 *
 * Exit codes of a child: 0 all good; 10 + n an unexpected result from check n (printed
 * to stderr). A deadlock is ended by SIGALRM. The parent prints `key=value` lines and
 * exits 1 when anything went wrong.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "trainprof_hook.h"

#define MAX_CHILDREN 64

static uint32_t phase_id, parent_name, thread_name;

/* Events the parent's threads had accepted (OK) or were told were dropped (DROPPED). */
static atomic_long accepted = 0;
static atomic_long dropped = 0;
static atomic_int parent_errors = 0;
static atomic_int stop_thread = 0;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Counts what the library did with an event recorded in the parent. */
static void count(TrainprofStatus st, const char *what) {
    if (st == TRAINPROF_STATUS_OK) {
        atomic_fetch_add(&accepted, 1);
    } else if (st == TRAINPROF_STATUS_DROPPED) {
        atomic_fetch_add(&dropped, 1);
    } else {
        fprintf(stderr, "FAIL parent: %s returned %d\n", what, (int)st);
        atomic_fetch_add(&parent_errors, 1);
    }
}

static void expect_parent(TrainprofStatus st, TrainprofStatus want, const char *what) {
    if (st != want) {
        fprintf(stderr, "FAIL parent: %s returned %d, expected %d\n", what, (int)st, (int)want);
        atomic_fetch_add(&parent_errors, 1);
    }
}

/* The parent's second thread: records in bursts and also takes the library's locks
 * (names, windows) and begins and ends steps, until told to stop. */
static void *parent_thread(void *arg) {
    (void)arg;
    int32_t active = 0;
    uint32_t id = 0;
    long round = 0;
    while (!atomic_load(&stop_thread)) {
        for (int i = 0; i < 32; i++) {
            int64_t t = trainprof_now_us();
            TrainprofArg a = {phase_id, TRAINPROF_ARG_KIND_INT, round};
            count(trainprof_record(phase_id, thread_name, t, t + 1, -1, &a, 1), "thread record");
        }
        expect_parent(trainprof_register_name("ParentThread", &id), TRAINPROF_STATUS_OK, "register_name");
        expect_parent(trainprof_window_active(TRAINPROF_FEATURE_DETAILED, -1, NULL, &active), TRAINPROF_STATUS_OK,
                      "window_active");
        expect_parent(trainprof_window_active(TRAINPROF_FEATURE_DATALOADER, -1, "DataLoaderIter", &active),
                      TRAINPROF_STATUS_OK, "window_active dataloader");
        if (round % 8 == 0) {
            expect_parent(trainprof_step_begin(TRAINPROF_MODE_TRAIN, -1, NULL), TRAINPROF_STATUS_OK, "step_begin");
            count(trainprof_step_end(), "step_end");
        }
        round++;
        sleep_us(100);
    }
    return NULL;
}

/* ---- the child ---------------------------------------------------------------------- */

static int child_check = 0;

/* Exits with 10 + the number of the failed check. */
#define CHILD_EXPECT(cond)                                                                         \
    do {                                                                                           \
        child_check++;                                                                             \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL child %d: fork.c:%d: %s\n", (int)getpid(), __LINE__, #cond);     \
            exit(10 + child_check < 250 ? 10 + child_check : 250);                                 \
        }                                                                                          \
    } while (0)

#define FORKED(call) CHILD_EXPECT((call) == TRAINPROF_STATUS_FORKED_CHILD)

static void child_calls(void) {
    child_check = 0;
    int64_t t = trainprof_now_us();
    TrainprofArg a = {phase_id, TRAINPROF_ARG_KIND_INT, 1};
    TrainprofArg five[5] = {a, a, a, a, a};
    FORKED(trainprof_record(phase_id, parent_name, t, t + 1, -1, NULL, 0));
    FORKED(trainprof_record(phase_id, parent_name, t, t + 1, 3, &a, 1));
    /* Even a call with bad arguments returns FORKED_CHILD: the fork check comes first. */
    FORKED(trainprof_record(phase_id, parent_name, t + 1, t, -1, five, 5));
    int64_t step = -77;
    FORKED(trainprof_step_begin(TRAINPROF_MODE_TRAIN, -1, &step));
    CHILD_EXPECT(step == -77);
    FORKED(trainprof_step_end());
    int32_t active = 7;
    FORKED(trainprof_window_active(TRAINPROF_FEATURE_DETAILED, -1, NULL, &active));
    CHILD_EXPECT(active == 0);
    active = 7;
    FORKED(trainprof_window_active(TRAINPROF_FEATURE_DATALOADER, 0, "DataLoaderIter", &active));
    CHILD_EXPECT(active == 0);
    uint32_t id = 12345;
    FORKED(trainprof_register_name("Child", &id));
    CHILD_EXPECT(id == 12345);
    FORKED(trainprof_register_name("ParentThread", &id));
    static TrainprofPythonWindow w;
    FORKED(trainprof_python_boundary(TRAINPROF_BOUNDARY_STEP_START, &w));
    CHILD_EXPECT(w.ended == 0 && w.started == 0);
    char node[256] = "untouched";
    FORKED(trainprof_node_id(node, sizeof node));
    CHILD_EXPECT(strcmp(node, "untouched") == 0);
    TrainprofStats s;
    memset(&s, 0xab, sizeof s);
    FORKED(trainprof_stats(&s));
    CHILD_EXPECT(s.dropped_queue_full == 0 && s.dropped_writer == 0 && s.written == 0 && s.files_sealed == 0 &&
                 s.open_failures == 0);
    CHILD_EXPECT(trainprof_dropped_events() == 0);
    FORKED(trainprof_shutdown(100));
    FORKED(trainprof_init("pytorch"));
    FORKED(trainprof_init("tensorflow"));
    CHILD_EXPECT(trainprof_abi_version() == TRAINPROF_ABI_VERSION);
    CHILD_EXPECT(trainprof_version() != NULL);
    CHILD_EXPECT(trainprof_now_us() >= t);
}

/* Calls every export for child_ms ms, then leaves with exit(0). */
static _Noreturn void child_loop(int child_ms) {
    double end = now_ms() + child_ms;
    while (now_ms() < end) {
        child_calls();
    }
    exit(0);
}

static _Noreturn void child_main(int child_ms, int first) {
    /* A deadlock in the library ends the child with SIGALRM (alarms are not inherited). */
    alarm(60);
    if (!first) {
        child_loop(child_ms);
    }
    /* A grandchild: still inert. */
    pid_t g = fork();
    if (g < 0) {
        perror("fork grandchild");
        exit(3);
    }
    if (g == 0) {
        alarm(60);
        child_loop(child_ms);
    }
    printf("grandchild=%d\n", (int)g);
    double end = now_ms() + child_ms;
    while (now_ms() < end) {
        child_calls();
    }
    int status = 0;
    pid_t r;
    while ((r = waitpid(g, &status, 0)) < 0 && errno == EINTR) {
    }
    if (r != g) {
        perror("waitpid grandchild");
        exit(4);
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "FAIL grandchild %d: status %#x\n", (int)g, status);
        exit(5);
    }
    exit(0);
}

/* ---- the parent ------------------------------------------------------------------------- */

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: fork <children> <child_ms>\n");
        return 2;
    }
    int n_children = atoi(argv[1]);
    int child_ms = atoi(argv[2]);
    if (n_children < 1 || n_children > MAX_CHILDREN || child_ms < 1) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    /* Unbuffered: nothing buffered in the parent is printed again by a child's exit(). */
    setvbuf(stdout, NULL, _IONBF, 0);
    /* The whole test, children included, must end: a deadlock becomes SIGALRM. */
    alarm(120);

    TrainprofStatus st = trainprof_init("pytorch");
    if (st != TRAINPROF_STATUS_OK) {
        fprintf(stderr, "FAIL parent: init returned %d\n", (int)st);
        return 1;
    }
    expect_parent(trainprof_register_name("Parent", &phase_id), TRAINPROF_STATUS_OK, "register Parent");
    expect_parent(trainprof_register_name("ParentMain", &parent_name), TRAINPROF_STATUS_OK, "register ParentMain");
    expect_parent(trainprof_register_name("ParentThread", &thread_name), TRAINPROF_STATUS_OK,
                  "register ParentThread");
    printf("parent=%d\n", (int)getpid());

    for (int i = 0; i < 1000; i++) {
        int64_t t = trainprof_now_us();
        count(trainprof_record(phase_id, parent_name, t, t + 1, -1, NULL, 0), "main record");
    }

    pthread_t th;
    if (pthread_create(&th, NULL, parent_thread, NULL) != 0) {
        fprintf(stderr, "pthread_create failed\n");
        return 1;
    }

    pid_t children[MAX_CHILDREN];
    for (int c = 0; c < n_children; c++) {
        /* Record right up to the fork, from this thread too. */
        for (int i = 0; i < 200; i++) {
            int64_t t = trainprof_now_us();
            count(trainprof_record(phase_id, parent_name, t, t + 1, -1, NULL, 0), "main record");
        }
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 1;
        }
        if (pid == 0) {
            child_main(child_ms, c == 0);
        }
        children[c] = pid;
        printf("child=%d\n", (int)pid);
        sleep_us(2000);
    }

    /* The parent goes on recording while its children run. */
    double end = now_ms() + child_ms / 2.0;
    while (now_ms() < end) {
        int64_t t = trainprof_now_us();
        count(trainprof_record(phase_id, parent_name, t, t + 1, -1, NULL, 0), "main record");
        sleep_us(20);
    }

    int children_failed = 0;
    for (int c = 0; c < n_children; c++) {
        int status = 0;
        pid_t r;
        while ((r = waitpid(children[c], &status, 0)) < 0 && errno == EINTR) {
        }
        if (r != children[c]) {
            perror("waitpid");
            return 1;
        }
        if (WIFEXITED(status)) {
            printf("child_exit=%d:%d\n", (int)children[c], WEXITSTATUS(status));
            if (WEXITSTATUS(status) != 0) {
                children_failed++;
            }
        } else {
            printf("child_signal=%d:%d\n", (int)children[c], WIFSIGNALED(status) ? WTERMSIG(status) : -1);
            children_failed++;
        }
    }

    atomic_store(&stop_thread, 1);
    pthread_join(th, NULL);

    /* After the children: the parent's hook still works. */
    for (int i = 0; i < 100; i++) {
        int64_t t = trainprof_now_us();
        count(trainprof_record(phase_id, parent_name, t, t + 1, -1, NULL, 0), "main record");
    }

    expect_parent(trainprof_shutdown(60000), TRAINPROF_STATUS_OK, "shutdown");
    TrainprofStats s;
    expect_parent(trainprof_stats(&s), TRAINPROF_STATUS_OK, "stats");
    printf("accepted=%ld\n", atomic_load(&accepted));
    printf("dropped=%ld\n", atomic_load(&dropped));
    printf("stats_written=%llu\n", (unsigned long long)s.written);
    printf("stats_dropped_queue_full=%llu\n", (unsigned long long)s.dropped_queue_full);
    printf("stats_dropped_writer=%llu\n", (unsigned long long)s.dropped_writer);
    printf("children_failed=%d\n", children_failed);
    printf("parent_errors=%d\n", atomic_load(&parent_errors));
    return (children_failed == 0 && atomic_load(&parent_errors) == 0) ? 0 : 1;
}
