/*
 * sandbox-shim serve: the process of one run (see serve_int.h).
 *
 * Forked from the service, it keeps three descriptors of the service's: the
 * report socket, the client's connection, only to notice the client hanging
 * up (relay.c's cancel_fd), and the jail's cgroup directory when there is one.
 * Everything else it inherited is closed first, so no other client's
 * connection is held open by it, and the guest (started by runner.c, exactly
 * as `run` starts it, in the jail the service made at start-up) inherits
 * nothing at all.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "sb/mem.h"
#include "jail/hooks.h"
#include "serve/serve_int.h"

#define REPORT_FD 3
#define CANCEL_FD 4
#define JAIL_FD 5 /* the jail's cgroup directory, when it has one (sb_shim_jail_move_fd) */

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

/*
 * Keeps the report socket and the client's connection as REPORT_FD and CANCEL_FD, and the jail's
 * descriptor as JAIL_FD (both of ours first move above every fixed number, so that no move
 * overwrites another); closes the rest.
 */
static int keep_only(int report_fd, int cancel_fd, sb_shim_jail_t *jail)
{
    int r = fcntl(report_fd, F_DUPFD, 16), c = cancel_fd >= 0 ? fcntl(cancel_fd, F_DUPFD, 16) : -1, j;

    if (r < 0 || (cancel_fd >= 0 && c < 0) || (j = sb_shim_jail_move_fd(jail, JAIL_FD)) < 0 || dup2(r, REPORT_FD) != REPORT_FD)
        return -1;
    if (c >= 0 && dup2(c, CANCEL_FD) != CANCEL_FD)
        return -1;
    if (c < 0)
        (void)close(CANCEL_FD);
    if (j == 0)
        (void)close(JAIL_FD);
#ifdef SYS_close_range
    if (syscall(SYS_close_range, (unsigned)JAIL_FD + 1, ~0u, 0u) != 0)
#endif
    {
        for (int fd = JAIL_FD + 1; fd < 65536; ++fd)
            (void)close(fd);
    }
    (void)fcntl(REPORT_FD, F_SETFD, FD_CLOEXEC);
    if (c >= 0)
        (void)fcntl(CANCEL_FD, F_SETFD, FD_CLOEXEC);
    return 0;
}

static const char *classify(const json_t *answer)
{
    const char *e = json_string_value(json_object_get(answer, "error"));

    if (json_is_true(json_object_get(answer, "ok")))
        return "ok";
    if (json_is_true(json_object_get(answer, "timedOut")))
        return "timeout";
    if (e != NULL && strcmp(e, "sandbox request cancelled") == 0)
        return "cancelled";
    return "failed";
}

static json_t *failure(const char *error)
{
    return json_pack("{s:b, s:s, s:[]}", "ok", 0, "error", error, "logs");
}

__attribute__((noreturn)) void sb_serve_run_main(const sb_serve_job_t *job, int report_fd, int cancel_fd)
{
    const sb_serve_conf_t *conf = job->conf;
    static sb_shim_config_t cfg; /* 8 KiB of token: not on the stack */
    json_t *outcome = NULL, *answer = NULL, *meta;
    const char *outcome_kind = NULL, *revoke = NULL;
    char err[512], revoke_err[256] = "", token[65] = "";
    char *body = NULL, *line = NULL;
    long long calls = 0;
    int spawned = 0;
    pid_t parent = getppid();
    struct sigaction sa;
    int stop[2];

    /* the service's handlers are not ours; a lost service means nobody waits for this run */
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    signal(SIGCHLD, SIG_DFL);
    if (keep_only(report_fd, cancel_fd, conf->deno.jail) != 0 || prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
        _exit(1);
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
    cfg.cancel_fd = cancel_fd >= 0 ? CANCEL_FD : -1;
    cfg.stop_fd = stop[0];
    cfg.stderr_cap_fails = 1;
    switch (job->kind) {
    case SB_SERVE_COMPUTE:
        cfg.calls_refused = "binding call refused: this run has no bindings";
        break;
    case SB_SERVE_BINDINGS:
        memcpy(cfg.token, job->token, sizeof(cfg.token));
        break;
    case SB_SERVE_NET: {
        sb_status_t st = sb_shim_netmint_mint(&conf->netmint, job->net, job->timeout_ms, token, err, sizeof(err));
        if (st != SB_OK) {
            char e[600];
            snprintf(e, sizeof(e), "egress blocked: %s", err);
            outcome = failure(e);
            outcome_kind = "egress_blocked";
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
    {
        sb_shim_deno_t d = conf->deno;
        d.memory_mb = job->memory_mb;
        switch (sb_shim_deno_run(&d, &cfg, (const uint8_t *)job->init.data, job->init.size, on_spawned, NULL, &outcome, err,
                                 sizeof(err))) {
        case SB_OK:
            spawned = 1;
            break;
        case SB_E_EXECUTION:
            outcome = failure(err);
            outcome_kind = "spawn_failed";
            break;
        default:
            outcome = failure("sandbox IO error: out of memory");
            outcome_kind = "failed";
            break;
        }
    }
    if (spawned)
        record(SB_SERVE_REC_GONE, NULL, 0, NULL, 0);
    explicit_bzero(cfg.token, sizeof(cfg.token));
    if (token[0] != '\0') {
        revoke = sb_shim_netmint_revoke(&conf->netmint, token, revoke_err, sizeof(revoke_err)) == SB_OK ? "ok" : "failed";
        explicit_bzero(token, sizeof(token));
    }

Answer:
    /* upstream's answer: {ok, output?, error?, logs, timedOut?, ms}; the call count goes to the log only */
    if (outcome == NULL)
        outcome = failure("sandbox IO error: out of memory");
    calls = json_integer_value(json_object_get(outcome, "calls"));
    json_object_del(outcome, "calls");
    json_object_set_new(outcome, "ms", json_integer(sb_serve_now_ms() - job->started_ms));
    answer = outcome;
    body = json_dumps(answer, JSON_COMPACT);
    if (body == NULL || strlen(body) > SB_SERVE_MAX_ANSWER) {
        /* an answer the upstream adapter could not read (it stops at 2 MiB) is replaced, whole */
        sb_mem_free_foreign(body);
        answer = json_pack("{s:b, s:s, s:[], s:I}", "ok", 0, "error", "sandbox output limit exceeded", "logs", "ms",
                           (json_int_t)(sb_serve_now_ms() - job->started_ms));
        body = answer != NULL ? json_dumps(answer, JSON_COMPACT) : NULL;
        if (outcome_kind == NULL)
            outcome_kind = "failed";
    }
    if (outcome_kind == NULL)
        outcome_kind = classify(answer);
    meta = json_pack("{s:s, s:I, s:b, s:I}", "outcome", outcome_kind, "calls", (json_int_t)calls, "timedOut",
                     json_is_true(json_object_get(answer, "timedOut")), "jailFailures", (json_int_t)sb_shim_hook_jail_failures());
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
    _exit(0);
}
