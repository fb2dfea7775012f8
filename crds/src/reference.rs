//! The field reference `docs/reference/streamapp-fields.md`, rendered from the CRD's
//! OpenAPI v3 schema so it cannot miss a field or disagree with what the API server
//! checks.
//!
//! [`render`] is generic (any structural schema in, markdown out) and pure;
//! [`streamapp_fields_md`] applies it to the StreamApp CRD. A test compares the result
//! with the committed file.

use kube::CustomResourceExt;
use serde_json::Value;

use crate::streamapp::StreamApp;

/// Path of the committed reference, relative to the workspace root.
pub const REFERENCE_PATH: &str = "docs/reference/streamapp-fields.md";

/// A field of one of Kubernetes' own types: named, not expanded (their reference is
/// Kubernetes', and expanded they would outweigh every Oxbow field together).
#[derive(Debug, Clone, Copy)]
pub struct External {
    /// Field path as the reference writes it, e.g. `spec.podTemplate.affinity`.
    pub path: &'static str,
    /// What the type column says, e.g. `core/v1 Affinity`.
    pub type_name: &'static str,
}

/// What surrounds the tables.
#[derive(Debug, Clone, Copy)]
pub struct Page<'a> {
    pub title: &'a str,
    /// Markdown between the title and the contents.
    pub intro: &'a str,
    /// Heading of the section of the schema's root object.
    pub root: &'a str,
    pub external: &'a [External],
}

/// The StreamApp's fields whose types are Kubernetes'.
pub const STREAMAPP_EXTERNAL: &[External] = &[
    External {
        path: "spec.podTemplate.affinity",
        type_name: "core/v1 Affinity",
    },
    External {
        path: "spec.podTemplate.env",
        type_name: "list of core/v1 EnvVar",
    },
    External {
        path: "spec.podTemplate.tolerations",
        type_name: "list of core/v1 Toleration",
    },
    External {
        path: "spec.resources",
        type_name: "core/v1 ResourceRequirements",
    },
];

const INTRO: &str = "\
This file is generated from the CRD's OpenAPI v3 schema (the types in `crds/src/streamapp.rs`) \
by `crds/src/reference.rs`. Do not edit it: run \
`OXBOW_UPDATE_REFERENCE=1 cargo test --release -p oxbow-crds --test it committed_reference` \
and commit the result. What the fields do, with examples, is in [streamapp.md](../streamapp.md).

How to read it:

- **Paths.** `[]` stands for any item of a list, `*` for any key of a map:
  `spec.steps[].aggregate.fields.*.sum`.
- **Required.** Whether the API server rejects an object without the field. A field with a
  default is optional: the API server fills the default in.
