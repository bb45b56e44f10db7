/*
 * sandbox-shim serve: the process of one run (see serve_int.h).
 *
 * Forked from the launcher (launcher.h), never from the service, it holds
 * three descriptors besides its guest's: the report socket, the client's
 * connection, only to notice the client hanging up (relay.c's cancel_fd), and
 * the jail's cgroup directory when there is one (launcher.c arranges them as
 * SB_SERVE_REPORT_FD, SB_SERVE_CANCEL_FD, SB_SERVE_JAIL_FD and closes the
 * rest). The guest (started by runner.c, exactly as `run` starts it, in the
 * jail the service made at start-up; before the run for a pooled one)
 * inherits nothing at all.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "sb/mem.h"
#include "jail/hooks.h"
#include "serve/serve_int.h"
#include "serve/launcher.h"

#define REPORT_FD SB_SERVE_REPORT_FD
#define CANCEL_FD SB_SERVE_CANCEL_FD

/* the write end of the stop pipe (relay.c's stop_fd): SIGTERM from the service closes it */
static volatile sig_atomic_t stop_w = -1;

static void on_stop(int sig)
{
    int fd = stop_w;
    (void)sig;
    stop_w = -1;
    if (fd >= 0)
        (void)close(fd);
}

int64_t sb_serve_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void write_all(const void *p, size_t n)
{
    const uint8_t *b = p;

    while (n > 0) {
        ssize_t w = write(REPORT_FD, b, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            _exit(1); /* the service is gone: nobody is waiting for this run */
        b += w;
        n -= (size_t)w;
    }
}

static void record(char kind, const void *p1, size_t n1, const void *p2, size_t n2)
{
    uint8_t head[5];
    size_t n = n1 + n2;

    head[0] = (uint8_t)kind;
    head[1] = (uint8_t)(n >> 24);
    head[2] = (uint8_t)(n >> 16);
    head[3] = (uint8_t)(n >> 8);
    head[4] = (uint8_t)n;
    write_all(head, sizeof(head));
    if (n1 != 0)
        write_all(p1, n1);
    if (n2 != 0)
        write_all(p2, n2);
}

static void on_spawned(void *arg, const sb_shim_child_t *child)
{
    uint8_t pid[4];
    uint32_t v = (uint32_t)child->pid;

    (void)arg;
    pid[0] = (uint8_t)(v >> 24);
    pid[1] = (uint8_t)(v >> 16);
    pid[2] = (uint8_t)(v >> 8);
    pid[3] = (uint8_t)v;
    record(SB_SERVE_REC_GUEST, pid, sizeof(pid), NULL, 0);
}

#define SB_SERVE_OUTCOME_NAME(id, name) name,
static const char *const OUTCOME_NAMES[] = {SB_SERVE_OUTCOMES(SB_SERVE_OUTCOME_NAME)};
#undef SB_SERVE_OUTCOME_NAME

const char *sb_serve_outcome_name(sb_serve_outcome_t o)
{
    return (unsigned)o < SB_SERVE_OUT_COUNT ? OUTCOME_NAMES[o] : OUTCOME_NAMES[SB_SERVE_OUT_ERROR];
}

sb_serve_outcome_t sb_serve_outcome_parse(const char *name)
{
    for (unsigned i = 0; name != NULL && i < SB_SERVE_OUT_COUNT; ++i)
        if (strcmp(OUTCOME_NAMES[i], name) == 0)
            return (sb_serve_outcome_t)i;
    return SB_SERVE_OUT_ERROR;
}

/* a run whose guest started: what its answer says (the relay marks a broker denial, relay.h) */
static sb_serve_outcome_t classify(const json_t *answer, int denied)
{
    const char *e = json_string_value(json_object_get(answer, "error"));

    if (json_is_true(json_object_get(answer, "ok")))
        return SB_SERVE_OUT_OK;
    if (json_is_true(json_object_get(answer, "timedOut")))
        return SB_SERVE_OUT_TIMEOUT;
    if (e != NULL && strcmp(e, "sandbox request cancelled") == 0)
        return SB_SERVE_OUT_CANCELLED;
    return denied ? SB_SERVE_OUT_CALL_DENIED : SB_SERVE_OUT_FAILED;
}

/*
 * A pooled guest was started with the longest run's RLIMIT_CPU (it did not know its run): the
 * hand-over lowers it to this run's, plus what its start may have used (SB_SERVE_POOL_START_CPU_S).
 * prlimit(2) on the guest is allowed: this process owns the guest's user namespace (and is root, or
 * shares its uid). Should the kernel refuse, the guest keeps the longest
 * run's limit, which still bounds it, and the run's wall clock kills it first in any case.
 */
static void lower_cpu_limit(const sb_shim_guest_t *g, int64_t timeout_ms)
{
    unsigned long long lim = sb_shim_jail_cpu_limit((unsigned)timeout_ms);
    struct rlimit rl;

    if (lim == 0 || g->child.pid <= 0 || !sb_shim_jail_enabled(g->child.jail))
        return;
    rl.rlim_cur = rl.rlim_max = (rlim_t)(lim + SB_SERVE_POOL_START_CPU_S);
    (void)prlimit(g->child.pid, RLIMIT_CPU, &rl, NULL);
}

static json_t *failure(const char *error)
{
    return json_pack("{s:b, s:s, s:[]}", "ok", 0, "error", error, "logs");
}

__attribute__((noreturn)) void sb_serve_run_main(const sb_serve_job_t *job, sb_shim_guest_t *pre)
{
    const sb_serve_conf_t *conf = job->conf;
    static sb_shim_config_t cfg; /* 8 KiB of token: not on the stack */
    static sb_shim_guest_t cold;
    static sb_shim_netmint_t netmint; /* the URL from the configuration, the secret from the job */
    sb_shim_guest_t *guest = NULL;    /* released after the answer: it is reaped by then */
    json_t *outcome = NULL, *answer = NULL, *meta, *detail = NULL, *modules = NULL;
    sb_serve_outcome_t outcome_kind = SB_SERVE_OUT_COUNT; /* COUNT: not decided yet */
    const char *revoke = NULL;
    int denied = 0;
    char err[512], revoke_err[256] = "", token[65] = "";
    char *body = NULL, *line = NULL;
    long long calls = 0;
    int spawned = 0, cancel = fcntl(CANCEL_FD, F_GETFD) >= 0;
    int64_t handover_ms = -1;
    int pooled = pre != NULL, pooled_died = 0;
    struct sigaction sa;
    int stop[2];

    /*
     * SIGTERM from the service (its client went away) cancels the run like a hang-up of the
     * client's connection: the guest is killed at once, and this process still cleans up after it
     * (work directory, the jail's uid and cgroup, a minted token) and reports.
     */
    if (pipe2(stop, O_CLOEXEC) != 0)
        _exit(1);
    stop_w = stop[1];
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGTERM, &sa, NULL) != 0)
        _exit(1);

    memset(&cfg, 0, sizeof(cfg));
    cfg.timeout_ms = job->timeout_ms;
    cfg.call_timeout_ms = SB_SERVE_CALL_TIMEOUT_MS;
    cfg.max_calls = SB_SHIM_DEFAULT_MAX_CALLS;
    cfg.max_inflight = SB_SHIM_DEFAULT_MAX_INFLIGHT;
    cfg.cancel_fd = cancel ? CANCEL_FD : -1;
    cfg.stop_fd = stop[0];
    cfg.stderr_cap_fails = 1;
    cfg.upstream_call_limit = 1;
    cfg.mark_denial = 1;
    if (job->origins.n != 0) {
        cfg.imports = &job->origins; /* parsed once, by the service */
        /* a pooled guest has no module path (its flags and listeners are fixed at spawn): the launcher starts these
         * runs cold, and one that came with a guest all the same does not use it */
        if (pre != NULL) {
            sb_shim_deno_discard(pre);
            pre = NULL;
            pooled = 0;
        }
    }
    switch (job->kind) {
    case SB_SERVE_COMPUTE:
        cfg.calls_refused = "binding call refused: this run has no bindings";
        break;
    case SB_SERVE_BINDINGS:
        memcpy(cfg.token, job->token, sizeof(cfg.token));
        break;
    case SB_SERVE_NET: {
        sb_status_t st;
        /* the credential the service held when it took the run (its launcher keeps none) */
        netmint = conf->netmint;
        memcpy(netmint.secret, job->netmint_secret, sizeof(netmint.secret));
        st = sb_shim_netmint_mint(&netmint, job->net, job->imports, job->timeout_ms, token, err, sizeof(err));
        if (st != SB_OK) {
            char e[600];
            snprintf(e, sizeof(e), "egress blocked: %s", err);
            outcome = failure(e);
            outcome_kind = SB_SERVE_OUT_EGRESS_BLOCKED;
            if (pre != NULL)
                sb_shim_deno_discard(pre);
            pooled = 0; /* no guest ran */
            goto Answer;
        }
        memcpy(cfg.token, token, sizeof(token));
        break;
    }
    }
    if (job->kind != SB_SERVE_COMPUTE) {
        cfg.url = conf->broker;
        cfg.addr = conf->broker_addr;
        cfg.addr_len = conf->broker_addr_len;
        cfg.tls = conf->tls;
    }
    if (pre != NULL && sb_shim_child_gone(&pre->child)) {
        /* the pooled guest died as its run was handed over: not the run's failure, it starts cold */
        sb_shim_deno_discard(pre);
        pre = NULL;
        pooled_died = 1;
    }
    pooled = pre != NULL;
    {
        sb_shim_deno_t d = conf->deno;
        sb_status_t st;
        d.memory_mb = job->memory_mb;
        d.timeout_ms = (unsigned)job->timeout_ms;
        d.imports = cfg.imports;
        if (pre != NULL) {
            guest = pre;
            /* a pooled guest: started before this run, it has waited for its init frame since */
            lower_cpu_limit(pre, job->timeout_ms);
            on_spawned(NULL, &pre->child);
            handover_ms = sb_serve_now_ms() - job->started_ms;
            st = sb_shim_deno_relay(pre, &cfg, (const uint8_t *)job->init.data, job->init.size, &outcome);
        } else {
            st = sb_shim_deno_start(&d, (void *)cfg.token, sizeof(cfg.token), &cold, err, sizeof(err));
            if (st == SB_OK) {
                guest = &cold;
                on_spawned(NULL, &cold.child);
                handover_ms = sb_serve_now_ms() - job->started_ms;
                st = sb_shim_deno_relay(&cold, &cfg, (const uint8_t *)job->init.data, job->init.size, &outcome);
            }
        }
        switch (st) {
        case SB_OK:
            spawned = 1;
            break;
        case SB_E_EXECUTION:
            outcome = failure(err);
            outcome_kind = SB_SERVE_OUT_SPAWN_FAILED;
            break;
        default:
            outcome = failure("sandbox IO error: out of memory");
            outcome_kind = SB_SERVE_OUT_FAILED;
            break;
        }
    }
    if (spawned)
        record(SB_SERVE_REC_GONE, NULL, 0, NULL, 0);
    explicit_bzero(cfg.token, sizeof(cfg.token));
    if (token[0] != '\0') {
        revoke = sb_shim_netmint_revoke(&netmint, token, revoke_err, sizeof(revoke_err)) == SB_OK ? "ok" : "failed";
        explicit_bzero(token, sizeof(token));
    }

