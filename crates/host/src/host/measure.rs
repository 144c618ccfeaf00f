//! `moat lock`'s measurement of one server: start it, read its identity
//! and its tools, prompts and resources, and record them.

use super::ConnectError;
use super::Host;
use crate::config::ServerSpec;
use crate::identity::Expectation;
use crate::launch::LaunchError;
use crate::lock::{LockedServer, LockedTool, canonical_tool, execution_identity, tool_pin};
use crate::session::{Handshake, SessionError, identity_parts};

impl Host {
    /// Starts `spec`, measures it and returns what `moat lock` records: its
    /// digests, identity, evidence and every tool's pinned definition. A
    /// digest pinned in the config must still match.
    pub async fn measure(&self, spec: &ServerSpec) -> Result<LockedServer, ConnectError> {
        let expected = spec.sha256.map_or(Expectation::Record, Expectation::Pinned);
        // The grants as they are now: recorded, and pinned for this very
        // launch, so what is recorded is what the server was given.
        let mut spec = spec.clone();
        let mut grants = std::collections::BTreeMap::new();
        #[cfg(unix)]
        for dir in &mut spec.dirs {
            let opened = crate::grants::open(&spec.name, dir).map_err(LaunchError::from)?;
            dir.inode = Some(opened.inode);
            grants.insert(dir.host.display().to_string(), opened.inode);
        }
        let spec = &spec;
        let session = self
            .connect_falling_back(
                &spec.name,
                || self.transport_expecting(spec, expected),
                Handshake::Auto,
            )
            .await?;
        let listed = async {
            let tools = session.list_tools().await?;
            let prompts = if session.offers_prompts() {
                session.list_prompts().await?
            } else {
                Vec::new()
            };
            let resources = if session.offers_resources() {
                session.list_resources().await?
            } else {
                Vec::new()
            };
            Ok::<_, ConnectError>((tools, prompts, resources))
        }
        .await;
        let identity = session.identity();
        session.close().await?;
        let (tools, prompts, resources) = listed?;
        let identity = identity.ok_or_else(|| {
            ConnectError::from(SessionError::Protocol {
                server: spec.name.clone(),
                operation: "measure".into(),
                detail: "the server reported no identity".into(),
            })
        })?;
        let digest = match identity.digest {
            Some(digest) => digest.to_string(),
            // A remote server has no bytes here; its identity is its endpoint.
            None if matches!(
                identity.evidence,
                crate::identity::Evidence::Remote | crate::identity::Evidence::RemoteMeasured
            ) =>
            {
                String::new()
            }
            None => {
                return Err(ConnectError::from(SessionError::Protocol {
                    server: spec.name.clone(),
                    operation: "measure".into(),
                    detail: "the server's bytes were not measured".into(),
                }));
            }
        };
        let parts = identity_parts(spec, &identity);
        let execution = execution_identity(&parts);
        let pin = |name: String, definition: String| LockedTool {
            sha256: tool_pin(&execution, &definition).to_string(),
            flags: crate::lock::definition_flags(&definition),
            name,
            definition,
        };
        let sorted = |mut items: Vec<LockedTool>| {
            items.sort_by(|a, b| a.name.cmp(&b.name));
            items
        };
        let locked_tools = sorted(
            tools
                .iter()
                .map(|tool| pin(tool.name.to_string(), canonical_tool(tool)))
                .collect(),
        );
        let prompts = sorted(
            prompts
                .iter()
                .map(|p| pin(p.name.clone(), crate::lock::canonical_listing(p)))
                .collect(),
        );
        let resources = sorted(
            resources
                .iter()
                .map(|r| pin(r.uri.clone(), crate::lock::canonical_listing(r)))
                .collect(),
        );
        Ok(LockedServer {
            kind: parts.kind.to_owned(),
            evidence: identity.evidence.to_string(),
            sha256: digest,
            identity: execution.to_string(),
            measured: parts.measured.clone(),
            grants,
            tools: locked_tools,
            prompts,
            resources,
            package: spec.package().map(|record| crate::lock::LockedPackage {
                ecosystem: record.ecosystem.to_string(),
                name: record.name.clone(),
                version: record.version.clone(),
                lockfile_sha256: record.lockfile_sha256.clone(),
                sha256: parts
                    .measured
                    .get(&record.store.display().to_string())
                    .cloned()
                    .unwrap_or_default(),
            }),
            oci: identity.oci.as_ref().map(|origin| crate::lock::LockedOci {
                reference: origin.reference.clone(),
                manifest: origin.manifest.to_string(),
                layer: origin.layer.to_string(),
            }),
        })
    }
}
