//! Which librdkafka properties a user may hand to Oxbow's Kafka clients, in
//! `spec.kafka.properties` or in the Secret of `spec.kafka.secretRef`.
//!
//! librdkafka can be told to load a shared library into the process
//! (`plugin.library.paths`, OpenSSL engines and providers), to run a command
//! (`sasl.kerberos.kinit.cmd`) or to read any file the process can read (`*.location`,
//! `*.file`, the Kerberos keytab). A StreamApp's author is not the operator's administrator: none
//! of these may come from a manifest or a Secret. Certificates and keys are given as
//! content (`ssl.ca.pem`, `ssl.certificate.pem`, `ssl.key.pem`) instead, which the
//! operator's admin client and the worker read alike.
//!
//! A secret in the manifest is refused too: anyone who may read StreamApps would read it.
//!
//! This module owns that rule; it performs no I/O, and its messages never quote a value.

use std::collections::BTreeMap;

use crate::redact::is_sensitive;

/// Where a property was set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// `spec.kafka.properties`: readable by anyone who may read the StreamApp.
    Manifest,
    /// The Secret of `spec.kafka.secretRef`.
    Secret,
}

/// Why a property is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    LoadsCode,
    RunsCommand,
    ReadsFiles,
    SecretInManifest,
}

impl Refusal {
    /// What the property would do, and what to use instead.
    pub fn explain(self) -> &'static str {
        match self {
            Refusal::LoadsCode => {
                "it loads a shared library into Oxbow's processes, which a StreamApp may not do"
            }
            Refusal::RunsCommand => {
                "it runs a command in Oxbow's processes, which a StreamApp may not do"
            }
            Refusal::ReadsFiles => {
                "it reads a file of the operator's or the worker's filesystem; give the content instead (ssl.ca.pem, ssl.certificate.pem, ssl.key.pem) in the Secret of spec.kafka.secretRef, or ssl.ca.location: probe for the system's CAs"
            }
            Refusal::SecretInManifest => {
                "its value is secret and anyone who may read the StreamApp would read it; put it in the Secret named by spec.kafka.secretRef"
            }
        }
    }
}

/// Properties that make librdkafka or OpenSSL load code.
const LOADS_CODE: &[&str] = &[
    "plugin.library.paths",
    "ssl.engine.location",
    "ssl.engine.id",
    "ssl.providers",
];

/// Why the property `name` with `value`, set at `place`, is refused; `None` when allowed.
pub fn refusal(name: &str, value: &str, place: Place) -> Option<Refusal> {
    let n = name.trim().to_ascii_lowercase();
    if LOADS_CODE.contains(&n.as_str()) {
        return Some(Refusal::LoadsCode);
    }
    if n == "sasl.kerberos.kinit.cmd" {
        return Some(Refusal::RunsCommand);
    }
    // `probe` reads only the system's well-known CA bundles, which is what a managed
    // Kafka with a public CA needs.
    let probe = n == "ssl.ca.location" && value.trim() == "probe";
    // `*.file`: the OAUTHBEARER assertion files of a librdkafka built with curl.
    if (n.ends_with(".location") || n.ends_with(".file") || n == "sasl.kerberos.keytab") && !probe {
        return Some(Refusal::ReadsFiles);
    }
    if place == Place::Manifest && is_sensitive(&n) {
        return Some(Refusal::SecretInManifest);
    }
    None
}

/// Every refused property of one client configuration: `manifest` from
/// `spec.kafka.properties`, `secret` from the Secret named `secret_name`. Each entry
/// names where the property was set, never its value.
pub fn refused(
    manifest: &BTreeMap<String, String>,
    secret: &BTreeMap<String, String>,
    secret_name: &str,
) -> Vec<Refused> {
    let at = |place, props: &BTreeMap<String, String>| {
        props
            .iter()
            .filter_map(|(name, value)| {
                refusal(name, value, place).map(|why| Refused {
                    path: match place {
                        Place::Manifest => format!("spec.kafka.properties[{name:?}]"),
                        Place::Secret => format!("key {name:?} of Secret {secret_name}"),
                    },
                    why,
                })
            })
            .collect::<Vec<_>>()
    };
    let mut out = at(Place::Manifest, manifest);
    out.extend(at(Place::Secret, secret));
    out
}

/// One refused property, for an error message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub path: String,
    pub why: Refusal,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: refused, because {}", self.path, self.why.explain())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_that_load_code_run_commands_or_read_files_are_refused_anywhere() {
        for place in [Place::Manifest, Place::Secret] {
            for (name, why) in [
                ("plugin.library.paths", Refusal::LoadsCode),
                ("Plugin.Library.Paths", Refusal::LoadsCode),
                ("ssl.engine.location", Refusal::LoadsCode),
                ("ssl.providers", Refusal::LoadsCode),
                ("sasl.kerberos.kinit.cmd", Refusal::RunsCommand),
                ("ssl.key.location", Refusal::ReadsFiles),
                ("ssl.keystore.location", Refusal::ReadsFiles),
                ("ssl.crl.location", Refusal::ReadsFiles),
                ("sasl.kerberos.keytab", Refusal::ReadsFiles),
                (
                    "sasl.oauthbearer.assertion.private.key.file",
                    Refusal::ReadsFiles,
                ),
                ("ssl.ca.location", Refusal::ReadsFiles),
            ] {
                assert_eq!(refusal(name, "/etc/shadow", place), Some(why), "{name}");
            }
        }
    }

    #[test]
    fn the_system_ca_probe_and_ordinary_tuning_are_allowed() {
        assert_eq!(refusal("ssl.ca.location", "probe", Place::Manifest), None);
        for name in [
            "linger.ms",
            "compression.type",
            "security.protocol",
            "sasl.mechanism",
        ] {
            assert_eq!(refusal(name, "x", Place::Manifest), None, "{name}");
        }
    }

    #[test]
    fn a_secret_is_refused_in_the_manifest_and_welcome_in_the_secret() {
        for name in [
            "sasl.password",
            "ssl.key.pem",
            "sasl.username",
            "ssl.key.password",
        ] {
            assert_eq!(
                refusal(name, "x", Place::Manifest),
                Some(Refusal::SecretInManifest),
                "{name}"
            );
            assert_eq!(refusal(name, "x", Place::Secret), None, "{name}");
        }
    }

    #[test]
    fn each_refused_property_is_named_where_it_was_set_without_its_value() {
        let m = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let r = refused(
            &m(&[("sasl.password", "pw-sentinel"), ("linger.ms", "5")]),
            &m(&[
                ("plugin.library.paths", "/tmp/evil.so"),
                ("sasl.password", "pw"),
            ]),
            "creds",
        );
        let text: Vec<String> = r.iter().map(|r| r.to_string()).collect();
        assert_eq!(text.len(), 2, "{text:?}");
        assert!(text[0].starts_with(r#"spec.kafka.properties["sasl.password"]: refused"#));
        assert!(text[1].starts_with(
            r#"key "plugin.library.paths" of Secret creds: refused, because it loads"#
        ));
        assert!(!text.concat().contains("sentinel") && !text.concat().contains("evil"));
    }
}
