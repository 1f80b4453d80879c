/*
 * A fake libnvidia-ml.so.1 for the GPU sampler's tests (agent/src/pipeline/sample/gpu/) and its cost
 * benchmark (BENCHMARKS.md, "NVML cost").
 *
 * It exports only the NVML functions that nvml-wrapper calls on the sampler's path, with
 * the C signatures and structure layouts of nvml.h. nvml-wrapper resolves every symbol
 * lazily: a function missing here is an error only when it is called, which is how the
 * tests check that a missing function switches one field off.
 *
 * Time, as on a real GPU: the sample buffers fill with the wall clock, not with reads. Sample
 * k of a buffer has the timestamp t0 + k * FAKE_NVML_SAMPLE_US (CLOCK_REALTIME, µs, as NVML's);
 * a buffer holds the newest FAKE_NVML_RING samples, and is full at nvmlInit (a driver that
 * has run a while). Reading a buffer changes nothing.
 *
 * Cost, as on a real GPU: FAKE_NVML_COST_US (read once, at the first call) is a comma list of
 * `FUNCTION=µs` (e.g. `nvmlDeviceGetSamples=1380`) and `nvmlDeviceGetFieldValues:ID=µs` (a
 * field batch costs its function's cost plus the sum of its fields'). A call spends that
 * much CPU time busy, measured with the calling thread's CPU clock
 * (CLOCK_THREAD_CPUTIME_ID). Unset: no cost.
 *
 * GPUs (values are scripted):
 *   gpu0 "Fake GPU A", every field:
 *     - its first temperature read fails with NVML_ERROR_UNKNOWN (transient), later ones
 *       succeed;
 *     - sample buffers (above): sample k of the GPU buffer is {50,100,80,90}[k % 4], of the
 *       memory buffer {30,40,50,60}[k % 4]; the instant utilisation is the newest sample of
 *       each, as NVML's nvmlDeviceGetUtilizationRates is;
 *     - running compute processes: pids 101 (1 GiB) and 202 (2 GiB), and 303 (512 MiB), or,
 *       when FAKE_NVML_PIDS_FILE names a file, the pids listed in it ((i+1) GiB each) and
 *       4194000 (512 MiB);
 *     - process utilisation: a buffer like the others, one sample per listed pid and per
 *       period (timestamp + i for the i-th pid): the listed pid i has SM 60 - 10 i and memory
 *       busy 20 - 5 i; the extra pid SM 5, memory 1;
 *     - throttle reasons SW power cap | HW thermal slowdown (0x44);
 *     - field values: at the n-th call (from 1) of a GPU that asks for a counter (PCIe,
 *       NVLink or energy): PCIe TX n * 1e6 bytes, RX n * 2e6;
 *       NVLink TX n * 1000 KiB, RX n * 3000 KiB (only with scopeId UINT_MAX, all links;
 *       another scope is NVML_ERROR_INVALID_ARGUMENT for that field); power 215 W instant;
 *       energy n * 21250 mJ; ECC counters SBE volatile 2, DBE volatile 0, SBE aggregate 7,
 *       DBE aggregate 1;
 *     - GPM supported: SM active 61.5, SM occupancy 33.25, tensor active 44, DRAM 12.5 %;
 *     - events: Xid, single- and double-bit ECC supported; its event set's first wait
 *       returns Xid 79, the third a single-bit ECC error, every other one times out.
 *   gpu1 "Fake GPU B": power usage and power limit NVML_ERROR_NOT_SUPPORTED; sample
 *     buffers, process utilisation and GPM not supported; instant utilisation 3 %, memory
 *     busy 1 %; no running processes; no throttling; of the fields only PCIe (NVLink,
 *     instant power, energy, ECC: not supported); no events supported.
 *   gpu2.. (with -DFAKE_NVML_DEVICES=N, up to 8) behave like gpu0.
 *
 * Every exported function counts one call: fake_nvml_call_count() returns the total;
 * fake_nvml_sample_us() the sample period.
 *
 * Built by the tests with `cc -shared -fPIC`, and these switches for other machines:
 *   -DFAKE_NVML_NO_CLOCK       no nvmlDeviceGetClockInfo symbol at all
 *   -DFAKE_NVML_DEVICES=N      N GPUs instead of 2 (0 for a machine without GPUs; at most 8)
 *   -DFAKE_NVML_INIT_RESULT=R  nvmlInit_v2 returns R (9: NVML_ERROR_DRIVER_NOT_LOADED)
 *   -DFAKE_NVML_MANY_PROCESSES 100 more compute processes on the full GPUs (pids 5000-5099,
 *                              1 MiB each): more than a caller's first guess of the size
 *   -DFAKE_NVML_SAMPLE_US=P    the buffers' sample period, µs (default 200000: 5 a second)
 *   -DFAKE_NVML_RING=N         samples a buffer holds (default 70: 14 s, as an H200's)
 */

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_TIMEOUT 10
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define NVML_ERROR_UNKNOWN 999

