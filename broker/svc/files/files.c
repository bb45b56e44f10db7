/*
 * broker/svc/files: files.read / write / list beneath a target's root
 * (handlers.h; the storage rules are in files_fs.c, the path rules in
 * files_path.c).
 *
 *   read  {path}                          -> {path, size, mimeType, content: bin}
 *                                            (JSON: contentBase64 instead of content)
 *   write {path, content | contentBase64} -> {path, size}
 *   list  {path?}                         -> {entries: [{path, type, size}], truncated}
 *
 * The path is the typed call's (call/call.h): decoded once, in the normal
 * form the capability check matched against the manifest's globs and held to
 * the storage shape by the decoder, so the path opened is byte for byte the
 * path granted (nothing here normalises it again). The root comes from the
 * target's template and the token's own scope values (never from args:
 * upstream's "scope" argument, like "title" and "mime_type", is accepted and
 * ignored), and the kernel confines every open to the root (files_fs.c).
 *
 * Why a worker pool: measured on the development VM's ext4, an atomic write
 * (create, write, fsync, rename, fsync of the directory) of 16 bytes to
 * 64 KiB takes 0.3-0.5 ms at the median on an idle disk but up to 1.4-4.7 ms
 * at p99 and 6 ms at worst, 1.1 ms at the median for 1 MiB, and 8-9 ms at the
 * median (20 ms worst) while the disk is shared with other load; a cold read
 * or a large directory can block for as long. On an h2o loop that stalls
 * every other call the worker carries, so every files operation runs on a
 * small pool of POOL_THREADS threads shared by all workers, behind a bounded
 * queue: a full queue answers rate_limited at once instead of growing without
 * bound. The loop side (argument parsing, the root template) runs before the
 * job is queued; the result goes back to the loop that started the call
 * through an h2o_multithread queue, and the callback runs there, never on a
 * pool thread.
 * A job holds its own token reference (the manifest filters files.list) and
 * copies everything else it needs from the request, which may be gone by the
 * time the job runs.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "sb/limits.h"
#include "sb/value.h"
#include "svc/files/files_fs.h"
#include "svc/files/files_path.h"
#include "svc/handlers.h"
#include "util/util.h"

#define POOL_THREADS 2u
/* jobs waiting for a thread; one more is rate_limited */
#define POOL_QUEUE_MAX 64u
/*
 * The largest file files.read answers in JSON: its base64 (4/3 of it) plus the
 * other keys (a path of SB_MAX_PATH bytes may grow sixfold when escaped) must
 * fit the native result cap, or the route would turn the reply into an
 * execution_error after the read. msgpack carries the bytes as they are.
 */
#define JSON_READ_CAP ((SB_MAX_NATIVE_RESULT - 32768u) / 4u * 3u)
/* the budget of a files.list reply (entries are costed as JSON, the larger encoding) */
#define LIST_MAX_BYTES (SB_MAX_NATIVE_RESULT - 8192u)

/* one per h2o loop that has started a files call: where the results of its jobs are delivered */
typedef struct st_loop_ctx_t {
    h2o_loop_t *loop;
    h2o_multithread_queue_t *queue;
    h2o_multithread_receiver_t receiver;
    struct st_loop_ctx_t *next;
} loop_ctx_t;

typedef struct st_files_job_t {
    h2o_multithread_message_t super; /* the delivery back to `home` */
    struct st_files_job_t *next;     /* the pool's queue */
    loop_ctx_t *home;
    sb_token_t *tok; /* a reference of our own */
    sb_method_op_t op;
    int binary;
    size_t max_read, max_write, max_entries;
    int has_path;
    char root[PATH_MAX];
    char path[SB_MAX_PATH + 1];
    uint8_t *content; /* files.write: the decoded bytes (malloc'ed, NULL when empty) */
    size_t content_len;
    sb_dispatch_cb cb;
    void *arg;
    sb_result_t res;
} files_job_t;

static struct {
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    files_job_t *head, *tail;
    size_t queued;
    unsigned nthreads;
    loop_ctx_t *loops; /* never freed: a loop lives as long as the process */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, NULL, 0, 0, NULL};

/* the calling thread's loop context, so the common case takes no lock */
static __thread loop_ctx_t *this_loop;

