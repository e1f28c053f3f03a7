//! The admin HTTP server.
//!
//! | request | answer |
//! | --- | --- |
//! | `GET /metrics` | OpenMetrics text if `Accept` asks for it, else Prometheus text |
//! | `GET /status` | [`AdminHandler::status`] |
//! | `GET /connections?sample=N` | [`AdminHandler::connections`] (N default 20, at most 1000) |
//! | `GET /routes` | [`AdminHandler::routes`] |
//! | `GET /params` | [`AdminHandler::params`]: `[{name, kind, description, value}]` |
//! | `PUT /params` | body `{"name": value, ...}`: `200 {"changed": [{name, old, new}]}` or `400 {"errors": [{param, message}]}`, nothing changed |
//! | `POST /drain` | [`AdminHandler::drain`] |
//! | `POST /reload` | [`AdminHandler::reload`]; `422 {"errors": [...]}` if the config is invalid |
//!
//! Unsupported operations answer `501`, refused ones `409`. Requests that
//! change something (`PUT`, `POST`) are refused with `403` when they carry an
//! `Origin` header, i.e. come from a browser.
//!
//! Hand-written HTTP/1.1, one request per connection (`Connection: close`):
//! the admin API is scraped every few seconds, so keep-alive buys nothing and
//! a smaller parser is a smaller attack surface. Every connection is bounded
//! in time (the whole request must arrive within [`AdminConfig::read_timeout`])
//! and in size, and at most [`AdminConfig::max_connections`] are served at
//! once; further connections wait in the kernel's accept queue.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use splitway_api as api;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tracing::{debug, error, info, warn};

use crate::error::ControlError;
use crate::http::{self, Limits, Request, RequestError, Response, Status};
use crate::metrics::{Metrics, OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE, accepts_openmetrics};
use crate::params::{self, ParamChange, ParamError, ParamInfo, ParamUpdate};

/// What the relay offers the admin API. Every method is called on the admin
/// server's task, once per request: keep them cheap and non-blocking (read
/// atomics or a snapshot, don't do I/O); start long work (a drain) and return.
///
/// Only [`AdminHandler::status`] is required; the other operations default
/// to [`AdminError::Unsupported`] (answered `501`) or to no parameters. Any
/// `Fn() -> splitway_api::Status` closure is a handler serving just `/status`.
/// Answers are the [`splitway_api`] types, which `splitway ctl` reads back.
pub trait AdminHandler: Send + Sync + 'static {
    /// The document served at `GET /status`.
    fn status(&self) -> api::Status;

    /// `GET /connections?sample=N`: counts by state and at most `sample`
    /// connections.
    fn connections(&self, sample: usize) -> Result<api::Connections, AdminError> {
        let _ = sample;
        Err(AdminError::Unsupported)
    }

    /// Called before `GET /metrics` is encoded: copies in what the relay
    /// only reads on demand (the kernel's learned-window counters).
    fn refresh_metrics(&self) {}

    /// `GET /routes`: each route's candidate next hops as measured (state,
    /// RTT, loss) and the current choice (`splitway ctl routes`).
    fn routes(&self) -> Result<api::RoutesView, AdminError> {
        Err(AdminError::Unsupported)
    }

    /// The live-tunable parameters and their current values (`GET /params`).
    /// The server validates `PUT /params` against these before calling
    /// [`AdminHandler::set_params`].
    fn params(&self) -> Vec<ParamInfo> {
        Vec::new()
    }

    /// Applies validated updates, all or nothing (`PUT /params`). Every
    /// update names a declared parameter and has a value of its kind within
    /// its range; refuse cross-parameter violations with errors naming the
    /// parameter. Returns the changes that took effect; the server logs each
    /// one (name, old, new) at info and returns them to the client.
    fn set_params(&self, updates: &[ParamUpdate]) -> Result<Vec<ParamChange>, Vec<ParamError>> {
        Err(updates
            .iter()
            .map(|update| ParamError::new(&update.name, "this relay has no tunable parameters"))
            .collect())
    }

    /// `POST /drain`: stop accepting new connections and let open ones
    /// finish. Returns at once with a document describing the drain.
    fn drain(&self) -> Result<api::Drain, AdminError> {
        Err(AdminError::Unsupported)
    }

    /// `POST /reload`: re-read the config file and apply what can change
    /// live. An invalid config changes nothing and is reported as
    /// [`AdminError::Invalid`] (one message per problem, each naming its key).
    fn reload(&self) -> Result<api::Reload, AdminError> {
        Err(AdminError::Unsupported)
    }
}

