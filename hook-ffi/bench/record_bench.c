/*
 * How long trainprof_record takes from C, with the writer thread running.
 *
 *   record_bench <threads> <batches per thread> <pace ns>
 *
 * Run by scripts/bench-hook (which builds the release library and sets
 * SMPROFILER_CONFIG_PATH). Each thread times batches of BATCH calls with
 * clock_gettime(CLOCK_MONOTONIC) and keeps the time per call of every batch; the
 * percentiles are over all batches of all threads. With <pace ns> > 0 a thread starts a
 * batch every <pace ns> (it sleeps in between, outside the timed part, as a trainer
 * computes between events), so that the writer keeps up and the calls are accepted; with
 * 0 the threads record as fast as they can and the queue overflows (then most calls take
 * the drop path).
 *
 * Baselines, measured the same way on the main thread: an empty timed batch (the cost of
 * the two clock_gettime calls, spread over BATCH), and BATCH calls of an empty function
 * with trainprof_record's signature through a function pointer (what a call into a shared
 * library costs at least).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "trainprof_hook.h"

#define BATCH 64
#define WARMUP_BATCHES 200
#define MAX_THREADS 64

typedef TrainprofStatus (*record_fn)(uint32_t, uint32_t, int64_t, int64_t, int64_t, const TrainprofArg *,
                                     uint32_t);

__attribute__((noinline)) static TrainprofStatus empty_record(uint32_t phase_id, uint32_t name_id,
                                                              int64_t start_us, int64_t end_us, int64_t step,
                                                              const TrainprofArg *args, uint32_t n_args) {
    (void)phase_id, (void)name_id, (void)start_us, (void)end_us, (void)step, (void)args, (void)n_args;
    __asm__ volatile("" ::: "memory");
    return TRAINPROF_STATUS_OK;
}

/* volatile: the compiler may neither inline the call nor drop it. */
static record_fn volatile empty_fn = empty_record;

static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

struct worker {
    pthread_t thread;
    long batches;
    int64_t pace_ns;
    uint32_t phase, name;
    double *ns_per_call; /* one per batch */
    unsigned char *outcome; /* per batch: 0 all accepted, 1 all dropped, 2 mixed */
    long ok, dropped, other;
};

static pthread_barrier_t start_line;

static void *work(void *arg) {
    struct worker *w = arg;
    pthread_barrier_wait(&start_line);
    int64_t t = trainprof_now_us();
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    for (long b = -WARMUP_BATCHES; b < w->batches; b++) {
        if (w->pace_ns > 0) {
            /* The next start, on a fixed grid: a late batch does not shift the later ones. */
            next.tv_nsec += (long)(w->pace_ns % 1000000000);
            next.tv_sec += (time_t)(w->pace_ns / 1000000000) + next.tv_nsec / 1000000000;
            next.tv_nsec %= 1000000000;
            while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL) != 0) {
            }
        }
        int n_ok = 0, n_dropped = 0;
        int64_t t0 = now_ns();
        for (int i = 0; i < BATCH; i++) {
            TrainprofStatus st = trainprof_record(w->phase, w->name, t, t + 1, -1, NULL, 0);
            n_ok += st == TRAINPROF_STATUS_OK;
            n_dropped += st == TRAINPROF_STATUS_DROPPED;
        }
        int64_t t1 = now_ns();
        w->ok += n_ok;
        w->dropped += n_dropped;
        w->other += BATCH - n_ok - n_dropped;
        if (b >= 0) {
            w->ns_per_call[b] = (double)(t1 - t0) / BATCH;
            w->outcome[b] = n_ok == BATCH ? 0 : n_dropped == BATCH ? 1 : 2;
        }
    }
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(const double *sorted, long n, double p) {
    if (n == 0) {
        return 0.0;
    }
    long i = (long)(p * (double)(n - 1) + 0.5);
    return sorted[i];
}

static void print_percentiles(const char *label, double *v, long n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    if (n == 0) {
        printf("  %-28s %8ld batches\n", label, n);
        return;
    }
    printf("  %-28s %8ld batches  p50 %7.1f  p90 %7.1f  p99 %7.1f  min %6.1f  max %9.1f ns/call\n", label, n,
           pct(v, n, 0.50), pct(v, n, 0.90), pct(v, n, 0.99), v[0], v[n - 1]);
}

/* ns per call of `batches` timed batches of `calls` calls of the empty function (0: an
 * empty batch, whose time is the two clock_gettime calls). */
