/*
 * broker/fetch: the http.fetch address policy (fetch/ipclass.h).
 *
 * Why positive: every SSRF filter that listed "the bad ranges" by hand has
 * shipped a bypass through a range nobody thought of (NAT64, 6to4, the
 * IPv4-mapped and -compatible forms, 0.0.0.0, multicast, 240/4). So IPv6 is
 * allowed only inside 2000::/3, the global unicast space (RFC 4291 section
 * 2.4, IANA "IPv6 Global Unicast Address Assignments"), and both families
 * then lose every block that the IANA special-purpose address registries
 * (RFC 6890, RFC 8190) do not mark "Globally Reachable":
 *   https://www.iana.org/assignments/iana-ipv4-special-registry/
 *   https://www.iana.org/assignments/iana-ipv6-special-registry/
 * The IPv4 list denies all of 192.0.0.0/24, including
 * the two registry carve-outs 192.0.0.9/32 and 192.0.0.10/32 (PCP and TURN
 * anycast), which an HTTP client has no business reaching.
 *
 * Why numbers: the verdict is computed on bytes under prefix masks, so
 * "0:0:0:0:0:0:0:1", "::1" and "0::01" are the same address here (RFC 4291
 * section 2.2: one address has many text forms), which a string comparison
 * (upstream's address policy) gets wrong.
 *
 * Why the classes: operator allow_cidrs are "audited exceptions" (docs/config.md),
 * but an exception written as a range must not open what the operator did not
 * name. Each denial therefore carries a class:
 *  - CLS_ORDINARY: any covering allow_cidrs entry lifts it (an internal API
 *    in 10.0.0.0/8 is the documented use);
 *  - CLS_EXACT: only an entry naming that very address (/32, /128 or bare)
 *    lifts it: loopback, link-local, the unspecified addresses (Linux
 *    connects 0.0.0.0 and :: to the local host), cloud metadata and the
 *    broker's own interface addresses, where one host is one service and a
 *    range is always a mistake;
 *  - CLS_FINAL: nothing lifts it: operator deny_cidrs (deny beats allow), and
 *    the transition forms that smuggle an IPv4 destination inside an IPv6
 *    address (mapped, compatible, 6to4, Teredo). The broker's resolver and URL
 *    parser hand us IPv4 as IPv4, so an operator never needs those forms.
 *
 * Nothing here allocates after sb_egress_policy_create: a check reads the
 * const tables below and the policy's arrays, so it is safe on every worker
 * thread at once.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>
#include "fetch/ipclass.h"
#include "sb/mem.h"
#include "util/util.h"

/* how much of an offending entry an error message quotes */
#define MAX_QUOTE 64u
/* the longest CIDR text we try to parse: a 45-byte IPv6 literal (INET6_ADDRSTRLEN - 1) plus "/128" */
#define MAX_CIDR_TEXT 49u

typedef enum en_cls_t {
    CLS_ALLOW = 0, /* no rule denies */
    CLS_ORDINARY,  /* denied; any covering allow_cidrs entry lifts it */
    CLS_EXACT,     /* denied; only an allow_cidrs entry naming exactly this address lifts it */
    CLS_FINAL      /* denied; nothing lifts it */
} cls_t;

/* a rule's name, and the name it takes when reached through the NAT64 prefix */
typedef struct st_rule_t {
    const char *name;
    const char *nat64;
} rule_t;

/* a built-in prefix: address bytes (IPv4 in the first four), prefix length, class, rule */
typedef struct st_range_t {
    uint8_t addr[16];
    uint8_t plen;
    uint8_t cls;
    const rule_t *rule;
} range_t;

/* an operator or interface prefix */
typedef struct st_cidr_t {
    int family;
    unsigned plen;
    uint8_t addr[16];
} cidr_t;

typedef struct st_cidr_list_t {
    cidr_t *v;
    size_t n;
} cidr_list_t;

struct st_sb_egress_policy_t {
    cidr_list_t deny;  /* egress.deny_cidrs */
    cidr_list_t allow; /* egress.allow_cidrs */
    cidr_list_t local; /* the broker's interface addresses, each a /32 or /128 */
};

typedef struct st_verdict_t {
    int allowed;
    cls_t cls;          /* the class of the denial, also when an allow entry lifted it */
    const rule_t *rule; /* the deciding rule */
    int via_nat64;      /* name the rule by its NAT64 spelling */
} verdict_t;

/* ---- rules --------------------------------------------------------------------------------------------------------- */

#define NAT64_PREFIX "nat64 64:ff9b::/96 embeds "
/* an IPv4-reachable rule: also named through the NAT64 prefix */
#define RULE4(s)                                                                                                                   \
    {                                                                                                                              \
        s, NAT64_PREFIX s                                                                                                          \
    }
/* an IPv6-only rule */
#define RULE6(s)                                                                                                                   \
    {                                                                                                                              \
        s, s                                                                                                                       \
    }

static const rule_t r_global = RULE4("global unicast");
static const rule_t r_op_allow = RULE4("operator allow_cidrs");
static const rule_t r_op_deny = RULE4("operator deny_cidrs");
static const rule_t r_iface = RULE4("broker interface address");
static const rule_t r_invalid = RULE6("invalid address");

