/*
 * libFuzzer driver for broker/fetch/ipclass.c (issue 4: "Fuzz harnesses:
 * ... address classifier").
 *
 * Input: byte 0 picks the family (bit 0: IPv4 or IPv6; bit 7 set: a bogus
 * family, which must be denied), bytes 1-16 are the address, and whatever
 * follows is tried as one egress.allow_cidrs entry and as a host name.
 *
 * Properties, checked on every input (abort on violation):
 *  - a verdict always names a rule, and a bogus family is denied;
 *  - for an IPv4 address A, the verdict and rule of 64:ff9b::A are A's
 *    (the rule behind the "nat64 64:ff9b::/96 embeds " prefix), under a
 *    policy with IPv4-only operator lists;
 *  - ::ffff:A (IPv4-mapped) and ::A (IPv4-compatible, past ::1) are always denied;
 *  - the address survives sb_ip_format -> sb_ip_parse and sb_ip_to_sockaddr -> sb_ip_from_sockaddr;
 *  - an accepted CIDR entry, used as the only allow entry, never allows
 *    loopback through a range: 127.0.0.1 is allowed only by exactly "127.0.0.1" or "127.0.0.1/32".
 */
#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "fetch/ipclass.h"
#include "fuzz.h"

#define NAT64 "nat64 64:ff9b::/96 embeds "

/* built on the first input (replay.c, the gcc driver, has no LLVMFuzzerInitialize) and kept for the process */
static sb_egress_policy_t *policy;

static sb_egress_policy_t *make_policy(void)
{
    json_t *deny = json_loads("[\"8.8.8.0/24\", \"10.9.0.0/16\"]", 0, NULL);
    json_t *allow = json_loads("[\"10.0.0.0/8\", \"127.0.0.1\", \"169.254.0.0/16\", \"168.63.129.16/32\"]", 0, NULL);
    sb_egress_policy_t *p = NULL;
    char err[256];

    SB_FUZZ_ASSERT(sb_egress_policy_create(deny, allow, 0, &p, err, sizeof(err)) == SB_OK, "fuzz policy: %s", err);
    json_decref(deny);
    json_decref(allow);
    return p;
}

static void check_v4_properties(const sb_egress_policy_t *p, const sb_ip_t *v4)
{
    sb_ip_t v6;
    const char *r4 = NULL, *r6 = NULL;
    int a4, a6;

    a4 = sb_egress_check_ip(p, v4, &r4);
    memset(&v6, 0, sizeof(v6));
    v6.family = AF_INET6;
    v6.addr[1] = 0x64, v6.addr[2] = 0xff, v6.addr[3] = 0x9b;
    memcpy(v6.addr + 12, v4->addr, 4);
    a6 = sb_egress_check_ip(p, &v6, &r6);
    SB_FUZZ_ASSERT(a4 == a6, "NAT64 verdict differs from the IPv4 verdict");
    SB_FUZZ_ASSERT(strncmp(r6, NAT64, sizeof(NAT64) - 1) == 0 && strcmp(r6 + sizeof(NAT64) - 1, r4) == 0,
                   "NAT64 rule %s is not IPv4 rule %s", r6, r4);

    memset(v6.addr, 0, 16);
    v6.addr[10] = v6.addr[11] = 0xff;
    memcpy(v6.addr + 12, v4->addr, 4);
    SB_FUZZ_ASSERT(sb_egress_check_ip(p, &v6, &r6) == 0, "IPv4-mapped address allowed");
    SB_FUZZ_ASSERT(strcmp(r6, "ipv4-mapped ::ffff:0:0/96") == 0, "IPv4-mapped rule is %s", r6);

    memset(v6.addr, 0, 16);
    memcpy(v6.addr + 12, v4->addr, 4);
    SB_FUZZ_ASSERT(sb_egress_check_ip(p, &v6, &r6) == 0, "IPv4-compatible address (or ::, ::1) allowed");
}