/// Any `Fn() -> splitway_api::Status` closure serves `/status` only.
impl<F> AdminHandler for F
where
    F: Fn() -> api::Status + Send + Sync + 'static,
{
    fn status(&self) -> api::Status {
        self()
    }
}

/// The former name of [`AdminHandler`], for handlers serving `/status` only.
pub use AdminHandler as StatusProvider;

/// Why an admin operation was not carried out.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AdminError {
    /// This relay does not offer the operation (`501`).
    #[error("not supported by this relay")]
    Unsupported,
    /// The operation conflicts with the relay's state, e.g. a drain is
    /// already under way (`409`).
    #[error("{0}")]
    Refused(String),
    /// The input (the config file, for a reload) is invalid; nothing changed
    /// (`422`). Each message names its key.
    #[error("{} error(s), nothing changed", .0.len())]
    Invalid(Vec<String>),
}

/// Limits of the admin server. [`Default`] is what [`serve`] uses.
#[derive(Clone, Debug)]
pub struct AdminConfig {
    /// Deadline for receiving a whole request (head and body), and separately
    /// for writing the response. Default 5 s.
    pub read_timeout: Duration,
    /// Connections served at once; more wait in the accept queue. Default 64.
    pub max_connections: usize,
    /// Request line + headers ceiling; larger heads get 431. Default 8 KiB.
    pub max_head_bytes: usize,
    /// Request body ceiling; larger bodies get 413. Default 64 KiB.
    pub max_body_bytes: usize,
    /// Serve `GET /metrics` only; every other path is 404 (a metrics
    /// address a cluster's scraper reaches, apart from the admin API).
    pub metrics_only: bool,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            read_timeout: Duration::from_secs(5),
            max_connections: 64,
            max_head_bytes: 8 * 1024,
            max_body_bytes: 64 * 1024,
            metrics_only: false,
        }
    }
}

/// How long to drain a client after answering before closing, so unread
/// request bytes don't turn the close into an RST that destroys the answer.
const MAX_LINGER: Duration = Duration::from_secs(1);
/// Bytes drained at most while lingering.
const MAX_LINGER_BYTES: usize = 64 * 1024;
/// Pause after a transient accept failure (e.g. EMFILE) so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Binds the admin listener on `addr`.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ControlError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ControlError::Bind { addr, source })
}

/// Serves the admin API on `listener` with [`AdminConfig::default`] until
/// `shutdown` completes. See [`serve_with_config`].
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    handler: Arc<dyn AdminHandler>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ControlError> {
    serve_with_config(listener, metrics, handler, AdminConfig::default(), shutdown).await
}

/// Serves the admin API on `listener` until `shutdown` completes.
///
/// On shutdown the listener is closed and requests still in flight are
/// aborted; the function returns once they are gone. Errors of individual
/// clients are answered and logged, never returned: only a failure of the
/// listening socket itself ends the server early.
pub async fn serve_with_config(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    handler: Arc<dyn AdminHandler>,
    config: AdminConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ControlError> {
    run_server(listener, metrics, handler, config, shutdown).await
}

/// Binds the admin API on a unix socket at `path` (e.g.
/// `/run/splitway/admin.sock`), mode 0660: access is then controlled by the
/// file system instead of by whoever can reach a TCP port. A socket file
/// left by a relay that is gone is replaced; one a live relay still answers
/// on is not.
pub fn bind_unix(path: &Path) -> Result<UnixListener, ControlError> {
    let bind_error = |source| ControlError::BindUnix {
        path: path.to_owned(),
        source,
    };
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(bind_error(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "a file that is not a socket is in the way",
            )));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(bind_error(io::Error::new(
                io::ErrorKind::AddrInUse,
                "another process is serving on this socket",
            )));
        }
        std::fs::remove_file(path).map_err(bind_error)?;
    }
    let listener = UnixListener::bind(path).map_err(bind_error)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)).map_err(bind_error)?;
    Ok(listener)
}

