/*
 * loadgen.c - the tunnel and bulk load generator of the egress bench.
 *
 * A Python client is the bottleneck on a shared core, so tunnels and bulk transfers are driven
 * from C: one thread per connection, blocking sockets, loopback (127.0.0.1) only.
 *
 *   loadgen tunnels PROXY_PORT TARGET_PORT CONCURRENCY SECONDS
 *       each thread loops: connect, CONNECT 127.0.0.1:TARGET_PORT, one GET, close.
 *   loadgen bulk PROXY_PORT TARGET_PORT STREAMS TOTAL_BYTES
 *       each thread opens one tunnel, asks the raw source for TOTAL_BYTES/STREAMS bytes
 *       ("N\n"), and reads them; all streams start together after a barrier.
 *
 * PROXY_PORT 0 means the direct path: connect straight to the target, no CONNECT.
 * Prints one JSON object on stdout.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int proxy_port, target_port;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int dial(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int write_all(int fd, const char *buf, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Reads one response head into buf; returns its length or -1. Extra bytes stay in buf after. */
static ssize_t read_head(int fd, char *buf, size_t cap, size_t *got) {
    *got = 0;
    while (*got < cap - 1) {
        ssize_t n = read(fd, buf + *got, cap - 1 - *got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        *got += (size_t)n;
        buf[*got] = 0;
        char *end = strstr(buf, "\r\n\r\n");
        if (end) return end + 4 - buf;
    }
    return -1;
}

static int status_ok(const char *head) {
    return strncmp(head, "HTTP/1.", 7) == 0 && strncmp(head + 8, " 200", 4) == 0;
}

/* Opens a tunnel to the target (or connects directly); returns fd or -1. */
static int open_tunnel(void) {
    if (proxy_port == 0) return dial(target_port);
    int fd = dial(proxy_port);
    if (fd < 0) return -1;
    char req[160], head[4096];
    int len = snprintf(req, sizeof req,
                       "CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n",
                       target_port, target_port);
    size_t got;
    ssize_t hl;
    if (write_all(fd, req, (size_t)len) < 0 || (hl = read_head(fd, head, sizeof head, &got)) < 0 ||
        !status_ok(head) || (size_t)hl != got) {
        close(fd);
        return -1;
    }
    return fd;
}

/* One GET through an open tunnel; reads the whole Content-Length body. 0 on success. */
static int one_get(int fd) {
    char req[160], buf[4096];
    int len = snprintf(req, sizeof req,
                       "GET / HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n\r\n",
                       target_port);
    size_t got;
    ssize_t hl;
    if (write_all(fd, req, (size_t)len) < 0 || (hl = read_head(fd, buf, sizeof buf, &got)) < 0 ||
        !status_ok(buf))
        return -1;
    char *cl = strcasestr(buf, "\r\ncontent-length:");
    if (!cl || cl > buf + hl) return -1;
    size_t want = (size_t)strtoul(cl + 17, NULL, 10), have = got - (size_t)hl;
    while (have < want) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        have += (size_t)n;
    }
    return 0;
}

struct tunnel_worker {
    pthread_t tid;
    uint64_t deadline;
    uint64_t *lat_ns;
    size_t n, cap, errors;
};

