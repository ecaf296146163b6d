//! Users, tokens, grants and schemas: who a request comes from, what it
//! may do, and the changes to them through the metastore.

use narad_raft::state::{Action, Grant, ADMIN_USER};

use super::*;
use crate::auth::{self, Credentials, NewToken};
use crate::limits::{ADMIN_BOOTSTRAP_RETRY, PASSWORD_CHECKS_MAX};

fn unauthenticated(message: &str) -> ApiError {
    ApiError::new(ErrorCode::Unauthenticated, message)
}

fn hashing_full() -> ApiError {
    ApiError::new(
        ErrorCode::Overloaded,
        "too many password checks are under way on this node; retry with backoff, or use a bearer token",
    )
}

/// Counts one hash under way until dropped (also when its request is).
struct Counted<'a>(&'a Cell<usize>);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}

impl<F: FileSystem> Shard<F> {
    /// Runs slow work (a password hash) off this shard's thread and returns
    /// what it gave; `None` when [`PASSWORD_CHECKS_MAX`] are under way here
    /// already (a flood of wrong passwords is refused, not queued).
    async fn off_thread<R: Send + 'static>(
        &self,
        work: impl FnOnce() -> R + Send + 'static,
    ) -> Option<R> {
        if self.hashing.get() >= PASSWORD_CHECKS_MAX {
            return None;
        }
        self.hashing.set(self.hashing.get() + 1);
        let _counted = Counted(&self.hashing);
        let (sender, receiver) = futures_channel::oneshot::channel();
        self.env
            .runtime
            .blocking(Box::new(move || {
                let _ = sender.send(work());
            }))
            .await;
        receiver.await.ok()
    }

    /// The user the `Authorization` header names, or 401 `unauthenticated`.
    pub async fn authenticate(&self, header: Option<&[u8]>) -> Result<String, ApiError> {
        self.authenticate_with(auth::credentials(header)?).await
    }

    /// The user `credentials` prove, or 401 `unauthenticated` (over HTTP
    /// from a header, over Kafka from SASL PLAIN).
    pub async fn authenticate_with(&self, credentials: Credentials) -> Result<String, ApiError> {
        let view = self.view();
        match credentials {
            Credentials::Bearer(token) => auth::token_user(&view.state, &token)
                .map(str::to_string)
                .ok_or_else(|| unauthenticated("the bearer token is unknown or revoked")),
            Credentials::Basic { user, password } => {
                let hash = view.state.users.get(&user).map(|u| u.password_hash.clone());
                drop(view);
                if let Some(hash) = &hash {
                    if self.passwords.known(&user, &password, hash) {
                        return Ok(user);
                    }
                }
                // An unknown user is checked against a decoy, so that the
                // answer takes as long as for a wrong password.
                let against = hash.clone();
                let candidate = password.clone();
                let matched = self
                    .off_thread(move || {
                        let against: &str = match &against {
                            Some(hash) => hash,
                            None => auth::decoy_hash(),
                        };
                        auth::verify_password(against, &candidate)
                    })
                    .await
                    .ok_or_else(hashing_full)?;
                match hash {
                    Some(hash) if matched => {
                        self.passwords.remember(&user, &password, &hash);
                        Ok(user)
                    }
                    _ => Err(unauthenticated("wrong user name or password")),
                }
            }
        }
    }

    /// 403 `forbidden` unless `user` may do `action` (on `topic`).
    pub fn authorize(
        &self,
        user: &str,
        action: Action,
        topic: Option<&str>,
    ) -> Result<(), ApiError> {
        if auth::allows(&self.view().state, user, action, topic) {
            Ok(())
        } else {
            Err(auth::forbidden(user, action, topic))
        }
    }

    /// Whether `user` holds any grant on `topic`.
    pub fn sees_topic(&self, user: &str, topic: &str) -> bool {
        auth::sees(&self.view().state, user, topic)
    }

    /// The metastore's state now (users, grants, schemas).
    pub fn state(&self) -> Arc<MetaView> {
        self.view()
    }

    /// Proposes a change and waits until this node applied it too, so the
    /// next request here sees it.
    async fn change(
        &self,
        command: Command,
        applied_here: impl Fn(&MetaState) -> bool,
    ) -> Result<Applied, ApiError> {
        let applied = self.propose(command).await?;
        self.applied_here_when(applied_here).await;
        Ok(applied)
    }

    /// Creates a user or changes its password; whether it was created.
    pub async fn put_user(&self, name: &str, password: String) -> Result<bool, ApiError> {
        let hash = self
            .off_thread(move || auth::hash_password(&password))
            .await
            .ok_or_else(hashing_full)?
            .map_err(|e| ApiError::new(ErrorCode::Internal, e))?;
        let expected = hash.clone();
        let applied = self
            .change(
                Command::PutUser {
                    name: name.to_string(),
                    password_hash: hash,
                    if_absent: false,
                    now_ms: self.wall(),
                },
                |state| {
                    state
                        .users
                        .get(name)
                        .is_some_and(|u| u.password_hash == expected)
                },
            )
            .await?;
        Ok(applied == Applied::UserCreated)
    }

    /// Creates the user `admin` with this password unless it exists;
    /// tries until the metastore takes it (or the shard stops).
    pub async fn bootstrap_admin(&self, password: String) {
        // Once, at start, before any client: on the shard's own thread.
        let Ok(hash) = auth::hash_password(&password) else {
            tracing::error!("could not hash auth.admin_password; the user admin is not created");
            return;
        };
        while !self.is_stopping() && !self.view().state.users.contains_key(ADMIN_USER) {
            let command = Command::PutUser {
                name: ADMIN_USER.to_string(),
                password_hash: hash.clone(),
                if_absent: true,
                now_ms: self.wall(),
            };
            match self.env.meta.propose(command).await {
                Ok(applied) => {
                    if applied == Applied::UserCreated {
                        tracing::info!("created the user admin");
                    }
                    self.applied_here_when(|state| state.users.contains_key(ADMIN_USER))
                        .await;
                }
                Err(error) => {
                    tracing::debug!(%error, "the user admin is not created yet");
                    self.env.runtime.sleep(ADMIN_BOOTSTRAP_RETRY).await;
                }
            }
        }
    }

    pub async fn delete_user(&self, name: &str) -> Result<(), ApiError> {
        self.change(
            Command::DeleteUser {
                name: name.to_string(),
            },
            |state| !state.users.contains_key(name),
        )
        .await
        .map(drop)
    }

    pub async fn set_grants(&self, user: &str, grants: Vec<Grant>) -> Result<(), ApiError> {
        let expected = grants.clone();
        self.change(
            Command::SetGrants {
                user: user.to_string(),
                grants,
            },
            |state| state.users.get(user).is_some_and(|u| u.grants == expected),
        )
        .await
        .map(drop)
    }

    pub async fn add_token(&self, user: &str) -> Result<(NewToken, u64), ApiError> {
        let token = auth::new_token().map_err(|e| ApiError::new(ErrorCode::Internal, e))?;
        let now_ms = self.wall();
        self.change(
            Command::AddToken {
                user: user.to_string(),
                id: token.id.clone(),
                secret_hash: token.secret_hash.clone(),
                now_ms,
            },
            |state| state.tokens.contains_key(&token.id),
        )
        .await?;
        Ok((token, now_ms))
    }

    pub async fn revoke_token(&self, user: &str, id: &str) -> Result<(), ApiError> {
        self.change(
            Command::RevokeToken {
                user: user.to_string(),
                id: id.to_string(),
            },
            |state| !state.tokens.contains_key(id),
        )
        .await
        .map(drop)
    }

    /// Adds a version of a schema (a checked document); its version and
    /// whether it was created.
    pub async fn put_schema(&self, name: &str, document: String) -> Result<(u32, bool), ApiError> {
        let expected = document.clone();
        let applied = self
            .change(
                Command::PutSchema {
                    name: name.to_string(),
                    document,
                },
                |state| {
                    state
                        .schemas
                        .get(name)
                        .is_some_and(|s| s.latest().1 == expected)
                },
            )
            .await?;
        match applied {
            Applied::SchemaPut { version, created } => Ok((version, created)),
            _ => Err(ApiError::new(
                ErrorCode::Internal,
                "the metastore answered a schema change oddly",
            )),
        }
    }

    pub async fn delete_schema(&self, name: &str) -> Result<(), ApiError> {
        self.change(
            Command::DeleteSchema {
                name: name.to_string(),
            },
            |state| !state.schemas.contains_key(name),
        )
        .await
        .map(drop)
    }
}
