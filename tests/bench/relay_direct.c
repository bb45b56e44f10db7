/*
 * The direct client of tests/bench/relay.sh: the same call the relay makes,
 * sent straight to the broker over one kept-alive HTTP/1.1 connection.
 *
 * Usage: relay_direct PORT N WARMUP   (the token comes from $SB_BENCH_TOKEN)
 *
 * Sends WARMUP + N sequential requests byte-for-byte like the shim's
 * (supervisor-shim/relay/http.c: POST /api/sandbox/rpc, msgpack body
 * {method:"services.svc.fn", args:{}}, x-questpie-sandbox-token), each timed
 * from just before the request is written to just after the whole response
 * body has been read. Every response must be HTTP 501 with the broker's
 * not_implemented error. Prints one line:
 *   BENCH n=N min_ns=.. p50_ns=.. p90_ns=.. p99_ns=.. max_ns=.. mean_ns=..
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include "relay_common.h"

#define MAX_RESPONSE 65536u

/* reads one response; returns its status and leaves the body in buf[*body_off, *body_off + *body_len) */
static int read_response(int fd, char *buf, size_t *body_off, size_t *body_len)
{
    size_t have = 0, head = 0, clen = 0;
    int status;
    char *p;

    for (;;) {
        ssize_t k;
        if (head == 0) {
            char *e = have >= 4 ? memmem(buf, have, "\r\n\r\n", 4) : NULL;
            if (e != NULL) {
                head = (size_t)(e - buf) + 4;
                buf[head - 1] = '\0';
                if (have < 12 || memcmp(buf, "HTTP/1.1 ", 9) != 0)
                    return -1;
                status = (buf[9] - '0') * 100 + (buf[10] - '0') * 10 + (buf[11] - '0');
                p = strcasestr(buf, "\r\ncontent-length:");
                if (p == NULL)
                    return -1;
                for (p += 17; *p == ' '; ++p)
                    ;
                for (; *p >= '0' && *p <= '9'; ++p)
                    clen = clen * 10 + (size_t)(*p - '0');
                if (head + clen > MAX_RESPONSE)
                    return -1;
            }
        }
        if (head != 0 && have >= head + clen) {
            if (have != head + clen)
                return -1; /* nothing was pipelined: extra bytes are an error */
            *body_off = head;
            *body_len = clen;
            return status;
        }
        if (have == MAX_RESPONSE)
            return -1;
        k = read(fd, buf + have, MAX_RESPONSE - have);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        have += (size_t)k;
    }
}

int main(int argc, char **argv)
{
    unsigned long port, n, warm;
    const char *token = getenv("SB_BENCH_TOKEN");
    struct sockaddr_in sa;
    msgpack_sbuffer body;
    msgpack_packer pk;
    char *req, *buf;
    int fd, one = 1, hlen;
    size_t req_len;
    uint64_t *samples;
    relay_stats_t st;

    if (argc != 4 || relay_parse_u(argv[1], 1, 65535, &port) != 0 || relay_parse_u(argv[2], 1, RELAY_MAX_N, &n) != 0 ||
        relay_parse_u(argv[3], 0, RELAY_MAX_N, &warm) != 0 || token == NULL || strlen(token) != 64) {
        fprintf(stderr, "usage: SB_BENCH_TOKEN=<64 hex> relay_direct PORT N WARMUP\n");
        return 2;
    }
    msgpack_sbuffer_init(&body);
    msgpack_packer_init(&pk, &body, msgpack_sbuffer_write);
    (void)msgpack_pack_map(&pk, 2);
    (void)msgpack_pack_str_with_body(&pk, "method", 6);
    (void)msgpack_pack_str_with_body(&pk, RELAY_METHOD, strlen(RELAY_METHOD));
    (void)msgpack_pack_str_with_body(&pk, "args", 4);
    (void)msgpack_pack_map(&pk, 0);
    req = malloc(1024 + body.size);
    buf = malloc(MAX_RESPONSE);
    samples = calloc(n, sizeof(*samples));
    if (req == NULL || buf == NULL || samples == NULL)
        return 1;
    /* the same head the shim builds (supervisor-shim/relay/http.c) */
    hlen = snprintf(req, 1024,
                    "POST /api/sandbox/rpc HTTP/1.1\r\nHost: 127.0.0.1:%lu\r\nContent-Type: application/msgpack\r\n"
                    "Accept: application/msgpack\r\nx-questpie-sandbox-token: %s\r\nContent-Length: %zu\r\n\r\n",
                    port, token, body.size);
    memcpy(req + hlen, body.data, body.size);
    req_len = (size_t)hlen + body.size;

    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if ((fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        perror("relay_direct: connect");
        return 1;
    }
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    for (unsigned long i = 0; i < n + warm; ++i) {
        size_t off, len;
        uint64_t t0 = relay_now_ns(), t1;
        int status;
        if (relay_write_full(fd, req, req_len) != 0 || (status = read_response(fd, buf, &off, &len)) < 0) {
            fprintf(stderr, "relay_direct: request %lu failed (connection closed or bad response)\n", i + 1);
            return 1;
        }
        t1 = relay_now_ns();
        if (status != 501 || !relay_is_not_implemented(buf + off, len, NULL)) {
            fprintf(stderr, "relay_direct: request %lu: HTTP %d, not the broker's not_implemented error\n", i + 1, status);
            return 1;
        }
        if (i >= warm)
            samples[i - warm] = t1 - t0;
    }
    close(fd);
    relay_summarise(samples, n, &st);
    printf("BENCH n=%llu min_ns=%llu p50_ns=%llu p90_ns=%llu p99_ns=%llu max_ns=%llu mean_ns=%llu\n", (unsigned long long)st.n,
           (unsigned long long)st.min_ns, (unsigned long long)st.p50_ns, (unsigned long long)st.p90_ns,
           (unsigned long long)st.p99_ns, (unsigned long long)st.max_ns, (unsigned long long)st.mean_ns);
    free(samples);
    free(buf);
    free(req);
    msgpack_sbuffer_destroy(&body);
    return 0;
}
