/* SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause */
/*
 * CUBIC (RFC 9438) for splitway's BPF congestion controls, after the
 * kernel's net/ipv4/tcp_cubic.c: the hooks as inline functions, so
 * splitway_cubic.c and splitway_resume.c can wrap them. See
 * splitway_cubic.c for how it differs from the kernel's.
 */
#ifndef SPLITWAY_CUBIC_CORE_H
#define SPLITWAY_CUBIC_CORE_H

#include "splitway_cc.h"

#define BETA_SCALE 1024
#define BETA 717                     /* multiplicative decrease 717/1024 */
#define CUBIC_HZ 10                  /* time unit 2^-10 s */
#define CUBE_RTT_SCALE (41 * 10)     /* C = 0.4 scaled by 2^10 */
/* 2^(10 + 3 * CUBIC_HZ) / CUBE_RTT_SCALE: (wmax - cwnd) / C in K^3 units */
#define CUBE_FACTOR ((__u64)(1ULL << (10 + 3 * CUBIC_HZ)) / CUBE_RTT_SCALE)
/* TCP-friendly region: 8 * (1 + beta) / 3 / (1 - beta), scaled by 8 */
#define FRIENDLY_SCALE (8 * (BETA_SCALE + BETA) / 3 / (BETA_SCALE - BETA))

#define USEC_PER_SEC 1000000U
#define UPDATE_MIN_US 1000U          /* cnt recomputed at most once per ms */
#define SAME_CWND_MIN_US (USEC_PER_SEC / 32)
#define NO_DELAY_SAMPLES_US USEC_PER_SEC /* after a reduction */

#define HYSTART_LOW_WINDOW 16
#define HYSTART_ACK_DELTA_US 2000U
#define HYSTART_MIN_SAMPLES 8
#define HYSTART_DELAY_MIN_US 4000U
#define HYSTART_DELAY_MAX_US 16000U
#define GSO_LEGACY_MAX 65536ULL

struct sw_cubic {
	__u32 cnt;            /* ACKs per one-segment cwnd increase */
	__u32 last_max_cwnd;  /* W_max */
	__u32 last_cwnd;
	__u32 last_time_us;   /* when cnt was last recomputed */
	__u32 origin;         /* cwnd at the plateau of the curve */
	__u32 k;              /* time to origin, 2^-10 s */
	__u32 delay_min_us;
	__u32 epoch_start_us; /* 0: no epoch */
	__u32 ack_cnt;
	__u32 tcp_cwnd;       /* what Reno would have now */
	__u32 last_acked_us;  /* for the idle shift at TX_START */
	__u8 found;           /* HyStart exit taken */
	__u8 sample_cnt;
	__u16 pad;
	__u32 round_start_us;
	__u32 end_seq;
	__u32 last_ack_us;    /* HyStart ack train */
	__u32 curr_rtt_us;
};

_Static_assert(sizeof(struct sw_cubic) <= 13 * sizeof(__u64),
	       "state must fit icsk_ca_priv");

static __always_inline __u32 now_us(const struct tcp_sock *tp)
{
	return (__u32)tp->tcp_mstamp;
}

static __always_inline void cubic_reset(struct sw_cubic *ca)
{
	ca->cnt = 0;
	ca->last_max_cwnd = 0;
	ca->last_cwnd = 0;
	ca->last_time_us = 0;
	ca->origin = 0;
	ca->k = 0;
	ca->delay_min_us = 0;
	ca->epoch_start_us = 0;
	ca->ack_cnt = 0;
	ca->tcp_cwnd = 0;
	ca->found = 0;
}

static __always_inline void hystart_reset(struct sock *sk, struct sw_cubic *ca)
{
	struct tcp_sock *tp = sw_tcp_sk(sk);

	ca->round_start_us = ca->last_ack_us = now_us(tp);
	ca->end_seq = tp->snd_nxt;
	ca->curr_rtt_us = ~0U;
	ca->sample_cnt = 0;
}

/* Index of the highest set bit, 1-based (0 for 0). */
static __always_inline __u32 fls64(__u64 x)
{
	__u32 n = 0;

	if (x >> 32) {
		n += 32;
		x >>= 32;
	}
	if (x >> 16) {
		n += 16;
		x >>= 16;
	}
	if (x >> 8) {
		n += 8;
		x >>= 8;
	}
	if (x >> 4) {
		n += 4;
		x >>= 4;
	}
	if (x >> 2) {
		n += 2;
		x >>= 2;
	}
	if (x >> 1) {
		n += 1;
		x >>= 1;
	}
	return n + (__u32)x;
}

/* floor(cbrt(a)), within one. Newton's iteration from 2^ceil(bits/3),
 * which is at most twice the root, so it descends monotonically; seven
 * fixed steps reach the root for any 64-bit a. No data-dependent loop, so
 * the verifier walks it once. */
