/*
 * What one train step costs the trainer's thread in the hook, from C:
 * trainprof_step_begin + trainprof_step_end, with the writer thread running.
 *
 *   step_bench <batches> <pace ns>
 *
 * Run by scripts/bench-hook-steps, which builds the libraries, writes the configs (with and
 * without AutoProfilingConfig) and sets SMPROFILER_CONFIG_PATH. The main thread times
 * batches of BATCH steps with clock_gettime(CLOCK_MONOTONIC) and keeps the time per step
 * of every batch; a batch starts every <pace ns> (it sleeps in between, outside the timed
 * part), so that the writer keeps up and every step event is accepted. Step ends are what
 * feed the anomaly detector (docs/formats.md, "Anomaly-triggered windows").
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "trainprof_hook.h"

#define BATCH 32
#define WARMUP_BATCHES 200

static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void sleep_until(int64_t t_ns) {
    struct timespec ts = {.tv_sec = t_ns / 1000000000, .tv_nsec = t_ns % 1000000000};
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s <batches> <pace ns>\n", argv[0]);
        return 2;
    }
    long batches = atol(argv[1]);
    int64_t pace_ns = atoll(argv[2]);
    if (batches <= 0 || pace_ns < 0) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    if (trainprof_init("pytorch") != TRAINPROF_STATUS_OK) {
        fprintf(stderr, "trainprof_init failed\n");
        return 1;
    }
    double *ns = calloc((size_t)batches, sizeof *ns);
    if (!ns) return 1;
    long bad = 0;
    int64_t next = now_ns();
    for (long b = -WARMUP_BATCHES; b < batches; b++) {
        if (pace_ns > 0) {
            next += pace_ns;
            sleep_until(next);
        }
        int64_t t0 = now_ns();
        for (int i = 0; i < BATCH; i++) {
            int64_t step;
            if (trainprof_step_begin(TRAINPROF_MODE_TRAIN, -1, &step) != TRAINPROF_STATUS_OK) bad++;
            if (trainprof_step_end() != TRAINPROF_STATUS_OK) bad++;
        }
        int64_t t1 = now_ns();
        if (b >= 0) ns[b] = (double)(t1 - t0) / BATCH;
    }
    TrainprofStats stats;
    trainprof_stats(&stats);
    trainprof_shutdown(10000);
    qsort(ns, (size_t)batches, sizeof *ns, cmp_double);
    double p50 = ns[batches / 2], p99 = ns[(long)(batches * 0.99)];
    printf("RESULT {\"metric\": \"train step (step_begin + step_end) from C, p50\", \"unit\": \"ns/step\", "
           "\"trainprof\": %.1f}\n", p50);
    printf("RESULT {\"metric\": \"train step (step_begin + step_end) from C, p99\", \"unit\": \"ns/step\", "
           "\"trainprof\": %.1f}\n", p99);
    fprintf(stderr, "steps not OK: %ld, events written %llu, dropped (queue full) %llu\n", bad,
            (unsigned long long)stats.written, (unsigned long long)stats.dropped_queue_full);
    free(ns);
    return bad ? 1 : 0;
}
