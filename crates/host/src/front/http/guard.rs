//! Who may ask: the bearer token, compared in constant time, and the
//! `Host` a scrape of `/metrics` names (rmcp checks `Host` and `Origin`
//! for `/mcp` itself).

use hyper::Request;

/// Whether `presented` is the expected `Authorization` value, compared in
/// constant time (for values of the same length).
pub(super) fn token_matches(expected: &str, presented: Option<&[u8]>) -> bool {
    use subtle::ConstantTimeEq;
    presented.is_some_and(|p| bool::from(expected.as_bytes().ct_eq(p)))
}

/// Whether the request's `Host` is one the listener accepts: the host
/// (brackets removed, any case) equal to an allowed one, and the port too
/// when the allowed entry names one.
pub(super) fn host_allowed(request: &Request<hyper::body::Incoming>, allowed: &[String]) -> bool {
    let authority = |text: &str| {
        let authority = hyper::http::uri::Authority::try_from(text.trim()).ok()?;
        let host = authority
            .host()
            .trim_matches(['[', ']'])
            .to_ascii_lowercase();
        Some((host, authority.port_u16()))
    };
    let Some((host, port)) = request
        .headers()
        .get(hyper::header::HOST)
        .and_then(|v| v.to_str().ok())
        .and_then(authority)
    else {
        return false;
    };
    allowed
        .iter()
        .filter_map(|a| authority(a))
        .any(|(h, p)| h == host && p.is_none_or(|p| Some(p) == port))
}
