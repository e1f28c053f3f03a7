//! `mode = "http-connect"`: an HTTP proxy. `CONNECT host:port` opens a
//! tunnel; an absolute-form request (`GET http://host/path`, what
//! `http_proxy=` clients send) goes to its server rewritten (origin-form,
//! `Connection: close`: one request per connection), through the same
//! routes and policy. Errors carry a one-line reason body. With
//! `auth_file`, a request without the right `Proxy-Authorization: Basic`
//! is answered 407.

use std::net::SocketAddr;

use crate::metrics::Mode;
use splitway_proto::header::ReplyStatus;
use splitway_proto::{Destination, http_connect, proxy_auth};
use tokio::net::TcpStream;

use super::{Confirm, Handshake, Learned, Learning, Listen, frame_err, within};
use crate::bytes::write_all;
use crate::config::{ListenMode, ProxyUsers};
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
            let users = hs.spec.users.as_deref();
            let (dst, early_data, forwarded) =
                within(deadline, handshake(hs.stream, users)).await?;
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
/// and whether the request itself is forwarded. Where `users` asks for
/// credentials, a request without them is answered 407.
async fn handshake(
    stream: &TcpStream,
    users: Option<&ProxyUsers>,
) -> Result<(Destination, Vec<u8>, bool), ConnError> {
    let mut buf = Vec::new();
    let req = match read_frame(stream, &mut buf, http_connect::parse_request).await {
        Ok(req) => req,
        Err(FrameError::Bad(e)) => {
            // Best effort: the client is refused either way.
            let answer = http_connect::error_response(e.status(), &e.to_string());
            let _ = write_all(stream, &answer).await;
            return Err(ConnError::ClientProtocol(e.to_string()));
        }
        Err(e) => return Err(frame_err(e)),
    };
    if let Some(users) = users
        && let Err((user, why)) = authenticate(users, req.proxy_authorization.as_deref())
    {
        // Best effort, as above.
        let answer = proxy_auth::proxy_auth_required(REALM, &format!("splitway: {why}"));
        let _ = write_all(stream, &answer).await;
        return Err(ConnError::ClientCredentials { user, why });
    }
    Ok(match req.forward {
        Some(mut head) => {
            head.append(&mut buf);
            (req.dst, head, true)
        }
        None => (req.dst, buf, false),
    })
}

/// The realm a 407 names (what a browser shows in its password prompt).
const REALM: &str = "splitway";

/// Checks a `Proxy-Authorization` value against `users`; why not, and
/// the user it named if it named one.
fn authenticate(
    users: &ProxyUsers,
    value: Option<&[u8]>,
) -> Result<(), (Option<String>, &'static str)> {
    let value = value.ok_or((
        None,
        "proxy authentication required (no Proxy-Authorization)",
    ))?;
    let credentials = proxy_auth::parse_basic(value).map_err(|e| {
        let why = match e {
            proxy_auth::ProxyAuthError::NotBasic => "Proxy-Authorization is not Basic",
            _ => "Proxy-Authorization Basic is not base64 of user:password",
        };
        (None, why)
    })?;
    if users.check(&credentials) {
        Ok(())
    } else {
        Err((
            Some(credentials.user_for_log()),
            "wrong user name or password",
        ))
    }
}
