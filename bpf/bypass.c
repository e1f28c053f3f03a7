// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//
// bypass: co-located TCP bypass (the module-free form of tcp_splice).
//
// A cgroup sock_ops program puts each established TCP socket of the cgroup
// into BYP_SOCKS, keyed by its own 4-tuple as seen from that socket. An
// sk_msg program on that sockhash decides, for every send, whether it goes
// straight into the peer's receive queue (bpf_msg_redirect_hash with
// BPF_F_INGRESS) or over plain TCP.
//
// The rule, per direction: a send is redirected when everything sent before
// it has been read by the peer's application with recvmsg (and at least one
// byte has: proof that the reader uses recvmsg, the only reader that sees
// redirected data), which starts a run; or when it continues a run, i.e.
// every unread byte was redirected and fewer than BACKLOG_MAX are unread.
// Otherwise it goes over TCP. Why:
// - Order. The receiver's tcp_bpf recvmsg drains redirected data before the
//   TCP receive queue. TCP bytes queued behind redirected ones are therefore
//   read in order; redirected bytes could overtake TCP bytes still unread,
//   and the rule never lets that happen (a run starts with nothing unread
//   and continues only while no TCP byte is unread).
// - Short reads. A tcp_bpf recvmsg returns redirected bytes alone even when
//   TCP bytes are queued behind them. Readers that take a read shorter than
//   their buffer as "drained" (tokio, and anything else edge-triggered that
//   clears readiness then) would wait for an event that never comes: two
//   writes before a read, the first redirected and the second over TCP,
//   stalled every such tokio reader (torture --mode pipelined). Continuing
//   runs keeps unread data on one path, so a short read is a drained socket.
// - Memory. A run holds at most BACKLOG_MAX unread bytes in the peer's
//   psock; a send beyond goes over TCP, whose windows and buffers block the
//   sender as usual. A reader that stops reading stops a writer, as without
//   the bypass, with BACKLOG_MAX more queued. Only there do the two paths
//   mix with bytes unread, so only a reader that far behind can still meet
//   the short-read stall (docs/bypass.md).
// - Readers that never recvmsg (splice, TCP_ZEROCOPY_RECEIVE) are never fed
//   a redirected byte: nothing they read is counted, so no run starts.
//
// Request/response traffic starts a run at every request and response. A
// stream continues runs instead (its reader is behind), and redirecting a
// stream of small writes costs more than TCP; TCP through tcp_bpf's sendmsg
// is slower than plain TCP too. So a direction that continued runs for
// UNPAIR_AFTER bytes since its last TCP send starts no new run: once its
// reader catches up it goes over TCP, and a connection that sent
// UNPAIR_AFTER bytes over TCP since its last redirect leaves the sockhash
// for good (both ends), back to the plain TCP stack, at its next ACK
// (sock_ops; an sk_msg program may not delete from a sockhash). Leaving
// drops whatever redirected data is still queued, so it happens only once
// no run can start (each direction's `closed`, set under the same lock the
// redirect decision takes), every redirected byte has been read, and no run
// can continue (`sealed`, set under that lock only if no redirect came
// between the read counts and the seal).
//
// "Read" is counted by a BTF raw tracepoint on sock_recv_length (the kernel
// has no fentry here): bytes returned by each recvmsg, MSG_PEEK excluded, added
// to BYP_CONSUMED under the reading socket's cookie. What was sent toward a
// socket is in its BYP_FLOW entry, written by its peer; the peer finds the
// cookie once in BYP_COOKIES. A stale count only ever lags, which keeps a
// send on TCP. FIN and RST always travel over TCP.
//
// Addresses are keyed as IPv6, IPv4 as v4-mapped (::ffff:a.b.c.d), so an
// IPv4 socket pairs with a v4-mapped IPv6 peer. Loopback keys also carry the
// network namespace cookie, so equal 127.0.0.1 tuples in two namespaces never
// pair; routable (veth) keys do not, so two namespaces on one host can pair.
//
// Layouts of bypass_key, BYP_POLICY and BYP_STATS are shared with
// crates/splitway-sys/src/bpf/bypass.rs.

#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "parse.h"
#include "layout.h"

// One 32-bit load per context field: the verifier rejects context loads
// through a pointer the compiler has offset (e.g. one base for an array).
#define RD(field) (*(volatile __u32 *)&(field))


