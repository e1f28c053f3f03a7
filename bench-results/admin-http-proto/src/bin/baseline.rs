//! No HTTP library and no admin routes: reads a request head and answers
//! `/status` as text. What both other binaries carry beyond this is their
//! HTTP layer (and, for `current`, the whole admin API's routes).

use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn main() {
    let addr = admin_http_proto::addr();
    admin_http_proto::runtime().block_on(async {
        let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
        let metrics = admin_http_proto::metrics();
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                continue;
            };
            let metrics = metrics.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let body = if head.starts_with(b"GET /metrics ") {
                    metrics.encode().into_bytes()
                } else {
                    serde_json::to_vec(&admin_http_proto::status()).expect("status serialises")
                };
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let sent = async {
                    stream.write_all(answer.as_bytes()).await?;
                    stream.write_all(&body).await
                };
                if let Err(error) = sent.await {
                    eprintln!("answer: {error}");
                }
            });
        }
    });
}
