/*
 * sandbox-shim: the supervisor-side relay between a guest speaking length-
 * prefixed msgpack frames on stdio and the broker (README.md, proto/PROTOCOL.md section 2).
 *
 *   sandbox-shim run   --broker-url URL (--token-env NAME | --token-fd N) --source FILE [options]
 *   sandbox-shim relay --broker-url URL (--token-env NAME | --token-fd N) [options] -- CMD ARGS...
 *   sandbox-shim serve [options]   (serve.c: the HTTP service, one run per request)
 *   sandbox-shim jail-check [jail options]
 *   sandbox-shim --version | --help
 *
 * This file parses the command line, reads the token, resolves the broker,
 * starts the guest (for `run`: runner.c, the same path serve takes) and
 * prints the one JSON line of the outcome.
 * It links proto/ only; nothing from broker/.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <jansson.h>
#include <msgpack.h>
#include "sb/mem.h"
#include "sb/frame.h"
#include "sb/limits.h"
#include "sb/value.h"
#include "sb/buf.h"
#include "jail/child.h"
#include "jail/jail.h"
#include "relay/relay.h"
#include "guest/runner.h"
#include "serve/serve.h"
#include "relay/url.h"
#include "sb_build_info.h"

#define EXIT_USAGE 2
/* guest source and input travel in the init frame; both fit in SB_MAX_FRAME with room to spare */
#define SB_SHIM_MAX_SOURCE (4u * 1024u * 1024u)
#define SB_SHIM_MAX_INPUT (1024u * 1024u)
#define SB_SHIM_DEFAULT_MEMORY_MB 256u

extern char **environ;

typedef struct st_opts_t {
    int run; /* 1: run (spawn Deno), 0: relay */
    const char *broker_url;
    const char *token_env;
    long token_fd;
    const char *source;
    const char *input;
    const char *input_file;
    const char *deno;
    const char *ca_file;
    unsigned long memory_mb;
    int memory_set;
    sb_shim_jail_config_t jail;
    char **cmd;                /* relay: CMD ARGS... */
    sb_shim_imports_t imports; /* run: --import, the run's capabilities.import (relay/modules.h) */
} opts_t;

static void usage(FILE *f)
{
    fputs("usage:\n"
          "  sandbox-shim run   --broker-url URL (--token-env NAME | --token-fd N) --source FILE\n"
          "                     [--input JSON | --input-file F] [--memory-mb N] [--deno PATH]\n"
          "                     [--import HOST[:PORT],...] [limits]\n"
          "  sandbox-shim relay --broker-url URL (--token-env NAME | --token-fd N)\n"
          "                     [--source FILE] [--input JSON | --input-file F] [limits] -- CMD ARGS...\n"
          "  sandbox-shim jail-check [jail options]   (starts one jailed probe guest; exit 0 when it worked)\n"
          "  sandbox-shim serve [--listen HOST:PORT] ... [--check-config] (sandbox-shim serve --help)\n"
          "  sandbox-shim --version | --help\n"
          "limits: [--timeout-ms N] [--max-calls N] [--max-inflight N] [--call-timeout-ms N]\n"
          "        [--on-denial terminate|reply] [--memory-mb N]\n"
          "jail (on by default): [--jail on|off] [--jail-uid-base N] [--jail-slots N] [--jail-nproc N]\n"
          "        [--jail-fsize-mb N] [--jail-cgroup DIR] [--jail-lock-file F]\n"
          "https brokers: [--ca-file F] (PEM CAs to trust instead of the system store)\n"
          "Prints one JSON line {ok, output?, error?, logs, timedOut?, ms, calls}; exit 0 when a run completed,\n"
          "2 for usage or configuration errors.\n",
          f);
}

static int fail_usage(const char *fmt, const char *arg)
{
    fputs("sandbox-shim: ", stderr);
    fprintf(stderr, fmt, arg != NULL ? arg : "");
    fputc('\n', stderr);
    return EXIT_USAGE;
}

