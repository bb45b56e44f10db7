/*
 * Unit tests for broker/authz/manifest.c: strict manifest parsing and the
 * exact error messages naming the offending path, and the interning of
 * parsed manifests. What a parsed manifest grants is tested through
 * sb_authz_check in authz_check.c.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "tap.h"
#include "sb/limits.h"
#include "sb/mem.h"
#include "authz/authz.h"
#include "authz/manifest_int.h"

static const struct {
    const char *json;
    const char *err; /* NULL: accepted */
} cases[] = {
    /* the whole thing */
    {"null", NULL},
    {"{}", NULL},
    {"[]", "capabilities: must be an object"},
    {"1", "capabilities: must be an object"},
    {"\"net\"", "capabilities: must be an object"},
    {"{\"fils\": []}", "capabilities.fils: unknown key"},
    {"{\"Net\": []}", "capabilities.Net: unknown key"},
    {"{\"__proto__\": {}}", "capabilities.__proto__: unknown key"},
    {"{\"constructor\": []}", "capabilities.constructor: unknown key"},
    {"{\"knowledge\": {}}", "capabilities.knowledge: unknown key"},
    {"{\"net\": [], \"bogus\": 1}", "capabilities.bogus: unknown key"},
    /* a full manifest */
    {"{\"net\": [\"example.com\"], \"import\": [\"deno.land\"], \"files\": {\"read\": [\"a/**\"], \"write\": [\"b/*\"]},"
     " \"data\": {\"collections\": {\"posts\": [\"read\", \"create\", \"update\", \"delete\", \"read\"]},"
     " \"globals\": {\"site\": [\"read\", \"write\"]}, \"stores\": {\"notes\": [\"read\", \"write\"]}},"
     " \"services\": [\"billing\"], \"jobs\": [\"reindex\"], \"workflows\": [\"onboard\"], \"tools\": [\"github.*\"],"
     " \"timeoutMs\": 30000, \"memoryMb\": 256}",
     NULL},
    {"{\"net\": [], \"import\": [], \"files\": {}, \"data\": {}, \"services\": [], \"jobs\": [], \"workflows\": [], \"tools\": []}",
     NULL},
    {"{\"files\": {\"read\": []}, \"data\": {\"collections\": {}, \"globals\": {}, \"stores\": {}}}", NULL},
    {"{\"data\": {\"collections\": {\"posts\": []}}}", NULL},

    /* net */
    {"{\"net\": \"example.com\"}", "capabilities.net: must be an array"},
    {"{\"net\": null}", "capabilities.net: must be an array"},
    {"{\"net\": {}}", "capabilities.net: must be an array"},
    {"{\"net\": [1]}", "capabilities.net[0]: must be a string or an object"},
    {"{\"net\": [\"ok.example\", null]}", "capabilities.net[1]: must be a string or an object"},
    /* net entries as objects: {host, methods?, paths?} */
    {"{\"net\": [{\"host\": \"api.test:8443\", \"methods\": [\"GET\", \"HEAD\"], \"paths\": [\"/repos/acme/**\"]}, \"x.test\"]}",
     NULL},
    {"{\"net\": [{\"host\": \"*.api.test\"}]}", NULL},
    {"{\"net\": [{\"host\": \"api.test\", \"verbs\": []}]}", "capabilities.net[0].verbs: unknown key"},
    {"{\"net\": [{\"methods\": [\"GET\"]}]}", "capabilities.net[0].host: must be a string"},
    {"{\"net\": [\"a.test\", {\"host\": 1}]}", "capabilities.net[1].host: must be a string"},
    {"{\"net\": [{\"host\": \"a.test/x\"}]}", "capabilities.net[0].host: '/' is not allowed"},
    {"{\"net\": [{\"host\": \"a.test\", \"methods\": [\"get\"]}]}",
     "capabilities.net[0].methods[0]: expected an uppercase HTTP method"},
    {"{\"net\": [{\"host\": \"a.test\", \"methods\": [\"G ET\"]}]}",
     "capabilities.net[0].methods[0]: expected an uppercase HTTP method"},
    {"{\"net\": [{\"host\": \"a.test\", \"methods\": []}]}",
     "capabilities.net[0].methods: must not be empty (omit it to allow any)"},
    {"{\"net\": [{\"host\": \"a.test\", \"methods\": \"GET\"}]}", "capabilities.net[0].methods: must be an array"},
    {"{\"net\": [{\"host\": \"a.test\", \"paths\": [\"repos/**\"]}]}",
     "capabilities.net[0].paths[0]: expected a glob starting with '/'"},
    {"{\"net\": [{\"host\": \"a.test\", \"paths\": [\"/a b\"]}]}",
     "capabilities.net[0].paths[0]: expected a glob starting with '/'"},
    {"{\"net\": [{\"host\": \"a.test\", \"paths\": [1]}]}", "capabilities.net[0].paths[0]: must be a string"},
    {"{\"import\": [{\"host\": \"a.test\"}]}", "capabilities.import[0]: must be a string"},
    /* the target secrets a run receives */
    {"{\"secrets\": [\"github\", \"a.b-c_D9\"]}", NULL},
    {"{\"secrets\": \"github\"}", "capabilities.secrets: must be an array"},
    {"{\"secrets\": [\"bad name\"]}", "capabilities.secrets[0]: expected a secret name of [A-Za-z0-9_.-]{1,64}"},
    {"{\"secrets\": [\"\"]}", "capabilities.secrets[0]: expected a secret name of [A-Za-z0-9_.-]{1,64}"},
    {"{\"net\": [\"example.com\", \"Example.COM:443\", \"*.example.com\", \"*.example.com:8443\", \"[::1]:8080\", \"[::1]\","
     " \"::1\", \"2001:db8::1\", \"1.2.3.4:80\", \"example.com.\", \"localhost\", \"a_b\"]}",
     NULL},
    {"{\"net\": [\"\"]}", "capabilities.net[0]: empty entry"},
    {"{\"net\": [\"a b\"]}", "capabilities.net[0]: whitespace or control character"},
    {"{\"net\": [\" a\"]}", "capabilities.net[0]: whitespace or control character"},
    {"{\"net\": [\"a\\tb\"]}", "capabilities.net[0]: whitespace or control character"},
    {"{\"net\": [\"a\\u007f\"]}", "capabilities.net[0]: whitespace or control character"},
    {"{\"net\": [\"a\\u0000b\"]}", "capabilities.net[0]: whitespace or control character"},
    {"{\"net\": [\"example.com/path\"]}", "capabilities.net[0]: '/' is not allowed"},
    {"{\"net\": [\"https://example.com\"]}", "capabilities.net[0]: '/' is not allowed"},
    {"{\"net\": [\"user@example.com\"]}", "capabilities.net[0]: '@' is not allowed"},
    {"{\"net\": [\"*\"]}", "capabilities.net[0]: '*' is only allowed as a leading \"*.\""},
    {"{\"net\": [\"*:443\"]}", "capabilities.net[0]: '*' is only allowed as a leading \"*.\""},
    {"{\"net\": [\"*example.com\"]}", "capabilities.net[0]: '*' is only allowed as a leading \"*.\""},
    {"{\"net\": [\"a*.example.com\"]}", "capabilities.net[0]: '*' is only allowed as a leading \"*.\""},
    {"{\"net\": [\"*.*.example.com\"]}", "capabilities.net[0]: '*' is only allowed as a leading \"*.\""},
    {"{\"net\": [\"*.example.*\"]}", "capabilities.net[0]: '*' is only allowed as a leading \"*.\""},
    {"{\"net\": [\"*.\"]}", "capabilities.net[0]: '*' is only allowed as a leading \"*.\""},
    {"{\"net\": [\"*..\"]}", "capabilities.net[0]: empty wildcard suffix"},
    {"{\"net\": [\"example.com:\"]}", "capabilities.net[0]: invalid port"},
    {"{\"net\": [\"example.com:0\"]}", "capabilities.net[0]: invalid port"},
    {"{\"net\": [\"example.com:65536\"]}", "capabilities.net[0]: invalid port"},
    {"{\"net\": [\"example.com:123456\"]}", "capabilities.net[0]: invalid port"},
    {"{\"net\": [\"example.com:https\"]}", "capabilities.net[0]: invalid port"},
    {"{\"net\": [\"example.com:-1\"]}", "capabilities.net[0]: invalid port"},
    {"{\"net\": [\":443\"]}", "capabilities.net[0]: empty host"},
    {"{\"net\": [\".\"]}", "capabilities.net[0]: empty host"},
    {"{\"net\": [\"a:1:2\"]}", "capabilities.net[0]: invalid IPv6 literal"},
    {"{\"net\": [\"[::1\"]}", "capabilities.net[0]: invalid IPv6 literal"},
    {"{\"net\": [\"[]\"]}", "capabilities.net[0]: invalid IPv6 literal"},
    {"{\"net\": [\"[example.com]:80\"]}", "capabilities.net[0]: invalid IPv6 literal"},
    {"{\"net\": [\"[fe80::1%eth0]:80\"]}", "capabilities.net[0]: invalid IPv6 literal"},
    {"{\"net\": [\"fe80::1%eth0\"]}", "capabilities.net[0]: invalid IPv6 literal"},
    {"{\"net\": [\"[::1]x\"]}", "capabilities.net[0]: invalid port"},
    {"{\"net\": [\"[::1]:\"]}", "capabilities.net[0]: invalid port"},
    {"{\"net\": [\"[::1]:0\"]}", "capabilities.net[0]: invalid port"},
    {"{\"net\": [\"a]b\"]}", "capabilities.net[0]: invalid host"},
    {"{\"net\": [\"bücher.de\"]}", "capabilities.net[0]: non-ASCII host (use the A-label form)"},
    {"{\"import\": [\"deno.land\", \"esm.sh:443\", \"*.jsdelivr.net\"]}", NULL},
    {"{\"import\": \"deno.land\"}", "capabilities.import: must be an array"},
    {"{\"import\": [\"deno.land/x\"]}", "capabilities.import[0]: '/' is not allowed"},
    {"{\"import\": [\"ok\", \"*\"]}", "capabilities.import[1]: '*' is only allowed as a leading \"*.\""},

    /* files */
    {"{\"files\": []}", "capabilities.files: must be an object"},
    {"{\"files\": null}", "capabilities.files: must be an object"},
    {"{\"files\": {\"reed\": []}}", "capabilities.files.reed: unknown key"},
    {"{\"files\": {\"read\": \"a/**\"}}", "capabilities.files.read: must be an array"},
    {"{\"files\": {\"write\": [1]}}", "capabilities.files.write[0]: must be a string"},
    {"{\"files\": {\"read\": [\"a/**\", \"./b\", \"c//d\", \"[x]\", \"{y}\", \"a/./b\", \"...\"]}}", NULL},
    {"{\"files\": {\"read\": [\"../x\"]}}", "capabilities.files.read[0]: unsafe glob"},
    {"{\"files\": {\"read\": [\"ok\", \"a/../b\"]}}", "capabilities.files.read[1]: unsafe glob"},
    {"{\"files\": {\"read\": [\"/etc/**\"]}}", "capabilities.files.read[0]: unsafe glob"},
    {"{\"files\": {\"read\": [\"a\\\\b\"]}}", "capabilities.files.read[0]: unsafe glob"},
    {"{\"files\": {\"read\": [\"a\\u0000b\"]}}", "capabilities.files.read[0]: unsafe glob"},
    {"{\"files\": {\"write\": [\"\"]}}", "capabilities.files.write[0]: unsafe glob"},
    {"{\"files\": {\"write\": [\"./\"]}}", "capabilities.files.write[0]: unsafe glob"},
    {"{\"files\": {\"write\": [\"**/..\"]}}", "capabilities.files.write[0]: unsafe glob"},

    /* data */
    {"{\"data\": []}", "capabilities.data: must be an object"},
    {"{\"data\": {\"colections\": {}}}", "capabilities.data.colections: unknown key"},
    {"{\"data\": {\"collections\": []}}", "capabilities.data.collections: must be an object"},
    {"{\"data\": {\"globals\": null}}", "capabilities.data.globals: must be an object"},
    {"{\"data\": {\"stores\": \"notes\"}}", "capabilities.data.stores: must be an object"},
    {"{\"data\": {\"collections\": {\"posts\": [\"read\", \"drop\"]}}}",
     "capabilities.data.collections.posts[1]: unknown verb \"drop\""},
    {"{\"data\": {\"collections\": {\"posts\": [\"write\"]}}}", "capabilities.data.collections.posts[0]: unknown verb \"write\""},
    {"{\"data\": {\"collections\": {\"posts\": [\"READ\"]}}}", "capabilities.data.collections.posts[0]: unknown verb \"READ\""},
    {"{\"data\": {\"collections\": {\"posts\": [\"read \"]}}}", "capabilities.data.collections.posts[0]: unknown verb \"read \""},
    {"{\"data\": {\"collections\": {\"posts\": [\"re\\\"ad\\n\"]}}}",
     "capabilities.data.collections.posts[0]: unknown verb \"re?ad?\""},
    {"{\"data\": {\"collections\": {\"posts\": [\"\"]}}}", "capabilities.data.collections.posts[0]: unknown verb \"\""},
    {"{\"data\": {\"globals\": {\"site\": [\"create\"]}}}", "capabilities.data.globals.site[0]: unknown verb \"create\""},
    {"{\"data\": {\"globals\": {\"site\": [\"read\", \"delete\"]}}}", "capabilities.data.globals.site[1]: unknown verb \"delete\""},
    {"{\"data\": {\"stores\": {\"notes\": [\"update\"]}}}", "capabilities.data.stores.notes[0]: unknown verb \"update\""},
    {"{\"data\": {\"collections\": {\"posts\": \"read\"}}}", "capabilities.data.collections.posts: must be an array"},
    {"{\"data\": {\"collections\": {\"posts\": {\"read\": true}}}}", "capabilities.data.collections.posts: must be an array"},
    {"{\"data\": {\"collections\": {\"posts\": [true]}}}", "capabilities.data.collections.posts[0]: must be a string"},
    {"{\"data\": {\"collections\": {\"bad name\": [\"read\"]}}}", "capabilities.data.collections: invalid name \"bad name\""},
    {"{\"data\": {\"collections\": {\"\": [\"read\"]}}}", "capabilities.data.collections: invalid name \"\""},
    {"{\"data\": {\"collections\": {\"a.b\": [\"read\"]}}}", "capabilities.data.collections: invalid name \"a.b\""},
    {"{\"data\": {\"stores\": {\"nötes\": [\"read\"]}}}", "capabilities.data.stores: invalid name \"n??tes\""},
    {"{\"data\": {\"collections\": {\"__proto__\": [\"read\"], \"constructor\": [], \"toString\": [\"delete\"]}}}", NULL},
    {"{\"data\": {\"globals\": {\"site\": [\"read\", \"write\", \"write\"]}, \"stores\": {\"a-b_C9\": [\"write\"]}}}", NULL},

    /* names */
    {"{\"services\": \"billing\"}", "capabilities.services: must be an array"},
    {"{\"services\": [\"billing\", \"a b\"]}", "capabilities.services[1]: invalid name"},
    {"{\"services\": [\"\"]}", "capabilities.services[0]: invalid name"},
    {"{\"services\": [\"a.b\"]}", "capabilities.services[0]: invalid name"},
    {"{\"services\": [\"__proto__\", \"constructor\", \"billing\", \"billing\"]}", NULL},
    {"{\"jobs\": [\"re/index\"]}", "capabilities.jobs[0]: invalid name"},
    {"{\"jobs\": [7]}", "capabilities.jobs[0]: must be a string"},
    {"{\"workflows\": [\"on*\"]}", "capabilities.workflows[0]: invalid name"},
    {"{\"workflows\": {}}", "capabilities.workflows: must be an array"},

    /* tools */
    {"{\"tools\": [\"github.*\", \"*\", \"a?c\", \"x-y_z.1\", \"**\"]}", NULL},
    {"{\"tools\": [\"a/b\"]}", "capabilities.tools[0]: invalid tool glob"},
    {"{\"tools\": [\"\"]}", "capabilities.tools[0]: invalid tool glob"},
    {"{\"tools\": [\"a b\"]}", "capabilities.tools[0]: invalid tool glob"},
    {"{\"tools\": [\"[ab]\"]}", "capabilities.tools[0]: invalid tool glob"},
    {"{\"tools\": \"*\"}", "capabilities.tools: must be an array"},

    /* numbers */
    {"{\"timeoutMs\": 1, \"memoryMb\": 16}", NULL},
    {"{\"timeoutMs\": 86400000, \"memoryMb\": 65536}", NULL},
    {"{\"timeoutMs\": 0}", "capabilities.timeoutMs: must be an integer from 1 to 86400000"},
    {"{\"timeoutMs\": -5}", "capabilities.timeoutMs: must be an integer from 1 to 86400000"},
    {"{\"timeoutMs\": 86400001}", "capabilities.timeoutMs: must be an integer from 1 to 86400000"},
    {"{\"timeoutMs\": 1000.5}", "capabilities.timeoutMs: must be an integer from 1 to 86400000"},
    {"{\"timeoutMs\": 1000.0}", "capabilities.timeoutMs: must be an integer from 1 to 86400000"},
    {"{\"timeoutMs\": \"1000\"}", "capabilities.timeoutMs: must be an integer from 1 to 86400000"},
    {"{\"timeoutMs\": true}", "capabilities.timeoutMs: must be an integer from 1 to 86400000"},
    {"{\"timeoutMs\": null}", "capabilities.timeoutMs: must be an integer from 1 to 86400000"},
    {"{\"timeoutMs\": 99999999999999999}", "capabilities.timeoutMs: must be an integer from 1 to 86400000"},
    {"{\"memoryMb\": 15}", "capabilities.memoryMb: must be an integer from 16 to 65536"},
    {"{\"memoryMb\": 65537}", "capabilities.memoryMb: must be an integer from 16 to 65536"},
    {"{\"memoryMb\": [256]}", "capabilities.memoryMb: must be an integer from 16 to 65536"},
    /* decide: method patterns and fetch entries (the net grammar) */
    {"{\"decide\": {}}", NULL},
    {"{\"decide\": {\"methods\": [\"collections.posts.delete\", \"tools.call\", \"store.*.create\", \"collections.*.*\","
     " \"services.*.*\", \"jobs.enqueue.*\", \"http.fetch\", \"files.*\", \"collections.document_store.delete\"]}}",
     NULL},
    {"{\"decide\": {\"fetch\": [\"pay.test\", {\"host\": \"*.stripe.test\", \"methods\": [\"POST\"], \"paths\": [\"/v1/**\"]}]}}",
     NULL},
    {"{\"decide\": []}", "capabilities.decide: must be an object"},
    {"{\"decide\": {\"method\": []}}", "capabilities.decide.method: unknown key"},
    {"{\"decide\": {\"methods\": \"tools.call\"}}", "capabilities.decide.methods: must be an array"},
    {"{\"decide\": {\"methods\": [1]}}", "capabilities.decide.methods[0]: must be a string"},
    {"{\"decide\": {\"methods\": [\"\"]}}",
     "capabilities.decide.methods[0]: invalid method pattern: expected a method pattern of at most 256 bytes"},
    {"{\"decide\": {\"methods\": [\"*.posts.delete\"]}}",
     "capabilities.decide.methods[0]: invalid method pattern: the first segment names the method family"},
    {"{\"decide\": {\"methods\": [\"collections.posts.remove\"]}}",
     "capabilities.decide.methods[0]: invalid method pattern: matches no method"},
    {"{\"decide\": {\"methods\": [\"colections.posts.delete\"]}}",
     "capabilities.decide.methods[0]: invalid method pattern: matches no method"},
    {"{\"decide\": {\"methods\": [\"collections.posts\"]}}",
     "capabilities.decide.methods[0]: invalid method pattern: matches no method"},
    {"{\"decide\": {\"methods\": [\"collections.posts.delete.x\"]}}",
     "capabilities.decide.methods[0]: invalid method pattern: a method has at most 3 segments"},
    {"{\"decide\": {\"methods\": [\"collections.po*.delete\"]}}",
     "capabilities.decide.methods[0]: invalid method pattern: each segment is a name or \"*\""},
    {"{\"decide\": {\"methods\": [\"collections..delete\"]}}",
     "capabilities.decide.methods[0]: invalid method pattern: each segment is a name or \"*\""},
    {"{\"decide\": {\"methods\": [\"jobs.*\"]}}",
     "capabilities.decide.methods[0]: invalid method pattern: matches no method"},
    {"{\"decide\": {\"fetch\": [\"a b\"]}}", "capabilities.decide.fetch[0]: whitespace or control character"},
    {"{\"decide\": {\"fetch\": [{\"host\": \"a.test\", \"methods\": [\"post\"]}]}}",
     "capabilities.decide.fetch[0].methods[0]: expected an uppercase HTTP method"},
};

