/*
 * Listeners, workers and their life cycle.
 *
 * Both listening sockets are bound in the main thread so a bad address fails
 * start-up before anything runs. Each worker owns an h2o evloop and accepts on
 * its own dup() of the public listener; worker 0 also serves the admin
 * listener. SIGTERM (handled by main) sends every worker a shutdown message:
 * it stops accepting, asks h2o to close connections after their current
 * response, and keeps its loop running until every request it accepted has
 * been answered and released, or drain_timeout_ms has passed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "http/framing.h"
#include "http/routes.h"
#include "http/server.h"
#include "obs/log.h"
#include "obs/metrics.h"
#include "svc/handlers.h"
#include "util/util.h"

/* on shutdown, an idle keep-alive connection is closed after this long (see on_shutdown_msg) */
/*
 * Draining, a keep-alive connection idle this long is closed. Connections a proxy used within it get
 * "connection: close" on their next answer and are closed by the proxy itself, cleanly; only those
 * it left idle longer are closed from our side, which races with a request it sends on one at that
 * moment (HTTP/1.1 has no way around it, and a proxy does not replay a POST). A proxy's keep-alive
 * cache hands out the connection used last first, so the ones idle this long are the ones it is
 * least likely to pick: 100 ms closed connections it was picking under load (nginx answered 500).
 */
#define SB_DRAIN_IDLE_CLOSE_MS 1000
/* the threads files operations run on, shared by every worker (svc/files/files.c says why they exist) */
#define FILES_THREADS 2u

/* "host:port" or "[v6]:port" of an address */
static void format_addr(const struct sockaddr_storage *ss, char *out, size_t outsz)
{
    char host[INET6_ADDRSTRLEN] = "?";
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *sin = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &sin->sin_addr, host, sizeof(host));
        snprintf(out, outsz, "%s:%u", host, (unsigned)ntohs(sin->sin_port));
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *sin6 = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &sin6->sin6_addr, host, sizeof(host));
        snprintf(out, outsz, "[%s]:%u", host, (unsigned)ntohs(sin6->sin6_port));
    } else {
        snprintf(out, outsz, "?");
    }
}

static int bind_listener(const struct sockaddr_storage *ss, socklen_t len, const char *what)
{
    int fd = -1, on = 1;
    struct sockaddr_storage bound;
    socklen_t blen = sizeof(bound);
    char host[INET6_ADDRSTRLEN] = "?", addr[INET6_ADDRSTRLEN + 16], ebuf[128];
    const char *step;
    int port = 0, e;
    sb_logline_t l;

    step = "socket";
    if ((fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
        goto Fail;
    step = "setsockopt";
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on)) != 0)
        goto Fail;
    step = "bind";
    if (bind(fd, (const struct sockaddr *)ss, len) != 0)
        goto Fail;
    step = "listen";
    if (listen(fd, 1024) != 0)
        goto Fail;
    step = "fcntl";
    if (fcntl(fd, F_SETFL, O_NONBLOCK) != 0)
        goto Fail;
    if (getsockname(fd, (struct sockaddr *)&bound, &blen) == 0) {
        if (bound.ss_family == AF_INET) {
            struct sockaddr_in *sin = (struct sockaddr_in *)&bound;
            inet_ntop(AF_INET, &sin->sin_addr, host, sizeof(host));
            port = ntohs(sin->sin_port);
        } else {
            struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&bound;
            inet_ntop(AF_INET6, &sin6->sin6_addr, host, sizeof(host));
            port = ntohs(sin6->sin6_port);
        }
    }
    /* tests start the broker on port 0 and read the real port from this line */
    sb_log_begin(&l, SB_LOG_INFO, "listening");
    sb_log_cstr(&l, "listener", what);
    sb_log_cstr(&l, "host", host);
    sb_log_int(&l, "port", port);
    sb_log_end(&l);
    return fd;