- **Validation.** Every check the API server makes before it stores the object: enums,
  ranges, lengths, list and map sizes, and the CEL rules (`x-kubernetes-validations`) with
  the message `kubectl apply` prints when one fails. Checks that need more than the object
  (CEL syntax of the expressions, whether the source topics exist) are made by the
  operator: see [streamapp.md](../streamapp.md#reported-by-the-operator-stalled).
- **Kubernetes types.** `affinity`, `tolerations`, `env` and `resources` take Kubernetes'
  own types and are not expanded here: see the
  [Pod reference](https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/).
- **Status.** Written by the operator, except `status.instances[]`, which each worker pod
  writes for itself.";

/// The StreamApp field reference, as committed at [`REFERENCE_PATH`].
pub fn streamapp_fields_md() -> String {
    let crd = serde_json::to_value(StreamApp::crd()).unwrap_or(Value::Null);
    let version = &crd["spec"]["versions"][0];
    let schema = &version["schema"]["openAPIV3Schema"];
    let title = format!(
        "StreamApp fields (`{}/{}`)",
        crd["spec"]["group"].as_str().unwrap_or_default(),
        version["name"].as_str().unwrap_or_default()
    );
    render(
        &Page {
            title: &title,
            intro: INTRO,
            root: "StreamApp",
            external: STREAMAPP_EXTERNAL,
        },
        schema,
    )
}

/// The StreamApp CRD's schema (for tests of [`STREAMAPP_EXTERNAL`]).
pub fn streamapp_schema() -> Value {
    let crd = serde_json::to_value(StreamApp::crd()).unwrap_or(Value::Null);
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

/// Every field path of `schema`, in the reference's notation, in the order rendered.
pub fn field_paths(schema: &Value) -> Vec<String> {
    let mut out = Vec::new();
    collect_paths("", schema, &mut out);
    out
}

fn collect_paths(path: &str, node: &Value, out: &mut Vec<String>) {
    for (name, child) in properties(node) {
        let p = join(path, name);
        out.push(p.clone());
        collect_paths(&p, child, out);
    }
    if let Some(items) = node.get("items") {
        collect_paths(&format!("{path}[]"), items, out);
    }
    if let Some(values) = map_values(node) {
        collect_paths(&format!("{path}.*"), values, out);
    }
}

/// The markdown reference of `schema`: one section per object (the root, every object
/// field, every object in a list or map), each with a table of its fields.
pub fn render(page: &Page<'_>, schema: &Value) -> String {
    let mut sections = Vec::new();
    collect_sections("", schema, page, &mut sections);
    let mut out = format!(
        "# {}\n\n{}\n\n## Contents\n\n",
        page.title,
        page.intro.trim()
    );
    for (path, _) in &sections {
        out.push_str(&format!(
            "- [`{}`](#{})\n",
            heading(page, path),
            anchor(page, path)
        ));
    }
    for (path, node) in &sections {
        out.push('\n');
        out.push_str(&section(page, path, node));
    }
    out
}

fn collect_sections<'a>(
    path: &str,
    node: &'a Value,
    page: &Page<'_>,
    out: &mut Vec<(String, &'a Value)>,
) {
    if external(page, path).is_some() {
        return;
    }
    if node.get("properties").is_some() {
        out.push((path.to_string(), node));
    }
    for (name, child) in properties(node) {
        collect_sections(&join(path, name), child, page, out);
    }
    if let Some(items) = node.get("items") {
        collect_sections(&format!("{path}[]"), items, page, out);
    }
    if let Some(values) = map_values(node) {
        collect_sections(&format!("{path}.*"), values, page, out);
    }
}

fn section(page: &Page<'_>, path: &str, node: &Value) -> String {
    let mut out = format!(
        "<a id=\"{}\"></a>\n\n## `{}`\n\n",
        anchor(page, path),
        heading(page, path)
    );
    if let Some(d) = description(node) {
        out.push_str(&escape_html(&d));
        out.push_str("\n\n");
    }
    // An object field's own checks are in its row of the parent's table; the root and
    // the objects of lists and maps have no row, so theirs are listed here.
    let has_row = !(path.is_empty() || path.ends_with("[]") || path.ends_with(".*"));
    let own = checks(node);
    if !has_row && !own.is_empty() {
        out.push_str("Checked on the whole object:\n\n");
        for c in own {
            out.push_str(&format!("- {c}\n"));
        }
        out.push('\n');
    }
    out.push_str("| field | type | required | default | validation | description |\n");
    out.push_str("|---|---|---|---|---|---|\n");
    let required: Vec<&str> = node
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for (name, child) in properties(node) {
        let p = join(path, name);
        let validation = if external(page, &p).is_some() {
            checks(child)
        } else {
            all_checks(child)
        };
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {} |\n",
            p,
            type_of(page, &p, child),
            if required.contains(&name) {
                "required"
            } else {
                "optional"
            },
            child.get("default").map(default_text).unwrap_or("—".into()),
            if validation.is_empty() {
                "—".to_string()
            } else {
                validation.join("<br>")
            },
            description(child).map(|d| cell(&d)).unwrap_or("—".into()),
        ));
    }
    out
}

/// A node's checks plus those of its scalar items or map values (which have no row of
/// their own); objects inside get their own section.
fn all_checks(node: &Value) -> Vec<String> {
    let mut out = checks(node);
    let mut inner = |prefix: &str, n: &Value| {
        if n.get("properties").is_none() {
            out.extend(all_checks(n).into_iter().map(|c| format!("{prefix}: {c}")));
        }
    };
    if let Some(items) = node.get("items") {
        inner("each item", items);
    }
    if let Some(values) = map_values(node) {
        inner("each value", values);
    }
    out
}