struct bypass_key {
	__u32 local_ip[4];  // network byte order, v4 as ::ffff:a.b.c.d
	__u32 remote_ip[4];
	__u32 local_port;   // host byte order
	__u32 remote_port;  // host byte order
	__u64 netns;        // netns cookie for loopback, 0 for routable
};
SW_PIN_SIZE(bypass_key, 48);

// Per socket.
struct sock_state {
	__u64 cookie;      // this socket's cookie (its BYP_FLOW and BYP_COOKIES entries)
	__u64 peer_cookie; // the peer's, once found in BYP_COOKIES (0: not yet)
	__u64 tcp_run;     // bytes sent over TCP since its last redirect
	__u64 cont_run;    // bytes redirected continuing a run since its last TCP send
	__u32 streaming;   // cont_run reached UNPAIR_AFTER: no new run
	__u32 leave;       // drained for leaving the sockhash: sock_ops removes it
	__u32 left;        // removed
};

// What was sent toward a socket (BYP_FLOW, keyed by the receiver's cookie;
// written by its peer under `lock`, and `closed` also by the receiver).
struct flow {
	struct bpf_spin_lock lock;
	__u32 closed;    // no new run into this socket (unpairing)
	__u32 sealed;    // no redirect into it at all: every redirected byte was read
	__u64 sent;      // bytes sent toward it since pairing, both paths
	__u64 redir_end; // `sent` just after the last redirected send
};

// A connection that sent this much over TCP since its last redirect is a
// stream: it leaves the sockhash (see the header).
#define UNPAIR_AFTER (1u << 20)
// Unread redirected bytes a run may hold (see the header): about what a
// TCP receive window holds at most by default.
#define BACKLOG_MAX (4u << 20)

// Offsets of sock_common.skc_cookie and sock.sk_user_data, from the
// kernel's BTF (set by the loader).
volatile const __u32 COOKIE_OFF = 0;
volatile const __u32 USER_DATA_OFF = 0;

#define SW_MSG_PEEK 2
#define SW_MSG_ERRQUEUE 0x2000
#define SW_TCP_ESTABLISHED 1
#define SW_TCP_CLOSE 7
#define SW_TCP_CLOSE_WAIT 8

// peer_cookie of a socket whose first send found no paired peer: no
// BYP_FLOW entry has this key, so every send of it goes over TCP.
#define NO_PEER_COOKIE (~0ULL)

// Policy, index 0 of BYP_POLICY.
#define POLICY_ENABLED (1u << 0)
#define POLICY_LOOPBACK_ONLY (1u << 1)
#define POLICY_PORTS (1u << 2) // only ports listed in BYP_PORTS

struct policy {
	__u32 flags;
	__u32 pad;
};
SW_PIN_SIZE(policy, 8);

// Counters, indexes into BYP_STATS (per CPU).
enum {
	ST_PAIRED = 0,         // sockets inserted into the sockhash
	ST_EXCLUDED_POLICY,    // established sockets the policy left alone
	ST_EXCLUDED_EARLY,     // data moved before ESTABLISHED (TFO): not paired
	ST_INSERT_FAILED,      // storage or sockhash insert failed: not paired
	ST_MSGS_TCP,           // sends over TCP: the peer had not read all before it
	ST_BYTES_TCP,          // their bytes
	ST_MSGS_REDIRECTED,    // sends redirected
	ST_BYTES_REDIRECTED,   // their bytes
	ST_REDIRECT_MISSES,    // redirect found no peer (it closed): over TCP
	ST_NO_STATE,           // send on a mapped socket without state (TCP)
	ST_NO_PEER,            // sends over TCP because the peer is not paired
	ST_READS_COUNTED,      // recvmsg calls counted on paired sockets
	ST_UNPAIRED,           // connections that left the sockhash as streams
	ST_COUNT,
};

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 65536);
	__type(key, struct bypass_key);
	__type(value, __u32);
} BYP_SOCKS SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sock_state);
} BYP_STATE SEC(".maps");

// Paired socket's own key -> its cookie, for the peer to find its BYP_FLOW.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct bypass_key);
	__type(value, __u64);
} BYP_COOKIES SEC(".maps");

