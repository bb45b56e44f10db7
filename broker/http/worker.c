/*
 * broker/http: the per-thread worker pointer (worker.h). It lives apart from
 * server.c, which sets it, so the routes depend on the worker's state and
 * never on the life cycle that runs it.
 */
#include "http/worker.h"

__thread sb_worker_t *sb_current_worker;
