// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//
// Unlike the rest of splitway (Apache-2.0, see LICENSE), this program runs
// in the kernel, whose verifier lets only programs with a GPL-compatible
// license section call GPL-only helpers; it is dual licensed GPL/BSD and
// its license section says the same ("Dual BSD/GPL").
//
// syn_watch: a tc ingress (cls_bpf direct-action or TCX) program that reports
// every TCP SYN (SYN set, ACK clear) to user space through a ring buffer, so
// the relay can start the next leg before accept() returns (KTCP's
// "Early SYN"). For a syn-option listener's port it reports only SYNs that
// carry splitway's destination option, with their TCP options attached: the
// destination is in the option, not in the IP header.
//
// It never drops, redirects or holds a packet. Every path returns
// TC_ACT_UNSPEC rather than TC_ACT_OK: both let the packet through, but OK
// also ends classification, so under TCX it would skip later TCX programs
// and every legacy clsact filter (e.g. a lab's mirred redirect), and under
// cls_bpf it would skip lower-priority filters. UNSPEC means "no opinion":
// the next program or filter runs, and at the end the packet passes.
//
// Headers are read relative to the network header
// (bpf_skb_load_bytes_relative with BPF_HDR_START_NET), so the same program
// works on Ethernet devices (veth) and on L3-only devices (TUN), where tc
// ingress sees no MAC header. skb->protocol selects IPv4 or IPv6; TUN devices
// opened with IFF_NO_PI set it from the IP version nibble.
//
// Event layout is shared with crates/splitway-sys/src/bpf/syn_watch/event.rs
// (RawSynEvent): addresses and ports in network byte order, exactly as on the
// wire; IPv4 addresses occupy the first 4 bytes of the 16-byte fields.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "parse.h"
#include "layout.h"

#define SW_FAMILY_V4 4
#define SW_FAMILY_V6 6

#define TCP_FLAGS_OFFSET 13

struct syn_event {
	__u64 at_ns;      // bpf_ktime_get_ns(): CLOCK_MONOTONIC
	__u8 saddr[16];   // client
	__u8 daddr[16];   // original destination
	__u16 sport;      // network byte order
	__u16 dport;      // network byte order
	__u32 ifindex;    // device the SYN arrived on
	__u8 family;      // SW_FAMILY_V4 or SW_FAMILY_V6
	__u8 ttl;         // IPv4 TTL or IPv6 hop limit: the relay's loop guard
	__u8 synopt;      // 1: a SYN to a syn-option port carrying our option
	__u8 opt_len;     // bytes of `opts` in use (synopt events only)
	__u8 _pad[4];
	__u8 opts[40];    // the SYN's TCP options, raw: user space parses them
};
SW_PIN_SIZE(syn_event, 96);
SW_PIN_OFFSET(syn_event, at_ns, 0);
SW_PIN_OFFSET(syn_event, saddr, 8);
SW_PIN_OFFSET(syn_event, daddr, 24);
SW_PIN_OFFSET(syn_event, sport, 40);
SW_PIN_OFFSET(syn_event, dport, 42);
SW_PIN_OFFSET(syn_event, family, 48);
SW_PIN_OFFSET(syn_event, ttl, 49);
SW_PIN_OFFSET(syn_event, synopt, 50);
SW_PIN_OFFSET(syn_event, opt_len, 51);
SW_PIN_OFFSET(syn_event, opts, 56);

// Ring buffer of struct syn_event. 128 KiB = 1,260 events of 104 bytes
// (event + 8-byte record header) between two reads; the reader wakes on
// each submit. User space maps the data area twice, so each KiB here is
// two of the relay's RSS (256 KiB cost 520 KB idle).
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 128 * 1024);
} SW_EVENTS SEC(".maps");

// Destination ports to watch (host byte order key). The value's bits:
// PORT_PLAIN reports every SYN to the port (tproxy interception; consulted
// only when SW_FILTER_PORTS is set, else every port is plain);
// PORT_SYNOPT reports SYNs that carry splitway's destination option (a
// syn-option listener's port), with their options.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u16);
	__type(value, __u8);
} SW_PORTS SEC(".maps");

