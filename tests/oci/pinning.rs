//! What is pulled is what is pinned: a digest reference is pulled once and
//! locked, a tag alone needs consent, a pin other than the manifest's layer,
//! a missing manifest, an artifact that is not one wasm layer and a registry
//! serving other bytes than its manifest names are refused.

use super::*;

#[test]
fn a_digest_reference_is_pulled_once_pinned_by_its_manifest_and_locked() {
    let mut registry = Registry::start();
    let manifest = registry.push("moat/everything:v1", Path::new(guests::EVERYTHING_WASM));
    let layer = digest_of(guests::EVERYTHING_WASM);
    let reference = format!(
        "oci://{}/moat/everything:v1@sha256:{manifest}",
        registry.addr
    );
    let work = Workspace::new();
    // A digest pins the component through its manifest: no `sha256` and no
    // `allow_unmeasured` needed.
    work.write(&format!("wasm = \"{reference}\""));

    let pulled = work.ok(&["pull"]);
    assert!(pulled.starts_with(&format!("{reference}\n")), "{pulled}");
    assert!(
        pulled.contains(&format!("component sha256:{layer} (")),
        "{pulled}"
    );
    assert!(pulled.contains("pulled to"), "{pulled}");
    let stored = work.store().join(format!("blobs/sha256/{layer}"));
    assert_eq!(
        std::fs::read(&stored).unwrap(),
        std::fs::read(guests::EVERYTHING_WASM).unwrap()
    );
    assert_eq!(registry.blob_gets(layer), 1);

    let tools = work.ok(&["tools", "tool"]);
    assert!(tools.contains("echo"), "{tools}");
    assert!(
        tools.contains(&format!(
            "oci       {reference} (manifest sha256:{manifest})"
        )),
        "{tools}"
    );
    work.ok(&["lock"]);
    let lock: toml::Value =
        toml::from_str(&std::fs::read_to_string(work.dir.path().join("moat.lock")).unwrap())
            .unwrap();
    let server = &lock["servers"]["tool"];
    assert_eq!(server["sha256"].as_str(), Some(layer.to_string().as_str()));
    assert_eq!(
        server["oci"]["reference"].as_str(),
        Some(reference.as_str())
    );
    assert_eq!(
        server["oci"]["manifest"].as_str(),
        Some(manifest.to_string().as_str())
    );
    assert_eq!(
        server["oci"]["layer"].as_str(),
        Some(layer.to_string().as_str())
    );
    assert_eq!(registry.blob_gets(layer), 1, "launches use the store");

    // With the registry gone, everything still runs from the store.
    registry.stop();
    let again = work.ok(&["pull"]);
    assert!(again.contains("already in"), "{again}");
    let tools = work.ok(&["tools", "--locked", "tool"]);
    assert!(tools.contains("echo"), "{tools}");
}

#[test]
fn a_tag_alone_needs_consent_and_under_the_lock_a_moved_tag_changes_nothing() {
    let registry = Registry::start();
    let first = registry.push("moat/tool:latest", Path::new(guests::EVERYTHING_WASM));
    let reference = format!("oci://{}/moat/tool:latest", registry.addr);
    let work = Workspace::new();
    work.write(&format!("wasm = \"{reference}\""));
    let refused = work.fails(&["tools", "tool"]);
    assert!(
        refused.contains("server `tool` has no sha256 pinned: refusing an unmeasured launch"),
        "{refused}"
    );
    assert!(
        !work.store().exists(),
        "nothing is pulled for a refused launch"
    );

    work.write(&format!("wasm = \"{reference}\"\nallow_unmeasured = true"));
    work.ok(&["lock"]);
    let lock = std::fs::read_to_string(work.dir.path().join("moat.lock")).unwrap();
    assert!(lock.contains(&format!("manifest = \"{first}\"")), "{lock}");

    // The tag moves to another component.
    let second = registry.push("moat/tool:latest", Path::new(guests::FUZZABLE_WASM));
    assert_ne!(first, second);
    let locked = work.ok(&["tools", "--locked", "tool"]);
    assert!(
        locked.contains("echo"),
        "the locked manifest runs: {locked}"
    );
    assert!(!locked.contains("countdown"), "{locked}");
    let moved = work.ok(&["pull"]);
    assert!(moved.contains(&format!("@sha256:{second}")), "{moved}");
    assert_eq!(registry.blob_gets(digest_of(guests::FUZZABLE_WASM)), 1);
    work.ok(&["pull"]);
    assert_eq!(
        registry.blob_gets(digest_of(guests::FUZZABLE_WASM)),
        1,
        "a tag is looked up again, its component is not downloaded again"
    );

    // Naming the new manifest conflicts with the lock until `moat lock`.
    work.write(&format!("wasm = \"{reference}@sha256:{second}\""));
    let conflict = work.fails(&["tools", "--locked", "tool"]);
    assert!(
        conflict.contains(&format!(
            "server `tool`: the config names {reference}@sha256:{second} but the lock approved {reference} (manifest sha256:{first})"
        )),
        "{conflict}"
    );
    work.ok(&["lock"]);
    let unlocked = work.ok(&["tools", "--locked", "tool"]);
    assert!(unlocked.contains("countdown"), "{unlocked}");
}

