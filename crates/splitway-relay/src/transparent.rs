//! `[[route]] source = "client"`: the server leg leaves from the client's
//! own address (IP_TRANSPARENT), so the server's socket peer is the client.
//!
//! The kernel lets a transparent socket bind a foreign address; the
//! server's replies, addressed to the client, must then be routed back to
//! this host (symmetric routing) and delivered to the socket: a policy
//! route for marked packets of transparent sockets ([`policy_routing`]).

use std::net::SocketAddr;

use tokio::net::TcpSocket;

use crate::error::ConnError;

/// Firewall mark and routing table for replies to client-sourced legs
/// ("SY"); apart from the TPROXY interception's, whose rules come and go
/// with its listeners.
pub const FWMARK: u32 = 0x5359;
pub const ROUTE_TABLE: u32 = 0x5359;

/// Binds `sock` to the client's address (its port too, when free) before
/// it dials `server`.
pub fn bind_as_client(
    sock: &TcpSocket,
    client: SocketAddr,
    server: SocketAddr,
) -> Result<(), ConnError> {
    let fail = |detail: String| ConnError::ClientSource {
        client,
        server,
        detail,
    };
    if client.is_ipv4() != server.is_ipv4() {
        return Err(fail(
            "the client and the server are of different IP families".into(),
        ));
    }
    splitway_sys::sock::set_transparent(sock, server.is_ipv6())
        .map_err(|e| fail(format!("{e} (needs CAP_NET_ADMIN)")))?;
    sock.set_reuseaddr(true)
        .map_err(|e| fail(format!("SO_REUSEADDR: {e}")))?;
    match sock.bind(client) {
        Ok(()) => Ok(()),
        // The client's port is taken here (this relay dials the same client
        // to two servers, or the relay is the client's own host): the
        // server still sees the client's address.
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => sock
            .bind(SocketAddr::new(client.ip(), 0))
            .map_err(|e| fail(format!("bind: {e}"))),
        Err(e) => Err(fail(format!("bind: {e}"))),
    }
}

/// Checks that this process may make client-sourced legs: a socket that
/// takes IP_TRANSPARENT (CAP_NET_ADMIN). For `--check`.
pub fn probe(ipv6: bool) -> Result<(), String> {
    let sock = if ipv6 {
        TcpSocket::new_v6()
    } else {
        TcpSocket::new_v4()
    }
    .map_err(|e| format!("socket: {e}"))?;
    splitway_sys::sock::set_transparent(&sock, ipv6)
        .map_err(|e| format!("{e}: source = \"client\" needs CAP_NET_ADMIN"))
}

/// The policy routing replies to client-sourced legs need on this host,
/// as commands for the operator (the relay does not install it: the rules
/// are host-wide and outlive any one relay process).
pub fn policy_routing() -> String {
    format!(
        "# Replies to legs sent from the client's address (route source = \"client\"):\n\
         # deliver packets of transparent sockets locally. The network must route the\n\
         # client addresses' return traffic from the servers back through this host.\n\
         nft add table inet splitway_source\n\
         nft add chain inet splitway_source prerouting '{{ type filter hook prerouting priority mangle; policy accept; }}'\n\
         nft add rule inet splitway_source prerouting meta l4proto tcp socket transparent 1 meta mark set {FWMARK:#x}\n\
         ip -4 rule add fwmark {FWMARK:#x} lookup {ROUTE_TABLE}\n\
         ip -4 route replace local 0.0.0.0/0 dev lo table {ROUTE_TABLE}\n\
         ip -6 rule add fwmark {FWMARK:#x} lookup {ROUTE_TABLE}\n\
         ip -6 route replace local ::/0 dev lo table {ROUTE_TABLE}\n"
    )
}

/// Whether this host has the policy rule [`policy_routing`] adds for the
/// family (`ip rule show`); `false` when `ip` cannot tell.
pub fn policy_rule_installed(ipv6: bool) -> bool {
    let flag = if ipv6 { "-6" } else { "-4" };
    let needle = format!("fwmark {FWMARK:#x} lookup {ROUTE_TABLE}");
    splitway_sys::netns::ip(&[flag, "rule", "show"])
        .map(|out| String::from_utf8_lossy(&out.stdout).contains(&needle))
        .unwrap_or(false)
}
