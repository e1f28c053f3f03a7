// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//
// splitway_resume: CUBIC that resumes from the previous connections to the
// same peer, after the IETF's Careful Resume
// (draft-ietf-tsvwg-careful-resume). Meant for relay legs, which reconnect
// to the same few peers all the time: a measured, per-peer replacement for
// turbo-start's static initcwnd.
//
// License: dual GPL-2.0-only OR BSD-2-Clause; object license string
// "Dual BSD/GPL" (GPL-compatible, needed for the kfuncs CUBIC calls).
//
// - Measured: the path's bandwidth-delay product without its queue: the
//   highest delivery rate (sampled on every ACK) times the minimum RTT.
// - Saved: when a connection ends (release), that BDP, its final cwnd and
//   its minimum RTT, per peer address, in an LRU hash map
//   (`sw_resume_peers`) pinned where the host has a bpf filesystem, else
//   living as long as the registration. Only windows above RESUME_MIN_CWND
//   are saved. A connection without a loss may only raise what the entry
//   holds (a short transfer, or one whose slow start HyStart ended on a
//   jitter spike, measured less than the path has); one with a loss that
//   was not undone as spurious and came after a queue (the smoothed RTT
//   more than a quarter + 2 ms above the path's) replaces it, so what is
//   saved follows a capacity drop, and so does one whose RTT left the
//   resume check's range (a new route). A loss replaces it only if the
//   connection put at least half the entry's window in flight: a short
//   download's tail loss measured its own size, not the path. Random loss,
//   with no queue before it, is no measure of the path: a connection that
//   only met such loss may only raise the entry, as one without a loss.
// - Random loss is not congestion (issue #29 item 3, on relay legs): a
//   loss the RTT shows no queue before (see loss_without_queue) leaves
//   the window as it is, and if it came in slow start the recovery's end
//   gives back the growth PRR held back (regrow_after_random_loss); a
//   queue that builds makes the next loss count.
// - Resume: at each send after idle (CA_EVENT_TX_START) while the
//   connection has sent fewer than RESUME_MIN_CWND data segments, if the
//   peer has an entry younger than RESUME_MAX_AGE and the RTT confirms the
//   path (between half and ten times the saved RTT, Careful Resume's check),
//   cwnd jumps to the saved BDP, capped at the saved cwnd (to half the
//   saved cwnd where no delivery rate was measured). Slow start goes on from there (HyStart
//   watches it as ever): capping it at an earlier connection's window
//   left bigger transfers in congestion avoidance far below the path
//   whenever that window was low.
//   The jump is paced (the kernel's internal pacing, SK_PACING_NEEDED) for
//   the unvalidated phase. Jumping at the send, not at init, is what makes
//   it work on pooled legs: they idle between handshake and first use, and
//   slow start after idle (tcp_cwnd_restart, which runs just before
//   TX_START) would cut a jump made at init back to the initial window.
// - Unvalidated phase: two smoothed RTTs after the jump. A congestion
//   loss in it, before the jump's own flight is all acknowledged,
//   is a "safe retreat": ssthresh = half the jump (below what plain CUBIC
//   would keep), CUBIC's W_max forgotten, and the peer's entry deleted; the
//   retreating connection saves nothing, so the next one starts normally.
//   A loss once that flight is acknowledged is of what slow start sent
//   beyond it, and a random loss did not overfill the path: either ends
//   the phase validated.
// - Afterwards it is splitway_cubic (cubic_core.h).
//
// Against the draft: the RTT check uses the connection's smoothed RTT so
// far (on a new leg, the handshake's) as the reconnaissance. The draft
// jumps to half a measured flight size; the final cwnd is no such measure
// (on a deep queue it is the BDP plus the queue; after slow start's last
// ACKs it is twice what was sent), so the jump is the measured BDP: what
// the path delivered, over its RTT without queueing. A jump to the BDP,
// paced at 120 % of the rate it was measured at, fills the pipe and at
// most a sixth of it in queue; `splitway lab window-safety` measures it
// against a competing CUBIC flow and a capacity drop.

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

