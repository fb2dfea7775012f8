//! Which Kafka client values are secret, and their removal from text that leaves the
//! process (errors, conditions, events, `lastError`, log lines). librdkafka quotes a
//! refused property's value in its error, so any error text built from a client
//! configuration can carry a password or a private key.
//!
//! The rule: every value that came from the Secret of `spec.kafka.secretRef` is secret,
//! and so is any value of a property whose name marks it as sensitive, wherever it was
//! set. The few properties whose values are enumerations that name no secret
//! (`security.protocol`, `sasl.mechanism`, …) stay visible even from the Secret:
//! redacting "SSL" or "PLAIN" would mangle every message and hide nothing.
//!
//! Every client configuration a process builds is remembered ([`Redactor::remember`]),
//! and what leaves the process passes through [`scrub`]: status and event text, and
//! every log line ([`ScrubbingWriter`] under the tracing subscriber).
//!
//! This module owns that rule, the process's set of secret values and the text
//! substitution; its only I/O is the writer it is given.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::RwLock;

/// What a secret value is replaced with.
pub const REDACTED: &str = "[redacted]";

/// Properties whose values are enumerations, never secrets.
const PUBLIC_ENUMS: &[&str] = &[
    "security.protocol",
    "sasl.mechanism",
    "sasl.mechanisms",
    "ssl.endpoint.identification.algorithm",
    "sasl.oauthbearer.method",
];

fn is_public_enum(name: &str) -> bool {
    PUBLIC_ENUMS.contains(&name.to_ascii_lowercase().as_str())
}

/// Whether a property's name marks its value as sensitive: `*.password`, `*.key*`,
/// `sasl.*`, `ssl.*.pem`, `*secret*`, `*token*`.
pub fn is_sensitive(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    if is_public_enum(&n) {
        return false;
    }
    n.ends_with(".password")
        || n.contains(".key")
        || n.starts_with("sasl.")
        || (n.starts_with("ssl.") && n.ends_with(".pem"))
        || n.contains("secret")
        || n.contains("token")
}

/// The secret values of one client configuration, to remove from text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Redactor {
    /// Longest first, so a value that contains another is replaced whole.
    secrets: Vec<String>,
}

impl Redactor {
    /// `properties`: every property in effect; `from_secret`: the names that came from
    /// the Secret.
    pub fn new<'a>(
        properties: &BTreeMap<String, String>,
        from_secret: impl IntoIterator<Item = &'a String>,
    ) -> Self {
        let from_secret: Vec<&String> = from_secret.into_iter().collect();
        let mut secrets: Vec<String> = Vec::new();
        for (name, value) in properties {
            // A flag or a number set in the Secret (`enable.ssl.certificate.verification`,
            // a timeout) names no secret, and redacting "true" would mangle every message.
            let plain = {
                let v = value.trim();
                v.eq_ignore_ascii_case("true")
                    || v.eq_ignore_ascii_case("false")
                    || v.parse::<f64>().is_ok()
            };
            let secret = is_sensitive(name)
                || (from_secret.contains(&name) && !is_public_enum(name) && !plain);
            if !secret {
                continue;
            }
            // A PEM value (or any multi-line one) may be quoted in part: each line of
            // substance is secret on its own.
            let lines = value
                .lines()
                .map(str::trim)
                .filter(|l| l.len() >= 16 && !l.starts_with("-----"));
            for v in std::iter::once(value.as_str()).chain(lines) {
                secrets.push(v.to_string());
                // As a JSON log line or a Debug field shows it: `"` and `\` escaped.
                for quoted in [
                    serde_json::to_string(v).unwrap_or_default(),
                    format!("{v:?}"),
                ] {
                    let inner = quoted.trim_matches('"');
                    if inner != v {
                        secrets.push(inner.to_string());
                    }
                }
            }
        }
        // An empty or one-character value would redact half of every message.
        secrets.retain(|s| s.trim().len() >= 2);
        Self {
            secrets: longest_first(secrets),
        }
    }

    /// `text` with every secret value replaced by [`REDACTED`].
    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_string();
        for s in &self.secrets {
            if out.contains(s.as_str()) {
                out = replace_quoted(&out, s);
            }
        }
        out
    }

    /// Adds these values to the ones [`scrub`] removes, for the rest of the process.
    /// Values are never forgotten: a rotated password must not reappear in old errors.
    pub fn remember(&self) {
        let mut known = KNOWN.write().unwrap_or_else(|e| e.into_inner());
        if self.secrets.iter().all(|s| known.secrets.contains(s)) {
            return;
        }
        let mut merged = known.secrets.clone();
        merged.extend(self.secrets.iter().cloned());
        known.secrets = longest_first(merged);
    }
}