/* strict decimal in [min, max]; no sign, no spaces, no trailing bytes */
static int parse_num(const char *s, unsigned long long min, unsigned long long max, unsigned long long *out)
{
    unsigned long long v = 0;

    if (s == NULL || *s == '\0' || strlen(s) > 12)
        return -1;
    for (const char *p = s; *p != '\0'; ++p) {
        if (*p < '0' || *p > '9')
            return -1;
        v = v * 10 + (unsigned long long)(*p - '0');
    }
    if (v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

static int valid_token(const char *t, size_t n)
{
    if (n != 64)
        return 0;
    for (size_t i = 0; i < n; ++i)
        if (!((t[i] >= '0' && t[i] <= '9') || (t[i] >= 'a' && t[i] <= 'f')))
            return 0;
    return 1;
}

/*
 * Reads the token once. From an environment variable, the value is copied,
 * then overwritten in place and the variable removed: unsetenv alone would
 * leave the bytes in the initial environment block that /proc/<pid>/environ
 * shows. From a descriptor, the descriptor is closed after reading.
 */
static int read_token(const opts_t *o, char *token)
{
    char buf[80];
    size_t n = 0;

    if (o->token_env != NULL) {
        char *v = getenv(o->token_env);
        if (v == NULL)
            return fail_usage("token variable %s is not set", o->token_env);
        n = strlen(v);
        if (n < sizeof(buf))
            memcpy(buf, v, n);
        explicit_bzero(v, n);
        if (unsetenv(o->token_env) != 0)
            return fail_usage("cannot remove %s from the environment", o->token_env);
    } else {
        int fd = (int)o->token_fd;
        ssize_t r;
        while (n < sizeof(buf)) {
            r = read(fd, buf + n, sizeof(buf) - n);
            if (r < 0 && errno == EINTR)
                continue;
            if (r < 0) {
                close(fd);
                return fail_usage("cannot read the token descriptor: %s", strerror(errno));
            }
            if (r == 0)
                break;
            n += (size_t)r;
        }
        close(fd);
        while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
            --n;
    }
    if (n >= sizeof(buf) || !valid_token(buf, n)) {
        explicit_bzero(buf, sizeof(buf));
        return fail_usage("the token must be 64 lowercase hex characters%s", "");
    }
    memcpy(token, buf, 64);
    token[64] = '\0';
    explicit_bzero(buf, sizeof(buf));
    return 0;
}

static int parse_args(int argc, char **argv, opts_t *o, sb_shim_config_t *cfg)
{
    unsigned long long v;
    int i;

    memset(o, 0, sizeof(*o));
    sb_shim_jail_config_init(&o->jail);
    o->token_fd = -1;
    o->memory_mb = SB_SHIM_DEFAULT_MEMORY_MB;
    cfg->timeout_ms = SB_SHIM_DEFAULT_TIMEOUT_MS;
    cfg->call_timeout_ms = SB_SHIM_DEFAULT_CALL_TIMEOUT_MS;
    cfg->max_calls = SB_SHIM_DEFAULT_MAX_CALLS;
    cfg->max_inflight = SB_SHIM_DEFAULT_MAX_INFLIGHT;
    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(stdout);
        return -1;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("sandbox-shim %s (commit %s)\n", SB_VERSION, SB_GIT_COMMIT);
        return -1;
    }
    if (strcmp(argv[1], "run") == 0)
        o->run = 1;
    else if (strcmp(argv[1], "relay") != 0)
        return fail_usage("unknown mode \"%s\" (want run, relay, serve or jail-check; --help lists them)", argv[1]);

    for (i = 2; i < argc; ++i) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--") == 0) {
            ++i;
            break;
        }
        if (strcmp(a, "--help") == 0) {
            usage(stdout);
            return -1;
        }
        if (strncmp(a, "--", 2) != 0)
            return fail_usage("unexpected argument \"%s\"", a);
        if (strncmp(a, "--jail=", 7) == 0) {
            const char *why = NULL;
            if (sb_shim_jail_config_option(&o->jail, a, NULL, &why) < 0)
                return fail_usage("%s", why);
            continue;
        }
        if (val == NULL)
            return fail_usage("%s needs a value", a);
        ++i;
        if (strcmp(a, "--broker-url") == 0) {
            o->broker_url = val;
        } else if (strcmp(a, "--token-env") == 0) {
            o->token_env = val;
        } else if (strcmp(a, "--token-fd") == 0) {
            if (parse_num(val, 0, INT_MAX, &v) != 0)
                return fail_usage("--token-fd wants a descriptor number, not \"%s\"", val);
            o->token_fd = (long)v;
        } else if (strcmp(a, "--timeout-ms") == 0) {
            if (parse_num(val, 1, 3600000, &v) != 0)
                return fail_usage("--timeout-ms wants 1..3600000, not \"%s\"", val);
            cfg->timeout_ms = (int64_t)v;
        } else if (strcmp(a, "--call-timeout-ms") == 0) {
            if (parse_num(val, 1, 600000, &v) != 0)
                return fail_usage("--call-timeout-ms wants 1..600000, not \"%s\"", val);
            cfg->call_timeout_ms = (int64_t)v;
        } else if (strcmp(a, "--max-calls") == 0) {
            if (parse_num(val, 0, 1000000, &v) != 0)
                return fail_usage("--max-calls wants 0..1000000, not \"%s\"", val);
            cfg->max_calls = (unsigned)v;
        } else if (strcmp(a, "--max-inflight") == 0) {
            if (parse_num(val, 1, SB_SHIM_MAX_INFLIGHT_LIMIT, &v) != 0)
                return fail_usage("--max-inflight wants 1..256, not \"%s\"", val);
            cfg->max_inflight = (unsigned)v;
        } else if (strcmp(a, "--on-denial") == 0) {
            if (strcmp(val, "terminate") == 0)
                cfg->denial_reply = 0;
            else if (strcmp(val, "reply") == 0)
                cfg->denial_reply = 1;
            else
                return fail_usage("--on-denial wants terminate or reply, not \"%s\"", val);
        } else if (strcmp(a, "--ca-file") == 0) {
            o->ca_file = val;
        } else if (strcmp(a, "--source") == 0) {
            o->source = val;
        } else if (strcmp(a, "--input") == 0) {
            o->input = val;
        } else if (strcmp(a, "--input-file") == 0) {
            o->input_file = val;
        } else if (strcmp(a, "--memory-mb") == 0) {
            if (parse_num(val, 16, 16384, &v) != 0)
                return fail_usage("--memory-mb wants 16..16384, not \"%s\"", val);
            o->memory_mb = (unsigned long)v;
            o->memory_set = 1;
        } else if (strcmp(a, "--deno") == 0 && o->run) {
            o->deno = val;
        } else if (strcmp(a, "--import") == 0 && o->run) {
            /* the hosts the token's manifest lists under import, as upstream's capabilities.import */
            for (const char *p = val;;) {
                const char *end = strchr(p, ','), *why = NULL;
                size_t n = end != NULL ? (size_t)(end - p) : strlen(p);
                if (sb_shim_imports_add(&o->imports, p, n, &why) != 0)
                    return fail_usage("--import: %s", why);
                if (end == NULL)
                    break;
                p = end + 1;
            }
        } else {
            const char *why = NULL;
            int jr = sb_shim_jail_config_option(&o->jail, a, val, &why);
            if (jr < 0)
                return fail_usage("%s", why);
            if (jr == 0)
                return fail_usage("unknown option %s", a);
        }
    }
    if (o->run && i < argc)
        return fail_usage("run takes no command%s", "");
    if (!o->run) {
        if (i >= argc)
            return fail_usage("relay needs -- CMD ARGS...%s", "");
        o->cmd = &argv[i];
    }
    if (o->broker_url == NULL)
        return fail_usage("--broker-url is required%s", "");
    if ((o->token_env != NULL) == (o->token_fd >= 0))
        return fail_usage("exactly one of --token-env and --token-fd is required%s", "");
    if (o->run && o->source == NULL)
        return fail_usage("run needs --source FILE%s", "");
    if (o->input != NULL && o->input_file != NULL)
        return fail_usage("--input and --input-file are exclusive%s", "");
    return 0;
}