#define NVML_TEMPERATURE_GPU 0
#define NVML_CLOCK_SM 1
#define NVML_GPU_UTILIZATION_SAMPLES 1
#define NVML_MEMORY_UTILIZATION_SAMPLES 2
#define NVML_VALUE_TYPE_UNSIGNED_INT 1
#define NVML_VALUE_TYPE_UNSIGNED_LONG_LONG 3

#define EVENT_SINGLE_BIT_ECC 0x1ull
#define EVENT_DOUBLE_BIT_ECC 0x2ull
#define EVENT_PSTATE 0x4ull
#define EVENT_XID 0x8ull

#ifndef FAKE_NVML_DEVICES
#define FAKE_NVML_DEVICES 2
#endif
#ifndef FAKE_NVML_INIT_RESULT
#define FAKE_NVML_INIT_RESULT NVML_SUCCESS
#endif
#define MAX_DEVICES 8
#ifndef FAKE_NVML_SAMPLE_US
#define FAKE_NVML_SAMPLE_US 200000ull
#endif
#ifndef FAKE_NVML_RING
#define FAKE_NVML_RING 70ull
#endif

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

typedef union {
    double dVal;
    int siVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned long long timeStamp;
    nvmlValue_t sampleValue;
} nvmlSample_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil;
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

struct nvmlDevice_st {
    char name[32];
    char uuid[48];
    int full; /* 1: behaves like gpu0; 0: like gpu1 */
    unsigned int gpu_util, mem_busy;
    unsigned long long mem_total, mem_used;
    unsigned int power_mw, power_limit_mw;
    unsigned int temperature_c, sm_clock_mhz;
    unsigned int temperature_reads;
    unsigned long long field_calls;
};
typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

struct nvmlEventSet_st {
    int used;
    nvmlDevice_t device;
    unsigned long long types;
    unsigned int waits;
};
typedef struct nvmlEventSet_st *nvmlEventSet_t;

struct nvmlGpmSample_st {
    int used;
    nvmlDevice_t device;
    unsigned long long seq;
};
typedef struct nvmlGpmSample_st *nvmlGpmSample_t;

typedef struct {
    unsigned int version;
    unsigned int isSupportedDevice;
} nvmlGpmSupport_t;

typedef struct {
    unsigned int metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    struct {
        char *shortName;
        char *longName;
        char *unit;
    } metricInfo;
} nvmlGpmMetric_t;

typedef struct {
    unsigned int version;
    unsigned int numMetrics;
    nvmlGpmSample_t sample1;
    nvmlGpmSample_t sample2;
    nvmlGpmMetric_t metrics[210];
} nvmlGpmMetricsGet_t;

static struct nvmlDevice_st devices[MAX_DEVICES];
static struct nvmlEventSet_st event_sets[4 * MAX_DEVICES];
static struct nvmlGpmSample_st gpm_samples[8 * MAX_DEVICES];
static unsigned long long gpm_seq;
static int initialized;
static unsigned long long calls;

/* ---- cost ---- */

#define MAX_COSTS 64

/* FAKE_NVML_COST_US, parsed: a function's name, or `nvmlDeviceGetFieldValues:ID`. */
static struct {
    char name[64];
    double us;
} costs[MAX_COSTS];
static int cost_count = -1; /* -1: not parsed yet */

static void parse_costs(void) {
    cost_count = 0;
    const char *env = getenv("FAKE_NVML_COST_US");
    if (env == NULL) return;
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", env);
    for (char *save = NULL, *item = strtok_r(buf, ",", &save); item != NULL && cost_count < MAX_COSTS;
         item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        if (eq == NULL) continue;
        *eq = '\0';
        snprintf(costs[cost_count].name, sizeof costs[cost_count].name, "%s", item);
        costs[cost_count].us = strtod(eq + 1, NULL);
        cost_count++;
    }
}

