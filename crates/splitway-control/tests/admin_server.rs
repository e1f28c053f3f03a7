//! The admin server over real loopback sockets.

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use prometheus_parse::{LineInfo, Scrape, Value};
use splitway_control::{
    AdminConfig, ControlError, Metrics, OPENMETRICS_CONTENT_TYPE, StatusProvider, bind,
    serve_with_config,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};

/// Upper bound for anything that should happen promptly; only reached when a
/// test is failing, so the suite fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(10);

struct Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), ControlError>>,
}

impl Server {
    async fn start(config: AdminConfig, status: Arc<dyn StatusProvider>) -> Self {
        Self::start_with(config, status, Arc::new(Metrics::new())).await
    }

    async fn start_with(
        config: AdminConfig,
        status: Arc<dyn StatusProvider>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = async move {
            // A dropped sender also means stop.
            let _ = stopped.await;
        };
        let task = tokio::spawn(serve_with_config(
            listener, metrics, status, config, shutdown,
        ));
        Self {
            addr,
            stop: Some(stop),
            task,
        }
    }

    async fn with_defaults() -> Self {
        Self::start(
            AdminConfig::default(),
            Arc::new(splitway_api::Status::default),
        )
        .await
    }

    async fn stop(mut self) -> Result<(), ControlError> {
        self.stop.take().unwrap().send(()).unwrap();
        timeout(PATIENCE, self.task)
            .await
            .expect("server did not stop")
            .expect("server task panicked")
    }
}

#[derive(Debug)]
struct HttpResponse {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl HttpResponse {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    fn json<T: serde::de::DeserializeOwned>(&self) -> T {
        assert_eq!(self.header("content-type"), Some("application/json"));
        serde_json::from_str(&self.body).unwrap()
    }