/// [`serve`] on a unix socket from [`bind_unix`]. The socket file is left in
/// place; the next [`bind_unix`] replaces it.
pub async fn serve_unix(
    listener: UnixListener,
    metrics: Arc<Metrics>,
    handler: Arc<dyn AdminHandler>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ControlError> {
    run_server(listener, metrics, handler, AdminConfig::default(), shutdown).await
}

/// A listening socket the admin server accepts from.
trait AdminListener: Send {
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// The next connection and a description of the client for logs.
    fn accept_client(&self) -> impl Future<Output = io::Result<(Self::Stream, String)>> + Send;
    /// The local address, for errors (TCP only).
    fn local_socket_addr(&self) -> Option<SocketAddr>;
}

impl AdminListener for TcpListener {
    type Stream = tokio::net::TcpStream;
    async fn accept_client(&self) -> io::Result<(Self::Stream, String)> {
        let (stream, peer) = self.accept().await?;
        Ok((stream, peer.to_string()))
    }
    fn local_socket_addr(&self) -> Option<SocketAddr> {
        self.local_addr().ok()
    }
}

impl AdminListener for UnixListener {
    type Stream = tokio::net::UnixStream;
    async fn accept_client(&self) -> io::Result<(Self::Stream, String)> {
        let (stream, _) = self.accept().await?;
        Ok((stream, "unix socket".to_owned()))
    }
    fn local_socket_addr(&self) -> Option<SocketAddr> {
        None
    }
}

async fn run_server<L: AdminListener>(
    listener: L,
    metrics: Arc<Metrics>,
    handler: Arc<dyn AdminHandler>,
    config: AdminConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ControlError> {
    let api = Arc::new(Api {
        metrics,
        handler,
        metrics_only: config.metrics_only,
    });
    let config = Arc::new(config);
    let slots = Arc::new(Semaphore::new(config.max_connections.max(1)));
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);

    loop {
        // Wait for a free slot first so excess clients queue in the kernel
        // instead of costing a task each.
        let accepted = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = async {
                let slot = Arc::clone(&slots)
                    .acquire_owned()
                    .await
                    .expect("the connection semaphore is never closed");
                (slot, listener.accept_client().await)
            } => accepted,
        };
        while let Some(finished) = connections.try_join_next() {
            log_connection_task_end(finished);
        }
        match accepted {
            (slot, Ok((stream, peer))) => {
                let api = Arc::clone(&api);
                let config = Arc::clone(&config);
                connections.spawn(async move {
                    let _slot = slot;
                    if let Err(error) = handle_connection(stream, &api, &config).await {
                        debug!(%peer, %error, "admin connection failed");
                    }
                });
            }
            (_slot, Err(error)) if is_transient_accept_error(&error) => {
                warn!(%error, "admin API: accept failed, retrying");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
            (_slot, Err(source)) => {
                connections.shutdown().await;
                return Err(ControlError::Accept {
                    addr: listener.local_socket_addr(),
                    source,
                });
            }
        }
    }

    drop(listener);
    connections.shutdown().await;
    Ok(())
}

fn log_connection_task_end(result: Result<(), tokio::task::JoinError>) {
    if let Err(join_error) = result {
        // Cancellation only happens at shutdown; a panic is a bug.
        if join_error.is_panic() {
            error!(error = %join_error, "admin connection handler panicked");
        }
    }
}

/// Whether an accept failure is about one connection or a momentary resource
/// shortage (EMFILE, ENOBUFS, ECONNABORTED, ...), so retrying makes sense.
/// Only errors saying the listening socket itself is unusable end the server.
fn is_transient_accept_error(error: &io::Error) -> bool {
    const EBADF: i32 = 9;
    const ENOTSOCK: i32 = 88;
    let listener_unusable = matches!(
        error.kind(),
        io::ErrorKind::InvalidInput | io::ErrorKind::Unsupported
    ) || matches!(error.raw_os_error(), Some(EBADF | ENOTSOCK));
    !listener_unusable
}

/// Reads one request, answers it, closes. `Err` is an I/O failure of the
/// client's connection (already unanswerable), for logging only.
async fn handle_connection<S>(mut stream: S, api: &Api, config: &AdminConfig) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let limits = Limits {
        max_head_bytes: config.max_head_bytes,
        max_body_bytes: config.max_body_bytes,
    };
    let read = tokio::time::timeout(config.read_timeout, http::read_request(&mut stream, limits));
    let (response, head_only) = match read.await {
        Ok(Ok(request)) => {
            let response = api.handle(&request);
            debug!(
                method = %request.method,
                path = %request.path,
                status = response.status.code(),
                "admin request"
            );
            (response, request.method == "HEAD")
        }
        Ok(Err(RequestError::Io(error))) => return Err(error),
        Ok(Err(error)) => match error.status() {
            Some(status) => {
                debug!(%error, "admin request rejected");
                (Response::error(status, &error.to_string()), false)
            }
            None => {
                debug!(%error, "admin connection ended");
                return Ok(());
            }
        },
        Err(_elapsed) => {
            debug!(
                timeout_ms = config.read_timeout.as_millis(),
                "admin client too slow, cutting it off"
            );
            let message = format!(
                "request not received within {} ms",
                config.read_timeout.as_millis()
            );
            (Response::error(Status::RequestTimeout, &message), false)
        }
    };

    let write = tokio::time::timeout(
        config.read_timeout,
        http::write_response(&mut stream, &response, head_only),
    );
    match write.await {
        Ok(result) => result?,
        Err(_elapsed) => {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "admin client did not read its response in time",
            ));
        }
    }
    stream.shutdown().await?;
    linger(&mut stream, config.read_timeout.min(MAX_LINGER)).await
}

