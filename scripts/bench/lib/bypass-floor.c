// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The floor of the sk_msg bypass on this kernel, for scripts/bench/bypass-floor.sh:
// every established IPv4 connection to or from a port in FLOOR_PORT_MIN ..=
// FLOOR_PORT_MAX joins a sockhash,
// and every send is redirected into the peer's receive queue. No ordering
// rule, no read counter, no statistics: this is NOT safe (a stream would
// reorder around pairing and a slow reader queues without bound) and is never
// loaded by splitway. It only measures what the kernel's redirect path costs
// when the program does the least possible work, so that the gain of
// bpf/bypass.c can be compared with the most any sk_msg program could give.
#include <linux/bpf.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#if !defined(FLOOR_PORT_MIN) || !defined(FLOOR_PORT_MAX)
#error "build with -DFLOOR_PORT_MIN=<port> -DFLOOR_PORT_MAX=<port>"
#endif

#define IN_RANGE(p) ((p) >= FLOOR_PORT_MIN && (p) <= FLOOR_PORT_MAX)

struct key {
	__u32 local_ip;
	__u32 remote_ip;
	__u32 local_port;  // host byte order
	__u32 remote_port; // host byte order
};

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 1024);
	__type(key, struct key);
	__type(value, __u64);
} FLOOR_SOCKS SEC(".maps");

SEC("sockops")
int floor_sockops(struct bpf_sock_ops *skops)
{
	if (skops->op != BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB &&
	    skops->op != BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB)
		return 1;
	if (skops->family != 2 /* AF_INET */)
		return 1;
	struct key k = {
		.local_ip = skops->local_ip4,
		.remote_ip = skops->remote_ip4,
		.local_port = skops->local_port,
		.remote_port = bpf_ntohl(skops->remote_port),
	};
	if (!IN_RANGE(k.local_port) && !IN_RANGE(k.remote_port))
		return 1;
	bpf_sock_hash_update(skops, &FLOOR_SOCKS, &k, BPF_NOEXIST);
	return 1;
}

SEC("sk_msg")
int floor_msg(struct sk_msg_md *msg)
{
	struct key peer = {
		.local_ip = msg->remote_ip4,
		.remote_ip = msg->local_ip4,
		.local_port = bpf_ntohl(msg->remote_port),
		.remote_port = msg->local_port,
	};
	return bpf_msg_redirect_hash(msg, &FLOOR_SOCKS, &peer, BPF_F_INGRESS);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
