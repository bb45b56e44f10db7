/*
 * broker/fetch: the http.fetch address policy (PROTOCOL.md section 6a; docs/config.md, egress).
 *
 * Every address the broker may connect to for a guest, whether a URL literal
 * or a DNS answer, goes through sb_egress_check_ip, and every host name goes
 * through sb_egress_check_name before it is resolved. The policy is positive:
 * an address is allowed only when it is globally reachable unicast per the
 * IANA IPv4 and IPv6 special-purpose address registries, then an explicit deny
 * layer (cloud metadata addresses, the broker's own interface addresses and
 * the operator's egress.deny_cidrs) is applied, and the operator's
 * egress.allow_cidrs can carve audited exceptions out of the denials.
 *
 * Addresses are compared as numbers (bytes under a prefix mask), never as
 * text, so no spelling of an address reaches a different verdict.
 *
 * Rule strings. Every verdict names its rule with one of these static strings
 * (compare by content; the set is closed):
 *
 *   allowed:
 *     "global unicast"
 *     "globally reachable pcp anycast 2001:1::1/128"
 *     "globally reachable turn anycast 2001:1::2/128"
 *     "globally reachable dns-sd srp anycast 2001:1::3/128"
 *     "globally reachable amt 2001:3::/32"
 *     "globally reachable as112-v6 2001:4:112::/48"
 *     "globally reachable orchidv2 2001:20::/28"
 *     "globally reachable drip det 2001:30::/28"
 *     "operator allow_cidrs"
 *   denied, IPv4:
 *     "this network 0.0.0.0/8"              "private 10.0.0.0/8"
 *     "shared address space 100.64.0.0/10"  "loopback 127.0.0.0/8"
 *     "link-local 169.254.0.0/16"           "private 172.16.0.0/12"
 *     "ietf protocol assignments 192.0.0.0/24"
 *     "documentation 192.0.2.0/24"          "6to4 relay anycast 192.88.99.0/24"
 *     "private 192.168.0.0/16"              "benchmarking 198.18.0.0/15"
 *     "documentation 198.51.100.0/24"       "documentation 203.0.113.0/24"
 *     "multicast 224.0.0.0/4"               "limited broadcast 255.255.255.255/32"
 *     "reserved 240.0.0.0/4"
 *   denied, IPv6:
 *     "unspecified ::/128"                  "loopback ::1/128"
 *     "ipv4-mapped ::ffff:0:0/96"           "ipv4-compatible ::/96"
 *     "local-use nat64 64:ff9b:1::/48"      "discard-only 100::/64"
 *     "teredo 2001::/32"                    "benchmarking 2001:2::/48"
 *     "deprecated orchid 2001:10::/28"      "ietf protocol assignments 2001::/23"
 *     "documentation 2001:db8::/32"         "6to4 2002::/16"
 *     "documentation 3fff::/20"             "unique local fc00::/7"
 *     "link-local fe80::/10"                "site-local fec0::/10"
 *     "multicast ff00::/8"                  "not global unicast (outside 2000::/3)"
 *   denied, explicit layer:
 *     "metadata 169.254.169.254"  "metadata 168.63.129.16"  "metadata 100.100.100.200"
 *     "metadata 192.0.0.192"      "metadata fd00:ec2::254"  "metadata fd20:ce::254"
 *     "broker interface address"  "operator deny_cidrs"
 *   other:
 *     "invalid address"           (NULL address or a family other than AF_INET/AF_INET6)
 *   NAT64: an address in 64:ff9b::/96 is judged by the IPv4 address it embeds
 *     (RFC 6052); its rule is "nat64 64:ff9b::/96 embeds " followed by the IPv4
 *     rule, e.g. "nat64 64:ff9b::/96 embeds private 10.0.0.0/8" or
 *     "nat64 64:ff9b::/96 embeds global unicast".
 *   names (sb_egress_check_name):
 *     "not a reserved name" (allowed), "empty host name", "numeric host is not a name",
 *     "reserved name localhost", "reserved name *.localhost",
 *     "metadata name <name>" for each name listed at sb_egress_check_name.
 *
 * Operator exceptions. An address in egress.allow_cidrs is allowed although a
 * rule above denies it, except:
 *  - operator deny_cidrs always win over allow_cidrs;
 *  - loopback (127.0.0.0/8, ::1), the unspecified addresses (0.0.0.0/8, ::,
 *    which Linux connects to the local host), link-local (169.254.0.0/16,
 *    fe80::/10), the metadata addresses and the broker's interface addresses
 *    are allowed only by an entry naming that exact address (a /32 or /128, or
 *    a bare address): "127.0.0.0/8" does not allow 127.0.0.1, "127.0.0.1" does;
 *  - the IPv4-embedding transition forms (IPv4-mapped ::ffff:0:0/96,
 *    IPv4-compatible ::/96, 6to4 2002::/16, Teredo 2001::/32) are never
 *    allowed: allow the IPv4 address itself. An allow_cidrs entry that lies
 *    inside one of them is a configuration error.
 */