static void baseline(const char *label, int calls, long batches) {
    double *v = malloc(sizeof *v * (size_t)batches);
    if (v == NULL) {
        abort();
    }
    for (long b = 0; b < batches; b++) {
        int64_t t0 = now_ns();
        for (int i = 0; i < calls; i++) {
            empty_fn(1, 2, 3, 4, -1, NULL, 0);
        }
        int64_t t1 = now_ns();
        v[b] = (double)(t1 - t0) / BATCH;
    }
    print_percentiles(label, v, batches);
    free(v);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: record_bench <threads> <batches per thread> <pace ns>\n");
        return 2;
    }
    int n_threads = atoi(argv[1]);
    long batches = atol(argv[2]);
    int64_t pace_ns = atoll(argv[3]);
    if (n_threads < 1 || n_threads > MAX_THREADS || batches < 1 || pace_ns < 0) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    if (trainprof_abi_version() != TRAINPROF_ABI_VERSION) {
        fprintf(stderr, "ABI version %u, expected %d\n", trainprof_abi_version(), TRAINPROF_ABI_VERSION);
        return 1;
    }

    printf("threads %d, %ld batches of %d calls per thread, %s\n", n_threads, batches, BATCH,
           pace_ns > 0 ? "paced" : "as fast as possible");
    if (pace_ns > 0) {
        printf("  pace: one batch per %lld ns per thread (%.2f M calls/s in all)\n", (long long)pace_ns,
               (double)n_threads * BATCH * 1e3 / (double)pace_ns);
    }
    baseline("baseline: clock_gettime", 0, 100000);
    baseline("baseline: empty call", BATCH, 100000);

    TrainprofStatus st = trainprof_init("pytorch");
    if (st != TRAINPROF_STATUS_OK) {
        fprintf(stderr, "trainprof_init returned %d\n", (int)st);
        return 1;
    }
    uint32_t phase = 0, name = 0;
    if (trainprof_register_name("Bench", &phase) != TRAINPROF_STATUS_OK ||
        trainprof_register_name("record", &name) != TRAINPROF_STATUS_OK) {
        fprintf(stderr, "trainprof_register_name failed\n");
        return 1;
    }

    static struct worker workers[MAX_THREADS];
    pthread_barrier_init(&start_line, NULL, (unsigned)n_threads + 1);
    for (int i = 0; i < n_threads; i++) {
        struct worker *w = &workers[i];
        w->batches = batches;
        w->pace_ns = pace_ns;
        w->phase = phase;
        w->name = name;
        w->ns_per_call = calloc((size_t)batches, sizeof *w->ns_per_call);
        w->outcome = calloc((size_t)batches, 1);
        if (w->ns_per_call == NULL || w->outcome == NULL ||
            pthread_create(&w->thread, NULL, work, w) != 0) {
            fprintf(stderr, "out of resources\n");
            return 1;
        }
    }
    int64_t t0 = now_ns();
    pthread_barrier_wait(&start_line);
    long total = (long)n_threads * batches;
    double *all = malloc(sizeof *all * (size_t)total);
    double *accepted = malloc(sizeof *all * (size_t)total);
    double *dropped = malloc(sizeof *all * (size_t)total);
    if (all == NULL || accepted == NULL || dropped == NULL) {
        return 1;
    }
    long n_all = 0, n_accepted = 0, n_dropped = 0, ok = 0, drops = 0, other = 0;
    for (int i = 0; i < n_threads; i++) {
        struct worker *w = &workers[i];
        pthread_join(w->thread, NULL);
        for (long b = 0; b < batches; b++) {
            all[n_all++] = w->ns_per_call[b];
            if (w->outcome[b] == 0) {
                accepted[n_accepted++] = w->ns_per_call[b];
            } else if (w->outcome[b] == 1) {
                dropped[n_dropped++] = w->ns_per_call[b];
            }
        }
        ok += w->ok;
        drops += w->dropped;
        other += w->other;
    }
    int64_t t1 = now_ns();
    st = trainprof_shutdown(60000);
    int64_t t2 = now_ns();
    TrainprofStats s;
    trainprof_stats(&s);

    print_percentiles("trainprof_record, all", all, n_all);
    print_percentiles("  batches all accepted", accepted, n_accepted);
    print_percentiles("  batches all dropped", dropped, n_dropped);
    long calls = ok + drops + other;
    printf("  calls %ld in %.3f s: accepted %ld, dropped %ld (%.1f%%), other %ld\n", calls, (double)(t1 - t0) / 1e9,
           ok, drops, 100.0 * (double)drops / (double)calls, other);
    printf("  stats: dropped_queue_full %llu, written %llu, files %llu; shutdown %d\n",
           (unsigned long long)s.dropped_queue_full, (unsigned long long)s.written,
           (unsigned long long)s.files_sealed, (int)st);
    /* For bench/run.py (scripts/bench): one JSON object a line after "RESULT ". */
    const char *mode = pace_ns > 0 ? "paced" : "flat out";
    printf("RESULT {\"metric\": \"trainprof_record from C, %d thread%s %s, p50\", \"unit\": \"ns/event\", "
           "\"trainprof\": %.1f, \"peer\": null, \"peer_name\": null, \"better\": \"lower\"}\n",
           n_threads, n_threads == 1 ? "" : "s", mode, pct(all, n_all, 0.50));
    printf("RESULT {\"metric\": \"trainprof_record from C, %d thread%s %s, p99\", \"unit\": \"ns/event\", "
           "\"trainprof\": %.1f, \"peer\": null, \"peer_name\": null, \"better\": \"lower\"}\n",
           n_threads, n_threads == 1 ? "" : "s", mode, pct(all, n_all, 0.99));
    if (pace_ns == 0) {
        /* Flat out, the writer is the bottleneck: events written per second until sealed. */
        printf("RESULT {\"metric\": \"timeline writer from C, %d thread%s flat out\", \"unit\": \"events/s\", "
               "\"trainprof\": %.0f, \"peer\": null, \"peer_name\": null, \"better\": \"higher\"}\n",
               n_threads, n_threads == 1 ? "" : "s", (double)s.written * 1e9 / (double)(t2 - t0));
    }
    return other == 0 && st == TRAINPROF_STATUS_OK ? 0 : 1;
}
