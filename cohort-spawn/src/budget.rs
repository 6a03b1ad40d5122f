//! `--max-cost USD` at spawn: a budget means something only when every model the run may use
//! has a price cohort can know, so a start whose step runs a model without one is refused, in
//! one line naming the model, before anything exists.
//!
//! The models a step may use are its model (the step's, else its agent's), any `--model` in the
//! Pi arguments (the run's after `--`, and the step's `piArgs`, which Pi reads last), and its
//! agent's fallback models. A step with none runs Pi's default model, which spawn cannot see.
//! Whether a price can be known is [`models_json::price_known`]'s rule over the profile's
//! `models.json`.

use std::collections::HashMap;

use cohort_common::format::models_json;
use cohort_common::format::spec::{self, ChainStep, TaskSpec};

/// The value of every `--model V` or `--model=V` in `args` (pure).
fn models_in_args(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--model" {
            if let Some(v) = it.next() {
                out.push(v.clone());
            }
        } else if let Some(v) = a.strip_prefix("--model=") {
            out.push(v.to_string());
        }
    }
    out
}

/// The models step `t` may run, with `run_args` the run's Pi arguments (pure); empty when it
/// runs Pi's default model.
pub fn step_models(t: &TaskSpec, run_args: &[String]) -> Vec<String> {
    let agent = t.resolved_agent.as_ref();
    let mut out: Vec<String> = t
        .model
        .clone()
        .or_else(|| agent.and_then(|a| a.model.clone()))
        .into_iter()
        .collect();
    out.extend(models_in_args(run_args));
    out.extend(models_in_args(&t.pi_args));
    out.extend(agent.map(|a| a.fallback_models.clone()).unwrap_or_default());
    out
}

/// Why `chain` cannot run under a budget (pure): the first step whose model has no price
/// cohort can know, or that runs Pi's default model; `None` when every price can be known.
/// `entries` are the profile's `models.json` entries ([`models_json::model_entries`]).
pub fn refusal(
    chain: &[ChainStep],
    run_args: &[String],
    entries: &HashMap<(String, String), bool>,
) -> Option<String> {
    let (flat, _) = spec::flatten(chain);
    for f in &flat {
        let models = step_models(&f.spec, run_args);
        let label = spec::label_of(&f.spec, f.index);
        if models.is_empty() {
            return Some(format!(
                "--max-cost: step {label} runs Pi's default model, whose price cohort cannot know; give it a model (--model PROVIDER/ID)"
            ));
        }
        if let Some(m) = models
            .iter()
            .find(|m| !models_json::price_known(entries, m))
        {
            return Some(format!(
                "--max-cost: the price of model {m} cannot be known (its models.json entry has no cost, and Pi counts it as free); give it a cost in models.json or drop --max-cost"
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(model: Option<&str>, pi_args: &[&str]) -> ChainStep {
        ChainStep::Task(TaskSpec {
            task: "t".into(),
            model: model.map(str::to_string),
            pi_args: pi_args.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        })
    }

    #[test]
    fn every_model_a_step_may_run_must_have_a_price() {
        let entries = models_json::model_entries(
            r#"{"providers": {"fake": {"models": [
                {"id": "metered", "cost": {"input": 1, "output": 1, "cacheRead": 0, "cacheWrite": 0}},
                {"id": "plain"}]}}}"#,
        );
        let none: [String; 0] = [];
        assert_eq!(
            refusal(&[task(Some("fake/metered"), &[])], &none, &entries),
            None
        );
        assert_eq!(
            refusal(
                &[task(Some("anthropic/claude-sonnet-4"), &[])],
                &none,
                &entries
            ),
            None,
            "Pi's catalog prices it"
        );
        let why = refusal(&[task(Some("fake/plain"), &[])], &none, &entries).unwrap();
        assert!(
            why.contains("model fake/plain") && !why.contains('\n'),
            "{why}"
        );
        let why = refusal(&[task(None, &[])], &none, &entries).unwrap();
        assert!(why.contains("default model"), "{why}");
        // A --model in the Pi arguments counts, the run's and the step's.
        let run_args = vec!["--model".to_string(), "fake/plain".to_string()];
        assert!(refusal(&[task(Some("fake/metered"), &[])], &run_args, &entries).is_some());
        assert!(refusal(
            &[task(Some("fake/metered"), &["--model=fake/plain"])],
            &none,
            &entries
        )
        .is_some());
        assert_eq!(
            refusal(&[task(None, &["--model", "fake/metered"])], &none, &entries),
            None
        );
    }
}
