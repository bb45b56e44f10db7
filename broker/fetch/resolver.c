/*
 * c-ares 1.18 on the h2o evloop (deps.md section 3).
 *
 * One resolver per worker loop, made once (and again on a reload), holding a
 * pool of c-ares channels. Every query runs alone on a channel that has no
 * other query in flight: c-ares 1.18 opens a server's UDP socket for the first
 * query it sends and shares it with every query sent while it is open (it has
 * no per-query socket option before 1.20), and without ARES_FLAG_STAYOPEN it
 * closes it after the last answer. One query per channel therefore gives
 * every query, A and AAAA and concurrent lookups alike, a socket of its own
 * and so a source port the kernel picked at random, on top of the random
 * query id c-ares draws for it: an off-path spoofer has to guess both
 * (RFC 5452 section 9.2). Idle channels are kept for the next query, so what
 * a lookup costs is its two sockets, not a channel set-up.
 *
 * c-ares creates and closes its sockets through ares_set_socket_functions:
 * each socket is made non-blocking and close-on-exec at once and goes into
 * an epoll set of the resolver's own, which the loop watches as one h2o
 * socket (DONT_READ: h2o only reports readiness and never consumes a
 * datagram). So a query costs its socket, connect, send, receive and close
 * and one epoll_ctl, and nothing per socket on the loop (no dup(), no h2o
 * socket); closing a socket takes it out of the set by itself.
 * h2o 2.2.5 has no one-shot timers, so a 50 ms tick drives c-ares' timeouts
 * while queries are pending. Answers are never kept: every lookup asks the
 * server again.
 */
#include <arpa/inet.h>
#include <arpa/nameser.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include <ares.h>
#include "fetch/resolver.h"
#include "sb/mem.h"
#include "util/util.h"

/* sockets of one channel: its server's UDP socket, and a TCP one when an answer came truncated */
#define CHAN_SOCKS 4
/* idle channels kept per resolver; more are made while needed and destroyed once idle */
#define IDLE_CHANNELS 16
/* channels (queries) in flight per resolver: two per lookup; past it a lookup fails closed */
#define BUSY_CHANNELS 512

typedef struct st_chan_t chan_t;

typedef struct st_watch_t {
    chan_t *c;
    ares_socket_t fd;
    int in_use;
    uint32_t events; /* what the resolver's epoll set watches the socket for */
    int wanted;      /* c-ares wants to hear of it (when not, it is about to close it) */
    uint64_t serial; /* tells a reused slot from the socket an event was for */
} watch_t;

struct st_chan_t {
    sb_resolver_t *r;
    ares_channel ch;
    watch_t socks[CHAN_SOCKS];
    chan_t *next; /* in the idle list, or the list of channels to give back */
    int busy;     /* a query is in flight */
    int answered; /* its callback ran: given back once c-ares has returned */
    h2o_linklist_t busy_link;
};

struct st_sb_resolver_t {
    h2o_loop_t *loop;
    struct ares_options opts;
    int optmask;
    char *servers;
    chan_t *idle;
    size_t nidle, nbusy;
    h2o_linklist_t busy; /* chan_t.busy_link */
    chan_t *returning;   /* answered, waiting for c-ares to return */
    int depth;           /* inside a c-ares call: channels are given back when the outermost returns */
    int epfd;            /* the epoll set of every c-ares socket, itself watched by the loop through epsock */
    h2o_socket_t *epsock;
    uint64_t serial;
    h2o_timeout_t tick_timeout;
    h2o_timeout_entry_t tick;
    size_t pending; /* lookups */
};

typedef struct st_query_t {
    struct st_sb_resolve_t *q;
    chan_t *c;
    const char *fail; /* set when the query could not be sent */
} query_t;

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
    query_t a, aaaa;
};

/* ---- sockets ---------------------------------------------------------------------------------------------------- */

static watch_t *find_watch(chan_t *c, ares_socket_t fd)
{
    for (size_t i = 0; i < CHAN_SOCKS; ++i)
        if (c->socks[i].in_use && c->socks[i].fd == fd)
            return &c->socks[i];
    return NULL;
}

static void give_back(sb_resolver_t *r);

