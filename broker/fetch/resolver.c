/*
 * c-ares 1.18 on the h2o evloop (deps.md section 3). c-ares owns its sockets;
 * each is watched through an h2o socket wrapping a dup() with DONT_READ, so
 * h2o only reports readiness and never consumes a datagram. h2o 2.2.5 has no
 * one-shot timers, so a 50 ms tick drives c-ares' timeouts while queries are
 * pending.
 */
#include <arpa/inet.h>
#include <arpa/nameser.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <ares.h>
#include "fetch/resolver.h"
#include "sb/mem.h"
#include "util/util.h"

#define MAX_SOCKS 16

typedef struct st_watch_t {
    struct st_sb_resolver_t *r;
    ares_socket_t fd;
    h2o_socket_t *sock;
    int reading, want_write, write_armed;
} watch_t;

struct st_sb_resolver_t {
    h2o_loop_t *loop;
    ares_channel ch;
    watch_t socks[MAX_SOCKS];
    h2o_timeout_t tick_timeout;
    h2o_timeout_entry_t tick;
    size_t pending;
};

struct st_sb_resolve_t {
    sb_resolver_t *r;
    sb_resolve_cb cb;
    void *arg;
    int cancelled;
    int outstanding; /* c-ares queries not yet answered */
    const char *error;
    sb_dns_result_t res;
    sb_ip_t v6[SB_MAX_DNS_ANSWERS];
    size_t nv6;
};

static void on_readable(h2o_socket_t *sock, const char *err)
{
    watch_t *w = sock->data;
    ares_process_fd(w->r->ch, w->fd, ARES_SOCKET_BAD);
}

static void on_writable(h2o_socket_t *sock, const char *err)
{
    watch_t *w = sock->data;
    w->write_armed = 0;
    if (w->want_write)
        ares_process_fd(w->r->ch, ARES_SOCKET_BAD, w->fd);
}

static void arm_write(watch_t *w)
{
    /* h2o asserts when notify_write is armed twice */
    if (w->want_write && !w->write_armed && w->sock != NULL) {
        w->write_armed = 1;
        h2o_socket_notify_write(w->sock, on_writable);
    }
}

static void sock_state_cb(void *data, ares_socket_t fd, int readable, int writable)
{
    sb_resolver_t *r = data;
    watch_t *w = NULL;

    for (size_t i = 0; i < MAX_SOCKS; ++i)
        if (r->socks[i].sock != NULL && r->socks[i].fd == fd)
            w = &r->socks[i];
    if (!readable && !writable) {
        if (w != NULL) {
            /* closes only our dup; c-ares closes its own fd */
            h2o_socket_close(w->sock);
            memset(w, 0, sizeof(*w));
        }
        return;
    }
    if (w == NULL) {
        int dupfd;
        for (size_t i = 0; i < MAX_SOCKS && w == NULL; ++i)
            if (r->socks[i].sock == NULL)
                w = &r->socks[i];
        if (w == NULL || (dupfd = dup(fd)) < 0)
            return; /* the query times out and fails closed */
        w->r = r;
        w->fd = fd;
        w->sock = h2o_evloop_socket_create(r->loop, dupfd, H2O_SOCKET_FLAG_DONT_READ);
        w->sock->data = w;
    }
    if (readable && !w->reading) {
        w->reading = 1;
        h2o_socket_read_start(w->sock, on_readable);
    } else if (!readable && w->reading) {
        w->reading = 0;
        h2o_socket_read_stop(w->sock);
    }
    w->want_write = writable;
    arm_write(w);
}

static void on_tick(h2o_timeout_entry_t *entry)
{
    sb_resolver_t *r = H2O_STRUCT_FROM_MEMBER(sb_resolver_t, tick, entry);
    ares_process_fd(r->ch, ARES_SOCKET_BAD, ARES_SOCKET_BAD);
    if (r->pending != 0 && !h2o_timeout_is_linked(&r->tick))
        h2o_timeout_link(r->loop, &r->tick_timeout, &r->tick);
}

sb_resolver_t *sb_resolver_create(h2o_loop_t *loop, const char *servers, unsigned timeout_ms, unsigned tries, const char **err)
{
    sb_resolver_t *r = sb_mem_calloc(1, sizeof(*r));
    struct ares_options o;
    int mask = ARES_OPT_SOCK_STATE_CB | ARES_OPT_LOOKUPS | ARES_OPT_TIMEOUTMS | ARES_OPT_TRIES | ARES_OPT_FLAGS;
    static int lib_ready;

    if (!__atomic_exchange_n(&lib_ready, 1, __ATOMIC_ACQ_REL))
        ares_library_init(ARES_LIB_INIT_ALL);
    memset(&o, 0, sizeof(o));
    o.sock_state_cb = sock_state_cb;
    o.sock_state_cb_data = r;
    o.lookups = (char *)"b"; /* DNS only, never /etc/hosts */
    o.timeout = (int)timeout_ms;
    o.tries = (int)tries;
    /*
     * NOCHECKRESP: hand SERVFAIL and REFUSED back as such instead of retrying
     * and ending with "connection refused"; either way the name is rejected,
     * and the operator reads the real reason. Not STAYOPEN: it would save a
     * socket per lookup (~27 us) but pin the source port, which is half of
     * what makes an off-path spoofed answer hard to land.
     */
    o.flags = ARES_FLAG_NOSEARCH | ARES_FLAG_NOALIASES | ARES_FLAG_NOCHECKRESP;
    r->loop = loop;
    if (ares_init_options(&r->ch, &o, mask) != ARES_SUCCESS) {
        *err = "c-ares initialisation failed";
        sb_mem_free(r);
        return NULL;
    }
    if (servers != NULL && ares_set_servers_ports_csv(r->ch, servers) != ARES_SUCCESS) {
        *err = "egress.dns_servers: not a list of ip:port";
        ares_destroy(r->ch);
        sb_mem_free(r);
        return NULL;
    }
    h2o_timeout_init(loop, &r->tick_timeout, 50);
    r->tick.cb = on_tick;
    return r;
}

