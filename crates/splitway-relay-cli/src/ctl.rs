//! `splitway ctl`: inspect and tune a running relay through its admin API.
//!
//! Talks HTTP/1.1 to the relay's `admin` address with the blocking client of
//! splitway-control; renders tables from the JSON, or prints it with `--json`.
//! Exit codes: 0 done, 1 the relay refused or answered an error, 2 the relay
//! could not be reached.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use serde::Deserialize;
use serde_json::Value;
use splitway_api as api;
use splitway_control::client::{AdminClient, Answer, ClientError, DEFAULT_ADMIN_ADDR};

mod paths;

/// Exit code when the relay is not reachable.
const EXIT_UNREACHABLE: u8 = 2;
/// Exit code when the relay answered with an error.
const EXIT_REFUSED: u8 = 1;

#[derive(Args, Debug)]
#[command(
    about = "Inspect and tune a running relay through its admin API",
    long_about = "Inspect and tune a running relay through its admin API (the `admin` key of \
its config, 127.0.0.1:9090 unless set otherwise).\n\n\
Read-only: status, pools, routes, connections, params, metrics. Changing: set (live \
parameters, all or nothing), drain (stop accepting, let open connections finish), reload \
(re-read the config file, like SIGHUP).\n\n\
Output is a table for people; --json prints the relay's JSON answer unchanged, for scripts.\n\n\
Exit status: 0 on success, 1 when the relay refused the request or answered an error (the \
reasons are printed, one per line), 2 when the relay's admin API could not be reached."
)]
pub struct CtlArgs {
    /// Address of the relay's admin API: HOST:PORT (the port defaults to 9090) or unix:/path/to/socket.
    #[arg(
        long,
        short = 'a',
        value_name = "ADDR",
        default_value = DEFAULT_ADMIN_ADDR,
        env = "SPLITWAY_ADMIN",
        global = true
    )]
    admin: String,
    /// Print the relay's raw JSON answer instead of a table.
    #[arg(long, global = true)]
    json: bool,
    /// How long to wait for the relay to connect and to answer.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_timeout, global = true)]
    timeout: Duration,
    #[command(subcommand)]
    command: CtlCommand,
}

#[derive(Subcommand, Debug)]
enum CtlCommand {
    /// Name, version, uptime, listeners, features and active connections.
    #[command(
        long_about = "Show the relay's name, version and uptime, its listeners \
(mode, address, TPROXY interception), the accelerations in effect (data path, early SYN, \
pool, TFO, turbo-start), active connections by mode, and early-SYN counters.\n\n\
Source: GET /status."
    )]
    Status,
    /// Connection pools to each peer relay: level, watermarks, events.
    #[command(
        long_about = "Show one line per configured peer relay: its address and \
congestion control, and when pooling is on, the pool's idle connections (LEVEL), refills \
in flight, the low/high watermarks, and how often a connection was taken, refilled, found \
dead, expired, or missed (pool empty), plus dial failures and the last error.\n\n\
Tune watermarks live with `splitway ctl set pool.PEER.low N pool.PEER.high M`.\n\n\
Source: GET /status (peers[].pool)."
    )]
    Pools,
    /// The routing table: destination prefix → next hop, and each candidate as measured.
    #[command(
        long_about = "Show the routing table in the relay's order: each destination \
prefix and where matching connections go next, `direct` (to the server itself) or a peer \
relay's name and address. The longest matching prefix wins; a destination no prefix \
matches is refused.\n\n\
Then every route's candidates (`via = [\"rs1\", \"rs2\", \"direct\"]`): state (up, down, \
unknown), the measured RTT of our leg to it, what that relay reported for its own onward \
legs, their sum (the estimate new connections are placed by), retransmits per sampled leg, \
probes sent and why a candidate is down; `*` marks the current choice.\n\n\
Source: GET /status (routes, peers) and GET /routes."
    )]
    Routes,
    /// Connection counts by state and mode, and a sample of connections.
    #[command(
        long_about = "Show how many connections the relay holds, by state and by \
mode, and a sample of individual connections (client, destination, next hop, age, bytes \
each way). The sample is bounded: --sample N (at most 1000).\n\n\
Source: GET /connections?sample=N."
    )]
    Connections {
        /// Connections to list individually.
        #[arg(long, default_value_t = 20, value_name = "N")]
        sample: usize,
    },
    /// Live-tunable parameters: current value, type and range.
    #[command(
        long_about = "List the parameters `splitway ctl set` can change on the \
running relay, with their current values, types, allowed ranges and meaning.\n\n\
Source: GET /params."
    )]
    Params,
    /// Change live parameters: set KEY VALUE [KEY VALUE...].
    #[command(long_about = "Change parameters of the running relay, e.g.\n\n\
    splitway ctl set pool.rs.low 8 pool.rs.high 64\n\
    splitway ctl set early_syn off timeouts.idle 10m log.level debug\n\n\
