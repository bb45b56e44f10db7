/*
 * sandbox-broker: the security boundary between sandboxed guest code and the
 * host's database, files, tools and network.
 *
 *   sandbox-broker [--config FILE]                      run
 *   sandbox-broker --check-config [--offline | --allow-down] [--env-file FILE] [--config FILE]
 *   sandbox-broker egress-check [--config FILE] [--allow HOST[:PORT]]... URL
 *   sandbox-broker --print-config-keys | --version | --help
 *
 * Exit status: 0 done (or a clean shutdown), 1 the configuration is wrong
 * (or start-up failed), 2 usage; --check-config: one status per kind of
 * problem (CHECK_* below; docs/config.md, "Checking a configuration").
 */
#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
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
#include "svc/decide/decide.h"
#include "util/util.h"
#include "sb/mem.h"
#include "sb_build_info.h"

int sb_egress_check_main(int argc, char **argv);

static sb_store_t *the_store;

/*
 * --check-config's exit statuses, one per kind of problem. Every problem is
 * printed on a line of its own, prefixed by its kind; with several kinds the
 * status is the first of: invalid, credentials, privileges, unreachable.
 */
#define CHECK_INVALID 1     /* the configuration: a key, a value, a file it names, the schema it declares */
#define CHECK_USAGE 2       /* the command line */
#define CHECK_DOWN 3        /* valid, but a backend does not answer now: the broker would start and say so on /readyz */
#define CHECK_CREDENTIALS 4 /* a backend refused the credentials: the database's or Redis's user or password */
#define CHECK_PRIVILEGES 5  /* the database role lacks privileges the targets need */

/* the unit's EnvironmentFile=; --check-config reads it (when it exists) unless --env-file names another */
#define UNIT_ENV_FILE "/etc/sandbox-broker/environment"
#define ENV_FILE_MAX (64u * 1024u)

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
                "       sandbox-broker --check-config [--offline | --allow-down] [--env-file FILE] [--config FILE]\n"
                "       sandbox-broker egress-check [--config FILE] [--allow HOST[:PORT]]... URL\n"
                "       sandbox-broker audit-verify [--key PUBKEY] [--allow-open] FILE...\n"
                "       sandbox-broker audit-pubkey KEYFILE\n"
                "       sandbox-broker --print-config-keys | --version | --help\n"
                "\n"
                "  --config FILE        JSON configuration (docs/config.md); SANDBOX_BROKER_<KEY> variables win over it\n"
                "  --check-config       check what start-up reads and opens, every problem on its own line; exit 0 valid,\n"
                "                       1 invalid, 3 a backend is down now, 4 a backend refused the credentials,\n"
                "                       5 the database role lacks privileges\n"
                "  --offline            with --check-config: contact no backend\n"
                "  --allow-down         with --check-config: a backend that does not answer now is said, but is not an\n"
                "                       error (ExecStartPre: an outage must not stop a restart; refused credentials do)\n"
                "  --env-file FILE      with --check-config: read FILE's KEY=VALUE lines into the environment first, as the\n"
                "                       unit's EnvironmentFile= does (default: " UNIT_ENV_FILE " when it exists; \"\" for none)\n"
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

/* "audit" unset and "off" are the same setting */
static const char *audit_or_off(const char *a)
{
    return a != NULL ? a : "off";
}

