//! The model against the closed forms of the Miniproxy paper (section 3) and
//! the numbers of the KTCP paper (section 4).

use splitway_lab::model::{
    Config, HTTP_RESPONSE_HEADER_BYTES, LinkModel, MSS, Mechanics, ModelParams, RelayLeg, predict,
    predict_mechanics,
};

const TOL_MS: f64 = 0.05;

fn link(rtt_ms: f64) -> LinkModel {
    LinkModel::symmetric(rtt_ms, None, 0.0)
}

fn ktcp_path() -> Vec<LinkModel> {
    vec![link(32.7), link(215.0), link(26.0)]
}

fn ttfb(links: &[LinkModel], config: Config) -> f64 {
    predict(links, config, 10_000, &ModelParams::default()).ttfb_ms
}

fn ttfb_m(links: &[LinkModel], m: Mechanics) -> f64 {
    predict_mechanics(links, &m, 10_000, &ModelParams::default()).ttfb_ms
}

fn assert_close(got: f64, want: f64, what: &str) {
    assert!(
        (got - want).abs() < TOL_MS,
        "{what}: got {got:.3} ms, want {want:.3} ms"
    );
}

/// Miniproxy: with N evenly placed proxies on a path of one-way delay D,
/// the TTFB is 4D without early SYN forwarding and 2D + 2D/(N+1) with it.
/// Their D and X_i are one-way delays; our links take RTTs (= 2 X_i).
#[test]
fn miniproxy_even_chains() {
    let d_ms = 50.0; // 100 ms end-to-end RTT
    for proxies in 1..=3_usize {
        let x = d_ms / (proxies as f64 + 1.0);
        let links: Vec<LinkModel> = (0..=proxies).map(|_| link(2.0 * x)).collect();
        assert_close(
            ttfb_m(&links, Mechanics::paper_split()),
            4.0 * d_ms,
            "no ESF",
        );
        assert_close(
            ttfb_m(&links, Mechanics::paper_early_syn()),
            2.0 * d_ms + 2.0 * x,
            "ESF",
        );
        // Their reported savings: 25 %, 33.3 %, 37.5 %.
        let saving = 1.0 - ttfb_m(&links, Mechanics::paper_early_syn()) / (4.0 * d_ms);
        let want = [0.25, 1.0 / 3.0, 0.375][proxies - 1];
        assert!(
            (saving - want).abs() < 1e-6,
            "saving {saving} for {proxies}"
        );
    }
}

/// Miniproxy eq. (2) with uneven delays: TTFB = 2D + 2·max(X_i).
#[test]
fn miniproxy_uneven_chain() {
    let one_way = [10.0, 60.0, 5.0, 25.0];
    let links: Vec<LinkModel> = one_way.iter().map(|x| link(2.0 * x)).collect();
    let d: f64 = one_way.iter().sum();
    let max = one_way.iter().cloned().fold(0.0, f64::max);
    assert_close(
        ttfb_m(&links, Mechanics::paper_early_syn()),
        2.0 * d + 2.0 * max,
        "eq. 2",
    );
    assert_close(ttfb_m(&links, Mechanics::paper_split()), 4.0 * d, "4D");
}

/// Miniproxy eq. (10): TTC_k = TTFB + k·2·max(X_i) for a transfer needing
/// k+1 slow-start rounds, the legs' slow starts running in parallel.
#[test]
fn miniproxy_slow_start_rounds() {
    let x = 25.0;
    let links = vec![link(2.0 * x), link(2.0 * x)];
    let params = ModelParams::default();
    for k in 0..4_u32 {
        let segments = 10 * ((1_u64 << (k + 1)) - 1);
        let body = segments * u64::from(MSS) - HTTP_RESPONSE_HEADER_BYTES;
        let p = predict_mechanics(&links, &Mechanics::paper_early_syn(), body, &params);
        let ttfb = 2.0 * 50.0 + 2.0 * x;
        assert_close(p.ttfb_ms, ttfb, "TTFB");
        assert_close(p.total_ms, ttfb + f64::from(k) * 2.0 * x, "TTC_k");
        // End to end the rounds take the full RTT (eq. 9).
        let e2e = predict(&links, Config::E2e, body, &params);
        assert_close(e2e.total_ms, 200.0 + f64::from(k) * 100.0, "e2e TTC_k");
    }
}

/// KTCP section 4: 32.7 / 215 / 26 ms.
#[test]
fn ktcp_numbers() {
    let path = ktcp_path();
    let total_rtt = 32.7 + 215.0 + 26.0;
    // End to end: connect + request/response = 2 RTT ≈ 547 ms.
    assert_close(ttfb(&path, Config::E2e), 2.0 * total_rtt, "e2e");
    // The papers' basic split and the ssh baseline coincide with e2e.
    assert_close(
        ttfb_m(&path, Mechanics::paper_split()),
        547.4,
        "paper split",
    );
    assert_close(ttfb(&path, Config::Ssh), 547.4, "ssh baseline");
    assert_close(ttfb(&path, Config::Haproxy), 547.4, "haproxy");
    // Early SYN saves one RTT of the client leg and one of the server leg.
    let es = ttfb_m(&path, Mechanics::paper_early_syn());
    assert_close(547.4 - es, 32.7 + 26.0, "early SYN saving ≈ 59 ms");
    // The pool saves a further 215 − 33 ≈ 182 ms: 2·RTTc + RTTm + RTTs.
    let pool = ttfb_m(&path, Mechanics::paper_pool());
    assert_close(es - pool, 215.0 - 32.7, "pool saving ≈ 182 ms");
    assert_close(pool, 2.0 * 32.7 + 215.0 + 26.0, "≈ 306 ms");
    // splitway's pooled configurations match KTCP+TP+ES+CP; Turbo-Start
    // does not change the TTFB; TFO on both ends reaches one RTT.
    assert_close(ttfb(&path, Config::SplitEsPool), pool, "split+es+pool");
    assert_close(ttfb(&path, Config::Full), pool, "full");
    assert_close(ttfb(&path, Config::FullTfo), total_rtt, "full+tfo ≈ 274 ms");
}

