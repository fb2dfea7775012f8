//! The worker's configuration: a `StreamApp` manifest (exactly what a user applies, or
//! the operator's rendered copy) plus the process's own flags. Loading validates the
//! spec and compiles every expression, so a bad manifest fails at start, not at the
//! first record.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use oxbow_crds::topology::StageInput;
use oxbow_crds::{ProcessingGuarantee, StreamApp};

use crate::expr::Expr;
use crate::processor::ProcessorFactory;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("failed to read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("failed to parse {path} as a StreamApp manifest: {source}")]
    Parse {
        path: PathBuf,
        source: serde_yaml::Error,
    },
    #[error("{path} is a {kind}, not an oxbow.dev StreamApp")]
    NotAStreamApp { path: PathBuf, kind: String },
    #[error("invalid StreamApp: {}", errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    Invalid {
        errors: Vec<oxbow_crds::validate::ValidationError>,
    },
    #[error("invalid StreamApp: spec.commitInterval: {0}")]
    CommitInterval(#[source] oxbow_crds::duration::DurationError),
    #[error(transparent)]
    Compile(#[from] crate::steps::CompileError),
    #[error("failed to read Kafka secret directory {path}: {source}")]
    Secret {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}", refused.iter().map(|r| r.to_string()).collect::<Vec<_>>().join("; "))]
    RefusedProperties {
        refused: Vec<oxbow_crds::kafka_properties::Refused>,
    },
}

/// A loaded, validated app with its compiled topology.
pub struct App {
    pub manifest: StreamApp,
    pub application_id: String,
    pub guarantee: ProcessingGuarantee,
    pub commit_interval: std::time::Duration,
    pub steps: Vec<ProcessorFactory>,
    pub timestamp: Option<Expr>,
    pub sink_key: Option<Expr>,
    pub sink_value: Option<Expr>,
    /// The stages (sub-topologies) the steps split into at repartitions.
    pub topology: oxbow_crds::topology::Topology,
    /// `source.partitionedBy`, checked on every stage-0 record.
    pub partitioned_by: Option<Expr>,
    /// Per stage: the key its repartition topic is keyed by (`None` for stage 0).
    pub stage_keys: Vec<Option<Expr>>,
    /// Per stage: the topics its tasks read (derived once: the engine asks per record).
    stage_inputs: Vec<Vec<String>>,
    /// librdkafka properties from the spec and the secret directory.
    pub kafka: BTreeMap<String, String>,
    /// The other streams of stream–stream joins, by topic.
    pub join_streams: BTreeMap<String, JoinInput>,
    /// The only fields of a source value the app can see (`None`: all of them); stage-0
    /// tasks decode just these ([`crate::projection`]).
    pub source_fields: Option<crate::projection::Fields>,
    /// How the built-in steps write their stores' values: JSON unless told
    /// (`--store-encoding`), since a worker before the binary encoding reads JSON alone.
    pub store_encoding: oxbow_crds::StoreEncoding,
}

/// How a task reads a record of a stream–stream join's other stream.
pub struct JoinInput {
    /// The stage whose tasks read it.
    pub stage: u32,
    /// The join's index among the stage's processors: where its records enter.
    pub step: usize,
    pub value_format: oxbow_crds::RecordFormat,
    /// `join.stream.timestamp`; `None`: the Kafka timestamp.
    pub timestamp: Option<Expr>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("application_id", &self.application_id)
            .field("steps", &self.steps.len())
            .finish()
    }
}

pub fn parse_manifest(path: &Path, text: &str) -> Result<StreamApp, ConfigError> {
    let doc: serde_yaml::Value =
        serde_yaml::from_str(text).map_err(|source| ConfigError::Parse {
            path: path.into(),
            source,
        })?;
    let kind = doc.get("kind").and_then(|k| k.as_str()).unwrap_or("");
    let api = doc.get("apiVersion").and_then(|k| k.as_str()).unwrap_or("");
    if kind != "StreamApp" || !api.starts_with("oxbow.dev/") {
        return Err(ConfigError::NotAStreamApp {
            path: path.into(),
            kind: format!("{api} {kind}").trim().to_string(),
        });
    }
    serde_yaml::from_value(doc).map_err(|source| ConfigError::Parse {
        path: path.into(),
        source,
    })
}

