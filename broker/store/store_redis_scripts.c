/*
 * The Redis backend's Lua scripts (see store_redis.c for how they are used).
 * Each is loaded once per connection with SCRIPT LOAD and run by its digest.
 */
#include "store/store_redis_int.h"

/*
 * Slots given back (KEYS[first..], ARGV[same index + off] = how many):
 * DECRBY, then a counter that went below zero is put back to 0, or deleted
 * when DECRBY created it (the run's counters had already expired). `failed`
 * is a bit mask of the keys that could not be decremented, for the caller to
 * log.
 */
#define RELEASE_LUA(first, off)                                                                                                    \
    "local failed = 0\n"                                                                                                           \
    "for i = " #first ", #KEYS do\n"                                                                                               \
    "  local r = redis.pcall('DECRBY', KEYS[i], ARGV[i + " #off "])\n"                                                             \
    "  if type(r) ~= 'number' then failed = failed + 2 ^ (i - " #first ")\n"                                                       \
    "  elseif r < 0 then\n"                                                                                                        \
    "    if redis.call('PTTL', KEYS[i]) < 0 then redis.call('DEL', KEYS[i]) else redis.call('SET', KEYS[i], '0', 'KEEPTTL') end\n" \
    "  end\n"                                                                                                                      \
    "end\n"

/*
 * The call path. KEYS[1] the token record, KEYS[2..] counters to give back
 * first (releases and lease returns of earlier calls carried along, counts
 * in ARGV[10..]). ARGV[1] the key prefix; ARGV[2..7] what the worker knows
 * of a record it parsed before (mint id, length, runId, expiresAt, calls,
 * concurrent), or empty; ARGV[8] the calls the worker asks for (0: it has
 * one leased already), ARGV[9] the concurrency slots (0 likewise).
 *
 * Calls are leased (PROTOCOL.md section 9, "Quotas across instances"): the
 * grant is what was asked for, at most a sixteenth of what the run has left
 * and at least one, so a run near its limit gets one call at a time and no
 * more is ever granted in total than its quota. A run with nothing left is
 * refused without counting. Slots are granted as asked, up to what is free.
 *
 * Returns {failed, 0} no record; {failed, 3} a record it cannot read; else
 * {failed, code, calls granted, slots granted} when the record is the one the
 * worker knows (same mint id at its fixed offset and same length: records
 * never change once written, and each write gets a fresh id), or the same
 * with the record and its runId appended; code is 1 calls per run exceeded,
 * 2 concurrent calls exceeded (the calls granted are counted), 4 granted;
 * {failed, 3} also when a counter is not a number (read before anything is
 * counted, so a broken counter costs the run nothing). A
 * record the worker does not know is read with one anchored match (token.c
 * writes runId, expiresAt and the call quotas first), or decoded in full when
 * written in another order. The mint creates the run's counters with the
 * run's latest expiry; a counter not there yet (a record from an older
 * version) gets the token's.
 */
static const char script_lookup[] = "#!lua\n" RELEASE_LUA(
    2, 8) "local rec = redis.call('GET', KEYS[1])\n"
          "if not rec then return {failed, 0} end\n"
          "local run, exp, calls, conc\n"
          "local known = ARGV[2] ~= '' and #rec == tonumber(ARGV[3]) and string.sub(rec, 16, 47) == ARGV[2]\n"
          "if known then\n"
          "  run, exp, calls, conc = ARGV[4], ARGV[5], ARGV[6], ARGV[7]\n"
          "else\n"
          "  run, exp, calls, conc = string.match(rec, '^{\"v\":1,\"mint\":\"%x+\",\"runId\":\"([^\"\\\\]+)\",\"expiresAt\":(%d+),"
          "\"quota\":{\"calls\":(%d+),\"concurrent\":(%d+),')\n"
          "end\n"
          "if not run then\n"
          "  local ok, o = pcall(cjson.decode, rec)\n"
          "  if not ok or type(o) ~= 'table' or type(o.runId) ~= 'string' or type(o.expiresAt) ~= 'number' or\n"
          "     type(o.quota) ~= 'table' or type(o.quota.calls) ~= 'number' or type(o.quota.concurrent) ~= 'number' then\n"
          "    return {failed, 3}\n"
          "  end\n"
          "  run = o.runId\n"
          "  exp = string.format('%.0f', o.expiresAt)\n"
          "  calls = o.quota.calls\n"
          "  conc = o.quota.concurrent\n"
          "end\n"
          "exp = tonumber(exp)\n"
          "local function answer(code, gc, gs) if known then return {failed, code, gc, gs} end return {failed, code, gc, gs, rec, "
          "run} end\n"
          "local function take(k, n)\n"
          "  if redis.call('INCRBY', k, n) == n and redis.call('PEXPIRETIME', k) < exp then redis.call('PEXPIREAT', k, exp) end\n"
          "end\n"
          "local ck, ik = ARGV[1] .. 'q:calls:' .. run, ARGV[1] .. 'q:inflight:' .. run\n"
          "local used, busy = tonumber(redis.call('GET', ck) or '0'), tonumber(redis.call('GET', ik) or '0')\n"
          "if not used or not busy then return {failed, 3} end\n"
          "local gc, wc, ws = 0, tonumber(ARGV[8]), tonumber(ARGV[9])\n"
          "if wc > 0 then\n"
          "  local left = tonumber(calls) - used\n"
          "  if left <= 0 then return answer(1, 0, 0) end\n"
          "  gc = math.max(1, math.min(wc, math.floor(left / 16)))\n"
          "  take(ck, gc)\n"
          "end\n"
          "if ws > 0 then\n"
          "  local free = tonumber(conc) - busy\n"
          "  if free <= 0 then return answer(2, gc, 0) end\n"
          "  if ws > free then ws = free end\n"
          "  take(ik, ws)\n"
          "end\n"
          "return answer(4, gc, ws)\n";
