//! A call to a server before 2026-07-28 that asked for input while its
//! agent (2026-07-28) takes requests for input: parked at the gateway under
//! an unguessable `requestState` until the agent's retry brings the
//! answers, or cancelled after [`INPUT_WAIT`].

use super::bridge::{INPUT_ROUNDS, answer_ask};
use super::call::{Takes, Target};
use super::session::AgentSession;
use crate::session::SessionError;
use crate::session::{CallAnswer, ProgressSender, Retry, ServerAsk};
use rmcp::RoleServer;
use rmcp::model::{ErrorData, ProgressNotificationParam};
use rmcp::service::Peer;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A call to a server before 2026-07-28 that asked for input (its own
/// `elicitation/create` or `sampling/createMessage`) while its agent, on
/// 2026-07-28, takes requests for input instead of answering such
/// requests. The agent gets the request as an `InputRequiredResult` whose
/// `requestState` names this call; the call goes on waiting at the server,
/// and the agent's retry delivers its answers and takes the call up again.
/// A server is asked once per call, as it asked: nothing is run twice.
pub(super) struct Parked {
    pub(super) server: String,
    pub(super) tool: String,
    /// The session whose child runs the call, when that is not the session
    /// holding it (a stateless request's, taken up by the next request).
    pub(super) keep: Option<AgentSession>,
    pub(super) call:
        std::pin::Pin<Box<dyn Future<Output = Result<CallAnswer, SessionError>> + Send>>,
    pub(super) asks: tokio::sync::mpsc::UnboundedReceiver<ServerAsk>,
    /// The call's progress, passed to whichever agent request holds it.
    pub(super) progress: tokio::sync::mpsc::UnboundedReceiver<ProgressNotificationParam>,
    pub(super) cancel: CancellationToken,
    /// The server's requests the agent was handed, by the key it answers.
    pub(super) waiting: Vec<(
        String,
        tokio::sync::oneshot::Sender<Result<serde_json::Value, ErrorData>>,
    )>,
    pub(super) rounds: usize,
}

impl Parked {
    /// Ends the call: the server's requests are answered with an error (no
    /// answer came), and the call is cancelled.
    pub(super) async fn abandon(mut self) {
        self.waiting.clear();
        self.cancel.cancel();
        let _ = self.call.await;
    }
}

/// How long a parked call waits for the agent's retry before it is
/// cancelled (a person may be answering).
pub(super) const INPUT_WAIT: Duration = Duration::from_secs(600);

/// What marks a `requestState` as Moat's own, naming a parked call.
pub(super) const PARKED_STATE: &str = "moat-parked:";

impl AgentSession {
    /// The answer of a server before 2026-07-28 to a call. Such a server
    /// may ask for input on its own while it works (`elicitation/create`,
    /// `sampling/createMessage`): each request goes to `asker` (an older
    /// agent that declared what it needs), or, for an agent that takes
    /// requests for input and will come back (`park`), to the agent as an
    /// `InputRequiredResult` while the call waits parked at the gateway
    /// (see [`Parked`]); any other caller's is refused. A retry whose
    /// `requestState` names a parked call of this session takes it up.
    #[allow(
        clippy::too_many_arguments,
        reason = "one call's parts, as the agent sent them"
    )]
    pub(super) async fn older_answer(
        &self,
        target: Target<'_>,
        arguments: Option<rmcp::model::JsonObject>,
        progress: Option<ProgressSender>,
        cancel_call: &CancellationToken,
        traceparent: Option<String>,
        retry: Retry,
        asker: Option<&Peer<RoleServer>>,
        takes: Takes,
    ) -> Result<CallAnswer, SessionError> {
        let Takes {
            input: takes_input,
            held,
            ..
        } = takes;
        let Target {
            server,
            tool,
            child,
        } = target;
        let mut parked = match retry
            .request_state
            .as_deref()
            .filter(|state| state.starts_with(PARKED_STATE))
        {
            Some(state) => {
                // Parked by an earlier stateless request: its session is
                // held under the state, and comes along until the call ends.
                let holder = self.gateway.release(state);
                let found = match &holder {
                    Some(holder) => holder.unpark(server, tool, state, retry.input_responses),
                    None => self.unpark(server, tool, state, retry.input_responses),
                };
                if let (None, Some(holder)) = (&found, &holder) {
                    // Named for another tool: it waits on for its own retry.
                    self.gateway.hold(state.to_owned(), holder.clone(), INPUT_WAIT);
                }
                found.map(|mut parked| {
                    if parked.keep.is_none() {
                        parked.keep = holder;
                    }
                    parked
                })
            }
            .ok_or_else(|| SessionError::Protocol {
                    server: server.to_owned(),
                    operation: format!("tools/call `{tool}`"),
                    detail: self.gateway.misrouted("the call parked under requestState", state).unwrap_or_else(|| format!(
                        "requestState {state:?} names no call of this tool waiting for input in this session (it may have waited longer than {INPUT_WAIT:?})"
                    )),
                })?,
            None => {
                let asks = child.asks();
                let (relay, relayed) = tokio::sync::mpsc::unbounded_channel();
                let cancel = CancellationToken::new();
                let call = {
                    let (child, tool, cancel) = (child.clone(), tool.to_owned(), cancel.clone());
                    Box::pin(async move {
                        child
                            .call_tool_answer(
                                &tool,
                                arguments,
                                Some(relay),
                                cancel,
                                traceparent,
                                retry,
                            )
                            .await
                    })
                };
                Parked {
                    server: server.to_owned(),
                    tool: tool.to_owned(),
                    keep: None,
                    call,
                    asks,
                    progress: relayed,
                    cancel,
                    waiting: Vec::new(),
                    rounds: 0,
                }
            }
        };
        loop {
            tokio::select! {
                answer = &mut parked.call => return answer,
                Some(note) = parked.progress.recv() => {
                    if let Some(progress) = &progress {
                        let _ = progress.send(note);
                    }
                }
                () = cancel_call.cancelled(), if !parked.cancel.is_cancelled() => parked.cancel.cancel(),
                Some(ask) = parked.asks.recv() => {
                    if asker.is_some() || !takes_input || parked.rounds == INPUT_ROUNDS {
                        // Asked of an older agent, or refused.
                        answer_ask(asker, server, &format!("tool `{tool}`"), ask).await;
                    } else {
                        parked.rounds += 1;
                        let key = format!("moat-{}", parked.rounds);
                        let asked = rmcp::model::InputRequests::from([(key.clone(), ask.request)]);
                        parked.waiting.push((key, ask.answer));
                        let state = self.park(parked, held);
                        return Ok(CallAnswer::InputRequired(rmcp::model::InputRequiredResult::new(
                            Some(asked),
                            Some(state),
                        )));
                    }
                }
            }
        }
    }

    /// Keeps `parked` for the agent's retry, under a fresh `requestState`
    /// of this session; after [`INPUT_WAIT`] without one it is cancelled.
    pub(super) fn park(&self, parked: Parked, held: bool) -> String {
        let state = format!("{PARKED_STATE}{}", self.gateway.capability());
        self.parked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(state.clone(), parked);
        if !held {
            // A stateless request's session ends with it: held for the retry.
            self.gateway.hold(state.clone(), self.clone(), INPUT_WAIT);
        }
        let (all, key) = (Arc::downgrade(&self.parked), state.clone());
        tokio::spawn(async move {
            tokio::time::sleep(INPUT_WAIT).await;
            let Some(all) = all.upgrade() else { return };
            let expired = all.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
            if let Some(parked) = expired {
                tracing::warn!(server = %parked.server, tool = %parked.tool, "no retry came for a request for input: the call is cancelled");
                parked.abandon().await;
            }
        });
        state
    }

    /// The session whose instance runs the call that an earlier stateless
    /// request parked under `state`: the session held under it, or the
    /// one that session keeps for the call (parked again by a later round).
    pub(super) fn parked_runner(&self, state: &str) -> Option<AgentSession> {
        let holder = self.gateway.held(state)?;
        let kept = holder
            .parked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(state)
            .and_then(|parked| parked.keep.clone());
        Some(kept.unwrap_or(holder))
    }

    /// Lets go of the parked call `state` names, if it is still parked: its
    /// server is told that no answer came, and the call is cancelled.
    pub(super) fn abandon_parked(&self, state: &str) {
        let parked = self
            .parked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(state);
        drop(self.gateway.release(state));
        if let Some(parked) = parked {
            tokio::spawn(parked.abandon());
        }
    }

    /// Takes up the parked call `state` names, for a retry of `server`'s
    /// `tool`, and gives the server the agent's answers; `None` if this
    /// session has no such call.
    pub(super) fn unpark(
        &self,
        server: &str,
        tool: &str,
        state: &str,
        answers: Option<rmcp::model::InputResponses>,
    ) -> Option<Parked> {
        let mut parked = {
            let mut all = self.parked.lock().unwrap_or_else(|e| e.into_inner());
            let found = all
                .get(state)
                .is_some_and(|parked| parked.server == server && parked.tool == tool);
            found.then(|| all.remove(state)).flatten()?
        };
        let mut answers = answers.unwrap_or_default();
        for (key, answer) in parked.waiting.drain(..) {
            let _ = answer.send(answers.remove(&key).ok_or_else(|| {
                ErrorData::invalid_params(format!("the agent gave no answer to `{key}`"), None)
            }));
        }
        Some(parked)
    }
}
