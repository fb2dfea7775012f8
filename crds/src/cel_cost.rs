//! The cost of a CEL expression: a bound on the work one evaluation can do, computed
//! from its syntax tree, in the spirit of Kubernetes' cost estimates for its own CEL
//! rules. CEL has no loops, so an evaluation's work grows only with the collections it
//! iterates (comprehensions: `all`, `exists`, `map`, `filter`, …) and the strings and
//! lists that some functions scan (`matches`, `contains`, `in`). The estimate is a
//! polynomial in `n`, the size of the largest collection or string in a record:
//! `value.items.map(i, value.items.filter(j, j > i))` is about n² steps.
//!
//! Two checks use it, both deterministic (a replayed record gets the same verdict):
//! - validation rejects an expression whose cost with collections of
//!   [`ASSUMED_SIZE`] elements exceeds [`BUDGET`] (nested comprehensions over
//!   anything sizable);
//! - the worker computes the cost for each record's actual sizes before evaluating, and
//!   a record over [`BUDGET`] is that record's error (`CostExceeded`), never a stalled
//!   partition.
//!
//! This module is pure: no evaluation, no records.

use cel::common::ast::{EntryExpr, Expr};

/// The most cost units one evaluation may take (a unit is one node visited, roughly a
/// few nanoseconds to a microsecond of work).
pub const BUDGET: u64 = 10_000_000;
/// The collection size validation assumes: a large but ordinary list in a record.
pub const ASSUMED_SIZE: u64 = 1_000;

/// Functions whose work grows with the size of what they scan.
/// (`_+_` is not among them: on numbers it is constant, and a concatenation inside a
/// comprehension is counted by the comprehension.)
const LINEAR: &[&str] = &["matches", "contains", "startsWith", "endsWith", "@in"];

/// `coefficients[d]` is the factor of n^d.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Cost {
    coefficients: Vec<u64>,
}

impl Cost {
    fn constant(c: u64) -> Self {
        Self {
            coefficients: vec![c],
        }
    }

    fn add(mut self, other: &Cost) -> Self {
        if self.coefficients.len() < other.coefficients.len() {
            self.coefficients.resize(other.coefficients.len(), 0);
        }
        for (a, b) in self.coefficients.iter_mut().zip(&other.coefficients) {
            *a = a.saturating_add(*b);
        }
        self
    }

    /// This cost once per element: multiplied by n.
    fn per_element(self) -> Self {
        let mut c = vec![0];
        c.extend(self.coefficients);
        Self { coefficients: c }
    }

    /// The highest power of n (0: the cost does not depend on the record).
    pub fn degree(&self) -> usize {
        self.coefficients
            .iter()
            .rposition(|&c| c > 0)
            .unwrap_or_default()
    }

    /// The cost for collections and strings of `n` elements, saturating.
    pub fn at(&self, n: u64) -> u64 {
        let mut total: u64 = 0;
        let mut power: u64 = 1;
        for &c in &self.coefficients {
            total = total.saturating_add(c.saturating_mul(power));
            power = power.saturating_mul(n.max(1));
        }
        total
    }
}

/// The cost of the expression a CEL program was compiled from.
pub fn estimate(program: &cel::Program) -> Cost {
    walk(&program.expression().expr)
}

fn walk(e: &Expr) -> Cost {
    match e {
        Expr::Unspecified | Expr::Ident(_) | Expr::Literal(_) => Cost::constant(1),
        Expr::Select(s) => walk(&s.operand.expr).add(&Cost::constant(1)),
        Expr::Call(c) => {
            let mut cost = Cost::constant(1);
            if let Some(t) = &c.target {
                cost = cost.add(&walk(&t.expr));
            }
            for a in &c.args {
                cost = cost.add(&walk(&a.expr));
            }
            if LINEAR.contains(&c.func_name.as_str()) {
                cost = cost.add(&Cost::constant(1).per_element());
            }
            cost
        }
        Expr::List(l) => l
            .elements
            .iter()
            .fold(Cost::constant(1), |c, x| c.add(&walk(&x.expr))),
        Expr::Map(m) => entries(m.entries.iter().map(|e| &e.expr)),
        Expr::Struct(s) => entries(s.entries.iter().map(|e| &e.expr)),
        Expr::Comprehension(c) => {
            let body = walk(&c.loop_cond.expr).add(&walk(&c.loop_step.expr));
            walk(&c.iter_range.expr)
                .add(&walk(&c.accu_init.expr))
                .add(&walk(&c.result.expr))
                .add(&body.per_element())
        }
    }
}

fn entries<'a>(es: impl Iterator<Item = &'a EntryExpr>) -> Cost {
    es.fold(Cost::constant(1), |c, e| match e {
        EntryExpr::StructField(f) => c.add(&walk(&f.value.expr)),
        EntryExpr::MapEntry(m) => c.add(&walk(&m.key.expr)).add(&walk(&m.value.expr)),
    })
}

/// The size `n` of a record for [`Cost::at`]: its largest list, object or string.
pub fn size_of(v: &serde_json::Value) -> u64 {
    match v {
        serde_json::Value::Array(a) => a.iter().map(size_of).fold(a.len() as u64, u64::max),
        serde_json::Value::Object(o) => o.values().map(size_of).fold(o.len() as u64, u64::max),
        serde_json::Value::String(s) => s.len() as u64,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost(src: &str) -> Cost {
        estimate(&cel::Program::compile(src).expect("compiles"))
    }

    #[test]
    fn a_field_comparison_costs_the_same_whatever_the_record() {
        let c = cost("value.amount > 100 && value.currency == 'EUR'");
        assert_eq!(c.degree(), 0);
        assert_eq!(c.at(1), c.at(1_000_000));
        assert!(c.at(ASSUMED_SIZE) < 100);
    }

    #[test]
    fn a_comprehension_grows_with_the_list_and_nesting_multiplies() {
        let one = cost("value.items.all(i, i.price > 0)");
        assert_eq!(one.degree(), 1);
        assert!(one.at(2_000) > one.at(1_000));
        let two = cost("value.items.all(i, value.items.exists(j, j.price > i.price))");
        assert_eq!(two.degree(), 2);
        let three = cost("value.a.all(i, value.a.all(j, value.a.exists(k, k == i + j)))");
        assert_eq!(three.degree(), 3);
        assert!(
            one.at(ASSUMED_SIZE) <= BUDGET,
            "one pass over a list is fine"
        );
        assert!(
            three.at(ASSUMED_SIZE) > BUDGET,
            "three nested passes are refused"
        );
    }

    #[test]
    fn scanning_functions_count_the_string_they_scan() {
        assert_eq!(cost("value.note.matches('^a.*z$')").degree(), 1);
        assert_eq!(cost("'x' in value.tags").degree(), 1);
    }

    #[test]
    fn the_cost_saturates_instead_of_overflowing() {
        let c = cost("value.a.all(i, value.a.all(j, value.a.all(k, value.a.all(l, true))))");
        assert_eq!(c.at(u64::MAX), u64::MAX);
    }

    #[test]
    fn a_records_size_is_its_largest_collection_or_string() {
        let v = serde_json::json!({"a": [1, 2, 3], "b": {"c": "hello world"}, "d": 7});
        assert_eq!(size_of(&v), 11);
        assert_eq!(size_of(&serde_json::json!(null)), 1);
        assert_eq!(size_of(&serde_json::json!([[1, 2, 3, 4, 5]])), 5);
    }
}