/* IPv4 (names, RFCs and "Globally Reachable" from the IANA IPv4 special-purpose registry) */
static const rule_t r4_this_net = RULE4("this network 0.0.0.0/8");                /* RFC 791 3.2; RFC 1122 3.2.1.3 */
static const rule_t r4_private10 = RULE4("private 10.0.0.0/8");                   /* RFC 1918 */
static const rule_t r4_shared = RULE4("shared address space 100.64.0.0/10");      /* RFC 6598 (CGN) */
static const rule_t r4_loopback = RULE4("loopback 127.0.0.0/8");                  /* RFC 1122 3.2.1.3 */
static const rule_t r4_link_local = RULE4("link-local 169.254.0.0/16");           /* RFC 3927 */
static const rule_t r4_private172 = RULE4("private 172.16.0.0/12");               /* RFC 1918 */
static const rule_t r4_ietf = RULE4("ietf protocol assignments 192.0.0.0/24");    /* RFC 6890 2.1 */
static const rule_t r4_doc1 = RULE4("documentation 192.0.2.0/24");                /* RFC 5737 TEST-NET-1 */
static const rule_t r4_6to4_relay = RULE4("6to4 relay anycast 192.88.99.0/24");   /* RFC 7526 (deprecated) */
static const rule_t r4_private192 = RULE4("private 192.168.0.0/16");              /* RFC 1918 */
static const rule_t r4_bench = RULE4("benchmarking 198.18.0.0/15");               /* RFC 2544 */
static const rule_t r4_doc2 = RULE4("documentation 198.51.100.0/24");             /* RFC 5737 TEST-NET-2 */
static const rule_t r4_doc3 = RULE4("documentation 203.0.113.0/24");              /* RFC 5737 TEST-NET-3 */
static const rule_t r4_multicast = RULE4("multicast 224.0.0.0/4");                /* RFC 5771 */
static const rule_t r4_broadcast = RULE4("limited broadcast 255.255.255.255/32"); /* RFC 919, RFC 8190 */
static const rule_t r4_reserved = RULE4("reserved 240.0.0.0/4");                  /* RFC 1112 4 */

/* IPv6 (IANA IPv6 special-purpose registry, plus RFC 4291's scoped and deprecated prefixes) */
static const rule_t r6_unspecified = RULE6("unspecified ::/128");                   /* RFC 4291 2.5.2 */
static const rule_t r6_loopback = RULE6("loopback ::1/128");                        /* RFC 4291 2.5.3 */
static const rule_t r6_mapped = RULE6("ipv4-mapped ::ffff:0:0/96");                 /* RFC 4291 2.5.5.2 */
static const rule_t r6_compat = RULE6("ipv4-compatible ::/96");                     /* RFC 4291 2.5.5.1 (deprecated) */
static const rule_t r6_nat64_local = RULE6("local-use nat64 64:ff9b:1::/48");       /* RFC 8215 */
static const rule_t r6_discard = RULE6("discard-only 100::/64");                    /* RFC 6666 */
static const rule_t r6_teredo = RULE6("teredo 2001::/32");                          /* RFC 4380 */
static const rule_t r6_bench = RULE6("benchmarking 2001:2::/48");                   /* RFC 5180 */
static const rule_t r6_orchid = RULE6("deprecated orchid 2001:10::/28");            /* RFC 4843 */
static const rule_t r6_ietf = RULE6("ietf protocol assignments 2001::/23");         /* RFC 2928 */
static const rule_t r6_doc = RULE6("documentation 2001:db8::/32");                  /* RFC 3849 */
static const rule_t r6_6to4 = RULE6("6to4 2002::/16");                              /* RFC 3056 */
static const rule_t r6_doc2 = RULE6("documentation 3fff::/20");                     /* RFC 9637 */
static const rule_t r6_ula = RULE6("unique local fc00::/7");                        /* RFC 4193 */
static const rule_t r6_link_local = RULE6("link-local fe80::/10");                  /* RFC 4291 2.5.6 */
static const rule_t r6_site_local = RULE6("site-local fec0::/10");                  /* RFC 3879 (deprecated) */
static const rule_t r6_multicast = RULE6("multicast ff00::/8");                     /* RFC 4291 2.7 */
static const rule_t r6_not_global = RULE6("not global unicast (outside 2000::/3)"); /* RFC 4291 2.4 */

/*
 * The carve-outs inside 2001::/23 ("IETF Protocol Assignments", Globally
 * Reachable False, footnote "unless allowed by a more specific allocation")
 * whose registry row says Globally Reachable = True. Checked before their
 * parent. Teredo 2001::/32 ("N/A"), benchmarking 2001:2::/48 and the
 * deprecated ORCHID 2001:10::/28 (both False) stay denied.
 */
static const rule_t r6_pcp = RULE6("globally reachable pcp anycast 2001:1::1/128");        /* RFC 7723 */
static const rule_t r6_turn = RULE6("globally reachable turn anycast 2001:1::2/128");      /* RFC 8155 */
static const rule_t r6_srp = RULE6("globally reachable dns-sd srp anycast 2001:1::3/128"); /* RFC 9665 */
static const rule_t r6_amt = RULE6("globally reachable amt 2001:3::/32");                  /* RFC 7450 */
static const rule_t r6_as112 = RULE6("globally reachable as112-v6 2001:4:112::/48");       /* RFC 7535 */
static const rule_t r6_orchid2 = RULE6("globally reachable orchidv2 2001:20::/28");        /* RFC 7343 */
static const rule_t r6_drip = RULE6("globally reachable drip det 2001:30::/28");           /* RFC 9374 */

/*
 * Cloud metadata services, denied in the CLS_EXACT class wherever they sit:
 * one outside every special-purpose block (Azure's 168.63.129.16) must be
 * denied explicitly, and the ones inside a denied block must survive an
 * operator who allows that block (allowing 100.64.0.0/10 for a tailnet must
 * not open Alibaba's metadata server).
 *  - 169.254.169.254: AWS, GCP, Azure IMDS, OCI, DigitalOcean, OpenStack, IBM Cloud VPC;
 *  - 168.63.129.16: Azure WireServer / platform DNS ("What is IP address 168.63.129.16?", Microsoft Learn);
 *  - 100.100.100.200: Alibaba Cloud ECS metadata (Alibaba Cloud "ECS instance metadata");
 *  - 192.0.0.192: Oracle Cloud at Customer / Classic metadata ("Retrieve Predefined Instance Metadata");
 *  - fd00:ec2::254: AWS IMDS over IPv6 (EC2 User Guide, "Retrieve instance metadata");
 *  - fd20:ce::254: GCP metadata server over IPv6 (Compute Engine, IPv6-only instances).
 */
