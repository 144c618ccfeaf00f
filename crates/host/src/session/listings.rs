//! Prompts and resources: listed and read through the pins, as tools are.

use rmcp::model::{
    GetPromptRequestParams, GetPromptResult, JsonObject, ReadResourceRequestParams,
    ReadResourceResult, Resource,
};

use super::Session;
use super::call::Retry;
use super::error::SessionError;

/// Prompt or resource pins being enforced, and which of them the latest
/// listing found as pinned.
pub(crate) struct ListingState {
    pub(crate) pins: crate::policy::ListingPins,
    pub(crate) available: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

impl Session {
    /// Whether the server said it has prompts.
    pub fn offers_prompts(&self) -> bool {
        self.service
            .peer_info()
            .is_some_and(|info| info.capabilities.prompts.is_some())
    }

    /// Whether the server said it has resources.
    pub fn offers_resources(&self) -> bool {
        self.service
            .peer_info()
            .is_some_and(|info| info.capabilities.resources.is_some())
    }

    /// Under a lock, `live` (name, item) pairs judged against `state`: the
    /// pinned definitions of those as pinned. Without one, `live` as it is.
    /// A pinned definition that does not parse is named in the error.
    pub(crate) fn as_pinned<T: serde::Serialize + serde::de::DeserializeOwned>(
        &self,
        state: Option<&ListingState>,
        live: Vec<(String, T)>,
    ) -> Result<Vec<T>, String> {
        let Some(state) = state else {
            return Ok(live.into_iter().map(|(_, item)| item).collect());
        };
        let canonical: Vec<(String, String)> = live
            .iter()
            .map(|(name, item)| (name.clone(), crate::lock::canonical_listing(item)))
            .collect();
        let (served, others) = state.pins.evaluate(&canonical);
        for report in &others {
            tracing::warn!(server = %self.server(), kind = state.pins.kind(), name = %report.name, status = report.status.word(), "not as pinned; unavailable");
        }
        *state.available.lock().unwrap_or_else(|e| e.into_inner()) =
            served.iter().map(|(name, _)| name.clone()).collect();
        served
            .into_iter()
            .map(|(name, definition)| {
                serde_json::from_str(&definition).map_err(|e| {
                    format!(
                        "{} `{name}`: the definition does not parse: {e}",
                        state.pins.kind()
                    )
                })
            })
            .collect()
    }

    /// Under a lock, the refusal of `name` unless the latest listing found
    /// it as pinned.
    pub(crate) fn unpinned(
        &self,
        state: Option<&ListingState>,
        name: &str,
    ) -> Option<SessionError> {
        let state = state?;
        if state
            .available
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(name)
        {
            return None;
        }
        Some(SessionError::NotPinned {
            server: self.server().to_owned(),
            kind: state.pins.kind(),
            name: name.to_owned(),
            status: "not listed as pinned",
        })
    }

    /// Every prompt the server lists; under a lock, the pinned definitions
    /// of those listed as pinned, and no other.
    pub async fn list_prompts(&self) -> Result<Vec<rmcp::model::Prompt>, SessionError> {
        let live = self
            .service
            .list_all_prompts()
            .await
            .map_err(|e| self.error("prompts/list", e))?;
        self.as_pinned(
            self.prompt_pins.as_ref(),
            live.into_iter().map(|p| (p.name.clone(), p)).collect(),
        )
        .map_err(|detail| self.bad_lock(detail))
    }

    /// Every resource the server lists; under a lock, the pinned definitions
    /// of those listed as pinned, and no other.
    pub async fn list_resources(&self) -> Result<Vec<Resource>, SessionError> {
        let live = self
            .service
            .list_all_resources()
            .await
            .map_err(|e| self.error("resources/list", e))?;
        self.as_pinned(
            self.resource_pins.as_ref(),
            live.into_iter().map(|r| (r.uri.clone(), r)).collect(),
        )
        .map_err(|detail| self.bad_lock(detail))
    }

    /// Reads resource `uri` (under a lock, only one listed as pinned).
    pub async fn read_resource(&self, uri: &str) -> Result<ReadResourceResult, SessionError> {
        if let Some(refused) = self.unpinned(self.resource_pins.as_ref(), uri) {
            return Err(refused);
        }
        self.service
            .read_resource(ReadResourceRequestParams::new(uri))
            .await
            .map_err(|e| self.error(&format!("resources/read `{uri}`"), e))
    }

    /// Gets prompt `name` with `arguments`.
    pub async fn get_prompt(
        &self,
        name: &str,
        arguments: Option<JsonObject>,
    ) -> Result<GetPromptResult, SessionError> {
        if let Some(refused) = self.unpinned(self.prompt_pins.as_ref(), name) {
            return Err(refused);
        }
        let mut params = GetPromptRequestParams::new(name);
        params.arguments = arguments;
        self.service
            .get_prompt(params)
            .await
            .map_err(|e| self.error(&format!("prompts/get `{name}`"), e))
    }

    /// Gets prompt `name` once (2026-07-28): a request for input comes
    /// back as the server worded it, for the caller to answer and get the
    /// prompt again with `retry`.
    pub async fn get_prompt_once(
        &self,
        name: &str,
        arguments: Option<JsonObject>,
        retry: Retry,
    ) -> Result<rmcp::model::GetPromptResponse, SessionError> {
        if let Some(refused) = self.unpinned(self.prompt_pins.as_ref(), name) {
            return Err(refused);
        }
        let mut params = GetPromptRequestParams::new(name);
        params.arguments = arguments;
        params.input_responses = retry.input_responses;
        params.request_state = retry.request_state;
        self.service
            .get_prompt_once(params)
            .await
            .map_err(|e| self.error(&format!("prompts/get `{name}`"), e))
    }

    /// Reads resource `uri` once (2026-07-28): a request for input comes
    /// back as it is, as for [`Session::get_prompt_once`].
    pub async fn read_resource_once(
        &self,
        uri: &str,
        retry: Retry,
    ) -> Result<rmcp::model::ReadResourceResponse, SessionError> {
        if let Some(refused) = self.unpinned(self.resource_pins.as_ref(), uri) {
            return Err(refused);
        }
        let mut params = ReadResourceRequestParams::new(uri);
        params.input_responses = retry.input_responses;
        params.request_state = retry.request_state;
        self.service
            .read_resource_once(params)
            .await
            .map_err(|e| self.error(&format!("resources/read `{uri}`"), e))
    }
}