/* reads a whole file of at most `cap` bytes into `out` */
static int read_file(const char *path, size_t cap, sb_buf_t *out, const char *what)
{
    uint8_t tmp[65536];
    int fd = open(path, O_RDONLY | O_CLOEXEC), rc = 0;

    if (fd < 0)
        return fail_usage("cannot open %s", path);
    sb_buf_init(out, cap);
    for (;;) {
        ssize_t n = read(fd, tmp, sizeof(tmp));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = fail_usage("cannot read %s", path);
            break;
        }
        if (n == 0)
            break;
        if (sb_buf_append(out, tmp, (size_t)n) != SB_OK) {
            fprintf(stderr, "sandbox-shim: %s %s is larger than %zu bytes\n", what, path, cap);
            rc = EXIT_USAGE;
            break;
        }
    }
    close(fd);
    return rc;
}

/* the broker is resolved once, before the guest starts (url.h) */
static int resolve_broker(sb_shim_config_t *cfg)
{
    const char *why = NULL;

    if (sb_shim_url_resolve(&cfg->url, &cfg->addr, &cfg->addr_len, &why) != SB_OK)
        return fail_usage("cannot resolve the broker host: %s", why);
    return 0;
}

static void pack_cstr(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    (void)msgpack_pack_str(pk, n);
    (void)msgpack_pack_str_body(pk, s, n);
}

