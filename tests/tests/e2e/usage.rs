//! End-to-end: the usage and cost ledger. Model `metered` has prices in the profile's
//! `models.json`, so Pi reports a cost for it; `plain` and `tool` have none, so theirs is
//! unknown. Per step, per run and per tree in the single view and `--json`, and summed across
//! runs by `cohort-status --usage`, from the index's ledger once a tree is closed.

use std::time::Duration;

use cohort_e2e::fake_server::METERED_PRICES;
use cohort_e2e::harness::{bin_dir, json_lines, stderr, stdout, wait_for, TestEnv, HERMETIC};
use serde_json::Value;

/// What `metered`'s reply costs at its prices, from the token counts Pi recorded, as Pi
/// computes it (dollars per million tokens).
fn metered_cost(usage: &Value) -> f64 {
    let [input, output, cache_read, cache_write] = METERED_PRICES;
    let n = |k: &str| usage[k].as_u64().unwrap() as f64;
    input / 1e6 * n("input")
        + output / 1e6 * n("output")
        + cache_read / 1e6 * n("cacheRead")
        + cache_write / 1e6 * n("cacheWrite")
}

fn close(a: &Value, b: f64) -> bool {
    a.as_f64().is_some_and(|a| (a - b).abs() < 1e-12)
}

fn usage_json(env: &TestEnv, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["--usage", "--json"];
    all.extend_from_slice(args);
    let out = env.run("cohort-status", &all);
    assert!(out.status.success(), "{}", stderr(&out));
    json_lines(&stdout(&out))
}

#[test]
fn a_priced_model_costs_what_pi_reports_and_an_unpriced_one_is_unknown() {
    let env = TestEnv::new();
    let priced = env.spawn(&["--model", "fake/metered", "count the tokens"]);
    let unpriced = env.spawn(&["--model", "fake/plain", "hello"]);
    let rec = env.wait_terminal(&priced, 60);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    let u = &rec["steps"][0]["usage"];
    // The fake server's numbers: 1000 prompt tokens, 300 of them cached; 200 completion.
    assert_eq!(
        (&u["input"], &u["output"], &u["cacheRead"]),
        (&Value::from(700), &Value::from(200), &Value::from(300)),
        "{u:#}"
    );
    let want = metered_cost(u);
    assert!(want > 0.0);
    assert!(close(&u["cost"], want), "{u:#} want {want}");
    assert_eq!(u["costSource"], "pi");
    let plain = env.wait_terminal(&unpriced, 60);
    let pu = &plain["steps"][0]["usage"];
    assert!(pu["totalTokens"].as_u64().unwrap() > 0);
    assert!(pu.get("cost").is_none(), "no price, no cost: {pu:#}");

    // The single view says it per step and per run, and `--json` adds the run's total.
    let view = stdout(&env.run("cohort-status", &[&priced]));
    assert!(
        view.contains("(from Pi)") && view.contains("run: 1200 tokens"),
        "{view}"
    );
    let view = stdout(&env.run("cohort-status", &[&unpriced]));
    assert!(view.contains("cost unknown"), "{view}");
    let line = &json_lines(&stdout(&env.run("cohort-status", &["--json", &priced])))[0];
    assert!(close(&line["runUsage"]["cost"], want), "{line:#}");
    assert_eq!(line["treeUsage"]["runs"], 1);

    // Summed across runs by model: the unpriced run's cost stays unknown, the total says so.
    let rows = usage_json(&env, &["--by", "model"]);
    assert_eq!(rows.len(), 3, "{rows:#?}");
    let row = |k: &str| rows.iter().find(|r| r["key"] == k).cloned().unwrap();
    assert!(close(&row("fake/metered")["cost"], want));
    assert_eq!(row("fake/plain")["cost"], Value::Null);
    let total = rows.last().unwrap();
    assert_eq!(total["total"], true);
    assert_eq!(total["runs"], 2);
    assert_eq!(total["cost"], Value::Null);
    assert!(close(&total["costKnown"], want));
    let table = stdout(&env.run("cohort-status", &["--usage", "--by", "model"]));
    assert!(table.starts_with("MODEL"), "{table}");
    assert!(table.contains("$0.0052 + unknown"), "{table}");

    // Both trees are closed: the ledger holds them, and the next sum reads it, not them.
    let ledger = env.state_root().index_dir().join("usage");
    let text = std::fs::read_to_string(&ledger).expect("the ledger is written");
    assert!(text.contains(&priced) && text.contains(&unpriced), "{text}");
    std::fs::rename(
        env.run_dir(&priced).join("status.json"),
        env.run_dir(&priced).join("status.json.away"),
    )
    .unwrap();
    let again = usage_json(&env, &["--by", "model"]);
    assert_eq!(again, rows, "summed from the ledger, not the records");
    // --since keeps trees started within the window.
    let recent = usage_json(&env, &["--since", "1h"]);
    assert_eq!(recent.last().unwrap()["runs"], 2);
}

