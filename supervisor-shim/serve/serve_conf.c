/*
 * sandbox-shim serve: its configuration (serve_conf.h). Flags first, then the secrets (the
 * admission secret before anything else can fail, so no mistake leaves it in the environment),
 * the listener, the broker and its admin URL, the jail (built and probed), and Deno (started once
 * as a guest). Every refusal names the flag or variable it came from and never a secret.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "sb/addr.h"
#include "sb/mem.h"
#include "serve/serve_conf.h"
#include "relay/tls.h"

#define DEFAULT_PORT 8787u
#define DEFAULT_MAX_CONNECTIONS 256u

int sb_serve_fail_usage(const char *fmt, const char *arg)
{
    fputs("sandbox-shim serve: ", stderr);
    fprintf(stderr, fmt, arg != NULL ? arg : "");
    fputc('\n', stderr);
    return SB_SERVE_EXIT_USAGE;
}

static int parse_uint(const char *s, unsigned long min, unsigned long max, unsigned long *out)
{
    unsigned long v = 0;
    if (s == NULL || *s == '\0' || strlen(s) > 9)
        return -1;
    for (const char *p = s; *p != '\0'; ++p) {
        if (*p < '0' || *p > '9')
            return -1;
        v = v * 10 + (unsigned long)(*p - '0');
    }
    if (v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

/* trims ASCII white space at both ends, in place (upstream trims its environment values) */
static char *trim(char *s)
{
    size_t n;
    while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
        ++s;
    n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r'))
        s[--n] = '\0';
    return s;
}

int sb_serve_read_secret(const char *file, const char *env, char *out, size_t outsz, const char *what, char *err, size_t errsz)
{
    char buf[SB_SERVE_MAX_SECRET + 2];
    size_t n = 0;
    int rc = -1;

    out[0] = '\0';
    if (file != NULL) {
        int fd = open(file, O_RDONLY | O_CLOEXEC);
        ssize_t r;
        if (fd < 0) {
            snprintf(err, errsz, "cannot open the %s file %s: %s", what, file, strerror(errno));
            return -1;
        }
        while (n < sizeof(buf) - 1 && (r = read(fd, buf + n, sizeof(buf) - 1 - n)) != 0) {
            if (r < 0 && errno == EINTR)
                continue;
            if (r < 0) {
                snprintf(err, errsz, "cannot read the %s file %s: %s", what, file, strerror(errno));
                close(fd);
                goto Exit;
            }
            n += (size_t)r;
        }
        /* a file longer than that is refused whole, never cut to what was read */
        if (n == sizeof(buf) - 1) {
            char more;
            ssize_t m;
            do
                m = read(fd, &more, 1);
            while (m < 0 && errno == EINTR);
            if (m != 0) {
                snprintf(err, errsz, "the file %s: the %s is longer than 1024 bytes", file, what);
                close(fd);
                goto Exit;
            }
        }
        close(fd);
        buf[n] = '\0';
    } else {
        char *v = getenv(env);
        if (v == NULL)
            return 0;
        n = strlen(v);
        if (n < sizeof(buf))
            memcpy(buf, v, n + 1);
        explicit_bzero(v, n);
        (void)unsetenv(env);
        if (n >= sizeof(buf)) {
            snprintf(err, errsz, "%s: the %s is longer than 1024 bytes", env, what);
            goto Exit;
        }
    }
    {
        char *t = trim(buf);
        size_t tl = strlen(t);
        if (tl >= outsz || tl > SB_SERVE_MAX_SECRET) {
            snprintf(err, errsz, "%s%s: the %s is longer than 1024 bytes", file != NULL ? "the file " : "",
                     file != NULL ? file : env, what);
            goto Exit;
        }
        for (size_t i = 0; i < tl; ++i) {
            if ((unsigned char)t[i] < 0x20 || (unsigned char)t[i] == 0x7f) {
                snprintf(err, errsz, "%s%s: the %s holds control characters", file != NULL ? "the file " : "",
                         file != NULL ? file : env, what);
                goto Exit;
            }
        }
        memcpy(out, t, tl + 1);
    }
    rc = 0;
Exit:
    explicit_bzero(buf, sizeof(buf));
    return rc;
}