/* init frame: {t:"init", source?: str, input: any} (proto/PROTOCOL.md section 2) */
static int build_init(const opts_t *o, msgpack_sbuffer *frame)
{
    sb_buf_t src, in;
    msgpack_zone zone;
    msgpack_object input;
    int has_input = 0;
    msgpack_packer pk;
    const char *why = NULL;
    int rc = EXIT_USAGE;

    memset(&src, 0, sizeof(src));
    memset(&in, 0, sizeof(in));
    msgpack_zone_init(&zone, 4096);
    msgpack_sbuffer_init(frame);
    if (o->source != NULL && read_file(o->source, SB_SHIM_MAX_SOURCE, &src, "source") != 0)
        goto Exit;
    if (o->source != NULL && !sb_utf8_valid((const uint8_t *)src.base, src.len)) {
        fail_usage("source %s is not valid UTF-8", o->source);
        goto Exit;
    }
    if (o->input_file != NULL && read_file(o->input_file, SB_SHIM_MAX_INPUT, &in, "input") != 0)
        goto Exit;
    if (o->input != NULL) {
        if (strlen(o->input) > SB_SHIM_MAX_INPUT) {
            fail_usage("--input is larger than 1 MiB%s", "");
            goto Exit;
        }
        if (sb_buf_init(&in, SB_SHIM_MAX_INPUT), sb_buf_append_str(&in, o->input) != SB_OK) {
            fail_usage("out of memory%s", "");
            goto Exit;
        }
    }
    if (o->input != NULL || o->input_file != NULL) {
        /* the tree points into `in`, which lives until the frame is packed */
        if (sb_json_parse(in.base, in.len, &zone, &input, &why) != SB_OK) {
            fail_usage("input is not valid JSON (%s)", why != NULL ? why : "parse error");
            goto Exit;
        }
        has_input = 1;
    }
    (void)msgpack_sbuffer_write(frame, "\0\0\0\0", 4);
    msgpack_packer_init(&pk, frame, msgpack_sbuffer_write);
    (void)msgpack_pack_map(&pk, 2 + (o->source != NULL) + (o->imports.n != 0));
    pack_cstr(&pk, "t");
    pack_cstr(&pk, "init");
    if (o->source != NULL) {
        pack_cstr(&pk, "source");
        (void)msgpack_pack_str(&pk, src.len);
        (void)msgpack_pack_str_body(&pk, src.len != 0 ? src.base : "", src.len);
    }
    pack_cstr(&pk, "input");
    if (has_input)
        sb_mp_pack_object(&pk, &input);
    else
        (void)msgpack_pack_nil(&pk);
    if (o->imports.n != 0) {
        pack_cstr(&pk, "imports");
        sb_shim_imports_pack(&o->imports, &pk);
    }
    if (frame->data == NULL || frame->size - 4 > SB_MAX_FRAME) {
        fail_usage("source and input do not fit in one frame%s", "");
        goto Exit;
    }
    sb_frame_header((uint32_t)(frame->size - 4), (uint8_t *)frame->data);
    rc = 0;
Exit:
    msgpack_zone_destroy(&zone);
    sb_buf_free(&src);
    sb_buf_free(&in);
    return rc;
}

