/*
 * Unit tests for broker/fetch/ipclass.c: the http.fetch address policy
 * (issue 4, "Address policy"). Table-driven: both edges of every range, the
 * neighbours just outside, every IPv4-embedding form of every denied IPv4
 * range, the registry carve-outs, operator allow/deny precedence, metadata,
 * names, CIDR errors with their exact messages, and the sb_ip_t helpers.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tap.h"
#include "fetch/ipclass.h"

#define NAT64 "nat64 64:ff9b::/96 embeds "

#define GLOBAL "global unicast"
#define OP_ALLOW "operator allow_cidrs"
#define OP_DENY "operator deny_cidrs"
#define IFACE "broker interface address"

#define R4_THIS "this network 0.0.0.0/8"
#define R4_P10 "private 10.0.0.0/8"
#define R4_SHARED "shared address space 100.64.0.0/10"
#define R4_LOOP "loopback 127.0.0.0/8"
#define R4_LL "link-local 169.254.0.0/16"
#define R4_P172 "private 172.16.0.0/12"
#define R4_IETF "ietf protocol assignments 192.0.0.0/24"
#define R4_DOC1 "documentation 192.0.2.0/24"
#define R4_RELAY "6to4 relay anycast 192.88.99.0/24"
#define R4_P192 "private 192.168.0.0/16"
#define R4_BENCH "benchmarking 198.18.0.0/15"
#define R4_DOC2 "documentation 198.51.100.0/24"
#define R4_DOC3 "documentation 203.0.113.0/24"
#define R4_MCAST "multicast 224.0.0.0/4"
#define R4_BCAST "limited broadcast 255.255.255.255/32"
#define R4_RES "reserved 240.0.0.0/4"

#define R6_UNSPEC "unspecified ::/128"
#define R6_LOOP "loopback ::1/128"
#define R6_MAPPED "ipv4-mapped ::ffff:0:0/96"
#define R6_COMPAT "ipv4-compatible ::/96"
#define R6_NAT64L "local-use nat64 64:ff9b:1::/48"
#define R6_DISCARD "discard-only 100::/64"
#define R6_TEREDO "teredo 2001::/32"
#define R6_BENCH "benchmarking 2001:2::/48"
#define R6_ORCHID "deprecated orchid 2001:10::/28"
#define R6_IETF "ietf protocol assignments 2001::/23"
#define R6_DOC "documentation 2001:db8::/32"
#define R6_6TO4 "6to4 2002::/16"
#define R6_DOC2 "documentation 3fff::/20"
#define R6_ULA "unique local fc00::/7"
#define R6_LL "link-local fe80::/10"
#define R6_SITE "site-local fec0::/10"
#define R6_MCAST "multicast ff00::/8"
#define R6_NOTGLOBAL "not global unicast (outside 2000::/3)"

#define C_PCP "globally reachable pcp anycast 2001:1::1/128"
#define C_TURN "globally reachable turn anycast 2001:1::2/128"
#define C_SRP "globally reachable dns-sd srp anycast 2001:1::3/128"
#define C_AMT "globally reachable amt 2001:3::/32"
#define C_AS112 "globally reachable as112-v6 2001:4:112::/48"
#define C_ORCHID2 "globally reachable orchidv2 2001:20::/28"
#define C_DRIP "globally reachable drip det 2001:30::/28"

typedef struct st_case_t {
    const char *addr;
    int allowed;
    const char *rule;
} case_t;

/* IPv4: first and last address of every range, and the neighbours just outside where they are not denied themselves */
static const case_t v4_cases[] = {
    {"0.0.0.0", 0, R4_THIS},
    {"0.255.255.255", 0, R4_THIS},
    {"1.0.0.0", 1, GLOBAL},
    {"9.255.255.255", 1, GLOBAL},
    {"10.0.0.0", 0, R4_P10},
    {"10.255.255.255", 0, R4_P10},
    {"11.0.0.0", 1, GLOBAL},
    {"100.63.255.255", 1, GLOBAL},
    {"100.64.0.0", 0, R4_SHARED},
    {"100.127.255.255", 0, R4_SHARED},
    {"100.128.0.0", 1, GLOBAL},
    {"126.255.255.255", 1, GLOBAL},
    {"127.0.0.0", 0, R4_LOOP},
    {"127.0.0.1", 0, R4_LOOP},
    {"127.255.255.255", 0, R4_LOOP},
    {"128.0.0.0", 1, GLOBAL},
    {"169.253.255.255", 1, GLOBAL},
    {"169.254.0.0", 0, R4_LL},
    {"169.254.255.255", 0, R4_LL},
    {"169.255.0.0", 1, GLOBAL},
    {"172.15.255.255", 1, GLOBAL},
    {"172.16.0.0", 0, R4_P172},
    {"172.31.255.255", 0, R4_P172},
    {"172.32.0.0", 1, GLOBAL},
    {"191.255.255.255", 1, GLOBAL},
    {"192.0.0.0", 0, R4_IETF},
    {"192.0.0.9", 0, R4_IETF},  /* registry says globally reachable (PCP anycast); issue 4 denies the /24 */
    {"192.0.0.10", 0, R4_IETF}, /* likewise (TURN anycast) */
    {"192.0.0.255", 0, R4_IETF},
    {"192.0.1.0", 1, GLOBAL},
    {"192.0.1.255", 1, GLOBAL},
    {"192.0.2.0", 0, R4_DOC1},
    {"192.0.2.255", 0, R4_DOC1},
    {"192.0.3.0", 1, GLOBAL},
    {"192.88.98.255", 1, GLOBAL},
    {"192.88.99.0", 0, R4_RELAY},
    {"192.88.99.255", 0, R4_RELAY},
    {"192.88.100.0", 1, GLOBAL},
    {"192.167.255.255", 1, GLOBAL},
    {"192.168.0.0", 0, R4_P192},
    {"192.168.255.255", 0, R4_P192},
    {"192.169.0.0", 1, GLOBAL},
    {"198.17.255.255", 1, GLOBAL},
    {"198.18.0.0", 0, R4_BENCH},
    {"198.19.255.255", 0, R4_BENCH},
    {"198.20.0.0", 1, GLOBAL},
    {"198.51.99.255", 1, GLOBAL},
    {"198.51.100.0", 0, R4_DOC2},
    {"198.51.100.255", 0, R4_DOC2},
    {"198.51.101.0", 1, GLOBAL},
    {"203.0.112.255", 1, GLOBAL},
    {"203.0.113.0", 0, R4_DOC3},
    {"203.0.113.255", 0, R4_DOC3},
    {"203.0.114.0", 1, GLOBAL},
    {"223.255.255.255", 1, GLOBAL},
    {"224.0.0.0", 0, R4_MCAST},
    {"239.255.255.255", 0, R4_MCAST},
    {"240.0.0.0", 0, R4_RES},
    {"255.255.255.254", 0, R4_RES},
    {"255.255.255.255", 0, R4_BCAST},
    /* metadata, inside and outside the special-purpose blocks */
    {"169.254.169.254", 0, "metadata 169.254.169.254"},
    {"169.254.169.253", 0, R4_LL},
    {"168.63.129.16", 0, "metadata 168.63.129.16"},
    {"168.63.129.15", 1, GLOBAL},
    {"168.63.129.17", 1, GLOBAL},
    {"100.100.100.200", 0, "metadata 100.100.100.200"},
    {"100.100.100.201", 0, R4_SHARED},
    {"192.0.0.192", 0, "metadata 192.0.0.192"},
    /* plain public addresses */
    {"8.8.8.8", 1, GLOBAL},
    {"1.1.1.1", 1, GLOBAL},
    {"93.184.216.34", 1, GLOBAL},
};

