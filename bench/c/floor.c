/* The floor for the agent's sampling cost (bench/agent_vs_psutil.py): the least a
 * collector of the same figures can do. It opens the files the agent keeps open once, and
 * at each deadline (start + k * interval, CLOCK_MONOTONIC, absolute sleeps like the agent's
 * loop) re-reads each one from offset 0 with pread and writes one JSON line of the agent's
 * bytes-per-tick size with one write(2). No parsing, no formatting beyond a timestamp: what
 * remains is the kernel's cost of producing the files and of the write, which any collector
 * pays.
 *
 *   floor OUT INTERVAL_MS BYTES_PER_TICK FILE...
 *
 * Stops at SIGTERM or SIGINT. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_signal(int sig) {
    (void)sig;
    stop = 1;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s OUT INTERVAL_MS BYTES_PER_TICK FILE...\n", argv[0]);
        return 2;
    }
    long interval_ms = strtol(argv[2], NULL, 10);
    long bytes = strtol(argv[3], NULL, 10);
    if (interval_ms <= 0 || bytes < 64 || bytes > (1 << 24)) {
        fprintf(stderr, "bad interval or size\n");
        return 2;
    }
    int n = argc - 4;
    int *fds = calloc((size_t)(n > 0 ? n : 1), sizeof(int));
    char *line = malloc((size_t)bytes + 64);
    static char buf[1 << 16];
    if (fds == NULL || line == NULL) return 1;
    for (int i = 0; i < n; i++) {
        fds[i] = open(argv[4 + i], O_RDONLY | O_CLOEXEC);
        if (fds[i] < 0) fprintf(stderr, "floor: cannot open %s: %s (left out)\n", argv[4 + i], strerror(errno));
    }
    int out = open(argv[1], O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (out < 0) {
        fprintf(stderr, "floor: cannot create %s: %s\n", argv[1], strerror(errno));
        return 1;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    struct timespec start, next;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (long k = 1; !stop; k++) {
        long long ns = (long long)start.tv_nsec + (long long)k * interval_ms * 1000000LL;
        next.tv_sec = start.tv_sec + (time_t)(ns / 1000000000LL);
        next.tv_nsec = (long)(ns % 1000000000LL);
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL) == EINTR && !stop) {}
        if (stop) break;
        for (int i = 0; i < n; i++) {
            if (fds[i] < 0) continue;
            off_t at = 0;
            ssize_t got;
            while ((got = pread(fds[i], buf, sizeof buf, at)) > 0) at += got;
        }
        struct timespec wall;
        clock_gettime(CLOCK_REALTIME, &wall);
        /* {"Type":"floor","Pad":"xxx…","Timestamp":S.UUUUUU}\n, BYTES_PER_TICK long. */
        char tail[64];
        int tl = snprintf(tail, sizeof tail, "\",\"Timestamp\":%lld.%06ld}\n", (long long)wall.tv_sec,
                          wall.tv_nsec / 1000);
        const char *head = "{\"Type\":\"floor\",\"Pad\":\"";
        size_t hl = strlen(head);
        long pad = bytes - (long)hl - tl;
        if (pad < 0) pad = 0;
        memcpy(line, head, hl);
        memset(line + hl, 'x', (size_t)pad);
        memcpy(line + hl + (size_t)pad, tail, (size_t)tl);
        if (write(out, line, hl + (size_t)pad + (size_t)tl) < 0) {
            fprintf(stderr, "floor: write: %s\n", strerror(errno));
            return 1;
        }
    }
    close(out);
    return 0;
}