static __always_inline __u32 cube_root(__u64 a)
{
	__u64 x;
	int i;

	if (a == 0)
		return 0;
	x = 1ULL << ((fls64(a) + 2) / 3);
#pragma unroll
	for (i = 0; i < 7; i++)
		x = (2 * x + a / (x * x)) / 3;
	if (x * x * x > a)
		x--;
	return (__u32)x;
}

static __always_inline void cubic_init(struct sock *sk)
{
	struct sw_cubic *ca = sw_ca_priv(sk);

	cubic_reset(ca);
	ca->last_acked_us = now_us(sw_tcp_sk(sk));
	hystart_reset(sk, ca);
}

static __always_inline void cubic_cwnd_event(struct sock *sk, enum tcp_ca_event ev)
{
	struct sw_cubic *ca;
	__u32 now;
	__s32 idle;

	if (ev != CA_EVENT_TX_START)
		return;
	ca = sw_ca_priv(sk);
	now = now_us(sw_tcp_sk(sk));
	idle = (__s32)(now - ca->last_acked_us);
	/* Application-limited for a while: move the epoch so the curve does
	 * not jump ahead by the idle time. */
	if (ca->epoch_start_us && idle > 0) {
		ca->epoch_start_us += idle;
		if (sw_after(ca->epoch_start_us, now))
			ca->epoch_start_us = now;
	}
}

static __always_inline void cubic_update(struct sw_cubic *ca, __u32 now,
					 __u32 cwnd, __u32 acked)
{
	__u32 delta, target, max_cnt;
	__u64 t, offs;

	ca->ack_cnt += acked;

	if (ca->last_cwnd == cwnd &&
	    (__s32)(now - ca->last_time_us) <= (__s32)SAME_CWND_MIN_US)
		return;

	if (ca->epoch_start_us &&
	    (__s32)(now - ca->last_time_us) < (__s32)UPDATE_MIN_US)
		goto friendliness;

	ca->last_cwnd = cwnd;
	ca->last_time_us = now;

	if (ca->epoch_start_us == 0) {
		ca->epoch_start_us = now ? now : 1;
		ca->ack_cnt = acked;
		ca->tcp_cwnd = cwnd;
		if (ca->last_max_cwnd <= cwnd) {
			ca->k = 0;
			ca->origin = cwnd;
		} else {
			ca->k = cube_root(CUBE_FACTOR *
					  (__u64)(ca->last_max_cwnd - cwnd));
			ca->origin = ca->last_max_cwnd;
		}
	}

	/* Time since the epoch began, one min RTT ahead, in 2^-10 s. */
	t = (__u64)(__u32)(now - ca->epoch_start_us) + ca->delay_min_us;
	t = (t << CUBIC_HZ) / USEC_PER_SEC;
	offs = t < ca->k ? ca->k - t : t - ca->k;
	delta = (CUBE_RTT_SCALE * offs * offs * offs) >> (10 + 3 * CUBIC_HZ);
	target = t < ca->k ? ca->origin - delta : ca->origin + delta;

	if (target > cwnd)
		ca->cnt = cwnd / (target - cwnd);
	else
		ca->cnt = 100 * cwnd; /* plateau: grow very slowly */

	/* No W_max yet: grow at least 5 % per RTT. */
	if (ca->last_max_cwnd == 0 && ca->cnt > 20)
		ca->cnt = 20;

friendliness:
	/* Never slower than Reno with the same beta would be. */
	delta = (cwnd * FRIENDLY_SCALE) >> 3;
	if (delta && ca->ack_cnt > delta) {
		__u32 n = ca->ack_cnt / delta;

		ca->ack_cnt -= n * delta;
		ca->tcp_cwnd += n;
	}
	if (ca->tcp_cwnd > cwnd) {
		max_cnt = cwnd / (ca->tcp_cwnd - cwnd);
		if (ca->cnt > max_cnt)
			ca->cnt = max_cnt;
	}
	/* At most 1.5x per RTT. */
	if (ca->cnt < 2)
		ca->cnt = 2;
}

static __always_inline void cubic_cong_avoid(struct sock *sk, __u32 ack, __u32 acked)
{
	struct tcp_sock *tp = sw_tcp_sk(sk);
	struct sw_cubic *ca = sw_ca_priv(sk);

	if (!sw_is_cwnd_limited(tp))
		return;
	if (sw_in_slow_start(tp)) {
		acked = tcp_slow_start(tp, acked);
		if (!acked)
			return;
	}
	cubic_update(ca, now_us(tp), tp->snd_cwnd, acked);
	tcp_cong_avoid_ai(tp, ca->cnt, acked);
}

static __always_inline __u32 cubic_ssthresh(struct sock *sk)
{
	const struct tcp_sock *tp = sw_tcp_sk(sk);
	struct sw_cubic *ca = sw_ca_priv(sk);
	__u32 cwnd = tp->snd_cwnd;

	ca->epoch_start_us = 0;
	/* Fast convergence: release bandwidth to newer flows. */
	if (cwnd < ca->last_max_cwnd)
		ca->last_max_cwnd = (cwnd * (BETA_SCALE + BETA)) / (2 * BETA_SCALE);
	else
		ca->last_max_cwnd = cwnd;
	return SW_MAX((cwnd * BETA) / BETA_SCALE, 2U);
}

