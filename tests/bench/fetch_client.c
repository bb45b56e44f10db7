/*
 * The measuring client of tests/bench/fetch.sh. In one process, rotating the
 * order round by round, it times
 *   broker:     http.fetch of http://bench.test:UP/ through the broker's RPC
 *               route, on one keep-alive connection to the broker (the
 *               broker resolves bench.test, validates, connects afresh,
 *               every call);
 *   direct:     what `curl --resolve bench.test:UP:127.0.0.1 http://bench.test:UP/`
 *               does on the wire: a fresh TCP connection to 127.0.0.1:UP,
 *               the same GET with Host: bench.test:UP, the response read to
 *               its end, the connection closed; no name resolution, no
 *               process start-up;
 *   resolved:   direct, after the name resolution the broker does: an A and
 *               an AAAA query for bench.test to the same dnsmasq, sent
 *               together, both answers awaited (what curl without --resolve
 *               would add); it tells how much of the gap is DNS;
 *   broker-ka:  http.fetch of http://bench.test:UP/ka with a second token (a
 *               second run): the upstream keeps those connections alive, so
 *               from the second fetch of that run on the broker reuses its
 *               parked connection (after resolving and validating afresh);
 *   resolved-ka: the same lookups, then GET /ka on one kept-alive connection
 *               to the upstream: a kept-alive direct request plus the lookups.
 * Every response is checked (status 200 and the 1024-byte body; for the
 * broker an RPC answer with "status":200 and the body's 1368 base64
 * characters; DNS answers without error); one failure ends the run with
 * exit status 1.
 *
 *   fetch_client BROKER_PORT TOKEN UPSTREAM_PORT DNS_PORT ROUNDS PER_ROUND WARMUP TOKEN_KA
 *   fetch_client BROKER_PORT TOKEN UPSTREAM_PORT DNS_PORT ROUNDS PER_ROUND WARMUP SECRET_TOKEN VALUE
 *
 * With SECRET_TOKEN (fetch_secret.sh) there are three sides, and the third is
 * "secret" instead of "resolved": the same fetch on a second keep-alive
 * connection, with the token of a run that holds one secret for bench.test
 * and the header "authorization: Bearer {{secret:bench}}", so the broker
 * substitutes it on the way out and redacts the answer on the way back, while
 * the "broker" side sends "authorization: Bearer VALUE" itself (the same
 * request bytes on the wire, without the feature); it prints
 * "paired_p50_ratio_secret=..": the median over rounds of secret p50 /
 * broker p50.
 *
 * Prints one line per side: "<side> n=.. p50_us=.. p90_us=.. p99_us=.. mean_us=.. min_us=.. max_us=..",
 * then "paired_p50_ratio=..", "paired_p50_ratio_resolved=.." and "paired_p50_ratio_ka=..": the
 * median over rounds of broker p50 / direct (resolved) p50, and broker-ka p50 / resolved-ka p50,
 * in the same round. Per-round lines go to stderr.
 *
 * Build (fetch.sh does this):
 *   gcc -std=c11 -O2 -D_GNU_SOURCE -Wall -Wextra -Werror -o fetch_client fetch_client.c
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define BODY_LEN 1024
#define B64_LEN 1368 /* base64 of 1024 bytes */

static char rbuf[1 << 20];

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void die(const char *what)
{
    fprintf(stderr, "fetch_client: %s%s%s\n", what, errno != 0 ? ": " : "", errno != 0 ? strerror(errno) : "");
    exit(1);
}

static int connect_loopback(int port)
{
    struct sockaddr_in sa;
    struct timeval tv = {5, 0};
    int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);

    if (fd < 0)
        die("socket");
    /* curl sets TCP_NODELAY; a 5 s receive timeout bounds a stuck exchange */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0)
        die("connect");
    return fd;
}

static void send_all(int fd, const char *p, size_t len)
{
    while (len != 0) {
        ssize_t n = write(fd, p, len);
        if (n <= 0)
            die("write");
        p += n;
        len -= (size_t)n;
    }
}

/*
 * Reads one response: the head, then Content-Length bytes (or up to the close when there is none).
 * Returns the status; *body and *body_len point into rbuf.
 */