/// The checks the API server makes on this node itself.
fn checks(node: &Value) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(values) = node.get("enum").and_then(Value::as_array) {
        let values: Vec<String> = values
            .iter()
            .filter(|v| !v.is_null())
            .map(|v| format!("`{}`", scalar(v)))
            .collect();
        out.push(format!("one of {}", values.join(", ")));
    }
    if let Some(r) = range(node, "minimum", "maximum", "") {
        out.push(r);
    }
    if let Some(r) = range(node, "minLength", "maxLength", "character") {
        out.push(r);
    }
    if let Some(r) = range(node, "minItems", "maxItems", "item") {
        out.push(r);
    }
    if let Some(r) = range(node, "minProperties", "maxProperties", "key") {
        out.push(r);
    }
    if let Some(p) = node.get("pattern").and_then(Value::as_str) {
        out.push(format!("matches `{}`", code(p)));
    }
    if let Some(list) = node.get("x-kubernetes-list-type").and_then(Value::as_str) {
        let keys: Vec<String> = node
            .get("x-kubernetes-list-map-keys")
            .and_then(Value::as_array)
            .map(|k| {
                k.iter()
                    .filter_map(Value::as_str)
                    .map(|k| format!("`{k}`"))
                    .collect()
            })
            .unwrap_or_default();
        out.push(match list {
            "map" => format!("list-map keyed by {}", keys.join(", ")),
            other => format!("list type `{other}`"),
        });
    }
    for rule in node
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let text = rule.get("rule").and_then(Value::as_str).unwrap_or_default();
        let message = rule
            .get("message")
            .and_then(Value::as_str)
            .map(|m| format!(": \"{}\"", cell(m)))
            .or_else(|| {
                rule.get("messageExpression")
                    .and_then(Value::as_str)
                    .map(|m| format!(": message `{}`", code(m)))
            })
            .unwrap_or_default();
        out.push(format!("rule `{}`{message}", code(text)));
    }
    out
}

/// `1 to 16 items`, `at least 0`, `at most 1 character`.
fn range(node: &Value, min: &str, max: &str, unit: &str) -> Option<String> {
    let min = node.get(min).and_then(Value::as_f64);
    let max = node.get(max).and_then(Value::as_f64);
    let n = |v: f64| {
        if v.fract() == 0.0 && v.abs() < 1e15 {
            format!("{}", v as i64)
        } else {
            format!("{v}")
        }
    };
    let unit = |v: f64| match unit {
        "" => String::new(),
        u if v == 1.0 => format!(" {u}"),
        u => format!(" {u}s"),
    };
    match (min, max) {
        (Some(a), Some(b)) => Some(format!("{} to {}{}", n(a), n(b), unit(b))),
        (Some(a), None) => Some(format!("at least {}{}", n(a), unit(a))),
        (None, Some(b)) => Some(format!("at most {}{}", n(b), unit(b))),
        (None, None) => None,
    }
}

fn type_of(page: &Page<'_>, path: &str, node: &Value) -> String {
    if let Some(e) = external(page, path) {
        return e.type_name.to_string();
    }
    if node
        .get("x-kubernetes-int-or-string")
        .and_then(Value::as_bool)
        == Some(true)
    {
        return "int or string".into();
    }
    if node.get("properties").is_some() {
        return format!("[object](#{})", anchor(page, path));
    }
    if let Some(items) = node.get("items") {
        return format!("list of {}", type_of(page, &format!("{path}[]"), items));
    }
    if let Some(values) = map_values(node) {
        return format!("map of {}", type_of(page, &format!("{path}.*"), values));
    }
    let format = node.get("format").and_then(Value::as_str);
    match (node.get("type").and_then(Value::as_str), format) {
        (Some("integer"), Some(f @ ("int32" | "int64"))) => f.into(),
        (Some("number"), _) => "number".into(),
        (Some("string"), Some(f)) => format!("string ({f})"),
        (Some(t), _) => t.into(),
        // No type: `x-kubernetes-preserve-unknown-fields`, anything goes.
        (None, _) => "any".into(),
    }
}

