//! What both servers share: the runtime, the metrics registry and the
//! `/status` document, so that only the HTTP layer differs.

use std::net::SocketAddr;
use std::sync::Arc;

use splitway_control::{Metrics, Mode};

/// `127.0.0.1:<first argument>`.
pub fn addr() -> SocketAddr {
    let port: u16 = std::env::args()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("usage: <bin> PORT");
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// The relay's runtime shape: a multi-thread runtime with two workers.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

pub fn metrics() -> Arc<Metrics> {
    let metrics = Arc::new(Metrics::new());
    metrics.accepted(Mode::Socks5);
    metrics
}

pub fn status() -> splitway_api::Status {
    splitway_api::Status {
        name: "proto".into(),
        version: "0".into(),
        ..Default::default()
    }
}
