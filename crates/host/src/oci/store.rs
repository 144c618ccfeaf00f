//! Moat's content-addressed store of OCI blobs, and the pull into it: a
//! manifest kept only once it hashes to its digest, a component only once
//! it hashes to the layer digest and has the declared size.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use sha2::Digest as _;

use super::manifest::wasm_layer;
use super::{
    MAX_MANIFEST_BYTES, OCI_INDEX_MEDIA_TYPE, OCI_MANIFEST_MEDIA_TYPE, OciError, OciRef, Pulled,
    registry,
};
use crate::identity::Digest;

/// Moat's content-addressed store of OCI blobs.
#[derive(Clone, Debug)]
pub struct Store {
    root: PathBuf,
}

impl Store {
    /// The store at `root` (created at the first pull).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// `<package store>/oci`, when a data directory is known.
    pub fn default_root() -> Option<PathBuf> {
        crate::dirs::store().map(|store| store.join("oci"))
    }

    /// The store's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn blobs(&self) -> PathBuf {
        self.root.join("blobs").join("sha256")
    }

    /// Where the blob with `digest` is kept.
    pub fn blob(&self, digest: Digest) -> PathBuf {
        self.blobs().join(digest.to_string())
    }

    /// The component that `reference` names, from the store alone: only a
    /// reference with a digest can be, and only when both its manifest and
    /// its layer are stored. The manifest is read and hashed again (a few
    /// hundred bytes); the component is measured at launch like any other.
    pub fn stored(&self, reference: &OciRef) -> Result<Option<Pulled>, OciError> {
        let Some(manifest) = reference.digest else {
            return Ok(None);
        };
        let path = self.blob(manifest);
        let raw = match read_bounded(&path, MAX_MANIFEST_BYTES) {
            Ok(raw) => raw,
            Err(source) if source.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(OciError::Io { path, source }),
        };
        if Digest::of(&raw) != manifest {
            // Damaged or replaced: pulled again over it.
            tracing::warn!(path = %path.display(), "stored manifest does not match its digest; pulling it again");
            return Ok(None);
        }
        let (layer, size) = wasm_layer(reference, &raw)?;
        let component = self.blob(layer);
        match std::fs::metadata(&component) {
            Ok(meta) if meta.len() == size => Ok(Some(Pulled {
                reference: reference.clone(),
                manifest,
                layer,
                size,
                path: component,
                fetched: false,
            })),
            Ok(_) => Ok(None),
            Err(source) if source.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(OciError::Io {
                path: component,
                source,
            }),
        }
    }

    /// Resolves `reference` to a stored component, downloading what the
    /// store lacks: with a digest and everything stored, nothing is
    /// fetched; a tag is looked up. Progress goes to stderr when it is a
    /// terminal.
    pub async fn pull(&self, reference: &OciRef) -> Result<Pulled, OciError> {
        if let Some(pulled) = self.stored(reference)? {
            return Ok(pulled);
        }
        let shown = reference.to_string();
        let mut registry = registry::Registry::new(reference)?;
        let target = match (reference.digest, &reference.tag) {
            (Some(digest), _) => format!("sha256:{digest}"),
            (None, Some(tag)) => tag.clone(),
            (None, None) => "latest".to_owned(),
        };
        tracing::info!(reference = %shown, "fetching manifest");
        let raw = registry
            .manifest(
                &target,
                &format!("{OCI_MANIFEST_MEDIA_TYPE}, {OCI_INDEX_MEDIA_TYPE}"),
                MAX_MANIFEST_BYTES as u64,
            )
            .await?;
        let manifest = Digest::of(&raw);
        if let Some(expected) = reference.digest
            && expected != manifest
        {
            return Err(OciError::ManifestDigest {
                reference: shown,
                expected,
                actual: manifest,
            });
        }
        let (layer, size) = wasm_layer(reference, &raw)?;
        let resolved = reference.with_digest(manifest);
        self.write_blob(manifest, &raw)?;
        if let Some(pulled) = self.stored(&resolved)? {
            return Ok(pulled);
        }
        let progress = Progress::start(&shown, size);
        let mut file = self.new_blob()?;
        let mut hasher = sha2::Sha256::new();
        let received = registry
            .blob(&format!("sha256:{layer}"), size, |chunk| {
                hasher.update(chunk);
                file.write_all(chunk).map_err(|source| OciError::Io {
                    path: file.path().to_owned(),
                    source,
                })
            })
            .await?;
        let actual = Digest::from_bytes(hasher.finalize().into());
        if received != size || actual != layer {
            return Err(OciError::Layer {
                reference: shown,
                expected: layer,
                detail: format!("are {received} bytes hashing to sha256:{actual}"),
            });
        }
        let path = self.keep_blob(file, layer)?;
        progress.done();
        Ok(Pulled {
            reference: resolved,
            manifest,
            layer,
            size,
            path,
            fetched: true,
        })
    }

    /// Writes a verified blob into its place whole.
    pub(super) fn write_blob(&self, digest: Digest, bytes: &[u8]) -> Result<(), OciError> {
        let mut file = self.new_blob()?;
        file.write_all(bytes).map_err(|source| OciError::Io {
            path: file.path().to_owned(),
            source,
        })?;
        self.keep_blob(file, digest).map(drop)
    }

    /// A temporary file beside the blobs, gone unless kept.
    fn new_blob(&self) -> Result<tempfile::NamedTempFile, OciError> {
        let blobs = self.blobs();
        create_dir(&blobs)?;
        tempfile::NamedTempFile::new_in(&blobs).map_err(|source| OciError::Io {
            path: blobs,
            source,
        })
    }

    /// Syncs `file` and renames it into the place of the blob `digest`.
    fn keep_blob(
        &self,
        file: tempfile::NamedTempFile,
        digest: Digest,
    ) -> Result<PathBuf, OciError> {
        let path = self.blob(digest);
        file.as_file().sync_all().map_err(|source| OciError::Io {
            path: file.path().to_owned(),
            source,
        })?;
        file.persist(&path).map_err(|e| OciError::Io {
            path: path.clone(),
            source: e.error,
        })?;
        Ok(path)
    }
}

fn create_dir(path: &Path) -> Result<(), OciError> {
    std::fs::create_dir_all(path).map_err(|source| OciError::Io {
        path: path.to_owned(),
        source,
    })
}

/// Reads at most `limit` bytes of `path`; a longer file is an error.
fn read_bounded(path: &Path, limit: usize) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let file = std::fs::File::open(path)?;
    let mut bytes = Vec::new();
    file.take(limit as u64 + 1).read_to_end(&mut bytes)?;
    if bytes.len() > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {limit} bytes"),
        ));
    }
    Ok(bytes)
}

/// The download's line on stderr, when that is a terminal.
struct Progress {
    shown: Option<(String, std::time::Instant)>,
}

impl Progress {
    fn start(reference: &str, size: u64) -> Self {
        use std::io::IsTerminal as _;
        tracing::info!(reference, bytes = size, "pulling component");
        let shown = std::io::stderr().is_terminal().then(|| {
            eprintln!(
                "moat: pulling {} ({} KiB)...",
                crate::text::printable(reference),
                size.div_ceil(1024)
            );
            (reference.to_owned(), std::time::Instant::now())
        });
        Self { shown }
    }

    fn done(self) {
        if let Some((reference, started)) = self.shown {
            eprintln!(
                "moat: pulled {} in {:.1} s",
                crate::text::printable(&reference),
                started.elapsed().as_secs_f64()
            );
        }
    }
}
