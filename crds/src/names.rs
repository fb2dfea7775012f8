//! Kafka and Kubernetes names derived from a StreamApp.
//!
//! Kafka names follow Kafka Streams so existing tooling keeps working: consumer group =
//! applicationId, changelog = `<applicationId>-<store>-changelog`, transactional id =
//! `<applicationId>-<task>`, DLQ = `<applicationId>-dlq`.

use crate::streamapp::StreamApp;
use kube::ResourceExt;

/// A task: one partition number of the co-partitioned source topics.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct TaskId(pub u32);

impl std::fmt::Display for TaskId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A state store's name as written in the spec.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct StoreName(pub String);

impl std::fmt::Display for StoreName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl StreamApp {
    /// `spec.applicationId`, defaulting to the object's name.
    pub fn application_id(&self) -> String {
        self.spec
            .application_id
            .clone()
            .unwrap_or_else(|| self.name_any())
    }

    pub fn consumer_group(&self) -> String {
        self.application_id()
    }

    pub fn changelog_topic(&self, store: &StoreName) -> String {
        changelog_topic(&self.application_id(), store)
    }

    pub fn transactional_id(&self, task: TaskId) -> String {
        format!("{}-{task}", self.application_id())
    }

    /// The dead-letter topic when the error policy is `deadLetter`.
    pub fn dead_letter_topic(&self) -> Option<String> {
        use crate::streamapp::ErrorPolicy;
        match self.spec.errors.policy {
            ErrorPolicy::DeadLetter => Some(
                self.spec
                    .errors
                    .topic
                    .clone()
                    .unwrap_or_else(|| format!("{}-dlq", self.application_id())),
            ),
            _ => None,
        }
    }

    /// Kubernetes object names of the children.
    pub fn worker_name(&self) -> String {
        self.name_any()
    }
    pub fn config_map_name(&self) -> String {
        format!("{}-config", self.name_any())
    }
    pub fn assignment_config_map_name(&self) -> String {
        format!("{}-assignment", self.name_any())
    }
    pub fn headless_service_name(&self) -> String {
        format!("{}-workers", self.name_any())
    }
    pub fn client_service_name(&self) -> String {
        format!("{}-query", self.name_any())
    }
    pub fn service_account_name(&self) -> String {
        format!("{}-worker", self.name_any())
    }
}

pub fn changelog_topic(application_id: &str, store: &StoreName) -> String {
    format!("{application_id}-{store}-changelog")
}