Answer:
    /* upstream's answer: {ok, output?, error?, logs, timedOut?, ms}; the call count goes to the log only */
    if (outcome == NULL)
        outcome = failure("sandbox IO error: out of memory");
    calls = json_integer_value(json_object_get(outcome, "calls"));
    json_object_del(outcome, "calls");
    modules = json_incref(json_object_get(outcome, "modules")); /* runs with imports: import.fetch calls, for the log */
    json_object_del(outcome, "modules");
    denied = json_is_true(json_object_get(outcome, "denied"));
    json_object_del(outcome, "denied");
    /* the failed call's method, code, reason and correlation id: for the log line, not the answer */
    detail = json_incref(json_object_get(outcome, "detail"));
    json_object_del(outcome, "detail");
    json_object_set_new(outcome, "ms", json_integer(sb_serve_now_ms() - job->started_ms));
    answer = outcome;
    body = json_dumps(answer, JSON_COMPACT);
    if (body == NULL || strlen(body) > SB_SERVE_MAX_ANSWER) {
        /* an answer the upstream adapter could not read (it stops at 2 MiB) is replaced, whole */
        sb_mem_free_foreign(body);
        answer = json_pack("{s:b, s:s, s:[], s:I}", "ok", 0, "error", "sandbox output limit exceeded", "logs", "ms",
                           (json_int_t)(sb_serve_now_ms() - job->started_ms));
        body = answer != NULL ? json_dumps(answer, JSON_COMPACT) : NULL;
        if (outcome_kind == SB_SERVE_OUT_COUNT)
            outcome_kind = SB_SERVE_OUT_FAILED;
    }
    if (outcome_kind == SB_SERVE_OUT_COUNT)
        outcome_kind = classify(answer, denied);
    meta = json_pack("{s:s, s:I, s:b, s:I, s:b}", "outcome", sb_serve_outcome_name(outcome_kind), "calls", (json_int_t)calls,
                     "timedOut", json_is_true(json_object_get(answer, "timedOut")), "jailFailures",
                     (json_int_t)sb_shim_hook_jail_failures(), "pooled", pooled);
    if (meta != NULL && pooled_died)
        json_object_set_new(meta, "pooledGuestDied", json_true());
    /* from the request to the guest's first instruction: the init frame is written next */
    if (meta != NULL && handover_ms >= 0)
        json_object_set_new(meta, "handoverMs", json_integer(handover_ms));
    if (meta != NULL && detail != NULL)
        json_object_set(meta, "detail", detail);
    if (meta != NULL && modules != NULL)
        json_object_set(meta, "modules", modules);
    if (meta != NULL && revoke != NULL) {
        json_object_set_new(meta, "revoke", json_string(revoke));
        if (revoke_err[0] != '\0')
            json_object_set_new(meta, "revokeError", json_string(revoke_err));
    }
    line = meta != NULL ? json_dumps(meta, JSON_COMPACT) : NULL;
    if (line != NULL && body != NULL) {
        size_t ln = strlen(line);
        line[ln] = '\n'; /* json_dumps' NUL becomes the separator; the length below counts it */
        record(SB_SERVE_REC_RESULT, line, ln + 1, body, strlen(body));
    }
    /* answered: the guest is reaped; its directory, uid and cgroup go now, off the run's latency */
    if (guest != NULL)
        sb_shim_deno_release(guest);
    _exit(0);
}

