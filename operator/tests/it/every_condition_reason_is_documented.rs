//! docs/streamapp.md must explain every condition reason, phase and event reason the
//! operator can set, and nothing it cannot. Pure: reads the operator's lists
//! (`status::reason::ALL`, `controller::EventReason::VARIANTS`), the CRD's phase enum and
//! the doc's tables; no cluster.

use std::collections::BTreeSet;
use std::path::PathBuf;

use oxbow_operator::controller::EventReason;
use oxbow_operator::status::reason;
use strum::VariantArray;

fn doc() -> String {
    let path = PathBuf::from(manifest_dir()).join("../docs/streamapp.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The rows of the table whose header line starts with `header`, as cells.
fn table(doc: &str, header: &str) -> Vec<Vec<String>> {
    let mut lines = doc.lines().skip_while(|l| !l.starts_with(header));
    assert!(
        lines.next().is_some(),
        "docs/streamapp.md has no table starting `{header}`"
    );
    lines
        .skip(1) // the |---| line
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.trim()
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

/// The names in backticks in a cell: "`Ready`, `Stalled`" gives both.
fn names(cell: &str) -> BTreeSet<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// (condition type, reason) pairs of the conditions table.
fn documented_reasons() -> BTreeSet<(String, String)> {
    let rows = table(&doc(), "| condition | status | reason |");
    let mut out = BTreeSet::new();
    for row in rows {
        for t in names(&row[0]) {
            for r in names(&row[2]) {
                out.insert((t.clone(), r));
            }
        }
    }
    out
}

#[test]
fn every_condition_reason_is_documented_with_its_condition() {
    let documented = documented_reasons();
    let missing: Vec<String> = reason::ALL
        .iter()
        .flat_map(|(r, on)| {
            on.iter()
                .map(move |t| (t.to_string(), r.as_str().to_string()))
        })
        .filter(|pair| !documented.contains(pair))
        .map(|(t, r)| format!("{t}/{r}"))
        .collect();
    assert!(
        missing.is_empty(),
        "condition reasons the operator sets but docs/streamapp.md does not explain \
         (add a row to the table under `### Conditions` saying what it means and what to do): {missing:?}"
    );
}

#[test]
fn every_documented_condition_reason_is_one_the_operator_sets() {
    let code: BTreeSet<(String, String)> = reason::ALL
        .iter()
        .flat_map(|(r, on)| {
            on.iter()
                .map(move |t| (t.to_string(), r.as_str().to_string()))
        })
        .collect();
    let stale: Vec<String> = documented_reasons()
        .into_iter()
        .filter(|pair| !code.contains(pair))
        .map(|(t, r)| format!("{t}/{r}"))
        .collect();
    assert!(
        stale.is_empty(),
        "docs/streamapp.md documents condition reasons that operator/src/status.rs (reason::ALL) \
         does not list for that condition: {stale:?}"
    );
}

#[test]
fn every_phase_is_documented() {
    let schema = oxbow_crds::reference::streamapp_schema();
    let phases: BTreeSet<String> = schema["properties"]["status"]["properties"]["phase"]["enum"]
        .as_array()
        .expect("status.phase is an enum")
        .iter()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    assert!(phases.contains("Running"), "{phases:?}");
    let documented: BTreeSet<String> = table(&doc(), "| phase | when |")
        .iter()
        .flat_map(|row| names(&row[0]))
        .collect();
    assert_eq!(
        documented, phases,
        "the Phase table of docs/streamapp.md must name exactly the phases of status.phase"
    );
}

#[test]
fn every_event_reason_is_documented() {
    // The Warning events of stalled apps take the Stalled reasons, covered above; the
    // table's row for them does not start with a reason in backticks.
    let documented: BTreeSet<String> = table(&doc(), "| reason | type | when |")
        .iter()
        .filter(|row| row[0].starts_with('`'))
        .flat_map(|row| names(&row[0]))
        .collect();
    let code: BTreeSet<String> = EventReason::VARIANTS
        .iter()
        .map(|r| r.as_str().to_string())
        .collect();
    assert_eq!(
        documented, code,
        "the Events table of docs/streamapp.md must list exactly controller::EventReason::VARIANTS"
    );
}

/// This crate's directory. Cargo sets `CARGO_MANIFEST_DIR` when it runs a test too, and
/// that value is the checkout being tested: the compile-time one is wherever the binary
/// was built, and a target directory shared by two checkouts (CI's clone and a working
/// copy) hands one checkout's test binaries to the other when the sources match.
fn manifest_dir() -> String {
    std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string())
}
