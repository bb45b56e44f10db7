/*
 * sandbox-shim serve: the supervisor as a service (README.md, "Service mode").
 *
 * One h2o evloop on one thread serves HTTP/1.1: GET /health, POST /run,
 * GET /metrics. A /run request is decoded and checked here (serve_req.c);
 * a run that passes gets a process of its own (serve_run.c), forked from this
 * one, which starts the guest the way `run` does (runner.c, in the kernel jail
 * made and probed once at start-up: jail.h) and reports back over a
 * socketpair watched by the loop. The loop never blocks on a run: the
 * number of runs is capped (--max-runs, 503 beyond it, no queue), each run
 * has a hard deadline, and a run whose client hangs up is cancelled by its own
 * process, which watches the client's connection.
 *
 * Nothing this file logs or answers carries a source, an input, a secret or
 * a token (README.md, "Logs and metrics").
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <h2o.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include "sb/buf.h"
#include "sb/mem.h"
#include "serve/serve.h"
#include "serve/serve_int.h"
#include "serve/serve_conf.h"
#include "serve/launcher.h"
#include "serve/gate.h"
#include "serve/metrics.h"
#include "relay/tls.h"
#include "sb_build_info.h"

#define ADMISSION_HEADER "x-questpie-sandbox-host-admission"
/*
 * h2o buffers a whole body before the handler runs and answers its own 413
 * past max_request_entity_size (json_error_setup makes it our JSON answer). h2o
 * counts a chunked body with its chunk framing, so the cap is 1 MiB above our
 * 2 MiB: a chunked body of at most 2 MiB whose framing takes less than 1 MiB
 * reaches the handler, which decides on the decoded size.
 */
#define H2O_ENTITY_CAP (SB_SERVE_MAX_BODY + 1024u * 1024u)
/* past its timeout, a run's process gets this long (deno start-up, mint, revoke) before it is killed */
#define RUN_GRACE_MS 20000
/* after SIGTERM, runs in flight get this long to finish */
#define DRAIN_MS 45000
/* /health starts Deno as a guest at most this often */
#define HEALTH_EVERY_MS 1000

#define MSG_DENIED "The workload is not authorized for this sandbox operation."

/*
 * Connections before their first head passed the gate (gate.h): at most this share of
 * --max-connections (the rest is kept for connections that showed the admission header), and each
 * for at most GATE_HEAD_MS until its head is complete. When none is free, the oldest one waiting
 * is closed for the new one.
 */
#define GATE_SHARE_NUM 3u
#define GATE_SHARE_DEN 4u
#define GATE_HEAD_MS 2000
/* a refusal's connection is read (and dropped) for at most this long, so the client sees the answer */
#define LINGER_MS 1000
#define LINGER_BYTES (256u * 1024u)
/* refusals before admission: at most this many log lines per interval, then one summary line */
#define REFUSAL_LOG_BUDGET 20u
#define REFUSAL_LOG_INTERVAL_MS 1000

/* the /metrics text: a fixed set of counters, about 2 kB; past this the scrape is a 500, never a cut text */
#define SERVE_METRICS_MAX 65536u

typedef struct st_conn_t {
    struct st_conn_t *next, *prev;
    h2o_socket_t *sock;
    int gated;         /* still in the gate: serve reads its head, h2o does not have it yet */
    int lingering;     /* a refusal was written: its input is dropped until LINGER_MS or LINGER_BYTES */
    int admitted;      /* its first head carried the admission header: h2o keeps it alive */
    unsigned requests; /* requests h2o handed to on_req on it */
    size_t dropped;
    int64_t since_ms; /* accepted (gated), or refusal written (lingering) */
    char answer[320]; /* a refusal's whole HTTP answer, while it is written */
} conn_t;

typedef struct st_run_t {
    struct st_run_t *next, *prev;
    h2o_req_t *req;         /* NULL once h2o disposed of the request */
    struct st_run_t **slot; /* in the request's pool, pointing back here (NULL with req) */
    pid_t pid;              /* the run's process */
    int pidfd;              /* names exactly that process until it is reaped; -1 without pidfd_open */
    pid_t guest;            /* the guest's process group, 0 until it started */
    int guest_alive;
    h2o_socket_t *sock; /* the report socket */
    int have_result;
    int answered;   /* the answer went out (at the 'R' record, before the process's end) */
    int holds_slot; /* counts against --max-runs */
    json_t *meta;
    char *body;
    size_t body_len;
    int64_t started_ms, deadline_ms;
} run_t;

static struct {
    sb_serve_settings_t set; /* serve_conf.h: read once at start, the secret files again on SIGHUP */
    uint8_t admission_hash[32];

    h2o_globalconf_t gc;
    h2o_context_t ctx;
    h2o_accept_ctx_t actx;
    h2o_evloop_t *loop;
    h2o_socket_t *listener;
    conn_t *conns;
    size_t nconns, ngated, nlingering; /* ngated + nlingering: connections not (yet) admitted */
    run_t *runs;
    unsigned nruns, guests;
    unsigned active; /* runs holding a --max-runs slot: from the fork to their answer */

    sb_serve_metrics_t m; /* metrics.h */
    /* the refusal log's budget: lines written in this interval, and refusals not logged */
    int64_t rlog_interval_at;
    unsigned rlog_lines;
    unsigned long long rlog_suppressed;

    /* the launcher every run's process is forked from, and its pool (launcher.h) */
    sb_serve_launcher_t launcher;
    uint64_t pool_failures_logged, pool_died_logged;
    int launcher_down_logged;

    /* operations */
    int64_t health_at; /* when the guest check behind /health last ran (0: never) */
    int health_ok;
    char health_err[512];
} S;

static volatile sig_atomic_t stop_requested, reopen_requested, reload_requested, other_signal;

/* ---- logging: one JSON line per event on stderr (the broker's format) ---- */

static void log_event(const char *level, const char *event, json_t *fields)
{
    struct timespec ts;
    struct tm tm;
    char stamp[96];
    json_t *o = json_object();
    const char *k;
    json_t *v;
    char *text;

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    snprintf(stamp, sizeof(stamp), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
             tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    json_object_set_new(o, "ts", json_string(stamp));
    json_object_set_new(o, "level", json_string(level));
    json_object_set_new(o, "event", json_string(event));
    if (fields != NULL) {
        json_object_foreach(fields, k, v)
        {
            json_object_set(o, k, v);
        }
        json_decref(fields);
    }
    if ((text = json_dumps(o, JSON_COMPACT)) != NULL) {
        fputs(text, stderr);
        fputc('\n', stderr);
        fflush(stderr);
        sb_mem_free_foreign(text);
    }
    json_decref(o);
}

/* ---- answers ---- */

static void send_json(h2o_req_t *req, int status, const char *reason, const char *body, size_t len)
{
    static h2o_generator_t generator = {NULL, NULL};
    h2o_iovec_t buf = h2o_strdup(&req->pool, body, len);

    req->res.status = status;
    req->res.reason = reason;
    req->res.content_length = len;
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, H2O_STRLIT("application/json"));
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CACHE_CONTROL, NULL, H2O_STRLIT("no-store"));
    if (stop_requested)
        req->http1_is_persistent = 0;
    h2o_start_response(req, &generator);
    h2o_send(req, &buf, 1, H2O_SEND_STATE_FINAL);
}

#define SEND_LIT(req, status, reason, lit) send_json(req, status, reason, H2O_STRLIT(lit))