fn properties(node: &Value) -> Vec<(&str, &Value)> {
    let mut out: Vec<(&str, &Value)> = node
        .get("properties")
        .and_then(Value::as_object)
        .map(|m| m.iter().map(|(k, v)| (k.as_str(), v)).collect())
        .unwrap_or_default();
    // Sorted here rather than trusting the map: serde_json keeps insertion order when
    // some crate in the build enables `preserve_order`.
    out.sort_by(|a, b| a.0.cmp(b.0));
    out
}

fn map_values(node: &Value) -> Option<&Value> {
    node.get("additionalProperties").filter(|v| v.is_object())
}

fn external<'p>(page: &Page<'p>, path: &str) -> Option<&'p External> {
    page.external.iter().find(|e| e.path == path)
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

fn heading(page: &Page<'_>, path: &str) -> String {
    if path.is_empty() {
        page.root.to_string()
    } else {
        path.to_string()
    }
}

/// An explicit anchor: headings made of code spans get unreadable generated ones.
fn anchor(page: &Page<'_>, path: &str) -> String {
    let text = heading(page, path)
        .replace("[]", ".item")
        .replace('*', "value");
    let mut out = String::new();
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_matches('-').to_string()
}

/// Paragraphs kept apart, lines within one joined (doc comments wrap at 90 columns).
fn description(node: &Value) -> Option<String> {
    let d = node.get("description").and_then(Value::as_str)?.trim();
    if d.is_empty() {
        return None;
    }
    let paragraphs: Vec<String> = d
        .split("\n\n")
        .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|p| !p.is_empty())
        .collect();
    Some(paragraphs.join("\n\n"))
}

/// Text fit for a table cell: no line breaks and no column separators.
fn cell(text: &str) -> String {
    escape_html(text)
        .replace("\n\n", "<br><br>")
        .replace('\n', " ")
        .replace('|', "\\|")
}

/// `<` outside code spans escaped, so `<applicationId>` is not taken for HTML.
fn escape_html(text: &str) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for c in text.chars() {
        match c {
            '`' => {
                in_code = !in_code;
                out.push(c);
            }
            '<' if !in_code => out.push_str("&lt;"),
            _ => out.push(c),
        }
    }
    out
}