static int read_response(int fd, const char **body, size_t *body_len)
{
    size_t got = 0, head_len = 0, cl = 0;
    int have_cl = 0, status;
    char *end;

    for (;;) {
        ssize_t n;
        if (head_len == 0 && (end = memmem(rbuf, got, "\r\n\r\n", 4)) != NULL) {
            char *line;
            head_len = (size_t)(end - rbuf) + 4;
            rbuf[head_len - 2] = '\0';
            for (line = strstr(rbuf, "\r\n"); line != NULL && line[2] != '\0'; line = strstr(line + 2, "\r\n"))
                if (strncasecmp(line + 2, "content-length:", 15) == 0) {
                    cl = strtoul(line + 17, NULL, 10);
                    have_cl = 1;
                }
            rbuf[head_len - 2] = '\r';
        }
        if (head_len != 0 && have_cl && got >= head_len + cl)
            break;
        if (got == sizeof(rbuf))
            die("response too large");
        n = read(fd, rbuf + got, sizeof(rbuf) - got);
        if (n < 0)
            die("read");
        if (n == 0) {
            if (head_len != 0 && !have_cl)
                break;
            errno = 0;
            die("connection closed before the response ended");
        }
        got += (size_t)n;
    }
    if (sscanf(rbuf, "HTTP/1.%*d %d", &status) != 1) {
        errno = 0;
        die("malformed status line");
    }
    *body = rbuf + head_len;
    *body_len = have_cl ? cl : got - head_len;
    return status;
}

static char direct_req[512], rpc_req[2048], direct_ka_req[512], rpc_ka_req[2048];
static size_t direct_req_len, rpc_req_len, direct_ka_req_len, rpc_ka_req_len;
static char rpc_req_secret[2048];
static size_t rpc_req_secret_len;

static void check_direct(int status, const char *body, size_t body_len)
{
    if (status != 200 || body_len != BODY_LEN || body[0] != 'a' || body[BODY_LEN - 1] != 'a' + (BODY_LEN - 1) % 26) {
        errno = 0;
        fprintf(stderr, "direct: status %d, %zu body bytes\n", status, body_len);
        die("unexpected direct response");
    }
}

static uint64_t time_direct(int up_port)
{
    const char *body;
    size_t body_len;
    uint64_t t0 = now_ns(), t1;
    int fd = connect_loopback(up_port), status;

    send_all(fd, direct_req, direct_req_len);
    status = read_response(fd, &body, &body_len);
    close(fd);
    t1 = now_ns();
    check_direct(status, body, body_len);
    return t1 - t0;
}

/*
 * The name resolution the broker does on every hop, alone: an A and an AAAA query for bench.test, both
 * sent, then both answers awaited (c-ares runs them side by side), to the same dnsmasq.
 */
static int dns_fd = -1;
static uint16_t dns_id;

static size_t dns_query(uint8_t *q, uint16_t id, uint16_t qtype)
{
    static const uint8_t name[] = "\x05"
                                  "bench"
                                  "\x04"
                                  "test";
    size_t n = 0;
    q[n++] = (uint8_t)(id >> 8);
    q[n++] = (uint8_t)id;
    q[n++] = 0x01; /* RD */
    q[n++] = 0x00;
    q[n++] = 0;
    q[n++] = 1; /* one question */
    memset(q + n, 0, 6);
    n += 6;
    memcpy(q + n, name, sizeof(name)); /* with the root label's 0 */
    n += sizeof(name);
    q[n++] = (uint8_t)(qtype >> 8);
    q[n++] = (uint8_t)qtype;
    q[n++] = 0;
    q[n++] = 1; /* IN */
    return n;
}