/// Longest first (a value that contains another is replaced whole), each once.
fn longest_first(mut secrets: Vec<String>) -> Vec<String> {
    secrets.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    secrets.dedup();
    secrets
}

/// Values this long are replaced wherever they occur; a shorter one (a user name, a
/// short password) only where it stands alone, so that "app" does not mangle "apps".
const ANYWHERE: usize = 12;

/// `-` joins names (`fraud-detection`); a `.` may end a sentence, so it does not.
fn is_word(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '-')
}

fn replace_quoted(text: &str, secret: &str) -> String {
    if secret.len() >= ANYWHERE {
        return text.replace(secret, REDACTED);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(secret) {
        let (before, tail) = rest.split_at(at);
        let after = &tail[secret.len()..];
        let alone = !before.chars().next_back().is_some_and(is_word)
            && !after.chars().next().is_some_and(is_word);
        out.push_str(before);
        out.push_str(if alone { REDACTED } else { secret });
        rest = after;
    }
    out.push_str(rest);
    out
}

/// The secret values of every client configuration this process has built.
static KNOWN: RwLock<Redactor> = RwLock::new(Redactor {
    secrets: Vec::new(),
});

/// `text` without any secret value this process knows of.
pub fn scrub(text: &str) -> String {
    let known = KNOWN.read().unwrap_or_else(|e| e.into_inner());
    if known.secrets.is_empty() {
        return text.to_string();
    }
    known.redact(text)
}

/// The fields of a status that carry free text (errors quoted from Kafka).
const TEXT_FIELDS: &[&str] = &["message", "lastError"];

/// Scrubs the free-text fields ([`TEXT_FIELDS`]) of `value`, a status or a patch about to
/// be sent, at any depth. Names and ids are left alone: a user name that is also an app's
/// name must not turn `metadata.name` or `applicationId` into `[redacted]`.
pub fn scrub_json(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Array(items) => items.iter_mut().for_each(scrub_json),
        serde_json::Value::Object(fields) => {
            for (k, v) in fields.iter_mut() {
                match v {
                    serde_json::Value::String(s) if TEXT_FIELDS.contains(&k.as_str()) => {
                        let clean = scrub(s);
                        if clean != *s {
                            *s = clean;
                        }
                    }
                    _ => scrub_json(v),
                }
            }
        }
        _ => {}
    }
}

/// Panics print through [`scrub`] too (the default hook writes straight to stderr).
pub fn scrub_panics() {
    std::panic::set_hook(Box::new(|info| {
        let backtrace = std::backtrace::Backtrace::capture();
        let thread = std::thread::current();
        let text = format!(
            "thread '{}' {info}\n{backtrace}",
            thread.name().unwrap_or("<unnamed>")
        );
        let _ = writeln!(std::io::stderr(), "{}", scrub(&text));
    }));
}

/// A log writer that scrubs what it is given before passing it on. The tracing
/// subscriber makes one per event and drops it after writing, so each event is scrubbed
/// whole (a value split across two `write` calls is still found).
pub struct ScrubbingWriter<W: Write> {
    inner: W,
    pending: Vec<u8>,
}

impl<W: Write> ScrubbingWriter<W> {
    pub fn new(inner: W) -> Self {
        Self {
            inner,
            pending: Vec::new(),
        }
    }

    fn emit(&mut self) -> std::io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let text = scrub(&String::from_utf8_lossy(&self.pending));
        self.pending.clear();
        self.inner.write_all(text.as_bytes())
    }
}

impl<W: Write> Write for ScrubbingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.pending.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.emit()?;
        self.inner.flush()
    }
}

