/*
 * sandbox-broker: the security boundary between sandboxed guest code and the
 * host's database, files, tools and network.
 *
 *   sandbox-broker [--config FILE]                      run
 *   sandbox-broker --check-config [--offline] [--config FILE]
 *   sandbox-broker egress-check [--config FILE] [--allow HOST[:PORT]]... URL
 *   sandbox-broker --print-config-keys | --version | --help
 *
 * Exit status: 0 done (or a clean shutdown), 1 the configuration is wrong
 * (or start-up failed), 2 usage, 3 --check-config found the configuration
 * valid but a backend unreachable now (not a configuration error: the broker
 * would start and report it on /readyz).
 */
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <openssl/ssl.h>
#include "conf/config.h"
#include "authz/secrets.h"
#include "http/server.h"
#include "obs/audit.h"
#include "obs/audit_chain.h"
#include "obs/log.h"
#include "obs/metrics.h"
#include "store/store.h"
#include "fetch/fetch.h"
#include "svc/target.h"
#include "svc/handlers.h"
#include "util/util.h"
#include "sb/mem.h"
#include "sb_build_info.h"

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
    fprintf(fp, "usage: sandbox-broker [--config FILE]\n"
                "       sandbox-broker --check-config [--offline] [--config FILE]\n"
                "       sandbox-broker egress-check [--config FILE] [--allow HOST[:PORT]]... URL\n"
                "       sandbox-broker audit-verify [--key PUBKEY] [--allow-open] FILE...\n"
                "       sandbox-broker audit-pubkey KEYFILE\n"
                "       sandbox-broker --print-config-keys | --version | --help\n"
                "\n"
                "  --config FILE        JSON configuration (docs/config.md); SANDBOX_BROKER_<KEY> variables win over it\n"
                "  --check-config       check what start-up reads and opens; exit 0 valid, 1 invalid, 3 a backend is down\n"
                "  --offline            with --check-config: contact no backend (ExecStartPre: an outage is not fatal)\n"
                "  --print-config-keys  print every configuration key and its environment variable, one a line\n"
                "  --version            print the version and the commit it was built from\n"
                "  --help, -h           print this help\n"
                "  egress-check URL     the http.fetch decision for URL, without connecting (exit 0 allow, 1 deny)\n"
                "  audit-verify FILE... the audit chain, checkpoints and signatures (exit 0 verified, 1 tampered, 2 usage)\n"
                "  audit-pubkey KEYFILE print the public key of an audit_key_file (PEM), for audit-verify --key\n"
                "\n"
                "The admin secret comes from SANDBOX_BROKER_ADMIN_SECRET or admin_secret_file.\n"
                "Signals: SIGHUP reloads the configuration and reopens the log and audit files; SIGUSR1 reopens\n"
                "them; SIGTERM and SIGINT drain and stop; SIGUSR2 and SIGALRM are logged and ignored.\n");
}

static const char *config_path;

static int same_str(const char *a, const char *b)
{
    return (a == NULL && b == NULL) || (a != NULL && b != NULL && strcmp(a, b) == 0);
}

/* which settings the environment made (names only), and which file keys it overrode */
static void log_sources(const sb_config_t *conf)
{
    char env[1024], overridden[512];
    sb_logline_t l;
    sb_config_sources(conf, env, sizeof(env), overridden, sizeof(overridden));
    sb_log_begin(&l, SB_LOG_INFO, "config.sources");
    sb_log_cstr(&l, "file", config_path != NULL ? config_path : "(none)");
    sb_log_cstr(&l, "env", env);
    if (overridden[0] != '\0') {
        sb_log_cstr(&l, "overridden", overridden);
        sb_log_cstr(&l, "msg", "the environment wins over these keys of the file: editing them there changes nothing");
    }
    sb_log_end(&l);
}

