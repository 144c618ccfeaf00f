//! The kinds of thing every server lists and the gateway merges into one
//! listing (prompts, resources): one gathering path for both, each kind
//! saying only how a session lists it.

use rmcp::model::{Prompt, Resource};

use crate::session::{Session, SessionError};

use super::GatewayError;
use super::names::valid_exposed_name;
use super::session::AgentSession;
use crate::config::SEPARATOR;
use rmcp::model::Tool;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A kind of listed thing.
pub(super) trait Listed: Sized {
    /// The method that lists it, for what is logged.
    const METHOD: &'static str;

    /// What `session` lists of it (under a lock, the pinned definitions).
    fn list(
        session: &Session,
    ) -> impl std::future::Future<Output = Result<Vec<Self>, SessionError>> + Send;
}

impl Listed for Prompt {
    const METHOD: &'static str = "prompts/list";

    async fn list(session: &Session) -> Result<Vec<Self>, SessionError> {
        session.list_prompts().await
    }
}

impl Listed for Resource {
    const METHOD: &'static str = "resources/list";

    async fn list(session: &Session) -> Result<Vec<Self>, SessionError> {
        session.list_resources().await
    }
}

impl AgentSession {
    /// Every server's tools, as `server__tool`, in server order.
    pub async fn tools(&self) -> Result<Vec<Tool>, SessionError> {
        let mut exposed = Vec::new();
        for server in self.servers() {
            if self.gate(&server, None).is_err() {
                continue;
            }
            let Some(child) = self.listable(&server).await else {
                continue;
            };
            let Ok(child) = self.gate_child(&server, None, child).await else {
                continue;
            };
            let tools = match child.list_tools().await {
                Ok(tools) => tools,
                Err(error) => {
                    tracing::warn!(%server, %error, "tools/list failed; its tools are left out of this listing");
                    continue;
                }
            };
            let mut seen = std::collections::BTreeSet::new();
            for mut tool in tools {
                let name = format!("{server}{SEPARATOR}{}", tool.name);
                if self.gate(&server, Some(&tool.name)).is_err() {
                    tracing::debug!(%server, tool = %tool.name, "revoked in moat.lock; hidden");
                    continue;
                }
                let problem = if !valid_exposed_name(&name) {
                    Some(GatewayError::InvalidName {
                        server: server.clone(),
                        what: "tool",
                        tool: tool.name.to_string(),
                        exposed: name.clone(),
                    })
                } else if !seen.insert(tool.name.clone()) {
                    Some(GatewayError::DuplicateName {
                        server: server.clone(),
                        what: "tool",
                        name: tool.name.to_string(),
                        exposed: name.clone(),
                    })
                } else {
                    None
                };
                if let Some(problem) = problem {
                    tracing::warn!("{problem}");
                    continue;
                }
                tool.name = name.into();
                exposed.push(tool);
            }
        }
        Ok(exposed)
    }

    /// Every server's prompts, named `server__name`; a name that cannot be
    /// exposed is hidden, with a warning.
    pub async fn prompts(&self) -> Result<Vec<rmcp::model::Prompt>, SessionError> {
        let mut exposed = Vec::new();
        for (server, prompts) in self.gather::<rmcp::model::Prompt>().await {
            let mut seen = std::collections::BTreeSet::new();
            for mut prompt in prompts {
                let name = format!("{server}{SEPARATOR}{}", prompt.name);
                if valid_exposed_name(&name) && seen.insert(prompt.name.clone()) {
                    prompt.name = name;
                    exposed.push(prompt);
                } else {
                    tracing::warn!(%server, prompt = %prompt.name, "prompt name not exposable; hidden");
                }
            }
        }
        Ok(exposed)
    }

    /// Every server's resources, named `server__name`, URIs unchanged. Two
    /// servers listing the same URI is an error naming both.
    pub async fn resources(&self) -> Result<Vec<rmcp::model::Resource>, SessionError> {
        let mut exposed = Vec::new();
        let mut owners = BTreeMap::new();
        for (server, resources) in self.gather::<rmcp::model::Resource>().await {
            for mut resource in resources {
                if let Some(other) = owners.insert(resource.uri.clone(), server.clone()) {
                    return Err(SessionError::Protocol {
                        server: server.clone(),
                        operation: "resources/list".into(),
                        detail: format!(
                            "resource {} is listed by both `{other}` and `{server}`",
                            resource.uri
                        ),
                    });
                }
                resource.name = format!("{server}{SEPARATOR}{}", resource.name);
                exposed.push(resource);
            }
        }
        *self.resources.owners.lock().await = owners;
        Ok(exposed)
    }

    /// What each server lists of `T`, in server order. A server that cannot
    /// start, or whose listing fails, is left out (with a warning), never
    /// the whole listing.
    pub(super) async fn gather<T: Listed>(&self) -> Vec<(String, Vec<T>)> {
        let mut gathered = Vec::new();
        for server in self.servers() {
            let Some(child) = self.listable(&server).await else {
                continue;
            };
            match T::list(&child).await {
                Ok(items) => gathered.push((server, items)),
                Err(error) => {
                    tracing::warn!(%server, %error, method = T::METHOD, "listing failed; what the server lists is left out of this listing");
                }
            }
        }
        gathered
    }

    pub(super) fn servers(&self) -> Vec<String> {
        self.generation.config.servers.keys().cloned().collect()
    }

    /// `server`'s child for a listing, or `None` when the listing leaves it
    /// out: it failed to start (now or before, its next try not yet due;
    /// see [`start_failures`]). One server that cannot start
    /// never hides the others.
    pub(super) async fn listable(&self, server: &str) -> Option<Arc<Session>> {
        match self.child(server).await {
            Ok(child) => Some(child),
            Err(error) => {
                tracing::debug!(%server, %error, "left out of the listing");
                None
            }
        }
    }
}