// Receiving socket's cookie -> what was sent toward it (struct flow). A plain
// hash: a spin lock cannot live in an LRU map.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	// Not preallocated: a deleted element is freed after RCU, not reused
	// at once under a program that still holds it.
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct flow);
} BYP_FLOW SEC(".maps");

// Receiving socket's cookie -> bytes its application read with recvmsg.
// Apart from BYP_FLOW because tracing programs may not touch a map whose
// values hold a spin lock. LRU: an entry lost to eviction only keeps that
// direction on TCP (nothing but sock_ops creates one).
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, __u64);
} BYP_CONSUMED SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct policy);
} BYP_POLICY SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u32); // port, host byte order
	__type(value, __u8);
} BYP_PORTS SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, ST_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} BYP_STATS SEC(".maps");

static __always_inline void count(__u32 idx, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(&BYP_STATS, &idx);
	if (v)
		*v += n;
}

static __always_inline int is_loopback(const __u32 ip[4])
{
	// ::1
	if (ip[0] == 0 && ip[1] == 0 && ip[2] == 0 && ip[3] == bpf_htonl(1))
		return 1;
	// ::ffff:127.0.0.0/8
	if (ip[0] == 0 && ip[1] == 0 && ip[2] == bpf_htonl(0xffff) &&
	    (bpf_ntohl(ip[3]) >> 24) == 127)
		return 1;
	return 0;
}

static __always_inline void set_v4(__u32 ip[4], __u32 v4)
{
	ip[0] = 0;
	ip[1] = 0;
	ip[2] = bpf_htonl(0xffff);
	ip[3] = v4;
}

// The remaining key fields once addresses and ports are filled in.
// Returns 0 on success.
static __always_inline int finish_key(struct bypass_key *k, __u64 netns)
{
	k->netns = 0;
	if (is_loopback(k->local_ip) || is_loopback(k->remote_ip))
		k->netns = netns;
	return 0;
}

static __always_inline void mirror(const struct bypass_key *k, struct bypass_key *p)
{
#pragma unroll
	for (int i = 0; i < 4; i++) {
		p->local_ip[i] = k->remote_ip[i];
		p->remote_ip[i] = k->local_ip[i];
	}
	p->local_port = k->remote_port;
	p->remote_port = k->local_port;
	p->netns = k->netns;
}

static __always_inline int policy_allows(const struct policy *pol, const struct bypass_key *k)
{
	if (pol->flags & POLICY_LOOPBACK_ONLY) {
		if (!is_loopback(k->local_ip) || !is_loopback(k->remote_ip))
			return 0;
	}
	if (pol->flags & POLICY_PORTS) {
		__u32 lp = k->local_port, rp = k->remote_port;
		if (!bpf_map_lookup_elem(&BYP_PORTS, &lp) && !bpf_map_lookup_elem(&BYP_PORTS, &rp))
			return 0;
	}
	return 1;
}

// The key of a socket as it sees itself; 0 on an unknown family.
static __always_inline int sockops_key(struct bpf_sock_ops *skops, struct bypass_key *k)
{
	__u32 family = skops->family;
	if (family == SW_AF_INET) {
		set_v4(k->local_ip, skops->local_ip4);
		set_v4(k->remote_ip, skops->remote_ip4);
	} else if (family == SW_AF_INET6) {
		k->local_ip[0] = RD(skops->local_ip6[0]);
		k->local_ip[1] = RD(skops->local_ip6[1]);
		k->local_ip[2] = RD(skops->local_ip6[2]);
		k->local_ip[3] = RD(skops->local_ip6[3]);
		k->remote_ip[0] = RD(skops->remote_ip6[0]);
		k->remote_ip[1] = RD(skops->remote_ip6[1]);
		k->remote_ip[2] = RD(skops->remote_ip6[2]);
		k->remote_ip[3] = RD(skops->remote_ip6[3]);
	} else {
		return 0;
	}
	k->local_port = skops->local_port & 0xffff;
	k->remote_port = bpf_ntohl(skops->remote_port) & 0xffff;
	finish_key(k, bpf_get_netns_cookie(skops));
	return 1;
}