Fail:
    /* one line: which listener, where, which step and why */
    e = errno;
    format_addr(ss, addr, sizeof(addr));
    sb_log_begin(&l, SB_LOG_ERROR, "listen.failed");
    sb_log_cstr(&l, "listener", what);
    sb_log_cstr(&l, "address", addr);
    sb_log_cstr(&l, "step", step);
    sb_log_cstr(&l, "error", strerror_r(e, ebuf, sizeof(ebuf)));
    sb_log_end(&l);
    if (fd >= 0)
        close(fd);
    return -1;
}

static int on_public_req(h2o_handler_t *self, h2o_req_t *req)
{
    sb_server_t *s = sb_current_worker->server;
    size_t plen = strlen(s->conf->rpc_path);

    if (req->path_normalized.len == plen && memcmp(req->path_normalized.base, s->conf->rpc_path, plen) == 0)
        return sb_rpc_on_req(self, req);
    /* every route of the public listener refuses ambiguous framing first (the RPC route in rpc.c) */
    if (sb_http_framing_refuse(req))
        return 0;
    return sb_health_on_req(self, req);
}

static void setup_globalconf(h2o_globalconf_t *gc, size_t max_entity, int (*on_req)(h2o_handler_t *, h2o_req_t *))
{
    h2o_hostconf_t *host;
    h2o_pathconf_t *path;
    h2o_handler_t *handler;

    h2o_config_init(gc);
    gc->max_request_entity_size = max_entity;
    gc->http1.upgrade_to_http2 = 0; /* HTTP/1.1 only */
    gc->server_name = h2o_iovec_init(H2O_STRLIT("sandbox-broker"));
    host = h2o_config_register_host(gc, h2o_iovec_init(H2O_STRLIT("default")), 65535);
    path = h2o_config_register_path(host, "/", 0);
    handler = h2o_create_handler(path, sizeof(*handler));
    handler->on_req = on_req;
}

sb_status_t sb_server_init(sb_server_t *s, sb_config_t *conf, sb_store_t *store, sb_fetch_conf_t *fetch_conf,
                           sb_decide_conf_t *decide_conf, sb_targets_t *targets)
{
    memset(s, 0, sizeof(*s));
    s->conf = conf;
    s->store = store;
    s->fetch_conf = fetch_conf;
    s->decide_conf = decide_conf;
    s->targets = targets;
    s->listen_fd = s->admin_fd = -1;
    sb_sha256(conf->admin_secret, strlen(conf->admin_secret), s->admin_secret_hash);
    setup_globalconf(&s->pub_conf, SB_MAX_HTTP_ENTITY, on_public_req);
    setup_globalconf(&s->admin_conf, SB_MAX_ADMIN_BODY, sb_admin_on_req);
    if ((s->listen_fd = bind_listener(&conf->listen_addr, conf->listen_addrlen, "public")) < 0)
        return SB_E_UNAVAILABLE;
    if ((s->admin_fd = bind_listener(&conf->admin_addr, conf->admin_addrlen, "admin")) < 0)
        return SB_E_UNAVAILABLE;
    s->nworkers = conf->threads;
    s->workers = sb_mem_calloc(s->nworkers, sizeof(*s->workers));
    s->files = sb_files_pool_create(FILES_THREADS);
    return SB_OK;
}

static void on_connection_close(void *data)
{
    sb_worker_t *w = data;
    --w->connections;
}

static void on_accept(h2o_socket_t *listener, const char *err)
{
    sb_worker_t *w = sb_current_worker;
    h2o_accept_ctx_t *actx = listener == w->admin_listener ? &w->admin_accept_ctx : &w->accept_ctx;
    size_t limit = (w->server->conf->max_connections + w->server->nworkers - 1) / w->server->nworkers;
    h2o_socket_t *sock;

    if (err != NULL)
        return;
    /* accept a bounded batch, so one busy listener cannot starve the loop */
    for (int i = 0; i < 16 && (sock = h2o_evloop_socket_accept(listener)) != NULL; ++i) {
        /*
         * Connections are bounded like everything else: past the worker's
         * share of max_connections a new one is closed at once (the admin
         * listener keeps one spare, so the host can still revoke)
         */
        if (w->connections >= limit + (listener == w->admin_listener ? 1 : 0)) {
            sb_metrics_connection_refused();
            h2o_socket_close(sock);
            continue;
        }
        ++w->connections;
        sock->on_close.cb = on_connection_close;
        sock->on_close.data = w;
        h2o_accept(actx, sock);
    }
}

