//! One generation of the config: the servers, the Host they launch on
//! under the lock, the spares kept from the start-up name check, the
//! failures of servers that could not start, and what the lock refuses.
//! A reload makes a new one; sessions keep the one they began with.

use super::names::unexposable;
use super::start_failures;
use crate::config::Config;
use crate::host::Host;
use crate::session::{Session, SessionError};
use std::collections::HashMap;
use std::sync::Arc;

/// One configuration that a gateway serves: the config and lock read at
/// start or at a reload, with the host that enforces that lock. Sessions
/// keep the generation they began in until they end.
pub(super) struct Generation {
    /// 1 at start, one more at each reload.
    pub(super) number: u64,
    pub(super) host: Host,
    pub(super) config: Arc<Config>,
    /// Servers the name check started, kept for the first session that
    /// needs each one, so start-up never pays for an instance it throws
    /// away.
    pub(super) spares: std::sync::Mutex<HashMap<String, Session>>,
    /// The egress pools of each spare, whose session is given when one
    /// takes it over.
    #[cfg(unix)]
    pub(super) spare_egress: std::sync::Mutex<HashMap<String, crate::egress::Shares>>,
    /// Set once a reload replaced this generation: the lock read then.
    /// A server that this generation runs and that lock no longer pins
    /// as it is refused here (see [`Generation::stale`]).
    pub(super) superseded: std::sync::RwLock<Option<Arc<crate::lock::Lock>>>,
    /// Servers that could not start, with why: left out of every listing
    /// and their calls answered with the reason until the next try is due
    /// (see [`start_failures`]).
    pub(super) failures: start_failures::StartFailures,
}

impl Generation {
    pub(super) fn new(number: u64, host: Host, config: Config) -> Self {
        Self {
            number,
            host,
            config: Arc::new(config),
            spares: std::sync::Mutex::default(),
            #[cfg(unix)]
            spare_egress: std::sync::Mutex::default(),
            superseded: std::sync::RwLock::default(),
            failures: Default::default(),
        }
    }

    /// The instance the name check started for `server`, if it is still
    /// healthy; each is handed out once, its egress proxy drawing from
    /// `egress` (the session's pool) from then on.
    pub(super) fn take_spare(
        &self,
        server: &str,
        #[cfg(unix)] egress: &crate::egress::Pool,
    ) -> Option<Session> {
        let spare = self
            .spares
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(server)?;
        #[cfg(unix)]
        if let Some(shares) = self
            .spare_egress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(server)
        {
            shares.adopt(egress);
        }
        match spare.fault() {
            None => Some(spare),
            Some(fault) => {
                tracing::debug!(%server, ?fault, "the name check's instance faulted; starting afresh");
                tokio::spawn(async move {
                    let _ = spare.close().await;
                });
                None
            }
        }
    }

    /// Closes the instances kept from the name check that `keep` does not
    /// keep, reporting each that failed to close. Returns how many closed.
    pub(super) async fn close_spares(
        &self,
        keep: impl Fn(&str, &Session) -> bool,
        failures: &mut Vec<(String, SessionError)>,
    ) -> usize {
        let closing: Vec<(String, Session)> = {
            let mut spares = self.spares.lock().unwrap_or_else(|e| e.into_inner());
            let names: Vec<String> = spares
                .iter()
                .filter(|(server, spare)| !keep(server, spare))
                .map(|(server, _)| server.clone())
                .collect();
            names
                .into_iter()
                .filter_map(|name| spares.remove(&name).map(|spare| (name, spare)))
                .collect()
        };
        let closed = closing.len();
        for (server, spare) in closing {
            if let Err(error) = spare.close().await {
                failures.push((format!("name-check/{server}"), error));
            }
        }
        closed
    }

    /// Without a lock, tool and prompt names are only known once servers
    /// run: starts each server once, and warns of each name that cannot be
    /// exposed, naming the server and the name (the listings leave it
    /// out). A server that fails to start here is logged and recorded (see
    /// [`start_failures`]).
    pub(super) async fn check_names(&self) {
        for (server, spec) in &self.config.servers {
            // Its session's pool is given when one takes it over.
            #[cfg(unix)]
            let host = {
                let shares = self.host.egress().detached();
                self.spare_egress
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(server.clone(), shares.clone());
                self.host.with_egress(shares)
            };
            #[cfg(not(unix))]
            let host = &self.host;
            let session = match host.connect(spec).await {
                Ok(session) => session,
                Err(error) => {
                    tracing::warn!(%server, %error, "could not start; its tools are left out until it does");
                    self.failures.record(server, &error);
                    continue;
                }
            };
            let tools = session.list_tools().await;
            // A server without prompts answers prompts/list with an error.
            let prompts = session.list_prompts().await.unwrap_or_default();
            // Kept for the first session that needs this server.
            if let Some(replaced) = self
                .spares
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(server.clone(), session)
            {
                tokio::spawn(async move {
                    let _ = replaced.close().await;
                });
            }
            let tools = match tools {
                Ok(tools) => tools,
                Err(error) => {
                    tracing::warn!(%server, %error, "listing tools for the name check");
                    continue;
                }
            };
            let problems = unexposable(server, "tool", tools.iter().map(|t| t.name.as_ref()))
                .into_iter()
                .chain(unexposable(
                    server,
                    "prompt",
                    prompts.iter().map(|p| p.name.as_str()),
                ));
            for problem in problems {
                tracing::warn!("{problem}");
            }
        }
    }

    /// Once a reload replaced this generation with a lock: why `server`,
    /// as this generation runs it, no longer matches that lock. Under a
    /// lock of its own, any change to the server's entry counts (bytes,
    /// execution identity, grants, tool pins); without one, the digest
    /// `child` measured must be the one the new lock pins.
    pub(super) fn stale(&self, server: &str, child: Option<&Session>) -> Option<String> {
        let newest = self
            .superseded
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()?;
        let Some(entry) = newest.servers.get(server) else {
            return Some("the lock no longer pins it".into());
        };
        if let Some(old) = self.host.locked(server) {
            return (old != entry).then(|| {
                if old.sha256 != entry.sha256 {
                    format!(
                        "this session runs sha256:{}, the lock now pins sha256:{}",
                        old.sha256, entry.sha256
                    )
                } else if old.identity != entry.identity {
                    "its execution identity changed in the lock".into()
                } else {
                    "its entry in the lock changed".into()
                }
            });
        }
        let measured = child?.identity()?.digest?;
        (measured.to_string() != entry.sha256).then(|| {
            format!(
                "this session runs sha256:{measured}, the lock now pins sha256:{}",
                entry.sha256
            )
        })
    }
}