/* ---- results -------------------------------------------------------------------------------------------------------- */

__attribute__((format(printf, 3, 4))) static void fail(files_job_t *job, sb_status_t st, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    sb_result_vfail(&job->res, st, fmt, ap);
    va_end(ap);
}
static void job_free(files_job_t *job)
{
    sb_result_dispose(&job->res);
    sb_mem_free(job->content);
    sb_token_release(job->tok);
    sb_mem_free(job);
}

/* answers on the loop thread and frees the job */
static void finish(files_job_t *job)
{
    job->cb(job->arg, &job->res);
    job_free(job);
}

static SB_WARN_UNUSED int pack_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    return msgpack_pack_str(pk, n) | msgpack_pack_str_body(pk, s, n);
}

/* a packer that failed (only on allocation failure) left a value nobody may send */
static void packed_or_fail(files_job_t *job, int rc)
{
    if (rc != 0) {
        fail(job, SB_E_EXECUTION, "files reply: out of memory");
        return;
    }
    job->res.status = SB_OK;
}

/* ---- the operations (pool threads) ---------------------------------------------------------------------------------- */

static void do_read(files_job_t *job, int rootfd)
{
    size_t cap = job->max_read, len = 0;
    uint8_t *data = NULL;
    msgpack_packer pk;
    int rc;

    if (!job->binary && cap > JSON_READ_CAP)
        cap = JSON_READ_CAP;
    if ((job->res.status = sb_files_fs_read(rootfd, job->path, cap, &data, &len, job->res.message, sizeof(job->res.message))) !=
        SB_OK)
        return;
    msgpack_packer_init(&pk, &job->res.value, msgpack_sbuffer_write);
    rc = msgpack_pack_map(&pk, 4);
    rc |= pack_str(&pk, "path") | pack_str(&pk, job->path);
    rc |= pack_str(&pk, "size") | msgpack_pack_uint64(&pk, len);
    rc |= pack_str(&pk, "mimeType") | pack_str(&pk, sb_files_mime_type(job->path, strlen(job->path)));
    /* bin either way: the RPC route writes a bin as base64 text in JSON, hence the key */
    rc |= pack_str(&pk, job->binary ? "content" : "contentBase64");
    rc |= msgpack_pack_bin(&pk, len);
    if (len != 0) /* an empty file has no buffer, and memcpy must not see NULL */
        rc |= msgpack_pack_bin_body(&pk, data, len);
    sb_mem_free(data);
    packed_or_fail(job, rc);
}

static void do_write(files_job_t *job, int rootfd)
{
    msgpack_packer pk;
    int rc;

    if ((job->res.status = sb_files_fs_write(rootfd, job->path, job->content, job->content_len, job->res.message,
                                             sizeof(job->res.message))) != SB_OK)
        return;
    msgpack_packer_init(&pk, &job->res.value, msgpack_sbuffer_write);
    rc = msgpack_pack_map(&pk, 2);
    rc |= pack_str(&pk, "path") | pack_str(&pk, job->path);
    rc |= pack_str(&pk, "size") | msgpack_pack_uint64(&pk, job->content_len);
    packed_or_fail(job, rc);
}

/*
 * What files.list shows: an entry whose path matches a read glob, or a
 * directory some read glob lives under (upstream's files.list rule, the one
 * the check applies to args.path). A directory matched by neither is hidden
 * even when a glob that starts with a wildcard could match something inside
 * it: the manifest answers only these two questions.
 */
static int list_filter(void *ctx, const char *path, size_t len, int is_dir)
{
    /* the manifest is immutable: a pool thread may read it */
    return sb_authz_files_visible(ctx, path, len, is_dir);
}

