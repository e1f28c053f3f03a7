//! `mode = "http-connect"`: HTTP `CONNECT` tunnels.

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
            let (dst, early_data) = within(deadline, handshake(hs.stream)).await?;
            Ok(Learned::explicit(dst, early_data, hs.client))
        })
    }

    fn refusal(&self, status: ReplyStatus, _: SocketAddr) -> Option<Vec<u8>> {
        Some(http_connect::response(http_connect::status_for(status)))
    }

    fn confirmation(&self, _: Confirm<'_>) -> Option<(Vec<u8>, bool)> {
        Some((http_connect::response(200), false))
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

/// The request: the destination and whatever the client sent after it.
async fn handshake(stream: &TcpStream) -> Result<(Destination, Vec<u8>), ConnError> {
    let mut buf = Vec::new();
    match read_frame(stream, &mut buf, http_connect::parse_request).await {
        Ok(req) => Ok((req.dst, buf)),
        Err(FrameError::Bad(e)) => {
            // Best effort: the client is refused either way.
            let _ = write_all(stream, &http_connect::response(e.status())).await;
            Err(ConnError::ClientProtocol(e.to_string()))
        }
        Err(e) => Err(frame_err(e)),
    }
}