// A paired socket closed: drop its entries (its sockhash entry goes by
// itself). Only its own: a new connection on the same 4-tuple may already
// have replaced the BYP_COOKIES entry.
static __always_inline void forget(struct bpf_sock_ops *skops)
{
	struct bpf_sock *sk = skops->sk;
	if (!sk)
		return;
	struct sock_state *st = bpf_sk_storage_get(&BYP_STATE, sk, 0, 0);
	if (!st || !st->cookie)
		return;
	bpf_map_delete_elem(&BYP_FLOW, &st->cookie);
	bpf_map_delete_elem(&BYP_CONSUMED, &st->cookie);
	struct bypass_key k = {};
	if (sockops_key(skops, &k)) {
		__u64 *c = bpf_map_lookup_elem(&BYP_COOKIES, &k);
		if (c && *c == st->cookie)
			bpf_map_delete_elem(&BYP_COOKIES, &k);
	}
	st->cookie = 0;
}

// A connection marked to leave (see unpair) goes: both ends out of the
// sockhash, back to the plain TCP stack. At an ACK, so in softirq with the
// socket locked; sock_ops may delete from a sockhash, sk_msg may not.
static __always_inline void leave(struct bpf_sock_ops *skops)
{
	struct bpf_sock *sk = skops->sk;
	if (!sk)
		return;
	struct sock_state *st = bpf_sk_storage_get(&BYP_STATE, sk, 0, 0);
	if (!st || !st->leave || st->left)
		return;
	struct bypass_key k = {}, peer = {};
	if (!sockops_key(skops, &k))
		return;
	mirror(&k, &peer);
	st->left = 1;
	bpf_map_delete_elem(&BYP_SOCKS, &peer);
	// Both ends may get here; the one whose own entry goes counts it.
	if (bpf_map_delete_elem(&BYP_SOCKS, &k) == 0)
		count(ST_UNPAIRED, 1);
	// Nothing reads the counts any more: no recvmsg of these sockets costs
	// the read counter a hit, and no ACK this callback.
	bpf_map_delete_elem(&BYP_CONSUMED, &st->cookie);
	bpf_map_delete_elem(&BYP_CONSUMED, &st->peer_cookie);
	bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags & ~BPF_SOCK_OPS_RTT_CB_FLAG);
}

SEC("sockops")
int bypass_sockops(struct bpf_sock_ops *skops)
{
	__u32 op = skops->op;
	if (op == BPF_SOCK_OPS_STATE_CB) {
		if (skops->args[1] == SW_TCP_CLOSE)
			forget(skops);
		return 1;
	}
	if (op == BPF_SOCK_OPS_RTT_CB) {
		leave(skops);
		return 1;
	}
	if (op != BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB && op != BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB)
		return 1;

	__u32 zero = 0;
	struct policy *pol = bpf_map_lookup_elem(&BYP_POLICY, &zero);
	if (!pol || !(pol->flags & POLICY_ENABLED))
		return 1;

	struct bypass_key k = {};
	if (!sockops_key(skops, &k))
		return 1;
	if (!policy_allows(pol, &k)) {
		count(ST_EXCLUDED_POLICY, 1);
		return 1;
	}
	// TCP Fast Open: data crossed before ESTABLISHED, uncounted by `sent`.
	if (skops->data_segs_in != 0 || skops->data_segs_out != 0) {
		count(ST_EXCLUDED_EARLY, 1);
		return 1;
	}
	struct bpf_sock *sk = skops->sk;
	if (!sk)
		return 1;
	struct sock_state *st = bpf_sk_storage_get(&BYP_STATE, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!st) {
		count(ST_INSERT_FAILED, 1);
		return 1;
	}
	__u64 cookie = bpf_get_socket_cookie(skops);
	struct flow fresh = {};
	__u64 none = 0;
	st->cookie = cookie;
	st->peer_cookie = 0;
	st->tcp_run = 0;
	st->cont_run = 0;
	st->streaming = 0;
	st->leave = 0;
	st->left = 0;
	// The flow entries and the cookie first: once in the sockhash, the peer
	// may look for them.
	if (bpf_map_update_elem(&BYP_FLOW, &cookie, &fresh, BPF_ANY) != 0 ||
	    bpf_map_update_elem(&BYP_CONSUMED, &cookie, &none, BPF_ANY) != 0 ||
	    // NOEXIST: a routable key carries no netns cookie, so two namespaces
	    // holding the same addresses could otherwise replace each other's
	    // entries (and drop a paired socket's unread data with its psock).
	    bpf_map_update_elem(&BYP_COOKIES, &k, &cookie, BPF_NOEXIST) != 0 ||
	    bpf_sock_hash_update(skops, &BYP_SOCKS, &k, BPF_NOEXIST) != 0) {
		forget(skops);
		count(ST_INSERT_FAILED, 1);
		return 1;
	}
	// STATE: forget the entries at close. RTT: every ACK, where a stream
	// leaves the sockhash (a redirected request/response has no ACKs).
	bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_STATE_CB_FLAG |
						 BPF_SOCK_OPS_RTT_CB_FLAG);
	count(ST_PAIRED, 1);
	return 1;
}