// Per CPU: index 0, events lost because the ring buffer was full; index 1,
// IPv6 packets whose TCP header, if any, lies behind extension headers the
// program does not walk (AH, or more than IPV6_EXT_MAX of them): a SYN among
// them is not reported.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} SW_DROPPED SEC(".maps");

#define COUNT_DROPPED 0
#define COUNT_IPV6_UNWALKED 1

// Client prefixes (IPv4 /24, IPv6 /64) whose handshakes complete too quickly
// for an early start to gain anything (a LAN: the accept follows the SYN by
// tens of microseconds, and the early start only costs CPU). Their plain
// SYNs are reported only for one client port in SW_NEAR_SAMPLE, so the relay keeps measuring them and takes the prefix
// out again when its handshakes slow down (a sample: bits 1-4 of the port
// all 0, one connection in 16). Filled by user space.
struct near_key {
	__u8 family;   // SW_FAMILY_V4 or SW_FAMILY_V6
	__u8 _pad[7];
	__u8 prefix[8]; // the address's first 3 (v4) or 8 (v6) bytes, rest 0
};
SW_PIN_SIZE(near_key, 16);
SW_PIN_OFFSET(near_key, family, 0);
SW_PIN_OFFSET(near_key, prefix, 8);

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct near_key);
	__type(value, __u8);
} SW_NEAR SEC(".maps");

#define SW_NEAR_SAMPLE 16

// Set by the loader before load: 1 = only ports in SW_PORTS, 0 = every port.
volatile const __u8 SW_FILTER_PORTS = 1;

#define PORT_PLAIN 1
#define PORT_SYNOPT 2

#define OPTS_MAX 40

// PORT_PLAIN / PORT_SYNOPT bits for a destination port.
static __always_inline __u8 port_watched(__u16 dport_be)
{
	__u16 key = bpf_ntohs(dport_be);
	__u8 *v = bpf_map_lookup_elem(&SW_PORTS, &key);
	__u8 bits = v ? *v : 0;
	if (!SW_FILTER_PORTS)
		bits |= PORT_PLAIN;
	return bits;
}

// Loads the TCP options (after the 20-byte fixed header) into `buf` and
// returns their length if they contain our option's first bytes (kind 253,
// a length of at least 5, ExID 0x5357), else 0. A scan at fixed offsets, not
// a walk of the option list: the verifier checks it in linear time, whereas
// the walk's data-dependent steps took it tens of seconds. A match inside
// another option's data is harmless: the relay parses the copy with the
// full codec and starts nothing for a SYN without a valid option.
static __always_inline __u32 load_our_option(struct __sk_buff *skb, __u32 tcp_offset,
					     const struct tcp_min *tcp, __u8 *buf)
{
	__u32 n = (__u32)(tcp->doff_res >> 4) * 4;
	if (n <= 20)
		return 0;
	n -= 20;
	if (n > OPTS_MAX)
		return 0;
	__builtin_memset(buf, 0, 64); // the event copies all OPTS_MAX bytes
	if (bpf_skb_load_bytes_relative(skb, tcp_offset + 20, buf, n, BPF_HDR_START_NET))
		return 0;
#pragma unroll
	for (int i = 0; i + 3 < OPTS_MAX; i++) {
		if (buf[i] == SW_OPT_KIND && buf[i + 1] >= 5 && buf[i + 2] == SW_OPT_EXID_HI &&
		    buf[i + 3] == SW_OPT_EXID_LO)
			return n;
	}
	return 0;
}

static __always_inline void count(__u32 what)
{
	__u64 *n = bpf_map_lookup_elem(&SW_DROPPED, &what);
	if (n)
		*n += 1; // per-CPU slot: no other writer, no atomic needed
}

#define NEXTHDR_HOP 0
#define NEXTHDR_ROUTING 43
#define NEXTHDR_FRAGMENT 44
#define NEXTHDR_AUTH 51
#define NEXTHDR_DEST 60
#define IPV6_EXT_MAX 4