/* (re)registers the socket with the resolver's epoll set for what c-ares wants */
static void watch_set(watch_t *w, uint32_t events)
{
    struct epoll_event ev;

    /* nothing wanted: c-ares closes the socket next, which takes it out of the set without a system call */
    w->wanted = events != 0;
    if (events == 0 || events == w->events)
        return;
    memset(&ev, 0, sizeof(ev));
    ev.events = events;
    ev.data.ptr = w;
    if (epoll_ctl(w->c->r->epfd, w->events == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, w->fd, &ev) != 0)
        return; /* not watched: the query times out and fails closed */
    w->events = events;
}

#define MAX_EVENTS 64

/*
 * The epoll set has ready sockets: hand each to its channel. The events are
 * taken first and checked against the slot's serial before each is handled,
 * since handling one can close another socket of the same channel (a UDP
 * answer that came truncated moves the query to TCP).
 */
static void on_ready(h2o_socket_t *sock, const char *err)
{
    sb_resolver_t *r = sock->data;
    struct epoll_event evs[MAX_EVENTS];
    uint64_t serials[MAX_EVENTS];
    int n = epoll_wait(r->epfd, evs, MAX_EVENTS, 0);

    (void)err;
    for (int i = 0; i < n; ++i)
        serials[i] = ((watch_t *)evs[i].data.ptr)->serial;
    ++r->depth;
    for (int i = 0; i < n; ++i) {
        watch_t *w = evs[i].data.ptr;
        uint32_t e = evs[i].events;
        ares_socket_t fd = w->fd;
        if (!w->in_use || w->serial != serials[i])
            continue;
        if (!w->wanted) {
            /* still open and no longer wanted (c-ares 1.18 always closes first): stop hearing of it */
            struct epoll_event none;
            memset(&none, 0, sizeof(none));
            (void)epoll_ctl(r->epfd, EPOLL_CTL_DEL, fd, &none);
            w->events = 0;
            continue;
        }
        /* errors and hang-ups are read, so c-ares sees them */
        ares_process_fd(w->c->ch, (e & (EPOLLIN | EPOLLERR | EPOLLHUP)) != 0 ? fd : ARES_SOCKET_BAD,
                        (e & EPOLLOUT) != 0 ? fd : ARES_SOCKET_BAD);
    }
    --r->depth;
    give_back(r);
}

static void sock_state_cb(void *data, ares_socket_t fd, int readable, int writable)
{
    watch_t *w = find_watch(data, fd);

    if (w == NULL)
        return; /* not one of ours: cannot happen, c-ares only reports sockets it made through sock_open */
    watch_set(w, (readable ? (uint32_t)EPOLLIN : 0) | (writable ? (uint32_t)EPOLLOUT : 0));
}

static ares_socket_t sock_open(int domain, int type, int protocol, void *data)
{
    chan_t *c = data;
    watch_t *w = NULL;
    int fd, one = 1;

    for (size_t i = 0; i < CHAN_SOCKS && w == NULL; ++i)
        if (!c->socks[i].in_use)
            w = &c->socks[i];
    if (w == NULL) {
        errno = EMFILE;
        return ARES_SOCKET_BAD; /* the query fails closed */
    }
    if ((fd = socket(domain, type | SOCK_NONBLOCK | SOCK_CLOEXEC, protocol)) < 0)
        return ARES_SOCKET_BAD;
    /* c-ares leaves every option of sockets it does not make to us: a query and its answer, no batching */
    if (type == SOCK_STREAM)
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    memset(w, 0, sizeof(*w));
    w->c = c;
    w->fd = fd;
    w->in_use = 1;
    w->serial = ++c->r->serial;
    return fd;
}

static int sock_close(ares_socket_t fd, void *data)
{
    watch_t *w = find_watch(data, fd);
    if (w != NULL) {
        /* closing the only descriptor of the socket takes it out of the epoll set (epoll(7)) */
        w->in_use = 0;
        w->events = 0;
        ++w->serial;
    }
    return close(fd);
}

static int sock_connect(ares_socket_t fd, const struct sockaddr *sa, ares_socklen_t len, void *data)
{
    (void)data;
    return connect(fd, sa, len);
}

