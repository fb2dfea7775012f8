//! The `to` step: sends the record to another topic as well, in the record's unit of
//! work (so under exactly-once in its task's transaction), and passes it on unchanged.
//! Several `to` steps with `when` predicates branch; a `topicExpr` routes by content.
//!
//! A `topic` is checked at start (the worker refuses to run without it); a topic a
//! record names is checked per record (cached by the engine), and a missing one sends
//! the record to the error policy with reason [`OUTPUT_TOPIC_MISSING`], never to a
//! producer that would wait for it to appear.
//!
//! Owns: the `to` processor. Must not touch: stores (it has none) or Kafka (the engine
//! sends what it returns).

use std::sync::Arc;

use oxbow_crds::ToStep;

use super::{CompileError, input};
use crate::expr::Expr;
use crate::processor::{Context, Processor, Record, StepError, ToRecord};
use crate::task::encode_key;

/// The error-policy reason of a record whose `topicExpr` names a missing topic.
pub const OUTPUT_TOPIC_MISSING: &str = "OutputTopicMissing";

#[derive(Clone)]
enum Topic {
    Fixed(Arc<str>),
    Expr(Expr),
}

#[derive(Clone)]
pub(super) struct To {
    name: String,
    topic: Topic,
    when: Option<Expr>,
    key: Option<Expr>,
    value: Option<Expr>,
}

impl To {
    pub(super) fn compile(path: &str, name: String, t: &ToStep) -> Result<Self, CompileError> {
        let opt = |field: &str, e: &Option<String>| {
            e.as_deref()
                .map(|e| Expr::compile(format!("{path}.to.{field}"), e))
                .transpose()
        };
        let topic = match (&t.topic, &t.topic_expr) {
            (Some(topic), None) => Topic::Fixed(Arc::from(topic.as_str())),
            (None, Some(e)) => Topic::Expr(Expr::compile(format!("{path}.to.topicExpr"), e)?),
            _ => {
                return Err(CompileError::Invalid {
                    path: format!("{path}.to"),
                    message: "to needs exactly one of topic or topicExpr".into(),
                });
            }
        };
        Ok(Self {
            name,
            topic,
            when: opt("when", &t.when)?,
            key: opt("key", &t.key)?,
            value: opt("value", &t.value)?,
        })
    }
}

impl Processor for To {
    fn name(&self) -> &str {
        &self.name
    }
    fn process(
        &mut self,
        ctx: &mut Context<'_>,
        r: Record,
        out: &mut Vec<Record>,
    ) -> Result<(), StepError> {
        let i = input(&r);
        let wanted = match &self.when {
            Some(w) => w.bool(ctx.env(), &i)?,
            None => true,
        };
        if wanted {
            let topic = match &self.topic {
                Topic::Fixed(t) => t.clone(),
                Topic::Expr(e) => {
                    let t = e.key(ctx.env(), &i)?;
                    if !ctx.topic_exists(&t) {
                        return Err(StepError::invalid(format!(
                            "{OUTPUT_TOPIC_MISSING}: {} gives topic {t:?}, which does not exist (Oxbow never creates output topics)",
                            e.path()
                        )));
                    }
                    Arc::from(t.as_str())
                }
            };
            let key = match &self.key {
                Some(e) => Some(e.key(ctx.env(), &i)?.into_bytes()),
                None => encode_key(&r.key),
            };
            let value = match &self.value {
                Some(e) => e.json(ctx.env(), &i)?,
                None => r.value.clone(),
            };
            ctx.send(ToRecord {
                topic,
                key,
                value: serde_json::to_vec(&value).unwrap_or_default(),
                timestamp: r.timestamp,
            });
        }
        out.push(r);
        Ok(())
    }
}