All pairs are applied together or not at all: an unknown parameter, a value of the wrong \
type or outside its range, or a combination the relay refuses (low above high) changes \
nothing and prints one line per problem, naming the parameter. On success each change is \
printed as `NAME: OLD -> NEW`; the relay logs the same. Changes last until the relay \
restarts or reloads its config (the file wins): put them in the config file to keep them. \
log.level takes a level or RUST_LOG-style directives (splitway_relay=debug,info) and \
survives reloads.\n\n\
`splitway ctl params` lists the parameters. Source: PUT /params.")]
    Set {
        /// KEY VALUE pairs.
        #[arg(num_args = 2.., value_names = ["KEY", "VALUE"], required = true)]
        pairs: Vec<String>,
    },
    /// Stop accepting new connections; open ones finish.
    #[command(
        long_about = "Put the relay into drain: it stops accepting new connections \
(and removes its TPROXY interception, so new connections bypass it) while open \
connections run to completion. Use before maintenance or a restart; the process exits \
or keeps running according to its own drain settings. A second drain is accepted and \
changes nothing: it answers as the first did (draining, with the connections still open).\n\n\
Source: POST /drain."
    )]
    Drain,
    /// Re-read the config file and apply it (like SIGHUP).
    #[command(
        long_about = "Make the relay re-read its config file and apply what can \
change without a restart: routes, peers (added, removed, changed; their pools are \
replaced), pool watermarks, the keys (psk_file, psk_file_previous: rotate without a \
restart), limits, timeouts, direct/client/peer tuning, forwarding.data_path, listeners' \
allow_clients, accel.pool, and accel.early_syn if the SYN detector is running. Open \
connections keep the config they started with.\n\n\
The listener set (addresses, modes, interception), admin, name, accel.tfo, accel.turbo, \
accel.learned_window \
and the early-SYN budget and expiry need a restart: they keep their old value and are \
listed as such. Values set with `splitway ctl set` are reset to the file's (the log \
level, not in the file, stays).\n\n\
Prints each change as `KEY: OLD -> NEW`. An invalid file changes nothing: every error is \
printed, one per line, each naming its key (the same as `splitway relay --check`), and \
the exit status is 1. Equivalent to `systemctl reload splitway@NAME` (SIGHUP), but \
reports the outcome.\n\n\
Source: POST /reload."
    )]
    Reload,
    /// Print the Prometheus metrics (OpenMetrics text).
    #[command(
        long_about = "Print every metric the relay exports, in the OpenMetrics \
text format Prometheus scrapes, e.g. to grep one series.\n\n\
Source: GET /metrics."
    )]
    Metrics,
}

fn parse_timeout(text: &str) -> Result<Duration, String> {
    splitway_control::params::parse_duration(text)
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("`{text}` is not a duration like 5s or 500ms"))
}

/// Runs one `splitway ctl` command, printing its output.
/// `json`: `--log-format json`, under which what goes to stderr is logged
/// as JSON lines, one per line of text (stdout is the answer, unchanged).
pub fn run(args: CtlArgs, json: bool) -> anyhow::Result<ExitCode> {
    let outcome = execute(&args)?;
    print!("{}", outcome.stdout);
    if json {
        for line in outcome.stderr.lines().filter(|l| !l.trim().is_empty()) {
            if outcome.code == 0 {
                tracing::warn!("{line}");
            } else {
                tracing::error!(exit_code = outcome.code, "{line}");
            }
        }
    } else {
        eprint!("{}", outcome.stderr);
    }
    Ok(ExitCode::from(outcome.code))
}

/// What a command printed and its exit code.
#[derive(Debug, Default)]
struct Outcome {
    stdout: String,
    stderr: String,
    code: u8,
}

impl Outcome {
    fn ok(stdout: String) -> Self {
        Self {
            stdout,
            ..Self::default()
        }
    }

    fn failed(code: u8, stdout: String, stderr: String) -> Self {
        Self {
            stdout,
            stderr,
            code,
        }
    }
}