/*
 * `sandbox-shim jail-check [jail options]`: says what the jail applies on this machine and starts
 * one jailed probe guest (sb_shim_jail_probe), so an operator or a service unit's start-up check
 * learns that the kernel refuses it before any run does. Exit 0 when a guest could be jailed, 2 not.
 */
static int jail_check(int argc, char **argv)
{
    sb_shim_jail_config_t jc;
    sb_shim_jail_t *j;
    char err[512];
    int rc = 0;

    sb_shim_jail_config_init(&jc);
    for (int i = 2; i < argc; ++i) {
        const char *why = NULL, *val = strchr(argv[i], '=') == NULL && i + 1 < argc ? argv[i + 1] : NULL;
        int r = sb_shim_jail_config_option(&jc, argv[i], strncmp(argv[i], "--jail=", 7) == 0 ? NULL : val, &why);
        if (r < 0)
            return fail_usage("%s", why);
        if (r == 0)
            return fail_usage("jail-check: unknown option %s", argv[i]);
        if (strncmp(argv[i], "--jail=", 7) != 0)
            ++i;
    }
    if ((j = sb_shim_jail_new(&jc, err, sizeof(err))) == NULL)
        return fail_usage("%s", err);
    fprintf(stderr, "sandbox-shim: %s\n", sb_shim_jail_describe(j));
    if (sb_shim_jail_probe(j, err, sizeof(err)) != SB_OK)
        rc = fail_usage("%s", err);
    else
        fputs(sb_shim_jail_enabled(j) ? "jail-check: ok, a jailed guest started\n" : "jail-check: the jail is off\n", stdout);
    sb_shim_jail_free(j);
    return rc;
}

/* relay mode: the shim's environment minus anything that carries the token */
static char **relay_env(const char *token)
{
    size_t n = 0, k = 0;
    char **env;

    while (environ[n] != NULL)
        ++n;
    if ((env = sb_mem_try_calloc(n + 1, sizeof(*env))) == NULL)
        return NULL;
    for (size_t i = 0; i < n; ++i)
        if (strstr(environ[i], token) == NULL)
            env[k++] = environ[i];
    return env;
}