static void resolve(int dns_port)
{
    uint8_t q[64], a[512];
    uint16_t ids[2];
    int answered = 0;

    if (dns_fd < 0) {
        struct sockaddr_in sa;
        struct timeval tv = {2, 0};
        if ((dns_fd = socket(AF_INET, SOCK_DGRAM, 0)) < 0)
            die("socket");
        setsockopt(dns_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        memset(&sa, 0, sizeof(sa));
        sa.sin_family = AF_INET;
        sa.sin_port = htons((uint16_t)dns_port);
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(dns_fd, (struct sockaddr *)&sa, sizeof(sa)) != 0)
            die("connect (dns)");
    }
    for (int i = 0; i < 2; ++i) {
        size_t n;
        ids[i] = ++dns_id;
        n = dns_query(q, ids[i], i == 0 ? 1 : 28);
        if (send(dns_fd, q, n, 0) != (ssize_t)n)
            die("send (dns)");
    }
    while (answered != 3) {
        ssize_t n = recv(dns_fd, a, sizeof(a), 0);
        uint16_t id;
        if (n < 12)
            die("recv (dns)");
        id = (uint16_t)(a[0] << 8 | a[1]);
        if ((a[3] & 15) != 0) {
            errno = 0;
            die("dns: an error answer");
        }
        answered |= id == ids[0] ? 1 : id == ids[1] ? 2 : 0;
    }
}

static uint64_t time_resolved(int up_port, int dns_port)
{
    uint64_t t0 = now_ns();
    resolve(dns_port);
    time_direct(up_port);
    return now_ns() - t0;
}

/* the lookups, then GET /ka on the one kept-alive connection (made on first use, outside the timing) */
static int ka_fd = -1;

static uint64_t time_resolved_ka(int up_port, int dns_port)
{
    const char *body;
    size_t body_len;
    uint64_t t0, t1;
    int status;

    if (ka_fd < 0)
        ka_fd = connect_loopback(up_port);
    t0 = now_ns();
    resolve(dns_port);
    send_all(ka_fd, direct_ka_req, direct_ka_req_len);
    status = read_response(ka_fd, &body, &body_len);
    t1 = now_ns();
    check_direct(status, body, body_len);
    return t1 - t0;
}

