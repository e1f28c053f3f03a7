// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//
// agent_synopt: the client-host half of splitway's explicit capture with the
// destination in the SYN (issue #18).
//
// - cgroup/connect4, cgroup/connect6: a connect() to a destination inside one
//   of the agent's routes (longest prefix match) is redirected to that
//   route's relay; the original destination is remembered by socket cookie.
// - sockops: for a redirected socket, reserves and writes the destination
//   option (kind 253, ExID 0x5357; layout in crates/splitway-proto/src/
//   syn_option.rs) into its SYN, and forgets the socket once established.
//
// Layouts shared with crates/splitway-sys/src/bpf/agent_synopt.rs. Addresses and
// ports are in network byte order, as in struct bpf_sock_addr.

#include <linux/bpf.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "parse.h"
#include "layout.h"

#define FORM_V4 0x04
#define FORM_V6 0x06
#define FORM_V6_INDEXED 0x80
#define MAX_SUFFIX 12

// Stats slots (agent_synopt.rs: Stat).
#define ST_REDIRECT4 0
#define ST_REDIRECT6 1
#define ST_OPT_WRITTEN 2
#define ST_OPT_NOSPC 3
#define ST_OPT_STORE_ERR 4
#define ST_PROBE_MAX 5
#define ST_LOST 6
#define ST_FALLBACK_DIRECT 7
#define ST_FALLBACK_REFUSED 8
#define ST_REFUSALS_SEEN 9
#define ST_SLOTS 10

struct route4_key {
	__u32 prefixlen;
	__u32 addr;
};
SW_PIN_SIZE(route4_key, 8);

struct route6_key {
	__u32 prefixlen;
	__u32 addr[4];
};
SW_PIN_SIZE(route6_key, 20);

struct route_val {
	__u32 relay[4];   // IPv4 relay: relay[0]
	__u16 relay_port; // network order
	// IPv6 routes: 0 = full form, else 1 + prefix index (indexed form with
	// suffix_len bytes).
	__u8 v6_index;
	__u8 suffix_len;
};

SW_PIN_SIZE(route_val, 20);
SW_PIN_OFFSET(route_val, relay, 0);
SW_PIN_OFFSET(route_val, relay_port, 16);
SW_PIN_OFFSET(route_val, v6_index, 18);
SW_PIN_OFFSET(route_val, suffix_len, 19);

struct conn_val {
	__u32 addr[4];
	__u16 port;
	__u8 family;
	__u8 v6_index;
	__u8 suffix_len;
	__u8 pad[3];
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1024);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct route4_key);
	__type(value, struct route_val);
} agent_routes4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1024);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct route6_key);
	__type(value, struct route_val);
} agent_routes6 SEC(".maps");

// Redirected sockets whose SYN still needs the option, by socket cookie. LRU:
// a socket that never reaches ESTABLISHED ages out instead of leaking.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct conn_val);
} agent_conns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, ST_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} agent_stats SEC(".maps");

// agent_cfg[0] = 1: probe mode, HDR_OPT_LEN records the largest reservable
// option length in ST_PROBE_MAX (and writes nothing).
// agent_cfg[1]: free option bytes in this host's SYNs (0: unknown). A route
// whose option (padded to 4) would not fit is not redirected: the connect
// goes direct (ST_FALLBACK_DIRECT) instead of reaching the relay without
// its destination and being reset.
// agent_cfg[2] = 1: fall back to direct after a refusal: a redirected
// connection reset before it received a byte (the relay found no option: a
// middlebox stripped it, or SYN cookies lost it; or it refused the
// destination) makes that destination go direct for FALLBACK_NS.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 3);
	__type(key, __u32);
	__type(value, __u32);
} agent_cfg SEC(".maps");

#define FALLBACK_NS (60ULL * 1000000000ULL)

// Destinations refused through the relay, until when they go direct.
struct dst_key {
	__u32 addr[4];
	__u16 port;
	__u8 family;
	__u8 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct dst_key);
	__type(value, __u64);
} agent_refused SEC(".maps");

static __always_inline void stat_add(__u32 slot, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(&agent_stats, &slot);
	if (v)
		__sync_fetch_and_add(v, n);
}

static __always_inline void remember(void *ctx, struct conn_val *c, int v6)
{
	__u64 cookie = bpf_get_socket_cookie(ctx);
	if (bpf_map_update_elem(&agent_conns, &cookie, c, BPF_ANY))
		stat_add(ST_LOST, 1);
	stat_add(v6 ? ST_REDIRECT6 : ST_REDIRECT4, 1);
}

// Whether an option of `len` bytes fits the SYN (always in probe mode,
// which measures the space and writes nothing).
static __always_inline int option_fits(__u32 len)
{
	__u32 slot = 0;
	__u32 *probe = bpf_map_lookup_elem(&agent_cfg, &slot);
	if (probe && *probe)
		return 1;
	slot = 1;
	__u32 *space = bpf_map_lookup_elem(&agent_cfg, &slot);
	if (!space || !*space)
		return 1;
	return ((len + 3) & ~3U) <= *space;
}