/* counts and logs a /run request; `fields` (taken) may carry calls, timedOut and extras */
static void account(sb_serve_outcome_t outcome, int status, int64_t ms, json_t *fields)
{
    json_t *line = json_object(), *v;
    const char *k;

    ++S.m.outcomes[outcome < SB_SERVE_OUT_COUNT ? outcome : SB_SERVE_OUT_ERROR];
    json_object_set_new(line, "outcome", json_string(sb_serve_outcome_name(outcome)));
    json_object_set_new(line, "status", json_integer(status));
    json_object_set_new(line, "ms", json_integer(ms));
    v = fields != NULL ? json_object_get(fields, "calls") : NULL;
    json_object_set_new(line, "calls", v != NULL ? json_incref(v) : json_integer(0));
    v = fields != NULL ? json_object_get(fields, "timedOut") : NULL;
    json_object_set_new(line, "timedOut", v != NULL ? json_incref(v) : json_false());
    if (fields != NULL) {
        json_object_foreach(fields, k, v)
        {
            if (json_object_get(line, k) == NULL)
                json_object_set(line, k, v);
        }
        json_decref(fields);
    }
    log_event("info", "run", line);
}

/*
 * Refusals before admission cost whoever connects nothing but the refusal: they are counted always
 * (sb_serve_runs_total, sb_serve_refused_total) and logged at most REFUSAL_LOG_BUDGET a
 * REFUSAL_LOG_INTERVAL_MS; past that one "refusals.suppressed" line per interval says how many
 * were not (refusal_log_flush, from the loop).
 */
static void refusal_log_flush(int64_t now)
{
    if (now - S.rlog_interval_at < REFUSAL_LOG_INTERVAL_MS)
        return;
    if (S.rlog_suppressed > 0)
        log_event("warn", "refusals.suppressed",
                  json_pack("{s:I, s:I}", "suppressed", (json_int_t)S.rlog_suppressed, "intervalMs",
                            (json_int_t)REFUSAL_LOG_INTERVAL_MS));
    S.rlog_suppressed = 0;
    S.rlog_lines = 0;
    S.rlog_interval_at = now;
}

static int refusal_log_ok(void)
{
    refusal_log_flush(sb_serve_now_ms());
    if (S.rlog_lines < REFUSAL_LOG_BUDGET) {
        ++S.rlog_lines;
        return 1;
    }
    ++S.rlog_suppressed;
    ++S.m.log_suppressed;
    return 0;
}

/* a POST /run refused before admission: counted as account() counts, logged within the budget */
static void account_refused(sb_serve_outcome_t outcome, int status, int64_t ms, json_t *fields)
{
    if (refusal_log_ok()) {
        account(outcome, status, ms, fields);
        return;
    }
    ++S.m.outcomes[outcome < SB_SERVE_OUT_COUNT ? outcome : SB_SERVE_OUT_ERROR];
    json_decref(fields);
}

/* a run answered before any process: {ok:false, error, logs:[], ms} */
static void answer_failure(h2o_req_t *req, sb_serve_outcome_t outcome, const char *error, int64_t started)
{
    int64_t ms = sb_serve_now_ms() - started;
    json_t *o = json_pack("{s:b, s:s, s:[], s:I}", "ok", 0, "error", error, "logs", "ms", (json_int_t)ms);
    char *text = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;

    if (text != NULL)
        send_json(req, 200, "OK", text, strlen(text));
    else
        SEND_LIT(req, 500, "Internal Server Error", "{\"ok\":false,\"error\":\"sandbox IO error: out of memory\",\"logs\":[]}");
    sb_mem_free_foreign(text);
    json_decref(o);
    account(outcome, 200, ms, NULL);
}

/* ---- admission ---- */

static void sha256(const void *p, size_t n, uint8_t out[32])
{
    unsigned len = 32;
    if (EVP_Digest(p, n, out, &len, EVP_sha256(), NULL) != 1)
        abort();
}

/*
 * The host's credential: the admission header, compared as SHA-256 digests
 * with CRYPTO_memcmp, so neither its bytes nor its length leak through
 * timing. One header exactly: two are ambiguous and refused.
 * /metrics also takes "Authorization: Bearer <secret>" (what scrapers send).
 */
static int admitted(h2o_req_t *req, int allow_bearer)
{
    ssize_t i = h2o_find_header_by_str(&req->headers, H2O_STRLIT(ADMISSION_HEADER), -1);
    uint8_t got[32];
    h2o_iovec_t v;

    if (i >= 0) {
        if (h2o_find_header_by_str(&req->headers, H2O_STRLIT(ADMISSION_HEADER), i) >= 0)
            return 0;
        v = req->headers.entries[i].value;
    } else if (allow_bearer && (i = h2o_find_header(&req->headers, H2O_TOKEN_AUTHORIZATION, -1)) >= 0) {
        v = req->headers.entries[i].value;
        if (h2o_find_header(&req->headers, H2O_TOKEN_AUTHORIZATION, i) >= 0 || v.len < 7 ||
            !h2o_lcstris(v.base, 7, H2O_STRLIT("bearer ")))
            return 0;
        v.base += 7;
        v.len -= 7;
    } else {
        return 0;
    }
    sha256(v.base, v.len, got);
    return CRYPTO_memcmp(got, S.admission_hash, 32) == 0;
}

/* ---- runs ---- */

/*
 * Signals a run's process through its pidfd, which cannot name another process. Never by pid: the
 * process is the launcher's child, reaped there, so its pid may already be another's. (Without a
 * pidfd, which the launcher's start checks the kernel has, the run still ends: its deadline and
 * the client's hang-up reach it through its own descriptors.)
 */
static void signal_run(const run_t *r, int sig)
{
#ifdef SYS_pidfd_send_signal
    if (r->pidfd >= 0)
        (void)syscall(SYS_pidfd_send_signal, r->pidfd, sig, NULL, 0);
#else
    (void)r;
    (void)sig;
#endif
}

static void run_unlink(run_t *r)
{
    if (r->prev != NULL)
        r->prev->next = r->next;
    else
        S.runs = r->next;
    if (r->next != NULL)
        r->next->prev = r->prev;
    --S.nruns;
}

static void release_slot(run_t *r)
{
    if (r->holds_slot) {
        r->holds_slot = 0;
        --S.active;
    }
}

/*
 * The run's answer, once: the body its process reported, or (when there is
 * none: the process died, its report was malformed, it overran its deadline)
 * a "sandbox IO error". The request is detached first, so that its disposal,
 * after the answer, reaches back to nothing. The run is counted and logged
 * here, and its --max-runs slot is free: its guest is gone and its token
 * revoked, what remains of the process is its exit.
 */
