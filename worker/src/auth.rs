//! Who may read this app's state over HTTP (`/v1/status` and `/v1/stores/...`): a caller
//! whose Kubernetes bearer token the API server accepts and whose identity may `get` the
//! subresource `streamapps/query` of this StreamApp.
//!
//! The worker asks the API server with the caller's own token (a
//! SelfSubjectAccessReview, which every authenticated identity may create): an invalid
//! or expired token is refused by the API server (401), a valid one is answered allowed
//! or not (403). So the worker needs no right of its own to review tokens or other
//! users' access (no cluster-wide `tokenreviews`/`subjectaccessreviews`), and the
//! answer is the API server's RBAC, audit log included. Answers are cached for a few
//! seconds by a digest of the token: after the first answer, a token's queries cost no
//! review for that long (queries that arrive together before it each ask once).
//!
//! A query forwarded to the pod that owns the key carries the caller's token (see
//! `query::AUTHORIZATION`) to an address the app's own pods report. Those pods already
//! see the tokens of the queries they answer, so the trust boundary is the app's pods;
//! give query clients identities that may do nothing but query.
//!
//! Owns: the check and its cache. Must not touch: what the endpoints answer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};

/// How long an answer stands. A revoked right or token works at most this much longer.
const CACHE_FOR: Duration = Duration::from_secs(10);
/// Bound on remembered answers (one per distinct token).
const CACHE_MAX: usize = 4096;

/// Why the API server could not be asked, with the cause. The texts are the causes'
/// own (what a refused caller reads after "failed to check the token with the API
/// server: "); none holds the token.
#[derive(Debug, thiserror::Error)]
pub enum Unavailable {
    /// No in-cluster or kubeconfig configuration.
    #[error(transparent)]
    Config(kube::config::InferConfigError),
    #[error("the bearer token is not a valid header value")]
    TokenNotAHeader(#[source] reqwest::header::InvalidHeaderValue),
    /// A client for the caller's token could not be built.
    #[error(transparent)]
    Client(kube::Error),
    /// The SelfSubjectAccessReview failed (not a 401 or 403 answer).
    #[error(transparent)]
    Review(kube::Error),
}

/// The answer for one request.
#[derive(Debug, Clone)]
pub enum Verdict {
    Allowed,
    /// No `Authorization: Bearer` header.
    NoToken,
    /// The API server does not accept the token.
    Unauthenticated,
    /// The token's identity may not query this app.
    Forbidden {
        user_reason: String,
    },
    /// The API server could not be asked (never cached: the next request asks again).
    Unavailable(Arc<Unavailable>),
}

impl PartialEq for Verdict {
    /// Equal answers; two `Unavailable` are equal when they are one failure.
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Forbidden { user_reason: a }, Self::Forbidden { user_reason: b }) => a == b,
            (Self::Unavailable(a), Self::Unavailable(b)) => Arc::ptr_eq(a, b),
            (a, b) => std::mem::discriminant(a) == std::mem::discriminant(b),
        }
    }
}

impl Verdict {
    /// The HTTP status and a message for the caller (never the token).
    pub fn refusal(&self, namespace: &str, app: &str) -> Option<(u16, String)> {
        // Built only for a refusal: an allowed query (the common case) formats nothing.
        let right = || {
            format!(
                "get on streamapps/query (apiGroup oxbow.dev) for StreamApp {app} in namespace {namespace}"
            )
        };
        match self {
            Verdict::Allowed => None,
            Verdict::NoToken => Some((
                401,
                format!(
                    "a Kubernetes bearer token is required (Authorization: Bearer <token>) whose identity has {}",
                    right()
                ),
            )),
            Verdict::Unauthenticated => Some((
                401,
                "the API server does not accept the bearer token (invalid or expired)".into(),
            )),
            Verdict::Forbidden { user_reason } => Some((
                403,
                format!("the token's identity lacks {}{user_reason}", right()),
            )),
            Verdict::Unavailable(error) => Some((
                503,
                format!("failed to check the token with the API server: {error}"),
            )),
        }
    }
}

/// Who this worker serves, and how it checks callers.
pub enum Access {
    /// Standalone (`--instance`/`--instances`): no API server to ask; every caller is
    /// served, as before any StreamApp existed.
    Open,
    Kubernetes(Box<Reviewer>),
}

/// The StreamApp a managed worker serves, and what it learned asking about callers.
pub struct Reviewer {
    namespace: String,
    app: String,
    cache: Mutex<HashMap<[u8; 32], (Verdict, Instant)>>,
    /// Where the API server is and how to trust it (without the worker's identity), read
    /// once.
    base: tokio::sync::OnceCell<kube::Config>,
}

impl Access {
    pub fn kubernetes(namespace: &str, app: &str) -> Self {
        Access::Kubernetes(Box::new(Reviewer {
            namespace: namespace.into(),
            app: app.into(),
            cache: Mutex::default(),
            base: tokio::sync::OnceCell::new(),
        }))
    }