#ifndef SB_FETCH_IPCLASS_H
#define SB_FETCH_IPCLASS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <jansson.h>
#include "sb/status.h"

/* the most entries either of egress.deny_cidrs and egress.allow_cidrs may hold */
#define SB_EGRESS_MAX_CIDRS 4096u
/* room for sb_ip_format's output, NUL included (INET6_ADDRSTRLEN) */
#define SB_IP_STRLEN 46u

/**
 * An IPv4 or IPv6 address as numbers. Plain value type: copy it freely.
 */
typedef struct st_sb_ip_t {
    int family;       /* AF_INET or AF_INET6 */
    uint8_t addr[16]; /* network byte order; IPv4 in addr[0..3], addr[4..15] ignored */
} sb_ip_t;

/**
 * An egress policy: the operator's deny and allow lists and, optionally, the
 * broker's own interface addresses. Opaque; immutable after
 * sb_egress_policy_create, so one policy may be read from every worker thread
 * at once without locking.
 */
typedef struct st_sb_egress_policy_t sb_egress_policy_t;

/**
 * Builds a policy from the egress configuration.
 * @param deny_cidrs egress.deny_cidrs: a JSON array of "a.b.c.d/len", "a.b.c.d", "v6/len" or "v6"
 *        strings, or NULL (or JSON null) for none. IPv4 must be the canonical dotted quad (no leading
 *        zeros, four parts); the prefix length is decimal without leading zeros; host bits below the
 *        prefix must be zero ("10.0.0.1/8" is refused). At most SB_EGRESS_MAX_CIDRS entries.
 * @param allow_cidrs egress.allow_cidrs, same syntax; additionally an entry inside an IPv4-embedding
 *        transition prefix (::ffff:0:0/96, ::/96, 2002::/16, 2001::/32) is refused.
 * @param deny_local_interfaces nonzero to read the broker's interface addresses now and deny them (IPv4
 *        by SIOCGIFCONF, IPv6 from /proc/net/if_inet6: no netlink socket, which the systemd unit does not
 *        allow); addresses that appear later (DHCP, hotplug) are not seen until the policy is rebuilt.
 * @param out receives the policy on success (NULL on failure); the caller owns it and frees it with
 *        sb_egress_policy_free once no thread reads it any more.
 * @param err receives a one-line message naming the offending entry on failure, e.g.
 *        `egress.allow_cidrs[1]: invalid CIDR "10.0.0.0/33": prefix length must be a decimal integer 0-32`;
 *        may be NULL. Set to "" on success.
 * @param errsz size of err.
 * @return SB_OK; SB_E_BAD_ARGS for a malformed list or entry; SB_E_UNAVAILABLE when
 *         deny_local_interfaces is set and either list cannot be read (fail closed); SB_E_NOMEM.
 */
SB_WARN_UNUSED sb_status_t sb_egress_policy_create(const json_t *deny_cidrs, const json_t *allow_cidrs, int deny_local_interfaces,
                                                   sb_egress_policy_t **out, char *err, size_t errsz);