static void run_answer(run_t *r, const char *why)
{
    h2o_req_t *req = r->req;
    int64_t ms = sb_serve_now_ms() - r->started_ms;
    sb_serve_outcome_t outcome = SB_SERVE_OUT_ERROR;
    json_t *fields;

    if (r->answered)
        return;
    r->answered = 1;
    fields = json_object();
    if (r->slot != NULL) {
        *r->slot = NULL;
        r->slot = NULL;
    }
    r->req = NULL;
    release_slot(r);
    if (r->have_result) {
        const char *o = json_string_value(json_object_get(r->meta, "outcome"));
        json_int_t jf = json_integer_value(json_object_get(r->meta, "jailFailures"));
        outcome = sb_serve_outcome_parse(o);
        json_object_set(fields, "calls", json_object_get(r->meta, "calls"));
        json_object_set(fields, "timedOut", json_object_get(r->meta, "timedOut"));
        if (json_object_get(r->meta, "revoke") != NULL)
            json_object_set(fields, "revoke", json_object_get(r->meta, "revoke"));
        if (json_object_get(r->meta, "revokeError") != NULL)
            json_object_set(fields, "revokeError", json_object_get(r->meta, "revokeError"));
        json_object_set(fields, "pooled", json_object_get(r->meta, "pooled"));
        if (json_is_true(json_object_get(r->meta, "pooledGuestDied"))) { /* its pooled guest died at the hand-over: cold */
            json_object_set_new(fields, "pooledGuestDied", json_true());
            ++S.m.handover_deaths;
        }
        /* a failed binding call: its method, code, the broker's reason and correlation id */
        if (json_is_string(json_object_get(r->meta, "detail")))
            json_object_set(fields, "detail", json_object_get(r->meta, "detail"));
        if (json_is_integer(json_object_get(r->meta, "modules"))) /* runs with imports: import.fetch calls */
            json_object_set(fields, "modules", json_object_get(r->meta, "modules"));
        if (json_is_integer(json_object_get(r->meta, "handoverMs"))) {
            json_int_t h = json_integer_value(json_object_get(r->meta, "handoverMs"));
            json_object_set_new(fields, "handoverMs", json_integer(h));
            if (h >= 0)
                sb_serve_hist_observe(&S.m.handover, h);
        }
        if (jf > 0) {
            S.m.jail_failures += (unsigned long long)jf;
            json_object_set_new(fields, "jailFailures", json_integer(jf));
        }
        if (req != NULL)
            send_json(req, 200, "OK", r->body, r->body_len);
    } else {
        char e[200];
        json_t *o;
        char *text;
        snprintf(e, sizeof(e), "sandbox IO error: %s", why != NULL ? why : "the run ended without an outcome");
        o = json_pack("{s:b, s:s, s:[], s:I}", "ok", 0, "error", e, "logs", "ms", (json_int_t)ms);
        text = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;
        if (req != NULL && text != NULL)
            send_json(req, 200, "OK", text, strlen(text));
        sb_mem_free_foreign(text);
        json_decref(o);
        json_object_set_new(fields, "reason", json_string(why != NULL ? why : "no outcome"));
    }
    if (req == NULL)
        json_object_set_new(fields, "answered", json_false());
    sb_serve_hist_observe(&S.m.runs, ms);
    account(outcome, 200, ms, fields);
}

/* the run is over: its process ended, or is killed now (`why`); what is left of it goes */
static void run_finish(run_t *r, const char *why)
{
    if (why != NULL)
        signal_run(r, SIGKILL);
    run_answer(r, why);
    if (r->sock != NULL) {
        h2o_socket_close(r->sock);
        r->sock = NULL;
    }
    if (r->guest_alive) {
        /*
         * The run's process went without reporting its guest's end (it was
         * killed). The guest dies with it (PR_SET_PDEATHSIG, child.c); it is
         * not signalled from here, as its group id may already be free.
         */
        r->guest_alive = 0;
        --S.guests;
    }
    if (r->pidfd >= 0)
        close(r->pidfd);
    r->pidfd = -1;
    /* the launcher reaps it (runs are its children) and removes the cgroups of one that was killed */
    run_unlink(r);
    json_decref(r->meta);
    sb_mem_free(r->body);
    sb_mem_free(r);
}

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* takes whole records from the report socket; -1 when the stream is not one the run process writes */
static int take_records(run_t *r)
{
    h2o_buffer_t *in = r->sock->input;

    while (in->size >= 5) {
        uint8_t kind = (uint8_t)in->bytes[0];
        uint32_t len = be32((const uint8_t *)in->bytes + 1);
        const char *p = in->bytes + 5;
        if (len > SB_SERVE_MAX_RECORD)
            return -1;
        if (in->size < 5 + (size_t)len)
            return 0;
        if (kind == SB_SERVE_REC_GUEST && len == 4 && !r->guest_alive && r->guest == 0) {
            r->guest = (pid_t)be32((const uint8_t *)p);
            r->guest_alive = 1;
            ++S.guests;
        } else if (kind == SB_SERVE_REC_GONE && len == 0 && r->guest_alive) {
            r->guest_alive = 0;
            --S.guests;
        } else if (kind == SB_SERVE_REC_RESULT && !r->have_result) {
            const char *nl = memchr(p, '\n', len);
            if (nl == NULL || (r->meta = json_loadb(p, (size_t)(nl - p), 0, NULL)) == NULL || !json_is_object(r->meta))
                return -1;
            r->body_len = len - (size_t)(nl + 1 - p);
            if ((r->body = sb_mem_try_alloc(r->body_len + 1)) == NULL)
                return -1;
            memcpy(r->body, nl + 1, r->body_len);
            r->have_result = 1;
        } else {
            return -1;
        }
        h2o_buffer_consume(&r->sock->input, 5 + (size_t)len);
        in = r->sock->input;
    }
    return 0;
}

static void on_report(h2o_socket_t *sock, const char *err)
{
    run_t *r = sock->data;

    if (take_records(r) != 0) {
        run_finish(r, "the run's report was malformed");
        return;
    }
    if (r->have_result)
        run_answer(r, NULL);
    if (err != NULL)
        run_finish(r, NULL);
}

/*
 * h2o let go of a request whose run is still going: its connection is gone.
 * Nobody will read the answer, so the run is cancelled at once: SIGTERM tells
 * its process to kill the guest and drop its broker calls (as a hang-up of the
 * client's connection does), then to clean up after the guest (its work
 * directory, the jail's uid and cgroup, a minted token) and report; the run's
 * deadline still bounds it (run_finish then SIGKILLs it).
 */
static void on_req_dispose(void *p)
{
    run_t *r = *(run_t **)p;
    if (r == NULL)
        return;
    r->req = NULL;
    r->slot = NULL;
    signal_run(r, SIGTERM);
}

/* the client's connection, found by its two ends (peer and local address) among the open ones */
static conn_t *conn_of(h2o_req_t *req);

/* the request's own connection (its socket, not an address that two connections may share) */
static int client_fd(h2o_req_t *req)
{
    conn_t *c = conn_of(req);
    return c != NULL && c->sock != NULL ? h2o_socket_get_fd(c->sock) : -1;
}

static void start_run(h2o_req_t *req, sb_serve_job_t *job)
{
    run_t *r = sb_mem_try_calloc(1, sizeof(*r)), **slot;
    int sv[2] = {-1, -1}, cfd = client_fd(req), pidfd = -1, pooled = 0;
    pid_t pid;
    char e[300], why[240];

    if (r == NULL || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        snprintf(e, sizeof(e), "failed to spawn sandbox subprocess: %s", r == NULL ? "out of memory" : strerror(errno));
        sb_mem_free(r);
        answer_failure(req, SB_SERVE_OUT_SPAWN_FAILED, e, job->started_ms);
        return;
    }
    /* the run's process is forked by the launcher, whose memory holds no other run's data (launcher.h) */
    if (sb_serve_launcher_submit(&S.launcher, job, sv[1], cfd, &pid, &pidfd, &pooled, why, sizeof(why)) != SB_OK) {
        snprintf(e, sizeof(e), "failed to spawn sandbox subprocess: %s", why);
        close(sv[0]);
        close(sv[1]);
        sb_mem_free(r);
        answer_failure(req, SB_SERVE_OUT_SPAWN_FAILED, e, job->started_ms);
        return;
    }
    close(sv[1]);
    (void)fcntl(sv[0], F_SETFL, O_NONBLOCK);
    r->pid = pid;
    r->pidfd = pidfd;
    r->req = req;
    r->holds_slot = 1;
    ++S.active;
    r->started_ms = job->started_ms;
    r->deadline_ms = sb_serve_now_ms() + job->timeout_ms + RUN_GRACE_MS;
    r->sock = h2o_evloop_socket_create(S.loop, sv[0], 0);
    r->sock->data = r;
    slot = h2o_mem_alloc_shared(&req->pool, sizeof(*slot), on_req_dispose);
    *slot = r;
    r->slot = slot;
    r->next = S.runs;
    if (S.runs != NULL)
        S.runs->prev = r;
    S.runs = r;
    ++S.nruns;
    h2o_socket_read_start(r->sock, on_report);
}

static void job_dispose(sb_serve_job_t *job)
{
    msgpack_sbuffer_destroy(&job->init);
    explicit_bzero(job->token, sizeof(job->token));
    explicit_bzero(job->netmint_secret, sizeof(job->netmint_secret));
    json_decref(job->net);
    json_decref(job->imports);
}