    /// The namespace and app checked against (empty when open).
    pub fn target(&self) -> (&str, &str) {
        match self {
            Access::Open => ("", ""),
            Access::Kubernetes(r) => (&r.namespace, &r.app),
        }
    }

    /// Whether the request with this `Authorization` header may be served.
    pub async fn check(&self, authorization: Option<&str>) -> Verdict {
        let Access::Kubernetes(reviewer) = self else {
            return Verdict::Allowed;
        };
        let Reviewer {
            namespace,
            app,
            cache,
            base,
        } = reviewer.as_ref();
        let Some(token) = bearer(authorization) else {
            return Verdict::NoToken;
        };
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let now = Instant::now();
        if let Some((v, at)) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&digest)
            && now.duration_since(*at) < CACHE_FOR
        {
            return v.clone();
        }
        let base = match base
            .get_or_try_init(|| async {
                let mut config = kube::Config::infer().await.map_err(Unavailable::Config)?;
                // Nothing of the worker's own identity: no client certificate, no token.
                config.auth_info = kube::config::AuthInfo::default();
                Ok::<_, Unavailable>(config)
            })
            .await
        {
            Ok(b) => b,
            Err(error) => return Verdict::Unavailable(Arc::new(error)),
        };
        let verdict = review(base, token, namespace, app).await;
        if !matches!(verdict, Verdict::Unavailable(_)) {
            let mut c = cache.lock().unwrap_or_else(|e| e.into_inner());
            if c.len() >= CACHE_MAX {
                c.retain(|_, (_, at)| now.duration_since(*at) < CACHE_FOR);
            }
            // Full of fresh answers (a flood of distinct tokens): the new one is not
            // kept, rather than dropping the answers of callers that are in use.
            if c.len() < CACHE_MAX {
                c.insert(digest, (verdict.clone(), now));
            }
        }
        verdict
    }
}

/// The token of an `Authorization: Bearer <token>` header.
pub fn bearer(authorization: Option<&str>) -> Option<&str> {
    let (scheme, token) = authorization?.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Asks the API server, as the caller, whether the caller may query the app.
async fn review(base: &kube::Config, token: &str, namespace: &str, app: &str) -> Verdict {
    let client = match client_as(base, token) {
        Ok(c) => c,
        Err(error) => return Verdict::Unavailable(Arc::new(error)),
    };
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(namespace.into()),
                verb: Some("get".into()),
                group: Some(oxbow_crds::API_GROUP.into()),
                resource: Some("streamapps".into()),
                subresource: Some("query".into()),
                name: Some(app.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: Api<SelfSubjectAccessReview> = Api::all(client);
    match api.create(&PostParams::default(), &review).await {
        Ok(r) => {
            let status = r.status.unwrap_or_default();
            if status.allowed {
                Verdict::Allowed
            } else {
                let why = status.reason.unwrap_or_default();
                Verdict::Forbidden {
                    user_reason: if why.is_empty() {
                        String::new()
                    } else {
                        format!(" ({why})")
                    },
                }
            }
        }
        Err(kube::Error::Api(s)) if s.code == 401 => Verdict::Unauthenticated,
        // An identity denied even the review of its own rights may not query either.
        Err(kube::Error::Api(s)) if s.code == 403 => Verdict::Forbidden {
            user_reason: String::new(),
        },
        Err(e) => Verdict::Unavailable(Arc::new(Unavailable::Review(e))),
    }
}

/// A client of this pod's API server that authenticates with `token` alone.
fn client_as(base: &kube::Config, token: &str) -> Result<kube::Client, Unavailable> {
    let mut config = base.clone();
    let value = format!("Bearer {token}")
        .parse::<reqwest::header::HeaderValue>()
        .map_err(Unavailable::TokenNotAHeader)?;
    config.headers.push((reqwest::header::AUTHORIZATION, value));
    kube::Client::try_from(config).map_err(Unavailable::Client)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_non_empty_bearer_token_is_taken() {
        assert_eq!(bearer(Some("Bearer abc.def")), Some("abc.def"));
        assert_eq!(bearer(Some("bearer  abc ")), Some("abc"));
        assert_eq!(bearer(Some("Basic dXNlcjpwdw==")), None);
        assert_eq!(bearer(Some("Bearer ")), None);
        assert_eq!(bearer(None), None);
    }

    #[tokio::test]
    async fn a_standalone_worker_serves_everyone_and_a_managed_one_wants_a_token() {
        assert_eq!(Access::Open.check(None).await, Verdict::Allowed);
        let managed = Access::kubernetes("ns", "app");
        assert_eq!(managed.check(None).await, Verdict::NoToken);
        let (code, msg) = Verdict::NoToken.refusal("ns", "app").expect("refused");
        assert_eq!(code, 401);
        assert!(msg.contains("get on streamapps/query"), "{msg}");
    }
}
