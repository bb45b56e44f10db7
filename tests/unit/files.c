/*
 * Unit tests for broker/svc/files/ (files.c, files_path.c, files_fs.c): root
 * template substitution, MIME types, the filesystem layer
 * on a scratch directory (containment, atomic replace, listing), and the
 * handler's worker pool (results on the loop thread, rate_limited when the
 * queue is full, token references returned), and the pool's life cycle: each
 * server owns one, and destroying it joins its threads.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include "tap.h"
#include "sb/limits.h"
#include "sb/mem.h"
#include "svc/files/files_fs.h"
#include "svc/files/files_path.h"
#include "call/call.h"
#include "svc/handlers.h"
#include "util/util.h"

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    return remove(path);
}

/* rm -rf without a shell; FTW_PHYS: links are removed, never followed */
static void rm_tree(const char *path)
{
    if (nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS) != 0)
        printf("# could not remove %s\n", path);
}

/* ---- root templates ----------------------------------------------------------------------------------------------- */

static const char *const scope_kv[][2] = {
    {"tenantId", "t1"}, {"app", "blog"},   {"dot", "."},   {"dotdot", ".."}, {"empty", ""},
    {"slash", "a/b"},   {"spaced", "a b"}, {"long", NULL}, {NULL, NULL},
};
static char long_value[300];

static const char *lookup(void *ctx, const char *key)
{
    for (size_t i = 0; scope_kv[i][0] != NULL; ++i)
        if (strcmp(scope_kv[i][0], key) == 0)
            return strcmp(key, "long") == 0 ? long_value : scope_kv[i][1];
    return NULL;
}

static void test_root_expand(void)
{
    static const struct {
        const char *tmpl;
        sb_status_t st;
        const char *want; /* the root, or the reason */
    } cases[] = {
        {"/srv/files/{tenantId}", SB_OK, "/srv/files/t1"},
        {"/srv/files", SB_OK, "/srv/files"},
        {"/srv/{app}/{tenantId}/data", SB_OK, "/srv/blog/t1/data"},
        {"/srv/{app}-{tenantId}", SB_OK, "/srv/blog-t1"},
        {"/srv/{spaced}", SB_OK, "/srv/a b"},
        {"/srv/.{tenantId}", SB_OK, "/srv/.t1"},
        {"/srv/{missing}", SB_E_FORBIDDEN, SB_FILES_WHY_SCOPE},
        {"/srv/{dot}", SB_E_FORBIDDEN, SB_FILES_WHY_SCOPE},
        {"/srv/{dotdot}", SB_E_FORBIDDEN, SB_FILES_WHY_SCOPE},
        {"/srv/{dotdot}/x", SB_E_FORBIDDEN, SB_FILES_WHY_SCOPE},
        {"/srv/.{dot}", SB_E_FORBIDDEN, SB_FILES_WHY_SCOPE},
        {"/srv/{empty}", SB_E_FORBIDDEN, SB_FILES_WHY_SCOPE},
        {"/srv/{slash}", SB_E_FORBIDDEN, SB_FILES_WHY_SCOPE},
        {"/srv/{", SB_E_EXECUTION, SB_FILES_WHY_TEMPLATE},
        {"/srv/{}", SB_E_EXECUTION, SB_FILES_WHY_TEMPLATE},
        {"/srv/{tenantId", SB_E_EXECUTION, SB_FILES_WHY_TEMPLATE},
        {"/srv/{tenant.Id}", SB_E_EXECUTION, SB_FILES_WHY_TEMPLATE},
        {"/srv/}", SB_E_EXECUTION, SB_FILES_WHY_TEMPLATE},
        {"srv/{tenantId}", SB_E_EXECUTION, SB_FILES_WHY_TEMPLATE},
        {"", SB_E_EXECUTION, SB_FILES_WHY_TEMPLATE},
        {"/srv/{aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa}", SB_E_EXECUTION, SB_FILES_WHY_TEMPLATE},
        {"/srv/{long}", SB_E_EXECUTION, SB_FILES_WHY_ROOT_LONG},
    };
    char out[256];

    memset(long_value, 'x', sizeof(long_value) - 1);
    for (size_t i = 0; i != sizeof(cases) / sizeof(cases[0]); ++i) {
        const char *why = NULL;
        sb_status_t st = sb_files_root_expand(cases[i].tmpl, lookup, NULL, out, sizeof(out), &why);
        is_int(st, cases[i].st, "root \"%s\": status", cases[i].tmpl);
        is_str(st == SB_OK ? out : why, cases[i].want, "root \"%s\": result", cases[i].tmpl);
    }
    {
        /* the output bound is exact: "/ab" needs 4 bytes */
        const char *why = NULL;
        ok(sb_files_root_expand("/ab", lookup, NULL, out, 4, &why) == SB_OK && strcmp(out, "/ab") == 0, "root fits exactly");
        ok(sb_files_root_expand("/abc", lookup, NULL, out, 4, &why) == SB_E_EXECUTION, "root one byte over");
        ok(sb_files_root_expand("/{tenantId}", lookup, NULL, out, 4, &why) == SB_OK, "substituted root fits exactly");
        ok(sb_files_root_expand("/{app}", lookup, NULL, out, 4, &why) == SB_E_EXECUTION, "substituted root one byte over");
    }
}