static __always_inline __u64 consumed_by(__u64 cookie)
{
	__u64 *c = bpf_map_lookup_elem(&BYP_CONSUMED, &cookie);
	return c ? *(volatile __u64 *)c : 0;
}

// Closes redirects into `f`'s socket; returns the end of the last one.
static __always_inline __u64 close_flow(struct flow *f)
{
	bpf_spin_lock(&f->lock);
	f->closed = 1;
	__u64 end = f->redir_end;
	bpf_spin_unlock(&f->lock);
	return end;
}

// Seals `f` if no redirect into it happened since its run ended at `end`
// (a run may continue after `closed`, and its sender may have read the
// reader's count before that count reached `end`); returns whether sealed.
static __always_inline int seal_flow(struct flow *f, __u64 end)
{
	bpf_spin_lock(&f->lock);
	if (f->redir_end == end)
		f->sealed = 1;
	int sealed = f->sealed;
	bpf_spin_unlock(&f->lock);
	return sealed;
}

// One step of leaving the sockhash (see the header): close both directions
// to new runs; once every redirected byte has been read, seal them, and if
// no redirect slipped in meanwhile mark the connection to leave. sk_msg may
// not delete from a sockhash; sock_ops does it at the next ACK (RTT_CB).
static __always_inline void unpair(struct sock_state *st, struct flow *to_peer)
{
	struct flow *to_me = bpf_map_lookup_elem(&BYP_FLOW, &st->cookie);
	if (!to_me)
		return;
	__u64 peer_end = close_flow(to_peer);
	__u64 my_end = close_flow(to_me);
	if (consumed_by(st->peer_cookie) < peer_end || consumed_by(st->cookie) < my_end)
		return;
	if (!seal_flow(to_peer, peer_end) || !seal_flow(to_me, my_end))
		return;
	st->leave = 1;
}