static ares_ssize_t sock_recvfrom(ares_socket_t fd, void *buf, size_t len, int flags, struct sockaddr *from,
                                  ares_socklen_t *fromlen, void *data)
{
    (void)data;
    return recvfrom(fd, buf, len, flags, from, fromlen);
}

static ares_ssize_t sock_sendv(ares_socket_t fd, const struct iovec *iov, int iovcnt, void *data)
{
    struct msghdr m;

    (void)data;
    memset(&m, 0, sizeof(m));
    m.msg_iov = (struct iovec *)iov;
    m.msg_iovlen = (size_t)iovcnt;
    /* a TCP server that went away must not raise SIGPIPE */
    return sendmsg(fd, &m, MSG_NOSIGNAL);
}

static const struct ares_socket_functions sock_funcs = {sock_open, sock_close, sock_connect, sock_recvfrom, sock_sendv};

/* ---- channels --------------------------------------------------------------------------------------------------- */

static chan_t *chan_create(sb_resolver_t *r, const char **err)
{
    chan_t *c = sb_mem_calloc(1, sizeof(*c));
    struct ares_options o = r->opts;

    c->r = r;
    o.sock_state_cb = sock_state_cb;
    o.sock_state_cb_data = c;
    if (ares_init_options(&c->ch, &o, r->optmask) != ARES_SUCCESS) {
        *err = "c-ares initialisation failed";
        sb_mem_free(c);
        return NULL;
    }
    if (r->servers != NULL && ares_set_servers_ports_csv(c->ch, r->servers) != ARES_SUCCESS) {
        *err = "egress.dns_servers: not a list of ip:port";
        ares_destroy(c->ch);
        sb_mem_free(c);
        return NULL;
    }
    ares_set_socket_functions(c->ch, &sock_funcs, c);
    return c;
}

static void chan_destroy(chan_t *c)
{
    ares_destroy(c->ch); /* completes a pending query with ARES_EDESTRUCTION, closes its sockets through sock_close */
    for (size_t i = 0; i < CHAN_SOCKS; ++i)
        if (c->socks[i].in_use)
            (void)sock_close(c->socks[i].fd, c);
    sb_mem_free(c);
}

/* an idle channel for one query (NULL when BUSY_CHANNELS are in flight, or c-ares fails) */
static chan_t *chan_take(sb_resolver_t *r)
{
    chan_t *c;
    const char *err = NULL;

    if (r->nbusy >= BUSY_CHANNELS)
        return NULL;
    if ((c = r->idle) != NULL) {
        r->idle = c->next;
        --r->nidle;
    } else if ((c = chan_create(r, &err)) == NULL) {
        return NULL;
    }
    c->next = NULL;
    c->busy = 1;
    c->answered = 0;
    h2o_linklist_insert(&r->busy, &c->busy_link);
    ++r->nbusy;
    return c;
}

/*
 * Channels whose query was answered go back once c-ares has returned from the
 * call that answered it (a channel cannot be destroyed, nor should it take a
 * new query, from inside its own callback: the socket it just read would be
 * shared by the next query).
 */
static void give_back(sb_resolver_t *r)
{
    if (r->depth != 0)
        return;
    while (r->returning != NULL) {
        chan_t *c = r->returning;
        r->returning = c->next;
        c->busy = 0;
        h2o_linklist_unlink(&c->busy_link);
        --r->nbusy;
        if (r->nidle < IDLE_CHANNELS) {
            c->next = r->idle;
            r->idle = c;
            ++r->nidle;
        } else {
            chan_destroy(c);
        }
    }
}

static void chan_answered(chan_t *c)
{
    if (c->answered)
        return;
    c->answered = 1;
    c->next = c->r->returning;
    c->r->returning = c;
}

/* ---- the resolver ----------------------------------------------------------------------------------------------- */

static void on_tick(h2o_timeout_entry_t *entry)
{
    sb_resolver_t *r = H2O_STRUCT_FROM_MEMBER(sb_resolver_t, tick, entry);
    /* nothing leaves the busy list while depth is held (channels taken meanwhile join its end) */
    ++r->depth;
    for (h2o_linklist_t *l = r->busy.next; l != &r->busy; l = l->next) {
        chan_t *c = H2O_STRUCT_FROM_MEMBER(chan_t, busy_link, l);
        if (!c->answered)
            ares_process_fd(c->ch, ARES_SOCKET_BAD, ARES_SOCKET_BAD);
    }
    --r->depth;
    give_back(r);
    if (r->pending != 0 && !h2o_timeout_is_linked(&r->tick))
        h2o_timeout_link(r->loop, &r->tick_timeout, &r->tick);
}

