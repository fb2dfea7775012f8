//! Leader election on a `coordination.k8s.io` Lease, so two operator replicas never
//! reconcile at once.
//!
//! Optimistic concurrency: every write carries the resourceVersion it read, so two
//! candidates cannot both take the Lease. A leader that cannot renew before its Lease
//! would expire stops (the process exits and restarts as a candidate).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};

#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("failed to read or write Lease {name}: {source}")]
    AccessLease { name: String, source: kube::Error },
    #[error("lost Lease {name} to {holder}")]
    LostLease { name: String, holder: String },
}

pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    lease_duration: Duration,
    renew_every: Duration,
    /// The other holder's (identity, renewTime) as last seen, and when we saw it change.
    /// Expiry is judged by our own clock since that moment, never by comparing the
    /// holder's timestamp with our clock: clock skew must not make two leaders.
    observed: std::sync::Mutex<Option<(String, Option<MicroTime>, std::time::Instant)>>,
}

enum Attempt {
    Acquired,
    HeldBy(String),
}

impl LeaderElector {
    pub fn new(client: kube::Client, namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(5),
            observed: std::sync::Mutex::new(None),
        }
    }

    fn err(&self, source: kube::Error) -> LeaderError {
        LeaderError::AccessLease {
            name: self.name.clone(),
            source,
        }
    }

    async fn try_acquire(&self) -> Result<Attempt, LeaderError> {
        let now = Timestamp::now();
        let Some(mut lease) = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| self.err(e))?
        else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(self.lease_duration.as_secs() as i32),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Attempt::Acquired),
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    Ok(Attempt::HeldBy("another candidate".into()))
                }
                Err(e) => Err(self.err(e)),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(15).max(1) as u64);
        let expired = {
            let mut seen = self.observed.lock().unwrap_or_else(|e| e.into_inner());
            let current = (holder.clone(), spec.renew_time.clone());
            match seen.as_ref() {
                Some((h, r, at)) if (h, r) == (&current.0, &current.1) => at.elapsed() > duration,
                _ => {
                    *seen = Some((current.0, current.1, std::time::Instant::now()));
                    false
                }
            }
        };
        if holder != self.identity && !holder.is_empty() && !expired {
            return Ok(Attempt::HeldBy(holder));
        }
        let mut new_spec = spec.clone();
        if holder != self.identity {
            new_spec.acquire_time = Some(MicroTime(now));
            new_spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        new_spec.holder_identity = Some(self.identity.clone());
        new_spec.lease_duration_seconds = Some(self.lease_duration.as_secs() as i32);
        new_spec.renew_time = Some(MicroTime(now));
        lease.spec = Some(new_spec);
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(Attempt::Acquired),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                Ok(Attempt::HeldBy("another candidate".into()))
            }
            Err(e) => Err(self.err(e)),
        }
    }

    /// Returns once this process holds the Lease. API errors while waiting are logged
    /// and retried: a candidate has nothing to lose by waiting.
    pub async fn acquire(&self) -> Result<(), LeaderError> {
        let mut announced = false;
        loop {
            match tokio::time::timeout(self.lease_duration, self.try_acquire()).await {
                Ok(Ok(Attempt::Acquired)) => {
                    tracing::info!(lease = %self.name, identity = %self.identity, "acquired leadership");
                    return Ok(());
                }
                Ok(Ok(Attempt::HeldBy(h))) => {
                    if !announced {
                        tracing::info!(lease = %self.name, holder = %h, "waiting for leadership");
                        announced = true;
                    }
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "failed to try for leadership; retrying"),
                Err(_) => {
                    tracing::warn!(lease = %self.name, "leadership attempt timed out; retrying")
                }
            }
            tokio::time::sleep(self.renew_every).await;
        }
    }

    /// Renews until leadership is lost or cannot be renewed in time; then returns why.
    /// Every renewal is bounded by what is left of the Lease, so a hung request cannot
    /// keep a leader reconciling after its Lease expired.
    pub async fn hold(&self) -> LeaderError {
        let mut last_renew = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.renew_every).await;
            let left = self
                .lease_duration
                .saturating_sub(last_renew.elapsed() + self.renew_every);
            match tokio::time::timeout(left, self.try_acquire()).await {
                Ok(Ok(Attempt::Acquired)) => last_renew = tokio::time::Instant::now(),
                Ok(Ok(Attempt::HeldBy(holder))) => {
                    return LeaderError::LostLease {
                        name: self.name.clone(),
                        holder,
                    };
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "failed to renew leadership");
                    // Stop before the Lease can expire under us: never two leaders.
                    if last_renew.elapsed() + self.renew_every >= self.lease_duration {
                        return e;
                    }
                }
                Err(_) => {
                    return LeaderError::LostLease {
                        name: self.name.clone(),
                        holder: "nobody (renewal timed out)".into(),
                    };
                }
            }
        }
    }
}
