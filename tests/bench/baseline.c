/*
 * The benchmark floor: a raw h2o evloop HTTP/1.1 server set up the way the
 * broker sets up its public listener (broker/http/server.c), answering every
 * POST with status 501 and the same 96-byte JSON body and the same headers
 * the broker sends for a granted-but-undispatched call. Everything the broker
 * does on top (body decode, token lookup, manifest check, logging, metrics)
 * is what the ratio in tests/bench/rpc.sh measures.
 *
 * Usage: baseline HOST:PORT [THREADS]   (PORT 0 picks a free port)
 * Prints "listening port N" on stdout once the socket is bound. Non-POST
 * requests fall through to h2o's 404. SIGTERM/SIGINT end the process.
 *
 * Build (tests/bench/rpc.sh does this):
 *   gcc -std=c11 -O2 -g -D_GNU_SOURCE -DH2O_USE_LIBUV=0 -Wall -Wextra -Wno-unused-parameter \
 *       -o baseline tests/bench/baseline.c \
 *       $(pkg-config --cflags --libs libh2o-evloop libssl libcrypto) -lpthread
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <h2o.h>

/* byte-for-byte the broker's reply to a granted services call (rpc.c reply_error, SB_E_NOT_IMPLEMENTED) */
static const char reply_body[] = "{\"ok\":false,\"error\":{\"code\":\"not_implemented\",\"message\":\"services dispatch is not implemented\"}}";

#define MAX_ENTITY (8u * 1024u * 1024u) /* SB_MAX_HTTP_ENTITY */

static h2o_globalconf_t config;
static int listen_fd = -1;

typedef struct {
    h2o_context_t ctx;
    h2o_accept_ctx_t accept_ctx;
    h2o_socket_t *listener;
} worker_t;

static int on_req(h2o_handler_t *self, h2o_req_t *req)
{
    static h2o_generator_t generator = {NULL, NULL};
    h2o_iovec_t body = h2o_iovec_init(reply_body, sizeof(reply_body) - 1);

    if (!h2o_memis(req->method.base, req->method.len, H2O_STRLIT("POST")))
        return -1;
    req->res.status = 501;
    req->res.reason = "Not Implemented";
    req->res.content_length = body.len;
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, H2O_STRLIT("application/json"));
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CACHE_CONTROL, NULL, H2O_STRLIT("no-store"));
    h2o_start_response(req, &generator);
    h2o_send(req, &body, 1, H2O_SEND_STATE_FINAL);
    return 0;
}

static void on_accept(h2o_socket_t *listener, const char *err)
{
    worker_t *w = listener->data;
    h2o_socket_t *sock;

    if (err != NULL)
        return;
    /* same bounded accept batch as the broker */
    for (int i = 0; i < 16 && (sock = h2o_evloop_socket_accept(listener)) != NULL; ++i)
        h2o_accept(&w->accept_ctx, sock);
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    h2o_evloop_t *loop = h2o_evloop_create();

    h2o_context_init(&w->ctx, loop, &config);
    w->accept_ctx.ctx = &w->ctx;
    w->accept_ctx.hosts = config.hosts;
    w->listener = h2o_evloop_socket_create(loop, dup(listen_fd), H2O_SOCKET_FLAG_DONT_READ);
    w->listener->data = w;
    h2o_socket_read_start(w->listener, on_accept);
    for (;;)
        h2o_evloop_run(loop, INT32_MAX);
    return NULL;
}

static int bind_listener(const char *hostport)
{
    char host[64];
    const char *colon = strrchr(hostport, ':');
    struct sockaddr_in sin;
    socklen_t len = sizeof(sin);
    int fd, on = 1;

    if (colon == NULL || (size_t)(colon - hostport) >= sizeof(host))
        return -1;
    memcpy(host, hostport, (size_t)(colon - hostport));
    host[colon - hostport] = '\0';
    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_port = htons((uint16_t)atoi(colon + 1));
    if (inet_pton(AF_INET, host, &sin.sin_addr) != 1)
        return -1;
    if ((fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on)) != 0 || bind(fd, (struct sockaddr *)&sin, sizeof(sin)) != 0 ||
        listen(fd, 1024) != 0 || fcntl(fd, F_SETFL, O_NONBLOCK) != 0 || getsockname(fd, (struct sockaddr *)&sin, &len) != 0) {
        perror("listen");
        return -1;
    }
    printf("listening port %d\n", ntohs(sin.sin_port));
    fflush(stdout);
    return fd;
}

int main(int argc, char **argv)
{
    h2o_hostconf_t *host;
    h2o_pathconf_t *path;
    h2o_handler_t *handler;
    int nthreads = argc > 2 ? atoi(argv[2]) : 1;
    worker_t *workers;

    if (argc < 2 || nthreads < 1 || nthreads > 64) {
        fprintf(stderr, "usage: %s HOST:PORT [THREADS]\n", argv[0]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);

    /* the broker's public globalconf (server.c setup_globalconf) */
    h2o_config_init(&config);
    config.max_request_entity_size = MAX_ENTITY;
    config.http1.upgrade_to_http2 = 0; /* HTTP/1.1 only */
    config.server_name = h2o_iovec_init(H2O_STRLIT("sandbox-broker"));
    host = h2o_config_register_host(&config, h2o_iovec_init(H2O_STRLIT("default")), 65535);
    path = h2o_config_register_path(host, "/", 0);
    handler = h2o_create_handler(path, sizeof(*handler));
    handler->on_req = on_req;

    if ((listen_fd = bind_listener(argv[1])) < 0)
        return 1;
    workers = calloc((size_t)nthreads, sizeof(*workers));
    for (int i = 1; i < nthreads; ++i) {
        pthread_t tid;
        h2o_multithread_create_thread(&tid, NULL, worker_main, &workers[i]);
    }
    worker_main(&workers[0]);
    return 0;
}
