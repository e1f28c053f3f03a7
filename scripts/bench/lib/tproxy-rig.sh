# Shared by scripts/bench/bench-tproxy.sh and scripts/bench/bench-growth.sh (sourced).
# Four namespaces joined by veth: client C — relay host R — T — server S.
# The client's traffic to S is routed through R, where a proxy intercepts it
# with TPROXY; T forwards like a router, and for the relay pair it is the
# host of the second relay (rs), next to the server. Methods:
#   direct    the kernel only forwards (no proxy at all);
#   splitway  one splitway relay on R, its minimal config (tproxy, direct);
#   haproxy   HAProxy (TCP mode, splice-auto) on R behind the same rule;
#   pair      splitway rc on R (tproxy, route via rs) and rs on T (peer
#             listener, direct): the real deployment, two relays;
#   baseline  like splitway, but the binary $BIN_BASELINE (an earlier build,
#             for before/after in one run), its config followed by
#             $BASELINE_APPEND when set (e.g. "[accel]\nloss_isolation = false"
#             with BIN_BASELINE=$BIN: one switch's cost, in one run);
#   floor     scripts/bench/lib/conn-floor.c behind HAProxy's rule: the least a
#             forwarder does per connection (no limits, no loop guard, no
#             crash safety; never shipped), one thread per CPU;
#   splitway1, haproxy1, floor1
#             the same with one thread (`workers = 1`, `nbthread 1`).
# start_proxy runs each method as above (one process per relay);
# start_split runs every proxy process twice, each copy with its own port
# and its own half of the connections (see there): for more connections
# than one process's open-file limit holds.
# The caller sets P (unique prefix), dir (scratch directory), BIN.
# shellcheck shell=bash
C=$P-c R=$P-r T=$P-t S=$P-s
CIP=10.201.1.1 RIN=10.201.1.2 ROUT=10.201.2.1 TIN=10.201.2.2 TOUT=10.201.3.1 SIP=10.201.3.2
RELAY_PORT=7000 PEER_PORT=7100
PORTS="80, 5201, 6379, 11111, 9001, 9002, 9003"
# start_split's second copies: they intercept only SPLIT_DPORT (a second
# one-request-per-connection backend on the server), listen on
# RELAY_PORT_B (rs: PEER_PORT_B) and answer admin requests on ADMIN_B
# (the first copies keep the default 127.0.0.1:9090 in their namespace).
SPLIT_DPORT=9004 RELAY_PORT_B=7001 PEER_PORT_B=7101 ADMIN_B=127.0.0.1:9091
pids=()
# The running proxy processes and a row name for each (`pair`: pair-rs,
# pair-rc; start_split: .a and .b after the name of each copy).
proxy_pids=()
proxy_names=()

nsx() { local ns=$1; shift; ip netns exec "$ns" "$@"; }

