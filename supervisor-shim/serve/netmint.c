/*
 * Network tokens for runs without bindings (see netmint.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#include "sb/mem.h"
#include "sb/buf.h"
#include "relay/http.h"
#include "serve/netmint.h"

/* an admin answer is small: a token and its expiry, or an error */
#define MAX_ANSWER 65536u

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* waits for `events` on fd until the deadline; 0 when ready */
static int wait_fd(int fd, short events, int64_t deadline)
{
    for (;;) {
        struct pollfd p = {fd, events, 0};
        int64_t left = deadline - now_ms();
        int n;
        if (left <= 0)
            return -1;
        n = poll(&p, 1, left > 60000 ? 60000 : (int)left);
        if (n > 0)
            return 0;
        if (n < 0 && errno != EINTR)
            return -1;
    }
}

/*
 * One request on a fresh connection (Connection: close), the answer read to
 * its end. The secret goes into the Authorization header and nowhere else.
 */
static sb_status_t exchange(const sb_shim_netmint_t *nm, const char *method, const char *path, const char *body, int *status,
                            sb_buf_t *answer, size_t *body_off, char *err, size_t errsz)
{
    int64_t deadline = now_ms() + SB_SHIM_NETMINT_TIMEOUT_MS;
    sb_buf_t req;
    sb_shim_http_head_t head;
    char cl[32];
    const char *why = NULL;
    size_t off = 0, blen = body != NULL ? strlen(body) : 0;
    int fd, one = 1, e = 0;
    socklen_t el = sizeof(e);
    sb_status_t st = SB_E_UNAVAILABLE;

    /* the request carries the secret and the answer a token: both buffers zero what they held */
    sb_buf_init_secret(&req, 4096 + blen);
    snprintf(cl, sizeof(cl), "%zu", blen);
    if (sb_buf_append_str(&req, method) != SB_OK || sb_buf_append_str(&req, " ") != SB_OK ||
        sb_buf_append_str(&req, path) != SB_OK || sb_buf_append_str(&req, " HTTP/1.1\r\nHost: ") != SB_OK ||
        sb_buf_append_str(&req, nm->url.host_header) != SB_OK ||
        sb_buf_append_str(&req, "\r\nConnection: close\r\nContent-Type: application/json\r\nAuthorization: Bearer ") != SB_OK ||
        sb_buf_append_str(&req, nm->secret) != SB_OK || sb_buf_append_str(&req, "\r\nContent-Length: ") != SB_OK ||
        sb_buf_append_str(&req, cl) != SB_OK || sb_buf_append_str(&req, "\r\n\r\n") != SB_OK ||
        (blen != 0 && sb_buf_append(&req, body, blen) != SB_OK)) {
        snprintf(err, errsz, "out of memory");
        sb_buf_free(&req);
        return SB_E_UNAVAILABLE;
    }
    if ((fd = socket(nm->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) < 0) {
        snprintf(err, errsz, "socket: %s", strerror(errno));
        goto Exit;
    }
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(fd, (const struct sockaddr *)&nm->addr, nm->addr_len) != 0 &&
        (errno != EINPROGRESS || wait_fd(fd, POLLOUT, deadline) != 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0 ||
         e != 0)) {
        snprintf(err, errsz, "cannot connect to the broker's admin listener: %s", e != 0 ? strerror(e) : "timed out");
        goto Exit;
    }
    while (off < req.len) {
        ssize_t n = send(fd, req.base + off, req.len - off, MSG_NOSIGNAL);
        if (n > 0) {
            off += (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && wait_fd(fd, POLLOUT, deadline) == 0) {
            continue;
        } else {
            snprintf(err, errsz, "cannot send to the broker's admin listener");
            goto Exit;
        }
    }
    sb_buf_init_secret(answer, MAX_ANSWER);
    for (;;) {
        uint8_t tmp[4096];
        ssize_t n = recv(fd, tmp, sizeof(tmp), 0);
        if (n > 0) {
            if (sb_buf_append(answer, tmp, (size_t)n) != SB_OK) {
                snprintf(err, errsz, "the broker's admin answer is too large");
                goto Exit;
            }
        } else if (n == 0) {
            break;
        } else if (errno == EINTR) {
            continue;
        } else if ((errno == EAGAIN || errno == EWOULDBLOCK) && wait_fd(fd, POLLIN, deadline) == 0) {
            continue;
        } else {
            snprintf(err, errsz, "no answer from the broker's admin listener in time");
            goto Exit;
        }
    }
    if (sb_shim_http_parse_head((const uint8_t *)answer->base, answer->len, MAX_ANSWER, &head, &why) != SB_OK ||
        (head.content_length >= 0 && answer->len - head.head_len < (size_t)head.content_length)) {
        snprintf(err, errsz, "the broker's admin answer is malformed");
        goto Exit;
    }
    *status = head.status;
    *body_off = head.head_len;
    if (head.content_length >= 0)
        sb_buf_truncate(answer, head.head_len + (size_t)head.content_length);
    st = SB_OK;
Exit:
    if (fd >= 0)
        close(fd);
    sb_buf_free(&req);
    return st;
}

/* the broker's error message from {"ok":false,"error":{"code","message"}}, or "" */
static void error_message(const sb_buf_t *answer, size_t off, char *out, size_t outsz)
{
    json_t *o = json_loadb(answer->base + off, answer->len - off, 0, NULL);
    const char *m = json_string_value(json_object_get(json_object_get(o, "error"), "message"));

    snprintf(out, outsz, "%.200s", m != NULL ? m : "");
    json_decref(o);
}

sb_status_t sb_shim_netmint_mint(const sb_shim_netmint_t *nm, const json_t *net, const json_t *imports, int64_t timeout_ms,
                                 char token[65], char *err, size_t errsz)
{
    uint8_t rnd[16];
    char run_id[64], msg[256];
    json_t *body;
    char *text;
    sb_buf_t answer;
    size_t off = 0;
    int status = 0;
    sb_status_t st;

    memset(&answer, 0, sizeof(answer));
    if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd)) {
        snprintf(err, errsz, "no randomness for a run id");
        return SB_E_UNAVAILABLE;
    }
    snprintf(run_id, sizeof(run_id), SB_SHIM_NETMINT_RUN_PREFIX);
    for (size_t i = 0; i < sizeof(rnd); ++i)
        snprintf(run_id + strlen(run_id), sizeof(run_id) - strlen(run_id), "%02x", rnd[i]);
    /* net and import each present only when not empty (the broker refuses an empty list); a run with imports has its
     * module path's import.fetch calls under this token too (PROTOCOL.md section 6c) */
    body = json_pack("{s:s, s:{s:I}}", "runId", run_id, "capabilities", "timeoutMs", (json_int_t)timeout_ms);
    if (body != NULL && ((net != NULL && json_array_size(net) != 0 &&
                          json_object_set(json_object_get(body, "capabilities"), "net", (json_t *)net) != 0) ||
                         (imports != NULL && json_array_size(imports) != 0 &&
                          json_object_set(json_object_get(body, "capabilities"), "import", (json_t *)imports) != 0))) {
        json_decref(body);
        body = NULL;
    }
    text = body != NULL ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (text == NULL) {
        snprintf(err, errsz, "out of memory");
        return SB_E_UNAVAILABLE;
    }
    st = exchange(nm, "POST", "/admin/v1/tokens", text, &status, &answer, &off, err, errsz);
    sb_mem_free_foreign(text);
    if (st != SB_OK)
        goto Exit;
    if (status == 201) {
        json_t *o = json_loadb(answer.base + off, answer.len - off, 0, NULL);
        const char *t = json_string_value(json_object_get(o, "token"));
        int good = t != NULL && strlen(t) == 64;
        for (size_t i = 0; good && i < 64; ++i)
            good = (t[i] >= '0' && t[i] <= '9') || (t[i] >= 'a' && t[i] <= 'f');
        if (good)
            memcpy(token, t, 65);
        else
            snprintf(err, errsz, "the broker's mint answer carries no token");
        json_decref(o);
        st = good ? SB_OK : SB_E_UNAVAILABLE;
        goto Exit;
    }
    error_message(&answer, off, msg, sizeof(msg));
    snprintf(err, errsz, "the broker refused a network token (HTTP %d%s%s)", status, msg[0] != '\0' ? ": " : "", msg);
    st = status >= 400 && status < 500 ? SB_E_FORBIDDEN : SB_E_UNAVAILABLE;
Exit:
    sb_buf_free(&answer);
    return st;
}

sb_status_t sb_shim_netmint_revoke(const sb_shim_netmint_t *nm, const char *token, char *err, size_t errsz)
{
    char path[128];
    sb_buf_t answer;
    size_t off = 0;
    int status = 0;
    sb_status_t st;

    memset(&answer, 0, sizeof(answer));
    snprintf(path, sizeof(path), "/admin/v1/tokens/%s", token);
    st = exchange(nm, "DELETE", path, NULL, &status, &answer, &off, err, errsz);
    explicit_bzero(path, sizeof(path));
    sb_buf_free(&answer);
    if (st == SB_OK && status != 204) {
        snprintf(err, errsz, "the broker did not revoke the network token (HTTP %d)", status);
        st = SB_E_UNAVAILABLE;
    }
    return st;
}
