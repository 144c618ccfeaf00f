//! A hostile registry's answers are cut off at their caps in bounded memory:
//! an endless manifest, an endless token answer, and a blob longer than its
//! manifest declares.

use super::*;

/// What an endless answer sends at most: far above every cap, so a client
/// that reads it whole holds at least this much.
const ENDLESS: u64 = 128 << 20;

/// The peak resident memory a refused pull may reach, in KiB: the caps
/// (4 MiB at most) and the process itself (about 35 MiB), half of
/// [`ENDLESS`].
const PEAK_KIB: u64 = 64 << 10;

/// What an endless answer may have sent when moat stopped reading at a
/// cap of at most 4 MiB: that, plus what loopback's socket buffers hold.
const CUT_OFF: u64 = 32 << 20;

/// Answers 200 with a chunked body of spaces that goes on (up to
/// [`ENDLESS`] bytes, or until the client hangs up), counting into `sent`.
fn answer_endless(stream: &mut std::net::TcpStream, kind: &str, sent: &AtomicU64) {
    if write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    .is_err()
    {
        return;
    }
    let chunk = vec![b' '; 64 << 10];
    while sent.load(Ordering::SeqCst) < ENDLESS {
        let framed = write!(stream, "{:x}\r\n", chunk.len())
            .and_then(|()| stream.write_all(&chunk))
            .and_then(|()| stream.write_all(b"\r\n"));
        if framed.is_err() {
            return;
        }
        sent.fetch_add(chunk.len() as u64, Ordering::SeqCst);
    }
    let _ = stream.write_all(b"0\r\n\r\n");
}

#[test]
fn an_endless_manifest_is_refused_at_its_cap_in_bounded_memory() {
    let sent = Arc::new(AtomicU64::new(0));
    let counted = sent.clone();
    let addr = scripted_registry(move |path, stream| {
        if path.contains("/manifests/") {
            answer_endless(
                stream,
                "application/vnd.oci.image.manifest.v1+json",
                &counted,
            );
        } else {
            answer_with(stream, "application/json", b"{}");
        }
    });
    let work = Workspace::new();
    let reference = format!("oci://{addr}/moat/endless:v1");
    let (refused, peak) = work.fails_measured(&["pull", &reference]);
    assert!(
        refused.contains(&format!(
            "pulling {reference}: manifest: the answer from http://{addr}/v2/moat/endless/manifests/v1 runs past {} bytes (the manifest limit): refused",
            moat_host::oci::MAX_MANIFEST_BYTES
        )),
        "{refused}"
    );
    assert!(
        peak < PEAK_KIB,
        "moat's peak resident memory was {peak} KiB, above {PEAK_KIB} KiB"
    );
    let sent = sent.load(Ordering::SeqCst);
    assert!(sent < CUT_OFF, "moat read on: {sent} bytes were sent");
    assert_eq!(work.blobs(), Vec::<String>::new(), "nothing is stored");
}

#[test]
fn an_endless_token_answer_is_refused_at_its_cap_in_bounded_memory() {
    let sent = Arc::new(AtomicU64::new(0));
    let counted = sent.clone();
    let addr = Arc::new(Mutex::new(String::new()));
    let realm = addr.clone();
    let registry = scripted_registry(move |path, stream| {
        if path.starts_with("/token") {
            answer_endless(stream, "application/json", &counted);
        } else {
            let _ = write!(
                stream,
                "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer realm=\"http://{}/token\",service=\"moat-test\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                realm.lock().unwrap()
            );
        }
    });
    *addr.lock().unwrap() = registry.clone();
    let work = Workspace::new();
    let reference = format!("oci://{registry}/moat/endless:v1");
    let (refused, peak) = work.fails_measured(&["pull", &reference]);
    assert!(
        refused.contains(&format!(
            "pulling {reference}: token: the answer from http://{registry}/token?scope=repository%3Amoat%2Fendless%3Apull&service=moat-test runs past {} bytes (the token answer limit): refused",
            moat_host::oci::MAX_TOKEN_BYTES
        )),
        "{refused}"
    );
    assert!(
        peak < PEAK_KIB,
        "moat's peak resident memory was {peak} KiB, above {PEAK_KIB} KiB"
    );
    let sent = sent.load(Ordering::SeqCst);
    assert!(sent < CUT_OFF, "moat read on: {sent} bytes were sent");
    assert_eq!(work.blobs(), Vec::<String>::new(), "nothing is stored");
}

#[test]
fn a_blob_longer_than_its_manifest_declares_is_refused_at_the_declared_size() {
    let component = std::fs::read(guests::EVERYTHING_WASM).unwrap();
    let layer = Digest::of(&component);
    let manifest = component_manifest(layer, component.len());
    let honest = Digest::of(&manifest);
    let sent = Arc::new(AtomicU64::new(0));
    let counted = sent.clone();
    let addr = scripted_registry(move |path, stream| {
        if path.contains("/manifests/") {
            answer_with(
                stream,
                "application/vnd.oci.image.manifest.v1+json",
                &manifest,
            );
        } else if path.contains("/blobs/") {
            // The component's bytes would do; an endless answer shows
            // that nothing past the declared size is read.
            answer_endless(stream, "application/octet-stream", &counted);
        } else {
            answer_with(stream, "application/json", b"{}");
        }
    });
    let work = Workspace::new();
    let reference = format!("oci://{addr}/moat/everything@sha256:{honest}");
    let (refused, peak) = work.fails_measured(&["pull", &reference]);
    assert!(
        refused.contains(&format!(
            "pulling {reference}: component: the answer from http://{addr}/v2/moat/everything/blobs/sha256:{layer} runs past {} bytes (the size the manifest declares): refused",
            component.len()
        )),
        "{refused}"
    );
    assert!(
        peak < PEAK_KIB,
        "moat's peak resident memory was {peak} KiB, above {PEAK_KIB} KiB"
    );
    let sent = sent.load(Ordering::SeqCst);
    assert!(sent < CUT_OFF, "moat read on: {sent} bytes were sent");
    assert_eq!(
        work.blobs(),
        vec![honest.to_string()],
        "the verified manifest is kept; no component, no temporary file"
    );
}
