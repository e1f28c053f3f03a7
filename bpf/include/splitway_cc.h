/* SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause */
/*
 * Minimal CO-RE view of the kernel types splitway's BPF congestion controls
 * touch. Only the members used are declared; `preserve_access_index` makes
 * clang emit relocations, and libbpf resolves the real offsets against the
 * running kernel's BTF (/sys/kernel/btf/vmlinux) at load time, so no
 * vmlinux.h (and no bpftool) is needed to build.
 *
 * struct tcp_congestion_ops is matched by member name by libbpf when it
 * fills the struct_ops map, so the subset below is enough; `name` must keep
 * the kernel's size (TCP_CA_NAME_MAX = 16).
 */
#ifndef SPLITWAY_CC_H
#define SPLITWAY_CC_H

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

struct in6_addr {
	union {
		__u32 u6_addr32[4];
	} in6_u;
} __attribute__((preserve_access_index));

struct sock_common {
	__u32 skc_daddr;
	unsigned short skc_family;
	struct in6_addr skc_v6_daddr;
} __attribute__((preserve_access_index));

struct sock {
	struct sock_common __sk_common;
	unsigned long sk_pacing_rate;
	unsigned long sk_max_pacing_rate;
	__u32 sk_pacing_status;
} __attribute__((preserve_access_index));

struct inet_connection_sock {
	__u64 icsk_ca_priv[13];
} __attribute__((preserve_access_index));

struct minmax_sample {
	__u32 t;
	__u32 v;
};

struct minmax {
	struct minmax_sample s[3];
};

struct tcp_sock {
	__u32 snd_cwnd;
	__u32 snd_cwnd_cnt;
	__u32 snd_cwnd_clamp;
	__u32 snd_ssthresh;
	__u32 snd_nxt;
	__u32 snd_una;
	__u32 max_packets_out;
	__u32 packets_out;
	__u32 lsndtime;
	__u32 srtt_us;
	__u32 data_segs_out;
	__u32 mss_cache;
	struct minmax rtt_min;
	__u64 tcp_mstamp;
	/* The last delivery-rate sample (what TCP_INFO's delivery rate
	 * reports): segments delivered over an interval. */
	__u32 rate_delivered;
	__u32 rate_interval_us;
	/* Segments marked lost (SACK, RACK) and retransmitted so far. */
	__u32 lost_out;
	__u32 total_retrans;
	/* Segments delivered since the current recovery began (PRR's count). */
	__u32 prr_delivered;
	__u8 is_cwnd_limited : 1;
} __attribute__((preserve_access_index));

struct ack_sample {
	__u32 pkts_acked;
	__s32 rtt_us;
	__u32 in_flight;
} __attribute__((preserve_access_index));

enum tcp_ca_event {
	CA_EVENT_TX_START = 0,
	CA_EVENT_CWND_RESTART = 1,
	CA_EVENT_COMPLETE_CWR = 2,
	CA_EVENT_LOSS = 3,
	CA_EVENT_ECN_NO_CE = 4,
	CA_EVENT_ECN_IS_CE = 5,
};

#define SW_TCP_CA_OPEN 0
#define SW_TCP_CA_LOSS 4
#define SW_SK_PACING_NONE 0
#define SW_SK_PACING_NEEDED 1

struct tcp_congestion_ops {
	__u32 (*ssthresh)(struct sock *sk);
	void (*cong_avoid)(struct sock *sk, __u32 ack, __u32 acked);
	void (*set_state)(struct sock *sk, __u8 new_state);
	void (*cwnd_event)(struct sock *sk, enum tcp_ca_event ev);
	void (*pkts_acked)(struct sock *sk, const struct ack_sample *sample);
	__u32 (*undo_cwnd)(struct sock *sk);
	char name[16];
	void (*init)(struct sock *sk);
	void (*release)(struct sock *sk);
} __attribute__((preserve_access_index));

/* Kernel helpers exported to struct_ops congestion controls as kfuncs. */
extern __u32 tcp_slow_start(struct tcp_sock *tp, __u32 acked) __ksym;
extern void tcp_cong_avoid_ai(struct tcp_sock *tp, __u32 w, __u32 acked) __ksym;
extern __u32 tcp_reno_undo_cwnd(struct sock *sk) __ksym;

static __always_inline struct tcp_sock *sw_tcp_sk(struct sock *sk)
{
	return (struct tcp_sock *)sk;
}

static __always_inline void *sw_ca_priv(struct sock *sk)
{
	return (void *)((struct inet_connection_sock *)sk)->icsk_ca_priv;
}

/* Sequence-space comparison (RFC 1982 style), as the kernel's after(). */
static __always_inline int sw_after(__u32 a, __u32 b)
{
	return (__s32)(b - a) < 0;
}

static __always_inline int sw_in_slow_start(const struct tcp_sock *tp)
{
	return tp->snd_cwnd < tp->snd_ssthresh;
}

/* The kernel's tcp_is_cwnd_limited(): in slow start, cwnd must be able to
 * double what is in flight; afterwards the stack's own flag decides. */
static __always_inline int sw_is_cwnd_limited(const struct tcp_sock *tp)
{
	if (sw_in_slow_start(tp))
		return tp->snd_cwnd < 2 * tp->max_packets_out;
	return BPF_CORE_READ_BITFIELD(tp, is_cwnd_limited);
}

#define SW_MIN(a, b) ((a) < (b) ? (a) : (b))
#define SW_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif
