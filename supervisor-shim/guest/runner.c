/*
 * One run of a Deno guest (see runner.h).
 */
#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
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

static _Thread_local int unreadable_seen;

/* a directory of the guest's becomes ours again, 0700, so that it can be emptied without CAP_DAC_OVERRIDE */
static int take_back(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)ftw;
    if (flag != FTW_D && flag != FTW_DNR)
        return 0;
    if (sb->st_uid != geteuid() || sb->st_gid != getegid())
        (void)lchown(path, geteuid(), getegid());
    if ((sb->st_mode & 07777) != 0700)
        (void)chmod(path, 0700); /* FTW_PHYS: a directory, not a link to one; its guest is gone */
    if (flag == FTW_DNR)
        unreadable_seen = 1;
    return 0;
}

/*
 * Removes the work directory. Called once the guest and everything it started are gone and before
 * the jail gives its uid back (sb_shim_child_close), so no process of that uid can change the tree
 * under us. The directories the guest made are taken back first, a level deeper on each pass for
 * those it had made unreadable.
 */
static void remove_workdir(const char *workdir, const char *home)
{
    for (int pass = 0; pass < 16; ++pass) {
        unreadable_seen = 0;
        (void)nftw(home, take_back, 16, FTW_PHYS | FTW_MOUNT);
        if (!unreadable_seen)
            break;
    }
    (void)nftw(workdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}

/* 1 when a guest running as another uid can traverse `dir` and every directory above it */
static int reachable(const char *dir)
{
    char walk[256];
    struct stat st;

    snprintf(walk, sizeof(walk), "%s", dir);
    for (char *slash = walk + strlen(walk); slash > walk; slash = strrchr(walk, '/')) {
        *slash = '\0';
        if (stat(walk[0] != '\0' ? walk : "/", &st) != 0 || (st.st_mode & S_IXOTH) == 0)
            return 0;
    }
    return 1;
}

sb_status_t sb_shim_deno_run(const sb_shim_deno_t *d, const sb_shim_config_t *cfg, const uint8_t *init, size_t init_len,
                             sb_shim_on_spawned_cb on_spawned, void *arg, json_t **outcome, char *err, size_t errsz)
{
    const char *base = getenv("TMPDIR");
    int jailed = sb_shim_jail_enabled(d->jail);
    char workdir[256], home[270], v8flags[64], e_home[300], e_denodir[320], e_tmp[300], why[400];
    char *argv[24], *envp[8];
    sb_shim_spawn_t sp;
    sb_shim_child_t child;
    sb_status_t st;
    uint64_t jail_failures;
    size_t a = 0, e = 0;

    *outcome = NULL;
    if (base == NULL || base[0] != '/' || strlen(base) > 200)
        base = "/tmp";
    /* jailed, the guest runs as another uid: it must reach its home through every parent */
    if (jailed && !reachable(base)) {
        snprintf(err, errsz, "failed to create sandbox work root: the guest cannot reach %s (every parent needs o+x; set TMPDIR)",
                 base);
        return SB_E_EXECUTION;
    }
    snprintf(workdir, sizeof(workdir), "%s/sb-shim-XXXXXX", base);
    if (mkdtemp(workdir) == NULL) {
        snprintf(err, errsz, "failed to create sandbox work root");
        return SB_E_EXECUTION;
    }
    /*
     * The directory stays ours: 0700, or only searchable (0711) when jailed; `home` inside it is
     * the guest's HOME, DENO_DIR and TMPDIR, handed to the guest's uid when it is spawned
     * (sb_shim_spawn_t.home). The runtime is on the command line, so nothing else is in it.
     */
    snprintf(home, sizeof(home), "%s/home", workdir);
    if (mkdir(home, 0700) != 0 || (jailed && chmod(workdir, 0711) != 0)) {
        snprintf(err, errsz, "failed to create sandbox work root");
        st = SB_E_EXECUTION;
        goto Exit;
    }
    snprintf(v8flags, sizeof(v8flags), "--v8-flags=--max-old-space-size=%lu", d->memory_mb);
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
    argv[a++] = "--no-remote";
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
    snprintf(e_home, sizeof(e_home), "HOME=%s", home);
    snprintf(e_denodir, sizeof(e_denodir), "DENO_DIR=%s/deno", home);
    snprintf(e_tmp, sizeof(e_tmp), "TMPDIR=%s", home);
    envp[e++] = e_home;
    envp[e++] = e_denodir;
    envp[e++] = e_tmp;
    envp[e++] = "NO_COLOR=1";
    envp[e++] = "DENO_NO_UPDATE_CHECK=1";
    envp[e++] = "DENO_NO_PROMPT=1";
    envp[e] = NULL;

    /* every guest, run's and serve's alike, starts here: the one place the spawn is described */
    memset(&sp, 0, sizeof(sp));
    sp.path = d->exe;
    sp.argv = argv;
    sp.envp = envp;
    sp.cwd = "/";
    sp.nofile = SB_SHIM_GUEST_NOFILE;
    sp.jail = d->jail;
    sp.memory_mb = (unsigned)d->memory_mb;
    sp.home = home;
    /* the child's copy of our memory is wiped of the token first (its own copy: ours stays) */
    sp.scrub = (void *)cfg->token;
    sp.scrub_len = sizeof(cfg->token);
    jail_failures = sb_shim_jail_failures();
    if (sb_shim_child_spawn(&sp, &child, why, sizeof(why)) != SB_OK) {
        /* the jail counts each guest it refused once (jail.h): those are serve's jail failures */
        if (sb_shim_jail_failures() != jail_failures)
            sb_shim_hook_jail_failure();
        snprintf(err, errsz, "failed to spawn sandbox subprocess: %s", why);
        st = SB_E_EXECUTION;
        goto Exit;
    }
    if (on_spawned != NULL)
        on_spawned(arg, &child);
    st = sb_shim_relay_run(cfg, &child, init, init_len, outcome);
    /* the relay reaped the guest; a jailed one took its PID namespace with it */
    remove_workdir(workdir, home);
    workdir[0] = '\0';
    sb_shim_child_close(&child);
Exit:
    if (workdir[0] != '\0')
        remove_workdir(workdir, home);
    return st;
}
