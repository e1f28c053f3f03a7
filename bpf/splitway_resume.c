// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//
// splitway_resume: CUBIC that resumes from the previous connection to the
// same peer, after the IETF's Careful Resume
// (draft-ietf-tsvwg-careful-resume) and RFC 9040's cached ssthresh. Meant for
// relay legs, which reconnect to the same few peers all the time: a measured,
// per-peer replacement for turbo-start's static initcwnd.
//
// License: dual GPL-2.0-only OR BSD-2-Clause; object license string
// "Dual BSD/GPL" (GPL-compatible, needed for the kfuncs CUBIC calls).
//
// - Saved: when a connection ends (release), its cwnd and smoothed RTT, per
//   peer address (the RTT is the connection's minimum), in an LRU hash map
//   (`sw_resume_peers`) pinned where the host has a bpf filesystem, else
//   living as long as the registration. Only windows above
//   RESUME_MIN_CWND are saved. A
//   connection that never left slow start may raise the saved window but not
//   lower it (a short transfer ends with a small window that says nothing of
//   the path); one that left it (loss, HyStart) replaces it.
// - Resume: at each send after idle (CA_EVENT_TX_START) while the
//   connection has sent fewer than RESUME_MIN_CWND data segments, if the
//   peer has an entry younger than RESUME_MAX_AGE and the RTT confirms the
//   path (between half and ten times the saved RTT, Careful Resume's check),
//   cwnd jumps to half the saved cwnd; ssthresh is set to the saved cwnd
//   only if the saving connection had left slow start.
//   The jump is paced (the kernel's internal pacing, SK_PACING_NEEDED) for
//   the unvalidated phase. Jumping at the send, not at init, is what makes
//   it work on pooled legs: they idle between handshake and first use, and
//   slow start after idle (tcp_cwnd_restart, which runs just before
//   TX_START) would cut a jump made at init back to the initial window.
// - Unvalidated phase: two smoothed RTTs after the jump. A loss in it is a
//   "safe retreat": ssthresh = a quarter of the jump (below what plain CUBIC
//   would keep), CUBIC's W_max forgotten, and the peer's entry deleted so
//   the next connection starts normally.
// - Afterwards it is splitway_cubic (cubic_core.h).
//
// Simplifications against the draft: the RTT check uses the connection's
// smoothed RTT so far (on a new leg, the handshake's) as the reconnaissance; the saved value is the final cwnd,
// not a measured flight size, which is why only half of it is used.

#include "cubic_core.h"
#include "layout.h"
#include "parse.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define RESUME_MIN_CWND 20
#define RESUME_MAX_AGE_NS (600ULL * 1000000000ULL)

struct resume_key {
	__u32 family;
	__u32 addr[4];
};

struct resume_val {
	__u32 cwnd;
	/* The saving connection's minimum RTT (its smoothed RTT if it had no
	 * minimum): the path's RTT without queueing. */
	__u32 srtt_us;
	__u64 at_ns;
	/* The saving connection had left slow start (a loss or HyStart), so
	 * its cwnd is a capacity estimate, not only what it had time to reach. */
	__u32 exited_slow_start;
	__u32 pad;
};

SW_PIN_SIZE(resume_key, 20);
SW_PIN_OFFSET(resume_key, addr, 4);
SW_PIN_SIZE(resume_val, 24);
SW_PIN_OFFSET(resume_val, srtt_us, 4);
SW_PIN_OFFSET(resume_val, at_ns, 8);
SW_PIN_OFFSET(resume_val, exited_slow_start, 16);

/* The kernel's initial ssthresh: the connection never left slow start. */
#define SW_INFINITE_SSTHRESH 0x7fffffff

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct resume_key);
	__type(value, struct resume_val);
} sw_resume_peers SEC(".maps");

/* What the algorithm did, host-wide (the name is registered machine-wide,
 * so every relay's legs run this one instance): read by the relays for
 * `splitway_learned_window_events_total` and `ctl status`. The map names
 * fit the kernel's 15 characters, so relays find the maps by name. */
enum {
	EV_JUMP,	/* a connection started from a saved window */
	EV_RTT_MISMATCH,	/* a saved window was refused: the RTT did not match */
	EV_VALIDATED,	/* a jump's unvalidated phase ended without loss */
	EV_RETREAT,	/* a loss in the unvalidated phase: safe retreat */
	EV_SAVED,	/* a connection's window was saved for its peer */
	EV_COUNT,
};

struct resume_events {
	__u64 n[EV_COUNT];
};

SW_PIN_SIZE(resume_events, 40);

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct resume_events);
} sw_resume_stats SEC(".maps");

static __always_inline void count_event(__u32 ev)
{
	__u32 zero = 0;
	struct resume_events *events = bpf_map_lookup_elem(&sw_resume_stats, &zero);

	if (events && ev < EV_COUNT)
		__sync_fetch_and_add(&events->n[ev], 1);
}