/// Drains what the client still sends until it closes, for at most `limit`
/// time and [`MAX_LINGER_BYTES`].
async fn linger<S: AsyncRead + Unpin>(stream: &mut S, limit: Duration) -> io::Result<()> {
    let drain = async {
        let mut scratch = [0u8; 4096];
        let mut drained = 0;
        while drained < MAX_LINGER_BYTES {
            let n = stream.read(&mut scratch).await?;
            if n == 0 {
                break;
            }
            drained += n;
        }
        Ok(())
    };
    // Running out of linger time is normal: the answer has been sent.
    tokio::time::timeout(limit, drain).await.unwrap_or(Ok(()))
}

/// `GET /connections` sample size when the request names none.
pub const DEFAULT_CONNECTION_SAMPLE: usize = 20;
/// Largest `GET /connections` sample served; larger requests get this many.
pub const MAX_CONNECTION_SAMPLE: usize = 1000;

/// The routes.
struct Api {
    metrics: Arc<Metrics>,
    handler: Arc<dyn AdminHandler>,
    metrics_only: bool,
}

const ALLOW_GET: &str = "GET, HEAD";
const ALLOW_PARAMS: &str = "GET, HEAD, PUT";
const ALLOW_POST: &str = "POST";

impl Api {
    fn handle(&self, request: &Request) -> Response {
        let method = request.method.as_str();
        let is_get = matches!(method, "GET" | "HEAD");
        if self.metrics_only && request.path != "/metrics" {
            return Response::error(Status::NotFound, "this address serves /metrics only");
        }
        let allow = match request.path.as_str() {
            "/metrics" | "/status" | "/connections" | "/routes" => ALLOW_GET,
            "/params" => ALLOW_PARAMS,
            "/drain" | "/reload" => ALLOW_POST,
            _ => return Response::error(Status::NotFound, "no such endpoint"),
        };
        let is_change = matches!(method, "PUT" | "POST") && allow.contains(method);
        if !is_get && !is_change || is_get && allow == ALLOW_POST {
            return Response::error(Status::MethodNotAllowed, "method not allowed")
                .with_header("Allow", allow);
        }
        // Browsers send Origin on every PUT/POST, same-origin ones included:
        // refusing it stops a web page (cross-site or DNS-rebound) from
        // reconfiguring the relay through the operator's browser.
        if is_change && request.header("origin").is_some() {
            return Response::error(
                Status::Forbidden,
                "the admin API does not accept changes from browsers (Origin header present)",
            );
        }
        match (request.path.as_str(), is_get) {
            // What the client's Accept asks for; Prometheus's text format
            // for the rest (curl, older scrapers). The relay copies in what
            // it only reads on demand first.
            ("/metrics", _) if accepts_openmetrics(request.header("accept")) => {
                self.handler.refresh_metrics();
                Response::new(
                    Status::Ok,
                    OPENMETRICS_CONTENT_TYPE,
                    self.metrics.encode().into_bytes(),
                )
            }
            ("/metrics", _) => {
                self.handler.refresh_metrics();
                Response::new(
                    Status::Ok,
                    TEXT_CONTENT_TYPE,
                    self.metrics.encode_text().into_bytes(),
                )
            }
            ("/status", _) => Response::json(Status::Ok, &self.handler.status()),
            ("/connections", _) => match sample_size(request.query.as_deref()) {
                Ok(sample) => outcome(self.handler.connections(sample)),
                Err(message) => Response::error(Status::BadRequest, &message),
            },
            ("/routes", _) => outcome(self.handler.routes()),
            ("/params", true) => {
                let params: Vec<api::Param> =
                    self.handler.params().iter().map(ParamInfo::api).collect();
                Response::json(Status::Ok, &params)
            }
            ("/params", false) => self.set_params(request),
            ("/drain", _) => {
                let result = self.handler.drain();
                match &result {
                    Ok(_) => info!("admin API: drain requested"),
                    Err(error) => warn!(%error, "admin API: drain refused"),
                }
                outcome(result)
            }
            ("/reload", _) => {
                let result = self.handler.reload();
                match &result {
                    Ok(_) => info!("admin API: config reloaded"),
                    Err(AdminError::Invalid(errors)) => {
                        warn!(errors = %errors.join("; "), "admin API: reload refused, config invalid")
                    }
                    Err(error) => warn!(%error, "admin API: reload refused"),
                }
                outcome(result)
            }
            _ => Response::error(Status::NotFound, "no such endpoint"),
        }
    }

