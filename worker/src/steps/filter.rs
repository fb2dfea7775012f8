//! The `filter` step: keeps a record when its CEL expression is true. Stateless.
//!
//! Owns: the filter processor. Must not touch: stores (it has none) or the record it
//! keeps, which passes on unchanged.

use super::input;
use crate::expr::Expr;
use crate::processor::{Context, Processor, Record, StepError};

#[derive(Clone)]
pub(super) struct Filter {
    pub(super) name: String,
    pub(super) cel: Expr,
}

impl Processor for Filter {
    fn name(&self) -> &str {
        &self.name
    }
    fn process(
        &mut self,
        ctx: &mut Context<'_>,
        r: Record,
        out: &mut Vec<Record>,
    ) -> Result<(), StepError> {
        if self.cel.bool(ctx.env(), &input(&r))? {
            out.push(r);
        }
        Ok(())
    }
}