/*
 * POST /run. The order is upstream's: the body cap (413), JSON (400), the
 * mode and the host's admission (403), the schema (400); then the checks
 * that answer a failed run without starting one: imports, the bindings URL,
 * a network grant without bindings; then capacity (503); then the run.
 */
static void handle_run(h2o_req_t *req)
{
    int64_t started = sb_serve_now_ms();
    sb_serve_job_t job;
    sb_serve_run_t run;
    json_t *root = NULL;
    const char *why = NULL;
    sb_status_t st;

    if (req->entity.len > SB_SERVE_MAX_BODY) {
        SEND_LIT(req, 413, "Payload Too Large", "{\"ok\":false,\"error\":\"request body too large\",\"logs\":[]}");
        account_refused(SB_SERVE_OUT_INVALID, 413, sb_serve_now_ms() - started, NULL);
        return;
    }
    st = sb_serve_req_decode(req->entity.base, req->entity.len, &root);
    if (st == SB_E_BAD_ARGS) {
        SEND_LIT(req, 400, "Bad Request", "{\"ok\":false,\"error\":\"invalid JSON body\",\"logs\":[]}");
        account_refused(SB_SERVE_OUT_INVALID, 400, sb_serve_now_ms() - started, NULL);
        return;
    }
    /* too deep or too many values for any valid request: what upstream answers depends on the admission only */
    if (st != SB_OK ? !admitted(req, 0) : !sb_serve_req_is_host(root) || !admitted(req, 0)) {
        json_decref(root);
        SEND_LIT(req, 403, "Forbidden", "{\"ok\":false,\"error\":\"" MSG_DENIED "\",\"logs\":[]}");
        account_refused(SB_SERVE_OUT_DENIED, 403, sb_serve_now_ms() - started, NULL);
        return;
    }
    if (st != SB_OK || sb_serve_req_validate(root, &run, &why) != SB_OK) {
        json_decref(root);
        SEND_LIT(req, 400, "Bad Request", "{\"ok\":false,\"error\":\"invalid sandbox request\",\"logs\":[]}");
        account(SB_SERVE_OUT_INVALID, 400, sb_serve_now_ms() - started, NULL);
        return;
    }

    memset(&job, 0, sizeof(job));
    msgpack_sbuffer_init(&job.init);
    job.conf = &S.set.conf;
    job.started_ms = started;
    job.timeout_ms = run.timeout_ms;
    job.memory_mb = run.memory_mb;
    /* remote module imports: through the broker's egress, on the module path inside the guest's jail (relay/modules.h) */
    if (run.imports != NULL && json_array_size(run.imports) != 0) {
        size_t i;
        json_t *h;
        const char *iwhy = NULL;
        char e[600];
        if (!sb_shim_jail_enabled(S.set.conf.deno.jail)) {
            answer_failure(req, SB_SERVE_OUT_EGRESS_BLOCKED,
                           "egress blocked: remote module imports need the jail (this supervisor runs with --jail=off)", started);
            goto Exit;
        }
        json_array_foreach(run.imports, i, h)
        {
            if (sb_shim_imports_add(&job.origins, json_string_value(h), json_string_length(h), &iwhy) != 0) {
                snprintf(e, sizeof(e), "egress blocked: capabilities.import entry \"%.256s\": %s", json_string_value(h), iwhy);
                answer_failure(req, SB_SERVE_OUT_EGRESS_BLOCKED, e, started);
                goto Exit;
            }
        }
        job.imports = json_incref((json_t *)run.imports);
    }
    if (run.has_bindings) {
        sb_shim_url_t u;
        const char *uwhy = NULL;
        char e[SB_SERVE_MAX_URL + 128];
        if (!S.set.conf.have_broker) {
            answer_failure(req, SB_SERVE_OUT_REJECTED, "bindings rejected: sandbox broker URL is not configured", started);
            goto Exit;
        }
        if (strlen(run.url) != run.url_len || sb_shim_url_parse(run.url, &u, &uwhy) != SB_OK) {
            snprintf(e, sizeof(e), "bindings rejected: bindings.url is not a valid URL: %s", run.url);
            answer_failure(req, SB_SERVE_OUT_REJECTED, e, started);
            goto Exit;
        }
        if (!sb_shim_url_equal(&u, &S.set.conf.broker)) {
            answer_failure(req, SB_SERVE_OUT_REJECTED, "bindings rejected: bindings.url does not match the configured broker URL",
                           started);
            goto Exit;
        }
        if (!sb_serve_token_ok(run.token, run.token_len)) {
            answer_failure(req, SB_SERVE_OUT_REJECTED, "bindings rejected: bindings.token cannot be sent in an HTTP header",
                           started);
            goto Exit;
        }
        job.kind = SB_SERVE_BINDINGS;
        memcpy(job.token, run.token, run.token_len);
        job.token[run.token_len] = '\0';
    } else if ((run.net != NULL && json_array_size(run.net) != 0) || job.imports != NULL) {
        /* the guest stays without sockets: its fetch and its modules are relayed under a token minted for the run */
        if (!S.set.conf.have_netmint || !S.set.conf.have_broker) {
            answer_failure(req, SB_SERVE_OUT_EGRESS_BLOCKED,
                           run.net != NULL && json_array_size(run.net) != 0
                               ? "egress blocked: network access for runs without bindings needs the broker's net-mint "
                                 "credential, which this supervisor does not have"
                               : "egress blocked: remote module imports for runs without bindings need the broker's net-mint "
                                 "credential, which this supervisor does not have",
                           started);
            goto Exit;
        }
        job.kind = SB_SERVE_NET;
        job.net = run.net != NULL ? json_incref((json_t *)run.net) : json_array();
        memcpy(job.netmint_secret, S.set.conf.netmint.secret, sizeof(job.netmint_secret));
    } else {
        job.kind = SB_SERVE_COMPUTE;
    }
    if (S.active >= S.set.max_runs) {
        SEND_LIT(req, 503, "Service Unavailable", "{\"ok\":false,\"error\":\"sandbox supervisor is at capacity\",\"logs\":[]}");
        account(SB_SERVE_OUT_BUSY, 503, sb_serve_now_ms() - started, NULL);
        goto Exit;
    }
    if (sb_serve_req_pack_init(&run, job.kind == SB_SERVE_BINDINGS, job.kind != SB_SERVE_COMPUTE, &job.origins, &job.init) !=
        SB_OK) {
        answer_failure(req, SB_SERVE_OUT_INVALID, "sandbox output limit exceeded", started);
        goto Exit;
    }
    start_run(req, &job);
Exit:
    job_dispose(&job);
    json_decref(root);
}

/* ---- health and metrics ---- */

/*
 * GET /health: whether a run can start now, as the broker's /readyz says whether a call can be
 * served. Deno is started as a guest (guest_deno_version: the spawn path, the jail, a free guest
 * uid), at most once per HEALTH_EVERY_MS whatever the number of probes; a removed or unreachable
 * Deno, no free guest uid, or a jail the kernel now refuses answers 503 with the reason.
 * The check blocks the loop for the time Deno takes to print its version (about 20 ms).
 */
