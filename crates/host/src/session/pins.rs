//! The pinned tools of a session under a lock: the server's definitions
//! judged against the pins at connect and whenever it says its list
//! changed; only tools as pinned are listed, with the pinned definitions.

use std::sync::Arc;

use rmcp::model::Tool;

use super::Session;
use super::error::SessionError;
use super::listings::ListingState;
use crate::lock::LockedServer;
use crate::policy::{Pins, PolicyError, ToolReport, ToolStatus};

/// Pins being enforced on a session, and the latest check of the live tools.
pub(crate) struct PinState {
    pub(crate) pins: Arc<Pins>,
    pub(crate) reports: tokio::sync::Mutex<Vec<ToolReport>>,
}

impl Session {
    /// Enforces the pins of `locked` on this session from now on: the live
    /// tools are compared with the pins (the host has already checked that
    /// the server runs as `live`, the locked execution identity).
    /// `compiled` is the pins the host compiled for that identity (shared
    /// by the server's sessions), when it has them.
    pub(crate) async fn enforce(
        &mut self,
        locked: &LockedServer,
        live: crate::identity::Digest,
        compiled: Option<Result<Arc<Pins>, PolicyError>>,
    ) -> Result<(), SessionError> {
        let pins = match compiled {
            Some(pins) => pins?,
            None => Arc::new(Pins::from_locked(locked, live)?),
        };
        // What is listed now supersedes any earlier announcement.
        self.take_tools_changed();
        let tools = self.live_tools().await?;
        let reports = pins.evaluate(&tools);
        for report in &reports {
            if !matches!(report.status, ToolStatus::Pinned { .. }) {
                tracing::warn!(server = %self.server(), tool = %report.name, status = report.status.word(), "tool not as pinned; unavailable");
            }
        }
        self.pins = Some(PinState {
            pins,
            reports: tokio::sync::Mutex::new(reports),
        });
        self.prompt_pins = Some(ListingState {
            pins: crate::policy::ListingPins::from_locked("prompt", &locked.prompts, live),
            available: Default::default(),
        });
        self.resource_pins = Some(ListingState {
            pins: crate::policy::ListingPins::from_locked("resource", &locked.resources, live),
            available: Default::default(),
        });
        // The first check, so a get or read before any listing is judged.
        if self.offers_prompts() {
            self.list_prompts().await?;
        }
        if self.offers_resources() {
            self.list_resources().await?;
        }
        Ok(())
    }

    pub(crate) fn bad_lock(&self, detail: String) -> SessionError {
        SessionError::BadLock {
            server: self.server().to_owned(),
            lock: "the lock".into(),
            detail,
        }
    }

    pub(crate) async fn live_tools(&self) -> Result<Vec<Tool>, SessionError> {
        self.service
            .list_all_tools()
            .await
            .map_err(|e| self.error("tools/list", e))
    }

    /// The latest check of live tools against the pins, re-checked when the
    /// server announced `notifications/tools/list_changed`. `None` without a
    /// lock.
    pub async fn tool_reports(&self) -> Result<Option<Vec<ToolReport>>, SessionError> {
        let Some(state) = &self.pins else {
            return Ok(None);
        };
        let mut reports = state.reports.lock().await;
        if self.take_tools_changed() {
            let live = self.live_tools().await?;
            *reports = state.pins.evaluate(&live);
        }
        Ok(Some(reports.clone()))
    }

    /// The tools to expose. Without a lock, what the server lists; with one,
    /// the pinned definitions of the tools that are as pinned (never the
    /// server's own words).
    pub async fn list_tools(&self) -> Result<Vec<Tool>, SessionError> {
        match (&self.pins, self.tool_reports().await?) {
            (Some(state), Some(reports)) => Ok(state.pins.exposed(&reports)),
            _ => self.live_tools().await,
        }
    }
}
