/*
 * The whole C ABI from C, in one process (one hook per process).
 *
 * Run by hook-ffi/tests/abi.rs as `api <LocalPath>` with SMPROFILER_CONFIG_PATH set.
 * Every unexpected result is printed to stderr as `FAIL api.c:<line>: ...`; the exit
 * status is 1 if there was any. On stdout it prints `key=value` lines that the Rust
 * side compares with the sealed timeline files.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trainprof_hook.h"

static int failures = 0;

#define CHECK_STATUS(call, want)                                                           \
    do {                                                                                   \
        int32_t got_ = (int32_t)(call);                                                    \
        if (got_ != (int32_t)(want)) {                                                     \
            fprintf(stderr, "FAIL api.c:%d: %s returned %d, expected %s (%d)\n", __LINE__, \
                    #call, (int)got_, #want, (int)(want));                                 \
            failures++;                                                                    \
        }                                                                                  \
    } while (0)

#define CHECK(cond)                                                                        \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "FAIL api.c:%d: %s\n", __LINE__, #cond);                       \
            failures++;                                                                    \
        }                                                                                  \
    } while (0)

static TrainprofArg int_arg(uint32_t key, int64_t v) {
    TrainprofArg a = {key, TRAINPROF_ARG_KIND_INT, v};
    return a;
}

static TrainprofArg float_arg(uint32_t key, double v) {
    TrainprofArg a = {key, TRAINPROF_ARG_KIND_FLOAT, 0};
    memcpy(&a.value, &v, sizeof v);
    return a;
}

static TrainprofArg bool_arg(uint32_t key, int v) {
    TrainprofArg a = {key, TRAINPROF_ARG_KIND_BOOL, v};
    return a;
}

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static int stats_are_zero(const TrainprofStats *s) {
    return s->dropped_queue_full == 0 && s->dropped_writer == 0 && s->written == 0 &&
           s->files_sealed == 0 && s->open_failures == 0;
}

/* Events the library accepted (OK from trainprof_record and trainprof_step_end). */
static long recorded = 0;

static void record_ok(TrainprofStatus st, int line) {
    if (st == TRAINPROF_STATUS_OK) {
        recorded++;
    } else {
        fprintf(stderr, "FAIL api.c:%d: an event was refused with %d\n", line, (int)st);
        failures++;
    }
}