/**
 * Frees a policy. NULL is a no-op.
 * @param p the policy; no thread may still be reading it.
 */
void sb_egress_policy_free(sb_egress_policy_t *p);

/**
 * The verdict for one address. Thread-safe, allocation-free, constant-time in
 * the built-in tables and linear in the operator lists.
 * @param p the policy, or NULL for the built-in rules only (no operator lists, no interface addresses).
 * @param ip the address; AF_INET or AF_INET6. A NULL address or any other family is denied.
 * @param rule if not NULL, receives a static string naming the deciding rule (see the table at the top
 *        of this header); never NULL afterwards.
 * @return 1 allowed, 0 denied.
 */
SB_WARN_UNUSED int sb_egress_check_ip(const sb_egress_policy_t *p, const sb_ip_t *ip, const char **rule);

/**
 * The verdict for a host name, before any DNS query. The name should be the
 * URL parser's canonical host (lowercase A-labels, no trailing dot); ASCII
 * case and one trailing dot are tolerated anyway. Denied:
 *  - "localhost" and every name under ".localhost" (RFC 6761 section 6.3);
 *  - documented cloud metadata and in-cluster API names: metadata.google.internal and metadata (GCP),
 *    instance-data, instance-data.ec2.internal and instance-data.<region>.compute.internal (AWS),
 *    metadata.tencentyun.com (Tencent Cloud), api.metadata.cloud.ibm.com (IBM Cloud VPC),
 *    kubernetes.default.svc and kubernetes.default.svc.cluster.local (Kubernetes API server);
 *  - anything numeric-looking (a ':' anywhere, or an all-digit last label): literals are addresses
 *    and go through sb_egress_check_ip, never through DNS.
 * Allowing a name only means it may be resolved: every answer still goes through sb_egress_check_ip.
 * @param p the policy, or NULL (names have no operator rules today).
 * @param host NUL-terminated host name; NULL or "" is denied.
 * @param rule if not NULL, receives a static string naming the rule; never NULL afterwards.
 * @return 1 allowed, 0 denied.
 */
SB_WARN_UNUSED int sb_egress_check_name(const sb_egress_policy_t *p, const char *host, const char **rule);

/**
 * Reads an address out of a socket address. An IPv4-mapped IPv6 socket
 * address stays AF_INET6 (and is therefore denied by sb_egress_check_ip).
 * @param sa an AF_INET or AF_INET6 socket address (sockaddr_in or sockaddr_in6 behind the pointer)
 * @param out filled on success, zeroed on failure
 * @return 0, or -1 for NULL or another family
 */
SB_WARN_UNUSED int sb_ip_from_sockaddr(const struct sockaddr *sa, sb_ip_t *out);

/**
 * Writes a socket address for connect(2).
 * @param ip the address (AF_INET or AF_INET6)
 * @param port the port, host byte order
 * @param ss zeroed, then filled with a sockaddr_in or sockaddr_in6 (scope id 0)
 * @param len receives sizeof the filled structure, or 0 when ip is NULL or of another family
 */
void sb_ip_to_sockaddr(const sb_ip_t *ip, uint16_t port, struct sockaddr_storage *ss, socklen_t *len);

/**
 * Writes the canonical text of an address (the inet_ntop form: dotted quad,
 * or RFC 5952 lowercase compressed IPv6).
 * @param ip the address; NULL or another family writes "(invalid)"
 * @param out the buffer; SB_IP_STRLEN bytes always suffice; NUL-terminated, truncated to outsz
 * @param outsz its size; 0 writes nothing
 */
void sb_ip_format(const sb_ip_t *ip, char *out, size_t outsz);

/**
 * Parses an address literal strictly: a canonical dotted-quad IPv4 (four
 * decimal parts 0-255 without leading zeros) or an IPv6 address as inet_pton
 * accepts it (no brackets, no zone id, no prefix length).
 * @param s NUL-terminated text
 * @param out filled on success, zeroed on failure
 * @return 0 on success, -1 otherwise
 */
SB_WARN_UNUSED int sb_ip_parse(const char *s, sb_ip_t *out);

#endif