/* releases on their own (no call followed within the loop pass): KEYS[1..] slots, ARGV counts; returns the failed mask */
static const char script_release[] = "#!lua\n" RELEASE_LUA(1, 0) "return failed\n";
/* KEYS[1] the run's fetched-bytes counter, ARGV[1] bytes, ARGV[2] the token's expiry */
static const char script_fetch_add[] = "#!lua\n"
                                       "redis.call('INCRBY', KEYS[1], ARGV[1])\n"
                                       "if redis.call('PEXPIRETIME', KEYS[1]) < tonumber(ARGV[2]) then\n"
                                       "  redis.call('PEXPIREAT', KEYS[1], ARGV[2]) end\n"
                                       "return 0\n";
/*
 * mint: SET NX with expiry, index the token under its run, and make sure the
 * run's call counters (KEYS[3], KEYS[4]) live as long as its latest token
 * (ARGV[4], absolute), so the call path never has to look at their expiry
 */
static const char script_mint[] = "#!lua\n"
                                  "if not redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2], 'NX') then return 0 end\n"
                                  "redis.call('SADD', KEYS[2], ARGV[3])\n"
                                  "if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[2]) then\n"
                                  "  redis.call('PEXPIRE', KEYS[2], ARGV[2]) end\n"
                                  "for i = 3, 4 do\n"
                                  "  if not redis.call('SET', KEYS[i], '0', 'NX', 'PXAT', ARGV[4]) and\n"
                                  "     redis.call('PEXPIRETIME', KEYS[i]) < tonumber(ARGV[4]) then\n"
                                  "    redis.call('PEXPIREAT', KEYS[i], ARGV[4]) end\n"
                                  "end\n"
                                  "return 1\n";
/* revoke a run: every token indexed under it, then the index */
static const char script_revoke_run[] = "#!lua\n"
                                        "local m = redis.call('SMEMBERS', KEYS[1])\n"
                                        "for _, h in ipairs(m) do redis.call('DEL', ARGV[1] .. h) end\n"
                                        "redis.call('DEL', KEYS[1]) return #m\n";
/*
 * inspect a run, reading only: KEYS[1] its token index, KEYS[2..4] its calls,
 * in-flight and fetched-bytes counters; ARGV[1] the token key prefix, ARGV[2]
 * the most records to return. Returns {calls, inflight, bytes, live, hash,
 * record, ...}: the index also holds revoked tokens (a token revocation
 * deletes only the record), which have no record and are not counted.
 */
static const char script_inspect_run[] = "#!lua\n"
                                         "local out = {redis.call('GET', KEYS[2]) or '0', redis.call('GET', KEYS[3]) or '0',\n"
                                         "             redis.call('GET', KEYS[4]) or '0', 0}\n"
                                         "local live, max = 0, tonumber(ARGV[2])\n"
                                         "for _, h in ipairs(redis.call('SMEMBERS', KEYS[1])) do\n"
                                         "  local r = redis.call('GET', ARGV[1] .. h)\n"
                                         "  if r then\n"
                                         "    live = live + 1\n"
                                         "    if live <= max then out[#out + 1] = h out[#out + 1] = r end\n"
                                         "  end\n"
                                         "end\n"
                                         "out[4] = live return out\n";

/*
 * One tools.call of a run: KEYS[1] the run's tools.call counter, KEYS[2] its
 * call counter (which the mint keeps alive as long as the run's latest token),
 * ARGV[1] the calling token's expiry. Counts, then makes the counter live as
 * long as the later of the two, so it cannot expire, and start again from 0,
 * while the run still has a token. Returns the count, this call included.
 */
static const char script_tool_call[] =
    "#!lua\n"
    "local n = redis.call('INCR', KEYS[1])\n"
    "local exp = tonumber(ARGV[1])\n"
    "local run = redis.call('PEXPIRETIME', KEYS[2])\n"
    "if run > exp then exp = run end\n"
    "if redis.call('PEXPIRETIME', KEYS[1]) < exp then redis.call('PEXPIREAT', KEYS[1], exp) end\n"
    "return n\n";

/*
 * A run's import.fetch counters: KEYS[1] its modules, KEYS[2] its module
 * bytes, KEYS[3] its call counter (alive as long as the run's latest token),
 * ARGV[1] the calling token's expiry, ARGV[2] and ARGV[3] what to add. Both
 * counters live as long as the later of the two expiries, as the tools.call
 * counter does. Returns {modules, bytes}, this call included.
 */
static const char script_modules[] =
    "#!lua\n"
    "local m = redis.call('INCRBY', KEYS[1], ARGV[2])\n"
    "local b = redis.call('INCRBY', KEYS[2], ARGV[3])\n"
    "local exp = tonumber(ARGV[1])\n"
    "local run = redis.call('PEXPIRETIME', KEYS[3])\n"
    "if run > exp then exp = run end\n"
    "for i = 1, 2 do if redis.call('PEXPIRETIME', KEYS[i]) < exp then redis.call('PEXPIREAT', KEYS[i], exp) end end\n"
    "return {m, b}\n";

const sb_store_redis_script_t sb_store__redis_scripts[SB_STORE_NSCRIPTS] = {
    {script_lookup, sizeof(script_lookup) - 1},         {script_release, sizeof(script_release) - 1},
    {script_fetch_add, sizeof(script_fetch_add) - 1},   {script_mint, sizeof(script_mint) - 1},
    {script_revoke_run, sizeof(script_revoke_run) - 1}, {script_inspect_run, sizeof(script_inspect_run) - 1},
    {script_tool_call, sizeof(script_tool_call) - 1},   {script_modules, sizeof(script_modules) - 1},
};