static int urandom_readable(void)
{
    unsigned char b;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC), ok;

    if (fd < 0)
        return 0;
    ok = read(fd, &b, 1) == 1;
    close(fd);
    return ok;
}

sb_resolver_t *sb_resolver_create(h2o_loop_t *loop, const char *servers, unsigned timeout_ms, unsigned tries, const char **err)
{
    sb_resolver_t *r = sb_mem_calloc(1, sizeof(*r));
    chan_t *first;
    static int lib_ready;

    if (!__atomic_exchange_n(&lib_ready, 1, __ATOMIC_ACQ_REL))
        ares_library_init(ARES_LIB_INIT_ALL);
    /*
     * c-ares 1.18 keys each channel's query-id generator from /dev/urandom and
     * falls back to libc's weak generator when it cannot read it (CVE-2023-31147, fixed in
     * 1.19.1 and not in Debian's 1.18.1-3): without it the ids would be
     * guessable, so there is no resolver.
     */
    if (!urandom_readable()) {
        *err = "cannot read /dev/urandom, which c-ares needs for random DNS query ids";
        sb_mem_free(r);
        return NULL;
    }
    r->loop = loop;
    r->optmask = ARES_OPT_SOCK_STATE_CB | ARES_OPT_LOOKUPS | ARES_OPT_TIMEOUTMS | ARES_OPT_TRIES | ARES_OPT_FLAGS;
    r->opts.lookups = (char *)"b"; /* DNS only, never /etc/hosts */
    r->opts.timeout = (int)timeout_ms;
    r->opts.tries = (int)tries;
    /*
     * NOCHECKRESP: hand SERVFAIL and REFUSED back as such instead of retrying
     * and ending with "connection refused"; either way the name is rejected,
     * and the operator reads the real reason. Not STAYOPEN: the socket closes
     * with its one query, so the next query gets a fresh source port.
     */
    r->opts.flags = ARES_FLAG_NOSEARCH | ARES_FLAG_NOALIASES | ARES_FLAG_NOCHECKRESP;
    r->servers = servers != NULL ? sb_mem_strdup(servers) : NULL;
    h2o_linklist_init_anchor(&r->busy);
    h2o_timeout_init(loop, &r->tick_timeout, 50);
    r->tick.cb = on_tick;
    if ((r->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0) {
        *err = "epoll_create1 failed for the resolver";
        sb_resolver_destroy(r);
        return NULL;
    }
    r->epsock = h2o_evloop_socket_create(loop, r->epfd, H2O_SOCKET_FLAG_DONT_READ);
    r->epsock->data = r;
    h2o_socket_read_start(r->epsock, on_ready);
    /* the first channel now: a configuration c-ares refuses is an error at start-up, not at the first fetch */
    if ((first = chan_create(r, err)) == NULL) {
        sb_resolver_destroy(r);
        return NULL;
    }
    first->next = NULL;
    r->idle = first;
    r->nidle = 1;
    return r;
}

void sb_resolver_destroy(sb_resolver_t *r)
{
    if (r == NULL)
        return;
    /* pending lookups complete with ARES_EDESTRUCTION ("DNS lookup cancelled") */
    while (!h2o_linklist_is_empty(&r->busy)) {
        chan_t *c = H2O_STRUCT_FROM_MEMBER(chan_t, busy_link, r->busy.next);
        h2o_linklist_unlink(&c->busy_link);
        chan_destroy(c);
    }
    while (r->idle != NULL) {
        chan_t *c = r->idle;
        r->idle = c->next;
        chan_destroy(c);
    }
    if (h2o_timeout_is_linked(&r->tick))
        h2o_timeout_unlink(&r->tick);
    h2o_timeout_dispose(r->loop, &r->tick_timeout);
    if (r->epsock != NULL)
        h2o_socket_close(r->epsock); /* closes epfd */
    sb_mem_free(r->servers);
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

static int same_ip(const sb_ip_t *a, const sb_ip_t *b)
{
    return a->family == b->family && memcmp(a->addr, b->addr, a->family == AF_INET ? 4 : 16) == 0;
}

/* appends ip unless the list has it already: a repeated answer is validated and connected to once */
static void add_unique(sb_ip_t *list, size_t *n, size_t cap, const sb_ip_t *ip)
{
    for (size_t i = 0; i < *n; ++i)
        if (same_ip(&list[i], ip))
            return;
    if (*n < cap)
        list[(*n)++] = *ip;
}

static void finish_if_done(sb_resolve_t *q)
{
    if (--q->outstanding != 0)
        return;
    --q->r->pending;
    if (!q->cancelled) {
        /* A answers first, then AAAA */
        for (size_t i = 0; i < q->nv6; ++i)
            add_unique(q->res.addrs, &q->res.naddrs, sizeof(q->res.addrs) / sizeof(q->res.addrs[0]), &q->v6[i]);
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
    query_t *qq = arg;
    sb_resolve_t *q = qq->q;
    struct ares_addrttl ttls[SB_MAX_DNS_ANSWERS];
    int n = SB_MAX_DNS_ANSWERS;

    if (qq->c != NULL)
        chan_answered(qq->c);
    if (qq->fail != NULL) {
        q->error = qq->fail;
    } else if (status == ARES_SUCCESS) {
        if (too_many_answers(abuf, alen)) {
            q->error = "too many DNS answers";
        } else if ((status = ares_parse_a_reply(abuf, alen, NULL, ttls, &n)) == ARES_SUCCESS) {
            for (int i = 0; i < n; ++i) {
                sb_ip_t ip;
                memset(&ip, 0, sizeof(ip));
                ip.family = AF_INET;
                memcpy(ip.addr, &ttls[i].ipaddr, 4);
                add_unique(q->res.addrs, &q->res.naddrs, SB_MAX_DNS_ANSWERS, &ip);
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
    query_t *qq = arg;
    sb_resolve_t *q = qq->q;
    struct ares_addr6ttl ttls[SB_MAX_DNS_ANSWERS];
    int n = SB_MAX_DNS_ANSWERS;

    if (qq->c != NULL)
        chan_answered(qq->c);
    if (qq->fail != NULL) {
        q->error = qq->fail;
    } else if (status == ARES_SUCCESS) {
        if (too_many_answers(abuf, alen)) {
            q->error = "too many DNS answers";
        } else if ((status = ares_parse_aaaa_reply(abuf, alen, NULL, ttls, &n)) == ARES_SUCCESS) {
            for (int i = 0; i < n; ++i) {
                sb_ip_t ip;
                memset(&ip, 0, sizeof(ip));
                ip.family = AF_INET6;
                memcpy(ip.addr, &ttls[i].ip6addr, 16);
                add_unique(q->v6, &q->nv6, SB_MAX_DNS_ANSWERS, &ip);
            }
        } else if (status != ARES_ENODATA) {
            q->error = family_error(status);
        }
    } else if (status != ARES_ENODATA) {
        q->error = family_error(status);
    }
    finish_if_done(q);
}

/* sends one query on a channel of its own; with none to be had, the query fails closed at once */
static void send_query(sb_resolver_t *r, query_t *qq, const char *name, int type, ares_callback cb)
{
    if ((qq->c = chan_take(r)) == NULL) {
        qq->fail = "too many DNS lookups in flight";
        cb(qq, ARES_ECANCELLED, 0, NULL, 0);
        return;
    }
    ++r->depth;
    ares_query(qq->c->ch, name, ns_c_in, type, cb, qq);
    --r->depth;
}

sb_resolve_t *sb_resolve(sb_resolver_t *r, const char *name, sb_resolve_cb cb, void *arg)
{
    sb_resolve_t *q = sb_mem_calloc(1, sizeof(*q));
    q->r = r;
    q->cb = cb;
    q->arg = arg;
    q->a.q = q->aaaa.q = q;
    /* hold one extra count so a synchronous answer cannot complete before both queries are sent */
    q->outstanding = 3;
    ++r->pending;
    send_query(r, &q->a, name, ns_t_a, on_a);
    send_query(r, &q->aaaa, name, ns_t_aaaa, on_aaaa);
    give_back(r);
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
