// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The least a per-recvmsg hook costs, for scripts/bench/bypass-floor.sh (mode
// `hook`): a raw tracepoint on sock_recv_length, the event bpf/bypass.c's
// read counter uses, whose program does nothing. What it costs is the
// tracepoint's dispatch alone. Never part of splitway.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

SEC("raw_tracepoint/sock_recv_length")
int recv_hook(struct bpf_raw_tracepoint_args *ctx)
{
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
