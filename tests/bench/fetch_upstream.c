/*
 * The loopback upstream of tests/bench/fetch.sh: answers every request with
 * 200 and a fixed 1024-byte body. "GET /ka" is answered on a kept-alive
 * connection (Content-Length, no Connection header; the next request may
 * follow on it); anything else with "Connection: close", then the close. One
 * thread polling every connection, so the upstream's own cost is the same
 * small constant for the broker and for the direct client.
 *
 *   fetch_upstream            listens on 127.0.0.1:<free port>, prints "listening port N"
 *
 * Build (fetch.sh does this):
 *   gcc -std=c11 -O2 -D_GNU_SOURCE -Wall -Wextra -Werror -o fetch_upstream fetch_upstream.c
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define BODY_LEN 1024
#define MAX_CONNS 64

static char resp_close[512 + BODY_LEN], resp_ka[512 + BODY_LEN];
static size_t resp_close_len, resp_ka_len;

/* one connection: the bytes of the request head read so far */
typedef struct {
    int fd;
    size_t got;
    char req[16384];
} conn_t;

static conn_t conns[MAX_CONNS];

static void drop(conn_t *c)
{
    close(c->fd);
    c->fd = -1;
}

static void write_all(conn_t *c, const char *p, size_t len)
{
    size_t off = 0;
    while (off < len) {
        ssize_t n = write(c->fd, p + off, len - off);
        if (n <= 0) {
            drop(c);
            return;
        }
        off += (size_t)n;
    }
}

/* answers every complete request head in the buffer (no request here has a body) */
static void serve(conn_t *c)
{
    char *end;
    while (c->fd >= 0 && (end = memmem(c->req, c->got, "\r\n\r\n", 4)) != NULL) {
        size_t used = (size_t)(end - c->req) + 4;
        int keep = c->got >= 8 && memcmp(c->req, "GET /ka ", 8) == 0;
        if (keep)
            write_all(c, resp_ka, resp_ka_len);
        else
            write_all(c, resp_close, resp_close_len);
        if (!keep) {
            if (c->fd >= 0)
                drop(c);
            return;
        }
        memmove(c->req, c->req + used, c->got - used);
        c->got -= used;
    }
}

int main(void)
{
    struct sockaddr_in sa;
    socklen_t salen = sizeof(sa);
    int one = 1, lfd;

    signal(SIGPIPE, SIG_IGN);
    resp_close_len = (size_t)snprintf(resp_close, sizeof(resp_close),
                                      "HTTP/1.1 200 OK\r\nServer: fetch-bench\r\nContent-Type: application/octet-stream\r\n"
                                      "Content-Length: %d\r\nConnection: close\r\n\r\n",
                                      BODY_LEN);
    resp_ka_len = (size_t)snprintf(resp_ka, sizeof(resp_ka),
                                   "HTTP/1.1 200 OK\r\nServer: fetch-bench\r\nContent-Type: application/octet-stream\r\n"
                                   "Content-Length: %d\r\n\r\n",
                                   BODY_LEN);
    for (int i = 0; i < BODY_LEN; ++i) {
        resp_close[resp_close_len + (size_t)i] = (char)('a' + i % 26);
        resp_ka[resp_ka_len + (size_t)i] = (char)('a' + i % 26);
    }
    resp_close_len += BODY_LEN;
    resp_ka_len += BODY_LEN;
    for (int i = 0; i < MAX_CONNS; ++i)
        conns[i].fd = -1;

    if ((lfd = socket(AF_INET, SOCK_STREAM, 0)) < 0) {
        perror("socket");
        return 1;
    }
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(lfd, 128) != 0 ||
        getsockname(lfd, (struct sockaddr *)&sa, &salen) != 0) {
        perror("bind/listen");
        return 1;
    }
    printf("listening port %d\n", ntohs(sa.sin_port));
    fflush(stdout);

    for (;;) {
        struct pollfd pfd[MAX_CONNS + 1];
        int map[MAX_CONNS + 1], n = 0;

        pfd[n].fd = lfd;
        pfd[n].events = POLLIN;
        map[n++] = -1;
        for (int i = 0; i < MAX_CONNS; ++i)
            if (conns[i].fd >= 0) {
                pfd[n].fd = conns[i].fd;
                pfd[n].events = POLLIN;
                map[n++] = i;
            }
        if (poll(pfd, (nfds_t)n, -1) < 0)
            continue;
        for (int k = 1; k < n; ++k) {
            conn_t *c = &conns[map[k]];
            ssize_t got;
            if (!(pfd[k].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            got = read(c->fd, c->req + c->got, sizeof(c->req) - c->got);
            if (got <= 0) {
                drop(c);
                continue;
            }
            c->got += (size_t)got;
            serve(c);
            if (c->fd >= 0 && c->got == sizeof(c->req))
                drop(c); /* a head this large is no request of the benchmark */
        }
        if (pfd[0].revents & POLLIN) {
            int fd = accept(lfd, NULL, NULL), slot = -1;
            if (fd < 0)
                continue;
            for (int i = 0; i < MAX_CONNS && slot < 0; ++i)
                if (conns[i].fd < 0)
                    slot = i;
            if (slot < 0) {
                close(fd);
                continue;
            }
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            conns[slot].fd = fd;
            conns[slot].got = 0;
        }
    }
}