static void handle_health(h2o_req_t *req)
{
    char body[900], version[64];
    int64_t now = sb_serve_now_ms();
    json_t *o;
    char *text;

    if (S.health_at == 0 || now - S.health_at >= HEALTH_EVERY_MS) {
        S.health_ok = sb_serve_deno_version(&S.set.conf, version, sizeof(version), SB_SERVE_DENO_CHECK_HEALTH_MS, S.health_err,
                                            sizeof(S.health_err)) == 0;
        S.health_at = sb_serve_now_ms();
    }
    /* every run's process comes from the launcher: without it no run can start (launcher.h) */
    if (S.health_ok && !sb_serve_launcher_alive(&S.launcher)) {
        S.health_ok = 0;
        snprintf(S.health_err, sizeof(S.health_err), "the launcher is gone: no run can start until serve is restarted");
    }
    if (S.health_ok) {
        int n = snprintf(body, sizeof(body), "{\"ok\":true,\"runtime\":\"deno\",\"version\":\"%s\"}", S.set.deno_version);
        send_json(req, 200, "OK", body, (size_t)n);
        return;
    }
    o = json_pack("{s:b, s:s, s:s, s:s}", "ok", 0, "runtime", "deno", "version", S.set.deno_version, "error", S.health_err);
    text = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;
    if (text != NULL)
        send_json(req, 503, "Service Unavailable", text, strlen(text));
    else
        SEND_LIT(req, 503, "Service Unavailable", "{\"ok\":false,\"runtime\":\"deno\"}");
    sb_mem_free_foreign(text);
    json_decref(o);
}

static void handle_metrics(h2o_req_t *req)
{
    static h2o_generator_t generator = {NULL, NULL};
    sb_serve_gauges_t g;
    sb_buf_t t;
    sb_status_t st;
    h2o_iovec_t buf;

    if (!admitted(req, 1)) {
        SEND_LIT(req, 403, "Forbidden", "{\"ok\":false,\"error\":\"" MSG_DENIED "\",\"logs\":[]}");
        return;
    }
    /* the scrape gets the whole text or a 500, never a cut one */
    g.gated = S.ngated;
    g.open = S.nconns;
    g.runs = S.nruns;
    g.guests = S.guests;
    g.max_runs = S.set.max_runs;
    sb_serve_launcher_stats(&S.launcher, &g.pool);
    sb_buf_init(&t, SERVE_METRICS_MAX);
    st = sb_serve_metrics_text(&S.m, &g, &t);
    if (st != SB_OK) {
        sb_buf_free(&t);
        SEND_LIT(req, 500, "Internal Server Error", "{\"ok\":false,\"error\":\"out of memory\",\"logs\":[]}");
        return;
    }
    buf = h2o_strdup(&req->pool, t.base, t.len);
    sb_buf_free(&t);
    req->res.status = 200;
    req->res.reason = "OK";
    req->res.content_length = buf.len;
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, H2O_STRLIT("text/plain; version=0.0.4"));
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CACHE_CONTROL, NULL, H2O_STRLIT("no-store"));
    h2o_start_response(req, &generator);
    h2o_send(req, &buf, 1, H2O_SEND_STATE_FINAL);
}

/* the JSON bodies of h2o's own refusals (json_error_setup) */
static const char BODY_413[] = "{\"ok\":false,\"error\":\"request body too large\",\"logs\":[]}";
static const char BODY_400[] = "{\"ok\":false,\"error\":\"invalid request\",\"logs\":[]}";

typedef struct st_json_error_ostream_t {
    h2o_ostream_t super;
    h2o_iovec_t body;
} json_error_ostream_t;

static void json_error_send(h2o_ostream_t *self, h2o_req_t *req, h2o_iovec_t *bufs, size_t bufcnt, h2o_send_state_t state)
{
    json_error_ostream_t *o = (json_error_ostream_t *)self;
    (void)bufs;
    (void)bufcnt;
    if (h2o_send_state_is_in_progress(state))
        h2o_ostream_send_next(self, req, NULL, 0, state);
    else
        h2o_ostream_send_next(self, req, &o->body, 1, state);
}

/*
 * h2o's own refusals (a 4xx it answers before any handler: a chunked body past its limit, broken
 * chunked encoding, ...) are plain text; this filter, on every path h2o may bind such an answer to,
 * gives them our JSON shape, 413 "request body too large" and every other one "invalid request",
 * so the client sees the same JSON 413 however the body came (a Content-Length past the cap never
 * gets that far: the gate answers it).
 */
static void json_error_setup(h2o_filter_t *self, h2o_req_t *req, h2o_ostream_t **slot)
{
    ssize_t i = h2o_find_header(&req->res.headers, H2O_TOKEN_CONTENT_TYPE, -1);
    (void)self;
    if (req->res.status >= 400 && req->res.status <= 499 &&
        (i < 0 || !h2o_memis(req->res.headers.entries[i].value.base, req->res.headers.entries[i].value.len,
                             H2O_STRLIT("application/json")))) {
        json_error_ostream_t *o;
        h2o_iovec_t body = req->res.status == 413 ? h2o_iovec_init(BODY_413, sizeof(BODY_413) - 1)
                                                  : h2o_iovec_init(BODY_400, sizeof(BODY_400) - 1);
        req->res.content_length = body.len;
        h2o_set_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, H2O_STRLIT("application/json"), 1);
        o = (json_error_ostream_t *)h2o_add_ostream(req, sizeof(*o), slot);
        o->super.do_send = json_error_send;
        o->body = body;
        slot = &o->super.next;
        if (h2o_memis(req->input.method.base, req->input.method.len, H2O_STRLIT("POST")) &&
            h2o_memis(req->input.path.base, req->input.path.len, H2O_STRLIT("/run")))
            account_refused(SB_SERVE_OUT_INVALID, req->res.status, 0, NULL);
    }
    h2o_setup_next_ostream(req, slot);
}

static void refused_event(sb_serve_refusal_t why, const char *reason);

/*
 * A later request on a kept-alive connection: h2o has parsed it, and its head is still at the start
 * of the connection's input (h2o consumes a request's bytes only after its answer, and decodes a
 * chunked body in place after the head; the broker's listener relies on the same, framing.c). The
 * gate's rules are applied to it; a head that is not this request's is refused too (fail closed).
 */
static int later_framing_refused(conn_t *c, h2o_req_t *req)
{
    sb_serve_gate_head_t head;
    const char *why = NULL;
    sb_serve_gate_t v = c->sock->input != NULL ? sb_serve_gate_head(c->sock->input->bytes, c->sock->input->size, S.admission_hash,
                                                                    SIZE_MAX, &head, &why)
                                               : SB_GATE_BAD_HEAD;

    if (v == SB_GATE_MORE || v == SB_GATE_BAD_HEAD)
        why = "the buffered head is not this request's";
    else if (!h2o_memis(head.method, head.method_len, req->input.method.base, req->input.method.len) ||
             !h2o_memis(head.target, head.target_len, req->input.path.base, req->input.path.len))
        why = "the buffered head is not this request's";
    else if (v != SB_GATE_FRAMING)
        return 0;
    refused_event(SB_SERVE_REFUSE_FRAMING, why);
    req->http1_is_persistent = 0;
    SEND_LIT(req, 400, "Bad Request", "{\"ok\":false,\"error\":\"invalid request\",\"logs\":[]}");
    return 1;
}

static int on_req(h2o_handler_t *self, h2o_req_t *req)
{
    h2o_iovec_t p = req->path_normalized;
    conn_t *c = conn_of(req);

    (void)self;
    /* a connection whose first head did not show the admission header serves that one request: its
     * next head goes through the gate again, on a new connection (gate.h) */
    if (c == NULL || !c->admitted)
        req->http1_is_persistent = 0;
    /* the gate decided the first head; a later one on a kept-alive connection is held to the same framing rules here */
    if (c != NULL && c->requests++ > 0 && later_framing_refused(c, req))
        return 0;
    if (h2o_memis(req->method.base, req->method.len, H2O_STRLIT("GET")) && h2o_memis(p.base, p.len, H2O_STRLIT("/health")))
        handle_health(req);
    else if (h2o_memis(req->method.base, req->method.len, H2O_STRLIT("POST")) && h2o_memis(p.base, p.len, H2O_STRLIT("/run")))
        handle_run(req);
    else if (h2o_memis(req->method.base, req->method.len, H2O_STRLIT("GET")) && h2o_memis(p.base, p.len, H2O_STRLIT("/metrics")))
        handle_metrics(req);
    else
        SEND_LIT(req, 404, "Not Found", "{\"ok\":false,\"error\":\"not found\"}"); /* upstream's body, byte for byte */
    return 0;
}

