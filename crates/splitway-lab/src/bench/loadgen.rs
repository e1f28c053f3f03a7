//! `splitway lab load`: the bench's backends and built-in generators on any
//! address, for the namespace benches (`scripts/bench/bench-growth.sh`) that put
//! splitway and HAProxy behind the same TPROXY rule. Each generator prints
//! one line of `key=value` pairs for the script to record.

use std::io::{self, BufRead};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use clap::Subcommand;

use super::BenchError;
use super::load::{self, Access, Backends};
use super::stats::percentile;

#[derive(Debug, Subcommand)]
pub enum LoadCommand {
    /// Serve the bench backends (sink, echo, one request per connection,
    /// holding idle connections) on `--bind` until killed.
    Serve {
        #[arg(long)]
        bind: IpAddr,
        #[arg(long, default_value_t = 9001)]
        sink: u16,
        #[arg(long, default_value_t = 9002)]
        echo: u16,
        #[arg(long, default_value_t = 9003)]
        conn: u16,
    },
    /// New connections to a one-request-per-connection backend at a fixed
    /// rate (open loop): prints the achieved rate, p50/p99/max setup
    /// latency in µs (connect to first response byte) and failures.
    Rate {
        #[arg(long)]
        target: SocketAddr,
        #[arg(long)]
        rate: f64,
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
    },
    /// Open `--count` connections (one request/response each) and hold them
    /// until standard input closes; prints `open=N` once all are up.
    Idle {
        #[arg(long)]
        target: SocketAddr,
        #[arg(long)]
        count: usize,
    },
}

pub fn run(command: LoadCommand) -> Result<(), BenchError> {
    match command {
        LoadCommand::Serve {
            bind,
            sink,
            echo,
            conn,
        } => {
            let backends =
                Backends::start_on(bind, sink, echo, conn).map_err(|source| BenchError::Io {
                    op: format!("bind the backends on {bind}"),
                    source,
                })?;
            println!(
                "sink={} echo={} conn={}",
                backends.sink, backends.echo, backends.conn
            );
            // Until killed: the script stops it with its namespace.
            loop {
                std::thread::park();
            }
        }
        LoadCommand::Rate {
            target,
            rate,
            seconds,
        } => {
            if !(rate > 0.0 && seconds > 0.0) {
                return Err(BenchError::Tool {
                    tool: "load rate".into(),
                    detail: "--rate and --seconds must be positive".into(),
                });
            }
            let (achieved, latencies, failures) = load::fixed_rate(
                Access::Plain(target),
                rate,
                Duration::from_secs_f64(seconds),
            );
            let p = |q| percentile(&latencies, q).map_or("nan".to_string(), |v| format!("{v:.1}"));
            println!(
                "rate={rate} achieved={achieved:.1} connections={} failures={failures} p50_us={} p99_us={} max_us={}",
                latencies.len(),
                p(50.0),
                p(99.0),
                p(100.0)
            );
            Ok(())
        }
        LoadCommand::Idle { target, count } => {
            let open =
                load::open_idle(Access::Plain(target), count).map_err(|e| BenchError::Tool {
                    tool: "load idle".into(),
                    detail: format!("opening {count} connections to {target}: {e}"),
                })?;
            println!("open={}", open.len());
            // Hold until the script closes our stdin.
            let mut line = String::new();
            while io::stdin()
                .lock()
                .read_line(&mut line)
                .map_err(|source| BenchError::Io {
                    op: "read stdin".into(),
                    source,
                })?
                > 0
            {
                line.clear();
            }
            drop(open);
            Ok(())
        }
    }
}
