//! Kafka and Kubernetes names derived from a StreamApp.
//!
//! Kafka names follow Kafka Streams so existing tooling keeps working: consumer group =
//! applicationId, changelog = `<applicationId>-<store>-changelog`, transactional id =
//! `<applicationId>-<task>` (task `0_3`), repartition topic =
//! `<applicationId>-<step>-repartition`, DLQ = `<applicationId>-dlq`.

use crate::streamapp::StreamApp;
use kube::ResourceExt;

/// A task: one partition of one sub-topology (stage), Kafka Streams' `<stage>_<partition>`.
/// Stage 0 reads partition N of the co-partitioned source topics; stage S > 0 reads
/// partition N of the repartition topic in front of it (see [`crate::topology`]). Its
/// text form is `0_3`; `3` is read as `0_3` (assignments and status written before
/// stages existed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskId {
    pub stage: u32,
    pub partition: u32,
}

impl TaskId {
    pub const fn new(stage: u32, partition: u32) -> Self {
        Self { stage, partition }
    }

    /// Every task of a topology with `stages` stages of `partitions` tasks each, in order.
    pub fn all(stages: u32, partitions: u32) -> impl Iterator<Item = TaskId> {
        (0..stages).flat_map(move |s| (0..partitions).map(move |p| TaskId::new(s, p)))
    }

    /// The Kafka partition this task reads and writes (source or repartition topic,
    /// changelogs of its stores).
    pub fn kafka_partition(&self) -> i32 {
        self.partition as i32
    }
}

impl std::fmt::Display for TaskId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}_{}", self.stage, self.partition)
    }
}

/// A task id that is neither `<stage>_<partition>` nor a bare partition number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a task id: expected <stage>_<partition> such as 0_3 or 1_0")]
pub struct BadTaskId(pub String);

impl std::str::FromStr for TaskId {
    type Err = BadTaskId;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadTaskId(s.to_string());
        match s.split_once('_') {
            Some((st, p)) => Ok(TaskId::new(
                st.parse().map_err(|_| bad())?,
                p.parse().map_err(|_| bad())?,
            )),
            None => Ok(TaskId::new(0, s.parse().map_err(|_| bad())?)),
        }
    }
}

impl serde::Serialize for TaskId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for TaskId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = TaskId;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a task id such as \"0_3\" (or a partition number)")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<TaskId, E> {
                v.parse().map_err(E::custom)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<TaskId, E> {
                u32::try_from(v)
                    .map(|p| TaskId::new(0, p))
                    .map_err(|_| E::custom(format!("task {v} is out of range")))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<TaskId, E> {
                u32::try_from(v)
                    .map(|p| TaskId::new(0, p))
                    .map_err(|_| E::custom(format!("task {v} is out of range")))
            }
        }
        d.deserialize_any(V)
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
    /// The id in force: the one recorded in `status.applicationId`; else
    /// `spec.applicationId`; else, for an app an earlier operator reconciled (a status
    /// without the field), its name; else `<namespace>.<name>` (the name alone for a
    /// standalone manifest without one), so same-named apps in two namespaces never share
    /// topics, group or transactional ids.
    ///
    /// The recorded id comes first: a spec that names another one is refused
    /// ([`Self::application_id_change`]), and everything, the status included, keeps
    /// following the id in force until the spec is set back.
    pub fn application_id(&self) -> String {
        let status = self.status.as_ref();
        if let Some(id) = status.and_then(|st| st.application_id.as_ref()) {
            return id.clone();
        }
        if let Some(id) = &self.spec.application_id {
            return id.clone();
        }
        if status.is_some_and(|st| st.observed_generation.is_some()) {
            return self.name_any();
        }
        match self.metadata.namespace.as_deref() {
            Some(ns) if !ns.is_empty() => format!("{ns}.{}", self.name_any()),
            _ => self.name_any(),
        }
    }

    /// `spec.applicationId` names another id than the one in force: the operator refuses
    /// to act on it (renaming would orphan the state). `None` when they agree.
    pub fn application_id_change(&self) -> Option<(String, String)> {
        let wanted = self.spec.application_id.as_ref()?;
        let in_force = self.status.as_ref()?.application_id.as_ref()?;
        (wanted != in_force).then(|| (in_force.clone(), wanted.clone()))
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

/// The internal topic in front of a keyed step that repartitions (Kafka Streams' name).
pub fn repartition_topic(application_id: &str, step: &str) -> String {
    format!("{application_id}-{step}-repartition")
}

#[cfg(test)]
mod tests {
    use crate::streamapp::{StreamApp, StreamAppStatus};

    fn app(ns: Option<&str>, id: Option<&str>, status: Option<StreamAppStatus>) -> StreamApp {
        let mut a: StreamApp = serde_yaml::from_str(
            "apiVersion: oxbow.dev/v1alpha1\nkind: StreamApp\nmetadata: {name: orders}\nspec:\n  kafka: {bootstrapServers: 'k:9092'}\n  source: {topics: [in]}\n",
        )
        .expect("manifest");
        a.metadata.namespace = ns.map(Into::into);
        a.spec.application_id = id.map(Into::into);
        a.status = status;
        a
    }

    #[test]
    fn the_default_application_id_is_namespaced_and_never_changes_for_a_running_app() {
        assert_eq!(
            app(Some("team-a"), None, None).application_id(),
            "team-a.orders"
        );
        assert_eq!(
            app(None, None, None).application_id(),
            "orders",
            "standalone"
        );
        assert_eq!(app(Some("team-a"), Some("x"), None).application_id(), "x");
        let recorded = StreamAppStatus {
            observed_generation: Some(4),
            application_id: Some("kept".into()),
            ..Default::default()
        };
        assert_eq!(
            app(Some("team-a"), None, Some(recorded.clone())).application_id(),
            "kept"
        );
        // Reconciled by an operator from before the namespaced default: its name.
        let legacy = StreamAppStatus {
            observed_generation: Some(4),
            ..Default::default()
        };
        assert_eq!(
            app(Some("team-a"), None, Some(legacy)).application_id(),
            "orders"
        );
        // Written down once, as the id in force: no change; as another id: a change.
        assert_eq!(
            app(Some("team-a"), Some("kept"), Some(recorded.clone())).application_id_change(),
            None
        );
        assert_eq!(
            app(Some("team-a"), Some("new"), Some(recorded)).application_id_change(),
            Some(("kept".into(), "new".into()))
        );
    }

    #[test]
    fn an_app_whose_spec_names_another_id_keeps_running_as_the_id_in_force() {
        let recorded = StreamAppStatus {
            observed_generation: Some(4),
            application_id: Some("kept".into()),
            ..Default::default()
        };
        let renamed = app(Some("team-a"), Some("new"), Some(recorded));
        // Topics, group, claims and the status all follow the id in force: a refused
        // rename must not become the id by the next reconciliation.
        assert_eq!(renamed.application_id(), "kept");
        assert_eq!(renamed.consumer_group(), "kept");
        assert_eq!(
            renamed.application_id_change(),
            Some(("kept".into(), "new".into()))
        );
    }
}