static double cost_of(const char *name) {
    if (cost_count < 0) parse_costs();
    for (int i = 0; i < cost_count; i++)
        if (strcmp(costs[i].name, name) == 0) return costs[i].us;
    return 0;
}

static double field_cost(unsigned int id) {
    char name[64];
    snprintf(name, sizeof name, "nvmlDeviceGetFieldValues:%u", id);
    return cost_of(name);
}

static double thread_cpu_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

/* Spends `us` of this thread's CPU time, busy. */
static void burn(double us) {
    if (us <= 0) return;
    double until = thread_cpu_us() + us;
    volatile unsigned long long spin = 0;
    while (thread_cpu_us() < until)
        for (int i = 0; i < 64; i++) spin++;
}

/* At the start of every exported NVML function: counts the call and spends its cost (looked
 * up once per function). */
#define CALL()                                         \
    do {                                               \
        static double cost_ = -1;                      \
        calls++;                                       \
        if (cost_ < 0) cost_ = cost_of(__func__);      \
        burn(cost_);                                   \
    } while (0)

unsigned long long fake_nvml_call_count(void) { return calls; }
unsigned long long fake_nvml_sample_us(void) { return FAKE_NVML_SAMPLE_US; }

/* ---- time ---- */

/* When sample 0 was taken: the ring is full at nvmlInit. */
static unsigned long long t0_us;

static unsigned long long now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (unsigned long long)t.tv_sec * 1000000ull + (unsigned long long)t.tv_nsec / 1000ull;
}

/* The newest sample's number (each buffer's samples share their numbers and timestamps). */
static unsigned long long head(void) { return (now_us() - t0_us) / FAKE_NVML_SAMPLE_US; }

/* The oldest sample still held. */
static unsigned long long tail(unsigned long long h) { return h >= FAKE_NVML_RING ? h - FAKE_NVML_RING + 1 : 1; }

static unsigned long long stamp(unsigned long long k) { return t0_us + k * FAKE_NVML_SAMPLE_US; }

static const unsigned int gpu_values[4] = {50, 100, 80, 90}, mem_values[4] = {30, 40, 50, 60};

static int device_count(void) { return FAKE_NVML_DEVICES < MAX_DEVICES ? FAKE_NVML_DEVICES : MAX_DEVICES; }

static void setup(void) {
    for (int i = 0; i < MAX_DEVICES; i++) {
        struct nvmlDevice_st *d = &devices[i];
        memset(d, 0, sizeof *d);
        d->full = i != 1;
        snprintf(d->name, sizeof d->name, "Fake GPU %c", 'A' + i);
        snprintf(d->uuid, sizeof d->uuid, "GPU-00000000-0000-0000-0000-%012x", 0xa + i);
        if (d->full) {
            d->gpu_util = 87, d->mem_busy = 41, d->mem_total = 16ull << 30, d->mem_used = 4ull << 30;
            d->power_mw = 212500, d->power_limit_mw = 300000, d->temperature_c = 64, d->sm_clock_mhz = 1410;
        } else {
            d->gpu_util = 3, d->mem_busy = 1, d->mem_total = 8ull << 30, d->mem_used = 2ull << 30;
            d->temperature_c = 35, d->sm_clock_mhz = 1095;
        }
    }
}

static nvmlReturn_t device_ok(nvmlDevice_t device) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    for (int i = 0; i < device_count(); i++)
        if (device == &devices[i]) return NVML_SUCCESS;
    return NVML_ERROR_INVALID_ARGUMENT;
}