#define RECORD_OK(call) record_ok((call), __LINE__)

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: api <LocalPath>\n");
        return 2;
    }
    char framework_dir[4096];
    snprintf(framework_dir, sizeof framework_dir, "%s/framework", argv[1]);

    /* --- versions: always work ---------------------------------------------------- */
    CHECK(trainprof_abi_version() == TRAINPROF_ABI_VERSION);
    const char *version = trainprof_version();
    CHECK(version != NULL);
    printf("version=%s\n", version ? version : "(null)");
    CHECK(trainprof_now_us() > 1600000000LL * 1000000LL);

    /* --- before init: nothing happens, a positive status -------------------------- */
    uint32_t id = 12345;
    CHECK_STATUS(trainprof_register_name("Forward", &id), TRAINPROF_STATUS_NOT_INITIALIZED);
    CHECK(id == 12345);
    CHECK_STATUS(trainprof_record(0, 0, 1, 2, -1, NULL, 0), TRAINPROF_STATUS_NOT_INITIALIZED);
    int64_t step = -77;
    CHECK_STATUS(trainprof_step_begin(TRAINPROF_MODE_TRAIN, -1, &step), TRAINPROF_STATUS_NOT_INITIALIZED);
    CHECK(step == -77);
    CHECK_STATUS(trainprof_step_end(), TRAINPROF_STATUS_NOT_INITIALIZED);
    int32_t active = 7;
    CHECK_STATUS(trainprof_window_active(TRAINPROF_FEATURE_DETAILED, 5, NULL, &active),
                 TRAINPROF_STATUS_NOT_INITIALIZED);
    CHECK(active == 0);
    static TrainprofPythonWindow window;
    CHECK_STATUS(trainprof_python_boundary(TRAINPROF_BOUNDARY_START, &window), TRAINPROF_STATUS_NOT_INITIALIZED);
    CHECK(window.ended == 0 && window.started == 0);
    char node[256] = "untouched";
    CHECK_STATUS(trainprof_node_id(node, sizeof node), TRAINPROF_STATUS_NOT_INITIALIZED);
    CHECK(strcmp(node, "untouched") == 0);
    TrainprofStats stats;
    memset(&stats, 0xab, sizeof stats);
    CHECK_STATUS(trainprof_stats(&stats), TRAINPROF_STATUS_NOT_INITIALIZED);
    CHECK(stats_are_zero(&stats));
    CHECK(trainprof_dropped_events() == 0);
    CHECK_STATUS(trainprof_shutdown(1000), TRAINPROF_STATUS_NOT_INITIALIZED);
    /* A panic before init is caught too (std's default panic message goes to stderr). */
    CHECK_STATUS(trainprof_selftest_panic(), TRAINPROF_STATUS_INTERNAL);

    /* --- init: bad arguments are refused and do not start the hook ----------------- */
    CHECK_STATUS(trainprof_init(NULL), TRAINPROF_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(trainprof_init("\xff"), TRAINPROF_STATUS_INVALID_UTF8);
    CHECK_STATUS(trainprof_init("keras"), TRAINPROF_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(trainprof_init(""), TRAINPROF_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(trainprof_register_name("Forward", &id), TRAINPROF_STATUS_NOT_INITIALIZED);
    CHECK(!exists(framework_dir));

    CHECK_STATUS(trainprof_init("pytorch"), TRAINPROF_STATUS_OK);
    CHECK_STATUS(trainprof_init("pytorch"), TRAINPROF_STATUS_OK);
    CHECK_STATUS(trainprof_init("keras"), TRAINPROF_STATUS_INVALID_ARGUMENT);

    /* --- names ---------------------------------------------------------------------- */
    uint32_t forward = 0, forward2 = 0, net = 0, worker_id = 0, ratio = 0, pin_memory = 0, with_args = 0;
    CHECK_STATUS(trainprof_register_name("Forward", &forward), TRAINPROF_STATUS_OK);
    CHECK_STATUS(trainprof_register_name("Net", &net), TRAINPROF_STATUS_OK);
    CHECK_STATUS(trainprof_register_name("Forward", &forward2), TRAINPROF_STATUS_OK);
    CHECK(forward == forward2);
    CHECK(forward != net);
    CHECK_STATUS(trainprof_register_name("worker_id", &worker_id), TRAINPROF_STATUS_OK);
    CHECK_STATUS(trainprof_register_name("ratio", &ratio), TRAINPROF_STATUS_OK);
    CHECK_STATUS(trainprof_register_name("pin_memory", &pin_memory), TRAINPROF_STATUS_OK);
    CHECK_STATUS(trainprof_register_name("WithArgs", &with_args), TRAINPROF_STATUS_OK);
    CHECK_STATUS(trainprof_register_name(NULL, &id), TRAINPROF_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(trainprof_register_name("Forward", NULL), TRAINPROF_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(trainprof_register_name("bad\xff\xfe", &id), TRAINPROF_STATUS_INVALID_UTF8);

    /* --- steps: bad mode, end without a step ------------------------------------------ */
    CHECK_STATUS(trainprof_step_begin(99, -1, NULL), TRAINPROF_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(trainprof_step_begin(0, -1, NULL), TRAINPROF_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(trainprof_step_end(), TRAINPROF_STATUS_NO_STEP);

    /* --- record: refused arguments ---------------------------------------------------- */
    int64_t t0 = trainprof_now_us();
    TrainprofArg args[5] = {int_arg(worker_id, -7), float_arg(ratio, 0.25), bool_arg(pin_memory, 1),
                            int_arg(worker_id, 1), int_arg(worker_id, 2)};
    CHECK_STATUS(trainprof_record(100000, net, t0, t0 + 1, -1, NULL, 0), TRAINPROF_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(trainprof_record(forward, 100000, t0, t0 + 1, -1, NULL, 0), TRAINPROF_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(trainprof_record(forward, net, t0 + 1, t0, -1, NULL, 0), TRAINPROF_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(trainprof_record(forward, net, t0, t0 + 1, -1, args, 5), TRAINPROF_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(trainprof_record(forward, net, t0, t0 + 1, -1, NULL, 1), TRAINPROF_STATUS_NULL_ARGUMENT);
    TrainprofArg bad_key = int_arg(100000, 1);
    CHECK_STATUS(trainprof_record(forward, net, t0, t0 + 1, -1, &bad_key, 1), TRAINPROF_STATUS_INVALID_ARGUMENT);
    TrainprofArg bad_kind = {worker_id, 3, 1};
    CHECK_STATUS(trainprof_record(forward, net, t0, t0 + 1, -1, &bad_kind, 1), TRAINPROF_STATUS_INVALID_ARGUMENT);

    /* --- record: accepted ----------------------------------------------------------- */
    /* Before any step: no step_num. A zero-length event; args may be NULL with 0 args. */
    RECORD_OK(trainprof_record(forward, net, t0, t0, -1, NULL, 0));
    /* int, float, bool arguments, at an explicit step. */
    RECORD_OK(trainprof_record(forward, with_args, t0, t0 + 10, 42, args, 3));
    /* A non-NULL args pointer with 0 args is ignored. */
    RECORD_OK(trainprof_record(forward, net, t0, t0 + 3, 43, args, 0));

    /* Train steps 0, 1, 2 (numbered by the hook), eval steps 0, 1, then train step 10. */
    for (int64_t i = 0; i < 3; i++) {
        int64_t n = -1;
        CHECK_STATUS(trainprof_step_begin(TRAINPROF_MODE_TRAIN, -1, &n), TRAINPROF_STATUS_OK);
        CHECK(n == i);
        int64_t s = trainprof_now_us();
        RECORD_OK(trainprof_record(forward, net, s, s + 5, -1, NULL, 0));
        RECORD_OK(trainprof_step_end());
        CHECK_STATUS(trainprof_step_end(), TRAINPROF_STATUS_NO_STEP);
    }
    for (int64_t i = 0; i < 2; i++) {
        int64_t n = -1;
        CHECK_STATUS(trainprof_step_begin(TRAINPROF_MODE_EVAL, -1, &n), TRAINPROF_STATUS_OK);
        CHECK(n == i);
        int64_t s = trainprof_now_us();
        RECORD_OK(trainprof_record(forward, net, s, s + 5, -1, NULL, 0));
        RECORD_OK(trainprof_step_end());
    }
    {
        int64_t n = -1;
        CHECK_STATUS(trainprof_step_begin(TRAINPROF_MODE_TRAIN, 10, &n), TRAINPROF_STATUS_OK);
        CHECK(n == 10);
        /* out_step may be NULL. */
        CHECK_STATUS(trainprof_step_begin(TRAINPROF_MODE_TRAIN, 11, NULL), TRAINPROF_STATUS_OK);
        RECORD_OK(trainprof_step_end());
        CHECK_STATUS(trainprof_step_begin(TRAINPROF_MODE_TRAIN, -1, &n), TRAINPROF_STATUS_OK);
        CHECK(n == 12);
        RECORD_OK(trainprof_step_end());
    }

    /* --- windows (the config has Detailed at steps 5 and 6, Dataloader for "Data.*"
     *     at step 0) --------------------------------------------------------------- */
    CHECK_STATUS(trainprof_window_active(TRAINPROF_FEATURE_DETAILED, -1, NULL, NULL), TRAINPROF_STATUS_NULL_ARGUMENT);
    active = 7;
    CHECK_STATUS(trainprof_window_active(TRAINPROF_FEATURE_DATALOADER, 0, NULL, &active),
                 TRAINPROF_STATUS_NULL_ARGUMENT);
    CHECK(active == 0);
    CHECK_STATUS(trainprof_window_active(TRAINPROF_FEATURE_DATALOADER, 0, "\xff", &active),
                 TRAINPROF_STATUS_INVALID_UTF8);
    CHECK_STATUS(trainprof_window_active(99, 0, NULL, &active), TRAINPROF_STATUS_INVALID_ARGUMENT);
    active = 7;
    CHECK_STATUS(trainprof_window_active(TRAINPROF_FEATURE_DETAILED, 4, NULL, &active), TRAINPROF_STATUS_OK);
    CHECK(active == 0);
    CHECK_STATUS(trainprof_window_active(TRAINPROF_FEATURE_DETAILED, 5, NULL, &active), TRAINPROF_STATUS_OK);
    CHECK(active == 1);
    CHECK_STATUS(trainprof_window_active(TRAINPROF_FEATURE_DETAILED, 6, "ignored", &active), TRAINPROF_STATUS_OK);
    CHECK(active == 1);
    CHECK_STATUS(trainprof_window_active(TRAINPROF_FEATURE_DETAILED, 7, NULL, &active), TRAINPROF_STATUS_OK);
    CHECK(active == 0);
    CHECK_STATUS(trainprof_window_active(TRAINPROF_FEATURE_DATALOADER, 0, "DataLoaderIter", &active),
                 TRAINPROF_STATUS_OK);
    CHECK(active == 1);
    CHECK_STATUS(trainprof_window_active(TRAINPROF_FEATURE_DATALOADER, 0, "Other", &active), TRAINPROF_STATUS_OK);
    CHECK(active == 0);
    CHECK_STATUS(trainprof_window_active(TRAINPROF_FEATURE_DATALOADER, 1, "DataLoaderIter", &active),
                 TRAINPROF_STATUS_OK);
    CHECK(active == 0);
    CHECK_STATUS(trainprof_window_active(TRAINPROF_FEATURE_PYTHON, 0, NULL, &active), TRAINPROF_STATUS_OK);
    CHECK(active == 0);

    /* --- Python windows: none configured ---------------------------------------------- */
    CHECK_STATUS(trainprof_python_boundary(TRAINPROF_BOUNDARY_START, NULL), TRAINPROF_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(trainprof_python_boundary(99, &window), TRAINPROF_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(trainprof_python_boundary(TRAINPROF_BOUNDARY_START, &window), TRAINPROF_STATUS_OK);
    CHECK(window.ended == 0 && window.started == 0);
    CHECK_STATUS(trainprof_python_boundary(TRAINPROF_BOUNDARY_STEP_START, &window), TRAINPROF_STATUS_OK);
    CHECK(window.ended == 0 && window.started == 0);

    /* --- node id ------------------------------------------------------------------------ */
    char small[1] = {'x'};
    CHECK_STATUS(trainprof_node_id(small, sizeof small), TRAINPROF_STATUS_BUFFER_TOO_SMALL);
    CHECK_STATUS(trainprof_node_id(NULL, 64), TRAINPROF_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(trainprof_node_id(node, 0), TRAINPROF_STATUS_BUFFER_TOO_SMALL);
    CHECK_STATUS(trainprof_node_id(node, sizeof node), TRAINPROF_STATUS_OK);
    CHECK(strlen(node) > 2 && strchr(node, '-') != NULL);
    /* Exactly enough room for the id and its NUL. */
    {
        size_t need = strlen(node) + 1;
        char exact[256];
        CHECK_STATUS(trainprof_node_id(exact, need), TRAINPROF_STATUS_OK);
        CHECK(strcmp(exact, node) == 0);
        CHECK_STATUS(trainprof_node_id(exact, need - 1), TRAINPROF_STATUS_BUFFER_TOO_SMALL);
    }
    printf("node=%s\n", node);

    /* --- a detailed window's torch trace: made by the hook, written as torch writes it
     *     (<path>.tmp, renamed over <path>), handed back; its 2 ops (one filtered out) are
     *     written by the writer thread, numbered by the step they began in --------------- */
    {
        char path[TRAINPROF_PATH_MAX];
        uint64_t token = 0, unused = 0;
        CHECK_STATUS(trainprof_torch_trace_create(NULL, sizeof path, &token), TRAINPROF_STATUS_NULL_ARGUMENT);
        CHECK_STATUS(trainprof_torch_trace_create(path, sizeof path, NULL), TRAINPROF_STATUS_NULL_ARGUMENT);
        CHECK_STATUS(trainprof_torch_trace_create(small, sizeof small, &unused), TRAINPROF_STATUS_BUFFER_TOO_SMALL);
        CHECK_STATUS(trainprof_torch_trace_create(path, sizeof path, &token), TRAINPROF_STATUS_OK);
        CHECK(strstr(path, "/.trainprof-torch/") != NULL);
        char tmp[TRAINPROF_PATH_MAX + 8];
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        FILE *f = fopen(tmp, "w");
        CHECK(f != NULL);
        if (f) {
            fprintf(f, "{\"schemaVersion\": 1, \"baseTimeNanoseconds\": 1700000000000000000, \"traceEvents\": ["
                       "{\"ph\": \"X\", \"cat\": \"cpu_op\", \"name\": \"aten::mm\", \"tid\": 9, \"ts\": 100.5, \"dur\": 3},"
                       "{\"ph\": \"X\", \"cat\": \"cpu_op\", \"name\": \"aten::is_leaf\", \"tid\": 9, \"ts\": 101, \"dur\": 1},"
                       "{\"ph\": \"X\", \"cat\": \"cpu_op\", \"name\": \"aten::relu\", \"tid\": 9, \"ts\": 300, \"dur\": 2}"
                       "], \"traceName\": \"%s\"}", path);
            fclose(f);
            CHECK(unlink(path) == 0);
            CHECK(rename(tmp, path) == 0);
        }
        const int64_t starts[2] = {1700000000000000LL, 1700000000000200LL};
        const int64_t steps_of[2] = {5, 6};
        CHECK_STATUS(trainprof_torch_trace_import(token + 1000, starts, steps_of, 2, 0, 100, 1),
                     TRAINPROF_STATUS_INVALID_ARGUMENT);
        CHECK_STATUS(trainprof_torch_trace_import(token, NULL, steps_of, 2, 0, 100, 1), TRAINPROF_STATUS_NULL_ARGUMENT);
        CHECK_STATUS(trainprof_torch_trace_import(token, starts, steps_of, 2, 0, 100, 1), TRAINPROF_STATUS_OK);
        CHECK_STATUS(trainprof_torch_trace_import(token, starts, steps_of, 2, 0, 100, 1),
                     TRAINPROF_STATUS_INVALID_ARGUMENT);
        recorded += 2;
        /* Made and discarded unread: nothing is written. */
        CHECK_STATUS(trainprof_torch_trace_create(path, sizeof path, &token), TRAINPROF_STATUS_OK);
        CHECK(exists(path));
        CHECK_STATUS(trainprof_torch_trace_discard(token), TRAINPROF_STATUS_OK);
        CHECK(!exists(path));
        CHECK_STATUS(trainprof_torch_trace_discard(token), TRAINPROF_STATUS_INVALID_ARGUMENT);
    }

    /* --- a panic inside the library: caught, and the hook goes on ---------------------- */
    CHECK_STATUS(trainprof_selftest_panic(), TRAINPROF_STATUS_INTERNAL);
    CHECK_STATUS(trainprof_selftest_panic(), TRAINPROF_STATUS_INTERNAL);
    {
        uint32_t after = 0;
        CHECK_STATUS(trainprof_register_name("AfterPanic", &after), TRAINPROF_STATUS_OK);
        int64_t s = trainprof_now_us();
        RECORD_OK(trainprof_record(forward, after, s, s + 1, -1, NULL, 0));
    }

    /* --- stats ------------------------------------------------------------------------------- */
    CHECK_STATUS(trainprof_stats(NULL), TRAINPROF_STATUS_NULL_ARGUMENT);
    CHECK_STATUS(trainprof_stats(&stats), TRAINPROF_STATUS_OK);
    CHECK(stats.dropped_queue_full == 0 && stats.dropped_writer == 0 && stats.open_failures == 0);
    CHECK(stats.written <= (uint64_t)recorded);
    CHECK(trainprof_dropped_events() == 0);

    /* --- shutdown ---------------------------------------------------------------------------- */
    CHECK_STATUS(trainprof_shutdown(30000), TRAINPROF_STATUS_OK);
    CHECK_STATUS(trainprof_shutdown(30000), TRAINPROF_STATUS_SHUT_DOWN);
    CHECK_STATUS(trainprof_stats(&stats), TRAINPROF_STATUS_OK);
    CHECK(stats.written == (uint64_t)recorded);
    CHECK(stats.files_sealed >= 1);
    CHECK(stats.dropped_queue_full == 0 && stats.dropped_writer == 0 && stats.open_failures == 0);
    printf("recorded=%ld\n", recorded);
    printf("written=%llu\n", (unsigned long long)stats.written);
    printf("files_sealed=%llu\n", (unsigned long long)stats.files_sealed);

    /* After shutdown: events and steps are refused, the hook stays down. */
    int64_t s = trainprof_now_us();
    CHECK_STATUS(trainprof_record(forward, net, s, s + 1, -1, NULL, 0), TRAINPROF_STATUS_SHUT_DOWN);
    CHECK_STATUS(trainprof_record(forward, net, s, s + 1, -1, args, 5), TRAINPROF_STATUS_SHUT_DOWN);
    CHECK_STATUS(trainprof_step_begin(TRAINPROF_MODE_TRAIN, -1, NULL), TRAINPROF_STATUS_SHUT_DOWN);
    CHECK_STATUS(trainprof_step_end(), TRAINPROF_STATUS_SHUT_DOWN);
    CHECK_STATUS(trainprof_register_name("Late", &id), TRAINPROF_STATUS_SHUT_DOWN);
    CHECK_STATUS(trainprof_window_active(TRAINPROF_FEATURE_DETAILED, 5, NULL, &active), TRAINPROF_STATUS_SHUT_DOWN);
    CHECK(active == 0);
    CHECK_STATUS(trainprof_init("pytorch"), TRAINPROF_STATUS_SHUT_DOWN);
    /* Python windows still work, so that the post-close window can end at exit. */
    CHECK_STATUS(trainprof_python_boundary(TRAINPROF_BOUNDARY_CLOSE, &window), TRAINPROF_STATUS_OK);
    CHECK_STATUS(trainprof_python_boundary(TRAINPROF_BOUNDARY_EXIT, &window), TRAINPROF_STATUS_OK);
    CHECK_STATUS(trainprof_node_id(node, sizeof node), TRAINPROF_STATUS_OK);
    CHECK_STATUS(trainprof_selftest_panic(), TRAINPROF_STATUS_INTERNAL);
    CHECK(trainprof_dropped_events() == 0);
    {
        TrainprofStats again;
        CHECK_STATUS(trainprof_stats(&again), TRAINPROF_STATUS_OK);
        CHECK(memcmp(&again, &stats, sizeof stats) == 0);
    }

    printf("failures=%d\n", failures);
    return failures == 0 ? 0 : 1;
}