/* SIGUSR1 and SIGHUP: the log and audit files again at their paths, for rotation */
static void reopen_files(const char *why)
{
    char err[512];
    sb_logline_t l;
    int failed = 0;
    for (int i = 0; i < 2; ++i) {
        if ((i == 0 ? sb_log_reopen(err, sizeof(err)) : sb_audit_reopen(why, err, sizeof(err))) == SB_OK)
            continue;
        sb_log_begin(&l, SB_LOG_ERROR, "reopen.failed");
        sb_log_cstr(&l, "reason", err);
        sb_log_cstr(&l, "msg", "the file stays open as it was");
        sb_log_end(&l);
        failed = 1;
    }
    if (!failed) {
        sb_log_begin(&l, SB_LOG_INFO, "reopened");
        sb_log_cstr(&l, "log", sb_log_file());
        sb_log_cstr(&l, "audit", server.conf->audit != NULL ? server.conf->audit : "off");
        sb_log_end(&l);
    }
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
        sb_metrics_reload(0); /* counted before the line, so whoever reads the line sees the count */
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
        !same_str(conf->audit, cur->audit) || !same_str(conf->log_file, cur->log_file) || conf->max_tokens != cur->max_tokens ||
        !same_str(conf->redis_password, cur->redis_password) || !same_str(conf->redis_password_file, cur->redis_password_file) ||
        !same_str(conf->redis_sentinel_password, cur->redis_sentinel_password) ||
        !same_str(conf->redis_sentinel_password_file, cur->redis_sentinel_password_file) ||
        !same_str(conf->audit_key_file, cur->audit_key_file) || conf->audit_checkpoint_records != cur->audit_checkpoint_records)
        sb_log_msg(
            SB_LOG_WARN, "reload.restart_needed",
            "listen, admin_listen, threads, token_store, redis_prefix, the redis passwords, rpc_path, audit, audit_key_file, "
            "audit_checkpoint_records, log_file and max_tokens change only on restart");
    /* keep what cannot change now, so the published configuration describes what runs */
    sb_mem_free(conf->listen);
    conf->listen = sb_mem_strdup(cur->listen);
    sb_mem_free(conf->admin_listen);
    conf->admin_listen = sb_mem_strdup(cur->admin_listen);
    conf->threads = cur->threads;
    sb_mem_free(conf->token_store);
    conf->token_store = sb_mem_strdup(cur->token_store);
    sb_mem_free(conf->redis_prefix);
    conf->redis_prefix = sb_mem_strdup(cur->redis_prefix);
    sb_mem_free(conf->rpc_path);
    conf->rpc_path = sb_mem_strdup(cur->rpc_path);
    sb_mem_free(conf->audit);
    conf->audit = sb_mem_strdup(cur->audit != NULL ? cur->audit : "off");
    sb_mem_free(conf->audit_key_file);
    conf->audit_key_file = cur->audit_key_file != NULL ? sb_mem_strdup(cur->audit_key_file) : NULL;
    conf->audit_checkpoint_records = cur->audit_checkpoint_records;
    sb_mem_free(conf->log_file);
    conf->log_file = sb_mem_strdup(cur->log_file);
    conf->max_tokens = cur->max_tokens;
    log_sources(conf);
    sb_server_reload(&server, conf, fc, targets);
    sb_metrics_reload(1);
    sb_log_msg(SB_LOG_INFO, "reload.applied", "configuration reloaded");
}

static const char *signal_name(int sig)
{
    switch (sig) {
    case SIGTERM:
        return "SIGTERM";
    case SIGINT:
        return "SIGINT";
    case SIGHUP:
        return "SIGHUP";
    case SIGUSR1:
        return "SIGUSR1";
    case SIGUSR2:
        return "SIGUSR2";
    case SIGALRM:
        return "SIGALRM";
    default:
        return "other";
    }
}

/*
 * Every signal an operator (or logrotate) might send is taken here, never by
 * its default action: SIGUSR1, SIGUSR2 and SIGALRM would otherwise end the
 * process with no log line.
 */
