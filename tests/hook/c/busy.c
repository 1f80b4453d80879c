/* A plain C program with no trainprof calls: prints how many threads it has, then spins
 * in one named function for argv[1] seconds of wall time; with argv[2] = "thread" the
 * spinning is done by a second thread while main waits for it in pthread_join. The
 * native-profiling tests preload libtrainprof_hook.so into it (tests/hook/test_native.py). */
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int task_count(void) {
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    struct dirent *e;
    if (!d) return -1;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The hot loop: pure arithmetic, so the samples land in this function. */
__attribute__((noinline)) unsigned long trainprof_busy_native_loop(unsigned long n) {
    volatile unsigned long acc = 0;
    for (unsigned long i = 0; i < n; i++) acc = acc * 6364136223846793005UL + i;
    return acc;
}

static double seconds;
static unsigned long sink;

static void *spin(void *arg) {
    (void)arg;
    double end = now() + seconds;
    while (now() < end) sink += trainprof_busy_native_loop(2000000);
    return NULL;
}

int main(int argc, char **argv) {
    seconds = argc > 1 ? atof(argv[1]) : 0.0;
    printf("tasks %d\n", task_count());
    fflush(stdout);
    if (argc > 2 && strcmp(argv[2], "thread") == 0) {
        pthread_t t;
        if (pthread_create(&t, NULL, spin, NULL) != 0 || pthread_join(t, NULL) != 0) return 3;
    } else {
        spin(NULL);
    }
    printf("done %lu\n", sink & 1);
    return 0;
}
