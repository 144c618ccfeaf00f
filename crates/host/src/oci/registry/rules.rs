//! The rules a pull holds on where it goes: which redirects are followed,
//! which token realms are asked, and what a Bearer challenge says.

use reqwest::Url;

/// Why a redirect from `from` to `to` is not followed, if it is not. A
/// pull starts on https, or on plain http when the registry is on
/// loopback; https is never left for plain http, and plain http never
/// leaves loopback.
pub(super) fn redirect_refusal(
    loopback_registry: bool,
    from: &Url,
    to: &Url,
) -> Option<&'static str> {
    match to.scheme() {
        "https" => None,
        "http" if from.scheme() != "http" || !loopback_registry => {
            Some("a pull that is on https never goes to plain http")
        }
        "http" if !is_loopback(to) => Some("plain http is used on loopback only"),
        "http" => None,
        _ => Some("only https (or plain http on loopback) is followed"),
    }
}

/// Why a token realm is not asked, if it is not: it must be https, or
/// plain http on the host of a registry on loopback.
pub(super) fn realm_refusal(
    registry: &Url,
    loopback_registry: bool,
    realm: &Url,
) -> Option<&'static str> {
    match realm.scheme() {
        "https" => None,
        "http" if loopback_registry && realm.host() == registry.host() => None,
        _ => Some(
            "a token realm must be https (plain http only on the host of a registry on loopback)",
        ),
    }
}

/// Whether `url`'s host is `localhost` or a loopback address.
fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// A `WWW-Authenticate: Bearer` challenge's parameters Moat uses.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Challenge {
    pub(super) realm: String,
    pub(super) service: Option<String>,
}

/// Parses `Bearer realm="...",service="...",scope="..."` (quoted or token
/// values); `None` for another scheme or without a realm.
pub(super) fn bearer_challenge(header: &str) -> Option<Challenge> {
    let (scheme, mut rest) = header.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let (mut realm, mut service) = (None, None);
    loop {
        rest = rest.trim_start_matches([' ', ',']);
        if rest.is_empty() {
            break;
        }
        let (key, after) = rest.split_once('=')?;
        let (value, after) = if let Some(quoted) = after.strip_prefix('"') {
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next().map(|(_, c)| c)),
                    '"' => {
                        end = Some(i + 1);
                        break;
                    }
                    c => value.push(c),
                }
            }
            (value, &quoted[end?..])
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (after[..end].trim().to_owned(), &after[end..])
        };
        match key.trim().to_ascii_lowercase().as_str() {
            "realm" => realm = Some(value),
            "service" => service = Some(value),
            _ => {}
        }
        rest = after;
    }
    Some(Challenge {
        realm: realm?,
        service,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(text: &str) -> Url {
        Url::parse(text).unwrap()
    }

    #[test]
    fn redirects_keep_https_and_plain_http_stays_on_loopback() {
        let cases = [
            // (registry on loopback, from, to, followed)
            (
                false,
                "https://reg.example/v2/",
                "https://cdn.example/blob",
                true,
            ),
            (
                false,
                "https://reg.example/v2/",
                "http://cdn.example/blob",
                false,
            ),
            (
                false,
                "https://reg.example/v2/",
                "http://127.0.0.1/blob",
                false,
            ),
            (
                false,
                "https://reg.example/v2/",
                "http://localhost/blob",
                false,
            ),
            (
                false,
                "https://reg.example/v2/",
                "ftp://cdn.example/blob",
                false,
            ),
            (
                true,
                "http://127.0.0.1:5000/v2/",
                "http://127.0.0.2:80/x",
                true,
            ),
            (true, "http://127.0.0.1:5000/v2/", "http://[::1]:80/x", true),
            (
                true,
                "http://localhost:5000/v2/",
                "http://localhost:6000/x",
                true,
            ),
            (
                true,
                "http://127.0.0.1:5000/v2/",
                "http://10.0.0.1/x",
                false,
            ),
            (
                true,
                "http://127.0.0.1:5000/v2/",
                "http://cdn.example/x",
                false,
            ),
            (
                true,
                "http://127.0.0.1:5000/v2/",
                "https://cdn.example/x",
                true,
            ),
            (
                true,
                "https://cdn.example/x",
                "http://127.0.0.1:5000/y",
                false,
            ),
        ];
        for (loopback, from, to, followed) in cases {
            let refusal = redirect_refusal(loopback, &url(from), &url(to));
            assert_eq!(refusal.is_none(), followed, "{from} -> {to}: {refusal:?}");
        }
        assert_eq!(
            redirect_refusal(false, &url("https://r.example/"), &url("http://r.example/")),
            Some("a pull that is on https never goes to plain http")
        );
        assert_eq!(
            redirect_refusal(true, &url("http://127.0.0.1/"), &url("http://10.1.1.1/")),
            Some("plain http is used on loopback only")
        );
    }

    #[test]
    fn a_token_realm_is_https_or_the_loopback_registrys_own_host() {
        let cases = [
            (
                "https://reg.example/",
                false,
                "https://auth.example/token",
                true,
            ),
            (
                "https://reg.example/",
                false,
                "http://auth.example/token",
                false,
            ),
            (
                "https://reg.example/",
                false,
                "http://reg.example/token",
                false,
            ),
            (
                "https://reg.example/",
                false,
                "http://127.0.0.1/token",
                false,
            ),
            (
                "http://127.0.0.1:5000/",
                true,
                "http://127.0.0.1:5001/token",
                true,
            ),
            (
                "http://127.0.0.1:5000/",
                true,
                "http://127.0.0.2/token",
                false,
            ),
            (
                "http://127.0.0.1:5000/",
                true,
                "http://auth.example/token",
                false,
            ),
            (
                "http://127.0.0.1:5000/",
                true,
                "https://auth.example/token",
                true,
            ),
            ("http://127.0.0.1:5000/", true, "file:///etc/passwd", false),
        ];
        for (registry, loopback, realm, asked) in cases {
            let refusal = realm_refusal(&url(registry), loopback, &url(realm));
            assert_eq!(refusal.is_none(), asked, "{registry} realm {realm}");
        }
    }

    #[test]
    fn bearer_challenges_parse() {
        assert_eq!(
            bearer_challenge(
                r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull""#
            ),
            Some(Challenge {
                realm: "https://auth.example/token".into(),
                service: Some("registry.example".into()),
            })
        );
        assert_eq!(
            bearer_challenge(r#"bearer realm=https://a.example/t, service="s\"q""#),
            Some(Challenge {
                realm: "https://a.example/t".into(),
                service: Some("s\"q".into()),
            })
        );
        assert_eq!(bearer_challenge(r#"Basic realm="x""#), None);
        assert_eq!(bearer_challenge(r#"Bearer service="x""#), None);
        assert_eq!(bearer_challenge(r#"Bearer realm="unterminated"#), None);
    }
}