static uint64_t time_broker(int fd, const char *req, size_t req_len)
{
    const char *body, *b64;
    size_t body_len;
    uint64_t t0 = now_ns(), t1;
    int status;

    send_all(fd, req, req_len);
    status = read_response(fd, &body, &body_len);
    t1 = now_ns();
    /* {"status":200,...,"bodyBase64":"<1368 chars>",...} somewhere in the RPC answer */
    b64 = memmem(body, body_len, "\"bodyBase64\":\"", 14);
    if (status != 200 || memmem(body, body_len, "\"status\":200", 12) == NULL || b64 == NULL ||
        (size_t)(body + body_len - b64) < 14 + B64_LEN + 1 || b64[14 + B64_LEN] != '"') {
        errno = 0;
        fprintf(stderr, "broker: HTTP %d: %.*s\n", status, (int)(body_len < 400 ? body_len : 400), body);
        die("unexpected broker response");
    }
    return t1 - t0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* nearest-rank percentile of a sorted array */
static double pct(const uint64_t *v, size_t n, double p)
{
    size_t k = (size_t)(p / 100.0 * (double)n + 0.999999);
    if (k == 0)
        k = 1;
    if (k > n)
        k = n;
    return (double)v[k - 1] / 1000.0;
}

static void report(const char *side, uint64_t *v, size_t n)
{
    double sum = 0;
    qsort(v, n, sizeof(*v), cmp_u64);
    for (size_t i = 0; i < n; ++i)
        sum += (double)v[i];
    printf("%s n=%zu p50_us=%.1f p90_us=%.1f p99_us=%.1f mean_us=%.1f min_us=%.1f max_us=%.1f\n", side, n, pct(v, n, 50),
           pct(v, n, 90), pct(v, n, 99), sum / (double)n / 1000.0, (double)v[0] / 1000.0, (double)v[n - 1] / 1000.0);
}

static double median(double *v, int n)
{
    for (int i = 1; i < n; ++i)
        for (int j = i; j > 0 && v[j - 1] > v[j]; --j) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static double p50_of(const uint64_t *v, size_t n, uint64_t *tmp)
{
    memcpy(tmp, v, n * sizeof(*tmp));
    qsort(tmp, n, sizeof(*tmp), cmp_u64);
    return pct(tmp, n, 50);
}

int main(int argc, char **argv)
{
    enum { SIDES = 5 };
    static const char *const names[SIDES] = {"broker", "direct", "resolved", "broker-ka", "resolved-ka"};
    int broker_port, up_port, dns_port, rounds, per, warmup, bfd, sfd = -1, nsides = SIDES;
    const char *token, *token_ka = "", *secret_token = NULL, *literal = NULL;
    uint64_t *t[SIDES], *tmp;
    double *ratio_d, *ratio_r, *ratio_k;
    size_t n[SIDES] = {0}, total;
    char body[256];
    int blen;

    if (argc != 9 && argc != 10) {
        fprintf(stderr, "usage: fetch_client BROKER_PORT TOKEN UPSTREAM_PORT DNS_PORT ROUNDS PER_ROUND WARMUP "
                        "{TOKEN_KA | SECRET_TOKEN VALUE}\n");
        return 2;
    }
    broker_port = atoi(argv[1]);
    token = argv[2];
    up_port = atoi(argv[3]);
    dns_port = atoi(argv[4]);
    rounds = atoi(argv[5]);
    per = atoi(argv[6]);
    warmup = atoi(argv[7]);
    if (argc == 9) {
        token_ka = argv[8];
    } else {
        secret_token = argv[8];
        literal = argv[9];
        nsides = 3;
    }
    if (broker_port <= 0 || up_port <= 0 || dns_port <= 0 || rounds <= 0 || per <= 0 || warmup < 0 || strlen(token) > 128 ||
        strlen(token_ka) > 128 || (secret_token != NULL && (strlen(secret_token) > 128 || strlen(literal) > 128))) {
        fprintf(stderr, "fetch_client: bad arguments\n");
        return 2;
    }

    /* the request curl --resolve sends (curl 7.88's default headers) */
    direct_req_len =
        (size_t)snprintf(direct_req, sizeof(direct_req),
                         "GET / HTTP/1.1\r\nHost: bench.test:%d\r\nUser-Agent: curl/7.88.1\r\nAccept: */*\r\n\r\n", up_port);
    if (literal != NULL)
        blen = snprintf(body, sizeof(body),
                        "{\"method\":\"http.fetch\",\"args\":{\"url\":\"http://bench.test:%d/\","
                        "\"headers\":{\"authorization\":\"Bearer %s\"}}}",
                        up_port, literal);
    else
        blen = snprintf(body, sizeof(body), "{\"method\":\"http.fetch\",\"args\":{\"url\":\"http://bench.test:%d/\"}}", up_port);
    rpc_req_len = (size_t)snprintf(rpc_req, sizeof(rpc_req),
                                   "POST /api/sandbox/rpc HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
                                   "x-questpie-sandbox-token: %s\r\nContent-Length: %d\r\n\r\n%s",
                                   broker_port, token, blen, body);
    direct_ka_req_len =
        (size_t)snprintf(direct_ka_req, sizeof(direct_ka_req),
                         "GET /ka HTTP/1.1\r\nHost: bench.test:%d\r\nUser-Agent: curl/7.88.1\r\nAccept: */*\r\n\r\n", up_port);
    blen = snprintf(body, sizeof(body), "{\"method\":\"http.fetch\",\"args\":{\"url\":\"http://bench.test:%d/ka\"}}", up_port);
    rpc_ka_req_len = (size_t)snprintf(rpc_ka_req, sizeof(rpc_ka_req),
                                      "POST /api/sandbox/rpc HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
                                      "x-questpie-sandbox-token: %s\r\nContent-Length: %d\r\n\r\n%s",
                                      broker_port, token_ka, blen, body);
    if (secret_token != NULL) {
        blen = snprintf(body, sizeof(body),
                        "{\"method\":\"http.fetch\",\"args\":{\"url\":\"http://bench.test:%d/\","
                        "\"headers\":{\"authorization\":\"Bearer {{secret:bench}}\"}}}",
                        up_port);
        rpc_req_secret_len = (size_t)snprintf(rpc_req_secret, sizeof(rpc_req_secret),
                                              "POST /api/sandbox/rpc HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: "
                                              "application/json\r\nx-questpie-sandbox-token: %s\r\nContent-Length: %d\r\n\r\n%s",
                                              broker_port, secret_token, blen, body);
    }

    total = (size_t)rounds * (size_t)per;
    for (int k = 0; k < SIDES; ++k)
        if ((t[k] = calloc(total, sizeof(uint64_t))) == NULL)
            die("calloc");
    tmp = calloc(total, sizeof(*tmp));
    ratio_d = calloc((size_t)rounds, sizeof(double));
    ratio_r = calloc((size_t)rounds, sizeof(double));
    ratio_k = calloc((size_t)rounds, sizeof(double));
    if (tmp == NULL || ratio_d == NULL || ratio_r == NULL || ratio_k == NULL)
        die("calloc");
    bfd = connect_loopback(broker_port);
    if (secret_token != NULL)
        sfd = connect_loopback(broker_port);

    for (int i = 0; i < warmup; ++i) {
        time_broker(bfd, rpc_req, rpc_req_len);
        time_direct(up_port);
        if (sfd >= 0) {
            time_broker(sfd, rpc_req_secret, rpc_req_secret_len);
            continue;
        }
        time_resolved(up_port, dns_port);
        time_broker(bfd, rpc_ka_req, rpc_ka_req_len);
        time_resolved_ka(up_port, dns_port);
    }
    for (int r = 0; r < rounds; ++r) {
        size_t start[SIDES];
        double p[SIDES];
        memcpy(start, n, sizeof(start));
        /* rotate which side goes first, so a drift during the run hits every side alike */
        for (int step = 0; step < nsides; ++step) {
            int side = (r + step) % nsides;
            for (int i = 0; i < per; ++i)
                t[side][n[side]++] = side == 0   ? time_broker(bfd, rpc_req, rpc_req_len)
                                     : side == 1 ? time_direct(up_port)
                                     : side == 2 ? (sfd >= 0 ? time_broker(sfd, rpc_req_secret, rpc_req_secret_len)
                                                             : time_resolved(up_port, dns_port))
                                     : side == 3 ? time_broker(bfd, rpc_ka_req, rpc_ka_req_len)
                                                 : time_resolved_ka(up_port, dns_port);
        }
        for (int k = 0; k < nsides; ++k)
            p[k] = p50_of(t[k] + start[k], (size_t)per, tmp);
        ratio_d[r] = p[0] / p[1];
        ratio_r[r] = p[0] / p[2];
        if (sfd >= 0) {
            ratio_r[r] = p[2] / p[0];
            fprintf(stderr, "  round %2d: p50 broker %7.1f us, direct %6.1f us, secret %6.1f us: %.2fx, %.2fx\n", r + 1, p[0], p[1],
                    p[2], ratio_d[r], ratio_r[r]);
            continue;
        }
        ratio_k[r] = p[3] / p[4];
        fprintf(stderr,
                "  round %2d: p50 broker %7.1f us, direct %6.1f us, direct+dns %6.1f us: %.2fx, %.2fx; "
                "kept-alive: broker %6.1f us, direct+dns %6.1f us: %.2fx\n",
                r + 1, p[0], p[1], p[2], ratio_d[r], ratio_r[r], p[3], p[4], ratio_k[r]);
    }
    close(bfd);
    if (ka_fd >= 0)
        close(ka_fd);
    if (sfd >= 0) {
        close(sfd);
        report("broker", t[0], n[0]);
        report("direct", t[1], n[1]);
        report("secret", t[2], n[2]);
        printf("paired_p50_ratio=%.3f\n", median(ratio_d, rounds));
        printf("paired_p50_ratio_secret=%.3f\n", median(ratio_r, rounds));
        return 0;
    }
    for (int k = 0; k < SIDES; ++k)
        report(names[k], t[k], n[k]);
    /* medians of the per-round p50 ratios */
    printf("paired_p50_ratio=%.3f\n", median(ratio_d, rounds));
    printf("paired_p50_ratio_resolved=%.3f\n", median(ratio_r, rounds));
    printf("paired_p50_ratio_ka=%.3f\n", median(ratio_k, rounds));
    return 0;
}
