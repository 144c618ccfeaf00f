//! The `measure` paths: a file's digest, or a directory's listing of every
//! file's digest and every link's text, links kept inside what is measured.

use std::path::{Path, PathBuf};

use super::hash_reader;
use crate::identity::Digest;
use crate::native::NativeError;

/// The digest of a measured file, or of a directory: every regular file
/// below it in path order, each as its relative path and digest, and every
/// link as its relative path and its text. A link must stay inside `path` or
/// reach into another of `roots` (the other measured paths, canonical), so
/// whatever it can reach is measured too; one that leaves them, or whose
/// target is missing, is refused.
pub fn measure_path(path: &Path, roots: &[PathBuf]) -> Result<Digest, NativeError> {
    let meta = std::fs::symlink_metadata(path).map_err(|source| NativeError::Io {
        syscall: "lstat",
        path: path.to_owned(),
        source,
    })?;
    if meta.is_symlink() {
        return Err(NativeError::MeasureLink {
            link: path.to_owned(),
            text: std::fs::read_link(path).unwrap_or_default(),
            why: format!(
                "a measure path may not be a link: measure its target {}",
                std::fs::canonicalize(path)
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|_| "(missing)".into())
            ),
        });
    }
    if meta.is_file() {
        let file = std::fs::File::open(path).map_err(|source| NativeError::Io {
            syscall: "open",
            path: path.to_owned(),
            source,
        })?;
        return hash_reader(file, path);
    }
    if !meta.is_dir() {
        return Err(NativeError::NotRegular {
            path: path.to_owned(),
        });
    }
    let root = std::fs::canonicalize(path).map_err(|source| NativeError::Io {
        syscall: "realpath",
        path: path.to_owned(),
        source,
    })?;
    let mut entries = Vec::new();
    collect_files(path, path, &mut entries)?;
    entries.sort();
    let mut listing = String::new();
    for (relative, link) in entries {
        let full = path.join(&relative);
        match link {
            None => {
                let digest = measure_path(&full, roots)?;
                listing.push_str(&format!("{digest}  {}\n", relative.display()));
            }
            Some(text) => {
                let why = match std::fs::canonicalize(&full) {
                    Err(_) => Some("its target does not exist".to_owned()),
                    Ok(reached)
                        if !reached.starts_with(&root)
                            && !roots.iter().any(|r| reached.starts_with(r)) =>
                    {
                        Some(format!(
                            "it reaches {}, outside {} and every other measured path: measure that too, or remove the link",
                            reached.display(),
                            path.display()
                        ))
                    }
                    Ok(_) => None,
                };
                if let Some(why) = why {
                    return Err(NativeError::MeasureLink {
                        link: full,
                        text,
                        why,
                    });
                }
                listing.push_str(&format!(
                    "link  {} -> {}\n",
                    relative.display(),
                    text.display()
                ));
            }
        }
    }
    Ok(Digest::of(listing.as_bytes()))
}

/// Every regular file (`None`) and link (`Some(text)`) below `dir`, relative
/// to `root`; links are listed, never followed.
fn collect_files(
    root: &Path,
    dir: &Path,
    out: &mut Vec<(PathBuf, Option<PathBuf>)>,
) -> Result<(), NativeError> {
    let entries = std::fs::read_dir(dir).map_err(|source| NativeError::Io {
        syscall: "opendir",
        path: dir.to_owned(),
        source,
    })?;
    for entry in entries {
        let entry = entry.map_err(|source| NativeError::Io {
            syscall: "readdir",
            path: dir.to_owned(),
            source,
        })?;
        let path = entry.path();
        let kind = entry.file_type().map_err(|source| NativeError::Io {
            syscall: "lstat",
            path: path.clone(),
            source,
        })?;
        let relative = || path.strip_prefix(root).unwrap_or(&path).to_owned();
        if kind.is_dir() {
            collect_files(root, &path, out)?;
        } else if kind.is_file() {
            out.push((relative(), None));
        } else if kind.is_symlink() {
            let text = std::fs::read_link(&path).map_err(|source| NativeError::Io {
                syscall: "readlink",
                path: path.clone(),
                source,
            })?;
            out.push((relative(), Some(text)));
        }
    }
    Ok(())
}

/// Digests of every `measure` path, off the async runtime. `executable`
/// names the launch in errors; a link in a measured directory may also
/// reach the files in `also` (the executable and its interpreter, measured
/// in the identity themselves), as a virtualenv's `bin/python` does.
pub(in crate::native) async fn measure_all(
    paths: Vec<PathBuf>,
    executable: &Path,
    also: Vec<PathBuf>,
) -> Result<Vec<(PathBuf, Digest)>, NativeError> {
    tokio::task::spawn_blocking(move || {
        let roots: Vec<PathBuf> = paths
            .iter()
            .filter_map(|p| std::fs::canonicalize(p).ok())
            .chain(also)
            .collect();
        paths
            .iter()
            .map(|path| measure_path(path, &roots).map(|digest| (path.clone(), digest)))
            .collect::<Result<Vec<_>, _>>()
    })
    .await
    .map_err(|error| NativeError::Spawn {
        path: executable.to_owned(),
        source: std::io::Error::other(error.to_string()),
    })?
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 12, item 3: pnpm's `node_modules` is mostly links. A link's
    /// text is part of the digest, so re-pointing it changes the identity;
    /// a link out of the measured set is refused unless its target is
    /// measured too.
    #[test]
    fn links_are_measured_and_may_not_leave_the_measured_paths() {
        let root = tempfile::tempdir().unwrap();
        let package = root.path().join("package");
        std::fs::create_dir(&package).unwrap();
        std::fs::write(package.join("a.js"), "good").unwrap();
        std::fs::write(package.join("b.js"), "evil").unwrap();
        std::os::unix::fs::symlink("a.js", package.join("entry.js")).unwrap();
        let before = measure_path(&package, &[]).unwrap();
        std::fs::remove_file(package.join("entry.js")).unwrap();
        std::os::unix::fs::symlink("b.js", package.join("entry.js")).unwrap();
        let after = measure_path(&package, &[]).unwrap();
        assert_ne!(before, after, "a re-pointed link changes the digest");

        let outside = root.path().join("store");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("lib.js"), "lib").unwrap();
        std::os::unix::fs::symlink(outside.join("lib.js"), package.join("lib.js")).unwrap();
        match measure_path(&package, &[]).unwrap_err() {
            NativeError::MeasureLink { link, why, .. } => {
                assert_eq!(link, package.join("lib.js"));
                assert!(why.contains("outside"), "{why}");
            }
            other => panic!("{other}"),
        }
        let roots = [std::fs::canonicalize(&outside).unwrap()];
        measure_path(&package, &roots).expect("the target is measured explicitly");

        std::os::unix::fs::symlink("missing.js", package.join("gone.js")).unwrap();
        match measure_path(&package, &roots).unwrap_err() {
            NativeError::MeasureLink { why, .. } => {
                assert_eq!(why, "its target does not exist")
            }
            other => panic!("{other}"),
        }
        std::fs::remove_file(package.join("gone.js")).unwrap();

        // A measure path that is itself a link names its target.
        let alias = root.path().join("alias");
        std::os::unix::fs::symlink(&package, &alias).unwrap();
        assert!(matches!(
            measure_path(&alias, &roots).unwrap_err(),
            NativeError::MeasureLink { .. }
        ));
    }
}