enum { CR_OFF = 0, CR_UNVALIDATED = 1 };

struct sw_resume {
	struct sw_cubic cubic; /* first: cubic_core.h reads it at offset 0 */
	__u32 jump_cwnd;
	__u32 jump_at_us;
	__u32 validate_us;
	/* The ssthresh the jump took from the saved entry (0: none): a
	 * connection whose ssthresh is still this one did not leave slow
	 * start itself, so it measured nothing new about the path. */
	__u32 inherited_ssthresh;
	__u8 phase;
};

_Static_assert(sizeof(struct sw_resume) <= 13 * sizeof(__u64),
	       "state must fit icsk_ca_priv");

static __always_inline int peer_key(struct sock *sk, struct resume_key *key)
{
	__u16 family = sk->__sk_common.skc_family;

	__builtin_memset(key, 0, sizeof(*key));
	key->family = family;
	if (family == SW_AF_INET) {
		key->addr[0] = sk->__sk_common.skc_daddr;
		return 1;
	}
	if (family == SW_AF_INET6) {
		key->addr[0] = sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32[0];
		key->addr[1] = sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32[1];
		key->addr[2] = sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32[2];
		key->addr[3] = sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32[3];
		return 1;
	}
	return 0;
}

SEC("struct_ops/splitway_resume_init")
void BPF_PROG(splitway_resume_init, struct sock *sk)
{
	struct sw_resume *ca = sw_ca_priv(sk);

	cubic_init(sk);
	ca->phase = CR_OFF;
	ca->inherited_ssthresh = 0;
}

/* Called at a send with nothing in flight (CA_EVENT_TX_START), after the
 * kernel's slow start after idle has run: jumps to the peer's saved window
 * if this connection is still in its first flights. */
static __always_inline void maybe_resume(struct sock *sk, struct sw_resume *ca)
{
	struct tcp_sock *tp = sw_tcp_sk(sk);
	struct resume_key key;
	struct resume_val *saved;
	__u32 srtt, jump;
	__u64 rate;

	/* Only a connection's first use: later idle periods follow the
	 * kernel's rules like any CUBIC flow. */
	if (tp->data_segs_out >= RESUME_MIN_CWND)
		return;
	if (!peer_key(sk, &key))
		return;
	saved = bpf_map_lookup_elem(&sw_resume_peers, &key);
	if (!saved)
		return;
	if (bpf_ktime_get_ns() - saved->at_ns > RESUME_MAX_AGE_NS)
		return;
	srtt = tp->srtt_us >> 3;
	/* No RTT sample, or clearly a different path: start normally.
	 * Careful Resume's bounds (half to ten times the saved RTT), widened
	 * by 1 ms so that microsecond jitter on short paths does not count.
	 * The saved RTT is the path's minimum, not its smoothed RTT: a
	 * transfer that filled a bottleneck's queue (a window probe into a
	 * GEO link's 1.2 s buffer) would otherwise save an RTT more than
	 * twice the empty path's, and every later leg would fail the check. */
	if (!srtt || srtt + 1000 < saved->srtt_us / 2 ||
	    srtt > saved->srtt_us * 10 + 1000) {
		count_event(EV_RTT_MISMATCH);
		return;
	}
	jump = saved->cwnd / 2;
	if (jump <= tp->snd_cwnd)
		return;
	if (jump > tp->snd_cwnd_clamp)
		jump = tp->snd_cwnd_clamp;
	tp->snd_cwnd = jump;
	/* Slow start ends at the saved window only when that window was a
	 * capacity estimate. A window that was still growing when its
	 * connection ended says nothing about where to stop: capping there
	 * would leave a bigger transfer in congestion avoidance far below
	 * the path's capacity (measured: 1 MB 9 % slower than no resume). */
	if (saved->exited_slow_start) {
		tp->snd_ssthresh = saved->cwnd;
		ca->inherited_ssthresh = saved->cwnd;
	}
	sk->sk_pacing_status = SW_SK_PACING_NEEDED;
	/* The kernel recomputes the pacing rate from cwnd only at the next
	 * ACK; until then the jump would leave at the old window's rate
	 * (measured: a resumed leg's first round trip carried about 20
	 * segments, so 100 KB took two). Pace the jump over one RTT now. */
	rate = (__u64)jump * tp->mss_cache * 1000000ULL / srtt;
	if (rate > sk->sk_max_pacing_rate)
		rate = sk->sk_max_pacing_rate;
	sk->sk_pacing_rate = rate;
	ca->jump_cwnd = jump;
	ca->jump_at_us = now_us(tp);
	ca->validate_us = 2 * srtt;
	ca->phase = CR_UNVALIDATED;
	count_event(EV_JUMP);
}

