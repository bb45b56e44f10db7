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
 * small pool of threads shared by all workers, behind a bounded queue: a full
 * queue answers rate_limited at once instead of growing without bound. The
 * pool belongs to the server, which creates it and joins its threads
 * (sb_files_pool_create / destroy); each worker has a files context on its
 * loop (sb_files_ctx_create) where the results of its jobs are delivered. The
 * loop side (argument parsing, the root template) runs before the job is
 * queued; the result goes back to the loop that started the call through the
 * context's h2o_multithread queue, and the callback runs there, never on a
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

/* the server's pool: jobs waiting for a thread, and the threads */
struct st_sb_files_pool_t {
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    struct st_files_job_t *head, *tail;
    size_t queued;
    int stopping;
    pthread_t *threads;
    unsigned nthreads;
};

/* one per worker loop: where the results of its jobs are delivered (a receiver on the loop's queue) */
struct st_sb_files_ctx_t {
    sb_files_pool_t *pool;
    h2o_multithread_queue_t *queue;
    h2o_multithread_receiver_t receiver;
    size_t pending; /* jobs queued or running, not yet answered (loop-local) */
};

typedef struct st_files_job_t {
    h2o_multithread_message_t super; /* the delivery back to `home` */
    struct st_files_job_t *next;     /* the pool's queue */
    sb_files_ctx_t *home;
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

/* runs jobs until the pool stops and its queue is empty: a job accepted is always run and answered */
static void *pool_main(void *arg)
{
    sb_files_pool_t *p = arg;

    for (;;) {
        files_job_t *job;
        pthread_mutex_lock(&p->mutex);
        while (p->head == NULL && !p->stopping)
            pthread_cond_wait(&p->cond, &p->mutex);
        if ((job = p->head) == NULL) {
            pthread_mutex_unlock(&p->mutex);
            return NULL;
        }
        if ((p->head = job->next) == NULL)
            p->tail = NULL;
        --p->queued;
        pthread_mutex_unlock(&p->mutex);
        run_job(job);
        h2o_multithread_send_message(&job->home->receiver, &job->super);
    }
}

/*
 * The threads inherit the signal mask of the thread that creates the pool
 * (main blocks SIGTERM, SIGINT and the other handled signals for every thread
 * but its signal thread before the server is created).
 */
sb_files_pool_t *sb_files_pool_create(unsigned nthreads)
{
    sb_files_pool_t *p = sb_mem_calloc(1, sizeof(*p));

    pthread_mutex_init(&p->mutex, NULL);
    pthread_cond_init(&p->cond, NULL);
    p->threads = sb_mem_calloc(nthreads != 0 ? nthreads : 1, sizeof(*p->threads));
    for (unsigned i = 0; i != nthreads; ++i)
        if (pthread_create(&p->threads[p->nthreads], NULL, pool_main, p) == 0)
            ++p->nthreads;
    return p;
}

void sb_files_pool_destroy(sb_files_pool_t *p)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->mutex);
    p->stopping = 1;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->mutex);
    for (unsigned i = 0; i != p->nthreads; ++i)
        pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->cond);
    pthread_mutex_destroy(&p->mutex);
    sb_mem_free(p->threads);
    sb_mem_free(p);
}

static SB_WARN_UNUSED sb_status_t pool_submit(sb_files_pool_t *p, files_job_t *job)
{
    sb_status_t st = SB_OK;

    pthread_mutex_lock(&p->mutex);
    if (p->nthreads == 0 || p->stopping) {
        st = SB_E_UNAVAILABLE;
    } else if (p->queued >= POOL_QUEUE_MAX) {
        st = SB_E_RATE_LIMITED;
    } else {
        job->next = NULL;
        if (p->tail != NULL)
            p->tail->next = job;
        else
            p->head = job;
        p->tail = job;
        ++p->queued;
        pthread_cond_signal(&p->cond);
    }
    pthread_mutex_unlock(&p->mutex);
    return st;
}

static void on_jobs_done(h2o_multithread_receiver_t *receiver, h2o_linklist_t *messages)
{
    sb_files_ctx_t *fc = H2O_STRUCT_FROM_MEMBER(sb_files_ctx_t, receiver, receiver);

    while (!h2o_linklist_is_empty(messages)) {
        files_job_t *job = H2O_STRUCT_FROM_MEMBER(files_job_t, super.link, messages->next);
        h2o_linklist_unlink(&job->super.link);
        --fc->pending;
        finish(job);
    }
}

/*
 * A receiver on the loop's existing queue rather than a queue of its own:
 * h2o 2.2.5's h2o_multithread_destroy_queue does not free the queue, so a
 * queue lives as long as its loop.
 */
sb_files_ctx_t *sb_files_ctx_create(sb_files_pool_t *pool, h2o_multithread_queue_t *queue)
{
    sb_files_ctx_t *fc = sb_mem_calloc(1, sizeof(*fc));

    fc->pool = pool;
    fc->queue = queue;
    h2o_multithread_register_receiver(fc->queue, &fc->receiver, on_jobs_done);
    return fc;
}

size_t sb_files_ctx_pending(const sb_files_ctx_t *fc)
{
    return fc != NULL ? fc->pending : 0;
}

void sb_files_ctx_destroy(sb_files_ctx_t *fc)
{
    if (fc == NULL)
        return;
    h2o_multithread_unregister_receiver(fc->queue, &fc->receiver);
    sb_mem_free(fc);
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
    /* copied: the job may run after a reload has replaced the configuration */
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
    if (env->files == NULL) {
        fail(job, SB_E_UNAVAILABLE, "files has no event loop to answer on");
        goto Answer;
    }
    job->home = env->files;
    switch (pool_submit(env->files->pool, job)) {
    case SB_OK:
        ++env->files->pending;
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
