/*
 * One run of a Deno guest (see runner.h).
 */
#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "sb/buf.h"
#include "sb/mem.h"
#include "sb/value.h"
#include "jail/hooks.h"
#include "guest/runner.h"
#include "runtime_js.h"

#define RUNTIME_URL_PREFIX "data:application/javascript;base64,"

char *sb_shim_runtime_url(void)
{
    size_t pre = sizeof(RUNTIME_URL_PREFIX) - 1, n = sb_b64_encoded_len(sizeof(sb_shim_runtime_js));
    char *url = sb_mem_try_alloc(pre + n + 1);

    if (url == NULL)
        return NULL;
    memcpy(url, RUNTIME_URL_PREFIX, pre);
    sb_b64_encode(sb_shim_runtime_js, sizeof(sb_shim_runtime_js), url + pre);
    return url;
}

char *sb_shim_find_exe(const char *name)
{
    const char *path = getenv("PATH");
    char *buf;

    if (strchr(name, '/') != NULL)
        return sb_mem_try_strdup(name);
    if (path == NULL)
        path = "/usr/local/bin:/usr/bin:/bin";
    if ((buf = sb_mem_try_alloc(PATH_MAX)) == NULL)
        return NULL;
    while (*path != '\0') {
        const char *end = strchr(path, ':');
        size_t n = end != NULL ? (size_t)(end - path) : strlen(path);
        if (n != 0 && n + 1 + strlen(name) < PATH_MAX) {
            memcpy(buf, path, n);
            buf[n] = '/';
            memcpy(buf + n + 1, name, strlen(name) + 1);
            if (access(buf, X_OK) == 0)
                return buf;
        }
        path += n;
        if (*path == ':')
            ++path;
    }
    sb_mem_free(buf);
    return NULL;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    (void)remove(path);
    return 0;
}

