# splitway: the two commands for a fresh machine are `make demo` and `make test`.
CARGO ?= cargo
export CARGO_TERM_COLOR ?= never

.PHONY: startup-order footprint footprint-check demo test deps build release deb deb-test image lint check-no-bpf import-graph fuzz fuzz-ci lab-full lab-window-safety lab-loss-fairness fidelity bench clean faults-long lab-paths soak churn bypass-long bypass-probes bypass-floor bench-bypass bench-tproxy bench-growth flood

## demo: the main job: `splitway lab` on its default scenario (paper-ktcp), quick mode.
demo: deps release
	./target/release/splitway lab --quick

## test: lint, then unit and namespace integration tests (needs root; CI runs this).
## On a failure it prints, last, the head of every failed test's output (unit tests too) and
## the namespace tests' panics with their relays' unusual log lines: CI keeps only the head
## and tail of a long output.
test: deps lint footprint-check
	@rm -f target/test-failures.txt target/test-output.txt
	SPLITWAY_REQUIRE_NETNS=1 SPLITWAY_TEST_FAILURES=$(CURDIR)/target/test-failures.txt \
	  bash -o pipefail -c '$(CARGO) test --workspace --all-targets --all-features --no-fail-fast 2>&1 | tee target/test-output.txt' \
	  || { echo '===== every failed test, its first lines ====='; \
	       awk '/^---- .* stdout ----$$/ {p = 1; n = 0} /^stack backtrace:/ {p = 0} p && n++ < 25' target/test-output.txt; \
	       echo '===== namespace tests: panics and relay lines (target/test-failures.txt) ====='; \
	       cat target/test-failures.txt 2>/dev/null; exit 1; }
	SPLITWAY_REQUIRE_NETNS=1 $(CARGO) test --workspace --doc

deps:
	./scripts/install-deps.sh

build:
	$(CARGO) build --workspace

## The relay binary (splitway-relay) links glibc statically (crt-static, static-pie): an idle
## relay then keeps no ld.so, libc.so, libm or libgcc_s pages of its own, only the libc code it
## calls, and exec skips the dynamic loader (idle RSS 7,300 -> 5,652 kB, PSS the same; docs/efficiency.md).
## `cargo rustc` applies the flag to that binary alone, not to build scripts or proc-macros.
## The multi-call front (splitway), the lab and the host tools stay dynamic.
RELAY_BUILD = $(CARGO) rustc --release -p splitway-relay-cli --bin splitway-relay -- -C target-feature=+crt-static

release:
	$(CARGO) build --release -p splitway -p splitway-lab -p splitway-tools
	$(RELAY_BUILD)