impl<W: Write> Drop for ScrubbingWriter<W> {
    fn drop(&mut self) {
        let _ = self.emit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn names_that_mark_a_value_sensitive_are_recognised() {
        for n in [
            "sasl.password",
            "sasl.username",
            "sasl.jaas.config",
            "ssl.key.password",
            "ssl.key.pem",
            "ssl.keystore.password",
            "ssl.certificate.pem",
            "sasl.oauthbearer.client.secret",
            "my.token.value",
        ] {
            assert!(is_sensitive(n), "{n}");
        }
        for n in [
            "security.protocol",
            "sasl.mechanism",
            "bootstrap.servers",
            "linger.ms",
            "ssl.ca.location",
        ] {
            assert!(!is_sensitive(n), "{n}");
        }
    }

    #[test]
    fn a_refused_value_quoted_by_librdkafka_is_redacted() {
        let p = props(&[("sasl.password", "hunter2-sentinel"), ("linger.ms", "5")]);
        let r = Redactor::new(&p, []);
        let msg = r#"Invalid value "hunter2-sentinel" for configuration property "sasl.password""#;
        assert_eq!(
            r.redact(msg),
            r#"Invalid value "[redacted]" for configuration property "sasl.password""#
        );
    }

    #[test]
    fn every_value_from_the_secret_is_secret_but_enumerations_stay_readable() {
        let p = props(&[
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "SCRAM-SHA-512"),
            ("client.rack", "rack-with-a-secret-name"),
        ]);
        let names: Vec<String> = p.keys().cloned().collect();
        let r = Redactor::new(&p, &names);
        assert_eq!(
            r.redact("SASL_SSL with SCRAM-SHA-512 from rack-with-a-secret-name"),
            "SASL_SSL with SCRAM-SHA-512 from [redacted]"
        );
        let flags = props(&[
            ("enable.ssl.certificate.verification", "true"),
            ("sasl.password", "123456"),
        ]);
        let names: Vec<String> = flags.keys().cloned().collect();
        assert_eq!(
            Redactor::new(&flags, &names).redact("ready: true, password 123456"),
            "ready: true, password [redacted]"
        );
    }

    #[test]
    fn a_short_value_is_redacted_where_it_stands_alone_but_not_inside_a_word() {
        let r = Redactor::new(&props(&[("sasl.username", "app")]), []);
        assert_eq!(
            r.redact(r#"user "app" refused; apps and app-1 are fine; app"#),
            r#"user "[redacted]" refused; apps and app-1 are fine; [redacted]"#
        );
    }

    #[test]
    fn a_remembered_value_is_scrubbed_from_logs_and_json_for_the_life_of_the_process() {
        Redactor::new(&props(&[("sasl.password", "remembered-sentinel-1")]), []).remember();
        let mut out = Vec::new();
        {
            let mut w = ScrubbingWriter::new(&mut out);
            w.write_all(b"login with remembered-sen").expect("write");
            w.write_all(b"tinel-1 refused\n").expect("write");
        }
        assert_eq!(
            String::from_utf8(out).expect("utf-8"),
            "login with [redacted] refused\n"
        );
        let mut status = serde_json::json!({
            "conditions": [{"message": "pw remembered-sentinel-1"}],
            "instances": [{"pod": "remembered-sentinel-1", "lastError": "x remembered-sentinel-1"}],
        });
        scrub_json(&mut status);
        assert_eq!(status["conditions"][0]["message"], "pw [redacted]");
        assert_eq!(status["instances"][0]["lastError"], "x [redacted]");
        assert_eq!(
            status["instances"][0]["pod"], "remembered-sentinel-1",
            "names are not free text"
        );
    }

    #[test]
    fn a_value_is_found_as_a_json_or_debug_string_shows_it_too() {
        let r = Redactor::new(&props(&[("sasl.password", r#"pa"ss\word"#)]), []);
        assert_eq!(
            r.redact(r#"{"error":"login pa\"ss\\word refused"}"#),
            r#"{"error":"login [redacted] refused"}"#
        );
        let short = Redactor::new(&props(&[("sasl.username", "fraud")]), []);
        assert_eq!(
            short.redact("user fraud. fraud-detection"),
            "user [redacted]. fraud-detection"
        );
    }

    #[test]
    fn remembering_the_same_values_again_adds_nothing() {
        let p = props(&[(
            "ssl.key.pem",
            "aaaaaaaaaaaaaaaa1\nbbbbbbbbbbbbbbbb2\ncccccccccccccccc3",
        )]);
        Redactor::new(&p, []).remember();
        let before = KNOWN.read().expect("lock").secrets.len();
        Redactor::new(&p, []).remember();
        assert_eq!(KNOWN.read().expect("lock").secrets.len(), before);
    }

    #[test]
    fn a_line_of_a_private_key_quoted_alone_is_redacted() {
        let pem = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQDWIT257Ma28\nAbCdEfGhIjKlMnOpQrStUvWxYz0123456789\n-----END PRIVATE KEY-----";
        let r = Redactor::new(&props(&[("ssl.key.pem", pem)]), []);
        assert_eq!(
            r.redact("bad key near MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQDWIT257Ma28"),
            "bad key near [redacted]"
        );
        assert_eq!(r.redact(pem), "[redacted]");
        assert_eq!(
            r.redact("-----BEGIN PRIVATE KEY-----"),
            "-----BEGIN PRIVATE KEY-----"
        );
    }
}