static void close_listeners(sb_worker_t *w)
{
    if (w->listener != NULL) {
        h2o_socket_read_stop(w->listener);
        h2o_socket_close(w->listener);
        w->listener = NULL;
    }
    if (w->admin_listener != NULL) {
        h2o_socket_read_stop(w->admin_listener);
        h2o_socket_close(w->admin_listener);
        w->admin_listener = NULL;
    }
}

typedef struct st_worker_msg_t {
    h2o_multithread_message_t super;
    int reload;                  /* 0: shutdown */
    uint8_t new_secret_hash[32]; /* reload: the admin secret (worker 0 owns the copy it checks) */
} worker_msg_t;

/* 1 while a context a reload replaced still has users (the worker's own two are not counted) */
static int retired_live(const sb_worker_t *w)
{
    return w->reaper.live > (size_t)(w->svc.fetch != NULL) + (size_t)(w->svc.pg != NULL);
}

static void apply_reload(sb_worker_t *w, const worker_msg_t *m)
{
    sb_server_t *s = w->server;
    sb_config_t *conf = s->conf;
    sb_fetch_ctx_t *fetch;
    const char *err = NULL;

    /*
     * egress: a fresh context (resolver, timeouts, an empty pool of kept-alive connections) on the new
     * settings; the worker lets go of the old one, which its exchanges in flight keep until the last of
     * them has answered (handlers.h). When the new one cannot be made, http.fetch is off on this worker
     * as at start-up, never left running on the settings (and the parked connections) the reload replaced
     */
    if ((fetch = sb_fetch_ctx_create(s->fetch_conf, w->loop, &w->reaper, &err)) == NULL) {
        sb_logline_t l;
        sb_log_begin(&l, SB_LOG_ERROR, "egress.disabled");
        sb_log_cstr(&l, "reason", err != NULL ? err : "resolver setup failed");
        sb_log_end(&l);
    }
    sb_fetch_ctx_release(w->svc.fetch);
    w->svc.fetch = fetch;
    w->svc.targets = s->targets;
    /* the database pool follows database_url and the targets' collections; its queued jobs keep the old one */
    sb_pg_pool_release(w->svc.pg);
    w->svc.pg = sb_pg_pool_create(w->loop, &w->reaper, conf->database_url, s->targets, conf->database_pool_size);
    if (w->index == 0 && memcmp(s->admin_secret_hash, m->new_secret_hash, 32) != 0) {
        /* the secret a reload replaces is honoured a little longer, so a host can switch without a gap */
        memcpy(w->previous_secret_hash, s->admin_secret_hash, 32);
        w->previous_secret_until = sb_now_ms() + 300000;
        memcpy(s->admin_secret_hash, m->new_secret_hash, 32);
    }
}

static void on_shutdown_msg(h2o_multithread_receiver_t *receiver, h2o_linklist_t *messages)
{
    sb_worker_t *w = H2O_STRUCT_FROM_MEMBER(sb_worker_t, shutdown_receiver, receiver);
    int stop = 0;
    while (!h2o_linklist_is_empty(messages)) {
        worker_msg_t *m = (worker_msg_t *)H2O_STRUCT_FROM_MEMBER(h2o_multithread_message_t, link, messages->next);
        h2o_linklist_unlink(&m->super.link);
        if (m->reload && !w->stopping)
            apply_reload(w, m);
        else if (!m->reload)
            stop = 1;
        sb_mem_free(m);
    }
    if (!stop || w->stopping)
        return;
    w->stopping = 1;
    close_listeners(w);
    h2o_context_request_shutdown(&w->ctx);
    if (w->index == 0)
        h2o_context_request_shutdown(&w->admin_ctx);
    /*
     * h2o 2.2.5 does nothing for HTTP/1 on shutdown: an idle keep-alive
     * connection stays open until the process exits, and a request a proxy
     * sends on it in that last moment is lost with a reset. Shortening the
     * idle timeout closes each idle connection now, with a FIN the proxy sees
     * before it picks the connection again (RFC 9112 section 9.6); the drain
     * below waits until they are gone.
     */
    w->ctx.http1.req_timeout.timeout = SB_DRAIN_IDLE_CLOSE_MS;
    if (w->index == 0)
        w->admin_ctx.http1.req_timeout.timeout = SB_DRAIN_IDLE_CLOSE_MS;
}