rig_cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  stop_proxy
  # Whatever runs in the namespaces (servers are children of `ip netns
  # exec`, not of this shell) goes with them.
  for n in $C $R $T $S; do ip netns pids "$n" 2>/dev/null | xargs -r kill 2>/dev/null; done
  # Only our own children: a bare `wait` also waits for a caller's process
  # substitution (`exec > >(tee …)`), which ends only after this shell does.
  [ ${#pids[@]} -gt 0 ] && wait "${pids[@]}" 2>/dev/null
  for n in $C $R $T $S; do
    for _ in $(seq 50); do [ -z "$(ip netns pids "$n" 2>/dev/null)" ] && break; sleep 0.1; done
    ip netns del "$n" 2>/dev/null
  done
  rm -rf "$dir"
}

# The whole rig, removed again when the caller's shell exits.
rig_up() {
  trap rig_cleanup EXIT
  rig_topology && rig_configs && rig_servers
}

wait_listen() { # ns port
  for _ in $(seq 100); do
    nsx "$1" ss -Hltn "sport = :$2" | grep -q . && return 0
    sleep 0.05
  done
  echo "rig: nothing listens on port $2 in $1" >&2
  return 1
}

rig_topology() {
  for n in $C $R $T $S; do ip netns add "$n"; nsx "$n" ip link set lo up; done
  ip link add vc netns $C type veth peer name vr netns $R
  ip link add vs netns $R type veth peer name vt netns $T
  ip link add vu netns $T type veth peer name vd netns $S
  nsx $C ip addr add $CIP/24 dev vc; nsx $C ip link set vc up
  # One client source address per method: a proxy's TIME_WAIT sockets in
  # the relay namespace (transparent, bound to the server's address)
  # outlive it, and early demux would hand a later SYN on the same 4-tuple
  # to them.
  for a in 11 12 13 14 15 16 17 18 19; do nsx $C ip addr add 10.201.1.$a/24 dev vc; done
  nsx $R ip addr add $RIN/24 dev vr; nsx $R ip link set vr up
  nsx $R ip addr add $ROUT/24 dev vs; nsx $R ip link set vs up
  nsx $T ip addr add $TIN/24 dev vt; nsx $T ip link set vt up
  nsx $T ip addr add $TOUT/24 dev vu; nsx $T ip link set vu up
  nsx $S ip addr add $SIP/24 dev vd; nsx $S ip link set vd up
  nsx $C ip route add default via $RIN
  nsx $R ip route add default via $TIN
  nsx $T ip route add 10.201.1.0/24 via $ROUT
  nsx $S ip route add default via $TOUT
  nsx $R sysctl -qw net.ipv4.ip_forward=1
  nsx $T sysctl -qw net.ipv4.ip_forward=1
  # TPROXY's local delivery (splitway installs its own nft rule, HAProxy
  # gets the README's manual one).
  nsx $R ip rule add fwmark 1 lookup 100
  nsx $R ip route add local 0.0.0.0/0 dev lo table 100
  for n in $C $R $T $S; do nsx "$n" sysctl -qw net.ipv4.tcp_tw_reuse=1; done
}

rig_servers() {
  cat > "$dir/nginx.conf" <<EOF
daemon off;
worker_processes 1;
pid $dir/nginx.pid;
error_log stderr error;
events { worker_connections 4096; }
http {
  access_log off;
  server { listen $SIP:80 backlog=4096; location / { return 200 "ok\n"; } }
}
EOF
  nsx $S nginx -c "$dir/nginx.conf" -e stderr >/dev/null 2>&1 & pids+=($!)
  nsx $S sockperf sr --tcp -i $SIP -p 11111 >/dev/null 2>&1 & pids+=($!)
  nsx $S iperf3 -s -p 5201 -B $SIP >/dev/null 2>&1 & pids+=($!)
  nsx $S redis-server --port 6379 --bind $SIP --save '' --appendonly no --protected-mode no >/dev/null 2>&1 & pids+=($!)
  nsx $S "$BIN" lab load serve --bind $SIP >/dev/null 2>&1 & pids+=($!)
  # The backend of start_split's second copies (its sink and echo on any
  # free port: only its conn port is used). Two processes also halve what
  # each holds (RLIMIT_NOFILE).
  nsx $S "$BIN" lab load serve --bind $SIP --sink 0 --echo 0 --conn $SPLIT_DPORT >/dev/null 2>&1 & pids+=($!)
  for p in 80 11111 5201 6379 9001 9002 9003 $SPLIT_DPORT; do wait_listen $S $p || return 1; done
}

rig_configs() {
  "$BIN" keygen > "$dir/psk.key"
  one_relay_toml bench $RELAY_PORT "$PORTS" > "$dir/splitway.toml"
  sed '1a workers = 1' "$dir/splitway.toml" > "$dir/splitway1.toml"
  { cat "$dir/splitway.toml"; printf '%b\n' "${BASELINE_APPEND:-}"; } > "$dir/baseline.toml"
  rc_toml rc $RELAY_PORT "$PORTS" $PEER_PORT > "$dir/rc.toml"
  rs_toml $PEER_PORT > "$dir/rs.toml"
  # start_split's second copies: the same, but their own name (the nft
  # table a relay installs is named after it), admin address, listening
  # port and intercepted port; rc-b's peer is rs-b.
  one_relay_toml bench-b $RELAY_PORT_B $SPLIT_DPORT "$ADMIN_B" > "$dir/splitway-b.toml"
  rc_toml rc-b $RELAY_PORT_B $SPLIT_DPORT $PEER_PORT_B "$ADMIN_B" > "$dir/rc-b.toml"
  rs_toml $PEER_PORT_B "$ADMIN_B" > "$dir/rs-b.toml"
  # Under RLIMIT_NOFILE 20,000: 2 fds per connection and 2 per pipe.
  haproxy_cfg 9000 $RELAY_PORT > "$dir/haproxy.cfg"
  haproxy_cfg 9000 $RELAY_PORT 1 > "$dir/haproxy1.cfg"
  # start_split's copies hold up to 9,000 connections each (18,000 in
  # all): some headroom above that, still under 20,000 fds.
  haproxy_cfg 9400 $RELAY_PORT > "$dir/haproxy-a.cfg"
  haproxy_cfg 9400 $RELAY_PORT_B > "$dir/haproxy-b.cfg"
  haproxy_nft > "$dir/haproxy.nft"
  # The split: the first copy gets what it gets alone, the second only
  # SPLIT_DPORT (the first does not intercept it).
  haproxy_nft "meta nfproto ipv4 iifname \"vr\" tcp dport $SPLIT_DPORT tproxy ip to :$RELAY_PORT_B meta mark set 1 accept" > "$dir/haproxy-split.nft"
}

# One relay intercepting `ports` on the relay host, route direct (the
# README's minimal tproxy config).
one_relay_toml() { # name listen_port ports [admin]
  # `admin = "…"` and its newline when given, else nothing.
  local admin=${4:+"admin = \"$4\""$'\n'}
  cat <<EOF
name = "$1"
${admin}[[listen]]
mode = "tproxy"
addr = "0.0.0.0:$2"
intercept = { interfaces = ["vr"], ports = [$3] }
[[route]]
dst = "0.0.0.0/0"
via = "direct"
EOF
}

# The pair's rc: intercepts as above, forwards to rs at `peer_port`.
rc_toml() { # name listen_port ports peer_port [admin]
  # `admin = "…"` and its newline when given, else nothing.
  local admin=${5:+"admin = \"$5\""$'\n'}
  cat <<EOF
name = "$1"
psk_file = "psk.key"
${admin}[[listen]]
mode = "tproxy"
addr = "0.0.0.0:$2"
intercept = { interfaces = ["vr"], ports = [$3] }
[[peer]]
name = "rs"
addr = "$TIN:$4"
[[route]]
dst = "0.0.0.0/0"
via = "rs"
EOF
}

# The pair's rs: a peer listener at `peer_port` for rc, route direct.
rs_toml() { # peer_port [admin]
  # `admin = "…"` and its newline when given, else nothing.
  local admin=${2:+"admin = \"$2\""$'\n'}
  cat <<EOF
name = "rs"
psk_file = "psk.key"
${admin}[[listen]]
mode = "peer"
addr = "$TIN:$1"
allow_clients = ["$ROUT/32"]
[[route]]
dst = "0.0.0.0/0"
via = "direct"
EOF
}

haproxy_cfg() { # maxconn port [threads]
  cat <<EOF
global
  maxconn $1
  maxpipes 256
${3:+  nbthread $3
}defaults
  mode tcp
  timeout connect 5s
  timeout client 120s
  timeout server 120s
  option splice-auto
listen tproxy
  bind 0.0.0.0:$2 transparent
  server origin 0.0.0.0
EOF
}

# The README's manual TPROXY rules for HAProxy, and a further rule if given.
haproxy_nft() { # [rule]
  cat <<EOF
table inet swbt_haproxy {
  chain prerouting {
    type filter hook prerouting priority mangle; policy accept;
    meta l4proto tcp tcp flags & (fin | syn | rst | ack) != syn socket transparent 1 meta mark set 1 accept
    meta nfproto ipv4 iifname "vr" tcp dport { $PORTS } tproxy ip to :$RELAY_PORT meta mark set 1 accept
${1:+    $1
}  }
}
EOF
}

wait_splitway_rules() { # [table…]: those tables, or any splitway table
  # Listening comes before the rules: wait for the intercept table.
  local t
  for _ in $(seq 100); do
    if [ $# -eq 0 ]; then
      nsx $R nft list tables | grep -q splitway && return 0
    else
      for t in "$@"; do nsx $R nft list table inet "$t" >/dev/null 2>&1 || continue 2; done
      return 0
    fi
    sleep 0.05
  done
  echo "rig: no interception rules (${*:-splitway}) in $R" >&2
  return 1
}

# One relay process in a namespace, added to proxy_pids as `name`, its log
# in $dir/<log>.log; returns once it listens on `port`.
spawn_relay() { # ns binary config name log port
  # `ip netns exec` execs the command: $! is the proxy's own pid.
  ip netns exec "$1" "$2" relay --config "$dir/$3" >"$dir/$5.log" 2>&1 &
  proxy_pids+=($!)
  proxy_names+=("$4")
  wait_listen "$1" "$6" || { cat "$dir/$5.log" >&2; return 1; }
}

# Each method behind its own client source address (see rig_topology).
route_source() { # method
  local src
  case $1 in direct) src=11 ;; splitway) src=12 ;; haproxy) src=13 ;; pair) src=14 ;; baseline) src=15 ;; floor) src=16 ;; floor1) src=17 ;; haproxy1) src=18 ;; splitway1) src=19 ;; esac
  nsx $C ip route replace default via $RIN src 10.201.1.$src
}