fn execute(args: &CtlArgs) -> anyhow::Result<Outcome> {
    let client = AdminClient::new(&args.admin, args.timeout);
    let (method, path, body) = match &args.command {
        CtlCommand::Status | CtlCommand::Pools | CtlCommand::Routes => {
            ("GET", "/status".into(), None)
        }
        CtlCommand::Connections { sample } => {
            ("GET", format!("/connections?sample={sample}"), None)
        }
        CtlCommand::Params => ("GET", "/params".into(), None),
        CtlCommand::Set { pairs } => match set_body(pairs) {
            Ok(body) => {
                let body = serde_json::to_vec(&body).context("internal: PUT /params body")?;
                ("PUT", "/params".into(), Some(body))
            }
            Err(message) => {
                let stderr = format!("splitway ctl set: {message}\n");
                return Ok(Outcome::failed(EXIT_REFUSED, String::new(), stderr));
            }
        },
        CtlCommand::Drain => ("POST", "/drain".into(), None),
        CtlCommand::Reload => ("POST", "/reload".into(), None),
        CtlCommand::Metrics => ("GET", "/metrics".into(), None),
    };
    let answer = match client.request(method, &path, body.as_deref()) {
        Ok(answer) => answer,
        Err(error) => {
            let code = match error {
                ClientError::BadResponse { .. } => EXIT_REFUSED,
                _ => EXIT_UNREACHABLE,
            };
            return Ok(Outcome::failed(
                code,
                String::new(),
                format!("splitway ctl: {error}\n"),
            ));
        }
    };

    if matches!(args.command, CtlCommand::Metrics) && answer.is_success() {
        return Ok(Outcome::ok(
            String::from_utf8_lossy(&answer.body).into_owned(),
        ));
    }
    // Read once untyped: `--json` prints it as it came.
    let document: Value = answer.json().with_context(|| {
        format!(
            "the admin API at {} answered {} with a body that is not JSON",
            client.addr(),
            answer.status
        )
    })?;
    if matches!(args.command, CtlCommand::Routes) && answer.is_success() {
        let status = read(&document).with_context(|| {
            format!(
                "the admin API at {} answered {path} with a document that is not a status",
                client.addr()
            )
        })?;
        return Ok(paths::routes(&client, &status, args.json));
    }
    let raw = if args.json {
        format!("{}\n", pretty(&document))
    } else {
        String::new()
    };
    if !answer.is_success() {
        return Ok(Outcome::failed(
            EXIT_REFUSED,
            raw,
            render_failure(&answer, &document),
        ));
    }
    if args.json {
        return Ok(Outcome::ok(raw));
    }
    let typed = |what: &str| {
        format!(
            "the admin API at {} answered {path} with a document that is not {what}",
            client.addr()
        )
    };
    Ok(Outcome::ok(match &args.command {
        CtlCommand::Status => render_status(&read(&document).with_context(|| typed("a status"))?),
        CtlCommand::Pools => render_pools(&read(&document).with_context(|| typed("a status"))?),
        CtlCommand::Routes => render_routes(&read(&document).with_context(|| typed("a status"))?),
        CtlCommand::Connections { .. } => {
            render_connections(&read(&document).with_context(|| typed("a connection list"))?)
        }
        CtlCommand::Params => {
            render_params(&read::<Vec<_>>(&document).with_context(|| typed("a parameter list"))?)
        }
        CtlCommand::Set { .. } => {
            render_changes(&read(&document).with_context(|| typed("a list of changes"))?)
        }
        CtlCommand::Reload => {
            render_reload(&read(&document).with_context(|| typed("a reload report"))?)
        }
        CtlCommand::Drain => {
            render_drain(&read(&document).with_context(|| typed("a drain report"))?)
        }
        // Text, answered above; here only if a relay sent it as JSON.
        CtlCommand::Metrics => String::from_utf8_lossy(&answer.body).into_owned(),
    }))
}