/* Ends the unvalidated phase once two RTTs passed without a loss. */
static __always_inline void maybe_validated(struct sock *sk, struct sw_resume *ca)
{
	struct tcp_sock *tp = sw_tcp_sk(sk);

	if (ca->phase == CR_UNVALIDATED &&
	    (__s32)(now_us(tp) - ca->jump_at_us) > (__s32)ca->validate_us) {
		ca->phase = CR_OFF;
		sk->sk_pacing_status = SW_SK_PACING_NONE;
		count_event(EV_VALIDATED);
	}
}

SEC("struct_ops/splitway_resume_cong_avoid")
void BPF_PROG(splitway_resume_cong_avoid, struct sock *sk, __u32 ack, __u32 acked)
{
	maybe_validated(sk, sw_ca_priv(sk));
	cubic_cong_avoid(sk, ack, acked);
}

SEC("struct_ops/splitway_resume_ssthresh")
__u32 BPF_PROG(splitway_resume_ssthresh, struct sock *sk)
{
	struct sw_resume *ca = sw_ca_priv(sk);
	struct resume_key key;
	__u32 retreat;

	maybe_validated(sk, ca);
	if (ca->phase != CR_UNVALIDATED)
		return cubic_ssthresh(sk);
	/* Safe retreat: the saved window was wrong for this connection. */
	ca->phase = CR_OFF;
	sk->sk_pacing_status = SW_SK_PACING_NONE;
	if (peer_key(sk, &key))
		bpf_map_delete_elem(&sw_resume_peers, &key);
	count_event(EV_RETREAT);
	cubic_ssthresh(sk);
	retreat = SW_MAX(ca->jump_cwnd / 4, 2U);
	ca->cubic.last_max_cwnd = retreat;
	return retreat;
}

SEC("struct_ops/splitway_resume_release")
void BPF_PROG(splitway_resume_release, struct sock *sk)
{
	struct tcp_sock *tp = sw_tcp_sk(sk);
	struct resume_key key;
	struct resume_val val = {};
	struct resume_val *saved;
	struct sw_resume *ca = sw_ca_priv(sk);
	__u64 now = bpf_ktime_get_ns();
	/* Left slow start itself: a loss or HyStart set an ssthresh other
	 * than the one the jump inherited. */
	__u32 exited = tp->snd_ssthresh < SW_INFINITE_SSTHRESH &&
		       tp->snd_ssthresh != ca->inherited_ssthresh;
	__u32 fresh;

	if (tp->snd_cwnd < RESUME_MIN_CWND || !tp->srtt_us)
		return;
	if (!peer_key(sk, &key))
		return;
	/* A connection that did not leave slow start itself only shows how
	 * far it got (a short transfer ends small): it may raise the saved
	 * window but not lower it, and a raise keeps what the entry knew
	 * of the path's capacity. Lowering takes a congestion signal, so
	 * what was learned follows a capacity drop. (Measured before this
	 * rule counted an inherited ssthresh as an exit: each 100 KB
	 * download halved a GEO hop's saved window, and the next 1 MB ones
	 * took three satellite round trips more.) */
	saved = bpf_map_lookup_elem(&sw_resume_peers, &key);
	fresh = saved && now - saved->at_ns <= RESUME_MAX_AGE_NS;
	if (fresh && !exited && saved->cwnd >= tp->snd_cwnd) {
		saved->at_ns = now;
		return;
	}
	if (fresh && !exited)
		exited = saved->exited_slow_start;
	val.cwnd = tp->snd_cwnd;
	val.srtt_us = tp->rtt_min.s[0].v;
	if (!val.srtt_us || val.srtt_us == ~0U)
		val.srtt_us = tp->srtt_us >> 3;
	val.at_ns = now;
	val.exited_slow_start = exited;
	bpf_map_update_elem(&sw_resume_peers, &key, &val, BPF_ANY);
	count_event(EV_SAVED);
}

SEC("struct_ops/splitway_resume_cwnd_event")
void BPF_PROG(splitway_resume_cwnd_event, struct sock *sk, enum tcp_ca_event ev)
{
	cubic_cwnd_event(sk, ev);
	if (ev == CA_EVENT_TX_START)
		maybe_resume(sk, sw_ca_priv(sk));
}

SW_CUBIC_SHARED_OPS(splitway_resume)

SEC(".struct_ops")
struct tcp_congestion_ops splitway_resume_ops = {
	.init = (void *)splitway_resume_init,
	.release = (void *)splitway_resume_release,
	.ssthresh = (void *)splitway_resume_ssthresh,
	.cong_avoid = (void *)splitway_resume_cong_avoid,
	.set_state = (void *)splitway_resume_set_state,
	.undo_cwnd = (void *)splitway_resume_undo_cwnd,
	.cwnd_event = (void *)splitway_resume_cwnd_event,
	.pkts_acked = (void *)splitway_resume_pkts_acked,
	.name = "splitway_resume",
};
