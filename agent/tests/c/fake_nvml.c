/*
 * A fake libnvidia-ml.so.1 for the GPU sampler's tests (agent/src/sample/gpu.rs).
 *
 * It exports only the NVML functions that nvml-wrapper calls on the sampler's path, with
 * the C signatures and structure layouts of nvml.h. nvml-wrapper resolves every symbol
 * lazily: a function missing here is an error only when it is called, which is how the
 * tests check that a missing function switches one field off.
 *
 * Two GPUs:
 *   gpu0 "Fake GPU A", every field; its first temperature read fails with
 *        NVML_ERROR_UNKNOWN (a transient error), the later ones succeed.
 *   gpu1 "Fake GPU B", power usage and power limit NVML_ERROR_NOT_SUPPORTED.
 *
 * Built by the tests with `cc -shared -fPIC`, and these switches for other machines:
 *   -DFAKE_NVML_NO_CLOCK       no nvmlDeviceGetClockInfo symbol at all
 *   -DFAKE_NVML_DEVICES=N      N GPUs instead of 2 (0 for a machine without GPUs)
 *   -DFAKE_NVML_INIT_RESULT=R  nvmlInit_v2 returns R (9: NVML_ERROR_DRIVER_NOT_LOADED)
 */

#include <stddef.h>
#include <string.h>

typedef int nvmlReturn_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define NVML_ERROR_UNKNOWN 999

#define NVML_TEMPERATURE_GPU 0
#define NVML_CLOCK_SM 1

#ifndef FAKE_NVML_DEVICES
#define FAKE_NVML_DEVICES 2
#endif
#ifndef FAKE_NVML_INIT_RESULT
#define FAKE_NVML_INIT_RESULT NVML_SUCCESS
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

struct nvmlDevice_st {
    const char *name;
    const char *uuid;
    unsigned int gpu_util, mem_busy;
    unsigned long long mem_total, mem_used;
    int has_power;
    unsigned int power_mw, power_limit_mw;
    unsigned int temperature_c, sm_clock_mhz;
    unsigned int temperature_reads;
};
typedef struct nvmlDevice_st *nvmlDevice_t;

static struct nvmlDevice_st devices[2] = {
    {"Fake GPU A", "GPU-00000000-0000-0000-0000-00000000000a", 87, 41, 16ull << 30, 4ull << 30, 1,
     212500, 300000, 64, 1410, 0},
    {"Fake GPU B", "GPU-00000000-0000-0000-0000-00000000000b", 3, 1, 8ull << 30, 2ull << 30, 0, 0, 0, 35,
     1095, 0},
};

static int initialized;

static nvmlReturn_t device_ok(nvmlDevice_t device) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    for (int i = 0; i < FAKE_NVML_DEVICES && i < 2; i++)
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
    if (FAKE_NVML_INIT_RESULT != NVML_SUCCESS) return FAKE_NVML_INIT_RESULT;
    initialized = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown(void) {
    initialized = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    return copy_string("550.54.15", version, length);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *count = FAKE_NVML_DEVICES;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || index >= FAKE_NVML_DEVICES || index >= 2) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    nvmlReturn_t r = device_ok(device);
    return r != NVML_SUCCESS ? r : copy_string(device->name, name, length);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    nvmlReturn_t r = device_ok(device);
    return r != NVML_SUCCESS ? r : copy_string(device->uuid, uuid, length);
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit) {
    nvmlReturn_t r = device_ok(device);
    if (r != NVML_SUCCESS) return r;
    if (!device->has_power) return NVML_ERROR_NOT_SUPPORTED;
    *limit = device->power_limit_mw;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    nvmlReturn_t r = device_ok(device);
    if (r != NVML_SUCCESS) return r;
    utilization->gpu = device->gpu_util;
    utilization->memory = device->mem_busy;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
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
    nvmlReturn_t r = device_ok(device);
    if (r != NVML_SUCCESS) return r;
    if (!device->has_power) return NVML_ERROR_NOT_SUPPORTED;
    *power = device->power_mw;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int *temp) {
    nvmlReturn_t r = device_ok(device);
    if (r != NVML_SUCCESS) return r;
    if (sensor != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    if (device == &devices[0] && device->temperature_reads++ == 0) return NVML_ERROR_UNKNOWN;
    *temp = device->temperature_c;
    return NVML_SUCCESS;
}

#ifndef FAKE_NVML_NO_CLOCK
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int *clock) {
    nvmlReturn_t r = device_ok(device);
    if (r != NVML_SUCCESS) return r;
    if (type != NVML_CLOCK_SM) return NVML_ERROR_NOT_SUPPORTED;
    *clock = device->sm_clock_mhz;
    return NVML_SUCCESS;
}
#endif