static void do_list(files_job_t *job, int rootfd)
{
    sb_files_entry_t *v = NULL;
    size_t n = 0;
    int truncated = 0, rc;
    msgpack_packer pk;

    if ((job->res.status =
             sb_files_fs_list(rootfd, job->has_path ? job->path : NULL, list_filter, job->tok->manifest, job->max_entries,
                              LIST_MAX_BYTES, &v, &n, &truncated, job->res.message, sizeof(job->res.message))) != SB_OK)
        return;
    msgpack_packer_init(&pk, &job->res.value, msgpack_sbuffer_write);
    rc = msgpack_pack_map(&pk, 2);
    rc |= pack_str(&pk, "entries") | msgpack_pack_array(&pk, n);
    for (size_t i = 0; i != n; ++i) {
        rc |= msgpack_pack_map(&pk, 3);
        rc |= pack_str(&pk, "path") | pack_str(&pk, v[i].path);
        rc |= pack_str(&pk, "type") | pack_str(&pk, v[i].is_dir ? "dir" : "file");
        rc |= pack_str(&pk, "size") | msgpack_pack_uint64(&pk, v[i].size);
    }
    /* always present: a cut listing is never passed off as a whole one */
    rc |= pack_str(&pk, "truncated") | (truncated ? msgpack_pack_true(&pk) : msgpack_pack_false(&pk));
    sb_files_fs_entries_free(v, n);
    packed_or_fail(job, rc);
}

static void run_job(files_job_t *job)
{
    int rootfd = -1;

    if ((job->res.status = sb_files_fs_open_root(job->root, &rootfd, job->res.message, sizeof(job->res.message))) != SB_OK)
        return;
    switch (job->op) {
    case SB_OP_READ:
        do_read(job, rootfd);
        break;
    case SB_OP_WRITE:
        do_write(job, rootfd);
        break;
    case SB_OP_LIST:
        do_list(job, rootfd);
        break;
    default:
        fail(job, SB_E_NOT_IMPLEMENTED, "files operation has no host handler");
        break;
    }
    close(rootfd);
}

/* ---- the pool ------------------------------------------------------------------------------------------------------- */

static void *pool_main(void *unused)
{
    for (;;) {
        files_job_t *job;
        pthread_mutex_lock(&pool.mutex);
        while (pool.head == NULL)
            pthread_cond_wait(&pool.cond, &pool.mutex);
        job = pool.head;
        if ((pool.head = job->next) == NULL)
            pool.tail = NULL;
        --pool.queued;
        pthread_mutex_unlock(&pool.mutex);
        run_job(job);
        h2o_multithread_send_message(&job->home->receiver, &job->super);
    }
    return NULL;
}

/*
 * Started by the first files call. The threads inherit the signal mask of
 * the worker that starts them (main blocks SIGTERM and SIGINT for every thread
 * but its signal thread) and are detached: they hold no resource that outlives
 * a job, and a job cut short by exit leaves at most a temporary file.
 */
static SB_WARN_UNUSED int pool_start_locked(void)
{
    pthread_attr_t attr;

    if (pool.nthreads != 0)
        return 0;
    if (pthread_attr_init(&attr) != 0)
        return -1;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    for (unsigned i = 0; i != POOL_THREADS; ++i) {
        pthread_t tid;
        if (pthread_create(&tid, &attr, pool_main, NULL) == 0)
            ++pool.nthreads;
    }
    pthread_attr_destroy(&attr);
    return pool.nthreads != 0 ? 0 : -1;
}

static SB_WARN_UNUSED sb_status_t pool_submit(files_job_t *job)
{
    sb_status_t st = SB_OK;

    pthread_mutex_lock(&pool.mutex);
    if (pool_start_locked() != 0) {
        st = SB_E_UNAVAILABLE;
    } else if (pool.queued >= POOL_QUEUE_MAX) {
        st = SB_E_RATE_LIMITED;
    } else {
        job->next = NULL;
        if (pool.tail != NULL)
            pool.tail->next = job;
        else
            pool.head = job;
        pool.tail = job;
        ++pool.queued;
        pthread_cond_signal(&pool.cond);
    }
    pthread_mutex_unlock(&pool.mutex);
    return st;
}

static void on_jobs_done(h2o_multithread_receiver_t *receiver, h2o_linklist_t *messages)
{
    while (!h2o_linklist_is_empty(messages)) {
        files_job_t *job = H2O_STRUCT_FROM_MEMBER(files_job_t, super.link, messages->next);
        h2o_linklist_unlink(&job->super.link);
        finish(job);
    }
}

/*
 * The delivery queue of `loop`, created on first use. This runs on the loop's
 * own thread (handlers are called there), which is where h2o must create the
 * queue: it registers the queue's wake-up socket with that loop.
 */
