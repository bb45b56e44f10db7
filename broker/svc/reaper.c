/*
 * broker/svc: the reaper of a worker's loop (handlers.h, "ownership of the
 * per-worker contexts a reload replaces").
 *
 * A context whose last reference goes is not freed where that happens: the
 * last release usually runs inside one of the context's own callbacks (a
 * deadline on its timer queue, a resolver answer, a libpq socket), and h2o
 * reads the queue it is running, or the socket, after the callback returns.
 * The context links an entry of its own to this 0 ms queue instead, which
 * belongs to the worker and outlives every context, and is freed from there.
 */
#include "svc/handlers.h"

void sb_reaper_init(sb_reaper_t *r, h2o_loop_t *loop)
{
    r->loop = loop;
    r->live = 0;
    h2o_timeout_init(loop, &r->now, 0);
}

int sb_reaper_idle(const sb_reaper_t *r)
{
    return r->live == 0;
}

void sb_reaper_dispose(sb_reaper_t *r)
{
    h2o_timeout_dispose(r->loop, &r->now);
}

void sb_reaper__created(sb_reaper_t *r)
{
    ++r->live;
}

void sb_reaper__schedule(sb_reaper_t *r, h2o_timeout_entry_t *entry)
{
    h2o_timeout_link(r->loop, &r->now, entry);
}

void sb_reaper__freed(sb_reaper_t *r)
{
    --r->live;
}
