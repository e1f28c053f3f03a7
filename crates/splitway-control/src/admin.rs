//! The admin HTTP server: `GET /metrics` and `GET /status`.
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
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tracing::{debug, error, warn};

use crate::error::ControlError;
use crate::http::{self, Limits, Request, RequestError, Response, Status};
use crate::metrics::{Metrics, OPENMETRICS_CONTENT_TYPE};

/// Supplies the JSON document served at `GET /status`.
///
/// Called once per request on the admin server's task: keep it cheap and
/// non-blocking (read atomics or a snapshot, don't do I/O).
pub trait StatusProvider: Send + Sync + 'static {
    /// The current status document.
    fn status(&self) -> serde_json::Value;
}

/// Any `Fn() -> Value` closure is a provider.
impl<F> StatusProvider for F
where
    F: Fn() -> serde_json::Value + Send + Sync + 'static,
{
    fn status(&self) -> serde_json::Value {
        self()
    }
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
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            read_timeout: Duration::from_secs(5),
            max_connections: 64,
            max_head_bytes: 8 * 1024,
            max_body_bytes: 64 * 1024,
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
    status: Arc<dyn StatusProvider>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ControlError> {
    serve_with_config(listener, metrics, status, AdminConfig::default(), shutdown).await
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
    status: Arc<dyn StatusProvider>,
    config: AdminConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ControlError> {
    let api = Arc::new(Api { metrics, status });
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
                (slot, listener.accept().await)
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
                    addr: listener.local_addr().ok(),
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
            debug!(timeout = ?config.read_timeout, "admin client too slow, cutting it off");
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

/// The routes. New endpoints (params, connections, drain, reload) add their
/// handles here and a match arm in [`Api::handle`].
struct Api {
    metrics: Arc<Metrics>,
    status: Arc<dyn StatusProvider>,
}

const ALLOW_GET: &str = "GET, HEAD";

impl Api {
    fn handle(&self, request: &Request) -> Response {
        let is_get = matches!(request.method.as_str(), "GET" | "HEAD");
        match request.path.as_str() {
            "/metrics" if is_get => Response::new(
                Status::Ok,
                OPENMETRICS_CONTENT_TYPE,
                self.metrics.encode().into_bytes(),
            ),
            "/status" if is_get => Response::json(Status::Ok, &self.status.status()),
            "/metrics" | "/status" => {
                Response::error(Status::MethodNotAllowed, "method not allowed")
                    .with_header("Allow", ALLOW_GET)
            }
            _ => Response::error(Status::NotFound, "no such endpoint"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api() -> Api {
        Api {
            metrics: Arc::new(Metrics::new()),
            status: Arc::new(|| serde_json::json!({"ok": true})),
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