method_bin() { # method: the splitway binary it runs
  if [ "$1" = baseline ]; then echo "${BIN_BASELINE:?baseline needs BIN_BASELINE}"; else echo "$BIN"; fi
}

start_proxy() { # method
  route_source "$1"
  proxy_pids=() proxy_names=()
  case $1 in
    direct) ;;
    splitway | baseline | splitway1)
      local bin config=splitway.toml
      bin=$(method_bin "$1") || return 1
      [ "$1" = splitway1 ] && config=splitway1.toml
      [ "$1" = baseline ] && config=baseline.toml
      spawn_relay $R "$bin" "$config" "$1" splitway $RELAY_PORT || return 1
      wait_splitway_rules
      ;;
    pair)
      spawn_relay $T "$BIN" rs.toml pair-rs rs $PEER_PORT || return 1
      spawn_relay $R "$BIN" rc.toml pair-rc rc $RELAY_PORT || return 1
      wait_splitway_rules
      ;;
    haproxy | haproxy1)
      nsx $R nft -f "$dir/haproxy.nft"
      local cfg=haproxy.cfg
      [ "$1" = haproxy1 ] && cfg=haproxy1.cfg
      ip netns exec $R haproxy -db -f "$dir/$cfg" >"$dir/haproxy.log" 2>&1 &
      proxy_pids=($!) proxy_names=("$1")
      wait_listen $R $RELAY_PORT || { cat "$dir/haproxy.log" >&2; return 1; }
      ;;
    floor | floor1)
      [ -x "$dir/conn-floor" ] || cc -O2 -Wall -pthread -o "$dir/conn-floor" scripts/bench/lib/conn-floor.c || return 1
      nsx $R nft -f "$dir/haproxy.nft"
      local threads=$(nproc)
      [ "$1" = floor1 ] && threads=1
      ip netns exec $R "$dir/conn-floor" $RELAY_PORT "$threads" >"$dir/floor.log" 2>&1 &
      proxy_pids=($!) proxy_names=("$1")
      wait_listen $R $RELAY_PORT || { cat "$dir/floor.log" >&2; return 1; }
      ;;
  esac
}

