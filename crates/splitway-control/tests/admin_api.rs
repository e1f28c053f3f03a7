//! Every admin endpoint over real loopback sockets, answered by a fake
//! relay, and queried with the blocking client `splitway ctl` uses.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use splitway_api::{self as api, ParamValue as V};
use splitway_control::client::{AdminClient, Answer};
use splitway_control::params::ParamValues;
use splitway_control::{
    AdminError, AdminHandler, MAX_CONNECTION_SAMPLE, Metrics, ParamChange, ParamError, ParamInfo,
    ParamKind, ParamRegistry, ParamSpec, ParamUpdate, ParamValue, bind, serve,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

/// A relay stand-in: a parameter registry, a drain flag, and a reload that
/// fails once `config_broken` is set.
struct FakeRelay {
    params: ParamRegistry,
    drains: AtomicUsize,
    config_broken: Mutex<bool>,
    last_sample: Mutex<Option<usize>>,
}

/// A watermark of one named queue (`queue.<name>.low`, `.high`): the
/// parameters are the stand-in's own, declared as any handler declares
/// its (the relay's are pinned in splitway-relay, next to their owners).
fn watermark(queue: &str, end: &str) -> ParamSpec {
    ParamSpec::new(
        format!("queue.{queue}.{end}"),
        ParamKind::Int { min: 0, max: 4096 },
        format!("the {end} watermark of queue {queue}"),
    )
}

impl FakeRelay {
    fn new() -> Self {
        let idle = ParamSpec::new(
            "timeouts.idle",
            ParamKind::Duration {
                min: Duration::from_secs(1),
                max: Duration::from_secs(7 * 24 * 3600),
            },
            "close connections that moved no data for this long",
        );
        let compress = ParamSpec::new("compress", ParamKind::Bool, "compress answers");
        Self {
            params: ParamRegistry::with([
                (watermark("a", "low"), ParamValue::Int(4)),
                (watermark("a", "high"), ParamValue::Int(16)),
                (compress, ParamValue::Bool(false)),
                (idle, ParamValue::Duration(Duration::from_secs(300))),
                (ParamSpec::log_level(), ParamValue::Text("info".into())),
            ])
            .unwrap(),
            drains: AtomicUsize::new(0),
            config_broken: Mutex::new(false),
            last_sample: Mutex::new(None),
        }
    }
}

impl AdminHandler for FakeRelay {
    fn status(&self) -> api::Status {
        api::Status {
            name: "rc".into(),
            version: "test".into(),
            ..Default::default()
        }
    }

    fn connections(&self, sample: usize) -> Result<api::Connections, AdminError> {
        *self.last_sample.lock().unwrap() = Some(sample);
        let all = (0..3).map(|id| api::Connection {
            id: format!("{id:016x}"),
            mode: "socks5".into(),
            state: "forwarding".into(),
            ..Default::default()
        });
        Ok(api::Connections {
            total: 3,
            by_state: [("forwarding".to_owned(), 3)].into(),
            sample: all.take(sample).collect(),
            ..Default::default()
        })
    }

    fn params(&self) -> Vec<ParamInfo> {
        self.params.infos()
    }

    fn set_params(&self, updates: &[ParamUpdate]) -> Result<Vec<ParamChange>, Vec<ParamError>> {
        self.params.update(updates, |values: &ParamValues| {
            match (values.int("queue.a.low"), values.int("queue.a.high")) {
                (Some(low), Some(high)) if low > high => vec![ParamError::new(
                    "queue.a.low",
                    format!("low ({low}) is above high ({high})"),
                )],
                _ => Vec::new(),
            }
        })
    }

    fn drain(&self) -> Result<api::Drain, AdminError> {
        if self.drains.fetch_add(1, Ordering::SeqCst) > 0 {
            return Err(AdminError::Refused("already draining".into()));
        }
        Ok(api::Drain {
            draining: true,
            open_connections: 3,
        })
    }

    fn reload(&self) -> Result<api::Reload, AdminError> {
        if *self.config_broken.lock().unwrap() {
            return Err(AdminError::Invalid(vec![
                "peer.rs.addr: `nowhere` is not IP:port".into(),
                "route[0].via: no peer named `rx`".into(),
            ]));
        }
        Ok(api::Reload {
            reloaded: true,
            ..Default::default()
        })
    }
}

/// A running admin server; dropping it shuts the server down.
struct Server {
    addr: String,
    relay: Arc<FakeRelay>,
    _stop: oneshot::Sender<()>,
}

async fn start(handler: Option<Arc<dyn AdminHandler>>) -> Server {
    let relay = Arc::new(FakeRelay::new());
    let metrics = Arc::new(Metrics::new());
    let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (stop, stopped) = oneshot::channel::<()>();
    let handler = handler.unwrap_or_else(|| relay.clone());
    tokio::spawn(serve(listener, metrics, handler, async move {
        let _ = stopped.await;
    }));
    Server {
        addr,
        relay,
        _stop: stop,
    }
}

/// One request through the blocking client, off the runtime's threads.
async fn call(server: &Server, method: &str, path: &str, body: Option<&[u8]>) -> Answer {
    let client = AdminClient::new(&server.addr, Duration::from_secs(5));
    let (method, path, body) = (method.to_owned(), path.to_owned(), body.map(<[u8]>::to_vec));
    tokio::task::spawn_blocking(move || client.request(&method, &path, body.as_deref()))
        .await
        .unwrap()
        .unwrap()
}

/// A `PUT /params` body.
fn update<const N: usize>(pairs: [(&str, V); N]) -> Vec<u8> {
    let body: api::ParamsUpdate = pairs.map(|(k, v)| (k.to_owned(), v)).into();
    serde_json::to_vec(&body).unwrap()
}

/// The answer read as `T`, which must be its shape.
fn read<T: serde::de::DeserializeOwned>(answer: &Answer) -> T {
    answer.json().unwrap_or_else(|e| {
        let body = String::from_utf8_lossy(&answer.body);
        panic!(
            "answer {} not in the expected shape ({e}): {body}",
            answer.status
        )
    })
}

/// A request with hand-written headers, for what the client never sends.
async fn raw(server: &Server, request: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(&server.addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    answer
}

#[tokio::test]
async fn status_and_metrics_are_served() {
    let server = start(None).await;
    let status = call(&server, "GET", "/status", None).await;
    assert_eq!(status.status, 200);
    assert_eq!(status.content_type.as_deref(), Some("application/json"));
    assert_eq!(read::<api::Status>(&status).name, "rc");

    let metrics = call(&server, "GET", "/metrics", None).await;
    assert_eq!(metrics.status, 200);
    let text = String::from_utf8(metrics.body).unwrap();
    assert!(text.contains("splitway_build_info{"), "{text}");
}

#[tokio::test]
async fn connections_honours_and_bounds_the_sample() {
    let server = start(None).await;
    let default = call(&server, "GET", "/connections", None).await;
    assert_eq!(default.status, 200);
    assert_eq!(*server.relay.last_sample.lock().unwrap(), Some(20));
    let default: api::Connections = read(&default);
    assert_eq!(default.by_state["forwarding"], 3);
    assert_eq!(default.sample.len(), 3);

    let one = call(&server, "GET", "/connections?sample=1", None).await;
    assert_eq!(read::<api::Connections>(&one).sample.len(), 1);

    call(&server, "GET", "/connections?sample=999999", None).await;
    assert_eq!(
        *server.relay.last_sample.lock().unwrap(),
        Some(MAX_CONNECTION_SAMPLE)
    );

    let bad = call(&server, "GET", "/connections?sample=lots", None).await;
    assert_eq!(bad.status, 400);
    let bad: api::ErrorBody = read(&bad);
    assert!(bad.error.contains("sample"), "{bad:?}");
    assert_eq!(bad.status, 400);
}

#[tokio::test]
async fn params_are_listed_with_kind_and_value() {
    let server = start(None).await;
    let answer = call(&server, "GET", "/params", None).await;
    assert_eq!(answer.status, 200);
    let params: Vec<api::Param> = read(&answer);
    let low = params.iter().find(|p| p.name == "queue.a.low").unwrap();
    assert_eq!(low.value, V::Int(4));
    assert_eq!(low.kind, api::ParamKind::Int { min: 0, max: 4096 });
    let idle = params.iter().find(|p| p.name == "timeouts.idle").unwrap();
    assert_eq!(idle.value, V::Text("300s".into()));
}

#[tokio::test]
async fn put_params_applies_all_and_reports_old_and_new() {
    let server = start(None).await;
    let answer = call(
        &server,
        "PUT",
        "/params",
        Some(&update([
            ("queue.a.high", V::Int(32)),
            ("queue.a.low", V::Text("8".into())),
            ("timeouts.idle", V::Text("10m".into())),
        ])),
    )
    .await;
    assert_eq!(answer.status, 200);
    let changed = |name: &str, old, new| api::ParamChanged {
        name: name.into(),
        old,
        new,
    };
    assert_eq!(
        read::<api::ParamsChanged>(&answer).changed,
        [
            changed("queue.a.high", V::Int(16), V::Int(32)),
            changed("queue.a.low", V::Int(4), V::Int(8)),
            changed(
                "timeouts.idle",
                V::Text("300s".into()),
                V::Text("600s".into())
            ),
        ]
    );
    assert_eq!(
        server.relay.params.get("queue.a.low"),
        Some(ParamValue::Int(8))
    );
}

#[tokio::test]
async fn put_params_refuses_everything_if_anything_is_wrong() {
    let server = start(None).await;
    let answer = call(
        &server,
        "PUT",
        "/params",
        Some(&update([
            ("queue.a.low", V::Int(5)),
            ("queue.b.low", V::Int(1)),
            ("compress", V::Int(2)),
            ("queue.a.high", V::Int(99999)),
        ])),
    )
    .await;
    assert_eq!(answer.status, 400);
    let errors = param_errors(&answer);
    let named: Vec<&str> = errors.iter().map(|e| e.param.as_str()).collect();
    assert_eq!(named, ["compress", "queue.a.high", "queue.b.low"]);
    assert_eq!(errors[1].message, "99999 is outside 0..=4096");
    assert_eq!(
        server.relay.params.get("queue.a.low"),
        Some(ParamValue::Int(4))
    );

    // Valid one by one, invalid together: the relay's cross-check refuses.
    let crossed = update([("queue.a.low", V::Int(20))]);
    let crossed = call(&server, "PUT", "/params", Some(&crossed)).await;
    assert_eq!(crossed.status, 400);
    assert_eq!(
        param_errors(&crossed),
        [api::ParamError {
            param: "queue.a.low".into(),
            message: "low (20) is above high (16)".into()
        }]
    );

    for (body, why) in [
        (&b"[1, 2]"[..], "body must be a JSON object"),
        (b"{}", "no parameters given"),
        (b"{\"compress\": ", "body is not JSON"),
    ] {
        let refused = call(&server, "PUT", "/params", Some(body)).await;
        assert_eq!(refused.status, 400);
        let refused: api::ErrorBody = read(&refused);
        assert!(refused.error.starts_with(why), "{refused:?}");
    }
}

/// The per-parameter errors of a refused `PUT /params`.
fn param_errors(answer: &Answer) -> Vec<api::ParamError> {
    let body: api::ErrorBody = read(answer);
    let errors = body.errors.expect("errors listed");
    errors
        .into_iter()
        .map(|e| match e {
            api::ErrorDetail::Param(e) => e,
            api::ErrorDetail::Text(text) => panic!("error without a parameter: {text}"),
        })
        .collect()
}

#[tokio::test]
async fn drain_answers_then_refuses_a_second_drain() {
    let server = start(None).await;
    let first = call(&server, "POST", "/drain", None).await;
    assert_eq!(first.status, 200);
    assert!(read::<api::Drain>(&first).draining);
    let second = call(&server, "POST", "/drain", None).await;
    assert_eq!(second.status, 409);
    assert_eq!(read::<api::ErrorBody>(&second).error, "already draining");
}

#[tokio::test]
async fn reload_reports_each_config_error() {
    let server = start(None).await;
    let ok = call(&server, "POST", "/reload", None).await;
    assert_eq!(ok.status, 200);
    assert!(read::<api::Reload>(&ok).reloaded);
    *server.relay.config_broken.lock().unwrap() = true;
    let broken = call(&server, "POST", "/reload", None).await;
    assert_eq!(broken.status, 422);
    let errors = read::<api::ErrorBody>(&broken)
        .errors
        .expect("errors listed");
    assert_eq!(errors.len(), 2);
    assert!(
        matches!(&errors[0], api::ErrorDetail::Text(e) if e.starts_with("peer.rs.addr")),
        "{errors:?}"
    );
}

#[tokio::test]
async fn wrong_methods_unknown_paths_and_browsers_are_refused() {
    let server = start(None).await;
    let get_drain = call(&server, "GET", "/drain", None).await;
    assert_eq!(get_drain.status, 405);
    let post_status = call(&server, "POST", "/status", None).await;
    assert_eq!(post_status.status, 405);
    let nowhere = call(&server, "GET", "/nowhere", None).await;
    assert_eq!(nowhere.status, 404);

    let from_browser = raw(
        &server,
        "POST /drain HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://evil.example\r\nContent-Length: 0\r\n\r\n",
    )
    .await;
    assert!(from_browser.starts_with("HTTP/1.1 403 "), "{from_browser}");
    assert_eq!(server.relay.drains.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_status_only_handler_answers_501_and_knows_no_parameters() {
    let minimal = || api::Status {
        name: "minimal".into(),
        ..Default::default()
    };
    let server = start(Some(Arc::new(minimal))).await;
    assert_eq!(call(&server, "GET", "/status", None).await.status, 200);
    assert_eq!(call(&server, "GET", "/connections", None).await.status, 501);
    assert_eq!(call(&server, "POST", "/drain", None).await.status, 501);
    assert_eq!(call(&server, "POST", "/reload", None).await.status, 501);
    let params = call(&server, "GET", "/params", None).await;
    assert_eq!(read::<Vec<api::Param>>(&params), []);
    let set = update([("compress", V::Bool(true))]);
    let set = call(&server, "PUT", "/params", Some(&set)).await;
    assert_eq!(set.status, 400);
    assert_eq!(param_errors(&set)[0].param, "compress");
}

#[tokio::test]
async fn unix_socket_serves_the_same_api_and_replaces_a_stale_socket() {
    let dir = std::env::temp_dir().join(format!("splitway-admin-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("admin.sock");
    // A socket file nobody serves on, as a crashed relay leaves behind.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());

    let listener = splitway_control::bind_unix(&path).unwrap();
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o660);
    // A second relay must not steal a live socket.
    let taken = splitway_control::bind_unix(&path).unwrap_err();
    assert!(taken.to_string().contains("admin.sock"), "{taken}");

    let relay = Arc::new(FakeRelay::new());
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(splitway_control::serve_unix(
        listener,
        Arc::new(Metrics::new()),
        relay.clone(),
        async move {
            let _ = stopped.await;
        },
    ));
    let client = AdminClient::new(&format!("unix:{}", path.display()), Duration::from_secs(5));
    let body = update([("compress", V::Bool(true))]);
    let answer = tokio::task::spawn_blocking(move || client.request("PUT", "/params", Some(&body)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer.status, 200);
    assert_eq!(read::<api::ParamsChanged>(&answer).changed.len(), 1);
    assert_eq!(relay.params.get("compress"), Some(ParamValue::Bool(true)));

    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}