/* ---- connections ---- */

static void on_conn_close(void *data)
{
    conn_t *c = data;
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        S.conns = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    --S.nconns;
    if (c->gated)
        --S.ngated;
    if (c->lingering)
        --S.nlingering;
    sb_mem_free(c);
}

/* the connection a request came on (NULL if it cannot be told) */
static conn_t *conn_of(h2o_req_t *req)
{
    h2o_socket_t *sock = req->conn->callbacks->get_socket != NULL ? req->conn->callbacks->get_socket(req->conn) : NULL;
    return sock != NULL && sock->on_close.cb == on_conn_close ? sock->on_close.data : NULL;
}

static void refused_event(sb_serve_refusal_t why, const char *reason)
{
    ++S.m.refusals[why];
    if (refusal_log_ok())
        log_event("info", "refused", json_pack("{s:s, s:s}", "refusal", sb_serve_refusal_name(why), "reason", reason));
}

/* a refusal's answer is out: the client's further bytes are read and dropped for a while, then it closes */
static void on_linger_read(h2o_socket_t *sock, const char *err)
{
    conn_t *c = sock->on_close.data;
    if (err == NULL) {
        c->dropped += sock->input->size;
        h2o_buffer_consume(&sock->input, sock->input->size);
    }
    if (err != NULL || c->dropped > LINGER_BYTES)
        h2o_socket_close(sock);
}

static void on_refusal_written(h2o_socket_t *sock, const char *err)
{
    conn_t *c = sock->on_close.data;
    if (err != NULL) {
        h2o_socket_close(sock);
        return;
    }
    /* the answer is sent: say so (FIN), and read what the client still sends, so that closing with
     * unread bytes (a reset) does not destroy the answer before the client reads it */
    (void)shutdown(h2o_socket_get_fd(sock), SHUT_WR);
    c->since_ms = sb_serve_now_ms(); /* lingering since refuse_gated; its time counts from the answer */
    h2o_buffer_consume(&sock->input, sock->input->size);
    h2o_socket_read_start(sock, on_linger_read);
}

static void refuse_gated(conn_t *c, sb_serve_gate_t verdict, const sb_serve_gate_head_t *head, const char *why)
{
    static const char denied[] = "{\"ok\":false,\"error\":\"" MSG_DENIED "\",\"logs\":[]}";
    static const char large[] = "{\"ok\":false,\"error\":\"request body too large\",\"logs\":[]}";
    static const char bad[] = "{\"ok\":false,\"error\":\"invalid request\",\"logs\":[]}";
    const char *status, *body;
    h2o_iovec_t buf;
    sb_serve_refusal_t r;
    int n, code = 400;

    switch (verdict) {
    case SB_GATE_DENIED:
        status = "403 Forbidden", body = denied, r = SB_SERVE_REFUSE_DENIED, code = 403;
        break;
    case SB_GATE_TOO_LARGE:
        status = "413 Payload Too Large", body = large, r = SB_SERVE_REFUSE_TOO_LARGE, code = 413;
        break;
    case SB_GATE_FRAMING:
        status = "400 Bad Request", body = bad, r = SB_SERVE_REFUSE_FRAMING;
        break;
    default:
        status = "400 Bad Request", body = bad, r = SB_SERVE_REFUSE_HEAD;
        break;
    }
    c->gated = 0;
    --S.ngated;
    /* refused, it still holds a slot until it is closed: it counts in the unadmitted share, first to go */
    c->lingering = 1;
    c->since_ms = sb_serve_now_ms();
    ++S.nlingering;
    h2o_socket_read_stop(c->sock);
    if (head != NULL && head->is_run) {
        /* a POST /run: its outcome and run line as the handler would have given them, within the log budget */
        ++S.m.refusals[r];
        account_refused(r == SB_SERVE_REFUSE_DENIED ? SB_SERVE_OUT_DENIED : SB_SERVE_OUT_INVALID, code, 0,
                        json_pack("{s:s, s:s}", "refusal", sb_serve_refusal_name(r), "reason", why));
    } else {
        refused_event(r, why);
    }
    /* the answer lives in the connection until it is written (h2o_socket_write does not copy) */
    n = snprintf(c->answer, sizeof(c->answer),
                 "HTTP/1.1 %s\r\nContent-Type: application/json\r\nCache-Control: no-store\r\nConnection: close\r\n"
                 "Content-Length: %zu\r\n\r\n%s",
                 status, strlen(body), body);
    buf = h2o_iovec_init(c->answer, (size_t)n < sizeof(c->answer) ? (size_t)n : sizeof(c->answer) - 1);
    h2o_socket_write(c->sock, &buf, 1, on_refusal_written);
}

/* a gated connection's bytes: once its first head is complete, it is refused or handed to h2o */
static void on_gate_read(h2o_socket_t *sock, const char *err)
{
    conn_t *c = sock->on_close.data;
    sb_serve_gate_head_t head;
    sb_serve_gate_t v;
    const char *why = NULL;

    if (err != NULL) {
        h2o_socket_close(sock);
        return;
    }
    v = sb_serve_gate_head(sock->input->bytes, sock->input->size, S.admission_hash, SB_SERVE_MAX_BODY, &head, &why);
    if (v == SB_GATE_MORE)
        return;
    if (v != SB_GATE_PASS) {
        refuse_gated(c, v, v == SB_GATE_BAD_HEAD ? NULL : &head, why != NULL ? why : "refused");
        return;
    }
    c->gated = 0;
    --S.ngated;
    c->admitted = head.admitted;
    h2o_socket_read_stop(sock);
    /* h2o's HTTP/1 reader starts on the bytes already buffered: the head just decided */
    h2o_accept(&S.actx, sock);
}

/*
 * An unadmitted connection is closed, for a new one: the oldest refused one (answered already), else
 * the oldest still waiting for its head; 0 if there is none
 */
static int evict_gated(void)
{
    conn_t *oldest = NULL, *refused = NULL;
    for (conn_t *c = S.conns; c != NULL; c = c->next) {
        if (c->gated)
            oldest = c; /* the list is newest first */
        else if (c->lingering)
            refused = c;
    }
    if (refused != NULL) {
        h2o_socket_close(refused->sock);
        return 1;
    }
    if (oldest == NULL)
        return 0;
    refused_event(SB_SERVE_REFUSE_EVICTED, "a connection waiting for its head was closed for a newer one");
    h2o_socket_close(oldest->sock);
    return 1;
}

static void on_accept(h2o_socket_t *listener, const char *err)
{
    h2o_socket_t *sock;
    size_t gated_cap = S.set.max_connections * GATE_SHARE_NUM / GATE_SHARE_DEN;

    if (err != NULL)
        return;
    if (gated_cap == 0)
        gated_cap = 1;
    for (int i = 0; i < 16 && (sock = h2o_evloop_socket_accept(listener)) != NULL; ++i) {
        conn_t *c;
        /*
         * Connections are bounded like everything else. Those that have not shown their first head
         * yet hold at most their share of the slots, the oldest giving way to a new one; the rest is
         * kept for connections that showed the admission header. Past the cap a new one is closed.
         */
        if ((S.ngated + S.nlingering >= gated_cap || S.nconns >= S.set.max_connections) && !evict_gated()) {
            ++S.m.refusals[SB_SERVE_REFUSE_CONN_LIMIT];
            h2o_socket_close(sock);
            continue;
        }
        if ((c = sb_mem_try_calloc(1, sizeof(*c))) == NULL) {
            h2o_socket_close(sock);
            continue;
        }
        c->sock = sock;
        c->gated = 1;
        c->since_ms = sb_serve_now_ms();
        c->next = S.conns;
        if (S.conns != NULL)
            S.conns->prev = c;
        S.conns = c;
        ++S.nconns;
        ++S.ngated;
        sock->on_close.cb = on_conn_close;
        sock->on_close.data = c;
        h2o_socket_read_start(sock, on_gate_read);
    }
}