/// Text for a code span inside a table cell.
fn code(text: &str) -> String {
    text.replace('|', "\\|").replace('`', "'")
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn default_text(v: &Value) -> String {
    format!("`{}`", code(&scalar(v)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn page<'a>(external: &'a [External]) -> Page<'a> {
        Page {
            title: "Thing fields",
            intro: "Generated.",
            root: "Thing",
            external,
        }
    }

    fn tiny() -> Value {
        json!({
            "type": "object",
            "required": ["spec"],
            "x-kubernetes-validations": [{"rule": "self.a || self.b", "message": "a or b"}],
            "properties": {
                "spec": {
                    "type": "object",
                    "description": "The wish.\nWrapped line.\n\nSecond paragraph.",
                    "required": ["topics"],
                    "properties": {
                        "topics": {
                            "type": "array", "minItems": 1, "maxItems": 16,
                            "items": {"type": "string", "maxLength": 249},
                        },
                        "replicas": {
                            "type": "integer", "format": "int32", "default": 1,
                            "minimum": 0.0, "maximum": 1000.0,
                        },
                        "mode": {"type": "string", "enum": ["fast", "safe", null], "default": "safe"},
                        "size": {
                            "type": "string",
                            "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "size is immutable"}],
                        },
                        "steps": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "description": "One step.",
                                "x-kubernetes-validations": [{"rule": "has(self.x)", "message": "x is needed"}],
                                "properties": {"x": {"type": "string", "description": "Uses `<id>` and <b>."}},
                            },
                        },
                        "stores": {
                            "type": "object",
                            "additionalProperties": {
                                "type": "object",
                                "properties": {"ratio": {"type": "number", "format": "double"}},
                            },
                        },
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "affinity": {"type": "object", "properties": {"deep": {"type": "string"}}},
                    },
                },
            },
        })
    }

    fn row<'a>(md: &'a str, field: &str) -> &'a str {
        let start = format!("| `{field}` |");
        md.lines()
            .find(|l| l.starts_with(&start))
            .unwrap_or_else(|| panic!("no row for {field} in\n{md}"))
    }

    #[test]
    fn every_field_gets_a_row_with_type_requiredness_default_and_checks() {
        let md = render(&page(&[]), &tiny());
        assert_eq!(
            row(&md, "spec.replicas"),
            "| `spec.replicas` | int32 | optional | `1` | 0 to 1000 | — |"
        );
        assert_eq!(
            row(&md, "spec.topics"),
            "| `spec.topics` | list of string | required | — | 1 to 16 items<br>each item: at most 249 characters | — |"
        );
        assert!(
            row(&md, "spec.mode").contains("| `safe` | one of `fast`, `safe` |"),
            "null is not a value to offer"
        );
        assert!(
            row(&md, "spec.size").contains("rule `self == oldSelf`: \"size is immutable\""),
            "{md}"
        );
        assert!(row(&md, "spec.labels").contains("| map of string |"));
        assert!(row(&md, "spec").contains("| required |"));
    }

    #[test]
    fn objects_in_fields_lists_and_maps_get_their_own_linked_sections() {
        let md = render(&page(&[]), &tiny());
        for (path, anchor) in [
            ("Thing", "thing"),
            ("spec", "spec"),
            ("spec.steps[]", "spec-steps-item"),
            ("spec.stores.*", "spec-stores-value"),
            ("spec.affinity", "spec-affinity"),
        ] {
            assert!(
                md.contains(&format!("<a id=\"{anchor}\"></a>\n\n## `{path}`\n")),
                "section {path}:\n{md}"
            );
            assert!(
                md.contains(&format!("- [`{path}`](#{anchor})\n")),
                "contents"
            );
        }
        assert!(row(&md, "spec.steps").contains("| list of [object](#spec-steps-item) |"));
        assert!(row(&md, "spec.stores").contains("| map of [object](#spec-stores-value) |"));
        assert!(row(&md, "spec.stores.*.ratio").contains("| number |"));
    }

    #[test]
    fn rules_of_objects_without_a_row_are_listed_in_their_section() {
        let md = render(&page(&[]), &tiny());
        let steps = md.split("## `spec.steps[]`").nth(1).expect("steps section");
        assert!(steps.starts_with("\n\nOne step.\n\nChecked on the whole object:\n\n- rule `has(self.x)`: \"x is needed\"\n"));
        assert!(
            md.contains("- rule `self.a \\|\\| self.b`: \"a or b\""),
            "pipes escaped"
        );
    }

    #[test]
    fn descriptions_keep_paragraphs_and_escape_html_outside_code() {
        let md = render(&page(&[]), &tiny());
        assert!(md.contains("## `spec`\n\nThe wish. Wrapped line.\n\nSecond paragraph.\n"));
        assert!(row(&md, "spec").ends_with("| The wish. Wrapped line.<br><br>Second paragraph. |"));
        assert!(row(&md, "spec.steps[].x").ends_with("| Uses `<id>` and &lt;b>. |"));
    }

    #[test]
    fn kubernetes_types_are_named_not_expanded() {
        let external = [External {
            path: "spec.affinity",
            type_name: "core/v1 Affinity",
        }];
        let md = render(&page(&external), &tiny());
        assert!(row(&md, "spec.affinity").contains("| core/v1 Affinity |"));
        assert!(!md.contains("spec.affinity.deep"), "{md}");
        assert!(!md.contains("## `spec.affinity`"));
    }

    #[test]
    fn field_paths_name_every_field_in_list_and_map_notation() {
        let paths = field_paths(&tiny());
        for p in [
            "spec.topics",
            "spec.steps[].x",
            "spec.stores.*.ratio",
            "spec.affinity.deep",
        ] {
            assert!(paths.iter().any(|q| q == p), "{p} in {paths:?}");
        }
    }

    #[test]
    fn every_external_type_names_a_field_of_the_streamapp() {
        let paths = field_paths(&streamapp_schema());
        for e in STREAMAPP_EXTERNAL {
            assert!(
                paths.iter().any(|p| p == e.path),
                "{} is not a field",
                e.path
            );
        }
    }
}