/* 1 while the worker still holds an HTTP/1 connection, idle or not */
static int has_connections(sb_worker_t *w)
{
    return !h2o_linklist_is_empty(&w->ctx.http1._conns) || (w->index == 0 && !h2o_linklist_is_empty(&w->admin_ctx.http1._conns));
}

static void *worker_main(void *arg)
{
    sb_worker_t *w = arg;
    sb_server_t *s = w->server;
    h2o_multithread_queue_t *q;
    uint64_t deadline;
    unsigned long generation;

    sb_current_worker = w;
    sb_log_thread_buffered(1);
    generation = s->generation; /* before the first read of the reloadable objects */
    w->loop = h2o_evloop_create();
    h2o_context_init(&w->ctx, w->loop, &s->pub_conf);
    w->accept_ctx.ctx = &w->ctx;
    w->accept_ctx.hosts = s->pub_conf.hosts;
    w->listener = h2o_evloop_socket_create(w->loop, dup(s->listen_fd), H2O_SOCKET_FLAG_DONT_READ);
    h2o_socket_read_start(w->listener, on_accept);
    if (w->index == 0) {
        h2o_context_init(&w->admin_ctx, w->loop, &s->admin_conf);
        w->admin_accept_ctx.ctx = &w->admin_ctx;
        w->admin_accept_ctx.hosts = s->admin_conf.hosts;
        w->admin_listener = h2o_evloop_socket_create(w->loop, dup(s->admin_fd), H2O_SOCKET_FLAG_DONT_READ);
        h2o_socket_read_start(w->admin_listener, on_accept);
    }
    /* the worker's message queue: reload and shutdown messages, and the files pool's results */
    q = h2o_multithread_create_queue(w->loop);
    w->store = sb_store_conn_create(s->store, w->loop);
    sb_reaper_init(&w->reaper, w->loop);
    w->svc.loop = w->loop;
    w->svc.store = w->store;
    w->svc.targets = s->targets;
    w->svc.tools = sb_tools_ctx_create(w->loop);
    w->decide = sb_decide_ctx_create(w->loop);
    w->svc.files = sb_files_ctx_create(s->files, q);
    w->svc.pg = sb_pg_pool_create(w->loop, &w->reaper, s->conf->database_url, s->targets, s->conf->database_pool_size);
    {
        const char *err = NULL;
        if ((w->svc.fetch = sb_fetch_ctx_create(s->fetch_conf, w->loop, &w->reaper, &err)) == NULL) {
            /* http.fetch then answers not_implemented; everything else works */
            sb_logline_t l;
            sb_log_begin(&l, SB_LOG_ERROR, "egress.disabled");
            sb_log_cstr(&l, "reason", err != NULL ? err : "resolver setup failed");
            sb_log_end(&l);
        }
    }
    h2o_multithread_register_receiver(q, &w->shutdown_receiver, on_shutdown_msg);
    /* published last: sb_server_stop may message the worker from now on */
    __atomic_store_n(&w->queue, q, __ATOMIC_RELEASE);
    if (s->generation != generation) {
        /* a reload ran while this worker started and skipped it (no queue yet): apply it now */
        worker_msg_t m;
        memset(&m, 0, sizeof(m));
        m.reload = 1;
        sb_sha256(s->conf->admin_secret, strlen(s->conf->admin_secret), m.new_secret_hash);
        apply_reload(w, &m);
    }

    while (!w->stopping) {
        h2o_evloop_run(w->loop, INT32_MAX);
        sb_log_flush();
    }

    /*
     * drain: answer everything accepted, including requests that still arrive
     * on open keep-alive connections (h2o closes each after its current
     * response, and idle ones after SB_DRAIN_IDLE_CLOSE_MS), until no
     * connection is left, the worker has been idle for 50 ms, which also lets
     * the last responses leave the socket buffers, and every context a reload
     * retired has been freed by its last user; the stores are torn down only
     * then, so no call is failed by the shutdown itself. Then the worker lets
     * go of its own contexts, and the loop turns until the exchanges that
     * still hold them (those whose client left) have ended too.
     */
    {
        uint64_t now = sb_mono_us(), idle_since = now;
        deadline = now + s->conf->drain_timeout_ms * 1000u;
        while (now < deadline && (w->inflight != 0 || has_connections(w) || retired_live(w) || now - idle_since < 50000)) {
            h2o_evloop_run(w->loop, 10);
            sb_log_flush();
            now = sb_mono_us();
            if (w->inflight != 0 || retired_live(w))
                idle_since = now;
        }
        sb_fetch_ctx_release(w->svc.fetch);
        w->svc.fetch = NULL;
        sb_pg_pool_release(w->svc.pg);
        w->svc.pg = NULL;
        /* files jobs whose client left are answered too: a write completes or reports failure */
        while ((!sb_reaper_idle(&w->reaper) || sb_files_ctx_pending(w->svc.files) != 0) && (now = sb_mono_us()) < deadline) {
            h2o_evloop_run(w->loop, 10);
            sb_log_flush();
        }
    }
    if (w->inflight != 0 || !sb_reaper_idle(&w->reaper) || sb_files_ctx_pending(w->svc.files) != 0) {
        sb_logline_t l;
        sb_log_begin(&l, SB_LOG_WARN, "drain.timeout");
        sb_log_int(&l, "worker", w->index);
        sb_log_int(&l, "inflight", (long long)w->inflight);
        sb_log_int(&l, "contexts", (long long)w->reaper.live);
        sb_log_int(&l, "files", (long long)sb_files_ctx_pending(w->svc.files));
        sb_log_end(&l);
    }

    h2o_multithread_unregister_receiver(w->queue, &w->shutdown_receiver);
    /* NULL: a request still arriving on a kept-alive connection in the last turn below finds no handler */
    sb_tools_ctx_destroy(w->svc.tools);
    w->svc.tools = NULL;
    /* decisions still waiting past the drain are refused (their calls answer forbidden) */
    sb_decide_ctx_destroy(w->decide);
    w->decide = NULL;
    /*
     * past the drain deadline a context still in use stays, like the loop its
     * exchanges run on, and so does a files context a pool thread will still
     * answer on
     */
    if (sb_reaper_idle(&w->reaper))
        sb_reaper_dispose(&w->reaper);
    if (sb_files_ctx_pending(w->svc.files) == 0) {
        sb_files_ctx_destroy(w->svc.files);
        w->svc.files = NULL;
    }
    /* one more turn: the sockets the last contexts closed are released on the next one */
    h2o_evloop_run(w->loop, 0);
    /*
     * leased quota goes back to Redis (store/store.h), or other instances'
     * calls on those runs would find less: up to a second more, even when the
     * calls used up the drain's time
     */
    {
        uint64_t until = (deadline > sb_mono_us() ? deadline : sb_mono_us()) + 1000000u;
        while (sb_store_conn_settle(w->store) && sb_mono_us() < until)
            h2o_evloop_run(w->loop, 10);
    }
    sb_store_conn_destroy(w->store);
    w->store = NULL;
    sb_rpc_worker_done();
    sb_log_thread_buffered(0);
    /*
     * The loop, its contexts and queue stay: idle keep-alive connections still
     * hold timeouts on them (h2o_context_dispose asserts there are none), and
     * the process exits next. They remain reachable through the server object.
     */
    return NULL;
}