/* gated connections silent past GATE_HEAD_MS, and lingering ones past LINGER_MS, are closed */
static void conn_housekeeping(int64_t now)
{
    conn_t *c = S.conns;
    while (c != NULL) {
        conn_t *next = c->next;
        if (c->gated && now - c->since_ms >= GATE_HEAD_MS) {
            refused_event(SB_SERVE_REFUSE_HEAD_TIMEOUT, "no complete request head in time");
            h2o_socket_close(c->sock);
        } else if (c->lingering && now - c->since_ms >= LINGER_MS) {
            h2o_socket_close(c->sock);
        }
        c = next;
    }
    refusal_log_flush(now);
}

static void on_signal(int sig)
{
    switch (sig) {
    case SIGTERM:
    case SIGINT:
        stop_requested = 1;
        break;
    case SIGUSR1:
        reopen_requested = 1;
        break;
    case SIGHUP:
        reload_requested = 1;
        break;
    default:
        other_signal = sig;
        break;
    }
}

/* SIGUSR1 and SIGHUP: the log again at its path, for rotation; the line goes to the new file */
static void reopen_log(void)
{
    char err[PATH_MAX + 128];

    if (S.set.log_path == NULL) {
        log_event("info", "reopen", json_pack("{s:s, s:s}", "log", "stderr", "msg", "no --log-file: nothing to reopen"));
        return;
    }
    if (sb_serve_log_open(S.set.log_path, err, sizeof(err)) != 0) {
        log_event("error", "reopen.failed", json_pack("{s:s, s:s}", "reason", err, "msg", "the log stays open as it was"));
        return;
    }
    log_event("info", "reopened", json_pack("{s:s}", "log", S.set.log_path));
}

#define RESTART_ONLY "listen, broker and admin URLs, Deno, the jail, max-runs, max-connections, log-file"

/* the secret files again, checked as at start-up; -1 with `err` when one is not acceptable */
static int reread_secrets(char *adm, size_t admsz, char *mint, size_t mintsz, char *err, size_t errsz)
{
    if (S.set.adm_file != NULL &&
        (sb_serve_read_secret(S.set.adm_file, NULL, adm, admsz, "host admission secret", err, errsz) != 0 ||
         sb_serve_check_admission(adm, S.set.adm_file, err, errsz) != 0))
        return -1;
    if (S.set.mint_file != NULL && sb_serve_read_secret(S.set.mint_file, NULL, mint, mintsz, "net-mint secret", err, errsz) != 0)
        return -1;
    if (S.set.mint_file != NULL && mint[0] == '\0') {
        snprintf(err, errsz, "the net-mint secret file %s is empty", S.set.mint_file);
        return -1;
    }
    return 0;
}

/*
 * SIGHUP: what serve can take without a restart is its secrets, when they are files: the host
 * admission secret and the net-mint secret are read again, checked as at start-up, and take effect
 * for the next request (a run already going keeps its token). Everything else is read once at
 * start. One line says what happened: reload.applied, reload.rejected (the old secrets stay) or
 * reload.unsupported (nothing here can be reloaded, and why).
 */
static void reload(void)
{
    char adm[SB_SERVE_MAX_SECRET + 1], mint[sizeof(S.set.conf.netmint.secret)], err[PATH_MAX + 256];
    char what[96] = "";

    if (S.set.adm_file == NULL && S.set.mint_file == NULL) {
        log_event("warn", "reload.unsupported",
                  json_pack("{s:s, s:s}", "reason",
                            "the secrets came from the environment, which a running process cannot re-read, and every other "
                            "setting is read once at start",
                            "msg", "restart serve to apply changes (SIGTERM drains the runs in flight)"));
        return;
    }
    if (reread_secrets(adm, sizeof(adm), mint, sizeof(mint), err, sizeof(err)) != 0) {
        log_event("error", "reload.rejected", json_pack("{s:s, s:s}", "reason", err, "msg", "the running secrets stay"));
        explicit_bzero(adm, sizeof(adm));
        explicit_bzero(mint, sizeof(mint));
        return;
    }
    if (S.set.adm_file != NULL) {
        sha256(adm, strlen(adm), S.admission_hash);
        snprintf(what, sizeof(what), "the host admission secret");
    }
    if (S.set.mint_file != NULL) {
        memcpy(S.set.conf.netmint.secret, mint, sizeof(mint));
        snprintf(what + strlen(what), sizeof(what) - strlen(what), "%sthe net-mint secret", what[0] != '\0' ? ", " : "");
    }
    explicit_bzero(adm, sizeof(adm));
    explicit_bzero(mint, sizeof(mint));
    log_event("info", "reload.applied", json_pack("{s:s, s:s}", "reloaded", what, "restartOnly", RESTART_ONLY));
}

static void handle_signals(void)
{
    if (reopen_requested) {
        reopen_requested = 0;
        reopen_log();
    }
    if (reload_requested) {
        reload_requested = 0;
        reopen_log();
        reload();
    }
    if (other_signal != 0) {
        int sig = other_signal;
        other_signal = 0;
        log_event("info", "signal.ignored", json_pack("{s:s}", "signal", sig == SIGUSR2 ? "SIGUSR2" : "SIGALRM"));
    }
}

static int bind_listener(void)
{
    int fd, on = 1;
    struct sockaddr_storage bound;
    socklen_t blen = sizeof(bound);
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;

    if ((fd = socket(S.set.listen_addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on)) != 0 ||
        bind(fd, (const struct sockaddr *)&S.set.listen_addr, S.set.listen_len) != 0 || listen(fd, 1024) != 0 ||
        fcntl(fd, F_SETFL, O_NONBLOCK) != 0) {
        sb_serve_fail_usage("cannot listen: %s", strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    if (getsockname(fd, (struct sockaddr *)&bound, &blen) == 0) {
        if (bound.ss_family == AF_INET) {
            inet_ntop(AF_INET, &((struct sockaddr_in *)&bound)->sin_addr, host, sizeof(host));
            port = ntohs(((struct sockaddr_in *)&bound)->sin_port);
        } else {
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&bound)->sin6_addr, host, sizeof(host));
            port = ntohs(((struct sockaddr_in6 *)&bound)->sin6_port);
        }
    }
    /* tests start serve on port 0 and read the real one from this line */
    log_event("info", "listening", json_pack("{s:s, s:s, s:i}", "listener", "serve", "host", host, "port", port));
    return fd;
}

/* the pool's failures, said once each time they rise (the launcher only counts) */
static void pool_housekeeping(void)
{
    sb_serve_pool_stats_t ps;

    sb_serve_launcher_stats(&S.launcher, &ps);
    if (ps.refill_failures > S.pool_failures_logged) {
        log_event("warn", "pool.start_failed",
                  json_pack("{s:I, s:I}", "failures", (json_int_t)(ps.refill_failures - S.pool_failures_logged), "total",
                            (json_int_t)ps.refill_failures));
        S.pool_failures_logged = ps.refill_failures;
    }
    if (ps.died > S.pool_died_logged) {
        log_event("warn", "pool.guest_died",
                  json_pack("{s:I, s:I}", "died", (json_int_t)(ps.died - S.pool_died_logged), "total", (json_int_t)ps.died));
        S.pool_died_logged = ps.died;
    }
    if (!S.launcher_down_logged && !sb_serve_launcher_alive(&S.launcher) && S.launcher.pid > 0) {
        log_event("error", "launcher.down", json_pack("{s:s}", "effect", "every run fails to spawn until serve is restarted"));
        S.launcher_down_logged = 1;
    }
}