# The method as two copies of each of its processes, for more connections
# than RLIMIT_NOFILE lets one process hold (20,000 descriptors here, 2 per
# connection): the first copy exactly as start_proxy runs it, the second
# the same but intercepting only SPLIT_DPORT on its own port (rc-b through
# its own rs-b). A client splits its connections between the server's
# ports 9003 and SPLIT_DPORT, and each copy holds one half. Every copy
# installs its own interception as alone (splitway: its nft table and early
# SYN's SYN watch, limited to its ports), so each runs as in production;
# one splitway process cannot share its tproxy port with another
# (`reuse_port` is refused with `intercept`). Rows: <method>.a and .b.
start_split() { # method
  route_source "$1"
  proxy_pids=() proxy_names=()
  case $1 in
    direct) ;;
    splitway | baseline)
      local bin
      bin=$(method_bin "$1") || return 1
      spawn_relay $R "$bin" splitway.toml "$1.a" splitway $RELAY_PORT || return 1
      spawn_relay $R "$bin" splitway-b.toml "$1.b" splitway-b $RELAY_PORT_B || return 1
      wait_splitway_rules splitway_bench_0 splitway_bench_b_0
      ;;
    pair)
      spawn_relay $T "$BIN" rs.toml pair-rs.a rs $PEER_PORT || return 1
      spawn_relay $R "$BIN" rc.toml pair-rc.a rc $RELAY_PORT || return 1
      spawn_relay $T "$BIN" rs-b.toml pair-rs.b rs-b $PEER_PORT_B || return 1
      spawn_relay $R "$BIN" rc-b.toml pair-rc.b rc-b $RELAY_PORT_B || return 1
      wait_splitway_rules splitway_rc_0 splitway_rc_b_0
      ;;
    haproxy)
      nsx $R nft -f "$dir/haproxy-split.nft"
      local c
      for c in a b; do
        ip netns exec $R haproxy -db -f "$dir/haproxy-$c.cfg" >"$dir/haproxy-$c.log" 2>&1 &
        proxy_pids+=($!)
        proxy_names+=("haproxy.$c")
      done
      if ! wait_listen $R $RELAY_PORT || ! wait_listen $R $RELAY_PORT_B; then
        cat "$dir"/haproxy-[ab].log >&2
        return 1
      fi
      ;;
  esac
}