SEC("sk_msg")
int bypass_msg(struct sk_msg_md *msg)
{
	struct bpf_sock *sk = msg->sk;
	if (!sk)
		return SK_PASS;
	struct sock_state *st = bpf_sk_storage_get(&BYP_STATE, sk, 0, 0);
	if (!st) {
		count(ST_NO_STATE, 1);
		return SK_PASS;
	}
	if (st->leave)
		return SK_PASS;
	__u32 size = msg->size;

	struct bypass_key k = {};
	if (msg->family == SW_AF_INET) {
		set_v4(k.local_ip, msg->local_ip4);
		set_v4(k.remote_ip, msg->remote_ip4);
	} else if (msg->family == SW_AF_INET6) {
		k.local_ip[0] = RD(msg->local_ip6[0]);
		k.local_ip[1] = RD(msg->local_ip6[1]);
		k.local_ip[2] = RD(msg->local_ip6[2]);
		k.local_ip[3] = RD(msg->local_ip6[3]);
		k.remote_ip[0] = RD(msg->remote_ip6[0]);
		k.remote_ip[1] = RD(msg->remote_ip6[1]);
		k.remote_ip[2] = RD(msg->remote_ip6[2]);
		k.remote_ip[3] = RD(msg->remote_ip6[3]);
	} else {
		return SK_PASS;
	}
	k.local_port = msg->local_port & 0xffff;
	k.remote_port = bpf_ntohl(msg->remote_port) & 0xffff;
	finish_key(&k, bpf_get_netns_cookie(msg));
	struct bypass_key peer = {};
	mirror(&k, &peer);

	if (!st->peer_cookie) {
		__u64 *c = bpf_map_lookup_elem(&BYP_COOKIES, &peer);
		// A send that finds no peer is counted nowhere the peer's reads
		// are compared with: from then on the counts could agree while
		// that send is unread. So this socket stays on TCP for good.
		st->peer_cookie = c ? *c : NO_PEER_COOKIE;
	}
	__u64 peer_cookie = st->peer_cookie;
	struct flow *f = bpf_map_lookup_elem(&BYP_FLOW, &peer_cookie);
	if (!f) {
		count(ST_NO_PEER, 1);
		return SK_PASS;
	}
	// tcp_bpf's sendmsg does not check for a shut-down send side: after
	// shutdown(SHUT_WR) a redirect would deliver data behind the FIN.
	// Over TCP the send fails with EPIPE, as without the bypass.
	__u32 state = sk->state;
	int open = state == SW_TCP_ESTABLISHED || state == SW_TCP_CLOSE_WAIT;
	__u64 consumed = consumed_by(peer_cookie);
	// Decide under the lock the unpairing side closes with: a redirect is
	// either counted in redir_end before `closed`, or sees `closed`.
	int redirect = 0, continues = 0, closed;
	int streaming = st->streaming;
	bpf_spin_lock(&f->lock);
	closed = f->closed;
	__u64 sent = f->sent;
	// See the header. A run continues even once closed or streaming: a send
	// over TCP now would queue behind unread redirected bytes. Not once
	// sealed: then every redirected byte was read, and the socket may leave.
	if (open && !f->sealed && sent != 0 && f->redir_end == sent && consumed < sent &&
	    sent - consumed + size <= BACKLOG_MAX) {
		redirect = 1;
		continues = 1;
	} else if (open && !closed && !streaming && sent != 0 && consumed == sent) {
		redirect = 1;
	}
	if (redirect)
		f->redir_end = sent + size;
	f->sent = sent + size;
	bpf_spin_unlock(&f->lock);

	if (redirect) {
		st->tcp_run = 0;
		if (continues) {
			st->cont_run += size;
			if (st->cont_run >= UNPAIR_AFTER)
				st->streaming = 1;
		}
		if (bpf_msg_redirect_hash(msg, &BYP_SOCKS, &peer, BPF_F_INGRESS) == SK_PASS) {
			count(ST_MSGS_REDIRECTED, 1);
			count(ST_BYTES_REDIRECTED, size);
			return SK_PASS;
		}
		// The peer left the map: it closed (or was reset), so nothing it
		// has not read can still be delivered; TCP gives the sender the
		// error a closed peer gives.
		count(ST_REDIRECT_MISSES, 1);
		return SK_PASS;
	}
	count(ST_MSGS_TCP, 1);
	count(ST_BYTES_TCP, size);
	st->cont_run = 0;
	st->tcp_run += size;
	if (closed || st->tcp_run >= UNPAIR_AFTER)
		unpair(st, f);
	return SK_PASS;
}

// Every recvmsg on the host ends here (sock_recvmsg_nosec); only sockets with
// a BYP_CONSUMED entry are counted. args: struct sock *sk, int ret, int flags.
// A BTF tracepoint: the verifier knows `sk` is a struct sock and checks each
// load against its BTF, so fields are read with plain loads, not with
// bpf_probe_read_kernel calls (which cost a 1 KB-read bulk stream about 4 %
// more than the tracepoint alone: bench-results/bypass-floor-20261127T110824Z.txt).
SEC("tp_btf/sock_recv_length")
int bypass_recv(__u64 *ctx)
{
	int ret = (int)ctx[1];
	int flags = (int)ctx[2];
	// Peeks consume nothing; error-queue reads (timestamps, IP_RECVERR)
	// return no stream bytes.
	if (ret <= 0 || (flags & (SW_MSG_PEEK | SW_MSG_ERRQUEUE)))
		return 0;
	// A socket in a sockhash has its psock in sk_user_data; nearly every
	// other socket has none, and leaves after this one load.
	void *sk = (void *)ctx[0];
	__u64 psock = *(__u64 *)(sk + USER_DATA_OFF);
	if (psock == 0)
		return 0;
	__u64 cookie = *(__u64 *)(sk + COOKIE_OFF);
	if (cookie == 0)
		return 0;
	__u64 *consumed = bpf_map_lookup_elem(&BYP_CONSUMED, &cookie);
	if (!consumed)
		return 0;
	__sync_fetch_and_add(consumed, (__u64)ret);
	count(ST_READS_COUNTED, 1);
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