void sb_server_run(sb_server_t *s)
{
    for (unsigned i = 0; i < s->nworkers; ++i) {
        s->workers[i].server = s;
        s->workers[i].index = i;
        h2o_multithread_create_thread(&s->workers[i].tid, NULL, worker_main, &s->workers[i]);
    }
    for (unsigned i = 0; i < s->nworkers; ++i)
        pthread_join(s->workers[i].tid, NULL);
}

void sb_server_stop(sb_server_t *s)
{
    atomic_store(&s->stopping, 1);
    /*
     * Stop listening for every copy of the sockets at once. Closing the
     * workers' dup()s is not enough: the original descriptors would keep the
     * kernel accepting connections that nobody reads, and a proxy that has
     * sent a request on one cannot retry it elsewhere. Refused connections,
     * it can.
     */
    if (s->listen_fd >= 0)
        shutdown(s->listen_fd, SHUT_RD);
    if (s->admin_fd >= 0)
        shutdown(s->admin_fd, SHUT_RD);
    for (unsigned i = 0; i < s->nworkers; ++i) {
        sb_worker_t *w = &s->workers[i];
        void *m;
        /* the worker may still be starting; wait until its queue exists */
        while (__atomic_load_n(&w->queue, __ATOMIC_ACQUIRE) == NULL)
            usleep(1000);
        m = sb_mem_calloc(1, sizeof(worker_msg_t));
        h2o_multithread_send_message(&w->shutdown_receiver, m);
    }
}

