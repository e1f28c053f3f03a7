/* SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause */
/*
 * Packet constants and header layouts shared by splitway's BPF programs:
 * address families, TCP flags, splitway's destination option and the
 * smallest IP and TCP headers syn_watch reads. Wire order as on the wire.
 */
#ifndef SPLITWAY_PARSE_H
#define SPLITWAY_PARSE_H

#include <linux/types.h>

/* AF_INET, AF_INET6: the BPF target has no <sys/socket.h>. */
#define SW_AF_INET 2
#define SW_AF_INET6 10

/* TCP header flags byte. */
#define SW_TCP_FLAG_SYN 0x02
#define SW_TCP_FLAG_ACK 0x10

/*
 * splitway's destination option: RFC 6994 experimental kind 253, ExID
 * 0x5357 ("SW"); the body is in crates/splitway-proto/src/syn_option.rs.
 * agent_synopt writes it, syn_watch finds it.
 */
#define SW_OPT_KIND 253
#define SW_OPT_EXID_HI 0x53
#define SW_OPT_EXID_LO 0x57

struct ipv4_min {
	__u8 ver_ihl;
	__u8 tos;
	__u16 tot_len;
	__u16 id;
	__u16 frag_off;
	__u8 ttl;
	__u8 protocol;
	__u16 check;
	__u8 saddr[4];
	__u8 daddr[4];
};

struct ipv6_min {
	__u32 ver_tc_flow;
	__u16 payload_len;
	__u8 nexthdr;
	__u8 hop_limit;
	__u8 saddr[16];
	__u8 daddr[16];
};

// The first 14 bytes of the TCP header: ports and flags.
struct tcp_min {
	__u16 source;
	__u16 dest;
	__u32 seq;
	__u32 ack_seq;
	__u8 doff_res;
	__u8 flags;
};

#endif