static sb_status_t parse_text(const char *text, sb_manifest_t **m, char *err, size_t errsz)
{
    json_error_t jerr;
    json_t *j = json_loads(text, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
    sb_status_t st;

    if (j == NULL) {
        printf("# bad test JSON %s: %s\n", text, jerr.text);
        return SB_E_EXECUTION;
    }
    st = sb_manifest_parse(j, m, err, errsz);
    json_decref(j);
    return st;
}

static void test_table(void)
{
    size_t i;

    for (i = 0; i != sizeof(cases) / sizeof(cases[0]); ++i) {
        sb_manifest_t *m = (sb_manifest_t *)1;
        char err[256] = "(untouched)";
        sb_status_t st = parse_text(cases[i].json, &m, err, sizeof(err));
        if (cases[i].err == NULL) {
            is_int(st, SB_OK, "accept %s", cases[i].json);
            ok(m != NULL, "  manifest returned");
            if (st != SB_OK)
                printf("#   err: %s\n", err);
            sb_manifest_free(m);
        } else {
            is_int(st, SB_E_BAD_ARGS, "reject %s", cases[i].json);
            ok(m == NULL, "  no manifest returned");
            is_str(err, cases[i].err, "  error message");
        }
    }
}

/* a JSON array of n copies of a string */
static json_t *array_of(size_t n, const char *s)
{
    json_t *a = json_array();
    size_t i;

    for (i = 0; i != n; ++i)
        json_array_append_new(a, json_string(s));
    return a;
}

static sb_status_t parse_built(json_t *caps, char *err, size_t errsz)
{
    sb_manifest_t *m = NULL;
    sb_status_t st = sb_manifest_parse(caps, &m, err, errsz);

    sb_manifest_free(m);
    json_decref(caps);
    return st;
}

static void test_caps(void)
{
    char err[256], name[16], *big;
    json_t *caps, *map;
    size_t i;

    /* entries per list */
    is_int(parse_built(json_pack("{s:o}", "services", array_of(SB_MAX_MANIFEST_ENTRIES, "a")), err, sizeof(err)), SB_OK,
           "256 services accepted");
    is_int(parse_built(json_pack("{s:o}", "services", array_of(SB_MAX_MANIFEST_ENTRIES + 1, "a")), err, sizeof(err)), SB_E_BAD_ARGS,
           "257 services refused");
    is_str(err, "capabilities.services: too many entries (max 256)", "  error message");
    is_int(parse_built(json_pack("{s:o}", "net", array_of(SB_MAX_MANIFEST_ENTRIES + 1, "a")), err, sizeof(err)), SB_E_BAD_ARGS,
           "257 net entries refused");
    is_str(err, "capabilities.net: too many entries (max 256)", "  error message");
    is_int(parse_built(json_pack("{s:{s:o}}", "files", "read", array_of(SB_MAX_MANIFEST_ENTRIES + 1, "a")), err, sizeof(err)),
           SB_E_BAD_ARGS, "257 read globs refused");
    is_str(err, "capabilities.files.read: too many entries (max 256)", "  error message");
    is_int(parse_built(json_pack("{s:{s:{s:o}}}", "data", "collections", "posts", array_of(SB_MAX_MANIFEST_ENTRIES + 1, "read")),
                       err, sizeof(err)),
           SB_E_BAD_ARGS, "257 verbs refused");
    is_str(err, "capabilities.data.collections.posts: too many entries (max 256)", "  error message");

    /* entries per map */
    for (int n = SB_MAX_MANIFEST_ENTRIES; n <= (int)SB_MAX_MANIFEST_ENTRIES + 1; ++n) {
        map = json_object();
        for (i = 0; i != (size_t)n; ++i) {
            snprintf(name, sizeof(name), "c%zu", i);
            json_object_set_new(map, name, array_of(1, "read"));
        }
        caps = json_pack("{s:{s:o}}", "data", "stores", map);
        if (n == SB_MAX_MANIFEST_ENTRIES) {
            is_int(parse_built(caps, err, sizeof(err)), SB_OK, "256 stores accepted");
        } else {
            is_int(parse_built(caps, err, sizeof(err)), SB_E_BAD_ARGS, "257 stores refused");
            is_str(err, "capabilities.data.stores: too many entries (max 256)", "  error message");
        }
    }

    /* bytes per string */
    big = malloc(SB_MAX_MANIFEST_STRING + 2);
    memset(big, 'a', SB_MAX_MANIFEST_STRING + 1);
    big[SB_MAX_MANIFEST_STRING] = '\0';
    is_int(parse_built(json_pack("{s:[s]}", "tools", big), err, sizeof(err)), SB_OK, "512-byte tool glob accepted");
    is_int(parse_built(json_pack("{s:{s:[s]}}", "files", "read", big), err, sizeof(err)), SB_OK, "512-byte file glob accepted");
    big[SB_MAX_MANIFEST_STRING] = 'a';
    big[SB_MAX_MANIFEST_STRING + 1] = '\0';
    is_int(parse_built(json_pack("{s:[s]}", "tools", big), err, sizeof(err)), SB_E_BAD_ARGS, "513-byte tool glob refused");
    is_str(err, "capabilities.tools[0]: string is too long (max 512 bytes)", "  error message");
    is_int(parse_built(json_pack("{s:[s,s]}", "services", "ok", big), err, sizeof(err)), SB_E_BAD_ARGS, "513-byte name refused");
    is_str(err, "capabilities.services[1]: string is too long (max 512 bytes)", "  error message");
    /* names stop at 128 */
    big[128] = '\0';
    is_int(parse_built(json_pack("{s:[s]}", "jobs", big), err, sizeof(err)), SB_OK, "128-byte name accepted");
    big[128] = 'a';
    big[129] = '\0';
    is_int(parse_built(json_pack("{s:[s]}", "jobs", big), err, sizeof(err)), SB_E_BAD_ARGS, "129-byte name refused");
    is_str(err, "capabilities.jobs[0]: invalid name", "  error message");
    /* net hosts stop at 253 */
    big[129] = 'a';
    big[253] = '\0';
    is_int(parse_built(json_pack("{s:[s]}", "net", big), err, sizeof(err)), SB_OK, "253-byte net host accepted");
    big[253] = 'a';
    big[254] = '\0';
    is_int(parse_built(json_pack("{s:[s]}", "net", big), err, sizeof(err)), SB_E_BAD_ARGS, "254-byte net host refused");
    is_str(err, "capabilities.net[0]: host is too long", "  error message");
    free(big);
}

static void test_misc(void)
{
    sb_manifest_t *m = NULL;
    char err[16];

    is_int(sb_manifest_parse(NULL, &m, err, sizeof(err)), SB_OK, "NULL is the empty manifest");
    ok(m != NULL, "  manifest returned");
    is_int(sb_manifest_timeout_ms(m), -1, "  no timeoutMs");
    sb_manifest_free(m);

    is_int(parse_text("{\"timeoutMs\": 30000}", &m, err, sizeof(err)), SB_OK, "timeoutMs parsed");
    is_int(sb_manifest_timeout_ms(m), 30000, "  timeoutMs value");
    sb_manifest_free(m);

    is_int(parse_text("{\"fils\": []}", &m, err, sizeof(err)), SB_E_BAD_ARGS, "error with a small buffer");
    is_str(err, "capabilities.fi", "  truncated message");
    is_int(parse_text("{\"fils\": []}", &m, NULL, 0), SB_E_BAD_ARGS, "error without a buffer");

    /* keys are compared with their length: an embedded NUL does not shorten them (JSON text cannot carry one to jansson) */
    {
        char big[256];
        json_t *caps = json_object(), *data = json_object(), *globals = json_object();
        json_object_setn_new(caps, "net\0x", 5, json_array());
        is_int(parse_built(caps, big, sizeof(big)), SB_E_BAD_ARGS, "key \"net\\0x\" is not \"net\"");
        is_str(big, "capabilities.net?x: unknown key", "  error message");
        json_object_setn_new(globals, "a\0", 2, json_pack("[s]", "read"));
        json_object_set_new(data, "globals", globals);
        caps = json_pack("{s:o}", "data", data);
        is_int(parse_built(caps, big, sizeof(big)), SB_E_BAD_ARGS, "name \"a\\0\" refused");
        is_str(big, "capabilities.data.globals: invalid name \"a?\"", "  error message");
    }
    sb_manifest_free(NULL);
}

/* the text of sb_manifest_to_json for a manifest text, compact with sorted keys; NULL when it does not parse */
static char *enforced_text(const char *text)
{
    sb_manifest_t *m = NULL;
    char err[256], *out;
    json_t *j;

    if (parse_text(text, &m, err, sizeof(err)) != SB_OK)
        return NULL;
    j = sb_manifest_to_json(m);
    sb_manifest_free(m);
    out = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(j);
    return out;
}

/* sb_manifest_to_json: the enforced form, which parses back to itself */
static void test_to_json(void)
{
    static const struct {
        const char *in, *out;
    } exact[] = {
        {"null", "{}"},
        {"{\"net\": [], \"files\": {\"read\": []}, \"data\": {\"collections\": {}}, \"tools\": []}", "{}"},
        {"{\"net\": [\"Example.COM:443\", \"*.Example.com\", \"*.x.org:8443\", \"[0:0::1]:8080\", \"::1\", \"example.com.\"]}",
         "{\"net\":[\"example.com:443\",\"*.example.com\",\"*.x.org:8443\",\"[::1]:8080\",\"[::1]\",\"example.com\"]}"},
        {"{\"files\": {\"read\": [\"./a//b/**\"], \"write\": [\"out/*\"]}}",
         "{\"files\":{\"read\":[\"a/b/**\"],\"write\":[\"out/*\"]}}"},
        {"{\"data\": {\"collections\": {\"posts\": [\"delete\", \"read\", \"read\"], \"empty\": []},"
         " \"globals\": {\"site\": [\"write\", \"read\"]}}}",
         "{\"data\":{\"collections\":{\"empty\":[],\"posts\":[\"read\",\"delete\"]},\"globals\":{\"site\":[\"read\",\"write\"]}}}"},
        {"{\"services\": [\"b\"], \"jobs\": [\"j\"], \"workflows\": [\"w\"], \"tools\": [\"gh.*\"], \"import\": [\"deno.land\"],"
         " \"timeoutMs\": 5000, \"memoryMb\": 64}",
         "{\"import\":[\"deno.land\"],\"jobs\":[\"j\"],\"memoryMb\":64,\"services\":[\"b\"],\"timeoutMs\":5000,\"tools\":[\"gh.*\"]"
         ","
         "\"workflows\":[\"w\"]}"},
        /* an entry with rules keeps its object form; one without is a string */
        {"{\"net\": [{\"host\": \"API.test:8443\", \"paths\": [\"/a/**\"], \"methods\": [\"GET\", \"HEAD\"]},"
         " {\"host\": \"B.test\"}, {\"host\": \"[::1]\", \"paths\": [\"/x\"]}], \"secrets\": [\"gh\", \"a.b\"]}",
         "{\"net\":[{\"host\":\"api.test:8443\",\"methods\":[\"GET\",\"HEAD\"],\"paths\":[\"/a/**\"]},\"b.test\","
         "{\"host\":\"[::1]\",\"paths\":[\"/x\"]}],\"secrets\":[\"gh\",\"a.b\"]}"},
        {"{\"decide\": {\"fetch\": [\"Pay.test\", {\"host\": \"api.test\", \"methods\": [\"POST\"]}], \"methods\": "
         "[\"tools.call\"]}}",
         "{\"decide\":{\"fetch\":[\"pay.test\",{\"host\":\"api.test\",\"methods\":[\"POST\"]}],\"methods\":[\"tools.call\"]}}"},
        {"{\"decide\": {\"methods\": [], \"fetch\": []}}", "{}"},
    };
    size_t i;

    for (i = 0; i != sizeof(exact) / sizeof(exact[0]); ++i) {
        char *got = enforced_text(exact[i].in);
        is_str(got != NULL ? got : "(refused)", exact[i].out, "enforced form of %s", exact[i].in);
        free(got);
    }
    /* every manifest the table accepts: its enforced form parses, to the same enforced form */
    for (i = 0; i != sizeof(cases) / sizeof(cases[0]); ++i) {
        char *once, *twice;
        if (cases[i].err != NULL)
            continue;
        once = enforced_text(cases[i].json);
        twice = once != NULL ? enforced_text(once) : NULL;
        ok(once != NULL && twice != NULL && strcmp(once, twice) == 0, "enforced form is a fixpoint: %s", cases[i].json);
        free(once);
        free(twice);
    }
}

/* ---- interning ------------------------------------------------------------------------------------------------------- */

static sb_manifest_t *must_parse(const char *text)
{
    sb_manifest_t *m = NULL;
    char err[256];
    if (parse_text(text, &m, err, sizeof(err)) != SB_OK)
        printf("# parse of %s failed: %s\n", text, err);
    return m;
}

static int url_allowed(const sb_manifest_t *m, const char *url)
{
    sb_url_t u;
    const char *why;
    if (sb_url_parse(url, strlen(url), &u, &why) != SB_OK) {
        printf("# bad test URL %s: %s\n", url, why);
        return -1;
    }
    return sb_authz_fetch_allows(m, &u, "GET");
}

#define TYPICAL                                                                                                                    \
    "{\"data\": {\"collections\": {\"posts\": [\"read\", \"create\"], \"comments\": [\"read\"]}}, \"files\": {\"read\": "          \
    "[\"uploads/**\"]}, \"net\": [\"api.example.com:443\"], \"timeoutMs\": 60000}"

static void test_intern_share(void)
{
    size_t base = sb_manifest_interned_count();
    sb_manifest_t *a = must_parse(TYPICAL), *b = must_parse(TYPICAL), *c, *d, *e;

    ok(a != NULL && a == b, "the same manifest parsed twice is one object");
    is_int(sb_manifest_interned_count(), base + 1, "  one interned manifest");
    /* the packed form has a fixed axis order: the JSON key order does not matter */
    c = must_parse("{\"timeoutMs\": 60000, \"net\": [\"api.example.com:443\"], \"files\": {\"read\": [\"uploads/**\"]}, \"data\": "
                   "{\"collections\": {\"posts\": [\"read\", \"create\"], \"comments\": [\"read\"]}}}");
    ok(c == a, "  the same axes in another key order are the same object");
    /* verbs are a set: their order and repetition do not matter either */
    d = must_parse(
        "{\"data\": {\"collections\": {\"posts\": [\"create\", \"read\", \"read\"], \"comments\": [\"read\"]}}, \"files\": "
        "{\"read\": [\"uploads/**\"]}, \"net\": [\"api.example.com:443\"], \"timeoutMs\": 60000}");
    ok(d == a, "  the same verbs in another order are the same object");
    /* a normalised glob is what is compared */
    e = must_parse(
        "{\"data\": {\"collections\": {\"posts\": [\"read\", \"create\"], \"comments\": [\"read\"]}}, \"files\": {\"read\": "
        "[\"./uploads//**\"]}, \"net\": [\"API.example.com:443\"], \"timeoutMs\": 60000}");
    ok(e == a, "  globs and hosts are compared in their normalised form");
    is_int(sb_manifest_interned_count(), base + 1, "  still one interned manifest");

    /* releasing all but one reference keeps the object alive and granting */
    sb_manifest_free(b);
    sb_manifest_free(c);
    sb_manifest_free(d);
    sb_manifest_free(e);
    is_int(sb_manifest_interned_count(), base + 1, "releasing four of five references keeps it");
    is_int(sb_manifest__collection_verbs(a, "posts", 5), SB_MANIFEST_VERB_BIT(SB_OP_READ) | SB_MANIFEST_VERB_BIT(SB_OP_CREATE),
           "  and it still grants posts read+create");
    is_int(url_allowed(a, "https://api.example.com/x"), 1, "  and api.example.com:443");
    is_int(sb_manifest_timeout_ms(a), 60000, "  timeoutMs kept");
    sb_manifest_free(a);
    is_int(sb_manifest_interned_count(), base, "the last reference frees it");
    a = must_parse(TYPICAL);
    ok(a != NULL, "parsing it again makes a fresh one");
    is_int(sb_manifest_interned_count(), base + 1, "  interned again");
    is_int(url_allowed(a, "https://api.example.com/x"), 1, "  which grants the same");
    sb_manifest_free(a);
    is_int(sb_manifest_interned_count(), base, "  and is freed again");

    a = must_parse("null");
    b = must_parse("{}");
    c = must_parse("{\"net\": [], \"data\": {}, \"files\": {\"read\": []}}");
    ok(a != NULL && a == b && b == c, "null, {} and empty axes are the one empty manifest");
    sb_manifest_free(a);
    sb_manifest_free(b);
    sb_manifest_free(c);
    is_int(sb_manifest_interned_count(), base, "  freed with its last reference");
}

static void test_intern_distinct(void)
{
    /* each differs from the first in one thing the check reads */
    static const char *const variants[] = {
        TYPICAL,
        "{\"data\": {\"collections\": {\"posts\": [\"read\"], \"comments\": [\"read\"]}}, \"files\": {\"read\": [\"uploads/**\"]}, "
        "\"net\": [\"api.example.com:443\"], \"timeoutMs\": 60000}",
        "{\"data\": {\"collections\": {\"posts\": [\"read\", \"create\"], \"comments\": [\"read\"]}}, \"files\": {\"read\": "
        "[\"uploads/*\"]}, \"net\": [\"api.example.com:443\"], \"timeoutMs\": 60000}",
        "{\"data\": {\"collections\": {\"posts\": [\"read\", \"create\"], \"comments\": [\"read\"]}}, \"files\": {\"write\": "
        "[\"uploads/**\"]}, \"net\": [\"api.example.com:443\"], \"timeoutMs\": 60000}",
        "{\"data\": {\"collections\": {\"posts\": [\"read\", \"create\"], \"comments\": [\"read\"]}}, \"files\": {\"read\": "
        "[\"uploads/**\"]}, \"net\": [\"api.example.com:8443\"], \"timeoutMs\": 60000}",
        "{\"data\": {\"collections\": {\"posts\": [\"read\", \"create\"], \"comments\": [\"read\"]}}, \"files\": {\"read\": "
        "[\"uploads/**\"]}, \"net\": [\"*.api.example.com:443\"], \"timeoutMs\": 60000}",
        "{\"data\": {\"collections\": {\"posts\": [\"read\", \"create\"], \"comments\": [\"read\"]}}, \"files\": {\"read\": "
        "[\"uploads/**\"]}, \"import\": [\"api.example.com:443\"], \"timeoutMs\": 60000}",
        "{\"data\": {\"globals\": {\"posts\": [\"read\"], \"comments\": [\"read\"]}}, \"files\": {\"read\": [\"uploads/**\"]}, "
        "\"net\": [\"api.example.com:443\"], \"timeoutMs\": 60000}",
        "{\"data\": {\"collections\": {\"posts\": [\"read\", \"create\"], \"comments\": [\"read\"]}}, \"files\": {\"read\": "
        "[\"uploads/**\"]}, \"net\": [\"api.example.com:443\"], \"timeoutMs\": 60001}",
        "{\"data\": {\"collections\": {\"posts\": [\"read\", \"create\"], \"comments\": [\"read\"]}}, \"files\": {\"read\": "
        "[\"uploads/**\"]}, \"net\": [\"api.example.com:443\"], \"timeoutMs\": 60000, \"memoryMb\": 64}",
        "{\"services\": [\"posts\"]}",
        "{\"jobs\": [\"posts\"]}",
        "{\"workflows\": [\"posts\"]}",
        "{\"tools\": [\"posts\"]}",
        "{\"net\": [\"[::1]:443\"]}",
        "{\"net\": [\"[::2]:443\"]}",
        "{\"net\": [\"::1\"]}",
        /* net rules and the secrets axis are part of the packed form too */
        "{\"net\": [{\"host\": \"api.example.com:443\", \"methods\": [\"GET\"]}]}",
        "{\"net\": [{\"host\": \"api.example.com:443\", \"methods\": [\"POST\"]}]}",
        "{\"net\": [{\"host\": \"api.example.com:443\", \"paths\": [\"/GET\"]}]}",
        "{\"secrets\": [\"posts\"]}",
    };
    enum { N = sizeof(variants) / sizeof(variants[0]) };
    size_t base = sb_manifest_interned_count();
    sb_manifest_t *m[N];
    int distinct = 1;

    for (size_t i = 0; i < N; ++i)
        m[i] = must_parse(variants[i]);
    for (size_t i = 0; i < N; ++i)
        for (size_t j = i + 1; j < N; ++j)
            if (m[i] == NULL || m[i] == m[j]) {
                printf("# variants %zu and %zu share an object\n", i, j);
                distinct = 0;
            }
    ok(distinct, "%d manifests that differ in one thing each are distinct objects", (int)N);
    is_int(sb_manifest_interned_count(), base + N, "  all interned");
    is_int(sb_manifest__collection_verbs(m[1], "posts", 5), SB_MANIFEST_VERB_BIT(SB_OP_READ), "  each grants its own verbs");
    is_int(sb_manifest__collection_verbs(m[0], "posts", 5), SB_MANIFEST_VERB_BIT(SB_OP_READ) | SB_MANIFEST_VERB_BIT(SB_OP_CREATE),
           "  and the first its own");
    is_int(url_allowed(m[4], "https://api.example.com/x"), 0, "  port 8443 only: 443 denied");
    is_int(url_allowed(m[4], "https://api.example.com:8443/x"), 1, "  port 8443 granted");
    is_int(url_allowed(m[5], "https://api.example.com/x"), 0, "  a wildcard does not grant its apex");
    is_int(url_allowed(m[5], "https://a.api.example.com/x"), 1, "  but a subdomain");
    is_int(url_allowed(m[6], "https://api.example.com/x"), 0, "  import is not net");
    is_int(url_allowed(m[14], "https://[::1]/x"), 1, "  [::1]:443 granted");
    is_int(url_allowed(m[15], "https://[::1]/x"), 0, "  [::2] does not grant [::1]");
    is_int(url_allowed(m[16], "http://[::1]:8080/x"), 1, "  bare ::1 grants every port");
    is_int(sb_manifest__has_service(m[10], "posts", 5), 1, "  services lists posts");
    is_int(sb_manifest__has_job(m[10], "posts", 5), 0, "  jobs does not");
    is_int((long long)sb_manifest__tools_count(m[13]), 1, "  one tools glob");
    is_int(url_allowed(m[17], "https://api.example.com/x"), 1, "  a GET rule grants GET");
    is_int(url_allowed(m[18], "https://api.example.com/x"), 0, "  a POST rule does not");
    is_int(url_allowed(m[19], "https://api.example.com/x"), 0, "  a paths rule checks the path");
    is_int(url_allowed(m[19], "https://api.example.com/GET"), 1, "  and grants its own");
    is_int((long long)sb_manifest_secret_count(m[20]), 1, "  one secret name");
    is_str(sb_manifest_secret_name(m[20], 0), "posts", "  named as minted");
    is_int(sb_manifest_secret_name(m[20], 1) == NULL, 1, "  and no second");
    for (size_t i = 0; i < N; ++i)
        sb_manifest_free(m[i]);
    is_int(sb_manifest_interned_count(), base, "  all freed");
}

/* enough distinct manifests to grow the intern table several times: each still found again */
static void test_intern_many(void)
{
    enum { N = 3000 };
    size_t base = sb_manifest_interned_count();
    sb_manifest_t **m = sb_mem_calloc(N, sizeof(*m));
    int found = 1, granted = 1;
    char text[128];

    for (int i = 0; i < N; ++i) {
        snprintf(text, sizeof(text), "{\"services\": [\"s%d\"]}", i);
        m[i] = must_parse(text);
    }
    is_int(sb_manifest_interned_count(), base + N, "%d distinct manifests interned", N);
    for (int i = 0; i < N; ++i) {
        sb_manifest_t *again;
        char name[16];
        snprintf(text, sizeof(text), "{\"services\": [\"s%d\"]}", i);
        again = must_parse(text);
        found &= again == m[i];
        snprintf(name, sizeof(name), "s%d", i);
        granted &= sb_manifest__has_service(again, name, strlen(name)) && !sb_manifest__has_service(again, "s", 1);
        sb_manifest_free(again);
    }
    ok(found, "  every one found again after the table grew");
    ok(granted, "  every one grants its own service only");
    for (int i = 0; i < N; ++i)
        sb_manifest_free(m[i]);
    is_int(sb_manifest_interned_count(), base, "  all freed");
    sb_mem_free(m);
}

/* every allocation of a parse failing in turn: SB_E_NOMEM, nothing leaked (the sanitizer run checks), nothing interned */
static void test_intern_nomem(void)
{
    size_t base = sb_manifest_interned_count();
    json_t *caps = json_loads(TYPICAL, 0, NULL);
    sb_manifest_t *m = NULL;
    unsigned long before, n;
    int all_nomem = 1;
    char err[64];

    before = sb_mem_try_count();
    if (sb_manifest_parse(caps, &m, err, sizeof(err)) != SB_OK)
        all_nomem = 0;
    n = sb_mem_try_count() - before;
    sb_manifest_free(m);
    ok(n >= 5, "a typical parse makes %lu try-allocations", n);
    for (unsigned long i = 1; i <= n; ++i) {
        sb_status_t st;
        m = NULL;
        sb_mem_fail_nth(i);
        st = sb_manifest_parse(caps, &m, err, sizeof(err));
        sb_mem_fail_nth(0);
        if (st != SB_E_NOMEM || m != NULL || strcmp(err, "capabilities: out of memory") != 0) {
            printf("# allocation %lu failing: status %d\n", i, (int)st);
            all_nomem = 0;
        }
    }
    ok(all_nomem, "  each failing in turn gives SB_E_NOMEM with its message");
    is_int(sb_manifest_interned_count(), base, "  and interns nothing");
    json_decref(caps);
}

/* threads parsing and releasing the same and their own manifests: the table ends as it began */
typedef struct st_stress_t {
    int id;
    int bad;
} stress_t;

static void *stress_thread(void *arg)
{
    stress_t *st = arg;
    char own[64];
    json_t *shared = json_loads(TYPICAL, 0, NULL), *mine;

    snprintf(own, sizeof(own), "{\"services\": [\"thread%d\"]}", st->id);
    mine = json_loads(own, 0, NULL);
    for (int i = 0; i < 20000; ++i) {
        sb_manifest_t *a = NULL, *b = NULL;
        char err[64];
        if (sb_manifest_parse(shared, &a, err, sizeof(err)) != SB_OK || sb_manifest_parse(mine, &b, err, sizeof(err)) != SB_OK ||
            sb_manifest_timeout_ms(a) != 60000 || sb_manifest__has_service(b, "thread", 6))
            st->bad = 1;
        sb_manifest_free(b);
        sb_manifest_free(a);
    }
    json_decref(shared);
    json_decref(mine);
    return NULL;
}

static void test_intern_threads(void)
{
    enum { T = 4 };
    size_t base = sb_manifest_interned_count();
    pthread_t th[T];
    stress_t st[T];
    int bad = 0;

    for (int i = 0; i < T; ++i) {
        st[i].id = i;
        st[i].bad = 0;
        pthread_create(&th[i], NULL, stress_thread, &st[i]);
    }
    for (int i = 0; i < T; ++i) {
        pthread_join(th[i], NULL);
        bad |= st[i].bad;
    }
    ok(!bad, "%d threads parsing and releasing shared and own manifests saw the right ones", T);
    is_int(sb_manifest_interned_count(), base, "  and left the table as it was");
}

int main(void)
{
    test_table();
    test_caps();
    test_misc();
    test_to_json();
    test_intern_share();
    test_intern_distinct();
    test_intern_many();
    test_intern_nomem();
    test_intern_threads();
    return done_testing();
}
