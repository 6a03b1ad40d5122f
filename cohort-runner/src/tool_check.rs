//! The check that an agent's extension tools exist (`docs/agents.md`, "Tools from
//! extensions"): which tools an extension registers is known only once Pi has loaded it, so
//! for a step whose agent names tools that are not Pi's own, the runner gives the child one
//! more extension of cohort's, `tools-<i>.ts` in the run directory. Before the first model
//! call (Pi's `before_agent_start`) it compares the tools Pi has made active with the names
//! the agent declared, and when any is missing it prints one line naming every missing one, each
//! with what provides it upstream ([`cohort_common::tools`]), on stderr and
//! ends Pi with exit code [`EXIT_CODE`], so the step fails with that line and the model is
//! never called. It registers nothing and changes nothing else.
//!
//! [`required`] and [`source`] are pure; [`write_check`] does the I/O.

use std::path::PathBuf;

use cohort_common::error::Result;
use cohort_common::format::layout::RunDir;
use cohort_common::format::spec::FlatStep;
use cohort_common::os::files;

/// The exit code the check ends Pi with when a declared tool is missing.
pub const EXIT_CODE: i32 = 3;

/// The words the check's line starts with on the child's stderr.
pub const MISSING: &str = "cohort: the agent's tools are missing";

/// The tools of `step` that its agent's extensions must provide (pure): the names of the
/// step's tool list that spawn found to be extension tools (`resolvedAgent.extensionTools`),
/// in the list's order. Empty when the step has no agent, no tool list, or only Pi's tools
/// (the command line's `--tools` may have replaced the agent's).
pub fn required(step: &FlatStep) -> Vec<String> {
    let (Some(agent), Some(tools)) = (step.spec.resolved_agent.as_deref(), &step.spec.tools) else {
        return Vec::new();
    };
    tools
        .iter()
        .filter(|t| agent.extension_tools.contains(t))
        .cloned()
        .collect()
}

/// The check extension's TypeScript for the tool names `required` (pure; the names, and
/// each one's description with what provides it upstream
/// ([`cohort_common::tools::described`]), go in as JSON, so no name can break out of it).
/// Every missing tool is named in the one line, in `required`'s order.
pub fn source(required: &[String]) -> String {
    let names = serde_json::to_string(required).unwrap_or_else(|_| "[]".into());
    let described: serde_json::Map<String, serde_json::Value> = required
        .iter()
        .map(|n| (n.clone(), cohort_common::tools::described(n).into()))
        .collect();
    let described = serde_json::Value::Object(described).to_string();
    format!(
        r#"// Written by cohort-runner for one step: ends Pi before its first model call when a
// tool the step's agent declares is not active (no extension it loads registered it).
const required: string[] = {names};
const described: Record<string, string> = {described};
export default function (pi: any) {{
  pi.on("before_agent_start", async () => {{
    const active = new Set(
      (pi.getActiveTools() as any[]).map((t) => (typeof t === "string" ? t : t.name)),
    );
    const missing = required.filter((name) => !active.has(name));
    if (missing.length > 0) {{
      const have = [...active].sort().join(", ") || "none";
      process.stderr.write(
        "{MISSING}: " + missing.map((name) => described[name] ?? name).join(", ") +
          " (no extension the agent loads provides them; its tools are: " + have +
          "); the step ends before the model is called\n",
      );
      process.exit({EXIT_CODE});
    }}
  }});
}}
"#
    )
}

/// Write the check of step `step` to `tools-<i>.ts` in `dir` (0600, `O_EXCL`, so nothing
/// planted there is opened) when it has [`required`] tools, and return its path; a later
/// attempt (`fresh` false) uses the file its first attempt wrote. `None`: nothing to check.
///
/// Errors: the file cannot be created.
pub fn write_check(dir: &RunDir, step: &FlatStep, fresh: bool) -> Result<Option<PathBuf>> {
    let req = required(step);
    if req.is_empty() {
        return Ok(None);
    }
    let path = dir.path().join(format!("tools-{}.ts", step.index));
    if fresh {
        files::create_unsynced(&path, source(&req).as_bytes())?;
    }
    Ok(Some(path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_common::format::spec::{AgentSpec, TaskSpec};

    fn step(tools: Option<&[&str]>, extension_tools: &[&str]) -> FlatStep {
        let agent: AgentSpec = serde_json::from_value(serde_json::json!({
            "name": "a", "scope": "user", "prompt": "",
            "extensionTools": extension_tools,
        }))
        .unwrap();
        FlatStep {
            index: 2,
            chain_index: 0,
            spec: TaskSpec {
                task: "t".into(),
                tools: tools.map(|t| t.iter().map(|s| s.to_string()).collect()),
                resolved_agent: Some(Box::new(agent)),
                ..TaskSpec::default()
            },
        }
    }

    #[test]
    fn only_the_extension_tools_left_in_the_steps_list_are_checked() {
        let s = step(
            Some(&["read", "web_search", "fetch"]),
            &["web_search", "fetch"],
        );
        assert_eq!(required(&s), ["web_search", "fetch"]);
        // The command line replaced the agent's tools with Pi's own: nothing to check.
        assert!(required(&step(Some(&["read"]), &["web_search"])).is_empty());
        assert!(required(&step(None, &["web_search"])).is_empty());
        assert!(required(&step(Some(&["read"]), &[])).is_empty());
    }

    #[test]
    fn the_check_carries_the_names_as_json_and_exits_before_the_model() {
        let src = source(&["web_search".into(), "a\"b".into()]);
        assert!(
            src.contains(r#"const required: string[] = ["web_search","a\"b"];"#),
            "{src}"
        );
        assert!(src.contains("before_agent_start"));
        assert!(src.contains(&format!("process.exit({EXIT_CODE})")));
        assert!(src.contains(MISSING));
        let src = source(&["web_search".into(), "fetch".into(), "mine".into()]);
        assert!(
            src.contains(
                r#""web_search":"web_search (from pi-web-access (pi install npm:pi-web-access))""#
            ) && src.contains(r#""mine":"mine""#)
                && src.contains("pi-essentials"),
            "{src}"
        );
    }

    #[test]
    fn it_is_written_once_per_step_and_reused_by_later_attempts() {
        let t = tempfile::tempdir().unwrap();
        let dir = RunDir::new(t.path().to_path_buf());
        let s = step(Some(&["web_search"]), &["web_search"]);
        let p = write_check(&dir, &s, true).unwrap().unwrap();
        assert_eq!(p, t.path().join("tools-2.ts"));
        assert!(std::fs::read_to_string(&p).unwrap().contains("web_search"));
        assert_eq!(write_check(&dir, &s, false).unwrap(), Some(p.clone()));
        assert!(
            write_check(&dir, &s, true).is_err(),
            "never opens a file already there"
        );
        assert_eq!(
            write_check(&dir, &step(Some(&["read"]), &[]), true).unwrap(),
            None
        );
    }
}