    /// `PUT /params`: a JSON object of name → value, validated against the
    /// declared parameters, then applied all or nothing.
    fn set_params(&self, request: &Request) -> Response {
        // Values stay untyped here: `params::validate` checks each against
        // its declared kind and names the parameter when it does not fit.
        let changes: Map<String, Value> = match serde_json::from_slice(&request.body) {
            Ok(changes) => changes,
            Err(error) if error.is_data() => {
                return Response::error(
                    Status::BadRequest,
                    "body must be a JSON object of parameter name to value",
                );
            }
            Err(error) => {
                return Response::error(Status::BadRequest, &format!("body is not JSON: {error}"));
            }
        };
        if changes.is_empty() {
            return Response::error(Status::BadRequest, "no parameters given");
        }
        let result = params::validate(&self.handler.params(), &changes)
            .and_then(|updates| self.handler.set_params(&updates));
        match result {
            Ok(changes) => {
                for change in &changes {
                    info!(
                        param = %change.name,
                        old = %change.old,
                        new = %change.new,
                        "admin API: parameter changed"
                    );
                }
                let changed = changes.iter().map(ParamChange::api).collect();
                Response::json(Status::Ok, &api::ParamsChanged { changed })
            }
            Err(errors) => {
                let text: Vec<String> = errors
                    .iter()
                    .map(|e| format!("{}: {}", e.param, e.message))
                    .collect();
                warn!(errors = %text.join("; "), "admin API: parameter change refused");
                let errors = errors
                    .iter()
                    .map(|e| api::ErrorDetail::Param(e.api()))
                    .collect();
                Response::errors(
                    Status::BadRequest,
                    "invalid parameters, nothing changed".to_owned(),
                    Some(errors),
                )
            }
        }
    }
}

/// Parses `sample=N` from the query string.
fn sample_size(query: Option<&str>) -> Result<usize, String> {
    let mut sample = DEFAULT_CONNECTION_SAMPLE;
    for pair in query
        .unwrap_or("")
        .split('&')
        .filter(|pair| !pair.is_empty())
    {
        match pair.split_once('=') {
            Some(("sample", value)) => {
                sample = value
                    .parse::<usize>()
                    .map_err(|_| format!("sample must be a non-negative integer, got {value:?}"))?;
            }
            _ => return Err(format!("unknown query parameter {pair:?} (only `sample`)")),
        }
    }
    Ok(sample.min(MAX_CONNECTION_SAMPLE))
}