stop_proxy() {
  for p in "${proxy_pids[@]}"; do
    kill "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  proxy_pids=() proxy_names=()
  ip netns exec $R nft delete table inet swbt_haproxy 2>/dev/null
  return 0
}

proxies_alive() {
  for p in "${proxy_pids[@]}"; do kill -0 "$p" 2>/dev/null || return 1; done
}

cpu_ticks() { # pid: utime+stime of the process (all its threads)
  awk '{print $14 + $15}' "/proc/$1/stat"
}

# CPU-seconds per GB from clock ticks of CPU and bytes moved; FAIL without
# bytes.
cpu_per_gb() { # ticks bytes
  awk -v d="$1" -v hz="$(getconf CLK_TCK)" -v b="${2:-0}" \
    'BEGIN {if (b > 0) printf "%.4f", d / hz / (b / 1e9); else printf "FAIL"}'
}

# iperf3 from the client to the server for SECS s: "Gbit/s bytes" received.
iperf3_bulk() { # extra iperf3 arguments
  nsx $C iperf3 -c $SIP -p 5201 -t "$SECS" -J "$@" 2>/dev/null |
    python3 -c 'import json,sys; e=json.load(sys.stdin)["end"]["sum_received"]; print(e["bits_per_second"]/1e9, e["bytes"])'
}

# The built-in open-loop generator from the client: its key=value line.
setup_rate() { # rate seconds
  nsx $C "$BIN" lab load rate --target $SIP:9003 --rate "$1" --seconds "$2" 2>&1 | grep '^rate='
}

# One value of a key=value line, FAIL when the key is missing.
kv() { # line key
  local f
  for f in $1; do
    [ "${f%%=*}" = "$2" ] && { echo "${f#*=}"; return; }
  done
  echo FAIL
}

rss_kb() { # pid
  awk '/^VmRSS:/ {print $2}' "/proc/$1/status"
}

fd_count() { # pid: its open file descriptors (RLIMIT_NOFILE counts these)
  find "/proc/$1/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l
}