static loop_ctx_t *loop_ctx(h2o_loop_t *loop)
{
    loop_ctx_t *lc;

    if (this_loop != NULL && this_loop->loop == loop)
        return this_loop;
    pthread_mutex_lock(&pool.mutex);
    for (lc = pool.loops; lc != NULL && lc->loop != loop; lc = lc->next)
        ;
    if (lc == NULL) {
        lc = sb_mem_calloc(1, sizeof(*lc));
        lc->loop = loop;
        lc->queue = h2o_multithread_create_queue(loop);
        h2o_multithread_register_receiver(lc->queue, &lc->receiver, on_jobs_done);
        lc->next = pool.loops;
        pool.loops = lc;
    }
    pthread_mutex_unlock(&pool.mutex);
    this_loop = lc;
    return lc;
}

/* ---- arguments (loop thread) ---------------------------------------------------------------------------------------- */

/*
 * Takes the call's decoded args (call/call.h): the path is the one the check
 * matched, byte for byte, already held to the storage shape. Only the
 * target's own cap is checked here. Copied: the job may run after the
 * request is gone.
 */
static SB_WARN_UNUSED sb_status_t take_args(files_job_t *job, const sb_call_files_t *f)
{
    if (f->has_path) {
        memcpy(job->path, f->path, f->path_len + 1);
        job->has_path = 1;
    } else if (job->op != SB_OP_LIST) {
        fail(job, SB_E_FORBIDDEN, "%s", SB_PATH_WHY_UNSAFE);
        return job->res.status;
    }
    if (job->op != SB_OP_WRITE)
        return SB_OK;
    if (f->content_len > job->max_write) {
        fail(job, SB_E_BAD_ARGS, "files.write content exceeds %zu-byte cap", job->max_write);
        return job->res.status;
    }
    if (f->content_len != 0) {
        job->content = sb_mem_alloc(f->content_len);
        memcpy(job->content, f->content, f->content_len);
    }
    job->content_len = f->content_len;
    return SB_OK;
}

static const char *scope_lookup(void *ctx, const char *key)
{
    return sb_token_scope_value(ctx, key);
}

/* ---- entry ---------------------------------------------------------------------------------------------------------- */

void sb_files_handle(const sb_svc_env_t *env, const sb_files_conf_t *fc, sb_token_t *tok, const sb_call_t *call, sb_dispatch_cb cb,
                     void *arg)
{
    const sb_method_t *m = &call->m;
    files_job_t *job = sb_mem_calloc(1, sizeof(*job));
    const char *why = NULL;
    sb_status_t st;

    sb_result_init(&job->res);
    sb_token_addref(tok);
    job->tok = tok;
    job->op = m->op;
    job->binary = call->binary;
    job->cb = cb;
    job->arg = arg;
    /* copied: the configuration is freed at exit, possibly while a detached pool thread still runs */
    job->max_read = fc->max_read;
    job->max_write = fc->max_write;
    job->max_entries = fc->max_entries;

    if (m->kind != SB_MK_FILES || (m->op != SB_OP_READ && m->op != SB_OP_WRITE && m->op != SB_OP_LIST) || call->files == NULL) {
        fail(job, SB_E_NOT_IMPLEMENTED, "files operation has no host handler");
        goto Answer;
    }
    if (take_args(job, call->files) != SB_OK)
        goto Answer;
    if ((st = sb_files_root_expand(fc->root, scope_lookup, tok, job->root, sizeof(job->root), &why)) != SB_OK) {
        fail(job, st, "%s", why);
        goto Answer;
    }
    if (env->loop == NULL) {
        fail(job, SB_E_UNAVAILABLE, "files has no event loop to answer on");
        goto Answer;
    }
    job->home = loop_ctx(env->loop);
    switch (pool_submit(job)) {
    case SB_OK:
        return; /* answered by on_jobs_done, on this loop */
    case SB_E_RATE_LIMITED:
        fail(job, SB_E_RATE_LIMITED, "files queue is full (%u operations waiting)", POOL_QUEUE_MAX);
        break;
    default:
        fail(job, SB_E_UNAVAILABLE, "files worker threads could not be started");
        break;
    }
Answer:
    finish(job);
}