/* ---- the job, from the service to its run process (launcher.h) ---- */

#define JOB_MAGIC "SBJ1"
#define JOB_HEAD 49u                      /* magic 4, kind 1, memory 4, timeout 8, started 8, six lengths 4 each */
#define JOB_MAX_INIT (8u * 1024u * 1024u) /* an init frame is far smaller: source, input and secrets are capped */
#define JOB_MAX_NET (256u * 1024u)        /* capabilities.net: at most SB_SERVE_MAX_HOSTS short names */

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static void put64(uint8_t *p, uint64_t v)
{
    put32(p, (uint32_t)(v >> 32));
    put32(p + 4, (uint32_t)v);
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint64_t get64(const uint8_t *p)
{
    return (uint64_t)get32(p) << 32 | get32(p + 4);
}

static int write_fd_all(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n > 0) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

static int read_fd_all(int fd, void *p, size_t n)
{
    uint8_t *b = p;
    while (n > 0) {
        ssize_t r = read(fd, b, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        b += r;
        n -= (size_t)r;
    }
    return 0;
}

sb_status_t sb_serve_job_write(int fd, const sb_serve_job_t *job)
{
    uint8_t head[JOB_HEAD];
    size_t token_len = job->kind == SB_SERVE_BINDINGS ? strnlen(job->token, sizeof(job->token)) : 0;
    char *net = job->net != NULL ? json_dumps(job->net, JSON_COMPACT) : NULL;
    char *imp = job->imports != NULL ? json_dumps(job->imports, JSON_COMPACT) : NULL;
    size_t net_len = net != NULL ? strlen(net) : 0, imp_len = imp != NULL ? strlen(imp) : 0, org_len = 0;
    uint8_t org[SB_SHIM_MAX_IMPORT_ORIGINS * (SB_SHIM_MAX_ORIGIN + 2)];

    /* the origins as the service parsed them: each a 2-byte length and its bytes */
    for (unsigned i = 0; i < job->origins.n && i < SB_SHIM_MAX_IMPORT_ORIGINS; ++i) {
        size_t l = strnlen(job->origins.origin[i], SB_SHIM_MAX_ORIGIN - 1);
        org[org_len++] = (uint8_t)(l >> 8);
        org[org_len++] = (uint8_t)l;
        memcpy(org + org_len, job->origins.origin[i], l);
        org_len += l;
    }
    size_t mint_len = job->kind == SB_SERVE_NET ? strnlen(job->netmint_secret, sizeof(job->netmint_secret)) : 0;
    sb_status_t st = SB_E_EXECUTION;

    if ((job->net != NULL && net == NULL) || (job->imports != NULL && imp == NULL) || job->init.size > JOB_MAX_INIT ||
        net_len > JOB_MAX_NET || imp_len > JOB_MAX_NET)
        goto Exit;
    memcpy(head, JOB_MAGIC, 4);
    head[4] = (uint8_t)job->kind;
    put32(head + 5, job->memory_mb);
    put64(head + 9, (uint64_t)job->timeout_ms);
    put64(head + 17, (uint64_t)job->started_ms);
    put32(head + 25, (uint32_t)token_len);
    put32(head + 29, (uint32_t)job->init.size);
    put32(head + 33, (uint32_t)net_len);
    put32(head + 37, (uint32_t)mint_len);
    put32(head + 41, (uint32_t)imp_len);
    put32(head + 45, (uint32_t)org_len);
    if (write_fd_all(fd, head, sizeof(head)) == 0 && write_fd_all(fd, job->token, token_len) == 0 &&
        write_fd_all(fd, job->init.data, job->init.size) == 0 && write_fd_all(fd, net, net_len) == 0 &&
        write_fd_all(fd, job->netmint_secret, mint_len) == 0 && write_fd_all(fd, imp, imp_len) == 0 &&
        write_fd_all(fd, org, org_len) == 0)
        st = SB_OK;
Exit:
    sb_mem_free_foreign(net);
    sb_mem_free_foreign(imp);
    return st;
}

/* `len` bytes of a JSON array (capabilities.net or import) */
static sb_status_t read_json_array(int fd, size_t len, json_t **out)
{
    char *text = sb_mem_try_alloc(len);
    json_t *v = NULL;

    if (text == NULL)
        return SB_E_NOMEM;
    if (read_fd_all(fd, text, len) == 0)
        v = json_loadb(text, len, 0, NULL);
    sb_mem_free(text);
    if (!json_is_array(v)) {
        json_decref(v);
        return SB_E_EXECUTION;
    }
    *out = v;
    return SB_OK;
}

/* the origins the service parsed (sb_serve_job_write), each checked for its length and form on the way in */
static sb_status_t read_origins(int fd, size_t len, sb_shim_imports_t *im)
{
    uint8_t buf[SB_SHIM_MAX_IMPORT_ORIGINS * (SB_SHIM_MAX_ORIGIN + 2)];
    size_t off = 0;

    if (read_fd_all(fd, buf, len) != 0)
        return SB_E_EXECUTION;
    memset(im, 0, sizeof(*im));
    while (off < len) {
        size_t l;
        if (len - off < 2 || im->n >= SB_SHIM_MAX_IMPORT_ORIGINS)
            return SB_E_EXECUTION;
        l = (size_t)buf[off] << 8 | buf[off + 1];
        off += 2;
        if (l < 9 || l >= SB_SHIM_MAX_ORIGIN || l > len - off || memcmp(buf + off, "https://", 8) != 0 || memchr(buf + off, 0, l))
            return SB_E_EXECUTION;
        memcpy(im->origin[im->n], buf + off, l);
        im->origin[im->n++][l] = '\0';
        off += l;
    }
    return SB_OK;
}

sb_status_t sb_serve_job_read(int fd, const sb_serve_conf_t *conf, sb_serve_job_t *job)
{
    uint8_t head[JOB_HEAD];
    uint32_t token_len, init_len, net_len, mint_len, imp_len, org_len;
    sb_status_t st;

    memset(job, 0, sizeof(*job));
    msgpack_sbuffer_init(&job->init);
    job->conf = conf;
    if (lseek(fd, 0, SEEK_SET) != 0 || read_fd_all(fd, head, sizeof(head)) != 0 || memcmp(head, JOB_MAGIC, 4) != 0)
        return SB_E_EXECUTION;
    token_len = get32(head + 25);
    init_len = get32(head + 29);
    net_len = get32(head + 33);
    mint_len = get32(head + 37);
    imp_len = get32(head + 41);
    org_len = get32(head + 45);
    if (imp_len > JOB_MAX_NET || org_len > SB_SHIM_MAX_IMPORT_ORIGINS * (SB_SHIM_MAX_ORIGIN + 2) ||
        (imp_len != 0) != (org_len != 0) || head[4] > SB_SERVE_NET || token_len > SB_SHIM_MAX_TOKEN || init_len == 0 ||
        init_len > JOB_MAX_INIT || net_len > JOB_MAX_NET || mint_len > SB_SHIM_NETMINT_MAX_SECRET ||
        (head[4] == SB_SERVE_NET) != (net_len != 0) || (head[4] == SB_SERVE_NET) != (mint_len != 0) ||
        (head[4] == SB_SERVE_BINDINGS) != (token_len != 0))
        return SB_E_EXECUTION;
    job->kind = (sb_serve_kind_t)head[4];
    job->memory_mb = get32(head + 5);
    job->timeout_ms = (int64_t)get64(head + 9);
    job->started_ms = (int64_t)get64(head + 17);
    if (job->memory_mb < SB_SERVE_MIN_MEMORY_MB || job->memory_mb > SB_SERVE_MAX_MEMORY_MB ||
        job->timeout_ms < SB_SERVE_MIN_TIMEOUT_MS || job->timeout_ms > SB_SERVE_MAX_TIMEOUT_MS)
        return SB_E_EXECUTION;
    if (read_fd_all(fd, job->token, token_len) != 0)
        return SB_E_EXECUTION;
    job->token[token_len] = '\0';
    if ((job->init.data = sb_mem_try_alloc(init_len)) == NULL)
        return SB_E_NOMEM;
    job->init.alloc = init_len;
    if (read_fd_all(fd, job->init.data, init_len) != 0)
        return SB_E_EXECUTION;
    job->init.size = init_len;
    if (net_len != 0 && (st = read_json_array(fd, net_len, &job->net)) != SB_OK)
        return st;
    if (read_fd_all(fd, job->netmint_secret, mint_len) != 0)
        return SB_E_EXECUTION;
    job->netmint_secret[mint_len] = '\0';
    if (imp_len != 0 && (st = read_json_array(fd, imp_len, &job->imports)) != SB_OK)
        return st;
    return org_len != 0 ? read_origins(fd, org_len, &job->origins) : SB_OK;
}