/* IPv6: every rule's edges, in the same spirit */
static const case_t v6_cases[] = {
    {"::", 0, R6_UNSPEC},
    {"::1", 0, R6_LOOP},
    {"0:0:0:0:0:0:0:1", 0, R6_LOOP},
    {"0000:0000:0000:0000:0000:0000:0000:0001", 0, R6_LOOP},
    {"::2", 0, R6_COMPAT},
    {"::ffff:ffff", 0, R6_COMPAT},
    {"::1:0:0", 0, R6_NOTGLOBAL}, /* 0:0:0:0:0:1::, just past ::/96 */
    {"::fffe:ffff:ffff", 0, R6_NOTGLOBAL},
    {"::ffff:0:0", 0, R6_MAPPED},
    {"::ffff:255.255.255.255", 0, R6_MAPPED},
    {"0:0:0:0:0:ffff:7f00:1", 0, R6_MAPPED},
    {"::1:0:0:0:0", 0, R6_NOTGLOBAL},
    {"64:ff9a:ffff:ffff:ffff:ffff:ffff:ffff", 0, R6_NOTGLOBAL},
    {"64:ff9b::", 0, NAT64 R4_THIS},
    {"64:ff9b::808:808", 1, NAT64 GLOBAL},
    {"64:FF9B::0808:0808", 1, NAT64 GLOBAL},
    {"64:ff9b::ffff:ffff", 0, NAT64 R4_BCAST},
    {"64:ff9b::1:0:0", 0, R6_NOTGLOBAL}, /* just past 64:ff9b::/96 */
    {"64:ff9b:0:ffff:ffff:ffff:ffff:ffff", 0, R6_NOTGLOBAL},
    {"64:ff9b:1::", 0, R6_NAT64L},
    {"64:ff9b:1::808:808", 0, R6_NAT64L},
    {"64:ff9b:1:ffff:ffff:ffff:ffff:ffff", 0, R6_NAT64L},
    {"64:ff9b:2::", 0, R6_NOTGLOBAL},
    {"100::", 0, R6_DISCARD},
    {"100::ffff:ffff:ffff:ffff", 0, R6_DISCARD},
    {"100:0:0:1::", 0, R6_NOTGLOBAL},
    {"1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 0, R6_NOTGLOBAL},
    {"2000::", 1, GLOBAL},
    {"2000:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 1, GLOBAL},
    {"2001::", 0, R6_TEREDO},
    {"2001:0:ffff:ffff:ffff:ffff:ffff:ffff", 0, R6_TEREDO},
    {"2001:1::", 0, R6_IETF},
    {"2001:1::1", 1, C_PCP},
    {"2001:1::2", 1, C_TURN},
    {"2001:1::3", 1, C_SRP},
    {"2001:1::4", 0, R6_IETF},
    {"2001:1:ffff:ffff:ffff:ffff:ffff:ffff", 0, R6_IETF},
    {"2001:2::", 0, R6_BENCH},
    {"2001:2:0:ffff:ffff:ffff:ffff:ffff", 0, R6_BENCH},
    {"2001:2:1::", 0, R6_IETF},
    {"2001:2:ffff:ffff:ffff:ffff:ffff:ffff", 0, R6_IETF},
    {"2001:3::", 1, C_AMT},
    {"2001:3:ffff:ffff:ffff:ffff:ffff:ffff", 1, C_AMT},
    {"2001:4::", 0, R6_IETF},
    {"2001:4:111:ffff:ffff:ffff:ffff:ffff", 0, R6_IETF},
    {"2001:4:112::", 1, C_AS112},
    {"2001:4:112:ffff:ffff:ffff:ffff:ffff", 1, C_AS112},
    {"2001:4:113::", 0, R6_IETF},
    {"2001:f:ffff:ffff:ffff:ffff:ffff:ffff", 0, R6_IETF},
    {"2001:10::", 0, R6_ORCHID},
    {"2001:1f:ffff:ffff:ffff:ffff:ffff:ffff", 0, R6_ORCHID},
    {"2001:20::", 1, C_ORCHID2},
    {"2001:2f:ffff:ffff:ffff:ffff:ffff:ffff", 1, C_ORCHID2},
    {"2001:30::", 1, C_DRIP},
    {"2001:3f:ffff:ffff:ffff:ffff:ffff:ffff", 1, C_DRIP},
    {"2001:40::", 0, R6_IETF},
    {"2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff", 0, R6_IETF},
    {"2001:200::", 1, GLOBAL},
    {"2001:db7:ffff:ffff:ffff:ffff:ffff:ffff", 1, GLOBAL},
    {"2001:db8::", 0, R6_DOC},
    {"2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", 0, R6_DOC},
    {"2001:db9::", 1, GLOBAL},
    {"2001:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 1, GLOBAL},
    {"2002::", 0, R6_6TO4},
    {"2002:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 0, R6_6TO4},
    {"2003::", 1, GLOBAL},
    {"2620:4f:8000::", 1, GLOBAL}, /* direct delegation AS112, globally reachable */
    {"2606:4700:4700::1111", 1, GLOBAL},
    {"3ffe:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 1, GLOBAL},
    {"3fff::", 0, R6_DOC2},
    {"3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff", 0, R6_DOC2},
    {"3fff:1000::", 1, GLOBAL},
    {"3fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 1, GLOBAL},
    {"4000::", 0, R6_NOTGLOBAL},
    {"5f00::1", 0, R6_NOTGLOBAL},
    {"fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 0, R6_NOTGLOBAL},
    {"fc00::", 0, R6_ULA},
    {"fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 0, R6_ULA},
    {"fe00::", 0, R6_NOTGLOBAL},
    {"fe7f:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 0, R6_NOTGLOBAL},
    {"fe80::", 0, R6_LL},
    {"fe80::1", 0, R6_LL},
    {"febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 0, R6_LL},
    {"fec0::", 0, R6_SITE},
    {"feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 0, R6_SITE},
    {"ff00::", 0, R6_MCAST},
    {"ff02::1", 0, R6_MCAST},
    {"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 0, R6_MCAST},
    /* metadata */
    {"fd00:ec2::254", 0, "metadata fd00:ec2::254"},
    {"fd00:ec2::253", 0, R6_ULA},
    {"fd20:ce::254", 0, "metadata fd20:ce::254"},
    {"64:ff9b::a9fe:a9fe", 0, NAT64 "metadata 169.254.169.254"},
    {"64:ff9b::a83f:8110", 0, NAT64 "metadata 168.63.129.16"},
};

/* one sample inside every denied IPv4 range, with its rule, for the embedded forms */
static const case_t denied_v4[] = {
    {"0.1.2.3", 0, R4_THIS},          {"10.1.2.3", 0, R4_P10},       {"100.64.0.1", 0, R4_SHARED},
    {"127.0.0.1", 0, R4_LOOP},        {"169.254.1.1", 0, R4_LL},     {"172.16.0.1", 0, R4_P172},
    {"192.0.0.1", 0, R4_IETF},        {"192.0.2.1", 0, R4_DOC1},     {"192.88.99.1", 0, R4_RELAY},
    {"192.168.1.1", 0, R4_P192},      {"198.18.0.1", 0, R4_BENCH},   {"198.51.100.1", 0, R4_DOC2},
    {"203.0.113.1", 0, R4_DOC3},      {"224.0.0.1", 0, R4_MCAST},    {"240.0.0.1", 0, R4_RES},
    {"255.255.255.255", 0, R4_BCAST}, {"169.254.169.254", 0, "metadata 169.254.169.254"},
    {"168.63.129.16", 0, "metadata 168.63.129.16"},
    {"100.100.100.200", 0, "metadata 100.100.100.200"},
};

static sb_ip_t ip_of(const char *s)
{
    sb_ip_t ip;
    if (sb_ip_parse(s, &ip) != 0) {
        printf("# test bug: cannot parse %s\n", s);
        memset(&ip, 0, sizeof(ip));
    }
    return ip;
}

static void check_case(const sb_egress_policy_t *p, const char *tag, const char *addr, int allowed, const char *want_rule)
{
    sb_ip_t ip = ip_of(addr);
    const char *rule = NULL;
    int got = sb_egress_check_ip(p, &ip, &rule);

    is_int(got, allowed, "%s %s -> %s", tag, addr, allowed ? "allowed" : "denied");
    is_str(rule, want_rule, "%s %s rule", tag, addr);
}

static void check_ip(const sb_egress_policy_t *p, const char *tag, const sb_ip_t *ip, int allowed, const char *want_rule)
{
    char text[SB_IP_STRLEN];
    const char *rule = NULL;
    int got = sb_egress_check_ip(p, ip, &rule);

    sb_ip_format(ip, text, sizeof(text));
    is_int(got, allowed, "%s %s -> %s", tag, text, allowed ? "allowed" : "denied");
    is_str(rule, want_rule, "%s %s rule", tag, text);
}

static sb_ip_t v6_from(const uint8_t bytes[16])
{
    sb_ip_t ip;
    memset(&ip, 0, sizeof(ip));
    ip.family = AF_INET6;
    memcpy(ip.addr, bytes, 16);
    return ip;
}

/* ::ffff:a.b.c.d, ::a.b.c.d, 64:ff9b::a.b.c.d, 64:ff9b:1::a.b.c.d, 2002:AABB:CCDD::1, Teredo with v4 as server and client */
static void check_embedded(const sb_egress_policy_t *p, const char *v4text, int v4_allowed, const char *v4_rule)
{
    sb_ip_t v4 = ip_of(v4text), ip;
    uint8_t b[16];
    char want[256];
    int i;

    memset(b, 0, 16);
    b[10] = b[11] = 0xff;
    memcpy(b + 12, v4.addr, 4);
    ip = v6_from(b);
    check_ip(p, "mapped", &ip, 0, R6_MAPPED);

    memset(b, 0, 16);
    memcpy(b + 12, v4.addr, 4);
    ip = v6_from(b);
    /* ::0.0.0.0 and ::0.0.0.1 are :: and ::1; no sample here is either */
    check_ip(p, "compatible", &ip, 0, R6_COMPAT);

    memset(b, 0, 16);
    b[0] = 0x00, b[1] = 0x64, b[2] = 0xff, b[3] = 0x9b;
    memcpy(b + 12, v4.addr, 4);
    ip = v6_from(b);
    snprintf(want, sizeof(want), NAT64 "%s", v4_rule);
    check_ip(p, "nat64", &ip, v4_allowed, want);

    b[5] = 1; /* 64:ff9b:1::a.b.c.d (RFC 6052 would put a /48's IPv4 at bytes 6-9; either way it is local use) */
    ip = v6_from(b);
    check_ip(p, "local-use nat64", &ip, 0, R6_NAT64L);
    memset(b + 6, 0, 10);
    memcpy(b + 6, v4.addr, 4);
    ip = v6_from(b);
    check_ip(p, "local-use nat64 /48 layout", &ip, 0, R6_NAT64L);

    memset(b, 0, 16);
    b[0] = 0x20, b[1] = 0x02;
    memcpy(b + 2, v4.addr, 4);
    b[15] = 1;
    ip = v6_from(b);
    check_ip(p, "6to4", &ip, 0, R6_6TO4);

    /* RFC 4380 4: 2001:0:<server v4>:<flags>:<port ^ ffff>:<client v4 ^ ffffffff> */
    memset(b, 0, 16);
    b[0] = 0x20, b[1] = 0x01;
    memcpy(b + 4, v4.addr, 4);
    b[10] = 0xff, b[11] = 0xff;
    for (i = 0; i != 4; ++i)
        b[12 + i] = (uint8_t)~v4.addr[i];
    ip = v6_from(b);
    check_ip(p, "teredo server", &ip, 0, R6_TEREDO);
    memcpy(b + 4, (const uint8_t[]){8, 8, 8, 8}, 4);
    ip = v6_from(b);
    check_ip(p, "teredo client", &ip, 0, R6_TEREDO);
}

static sb_egress_policy_t *make_policy(const char *deny_json, const char *allow_json, int ifaces)
{
    json_t *d = deny_json != NULL ? json_loads(deny_json, 0, NULL) : NULL;
    json_t *a = allow_json != NULL ? json_loads(allow_json, 0, NULL) : NULL;
    sb_egress_policy_t *p = NULL;
    char err[256];
    sb_status_t st = sb_egress_policy_create(d, a, ifaces, &p, err, sizeof(err));

    ok(st == SB_OK && p != NULL, "policy deny=%s allow=%s ifaces=%d builds%s%s", deny_json ? deny_json : "-",
       allow_json ? allow_json : "-", ifaces, st == SB_OK ? "" : ": ", st == SB_OK ? "" : err);
    json_decref(d);
    json_decref(a);
    return p;
}

static void test_tables(void)
{
    size_t i;
    sb_egress_policy_t *empty;

    for (i = 0; i != sizeof(v4_cases) / sizeof(v4_cases[0]); ++i)
        check_case(NULL, "v4", v4_cases[i].addr, v4_cases[i].allowed, v4_cases[i].rule);
    for (i = 0; i != sizeof(v6_cases) / sizeof(v6_cases[0]); ++i)
        check_case(NULL, "v6", v6_cases[i].addr, v6_cases[i].allowed, v6_cases[i].rule);

    /* an empty policy behaves exactly like the built-in rules */
    empty = make_policy("[]", "[]", 0);
    for (i = 0; i != sizeof(v4_cases) / sizeof(v4_cases[0]); ++i)
        check_case(empty, "empty policy", v4_cases[i].addr, v4_cases[i].allowed, v4_cases[i].rule);
    sb_egress_policy_free(empty);
}

static void test_embedded(void)
{
    size_t i;
    char want[256];

    for (i = 0; i != sizeof(denied_v4) / sizeof(denied_v4[0]); ++i) {
        check_case(NULL, "sample", denied_v4[i].addr, 0, denied_v4[i].rule);
        check_embedded(NULL, denied_v4[i].addr, 0, denied_v4[i].rule);
    }
    /* a public IPv4 is reachable through NAT64 only; every other embedding stays denied */
    check_embedded(NULL, "8.8.8.8", 1, GLOBAL);
    /* NAT64 verdict == IPv4 verdict, rule == NAT64 spelling of the IPv4 rule, for every table row */
    for (i = 0; i != sizeof(v4_cases) / sizeof(v4_cases[0]); ++i) {
        sb_ip_t v4 = ip_of(v4_cases[i].addr), v6;
        uint8_t b[16] = {0, 0x64, 0xff, 0x9b};
        memcpy(b + 12, v4.addr, 4);
        v6 = v6_from(b);
        snprintf(want, sizeof(want), NAT64 "%s", v4_cases[i].rule);
        check_ip(NULL, "nat64 of row", &v6, v4_cases[i].allowed, want);
    }
}

static void test_operator(void)
{
    sb_egress_policy_t *p;

    /* allow 10.0.0.0/8 allows 10.1.2.3; the rest is untouched */
    p = make_policy(NULL, "[\"10.0.0.0/8\"]", 0);
    check_case(p, "allow 10/8", "10.1.2.3", 1, OP_ALLOW);
    check_case(p, "allow 10/8", "10.255.255.255", 1, OP_ALLOW);
    check_case(p, "allow 10/8", "11.0.0.1", 1, GLOBAL);
    check_case(p, "allow 10/8", "192.168.1.1", 0, R4_P192);
    check_case(p, "allow 10/8", "127.0.0.1", 0, R4_LOOP);
    check_case(p, "allow 10/8", "64:ff9b::a01:203", 1, NAT64 OP_ALLOW);
    check_case(p, "allow 10/8", "::ffff:10.1.2.3", 0, R6_MAPPED);
    sb_egress_policy_free(p);

    /* a range never opens loopback; the exact address does, and only it */
    p = make_policy(NULL, "[\"127.0.0.0/8\"]", 0);
    check_case(p, "allow 127/8", "127.0.0.1", 0, R4_LOOP);
    sb_egress_policy_free(p);
    p = make_policy(NULL, "[\"127.0.0.1/32\"]", 0);
    check_case(p, "allow 127.0.0.1/32", "127.0.0.1", 1, OP_ALLOW);
    check_case(p, "allow 127.0.0.1/32", "127.0.0.2", 0, R4_LOOP);
    check_case(p, "allow 127.0.0.1/32", "64:ff9b::7f00:1", 1, NAT64 OP_ALLOW);
    check_case(p, "allow 127.0.0.1/32", "::ffff:127.0.0.1", 0, R6_MAPPED);
    sb_egress_policy_free(p);
    p = make_policy(NULL, "[\"127.0.0.1\", \"::1\"]", 0);
    check_case(p, "allow bare 127.0.0.1", "127.0.0.1", 1, OP_ALLOW);
    check_case(p, "allow bare ::1", "::1", 1, OP_ALLOW);
    check_case(p, "allow bare ::1", "::", 0, R6_UNSPEC);
    sb_egress_policy_free(p);
    p = make_policy(NULL, "[\"::/127\"]", 0);
    check_case(p, "allow ::/127", "::1", 0, R6_LOOP);
    check_case(p, "allow ::/127", "::", 0, R6_UNSPEC);
    sb_egress_policy_free(p);

    /* deny beats allow, even an exact allow */
    p = make_policy("[\"10.1.0.0/16\", \"127.0.0.1/32\"]", "[\"10.0.0.0/8\", \"127.0.0.1/32\"]", 0);
    check_case(p, "deny 10.1/16 allow 10/8", "10.1.2.3", 0, OP_DENY);
    check_case(p, "deny 10.1/16 allow 10/8", "10.2.0.1", 1, OP_ALLOW);
    check_case(p, "deny+allow 127.0.0.1", "127.0.0.1", 0, OP_DENY);
    check_case(p, "deny 10.1/16", "64:ff9b::a01:203", 0, NAT64 OP_DENY);
    sb_egress_policy_free(p);

    /* deny_cidrs on public space */
    p = make_policy("[\"8.8.8.0/24\", \"2606:4700::/32\"]", NULL, 0);
    check_case(p, "deny 8.8.8/24", "8.8.8.8", 0, OP_DENY);
    check_case(p, "deny 8.8.8/24", "8.8.4.4", 1, GLOBAL);
    check_case(p, "deny 8.8.8/24", "64:ff9b::808:808", 0, NAT64 OP_DENY);
    check_case(p, "deny 2606:4700::/32", "2606:4700:4700::1111", 0, OP_DENY);
    check_case(p, "deny 2606:4700::/32", "2606:4701::1", 1, GLOBAL);
    sb_egress_policy_free(p);

    /* link-local and metadata need the exact address */
    p = make_policy(NULL, "[\"169.254.0.0/16\", \"168.63.129.0/24\", \"100.64.0.0/10\", \"fe80::/10\", \"fc00::/7\"]", 0);
    check_case(p, "allow 169.254/16", "169.254.1.1", 0, R4_LL);
    check_case(p, "allow 169.254/16", "169.254.169.254", 0, "metadata 169.254.169.254");
    check_case(p, "allow 168.63.129/24", "168.63.129.16", 0, "metadata 168.63.129.16");
    check_case(p, "allow 168.63.129/24", "168.63.129.17", 1, GLOBAL);
    check_case(p, "allow 100.64/10", "100.64.0.1", 1, OP_ALLOW);
    check_case(p, "allow 100.64/10", "100.100.100.200", 0, "metadata 100.100.100.200");
    check_case(p, "allow fe80::/10", "fe80::1", 0, R6_LL);
    check_case(p, "allow fc00::/7", "fd00::1", 1, OP_ALLOW);
    check_case(p, "allow fc00::/7", "fd00:ec2::254", 0, "metadata fd00:ec2::254");
    check_case(p, "allow fc00::/7", "fd20:ce::254", 0, "metadata fd20:ce::254");
    sb_egress_policy_free(p);
    p = make_policy(NULL, "[\"169.254.169.254\", \"168.63.129.16/32\", \"fe80::1/128\", \"fd00:ec2::254\"]", 0);
    check_case(p, "allow exact metadata", "169.254.169.254", 1, OP_ALLOW);
    check_case(p, "allow exact metadata", "169.254.169.253", 0, R4_LL);
    check_case(p, "allow exact metadata", "168.63.129.16", 1, OP_ALLOW);
    check_case(p, "allow exact fe80::1", "fe80::1", 1, OP_ALLOW);
    check_case(p, "allow exact fe80::1", "fe80::2", 0, R6_LL);
    check_case(p, "allow exact fd00:ec2::254", "fd00:ec2::254", 1, OP_ALLOW);
    sb_egress_policy_free(p);

    /* allow everything: only the exact-address and never-allowed classes remain */
    p = make_policy(NULL, "[\"0.0.0.0/0\", \"::/0\"]", 0);
    check_case(p, "allow all", "10.0.0.1", 1, OP_ALLOW);
    check_case(p, "allow all", "224.0.0.1", 1, OP_ALLOW);
    check_case(p, "allow all", "8.8.8.8", 1, GLOBAL);
    check_case(p, "allow all", "0.0.0.0", 0, R4_THIS);
    check_case(p, "allow all", "0.1.2.3", 0, R4_THIS);
    check_case(p, "allow all", "127.0.0.1", 0, R4_LOOP);
    check_case(p, "allow all", "169.254.169.254", 0, "metadata 169.254.169.254");
    check_case(p, "allow all", "::", 0, R6_UNSPEC);
    check_case(p, "allow all", "::1", 0, R6_LOOP);
    check_case(p, "allow all", "::ffff:8.8.8.8", 0, R6_MAPPED);
    check_case(p, "allow all", "::8.8.8.8", 0, R6_COMPAT);
    check_case(p, "allow all", "2002:808:808::1", 0, R6_6TO4);
    check_case(p, "allow all", "2001::1", 0, R6_TEREDO);
    check_case(p, "allow all", "2001:db8::1", 1, OP_ALLOW);
    check_case(p, "allow all", "fc00::1", 1, OP_ALLOW);
    check_case(p, "allow all", "fe80::1", 0, R6_LL);
    check_case(p, "allow all", "64:ff9b::a00:1", 1, NAT64 OP_ALLOW);
    check_case(p, "allow all", "64:ff9b::7f00:1", 0, NAT64 R4_LOOP);
    sb_egress_policy_free(p);

    /* IPv6 entries about NAT64 addresses: ordinary class lifts by range, loopback class by exact address */
    p = make_policy(NULL, "[\"64:ff9b::/96\"]", 0);
    check_case(p, "allow 64:ff9b::/96", "64:ff9b::a00:1", 1, OP_ALLOW);
    check_case(p, "allow 64:ff9b::/96", "64:ff9b::7f00:1", 0, NAT64 R4_LOOP);
    sb_egress_policy_free(p);
    p = make_policy(NULL, "[\"64:ff9b::7f00:1\"]", 0);
    check_case(p, "allow 64:ff9b::7f00:1", "64:ff9b::7f00:1", 1, OP_ALLOW);
    check_case(p, "allow 64:ff9b::7f00:1", "127.0.0.1", 0, R4_LOOP);
    sb_egress_policy_free(p);
    p = make_policy("[\"64:ff9b::/96\", \"::ffff:0:0/96\"]", NULL, 0);
    check_case(p, "deny 64:ff9b::/96", "64:ff9b::808:808", 0, OP_DENY);
    check_case(p, "deny 64:ff9b::/96", "8.8.8.8", 1, GLOBAL);
    check_case(p, "deny mapped", "::ffff:8.8.8.8", 0, OP_DENY);
    sb_egress_policy_free(p);
}

/*
 * Denies socket(AF_NETLINK, ...) with EAFNOSUPPORT for the rest of the
 * process, as the systemd unit's RestrictAddressFamilies=AF_INET AF_INET6
 * AF_UNIX does: a classic BPF seccomp filter, so the test needs no library.
 * Returns 0 when installed, -1 on an architecture this does not know.
 */
static int deny_netlink(void)
{
#if defined(__x86_64__) || defined(__aarch64__)
#if defined(__x86_64__)
    const uint32_t arch = AUDIT_ARCH_X86_64;
#else
    const uint32_t arch = AUDIT_ARCH_AARCH64;
#endif
    struct sock_filter prog[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, arch, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_socket, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_NETLINK, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EAFNOSUPPORT & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog fprog = {(unsigned short)(sizeof(prog) / sizeof(prog[0])), prog};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fprog) != 0)
        return -1;
    return 0;
#else
    return -1;
#endif
}

/*
 * The broker's own addresses: getifaddrs (netlink) is the oracle, read before
 * netlink is denied; the policy must then find every one of them without it,
 * as it must under the systemd unit.
 */
static void test_interfaces(void)
{
    struct ifaddrs *ifa = NULL, *it;
    sb_ip_t addrs[512];
    char names[512][IFNAMSIZ];
    size_t naddrs = 0;
    sb_egress_policy_t *with, *without;
    int checked = 0, sock;

    ok(getifaddrs(&ifa) == 0, "getifaddrs");
    for (it = ifa; it != NULL && naddrs < sizeof(addrs) / sizeof(addrs[0]); it = it->ifa_next) {
        if (it->ifa_addr == NULL || sb_ip_from_sockaddr(it->ifa_addr, &addrs[naddrs]) != 0)
            continue;
        snprintf(names[naddrs], sizeof(names[naddrs]), "%s", it->ifa_name);
        ++naddrs;
    }
    freeifaddrs(ifa);
    ok(naddrs != 0, "the host has interface addresses (%zu)", naddrs);

    if (deny_netlink() == 0) {
        sock = socket(AF_NETLINK, SOCK_RAW, 0);
        ok(sock < 0 && errno == EAFNOSUPPORT, "netlink sockets are refused from here on, as under the unit");
        if (sock >= 0)
            close(sock);
    } else {
        ok(1, "# skip: no seccomp filter for this architecture; the policy still reads without netlink");
    }

    with = make_policy(NULL, "[\"0.0.0.0/0\", \"::/0\"]", 1);
    without = make_policy(NULL, "[\"0.0.0.0/0\", \"::/0\"]", 0);
    for (size_t i = 0; i < naddrs && with != NULL; ++i) {
        const sb_ip_t *ip = &addrs[i];
        const char *rule = NULL, *base = NULL;
        int allowed;
        char text[SB_IP_STRLEN];
        sb_ip_format(ip, text, sizeof(text));
        allowed = sb_egress_check_ip(with, ip, &rule);
        ok(!allowed, "interface address %s (%s) is denied: %s", text, names[i], rule);
        /* what it would be without the interface layer: loopback and link-local keep their own name */
        if (sb_egress_check_ip(without, ip, &base) && (strcmp(base, OP_ALLOW) == 0 || strcmp(base, GLOBAL) == 0)) {
            is_str(rule, IFACE, "interface address %s is named as such", text);
            ++checked;
            if (ip->family == AF_INET) {
                uint8_t b[16] = {0, 0x64, 0xff, 0x9b};
                sb_ip_t v6;
                memcpy(b + 12, ip->addr, 4);
                v6 = v6_from(b);
                check_ip(with, "nat64 of interface", &v6, 0, NAT64 IFACE);
            }
        } else {
            is_str(rule, base, "interface address %s keeps its built-in rule", text);
        }
    }
    if (checked == 0)
        ok(1, "# skip: no interface address outside loopback/link-local on this host");
    sb_egress_policy_free(with);
    sb_egress_policy_free(without);

    /* an exact allow entry lifts the interface rule, a range does not */
    with = make_policy(NULL, "[\"127.0.0.1/32\"]", 1);
    check_case(with, "ifaces + allow 127.0.0.1", "127.0.0.1", 1, OP_ALLOW);
    check_case(with, "ifaces + allow 127.0.0.1", "8.8.8.8", 1, GLOBAL);
    sb_egress_policy_free(with);
}

typedef struct st_name_case_t {
    const char *host;
    int allowed;
    const char *rule;
} name_case_t;

static const name_case_t names[] = {
    {"localhost", 0, "reserved name localhost"},
    {"localhost.", 0, "reserved name localhost"},
    {"LOCALHOST", 0, "reserved name localhost"}, /* never passed (names arrive lowercased), denied anyway */
    {"foo.localhost", 0, "reserved name *.localhost"},
    {"a.b.localhost", 0, "reserved name *.localhost"},
    {".localhost", 0, "reserved name *.localhost"},
    {"localhost.example.com", 1, "not a reserved name"},
    {"notlocalhost", 1, "not a reserved name"},
    {"mylocalhost.com", 1, "not a reserved name"},
    {"localhostx", 1, "not a reserved name"},
    {"metadata.google.internal", 0, "metadata name metadata.google.internal"},
    {"metadata.google.internal.", 0, "metadata name metadata.google.internal"},
    {"metadata", 0, "metadata name metadata"},
    {"instance-data", 0, "metadata name instance-data"},
    {"instance-data.ec2.internal", 0, "metadata name instance-data.ec2.internal"},
    {"instance-data.us-west-2.compute.internal", 0, "metadata name instance-data.<region>.compute.internal"},
    {"instance-data..compute.internal", 1, "not a reserved name"},
    {"instance-data.a.b.compute.internal", 1, "not a reserved name"},
    {"metadata.tencentyun.com", 0, "metadata name metadata.tencentyun.com"},
    {"api.metadata.cloud.ibm.com", 0, "metadata name api.metadata.cloud.ibm.com"},
    {"kubernetes.default.svc", 0, "metadata name kubernetes.default.svc"},
    {"kubernetes.default.svc.cluster.local", 0, "metadata name kubernetes.default.svc.cluster.local"},
    {"metadata.google.internal.example.com", 1, "not a reserved name"},
    {"xmetadata", 1, "not a reserved name"},
    {"example.com", 1, "not a reserved name"},
    {"123.example", 1, "not a reserved name"},
    {"xn--bcher-kva.example", 1, "not a reserved name"},
    {"", 0, "empty host name"},
    {".", 0, "empty host name"},
    {"127.0.0.1", 0, "numeric host is not a name"},
    {"1.2.3", 0, "numeric host is not a name"},
    {"2130706433", 0, "numeric host is not a name"},
    {"0x7f000001", 0, "numeric host is not a name"},
    {"foo.0x10", 0, "numeric host is not a name"},
    {"example.123", 0, "numeric host is not a name"},
    {"::1", 0, "numeric host is not a name"},
    {"0xg", 1, "not a reserved name"},
};

static void test_names(void)
{
    size_t i;
    const char *rule;
    sb_egress_policy_t *p = make_policy(NULL, "[\"127.0.0.1\"]", 0);

    for (i = 0; i != sizeof(names) / sizeof(names[0]); ++i) {
        rule = NULL;
        is_int(sb_egress_check_name(NULL, names[i].host, &rule), names[i].allowed, "name \"%s\" -> %s", names[i].host,
               names[i].allowed ? "allowed" : "denied");
        is_str(rule, names[i].rule, "name \"%s\" rule", names[i].host);
    }
    rule = NULL;
    is_int(sb_egress_check_name(NULL, NULL, &rule), 0, "NULL name denied");
    is_str(rule, "empty host name", "NULL name rule");
    /* an allow entry for loopback never lets the name through */
    is_int(sb_egress_check_name(p, "localhost", &rule), 0, "localhost denied with 127.0.0.1 allowed");
    is_int(sb_egress_check_name(p, "example.com", NULL), 1, "rule pointer may be NULL");
    sb_egress_policy_free(p);
}

typedef struct st_err_case_t {
    const char *deny, *allow;
    const char *err;
} err_case_t;

static const err_case_t errors[] = {
    {NULL, "[\"10.0.0.0/33\"]", "egress.allow_cidrs[0]: invalid CIDR \"10.0.0.0/33\": prefix length must be a decimal integer 0-32"},
    {NULL, "[\"8.8.8.8\", \"10.0.0.0/33\"]",
     "egress.allow_cidrs[1]: invalid CIDR \"10.0.0.0/33\": prefix length must be a decimal integer 0-32"},
    {"[\"::/129\"]", NULL, "egress.deny_cidrs[0]: invalid CIDR \"::/129\": prefix length must be a decimal integer 0-128"},
    {"[\"10.0.0.1/8\"]", NULL, "egress.deny_cidrs[0]: invalid CIDR \"10.0.0.1/8\": host bits set (did you mean \"10.0.0.0/8\"?)"},
    {NULL, "[\"192.168.1.1/24\"]",
     "egress.allow_cidrs[0]: invalid CIDR \"192.168.1.1/24\": host bits set (did you mean \"192.168.1.0/24\"?)"},
    {"[\"2001:db8::1/32\"]", NULL,
     "egress.deny_cidrs[0]: invalid CIDR \"2001:db8::1/32\": host bits set (did you mean \"2001:db8::/32\"?)"},
    {"[\"0.0.0.1/0\"]", NULL, "egress.deny_cidrs[0]: invalid CIDR \"0.0.0.1/0\": host bits set (did you mean \"0.0.0.0/0\"?)"},
    {"[\"010.0.0.1\"]", NULL, "egress.deny_cidrs[0]: invalid CIDR \"010.0.0.1\": not a dotted-quad IPv4 or an IPv6 address"},
    {"[\"10.0.0.0/08\"]", NULL, "egress.deny_cidrs[0]: invalid CIDR \"10.0.0.0/08\": prefix length must be a decimal integer 0-32"},
    {"[\"10.0.0.0/\"]", NULL, "egress.deny_cidrs[0]: invalid CIDR \"10.0.0.0/\": prefix length must be a decimal integer 0-32"},
    {"[\"10.0.0.0/+8\"]", NULL, "egress.deny_cidrs[0]: invalid CIDR \"10.0.0.0/+8\": prefix length must be a decimal integer 0-32"},
    {"[\"10.0.0.0/-1\"]", NULL, "egress.deny_cidrs[0]: invalid CIDR \"10.0.0.0/-1\": prefix length must be a decimal integer 0-32"},
    {"[\"10.0.0.0/8 \"]", NULL, "egress.deny_cidrs[0]: invalid CIDR \"10.0.0.0/8 \": prefix length must be a decimal integer 0-32"},
    {"[\"10.0.0.0/0x8\"]", NULL, "egress.deny_cidrs[0]: invalid CIDR \"10.0.0.0/0x8\": prefix length must be a decimal integer 0-32"},
    {"[\"10.0.0.0/1000\"]", NULL, "egress.deny_cidrs[0]: invalid CIDR \"10.0.0.0/1000\": prefix length must be a decimal integer 0-32"},
    {"[\"10.0.0.0/8/8\"]", NULL, "egress.deny_cidrs[0]: invalid CIDR \"10.0.0.0/8/8\": prefix length must be a decimal integer 0-32"},
    {"[\"10.0.0\"]", NULL, "egress.deny_cidrs[0]: invalid CIDR \"10.0.0\": not a dotted-quad IPv4 or an IPv6 address"},
    {"[\"10.0.0.0.0\"]", NULL, "egress.deny_cidrs[0]: invalid CIDR \"10.0.0.0.0\": not a dotted-quad IPv4 or an IPv6 address"},
    {"[\"256.0.0.0/8\"]", NULL, "egress.deny_cidrs[0]: invalid CIDR \"256.0.0.0/8\": not a dotted-quad IPv4 or an IPv6 address"},
    {"[\"0x0a.0.0.0/8\"]", NULL, "egress.deny_cidrs[0]: invalid CIDR \"0x0a.0.0.0/8\": not a dotted-quad IPv4 or an IPv6 address"},
    {"[\"167772160/8\"]", NULL, "egress.deny_cidrs[0]: invalid CIDR \"167772160/8\": not a dotted-quad IPv4 or an IPv6 address"},
    {"[\"1e1.0.0.0\"]", NULL, "egress.deny_cidrs[0]: invalid CIDR \"1e1.0.0.0\": not a dotted-quad IPv4 or an IPv6 address"},
    {"[\" 10.0.0.0/8\"]", NULL, "egress.deny_cidrs[0]: invalid CIDR \" 10.0.0.0/8\": not a dotted-quad IPv4 or an IPv6 address"},
    {"[\"[::1]\"]", NULL, "egress.deny_cidrs[0]: invalid CIDR \"[::1]\": not a dotted-quad IPv4 or an IPv6 address"},
    {"[\"fe80::1%eth0\"]", NULL, "egress.deny_cidrs[0]: invalid CIDR \"fe80::1%eth0\": not a dotted-quad IPv4 or an IPv6 address"},
    {"[\"::ffff:010.0.0.1\"]", NULL,
     "egress.deny_cidrs[0]: invalid CIDR \"::ffff:010.0.0.1\": not a dotted-quad IPv4 or an IPv6 address"},
    {"[\"example.com\"]", NULL, "egress.deny_cidrs[0]: invalid CIDR \"example.com\": not a dotted-quad IPv4 or an IPv6 address"},
    {"[\"\"]", NULL, "egress.deny_cidrs[0]: invalid CIDR \"\": empty"},
    {"[\"/8\"]", NULL, "egress.deny_cidrs[0]: invalid CIDR \"/8\": not a dotted-quad IPv4 or an IPv6 address"},
    {"[\"10.0.0.0\\u00008\"]", NULL, "egress.deny_cidrs[0]: invalid CIDR \"10.0.0.0?8\": not a dotted-quad IPv4 or an IPv6 address"},
    {"[\"a\\\"b\"]", NULL, "egress.deny_cidrs[0]: invalid CIDR \"a?b\": not a dotted-quad IPv4 or an IPv6 address"},
    {"[\"1111:2222:3333:4444:5555:6666:7777:8888:9999:0000/64\"]", NULL,
     "egress.deny_cidrs[0]: invalid CIDR \"1111:2222:3333:4444:5555:6666:7777:8888:9999:0000/64\": not a dotted-quad IPv4 or an "
     "IPv6 address"},
    {"[\"10.0.0.0/8\", 8]", NULL, "egress.deny_cidrs[1]: must be a string"},
    {"[null]", NULL, "egress.deny_cidrs[0]: must be a string"},
    {"\"10.0.0.0/8\"", NULL, "egress.deny_cidrs: must be an array of CIDR strings"},
    {NULL, "{}", "egress.allow_cidrs: must be an array of CIDR strings"},
    {NULL, "[\"::ffff:10.0.0.0/104\"]",
     "egress.allow_cidrs[0]: \"::ffff:10.0.0.0/104\" lies inside ipv4-mapped ::ffff:0:0/96, which is never allowed (allow the IPv4 "
     "address instead)"},
    {NULL, "[\"::ffff:127.0.0.1\"]",
     "egress.allow_cidrs[0]: \"::ffff:127.0.0.1\" lies inside ipv4-mapped ::ffff:0:0/96, which is never allowed (allow the IPv4 "
     "address instead)"},
    {NULL, "[\"::a00:1\"]",
     "egress.allow_cidrs[0]: \"::a00:1\" lies inside ipv4-compatible ::/96, which is never allowed (allow the IPv4 address instead)"},
    {NULL, "[\"2002::/16\"]",
     "egress.allow_cidrs[0]: \"2002::/16\" lies inside 6to4 2002::/16, which is never allowed (allow the IPv4 address instead)"},
    {NULL, "[\"2002:a00:1::/48\"]",
     "egress.allow_cidrs[0]: \"2002:a00:1::/48\" lies inside 6to4 2002::/16, which is never allowed (allow the IPv4 address instead)"},
    {NULL, "[\"2001::/32\"]",
     "egress.allow_cidrs[0]: \"2001::/32\" lies inside teredo 2001::/32, which is never allowed (allow the IPv4 address instead)"},
};

/* entries that must build */
static const char *const good_lists[] = {
    "[\"0.0.0.0/0\", \"::/0\"]",
    "[\"10.0.0.0/8\", \"8.8.8.8\", \"8.8.8.8/32\", \"255.255.255.255/32\", \"0.0.0.0/32\"]",
    "[\"2001:db8::/32\", \"::1\", \"0:0:0:0:0:0:0:1/128\", \"2001:DB8::/32\", \"64:ff9b::/96\", \"::/128\"]",
    "[\"::ffff:0:0/96\", \"2002::/16\", \"2001::/32\"]", /* as deny entries: fine */
    "[\"2001::/23\", \"::/96\", \"::/127\", \"fe80::/10\"]",
    "null",
};

static void test_errors(void)
{
    size_t i;
    char err[512];
    sb_egress_policy_t *p;
    json_t *big;

    for (i = 0; i != sizeof(errors) / sizeof(errors[0]); ++i) {
        json_error_t jerr;
        json_t *d = errors[i].deny != NULL ? json_loads(errors[i].deny, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr) : NULL;
        json_t *a = errors[i].allow != NULL ? json_loads(errors[i].allow, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr) : NULL;
        sb_status_t st;
        if ((errors[i].deny != NULL && d == NULL) || (errors[i].allow != NULL && a == NULL))
            printf("# test bug: bad JSON in error case %zu: %s\n", i, jerr.text);
        p = (sb_egress_policy_t *)1;
        st = sb_egress_policy_create(d, a, 0, &p, err, sizeof(err));
        is_int(st, SB_E_BAD_ARGS, "error case %zu refused", i);
        ok(p == NULL, "error case %zu leaves *out NULL", i);
        is_str(err, errors[i].err, "error case %zu message", i);
        json_decref(d);
        json_decref(a);
    }
    for (i = 0; i != sizeof(good_lists) / sizeof(good_lists[0]); ++i) {
        json_t *d = json_loads(good_lists[i], JSON_DECODE_ANY, NULL);
        snprintf(err, sizeof(err), "junk");
        is_int(sb_egress_policy_create(d, NULL, 0, &p, err, sizeof(err)), SB_OK, "deny list %s builds", good_lists[i]);
        is_str(err, "", "success clears err");
        sb_egress_policy_free(p);
        json_decref(d);
    }
    /* allow lists that must build: the exact loopback and unspecified addresses sit inside ::/96 but are not compatible forms */
    p = make_policy(NULL, "[\"::1\", \"::\", \"::/127\", \"::/96\", \"0.0.0.0/0\", \"::/0\", \"2001::/23\"]", 0);
    sb_egress_policy_free(p);

    /* the cap */
    big = json_array();
    for (i = 0; i != SB_EGRESS_MAX_CIDRS; ++i)
        json_array_append_new(big, json_string("10.0.0.0/8"));
    is_int(sb_egress_policy_create(big, NULL, 0, &p, err, sizeof(err)), SB_OK, "%u entries build", SB_EGRESS_MAX_CIDRS);
    sb_egress_policy_free(p);
    json_array_append_new(big, json_string("10.0.0.0/8"));
    is_int(sb_egress_policy_create(big, NULL, 0, &p, err, sizeof(err)), SB_E_BAD_ARGS, "%u entries refused", SB_EGRESS_MAX_CIDRS + 1);
    is_str(err, "egress.deny_cidrs: too many entries (4097, at most 4096)", "cap message");
    json_decref(big);

    /* NULL err, tiny err: no crash, truncated */
    big = json_loads("[\"10.0.0.0/33\"]", 0, NULL);
    is_int(sb_egress_policy_create(big, NULL, 0, &p, NULL, 0), SB_E_BAD_ARGS, "NULL err buffer");
    is_int(sb_egress_policy_create(big, NULL, 0, &p, err, 8), SB_E_BAD_ARGS, "8-byte err buffer");
    is_str(err, "egress.", "8-byte err buffer is truncated and terminated");
    json_decref(big);

    /* NULL and JSON null lists are empty */
    is_int(sb_egress_policy_create(NULL, NULL, 0, &p, err, sizeof(err)), SB_OK, "NULL lists");
    sb_egress_policy_free(p);
    sb_egress_policy_free(NULL);
}

static void test_ip_helpers(void)
{
    static const char *const good[] = {"1.2.3.4",     "0.0.0.0",          "255.255.255.255", "::",   "::1",
                                       "2001:db8::1", "::ffff:127.0.0.1", "fe80::1",         "1::"};
    static const char *const bad[] = {"01.2.3.4", "1.2.3",     "1.2.3.4.5", "256.1.1.1",  "1.2.3.4 ",       " 1.2.3.4", "",
                                      "[::1]",    "::1%lo",    "1.2.3.04",  "0x1.2.3.4",  "1.2.3.-4",       "1..2.3",   "1.2.3.4/32",
                                      "::1/128",  "1:2:3:4:5:6:7:8:9", "12345::", "::ffff:1.2.3", "1.2.3.4.", "0177.0.0.1",
                                      "::g"};
    size_t i;
    sb_ip_t ip, back;
    char text[SB_IP_STRLEN];
    struct sockaddr_storage ss;
    socklen_t len;

    for (i = 0; i != sizeof(good) / sizeof(good[0]); ++i) {
        is_int(sb_ip_parse(good[i], &ip), 0, "parse \"%s\"", good[i]);
        sb_ip_format(&ip, text, sizeof(text));
        is_str(text, good[i], "format round-trips \"%s\"", good[i]);
        sb_ip_to_sockaddr(&ip, 443, &ss, &len);
        is_int(len, ip.family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6), "sockaddr length for %s", good[i]);
        is_int(sb_ip_from_sockaddr((const struct sockaddr *)&ss, &back), 0, "sockaddr back for %s", good[i]);
        ok(back.family == ip.family && memcmp(back.addr, ip.addr, ip.family == AF_INET ? 4 : 16) == 0, "sockaddr round-trips %s",
           good[i]);
        is_int(ntohs(ip.family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port : ((struct sockaddr_in6 *)&ss)->sin6_port), 443,
               "port for %s", good[i]);
    }
    for (i = 0; i != sizeof(bad) / sizeof(bad[0]); ++i) {
        memset(&ip, 0x55, sizeof(ip));
        is_int(sb_ip_parse(bad[i], &ip), -1, "refuse \"%s\"", bad[i]);
        ok(ip.family == 0, "refused \"%s\" leaves a zeroed address", bad[i]);
    }
    is_int(sb_ip_parse(NULL, &ip), -1, "refuse NULL");

    /* non-canonical IPv6 spellings parse to the canonical address */
    is_int(sb_ip_parse("2001:0DB8:0000:0000:0000:0000:0000:0001", &ip), 0, "parse non-canonical IPv6");
    sb_ip_format(&ip, text, sizeof(text));
    is_str(text, "2001:db8::1", "formatted canonically");
    is_int(sb_ip_parse("0:0:0:0:0:ffff:7f00:1", &ip), 0, "parse hex-mapped");
    sb_ip_format(&ip, text, sizeof(text));
    is_str(text, "::ffff:127.0.0.1", "mapped formatted as inet_ntop does");

    /* formatting edge cases */
    memset(&ip, 0, sizeof(ip));
    sb_ip_format(&ip, text, sizeof(text));
    is_str(text, "(invalid)", "family 0 formats as (invalid)");
    sb_ip_format(NULL, text, sizeof(text));
    is_str(text, "(invalid)", "NULL formats as (invalid)");
    ip = ip_of("192.168.100.200");
    sb_ip_format(&ip, text, 5);
    is_str(text, "192.", "format truncates to outsz");
    sb_ip_format(&ip, text, 0);

    /* invalid families and NULLs are denied */
    memset(&ip, 0, sizeof(ip));
    {
        const char *rule = NULL;
        is_int(sb_egress_check_ip(NULL, &ip, &rule), 0, "family 0 denied");
        is_str(rule, "invalid address", "family 0 rule");
        ip.family = AF_UNIX;
        is_int(sb_egress_check_ip(NULL, &ip, &rule), 0, "AF_UNIX denied");
        rule = NULL;
        is_int(sb_egress_check_ip(NULL, NULL, &rule), 0, "NULL address denied");
        is_str(rule, "invalid address", "NULL address rule");
        ip = ip_of("8.8.8.8");
        is_int(sb_egress_check_ip(NULL, &ip, NULL), 1, "rule pointer may be NULL");
    }

    /* sockaddr edge cases */
    memset(&ss, 0, sizeof(ss));
    ss.ss_family = AF_UNIX;
    is_int(sb_ip_from_sockaddr((const struct sockaddr *)&ss, &ip), -1, "AF_UNIX sockaddr refused");
    is_int(sb_ip_from_sockaddr(NULL, &ip), -1, "NULL sockaddr refused");
    ip.family = AF_UNIX;
    sb_ip_to_sockaddr(&ip, 80, &ss, &len);
    is_int(len, 0, "to_sockaddr of a bad family has length 0");
    sb_ip_to_sockaddr(NULL, 80, &ss, &len);
    is_int(len, 0, "to_sockaddr of NULL has length 0");
    /* a mapped socket address stays IPv6, and is denied */
    ip = ip_of("::ffff:8.8.8.8");
    sb_ip_to_sockaddr(&ip, 80, &ss, &len);
    is_int(sb_ip_from_sockaddr((const struct sockaddr *)&ss, &back), 0, "mapped sockaddr read");
    is_int(back.family, AF_INET6, "mapped sockaddr stays AF_INET6");
    is_int(sb_egress_check_ip(NULL, &back, NULL), 0, "mapped sockaddr denied");
}

int main(void)
{
    test_tables();
    test_embedded();
    test_operator();
    test_names();
    test_errors();
    test_ip_helpers();
    test_interfaces(); /* last: it denies netlink for the rest of the process */
    return done_testing();
}