#[test]
fn a_tree_counts_the_nested_runs_its_steps_started() {
    let env = TestEnv::new();
    let nested = format!(
        "{} --wait --model fake/metered 'below' -- {}",
        bin_dir().join("cohort-spawn").display(),
        HERMETIC.join(" ")
    );
    let root = env.spawn(&["--model", "fake/tool", &format!("RUN: {nested}")]);
    let rec = env.wait_terminal(&root, 90);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    let dir = env.state_root().nested_runs_dir(&root);
    let mut nested_dir = None;
    wait_for(Duration::from_secs(30), || {
        nested_dir = std::fs::read_dir(&dir).ok().and_then(|d| {
            d.flatten()
                .find(|e| !e.file_name().to_string_lossy().starts_with('.'))
                .map(|e| e.path())
        });
        nested_dir.is_some()
    })
    .expect("a nested run");
    let child = env.wait_terminal_at(&nested_dir.unwrap(), 60);
    let child_cost = metered_cost(&child["steps"][0]["usage"]);
    assert!(close(&child["steps"][0]["usage"]["cost"], child_cost));

    let line = &json_lines(&stdout(&env.run("cohort-status", &["--json", &root])))[0];
    let run_tokens = line["runUsage"]["totalTokens"].as_u64().unwrap();
    let tree = &line["treeUsage"];
    assert_eq!(tree["runs"], 2, "{line:#}");
    assert_eq!(tree["totalTokens"].as_u64().unwrap(), run_tokens + 1200);
    // The root's model has no prices: the tree's cost is unknown, not the child's alone.
    assert_eq!(tree["cost"], Value::Null);
    let view = stdout(&env.run("cohort-status", &[&root]));
    assert!(view.contains("tree (2 runs):"), "{view}");

    let rows = usage_json(&env, &["--by", "run"]);
    assert_eq!(
        rows.len(),
        2,
        "one top-level tree, then the total: {rows:#?}"
    );
    assert_eq!(rows[0]["key"], root.as_str());
    assert_eq!(rows[0]["steps"], 2);
    assert!(close(&rows[0]["costKnown"], child_cost));
    let by_model = usage_json(&env, &["--by", "model"]);
    let metered = by_model
        .iter()
        .find(|r| r["key"] == "fake/metered")
        .unwrap();
    assert!(close(&metered["cost"], child_cost), "{by_model:#?}");
}

/// A bash command that waits for `gate` to exist (a test that never creates it keeps the step
/// running until something stops it).
fn wait_on(gate: &std::path::Path) -> String {
    format!("while [ ! -e {} ]; do sleep 0.05; done", gate.display())
}

#[test]
fn a_run_past_its_budget_is_stopped_and_records_what_it_spent() {
    let env = TestEnv::new();
    let gate = env.tmp.path().join("never");
    // The first reply (the tool call) costs about $0.0052; the tool then waits for ever.
    let task = format!("RUN: {}", wait_on(&gate));
    let id = env.spawn(&["--max-cost", "0.001", "--model", "fake/meteredtool", &task]);
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["state"], "stopped", "{rec:#}");
    assert_eq!(rec["failure"], "budget", "{rec:#}");
    let spent = rec["budget"]["spentUsd"].as_f64().unwrap_or(0.0);
    let step_cost = rec["steps"][0]["usage"]["cost"].as_f64().unwrap_or(-1.0);
    assert!(
        spent > 0.001 && (spent - step_cost).abs() < 1e-12,
        "{rec:#}"
    );
    assert_eq!(rec["budget"]["maxCostUsd"], 0.001);
    assert_eq!(rec["budget"]["exceeded"], true);
    assert!(
        rec["error"].as_str().unwrap_or("").contains("--max-cost"),
        "{rec:#}"
    );
    assert_eq!(
        rec["steps"][0]["status"], "stopped",
        "the step got TERM: {rec:#}"
    );
    let view = stdout(&env.run("cohort-status", &[&id]));
    assert!(
        view.contains("of $0.001 spent (the run's tree), passed: the run was stopped"),
        "{view}"
    );
}

#[test]
fn a_run_within_its_budget_completes_and_records_what_it_spent() {
    let env = TestEnv::new();
    let id = env.spawn(&[
        "--max-cost",
        "1",
        "--model",
        "fake/meteredtool",
        "RUN: echo hi",
    ]);
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    assert!(rec.get("failure").is_none(), "{rec:#}");
    let cost = rec["steps"][0]["usage"]["cost"].as_f64().unwrap();
    assert!(close(&rec["budget"]["spentUsd"], cost), "{rec:#}");
    assert_eq!(rec["budget"]["exceeded"], false);
}

#[test]
fn the_budget_counts_the_nested_runs_of_the_tree() {
    let env = TestEnv::new();
    let gate = env.tmp.path().join("never");
    // The root's tool call costs about $0.0052, under the budget; the nested run's reply
    // costs as much again, which passes it while the root's tool still waits.
    let nested = format!(
        "{} --wait --model fake/metered 'below' -- {}",
        bin_dir().join("cohort-spawn").display(),
        HERMETIC.join(" ")
    );
    let task = format!("RUN: {nested}; {}", wait_on(&gate));
    let id = env.spawn(&["--max-cost", "0.008", "--model", "fake/meteredtool", &task]);
    let rec = env.wait_terminal(&id, 90);
    assert_eq!(rec["state"], "stopped", "{rec:#}");
    assert_eq!(rec["failure"], "budget", "{rec:#}");
    let own = rec["steps"][0]["usage"]["cost"].as_f64().unwrap();
    assert!(own < 0.008, "the root alone stayed under: {rec:#}");
    let spent = rec["budget"]["spentUsd"].as_f64().unwrap();
    assert!(spent > 0.008 && spent > own, "{rec:#}");
}

#[test]
fn a_budget_over_a_model_without_a_price_is_refused_at_spawn() {
    let env = TestEnv::new();
    let out = env.spawn_raw(&["--max-cost", "1", "--model", "fake/plain", "hi"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("fake/plain"), "{err}");
    let out = env.spawn_raw(&["--max-cost", "1", "hi"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("default model"), "{}", stderr(&out));
    for bad in ["0", "-1", "x", "inf"] {
        let out = env.spawn_raw(&["--max-cost", bad, "--model", "fake/metered", "hi"]);
        assert_eq!(out.status.code(), Some(2), "{bad}");
    }
    assert_eq!(env.run_count(), 0);
}
