use super::manifest::wasm_layer;
use super::*;

const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

#[test]
fn references_parse_and_print_back() {
    for text in [
        format!("oci://ghcr.io/microsoft/time-server-js@sha256:{HEX}"),
        format!("oci://127.0.0.1:5000/a/b:v1.2@sha256:{HEX}"),
        "oci://localhost:5000/x:latest".to_owned(),
        format!("oci://[::1]:5000/x@sha256:{HEX}"),
    ] {
        let parsed: OciRef = text.parse().unwrap();
        assert_eq!(parsed.to_string(), text);
    }
    let r: OciRef = "oci://reg.example:443/team/tool:1.0".parse().unwrap();
    assert_eq!(
        (r.registry.as_str(), r.repository.as_str(), r.tag.as_deref()),
        ("reg.example:443", "team/tool", Some("1.0"))
    );
    assert!(!r.is_loopback());
    for loopback in [
        "localhost:5000",
        "127.0.0.1:5000",
        "127.1.2.3",
        "[::1]:5000",
    ] {
        let r: OciRef = format!("oci://{loopback}/x:t").parse().unwrap();
        assert!(r.is_loopback(), "{loopback}");
    }
}

#[test]
fn bad_references_name_what_is_wrong() {
    let cases = [
        ("https://ghcr.io/x:1", "starts with oci://"),
        ("oci://ghcr.io", "expected oci://HOST/REPOSITORY"),
        ("oci://ghcr.io/x", "name a tag"),
        ("oci://ghcr.io/X:1", "not a repository name"),
        ("oci://ghcr.io/x:-1", "not a tag"),
        ("oci://ghcr.io/x@md5:00", "sha256:<64 hex digits>"),
        ("oci://ghcr.io/x@sha256:00", "64 hex digits, found 2"),
        ("oci://user@ghcr.io/x:1", "not a registry host"),
        ("oci://ghcr.io:0/x:1", "port must be a number"),
        ("oci://ghcr.io:http/x:1", "port must be a number"),
        ("oci:///x:1", "registry host is empty"),
        ("oci://ghcr.io/a//b:1", "not a repository name"),
        ("oci://[::1/x:1", "[ADDRESS]:PORT"),
    ];
    for (text, expected) in cases {
        let error = text.parse::<OciRef>().unwrap_err().to_string();
        assert!(error.contains(expected), "{text}: {error}");
    }
}

fn manifest(layers: &str) -> Vec<u8> {
    format!(
        r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST_MEDIA_TYPE}","config":{{"mediaType":"application/vnd.wasm.config.v0+json","digest":"sha256:{HEX}","size":2}},"layers":[{layers}]}}"#
    )
    .into_bytes()
}

#[test]
fn only_one_wasm_layer_is_a_component() {
    let r: OciRef = "oci://localhost/x:t".parse().unwrap();
    let layer = |media: &str, size: i64| {
        format!(r#"{{"mediaType":"{media}","digest":"sha256:{HEX}","size":{size}}}"#)
    };
    let (digest, size) = wasm_layer(&r, &manifest(&layer("application/wasm", 7))).unwrap();
    assert_eq!((digest.to_string().as_str(), size), (HEX, 7));
    let cases = [
        (manifest(""), "it has 0 layers"),
        (
            manifest(&format!(
                "{},{}",
                layer("application/wasm", 1),
                layer("application/wasm", 1)
            )),
            "it has 2 layers",
        ),
        (
            manifest(&layer("application/vnd.oci.image.layer.v1.tar", 1)),
            "media type application/vnd.oci.image.layer.v1.tar",
        ),
        (
            manifest(&layer("application/wasm", -1)),
            "size -1 is negative",
        ),
        (
            manifest(&layer("application/wasm", MAX_COMPONENT_BYTES as i64 + 1)),
            "above the limit",
        ),
        (
            br#"{"schemaVersion":2,"manifests":[]}"#.to_vec(),
            "image index",
        ),
        (b"not json".to_vec(), "not JSON"),
    ];
    for (raw, expected) in cases {
        let error = wasm_layer(&r, &raw).unwrap_err().to_string();
        assert!(error.contains(expected), "{expected}: {error}");
    }
}

#[test]
fn a_stored_manifest_that_was_altered_is_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path());
    let component = b"\0asm component bytes";
    let layer = Digest::of(component);
    let raw = format!(
        r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST_MEDIA_TYPE}","config":{{"mediaType":"application/vnd.wasm.config.v0+json","digest":"sha256:{HEX}","size":2}},"layers":[{{"mediaType":"application/wasm","digest":"sha256:{layer}","size":{}}}]}}"#,
        component.len()
    );
    let manifest = Digest::of(raw.as_bytes());
    let reference: OciRef = format!("oci://localhost/x@sha256:{manifest}")
        .parse()
        .unwrap();
    assert_eq!(store.stored(&reference).unwrap(), None, "empty store");
    store.write_blob(manifest, raw.as_bytes()).unwrap();
    assert_eq!(store.stored(&reference).unwrap(), None, "no layer yet");
    store.write_blob(layer, component).unwrap();
    let pulled = store.stored(&reference).unwrap().unwrap();
    assert_eq!((pulled.layer, pulled.fetched), (layer, false));
    assert_eq!(std::fs::read(&pulled.path).unwrap(), component);
    std::fs::write(store.blob(manifest), raw.replace("wasm\"", "wasm \"")).unwrap();
    assert_eq!(store.stored(&reference).unwrap(), None, "altered manifest");
}