    /// The error answer's `status`, which repeats the HTTP one.
    fn error_status(&self) -> u16 {
        self.json::<splitway_api::ErrorBody>().status
    }
}

fn parse_response(raw: &[u8]) -> HttpResponse {
    let raw = std::str::from_utf8(raw).expect("response is UTF-8");
    let (head, body) = raw.split_once("\r\n\r\n").expect("response has a head");
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap();
    let mut parts = status_line.splitn(3, ' ');
    assert_eq!(parts.next(), Some("HTTP/1.1"));
    let status = parts.next().unwrap().parse().unwrap();
    let headers = lines
        .map(|line| {
            let (name, value) = line.split_once(": ").expect("header line");
            (name.to_owned(), value.to_owned())
        })
        .collect();
    HttpResponse {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// Sends `raw` on a fresh connection and reads the answer to EOF.
async fn exchange(addr: SocketAddr, raw: &[u8]) -> HttpResponse {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(raw).await.unwrap();
    let mut answer = Vec::new();
    timeout(PATIENCE, stream.read_to_end(&mut answer))
        .await
        .expect("server did not close")
        .unwrap();
    let response = parse_response(&answer);
    assert_eq!(response.header("connection"), Some("close"));
    response
}

async fn get(addr: SocketAddr, path: &str) -> HttpResponse {
    get_with(addr, path, "").await
}

/// `GET path` with `headers` (each ending in CRLF) added.
async fn get_with(addr: SocketAddr, path: &str, headers: &str) -> HttpResponse {
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\n{headers}\r\n");
    let response = exchange(addr, request.as_bytes()).await;
    let length: usize = response.header("content-length").unwrap().parse().unwrap();
    assert_eq!(length, response.body.len());
    response
}

/// Value of the sample `name{labels}`; exactly one must exist.
fn sample(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    let matching: Vec<_> = scrape
        .samples
        .iter()
        .filter(|sample| {
            sample.metric == name
                && sample.labels.len() == labels.len()
                && labels
                    .iter()
                    .all(|(key, value)| sample.labels.get(key) == Some(*value))
        })
        .collect();
    assert_eq!(
        matching.len(),
        1,
        "samples for {name}{labels:?}: {matching:?}"
    );
    match &matching[0].value {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
        other => panic!("{name} is not a scalar: {other:?}"),
    }
}

/// Cumulative bucket counts of histogram `name{labels}` as (le, count).
fn buckets(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> Vec<(f64, f64)> {
    let histogram = scrape
        .samples
        .iter()
        .find(|sample| {
            sample.metric == name
                && labels
                    .iter()
                    .all(|(key, value)| sample.labels.get(key) == Some(*value))
        })
        .unwrap_or_else(|| panic!("no histogram {name}{labels:?}"));
    match &histogram.value {
        Value::Histogram(counts) => counts.iter().map(|c| (c.less_than, c.count)).collect(),
        other => panic!("{name} is not a histogram: {other:?}"),
    }
}

splitway_control::label_enum! {
    label "side";
    /// A label of the test's own family.
    pub enum Side {
        Left => "left",
        Right => "right",
    }
}

/// What the relay's families look like, declared by the test (the relay's
/// own are pinned in splitway-relay): an enum-labelled counter and a
/// histogram with a unit, beside the process's and the build's series.
#[tokio::test]
async fn metrics_endpoint_exports_what_was_counted() {
    use prometheus_client::metrics::histogram::Histogram;
    use prometheus_client::registry::Unit;
    use splitway_control::metrics::kit::EnumCounter;

    let mut builder = Metrics::builder();
    let sides: EnumCounter<Side> = EnumCounter::register(builder.registry(), "sides", "Sides seen");
    let wait = Histogram::new([0.001, 0.01, 0.1]);
    builder
        .registry()
        .register_with_unit("wait", "Time waited", Unit::Seconds, wait.clone());
    let server = Server::start_with(
        AdminConfig::default(),
        Arc::new(splitway_api::Status::default),
        Arc::new(builder.build()),
    )
    .await;
    for _ in 0..3 {
        sides.inc(Side::Right);
    }
    wait.observe(0.0003);
    wait.observe(0.05);

    // Prometheus's own Accept (OpenMetrics first); without one, the text
    // format (below).
    let prometheus_accept = "Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1\r\n";
    let response = get_with(server.addr, "/metrics", prometheus_accept).await;
    assert_eq!(response.status, 200);
    assert_eq!(
        response.header("content-type"),
        Some(OPENMETRICS_CONTENT_TYPE)
    );
    let plain = get(server.addr, "/metrics").await;
    assert_eq!(
        plain.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    assert!(!plain.body.contains("# EOF"), "{}", plain.body);
    let plain_scrape = Scrape::parse(plain.body.lines().map(|line| Ok(line.to_owned()))).unwrap();
    assert_eq!(
        sample(&plain_scrape, "splitway_sides_total", &[("side", "right")]),
        3.0
    );
    assert!(
        response.body.ends_with("# EOF\n"),
        "OpenMetrics body without EOF"
    );
    for line in response.body.lines() {
        let understood = !matches!(LineInfo::parse(line), LineInfo::Ignored)
            || line == "# EOF"
            || line.starts_with("# UNIT ");
        assert!(understood, "parser does not understand line {line:?}");
    }
    let scrape = Scrape::parse(response.body.lines().map(|line| Ok(line.to_owned()))).unwrap();
    assert_eq!(
        sample(&scrape, "splitway_sides_total", &[("side", "right")]),
        3.0
    );
    assert_eq!(
        sample(&scrape, "splitway_sides_total", &[("side", "left")]),
        0.0
    );
    assert_eq!(sample(&scrape, "splitway_wait_seconds_count", &[]), 2.0);
    let counts = buckets(&scrape, "splitway_wait_seconds", &[]);
    assert_eq!(
        counts,
        [(0.001, 1.0), (0.01, 1.0), (0.1, 2.0), (f64::INFINITY, 2.0)]
    );
    assert!(
        response
            .body
            .contains("# UNIT splitway_wait_seconds seconds\n")
    );
    assert!(response.body.contains("splitway_build_info{"));

    server.stop().await.unwrap();
}

#[tokio::test]
async fn head_metrics_sends_headers_only() {
    let server = Server::with_defaults().await;
    // The process metrics (CPU time, RSS) may change between two scrapes
    // and with them the length by a digit: the lengths must agree on some
    // pair of scrapes taken back to back.
    let mut lengths = Vec::new();
    for _ in 0..10 {
        let full = get(server.addr, "/metrics").await;
        let head = exchange(server.addr, b"HEAD /metrics HTTP/1.1\r\n\r\n").await;
        assert_eq!(head.status, 200);
        assert_eq!(head.body, "");
        let announced = head.header("content-length").map(str::to_owned);
        if announced == Some(full.body.len().to_string()) {
            server.stop().await.unwrap();
            return;
        }
        lengths.push((announced, full.body.len()));
    }
    panic!("HEAD's Content-Length never matched GET's body: {lengths:?}");
}

/// A `/status` document that tells the calls of the provider apart.
fn status_document(call: usize) -> splitway_api::Status {
    splitway_api::Status {
        name: "running".into(),
        uptime_seconds: call as f64,
        listeners: vec![splitway_api::Listener {
            mode: "socks5".into(),
            addr: "127.0.0.1:1080".into(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

#[tokio::test]
async fn status_endpoint_serves_the_provider_document() {
    let calls = Arc::new(AtomicUsize::new(0));
    let provider_calls = Arc::clone(&calls);
    let status: Arc<dyn StatusProvider> = Arc::new(move || {
        let call = provider_calls.fetch_add(1, Ordering::SeqCst) + 1;
        status_document(call)
    });
    let server = Server::start(AdminConfig::default(), status).await;

    for expected_call in 1..=2 {
        let response = get(server.addr, "/status?verbose=1").await;
        assert_eq!(response.status, 200);
        assert_eq!(
            response.json::<splitway_api::Status>(),
            status_document(expected_call)
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    server.stop().await.unwrap();
}

#[tokio::test]
async fn unknown_paths_wrong_methods_and_garbage_get_json_errors() {
    let server = Server::with_defaults().await;

    let not_found = get(server.addr, "/metrics/extra").await;
    assert_eq!(not_found.status, 404);
    assert_eq!(not_found.error_status(), 404);
    assert_eq!(
        not_found.json::<splitway_api::ErrorBody>().error,
        "no such endpoint"
    );

    let wrong_method = exchange(
        server.addr,
        b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
    )
    .await;
    assert_eq!(wrong_method.status, 405);
    assert_eq!(wrong_method.header("allow"), Some("GET, HEAD"));
    assert_eq!(wrong_method.error_status(), 405);

    let put_status = exchange(server.addr, b"PUT /status HTTP/1.1\r\n\r\n").await;
    assert_eq!(put_status.status, 405);

    for garbage in [
        &b"GARBAGE\r\n\r\n"[..],
        b"GET /metrics HTTP/1.1\r\nBroken header\r\n\r\n",
        b"GET metrics HTTP/1.1\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", // TLS ClientHello-ish
    ] {
        let response = exchange(server.addr, garbage).await;
        assert_eq!(response.status, 400, "for {garbage:?}");
        assert_eq!(response.error_status(), 400);
    }

    // Half-closed mid-head: still answered.
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHo")
        .await
        .unwrap();
    stream.shutdown().await.unwrap();
    let mut answer = Vec::new();
    timeout(PATIENCE, stream.read_to_end(&mut answer))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(parse_response(&answer).status, 400);

    server.stop().await.unwrap();
}

#[tokio::test]
async fn oversized_head_gets_431() {
    let server = Server::with_defaults().await;
    let mut request = b"GET /metrics HTTP/1.1\r\nX-Padding: ".to_vec();
    request.resize(9 * 1024, b'a');
    let response = exchange(server.addr, &request).await;
    assert_eq!(response.status, 431);
    assert_eq!(response.error_status(), 431);

    // Exactly at the limit is still fine.
    let mut request = b"GET /status HTTP/1.1\r\nX-Padding: ".to_vec();
    request.resize(8 * 1024 - 4, b'a');
    request.extend_from_slice(b"\r\n\r\n");
    assert_eq!(request.len(), 8 * 1024);
    assert_eq!(exchange(server.addr, &request).await.status, 200);
    server.stop().await.unwrap();
}

/// Sends half a request and returns a task that reads the server's answer and
/// reports (answer, when the server closed).
async fn slowloris(addr: SocketAddr) -> (Instant, JoinHandle<(Vec<u8>, Instant)>) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: sl")
        .await
        .unwrap();
    let sent = Instant::now();
    let reader = tokio::spawn(async move {
        let mut answer = Vec::new();
        timeout(PATIENCE, stream.read_to_end(&mut answer))
            .await
            .expect("slowloris client never cut off")
            .expect("slowloris read failed");
        (answer, Instant::now())
    });
    (sent, reader)
}

/// A metrics-only address (`metrics = ...` in a relay's config) answers
/// `GET /metrics` and nothing of the admin API: no status, no changes.
#[tokio::test]
async fn a_metrics_only_address_serves_metrics_and_nothing_else() {
    let config = AdminConfig {
        metrics_only: true,
        ..AdminConfig::default()
    };
    let server = Server::start(config, Arc::new(splitway_api::Status::default)).await;
    let metrics = get(server.addr, "/metrics").await;
    assert_eq!(metrics.status, 200);
    for path in ["/status", "/connections", "/routes", "/params"] {
        assert_eq!(get(server.addr, path).await.status, 404, "{path}");
    }
}

#[tokio::test]
async fn slowloris_is_cut_off_without_blocking_others() {
    let read_timeout = Duration::from_millis(500);
    let config = AdminConfig {
        read_timeout,
        ..AdminConfig::default()
    };
    let server = Server::start(config, Arc::new(splitway_api::Status::default)).await;

    let mut stalled = Vec::new();
    for _ in 0..3 {
        stalled.push(slowloris(server.addr).await);
    }
    for _ in 0..5 {
        assert_eq!(get(server.addr, "/status").await.status, 200);
        assert_eq!(get(server.addr, "/metrics").await.status, 200);
    }
    let others_done = Instant::now();

    for (sent, reader) in stalled {
        let (answer, cut_off) = reader.await.unwrap();
        let response = parse_response(&answer);
        assert_eq!(response.status, 408);
        assert_eq!(response.error_status(), 408);
        assert!(
            cut_off.duration_since(sent) >= read_timeout,
            "cut off after {:?}, before the {read_timeout:?} timeout",
            cut_off.duration_since(sent)
        );
        assert!(
            others_done < cut_off,
            "other requests finished only after the slowloris clients were cut off"
        );
    }
    server.stop().await.unwrap();
}

#[tokio::test]
async fn connection_limit_queues_excess_clients() {
    let config = AdminConfig {
        read_timeout: Duration::from_millis(300),
        max_connections: 1,
        ..AdminConfig::default()
    };
    let server = Server::start(config, Arc::new(splitway_api::Status::default)).await;

    let (_, stalled) = slowloris(server.addr).await;
    // Served, but only once the only slot is freed by the timeout.
    let queued = get(server.addr, "/status").await;
    let served = Instant::now();
    assert_eq!(queued.status, 200);
    let (answer, cut_off) = stalled.await.unwrap();
    assert_eq!(parse_response(&answer).status, 408);
    assert!(
        served > cut_off,
        "second client was served while the slot was taken"
    );
    server.stop().await.unwrap();
}

#[tokio::test]
async fn shutdown_closes_listener_and_aborts_stalled_requests() {
    let config = AdminConfig {
        read_timeout: Duration::from_secs(60),
        ..AdminConfig::default()
    };
    let server = Server::start(config, Arc::new(splitway_api::Status::default)).await;
    let addr = server.addr;
    assert_eq!(get(addr, "/status").await.status, 200);

    let mut stalled = TcpStream::connect(addr).await.unwrap();
    stalled
        .write_all(b"GET /status HTTP/1.1\r\n")
        .await
        .unwrap();
    // The server has this connection once it answers a later one (one accept loop).
    assert_eq!(get(addr, "/status").await.status, 200);

    let started = Instant::now();
    server.stop().await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(60));

    // The stalled request was dropped, not answered after its 60 s timeout.
    let mut answer = Vec::new();
    let read = timeout(PATIENCE, stalled.read_to_end(&mut answer))
        .await
        .expect("stalled connection still open after shutdown");
    match read {
        Ok(_) => assert!(answer.is_empty(), "got an answer: {answer:?}"),
        Err(error) => assert_eq!(error.kind(), ErrorKind::ConnectionReset),
    }

    let error = TcpStream::connect(addr).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::ConnectionRefused);
}

#[tokio::test]
async fn bind_error_names_the_address() {
    let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = taken.local_addr().unwrap();
    let error = bind(addr).await.unwrap_err();
    assert!(error.to_string().contains(&addr.to_string()), "{error}");
    match error {
        ControlError::Bind {
            addr: reported,
            source,
        } => {
            assert_eq!(reported, addr);
            assert_eq!(source.kind(), ErrorKind::AddrInUse);
        }
        other => panic!("unexpected error {other:?}"),
    }
}