static __always_inline struct dst_key dst_key_of(const struct conn_val *c)
{
	struct dst_key k = { .port = c->port, .family = c->family };
	__builtin_memcpy(k.addr, c->addr, sizeof(k.addr));
	return k;
}

static __always_inline int fallback_on(void)
{
	__u32 slot = 2;
	__u32 *on = bpf_map_lookup_elem(&agent_cfg, &slot);
	return on && *on;
}

// Whether `key` was refused through the relay within FALLBACK_NS.
static __always_inline int refused_recently(struct dst_key *key)
{
	if (!fallback_on())
		return 0;
	__u64 *until = bpf_map_lookup_elem(&agent_refused, key);
	if (!until)
		return 0;
	if (bpf_ktime_get_ns() < *until)
		return 1;
	bpf_map_delete_elem(&agent_refused, key);
	return 0;
}

SEC("cgroup/connect4")
int agent_connect4(struct bpf_sock_addr *ctx)
{
	if (ctx->type != 1 /* SOCK_STREAM */)
		return 1;
	struct route4_key key = { .prefixlen = 32, .addr = ctx->user_ip4 };
	struct route_val *r = bpf_map_lookup_elem(&agent_routes4, &key);
	if (!r)
		return 1;
	// The relay itself is never redirected (a route may cover it).
	if (r->relay[0] == ctx->user_ip4 && r->relay_port == (__u16)ctx->user_port)
		return 1;
	if (!option_fits(11)) {
		stat_add(ST_FALLBACK_DIRECT, 1);
		return 1;
	}
	struct conn_val c = {};
	c.addr[0] = ctx->user_ip4;
	c.port = (__u16)ctx->user_port;
	c.family = 4;
	struct dst_key dk = dst_key_of(&c);
	if (refused_recently(&dk)) {
		stat_add(ST_FALLBACK_REFUSED, 1);
		return 1;
	}
	remember(ctx, &c, 0);
	ctx->user_ip4 = r->relay[0];
	ctx->user_port = r->relay_port;
	return 1;
}

SEC("cgroup/connect6")
int agent_connect6(struct bpf_sock_addr *ctx)
{
	if (ctx->type != 1 /* SOCK_STREAM */)
		return 1;
	struct route6_key key = { .prefixlen = 128 };
	key.addr[0] = ctx->user_ip6[0];
	key.addr[1] = ctx->user_ip6[1];
	key.addr[2] = ctx->user_ip6[2];
	key.addr[3] = ctx->user_ip6[3];
	struct route_val *r = bpf_map_lookup_elem(&agent_routes6, &key);
	if (!r)
		return 1;
	if (r->relay[0] == key.addr[0] && r->relay[1] == key.addr[1] &&
	    r->relay[2] == key.addr[2] && r->relay[3] == key.addr[3] &&
	    r->relay_port == (__u16)ctx->user_port)
		return 1;
	if (!option_fits(r->v6_index ? 7 + (__u32)r->suffix_len : 23)) {
		stat_add(ST_FALLBACK_DIRECT, 1);
		return 1;
	}
	struct conn_val c = {};
	c.addr[0] = key.addr[0];
	c.addr[1] = key.addr[1];
	c.addr[2] = key.addr[2];
	c.addr[3] = key.addr[3];
	c.port = (__u16)ctx->user_port;
	c.family = 6;
	c.v6_index = r->v6_index;
	c.suffix_len = r->suffix_len;
	struct dst_key dk = dst_key_of(&c);
	if (refused_recently(&dk)) {
		stat_add(ST_FALLBACK_REFUSED, 1);
		return 1;
	}
	remember(ctx, &c, 1);
	ctx->user_ip6[0] = r->relay[0];
	ctx->user_ip6[1] = r->relay[1];
	ctx->user_ip6[2] = r->relay[2];
	ctx->user_ip6[3] = r->relay[3];
	ctx->user_port = r->relay_port;
	return 1;
}

static __always_inline __u32 opt_len(const struct conn_val *c)
{
	if (c->family == 4)
		return 11;
	if (c->v6_index == 0)
		return 23;
	return 7 + c->suffix_len;
}

static __always_inline int probe_space(struct bpf_sock_ops *skops)
{
	// bpf_reserve_hdr_opt reserves on success: the first success, from the
	// top, is the largest free space (the rest of the SYN is NOP padded).
	for (__u32 len = 40; len > 0; len--) {
		if (bpf_reserve_hdr_opt(skops, len, 0) == 0) {
			__u32 slot = ST_PROBE_MAX;
			__u64 *v = bpf_map_lookup_elem(&agent_stats, &slot);
			if (v)
				*v = len;
			return 0;
		}
	}
	return 0;
}