#[test]
fn a_pin_other_than_the_manifests_layer_and_a_missing_manifest_are_refused() {
    let registry = Registry::start();
    let manifest = registry.push("moat/everything:v1", Path::new(guests::EVERYTHING_WASM));
    let layer = digest_of(guests::EVERYTHING_WASM);
    let other = digest_of(guests::FUZZABLE_WASM);
    let reference = format!("oci://{}/moat/everything@sha256:{manifest}", registry.addr);
    let work = Workspace::new();
    work.write(&format!("wasm = \"{reference}\"\nsha256 = \"{other}\""));
    let refused = work.fails(&["tools", "tool"]);
    assert!(
        refused.contains(&format!(
            "server `tool`: {reference} names the component sha256:{layer}, but sha256:{other} is pinned: refused"
        )),
        "{refused}"
    );

    let unknown = format!("oci://{}/moat/everything@sha256:{other}", registry.addr);
    work.write(&format!("wasm = \"{unknown}\""));
    let missing = work.fails(&["tools", "tool"]);
    assert!(
        missing.contains(&format!("pulling {unknown}: manifest: ")),
        "{missing}"
    );
}

#[test]
fn an_artifact_that_is_not_one_wasm_layer_is_refused_by_name() {
    let registry = Registry::start();
    let reference: oci_client::Reference =
        format!("{}/moat/image:v1", registry.addr).parse().unwrap();
    runtime().block_on(async {
        let layer = oci_client::client::ImageLayer::new(
            b"not a component".to_vec(),
            "application/vnd.oci.image.layer.v1.tar".into(),
            None,
        );
        let config = oci_client::client::Config::new(
            b"{}".to_vec(),
            "application/vnd.oci.image.config.v1+json".into(),
            None,
        );
        plain_client()
            .push(
                &reference,
                &[layer],
                config,
                &oci_client::secrets::RegistryAuth::Anonymous,
                None,
            )
            .await
            .unwrap();
    });
    let work = Workspace::new();
    work.write("wasm = \"oci://127.0.0.1:1/x:1\"");
    let shown = format!("oci://{}/moat/image:v1", registry.addr);
    let refused = work.fails(&["pull", &shown]);
    assert!(
        refused.contains(&format!(
            "pulling {shown}: not a wasm component artifact: its layer has media type application/vnd.oci.image.layer.v1.tar, not application/wasm"
        )),
        "{refused}"
    );
}

/// A registry that serves an honest manifest and then, for its layer, the
/// component with one byte changed (same length).
fn hostile_registry(manifest: Vec<u8>, blob: Vec<u8>) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                match stream.read(&mut byte) {
                    Ok(1) => head.push(byte[0]),
                    _ => break,
                }
            }
            let head = String::from_utf8_lossy(&head);
            let path = head.split(' ').nth(1).unwrap_or("");
            let (kind, body): (&str, &[u8]) = if path.contains("/manifests/") {
                ("application/vnd.oci.image.manifest.v1+json", &manifest)
            } else if path.contains("/blobs/") {
                ("application/octet-stream", &blob)
            } else {
                ("application/json", b"{}")
            };
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(body);
        }
    });
    addr
}

#[test]
fn a_registry_serving_other_bytes_than_its_manifest_names_is_refused() {
    let component = std::fs::read(guests::EVERYTHING_WASM).unwrap();
    let layer = Digest::of(&component);
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.wasm.config.v0+json","digest":"sha256:{layer}","size":2}},"layers":[{{"mediaType":"application/wasm","digest":"sha256:{layer}","size":{}}}]}}"#,
        component.len()
    )
    .into_bytes();
    let mut tampered = component.clone();
    let last = tampered.len() - 1;
    tampered[last] ^= 1;
    let addr = hostile_registry(manifest.clone(), tampered);
    let work = Workspace::new();

    let honest = Digest::of(&manifest);
    let reference = format!("oci://{addr}/moat/everything@sha256:{honest}");
    work.write(&format!("wasm = \"{reference}\""));
    let refused = work.fails(&["tools", "tool"]);
    assert!(
        refused.contains(&format!(
            "pulling {reference}: the layer's bytes are {} bytes hashing to sha256:",
            component.len()
        )),
        "{refused}"
    );
    assert!(
        refused.contains(&format!(
            ", not the layer sha256:{layer} the manifest names: refused"
        )),
        "{refused}"
    );
    assert!(
        !work.store().join(format!("blobs/sha256/{layer}")).exists(),
        "no component is stored"
    );

    // The reference names another manifest than the one served.
    let wrong = format!("oci://{addr}/moat/everything@sha256:{layer}");
    work.write(&format!("wasm = \"{wrong}\""));
    let refused = work.fails(&["tools", "tool"]);
    assert!(
        refused.contains(&format!(
            "pulling {wrong}: the registry's manifest hashes to sha256:{honest}, not the digest the reference names (sha256:{layer}): refused"
        )),
        "{refused}"
    );
    assert!(
        !work.store().join(format!("blobs/sha256/{layer}")).exists(),
        "{refused}"
    );
}