/* a multi-line list of problems as one log field: "; " between them */
static void one_line(const char *in, char *out, size_t outsz)
{
    size_t w = 0;
    for (const char *p = in; *p != '\0' && w + 3 < outsz; ++p) {
        if (*p != '\n')
            out[w++] = *p;
        else if (p[1] != '\0' && w != 0) {
            out[w++] = ';';
            out[w++] = ' ';
        }
    }
    out[w] = '\0';
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
    sb_decide_conf_t *dc = NULL;
    sb_targets_t *targets = NULL;
    char err[8192];
    int reachable = 0;
    sb_logline_t l;

    if (sb_config_load(config_path, 1, &conf, err, sizeof(err)) != SB_OK ||
        sb_fetch_conf_create(conf->egress, &fc, err, sizeof(err)) != SB_OK ||
        sb_decide_conf_create(conf->decider, &dc, err, sizeof(err)) != SB_OK ||
        sb_targets_parse(conf->targets, &targets, err, sizeof(err)) != SB_OK ||
        sb_pg_check_schema(conf->database_url, targets, &reachable, err, sizeof(err)) == SB_E_BAD_ARGS) {
        char reason[sizeof(err) + 512];
        one_line(err, reason, sizeof(reason));
        sb_metrics_reload(0); /* counted before the line, so whoever reads the line sees the count */
        sb_log_begin_level_always(&l, SB_LOG_ERROR, "reload.rejected");
        sb_log_cstr(&l, "reason", reason);
        sb_log_cstr(&l, "msg", "the running configuration stays");
        sb_log_end(&l);
        sb_targets_free(targets);
        sb_decide_conf_free(dc);
        sb_fetch_conf_free(fc);
        sb_config_free(conf);
        return;
    }
    {
        /* only the restart-only keys whose value this file changes; the running values stay */
        char keys[512] = "";
        struct {
            int changed;
            const char *key;
        } restart_only[] = {
            {strcmp(conf->listen, cur->listen) != 0, "listen"},
            {strcmp(conf->admin_listen, cur->admin_listen) != 0, "admin_listen"},
            {conf->threads != cur->threads, "threads"},
            {strcmp(conf->token_store, cur->token_store) != 0, "token_store"},
            {strcmp(conf->redis_prefix, cur->redis_prefix) != 0, "redis_prefix"},
            {!same_str(conf->redis_password, cur->redis_password), "redis_password"},
            {!same_str(conf->redis_password_file, cur->redis_password_file), "redis_password_file"},
            {!same_str(conf->redis_sentinel_password, cur->redis_sentinel_password), "redis_sentinel_password"},
            {!same_str(conf->redis_sentinel_password_file, cur->redis_sentinel_password_file), "redis_sentinel_password_file"},
            {strcmp(conf->rpc_path, cur->rpc_path) != 0, "rpc_path"},
            {!same_str(audit_or_off(conf->audit), audit_or_off(cur->audit)), "audit"},
            {!same_str(conf->log_file, cur->log_file), "log_file"},
            {!same_str(conf->audit_key_file, cur->audit_key_file), "audit_key_file"},
            {conf->audit_checkpoint_records != cur->audit_checkpoint_records, "audit_checkpoint_records"},
            /* the token store took them at start (store.c) */
            {conf->timeline_max_events != cur->timeline_max_events, "timeline_max_events"},
            {conf->timeline_retention_ms != cur->timeline_retention_ms, "timeline_retention_ms"},
            {conf->max_tokens != cur->max_tokens, "max_tokens"},
        };
        for (size_t i = 0; i < sizeof(restart_only) / sizeof(restart_only[0]); ++i)
            if (restart_only[i].changed)
                snprintf(keys + strlen(keys), sizeof(keys) - strlen(keys), "%s%s", keys[0] != '\0' ? ", " : "",
                         restart_only[i].key);
        if (keys[0] != '\0') {
            sb_log_begin_level_always(&l, SB_LOG_WARN, "reload.restart_needed");
            sb_log_cstr(&l, "keys", keys);
            sb_log_cstr(&l, "msg", "these keys change only on restart; their running values stay until then");
            sb_log_end(&l);
        }
    }
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
    conf->timeline_max_events = cur->timeline_max_events;
    conf->timeline_retention_ms = cur->timeline_retention_ms;
    sb_mem_free(conf->log_file);
    conf->log_file = sb_mem_strdup(cur->log_file);
    conf->max_tokens = cur->max_tokens;
    log_sources(conf);
    sb_server_reload(&server, conf, fc, dc, targets);
    sb_metrics_reload(1);
    /* the outcome of the SIGHUP is logged whatever level the new configuration sets */
    sb_log_begin_level_always(&l, SB_LOG_INFO, "reload.applied");
    sb_log_cstr(&l, "msg", "configuration reloaded");
    sb_log_cstr(&l, "logLevel", conf->log_level);
    sb_log_end(&l);
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

static int check_status;

/*
 * A file start-up opens, in a directory that does not exist yet: on a fresh machine that is the
 * unit's LogsDirectory=, which systemd makes at the first start. Says how to make it now.
 */
static const char *file_hint(const char *path, char *err, size_t errsz)
{
    const char *slash = path != NULL ? strrchr(path, '/') : NULL;
    char dir[1024];
    struct stat st;

    if (slash == NULL || slash == path || (size_t)(slash - path) >= sizeof(dir))
        return err;
    memcpy(dir, path, (size_t)(slash - path));
    dir[slash - path] = '\0';
    if (stat(dir, &st) == 0 || errno != ENOENT)
        return err;
    snprintf(err + strlen(err), errsz - strlen(err),
             " (the directory %s does not exist%s; make it: install -d -m 0750 -o sandbox-broker -g sandbox-broker %s)", dir,
             strcmp(dir, "/var/log/sandbox-broker") == 0 ? " yet: the unit's LogsDirectory= makes it at the first start" : "", dir);
    return err;
}

static int check_rank(int kind)
{
    return kind == CHECK_INVALID ? 0 : kind == CHECK_CREDENTIALS ? 1 : kind == CHECK_PRIVILEGES ? 2 : kind == CHECK_DOWN ? 3 : 4;
}

/* one --check-config problem: each of its lines on a line of its own, prefixed by its kind */
static void check_problem(int kind, const char *msg)
{
    const char *label = kind == CHECK_INVALID       ? "invalid configuration"
                        : kind == CHECK_CREDENTIALS ? "credentials refused"
                        : kind == CHECK_PRIVILEGES  ? "missing privileges"
                                                    : "a backend is unreachable now";
    const char *p = msg;

    while (*p != '\0') {
        const char *nl = strchr(p, '\n');
        size_t n = nl != NULL ? (size_t)(nl - p) : strlen(p);
        if (n != 0)
            fprintf(stderr, "sandbox-broker: %s: %.*s\n", label, (int)n, p);
        p += n + (nl != NULL);
    }
    if (check_status == 0 || check_rank(kind) < check_rank(check_status))
        check_status = kind;
}

/*
 * A database that does not answer now: libpq's own words for a connection that never reached a
 * server, or a server's for one starting or stopping. --allow-down lets only these pass; any
 * other refusal of a connection (a localised message, a bad sslmode, a database that does not
 * exist) is the configuration's, so that a start that would never become ready fails its check.
 */
static int pg_down(const char *err)
{
    static const char *const down[] = {"Connection refused",
                                       "could not connect to server",
                                       "timeout expired",
                                       "Connection timed out",
                                       "could not translate host name",
                                       "No route to host",
                                       "Network is unreachable",
                                       "server closed the connection unexpectedly",
                                       "No such file or directory",
                                       "the database system is starting up",
                                       "the database system is shutting down",
                                       "the database system is in recovery mode",
                                       "too many connections"};
    for (size_t i = 0; i < sizeof(down) / sizeof(down[0]); ++i)
        if (strstr(err, down[i]) != NULL)
            return 1;
    return 0;
}

/* a database that answered but refused who we are (libpq says so in its message only) */
static int pg_auth_refused(const char *err)
{
    return strstr(err, "password authentication failed") != NULL || strstr(err, "no password supplied") != NULL ||
           strstr(err, "authentication failed for user") != NULL || strstr(err, "role \"") != NULL;
}

/*
 * --env-file: KEY=VALUE lines into the environment, as systemd's EnvironmentFile= reads them:
 * blank lines and lines starting with # or ; are skipped, white space around the key and the
 * value is dropped, a value in matching single or double quotes loses them. A variable already in
 * the environment is left as it is (see below). Neither the values nor a line that cannot be read is
 * ever printed (they may be secrets, or part of one); the variables' names are, by config.sources.
 * @return the number of the file's variables now in the environment, or -1 with `err` set
 */
static int load_env_file(const char *path, char *err, size_t errsz)
{
    FILE *f = fopen(path, "re");
    char *buf, *line, *next;
    size_t n;
    unsigned lineno = 0;
    int count = 0;

    if (f == NULL) {
        snprintf(err, errsz, "--env-file %s: %s", path, strerror(errno));
        return -1;
    }
    buf = sb_mem_alloc(ENV_FILE_MAX + 1);
    n = fread(buf, 1, ENV_FILE_MAX + 1, f);
    fclose(f);
    if (n > ENV_FILE_MAX) {
        snprintf(err, errsz, "--env-file %s: larger than %u bytes", path, ENV_FILE_MAX);
        sb_mem_free_secret(buf, ENV_FILE_MAX + 1);
        return -1;
    }
    buf[n] = '\0';
    for (line = buf; line != NULL; line = next) {
        char *k = line, *eq, *v, *end;
        next = strchr(line, '\n');
        if (next != NULL)
            *next++ = '\0';
        ++lineno;
        while (*k == ' ' || *k == '\t')
            ++k;
        if (*k == '\0' || *k == '#' || *k == ';' || *k == '\r')
            continue;
        if ((eq = strchr(k, '=')) == NULL) {
            /* the line is never echoed: it may be the continuation of a secret */
            snprintf(err, errsz, "--env-file %s: line %u has no '=' (its text is not shown: it may hold a secret)", path, lineno);
            count = -1;
            break;
        }
        for (end = eq; end > k && (end[-1] == ' ' || end[-1] == '\t'); --end)
            ;
        *end = '\0';
        for (v = eq + 1; *v == ' ' || *v == '\t'; ++v)
            ;
        for (end = v + strlen(v); end > v && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r'); --end)
            ;
        *end = '\0';
        if (end - v >= 2 && (v[0] == '"' || v[0] == '\'') && end[-1] == v[0]) {
            end[-1] = '\0';
            ++v;
        }
        for (const char *c = k; *c != '\0'; ++c) {
            if (!((*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') || *c == '_' || (c != k && *c >= '0' && *c <= '9'))) {
                snprintf(err, errsz, "--env-file %s: line %u: what stands before '=' is not a variable name (not shown)", path,
                         lineno);
                count = -1;
                break;
            }
        }
        if (count < 0)
            break;
        /*
         * A variable already in the environment wins: under the unit, systemd has read this file
         * (with its own quoting and escapes) before ExecStartPre runs, and those values are what the
         * broker will get; by hand, the file fills in what the shell does not set.
         */
        if (getenv(k) != NULL) {
            ++count;
            continue;
        }
        if (setenv(k, v, 0) != 0) {
            snprintf(err, errsz, "--env-file %s: cannot set %.64s", path, k);
            count = -1;
            break;
        }
        ++count;
    }
    sb_mem_free_secret(buf, ENV_FILE_MAX + 1);
    return count;
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
    int check_only = 0, offline = 0, allow_down = 0;
    sb_config_t *conf;
    sb_fetch_conf_t *fetch_conf = NULL;
    sb_decide_conf_t *decide_conf = NULL;
    sb_targets_t *targets = NULL;
    char errbuf[8192];
    const char *err = NULL, *env_file = NULL;
    int rc = 1, env_count = -1;
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
        } else if (strcmp(argv[i], "--env-file") == 0 && i + 1 < argc) {
            env_file = argv[++i];
        } else if (strcmp(argv[i], "--check-config") == 0) {
            check_only = 1;
        } else if (strcmp(argv[i], "--offline") == 0) {
            offline = 1;
        } else if (strcmp(argv[i], "--allow-down") == 0) {
            allow_down = 1;
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
            return CHECK_USAGE;
        }
    }
    if ((offline || allow_down || env_file != NULL) && !check_only) {
        fprintf(stderr, "sandbox-broker: %s goes with --check-config\n",
                offline      ? "--offline"
                : allow_down ? "--allow-down"
                             : "--env-file");
        usage(stderr);
        return CHECK_USAGE;
    }
    if (check_only) {
        /* what the unit reads before the broker does: its EnvironmentFile= (a process's own environment is the unit's) */
        if (env_file == NULL && access(UNIT_ENV_FILE, F_OK) == 0)
            env_file = UNIT_ENV_FILE;
        if (env_file != NULL && env_file[0] != '\0' && (env_count = load_env_file(env_file, errbuf, sizeof(errbuf))) < 0) {
            invalid(errbuf);
            return CHECK_INVALID;
        }
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
        sb_decide_conf_create(conf->decider, &decide_conf, errbuf, sizeof(errbuf)) != SB_OK ||
        sb_targets_parse(conf->targets, &targets, errbuf, sizeof(errbuf)) != SB_OK) {
        invalid(errbuf);
        goto Exit;
    }
    {
        /*
         * The database: a schema that does not match is a configuration error;
         * a database that does not answer now is not, the broker starts and
         * reports it (data calls answer unavailable, /readyz 503) until it does.
         * Nor, for a start, is one that refuses our user or password (the
         * broker follows when the database is fixed); --check-config tells
         * that apart (CHECK_CREDENTIALS), and the unit's ExecStartPre fails on it.
         * --offline connects to nothing: without database_url the check
         * still runs, since it then only asks whether a target needs one.
         */
        int reachable = 0;
        sb_status_t st = SB_OK;
        if (!offline || conf->database_url == NULL)
            st = sb_pg_check_schema(conf->database_url, targets, &reachable, errbuf, sizeof(errbuf));
        if (check_only && st == SB_E_UNAVAILABLE && pg_auth_refused(errbuf))
            st = SB_E_UNAUTHORIZED;
        else if (check_only && st == SB_E_UNAVAILABLE && !pg_down(errbuf))
            st = SB_E_BAD_ARGS; /* refused, not down: fail closed, --allow-down does not cover it */
        if (check_only) {
            if (st != SB_OK)
                check_problem(st == SB_E_BAD_ARGS       ? CHECK_INVALID
                              : st == SB_E_UNAUTHORIZED ? CHECK_CREDENTIALS
                              : st == SB_E_FORBIDDEN    ? CHECK_PRIVILEGES
                                                        : CHECK_DOWN,
                              errbuf);
        } else if (st == SB_E_BAD_ARGS) {
            invalid(errbuf);
            goto Exit;
        } else if (st == SB_E_FORBIDDEN) {
            /*
             * A role without the privileges the targets need: a start goes on and
             * reports it (the pools' introspection logs it once, /readyz answers 503
             * naming it) until a GRANT fixes it.
             */
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
        sb_status_t st;
        if (sb_store_create(&sc, &the_store, &err) != SB_OK) {
            if (!check_only) {
                invalid(err);
                goto Exit;
            }
            check_problem(CHECK_INVALID, err);
        } else if (check_only && !offline && (st = sb_store_check(the_store, errbuf, sizeof(errbuf))) != SB_OK) {
            /* the check opens what the start opens: AUTH, SELECT, the scripts, a primary (via the sentinels) */
            char line[sizeof(errbuf) + 16];
            snprintf(line, sizeof(line), "token store: %s", errbuf);
            check_problem(st == SB_E_UNAUTHORIZED ? CHECK_CREDENTIALS : st == SB_E_BAD_ARGS ? CHECK_INVALID : CHECK_DOWN, line);
        }
    }
    if (check_only) {
        /* the files start-up opens, opened the same way (as the same user, under the same sandbox) */
        if (sb_audit_check(conf->audit, conf->audit_key_file, errbuf, sizeof(errbuf)) != SB_OK)
            check_problem(CHECK_INVALID, file_hint(conf->audit, errbuf, sizeof(errbuf)));
        if (sb_log_check_file(conf->log_file, errbuf, sizeof(errbuf)) != SB_OK)
            check_problem(CHECK_INVALID, file_hint(conf->log_file, errbuf, sizeof(errbuf)));
        if (check_status == CHECK_DOWN)
            fprintf(stderr,
                    "sandbox-broker: otherwise the configuration is valid; the broker would start and report the "
                    "backend on /readyz until it answers%s\n",
                    allow_down ? " (--allow-down: not an error)" : " (--allow-down accepts that, --offline skips the check)");
        if (check_status == CHECK_DOWN && allow_down)
            check_status = 0;
        if (check_status == 0)
            printf("configuration OK%s\n", offline ? " (offline: no backend contacted)" : "");
        if (env_count >= 0)
            fprintf(stderr, "sandbox-broker: read %d variable(s) from %s, as the unit does\n", env_count, env_file);
        rc = check_status;
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
    sb_metrics_set_decide_pending_fn(sb_decide_pending);

    if (sb_server_init(&server, conf, the_store, fetch_conf, decide_conf, targets) != SB_OK)
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
        decide_conf = server.decide_conf;
        targets = server.targets;
    }
    sb_server_free_retired(&server);
Exit:
    sb_audit_close();
    sb_store_destroy(the_store);
    sb_fetch_conf_free(fetch_conf);
    sb_decide_conf_free(decide_conf);
    sb_targets_free(targets);
    sb_config_free(conf);
    return rc;
}