SEC("sockops")
int agent_sockops(struct bpf_sock_ops *skops)
{
	__u64 cookie;
	struct conn_val *c;
	__u32 zero = 0;

	switch (skops->op) {
	case BPF_SOCK_OPS_TCP_CONNECT_CB:
		cookie = bpf_get_socket_cookie(skops);
		if (bpf_map_lookup_elem(&agent_conns, &cookie))
			bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags |
								 BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG);
		break;
	case BPF_SOCK_OPS_HDR_OPT_LEN_CB:
		if ((skops->skb_tcp_flags & (SW_TCP_FLAG_SYN | SW_TCP_FLAG_ACK)) != SW_TCP_FLAG_SYN)
			break;
		cookie = bpf_get_socket_cookie(skops);
		c = bpf_map_lookup_elem(&agent_conns, &cookie);
		if (!c)
			break;
		__u32 *probe = bpf_map_lookup_elem(&agent_cfg, &zero);
		if (probe && *probe)
			return probe_space(skops) == 0;
		if (bpf_reserve_hdr_opt(skops, opt_len(c), 0))
			stat_add(ST_OPT_NOSPC, 1);
		break;
	case BPF_SOCK_OPS_WRITE_HDR_OPT_CB: {
		if ((skops->skb_tcp_flags & (SW_TCP_FLAG_SYN | SW_TCP_FLAG_ACK)) != SW_TCP_FLAG_SYN)
			break;
		__u32 *probe = bpf_map_lookup_elem(&agent_cfg, &zero);
		if (probe && *probe)
			break;
		cookie = bpf_get_socket_cookie(skops);
		c = bpf_map_lookup_elem(&agent_conns, &cookie);
		if (!c)
			break;
		__u8 opt[24] = {};
		__u32 len = opt_len(c);
		opt[0] = SW_OPT_KIND;
		opt[1] = len;
		opt[2] = SW_OPT_EXID_HI;
		opt[3] = SW_OPT_EXID_LO;
		if (c->family == 4) {
			opt[4] = FORM_V4;
			__builtin_memcpy(&opt[5], &c->addr[0], 4);
			__builtin_memcpy(&opt[9], &c->port, 2);
			if (bpf_store_hdr_opt(skops, opt, 11, 0))
				goto store_err;
		} else if (c->v6_index == 0) {
			opt[4] = FORM_V6;
			__builtin_memcpy(&opt[5], &c->addr[0], 16);
			__builtin_memcpy(&opt[21], &c->port, 2);
			if (bpf_store_hdr_opt(skops, opt, 23, 0))
				goto store_err;
		} else {
			__u32 n = c->suffix_len;
			if (n == 0 || n > MAX_SUFFIX)
				goto store_err;
			opt[4] = FORM_V6_INDEXED | ((c->v6_index - 1) & 0x7f);
			__u8 addr[16];
			__builtin_memcpy(addr, &c->addr[0], 16);
			// Low n bytes of the address, then the port.
			for (__u32 i = 0; i < MAX_SUFFIX; i++) {
				if (i < n)
					opt[5 + i] = addr[(16 - n + i) & 15];
			}
			__u8 *port = (__u8 *)&c->port;
			opt[5 + n] = port[0];
			opt[6 + n] = port[1];
			if (bpf_store_hdr_opt(skops, opt, 7 + n, 0))
				goto store_err;
		}
		stat_add(ST_OPT_WRITTEN, 1);
		break;
	store_err:
		stat_add(ST_OPT_STORE_ERR, 1);
		break;
	}
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
		cookie = bpf_get_socket_cookie(skops);
		if (!bpf_map_lookup_elem(&agent_conns, &cookie))
			break;
		if (fallback_on()) {
			// Keep the destination until the socket closes, to see
			// whether the relay refused it.
			bpf_sock_ops_cb_flags_set(skops, (skops->bpf_sock_ops_cb_flags &
							   ~BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG) |
							  BPF_SOCK_OPS_STATE_CB_FLAG);
		} else {
			bpf_map_delete_elem(&agent_conns, &cookie);
			bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags &
								 ~BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG);
		}
		break;
	case BPF_SOCK_OPS_STATE_CB: {
		if (skops->args[1] != BPF_TCP_CLOSE)
			break;
		cookie = bpf_get_socket_cookie(skops);
		c = bpf_map_lookup_elem(&agent_conns, &cookie);
		if (!c)
			break;
		// Reset (straight to CLOSE from an open or closing state, not
		// through LAST_ACK or TIME_WAIT) before a single byte came back:
		// the relay refused. Anything else is an ordinary close.
		__u32 from = skops->args[0];
		if (skops->bytes_received == 0 &&
		    (from == BPF_TCP_ESTABLISHED || from == BPF_TCP_FIN_WAIT1 ||
		     from == BPF_TCP_FIN_WAIT2 || from == BPF_TCP_CLOSE_WAIT)) {
			struct dst_key dk = dst_key_of(c);
			__u64 until = bpf_ktime_get_ns() + FALLBACK_NS;
			bpf_map_update_elem(&agent_refused, &dk, &until, BPF_ANY);
			stat_add(ST_REFUSALS_SEEN, 1);
		}
		bpf_map_delete_elem(&agent_conns, &cookie);
		break;
	}
	}
	return 1;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