static __always_inline void cubic_set_state(struct sock *sk, __u8 new_state)
{
	if (new_state == SW_TCP_CA_LOSS) {
		struct sw_cubic *ca = sw_ca_priv(sk);

		cubic_reset(ca);
		hystart_reset(sk, ca);
	}
}

/* Pacing may delay ACKs of a TSO burst; allow for it, at most 1 ms. */
static __always_inline __u32 hystart_ack_delay_us(struct sock *sk)
{
	unsigned long rate = sk->sk_pacing_rate;

	if (!rate)
		return 0;
	return SW_MIN(1000ULL, GSO_LEGACY_MAX * 4 * USEC_PER_SEC / rate);
}

static __always_inline void hystart_update(struct sock *sk, struct sw_cubic *ca,
					   __u32 delay)
{
	struct tcp_sock *tp = sw_tcp_sk(sk);
	__u32 threshold, now;

	if (sw_after(tp->snd_una, ca->end_seq))
		hystart_reset(sk, ca);
	if (tp->snd_cwnd < HYSTART_LOW_WINDOW)
		return;

	/* Ack train: ACKs closely spaced for longer than half the min RTT. */
	now = now_us(tp);
	if ((__s32)(now - ca->last_ack_us) <= (__s32)HYSTART_ACK_DELTA_US) {
		ca->last_ack_us = now;
		threshold = ca->delay_min_us + hystart_ack_delay_us(sk);
		if (sk->sk_pacing_status == SW_SK_PACING_NONE)
			threshold >>= 1;
		if ((__s32)(now - ca->round_start_us) > (__s32)threshold) {
			ca->found = 1;
			tp->snd_ssthresh = tp->snd_cwnd;
		}
	}

	/* Delay: the round's min RTT grew by an eighth (clamped 4-16 ms). */
	if (ca->curr_rtt_us > delay)
		ca->curr_rtt_us = delay;
	if (ca->sample_cnt < HYSTART_MIN_SAMPLES) {
		ca->sample_cnt++;
	} else {
		__u32 slack = ca->delay_min_us >> 3;

		slack = SW_MAX(slack, HYSTART_DELAY_MIN_US);
		slack = SW_MIN(slack, HYSTART_DELAY_MAX_US);
		if (ca->curr_rtt_us > ca->delay_min_us + slack) {
			ca->found = 1;
			tp->snd_ssthresh = tp->snd_cwnd;
		}
	}
}

static __always_inline void cubic_pkts_acked(struct sock *sk,
	      const struct ack_sample *sample)
{
	struct tcp_sock *tp = sw_tcp_sk(sk);
	struct sw_cubic *ca = sw_ca_priv(sk);
	__u32 now = now_us(tp);
	__u32 delay;
	__s32 rtt = sample->rtt_us;

	ca->last_acked_us = now;
	if (rtt < 0)
		return; /* duplicate ACK without a timing */
	/* Delay right after a reduction reflects the old queue. */
	if (ca->epoch_start_us &&
	    (__s32)(now - ca->epoch_start_us) < (__s32)NO_DELAY_SAMPLES_US)
		return;
	delay = rtt ? (__u32)rtt : 1;
	if (ca->delay_min_us == 0 || ca->delay_min_us > delay)
		ca->delay_min_us = delay;
	if (!ca->found && sw_in_slow_start(tp))
		hystart_update(sk, ca, delay);
}

static __always_inline __u32 cubic_undo_cwnd(struct sock *sk)
{
	return tcp_reno_undo_cwnd(sk);
}

/* The struct_ops callbacks that are CUBIC's unchanged, for a congestion
 * control NAME: NAME_set_state, NAME_pkts_acked and NAME_undo_cwnd, in the
 * sections libbpf expects. Both programs take them as they are. */
#define SW_CUBIC_SHARED_OPS(NAME)                                              \
	SEC("struct_ops/" #NAME "_set_state")                                  \
	void BPF_PROG(NAME##_set_state, struct sock *sk, __u8 new_state)       \
	{                                                                      \
		cubic_set_state(sk, new_state);                                \
	}                                                                      \
	SEC("struct_ops/" #NAME "_pkts_acked")                                 \
	void BPF_PROG(NAME##_pkts_acked, struct sock *sk,                      \
		      const struct ack_sample *sample)                         \
	{                                                                      \
		cubic_pkts_acked(sk, sample);                                  \
	}                                                                      \
	SEC("struct_ops/" #NAME "_undo_cwnd")                                  \
	__u32 BPF_PROG(NAME##_undo_cwnd, struct sock *sk)                      \
	{                                                                      \
		return cubic_undo_cwnd(sk);                                    \
	}

#endif
