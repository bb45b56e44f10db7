/*
 * sandbox-broker: the security boundary between sandboxed guest code and the
 * host's database, files, tools and network.
 *
 *   sandbox-broker [--config FILE]          run
 *   sandbox-broker --check-config [--config FILE]
 *   sandbox-broker --version
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <openssl/ssl.h>
#include "conf/config.h"
#include "http/server.h"
#include "obs/audit.h"
#include "obs/log.h"
#include "obs/metrics.h"
#include "store/store.h"
#include "fetch/fetch.h"
#include "svc/target.h"
#include "svc/handlers.h"
#include "util/util.h"

int sb_egress_check_main(int argc, char **argv);

static sb_store_t *the_store;

static long long live_tokens(void)
{
    return sb_store_live_tokens(the_store);
}

static sb_server_t server;

static int store_up(void)
{
    if (server.workers == NULL || server.workers[0].store == NULL)
        return 0;
    return sb_store_conn_healthy(server.workers[0].store);
}

static int db_up(void)
{
    if (server.workers == NULL || server.workers[0].loop == NULL)
        return -1;
    if (server.workers[0].svc.pg == NULL)
        return -1;
    return sb_pg_pool_healthy(server.workers[0].svc.pg);
}

static void usage(FILE *fp)
{
    fprintf(fp, "usage: sandbox-broker [--config FILE] [--check-config] [--version]\n"
                "       sandbox-broker egress-check [--config FILE] [--allow HOST[:PORT]]... URL\n"
                "  --config FILE    JSON configuration (docs/config.md); every key can be\n"
                "                   overridden by SANDBOX_BROKER_<KEY> in the environment\n"
                "  --check-config   validate the configuration and exit (0 valid, 1 not)\n"
                "The admin secret comes from SANDBOX_BROKER_ADMIN_SECRET or admin_secret_file.\n");
}

static const char *config_path;

static int same_str(const char *a, const char *b)
{
    return (a == NULL && b == NULL) || (a != NULL && b != NULL && strcmp(a, b) == 0);
}

/*
 * SIGHUP: read the configuration again and, when every part of it is valid,
 * publish it. A bad file is rejected as a whole and the running
 * configuration stays. Settings bound at start-up (listeners, threads, the
 * token store, the RPC path, the audit sink) keep their values until a
 * restart, and the log says so.
 */
static void reload(void)
{
    sb_config_t *conf = NULL, *cur = server.conf;
    sb_fetch_conf_t *fc = NULL;
    sb_targets_t *targets = NULL;
    char err[8192];
    int reachable = 0;
    sb_logline_t l;

    if (sb_config_load(config_path, 1, &conf, err, sizeof(err)) != SB_OK ||
        sb_fetch_conf_create(conf->egress, &fc, err, sizeof(err)) != SB_OK ||
        sb_targets_parse(conf->targets, &targets, err, sizeof(err)) != SB_OK ||
        sb_pg_check_schema(conf->database_url, targets, &reachable, err, sizeof(err)) == SB_E_BAD_ARGS) {
        for (char *p = err; *p != '\0'; ++p)
            if (*p == '\n')
                *p = ' ';
        sb_log_begin(&l, SB_LOG_ERROR, "reload.rejected");
        sb_log_cstr(&l, "reason", err);
        sb_log_cstr(&l, "msg", "the running configuration stays");
        sb_log_end(&l);
        sb_targets_free(targets);
        sb_fetch_conf_free(fc);
        sb_config_free(conf);
        return;
    }
    if (strcmp(conf->listen, cur->listen) != 0 || strcmp(conf->admin_listen, cur->admin_listen) != 0 ||
        conf->threads != cur->threads || strcmp(conf->token_store, cur->token_store) != 0 ||
        strcmp(conf->redis_prefix, cur->redis_prefix) != 0 || strcmp(conf->rpc_path, cur->rpc_path) != 0 ||
        !same_str(conf->audit, cur->audit) || conf->max_tokens != cur->max_tokens ||
        !same_str(conf->redis_password, cur->redis_password) || !same_str(conf->redis_password_file, cur->redis_password_file) ||
        !same_str(conf->redis_sentinel_password, cur->redis_sentinel_password) ||
        !same_str(conf->redis_sentinel_password_file, cur->redis_sentinel_password_file))
        sb_log_msg(SB_LOG_WARN, "reload.restart_needed",
                   "listen, admin_listen, threads, token_store, redis_prefix, the redis passwords, rpc_path, audit and "
                   "max_tokens change only on restart");
    /* keep what cannot change now, so the published configuration describes what runs */
    free(conf->listen);
    conf->listen = sb_mem_strdup(cur->listen);
    free(conf->admin_listen);
    conf->admin_listen = sb_mem_strdup(cur->admin_listen);
    conf->threads = cur->threads;
    free(conf->token_store);
    conf->token_store = sb_mem_strdup(cur->token_store);
    free(conf->redis_prefix);
    conf->redis_prefix = sb_mem_strdup(cur->redis_prefix);
    free(conf->rpc_path);
    conf->rpc_path = sb_mem_strdup(cur->rpc_path);
    free(conf->audit);
    conf->audit = sb_mem_strdup(cur->audit != NULL ? cur->audit : "off");
    conf->max_tokens = cur->max_tokens;
    sb_server_reload(&server, conf, fc, targets);
    sb_log_msg(SB_LOG_INFO, "reload.applied", "configuration reloaded");
}