/* Since the last loss, fields may come from different connections: the
 * largest cwnd, and the highest bandwidth (bdp over srtt_us) with its RTT. */
struct resume_val {
	__u32 cwnd;
	/* The minimum RTT of the connection that measured `bdp` (its smoothed
	 * RTT if it had no minimum): the path's RTT without queueing. */
	__u32 srtt_us;
	__u64 at_ns;
	/* A connection that left slow start (a loss or HyStart) saved or
	 * raised this entry, so it measured the path's capacity, not only
	 * what a short transfer had time to reach. */
	__u32 exited_slow_start;
	/* The path's BDP as a saving connection measured it, in segments:
	 * its highest delivery rate times its minimum RTT. */
	__u32 bdp;
};

SW_PIN_SIZE(resume_key, 20);
SW_PIN_OFFSET(resume_key, addr, 4);
SW_PIN_SIZE(resume_val, 24);
SW_PIN_OFFSET(resume_val, srtt_us, 4);
SW_PIN_OFFSET(resume_val, at_ns, 8);
SW_PIN_OFFSET(resume_val, exited_slow_start, 16);
SW_PIN_OFFSET(resume_val, bdp, 20);

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
	/* The highest delivery rate so far, segments per microsecond << BW_SCALE. */
	__u32 max_bw;
	/* The sequence number after the jump's flight. */
	__u32 jump_end_seq;
	/* The saved path RTT a jump was made on (0 without a jump). */
	__u32 base_rtt;
	/* cwnd when a random loss came in slow start (0: none pending): the
	 * recovery's end gives slow start back what it delivered meanwhile. */
	__u32 random_loss_cwnd;
	/* Pacing set by that regrowth ends here (0: not set by it). */
	__u32 regrowth_paced_until_us;
	/* The largest flight this connection had, in segments. */
	__u32 max_flight;
	/* ssthresh was called (a loss, an RTO, ECN, local congestion) and
	 * not undone as spurious: this connection met the path's limit, so
	 * what it measured replaces the peer's entry. */
	__u8 lost;
	/* A safe retreat deleted the peer's entry: this connection saves
	 * nothing, so the next one starts normally. */
	__u8 retreated;
	__u8 phase;
};

/* BBR's scale: 2^24 units per segment per microsecond, so a u32 holds up
 * to 256 segments per microsecond (3 Tbit/s at 1,448-byte segments). */
#define BW_SCALE 24

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
	ca->lost = 0;
	ca->retreated = 0;
	ca->max_bw = 0;
	ca->base_rtt = 0;
	ca->random_loss_cwnd = 0;
	ca->regrowth_paced_until_us = 0;
	ca->max_flight = 0;
}

/* The highest delivery rate so far: the sample of the ACK before this one
 * (the kernel takes it after pkts_acked), as TCP_INFO reports it. The
 * final cwnd is no measure of the path: on a deep queue it is the BDP plus
 * the queue, and slow start doubles it on the last flight's ACKs even when
 * no data is left to fill it. (Measured on a GEO hop: a flight scaled by
 * min RTT / smoothed RTT also overcounts in slow start, where the flight
 * doubled since the RTT was sampled: 2,843 segments for a 1,450 BDP.) */
static __always_inline void sample_bw(struct sock *sk, struct sw_resume *ca)
{
	struct tcp_sock *tp = sw_tcp_sk(sk);
	__u32 interval = tp->rate_interval_us;
	__u64 bw;

	if (!interval || !tp->rate_delivered)
		return;
	bw = ((__u64)tp->rate_delivered << BW_SCALE) / interval;
	if (bw > 0xffffffffULL)
		bw = 0xffffffffULL;
	if (bw > ca->max_bw)
		ca->max_bw = bw;
}

