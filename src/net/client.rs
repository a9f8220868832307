//! Outbound HTTP for verification and delivery: one pooled client that never follows
//! redirects and, unless private callbacks are allowed, refuses to connect to loopback,
//! private, link-local and other non-public addresses. The check runs in the resolver, on the
//! very addresses the connection will use, so a name that changes its answer between two
//! lookups (DNS rebinding) cannot slip through; IP-literal URLs are checked by [`check_target`].

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// True for addresses a public callback may not resolve to.
pub fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_documentation()
                || o[0] == 0
                || (o[0] == 100 && (o[1] & 0xc0) == 64) // 100.64.0.0/10 shared address space
                || (o[0] == 198 && (o[1] & 0xfe) == 18) // 198.18.0.0/15 benchmarking
                || (o[0] == 192 && o[1] == 0 && o[2] == 0) // 192.0.0.0/24 IETF protocol assignments
                || (o[0] == 192 && o[1] == 88 && o[2] == 99) // 192.88.99.0/24 6to4 relay anycast
                || v4.is_multicast() // 224.0.0.0/4
                || o[0] >= 240
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_private(IpAddr::V4(v4));
            }
            let s = v6.segments();
            // The IPv4 address in the low 32 bits, for the ranges that carry one.
            let low_v4 = || {
                let [.., a, b, c, d] = v6.octets();
                IpAddr::V4(std::net::Ipv4Addr::new(a, b, c, d))
            };
            match s {
                // ::a.b.c.d (IPv4-compatible, deprecated) and ::ffff:0:a.b.c.d (IPv4-translated)
                [0, 0, 0, 0, 0, 0, _, _] | [0, 0, 0, 0, 0xffff, 0, _, _] => return true,
                // 64:ff9b::/96, NAT64: reaches the embedded IPv4 address
                [0x64, 0xff9b, 0, 0, 0, 0, _, _] => return is_private(low_v4()),
                // 64:ff9b:1::/48, local-use NAT64
                [0x64, 0xff9b, 1, ..] => return true,
                // 2002::/16, 6to4: the IPv4 address is in the second and third segments
                [0x2002, hi, lo, ..] => {
                    let [a, b] = hi.to_be_bytes();
                    let [c, d] = lo.to_be_bytes();
                    return is_private(IpAddr::V4(std::net::Ipv4Addr::new(a, b, c, d)));
                }
                _ => {}
            }
            v6.is_loopback()
                || v6.is_unspecified()
                || (s[0] & 0xfe00) == 0xfc00 // unique local
                || (s[0] & 0xffc0) == 0xfe80 // link-local
                || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
                || (s[0] & 0xff00) == 0xff00 // multicast
                || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("not an absolute http(s) URL")]
    NotHttp,
    #[error("address {0} is loopback, private or link-local")]
    Private(IpAddr),
}

/// Checks a callback or topic URL before any request: scheme, and the address when the host
/// is an IP literal (names are checked by the resolver when connecting).
pub fn check_target(url: &url::Url, allow_private: bool) -> Result<(), TargetError> {
    if !matches!(url.scheme(), "http" | "https") {
        return Err(TargetError::NotHttp);
    }
    let ip = match url.host() {
        Some(url::Host::Ipv4(ip)) => IpAddr::V4(ip),
        Some(url::Host::Ipv6(ip)) => IpAddr::V6(ip),
        Some(url::Host::Domain(_)) => return Ok(()),
        None => return Err(TargetError::NotHttp),
    };
    if !allow_private && is_private(ip) {
        return Err(TargetError::Private(ip));
    }
    Ok(())
}

struct PublicOnlyResolver;

impl Resolve for PublicOnlyResolver {
    fn resolve(&self, name: Name) -> Resolving {
        Box::pin(async move {
            let host = name.as_str().to_string();
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await?
                .filter(|a| !is_private(a.ip()))
                .collect();
            if addrs.is_empty() {
                return Err(format!("{host} resolves to no public address").into());
            }
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

/// The client used for every outbound request of the hub: built once at start-up and shared
/// by verification, delivery and external-topic fetches (one connection pool).
pub fn outbound_client(allow_private: bool, timeout: Duration) -> reqwest::Client {
    let mut builder = reqwest::Client::builder()
        // Straight to the target, as the delivery connections (net::callback) go: through a
        // proxy (HTTP_PROXY …) the resolver would see the proxy's name, not the target's, and
        // the address rule would not hold.
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(timeout)
        .connect_timeout(timeout.min(Duration::from_secs(10)))
        .user_agent(concat!("changehub/", env!("CARGO_PKG_VERSION")));
    if !allow_private {
        builder = builder.dns_resolver(Arc::new(PublicOnlyResolver));
    }
    builder.build().unwrap_or_else(|e| {
        tracing::error!(error = %e, "cannot build the configured HTTP client; using defaults");
        reqwest::Client::new()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_ranges() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.1.1",
            "0.0.0.0",
            "100.64.0.1",
            "192.0.0.8",
            "192.88.99.1",
            "198.18.0.1",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "224.0.0.1",
            "239.255.255.250",
            "::127.0.0.1",
            "::169.254.169.254",
            "::93.184.216.34",
            "::ffff:0:169.254.169.254",
            "64:ff9b::169.254.169.254",
            "64:ff9b::10.0.0.1",
            "64:ff9b:1::1",
            "2002:a9fe:a9fe::1",
            "2002:7f00:1::1",
            "fec0::1",
            "2001:db8::1",
        ] {
            assert!(is_private(ip.parse().unwrap()), "{ip}");
        }
        for ip in [
            "93.184.216.34",
            "2606:2800:220:1::1",
            "64:ff9b::93.184.216.34",
            "2002:5db8:d822::1",
        ] {
            assert!(!is_private(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn literal_targets() {
        let u = |s: &str| url::Url::parse(s).unwrap();
        assert!(check_target(&u("http://127.0.0.1:9/cb"), false).is_err());
        assert!(check_target(&u("http://[::1]:9/cb"), false).is_err());
        assert!(check_target(&u("http://127.0.0.1:9/cb"), true).is_ok());
        assert!(check_target(&u("http://example.com/cb"), false).is_ok());
        assert!(check_target(&u("ftp://example.com/cb"), false).is_err());
    }

    /// The resolver, not only the literal check: a name that resolves to loopback is refused
    /// when connecting, and allowed with `allow_private`.
    #[tokio::test]
    async fn names_resolving_to_private_addresses_are_refused_when_connecting() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let app = axum::Router::new().route("/cb", axum::routing::get(|| async { "ok" }));
        tokio::spawn(async move { axum::serve(listener, app).await });
        let url = format!("http://localhost:{port}/cb");
        let refused = outbound_client(false, Duration::from_secs(5))
            .get(&url)
            .send()
            .await;
        let err = refused.expect_err("localhost must be refused");
        let mut chain = err.to_string();
        let mut source = std::error::Error::source(&err);
        while let Some(inner) = source {
            chain.push_str(&format!(": {inner}"));
            source = inner.source();
        }
        assert!(chain.contains("no public address"), "{chain}");
        let allowed = outbound_client(true, Duration::from_secs(5))
            .get(&url)
            .send()
            .await;
        assert_eq!(allowed.unwrap().status(), 200);
    }
}
