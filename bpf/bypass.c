// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//
// bypass: co-located TCP bypass (the module-free form of tcp_splice).
//
// A cgroup sock_ops program puts each established TCP socket of the cgroup
// into BYP_SOCKS, keyed by its own 4-tuple as seen from that socket. An
// sk_msg program on that sockhash redirects what a socket sends straight into
// its peer's receive queue (bpf_msg_redirect_hash with BPF_F_INGRESS), where
// the peer is the socket whose key is the sender's key mirrored.
//
// Ordering: a socket's sends take ONE path for the socket's whole life. The
// path is decided at its first sendmsg: redirect if the peer is in the map at
// that moment, else plain TCP forever. Both ends are inserted at ESTABLISHED,
// before the application can write, so the first sendmsg sees every byte of
// that direction; a direction never mixes the two paths, so redirected bytes
// can never overtake TCP bytes written before the peer was paired (the
// hazard in ../shared/bpf-facts.md). FIN and RST still travel over TCP; the
// receiver's tcp_bpf recvmsg drains redirected data before it reports EOF.
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

// Per-socket path decision for what the socket sends.
#define PATH_UNDECIDED 0
#define PATH_REDIRECT 1
#define PATH_TCP 2

struct sock_state {
	__u32 path;
	__u32 pad;
};

// Policy, index 0 of BYP_POLICY.
#define POLICY_ENABLED (1u << 0)
#define POLICY_LOOPBACK_ONLY (1u << 1)
#define POLICY_PORTS (1u << 2) // only ports listed in BYP_PORTS

struct policy {
	__u32 flags;
	__u32 pad;
};

// Counters, indexes into BYP_STATS (per CPU).
enum {
	ST_PAIRED = 0,         // sockets inserted into the sockhash
	ST_EXCLUDED_POLICY,    // established sockets the policy left alone
	ST_EXCLUDED_EARLY,     // data moved before ESTABLISHED (TFO): not paired
	ST_INSERT_FAILED,      // storage or sockhash insert failed: not paired
	ST_DIR_REDIRECT,       // socket directions decided "redirect"
	ST_DIR_TCP,            // decided "TCP": peer not paired at first send
	ST_MSGS_REDIRECTED,    // sendmsg calls redirected
	ST_BYTES_REDIRECTED,   // bytes redirected
	ST_REDIRECT_MISSES,    // redirect-path send found no peer (peer gone)
	ST_NO_STATE,           // send on a mapped socket without state (TCP)
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

SEC("sockops")
int bypass_sockops(struct bpf_sock_ops *skops)
{
	__u32 op = skops->op;
	if (op != BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB && op != BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB)
		return 1;

	__u32 zero = 0;
	struct policy *pol = bpf_map_lookup_elem(&BYP_POLICY, &zero);
	if (!pol || !(pol->flags & POLICY_ENABLED))
		return 1;

	struct bypass_key k = {};
	__u32 family = skops->family;
	if (family == SW_AF_INET) {
		set_v4(k.local_ip, skops->local_ip4);
		set_v4(k.remote_ip, skops->remote_ip4);
	} else if (family == SW_AF_INET6) {
		k.local_ip[0] = RD(skops->local_ip6[0]);
		k.local_ip[1] = RD(skops->local_ip6[1]);
		k.local_ip[2] = RD(skops->local_ip6[2]);
		k.local_ip[3] = RD(skops->local_ip6[3]);
		k.remote_ip[0] = RD(skops->remote_ip6[0]);
		k.remote_ip[1] = RD(skops->remote_ip6[1]);
		k.remote_ip[2] = RD(skops->remote_ip6[2]);
		k.remote_ip[3] = RD(skops->remote_ip6[3]);
	} else {
		return 1;
	}
	k.local_port = skops->local_port & 0xffff;
	k.remote_port = bpf_ntohl(skops->remote_port) & 0xffff;
	finish_key(&k, bpf_get_netns_cookie(skops));

	if (!policy_allows(pol, &k)) {
		count(ST_EXCLUDED_POLICY, 1);
		return 1;
	}
	// TCP Fast Open: data crossed before ESTABLISHED, over TCP. Pairing
	// could let redirected bytes overtake it, so leave the socket alone.
	if (skops->data_segs_in != 0 || skops->data_segs_out != 0) {
		count(ST_EXCLUDED_EARLY, 1);
		return 1;
	}
	struct bpf_sock *sk = skops->sk;
	if (!sk)
		return 1;
	struct sock_state init = {.path = PATH_UNDECIDED};
	struct sock_state *st = bpf_sk_storage_get(&BYP_STATE, sk, &init, BPF_SK_STORAGE_GET_F_CREATE);
	if (!st) {
		count(ST_INSERT_FAILED, 1);
		return 1;
	}
	st->path = PATH_UNDECIDED;
	if (bpf_sock_hash_update(skops, &BYP_SOCKS, &k, BPF_ANY) != 0) {
		count(ST_INSERT_FAILED, 1);
		return 1;
	}
	count(ST_PAIRED, 1);
	return 1;
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
	if (st->path == PATH_TCP)
		return SK_PASS;

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
	__u32 size = msg->size;

	if (st->path == PATH_UNDECIDED) {
		// Decide once, for the socket's life: see the header comment.
		if (bpf_msg_redirect_hash(msg, &BYP_SOCKS, &peer, BPF_F_INGRESS) == SK_PASS) {
			st->path = PATH_REDIRECT;
			count(ST_DIR_REDIRECT, 1);
			count(ST_MSGS_REDIRECTED, 1);
			count(ST_BYTES_REDIRECTED, size);
			return SK_PASS;
		}
		st->path = PATH_TCP;
		count(ST_DIR_TCP, 1);
		return SK_PASS;
	}

	// PATH_REDIRECT.
	if (bpf_msg_redirect_hash(msg, &BYP_SOCKS, &peer, BPF_F_INGRESS) == SK_PASS) {
		count(ST_MSGS_REDIRECTED, 1);
		count(ST_BYTES_REDIRECTED, size);
		return SK_PASS;
	}
	// The peer left the map: it closed (or was reset), so nothing it has
	// not read can still be delivered; plain TCP gives the sender the
	// same error a closed peer gives.
	count(ST_REDIRECT_MISSES, 1);
	return SK_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