void sb_resolver_destroy(sb_resolver_t *r)
{
    if (r == NULL)
        return;
    ares_destroy(r->ch); /* completes pending queries with ARES_EDESTRUCTION */
    for (size_t i = 0; i < MAX_SOCKS; ++i)
        if (r->socks[i].sock != NULL)
            h2o_socket_close(r->socks[i].sock);
    if (h2o_timeout_is_linked(&r->tick))
        h2o_timeout_unlink(&r->tick);
    h2o_timeout_dispose(r->loop, &r->tick_timeout);
    sb_mem_free(r);
}

static const char *family_error(int status)
{
    switch (status) {
    case ARES_ENOTFOUND:
        return "NXDOMAIN";
    case ARES_ESERVFAIL:
        return "SERVFAIL";
    case ARES_EREFUSED:
        return "REFUSED";
    case ARES_ETIMEOUT:
        return "DNS timeout";
    case ARES_ECONNREFUSED:
        return "DNS server unreachable";
    case ARES_EBADRESP:
        return "malformed DNS reply";
    case ARES_EDESTRUCTION:
    case ARES_ECANCELLED:
        return "DNS lookup cancelled";
    default:
        return "DNS failure";
    }
}

static void finish_if_done(sb_resolve_t *q)
{
    if (--q->outstanding != 0)
        return;
    --q->r->pending;
    if (!q->cancelled) {
        /* A answers first, then AAAA */
        for (size_t i = 0; i < q->nv6 && q->res.naddrs < sizeof(q->res.addrs) / sizeof(q->res.addrs[0]); ++i)
            q->res.addrs[q->res.naddrs++] = q->v6[i];
        if (q->error == NULL && q->res.naddrs == 0)
            q->error = "no A or AAAA records";
        q->res.error = q->error;
        q->cb(q->arg, q->error == NULL ? SB_OK : SB_E_EXECUTION, &q->res);
    }
    sb_mem_free(q);
}

/* the header's answer count: refuse replies with more answers than we read, so none goes unvalidated */
static int too_many_answers(const unsigned char *abuf, int alen)
{
    return alen >= 8 && ((unsigned)abuf[6] << 8 | abuf[7]) > SB_MAX_DNS_ANSWERS;
}

static void on_a(void *arg, int status, int timeouts, unsigned char *abuf, int alen)
{
    sb_resolve_t *q = arg;
    struct ares_addrttl ttls[SB_MAX_DNS_ANSWERS];
    int n = SB_MAX_DNS_ANSWERS;

    if (status == ARES_SUCCESS) {
        if (too_many_answers(abuf, alen)) {
            q->error = "too many DNS answers";
        } else if ((status = ares_parse_a_reply(abuf, alen, NULL, ttls, &n)) == ARES_SUCCESS) {
            for (int i = 0; i < n; ++i) {
                sb_ip_t *ip = &q->res.addrs[q->res.naddrs++];
                ip->family = AF_INET;
                memcpy(ip->addr, &ttls[i].ipaddr, 4);
            }
        } else if (status != ARES_ENODATA) {
            q->error = family_error(status);
        }
    } else if (status != ARES_ENODATA) {
        q->error = family_error(status);
    }
    finish_if_done(q);
}

static void on_aaaa(void *arg, int status, int timeouts, unsigned char *abuf, int alen)
{
    sb_resolve_t *q = arg;
    struct ares_addr6ttl ttls[SB_MAX_DNS_ANSWERS];
    int n = SB_MAX_DNS_ANSWERS;

    if (status == ARES_SUCCESS) {
        if (too_many_answers(abuf, alen)) {
            q->error = "too many DNS answers";
        } else if ((status = ares_parse_aaaa_reply(abuf, alen, NULL, ttls, &n)) == ARES_SUCCESS) {
            for (int i = 0; i < n; ++i) {
                sb_ip_t *ip = &q->v6[q->nv6++];
                ip->family = AF_INET6;
                memcpy(ip->addr, &ttls[i].ip6addr, 16);
            }
        } else if (status != ARES_ENODATA) {
            q->error = family_error(status);
        }
    } else if (status != ARES_ENODATA) {
        q->error = family_error(status);
    }
    finish_if_done(q);
}

sb_resolve_t *sb_resolve(sb_resolver_t *r, const char *name, sb_resolve_cb cb, void *arg)
{
    sb_resolve_t *q = sb_mem_calloc(1, sizeof(*q));
    q->r = r;
    q->cb = cb;
    q->arg = arg;
    /* hold one extra count so a synchronous answer cannot complete before both queries are sent */
    q->outstanding = 3;
    ++r->pending;
    ares_query(r->ch, name, ns_c_in, ns_t_a, on_a, q);
    ares_query(r->ch, name, ns_c_in, ns_t_aaaa, on_aaaa, q);
    if (!h2o_timeout_is_linked(&r->tick))
        h2o_timeout_link(r->loop, &r->tick_timeout, &r->tick);
    if (q->outstanding == 1) {
        /* both answers came synchronously (e.g. no DNS server could be used) */
        finish_if_done(q);
        return NULL;
    }
    finish_if_done(q);
    return q;
}

void sb_resolve_cancel(sb_resolve_t *q)
{
    if (q != NULL)
        q->cancelled = 1;
}
