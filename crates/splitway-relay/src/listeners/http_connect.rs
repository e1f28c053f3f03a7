//! `mode = "http-connect"`: an HTTP proxy. `CONNECT host:port` opens a
//! tunnel; an absolute-form request (`GET http://host/path`, what
//! `http_proxy=` clients send) goes to its server rewritten (origin-form,
//! `Connection: close`: one request per connection), through the same
//! routes and policy. Errors carry a one-line reason body.

use std::net::SocketAddr;

use splitway_control::metrics::Mode;
use splitway_proto::header::ReplyStatus;
use splitway_proto::{Destination, http_connect};
use tokio::net::TcpStream;

use super::{Confirm, Handshake, Learned, Learning, Listen, frame_err, within};
use crate::bytes::write_all;
use crate::config::ListenMode;
use crate::error::ConnError;
use crate::leg_io::{FrameError, read_frame};

pub struct HttpConnect;

impl Listen for HttpConnect {
    fn mode(&self) -> ListenMode {
        ListenMode::HttpConnect
    }

    fn label(&self) -> Mode {
        Mode::HttpConnect
    }

    fn learn<'a>(&'a self, hs: Handshake<'a>) -> Learning<'a> {
        Box::pin(async move {
            let deadline = hs.shared.cfg.timeouts.handshake;
            let (dst, early_data, forwarded) = within(deadline, handshake(hs.stream)).await?;
            Ok(Learned {
                answered_by_server: forwarded,
                ..Learned::explicit(dst, early_data, hs.client)
            })
        })
    }

    fn refusal(&self, status: ReplyStatus, _: SocketAddr) -> Option<Vec<u8>> {
        Some(http_connect::error_response(
            http_connect::status_for(status),
            http_connect::reason_for(status),
        ))
    }

    fn confirmation(&self, c: Confirm<'_>) -> Option<(Vec<u8>, bool)> {
        (!c.answered_by_server).then(|| (http_connect::response(200), false))
    }

    fn client_waits(&self) -> bool {
        true
    }

    fn explicit(&self) -> bool {
        true
    }

    fn proxies(&self) -> bool {
        true
    }
}

/// The request: the destination, what goes to it first (a forwarded
/// request's rewritten head, then whatever the client sent after its head)
/// and whether the request itself is forwarded.
async fn handshake(stream: &TcpStream) -> Result<(Destination, Vec<u8>, bool), ConnError> {
    let mut buf = Vec::new();
    match read_frame(stream, &mut buf, http_connect::parse_request).await {
        Ok(req) => match req.forward {
            Some(mut head) => {
                head.append(&mut buf);
                Ok((req.dst, head, true))
            }
            None => Ok((req.dst, buf, false)),
        },
        Err(FrameError::Bad(e)) => {
            // Best effort: the client is refused either way.
            let answer = http_connect::error_response(e.status(), &e.to_string());
            let _ = write_all(stream, &answer).await;
            Err(ConnError::ClientProtocol(e.to_string()))
        }
        Err(e) => Err(frame_err(e)),
    }
}
