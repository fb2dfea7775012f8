//! The `map` and `flatMap` steps: one record in, one (map) or zero or more (flatMap)
//! records out, computed by CEL. Stateless.
//!
//! Owns: both processors; they share this file because each is a few lines. Must not
//! touch: stores (they have none) or the timestamp, which every output record keeps.

use serde_json::Value as Json;

use super::input;
use crate::expr::Expr;
use crate::processor::{Context, Processor, Record, StepError};

/// Replaces the key, the value or both; an unset expression keeps the field.
#[derive(Clone)]
pub(super) struct Map {
    pub(super) name: String,
    pub(super) key: Option<Expr>,
    pub(super) value: Option<Expr>,
}

impl Processor for Map {
    fn name(&self) -> &str {
        &self.name
    }
    fn process(
        &mut self,
        ctx: &mut Context<'_>,
        r: Record,
        out: &mut Vec<Record>,
    ) -> Result<(), StepError> {
        let key = match &self.key {
            Some(e) => Json::String(e.key(ctx.env(), &input(&r))?),
            None => r.key.clone(),
        };
        let value = match &self.value {
            Some(e) => e.json(ctx.env(), &input(&r))?,
            None => r.value.clone(),
        };
        out.push(Record {
            key,
            value,
            timestamp: r.timestamp,
        });
        Ok(())
    }
}

/// One record per element of the list the expression returns, each with the input's key.
#[derive(Clone)]
pub(super) struct FlatMap {
    pub(super) name: String,
    pub(super) cel: Expr,
}

impl Processor for FlatMap {
    fn name(&self) -> &str {
        &self.name
    }
    fn process(
        &mut self,
        ctx: &mut Context<'_>,
        r: Record,
        out: &mut Vec<Record>,
    ) -> Result<(), StepError> {
        for value in self.cel.list(ctx.env(), &input(&r))? {
            out.push(Record {
                key: r.key.clone(),
                value,
                timestamp: r.timestamp,
            });
        }
        Ok(())
    }
}