int main(int argc, char **argv)
{
    opts_t o;
    sb_shim_config_t cfg;
    msgpack_sbuffer init;
    sb_shim_child_t child;
    sb_shim_spawn_t sp;
    json_t *outcome = NULL;
    sb_shim_jail_t *jail = NULL;
    char *exe = NULL, **env = NULL, *dump = NULL, *runtime_url = NULL;
    char err[512];
    const char *why = NULL;
    int rc;

    /* no core dumps of the token, and /proc/<pid>/{environ,mem} closed to same-uid processes */
    (void)prctl(PR_SET_DUMPABLE, 0);
    signal(SIGPIPE, SIG_IGN);
    if (argc >= 2 && strcmp(argv[1], "serve") == 0)
        return sb_shim_serve_main(argc - 1, argv + 1);
    memset(&cfg, 0, sizeof(cfg));
    memset(&child, 0, sizeof(child));
    child.pid = -1;
    cfg.cancel_fd = cfg.stop_fd = -1;
    msgpack_sbuffer_init(&init);

    if (argc >= 2 && strcmp(argv[1], "jail-check") == 0)
        return jail_check(argc, argv);
    if ((rc = parse_args(argc, argv, &o, &cfg)) != 0)
        return rc < 0 ? 0 : rc;
    /* the token is read (and scrubbed) first, so that no early exit leaves it in the environment */
    if ((rc = read_token(&o, cfg.token)) != 0)
        goto Exit;
    if (sb_shim_url_parse(o.broker_url, &cfg.url, &why) != SB_OK) {
        rc = fail_usage("%s", why);
        goto Exit;
    }
    /*
     * The command line names the broker's route itself: a query there is a mistake (a token or a
     * channel pasted into the URL), refused before anything runs. serve's SANDBOX_BROKER_URL keeps
     * its query, as upstream pins one (PROTOCOL.md section 3, "The broker URL").
     */
    if (cfg.url.query[0] != '\0') {
        rc = fail_usage("--broker-url must not have a query%s", "");
        goto Exit;
    }
    if (cfg.url.https) {
        if ((cfg.tls = sb_shim_tls_ctx_new(o.ca_file, err, sizeof(err))) == NULL) {
            rc = fail_usage("%s", err);
            goto Exit;
        }
    } else if (o.ca_file != NULL) {
        /* a CA file with an http URL is a configuration mistake: the operator expects TLS */
        rc = fail_usage("--ca-file needs an https:// broker URL%s", "");
        goto Exit;
    }
    if ((rc = resolve_broker(&cfg)) != 0 || (rc = build_init(&o, &init)) != 0)
        goto Exit;
    /* the jail is checked before anything is spawned; what it applies (or that it is off) is said once */
    if ((jail = sb_shim_jail_new(&o.jail, err, sizeof(err))) == NULL) {
        rc = fail_usage("%s; refusing to start the guest (--jail=off runs it without the jail)", err);
        goto Exit;
    }
    fprintf(stderr, "sandbox-shim: %s\n", sb_shim_jail_describe(jail));

    if (o.run) {
        sb_shim_deno_t d;
        if ((exe = sb_shim_find_exe(o.deno != NULL ? o.deno : "deno")) == NULL) {
            rc = fail_usage("cannot find deno (use --deno PATH)%s", "");
            goto Exit;
        }
        if ((runtime_url = sb_shim_runtime_url()) == NULL) {
            rc = fail_usage("out of memory%s", "");
            goto Exit;
        }
        memset(&d, 0, sizeof(d));
        d.exe = exe;
        d.runtime_url = runtime_url;
        d.memory_mb = o.memory_mb;
        d.jail = jail;
        if (o.imports.n != 0) {
            d.imports = &o.imports;
            cfg.imports = &o.imports;
        }
        switch (sb_shim_deno_run(&d, &cfg, (const uint8_t *)init.data, init.size, NULL, NULL, &outcome, err, sizeof(err))) {
        case SB_OK:
            break;
        case SB_E_EXECUTION:
            rc = fail_usage("%s", err);
            goto Exit;
        default:
            rc = fail_usage("out of memory building the outcome%s", "");
            goto Exit;
        }
    } else {
        if ((exe = sb_shim_find_exe(o.cmd[0])) == NULL) {
            rc = fail_usage("cannot find %s", o.cmd[0]);
            goto Exit;
        }
        if ((env = relay_env(cfg.token)) == NULL) {
            rc = fail_usage("out of memory%s", "");
            goto Exit;
        }
        memset(&sp, 0, sizeof(sp));
        sp.nofile = SB_SHIM_GUEST_NOFILE;
        sp.jail = jail;
        sp.scrub = cfg.token;
        sp.scrub_len = sizeof(cfg.token);
        sp.memory_mb = o.memory_set ? (unsigned)o.memory_mb : 0;
        sp.path = exe;
        sp.argv = o.cmd;
        sp.envp = env;
        sp.root_system = 1; /* jailed: the host's /usr and the files named in the command, read-only */
        sp.timeout_ms = (unsigned)cfg.timeout_ms;
        if (sb_shim_child_spawn(&sp, &child, err, sizeof(err)) != SB_OK) {
            rc = fail_usage("%s", err);
            goto Exit;
        }
        if (sb_shim_relay_run(&cfg, &child, (const uint8_t *)init.data, init.size, &outcome) != SB_OK) {
            rc = fail_usage("out of memory building the outcome%s", "");
            goto Exit;
        }
    }
    if ((dump = json_dumps(outcome, JSON_COMPACT)) == NULL) {
        rc = fail_usage("out of memory building the outcome%s", "");
        goto Exit;
    }
    fputs(dump, stdout);
    fputc('\n', stdout);
    rc = fflush(stdout) == 0 ? 0 : 1;
Exit:
    sb_shim_child_close(&child);
    sb_shim_jail_free(jail);
    explicit_bzero(cfg.token, sizeof(cfg.token));
    SSL_CTX_free(cfg.tls);
    sb_mem_free_foreign(dump);
    json_decref(outcome);
    sb_mem_free(env);
    sb_mem_free(exe);
    sb_mem_free(runtime_url);
    msgpack_sbuffer_destroy(&init);
    return rc;
}