static void test_mime(void)
{
    is_str(sb_files_mime_type("a.txt", 5), "text/plain", "txt");
    is_str(sb_files_mime_type("d/A.JSON", 8), "application/json", "JSON, any case");
    is_str(sb_files_mime_type("x.tar.gz", 8), "application/gzip", "last extension wins");
    is_str(sb_files_mime_type("img.PNG", 7), "image/png", "png");
    is_str(sb_files_mime_type("a.d/readme", 10), "application/octet-stream", "a dot in a directory is no extension");
    is_str(sb_files_mime_type("noext", 5), "application/octet-stream", "no extension");
    is_str(sb_files_mime_type("trailing.", 9), "application/octet-stream", "empty extension");
    is_str(sb_files_mime_type(".txt", 4), "text/plain", "dot file with a known extension");
    is_str(sb_files_mime_type("a.averyveryverylongextension", 28), "application/octet-stream", "long extension");
}

/* ---- the filesystem layer ----------------------------------------------------------------------------------------- */

static char scratch[256];

static void put_file(const char *rel, const char *data, size_t len)
{
    char p[PATH_MAX];
    int fd;
    snprintf(p, sizeof(p), "%s/%s", scratch, rel);
    fd = open(p, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    if (fd < 0 || write(fd, data, len) != (ssize_t)len)
        abort();
    close(fd);
}

static int exists(const char *rel)
{
    char p[PATH_MAX];
    struct stat st;
    snprintf(p, sizeof(p), "%s/%s", scratch, rel);
    return lstat(p, &st) == 0;
}

static size_t count_tmp(const char *reldir)
{
    char p[PATH_MAX];
    size_t n = 0;
    DIR *d;
    struct dirent *de;
    snprintf(p, sizeof(p), "%s/%s", scratch, reldir);
    if ((d = opendir(p)) == NULL)
        return 0;
    while ((de = readdir(d)) != NULL)
        n += sb_path_is_tmp_name(de->d_name, strlen(de->d_name));
    closedir(d);
    return n;
}

static int show_all(void *ctx, const char *path, size_t len, int is_dir)
{
    return 1;
}

static int show_txt_files(void *ctx, const char *path, size_t len, int is_dir)
{
    return !is_dir && len > 4 && memcmp(path + len - 4, ".txt", 4) == 0;
}

static void expect(sb_status_t got, sb_status_t want, const char *msg, const char *want_msg, const char *what)
{
    is_int(got, want, "%s: status", what);
    if (want_msg != NULL)
        is_str(msg, want_msg, "%s: reason", what);
}

static void test_fs(void)
{
    char msg[512], outside[300], p[PATH_MAX];
    uint8_t *data = NULL;
    size_t len = 0, n = 0;
    int rootfd = -1, truncated = 0;
    sb_files_entry_t *v = NULL;
    sb_status_t st;

    snprintf(scratch, sizeof(scratch), "/tmp/sb-unit-files-XXXXXX");
    if (mkdtemp(scratch) == NULL)
        abort();
    snprintf(outside, sizeof(outside), "%s-outside", scratch);
    if (mkdir(outside, 0755) != 0)
        abort();
    snprintf(p, sizeof(p), "%s/secret.txt", outside);
    {
        int fd = open(p, O_CREAT | O_WRONLY, 0644);
        if (fd < 0 || write(fd, "secret", 6) != 6)
            abort();
        close(fd);
    }
    snprintf(p, sizeof(p), "%s/nope", scratch);
    st = sb_files_fs_open_root(p, &rootfd, msg, sizeof(msg));
    is_int(st, SB_E_EXECUTION, "a missing root is an execution error");
    ok(!exists("nope"), "a missing root is not created");
    if (sb_files_fs_open_root(scratch, &rootfd, msg, sizeof(msg)) != SB_OK)
        abort();

    /* write, read back, replace */
    st = sb_files_fs_write(rootfd, "a/b/c.bin", (const uint8_t *)"x\0y", 3, msg, sizeof(msg));
    is_int(st, SB_OK, "write creates missing parents");
    st = sb_files_fs_read(rootfd, "a/b/c.bin", 100, &data, &len, msg, sizeof(msg));
    ok(st == SB_OK && len == 3 && memcmp(data, "x\0y", 3) == 0, "read returns the bytes, NUL included");
    free(data);
    st = sb_files_fs_write(rootfd, "a/b/c.bin", (const uint8_t *)"new", 3, msg, sizeof(msg));
    st = sb_files_fs_read(rootfd, "a/b/c.bin", 100, &data, &len, msg, sizeof(msg));
    ok(st == SB_OK && len == 3 && memcmp(data, "new", 3) == 0, "write replaces");
    free(data);
    st = sb_files_fs_write(rootfd, "empty", NULL, 0, msg, sizeof(msg));
    is_int(st, SB_OK, "an empty file can be written");
    st = sb_files_fs_read(rootfd, "empty", 100, &data, &len, msg, sizeof(msg));
    ok(st == SB_OK && len == 0 && data == NULL, "an empty file reads as nothing");
    is_int(count_tmp("a/b") + count_tmp(""), 0, "no temporary is left behind");

    /* caps */
    put_file("ten", "0123456789", 10);
    st = sb_files_fs_read(rootfd, "ten", 10, &data, &len, msg, sizeof(msg));
    ok(st == SB_OK && len == 10, "a file at the cap is read");
    free(data);
    data = NULL;
    st = sb_files_fs_read(rootfd, "ten", 9, &data, &len, msg, sizeof(msg));
    expect(st, SB_E_BAD_ARGS, msg, "files.read file exceeds 9-byte cap", "a file above the cap");
    ok(data == NULL, "nothing is returned above the cap");

    /* what is not a plain file inside the root */
    st = sb_files_fs_read(rootfd, "missing", 10, &data, &len, msg, sizeof(msg));
    expect(st, SB_E_BAD_ARGS, msg, SB_FILES_WHY_NOENT, "read a missing file");
    st = sb_files_fs_read(rootfd, "a", 10, &data, &len, msg, sizeof(msg));
    expect(st, SB_E_FORBIDDEN, msg, SB_FILES_WHY_NOTREG, "read a directory");
    snprintf(p, sizeof(p), "%s/fifo", scratch);
    if (mkfifo(p, 0600) != 0)
        abort();
    st = sb_files_fs_read(rootfd, "fifo", 10, &data, &len, msg, sizeof(msg));
    expect(st, SB_E_FORBIDDEN, msg, SB_FILES_WHY_NOTREG, "read a FIFO (without blocking)");
    st = sb_files_fs_write(rootfd, "a", (const uint8_t *)"x", 1, msg, sizeof(msg));
    expect(st, SB_E_FORBIDDEN, msg, SB_FILES_WHY_NOTREG, "write onto a directory");
    st = sb_files_fs_write(rootfd, "ten/x", (const uint8_t *)"x", 1, msg, sizeof(msg));
    expect(st, SB_E_BAD_ARGS, msg, SB_FILES_WHY_NOTDIR, "write below a file");
    st = sb_files_fs_read(rootfd, "ten/x", 10, &data, &len, msg, sizeof(msg));
    expect(st, SB_E_BAD_ARGS, msg, SB_FILES_WHY_NOTDIR, "read below a file");

    /* escapes: the kernel refuses them even if a path got this far */
    st = sb_files_fs_read(rootfd, "../x", 10, &data, &len, msg, sizeof(msg));
    expect(st, SB_E_FORBIDDEN, msg, SB_FILES_WHY_ESCAPE, "read through ..");
    st = sb_files_fs_read(rootfd, "/etc/passwd", 10, &data, &len, msg, sizeof(msg));
    expect(st, SB_E_FORBIDDEN, msg, SB_FILES_WHY_ESCAPE, "read an absolute path");
    st = sb_files_fs_write(rootfd, "../escaped.txt", (const uint8_t *)"x", 1, msg, sizeof(msg));
    expect(st, SB_E_FORBIDDEN, msg, SB_FILES_WHY_ESCAPE, "write through ..");
    snprintf(p, sizeof(p), "%s/escaped.txt", outside);
    ok(access(p, F_OK) != 0, "nothing was written outside");

    snprintf(p, sizeof(p), "%s/link", scratch);
    if (symlink("/etc/passwd", p) != 0)
        abort();
    st = sb_files_fs_read(rootfd, "link", 100000, &data, &len, msg, sizeof(msg));
    expect(st, SB_E_FORBIDDEN, msg, SB_FILES_WHY_SYMLINK, "read a symlink to outside");
    snprintf(p, sizeof(p), "%s/inlink", scratch);
    if (symlink("ten", p) != 0)
        abort();
    st = sb_files_fs_read(rootfd, "inlink", 100, &data, &len, msg, sizeof(msg));
    expect(st, SB_E_FORBIDDEN, msg, SB_FILES_WHY_SYMLINK, "read a symlink that stays inside");
    st = sb_files_fs_write(rootfd, "link", (const uint8_t *)"x", 1, msg, sizeof(msg));
    expect(st, SB_E_FORBIDDEN, msg, SB_FILES_WHY_NOTREG, "write onto a symlink");
    snprintf(p, sizeof(p), "%s/sd", scratch);
    if (symlink(outside, p) != 0)
        abort();
    st = sb_files_fs_read(rootfd, "sd/secret.txt", 100, &data, &len, msg, sizeof(msg));
    expect(st, SB_E_FORBIDDEN, msg, SB_FILES_WHY_SYMLINK, "read through a symlinked directory");
    st = sb_files_fs_write(rootfd, "sd/new.txt", (const uint8_t *)"x", 1, msg, sizeof(msg));
    expect(st, SB_E_FORBIDDEN, msg, SB_FILES_WHY_SYMLINK, "write through a symlinked directory");
    snprintf(p, sizeof(p), "%s/new.txt", outside);
    ok(access(p, F_OK) != 0, "nothing was written through the symlinked directory");
    st = sb_files_fs_list(rootfd, "sd", show_all, NULL, 10, 100000, &v, &n, &truncated, msg, sizeof(msg));
    expect(st, SB_E_FORBIDDEN, msg, SB_FILES_WHY_SYMLINK, "list a symlinked directory");
    snprintf(p, sizeof(p), "%s/proc", scratch);
    if (symlink("/proc/self/root", p) != 0)
        abort();
    st = sb_files_fs_read(rootfd, "proc/etc/passwd", 100000, &data, &len, msg, sizeof(msg));
    expect(st, SB_E_FORBIDDEN, msg, SB_FILES_WHY_SYMLINK, "read through a link to /proc/self/root");

    /* a hard link to a file outside the root */
    {
        char target[400];
        snprintf(target, sizeof(target), "%s/secret.txt", outside);
        snprintf(p, sizeof(p), "%s/hl.txt", scratch);
        if (link(target, p) != 0)
            abort();
    }
    st = sb_files_fs_read(rootfd, "hl.txt", 100, &data, &len, msg, sizeof(msg));
    expect(st, SB_E_FORBIDDEN, msg, SB_FILES_WHY_HARDLINK, "read a hard link");
    st = sb_files_fs_write(rootfd, "hl.txt", (const uint8_t *)"x", 1, msg, sizeof(msg));
    expect(st, SB_E_FORBIDDEN, msg, SB_FILES_WHY_HARDLINK, "overwrite a hard link");
    snprintf(p, sizeof(p), "%s/secret.txt", outside);
    {
        char buf[16] = {0};
        int fd = open(p, O_RDONLY);
        ok(fd >= 0 && read(fd, buf, sizeof(buf)) == 6 && memcmp(buf, "secret", 6) == 0, "the outside file is untouched");
        close(fd);
    }

    /* a failure after the temporary exists removes it: a file-size limit makes write(2) fail */
    {
        struct rlimit old, lim;
        signal(SIGXFSZ, SIG_IGN);
        getrlimit(RLIMIT_FSIZE, &old);
        lim = old;
        lim.rlim_cur = 4;
        setrlimit(RLIMIT_FSIZE, &lim);
        st = sb_files_fs_write(rootfd, "big/f.txt", (const uint8_t *)"0123456789", 10, msg, sizeof(msg));
        setrlimit(RLIMIT_FSIZE, &old);
        is_int(st, SB_E_EXECUTION, "a failing write(2) is an execution error");
        ok(strncmp(msg, "files write failed: ", 20) == 0, "with the system error for the log (%s)", msg);
        is_int(count_tmp("big"), 0, "and its temporary is removed");
        ok(!exists("big/f.txt"), "and no file appears under the final name");
    }

    /* listing */
    put_file(".sb-tmp-0123456789abcdef", "partial", 7);
    put_file("z.txt", "zz", 2);
    st = sb_files_fs_list(rootfd, NULL, show_all, NULL, 100, 100000, &v, &n, &truncated, msg, sizeof(msg));
    is_int(st, SB_OK, "list the root");
    {
        /* sorted; dirs and plain files only: no symlink, FIFO, hard link or temporary */
        static const char *const want[] = {"a", "big", "empty", "ten", "z.txt"};
        int same = n == sizeof(want) / sizeof(want[0]);
        for (size_t i = 0; same && i != n; ++i)
            same = strcmp(v[i].path, want[i]) == 0;
        ok(same, "root entries: a, big, empty, ten, z.txt (got %zu)", n);
        ok(n == 5 && v[0].is_dir && v[0].size == 0 && !v[3].is_dir && v[3].size == 10, "types and sizes");
        ok(!truncated, "not truncated");
    }
    sb_files_fs_entries_free(v, n);
    st = sb_files_fs_list(rootfd, NULL, show_all, NULL, 3, 100000, &v, &n, &truncated, msg, sizeof(msg));
    ok(st == SB_OK && n == 3 && truncated, "max_entries cuts the listing, and says so");
    sb_files_fs_entries_free(v, n);
    st = sb_files_fs_list(rootfd, NULL, show_all, NULL, 5, 100000, &v, &n, &truncated, msg, sizeof(msg));
    ok(st == SB_OK && n == 5 && !truncated, "exactly max_entries entries is not truncated");
    sb_files_fs_entries_free(v, n);
    st = sb_files_fs_list(rootfd, NULL, show_all, NULL, 100, 3 * 64 + 15, &v, &n, &truncated, msg, sizeof(msg));
    ok(st == SB_OK && n == 3 && truncated, "the byte budget cuts the listing too");
    sb_files_fs_entries_free(v, n);
    /* each allocation of a read and of a listing failed in turn: "out of memory", nothing returned, nothing leaked */
    {
        unsigned long k, points = 0, bad = 0;
        st = SB_E_EXECUTION;
        for (k = 1; k < 1000 && st != SB_OK; ++k) {
            data = NULL;
            sb_mem_fail_nth(k);
            st = sb_files_fs_read(rootfd, "ten", 10, &data, &len, msg, sizeof(msg));
            sb_mem_fail_nth(0);
            if (st == SB_OK)
                ok(len == 10 && memcmp(data, "0123456789", 10) == 0, "read: the bytes once no allocation fails");
            else if (++points, st != SB_E_EXECUTION || strcmp(msg, "files.read out of memory") != 0 || data != NULL)
                ++bad;
            sb_mem_free(data);
        }
        ok(points >= 1 && bad == 0, "read: %lu failure points, each \"files.read out of memory\"", points);
        points = bad = 0;
        v = NULL;
        n = 0;
        st = SB_E_EXECUTION;
        for (k = 1; k < 1000 && st != SB_OK; ++k) {
            sb_mem_fail_nth(k);
            st = sb_files_fs_list(rootfd, NULL, show_all, NULL, 100, 100000, &v, &n, &truncated, msg, sizeof(msg));
            sb_mem_fail_nth(0);
            if (st == SB_OK)
                ok(n == 5, "list: every entry once no allocation fails");
            else if (++points, st != SB_E_EXECUTION || strcmp(msg, "files.list out of memory") != 0 || v != NULL || n != 0)
                ++bad;
            if (st == SB_OK)
                sb_files_fs_entries_free(v, n);
        }
        ok(points >= 6 && bad == 0, "list: %lu failure points (the array and each path), each \"files.list out of memory\"",
           points);
    }
    v = NULL;
    n = 0;
    sb_files_fs_entries_free(v, n);
    st = sb_files_fs_list(rootfd, NULL, show_txt_files, NULL, 100, 100000, &v, &n, &truncated, msg, sizeof(msg));
    ok(st == SB_OK && n == 1 && strcmp(v[0].path, "z.txt") == 0, "the filter applies");
    sb_files_fs_entries_free(v, n);
    st = sb_files_fs_list(rootfd, "a/b", show_all, NULL, 100, 100000, &v, &n, &truncated, msg, sizeof(msg));
    ok(st == SB_OK && n == 1 && strcmp(v[0].path, "a/b/c.bin") == 0 && v[0].size == 3, "a subdirectory lists relative paths");
    sb_files_fs_entries_free(v, n);
    st = sb_files_fs_list(rootfd, "ten", show_all, NULL, 100, 100000, &v, &n, &truncated, msg, sizeof(msg));
    expect(st, SB_E_BAD_ARGS, msg, SB_FILES_WHY_LIST_NOTDIR, "list a file");
    st = sb_files_fs_list(rootfd, "nope", show_all, NULL, 100, 100000, &v, &n, &truncated, msg, sizeof(msg));
    expect(st, SB_E_BAD_ARGS, msg, SB_FILES_WHY_NOENT, "list a missing directory");

    close(rootfd);
    rm_tree(scratch);
    rm_tree(outside);
}

/* ---- the handler and its pool ------------------------------------------------------------------------------------- */

#define NCALLS 200

static pthread_t loop_thread;
/* a loop and its queue live as long as the process (h2o 2.2.5 never frees a destroyed queue) */
static h2o_loop_t *loop_queue_loop;
static h2o_multithread_queue_t *loop_queue;
static size_t ncb, nok, nlimited, nother, noff_thread;

static void on_result(void *arg, sb_result_t *res)
{
    ++ncb;
    if (!pthread_equal(pthread_self(), loop_thread))
        ++noff_thread;
    if (res->status == SB_OK)
        ++nok;
    else if (res->status == SB_E_RATE_LIMITED && strcmp(res->message, "files queue is full (64 operations waiting)") == 0)
        ++nlimited;
    else
        ++nother;
}

static void test_handler(void)
{
    char root[256], tmpl[300], err[256];
    uint8_t hash[32] = {1};
    json_t *caps = json_loads("{\"files\": {\"read\": [\"**\"], \"write\": [\"**\"]}}", 0, NULL);
    json_t *scope = json_loads("{\"tenantId\": \"t1\"}", 0, NULL);
    sb_token_t *tok = NULL;
    sb_files_conf_t fc;
    sb_svc_env_t env;
    sb_files_pool_t *pool;
    sb_method_t m;
    sb_call_t call;
    msgpack_zone zone;
    static uint8_t body[16384];
    uint64_t deadline;

    snprintf(root, sizeof(root), "/tmp/sb-unit-files-h-XXXXXX");
    if (mkdtemp(root) == NULL)
        abort();
    snprintf(tmpl, sizeof(tmpl), "%s/t1", root);
    if (mkdir(tmpl, 0755) != 0)
        abort();
    snprintf(tmpl, sizeof(tmpl), "%s/{tenantId}", root);
    if (sb_token_build(hash, "run-1", caps, "app", scope, INT64_MAX, &tok, err, sizeof(err)) != SB_OK)
        abort();
    memset(&fc, 0, sizeof(fc));
    fc.root = tmpl;
    fc.max_read = 1 << 20;
    fc.max_write = sizeof(body);
    fc.max_entries = 100;
    memset(&env, 0, sizeof(env));
    env.loop = loop_queue_loop = h2o_evloop_create();
    pool = sb_files_pool_create(2);
    loop_queue = h2o_multithread_create_queue(env.loop);
    env.files = sb_files_ctx_create(pool, loop_queue);
    loop_thread = pthread_self();
    if (sb_method_parse("files.write", 11, &m) != SB_OK)
        abort();

    /* many writes submitted at once: each takes milliseconds (fsync), submitting takes microseconds */
    for (int i = 0; i != NCALLS; ++i) {
        msgpack_sbuffer sb;
        msgpack_packer pk;
        msgpack_unpacked up;
        char path[32];
        int plen = snprintf(path, sizeof(path), "d%d/f%d.bin", i % 4, i);
        msgpack_sbuffer_init(&sb);
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        msgpack_pack_map(&pk, 2);
        msgpack_pack_str_with_body(&pk, "path", 4);
        msgpack_pack_str_with_body(&pk, path, (size_t)plen);
        msgpack_pack_str_with_body(&pk, "content", 7);
        msgpack_pack_bin_with_body(&pk, body, sizeof(body));
        msgpack_unpacked_init(&up);
        if (msgpack_unpack_next(&up, sb.data, sb.size, NULL) != MSGPACK_UNPACK_SUCCESS)
            abort();
        msgpack_zone_init(&zone, 1024);
        if (sb_call_decode(&call, &m, "files.write", 11, &up.data, 1, &zone) != SB_OK)
            abort();
        /* the call is gone as soon as the handler returns: a job copies what it needs */
        sb_files_handle(&env, &fc, tok, &call, on_result, NULL);
        msgpack_zone_destroy(&zone);
        msgpack_unpacked_destroy(&up);
        msgpack_sbuffer_destroy(&sb);
    }
    ok(nlimited > 0, "a full queue answers rate_limited at once (%zu of %d)", nlimited, NCALLS);
    deadline = sb_mono_us() + 60u * 1000000u;
    while (ncb != NCALLS && sb_mono_us() < deadline)
        h2o_evloop_run(env.loop, 10);
    is_int(ncb, NCALLS, "every call is answered exactly once");
    is_int(nok + nlimited, NCALLS, "the others succeed");
    is_int(nother, 0, "nothing else happens");
    is_int(noff_thread, 0, "every callback runs on the loop thread");
    is_int(atomic_load(&tok->_refcnt), 1, "every job returned its token reference");
    is_int(sb_files_ctx_pending(env.files), 0, "and none is pending");

    /* refusals on the loop, before any job exists */
    {
        msgpack_sbuffer sb;
        msgpack_packer pk;
        msgpack_unpacked up;
        json_t *s2 = json_loads("{\"tenantId\": \"..\"}", 0, NULL);
        sb_token_t *bad = NULL;
        if (sb_token_build(hash, "run-2", caps, "app", s2, INT64_MAX, &bad, err, sizeof(err)) != SB_OK)
            abort();
        msgpack_sbuffer_init(&sb);
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        msgpack_pack_map(&pk, 2);
        msgpack_pack_str_with_body(&pk, "path", 4);
        msgpack_pack_str_with_body(&pk, "x", 1);
        msgpack_pack_str_with_body(&pk, "content", 7);
        msgpack_pack_str_with_body(&pk, "x", 1);
        msgpack_unpacked_init(&up);
        if (msgpack_unpack_next(&up, sb.data, sb.size, NULL) != MSGPACK_UNPACK_SUCCESS)
            abort();
        ncb = nother = 0;
        msgpack_zone_init(&zone, 1024);
        if (sb_call_decode(&call, &m, "files.write", 11, &up.data, 1, &zone) != SB_OK)
            abort();
        sb_files_handle(&env, &fc, bad, &call, on_result, NULL);
        msgpack_zone_destroy(&zone);
        ok(ncb == 1 && nother == 1, "a scope value of \"..\" is refused before any I/O");
        is_int(atomic_load(&bad->_refcnt), 1, "and the token reference is returned");
        sb_token_release(bad);
        msgpack_unpacked_destroy(&up);
        msgpack_sbuffer_destroy(&sb);
        json_decref(s2);
    }
    {
        char in[PATH_MAX], out[PATH_MAX];
        snprintf(in, sizeof(in), "%s/t1/d0/f0.bin", root);
        snprintf(out, sizeof(out), "%s/d0", root);
        ok(access(in, F_OK) == 0 && access(out, F_OK) != 0, "the files landed under the tenant root");
    }
    sb_files_ctx_destroy(env.files);
    sb_files_pool_destroy(pool);
    sb_token_release(tok);
    json_decref(caps);
    json_decref(scope);
    rm_tree(root);
}

/* the threads of this process, from /proc/self/task */
static int count_threads(void)
{
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    int n = 0;

    if (d == NULL)
        abort();
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            ++n;
    closedir(d);
    return n;
}

/*
 * The threads once `want` is reached, looking for up to 2 s: a joined thread is finished, but its
 * /proc/self/task entry can outlive the join by a moment (the kernel wakes the joiner as the thread
 * exits, before the task is gone). A count that stays above `want` is still a failure.
 */
static int count_threads_settled(int want)
{
    uint64_t deadline = sb_mono_us() + 2000000u;
    int n;

    while ((n = count_threads()) != want && sb_mono_us() < deadline)
        usleep(10000);
    return n;
}

/* what one pool thread reports when it runs a job: the job ran on a thread of that pool */
static void on_pool_result(void *arg, sb_result_t *res)
{
    int *answered = arg;
    *answered += res->status == SB_OK ? 1 : 100;
}

/*
 * Two servers in one process each own a pool: both run jobs, and destroying
 * one joins its threads while the other keeps working (no process-wide pool).
 */
static void test_pool_life_cycle(void)
{
    int base = count_threads(), answered = 0;
    sb_files_pool_t *a, *b;
    h2o_loop_t *loop = loop_queue_loop;
    sb_files_ctx_t *ca, *cb;
    sb_files_conf_t fc;
    sb_svc_env_t env;
    sb_method_t m;
    sb_call_t call;
    msgpack_zone zone;
    msgpack_unpacked up;
    msgpack_sbuffer sbuf;
    msgpack_packer pk;
    char root[64], err[256];
    uint8_t hash[32] = {2};
    json_t *caps = json_loads("{\"files\": {\"read\": [\"**\"], \"write\": [\"**\"]}}", 0, NULL);
    sb_token_t *tok = NULL;
    uint64_t deadline;

    snprintf(root, sizeof(root), "/tmp/sb-unit-files-p-XXXXXX");
    if (mkdtemp(root) == NULL || sb_token_build(hash, "run-p", caps, "app", NULL, INT64_MAX, &tok, err, sizeof(err)) != SB_OK)
        abort();
    a = sb_files_pool_create(2);
    b = sb_files_pool_create(3);
    is_int(count_threads(), base + 5, "each pool starts its own threads when it is created");
    ca = sb_files_ctx_create(a, loop_queue);
    cb = sb_files_ctx_create(b, loop_queue);

    memset(&fc, 0, sizeof(fc));
    fc.root = root;
    fc.max_read = fc.max_write = 1024;
    fc.max_entries = 10;
    if (sb_method_parse("files.write", 11, &m) != SB_OK)
        abort();
    msgpack_sbuffer_init(&sbuf);
    msgpack_packer_init(&pk, &sbuf, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 2);
    msgpack_pack_str_with_body(&pk, "path", 4);
    msgpack_pack_str_with_body(&pk, "p.txt", 5);
    msgpack_pack_str_with_body(&pk, "content", 7);
    msgpack_pack_bin_with_body(&pk, "x", 1);
    msgpack_unpacked_init(&up);
    if (msgpack_unpack_next(&up, sbuf.data, sbuf.size, NULL) != MSGPACK_UNPACK_SUCCESS)
        abort();
    msgpack_zone_init(&zone, 1024);
    if (sb_call_decode(&call, &m, "files.write", 11, &up.data, 1, &zone) != SB_OK)
        abort();
    memset(&env, 0, sizeof(env));
    env.loop = loop;
    env.files = ca;
    sb_files_handle(&env, &fc, tok, &call, on_pool_result, &answered);
    env.files = cb;
    sb_files_handle(&env, &fc, tok, &call, on_pool_result, &answered);
    deadline = sb_mono_us() + 30u * 1000000u;
    while (answered < 2 && sb_mono_us() < deadline)
        h2o_evloop_run(loop, 10);
    is_int(answered, 2, "a job runs on either server's pool and is answered on the loop");

    /* the first server goes: its threads are joined, the second's keep running jobs */
    sb_files_ctx_destroy(ca);
    sb_files_pool_destroy(a);
    is_int(count_threads_settled(base + 3), base + 3, "destroying a pool joins its threads");
    answered = 0;
    sb_files_handle(&env, &fc, tok, &call, on_pool_result, &answered);
    deadline = sb_mono_us() + 30u * 1000000u;
    while (answered < 1 && sb_mono_us() < deadline)
        h2o_evloop_run(loop, 10);
    is_int(answered, 1, "the other server's pool still answers");
    is_int(sb_files_ctx_pending(cb), 0, "nothing is pending once answered");
    sb_files_ctx_destroy(cb);
    sb_files_pool_destroy(b);
    is_int(count_threads_settled(base), base, "no files thread outlives its server");

    msgpack_zone_destroy(&zone);
    msgpack_unpacked_destroy(&up);
    msgpack_sbuffer_destroy(&sbuf);
    sb_token_release(tok);
    json_decref(caps);
    rm_tree(root);
}

int main(void)
{
    test_root_expand();
    test_mime();
    test_fs();
    test_handler();
    test_pool_life_cycle();
    return done_testing();
}
