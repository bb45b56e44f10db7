/*
 * The loopback upstream of tests/bench/fetch.sh: answers every request with
 * 200 and a fixed 1024-byte body, "Connection: close", then closes. One
 * connection at a time (the benchmark is sequential), so the upstream's own
 * cost is the same small constant for the broker and for the direct client.
 *
 *   fetch_upstream            listens on 127.0.0.1:<free port>, prints "listening port N"
 *
 * Build (fetch.sh does this):
 *   gcc -std=c11 -O2 -D_GNU_SOURCE -Wall -Wextra -Werror -o fetch_upstream fetch_upstream.c
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define BODY_LEN 1024

int main(void)
{
    static char resp[512 + BODY_LEN];
    struct sockaddr_in sa;
    socklen_t salen = sizeof(sa);
    int one = 1, lfd, hlen;

    signal(SIGPIPE, SIG_IGN);
    hlen = snprintf(resp, sizeof(resp),
                    "HTTP/1.1 200 OK\r\nServer: fetch-bench\r\nContent-Type: application/octet-stream\r\n"
                    "Content-Length: %d\r\nConnection: close\r\n\r\n",
                    BODY_LEN);
    for (int i = 0; i < BODY_LEN; ++i)
        resp[hlen + i] = (char)('a' + i % 26);

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
        char req[16384];
        size_t got = 0;
        struct timeval tv = {2, 0};
        int fd = accept(lfd, NULL, NULL);

        if (fd < 0)
            continue;
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        /* the request head (no request here has a body) */
        for (;;) {
            ssize_t n = read(fd, req + got, sizeof(req) - 1 - got);
            if (n <= 0)
                break;
            got += (size_t)n;
            req[got] = '\0';
            if (strstr(req, "\r\n\r\n") != NULL || got == sizeof(req) - 1)
                break;
        }
        if (got != 0 && strstr(req, "\r\n\r\n") != NULL) {
            size_t off = 0, len = (size_t)hlen + BODY_LEN;
            while (off < len) {
                ssize_t n = write(fd, resp + off, len - off);
                if (n <= 0)
                    break;
                off += (size_t)n;
            }
        }
        close(fd);
    }
}