/// The typed form of an answer (`--json` prints the document as it came).
fn read<T: serde::de::DeserializeOwned>(document: &Value) -> Result<T, serde_json::Error> {
    T::deserialize(document)
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

/// The `PUT /params` body for `KEY VALUE` pairs. Booleans and integers are
/// sent as such, everything else as a string (the relay converts `"8"` and
/// `"30s"` by the parameter's type).
fn set_body(pairs: &[String]) -> Result<api::ParamsUpdate, String> {
    if !pairs.len().is_multiple_of(2) {
        return Err(format!(
            "expected KEY VALUE pairs, got an odd number of words ({}); `{}` has no value",
            pairs.len(),
            pairs[pairs.len() - 1]
        ));
    }
    let mut body = api::ParamsUpdate::new();
    for pair in pairs.chunks_exact(2) {
        let (key, text) = (&pair[0], &pair[1]);
        let value = match serde_json::from_str::<api::ParamValue>(text) {
            Ok(value @ (api::ParamValue::Bool(_) | api::ParamValue::Int(_))) => value,
            _ => api::ParamValue::Text(text.clone()),
        };
        if body.insert(key.clone(), value).is_some() {
            return Err(format!("`{key}` is given twice"));
        }
    }
    Ok(body)
}

/// What to print on stderr for an error answer: the message, then each
/// listed error on its own line. An answer in no known shape still gets
/// the status line.
fn render_failure(answer: &Answer, document: &Value) -> String {
    let body = api::ErrorBody::deserialize(document).ok();
    let mut out = String::new();
    let message = body
        .as_ref()
        .map(|b| b.error.as_str())
        .filter(|m| !m.is_empty())
        .unwrap_or("request failed");
    let _ = writeln!(
        out,
        "splitway ctl: relay answered {}: {message}",
        answer.status
    );
    for error in body.iter().flat_map(|b| b.errors.iter().flatten()) {
        let _ = writeln!(out, "  {error}");
    }
    out
}

/// A cell for an optional value: `-` when absent.
fn cell(value: Option<impl std::fmt::Display>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn on_off(on: bool) -> &'static str {
    if on { "on" } else { "off" }
}

/// A fractional number as JSON writes it (`30.0`), as ctl always showed it.
fn number(value: f64) -> String {
    serde_json::to_string(&value).unwrap_or_else(|_| value.to_string())
}

/// Left-aligned columns separated by two spaces; numbers right-aligned.
fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let numeric: Vec<bool> = (0..headers.len())
        .map(|column| {
            !rows.is_empty()
                && rows.iter().all(|row| {
                    row.get(column)
                        .is_some_and(|cell| cell == "-" || cell.parse::<f64>().is_ok())
                })
        })
        .collect();
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut rendered = String::new();
        for (column, cell) in cells.enumerate() {
            if column > 0 {
                rendered.push_str("  ");
            }
            let width = widths[column];
            if numeric[column] {
                let _ = write!(rendered, "{cell:>width$}");
            } else {
                let _ = write!(rendered, "{cell:<width$}");
            }
        }
        out.push_str(rendered.trim_end());
        out.push('\n');
    };
    line(&mut headers.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

/// `3d 04h 05m`, `2h 03m 10s`, `42s`.
fn uptime(seconds: f64) -> String {
    let total = seconds.max(0.0) as u64;
    let (days, hours, minutes, secs) = (
        total / 86_400,
        total / 3600 % 24,
        total / 60 % 60,
        total % 60,
    );
    if days > 0 {
        format!("{days}d {hours:02}h {minutes:02}m")
    } else if hours > 0 {
        format!("{hours}h {minutes:02}m {secs:02}s")
    } else if minutes > 0 {
        format!("{minutes}m {secs:02}s")
    } else {
        format!("{secs}s")
    }
}

/// One learned window in a cell: `jump 1450 seg (BDP 1450, cwnd 2900),
/// 215.2 ms, 12 s ago`, marked when it only shows how far a transfer grew,
/// or is too old to be used.
fn learned_window_cell(w: &api::LearnedWindow) -> String {
    let mut s = format!(
        "jump {} seg (BDP {}, cwnd {}), {:.1} ms, {:.0} s ago",
        w.jump_segments, w.bdp_segments, w.cwnd_segments, w.min_rtt_ms, w.age_s
    );
    if !w.capacity_estimate {
        s.push_str(", growing");
    }
    if !w.current {
        s.push_str(", expired");
    }
    s
}

/// `splitway_resume`'s counters and the window learned per peer address.
fn render_learned_windows(out: &mut String, learned: &api::LearnedWindows) {
    let e = &learned.events;
    let _ = writeln!(
        out,
        "learned windows (host-wide): jumps {}, validated {}, retreats {}, RTT mismatches {}, saved {}",
        e.jumps, e.validated, e.retreats, e.rtt_mismatches, e.saved
    );
    for w in &learned.peers {
        let _ = writeln!(
            out,
            "  {} ({}): {}",
            w.addr,
            w.peer.as_deref().unwrap_or("upstream relay"),
            learned_window_cell(w)
        );
    }
}

fn render_status(status: &api::Status) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "relay {}  (splitway {})  up {}",
        status.name,
        status.version,
        uptime(status.uptime_seconds),
    );

    let features = &status.features;
    let turbo = match &features.turbo_start {
        None => "off".to_owned(),
        Some(turbo) => format!("initcwnd {} initrwnd {}", turbo.initcwnd, turbo.initrwnd),
    };
    let _ = writeln!(
        out,
        "features: data path {}, early SYN {}, pool {}, TFO {}, turbo-start {}",
        features.data_path,
        on_off(features.early_syn),
        on_off(features.pool),
        on_off(features.tfo),
        turbo,
    );

    // Effective states (older relays send none).
    if !status.accel.is_empty() {
        let _ = writeln!(out, "accelerations (state, as requested: why):");
        let width = status.accel.keys().map(String::len).max().unwrap_or(0);
        for (name, a) in &status.accel {
            let _ = writeln!(
                out,
                "  {name:<width$}  {:<11}  {:<4}  {}",
                a.state, a.requested, a.reason,
            );
        }
    }
    // BPF congestion controls this relay process registered (or shares).
    let ccs: Vec<String> = status
        .congestion_controls
        .iter()
        .map(|c| {
            let mut s = format!("{} (held by {}", c.name, c.held_by);
            if !c.available {
                s.push_str(", NOT registered now");
            }
            s.push(')');
            s
        })
        .collect();
    let _ = writeln!(
        out,
        "BPF congestion controls: {}",
        if ccs.is_empty() {
            "none loaded".to_owned()
        } else {
            ccs.join(", ")
        }
    );

    if let Some(learned) = &status.learned_windows {
        render_learned_windows(&mut out, learned);
    }

    let active = &status.connections_active;
    let modes = [
        ("tproxy", active.tproxy),
        ("socks5", active.socks5),
        ("http_connect", active.http_connect),
        ("peer", active.peer),
    ];
    let total: i64 = modes.iter().map(|(_, n)| n).sum();
    let by_mode: Vec<String> = modes.iter().map(|(m, n)| format!("{m} {n}")).collect();
    let _ = writeln!(out, "active connections: {total} ({})", by_mode.join(", "));

    match &status.early_syn {
        Some(api::EarlySyn::Dead(_)) => {
            let _ = writeln!(out, "early SYN: detector dead, legs start at accept");
        }
        Some(api::EarlySyn::Running(early)) => {
            let _ = writeln!(
                out,
                "early SYN: {} pending of {} budget; started {}, hits {}, misses {}, duplicates {}, over budget {} (per prefix {}, share {}), expired {}; near clients {} ({} prefixes sampled)",
                early.pending,
                early.budget,
                early.started,
                early.hits,
                early.misses,
                early.duplicates,
                early.over_budget,
                early.prefix_over_budget,
                early.prefix_budget,
                early.expired,
                early.near,
                early.near_prefixes,
            );
        }
        None => {}
    }

    out.push_str("\nlisteners:\n");
    let listeners: Vec<Vec<String>> = status
        .listeners
        .iter()
        .map(|l| {
            let intercept = match &l.intercept {
                None => "-".to_owned(),
                Some(i) => format!("{} ports {}", list(&i.interfaces), list(&i.ports)),
            };
            vec![l.mode.clone(), l.addr.clone(), intercept]
        })
        .collect();
    out.push_str(&indent(&table(&["MODE", "ADDR", "INTERCEPT"], &listeners)));

    let _ = writeln!(
        out,
        "\n{} peer(s), {} route(s): `splitway ctl pools`, `splitway ctl routes`",
        status.peers.len(),
        status.routes.len()
    );
    out
}