int sb_serve_check_admission(const char *secret, const char *file, char *err, size_t errsz)
{
    if (strlen(secret) >= SB_SERVE_MIN_ADMISSION_SECRET)
        return 0;
    if (file != NULL)
        snprintf(err, errsz, "--admission-secret-file %s must hold at least 32 bytes; refusing to start without host admission",
                 file);
    else
        snprintf(err, errsz,
                 "SANDBOX_HOST_ADMISSION_SECRET (or --admission-secret-file) must hold at least 32 bytes; "
                 "refusing to start without host admission");
    return -1;
}

int sb_serve_deno_version(const sb_serve_conf_t *conf, char *version, size_t vsz, int64_t limit_ms, char *err, size_t errsz)
{
    char *argv[] = {"deno", "--version", NULL};
    char *envp[] = {"NO_COLOR=1", "DENO_NO_UPDATE_CHECK=1", "HOME=/nonexistent", NULL};
    sb_shim_spawn_t sp;
    sb_shim_child_t c;
    char out[4096], why[400];
    size_t n = 0;
    int64_t deadline = sb_serve_now_ms() + limit_ms;
    int status = 0;
    const char *v;

    memset(&sp, 0, sizeof(sp));
    sp.path = conf->deno.exe;
    sp.argv = argv;
    sp.envp = envp;
    sp.cwd = "/";
    sp.nofile = SB_SHIM_GUEST_NOFILE;
    sp.jail = conf->deno.jail;
    if (sb_shim_child_spawn(&sp, &c, why, sizeof(why)) != SB_OK) {
        snprintf(err, errsz, "spawn: %s", why);
        return -1;
    }
    close(c.in_fd);
    c.in_fd = -1;
    for (;;) {
        struct pollfd pf = {c.out_fd, POLLIN, 0};
        int64_t left = deadline - sb_serve_now_ms();
        ssize_t r;
        if (left <= 0 || poll(&pf, 1, (int)left) <= 0)
            break;
        r = read(c.out_fd, out + n, sizeof(out) - 1 - n);
        if (r < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (r <= 0)
            break;
        n += (size_t)r;
        if (n == sizeof(out) - 1)
            break;
    }
    sb_shim_child_signal(&c, SIGKILL);
    while (waitpid(c.pid, &status, 0) < 0 && errno == EINTR)
        ;
    c.pid = -1; /* reaped: close gives the uid back */
    sb_shim_child_close(&c);
    out[n] = '\0';
    if (strncmp(out, "deno ", 5) != 0) {
        snprintf(err, errsz, "%s --version did not answer like Deno (%s)", conf->deno.exe,
                 n != 0                          ? "its first line is not \"deno VERSION\""
                 : sb_serve_now_ms() >= deadline ? "no answer within the check's time"
                                                 : "no output");
        return -1;
    }
    v = out + 5;
    n = 0;
    while (n + 1 < vsz &&
           ((v[n] >= '0' && v[n] <= '9') || (v[n] >= 'a' && v[n] <= 'z') || v[n] == '.' || v[n] == '-' || v[n] == '+'))
        ++n;
    if (n == 0) {
        snprintf(err, errsz, "%s --version did not answer like Deno (no version)", conf->deno.exe);
        return -1;
    }
    memcpy(version, v, n);
    version[n] = '\0';
    return 0;
}

/*
 * Finds Deno and starts it once as a guest would (guest_deno_version). `src` names where the value
 * came from ("--deno", "DENO_BIN", or NULL: the default, deno on PATH), for the message.
 */
static int check_deno(sb_serve_settings_t *set, const char *deno, const char *src, const sb_shim_jail_config_t *jc, char *err,
                      size_t errsz)
{
    char what[360], why[512];
    struct stat st;

    if (src == NULL)
        snprintf(what, sizeof(what), "deno (looked up on PATH)");
    else if (strcmp(src, "--deno") == 0)
        snprintf(what, sizeof(what), "--deno %.320s", deno);
    else
        snprintf(what, sizeof(what), "%s=%.320s", src, deno);
    if ((set->conf.deno.exe = sb_shim_find_exe(deno)) == NULL) {
        const char *path = getenv("PATH");
        snprintf(err, errsz, "%s: not found at PATH=%.300s; install Deno (2.9) or name it with --deno PATH or DENO_BIN", what,
                 path != NULL ? path : "(unset: /usr/local/bin:/usr/bin:/bin)");
        return -1;
    }
    if (stat(set->conf.deno.exe, &st) != 0) {
        snprintf(err, errsz, "%s: not found at %.300s (%s); install Deno there or name another with --deno PATH or DENO_BIN", what,
                 set->conf.deno.exe, strerror(errno));
        return -1;
    }
    if (sb_serve_deno_version(&set->conf, set->deno_version, sizeof(set->deno_version), SB_SERVE_DENO_CHECK_START_MS, why,
                              sizeof(why)) == 0)
        return 0;
    if (strncmp(why, "spawn: cannot execute", 21) == 0) {
        char uids[96];
        if (!sb_shim_jail_enabled(set->conf.deno.jail) || !sb_shim_jail_privileged(set->conf.deno.jail))
            snprintf(uids, sizeof(uids), "serve's own uid %u", (unsigned)geteuid());
        else
            snprintf(uids, sizeof(uids), "uids of their own (--jail-uid-base %lu and up)", jc->uid_base);
        snprintf(err, errsz,
                 "%s: a guest cannot start it (%s): the guests run as %s, so the file and every directory above it must be "
                 "readable and executable by them; install Deno where they can reach it (e.g. /usr/local/bin), not under a "
                 "0700 home directory",
                 what, why + 7, uids);
    } else if (strncmp(why, "spawn: ", 7) == 0) {
        snprintf(err, errsz, "%s: a guest cannot be started: %s", what, why + 7);
    } else {
        snprintf(err, errsz, "%s: %s", what, why);
    }
    return -1;
}

static void usage(FILE *f)
{
    fputs("usage: sandbox-shim serve [options]\n"
          "  --listen HOST:PORT            listener (default 127.0.0.1:$PORT, PORT default 8787)\n"
          "  --admission-secret-file F     the host admission secret (else SANDBOX_HOST_ADMISSION_SECRET; >= 32 bytes; required)\n"
          "  --broker-url URL              the one broker URL runs may use (else SANDBOX_BROKER_URL)\n"
          "  --ca-file F                   https broker: PEM CAs instead of the system store\n"
          "  --broker-admin-url URL        the broker's admin listener, for runs with net and no bindings\n"
          "                                (else SANDBOX_BROKER_ADMIN_URL)\n"
          "  --net-mint-secret-file F      the broker's net-mint credential (else SANDBOX_NET_MINT_SECRET)\n"
          "  --deno PATH                   the Deno binary (else DENO_BIN, else deno on PATH)\n"
          "  --max-runs N                  runs at once (default: online CPUs x 2); beyond it 503\n"
          "  --max-connections N           open client connections (default 256)\n"
          "  --pool-size N                 guests kept started per memory class, waiting for a run (default 2; 0: none)\n"
          "  --pool-memory-mb LIST         the memory classes of the pool, memoryMb values (default 128)\n"
          "  --log-file F                  append the log to F instead of stderr (reopened on SIGUSR1 and SIGHUP)\n"
          "  --jail on|off                 the kernel jail around every guest (default on; off is logged)\n"
          "  --jail-uid-base N, --jail-slots N, --jail-nproc N, --jail-fsize-mb N, --jail-cgroup DIR,\n"
          "  --jail-lock-file F            as for `sandbox-shim run` (supervisor-shim/README.md, \"The jail\")\n"
          "  --check-config                check everything start-up checks (Deno started once as a guest), print\n"
          "                                \"configuration OK\" and exit 0; 2 when something is wrong\n"
          "Signals: SIGTERM and SIGINT drain the runs in flight and stop; SIGUSR1 reopens --log-file; SIGHUP\n"
          "reopens it and re-reads the secret files (everything else needs a restart, and the log says so);\n"
          "SIGUSR2 and SIGALRM are logged and ignored.\n",
          f);
}

int sb_serve_log_open(const char *path, char *err, size_t errsz)
{
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY, 0600);

    if (fd < 0) {
        snprintf(err, errsz, "cannot open the log file %s: %s", path, strerror(errno));
        return -1;
    }
    fflush(stderr);
    if (fd != 2 && dup2(fd, 2) < 0) {
        snprintf(err, errsz, "cannot open the log file %s: dup2: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (fd != 2)
        close(fd);
    return 0;
}

int sb_serve_configure(int argc, char **argv, sb_serve_settings_t *set, char *admission, size_t admsz, int *check_only)
{
    const char *listen = NULL, *broker = NULL, *ca = NULL, *admin = NULL, *deno = NULL, *adm_file = NULL, *mint_file = NULL;
    const char *why = NULL, *env, *broker_src = "--broker-url", *admin_src = "--broker-admin-url", *deno_src = "--deno";
    unsigned long v;
    long cpus;
    char lbuf[32], err[2048];
    sb_shim_jail_config_t jc;

    cpus = sysconf(_SC_NPROCESSORS_ONLN);
    set->max_runs = cpus > 0 && cpus < 4096 ? (unsigned)cpus * 2u : 2u;
    set->max_connections = DEFAULT_MAX_CONNECTIONS;
    set->pool.size = SB_SERVE_POOL_DEFAULT_SIZE;
    set->pool.nclasses = 1;
    set->pool.class_mb[0] = SB_SERVE_DEFAULT_MEMORY_MB;
    sb_shim_jail_config_init(&jc);
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return -1;
        }
        if (strcmp(a, "--check-config") == 0) {
            *check_only = 1;
            continue;
        }
        if (strncmp(a, "--jail=", 7) == 0) {
            if (sb_shim_jail_config_option(&jc, a, NULL, &why) < 0)
                return sb_serve_fail_usage("%s", why);
            continue;
        }
        if (val == NULL)
            return sb_serve_fail_usage("%s needs a value", a);
        ++i;
        if (strcmp(a, "--listen") == 0)
            listen = val;
        else if (strcmp(a, "--broker-url") == 0)
            broker = val;
        else if (strcmp(a, "--ca-file") == 0)
            ca = val;
        else if (strcmp(a, "--broker-admin-url") == 0)
            admin = val;
        else if (strcmp(a, "--admission-secret-file") == 0)
            adm_file = val;
        else if (strcmp(a, "--net-mint-secret-file") == 0)
            mint_file = val;
        else if (strcmp(a, "--deno") == 0)
            deno = val;
        else if (strcmp(a, "--log-file") == 0)
            set->log_path = val;
        else if (strcmp(a, "--max-runs") == 0) {
            if (parse_uint(val, 1, 4096, &v) != 0)
                return sb_serve_fail_usage("--max-runs wants 1..4096, not \"%s\"", val);
            set->max_runs = (unsigned)v;
        } else if (strcmp(a, "--pool-size") == 0) {
            if (parse_uint(val, 0, SB_SERVE_POOL_MAX_SIZE, &v) != 0)
                return sb_serve_fail_usage("--pool-size wants 0..64, not \"%s\"", val);
            set->pool.size = (unsigned)v;
        } else if (strcmp(a, "--pool-memory-mb") == 0) {
            if (sb_serve_pool_parse_classes(val, &set->pool, &why) != 0)
                return sb_serve_fail_usage("%s", why);
        } else if (strcmp(a, "--max-connections") == 0) {
            if (parse_uint(val, 1, 100000, &v) != 0)
                return sb_serve_fail_usage("--max-connections wants 1..100000, not \"%s\"", val);
            set->max_connections = (unsigned)v;
        } else {
            int jr = sb_shim_jail_config_option(&jc, a, val, &why);
            if (jr < 0)
                return sb_serve_fail_usage("%s", why);
            if (jr == 0)
                return sb_serve_fail_usage("unknown option %s", a);
        }
    }

    /* the admission secret first: no other mistake may leave it in the environment */
    if (sb_serve_read_secret(adm_file, "SANDBOX_HOST_ADMISSION_SECRET", admission, admsz, "host admission secret", err,
                             sizeof(err)) != 0 ||
        sb_serve_check_admission(admission, adm_file, err, sizeof(err)) != 0 ||
        sb_serve_read_secret(mint_file, "SANDBOX_NET_MINT_SECRET", set->conf.netmint.secret, sizeof(set->conf.netmint.secret),
                             "net-mint secret", err, sizeof(err)) != 0)
        return sb_serve_fail_usage("%s", err);
    set->adm_file = adm_file;
    set->mint_file = mint_file;

    if (listen == NULL) {
        const char *port = getenv("PORT");
        if (port != NULL && parse_uint(port, 0, 65535, &v) != 0)
            return sb_serve_fail_usage("PORT wants 0..65535, not \"%s\"", port);
        snprintf(lbuf, sizeof(lbuf), "127.0.0.1:%lu", port != NULL ? v : (unsigned long)DEFAULT_PORT);
        listen = lbuf;
    }
    if (sb_parse_listen_addr(listen, &set->listen_addr, &set->listen_len) != 0)
        return sb_serve_fail_usage("--listen wants HOST:PORT with a numeric host, not \"%s\"", listen);

    if (broker == NULL && (env = getenv("SANDBOX_BROKER_URL")) != NULL && *env != '\0') {
        broker = env;
        broker_src = "SANDBOX_BROKER_URL";
    }
    if (broker != NULL) {
        char *dup = sb_mem_try_strdup(broker), *b = dup != NULL ? trim(dup) : NULL;
        if (b == NULL || sb_shim_url_parse(b, &set->conf.broker, &why) != SB_OK) {
            snprintf(err, sizeof(err), "%s: %s", broker_src, why != NULL ? why : "out of memory");
            sb_mem_free(dup);
            return sb_serve_fail_usage("%s", err);
        }
        sb_mem_free(dup);
        if (sb_shim_url_resolve(&set->conf.broker, &set->conf.broker_addr, &set->conf.broker_addr_len, &why) != SB_OK) {
            snprintf(err, sizeof(err), "%s: cannot resolve the broker host: %s", broker_src, why);
            return sb_serve_fail_usage("%s", err);
        }
        if (set->conf.broker.https && (set->conf.tls = sb_shim_tls_ctx_new(ca, err, sizeof(err))) == NULL)
            return sb_serve_fail_usage("%s", err);
        set->conf.have_broker = 1;
    }
    if (ca != NULL && (broker == NULL || !set->conf.broker.https))
        return sb_serve_fail_usage("--ca-file needs an https:// broker URL%s", "");

    if (admin == NULL && (env = getenv("SANDBOX_BROKER_ADMIN_URL")) != NULL && *env != '\0') {
        admin = env;
        admin_src = "SANDBOX_BROKER_ADMIN_URL";
    }
    if (admin != NULL) {
        sb_shim_netmint_t *nm = &set->conf.netmint;
        if (sb_shim_url_parse(admin, &nm->url, &why) != SB_OK) {
            snprintf(err, sizeof(err), "%s: %s", admin_src, why);
            return sb_serve_fail_usage("%s", err);
        }
        if (nm->url.https || strcmp(nm->url.target, "/") != 0) {
            snprintf(err, sizeof(err),
                     "%s must be http://HOST:PORT (the admin listener is plain HTTP, on a private address), not \"%s\"", admin_src,
                     admin);
            return sb_serve_fail_usage("%s", err);
        }
        if (sb_shim_url_resolve(&nm->url, &nm->addr, &nm->addr_len, &why) != SB_OK) {
            snprintf(err, sizeof(err), "%s: cannot resolve the broker admin host: %s", admin_src, why);
            return sb_serve_fail_usage("%s", err);
        }
        if (nm->secret[0] == '\0')
            return sb_serve_fail_usage("%s needs SANDBOX_NET_MINT_SECRET (or --net-mint-secret-file)", admin_src);
        if (!set->conf.have_broker)
            return sb_serve_fail_usage("%s needs SANDBOX_BROKER_URL (or --broker-url): network tokens are used there", admin_src);
        set->conf.have_netmint = 1;
    } else if (set->conf.netmint.secret[0] != '\0') {
        return sb_serve_fail_usage(
            mint_file != NULL ? "--net-mint-secret-file is given without SANDBOX_BROKER_ADMIN_URL (or --broker-admin-url)%s"
                              : "SANDBOX_NET_MINT_SECRET is given without SANDBOX_BROKER_ADMIN_URL (or --broker-admin-url)%s",
            "");
    }

    /*
     * The jail, once for every run (runner.c puts it around each guest): the seccomp filter is
     * compiled and the configuration checked here, and one jailed guest is started, so that a
     * kernel that refuses namespaces or seccomp stops the service now rather than failing runs.
     */
    if ((set->conf.deno.jail = sb_shim_jail_new(&jc, err, sizeof(err))) == NULL ||
        sb_shim_jail_probe(set->conf.deno.jail, err, sizeof(err)) != SB_OK)
        return sb_serve_fail_usage(strstr(err, "--jail=off") != NULL
                                       ? "%s; serve does not start"
                                       : "%s; serve does not start (--jail=off runs the guests without the jail)",
                                   err);

    /* Deno, started once as every guest will be: in the jail, as a guest's uid */
    if (deno == NULL && (env = getenv("DENO_BIN")) != NULL && *env != '\0') {
        deno = env;
        deno_src = "DENO_BIN";
    }
    if (check_deno(set, deno != NULL ? deno : "deno", deno != NULL ? deno_src : NULL, &jc, err, sizeof(err)) != 0)
        return sb_serve_fail_usage("%s; serve does not start", err);
    if ((set->conf.deno.runtime_url = sb_shim_runtime_url()) == NULL)
        return sb_serve_fail_usage("out of memory%s", "");
    return 0;
}
