/*
 * sandbox-broker egress-check [--config FILE] [--allow ENTRY]... [--method M] URL
 *
 * ENTRY is a net entry: HOST[:PORT], or a JSON object {"host", "methods", "paths"}.
 *
 * The operator's view of an http.fetch decision: the same parser, allowlist,
 * name policy, resolver (with the configured DNS servers) and address policy
 * the fetch path runs, stopping before the connect. Exit 0 allowed, 1 denied,
 * 2 usage or configuration error.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "conf/config.h"
#include "sb/limits.h"
#include "svc/fetch/egress_check.h"

typedef struct st_check_state_t {
    int done;
    int allowed;
    int show_rule; /* --method given: the method and the rule decision are printed */
    char method[SB_MAX_FETCH_METHOD + 1];
} check_state_t;

static void on_decision(void *arg, const sb_egress_decision_t *d)
{
    check_state_t *st = arg;
    printf("decision: %s\n", d->allowed ? "allow" : "deny");
    if (st->show_rule)
        printf("method: %s\n", st->method);
    if (d->url.host_len != 0) {
        printf("url: %s://%s%s%s%s:%u%s\n", d->url.scheme == SB_URL_HTTPS ? "https" : "http",
               d->url.host_kind == SB_URL_HOST_IPV6 ? "[" : "", d->url.host, d->url.host_kind == SB_URL_HOST_IPV6 ? "]" : "", "",
               (unsigned)d->url.port, d->url.target);
    }
    for (size_t i = 0; i < d->nanswers; ++i) {
        char ip[64];
        sb_ip_format(&d->answers[i].ip, ip, sizeof(ip));
        printf("answer: %-40s %s (%s)\n", ip, d->answers[i].allowed ? "allow" : "deny", d->answers[i].rule);
    }
    if (st->show_rule && d->rule[0] != '\0')
        printf("rule: %s\n", d->rule);
    printf("reason: %s\n", d->reason);
    st->allowed = d->allowed;
    st->done = 1;
}

static int usage(void)
{
    fprintf(stderr, "usage: sandbox-broker egress-check [--config FILE] [--allow ENTRY]... [--method M] URL\n");
    return 2;
}

int sb_egress_check_main(int argc, char **argv)
{
    const char *config_path = NULL, *url = NULL, *err = NULL;
    json_t *allow = json_array();
    sb_config_t *conf = NULL;
    sb_fetch_conf_t *fc = NULL;
    sb_manifest_t *m = NULL;
    sb_fetch_ctx_t *ctx = NULL;
    h2o_loop_t *loop = NULL;
    sb_reaper_t reaper;
    check_state_t st = {0, 0, 0, "GET"};
    char errbuf[4096];
    int rc = 2;

    for (int i = 0; i < argc; ++i) {
        if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
            config_path = argv[++i];
        else if (strcmp(argv[i], "--allow") == 0 && i + 1 < argc) {
            const char *a = argv[++i];
            json_t *e = a[0] == '{' ? json_loads(a, JSON_REJECT_DUPLICATES, NULL) : json_string(a);
            if (e == NULL) {
                fprintf(stderr, "egress-check: --allow: not a JSON object: %s\n", a);
                goto Exit;
            }
            json_array_append_new(allow, e);
        } else if (strcmp(argv[i], "--method") == 0 && i + 1 < argc) {
            /* a token, uppercased as the typed call does */
            const char *mth = argv[++i];
            size_t n = strlen(mth);
            if (n == 0 || n > SB_MAX_FETCH_METHOD)
                goto Exit;
            for (size_t k = 0; k <= n; ++k)
                st.method[k] = mth[k] >= 'a' && mth[k] <= 'z' ? (char)(mth[k] - 'a' + 'A') : mth[k];
            st.show_rule = 1;
        } else if (argv[i][0] == '-' || url != NULL)
            goto Exit;
        else
            url = argv[i];
    }
    if (url == NULL) {
        rc = usage();
        goto Exit;
    }
    if (sb_config_load(config_path, 0, &conf, errbuf, sizeof(errbuf)) != SB_OK) {
        fprintf(stderr, "egress-check: invalid configuration:\n%s", errbuf);
        goto Exit;
    }
    if (sb_fetch_conf_create(conf->egress, &fc, errbuf, sizeof(errbuf)) != SB_OK) {
        fprintf(stderr, "egress-check: invalid configuration:\n%s\n", errbuf);
        goto Exit;
    }
    if (json_array_size(allow) != 0) {
        json_t *caps = json_pack("{s:O}", "net", allow);
        sb_status_t s = sb_manifest_parse(caps, &m, errbuf, sizeof(errbuf));
        json_decref(caps);
        if (s != SB_OK) {
            fprintf(stderr, "egress-check: --allow: %s\n", errbuf);
            goto Exit;
        }
    }
    loop = h2o_evloop_create();
    sb_reaper_init(&reaper, loop);
    if ((ctx = sb_fetch_ctx_create(fc, loop, &reaper, &err)) == NULL) {
        fprintf(stderr, "egress-check: %s\n", err);
        goto Exit;
    }
    sb_egress_check(ctx, m, url, strlen(url), st.method, on_decision, &st);
    while (!st.done)
        h2o_evloop_run(loop, 100);
    rc = st.allowed ? 0 : 1;
Exit:
    if (rc == 2 && url == NULL && argc != 0)
        usage();
    sb_fetch_ctx_release(ctx);
    if (loop != NULL) {
        /* the context is freed on the reaper's turn, and the sockets it closed on the next one */
        while (!sb_reaper_idle(&reaper))
            h2o_evloop_run(loop, 0);
        h2o_evloop_run(loop, 0);
        sb_reaper_dispose(&reaper);
        h2o_evloop_destroy(loop);
    }
    sb_manifest_free(m);
    sb_fetch_conf_free(fc);
    sb_config_free(conf);
    json_decref(allow);
    return rc;
}
