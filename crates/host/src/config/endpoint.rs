//! A remote server's endpoint (`url = ...`): https, or plain http to a
//! loopback address, with no credentials and no fragment.

/// Checks a configured endpoint and returns it normalised. Only `https`, or
/// `http` to a loopback address; no user name or password (use
/// `bearer_token_env`), no fragment.
pub fn parse_endpoint(text: &str) -> Result<String, String> {
    let url = url::Url::parse(text).map_err(|e| format!("{text:?} is not a URL: {e}"))?;
    match url.scheme() {
        "https" => {}
        "http" if is_loopback(&url) => {}
        "http" => {
            return Err(format!(
                "{text:?}: plain http is allowed to loopback addresses only; use https"
            ));
        }
        other => return Err(format!("{text:?}: scheme `{other}` is not http or https")),
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("{text:?} has no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!(
            "{:?} carries credentials; put a bearer token in the environment and name it with `bearer_token_env`",
            url.host_str().unwrap_or_default()
        ));
    }
    if url.fragment().is_some() {
        return Err(format!(
            "{text:?} has a fragment, which no endpoint receives"
        ));
    }
    Ok(url.to_string())
}

fn is_loopback(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        None => false,
    }
}