// The offset of an IPv6 packet's TCP header, walking up to IPV6_EXT_MAX
// hop-by-hop, routing, destination-options and (first) fragment headers;
// 0 when the packet carries no TCP header this program can see. A TCP
// header behind AH or deeper headers is counted (COUNT_IPV6_UNWALKED).
static __always_inline __u32 ipv6_tcp_offset(struct __sk_buff *skb, __u8 nexthdr)
{
	__u32 off = sizeof(struct ipv6_min);
#pragma unroll
	for (int i = 0; i < IPV6_EXT_MAX; i++) {
		__u8 hdr[4];
		if (nexthdr == IPPROTO_TCP)
			return off;
		if (nexthdr == NEXTHDR_HOP || nexthdr == NEXTHDR_ROUTING || nexthdr == NEXTHDR_DEST) {
			if (bpf_skb_load_bytes_relative(skb, off, hdr, 2, BPF_HDR_START_NET))
				return 0;
			nexthdr = hdr[0];
			off += ((__u32)hdr[1] + 1) * 8; // length in 8 octets, the first not counted
		} else if (nexthdr == NEXTHDR_FRAGMENT) {
			if (bpf_skb_load_bytes_relative(skb, off, hdr, 4, BPF_HDR_START_NET))
				return 0;
			// Only the first fragment (offset 0) holds the TCP header.
			if (((((__u16)hdr[2]) << 8) | hdr[3]) & 0xfff8)
				return 0;
			nexthdr = hdr[0];
			off += 8;
		} else {
			if (nexthdr == NEXTHDR_AUTH)
				count(COUNT_IPV6_UNWALKED);
			return 0; // UDP, ICMPv6, ESP (encrypted), ...
		}
	}
	if (nexthdr == IPPROTO_TCP)
		return off;
	if (nexthdr == NEXTHDR_HOP || nexthdr == NEXTHDR_ROUTING || nexthdr == NEXTHDR_DEST ||
	    nexthdr == NEXTHDR_FRAGMENT || nexthdr == NEXTHDR_AUTH)
		count(COUNT_IPV6_UNWALKED);
	return 0;
}

// A plain SYN from a near prefix that is not one of its samples.
static __always_inline int near_unsampled(__u8 family, const __u8 *saddr, __u16 sport_be)
{
	struct near_key key;
	// Bits 1-4: connect() picks even ports, consecutive ones 2 apart.
	if (((bpf_ntohs(sport_be) >> 1) & (SW_NEAR_SAMPLE - 1)) == 0)
		return 0;
	__builtin_memset(&key, 0, sizeof(key));
	key.family = family;
	if (family == SW_FAMILY_V4)
		__builtin_memcpy(key.prefix, saddr, 3);
	else
		__builtin_memcpy(key.prefix, saddr, 8);
	return bpf_map_lookup_elem(&SW_NEAR, &key) != 0;
}

static __always_inline int is_bare_syn(const struct tcp_min *tcp)
{
	return (tcp->flags & (SW_TCP_FLAG_SYN | SW_TCP_FLAG_ACK)) == SW_TCP_FLAG_SYN;
}

// A SYN carrying data is a TCP Fast Open client's: the listener accepts it
// at the SYN with the data readable, so starting the next leg early gains
// nothing and would send the relay header without the client's first bytes
// (which then cannot ride the server leg's SYN). Not reported.
static __always_inline int carries_data(__u32 ip_payload, const struct tcp_min *tcp)
{
	return ip_payload > (__u32)(tcp->doff_res >> 4) * 4;
}

