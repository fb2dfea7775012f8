//! The `join` step: a stream–table join. Looks the row of the record's lookup key up in
//! a table (`spec.tables`) and builds the new value from `value` and `other` (the row,
//! or null).
//!
//! A table that is not global is the task's own store, fed from partition N of the
//! table's topic by the engine (the topology makes the stream co-partitioned with it);
//! a global one is read through [`Context::global_row`]. Rows are stored as the topic
//! has them (raw key → raw value) and decoded here, per lookup.
//!
//! Owns: the join processor. Must not touch: the table's rows, which only the engine
//! writes (from the table's topic).

use oxbow_crds::{JoinStep, JoinType, RecordFormat, StoreName, TableSpec};
use serde_json::{Value as Json, json};

use super::{CompileError, input};
use crate::decode::unreadable;
use crate::expr::Expr;
use crate::processor::{Context, Processor, Record, StepError};

#[derive(Clone)]
pub(super) struct Join {
    name: String,
    table: String,
    store: Option<StoreName>,
    value_format: RecordFormat,
    key: Expr,
    join_type: JoinType,
    value: Option<Expr>,
}

impl Join {
    pub(super) fn compile(
        path: &str,
        name: String,
        j: &JoinStep,
        table: &TableSpec,
    ) -> Result<Self, CompileError> {
        Ok(Self {
            name,
            table: table.name.clone(),
            store: (!table.global).then(|| StoreName(table.name.clone())),
            value_format: table.value_format,
            key: Expr::compile(format!("{path}.join.key"), &j.key)?,
            join_type: j.join_type,
            value: j
                .value
                .as_deref()
                .map(|e| Expr::compile(format!("{path}.join.value"), e))
                .transpose()?,
        })
    }

    /// The table row of `key`, decoded; `None` when the table has no such row.
    fn row(&self, ctx: &Context<'_>, key: &str) -> Result<Option<Json>, StepError> {
        let raw = match &self.store {
            Some(store) => ctx.get(store, key.as_bytes())?,
            None => ctx.global_row(&self.table, key.as_bytes())?,
        };
        raw.map(|b| {
            crate::task::decode(Some(&b), self.value_format).map_err(|e| {
                unreadable(
                    format!("the row of key {key:?} in table {:?}", self.table),
                    e,
                )
            })
        })
        .transpose()
    }
}

impl Processor for Join {
    fn name(&self) -> &str {
        &self.name
    }
    fn stores(&self) -> Vec<StoreName> {
        self.store.iter().cloned().collect()
    }
    fn process(
        &mut self,
        ctx: &mut Context<'_>,
        r: Record,
        out: &mut Vec<Record>,
    ) -> Result<(), StepError> {
        let key = self.key.key(ctx.env(), &input(&r))?;
        let other = match (self.row(ctx, &key)?, self.join_type) {
            (Some(row), _) => row,
            (None, JoinType::Left | JoinType::Outer) => Json::Null,
            (None, JoinType::Inner) => return Ok(()),
        };
        let value = match &self.value {
            Some(e) => e.json_with_other(ctx.env(), &input(&r), &other)?,
            None => json!({ "value": r.value, "other": other }),
        };
        out.push(Record { value, ..r });
        Ok(())
    }
}
