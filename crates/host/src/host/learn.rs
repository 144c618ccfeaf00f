//! `moat learn`: one watched run of a server, and what it used beyond its
//! grants.

use std::path::PathBuf;

use rmcp::model::{CallToolResult, JsonObject};

use super::ConnectError;
use super::Host;
use crate::config::{ServerKind, ServerSpec};
use crate::launch::LaunchError;
use crate::session::{Handshake, Session, SessionError};

/// What a `moat learn` run found: the grants it proposes, how the run
/// ended, and each tool call it made with what came of it.
#[derive(Debug)]
pub struct Learned {
    pub proposal: crate::native::learn::Proposal,
    pub outcome: Result<(), SessionError>,
    pub calls: Vec<(String, Result<CallToolResult, SessionError>)>,
}

impl Host {
    /// `moat learn`: runs the native server `spec` once, watched, able to
    /// read everything and reach the network but to write only its private
    /// /tmp, its `rw` dirs and `writable` (the user's `--write`
    /// directories), completes the handshake and lists its tools (and its
    /// prompts and resources, where it has them), closes it, and proposes
    /// the grants that would let it do the same under the sandbox. The run's
    /// own outcome comes back beside the proposal: a server that fails even
    /// so still shows what it tried to use. A `writable` directory that is
    /// a system directory, the home directory (or holds it) or overlaps
    /// Moat's own files is refused before anything runs.
    #[cfg(unix)]
    pub async fn learn(
        &self,
        spec: &ServerSpec,
        writable: &[PathBuf],
        calls: &[(String, Option<JsonObject>)],
    ) -> Result<Learned, ConnectError> {
        let ServerKind::Native { cwd, measure, .. } = &spec.kind else {
            return Err(ConnectError::from(SessionError::Protocol {
                server: spec.name.clone(),
                operation: "learn".into(),
                detail: "moat learn runs native servers only (wasm and remote servers have no files or sockets of the host to learn)".into(),
            }));
        };
        let expected = spec.expectation().ok_or_else(|| LaunchError::Unmeasured {
            server: spec.name.clone(),
        })?;
        let home = std::env::var_os("HOME")
            .filter(|home| !home.is_empty())
            .map(|home| std::fs::canonicalize(&home).unwrap_or_else(|_| PathBuf::from(home)));
        let mut run = crate::native::learn::Run::default();
        for path in writable {
            let real = std::fs::canonicalize(path).map_err(|source| {
                crate::native::learn::LearnError::Writable {
                    path: path.clone(),
                    source,
                }
            })?;
            if let Some(why) = crate::native::learn::refusal(&real, true, home.as_deref()) {
                return Err(crate::native::learn::LearnError::Refused { path: real, why }.into());
            }
            run.writable.push(real);
        }
        let as_grants: Vec<crate::grants::DirGrant> = run
            .writable
            .iter()
            .map(|host| crate::grants::DirGrant::native_rw(host))
            .collect();
        crate::grants::check_protected(&spec.name, &as_grants, &[], &self.protected)
            .map_err(LaunchError::from)?;
        let observed = run.observed.clone();
        let planned = crate::launch::plan(
            &self.wasm,
            spec,
            expected,
            Some(run),
            self.egress.clone(),
            &self.protected,
        )?;
        let executable = match &planned {
            crate::launch::Planned::Native(launch) => launch.resolved.target.clone(),
            _ => {
                return Err(ConnectError::from(SessionError::Protocol {
                    server: spec.name.clone(),
                    operation: "learn".into(),
                    detail: "a native server planned another launcher".into(),
                }));
            }
        };
        let transport = planned.transport(&spec.name, spec.limits.clone());
        let mut called = Vec::new();
        let outcome = async {
            let session = Session::connect(transport, Handshake::Auto).await?;
            let listed = session.live_tools().await.map(drop);
            // The calls the user asked for, in order: what they open and
            // write is watched as start-up is.
            if listed.is_ok() {
                for (tool, arguments) in calls {
                    let result = session.call_tool(tool, arguments.clone()).await;
                    called.push((tool.clone(), result));
                }
            }
            let closed = session.close().await;
            listed.and(closed)
        }
        .await;
        let mut observed = observed.lock().unwrap_or_else(|e| e.into_inner()).clone();
        observed.settle();
        let package_paths = spec
            .env
            .resolve()
            .iter()
            .filter(|(name, _)| name == "PYTHONPATH" || name == "NODE_PATH")
            .flat_map(|(_, value)| {
                value
                    .split(':')
                    .filter(|p| !p.is_empty())
                    .filter_map(|p| std::fs::canonicalize(cwd.join(p)).ok())
                    .collect::<Vec<_>>()
            })
            .collect();
        let proposal = crate::native::learn::propose(
            &observed,
            &crate::native::learn::Granted {
                executable: &executable,
                measure,
                dirs: &spec.dirs,
                package_paths,
                protected: self.protected.iter().map(|p| p.path.clone()).collect(),
                roots: crate::sandbox::implicit_roots(
                    &executable,
                    None,
                    &crate::grants::Kept::from_env(&self.protected),
                )
                .granted,
                home,
            },
        );
        Ok(Learned {
            proposal,
            outcome,
            calls: called,
        })
    }
}