/// splitway's fresh peer legs are authenticated: with the version-1
/// challenge (now the fallback), one more RTT of the relay↔relay leg than
/// the papers' split; with the Hello after the handshake (`split` since
/// issue 13), none. With early SYN at the first relay and the 0-RTT Hello in
/// the relay leg's SYN, the next relay dials the server when that SYN
/// arrives: the papers' early SYN on every relay, without capturing SYNs
/// there.
#[test]
fn splitway_split_pays_the_auth_round_trip_and_zero_rtt_removes_it() {
    let path = ktcp_path();
    let challenge = Mechanics {
        relay_leg: RelayLeg::Authenticated,
        ..Config::Split.mechanics()
    };
    assert_close(ttfb_m(&path, challenge), 547.4 + 215.0, "challenge");
    assert_close(ttfb(&path, Config::Split), 547.4, "split (Hello)");
    assert_close(
        ttfb(&path, Config::Split),
        ttfb_m(&path, Mechanics::paper_split()),
        "split = papers' split",
    );
    assert_close(
        ttfb(&path, Config::Default),
        ttfb(&path, Config::SplitEsPool),
        "default = split+es+pool",
    );
    assert_close(
        ttfb(&path, Config::SplitEs),
        ttfb_m(&path, Mechanics::paper_early_syn()),
        "split+es = papers' early SYN",
    );
    assert_close(
        ttfb(&path, Config::SplitEs),
        547.4 - 32.7 - 26.0,
        "split+es",
    );
}

#[test]
fn connect_time_is_first_leg_for_relays() {
    let path = ktcp_path();
    let params = ModelParams::default();
    let e2e = predict(&path, Config::E2e, 10_000, &params);
    assert_close(e2e.connect_ms, 273.7, "e2e connect");
    for config in [Config::Haproxy, Config::Ssh, Config::Split, Config::Full] {
        let p = predict(&path, config, 10_000, &params);
        assert_close(p.connect_ms, 32.7, config.name());
    }
    let tfo = predict(&path, Config::FullTfo, 10_000, &params);
    assert_close(tfo.connect_ms, 0.0, "TFO connect returns at once");
}

/// Small objects arrive in the first window: total ≈ TTFB. Larger ones need
/// more rounds, and Turbo-Start shortens them, never the TTFB.
#[test]
fn sizes_and_turbo_start() {
    let path = ktcp_path();
    let params = ModelParams::default();
    let small = predict(&path, Config::E2e, 10_000, &params);
    assert!(small.total_ms - small.ttfb_ms < 0.01);
    for size in [100_000_u64, 1_000_000, 10_000_000] {
        let e2e = predict(&path, Config::E2e, size, &params);
        let pool = predict(&path, Config::SplitEsPool, size, &params);
        let full = predict(&path, Config::Full, size, &params);
        assert!(e2e.total_ms > e2e.ttfb_ms);
        assert!(full.total_ms < pool.total_ms, "turbo helps at {size}");
        assert_close(full.ttfb_ms, pool.ttfb_ms, "turbo leaves TTFB alone");
        assert!(pool.total_ms < e2e.total_ms, "split helps at {size}");
    }
}

/// A rate cap bounds the transfer: 10 MB over 100 Mbit/s takes at least
/// 0.8 s after the first byte, however large the window.
#[test]
fn rate_cap_bounds_transfer() {
    let links = vec![LinkModel::symmetric(10.0, Some(100.0), 0.0)];
    let p = predict(&links, Config::E2e, 10_000_000, &ModelParams::default());
    let wire_bytes = 10_000_000.0 * 1500.0 / 1448.0;
    let floor_ms = wire_bytes * 8.0 / 100e6 * 1000.0;
    assert!(p.total_ms - p.ttfb_ms >= floor_ms * 0.99, "{p:?}");
    assert!(p.total_ms - p.ttfb_ms < floor_ms * 1.2, "{p:?}");
}

/// Under loss the leg runs at the Mathis rate, so splitting off a short
/// lossy leg (NJIT's case) beats end to end by far.
#[test]
fn loss_uses_mathis_and_split_isolates_it() {
    let links = vec![
        LinkModel::symmetric(200.0, None, 0.0),
        LinkModel::symmetric(10.0, None, 0.05),
    ];
    let params = ModelParams::default();
    let size = 1_000_000;
    let e2e = predict(&links, Config::E2e, size, &params);
    let split = predict(&links, Config::Split, size, &params);
    let mathis_e2e = 1.22 * f64::from(MSS) / (0.21 * 0.05_f64.sqrt());
    let floor_ms = size as f64 * 1500.0 / 1448.0 / mathis_e2e * 1000.0;
    assert!(e2e.total_ms > floor_ms * 0.9, "{e2e:?} vs {floor_ms}");
    assert!(split.total_ms * 3.0 < e2e.total_ms, "{split:?} vs {e2e:?}");
}

#[test]
fn config_names_round_trip() {
    for c in Config::ALL {
        assert_eq!(c.name().parse::<Config>(), Ok(c));
    }
    assert!("nope".parse::<Config>().is_err());
}
