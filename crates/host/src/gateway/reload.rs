//! A reload (SIGHUP, `--watch`) and putting revocations in force across
//! every session: a new generation for new sessions, and what the new
//! lock refuses stopped in the old ones.

use super::gate::Enforced;
use super::generation::Generation;
use super::names::check_lock_names;
use super::{Gateway, ReloadError, Reloaded};
use crate::audit::Event;
use crate::config::Config;
use crate::revoke::Revoked;
use std::sync::Arc;

impl Gateway {
    /// [`Gateway::set_revocations`]; with `always`, every session enforces
    /// even when the revocations did not change (a reload made servers
    /// stale).
    pub(super) async fn put_in_force(
        &self,
        revoked: Revoked,
        source: &str,
        always: bool,
    ) -> Enforced {
        let before = self.current().host.set_revoked(revoked.clone());
        let (_, added) = before.with(&revoked);
        let (_, lifted) = revoked.with(&before);
        for ((_, entry), lifted) in added
            .iter()
            .map(|e| (e, false))
            .chain(lifted.iter().map(|e| (e, true)))
        {
            tracing::warn!(target = %entry.target, by = %entry.by, lifted, "revocation");
            // Put in force whether or not it can be recorded: a log that
            // fails stops every call anyway.
            let _ = self.record(&Event::Revoke {
                target: entry.target.clone(),
                by: entry.by.clone(),
                at: entry.at.clone(),
                reason: entry.reason.clone(),
                source: source.to_owned(),
                lifted,
            });
        }
        let mut enforced = Enforced {
            added: added.len(),
            lifted: lifted.len(),
            ..Enforced::default()
        };
        if added.is_empty() && lifted.is_empty() && !always {
            return enforced;
        }
        let current = self.current();
        let mut failures = Vec::new();
        enforced.stopped += current
            .close_spares(
                |server, spare| current.admits(server, None, Some(spare)).is_ok(),
                &mut failures,
            )
            .await;
        for (server, error) in failures {
            tracing::warn!(%server, %error, "closing a refused server's name-check instance");
        }
        let mut sessions = tokio::task::JoinSet::new();
        for state in self.live() {
            sessions.spawn(async move { state.enforce_revocations().await });
        }
        while let Some(done) = sessions.join_next().await {
            match done {
                Ok(done) => enforced.merge(&done),
                Err(error) => {
                    tracing::error!(%error, "enforcing revocations in a session panicked")
                }
            }
        }
        enforced
    }

    /// Reads the config and its moat.lock again (SIGHUP, `--watch`): new
    /// sessions get the new configuration, sessions already open keep
    /// theirs until they end, except that what the new lock revokes or no
    /// longer matches stops in them at once, as a revocation does. A reload
    /// that cannot be read, names a server badly, changes `[wasm]` or
    /// removes the lock changes nothing. Either way it is audited
    /// (`reload`), with `source`.
    pub async fn reload(&self, source: &str) -> Result<Reloaded, ReloadError> {
        let result = self.try_reload(source).await;
        let (generation, outcome, error) = match &result {
            Ok(reloaded) => (reloaded.generation, "reloaded", None),
            Err(error) => (
                self.generation(),
                "refused",
                Some(crate::text::error_chain(error)),
            ),
        };
        if let Some(error) = &error {
            tracing::debug!(%source, %error, "reload refused");
        }
        let _ = self.record(&Event::Reload {
            source: source.to_owned(),
            generation,
            outcome: outcome.into(),
            error,
        });
        result
    }

    pub(super) async fn try_reload(&self, source: &str) -> Result<Reloaded, ReloadError> {
        let old = self.current();
        let path = old.config.path.clone();
        let config = Config::load(&path)?;
        if config.wasm != old.config.wasm {
            return Err(ReloadError::WasmChanged {
                path: path.display().to_string(),
            });
        }
        let lock_path = crate::lock::Lock::path_for(&path);
        let lock = crate::lock::Lock::load(&lock_path)?;
        if lock.is_none() && old.host.is_locked() {
            return Err(ReloadError::LockRemoved {
                path: lock_path.display().to_string(),
            });
        }
        if let Some(lock) = &lock {
            for problem in check_lock_names(lock) {
                tracing::warn!(lock = %lock_path.display(), "{problem}");
            }
        }
        let revoked = lock
            .as_ref()
            .map(crate::lock::Lock::revocations)
            .unwrap_or_default();
        let revocations = revoked.iter().count();
        let newest = lock.clone().map(Arc::new);
        let host = old
            .host
            .relocked(lock.map(|lock| (lock, lock_path.clone())));
        let generation = Arc::new(Generation::new(old.number + 1, host, config));
        if !generation.host.is_locked() {
            generation.check_names().await;
        }
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = generation.clone();
        tracing::info!(%source, generation = generation.number, "reloaded");
        let mut failures = Vec::new();
        old.close_spares(|_, _| false, &mut failures).await;
        for (server, error) in failures {
            tracing::warn!(%server, %error, "closing an old name-check instance");
        }
        if let Some(newest) = newest {
            for state in self.live() {
                if state.generation.number < generation.number {
                    *state
                        .generation
                        .superseded
                        .write()
                        .unwrap_or_else(|e| e.into_inner()) = Some(newest.clone());
                }
            }
        }
        let enforced = self.put_in_force(revoked, source, true).await;
        Ok(Reloaded {
            generation: generation.number,
            servers: generation.config.servers.len(),
            revocations,
            enforced,
        })
    }
}