impl App {
    pub fn load(path: &Path, secret_dir: Option<&Path>) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        let manifest = parse_manifest(path, &text)?;
        let mut kafka = manifest.spec.kafka.properties.clone();
        if let Some(dir) = secret_dir {
            let secret = read_secret_dir(dir)?;
            // Before anything can quote them: every value of the Secret is secret.
            oxbow_crds::redact::Redactor::new(&secret, secret.keys()).remember();
            let name = format!("mounted at {}", dir.display());
            let refused = oxbow_crds::kafka_properties::refused(&BTreeMap::new(), &secret, &name);
            if !refused.is_empty() {
                return Err(ConfigError::RefusedProperties { refused });
            }
            kafka.extend(secret);
        }
        Self::from_manifest(manifest, kafka)
    }

    pub fn from_manifest(
        manifest: StreamApp,
        kafka: BTreeMap<String, String>,
    ) -> Result<Self, ConfigError> {
        oxbow_crds::redact::Redactor::new(&kafka, []).remember();
        let errors = oxbow_crds::validate::validate_app(&manifest);
        if !errors.is_empty() {
            return Err(ConfigError::Invalid { errors });
        }
        let spec = &manifest.spec;
        let commit_interval = oxbow_crds::duration::parse_duration(&spec.commit_interval)
            .map_err(ConfigError::CommitInterval)?;
        let steps = crate::steps::compile(spec)?;
        let expr = |path: &str, e: &Option<String>| {
            e.as_deref().map(|e| Expr::compile(path, e)).transpose()
        };
        let timestamp = expr("spec.source.timestamp", &spec.source.timestamp)
            .map_err(crate::steps::CompileError::from)?;
        let sink_key = expr(
            "spec.sink.key",
            &spec.sink.as_ref().and_then(|s| s.key.clone()),
        )
        .map_err(crate::steps::CompileError::from)?;
        let sink_value = expr(
            "spec.sink.value",
            &spec.sink.as_ref().and_then(|s| s.value.clone()),
        )
        .map_err(crate::steps::CompileError::from)?;
        let topology = oxbow_crds::topology::Topology::of(&manifest.application_id(), spec);
        let partitioned_by = expr("spec.source.partitionedBy", &spec.source.partitioned_by)
            .map_err(crate::steps::CompileError::from)?;
        let stage_keys = topology
            .stages
            .iter()
            .map(|s| match &s.input {
                StageInput::Source => Ok(None),
                StageInput::Repartition { key, path, .. } => Expr::compile(path, key).map(Some),
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(crate::steps::CompileError::from)?;
        let stage_inputs = topology
            .stages
            .iter()
            .map(|s| s.input_topics(spec))
            .collect();
        let join_streams = join_inputs(spec, &topology)?;
        let source_fields = match crate::projection::plan(spec) {
            crate::projection::Plan::Project(f) => {
                tracing::info!(fields = ?f.paths(), "source values: decoding only the fields the steps select");
                Some(f)
            }
            crate::projection::Plan::Whole(why) => {
                tracing::debug!(reason = %why, "source values: decoding every field");
                None
            }
        };
        Ok(Self {
            store_encoding: oxbow_crds::StoreEncoding::default(),
            source_fields,
            topology,
            partitioned_by,
            stage_keys,
            stage_inputs,
            application_id: manifest.application_id(),
            guarantee: spec.processing_guarantee,
            commit_interval,
            steps,
            timestamp,
            sink_key,
            sink_value,
            kafka,
            manifest,
            join_streams,
        })
    }
}

/// Where each joined stream's records enter, and how they are read.
fn join_inputs(
    spec: &oxbow_crds::StreamAppSpec,
    topology: &oxbow_crds::topology::Topology,
) -> Result<BTreeMap<String, JoinInput>, ConfigError> {
    let mut out = BTreeMap::new();
    for stage in &topology.stages {
        for (topic, index) in &stage.streams {
            let stream = spec.steps[*index]
                .join
                .as_ref()
                .and_then(|j| j.stream.as_ref())
                .expect("the topology lists stream joins only");
            let timestamp = stream
                .timestamp
                .as_deref()
                .map(|e| Expr::compile(format!("spec.steps[{index}].join.stream.timestamp"), e))
                .transpose()
                .map_err(crate::steps::CompileError::from)?;
            out.insert(
                topic.clone(),
                JoinInput {
                    stage: stage.index,
                    step: index - stage.steps.start,
                    value_format: stream.value_format,
                    timestamp,
                },
            );
        }
    }
    Ok(out)
}

impl App {
    /// The processor factories a task of `stage` runs: its steps, and for the last stage
    /// also the processors compiled into a custom worker.
    pub fn stage_steps(&self, stage: u32) -> &[ProcessorFactory] {
        let Some(st) = self.topology.stage(stage) else {
            return &[];
        };
        let end = if stage + 1 == self.topology.stage_count() {
            self.steps.len()
        } else {
            st.steps.end
        };
        &self.steps[st.steps.start.min(end)..end]
    }

    /// The topics a task of `stage` reads.
    pub fn inputs(&self, stage: u32) -> &[String] {
        self.stage_inputs
            .get(stage as usize)
            .map_or(&[], Vec::as_slice)
    }

    /// The co-partitioned tables a task of `stage` keeps: store and topic.
    pub fn stage_tables(&self, stage: u32) -> &[(oxbow_crds::StoreName, String)] {
        self.topology
            .stage(stage)
            .map_or(&[], |s| s.tables.as_slice())
    }

    /// The topic a store is restored from and its standbys follow: the changelog, or
    /// for a co-partitioned table the table's own topic.
    pub fn store_topic(&self, store: &oxbow_crds::StoreName) -> String {
        match self.topology.table_topic(store) {
            Some(t) => t.to_string(),
            None => oxbow_crds::names::changelog_topic(&self.application_id, store),
        }
    }

    /// Whether a store is a co-partitioned table's (fed from its topic, no changelog).
    pub fn is_table_store(&self, store: &oxbow_crds::StoreName) -> bool {
        self.topology.table_topic(store).is_some()
    }

    /// The global tables: every worker keeps all of each.
    pub fn global_tables(&self) -> impl Iterator<Item = &oxbow_crds::TableSpec> {
        self.manifest.spec.tables.iter().filter(|t| t.global)
    }

    /// The repartition topic the stage after `stage` reads, if any.
    pub fn next_stage_topic(&self, stage: u32) -> Option<&str> {
        match &self.topology.next(stage)?.input {
            StageInput::Repartition { topic, .. } => Some(topic),
            StageInput::Source => None,
        }
    }
}

/// One file per librdkafka property (a mounted Secret); dotfiles (the kubelet's
/// `..data` links) are skipped.
fn read_secret_dir(dir: &Path) -> Result<BTreeMap<String, String>, ConfigError> {
    let err = |source| ConfigError::Secret {
        path: dir.into(),
        source,
    };
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).map_err(err)? {
        let entry = entry.map_err(err)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || !entry.path().is_file() {
            continue;
        }
        let value = std::fs::read_to_string(entry.path()).map_err(err)?;
        out.insert(name, value.trim_end_matches('\n').to_string());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_with_a_bad_expression_fails_at_load_naming_the_field() {
        let text = r#"
apiVersion: oxbow.dev/v1alpha1
kind: StreamApp
metadata: {name: t}
spec:
  kafka: {bootstrapServers: "127.0.0.1:1"}
  source: {topics: [in]}
  steps:
  - filter: {cel: "value.x >"}
"#;
        let m = parse_manifest(Path::new("t.yaml"), text).expect("parses");
        let err = App::from_manifest(m, BTreeMap::new()).expect_err("invalid");
        assert!(
            err.to_string().contains("spec.steps[0].filter.cel"),
            "{err}"
        );
    }

    #[test]
    fn a_mounted_secret_that_would_load_a_plugin_is_refused_before_any_client_exists() {
        let dir = std::env::temp_dir().join(format!("oxbow-secret-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("secret")).expect("dir");
        std::fs::write(dir.join("secret/plugin.library.paths"), "/tmp/evil.so").expect("file");
        std::fs::write(dir.join("secret/sasl.password"), "pw-sentinel-42").expect("file");
        let manifest = dir.join("app.yaml");
        std::fs::write(
            &manifest,
            "apiVersion: oxbow.dev/v1alpha1\nkind: StreamApp\nmetadata: {name: t}\nspec:\n  kafka: {bootstrapServers: \"127.0.0.1:1\"}\n  source: {topics: [in]}\n",
        )
        .expect("manifest");
        let err = match App::load(&manifest, Some(&dir.join("secret"))) {
            Ok(_) => "loaded".to_string(),
            Err(e) => e.to_string(),
        };
        std::fs::remove_dir_all(&dir).ok();
        assert!(
            err.starts_with(r#"key "plugin.library.paths" of Secret mounted at "#)
                && err.contains("loads a shared library"),
            "{err}"
        );
        assert_eq!(
            oxbow_crds::redact::scrub("login failed for pw-sentinel-42"),
            "login failed for [redacted]",
            "the mounted Secret's values are not remembered as secret"
        );
    }

    #[test]
    fn a_deployment_is_not_taken_for_a_streamapp() {
        let err = parse_manifest(
            Path::new("d.yaml"),
            "apiVersion: apps/v1\nkind: Deployment\n",
        )
        .expect_err("wrong kind");
        assert_eq!(
            err.to_string(),
            "d.yaml is a apps/v1 Deployment, not an oxbow.dev StreamApp"
        );
    }
}