static nvmlReturn_t copy_string(const char *s, char *out, unsigned int length) {
    if (out == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(s) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, s, strlen(s) + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) {
    CALL();
    if (FAKE_NVML_INIT_RESULT != NVML_SUCCESS) return FAKE_NVML_INIT_RESULT;
    if (!initialized) {
        setup();
        t0_us = now_us() - (FAKE_NVML_RING + 1) * FAKE_NVML_SAMPLE_US;
    }
    initialized = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown(void) {
    CALL();
    initialized = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    CALL();
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    return copy_string("550.54.15", version, length);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    CALL();
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *count = FAKE_NVML_DEVICES;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    CALL();
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || index >= (unsigned int)device_count()) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    CALL();
    nvmlReturn_t r = device_ok(device);
    return r != NVML_SUCCESS ? r : copy_string(device->name, name, length);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    CALL();
    nvmlReturn_t r = device_ok(device);
    return r != NVML_SUCCESS ? r : copy_string(device->uuid, uuid, length);
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit) {
    CALL();
    nvmlReturn_t r = device_ok(device);
    if (r != NVML_SUCCESS) return r;
    if (!device->full) return NVML_ERROR_NOT_SUPPORTED;
    *limit = device->power_limit_mw;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    CALL();
    nvmlReturn_t r = device_ok(device);
    if (r != NVML_SUCCESS) return r;
    if (device->full) {
        unsigned long long k = head();
        utilization->gpu = gpu_values[k % 4];
        utilization->memory = mem_values[k % 4];
    } else {
        utilization->gpu = device->gpu_util;
        utilization->memory = device->mem_busy;
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    CALL();
    nvmlReturn_t r = device_ok(device);
    if (r != NVML_SUCCESS) return r;
    if (memory == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = device->mem_total;
    memory->reserved = 0;
    memory->used = device->mem_used;
    memory->free = device->mem_total - device->mem_used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    CALL();
    nvmlReturn_t r = device_ok(device);
    if (r != NVML_SUCCESS) return r;
    if (!device->full) return NVML_ERROR_NOT_SUPPORTED;
    *power = device->power_mw;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int *temp) {
    CALL();
    nvmlReturn_t r = device_ok(device);
    if (r != NVML_SUCCESS) return r;
    if (sensor != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    if (device == &devices[0] && device->temperature_reads++ == 0) return NVML_ERROR_UNKNOWN;
    *temp = device->temperature_c;
    return NVML_SUCCESS;
}

#ifndef FAKE_NVML_NO_CLOCK
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int *clock) {
    CALL();
    nvmlReturn_t r = device_ok(device);
    if (r != NVML_SUCCESS) return r;
    if (type != NVML_CLOCK_SM) return NVML_ERROR_NOT_SUPPORTED;
    *clock = device->sm_clock_mhz;
    return NVML_SUCCESS;
}
#endif

/* ---- sample buffers ---- */

nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t device, int type, unsigned long long last_seen, int *value_type,
                                  unsigned int *count, nvmlSample_t *samples) {
    CALL();
    nvmlReturn_t r = device_ok(device);
    if (r != NVML_SUCCESS) return r;
    if (!device->full) return NVML_ERROR_NOT_SUPPORTED;
    if (count == NULL || value_type == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    const unsigned int *values;
    if (type == NVML_GPU_UTILIZATION_SAMPLES) values = gpu_values;
    else if (type == NVML_MEMORY_UTILIZATION_SAMPLES) values = mem_values;
    else return NVML_ERROR_NOT_SUPPORTED;
    *value_type = NVML_VALUE_TYPE_UNSIGNED_INT;
    unsigned long long h = head();
    unsigned int n = 0;
    for (unsigned long long k = tail(h); k <= h; k++) {
        unsigned long long ts = stamp(k);
        if (ts <= last_seen) continue;
        if (samples != NULL) {
            if (n >= *count) return NVML_ERROR_INSUFFICIENT_SIZE;
            samples[n].timeStamp = ts;
            samples[n].sampleValue.uiVal = values[k % 4];
        }
        n++;
    }
    *count = n;
    return NVML_SUCCESS;
}

/* ---- processes ---- */

#define MAX_PIDS 16

/* The listed pids and the extra one: from FAKE_NVML_PIDS_FILE, else 101, 202 and 303. */
static int pids(unsigned int *out, unsigned int *extra) {
    const char *path = getenv("FAKE_NVML_PIDS_FILE");
    if (path == NULL || *path == '\0') {
        out[0] = 101, out[1] = 202, *extra = 303;
        return 2;
    }
    *extra = 4194000;
    FILE *f = fopen(path, "r");
    if (f == NULL) return 0;
    int n = 0;
    while (n < MAX_PIDS && fscanf(f, "%u", &out[n]) == 1) n++;
    fclose(f);
    return n;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                     nvmlProcessInfo_t *infos) {
    CALL();
    nvmlReturn_t r = device_ok(device);
    if (r != NVML_SUCCESS) return r;
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int list[MAX_PIDS], extra;
    int n = device->full ? pids(list, &extra) : 0;
    unsigned int many = 0;
#ifdef FAKE_NVML_MANY_PROCESSES
    many = device->full ? 100 : 0;
#endif
    unsigned int total = device->full ? (unsigned int)n + 1 + many : 0;
    if (infos == NULL || *count < total) {
        *count = total;
        return total == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (int i = 0; i < n; i++) {
        memset(&infos[i], 0, sizeof infos[i]);
        infos[i].pid = list[i];
        infos[i].usedGpuMemory = (unsigned long long)(i + 1) << 30;
    }
    if (total > 0) {
        memset(&infos[n], 0, sizeof infos[n]);
        infos[n].pid = extra;
        infos[n].usedGpuMemory = 512ull << 20;
    }
    for (unsigned int i = 0; i < many; i++) {
        memset(&infos[n + 1 + i], 0, sizeof infos[0]);
        infos[n + 1 + i].pid = 5000 + i;
        infos[n + 1 + i].usedGpuMemory = 1ull << 20;
    }
    *count = total;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *out,
                                             unsigned int *count, unsigned long long last_seen) {
    CALL();
    nvmlReturn_t r = device_ok(device);
    if (r != NVML_SUCCESS) return r;
    if (!device->full) return NVML_ERROR_NOT_SUPPORTED;
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int list[MAX_PIDS], extra;
    int n = pids(list, &extra);
    unsigned long long h = head();
    unsigned int k = 0;
    for (unsigned long long p = tail(h); p <= h; p++) {
        unsigned long long ts = stamp(p);
        if (ts <= last_seen) continue;
        for (int i = 0; i <= n; i++) {
            if (out != NULL) {
                if (k >= *count) return NVML_ERROR_INSUFFICIENT_SIZE;
                memset(&out[k], 0, sizeof out[k]);
                out[k].timeStamp = ts + (unsigned long long)i;
                if (i < n) {
                    out[k].pid = list[i];
                    int sm = 60 - 10 * i, mem = 20 - 5 * i;
                    out[k].smUtil = sm > 0 ? (unsigned int)sm : 0;
                    out[k].memUtil = mem > 0 ? (unsigned int)mem : 0;
                } else {
                    out[k].pid = extra, out[k].smUtil = 5, out[k].memUtil = 1;
                }
            }
            k++;
        }
    }
    *count = k;
    return out == NULL && k > 0 ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}

/* ---- throttle reasons, field values ---- */

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons) {
    CALL();
    nvmlReturn_t r = device_ok(device);
    if (r != NVML_SUCCESS) return r;
    *reasons = device->full ? 0x44 : 0;
    return NVML_SUCCESS;
}

static void put_ull(nvmlFieldValue_t *v, unsigned long long x) {
    v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
    v->value.ullVal = x;
    v->nvmlReturn = NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int count, nvmlFieldValue_t *values) {
    CALL();
    nvmlReturn_t r = device_ok(device);
    if (r != NVML_SUCCESS) return r;
    if (values == NULL || count <= 0) return NVML_ERROR_INVALID_ARGUMENT;
    double cost = 0;
    int counters = 0;
    for (int i = 0; i < count; i++) {
        unsigned int id = values[i].fieldId;
        cost += field_cost(id);
        counters |= id == 197 || id == 198 || id == 138 || id == 139 || id == 83;
    }
    burn(cost);
    unsigned long long n = device->field_calls += (unsigned long long)counters;
    for (int i = 0; i < count; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = (long long)n * 100000;
        v->latencyUsec = 0;
        int nvlink = v->fieldId == 138 || v->fieldId == 139;
        if (v->fieldId == 197) put_ull(v, n * 1000000);
        else if (v->fieldId == 198) put_ull(v, n * 2000000);
        else if (!device->full) v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        else if (nvlink && v->scopeId != 0xffffffffu) v->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT;
        else if (v->fieldId == 138) put_ull(v, n * 1000);
        else if (v->fieldId == 139) put_ull(v, n * 3000);
        else if (v->fieldId == 186) {
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            v->value.uiVal = 215000;
            v->nvmlReturn = NVML_SUCCESS;
        } else if (v->fieldId == 83) put_ull(v, n * 21250);
        else if (v->fieldId == 3) put_ull(v, 2);
        else if (v->fieldId == 4) put_ull(v, 0);
        else if (v->fieldId == 5) put_ull(v, 7);
        else if (v->fieldId == 6) put_ull(v, 1);
        else v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
    }
    return NVML_SUCCESS;
}

/* ---- events ---- */

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    CALL();
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    for (size_t i = 0; i < sizeof event_sets / sizeof event_sets[0]; i++) {
        if (!event_sets[i].used) {
            memset(&event_sets[i], 0, sizeof event_sets[i]);
            event_sets[i].used = 1;
            *set = &event_sets[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_UNKNOWN;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    CALL();
    if (set == NULL || !set->used) return NVML_ERROR_INVALID_ARGUMENT;
    set->used = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *types) {
    CALL();
    nvmlReturn_t r = device_ok(device);
    if (r != NVML_SUCCESS) return r;
    *types = device->full ? (EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC | EVENT_PSTATE | EVENT_XID) : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types, nvmlEventSet_t set) {
    CALL();
    nvmlReturn_t r = device_ok(device);
    if (r != NVML_SUCCESS) return r;
    if (set == NULL || !set->used) return NVML_ERROR_INVALID_ARGUMENT;
    if (!device->full || (types & EVENT_PSTATE)) return NVML_ERROR_NOT_SUPPORTED;
    set->device = device;
    set->types |= types;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    CALL();
    (void)timeout_ms;
    if (set == NULL || !set->used || data == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int wait = ++set->waits;
    memset(data, 0, sizeof *data);
    data->device = set->device;
    if (wait == 1 && (set->types & EVENT_XID)) {
        data->eventType = EVENT_XID;
        data->eventData = 79;
        return NVML_SUCCESS;
    }
    if (wait == 3 && (set->types & EVENT_SINGLE_BIT_ECC)) {
        data->eventType = EVENT_SINGLE_BIT_ECC;
        return NVML_SUCCESS;
    }
    return NVML_ERROR_TIMEOUT;
}

/* ---- GPM ---- */

nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *support) {
    CALL();
    nvmlReturn_t r = device_ok(device);
    if (r != NVML_SUCCESS) return r;
    if (support == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (support->version != 1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    support->isSupportedDevice = (unsigned int)device->full;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *sample) {
    CALL();
    if (sample == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    for (size_t i = 0; i < sizeof gpm_samples / sizeof gpm_samples[0]; i++) {
        if (!gpm_samples[i].used) {
            memset(&gpm_samples[i], 0, sizeof gpm_samples[i]);
            gpm_samples[i].used = 1;
            *sample = &gpm_samples[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_UNKNOWN; /* a leak in the caller ends here */
}

nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t sample) {
    CALL();
    if (sample == NULL || !sample->used) return NVML_ERROR_INVALID_ARGUMENT;
    sample->used = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t sample) {
    CALL();
    nvmlReturn_t r = device_ok(device);
    if (r != NVML_SUCCESS) return r;
    if (!device->full) return NVML_ERROR_NOT_SUPPORTED;
    if (sample == NULL || !sample->used) return NVML_ERROR_INVALID_ARGUMENT;
    sample->device = device;
    sample->seq = ++gpm_seq;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *m) {
    CALL();
    static char short_name[] = "fake", long_name[] = "fake GPM metric", unit[] = "%";
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (m == NULL || m->version != 1 || m->numMetrics > 210) return NVML_ERROR_INVALID_ARGUMENT;
    if (m->sample1 == NULL || m->sample2 == NULL || !m->sample1->used || !m->sample2->used ||
        m->sample1->device != m->sample2->device || m->sample1->seq >= m->sample2->seq)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < m->numMetrics; i++) {
        nvmlGpmMetric_t *x = &m->metrics[i];
        x->nvmlReturn = NVML_SUCCESS;
        x->metricInfo.shortName = short_name;
        x->metricInfo.longName = long_name;
        x->metricInfo.unit = unit;
        switch (x->metricId) {
            case 2: x->value = 61.5; break;  /* SM_UTIL */
            case 3: x->value = 33.25; break; /* SM_OCCUPANCY */
            case 5: x->value = 44.0; break;  /* ANY_TENSOR_UTIL */
            case 10: x->value = 12.5; break; /* DRAM_BW_UTIL */
            default: x->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    return NVML_SUCCESS;
}