/* timers the loop checks on each turn: the pool, connections and run deadlines */
static void housekeeping(void)
{
    int64_t now = sb_serve_now_ms();
    run_t *r = S.runs;

    pool_housekeeping();
    conn_housekeeping(now);
    while (r != NULL) {
        run_t *next = r->next;
        if (now >= r->deadline_ms)
            run_finish(r, "the run did not end in time");
        r = next;
    }
}

int sb_shim_serve_main(int argc, char **argv)
{
    char admission[SB_SERVE_MAX_SECRET + 1], err[PATH_MAX + 128];
    h2o_hostconf_t *host;
    h2o_pathconf_t *path;
    h2o_handler_t *handler;
    struct sigaction sa;
    int fd, rc, check_only = 0, shared_uid;
    int64_t drain_until = 0;

    memset(&S, 0, sizeof(S));
    sb_serve_metrics_init(&S.m);
    if ((rc = sb_serve_configure(argc, argv, &S.set, admission, sizeof(admission), &check_only)) != 0 || check_only) {
        explicit_bzero(admission, sizeof(admission));
        explicit_bzero(S.set.conf.netmint.secret, sizeof(S.set.conf.netmint.secret));
        if (rc == 0) {
            /* --check-config: everything start-up checks passed; nothing was bound or logged */
            printf("configuration OK: Deno %s started as a guest; %s; broker %s; net-mint %s\n", S.set.deno_version,
                   sb_shim_jail_describe(S.set.conf.deno.jail),
                   S.set.conf.have_broker ? S.set.conf.broker.host_header : "none (compute only)",
                   S.set.conf.have_netmint ? "configured" : "none");
        }
        SSL_CTX_free(S.set.conf.tls);
        sb_mem_free((char *)S.set.conf.deno.exe);
        sb_mem_free((char *)S.set.conf.deno.runtime_url);
        sb_shim_jail_free(S.set.conf.deno.jail);
        return rc < 0 ? 0 : rc;
    }
    sha256(admission, strlen(admission), S.admission_hash);
    explicit_bzero(admission, sizeof(admission));
    if (S.set.log_path != NULL && sb_serve_log_open(S.set.log_path, err, sizeof(err)) != 0) {
        sb_serve_fail_usage("%s", err);
        return SB_SERVE_EXIT_USAGE;
    }
    /* before the listener exists: the launcher's memory holds the configuration and no request */
    if (sb_serve_launcher_start(&S.launcher, &S.set.conf, &S.set.pool, err, sizeof(err)) != SB_OK) {
        sb_serve_fail_usage("%s; serve does not start", err);
        explicit_bzero(S.set.conf.netmint.secret, sizeof(S.set.conf.netmint.secret));
        sb_shim_jail_free(S.set.conf.deno.jail);
        return SB_SERVE_EXIT_USAGE;
    }

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    /* every signal an operator or logrotate may send is taken, never its default action (the end of the runs) */
    sigaction(SIGHUP, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGUSR2, &sa, NULL);
    sigaction(SIGALRM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    h2o_config_init(&S.gc);
    S.gc.max_request_entity_size = H2O_ENTITY_CAP;
    S.gc.http1.upgrade_to_http2 = 0; /* HTTP/1.1 only */
    S.gc.server_name = h2o_iovec_init(H2O_STRLIT("sandbox-shim"));
    host = h2o_config_register_host(&S.gc, h2o_iovec_init(H2O_STRLIT("default")), 65535);
    path = h2o_config_register_path(host, "/", 0);
    handler = h2o_create_handler(path, sizeof(*handler));
    handler->on_req = on_req;
    h2o_create_filter(path, sizeof(h2o_filter_t))->on_setup_ostream = json_error_setup;
    h2o_create_filter(&host->fallback_path, sizeof(h2o_filter_t))->on_setup_ostream = json_error_setup;
    S.loop = h2o_evloop_create();
    h2o_context_init(&S.ctx, S.loop, &S.gc);
    S.actx.ctx = &S.ctx;
    S.actx.hosts = S.gc.hosts;
    if ((fd = bind_listener()) < 0)
        return SB_SERVE_EXIT_USAGE;
    S.listener = h2o_evloop_socket_create(S.loop, fd, H2O_SOCKET_FLAG_DONT_READ);
    h2o_socket_read_start(S.listener, on_accept);
    /* what the jail applies, or that it is off (a warning), once; after "listening", which stays the first line */
    log_event(sb_shim_jail_enabled(S.set.conf.deno.jail) ? "info" : "warn", "jail",
              json_pack("{s:b, s:s}", "on", sb_shim_jail_enabled(S.set.conf.deno.jail), "describe",
                        sb_shim_jail_describe(S.set.conf.deno.jail)));
    /*
     * Unprivileged, every guest runs as serve's own uid: guests of different tenants could read each
     * other's files and signal each other. Said in the start-up line, as a warning.
     */
    shared_uid = sb_shim_jail_enabled(S.set.conf.deno.jail) && !sb_shim_jail_privileged(S.set.conf.deno.jail);
    {
        json_t *f = json_pack(
            "{s:s, s:s, s:s, s:b, s:b, s:i, s:s, s:b, s:b, s:s}", "version", SB_VERSION, "commit", SB_GIT_COMMIT, "deno",
            S.set.deno_version, "broker", S.set.conf.have_broker, "netMint", S.set.conf.have_netmint, "maxRuns",
            (int)S.set.max_runs, "brokerOrigin", S.set.conf.have_broker ? S.set.conf.broker.host_header : "", "jail",
            sb_shim_jail_enabled(S.set.conf.deno.jail), "uidPerGuest", sb_shim_jail_enabled(S.set.conf.deno.jail) && !shared_uid,
            "log", S.set.log_path != NULL ? S.set.log_path : "stderr");
        if (f != NULL && shared_uid)
            json_object_set_new(
                f, "warning",
                json_string("not root: every guest runs as serve's own uid, so guests of different tenants can read "
                            "each other's files and signal each other; run serve as root (the unit in "
                            "deploy/systemd) for a uid per guest"));
        log_event(shared_uid ? "warn" : "info", "started", f);
    }
    {
        json_t *classes = json_array();
        for (unsigned i = 0; i < S.set.pool.nclasses; ++i)
            json_array_append_new(classes, json_integer(S.set.pool.class_mb[i]));
        log_event("info", "pool", json_pack("{s:i, s:o}", "size", (int)S.set.pool.size, "memoryMb", classes));
    }

    for (;;) {
        h2o_evloop_run(S.loop, 100);
        handle_signals();
        housekeeping();
        if (stop_requested && drain_until == 0) {
            /* stop taking requests; the runs in flight finish and are answered */
            drain_until = sb_serve_now_ms() + DRAIN_MS;
            h2o_socket_read_stop(S.listener);
            h2o_socket_close(S.listener);
            S.listener = NULL;
            h2o_context_request_shutdown(&S.ctx);
            log_event("info", "stopping", json_pack("{s:i}", "runs", (int)S.nruns));
        }
        if (drain_until != 0 && (S.nruns == 0 || sb_serve_now_ms() >= drain_until))
            break;
    }
    while (S.runs != NULL)
        run_finish(S.runs, "the supervisor stopped");
    /* the pooled guests go; the runs' processes are over or killed above */
    sb_serve_launcher_stop(&S.launcher, 5000);
    /* let the last answers leave */
    for (int i = 0; i < 5; ++i)
        h2o_evloop_run(S.loop, 10);
    handle_signals();
    log_event("info", "stopped", NULL);
    SSL_CTX_free(S.set.conf.tls);
    explicit_bzero(S.set.conf.netmint.secret, sizeof(S.set.conf.netmint.secret));
    sb_mem_free((char *)S.set.conf.deno.exe);
    sb_mem_free((char *)S.set.conf.deno.runtime_url);
    sb_shim_jail_free(S.set.conf.deno.jail);
    return 0;
}