static const rule_t r_md_aws = RULE4("metadata 169.254.169.254");
static const rule_t r_md_azure = RULE4("metadata 168.63.129.16");
static const rule_t r_md_alibaba = RULE4("metadata 100.100.100.200");
static const rule_t r_md_oracle = RULE4("metadata 192.0.0.192");
static const rule_t r_md_aws6 = RULE6("metadata fd00:ec2::254");
static const rule_t r_md_gcp6 = RULE6("metadata fd20:ce::254");

/* ---- tables -------------------------------------------------------------------------------------------------------- */

#define HX(x) (uint8_t)((unsigned)(x) >> 8), (uint8_t)((unsigned)(x)&0xffu)
#define V6(a, b, c, d, e, f, g, h)                                                                                                 \
    {                                                                                                                              \
        HX(a), HX(b), HX(c), HX(d), HX(e), HX(f), HX(g), HX(h)                                                                     \
    }

static const range_t metadata4[] = {
    {{169, 254, 169, 254}, 32, CLS_EXACT, &r_md_aws},
    {{168, 63, 129, 16}, 32, CLS_EXACT, &r_md_azure},
    {{100, 100, 100, 200}, 32, CLS_EXACT, &r_md_alibaba},
    {{192, 0, 0, 192}, 32, CLS_EXACT, &r_md_oracle},
};

static const range_t metadata6[] = {
    {V6(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254), 128, CLS_EXACT, &r_md_aws6},
    {V6(0xfd20, 0x00ce, 0, 0, 0, 0, 0, 0x0254), 128, CLS_EXACT, &r_md_gcp6},
};

/* first match wins: a more specific entry precedes any entry that contains it */
static const range_t ranges4[] = {
    {{0, 0, 0, 0}, 8, CLS_EXACT, &r4_this_net},
    {{10, 0, 0, 0}, 8, CLS_ORDINARY, &r4_private10},
    {{100, 64, 0, 0}, 10, CLS_ORDINARY, &r4_shared},
    {{127, 0, 0, 0}, 8, CLS_EXACT, &r4_loopback},
    {{169, 254, 0, 0}, 16, CLS_EXACT, &r4_link_local},
    {{172, 16, 0, 0}, 12, CLS_ORDINARY, &r4_private172},
    {{192, 0, 0, 0}, 24, CLS_ORDINARY, &r4_ietf},
    {{192, 0, 2, 0}, 24, CLS_ORDINARY, &r4_doc1},
    {{192, 88, 99, 0}, 24, CLS_ORDINARY, &r4_6to4_relay},
    {{192, 168, 0, 0}, 16, CLS_ORDINARY, &r4_private192},
    {{198, 18, 0, 0}, 15, CLS_ORDINARY, &r4_bench},
    {{198, 51, 100, 0}, 24, CLS_ORDINARY, &r4_doc2},
    {{203, 0, 113, 0}, 24, CLS_ORDINARY, &r4_doc3},
    {{224, 0, 0, 0}, 4, CLS_ORDINARY, &r4_multicast},
    {{255, 255, 255, 255}, 32, CLS_ORDINARY, &r4_broadcast},
    {{240, 0, 0, 0}, 4, CLS_ORDINARY, &r4_reserved},
};

