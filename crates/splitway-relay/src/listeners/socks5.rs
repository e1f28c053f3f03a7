//! `mode = "socks5"`: SOCKS5 `CONNECT` (RFC 1928); with `auth_file`,
//! username/password (RFC 1929) instead of no authentication.

use std::net::SocketAddr;

use crate::metrics::Mode;
use splitway_proto::header::ReplyStatus;
use splitway_proto::{Destination, proxy_auth, socks5};
use tokio::net::TcpStream;

use super::{Confirm, Handshake, Learned, Learning, Listen, frame_err, unspecified, within};
use crate::bytes::write_all;
use crate::config::{ListenMode, ProxyUsers};
use crate::error::ConnError;
use crate::leg_io::{FrameError, read_frame};

pub struct Socks5;

impl Listen for Socks5 {
    fn mode(&self) -> ListenMode {
        ListenMode::Socks5
    }

    fn label(&self) -> Mode {
        Mode::Socks5
    }

    fn learn<'a>(&'a self, hs: Handshake<'a>) -> Learning<'a> {
        Box::pin(async move {
            let deadline = hs.shared.cfg.timeouts.handshake;
            let users = hs.spec.users.as_deref();
            let (dst, early_data) =
                within(deadline, handshake(hs.stream, hs.client, users)).await?;
            Ok(Learned::explicit(dst, early_data, hs.client))
        })
    }

    fn refusal(&self, status: ReplyStatus, client: SocketAddr) -> Option<Vec<u8>> {
        Some(socks5::encode_reply(
            socks5::ReplyCode::from(status),
            unspecified(client),
        ))
    }

    fn confirmation(&self, c: Confirm<'_>) -> Option<(Vec<u8>, bool)> {
        // Only SOCKS5 tells the client the bound address: the one
        // getsockname a connection needs, asked only here.
        let bound = c.out.local_addr().unwrap_or_else(|_| unspecified(c.client));
        Some((
            socks5::encode_reply(socks5::ReplyCode::Succeeded, bound),
            false,
        ))
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

/// Greeting, method selection, the credentials where `users` asks for
/// them, request: the destination and whatever the client sent after its
/// request.
async fn handshake(
    stream: &TcpStream,
    client: SocketAddr,
    users: Option<&ProxyUsers>,
) -> Result<(Destination, Vec<u8>), ConnError> {
    let mut buf = Vec::new();
    let greeting = read_frame(stream, &mut buf, socks5::parse_greeting)
        .await
        .map_err(frame_err)?;
    let method = match users {
        Some(_) => socks5::USERPASS,
        None => socks5::NO_AUTH,
    };
    if !greeting.offers(method) {
        // Best effort: the client is refused either way.
        let _ = write_all(stream, &socks5::method_selection(socks5::NO_ACCEPTABLE)).await;
        return Err(match users {
            Some(_) => ConnError::ClientCredentials {
                user: None,
                why: "the client offers no username/password method (RFC 1929)",
            },
            None => ConnError::ClientProtocol(
                "SOCKS5 client offers no method we support (only no-auth)".into(),
            ),
        });
    }
    write_all(stream, &socks5::method_selection(method))
        .await
        .map_err(|source| ConnError::ClientIo {
            op: "socks5 method",
            source,
        })?;
    if let Some(users) = users {
        authenticate(stream, &mut buf, users).await?;
    }
    match read_frame(stream, &mut buf, socks5::parse_request).await {
        Ok(req) => Ok((req.dst, buf)),
        Err(FrameError::Bad(e)) => {
            if let Some(code) = e.reply_code() {
                // Best effort, as above.
                let _ = write_all(stream, &socks5::encode_reply(code, unspecified(client))).await;
            }
            Err(ConnError::ClientProtocol(e.to_string()))
        }
        Err(e) => Err(frame_err(e)),
    }
}

/// RFC 1929's subnegotiation: the client's user name and password, and our
/// verdict (a refused client must close; we do too).
async fn authenticate(
    stream: &TcpStream,
    buf: &mut Vec<u8>,
    users: &ProxyUsers,
) -> Result<(), ConnError> {
    let credentials = read_frame(stream, buf, proxy_auth::parse_userpass)
        .await
        .map_err(frame_err)?;
    let accepted = users.check(&credentials);
    let answer = write_all(stream, &proxy_auth::userpass_status(accepted)).await;
    if !accepted {
        return Err(ConnError::ClientCredentials {
            user: Some(credentials.user_for_log()),
            why: "wrong user name or password",
        });
    }
    answer.map_err(|source| ConnError::ClientIo {
        op: "socks5 authentication",
        source,
    })
}