/// The response for a handler's answer.
fn outcome(result: Result<impl serde::Serialize, AdminError>) -> Response {
    match result {
        Ok(value) => Response::json(Status::Ok, &value),
        Err(AdminError::Unsupported) => Response::error(
            Status::NotImplemented,
            "this relay does not support the operation",
        ),
        Err(AdminError::Refused(message)) => Response::error(Status::Conflict, &message),
        Err(AdminError::Invalid(errors)) => Response::errors(
            Status::UnprocessableContent,
            format!("{} error(s), nothing changed", errors.len()),
            Some(errors.into_iter().map(api::ErrorDetail::Text).collect()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api() -> Api {
        Api {
            metrics: Arc::new(Metrics::new()),
            handler: Arc::new(api::Status::default),
            metrics_only: false,
        }
    }

    /// The default 5 s deadline, checked on virtual time: an in-memory stream
    /// keeps the I/O driver out of it, so paused time advances deterministically.
    #[tokio::test(start_paused = true)]
    async fn default_read_timeout_cuts_off_a_stalled_client() {
        let (mut client, server) = tokio::io::duplex(1024);
        let api = api();
        let config = AdminConfig::default();
        let started = tokio::time::Instant::now();
        let handler = async {
            handle_connection(server, &api, &config).await.unwrap();
            started.elapsed()
        };
        // `move`: dropping the client at the end ends the server's linger.
        let client = async move {
            client
                .write_all(b"GET /metrics HTTP/1.1\r\nHo")
                .await
                .unwrap();
            let mut answer = Vec::new();
            client.read_to_end(&mut answer).await.unwrap();
            String::from_utf8(answer).unwrap()
        };
        let (handler_elapsed, answer) = tokio::join!(handler, client);
        assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
        assert!(
            handler_elapsed >= Duration::from_secs(5),
            "{handler_elapsed:?}"
        );
        assert!(
            handler_elapsed < Duration::from_secs(6),
            "{handler_elapsed:?}"
        );
    }

    /// A client trickling one byte a second never lets a per-read timeout
    /// fire; the deadline covers the whole request.
    #[tokio::test(start_paused = true)]
    async fn trickling_client_is_cut_off_at_the_request_deadline() {
        let (mut client, server) = tokio::io::duplex(1024);
        let api = api();
        let config = AdminConfig {
            read_timeout: Duration::from_secs(3),
            ..AdminConfig::default()
        };
        let started = tokio::time::Instant::now();
        let handler = async {
            handle_connection(server, &api, &config).await.unwrap();
            started.elapsed()
        };
        let client = async move {
            let mut trickled = 0;
            for byte in b"GET /metrics HTTP/1.1\r\nHost: trickle\r\n\r\n" {
                if client.write_all(&[*byte]).await.is_err() {
                    break; // the server gave up on us
                }
                trickled += 1;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            let mut answer = Vec::new();
            client.read_to_end(&mut answer).await.unwrap();
            (trickled, String::from_utf8(answer).unwrap())
        };
        let (handler_elapsed, (trickled, answer)) = tokio::join!(handler, client);
        assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
        assert!(
            trickled < 10,
            "server kept reading {trickled} trickled bytes"
        );
        assert!(
            handler_elapsed >= Duration::from_secs(3),
            "{handler_elapsed:?}"
        );
        assert!(
            handler_elapsed < Duration::from_secs(5),
            "{handler_elapsed:?}"
        );
    }

    #[test]
    fn head_and_get_share_routes() {
        let api = api();
        let request = |method: &str, path: &str| Request {
            method: method.to_owned(),
            path: path.to_owned(),
            query: None,
            headers: Vec::new(),
            body: Vec::new(),
        };
        assert_eq!(api.handle(&request("HEAD", "/status")).status, Status::Ok);
        assert_eq!(api.handle(&request("GET", "/metrics")).status, Status::Ok);
        let post = api.handle(&request("POST", "/metrics"));
        assert_eq!(post.status, Status::MethodNotAllowed);
        assert_eq!(post.extra_headers, vec![("Allow", ALLOW_GET)]);
        assert_eq!(api.handle(&request("GET", "/")).status, Status::NotFound);
    }
}