/* Careful Resume's check that `rtt` is the saved path's: between half and
 * ten times the saved RTT, widened by 1 ms so that microsecond jitter on
 * short paths does not count. */
static __always_inline int rtt_matches(__u32 rtt, __u32 saved_rtt)
{
	return rtt + 1000 >= saved_rtt / 2 && rtt <= saved_rtt * 10 + 1000;
}

/* What a saved entry lets a new leg jump to: its BDP (capped at its cwnd),
 * or Careful Resume's half window where no delivery rate was measured.
 * Not the larger of the two: a cwnd raised by a bulk transfer into a deep
 * queue is twice the path (measured on a GEO hop: cwnd 5,510, BDP 1,404). */
static __always_inline __u32 jump_for(const struct resume_val *saved)
{
	if (!saved->bdp)
		return saved->cwnd / 2;
	return SW_MIN(saved->bdp, saved->cwnd);
}

/* Called at a send with nothing in flight (CA_EVENT_TX_START), after the
 * kernel's slow start after idle has run: jumps to the peer's saved window
 * if this connection is still in its first flights. */
static __always_inline void maybe_resume(struct sock *sk, struct sw_resume *ca)
{
	struct tcp_sock *tp = sw_tcp_sk(sk);
	struct resume_key key;
	struct resume_val *saved;
	__u32 srtt, now_rtt, jump;
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
	if (!srtt || !rtt_matches(srtt, saved->srtt_us)) {
		count_event(EV_RTT_MISMATCH);
		return;
	}
	/* A path whose RTT is shorter now (a LEO hop between handovers)
	 * holds less at the same bandwidth; a longer one is not assumed to
	 * hold more. */
	jump = jump_for(saved);
	now_rtt = tp->rtt_min.s[0].v;
	if (!now_rtt || now_rtt > srtt)
		now_rtt = srtt;
	if (now_rtt < saved->srtt_us)
		jump = (__u64)jump * now_rtt / saved->srtt_us;
	if (jump <= tp->snd_cwnd)
		return;
	if (jump > tp->snd_cwnd_clamp)
		jump = tp->snd_cwnd_clamp;
	tp->snd_cwnd = jump;
	sk->sk_pacing_status = SW_SK_PACING_NEEDED;
	/* The kernel recomputes the pacing rate from cwnd only at the next
	 * ACK; until then the jump would leave at the old window's rate
	 * (measured: a resumed leg's first round trip carried about 20
	 * segments, so 100 KB took two). Pace the jump now, at 120 % of the
	 * saved rate (the kernel's tcp_pacing_ca_ratio). The saved rate is
	 * below the path's where a short probe measured it (on a GEO hop:
	 * 1,048 of 1,450 segments), and a download that fits in the jump
	 * then left at that lower rate: 1 MB took 1.09x turbo-start's time,
	 * 1.03x at 120 %. The window is the jump either way; only its
	 * flight leaves in 5/6 of the RTT. */
	rate = (__u64)jump * tp->mss_cache * 1000000ULL * 6 / (5ULL * srtt);
	if (rate > sk->sk_max_pacing_rate)
		rate = sk->sk_max_pacing_rate;
	sk->sk_pacing_rate = rate;
	ca->jump_cwnd = jump;
	ca->base_rtt = saved->srtt_us;
	ca->jump_end_seq = tp->snd_nxt + jump * tp->mss_cache;
	ca->jump_at_us = now_us(tp);
	ca->validate_us = 2 * srtt;
	ca->phase = CR_UNVALIDATED;
	count_event(EV_JUMP);
}

/* Ends the unvalidated phase as validated: the jump stands, unpaced. */
static __always_inline void end_validated(struct sock *sk, struct sw_resume *ca)
{
	ca->phase = CR_OFF;
	sk->sk_pacing_status = SW_SK_PACING_NONE;
	count_event(EV_VALIDATED);
}