/* first match wins; whatever matches nothing is judged by 2000::/3 */
static const range_t ranges6[] = {
    {V6(0, 0, 0, 0, 0, 0, 0, 0), 128, CLS_EXACT, &r6_unspecified},
    {V6(0, 0, 0, 0, 0, 0, 0, 1), 128, CLS_EXACT, &r6_loopback},
    {V6(0, 0, 0, 0, 0, 0xffff, 0, 0), 96, CLS_FINAL, &r6_mapped},
    {V6(0, 0, 0, 0, 0, 0, 0, 0), 96, CLS_FINAL, &r6_compat},
    {V6(0x64, 0xff9b, 1, 0, 0, 0, 0, 0), 48, CLS_ORDINARY, &r6_nat64_local},
    {V6(0x100, 0, 0, 0, 0, 0, 0, 0), 64, CLS_ORDINARY, &r6_discard},
    {V6(0x2001, 1, 0, 0, 0, 0, 0, 1), 128, CLS_ALLOW, &r6_pcp},
    {V6(0x2001, 1, 0, 0, 0, 0, 0, 2), 128, CLS_ALLOW, &r6_turn},
    {V6(0x2001, 1, 0, 0, 0, 0, 0, 3), 128, CLS_ALLOW, &r6_srp},
    {V6(0x2001, 3, 0, 0, 0, 0, 0, 0), 32, CLS_ALLOW, &r6_amt},
    {V6(0x2001, 4, 0x112, 0, 0, 0, 0, 0), 48, CLS_ALLOW, &r6_as112},
    {V6(0x2001, 0x20, 0, 0, 0, 0, 0, 0), 28, CLS_ALLOW, &r6_orchid2},
    {V6(0x2001, 0x30, 0, 0, 0, 0, 0, 0), 28, CLS_ALLOW, &r6_drip},
    {V6(0x2001, 0, 0, 0, 0, 0, 0, 0), 32, CLS_FINAL, &r6_teredo},
    {V6(0x2001, 2, 0, 0, 0, 0, 0, 0), 48, CLS_ORDINARY, &r6_bench},
    {V6(0x2001, 0x10, 0, 0, 0, 0, 0, 0), 28, CLS_ORDINARY, &r6_orchid},
    {V6(0x2001, 0, 0, 0, 0, 0, 0, 0), 23, CLS_ORDINARY, &r6_ietf},
    {V6(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0), 32, CLS_ORDINARY, &r6_doc},
    {V6(0x2002, 0, 0, 0, 0, 0, 0, 0), 16, CLS_FINAL, &r6_6to4},
    {V6(0x3fff, 0, 0, 0, 0, 0, 0, 0), 20, CLS_ORDINARY, &r6_doc2},
    {V6(0xfc00, 0, 0, 0, 0, 0, 0, 0), 7, CLS_ORDINARY, &r6_ula},
    {V6(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10, CLS_EXACT, &r6_link_local},
    {V6(0xfec0, 0, 0, 0, 0, 0, 0, 0), 10, CLS_ORDINARY, &r6_site_local},
    {V6(0xff00, 0, 0, 0, 0, 0, 0, 0), 8, CLS_ORDINARY, &r6_multicast},
};

/* RFC 6052 2.1: the NAT64 well-known prefix; the IPv4 address is the last 32 bits */
static const uint8_t nat64_wkp[16] = V6(0x64, 0xff9b, 0, 0, 0, 0, 0, 0);
/* RFC 4291 2.4: global unicast */
static const uint8_t global_unicast[16] = V6(0x2000, 0, 0, 0, 0, 0, 0, 0);

/* ---- address arithmetic -------------------------------------------------------------------------------------------- */

static unsigned max_plen(int family)
{
    return family == AF_INET ? 32u : 128u;
}

/* 1 when the first plen bits of a and p are equal */
static int prefix_match(const uint8_t *a, const uint8_t *p, unsigned plen)
{
    unsigned full = plen / 8, rem = plen % 8;
    uint8_t mask;

    if (memcmp(a, p, full) != 0)
        return 0;
    if (rem == 0)
        return 1;
    mask = (uint8_t)(0xffu << (8 - rem));
    return (a[full] & mask) == (p[full] & mask);
}

static const range_t *find_range(const range_t *t, size_t n, const uint8_t *a)
{
    size_t i;

    for (i = 0; i != n; ++i)
        if (prefix_match(a, t[i].addr, t[i].plen))
            return t + i;
    return NULL;
}

static int list_covers(const cidr_list_t *l, int family, const uint8_t *a)
{
    size_t i;

    for (i = 0; i != l->n; ++i)
        if (l->v[i].family == family && prefix_match(a, l->v[i].addr, l->v[i].plen))
            return 1;
    return 0;
}

static int list_names_exactly(const cidr_list_t *l, int family, const uint8_t *a)
{
    size_t i;

    for (i = 0; i != l->n; ++i)
        if (l->v[i].family == family && l->v[i].plen == max_plen(family) &&
            memcmp(l->v[i].addr, a, family == AF_INET ? 4 : 16) == 0)
            return 1;
    return 0;
}

/* ---- verdicts ------------------------------------------------------------------------------------------------------ */

/*
 * The layers every address goes through once its built-in rule is known: the
 * broker's own addresses (as sensitive as loopback: a listener on 0.0.0.0 is
 * reachable through them), then the operator's exceptions by class.
 */
static verdict_t finish(const sb_egress_policy_t *p, int family, const uint8_t *a, const rule_t *rule, cls_t cls, int via_nat64)
{
    verdict_t v = {0, cls, rule, via_nat64};

    if (cls == CLS_FINAL)
        return v;
    if (p != NULL && cls != CLS_EXACT && list_covers(&p->local, family, a)) {
        v.rule = &r_iface;
        v.cls = cls = CLS_EXACT;
        v.via_nat64 = 0;
    }
    if (cls == CLS_ALLOW) {
        v.allowed = 1;
        return v;
    }
    if (p != NULL && (cls == CLS_ORDINARY ? list_covers(&p->allow, family, a) : list_names_exactly(&p->allow, family, a))) {
        v.allowed = 1;
        v.rule = &r_op_allow;
        v.via_nat64 = 0;
    }
    return v;
}

static verdict_t check_v4(const sb_egress_policy_t *p, const uint8_t *a)
{
    const range_t *r;
    verdict_t v = {0, CLS_FINAL, &r_op_deny, 0};

    if (p != NULL && list_covers(&p->deny, AF_INET, a))
        return v;
    if ((r = find_range(metadata4, sizeof(metadata4) / sizeof(metadata4[0]), a)) != NULL ||
        (r = find_range(ranges4, sizeof(ranges4) / sizeof(ranges4[0]), a)) != NULL)
        return finish(p, AF_INET, a, r->rule, (cls_t)r->cls, 0);
    return finish(p, AF_INET, a, &r_global, CLS_ALLOW, 0);
}

static verdict_t check_v6(const sb_egress_policy_t *p, const uint8_t *a)
{
    const range_t *r;
    verdict_t v = {0, CLS_FINAL, &r_op_deny, 0}, v4;

    if (p != NULL && list_covers(&p->deny, AF_INET6, a))
        return v;
    if ((r = find_range(metadata6, sizeof(metadata6) / sizeof(metadata6[0]), a)) != NULL)
        return finish(p, AF_INET6, a, r->rule, (cls_t)r->cls, 0);
    /*
     * RFC 6052 / RFC 7050: a connection to 64:ff9b::a.b.c.d is a connection to
     * a.b.c.d through whatever NAT64 serves this network, so the IPv4 verdict
     * (operator lists and interface addresses included) is the verdict, and
     * its class carries over to the IPv6 operator lists. Upstream's address
     * policy never decoded it.
     */
    if (prefix_match(a, nat64_wkp, 96)) {
        v4 = check_v4(p, a + 12);
        return finish(p, AF_INET6, a, v4.rule, v4.allowed ? CLS_ALLOW : v4.cls, 1);
    }
    if ((r = find_range(ranges6, sizeof(ranges6) / sizeof(ranges6[0]), a)) != NULL)
        return finish(p, AF_INET6, a, r->rule, (cls_t)r->cls, 0);
    if (!prefix_match(a, global_unicast, 3))
        return finish(p, AF_INET6, a, &r6_not_global, CLS_ORDINARY, 0);
    return finish(p, AF_INET6, a, &r_global, CLS_ALLOW, 0);
}

int sb_egress_check_ip(const sb_egress_policy_t *p, const sb_ip_t *ip, const char **rule)
{
    verdict_t v = {0, CLS_FINAL, &r_invalid, 0};

    if (ip != NULL && ip->family == AF_INET)
        v = check_v4(p, ip->addr);
    else if (ip != NULL && ip->family == AF_INET6)
        v = check_v6(p, ip->addr);
    if (rule != NULL)
        *rule = v.via_nat64 ? v.rule->nat64 : v.rule->name;
    return v.allowed;
}

/* ---- names --------------------------------------------------------------------------------------------------------- */

#define MD_NAME(n)                                                                                                                 \
    {                                                                                                                              \
        n, "metadata name " n                                                                                                      \
    }

/*
 * Documented names of cloud metadata services and of the in-cluster
 * Kubernetes API. The broker resolves with search domains off, so "metadata"
 * or "instance-data" alone should never resolve; they are denied anyway
 * because a resolver configuration is not a security boundary.
 *  - GCP: metadata.google.internal, and metadata (Compute Engine "About VM metadata");
 *  - AWS: instance-data, resolved through the VPC search domain as instance-data.ec2.internal
 *    (us-east-1) or instance-data.<region>.compute.internal (matched below);
 *  - Tencent Cloud: metadata.tencentyun.com (CVM "Viewing instance metadata");
 *  - IBM Cloud VPC: api.metadata.cloud.ibm.com (VPC Metadata API, "Endpoint URLs");
 *  - Kubernetes: kubernetes.default.svc ("Accessing the Kubernetes API from a Pod") and its
 *    fully qualified form under the default cluster domain.
 * Azure, Alibaba, Oracle and DigitalOcean document only addresses (denied in metadata4).
 */
static const struct st_reserved_name_t {
    const char *name;
    const char *rule;
} metadata_names[] = {
    MD_NAME("metadata.google.internal"),
    MD_NAME("metadata"),
    MD_NAME("instance-data"),
    MD_NAME("instance-data.ec2.internal"),
    MD_NAME("metadata.tencentyun.com"),
    MD_NAME("api.metadata.cloud.ibm.com"),
    MD_NAME("kubernetes.default.svc"),
    MD_NAME("kubernetes.default.svc.cluster.local"),
};

static const char rn_allowed[] = "not a reserved name";
static const char rn_empty[] = "empty host name";
static const char rn_numeric[] = "numeric host is not a name";
static const char rn_localhost[] = "reserved name localhost";
static const char rn_sub_localhost[] = "reserved name *.localhost";
static const char rn_aws_regional[] = "metadata name instance-data.<region>.compute.internal";

static char ascii_lower(char c)
{
    return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
}

static int ascii_eq_n(const char *s, const char *lit, size_t n)
{
    size_t i;

    for (i = 0; i != n; ++i)
        if (ascii_lower(s[i]) != lit[i])
            return 0;
    return 1;
}

static int name_is(const char *s, size_t len, const char *lit)
{
    size_t n = strlen(lit);
    return len == n && ascii_eq_n(s, lit, n);
}

static int name_ends_with(const char *s, size_t len, const char *lit)
{
    size_t n = strlen(lit);
    return len >= n && ascii_eq_n(s + len - n, lit, n);
}

static int is_hex_digit(char c)
{
    c = ascii_lower(c);
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

/*
 * WHATWG URL "ends in a number": a host whose last label is all digits, or
 * 0x followed by hex digits, is an IPv4 address to browsers and to
 * inet_aton. Such a string must never reach DNS (PROTOCOL.md section 6a), and neither must
 * anything with a colon (an IPv6 literal).
 */
static int looks_numeric(const char *s, size_t len)
{
    size_t i, start = 0;

    for (i = 0; i != len; ++i) {
        if (s[i] == ':')
            return 1;
        if (s[i] == '.')
            start = i + 1;
    }
    if (start == len)
        return 0;
    if (len - start >= 2 && s[start] == '0' && ascii_lower(s[start + 1]) == 'x') {
        for (i = start + 2; i != len; ++i)
            if (!is_hex_digit(s[i]))
                return 0;
        return 1;
    }
    for (i = start; i != len; ++i)
        if (s[i] < '0' || s[i] > '9')
            return 0;
    return 1;
}

int sb_egress_check_name(const sb_egress_policy_t *p, const char *host, const char **rule)
{
    static const char aws_head[] = "instance-data.", aws_tail[] = ".compute.internal";
    const char *why = rn_allowed;
    size_t i, len;
    int allowed = 0;

    (void)p;
    len = host != NULL ? strlen(host) : 0;
    if (len != 0 && host[len - 1] == '.')
        --len;
    if (len == 0) {
        why = rn_empty;
        goto Exit;
    }
    if (looks_numeric(host, len)) {
        why = rn_numeric;
        goto Exit;
    }
    /* RFC 6761 6.3: localhost and everything under it is the loopback host, whatever DNS says */
    if (name_is(host, len, "localhost")) {
        why = rn_localhost;
        goto Exit;
    }
    if (name_ends_with(host, len, ".localhost")) {
        why = rn_sub_localhost;
        goto Exit;
    }
    for (i = 0; i != sizeof(metadata_names) / sizeof(metadata_names[0]); ++i) {
        if (name_is(host, len, metadata_names[i].name)) {
            why = metadata_names[i].rule;
            goto Exit;
        }
    }
    /* instance-data.<one label>.compute.internal */
    if (len > sizeof(aws_head) - 1 + sizeof(aws_tail) - 1 && ascii_eq_n(host, aws_head, sizeof(aws_head) - 1) &&
        name_ends_with(host, len, aws_tail) &&
        memchr(host + sizeof(aws_head) - 1, '.', len - (sizeof(aws_head) - 1) - (sizeof(aws_tail) - 1)) == NULL) {
        why = rn_aws_regional;
        goto Exit;
    }
    allowed = 1;

Exit:
    if (rule != NULL)
        *rule = why;
    return allowed;
}

/* ---- sb_ip_t helpers ----------------------------------------------------------------------------------------------- */

/* four decimal parts 0-255, no leading zeros, nothing else (what every parser agrees on) */
static int parse_dotted_quad(const char *s, uint8_t out[4])
{
    unsigned part, digits, value;

    for (part = 0; part != 4; ++part) {
        if (part != 0 && *s++ != '.')
            return -1;
        for (digits = 0, value = 0; *s >= '0' && *s <= '9'; ++s, ++digits) {
            if (digits == 3 || (digits == 1 && value == 0))
                return -1;
            value = value * 10 + (unsigned)(*s - '0');
        }
        if (digits == 0 || value > 255)
            return -1;
        out[part] = (uint8_t)value;
    }
    return *s == '\0' ? 0 : -1;
}

int sb_ip_parse(const char *s, sb_ip_t *out)
{
    memset(out, 0, sizeof(*out));
    if (s == NULL || strlen(s) >= SB_IP_STRLEN)
        return -1;
    if (strchr(s, ':') != NULL) {
        if (inet_pton(AF_INET6, s, out->addr) != 1) {
            memset(out, 0, sizeof(*out));
            return -1;
        }
        out->family = AF_INET6;
        return 0;
    }
    if (parse_dotted_quad(s, out->addr) != 0) {
        memset(out, 0, sizeof(*out));
        return -1;
    }
    out->family = AF_INET;
    return 0;
}

void sb_ip_format(const sb_ip_t *ip, char *out, size_t outsz)
{
    char buf[SB_IP_STRLEN];

    if (outsz == 0)
        return;
    if (ip == NULL || (ip->family != AF_INET && ip->family != AF_INET6) ||
        inet_ntop(ip->family, ip->addr, buf, sizeof(buf)) == NULL)
        snprintf(out, outsz, "(invalid)");
    else
        snprintf(out, outsz, "%s", buf);
}

int sb_ip_from_sockaddr(const struct sockaddr *sa, sb_ip_t *out)
{
    struct sockaddr_in sin;
    struct sockaddr_in6 sin6;

    memset(out, 0, sizeof(*out));
    if (sa == NULL)
        return -1;
    switch (sa->sa_family) {
    case AF_INET:
        memcpy(&sin, sa, sizeof(sin));
        out->family = AF_INET;
        memcpy(out->addr, &sin.sin_addr, 4);
        return 0;
    case AF_INET6:
        memcpy(&sin6, sa, sizeof(sin6));
        out->family = AF_INET6;
        memcpy(out->addr, &sin6.sin6_addr, 16);
        return 0;
    default:
        return -1;
    }
}

void sb_ip_to_sockaddr(const sb_ip_t *ip, uint16_t port, struct sockaddr_storage *ss, socklen_t *len)
{
    struct sockaddr_in sin;
    struct sockaddr_in6 sin6;

    memset(ss, 0, sizeof(*ss));
    *len = 0;
    if (ip != NULL && ip->family == AF_INET) {
        memset(&sin, 0, sizeof(sin));
        sin.sin_family = AF_INET;
        sin.sin_port = htons(port);
        memcpy(&sin.sin_addr, ip->addr, 4);
        memcpy(ss, &sin, sizeof(sin));
        *len = (socklen_t)sizeof(sin);
    } else if (ip != NULL && ip->family == AF_INET6) {
        memset(&sin6, 0, sizeof(sin6));
        sin6.sin6_family = AF_INET6;
        sin6.sin6_port = htons(port);
        memcpy(&sin6.sin6_addr, ip->addr, 16);
        memcpy(ss, &sin6, sizeof(sin6));
        *len = (socklen_t)sizeof(sin6);
    }
}

/* ---- policy construction ------------------------------------------------------------------------------------------- */

/* the parsers' error exit and quoting, shared (util.h) */
#define fail(...) sb_fail_bad_args(__VA_ARGS__)
#define quote(s, len, buf, bufsz) sb_quote_printable((s), (len), MAX_QUOTE, (buf), (bufsz))

typedef enum en_cidr_err_t { CIDR_OK = 0, CIDR_EMPTY, CIDR_ADDRESS, CIDR_PREFIX, CIDR_HOST_BITS } cidr_err_t;

/*
 * One CIDR entry. Host bits must be zero: "10.0.0.1/8" is far more often a
 * typo for a /32 than a deliberate /8, and silently widening an allow entry is
 * the dangerous direction.
 */
static cidr_err_t parse_cidr(const char *s, size_t len, cidr_t *out)
{
    char buf[MAX_CIDR_TEXT + 1], *slash;
    const char *q;
    sb_ip_t ip;
    unsigned plen = 0, digits = 0, i;

    memset(out, 0, sizeof(*out));
    if (len == 0)
        return CIDR_EMPTY;
    if (len > MAX_CIDR_TEXT || memchr(s, '\0', len) != NULL)
        return CIDR_ADDRESS;
    memcpy(buf, s, len);
    buf[len] = '\0';
    if ((slash = strchr(buf, '/')) != NULL)
        *slash = '\0';
    if (sb_ip_parse(buf, &ip) != 0)
        return CIDR_ADDRESS;
    out->family = ip.family;
    memcpy(out->addr, ip.addr, sizeof(out->addr));
    if (slash == NULL) {
        out->plen = max_plen(ip.family);
        return CIDR_OK;
    }
    for (q = slash + 1; *q >= '0' && *q <= '9'; ++q, ++digits) {
        if (digits == 3 || (digits == 1 && plen == 0))
            return CIDR_PREFIX;
        plen = plen * 10 + (unsigned)(*q - '0');
    }
    if (digits == 0 || *q != '\0' || plen > max_plen(ip.family))
        return CIDR_PREFIX;
    out->plen = plen;
    for (i = plen; i != max_plen(ip.family); ++i)
        if (out->addr[i / 8] & (0x80u >> (i % 8)))
            return CIDR_HOST_BITS;
    return CIDR_OK;
}

/*
 * The built-in CLS_FINAL range an allow entry can only ever name addresses
 * of, if any: the entry lies inside it and contains none of the more specific
 * rows that precede it (::1 and :: sit inside ::/96 but are not
 * IPv4-compatible addresses, so "::1" is a meaningful allow entry).
 */
static const range_t *final_range_containing(const cidr_t *c)
{
    size_t i, j;

    if (c->family != AF_INET6)
        return NULL;
    for (i = 0; i != sizeof(ranges6) / sizeof(ranges6[0]); ++i) {
        if (ranges6[i].cls != CLS_FINAL || c->plen < ranges6[i].plen || !prefix_match(c->addr, ranges6[i].addr, ranges6[i].plen))
            continue;
        for (j = 0; j != i; ++j)
            if (ranges6[j].cls != CLS_FINAL && ranges6[j].plen >= c->plen && prefix_match(ranges6[j].addr, c->addr, c->plen))
                break;
        if (j == i)
            return ranges6 + i;
    }
    return NULL;
}

static sb_status_t parse_list(const json_t *arr, const char *key, int is_allow, cidr_list_t *out, char *err, size_t errsz)
{
    char q[MAX_QUOTE + 1], fix[SB_IP_STRLEN];
    const range_t *r;
    const char *s;
    size_t i, n, len;
    sb_ip_t masked;
    unsigned bit;

    if (arr == NULL || json_is_null(arr))
        return SB_OK;
    if (!json_is_array(arr))
        return fail(err, errsz, "%s: must be an array of CIDR strings", key);
    if ((n = json_array_size(arr)) == 0)
        return SB_OK;
    if (n > SB_EGRESS_MAX_CIDRS)
        return fail(err, errsz, "%s: too many entries (%zu, at most %u)", key, n, SB_EGRESS_MAX_CIDRS);
    if ((out->v = sb_mem_try_calloc(n, sizeof(*out->v))) == NULL) {
        sb_format_error(err, errsz, "%s: out of memory", key);
        return SB_E_NOMEM;
    }
    for (i = 0; i != n; ++i) {
        const json_t *e = json_array_get(arr, i);
        cidr_t *c = out->v + i;
        if (!json_is_string(e))
            return fail(err, errsz, "%s[%zu]: must be a string", key, i);
        s = json_string_value(e);
        len = json_string_length(e);
        switch (parse_cidr(s, len, c)) {
        case CIDR_OK:
            break;
        case CIDR_EMPTY:
            return fail(err, errsz, "%s[%zu]: invalid CIDR \"\": empty", key, i);
        case CIDR_ADDRESS:
            return fail(err, errsz, "%s[%zu]: invalid CIDR \"%s\": not a dotted-quad IPv4 or an IPv6 address", key, i,
                        quote(s, len, q, sizeof(q)));
        case CIDR_PREFIX:
            return fail(err, errsz, "%s[%zu]: invalid CIDR \"%s\": prefix length must be a decimal integer 0-%u", key, i,
                        quote(s, len, q, sizeof(q)), max_plen(c->family));
        case CIDR_HOST_BITS:
            masked.family = c->family;
            memcpy(masked.addr, c->addr, sizeof(masked.addr));
            for (bit = c->plen; bit != max_plen(c->family); ++bit)
                masked.addr[bit / 8] &= (uint8_t) ~(0x80u >> (bit % 8));
            sb_ip_format(&masked, fix, sizeof(fix));
            return fail(err, errsz, "%s[%zu]: invalid CIDR \"%s\": host bits set (did you mean \"%s/%u\"?)", key, i,
                        quote(s, len, q, sizeof(q)), fix, c->plen);
        }
        if (is_allow && (r = final_range_containing(c)) != NULL)
            return fail(err, errsz, "%s[%zu]: \"%s\" lies inside %s, which is never allowed (allow the IPv4 address instead)", key,
                        i, quote(s, len, q, sizeof(q)), r->rule->name);
        out->n = i + 1;
    }
    return SB_OK;
}

/*
 * The broker's own addresses, read without netlink. getifaddrs() asks the
 * kernel over an AF_NETLINK socket, which the systemd unit does not allow
 * (deploy/systemd/sandbox-broker.service: RestrictAddressFamilies=AF_INET
 * AF_INET6 AF_UNIX), so the broker could not start under it. Two older
 * interfaces give the same lists with what the unit allows:
 *  - IPv4: SIOCGIFCONF on an AF_INET socket lists every IPv4 address of every
 *    interface, secondary addresses included (netdevice(7));
 *  - IPv6: /proc/net/if_inet6 has one line per address, the address first as
 *    32 hex digits, then index, prefix length, scope, flags and name.
 * Either list unreadable fails closed: no policy, so no start with a partial
 * list. The one exception is a kernel without IPv6 (no if_inet6 and no
 * AF_INET6 sockets): it has no IPv6 address to deny.
 */
#define MAX_IFADDRS 4096u

static sb_status_t iface_fail(char *err, size_t errsz, const char *what, int e)
{
    char ebuf[128];
    if (err != NULL && errsz != 0)
        snprintf(err, errsz, "egress: cannot list the broker's interface addresses (%s: %s)", what,
                 e != 0 ? strerror_r(e, ebuf, sizeof(ebuf)) : "unexpected contents");
    return SB_E_UNAVAILABLE;
}

static sb_status_t push_local(cidr_list_t *out, size_t *cap, int family, const uint8_t *addr, char *err, size_t errsz)
{
    if (out->n == *cap) {
        size_t ncap = *cap == 0 ? 16 : *cap * 2;
        cidr_t *v;
        if (out->n == MAX_IFADDRS)
            return iface_fail(err, errsz, "more than 4096 addresses", 0);
        if (ncap > MAX_IFADDRS)
            ncap = MAX_IFADDRS;
        if ((v = sb_mem_try_realloc_array(out->v, ncap, sizeof(*v))) == NULL) {
            if (err != NULL && errsz != 0)
                snprintf(err, errsz, "egress: out of memory");
            return SB_E_NOMEM;
        }
        out->v = v;
        *cap = ncap;
    }
    memset(&out->v[out->n], 0, sizeof(out->v[out->n]));
    out->v[out->n].family = family;
    out->v[out->n].plen = max_plen(family);
    memcpy(out->v[out->n].addr, addr, family == AF_INET ? 4 : 16);
    ++out->n;
    return SB_OK;
}

static sb_status_t load_ipv4(cidr_list_t *out, size_t *cap, char *err, size_t errsz)
{
    struct ifreq *req = NULL;
    struct ifconf ifc;
    size_t room = 16, i, got;
    sb_status_t st = SB_OK;
    int fd;

    if ((fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0)) < 0)
        return iface_fail(err, errsz, "an AF_INET socket for SIOCGIFCONF", errno);
    for (;;) {
        struct ifreq *r = sb_mem_try_realloc_array(req, room, sizeof(*req));
        if (r == NULL) {
            st = SB_E_NOMEM;
            if (err != NULL && errsz != 0)
                snprintf(err, errsz, "egress: out of memory");
            goto Exit;
        }
        req = r;
        memset(&ifc, 0, sizeof(ifc));
        ifc.ifc_len = (int)(room * sizeof(*req));
        ifc.ifc_req = req;
        if (ioctl(fd, SIOCGIFCONF, &ifc) != 0) {
            st = iface_fail(err, errsz, "SIOCGIFCONF", errno);
            goto Exit;
        }
        /* the kernel fills what fits and says nothing of the rest: a full buffer is asked again, larger */
        if ((size_t)ifc.ifc_len < room * sizeof(*req))
            break;
        if (room >= MAX_IFADDRS) {
            st = iface_fail(err, errsz, "more than 4096 addresses", 0);
            goto Exit;
        }
        room *= 2;
    }
    got = (size_t)ifc.ifc_len / sizeof(*req);
    for (i = 0; i != got && st == SB_OK; ++i) {
        struct sockaddr_in sin;
        if (req[i].ifr_addr.sa_family != AF_INET)
            continue;
        memcpy(&sin, &req[i].ifr_addr, sizeof(sin));
        st = push_local(out, cap, AF_INET, (const uint8_t *)&sin.sin_addr, err, errsz);
    }

Exit:
    sb_mem_free(req);
    close(fd);
    return st;
}

static int ipv6_supported(void)
{
    int fd = socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return errno != EAFNOSUPPORT;
    close(fd);
    return 1;
}

static sb_status_t load_ipv6(cidr_list_t *out, size_t *cap, char *err, size_t errsz)
{
    /* a line is "<32 hex> <index> <plen> <scope> <flags> <name>": well under 128 bytes with IFNAMSIZ names */
    char line[128];
    sb_status_t st = SB_OK;
    FILE *fp;

    if ((fp = fopen("/proc/net/if_inet6", "re")) == NULL) {
        int e = errno;
        if (e == ENOENT && !ipv6_supported())
            return SB_OK; /* no IPv6 in this kernel */
        return iface_fail(err, errsz, "/proc/net/if_inet6", e);
    }
    while (st == SB_OK && fgets(line, sizeof(line), fp) != NULL) {
        uint8_t addr[16];
        size_t len = strlen(line);
        if (len == 0 || line[len - 1] != '\n' || len < 33 || line[32] != ' ') {
            st = iface_fail(err, errsz, "/proc/net/if_inet6", 0);
            break;
        }
        for (size_t i = 0; i != 16 && st == SB_OK; ++i) {
            int hi = sb_hex_digit(line[2 * i]), lo = sb_hex_digit(line[2 * i + 1]);
            if (hi < 0 || lo < 0)
                st = iface_fail(err, errsz, "/proc/net/if_inet6", 0);
            addr[i] = (uint8_t)(hi << 4 | lo);
        }
        if (st == SB_OK)
            st = push_local(out, cap, AF_INET6, addr, err, errsz);
    }
    if (st == SB_OK && ferror(fp))
        st = iface_fail(err, errsz, "/proc/net/if_inet6", EIO);
    fclose(fp);
    return st;
}

static sb_status_t load_interfaces(cidr_list_t *out, char *err, size_t errsz)
{
    size_t cap = 0;
    sb_status_t st = load_ipv4(out, &cap, err, errsz);
    return st != SB_OK ? st : load_ipv6(out, &cap, err, errsz);
}

sb_status_t sb_egress_policy_create(const json_t *deny_cidrs, const json_t *allow_cidrs, int deny_local_interfaces,
                                    sb_egress_policy_t **out, char *err, size_t errsz)
{
    sb_egress_policy_t *p;
    sb_status_t st;

    *out = NULL;
    if (err != NULL && errsz != 0)
        err[0] = '\0';
    if ((p = sb_mem_try_calloc(1, sizeof(*p))) == NULL) {
        if (err != NULL && errsz != 0)
            snprintf(err, errsz, "egress: out of memory");
        return SB_E_NOMEM;
    }
    if ((st = parse_list(deny_cidrs, "egress.deny_cidrs", 0, &p->deny, err, errsz)) != SB_OK)
        goto Exit;
    if ((st = parse_list(allow_cidrs, "egress.allow_cidrs", 1, &p->allow, err, errsz)) != SB_OK)
        goto Exit;
    if (deny_local_interfaces && (st = load_interfaces(&p->local, err, errsz)) != SB_OK)
        goto Exit;
    *out = p;
    p = NULL;

Exit:
    sb_egress_policy_free(p);
    return st;
}

void sb_egress_policy_free(sb_egress_policy_t *p)
{
    if (p == NULL)
        return;
    sb_mem_free(p->deny.v);
    sb_mem_free(p->allow.v);
    sb_mem_free(p->local.v);
    sb_mem_free(p);
}