static void *signal_thread(void *arg)
{
    sigset_t *set = arg;
    int sig = 0;
    for (;;) {
        sigwait(set, &sig);
        if (sig == SIGTERM || sig == SIGINT)
            break;
        if (sig == SIGHUP) {
            reopen_files("reload");
            reload();
        } else if (sig == SIGUSR1) {
            reopen_files("rotate");
        } else {
            sb_logline_t l;
            sb_log_begin(&l, SB_LOG_INFO, "signal.ignored");
            sb_log_cstr(&l, "signal", signal_name(sig));
            sb_log_end(&l);
        }
    }
    {
        sb_logline_t l;
        sb_log_begin(&l, SB_LOG_INFO, "shutdown");
        sb_log_cstr(&l, "signal", signal_name(sig));
        sb_log_end(&l);
    }
    sb_server_stop(&server);
    return NULL;
}

/* "sandbox-broker: invalid configuration:" and the problems, one a line */
static void invalid(const char *problems)
{
    size_t n = strlen(problems);
    fprintf(stderr, "sandbox-broker: invalid configuration:\n%s%s", problems, n != 0 && problems[n - 1] == '\n' ? "" : "\n");
}

/*
 * jansson's memory is wiped when freed: the admin mint body and the
 * configuration carry secret values (PROTOCOL.md section 5, "Secrets"), and
 * the parser's own buffers hold copies of every string it read.
 */
static void *json_alloc(size_t n)
{
    return sb_mem_try_alloc(n);
}

static void json_free_wiped(void *p)
{
    if (p != NULL)
        sb_mem_free_secret(p, malloc_usable_size(p));
}