/* Ends the unvalidated phase once two RTTs passed without a loss. */
static __always_inline void maybe_validated(struct sock *sk, struct sw_resume *ca)
{
	struct tcp_sock *tp = sw_tcp_sk(sk);

	if (ca->phase == CR_UNVALIDATED &&
	    (__s32)(now_us(tp) - ca->jump_at_us) > (__s32)ca->validate_us)
		end_validated(sk, ca);
}

/* The end of a recovery from a random loss that came in slow start
 * (CA_EVENT_COMPLETE_CWR). PRR held the window at what was in flight for
 * the recovery's round trip, and at 1 % loss a window of a few hundred
 * segments is in recovery nearly every round trip, so slow start never
 * reached the path (measured on a GEO hop with 1 % loss: learned BDPs of
 * 264-573 of 1,095 segments). The window gets what slow start would have
 * added for the segments delivered meanwhile, paced for one RTT (the
 * kernel's slow-start rate, twice cwnd per RTT) rather than sent in one
 * burst. A queue that this builds makes the next loss count. */
static __always_inline void regrow_after_random_loss(struct sock *sk, struct sw_resume *ca)
{
	struct tcp_sock *tp = sw_tcp_sk(sk);
	__u32 target, until;

	if (!ca->random_loss_cwnd)
		return;
	target = ca->random_loss_cwnd + SW_MIN(tp->prr_delivered, ca->random_loss_cwnd);
	ca->random_loss_cwnd = 0;
	if (target > tp->snd_cwnd_clamp)
		target = tp->snd_cwnd_clamp;
	if (target <= tp->snd_cwnd)
		return;
	tp->snd_cwnd = target;
	/* A jump's unvalidated phase paces already, and ends it. */
	if (ca->phase == CR_UNVALIDATED)
		return;
	until = now_us(tp) + SW_MAX(tp->srtt_us >> 3, 1U);
	ca->regrowth_paced_until_us = until ? until : 1;
	sk->sk_pacing_status = SW_SK_PACING_NEEDED;
}

static __always_inline void maybe_end_regrowth_pacing(struct sock *sk, struct sw_resume *ca)
{
	struct tcp_sock *tp = sw_tcp_sk(sk);

	if (!ca->regrowth_paced_until_us ||
	    (__s32)(now_us(tp) - ca->regrowth_paced_until_us) <= 0)
		return;
	ca->regrowth_paced_until_us = 0;
	if (ca->phase != CR_UNVALIDATED)
		sk->sk_pacing_status = SW_SK_PACING_NONE;
}

SEC("struct_ops/splitway_resume_cong_avoid")
void BPF_PROG(splitway_resume_cong_avoid, struct sock *sk, __u32 ack, __u32 acked)
{
	struct sw_resume *ca = sw_ca_priv(sk);

	maybe_validated(sk, ca);
	maybe_end_regrowth_pacing(sk, ca);
	/* Here the kernel has taken this ACK's rate sample (pkts_acked runs
	 * before it): the last ACK's sample is not lost. */
	sample_bw(sk, ca);
	cubic_cong_avoid(sk, ack, acked);
}

/* A loss with no queue before it: segments marked lost while the
 * smoothed RTT is within a quarter (+2 ms) of the path's RTT without
 * queueing (this connection's minimum, or the saved one a jump was made
 * on if lower), as loss isolation judges client legs (docs/config.md),
 * and at most 5 % of the segments sent retransmitted (after 3). A full queue, a
 * competing flow's or one a jump beyond a dropped capacity filled, adds
 * its delay before it drops; random loss (a radio or satellite hop) does
 * not, and says nothing of the path's capacity. An ECN mark or a timeout
 * (nothing marked lost yet) and heavier loss (a policer, which drops
 * without a queue) count as congestion. Measured on a GEO hop with 1 %
 * random loss: every jump's flight lost a segment, each loss retreated
 * and deleted the entry, and the loss-limited legs that followed saved
 * 32-57 segments for a 1,095-segment path, so the default ran 2.6x
 * turbo-start's time. */