fn render_pools(status: &api::Status) -> String {
    let rows: Vec<Vec<String>> = status
        .peers
        .iter()
        .map(|peer| {
            let mut row = vec![
                peer.name.clone(),
                peer.addr.clone(),
                cell(peer.congestion.as_ref()),
            ];
            match &peer.pool {
                None => {
                    row.extend(std::iter::repeat_n("-".to_owned(), 11));
                    row.push("pooling off".to_owned());
                }
                Some(pool) => {
                    row.extend(
                        [
                            pool.level,
                            pool.in_flight,
                            pool.low,
                            pool.high,
                            pool.taken,
                            pool.refilled,
                            pool.misses,
                            pool.dead,
                            pool.expired,
                            pool.dial_failures,
                        ]
                        .map(|n| n.to_string()),
                    );
                    row.push(number(pool.idle_seconds));
                    row.push(cell(pool.last_error.as_ref()));
                }
            }
            row
        })
        .collect();
    if rows.is_empty() {
        return "no peers configured\n".to_owned();
    }
    table(
        &[
            "PEER",
            "ADDR",
            "CC",
            "LEVEL",
            "IN-FLIGHT",
            "LOW",
            "HIGH",
            "TAKEN",
            "REFILLED",
            "MISSES",
            "DEAD",
            "EXPIRED",
            "DIAL-FAIL",
            "IDLE-S",
            "LAST-ERROR",
        ],
        &rows,
    )
}

fn render_routes(status: &api::Status) -> String {
    let peer_addr = |name: &str| {
        status
            .peers
            .iter()
            .find(|peer| peer.name == name)
            .map(|peer| peer.addr.clone())
    };
    let rows: Vec<Vec<String>> = status
        .routes
        .iter()
        .map(|route| {
            let next_hop = if route.via == "direct" {
                "the destination itself".to_owned()
            } else {
                peer_addr(&route.via).unwrap_or_else(|| "-".to_owned())
            };
            vec![route.dst.clone(), route.via.clone(), next_hop]
        })
        .collect();
    if rows.is_empty() {
        return "no routes: every connection is refused\n".to_owned();
    }
    table(&["DESTINATION", "VIA", "NEXT HOP"], &rows)
}

fn render_connections(document: &api::Connections) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "total: {}", document.total);
    for (title, counts) in [
        ("by state", &document.by_state),
        ("by mode", &document.by_mode),
    ] {
        // Older relays send no `by_mode`.
        if !counts.is_empty() {
            let parts: Vec<String> = counts
                .iter()
                .map(|(name, count)| format!("{name} {count}"))
                .collect();
            let _ = writeln!(out, "{title}: {}", parts.join(", "));
        }
    }
    let rows: Vec<Vec<String>> = document
        .sample
        .iter()
        .map(|c| {
            vec![
                c.id.clone(),
                c.mode.clone(),
                c.state.clone(),
                c.client.clone(),
                c.dst.clone(),
                cell(c.via.as_ref()),
                uptime(c.age_seconds),
                cell(c.bytes_to_server),
                cell(c.bytes_to_client),
            ]
        })
        .collect();
    if !rows.is_empty() {
        out.push('\n');
        out.push_str(&table(
            &[
                "ID",
                "MODE",
                "STATE",
                "CLIENT",
                "DESTINATION",
                "VIA",
                "AGE",
                "TO-SERVER",
                "TO-CLIENT",
            ],
            &rows,
        ));
    }
    out
}

fn render_params(params: &[api::Param]) -> String {
    let rows: Vec<Vec<String>> = params
        .iter()
        .map(|p| {
            let range = match &p.kind {
                api::ParamKind::Int { min, max } => format!("int {min}..={max}"),
                api::ParamKind::Duration { min, max } => format!("duration {min}..={max}"),
                api::ParamKind::Choice { choices } => list(choices),
                api::ParamKind::Bool => "bool".to_owned(),
                api::ParamKind::Text { .. } => "text".to_owned(),
                api::ParamKind::Unknown => "-".to_owned(),
            };
            vec![
                p.name.clone(),
                p.value.to_string(),
                range,
                p.description.clone(),
            ]
        })
        .collect();
    if rows.is_empty() {
        return "this relay has no live-tunable parameters\n".to_owned();
    }
    table(&["NAME", "VALUE", "TYPE", "DESCRIPTION"], &rows)
}

fn render_changes(document: &api::ParamsChanged) -> String {
    if document.changed.is_empty() {
        return "nothing changed: every parameter already had its value\n".to_owned();
    }
    document
        .changed
        .iter()
        .map(|c| format!("{}: {} -> {}\n", c.name, c.old, c.new))
        .collect()
}