## deb: the Debian package in target/debian/ (cargo-deb): the release binary stripped (its
## symbols in a -dbgsym package), man pages and completions written from the CLI
## (`splitway generate-docs`), splitway.toml(5) from docs/config.md, units, sysusers.d,
## tmpfiles.d, sysctl.d, /etc/splitway examples as conffiles, docs; then lintian, which
## must report no error. Installs cargo-deb and lintian when missing.
DEB_ASSETS = target/deb-assets
deb: release
	command -v cargo-deb >/dev/null || $(CARGO) install --locked cargo-deb
	command -v lintian >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends lintian >/dev/null; }
	rm -rf $(DEB_ASSETS) target/debian && mkdir -p $(DEB_ASSETS)/doc
	./target/release/splitway generate-docs --out $(DEB_ASSETS)
	python3 scripts/config-manpage.py docs/config.md $(DEB_ASSETS)/man/splitway.toml.5
	cp README.md docs/*.md $(DEB_ASSETS)/doc/
	gzip -9n $(DEB_ASSETS)/man/* $(DEB_ASSETS)/doc/*
	$(CARGO) deb -p splitway --no-build --dbgsym
	lintian --fail-on error target/debian/splitway_*.deb

## deb-test: debootstrap a fresh Debian root under target/ (removed after, also on failure),
## install the .deb there with apt resolving its dependencies, then in the root (chroot):
## `splitway relay --check` on the shipped examples, `systemd-analyze verify` on the units,
## nothing enabled, the user and modes set. Needs root and deb.debian.org; not in `make test`.
## Time here (2 shared vCPUs, load about 5): 2m12s from a built release binary, of which
## deb-test.sh 56 s (debootstrap and apt dominate; bench-results/deb-test-20261128T000717Z.txt);
## 9m35s when the release build (fat LTO) must rebuild the binary first
## (bench-results/deb-test-20261127T235358Z.txt). That fits CI's 90 min beside `make test` and
## fuzz-ci (about 20), but it is kept out of .ci/run: it needs deb.debian.org reachable from the
## CI machine and adds a release build and cargo-deb's (about 15 min from a clean clone), and a
## mirror hiccup would then block every landing. Run it before a release.
deb-test: deb
	command -v debootstrap >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null; }
	./scripts/deb-test.sh

## image: the container image localhost/splitway:0.1.0 from deploy/Containerfile (the binary
## and its shared libraries, FROM scratch: no registry), then from it, in containers without a
## network: `relay --check` on the DaemonSet's config (deploy/k8s/), and a relay that answers
## `ctl status` and `ctl drain` and exits 0 on SIGTERM. PODMAN_RUN_FLAGS: this machine's crun (1.8) refuses
## hybrid cgroups and no process here may raise rlimits, so runc with lowered limits.
IMAGE ?= localhost/splitway:0.1.0
PODMAN_RUN_FLAGS ?= --runtime runc --ulimit nofile=1024:1024 --ulimit nproc=1024:1024
image: release
	command -v podman >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends podman runc >/dev/null; }
	./scripts/image-root.sh target/release/splitway-relay target/image-root
	podman build -f deploy/Containerfile -t $(IMAGE) target/image-root
	./scripts/image-check.sh $(IMAGE) $(PODMAN_RUN_FLAGS)

## startup-order: re-trace which functions an idle relay runs (4 KB pages,
## scripts/bench/lib/pagetouch.c) and rewrite crates/splitway-relay-cli/startup-order.txt,
## the link order of the relay binary's release builds (crates/splitway-relay-cli/build.rs).
## Run after changes to start-up code; running it twice refines the order. It traces a dynamic
## build of the same code (LD_PRELOAD does not reach a static binary; the Rust symbols are the
## same), then relinks the static one with the new order.
startup-order: deps
	$(CARGO) build --release -p splitway-relay-cli
	cp target/release/splitway-relay target/splitway-relay-traced
	python3 scripts/bench/startup-order.py target/splitway-relay-traced
	$(RELAY_BUILD)

## footprint: idle RSS/PSS and exec -> READY=1 of the relay binary (splitway-relay) with
## and without the startup order, and of the multi-call front's `splitway relay`, alternating,
## 20 rounds (bench-results/).
footprint: deps release
	cp target/release/splitway-relay target/splitway-relay-ordered
	cp target/release/splitway target/splitway-front
	SPLITWAY_NO_STARTUP_ORDER=1 $(RELAY_BUILD)
	cp target/release/splitway-relay target/splitway-relay-unordered
	$(RELAY_BUILD)
	cc -O2 -o target/listen-floor scripts/bench/lib/listen-floor.c
	python3 scripts/bench/startup-order.py --coverage target/splitway-relay-ordered
	python3 scripts/bench/footprint-binaries.py 20 relay=target/splitway-relay-ordered unordered=target/splitway-relay-unordered front=target/splitway-front floor=target/listen-floor | tee bench-results/footprint-$$(date -u +%Y%m%dT%H%M%SZ).txt

## footprint-check: the relay binary's idle RSS and exec -> listening on the README's rc config,
## in a namespace of its own, against bench-results/footprint-baseline.txt: fails when RSS grows
## by more than 10 %, or exec -> listening above the C floor's by more than 50 % (part of `make test`).
footprint-check: deps
	$(RELAY_BUILD)
	clang -O2 -o target/listen-floor scripts/bench/lib/listen-floor.c
	python3 scripts/bench/footprint-check.py target/release/splitway-relay target/listen-floor bench-results/footprint-baseline.txt

lint: import-graph
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --all-features -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps --all-features
	./scripts/check-no-bpf.sh
	./scripts/deny.sh
	@# The relay binary's dependency tree holds no lab code (issue #31).
	! $(CARGO) tree -p splitway-relay-cli -e normal,build --prefix none | grep -E '^(splitway-lab|plotters|indicatif) '
	@# The host tools' binary holds neither relay nor lab code.
	! $(CARGO) tree -p splitway-tools -e normal,build --prefix none | grep -E '^(splitway-relay|splitway-lab|splitway-control|plotters) '
	kubernetes-validate --strict --quiet deploy/k8s/*.yaml

## check-no-bpf: `SPLITWAY_BPF_SKIP=1 cargo check --workspace` with clang hidden from PATH
## (its own target dir, target/no-bpf); the layout pins of bpf/*.c are a unit test of splitway-sys.
check-no-bpf:
	./scripts/check-no-bpf.sh

## import-graph: fails on any import cycle between the files of a crate, and on a circle between
## top-level modules (a folder is one) not in scripts/import-graph-baseline.txt (after a self-test
## proving it can fail); reports imports pointing up its layer order; `--graph` prints the graph.
import-graph:
	python3 scripts/import-graph.py --self-test
	python3 scripts/import-graph.py
	python3 scripts/fn-length.py

## fuzz: every fuzz target for FUZZ_SECONDS each (default 300).
FUZZ_SECONDS ?= 300
fuzz:
	./fuzz/run.sh $(FUZZ_SECONDS)

## fuzz-ci: the parser fuzz targets for FUZZ_CI_SECONDS each (default 15); installs cargo-fuzz if missing.
FUZZ_CI_SECONDS ?= 15
fuzz-ci:
	./fuzz/run.sh --ci $(FUZZ_CI_SECONDS)

## lab-full: every shipped scenario with full repetitions.
lab-full: deps release
	./target/release/splitway lab scenario paper-ktcp --json lab-results/paper-ktcp.json
	./target/release/splitway lab scenario miniproxy-chain --json lab-results/miniproxy-chain.json
	./target/release/splitway lab scenario njit-lossy --json lab-results/njit-lossy.json

## fidelity: the link emulator measured against its configuration.
fidelity: deps release
	./target/release/splitway lab fidelity

## bench: splitway vs direct TCP, HAProxy (splice) and socat on loopback (splitway via HTTP
## CONNECT), then bench-tproxy; results in bench-results/.
bench: deps release
	./target/release/splitway lab bench --json bench-results/latest.json
	./scripts/bench/bench-tproxy.sh

## bench-tproxy: the same work as the peers: one relay host, TPROXY in, direct out; splitway vs
## HAProxy (transparent, splice-auto) vs kernel forwarding, and the relay pair (rc + rs), with
## sockperf, ab + nginx, iperf3, redis-benchmark and the built-in setup-latency generator, methods
## alternating per round; bench-results/tproxy-bench-*.txt.
bench-tproxy: deps release
	./scripts/bench/bench-tproxy.sh

## bench-growth: how cost grows, splitway vs HAProxy vs the relay pair (TPROXY rig): CPU per GB
## against 1-64 iperf3 streams, RSS against 1,000-18,000 open connections (two copies of each proxy process), setup p50/p99 against 100-5,000
## new connections/s; bench-results/growth-*.txt and SVG charts beside it (10 min here).
bench-growth: deps release
	./scripts/bench/bench-growth.sh

## lab-paths: the path-choice scenario (issue #20, about 3.5 min): `splitway lab scenario path-choice`
## (a detour, +100 ms, a dead relay, 20 % loss); JSON per phase to PATHS_JSON; fails on a missed target.
PATHS_JSON ?= lab-results/path-choice.json
lab-paths: deps release
	./target/release/splitway lab scenario path-choice --json $(PATHS_JSON)

## lab-window-safety: learned relay-leg windows against a competing end-to-end CUBIC flow and a
## capacity drop, beside the kernel's default (issue #29; about 2 min per rep, WINDOW_SAFETY_REPS).
WINDOW_SAFETY_REPS ?= 5
lab-window-safety: deps release
	./target/release/splitway lab window-safety --reps $(WINDOW_SAFETY_REPS) --json lab-results/window-safety-$$(date -u +%Y%m%dT%H%MZ).json

## lab-loss-fairness: loss isolation on a client last mile shared with an end-to-end CUBIC flow,
## queueing only and with 1 % random loss, beside the kernel's default (issue #29 item 3;
## about 2 min per rep, LOSS_FAIRNESS_REPS).
LOSS_FAIRNESS_REPS ?= 3
lab-loss-fairness: deps release
	./target/release/splitway lab loss-fairness --reps $(LOSS_FAIRNESS_REPS) --json lab-results/loss-fairness-$$(date -u +%Y%m%dT%H%MZ).json

## faults-long: the fault tests (relay_faults.rs) moving >= 10 GB, every byte checked.
faults-long: deps
	SPLITWAY_REQUIRE_NETNS=1 SPLITWAY_FAULTS_LONG=1 $(CARGO) test -p splitway --test relay_faults -- --test-threads=2 --nocapture

## churn: CHURN_CONNECTIONS non-keepalive connections through a TPROXY relay
## (server closes first, 500 client ports reused); fails on any client SYN
## retransmit or a last round below 0.8x the first. Output in bench-results/.
CHURN_CONNECTIONS ?= 40000
churn: deps
	mkdir -p bench-results
	out=bench-results/churn-$$(date -u +%Y%m%dT%H%M%SZ).txt; \
	{ echo "# make churn, $$(date -u +%FT%TZ), commit $$(git rev-parse --short=12 HEAD), kernel $$(uname -r), load $$(cut -d' ' -f1-3 /proc/loadavg)"; \
	  SPLITWAY_REQUIRE_NETNS=1 SPLITWAY_CHURN_CONNECTIONS=$(CHURN_CONNECTIONS) $(CARGO) test -p splitway --test relay_churn -- --nocapture 2>&1; echo "exit $$?"; } > $$out; \
	grep -E '^(#|churn:|test result|exit)' $$out; grep -q '^exit 0$$' $$out

## flood: issue #33's floods (relay_flood): a spoofed SYN flood from one prefix
## with the real client's TTFB, and 5,000 connections through a relay pair
## whose pooled legs stay open, rs's RSS sampled for FLOOD_OBSERVE_SECS after
## the flood. Output in bench-results/.
FLOOD_OBSERVE_SECS ?= 60
flood: deps
	mkdir -p bench-results
	out=bench-results/flood-$$(date -u +%Y%m%dT%H%M%SZ).txt; \
	{ echo "# make flood, $$(date -u +%FT%TZ), commit $$(git rev-parse --short=12 HEAD), kernel $$(uname -r), load $$(cut -d' ' -f1-3 /proc/loadavg)"; \
	  SPLITWAY_REQUIRE_NETNS=1 SPLITWAY_FLOOD_OBSERVE_SECS=$(FLOOD_OBSERVE_SECS) $(CARGO) test -p splitway --test relay_flood -- --test-threads=1 --nocapture 2>&1; echo "exit $$?"; } > $$out; \
	grep -E '^#|flood: |real client|rs VmRSS|rs trim|test result|^exit' $$out; grep -q '^exit 0$$' $$out

## soak: SOAK_CONNECTIONS concurrent split connections through a relay pair for SOAK_DURATION,
## two relay processes per host sharing the listener (SO_REUSEPORT: fd limit 20,000 per process).
SOAK_DURATION ?= 10m
SOAK_CONNECTIONS ?= 10000
soak: deps release
	./target/release/splitway lab soak --duration $(SOAK_DURATION) --connections $(SOAK_CONNECTIONS)

clean:
	$(CARGO) clean

## bypass-long: `splitway bypass` torture with 1,000 randomized trials (half-close
## both ways, RST, pairing race; every byte sha256-checked) plus disable with
## live connections; make test runs the same test with 60 trials.
bypass-long: deps
	out=bench-results/bypass-long-$$(date -u +%Y%m%dT%H%M%SZ).txt; \
	{ echo "# make bypass-long $$(date -u +%FT%TZ), commit $$(git rev-parse --short HEAD)$$(git diff --quiet || echo -dirty), kernel $$(uname -r), load $$(cut -d' ' -f1-3 /proc/loadavg)"; \
	  SPLITWAY_REQUIRE_NETNS=1 SPLITWAY_BYPASS_TRIALS=1000 $(CARGO) test -p splitway --test bypass -- --nocapture 2>&1; } | tee "$$out"; \
	grep -q "test result: ok" "$$out"

## bypass-probes: the sk_msg-redirect hazards on this kernel (splice, FIONREAD,
## backpressure, blocking readers), paired vs plain; bench-results/bypass-probes-*.txt.
bypass-probes: deps release
	./scripts/bench/bypass-probes.sh

## bypass-floor: plain vs bypass vs the least any sk_msg redirect costs (scripts/bench/lib/bypass-floor.c)
## vs the read counter alone vs an empty program on its tracepoint; bench-results/bypass-floor-*.txt.
bypass-floor: deps release
	./scripts/bench/bypass-floor.sh

## bench-bypass: plain loopback vs bypass, alternating rounds (sockperf, redis-benchmark,
## iperf3); refuses to run at load average >= 3 unless FORCE=1; bench-results/bypass-bench-*.txt.
bench-bypass: deps release
	./scripts/bench/bench-bypass.sh