static __always_inline int loss_without_queue(struct tcp_sock *tp, struct sw_resume *ca)
{
	__u32 srtt = tp->srtt_us >> 3;
	__u32 base = tp->rtt_min.s[0].v;

	/* The first 3 retransmissions are free: at 1 % loss one can come
	 * within a connection's first 20 segments. */
	if (!tp->lost_out || (__u64)tp->total_retrans * 20 > (__u64)tp->data_segs_out + 60)
		return 0;
	if (!base || base == ~0U || base > srtt)
		base = srtt;
	if (ca->base_rtt && ca->base_rtt < base)
		base = ca->base_rtt;
	return srtt && srtt <= base + base / 4 + 2000;
}

SEC("struct_ops/splitway_resume_ssthresh")
__u32 BPF_PROG(splitway_resume_ssthresh, struct sock *sk)
{
	struct sw_resume *ca = sw_ca_priv(sk);
	struct tcp_sock *tp = sw_tcp_sk(sk);
	struct resume_key key;
	__u32 retreat;
	int random_loss;

	maybe_validated(sk, ca);
	random_loss = loss_without_queue(tp, ca);
	if (random_loss) {
		/* Not congestion: the window stays (slow start goes on), the
		 * jump is not undone, and the entry may only be raised. A queue
		 * that then builds makes the next loss count. */
		if (ca->phase == CR_UNVALIDATED)
			end_validated(sk, ca);
		if (tp->snd_cwnd < tp->snd_ssthresh)
			ca->random_loss_cwnd = tp->snd_cwnd;
		return SW_MAX(tp->snd_ssthresh, tp->snd_cwnd);
	}
	/* Only a loss a queue came before measures the path's limit. */
	ca->lost = 1;
	ca->random_loss_cwnd = 0;
	if (ca->phase != CR_UNVALIDATED)
		return cubic_ssthresh(sk);
	/* The jump's whole flight was acknowledged: the saved window fitted
	 * the path, and this loss is of what slow start sent beyond it (on a
	 * deep queue the next RTT's doubling can overflow it before the two
	 * RTTs are over; measured: a 10 MB download after a capacity drop
	 * retreated and took 5.7 s instead of 3.5). Validated, not a retreat. */
	if (!sw_after(ca->jump_end_seq, tp->snd_una)) {
		end_validated(sk, ca);
		return cubic_ssthresh(sk);
	}
	/* Safe retreat: the saved window was wrong for this connection. */
	ca->phase = CR_OFF;
	sk->sk_pacing_status = SW_SK_PACING_NONE;
	if (peer_key(sk, &key))
		bpf_map_delete_elem(&sw_resume_peers, &key);
	ca->retreated = 1;
	count_event(EV_RETREAT);
	cubic_ssthresh(sk);
	/* Half the jump: RFC 9959's PipeSize/2 when the jump was delivered,
	 * below the 0.7 x cwnd plain CUBIC would keep. A quarter (before
	 * 2026-11-28) left a leg that met a competing flow's full queue at
	 * 0.28-0.32 of the capacity after 30 s, as the kernel's own CUBIC
	 * starting late (`splitway lab window-safety`). */
	retreat = SW_MAX(ca->jump_cwnd / 2, 2U);
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
	__u32 srtt, min_rtt;

	srtt = tp->srtt_us >> 3;
	if (tp->snd_cwnd < RESUME_MIN_CWND || !srtt || ca->retreated)
		return;
	sample_bw(sk, ca);
	if (!peer_key(sk, &key))
		return;
	min_rtt = tp->rtt_min.s[0].v;
	if (!min_rtt || min_rtt == ~0U || min_rtt > srtt)
		min_rtt = srtt;
	val.cwnd = tp->snd_cwnd;
	val.srtt_us = min_rtt;
	val.bdp = ((__u64)ca->max_bw * min_rtt) >> BW_SCALE;
	val.at_ns = now;
	val.exited_slow_start = tp->snd_ssthresh < SW_INFINITE_SSTHRESH;
	/* Without a loss a connection may only raise what the entry holds: a
	 * short transfer ends small, and HyStart can end slow start on a
	 * jitter spike (measured: a window probe into a GEO hop stopped at
	 * 468 of 1,450 segments once in three runs). Lowering takes a loss,
	 * so what was learned follows a capacity drop. The entry keeps the
	 * higher bandwidth (BDP over its RTT) with its RTT, so a BDP from a
	 * long-RTT phase never pairs with a short-RTT phase's minimum. */
	saved = bpf_map_lookup_elem(&sw_resume_peers, &key);
	if (saved) {
		/* A copy at once: another connection's release may rewrite the
		 * entry meanwhile. */
		struct resume_val old = *saved;

		/* A path whose RTT moved out of the resume check's range (a new
		 * route) is a new path: its entry is replaced, or every later leg
		 * would fail the check while refreshing the entry's age. */
		/* A loss lowers the entry only if this connection put at least
		 * half of the entry's window in flight: one that never came
		 * near it (a short download, app-limited) measured its own
		 * demand, not the path. Measured on a GEO hop with 1 % loss:
		 * 100 KB downloads whose last segment was lost (a timeout,
		 * which counts as congestion) replaced a 1,100-segment entry
		 * with their own 40-70, and the next legs no longer jumped. */
		int measured_limit = ca->lost && (__u64)ca->max_flight * 2 >= jump_for(&old);

		if (now - old.at_ns <= RESUME_MAX_AGE_NS && !measured_limit &&
		    rtt_matches(min_rtt, old.srtt_us)) {
			if ((__u64)old.bdp * val.srtt_us > (__u64)val.bdp * old.srtt_us) {
				val.bdp = old.bdp;
				val.srtt_us = old.srtt_us;
			}
			val.cwnd = SW_MAX(val.cwnd, old.cwnd);
			val.exited_slow_start |= old.exited_slow_start;
		}
	}
	bpf_map_update_elem(&sw_resume_peers, &key, &val, BPF_ANY);
	count_event(EV_SAVED);
}