int main(int argc, char **argv)
{
    int check_only = 0, offline = 0, backend_down = 0;
    sb_config_t *conf;
    sb_fetch_conf_t *fetch_conf = NULL;
    sb_targets_t *targets = NULL;
    char errbuf[8192];
    const char *err = NULL;
    int rc = 1;
    sigset_t set;
    pthread_t sigtid;

    json_set_alloc_funcs(json_alloc, json_free_wiped);
    if (argc >= 2 && strcmp(argv[1], "egress-check") == 0)
        return sb_egress_check_main(argc - 2, argv + 2);
    if (argc >= 2 && strcmp(argv[1], "audit-verify") == 0)
        return sb_audit_verify_main(argc - 2, argv + 2);
    if (argc >= 2 && strcmp(argv[1], "audit-pubkey") == 0)
        return sb_audit_pubkey_main(argc - 2, argv + 2);
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--config") == 0 && i + 1 < argc) {
            config_path = argv[++i];
        } else if (strcmp(argv[i], "--check-config") == 0) {
            check_only = 1;
        } else if (strcmp(argv[i], "--offline") == 0) {
            offline = 1;
        } else if (strcmp(argv[i], "--print-config-keys") == 0) {
            sb_config_print_keys(stdout);
            return 0;
        } else if (strcmp(argv[i], "--version") == 0) {
            printf("sandbox-broker %s (commit %s)\n", SB_VERSION, SB_GIT_COMMIT);
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
    if (offline && !check_only) {
        fprintf(stderr, "sandbox-broker: --offline goes with --check-config\n");
        usage(stderr);
        return 2;
    }

    if (sb_config_load(config_path, 1, &conf, errbuf, sizeof(errbuf)) != SB_OK) {
        invalid(errbuf);
        return 1;
    }
    /* from here on everything start-up logs goes to log_file */
    if (!check_only && sb_log_open_file(conf->log_file, errbuf, sizeof(errbuf)) != SB_OK) {
        invalid(errbuf);
        goto Exit;
    }
    sb_log_set_level((sb_log_level_t)sb_log_parse_level(conf->log_level));
    if (sb_fetch_conf_create(conf->egress, &fetch_conf, errbuf, sizeof(errbuf)) != SB_OK ||
        sb_targets_parse(conf->targets, &targets, errbuf, sizeof(errbuf)) != SB_OK) {
        invalid(errbuf);
        goto Exit;
    }
    {
        /*
         * The database: a schema that does not match is a configuration error;
         * a database that does not answer now is not, the broker starts and
         * reports it (data calls answer unavailable, /readyz 503) until it
         * does. --offline connects to nothing: without database_url the check
         * still runs, since it then only asks whether a target needs one.
         */
        int reachable = 0;
        sb_status_t st = SB_OK;
        if (!offline || conf->database_url == NULL)
            st = sb_pg_check_schema(conf->database_url, targets, &reachable, errbuf, sizeof(errbuf));
        /*
         * A role without the privileges the targets need: the check fails; a
         * start goes on and reports it (the pools' introspection logs it once,
         * /readyz answers 503 naming it) until a GRANT fixes it.
         */
        if (st == SB_E_BAD_ARGS || (st == SB_E_FORBIDDEN && check_only)) {
            invalid(errbuf);
            goto Exit;
        }
        if (st == SB_E_FORBIDDEN) {
            /* reported by the pools */
        } else if (st != SB_OK && check_only) {
            fprintf(stderr, "sandbox-broker: a backend is unreachable now:\n%s\n", errbuf);
            backend_down = 1;
        } else if (st != SB_OK) {
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
                                conf->redis_sentinel_password_file,
                                (size_t)conf->timeline_max_events,
                                conf->timeline_retention_ms};
        if (sb_store_create(&sc, &the_store, &err) != SB_OK) {
            invalid(err);
            goto Exit;
        }
        /* the check opens what the start opens: AUTH, SELECT, the scripts, a primary (via the sentinels) */
        if (check_only && !offline && sb_store_check(the_store, errbuf, sizeof(errbuf)) != SB_OK) {
            fprintf(stderr, "sandbox-broker: invalid configuration:\ntoken store: %s\n", errbuf);
            goto Exit;
        }
    }
    if (check_only) {
        /* the files start-up opens, opened the same way (as the same user, under the same sandbox) */
        if (sb_audit_check(conf->audit, conf->audit_key_file, errbuf, sizeof(errbuf)) != SB_OK ||
            sb_log_check_file(conf->log_file, errbuf, sizeof(errbuf)) != SB_OK) {
            invalid(errbuf);
            goto Exit;
        }
        if (backend_down) {
            fprintf(stderr, "sandbox-broker: the configuration is valid; the broker would start and report the backend on "
                            "/readyz until it answers (--offline skips this check)\n");
            rc = 3;
            goto Exit;
        }
        printf("configuration OK%s\n", offline ? " (offline: no backend contacted)" : "");
        rc = 0;
        goto Exit;
    }
    log_sources(conf);
    /* the key that seals run secrets at rest; read once at start-up (a reload keeps this one) */
    sb_secrets_set_key(conf->has_secrets_key ? conf->secrets_key : NULL);
    if (strcmp(sb_store_kind(the_store), "memory") != 0 && !conf->has_secrets_key) {
        sb_logline_t l;
        sb_log_begin(&l, SB_LOG_WARN, "secrets.disabled");
        sb_log_cstr(&l, "reason", "the Redis token store has no secrets_key_file: mints that carry secrets are refused");
        sb_log_end(&l);
    }

    /*
     * Every thread inherits this mask, the audit writer included, so only the
     * signal thread ever takes these signals. SIGPIPE (a peer gone) and
     * SIGXFSZ (a file at its size limit: the write fails instead) are ignored.
     */
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGUSR2);
    sigaddset(&set, SIGALRM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGXFSZ, SIG_IGN);

    if (sb_audit_open(conf->audit, conf->audit_key_file, conf->audit_checkpoint_records, errbuf, sizeof(errbuf)) != SB_OK) {
        invalid(errbuf);
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
        sb_log_cstr(&l, "version", SB_VERSION);
        sb_log_cstr(&l, "commit", SB_GIT_COMMIT);
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
