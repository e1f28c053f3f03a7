// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//
// splitway_cubic: CUBIC (RFC 9438) as a BPF struct_ops tcp_congestion_ops,
// written for splitway after the kernel's net/ipv4/tcp_cubic.c, with
// HyStart (ack train + delay) and TCP friendliness, using the same
// constants (beta 717/1024, C 0.4, 2^10 time units).
//
// License: dual GPL-2.0-only OR BSD-2-Clause. The object's license string is
// "Dual BSD/GPL" (GPL-compatible), which the kernel requires because the
// program calls GPL-only kfuncs (tcp_slow_start, tcp_cong_avoid_ai,
// tcp_reno_undo_cwnd). The rest of splitway is Apache-2.0; this file is not.
//
// Differences from tcp_cubic.c, all because a BPF program cannot know HZ
// without reading the kernel config:
//  - epoch and rate-limit times are kept in microseconds (tp->tcp_mstamp)
//    rather than jiffies; the "once per jiffy" update limit is 1 ms and the
//    "unchanged cwnd" limit is 1/32 s, as at HZ=1000;
//  - the idle time shifted out of the epoch at CA_EVENT_TX_START is measured
//    from the last ACK rather than from tp->lsndtime (jiffies);
//  - the cube root is a fixed seven-step integer Newton iteration, not the
//    kernel's table + one Newton step (both within 0.2 %).

#include "cubic_core.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

SEC("struct_ops/splitway_cubic_init")
void BPF_PROG(splitway_cubic_init, struct sock *sk)
{
	cubic_init(sk);
}

SEC("struct_ops/splitway_cubic_cwnd_event")
void BPF_PROG(splitway_cubic_cwnd_event, struct sock *sk, enum tcp_ca_event ev)
{
	cubic_cwnd_event(sk, ev);
}

SEC("struct_ops/splitway_cubic_cong_avoid")
void BPF_PROG(splitway_cubic_cong_avoid, struct sock *sk, __u32 ack, __u32 acked)
{
	cubic_cong_avoid(sk, ack, acked);
}

SEC("struct_ops/splitway_cubic_ssthresh")
__u32 BPF_PROG(splitway_cubic_ssthresh, struct sock *sk)
{
	return cubic_ssthresh(sk);
}

SW_CUBIC_SHARED_OPS(splitway_cubic)

SEC(".struct_ops")
struct tcp_congestion_ops splitway_cubic_ops = {
	.init = (void *)splitway_cubic_init,
	.ssthresh = (void *)splitway_cubic_ssthresh,
	.cong_avoid = (void *)splitway_cubic_cong_avoid,
	.set_state = (void *)splitway_cubic_set_state,
	.undo_cwnd = (void *)splitway_cubic_undo_cwnd,
	.cwnd_event = (void *)splitway_cubic_cwnd_event,
	.pkts_acked = (void *)splitway_cubic_pkts_acked,
	.name = "splitway_cubic",
};