static void check_roundtrips(const sb_ip_t *ip)
{
    char text[SB_IP_STRLEN];
    sb_ip_t back;
    struct sockaddr_storage ss;
    socklen_t len;
    size_t n = ip->family == AF_INET ? 4 : 16;

    sb_ip_format(ip, text, sizeof(text));
    SB_FUZZ_ASSERT(sb_ip_parse(text, &back) == 0, "sb_ip_parse refuses sb_ip_format's output");
    SB_FUZZ_ASSERT(back.family == ip->family && memcmp(back.addr, ip->addr, n) == 0, "format/parse round trip via %s", text);
    sb_ip_to_sockaddr(ip, 443, &ss, &len);
    SB_FUZZ_ASSERT(len != 0, "sb_ip_to_sockaddr refused a valid address");
    SB_FUZZ_ASSERT(sb_ip_from_sockaddr((const struct sockaddr *)&ss, &back) == 0, "sb_ip_from_sockaddr refused its own output");
    SB_FUZZ_ASSERT(back.family == ip->family && memcmp(back.addr, ip->addr, n) == 0, "sockaddr round trip");
}

/* the tail as one allow entry: whatever it is, a range must not open loopback */
static void check_cidr(const uint8_t *s, size_t len)
{
    json_t *arr = json_array();
    sb_egress_policy_t *p = NULL;
    sb_ip_t lo;
    char err[256];
    int exact;

    json_array_append_new(arr, json_stringn((const char *)s, len));
    if (sb_egress_policy_create(NULL, arr, 0, &p, err, sizeof(err)) == SB_OK) {
        lo.family = AF_INET;
        memcpy(lo.addr, (const uint8_t[]){127, 0, 0, 1}, 4);
        exact = (len == 9 && memcmp(s, "127.0.0.1", 9) == 0) || (len == 12 && memcmp(s, "127.0.0.1/32", 12) == 0);
        SB_FUZZ_ASSERT(sb_egress_check_ip(p, &lo, NULL) == exact, "allow entry %.*s changed loopback's verdict", (int)len,
                       (const char *)s);
        sb_egress_policy_free(p);
    } else {
        SB_FUZZ_ASSERT(p == NULL && err[0] != '\0', "a refused list must leave *out NULL and say why");
    }
    json_decref(arr);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sb_ip_t ip;
    const char *rule = NULL;
    char name[300];
    size_t tail;
    int verdict;

    if (policy == NULL)
        policy = make_policy();
    if (size < 17)
        return 0;
    memset(&ip, 0, sizeof(ip));
    ip.family = (data[0] & 0x80) ? (int)data[0] : (data[0] & 1) ? AF_INET6 : AF_INET;
    memcpy(ip.addr, data + 1, 16);

    verdict = sb_egress_check_ip(policy, &ip, &rule);
    SB_FUZZ_ASSERT(rule != NULL && (verdict == 0 || verdict == 1), "no rule, or a verdict other than 0/1");
    rule = NULL;
    verdict = sb_egress_check_ip(NULL, &ip, &rule);
    SB_FUZZ_ASSERT(rule != NULL && (verdict == 0 || verdict == 1), "no rule, or a verdict other than 0/1 (NULL policy)");
    if (ip.family != AF_INET && ip.family != AF_INET6) {
        SB_FUZZ_ASSERT(sb_egress_check_ip(policy, &ip, &rule) == 0, "bogus family allowed");
        return 0;
    }
    if (ip.family == AF_INET) {
        check_v4_properties(policy, &ip);
        check_v4_properties(NULL, &ip);
    }
    check_roundtrips(&ip);

    tail = size - 17;
    if (tail != 0) {
        check_cidr(data + 17, tail);
        if (tail < sizeof(name)) {
            memcpy(name, data + 17, tail);
            name[tail] = '\0';
            rule = NULL;
            verdict = sb_egress_check_name(policy, name, &rule);
            SB_FUZZ_ASSERT(rule != NULL && (verdict == 0 || verdict == 1), "no name rule");
        }
    }
    return 0;
}
