//! The same answers from hyper 1 (HTTP/1.1, one request per connection as
//! the current server): only what the footprint comparison needs, not a
//! replacement (no limits, no /params, no errors in the API's shape).

use std::convert::Infallible;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

fn answer(
    metrics: &splitway_control::Metrics,
    request: &Request<Incoming>,
) -> Response<Full<Bytes>> {
    let (status, body) = match request.uri().path() {
        "/metrics" => (StatusCode::OK, metrics.encode().into_bytes()),
        "/status" => (
            StatusCode::OK,
            serde_json::to_vec(&admin_http_proto::status()).expect("status serialises"),
        ),
        _ => (StatusCode::NOT_FOUND, b"{\"error\":\"no such endpoint\"}".to_vec()),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
}

fn main() {
    let addr = admin_http_proto::addr();
    admin_http_proto::runtime().block_on(async {
        let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
        let metrics = admin_http_proto::metrics();
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let metrics = metrics.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request| {
                    let response = answer(&metrics, &request);
                    async move { Ok::<_, Infallible>(response) }
                });
                if let Err(error) = http1::Builder::new()
                    .keep_alive(false)
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    eprintln!("connection: {error}");
                }
            });
        }
    });
}
