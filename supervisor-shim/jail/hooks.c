/*
 * Counters the spawn path reports into (see hooks.h).
 */
#include "jail/hooks.h"

static unsigned long jail_failures;

void sb_shim_hook_jail_failure(void)
{
    ++jail_failures;
}

unsigned long sb_shim_hook_jail_failures(void)
{
    return jail_failures;
}
