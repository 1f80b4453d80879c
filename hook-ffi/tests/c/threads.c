/*
 * Many threads record as fast as they can into a small queue while the writer runs:
 * every call is either accepted (OK) or dropped and counted (DROPPED), and the counts
 * add up exactly.
 *
 * Run by hook-ffi/tests/abi.rs as `threads <threads> <calls per thread>` with
 * SMPROFILER_CONFIG_PATH and TRAINPROF_QUEUE_EVENTS set.
 *
 * Disk use: whatever is accepted is written (~90 bytes an event), so the writer must not
 * keep up with the recording threads. All threads, the writer included (trainprof_init
 * starts it on the main thread, and a new thread inherits the CPU set), run on at most
 * two CPUs: the writer then gets about a ninth of them, whatever the machine, and writes
 * a few percent of the calls while they run (about 250,000 of 8 x 1,000,000 in a debug
 * build); the rest are dropped and counted.
 *
 * Prints `key=value` lines; exits 1 when a call returned anything but OK or DROPPED.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "trainprof_hook.h"

#define MAX_THREADS 64

struct worker {
    pthread_t thread;
    int index;
    long calls;
    uint32_t phase;
    uint32_t name;
    long ok;
    long dropped;
    long other;
    int32_t first_other;
};

static pthread_barrier_t start_line;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *work(void *arg) {
    struct worker *w = arg;
    /* Wait until main has initialised the hook and registered the names. */
    pthread_barrier_wait(&start_line);
    int64_t t = trainprof_now_us();
    long ok = 0, dropped = 0, other = 0;
    for (long i = 0; i < w->calls; i++) {
        TrainprofStatus st = trainprof_record(w->phase, w->name, t, t + 1, -1, NULL, 0);
        if (st == TRAINPROF_STATUS_OK) {
            ok++;
        } else if (st == TRAINPROF_STATUS_DROPPED) {
            dropped++;
        } else {
            if (other == 0) {
                w->first_other = st;
            }
            other++;
        }
    }
    w->ok = ok;
    w->dropped = dropped;
    w->other = other;
    return NULL;
}

/* At most two CPUs of the ones this process may use, for every thread made from now on. */
static int limit_cpus(void) {
    cpu_set_t allowed, use;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) {
        return 0;
    }
    CPU_ZERO(&use);
    int n = 0;
    for (int c = 0; c < CPU_SETSIZE && n < 2; c++) {
        if (CPU_ISSET(c, &allowed)) {
            CPU_SET(c, &use);
            n++;
        }
    }
    if (n == 0 || sched_setaffinity(0, sizeof use, &use) != 0) {
        return 0;
    }
    return n;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: threads <threads> <calls per thread>\n");
        return 2;
    }
    int n_threads = atoi(argv[1]);
    long calls = atol(argv[2]);
    if (n_threads < 1 || n_threads > MAX_THREADS || calls < 1) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    printf("cpus=%d\n", limit_cpus());

    static struct worker workers[MAX_THREADS];
    if (pthread_barrier_init(&start_line, NULL, (unsigned)n_threads + 1) != 0) {
        fprintf(stderr, "pthread_barrier_init failed\n");
        return 1;
    }
    for (int i = 0; i < n_threads; i++) {
        workers[i].index = i;
        workers[i].calls = calls;
        if (pthread_create(&workers[i].thread, NULL, work, &workers[i]) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            return 1;
        }
    }
    TrainprofStatus st = trainprof_init("pytorch");
    if (st != TRAINPROF_STATUS_OK) {
        fprintf(stderr, "FAIL: init returned %d\n", (int)st);
        return 1;
    }
    uint32_t phase = 0;
    if (trainprof_register_name("Stress", &phase) != TRAINPROF_STATUS_OK) {
        fprintf(stderr, "FAIL: register_name\n");
        return 1;
    }
    for (int i = 0; i < n_threads; i++) {
        char name[16];
        snprintf(name, sizeof name, "T%d", i);
        workers[i].phase = phase;
        if (trainprof_register_name(name, &workers[i].name) != TRAINPROF_STATUS_OK) {
            fprintf(stderr, "FAIL: register_name %s\n", name);
            return 1;
        }
    }

    double t0 = now_s();
    pthread_barrier_wait(&start_line);
    long ok = 0, dropped = 0, other = 0;
    for (int i = 0; i < n_threads; i++) {
        pthread_join(workers[i].thread, NULL);
        ok += workers[i].ok;
        dropped += workers[i].dropped;
        other += workers[i].other;
        printf("thread_ok=T%d:%ld\n", i, workers[i].ok);
        if (workers[i].other != 0) {
            fprintf(stderr, "FAIL: thread %d: %ld calls returned something else, first %d\n", i, workers[i].other,
                    (int)workers[i].first_other);
        }
    }
    double t1 = now_s();
    TrainprofStats before;
    trainprof_stats(&before);

    st = trainprof_shutdown(120000);
    double t2 = now_s();
    TrainprofStats s;
    TrainprofStatus st2 = trainprof_stats(&s);

    printf("record_seconds=%.3f\n", t1 - t0);
    printf("shutdown_seconds=%.3f\n", t2 - t1);
    printf("written_before_shutdown=%llu\n", (unsigned long long)before.written);
    printf("ok=%ld\n", ok);
    printf("dropped=%ld\n", dropped);
    printf("other=%ld\n", other);
    printf("shutdown=%d\n", (int)st);
    printf("stats=%d\n", (int)st2);
    printf("stats_dropped_queue_full=%llu\n", (unsigned long long)s.dropped_queue_full);
    printf("stats_dropped_writer=%llu\n", (unsigned long long)s.dropped_writer);
    printf("stats_written=%llu\n", (unsigned long long)s.written);
    printf("stats_files_sealed=%llu\n", (unsigned long long)s.files_sealed);
    printf("dropped_events=%llu\n", (unsigned long long)trainprof_dropped_events());
    return other == 0 ? 0 : 1;
}