struct st_sb_retired_t {
    struct st_sb_retired_t *next;
    sb_config_t *conf;
    sb_fetch_conf_t *fetch_conf;
    sb_decide_conf_t *decide_conf;
    sb_targets_t *targets;
};

void sb_server_reload(sb_server_t *s, sb_config_t *conf, sb_fetch_conf_t *fetch_conf, sb_decide_conf_t *decide_conf,
                      sb_targets_t *targets)
{
    uint8_t new_hash[32];
    struct st_sb_retired_t *r = sb_mem_calloc(1, sizeof(*r));

    /* handlers in flight may still point into these: they live until exit */
    r->conf = s->conf;
    r->fetch_conf = s->fetch_conf;
    r->decide_conf = s->decide_conf;
    r->targets = s->targets;
    r->next = s->retired;
    s->retired = r;

    s->fetch_conf = fetch_conf;
    s->decide_conf = decide_conf;
    s->targets = targets;
    s->conf = conf;
    ++s->generation; /* after the objects: a worker that sees the new count reads the new objects */
    sb_log_set_level((sb_log_level_t)sb_log_parse_level(conf->log_level));
    /* the admin secret is read (and now written) by worker 0 only: it takes the new one from its message */
    sb_sha256(conf->admin_secret, strlen(conf->admin_secret), new_hash);
    for (unsigned i = 0; i < s->nworkers; ++i) {
        sb_worker_t *w = &s->workers[i];
        worker_msg_t *m;
        if (__atomic_load_n(&w->queue, __ATOMIC_ACQUIRE) == NULL)
            continue; /* still starting: it reads the new objects when it does */
        m = sb_mem_calloc(1, sizeof(*m));
        m->reload = 1;
        memcpy(m->new_secret_hash, new_hash, 32);
        h2o_multithread_send_message(&w->shutdown_receiver, &m->super);
    }
}

void sb_server_free_retired(sb_server_t *s)
{
    while (s->retired != NULL) {
        struct st_sb_retired_t *r = s->retired;
        s->retired = r->next;
        sb_config_free(r->conf);
        sb_fetch_conf_free(r->fetch_conf);
        sb_decide_conf_free(r->decide_conf);
        sb_targets_free(r->targets);
        sb_mem_free(r);
    }
}

void sb_server_dispose(sb_server_t *s)
{
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    if (s->admin_fd >= 0)
        close(s->admin_fd);
    /* after the workers: every files job they accepted has run, and the threads are joined */
    sb_files_pool_destroy(s->files);
    s->files = NULL;
    /* workers, loops and h2o configuration live until exit (see worker_main) */
}