SEC("struct_ops/splitway_resume_cwnd_event")
void BPF_PROG(splitway_resume_cwnd_event, struct sock *sk, enum tcp_ca_event ev)
{
	struct sw_resume *ca = sw_ca_priv(sk);

	cubic_cwnd_event(sk, ev);
	if (ev == CA_EVENT_TX_START)
		maybe_resume(sk, ca);
	else if (ev == CA_EVENT_COMPLETE_CWR)
		regrow_after_random_loss(sk, ca);
	else if (ev == CA_EVENT_LOSS)
		/* A timeout: no regrowth from a recovery it ended. */
		ca->random_loss_cwnd = 0;
}

SEC("struct_ops/splitway_resume_pkts_acked")
void BPF_PROG(splitway_resume_pkts_acked, struct sock *sk, const struct ack_sample *sample)
{
	struct sw_resume *ca = sw_ca_priv(sk);
	__u32 flight = sw_tcp_sk(sk)->packets_out + sample->pkts_acked;

	if (flight > ca->max_flight)
		ca->max_flight = flight;
	sample_bw(sk, ca);
	cubic_pkts_acked(sk, sample);
}

SEC("struct_ops/splitway_resume_undo_cwnd")
__u32 BPF_PROG(splitway_resume_undo_cwnd, struct sock *sk)
{
	struct sw_resume *ca = sw_ca_priv(sk);

	/* The loss was spurious (reordering, a late ACK): it measured no
	 * limit of the path. */
	ca->lost = 0;
	ca->random_loss_cwnd = 0;
	return cubic_undo_cwnd(sk);
}

SEC("struct_ops/splitway_resume_set_state")
void BPF_PROG(splitway_resume_set_state, struct sock *sk, __u8 new_state)
{
	cubic_set_state(sk, new_state);
}

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