/// What a reload changed, one `KEY: OLD -> NEW` line each, then what only a
/// restart applies.
fn render_reload(document: &api::Reload) -> String {
    let mut out = String::new();
    if document.changed.is_empty() {
        out.push_str("reloaded: nothing changed\n");
    } else {
        let _ = writeln!(out, "reloaded: {} change(s)", document.changed.len());
        for c in &document.changed {
            let _ = writeln!(out, "  {}: {} -> {}", c.key, c.old, c.new);
        }
    }
    if !document.needs_restart.is_empty() {
        let _ = writeln!(
            out,
            "not applied, need a restart: {} (the old values stay in effect)",
            document.needs_restart.join(", ")
        );
    }
    out
}

fn render_drain(document: &api::Drain) -> String {
    format!(
        "draining: {}\nopen_connections: {}\n",
        on_off(document.draining),
        document.open_connections
    )
}

fn list(items: &[impl std::fmt::Display]) -> String {
    if items.is_empty() {
        "-".to_owned()
    } else {
        items
            .iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }
}

fn indent(text: &str) -> String {
    text.lines().map(|line| format!("  {line}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use splitway_control::{
        AdminHandler, ParamChange, ParamError, ParamInfo, ParamRegistry, ParamUpdate, ParamValue,
    };

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        ctl: CtlArgs,
    }

    /// A fixture: JSON text in the API's wire format.
    fn parse<T: serde::de::DeserializeOwned>(document: &str) -> T {
        serde_json::from_str(document).expect("fixture in the API's shape")
    }

    /// The shape `GET /status` has today (relay.rs).
    fn sample_status() -> api::Status {
        parse(
            r#"{
            "name": "rc",
            "version": "0.1.0",
            "uptime_seconds": 7390.5,
            "learned_windows": {
                "events": {"jumps": 12, "rtt_mismatches": 1, "validated": 10, "retreats": 2, "saved": 30},
                "peers": [
                    {"addr": "10.0.12.2", "peer": "rs", "cwnd_segments": 2900, "bdp_segments": 1450,
                     "jump_segments": 1450, "min_rtt_ms": 215.25,
                     "age_s": 12.4, "capacity_estimate": true, "current": true},
                    {"addr": "10.0.9.1", "peer": null, "cwnd_segments": 40, "bdp_segments": 0,
                     "jump_segments": 20, "min_rtt_ms": 30.0,
                     "age_s": 700.0, "capacity_estimate": false, "current": false}]
            },
            "listeners": [
                {"mode": "tproxy", "addr": "0.0.0.0:7000",
                 "intercept": {"interfaces": ["eth0"], "ports": [80, 443]}},
                {"mode": "socks5", "addr": "127.0.0.1:1080", "intercept": null}
            ],
            "peers": [
                {"name": "rs", "addr": "10.0.12.2:7100", "congestion": "bbr",
                 "pool": {"level": 14, "in_flight": 2, "low": 4, "high": 16, "idle_seconds": 30.0,
                          "taken": 1200, "refilled": 1214, "dead": 1, "expired": 30,
                          "misses": 3, "dial_failures": 0, "last_error": null}},
                {"name": "rt", "addr": "10.0.13.2:7100", "congestion": null, "pool": null}
            ],
            "routes": [
                {"dst": "10.0.3.0/24", "via": "rs"},
                {"dst": "0.0.0.0/0", "via": "direct"}
            ],
            "early_syn": {"pending": 1, "budget": 1024, "started": 50, "hits": 48,
                          "misses": 2, "duplicates": 5, "over_budget": 0, "expired": 1},
            "accel": {
                "early_syn": {"requested": "auto", "state": "active", "reason": "BPF SYN detector attached on eth0"},
                "tfo_client": {"requested": "auto", "state": "unavailable", "reason": "net.ipv4.tcp_fastopen = 1 lacks the server bit (2)"}
            },
            "features": {"data_path": "auto", "early_syn": true, "pool": true, "tfo": false,
                         "turbo_start": {"initcwnd": 64, "initrwnd": 64, "buffer": 8388608, "routes": []}},
            "connections_active": {"tproxy": 3, "socks5": 1, "http_connect": 0, "peer": 0}
        }"#,
        )
    }

    #[test]
    fn pools_table_has_one_aligned_row_per_peer() {
        let rendered = render_pools(&sample_status());
        let lines: Vec<&str> = rendered.lines().collect();
        assert_eq!(lines.len(), 3, "{rendered}");
        assert!(lines[0].starts_with("PEER  ADDR            CC   LEVEL  IN-FLIGHT  LOW  HIGH"));
        assert!(
            lines[1].starts_with("rs    10.0.12.2:7100  bbr     14          2    4    16"),
            "{rendered}"
        );
        assert!(
            lines[2].starts_with("rt    10.0.13.2:7100  -"),
            "{rendered}"
        );
        assert!(lines[2].ends_with("pooling off"), "{rendered}");
        // Columns line up: every row puts LEVEL's last digit at the header's end.
        let level_end = lines[0].find("LEVEL").unwrap() + "LEVEL".len();
        assert_eq!(&lines[1][level_end - 2..level_end], "14");
        assert_eq!(&lines[2][level_end - 1..level_end], "-");
    }

    #[test]
    fn routes_table_names_the_next_hop() {
        assert_eq!(
            render_routes(&sample_status()),
            "DESTINATION  VIA     NEXT HOP\n\
             10.0.3.0/24  rs      10.0.12.2:7100\n\
             0.0.0.0/0    direct  the destination itself\n"
        );
        assert_eq!(
            render_routes(&parse(r#"{"routes": []}"#)),
            "no routes: every connection is refused\n"
        );
    }

    #[test]
    fn status_summarises_features_connections_and_listeners() {
        let rendered = render_status(&sample_status());
        for expected in [
            "relay rc  (splitway 0.1.0)  up 2h 03m 10s",
            "features: data path auto, early SYN on, pool on, TFO off, turbo-start initcwnd 64 initrwnd 64",
            "  early_syn   active       auto  BPF SYN detector attached on eth0",
            "  tfo_client  unavailable  auto  net.ipv4.tcp_fastopen = 1 lacks the server bit (2)",
            "active connections: 4 (tproxy 3, socks5 1, http_connect 0, peer 0)",
            "early SYN: 1 pending of 1024 budget; started 50, hits 48",
            "  tproxy  0.0.0.0:7000    eth0 ports 80,443",
            "  socks5  127.0.0.1:1080  -",
            "2 peer(s), 2 route(s)",
            "learned windows (host-wide): jumps 12, validated 10, retreats 2, RTT mismatches 1, saved 30",
            "  10.0.12.2 (rs): jump 1450 seg (BDP 1450, cwnd 2900), 215.2 ms, 12 s ago\n",
            "  10.0.9.1 (upstream relay): jump 20 seg (BDP 0, cwnd 40), 30.0 ms, 700 s ago, growing, expired",
        ] {
            assert!(
                rendered.contains(expected),
                "missing {expected:?} in:\n{rendered}"
            );
        }
    }

    #[test]
    fn connections_params_and_changes_render() {
        let connections = render_connections(&parse(
            r#"{
            "total": 2,
            "by_state": {"connecting": 1, "forwarding": 1},
            "sample": [{"id": "7", "mode": "tproxy", "state": "forwarding", "client": "10.0.1.1:5000",
                        "dst": "10.0.3.2:80", "via": "rs", "age_seconds": 65.0,
                        "bytes_to_server": 120, "bytes_to_client": 1048576}]
        }"#,
        ));
        assert!(connections.contains("by state: connecting 1, forwarding 1"));
        assert!(
            connections.contains("7  tproxy  forwarding  10.0.1.1:5000  10.0.3.2:80  rs   1m 05s")
        );

        let params = render_params(&parse::<Vec<_>>(
            r#"[
            {"name": "pool.rs.low", "value": 4, "kind": {"type": "int", "min": 0, "max": 4096},
             "description": "refill below this"},
            {"name": "log.level", "value": "info",
             "kind": {"type": "choice", "choices": ["error", "info"]}, "description": "verbosity"}
        ]"#,
        ));
        assert!(
            params.contains("pool.rs.low  4      int 0..=4096  refill below this"),
            "{params}"
        );
        assert!(
            params.contains("log.level    info   error,info"),
            "{params}"
        );

        assert_eq!(
            render_changes(&parse(
                r#"{"changed": [{"name": "early_syn", "old": false, "new": true}]}"#
            )),
            "early_syn: off -> on\n"
        );
    }

    #[test]
    fn reload_lists_changes_and_what_needs_a_restart() {
        let rendered = render_reload(&parse(
            r#"{
            "reloaded": true,
            "generation": 3,
            "changed": [
                {"key": "route.10.9.0.0/16", "old": "(none)", "new": "rs"},
                {"key": "limits.per_client", "old": "0", "new": "8"}
            ],
            "needs_restart": ["listen.0.0.0.0:7000", "name"]
        }"#,
        ));
        assert_eq!(
            rendered,
            "reloaded: 2 change(s)\n\
             \x20 route.10.9.0.0/16: (none) -> rs\n\
             \x20 limits.per_client: 0 -> 8\n\
             not applied, need a restart: listen.0.0.0.0:7000, name (the old values stay in effect)\n"
        );
        assert_eq!(
            render_reload(&parse(r#"{"changed": [], "needs_restart": []}"#)),
            "reloaded: nothing changed\n"
        );
    }

    #[test]
    fn set_pairs_become_a_typed_json_object() {
        let words = |list: &[&str]| list.iter().map(|w| w.to_string()).collect::<Vec<_>>();
        assert_eq!(
            set_body(&words(&[
                "pool.rs.low",
                "8",
                "early_syn",
                "true",
                "timeouts.idle",
                "5m"
            ]))
            .unwrap(),
            api::ParamsUpdate::from([
                ("early_syn".into(), api::ParamValue::Bool(true)),
                ("pool.rs.low".into(), api::ParamValue::Int(8)),
                ("timeouts.idle".into(), api::ParamValue::Text("5m".into())),
            ])
        );
        assert!(
            set_body(&words(&["a", "1", "b"]))
                .unwrap_err()
                .contains("`b` has no value")
        );
        assert!(
            set_body(&words(&["a", "1", "a", "2"]))
                .unwrap_err()
                .contains("twice")
        );
    }

    #[test]
    fn failures_list_each_error() {
        let answer = Answer {
            status: 400,
            content_type: None,
            body: Vec::new(),
        };
        let rendered = render_failure(
            &answer,
            &parse(
                r#"{"error": "invalid parameters, nothing changed", "status": 400,
                    "errors": [{"param": "pool.rx.low", "message": "unknown parameter"}]}"#,
            ),
        );
        assert_eq!(
            rendered,
            "splitway ctl: relay answered 400: invalid parameters, nothing changed\n  pool.rx.low: unknown parameter\n"
        );
    }

    fn ctl(args: &[&str]) -> Outcome {
        let cli = Cli::try_parse_from(std::iter::once("ctl").chain(args.iter().copied())).unwrap();
        execute(&cli.ctl).unwrap()
    }

    #[test]
    fn unreachable_relay_exits_2_with_one_clear_line() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let outcome = ctl(&["--admin", &format!("127.0.0.1:{port}"), "status"]);
        assert_eq!(outcome.code, EXIT_UNREACHABLE);
        assert_eq!(
            outcome.stderr,
            format!(
                "splitway ctl: cannot reach the relay's admin API at 127.0.0.1:{port}: connection refused — is `splitway relay` running, and is `admin` set to this address?\n"
            )
        );
        assert!(outcome.stdout.is_empty());
    }

    /// A relay stand-in with two parameters, served by the real admin server.
    struct TunableRelay(ParamRegistry);

    impl AdminHandler for TunableRelay {
        fn status(&self) -> api::Status {
            sample_status()
        }
        fn params(&self) -> Vec<ParamInfo> {
            self.0.infos()
        }
        fn set_params(&self, updates: &[ParamUpdate]) -> Result<Vec<ParamChange>, Vec<ParamError>> {
            self.0.update(updates, |_| Vec::new())
        }
    }

    #[test]
    fn commands_work_against_the_real_admin_server() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime
            .block_on(splitway_control::bind("127.0.0.1:0".parse().unwrap()))
            .unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let registry = ParamRegistry::with([
            (splitway_relay::pool::param_low("rs"), ParamValue::Int(4)),
            (splitway_relay::early_syn::param(), ParamValue::Bool(true)),
        ])
        .unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = runtime.spawn(splitway_control::serve(
            listener,
            std::sync::Arc::new(splitway_control::Metrics::new()),
            std::sync::Arc::new(TunableRelay(registry)),
            async move {
                let _ = stopped.await;
            },
        ));
        // The server runs on a runtime thread while ctl blocks this one.
        let thread = std::thread::spawn(move || runtime.block_on(server));

        let routes = ctl(&["-a", &addr, "routes"]);
        assert_eq!(routes.code, 0, "{routes:?}");
        assert!(routes.stdout.starts_with("DESTINATION  VIA"), "{routes:?}");

        let set = ctl(&["-a", &addr, "set", "pool.rs.low", "9", "early_syn", "off"]);
        assert_eq!(set.code, 0, "{set:?}");
        assert_eq!(set.stdout, "early_syn: on -> off\npool.rs.low: 4 -> 9\n");

        let refused = ctl(&[
            "-a",
            &addr,
            "set",
            "pool.rs.low",
            "99999",
            "pool.rx.low",
            "1",
        ]);
        assert_eq!(refused.code, EXIT_REFUSED);
        assert_eq!(
            refused.stderr,
            "splitway ctl: relay answered 400: invalid parameters, nothing changed\n  pool.rs.low: 99999 is outside 0..=4096\n  pool.rx.low: unknown parameter (`splitway ctl params` lists them)\n"
        );

        let params = ctl(&["-a", &addr, "--json", "params"]);
        let listed: Vec<api::Param> = serde_json::from_str(&params.stdout).unwrap();
        assert_eq!(listed[1].name, "pool.rs.low");
        assert_eq!(listed[1].value, api::ParamValue::Int(9), "{listed:?}");

        let drain = ctl(&["-a", &addr, "drain"]);
        assert_eq!(drain.code, EXIT_REFUSED);
        assert!(drain.stderr.contains("501"), "{drain:?}");

        let metrics = ctl(&["-a", &addr, "metrics"]);
        assert!(metrics.stdout.ends_with("# EOF\n"));

        stop.send(()).unwrap();
        thread.join().unwrap().unwrap().unwrap();
    }

    #[test]
    fn arguments_parse_with_defaults() {
        let cli = Cli::try_parse_from(["ctl", "set", "early_syn", "on", "--json"]).unwrap();
        assert_eq!(cli.ctl.admin, DEFAULT_ADMIN_ADDR);
        assert!(cli.ctl.json);
        assert!(matches!(cli.ctl.command, CtlCommand::Set { ref pairs } if pairs.len() == 2));
        assert!(Cli::try_parse_from(["ctl", "set", "early_syn"]).is_err());
        let cli =
            Cli::try_parse_from(["ctl", "-a", "10.0.0.1:9191", "connections", "--sample", "5"])
                .unwrap();
        assert!(matches!(
            cli.ctl.command,
            CtlCommand::Connections { sample: 5 }
        ));
    }
}
