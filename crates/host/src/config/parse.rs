//! The document: `moat.toml`'s text read into a [`Config`], relative paths
//! resolved against the config's own directory, each server's entry handed
//! to [`super::server`], then every `rw` grant held against what every
//! native server runs.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

use super::server::{self, RawServer, valid_server_name};
use super::{Config, ConfigError, DirMode, ServeSettings, WasmSettings, Writer};
#[cfg(unix)]
use super::{ServerKind, ServerSpec};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    servers: BTreeMap<Spanned<String>, Spanned<RawServer>>,
    #[serde(default)]
    serve: ServeSettings,
    #[serde(default)]
    wasm: WasmSettings,
    #[serde(default)]
    nodes: BTreeMap<Spanned<String>, super::node::RawNode>,
}

/// The directory relative paths in the config at `path` are resolved
/// against, canonical: every path that enters an execution identity (a
/// server's `cwd`, its `measure` paths, its grants) is then the same
/// whichever way the config was named (`moat.toml`, `./moat.toml`, an
/// absolute path, a path through a symbolic link). A directory that cannot
/// be resolved (a config parsed from text alone) stays as written, made
/// absolute against the working directory where that is possible.
fn canonical_base(path: &Path) -> PathBuf {
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::canonicalize(parent)
        .or_else(|_| std::path::absolute(parent))
        .unwrap_or_else(|_| parent.to_owned())
}

impl Config {
    /// Validates `text` as the config found at `path` (relative paths in it
    /// are resolved against `path`'s directory).
    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        let invalid = |span: Option<Range<usize>>, message: String| {
            let (line, column) =
                span.map_or((1, 1), |span| crate::text::line_column(text, span.start));
            ConfigError::Invalid {
                path: path.to_owned(),
                line,
                column,
                message,
            }
        };
        let raw: RawConfig = toml::from_str(text)
            .map_err(|error| invalid(error.span(), error.message().to_owned()))?;
        let base = canonical_base(path);
        let base = base.as_path();
        let nodes = super::node::nodes(raw.nodes, &invalid)?;
        let mut servers = BTreeMap::new();
        for (name, server) in raw.servers {
            let name_span = name.span();
            let name = name.into_inner();
            if !valid_server_name(&name) {
                return Err(invalid(
                    Some(name_span),
                    format!(
                        "server name `{name}` must be 1-32 characters of A-Z, a-z, 0-9, `-` or `_`, without `__` and not beginning or ending with `_` (exposed names are `server__tool` and must split one way only)"
                    ),
                ));
            }
            servers.insert(
                name.clone(),
                server::spec(name, server, base, &nodes, &invalid)?,
            );
        }
        let writers: Vec<Writer> = servers
            .values()
            .flat_map(|spec| {
                spec.dirs
                    .iter()
                    .filter(|d| d.mode == DirMode::Rw)
                    .map(|d| Writer {
                        server: spec.name.clone(),
                        grant: d.host.clone(),
                    })
            })
            .collect();
        for spec in servers.values_mut() {
            spec.writers = writers.clone();
        }
        #[cfg(unix)]
        for spec in servers.values() {
            check_writers(spec).map_err(|source| ConfigError::Writer {
                path: path.to_owned(),
                source: Box::new(source),
            })?;
        }
        Ok(Self {
            path: path.to_owned(),
            servers,
            serve: raw.serve,
            wasm: raw.wasm,
            nodes,
        })
    }
}

/// Refuses an `rw` grant of any server over what the native server `spec`
/// runs, as far as it can be known when the config is loaded: a command
/// that does not resolve yet, or a script that cannot be read, is checked
/// at its launch instead, which checks again in any case.
#[cfg(unix)]
fn check_writers(spec: &ServerSpec) -> Result<(), crate::grants::GrantError> {
    let ServerKind::Native {
        command,
        base_dir,
        measure,
        ..
    } = &spec.kind
    else {
        return Ok(());
    };
    let path_var = std::env::var_os("PATH");
    let executable = crate::command::resolve(command, base_dir, path_var.as_deref())
        .map(|resolved| resolved.target)
        .ok();
    let interpreter = executable
        .as_deref()
        .and_then(crate::script::script_interpreter);
    crate::grants::check_runs(
        &crate::grants::Runs {
            server: &spec.name,
            executable: executable.as_deref(),
            interpreter: interpreter.as_deref(),
            measure,
        },
        &spec.writers,
    )
}