static void *tunnel_loop(void *arg) {
    struct tunnel_worker *w = arg;
    while (now_ns() < w->deadline) {
        uint64_t t0 = now_ns();
        int fd = open_tunnel();
        int ok = fd >= 0 && one_get(fd) == 0;
        if (fd >= 0) close(fd);
        if (!ok) {
            w->errors++;
            usleep(1000);
            continue;
        }
        if (w->n == w->cap) {
            w->cap = w->cap ? w->cap * 2 : 4096;
            w->lat_ns = realloc(w->lat_ns, w->cap * sizeof *w->lat_ns);
            if (!w->lat_ns) abort();
        }
        w->lat_ns[w->n++] = now_ns() - t0;
    }
    return NULL;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static double pct_ms(const uint64_t *v, size_t n, double p) {
    if (n == 0) return 0.0;
    size_t i = (size_t)(p / 100.0 * (double)(n - 1) + 0.5);
    return (double)v[i] / 1e6;
}

static int run_tunnels(int conc, double seconds) {
    struct tunnel_worker *ws = calloc((size_t)conc, sizeof *ws);
    uint64_t t0 = now_ns(), deadline = t0 + (uint64_t)(seconds * 1e9);
    for (int i = 0; i < conc; i++) {
        ws[i].deadline = deadline;
        pthread_create(&ws[i].tid, NULL, tunnel_loop, &ws[i]);
    }
    size_t total = 0, errors = 0;
    for (int i = 0; i < conc; i++) {
        pthread_join(ws[i].tid, NULL);
        total += ws[i].n;
        errors += ws[i].errors;
    }
    double elapsed = (double)(now_ns() - t0) / 1e9;
    uint64_t *all = malloc((total ? total : 1) * sizeof *all);
    size_t k = 0;
    for (int i = 0; i < conc; i++) {
        memcpy(all + k, ws[i].lat_ns, ws[i].n * sizeof *all);
        k += ws[i].n;
        free(ws[i].lat_ns);
    }
    qsort(all, total, sizeof *all, cmp_u64);
    printf("{\"mode\": \"tunnels\", \"concurrency\": %d, \"tunnels\": %zu, \"errors\": %zu, "
           "\"seconds\": %.6f, \"per_s\": %.1f, \"p50_ms\": %.4f, \"p99_ms\": %.4f, "
           "\"max_ms\": %.4f}\n",
           conc, total, errors, elapsed, (double)total / elapsed, pct_ms(all, total, 50),
           pct_ms(all, total, 99), total ? (double)all[total - 1] / 1e6 : 0.0);
    free(all);
    free(ws);
    return 0;
}

struct bulk_worker {
    pthread_t tid;
    pthread_barrier_t *barrier;
    uint64_t want, got, end_ns;
    int failed;
};

static void *bulk_stream(void *arg) {
    struct bulk_worker *w = arg;
    int fd = open_tunnel();
    w->failed = fd < 0;
    pthread_barrier_wait(w->barrier);
    if (fd < 0) return NULL;
    char line[32];
    int len = snprintf(line, sizeof line, "%llu\n", (unsigned long long)w->want);
    char *buf = malloc(1 << 18);
    if (write_all(fd, line, (size_t)len) == 0) {
        while (w->got < w->want) {
            ssize_t n = read(fd, buf, 1 << 18);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break;
            w->got += (uint64_t)n;
        }
    }
    w->end_ns = now_ns();
    free(buf);
    w->failed = w->got != w->want;
    close(fd);
    return NULL;
}

static int run_bulk(int streams, uint64_t total) {
    struct bulk_worker *ws = calloc((size_t)streams, sizeof *ws);
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, (unsigned)streams + 1);
    for (int i = 0; i < streams; i++) {
        ws[i].barrier = &barrier;
        ws[i].want = total / (uint64_t)streams;
        pthread_create(&ws[i].tid, NULL, bulk_stream, &ws[i]);
    }
    pthread_barrier_wait(&barrier);
    uint64_t t0 = now_ns(), end = t0, got = 0;
    int failed = 0;
    for (int i = 0; i < streams; i++) {
        pthread_join(ws[i].tid, NULL);
        got += ws[i].got;
        failed += ws[i].failed;
        if (ws[i].end_ns > end) end = ws[i].end_ns;
    }
    double elapsed = (double)(end - t0) / 1e9;
    printf("{\"mode\": \"bulk\", \"streams\": %d, \"bytes\": %llu, \"failed_streams\": %d, "
           "\"seconds\": %.6f, \"mb_per_s\": %.1f}\n",
           streams, (unsigned long long)got, failed, elapsed,
           elapsed > 0 ? (double)got / 1e6 / elapsed : 0.0);
    free(ws);
    return failed ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: loadgen tunnels|bulk PROXY_PORT TARGET_PORT N SECONDS|BYTES\n");
        return 2;
    }
    proxy_port = atoi(argv[2]);
    target_port = atoi(argv[3]);
    int n = atoi(argv[4]);
    if (n < 1 || target_port < 1) return 2;
    if (strcmp(argv[1], "tunnels") == 0) return run_tunnels(n, atof(argv[5]));
    if (strcmp(argv[1], "bulk") == 0) return run_bulk(n, strtoull(argv[5], NULL, 10));
    return 2;
}