/* Removes the --jail=off work directory, which only this process and its unjailed guest wrote. */
static void remove_workdir(const char *workdir)
{
    (void)nftw(workdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}

/* appends the base64 of `len` bytes */
static sb_status_t base64_append(sb_buf_t *b, const uint8_t *p, size_t len)
{
    size_t n = sb_b64_encoded_len(len);
    char *tmp = sb_mem_try_alloc(n + 1);
    sb_status_t st;

    if (tmp == NULL)
        return SB_E_NOMEM;
    sb_b64_encode(p, len, tmp);
    st = sb_buf_append(b, tmp, n);
    sb_mem_free(tmp);
    return st;
}

/* Deno's two flags for a run with imports, and the ports of its listeners (origin i on port i, relay/modules.h) */
static sb_status_t import_flags(const sb_shim_imports_t *im, char **allow, char **map, uint16_t *ports)
{
    sb_buf_t a, m, j;
    sb_status_t st;

    sb_buf_init(&a, 64u * 1024u);
    sb_buf_init(&m, 64u * 1024u);
    sb_buf_init(&j, 32u * 1024u);
    /* the map as a data: URL, so that Deno reads no file */
    if ((st = sb_buf_append_str(&a, "--allow-import=")) == SB_OK && (st = sb_shim_imports_allow(im, &a)) == SB_OK &&
        (st = sb_buf_append(&a, "", 1)) == SB_OK && (st = sb_shim_imports_map(im, &j)) == SB_OK &&
        (st = sb_buf_append_str(&m, "--import-map=data:application/json;base64,")) == SB_OK &&
        (st = base64_append(&m, (const uint8_t *)j.base, j.len)) == SB_OK && (st = sb_buf_append(&m, "", 1)) == SB_OK &&
        (st = sb_buf_take(&a, allow, NULL)) == SB_OK && (st = sb_buf_take(&m, map, NULL)) == SB_OK) {
        for (unsigned i = 0; i < im->n; ++i)
            ports[i] = sb_shim_import_port(i);
    }
    sb_buf_free(&a);
    sb_buf_free(&m);
    sb_buf_free(&j);
    if (st != SB_OK) {
        sb_mem_free(*allow);
        *allow = NULL;
    }
    return st;
}

sb_status_t sb_shim_deno_start(const sb_shim_deno_t *d, void *scrub, size_t scrub_len, sb_shim_guest_t *g, char *err, size_t errsz)
{
    const char *base = getenv("TMPDIR");
    int jailed = sb_shim_jail_enabled(d->jail);
    char v8flags[128], e_home[300], e_denodir[320], e_tmp[300], why[400];
    char *argv[24], *envp[8], *allow = NULL, *map = NULL;
    uint16_t ports[SB_SHIM_MAX_IMPORT_ORIGINS];
    unsigned nports = d->imports != NULL ? d->imports->n : 0;
    sb_status_t st = SB_E_EXECUTION;
    sb_shim_spawn_t sp;
    uint64_t jail_failures;
    size_t a = 0, e = 0;

    memset(g, 0, sizeof(*g));
    g->child.pid = -1;
    if (nports != 0 && !jailed) {
        /* the listeners must exist only where the guest is: its own network namespace */
        snprintf(err, errsz, "remote module imports need the jail (its network namespace); refused with --jail=off");
        return SB_E_EXECUTION;
    }
    if (nports != 0 && import_flags(d->imports, &allow, &map, ports) != SB_OK) {
        snprintf(err, errsz, "out of memory");
        return SB_E_NOMEM;
    }
    /*
     * Jailed, the guest's HOME, DENO_DIR and TMPDIR are in /work, the scratch tmpfs of its own root
     * (jail/mounts.c), which goes with it: nothing is made on the host. Only --jail=off still needs a
     * private directory on the host, 0700 and removed afterwards.
     */
    if (!jailed) {
        if (base == NULL || base[0] != '/' || strlen(base) > 200)
            base = "/tmp";
        snprintf(g->workdir, sizeof(g->workdir), "%s/sb-shim-XXXXXX", base);
        if (mkdtemp(g->workdir) == NULL) {
            g->workdir[0] = '\0';
            snprintf(err, errsz, "failed to create sandbox work root");
            goto Exit;
        }
        snprintf(g->home, sizeof(g->home), "%s/home", g->workdir);
        if (mkdir(g->home, 0700) != 0) {
            snprintf(err, errsz, "failed to create sandbox work root");
            remove_workdir(g->workdir);
            g->workdir[0] = '\0';
            goto Exit;
        }
    } else {
        snprintf(g->home, sizeof(g->home), "/work");
    }
    /*
     * The heap cap, and no SharedArrayBuffer global in any context (the guest's, a node:vm
     * context's, a worker's): V8 offers it then only where the embedder's per-context callback
     * says so, and Deno sets none. WebAssembly's shared memories are the runtime's to close.
     */
    snprintf(v8flags, sizeof(v8flags), "--v8-flags=--max-old-space-size=%lu,--enable-sharedarraybuffer-per-context", d->memory_mb);
    /*
     * No --allow-* at all: with --no-prompt every permission check fails.
     * The explicit --deny-* flags keep it that way should a config file or a
     * future default grant something; --no-remote/--no-npm stop module
     * fetches, --no-config/--no-lock stop Deno from reading project files.
     * argv[0] is a fixed name (process.argv0 shows it), not the host path.
     */
    argv[a++] = "/runtime/deno";
    argv[a++] = "run";
    argv[a++] = "--no-prompt";
    argv[a++] = "--no-config";
    argv[a++] = "--no-lock";
    argv[a++] = "--no-npm";
    if (nports == 0) {
        argv[a++] = "--no-remote";
    } else {
        /* modules of the run's import origins only, from their listeners on the guest's own loopback, where the
         * import map sends each origin (relay/modules.h); any other remote module is refused by Deno */
        argv[a++] = allow;
        argv[a++] = map;
    }
    argv[a++] = "--no-code-cache";
    argv[a++] = "--deny-read";
    argv[a++] = "--deny-write";
    argv[a++] = "--deny-net";
    argv[a++] = "--deny-env";
    argv[a++] = "--deny-run";
    argv[a++] = "--deny-ffi";
    argv[a++] = "--deny-sys";
    argv[a++] = v8flags;
    argv[a++] = (char *)d->runtime_url;
    argv[a] = NULL;
    snprintf(e_home, sizeof(e_home), "HOME=%s", g->home);
    snprintf(e_denodir, sizeof(e_denodir), "DENO_DIR=%s/%s", g->home, jailed ? ".deno" : "deno");
    snprintf(e_tmp, sizeof(e_tmp), "TMPDIR=%s", g->home);
    envp[e++] = e_home;
    envp[e++] = e_denodir;
    envp[e++] = e_tmp;
    envp[e++] = "NO_COLOR=1";
    envp[e++] = "DENO_NO_UPDATE_CHECK=1";
    envp[e++] = "DENO_NO_PROMPT=1";
    envp[e] = NULL;

    /* every guest, run's and serve's, cold or pooled, starts here: the one place the spawn is described */
    memset(&sp, 0, sizeof(sp));
    sp.path = d->exe;
    sp.argv = argv;
    sp.envp = envp;
    sp.cwd = jailed ? "/work" : "/"; /* Deno.cwd() reads /work either way (runtime.js), as upstream's guest */
    sp.nofile = SB_SHIM_GUEST_NOFILE;
    sp.jail = d->jail;
    sp.memory_mb = (unsigned)d->memory_mb;
    sp.root_exe = "/runtime/deno"; /* argv[0], and what Deno.execPath() reads */
    /* RLIMIT_CPU's base; a guest started before its run gets the longest, lowered at the hand-over */
    sp.timeout_ms = d->timeout_ms;
    sp.threads_only = 1; /* Deno runs with --deny-run: a process of its own would be a second RLIMIT_DATA */
    /* the child's copy of our memory is wiped of the token first (its own copy: ours stays) */
    sp.scrub = scrub;
    sp.scrub_len = scrub_len;
    if (nports != 0) {
        sp.listen_ports = ports;
        sp.nlisten = nports;
        sp.threads_only = SB_SHIM_JAIL_FILTER_LOOPBACK;
    }
    jail_failures = sb_shim_jail_failures();
    if (sb_shim_child_spawn(&sp, &g->child, why, sizeof(why)) != SB_OK) {
        /* the jail counts each guest it refused once (jail.h): those are serve's jail failures */
        if (sb_shim_jail_failures() != jail_failures)
            sb_shim_hook_jail_failure();
        snprintf(err, errsz, "failed to spawn sandbox subprocess: %s", why);
        g->child.pid = -1;
        if (g->workdir[0] != '\0')
            remove_workdir(g->workdir);
        g->workdir[0] = '\0';
        goto Exit;
    }
    g->started = 1;
    st = SB_OK;
Exit:
    sb_mem_free(allow);
    sb_mem_free(map);
    return st;
}

/*
 * The guest and everything it started are gone (`reaped`: the relay reaped it), or are killed and
 * reaped now; a jailed one took its PID and mount namespaces, and so its scratch, with it. Then the
 * --jail=off directory goes, and the jail gives its uid and cgroup back (sb_shim_child_close).
 */
static void guest_release(sb_shim_guest_t *g, int reaped)
{
    if (g->started && !reaped && g->child.pid > 0) {
        sb_shim_child_signal(&g->child, SIGKILL);
        while (waitpid(g->child.pid, NULL, 0) < 0 && errno == EINTR)
            ;
    }
    if (g->workdir[0] != '\0')
        remove_workdir(g->workdir);
    g->workdir[0] = '\0';
    if (g->started)
        sb_shim_child_close(&g->child);
    g->started = 0;
}

sb_status_t sb_shim_deno_relay(sb_shim_guest_t *g, const sb_shim_config_t *cfg, const uint8_t *init, size_t init_len,
                               json_t **outcome)
{
    sb_status_t st;

    *outcome = NULL;
    st = sb_shim_relay_run(cfg, &g->child, init, init_len, outcome);
    g->reaped = 1; /* the relay reaped the guest; a jailed one took its PID namespace with it */
    return st;
}

void sb_shim_deno_release(sb_shim_guest_t *g)
{
    guest_release(g, g->reaped);
}

void sb_shim_deno_discard(sb_shim_guest_t *g)
{
    guest_release(g, g->reaped);
}

sb_status_t sb_shim_deno_run(const sb_shim_deno_t *d, const sb_shim_config_t *cfg, const uint8_t *init, size_t init_len,
                             sb_shim_on_spawned_cb on_spawned, void *arg, json_t **outcome, char *err, size_t errsz)
{
    sb_shim_guest_t g;
    sb_status_t st;

    sb_shim_deno_t dd = *d;

    *outcome = NULL;
    dd.timeout_ms = (unsigned)cfg->timeout_ms;
    if ((st = sb_shim_deno_start(&dd, (void *)cfg->token, sizeof(cfg->token), &g, err, errsz)) != SB_OK)
        return st;
    if (on_spawned != NULL)
        on_spawned(arg, &g.child);
    st = sb_shim_deno_relay(&g, cfg, init, init_len, outcome);
    sb_shim_deno_release(&g);
    return st;
}