static void *signal_thread(void *arg)
{
    sigset_t *set = arg;
    int sig = 0;
    for (;;) {
        sigwait(set, &sig);
        if (sig == SIGHUP) {
            reload();
            continue;
        }
        break;
    }
    {
        sb_logline_t l;
        sb_log_begin(&l, SB_LOG_INFO, "shutdown");
        sb_log_cstr(&l, "signal", sig == SIGTERM ? "SIGTERM" : "SIGINT");
        sb_log_end(&l);
    }
    sb_server_stop(&server);
    return NULL;
}

int main(int argc, char **argv)
{
    const char *err = NULL;
    int check_only = 0;
    sb_config_t *conf;
    sb_fetch_conf_t *fetch_conf = NULL;
    sb_targets_t *targets = NULL;
    char errbuf[8192];
    int rc = 1;
    sigset_t set;
    pthread_t sigtid;

    if (argc >= 2 && strcmp(argv[1], "egress-check") == 0)
        return sb_egress_check_main(argc - 2, argv + 2);
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--config") == 0 && i + 1 < argc) {
            config_path = argv[++i];
        } else if (strcmp(argv[i], "--check-config") == 0) {
            check_only = 1;
        } else if (strcmp(argv[i], "--version") == 0) {
            printf("sandbox-broker 0.1.0\n");
            return 0;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "sandbox-broker: unknown argument \"%s\"\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }

    if (sb_config_load(config_path, 1, &conf, errbuf, sizeof(errbuf)) != SB_OK) {
        fprintf(stderr, "sandbox-broker: invalid configuration:\n%s", errbuf);
        return 1;
    }
    if (sb_fetch_conf_create(conf->egress, &fetch_conf, errbuf, sizeof(errbuf)) != SB_OK ||
        sb_targets_parse(conf->targets, &targets, errbuf, sizeof(errbuf)) != SB_OK) {
        fprintf(stderr, "sandbox-broker: invalid configuration:\n%s\n", errbuf);
        goto Exit;
    }
    {
        int reachable = 0;
        sb_status_t st = sb_pg_check_schema(conf->database_url, targets, &reachable, errbuf, sizeof(errbuf));
        if (st == SB_E_BAD_ARGS || (st != SB_OK && check_only)) {
            fprintf(stderr, "sandbox-broker: invalid configuration:\n%s\n", errbuf);
            goto Exit;
        }
        if (st != SB_OK) {
            /* not reachable now: start anyway; data calls answer unavailable until it is */
            sb_logline_t l;
            sb_log_begin(&l, SB_LOG_WARN, "pg.unreachable_at_start");
            sb_log_cstr(&l, "reason", errbuf);
            sb_log_end(&l);
        }
    }
    {
        sb_store_config_t sc = {conf->token_store,
                                conf->redis_prefix,
                                conf->max_tokens,
                                conf->store_timeout_ms,
                                conf->redis_password,
                                conf->redis_password_file,
                                conf->redis_sentinel_password,
                                conf->redis_sentinel_password_file};
        if (sb_store_create(&sc, &the_store, &err) != SB_OK) {
            fprintf(stderr, "sandbox-broker: invalid configuration:\n%s\n", err);
            goto Exit;
        }
        /* the check opens what the start opens: AUTH, SELECT, the scripts, a primary (via the sentinels) */
        if (check_only && sb_store_check(the_store, errbuf, sizeof(errbuf)) != SB_OK) {
            fprintf(stderr, "sandbox-broker: invalid configuration:\ntoken store: %s\n", errbuf);
            goto Exit;
        }
    }
    if (check_only) {
        printf("configuration OK\n");
        rc = 0;
        goto Exit;
    }
    sb_log_set_level((sb_log_level_t)sb_log_parse_level(conf->log_level));

    /*
     * Every thread inherits this mask, the audit writer included, so only the
     * signal thread ever takes SIGTERM and SIGINT.
     */
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (sb_audit_open(conf->audit, &err) != SB_OK) {
        fprintf(stderr, "sandbox-broker: invalid configuration:\n%s\n", err);
        goto Exit;
    }
    sb_metrics_set_live_tokens_fn(live_tokens);
    sb_metrics_set_store_up_fn(store_up);
    sb_metrics_set_db_up_fn(db_up);

    if (sb_server_init(&server, conf, the_store, fetch_conf, targets) != SB_OK)
        goto Exit;
    {
        sb_logline_t l;
        sb_log_begin(&l, SB_LOG_INFO, "started");
        sb_log_cstr(&l, "tokenStore", sb_store_kind(the_store));
        sb_log_int(&l, "threads", conf->threads);
        sb_log_cstr(&l, "rpcPath", conf->rpc_path);
        sb_log_end(&l);
    }
    pthread_create(&sigtid, NULL, signal_thread, &set);
    sb_server_run(&server);
    pthread_cancel(sigtid);
    pthread_join(sigtid, NULL);
    sb_log_msg(SB_LOG_INFO, "stopped", "drained and stopped");
    sb_server_dispose(&server);
    rc = 0;
    if (server.conf != conf) {
        /* reloads replaced the start-up objects; the replaced ones are on the retired list */
        conf = server.conf;
        fetch_conf = server.fetch_conf;
        targets = server.targets;
    }
    sb_server_free_retired(&server);
Exit:
    sb_audit_close();
    sb_store_destroy(the_store);
    sb_fetch_conf_free(fetch_conf);
    sb_targets_free(targets);
    sb_config_free(conf);
    return rc;
}
