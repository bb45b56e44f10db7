/*
 * Unit tests for broker/fetch/resolver.c on a real h2o loop, against a UDP
 * "server" on loopback that reads every query and never answers: every query
 * of lookups in flight together leaves from a source port of its own, with
 * its own id; past the in-flight bound a lookup fails at once with its exact
 * reason; the rest time out ("DNS timeout"), and the resolver, its channels
 * kept, serves the next lookups the same way; destroying it with lookups
 * pending completes them ("DNS lookup cancelled").
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <h2o.h>
#include "tap.h"
#include "fetch/resolver.h"

#define LOOKUPS 256 /* the bound: 512 queries in flight, two per lookup */

typedef struct {
    int calls;
    sb_status_t st;
    char error[64];
} result_t;

static void on_done(void *arg, sb_status_t st, const sb_dns_result_t *res)
{
    result_t *r = arg;
    ++r->calls;
    r->st = st;
    snprintf(r->error, sizeof(r->error), "%s", res->error != NULL ? res->error : "");
}

/* reads every datagram waiting; returns how many, and how many distinct source ports and ids they had */
static int drain(int fd, int *ports, int *ids)
{
    static unsigned char seen_port[65536], seen_id[65536];
    int n = 0;
    unsigned char buf[512];
    struct sockaddr_in from;
    socklen_t flen = sizeof(from);
    ssize_t got;

    memset(seen_port, 0, sizeof(seen_port));
    memset(seen_id, 0, sizeof(seen_id));
    *ports = *ids = 0;
    while ((got = recvfrom(fd, buf, sizeof(buf), MSG_DONTWAIT, (struct sockaddr *)&from, &flen)) >= 12) {
        unsigned port = ntohs(from.sin_port), id = (unsigned)buf[0] << 8 | buf[1];
        ++n;
        if (!seen_port[port]++)
            ++*ports;
        if (!seen_id[id]++)
            ++*ids;
        flen = sizeof(from);
    }
    return n;
}

static int run_until(h2o_loop_t *loop, result_t *res, size_t n, int calls)
{
    for (int spin = 0; spin < 400; ++spin) {
        size_t done = 0;
        for (size_t i = 0; i < n; ++i)
            done += res[i].calls >= calls;
        if (done == n)
            return 1;
        h2o_evloop_run(loop, 10);
    }
    return 0;
}

int main(void)
{
    static result_t res[LOOKUPS + 1];
    h2o_loop_t *loop = h2o_evloop_create();
    struct sockaddr_in sa;
    socklen_t salen = sizeof(sa);
    char servers[64];
    const char *err = NULL;
    sb_resolver_t *r;
    int fd = socket(AF_INET, SOCK_DGRAM, 0), nq, ports, ids, bufsz = 1 << 20;

    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bufsz, sizeof(bufsz));
    ok(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 && getsockname(fd, (struct sockaddr *)&sa, &salen) == 0,
       "a silent UDP server on loopback");
    snprintf(servers, sizeof(servers), "127.0.0.1:%u", ntohs(sa.sin_port));
    r = sb_resolver_create(loop, servers, 200, 1, &err);
    ok(r != NULL, "resolver created (%s)", err != NULL ? err : "no error");

    is_int(sb_resolver_create(loop, "not a server list", 200, 1, &err) == NULL, 1, "a bad server list is refused");
    is_str(err, "egress.dns_servers: not a list of ip:port", "with its reason");

    for (int round = 0; round < 2; ++round) {
        int over_sync;
        memset(res, 0, sizeof(res));
        for (size_t i = 0; i < LOOKUPS; ++i)
            ok(sb_resolve(r, "silent.test", on_done, &res[i]) != NULL || res[i].calls != 0, "round %d: lookup %zu started", round,
               i);
        /* one more than the bound: refused at once, with its reason */
        over_sync = sb_resolve(r, "silent.test", on_done, &res[LOOKUPS]) == NULL;
        is_int(over_sync, 1, "round %d: the lookup past the bound completed before sb_resolve returned", round);
        is_int(res[LOOKUPS].calls, 1, "round %d: its callback ran once", round);
        is_int(res[LOOKUPS].st, SB_E_EXECUTION, "round %d: as a failure", round);
        is_str(res[LOOKUPS].error, "too many DNS lookups in flight", "round %d: reason", round);

        /* every query reached the server: one socket, one port each; ids random (512 draws of 16 bits collide about twice) */
        for (int spin = 0; spin < 100; ++spin) {
            h2o_evloop_run(loop, 1);
            usleep(1000);
        }
        nq = drain(fd, &ports, &ids);
        is_int(nq, 2 * LOOKUPS, "round %d: every query was sent", round);
        is_int(ports, 2 * LOOKUPS, "round %d: from %d source ports", round, 2 * LOOKUPS);
        ok(ids >= 2 * LOOKUPS - 16, "round %d: ids are random (%d distinct of %d)", round, ids, nq);

        ok(run_until(loop, res, LOOKUPS, 1), "round %d: every lookup completed", round);
        for (size_t i = 0; i < LOOKUPS; ++i)
            if (res[i].calls != 1 || res[i].st != SB_E_EXECUTION || strcmp(res[i].error, "DNS timeout") != 0)
                ok(0, "round %d: lookup %zu: %d calls, %s", round, i, res[i].calls, res[i].error);
        ok(1, "round %d: each timed out once with \"DNS timeout\"", round);
    }

    /* destroyed with lookups pending: they complete, cancelled */
    memset(res, 0, sizeof(res));
    ok(sb_resolve(r, "silent.test", on_done, &res[0]) != NULL, "a lookup pending at destruction");
    sb_resolver_destroy(r);
    is_int(res[0].calls, 1, "completed by the destruction");
    is_str(res[0].error, "DNS lookup cancelled", "as cancelled");

    /* the closed sockets are disposed of on the loop's next pass; then the loop can go */
    h2o_evloop_run(loop, 0);
    h2o_evloop_destroy(loop);
    close(fd);
    return done_testing();
}
