//! `ctl routes`: the routing table from `GET /status`, then each route's
//! candidates as measured, from `GET /routes` (relays without it: the
//! table alone).

use std::fmt::Write as _;

use splitway_api as api;
use splitway_control::client::AdminClient;

use super::{Outcome, render_routes, table};

/// The output of `ctl routes` given the `/status` document already fetched.
pub(super) fn routes(client: &AdminClient, status: &api::Status, json_out: bool) -> Outcome {
    // A relay without path choice answers 501: the table alone. Anything
    // else that goes wrong is said on stderr, the table still printed.
    let mut warning = String::new();
    let paths = match client.request("GET", "/routes", None) {
        Ok(a) if a.is_success() => match a.json::<api::RoutesView>() {
            Ok(doc) => Some(doc),
            Err(e) => {
                warning = format!("splitway ctl: GET /routes: not a routes document: {e}\n");
                None
            }
        },
        Ok(a) if a.status == 501 => None,
        Ok(a) => {
            warning = format!("splitway ctl: GET /routes answered {}\n", a.status);
            None
        }
        Err(e) => {
            warning = format!("splitway ctl: GET /routes: {e}\n");
            None
        }
    };
    let mut outcome = routes_output(status, paths, json_out);
    outcome.stderr = warning;
    outcome
}

fn routes_output(status: &api::Status, paths: Option<api::RoutesView>, json_out: bool) -> Outcome {
    if json_out {
        let report = api::RoutesReport {
            routes: status.routes.clone(),
            peers: status.peers.clone(),
            paths,
        };
        return match serde_json::to_string_pretty(&report) {
            Ok(text) => Outcome::ok(format!("{text}\n")),
            // Only a map with non-string keys fails: a bug in splitway-api.
            Err(e) => Outcome::failed(
                super::EXIT_REFUSED,
                String::new(),
                format!("splitway ctl: internal: routes report not serialisable: {e}\n"),
            ),
        };
    }
    // A route with candidates goes where its current choice is.
    let mut status = status.clone();
    if let Some(paths) = &paths {
        for route in &mut status.routes {
            if let Some(p) = paths.routes.iter().find(|p| p.dst == route.dst && p.probed) {
                route.via = p.chosen.clone();
            }
        }
    }
    let mut out = render_routes(&status);
    if let Some(paths) = paths {
        out.push('\n');
        out.push_str(&render_candidates(&paths));
    }
    Outcome::ok(out)
}

fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |ms| format!("{ms:.2}"))
}

/// One row per candidate: state, own leg RTT, what the next relay reported
/// for its onward legs, the sum (loss included), retransmits per sampled
/// leg, the recent share of segments retransmitted, and a `*`
/// on the current choice, and the window learned on legs to it.
pub(super) fn render_candidates(doc: &api::RoutesView) -> String {
    let mut rows = Vec::new();
    for route in &doc.routes {
        for c in &route.candidates {
            rows.push(vec![
                route.dst.clone(),
                format!(
                    "{}{}",
                    if c.name == route.chosen { "*" } else { " " },
                    c.name
                ),
                c.state.clone(),
                ms(c.leg_rtt_ms),
                ms(c.onward_ms),
                ms(c.estimate_ms),
                c.retrans_per_leg.map_or("-".into(), |r| format!("{r:.2}")),
                c.loss.map_or("-".into(), |l| format!("{:.1}%", l * 100.0)),
                c.probes.to_string(),
                c.learned_window
                    .as_ref()
                    .map_or("-".into(), super::learned_window_cell),
                c.down_reason.clone().unwrap_or_default(),
            ]);
        }
    }
    if rows.is_empty() {
        return "no routes\n".into();
    }
    let mut out = table(
        &[
            "DESTINATION",
            "CANDIDATE",
            "STATE",
            "LEG_MS",
            "ONWARD_MS",
            "EST_MS",
            "RETRANS",
            "LOSS",
            "PROBES",
            "LEARNED",
            "WHY DOWN",
        ],
        &rows,
    );
    let _ = writeln!(
        out,
        "* = current choice; changes at most once per {} s unless it goes down; probes every {} s",
        doc.hold_s, doc.probe_every_s
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_render_with_the_choice_marked() {
        let doc = r#"{"hold_s": 60, "probe_every_s": 1.0, "routes": [
            {"index": 0, "dst": "10.0.3.0/24", "chosen": "rs2", "probed": true, "flips": 1,
             "changed_s_ago": 3.5, "candidates": [
                {"name": "rs1", "state": "down", "estimate_ms": null, "leg_rtt_ms": 0.41,
                 "onward_ms": null, "retrans_per_leg": 0.0, "probes": 7,
                 "down_reason": "connection refused"},
                {"name": "rs2", "state": "up", "estimate_ms": 1.5, "leg_rtt_ms": 0.5,
                 "onward_ms": 1.0, "retrans_per_leg": 0.25, "probes": 8, "down_reason": null,
                 "learned_window": {"addr": "10.0.2.2", "peer": "rs2", "cwnd_segments": 2900,
                  "bdp_segments": 1450, "jump_segments": 1450, "min_rtt_ms": 215.25, "age_s": 12.4, "capacity_estimate": true,
                  "current": true}}]}]}"#;
        let doc: api::RoutesView = serde_json::from_str(doc).expect("a routes document");
        let out = render_candidates(&doc);
        let lines: Vec<&str> = out.lines().collect();
        assert!(
            lines[0].starts_with("DESTINATION  CANDIDATE  STATE"),
            "{out}"
        );
        assert!(
            lines[1].contains(" rs1") && lines[1].contains("down"),
            "{out}"
        );
        assert!(lines[1].ends_with("connection refused"), "{out}");
        assert!(
            lines[2].contains("*rs2") && lines[2].contains("1.50"),
            "{out}"
        );
        assert!(lines[2].contains("0.25"), "{out}");
        assert!(
            lines[2].contains("jump 1450 seg (BDP 1450, cwnd 2900), 215.2 ms, 12 s ago"),
            "{out}"
        );
        assert!(lines[1].contains("  -  "), "{out}");
        assert!(lines[3].contains("60 s"), "{out}");
        assert_eq!(
            render_candidates(&api::RoutesView::default()),
            "no routes\n"
        );
    }
}
