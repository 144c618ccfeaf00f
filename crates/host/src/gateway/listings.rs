//! The kinds of thing every server lists and the gateway merges into one
//! listing (prompts, resources): one gathering path for both, each kind
//! saying only how a session lists it.

use rmcp::model::{Prompt, Resource};

use crate::session::{ClientError, Session};

/// A kind of listed thing.
pub(super) trait Listed: Sized {
    /// The method that lists it, for what is logged.
    const METHOD: &'static str;

    /// What `session` lists of it (under a lock, the pinned definitions).
    fn list(
        session: &Session,
    ) -> impl std::future::Future<Output = Result<Vec<Self>, ClientError>> + Send;
}

impl Listed for Prompt {
    const METHOD: &'static str = "prompts/list";

    async fn list(session: &Session) -> Result<Vec<Self>, ClientError> {
        session.list_prompts().await
    }
}

impl Listed for Resource {
    const METHOD: &'static str = "resources/list";

    async fn list(session: &Session) -> Result<Vec<Self>, ClientError> {
        session.list_resources().await
    }
}