SEC("classifier") // aya 0.14 knows "classifier", not libbpf's "tc"
int syn_watch(struct __sk_buff *skb)
{
	struct tcp_min tcp;
	struct syn_event *event;
	__u32 tcp_offset;
	__u8 opts[64]; // OPTS_MAX, rounded up so masked indexes stay inside
	__u32 opt_len = 0;
	__u8 bits;

	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct ipv4_min ip;
		if (bpf_skb_load_bytes_relative(skb, 0, &ip, sizeof(ip), BPF_HDR_START_NET))
			return TC_ACT_UNSPEC;
		// Non-first fragments carry no TCP header.
		if (ip.protocol != IPPROTO_TCP || (ip.frag_off & bpf_htons(0x1fff)))
			return TC_ACT_UNSPEC;
		tcp_offset = (ip.ver_ihl & 0x0f) * 4;
		if (tcp_offset < sizeof(ip))
			return TC_ACT_UNSPEC;
		if (bpf_skb_load_bytes_relative(skb, tcp_offset, &tcp, sizeof(tcp), BPF_HDR_START_NET))
			return TC_ACT_UNSPEC;
		if (!is_bare_syn(&tcp))
			return TC_ACT_UNSPEC;
		bits = port_watched(tcp.dest);
		if (bits & PORT_SYNOPT)
			opt_len = load_our_option(skb, tcp_offset, &tcp, opts);
		if (!opt_len && !(bits & PORT_PLAIN))
			return TC_ACT_UNSPEC;
		if (!opt_len && near_unsampled(SW_FAMILY_V4, ip.saddr, tcp.source))
			return TC_ACT_UNSPEC;
		if (carries_data((__u32)bpf_ntohs(ip.tot_len) - tcp_offset, &tcp))
			return TC_ACT_UNSPEC;
		event = bpf_ringbuf_reserve(&SW_EVENTS, sizeof(*event), 0);
		if (!event) {
			count(COUNT_DROPPED);
			return TC_ACT_UNSPEC;
		}
		__builtin_memset(event, 0, sizeof(*event));
		__builtin_memcpy(event->saddr, ip.saddr, 4);
		__builtin_memcpy(event->daddr, ip.daddr, 4);
		event->family = SW_FAMILY_V4;
		event->ttl = ip.ttl;
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct ipv6_min ip6;
		if (bpf_skb_load_bytes_relative(skb, 0, &ip6, sizeof(ip6), BPF_HDR_START_NET))
			return TC_ACT_UNSPEC;
		tcp_offset = ipv6_tcp_offset(skb, ip6.nexthdr);
		if (!tcp_offset)
			return TC_ACT_UNSPEC;
		if (bpf_skb_load_bytes_relative(skb, tcp_offset, &tcp, sizeof(tcp), BPF_HDR_START_NET))
			return TC_ACT_UNSPEC;
		if (!is_bare_syn(&tcp))
			return TC_ACT_UNSPEC;
		bits = port_watched(tcp.dest);
		if (bits & PORT_SYNOPT)
			opt_len = load_our_option(skb, tcp_offset, &tcp, opts);
		if (!opt_len && !(bits & PORT_PLAIN))
			return TC_ACT_UNSPEC;
		if (!opt_len && near_unsampled(SW_FAMILY_V6, ip6.saddr, tcp.source))
			return TC_ACT_UNSPEC;
		// The payload length counts the extension headers too.
		if (carries_data((__u32)bpf_ntohs(ip6.payload_len) + sizeof(ip6) - tcp_offset, &tcp))
			return TC_ACT_UNSPEC;
		event = bpf_ringbuf_reserve(&SW_EVENTS, sizeof(*event), 0);
		if (!event) {
			count(COUNT_DROPPED);
			return TC_ACT_UNSPEC;
		}
		__builtin_memset(event, 0, sizeof(*event));
		__builtin_memcpy(event->saddr, ip6.saddr, 16);
		__builtin_memcpy(event->daddr, ip6.daddr, 16);
		event->family = SW_FAMILY_V6;
		event->ttl = ip6.hop_limit;
	} else {
		return TC_ACT_UNSPEC;
	}

	if (opt_len) {
		event->synopt = 1;
		event->opt_len = opt_len;
		__builtin_memcpy(event->opts, opts, OPTS_MAX);
	}
	event->sport = tcp.source;
	event->dport = tcp.dest;
	event->ifindex = skb->ifindex;
	event->at_ns = bpf_ktime_get_ns();
	bpf_ringbuf_submit(event, 0);
	return TC_ACT_UNSPEC;
}

/* Must match the SPDX line: GPL-compatible for the GPL-only helpers. */
char LICENSE[] SEC("license") = "Dual BSD/GPL";
