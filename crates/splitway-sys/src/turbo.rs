//! Turbo-start routes: a large initial congestion and receive window for
//! relay↔relay legs only, as per-destination routes (`ip route ... initcwnd
//! N initrwnd M`). Routes apply to every connection to that destination, so
//! they are installed for peer relays' addresses and never for clients' or
//! servers'. The kernel reads them when a connection is established.

use std::net::IpAddr;

use crate::SysError;
use crate::netns::ip;

/// The window sizes to install, in segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Windows {
    pub initcwnd: u32,
    pub initrwnd: u32,
}

/// An installed route; dropping it restores what was there before.
#[derive(Debug)]
pub struct TurboRoute {
    dst: String,
    family: &'static str,
    /// The route we replaced (same destination, same table), re-added on drop.
    previous: Option<String>,
    /// The metric ours took (IPv6), so that a drop removes ours only.
    metric: Option<String>,
}

fn family(addr: IpAddr) -> &'static str {
    if addr.is_ipv4() { "-4" } else { "-6" }
}

/// Installs a turbo route to `dst` (an address, or a prefix `addr/len`),
/// copying the nexthop the kernel uses today (`ip route get`).
pub fn install(dst_addr: IpAddr, prefix_len: u8, w: Windows) -> Result<TurboRoute, SysError> {
    let fam = family(dst_addr);
    let dst = format!("{dst_addr}/{prefix_len}");
    let out = ip(&[
        fam,
        "route",
        "get",
        &probe_addr(dst_addr, prefix_len).to_string(),
    ])?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let nexthop = parse_nexthop(&text).ok_or_else(|| {
        SysError::Internal(format!("no usable route to {dst_addr}: {}", text.trim()))
    })?;
    // The route this one replaces: the one of the copied metric (IPv6
    // lists each metric's route apart), its output-only words dropped so
    // that it can be replayed on drop.
    let metric = nexthop
        .iter()
        .position(|w| w == "metric")
        .and_then(|i| nexthop.get(i + 1))
        .cloned();
    let previous = ip(&[fam, "route", "show", "exact", &dst])
        .ok()
        .and_then(|o| replaced_route(&String::from_utf8_lossy(&o.stdout), metric.as_deref()));
    let mut args: Vec<String> = vec![fam.into(), "route".into(), "replace".into(), dst.clone()];
    args.extend(nexthop);
    args.extend([
        "initcwnd".into(),
        w.initcwnd.to_string(),
        "initrwnd".into(),
        w.initrwnd.to_string(),
    ]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    ip(&refs)?;
    Ok(TurboRoute {
        dst,
        family: fam,
        previous,
        metric,
    })
}

/// Of `ip route show exact` output, the one route of `metric` (or the only
/// route), without the words `ip route replace` does not take.
fn replaced_route(show: &str, metric: Option<&str>) -> Option<String> {
    let mut lines = show.lines().map(str::trim).filter(|l| !l.is_empty());
    let line = match metric {
        Some(m) => lines.find(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            words.windows(2).any(|w| w == ["metric", m])
        })?,
        None => {
            let only = lines.next()?;
            if lines.next().is_some() {
                return None;
            }
            only
        }
    };
    const OUTPUT_ONLY: [&str; 6] = [
        "linkdown",
        "dead",
        "offload",
        "trap",
        "rt_offload",
        "rt_trap",
    ];
    Some(
        line.split_whitespace()
            .filter(|w| !OUTPUT_ONLY.contains(w))
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// The address whose route a prefix's turbo route copies. An IPv6
/// prefix's first address is its subnet-router anycast address, which
/// `ip route get` answers as local (`dev lo`): its last one instead.
fn probe_addr(addr: IpAddr, prefix_len: u8) -> IpAddr {
    match addr {
        IpAddr::V6(a) if prefix_len < 128 => {
            IpAddr::V6((u128::from(a) | (u128::MAX >> prefix_len)).into())
        }
        other => other,
    }
}

/// `via X dev Y` (or `dev Y`) from `ip route get` output, with the
/// matched route's `metric` when it shows one; local destinations
/// (`local ...`) have no nexthop to copy. The metric matters for IPv6: its
/// connected routes have metric 256, and `ip -6 route replace` without one
/// adds a second route at 1024 beside the kernel's, which keeps winning.
fn parse_nexthop(get_output: &str) -> Option<Vec<String>> {
    let line = get_output.lines().next()?;
    if line.starts_with("local ") || line.starts_with("unreachable") {
        return None;
    }
    let words: Vec<&str> = line.split_whitespace().collect();
    let mut out = Vec::new();
    for key in ["via", "dev", "metric"] {
        if let Some(i) = words.iter().position(|w| *w == key)
            && let Some(v) = words.get(i + 1)
        {
            out.push(key.to_owned());
            out.push((*v).to_owned());
        }
    }
    out.iter().any(|w| w == "dev").then_some(out)
}

impl TurboRoute {
    pub fn destination(&self) -> &str {
        &self.dst
    }
}

impl Drop for TurboRoute {
    fn drop(&mut self) {
        let restored = match &self.previous {
            Some(prev) => {
                let mut args = vec![self.family, "route", "replace"];
                args.extend(prev.split_whitespace());
                ip(&args)
            }
            None => match &self.metric {
                Some(m) => ip(&[self.family, "route", "del", &self.dst, "metric", m]),
                None => ip(&[self.family, "route", "del", &self.dst]),
            },
        };
        if let Err(e) = restored {
            tracing::warn!(route = %self.dst, error = %e, "failed to remove turbo-start route");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_prefix_is_probed_at_its_last_address() {
        let a: IpAddr = "fd00:12::".parse().unwrap();
        assert_eq!(
            probe_addr(a, 64),
            "fd00:12::ffff:ffff:ffff:ffff".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            probe_addr("fd00:12::2".parse().unwrap(), 128),
            "fd00:12::2".parse::<IpAddr>().unwrap()
        );
        let v4: IpAddr = "10.0.12.0".parse().unwrap();
        assert_eq!(probe_addr(v4, 24), v4);
    }

    #[test]
    fn the_replaced_route_is_the_one_of_the_copied_metric() {
        let show = "fd00:12::/64 dev west proto kernel metric 256 pref medium\n\
                    fd00:12::/64 dev west metric 1024 initcwnd 40 pref medium\n";
        assert_eq!(
            replaced_route(show, Some("256")).as_deref(),
            Some("fd00:12::/64 dev west proto kernel metric 256 pref medium")
        );
        // Without a metric, only a single route is replayed.
        assert_eq!(replaced_route(show, None), None);
        assert_eq!(
            replaced_route(
                "10.0.12.0/24 dev west proto kernel scope link src 10.0.12.1 linkdown\n",
                None
            )
            .as_deref(),
            Some("10.0.12.0/24 dev west proto kernel scope link src 10.0.12.1")
        );
        assert_eq!(replaced_route("", Some("256")), None);
        assert_eq!(
            replaced_route(
                "fd00:12::/64 dev west metric 2560 pref medium\n",
                Some("256")
            ),
            None,
            "a metric is a whole word"
        );
    }

    #[test]
    fn nexthop_from_route_get() {
        assert_eq!(
            parse_nexthop("10.0.3.2 via 10.0.12.2 dev eth1 src 10.0.12.1 uid 0 \n    cache \n"),
            Some(vec![
                "via".into(),
                "10.0.12.2".into(),
                "dev".into(),
                "eth1".into()
            ])
        );
        assert_eq!(
            parse_nexthop("10.0.12.2 dev eth1 src 10.0.12.1 uid 0\n"),
            Some(vec!["dev".into(), "eth1".into()])
        );
        assert_eq!(
            parse_nexthop("local 127.0.0.1 dev lo src 127.0.0.1\n"),
            None
        );
        // IPv6 names the matched route's metric: the replacement must take
        // the connected route's place, not sit behind it.
        assert_eq!(
            parse_nexthop(
                "fd00:12::1 from :: dev va proto kernel src fd00:12::2 metric 256 pref medium\n"
            ),
            Some(vec![
                "dev".into(),
                "va".into(),
                "metric".into(),
                "256".into()
            ])
        );
    }
}
