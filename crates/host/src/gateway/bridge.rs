//! Asking an agent before 2026-07-28 for input on a server's behalf, with
//! the agent's own requests (`elicitation/create`, `sampling/createMessage`,
//! `roots/list`), and refusing what it cannot be asked.

use crate::session::ServerAsk;
use crate::session::{Session, SessionError};
use rmcp::RoleServer;
use rmcp::model::ErrorData;
use rmcp::service::Peer;

/// What a server before 2026-07-28 gets when it asks, while serving
/// `subject` (`tool `x``, `prompt `x``, `resource x`), for input that the
/// caller cannot give.
pub(super) fn cannot_answer(server: &str, subject: &str) -> ErrorData {
    ErrorData::invalid_request(
        format!("{subject} on server `{server}` asked for input that its caller cannot give"),
        None,
    )
}

/// Passes a server's own request for input (`ask`, made while serving
/// `subject`) to `agent` when it declared what the request needs, and the
/// agent's answer back; refuses it otherwise.
pub(super) async fn answer_ask(
    agent: Option<&Peer<RoleServer>>,
    server: &str,
    subject: &str,
    ask: ServerAsk,
) {
    let mut asked = rmcp::model::InputRequests::new();
    asked.insert("ask".to_owned(), ask.request);
    let Some(agent) = agent.filter(|agent| can_ask(agent, Some(&asked))) else {
        let _ = ask.answer.send(Err(cannot_answer(server, subject)));
        return;
    };
    let answer = match ask_agent(agent, server, subject, &asked).await {
        Ok(mut answers) => answers
            .remove("ask")
            .ok_or_else(|| cannot_answer(server, subject)),
        Err(error) => Err(ErrorData::internal_error(error.to_string(), None)),
    };
    let _ = ask.answer.send(answer);
}

/// Runs `work` (serving `subject` at `child`) while passing the server's
/// own requests for input to `agent` (see [`answer_ask`]).
pub(super) async fn answering<T>(
    child: &Session,
    agent: Option<&Peer<RoleServer>>,
    subject: &str,
    work: impl Future<Output = T>,
) -> T {
    let mut asks = child.asks();
    let mut work = std::pin::pin!(work);
    loop {
        tokio::select! {
            done = &mut work => return done,
            Some(ask) = asks.recv() => answer_ask(agent, child.server(), subject, ask).await,
        }
    }
}

/// Rounds of input Moat asks an agent for on a server's behalf before it
/// gives up on a call (rmcp's own client stops at the same count).
pub(super) const INPUT_ROUNDS: usize = rmcp::model::DEFAULT_MRTR_MAX_ROUNDS;

/// Whether an agent on a revision before 2026-07-28 can be asked, through
/// its own requests (`elicitation/create`, `sampling/createMessage`,
/// `roots/list`), for everything `asked` needs; with `None`, for anything
/// at all (then a call keeps its arguments, to call again with the answers).
#[allow(
    deprecated,
    reason = "agents before 2026-07-28 declare roots and sampling"
)]
pub(super) fn can_ask(
    agent: &Peer<RoleServer>,
    asked: Option<&rmcp::model::InputRequests>,
) -> bool {
    use rmcp::model::InputRequest;
    let Some(info) = agent.peer_info() else {
        return false;
    };
    let capabilities = &info.capabilities;
    let Some(asked) = asked else {
        return capabilities.elicitation.is_some()
            || capabilities.sampling.is_some()
            || capabilities.roots.is_some();
    };
    asked.values().all(|request| match request {
        InputRequest::Elicitation(_) => capabilities.elicitation.is_some(),
        InputRequest::CreateMessage(_) => capabilities.sampling.is_some(),
        InputRequest::ListRoots(_) => capabilities.roots.is_some(),
        _ => false,
    })
}

/// Asks an agent before 2026-07-28 what a server's request for input needs,
/// with the agent's own requests, and returns its answers keyed as asked.
#[allow(
    deprecated,
    reason = "agents before 2026-07-28 are asked with these requests"
)]
pub(super) async fn ask_agent(
    agent: &Peer<RoleServer>,
    server: &str,
    subject: &str,
    asked: &rmcp::model::InputRequests,
) -> Result<rmcp::model::InputResponses, SessionError> {
    use rmcp::model::InputRequest;
    let failed = |detail: String| SessionError::Protocol {
        server: server.to_owned(),
        operation: format!("asking the agent for input to {subject}"),
        detail,
    };
    let mut answers = rmcp::model::InputResponses::new();
    for (key, request) in asked {
        use rmcp::model::ServerRequest;
        let sent = match request {
            InputRequest::Elicitation(request) => ServerRequest::ElicitRequest(request.clone()),
            InputRequest::CreateMessage(request) => {
                ServerRequest::CreateMessageRequest(request.clone())
            }
            InputRequest::ListRoots(request) => ServerRequest::ListRootsRequest(request.clone()),
            _ => return Err(failed(format!("`{key}` is of a kind Moat cannot ask for"))),
        };
        let answer = agent
            .send_request(sent)
            .await
            .map_err(|error| failed(format!("`{key}`: {error}")))?;
        let answer =
            serde_json::to_value(answer).map_err(|error| failed(format!("`{key}`: {error}")))?;
        answers.insert(key.clone(), answer);
    }
    Ok(answers)
}
