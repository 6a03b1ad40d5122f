//! Governance: the settings that bound what a run may do, honoured at spawn and never
//! silently ignored (`docs/agents.md`, "Governance"). Two sources, as in pi-subagents 0.67:
//!
//! - the `subagents` keys of `settings.json` ([`crate::agents::settings`]): `modelScope`
//!   (which models a step may use), `maxThinking` (the most thinking a step may ask for); the
//!   project's value replaces the user's, as in pi-subagents;
//! - pi-subagents' own `$PI_CODING_AGENT_DIR/extensions/subagent/config.json`
//!   ([`parse_config`]): `timeoutMs` (the deadline of a single-agent run), `maxSubagentDepth`
//!   (how deep nested runs may go), `parallel.concurrency` and `parallel.maxTasks` (a parallel
//!   group's width and size), `globalConcurrencyLimit` (the width of the default queue every
//!   top-level run joins, [`default_queue`]), and
//!   `worktreeSetupHook` (read with the runner's worktrees,
//!   `cohort_common::worktree::load_setup_hook`). Every other key it documents shapes
//!   pi-subagents' own UI or in-session runs and is named in one warning; an unknown key gets a
//!   warning with the closest names.
//!
//! The command line beats both (upstream's precedence: the call, then the agent, then
//! settings). [`parse_config`], [`check`], [`in_scope`] and [`thinking_rank`] are pure; [`load`]
//! reads the files.

use std::path::{Path, PathBuf};

use cohort_common::format::spec::{ChainStep, QueueSpec, TaskSpec};
use serde_json::Value as Json;

use crate::agents::fields::THINKING_LEVELS;
use crate::agents::settings::{AgentSettings, ModelScope, ScopeRule};

/// pi-subagents' config file under a profile: `extensions/subagent/config.json`
/// (`src/extension/config.ts`).
pub fn config_file(profile: &Path) -> PathBuf {
    cohort_common::worktree::subagent_config_file(profile)
}

/// The keys of pi-subagents 0.67's `config.json` (`src/shared/types.ts`, `ExtensionConfig`)
/// that cohort honours, with what each decides here.
pub const CONFIG_HONOURED: [(&str, &str); 6] = [
    ("timeoutMs", "the deadline of a single-agent run that names none (--timeout, the agent's timeoutMs win)"),
    ("maxSubagentDepth", "the tree's nesting depth of a top-level run (--max-depth wins)"),
    ("globalConcurrencyLimit", "the width of the `default` queue every top-level run joins (--queue wins)"),
    ("parallel", "`concurrency`: a parallel group's width (--concurrency, the group's own win); `maxTasks`: the most members a group may have"),
    ("worktreeSetupHook", "the worktree setup hook, when pi-cohort's config names none"),
    ("worktreeSetupHookTimeoutMs", "the setup hook's time limit"),
];

/// The other keys of pi-subagents 0.67's `config.json`: read by pi-subagents for its UI and
/// in-session runs, without effect in cohort (one warning names those present).
pub const CONFIG_NO_EFFECT: [&str; 40] = [
    "asyncByDefault",
    "defaultSessionDir",
    "defaultSubagentContext",
    "forkContext",
    "foregroundDetachShortcut",
    "fleetView",
    "fleetViewPlacement",
    "fleetKeybindings",
    "asyncWidget",
    "modelExclusions",
    "modelResponseAliases",
    "toolDescriptionMode",
    "inlineToolDisplay",
    "mainWindowRenderer",
    "orcaProgressTabs",
    "forceTopLevelAsync",
    "waitTool",
    "singleRunOutputBaseDir",
    "maxSubagentSpawnsPerSession",
    "maxSubagentSpawnsPerRun",
    "maxActiveAsyncRunsPerSession",
    "capacity",
    "toolTimeoutMs",
    "control",
    "completionBatch",
    "toolBudget",
    "permissions",
    "usageBudget",
    "chain",
    "worktreeBaseDir",
    "worktree",
    "worktreeProvider",
    "worktreeBranchPrefix",
    "artifactDir",
    "artifactConfig",
    "intercomBridge",
    "resultScanLogging",
    "proactiveSkillSubagents",
    "scheduledRuns",
    "missions",
];

/// What pi-subagents' `config.json` decides in cohort.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// `timeoutMs`: ms, positive.
    pub timeout_ms: Option<u64>,
    /// `maxSubagentDepth`.
    pub max_subagent_depth: Option<u32>,
    /// `globalConcurrencyLimit`: positive.
    pub global_concurrency_limit: Option<u32>,
    /// `parallel.maxTasks`: positive.
    pub parallel_max_tasks: Option<usize>,
    /// `parallel.concurrency`: positive.
    pub parallel_concurrency: Option<usize>,
    /// One line each: keys without effect, unknown keys, values of the wrong type (which are
    /// left out, as pi-subagents leaves out an invalid `timeoutMs`).
    pub warnings: Vec<String>,
}

/// Read pi-subagents' `config.json` text of file `at` (pure). Errors: text that is not a JSON
/// object. A value of the wrong type is a warning and left out.
pub fn parse_config(at: &Path, text: &str) -> Result<Config, String> {
    let at = at.display();
    let v: Json = serde_json::from_str(text).map_err(|e| format!("{at}: invalid JSON: {e}"))?;
    let Json::Object(o) = v else {
        return Err(format!("{at}: the config must be a JSON object"));
    };
    let mut out = Config::default();
    let bad = |key: &str, what: &str, out: &mut Config| {
        out.warnings
            .push(format!("{at}: `{key}` must be {what}; it is left out"));
    };
    // Node's largest timer delay, the bound pi-subagents puts on `timeoutMs`.
    const MAX_TIMER_MS: u64 = 2_147_483_647;
    if let Some(t) = o.get("timeoutMs") {
        match t.as_u64().filter(|t| (1..=MAX_TIMER_MS).contains(t)) {
            Some(t) => out.timeout_ms = Some(t),
            None => bad(
                "timeoutMs",
                "a whole number of ms from 1 to 2147483647",
                &mut out,
            ),
        }
    }
    if let Some(d) = o.get("maxSubagentDepth") {
        match d.as_u64().and_then(|d| u32::try_from(d).ok()) {
            Some(d) => out.max_subagent_depth = Some(d),
            None => bad("maxSubagentDepth", "a whole number", &mut out),
        }
    }
    if let Some(g) = o.get("globalConcurrencyLimit") {
        match g
            .as_u64()
            .and_then(|g| u32::try_from(g).ok())
            .filter(|g| *g > 0)
        {
            Some(g) => out.global_concurrency_limit = Some(g),
            None => bad("globalConcurrencyLimit", "a whole number above 0", &mut out),
        }
    }
    match o.get("parallel") {
        None => {}
        Some(Json::Object(p)) => {
            let positive = |k: &str| p.get(k).map(|v| v.as_u64().filter(|n| *n > 0));
            match positive("maxTasks") {
                Some(Some(n)) => out.parallel_max_tasks = Some(n as usize),
                Some(None) => bad("parallel.maxTasks", "a whole number above 0", &mut out),
                None => {}
            }
            match positive("concurrency") {
                Some(Some(n)) => out.parallel_concurrency = Some(n as usize),
                Some(None) => bad("parallel.concurrency", "a whole number above 0", &mut out),
                None => {}
            }
            for k in p.keys().filter(|k| *k != "maxTasks" && *k != "concurrency") {
                out.warnings.push(format!(
                    "{at}: `parallel.{k}` is not a key pi-subagents or cohort knows, so it has no effect"
                ));
            }
        }
        Some(_) => bad(
            "parallel",
            "an object of maxTasks and concurrency",
            &mut out,
        ),
    }
    let honoured: Vec<&str> = CONFIG_HONOURED.iter().map(|(k, _)| *k).collect();
    let no_effect: Vec<&str> = o
        .keys()
        .map(String::as_str)
        .filter(|k| CONFIG_NO_EFFECT.contains(k))
        .collect();
    if !no_effect.is_empty() {
        out.warnings.push(format!(
            "{at}: {} shape{} pi-subagents' own interface and in-session runs and {} no effect in cohort",
            no_effect.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", "),
            if no_effect.len() == 1 { "s" } else { "" },
            if no_effect.len() == 1 { "has" } else { "have" },
        ));
    }
    let known: Vec<&str> = honoured
        .iter()
        .chain(CONFIG_NO_EFFECT.iter())
        .copied()
        .collect();
    for k in o.keys().filter(|k| !known.contains(&k.as_str())) {
        let hint = crate::agents::did_you_mean(k, &known, "");
        out.warnings.push(format!(
            "{at}: `{k}` is not a key pi-subagents or cohort knows, so it has no effect{hint}"
        ));
    }
    Ok(out)
}

/// Everything governance decides for one spawn.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Governance {
    /// `subagents.modelScope` and the settings file it came from (the project's, else the
    /// user's).
    pub model_scope: Option<(PathBuf, ModelScope)>,
    /// `subagents.maxThinking` and its file (the project's, else the user's).
    pub max_thinking: Option<(PathBuf, String)>,
    /// pi-subagents' `config.json`, and the file.
    pub config: Config,
    /// The config file's path.
    pub config_file: PathBuf,
}

impl Governance {
    /// The governance of the user's settings `user` and the trusted project's `project`, and
    /// pi-subagents' config `config` read from `config_file` (pure): the project's value of
    /// each settings key wins.
    pub fn of(
        user: &AgentSettings,
        project: Option<&AgentSettings>,
        config: Config,
        config_file: PathBuf,
    ) -> Governance {
        let pick = |f: &dyn Fn(&AgentSettings) -> bool| {
            project
                .filter(|p| f(p))
                .or_else(|| Some(user).filter(|u| f(u)))
        };
        Governance {
            model_scope: pick(&|s| s.model_scope.is_some())
                .map(|s| (s.file.clone(), s.model_scope.clone().unwrap_or_default())),
            max_thinking: pick(&|s| s.max_thinking.is_some())
                .map(|s| (s.file.clone(), s.max_thinking.clone().unwrap_or_default())),
            config,
            config_file,
        }
    }
}

/// Read the governance of a spawn (I/O): the user's and the trusted project's settings
/// ([`crate::agents::discover::settings_files`]) and pi-subagents' config under `profile`. Their
/// warnings are printed once, on stderr. Errors ([`cohort_common::Error::Usage`]): a settings
/// file that cannot be read or has a bad value, or a config that is not a JSON object.
pub fn load(profile: &Path, cwd: &Path) -> cohort_common::Result<Governance> {
    let (user, project) = crate::agents::discover::settings_files(profile, cwd)?;
    let file = config_file(profile);
    let config = match std::fs::read_to_string(&file) {
        Ok(text) => parse_config(&file, &text).map_err(cohort_common::Error::Usage)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Config::default(),
        Err(e) => {
            return Err(cohort_common::Error::Usage(format!(
                "cannot read {}: {e}",
                file.display()
            )))
        }
    };
    for w in user
        .warnings
        .iter()
        .chain(project.iter().flat_map(|p| &p.warnings))
        .chain(&config.warnings)
    {
        eprintln!("cohort-spawn: warning: {w}");
    }
    Ok(Governance::of(&user, project.as_ref(), config, file))
}

/// The width of the default queue every top-level run joins: pi-subagents'
/// `globalConcurrencyLimit` (`extensions/subagent/config.json`), when it is set and positive
/// (pure). The queue is named [`DEFAULT_QUEUE`]. Spawn gives it to a top-level run that names
/// no `--queue`.
pub fn default_queue(global_concurrency_limit: Option<u32>) -> Option<QueueSpec> {
    global_concurrency_limit
        .filter(|n| *n > 0)
        .map(|slots| QueueSpec {
            name: DEFAULT_QUEUE.into(),
            slots,
        })
}

/// The name of the queue `globalConcurrencyLimit` sets the width of.
pub const DEFAULT_QUEUE: &str = "default";

/// The rank of thinking level `level` in [`THINKING_LEVELS`] (pure; `None` for another word).
pub fn thinking_rank(level: &str) -> Option<usize> {
    THINKING_LEVELS.iter().position(|l| *l == level)
}

/// The thinking a step asks for (pure): its `thinking`, else a `:LEVEL` suffix of its model
/// (Pi's `provider/id:level`).
fn step_thinking(t: &TaskSpec) -> Option<String> {
    t.thinking.clone().or_else(|| {
        let (_, suffix) = t.model.as_deref()?.rsplit_once(':')?;
        thinking_rank(suffix).map(|_| suffix.to_string())
    })
}

/// `model` without a `:LEVEL` thinking suffix.
fn base_model(model: &str) -> &str {
    match model.rsplit_once(':') {
        Some((m, s)) if thinking_rank(s).is_some() => m,
        _ => model,
    }
}

/// Whether `model` passes allow-list `allow` (pure; pi-subagents' `matchesScopePattern`):
/// some pattern matches the whole `provider/id`, case-insensitive, thinking suffix aside, `*`
/// matching any run of characters; `inherit` is the caller's model `inherit` (no caller's
/// model: it matches nothing).
pub fn in_scope(model: &str, allow: &[String], inherit: Option<&str>) -> bool {
    let m = base_model(model).to_lowercase();
    allow.iter().any(|p| {
        let p = if p == "inherit" {
            match inherit {
                Some(i) => base_model(i).to_lowercase(),
                None => return false,
            }
        } else {
            p.to_lowercase()
        };
        glob_star(&p, &m)
    })
}

/// `*`-only glob match of all of `text` (pure).
fn glob_star(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || !text[first.len()..].ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}

/// What [`check`] found: warnings to print, or the one refusal.
pub type Verdict = Result<Vec<String>, String>;

/// Check the run's steps `chain` against `gov` (pure), once agents are resolved and the
/// command line merged in. `explicit` says the models came from the command line (`--model`);
/// `inherit` is the caller's model (`modelScope`'s `inherit`).
///
/// - `modelScope` (pi-subagents' `checkModelScope`): a step's model (the caller's `inherit`
///   when it names none), and each of its agent's `fallbackModels`, must pass the global allow-list and its agent's. Outside one with
///   `enforce: true`: refused when the model is the command line's or the list is `strict`,
///   else a warning; without `enforce` a warning that it is not enforced.
/// - `maxThinking`: a step asking for more thinking than the ceiling is refused (pi-subagents:
///   "Requests above the ceiling fail before child startup").
/// - `parallel.maxTasks`: a parallel group of more members is refused.
///
/// The refusal is one line naming the step, the value, the setting and its file.
pub fn check(
    chain: &[ChainStep],
    gov: &Governance,
    explicit: bool,
    inherit: Option<&str>,
) -> Verdict {
    let mut warnings = Vec::new();
    if let Some(max) = gov.config.parallel_max_tasks {
        for (i, s) in chain.iter().enumerate() {
            if let ChainStep::Parallel(p) = s {
                if p.parallel.len() > max {
                    return Err(format!(
                        "step {i}: a parallel group of {} members is more than `parallel.maxTasks` ({max}) in {} allows: split the group or raise the limit",
                        p.parallel.len(),
                        gov.config_file.display()
                    ));
                }
            }
        }
    }
    for (i, t) in tasks(chain).enumerate() {
        let what = match &t.agent {
            Some(a) => format!("step {i} (agent {a})"),
            None => format!("step {i}"),
        };
        if let Some((file, max)) = &gov.max_thinking {
            if let Some(th) = step_thinking(t) {
                if thinking_rank(&th) > thinking_rank(max) {
                    return Err(format!(
                        "{what}: thinking `{th}` is above `subagents.maxThinking` `{max}` in {}: ask for {max} or less (--thinking, the agent's `thinking`)",
                        file.display()
                    ));
                }
            }
        }
        if let Some((file, scope)) = &gov.model_scope {
            let fallbacks = t
                .resolved_agent
                .as_ref()
                .map(|a| a.fallback_models.clone())
                .unwrap_or_default();
            // A step without a model runs the caller's (Pi's default, or the parent step's):
            // checked as a model that does not come from the command line.
            let own = match (&t.model, inherit) {
                (Some(m), _) => Some((m.clone(), explicit)),
                (None, Some(i)) => Some((i.to_string(), false)),
                (None, None) => None,
            };
            let models = own
                .into_iter()
                .chain(fallbacks.into_iter().map(|m| (m, false)));
            for (model, explicit) in models {
                for (key, rule) in rules(scope, t.agent.as_deref()) {
                    let Some(allow) = &rule.allow else { continue };
                    if in_scope(&model, allow, inherit) {
                        continue;
                    }
                    let at = format!(
                        "{what}: model {:?} is outside `{key}` in {} (allowed: {})",
                        base_model(&model),
                        file.display(),
                        allow.join(", ")
                    );
                    match (rule.enforce, rule.strict) {
                        (Some(true), Some(true)) => return Err(format!("{at}: choose an allowed model")),
                        (Some(true), _) if explicit => return Err(format!("{at}: choose an allowed model")),
                        (Some(true), _) => warnings.push(format!(
                            "{at}; it runs, because it does not come from the command line (`strict: true` refuses it)"
                        )),
                        _ => warnings.push(format!(
                            "{at}; the scope is not enforced (`enforce: true` refuses such a model)"
                        )),
                    }
                }
            }
        }
    }
    Ok(warnings)
}

/// The rules a model of agent `agent` must pass, with their settings keys: the global one and
/// the agent's, whose `enforce` and `strict` default to the global ones.
fn rules(scope: &ModelScope, agent: Option<&str>) -> Vec<(String, ScopeRule)> {
    let mut out = vec![("subagents.modelScope".to_string(), scope.rule.clone())];
    if let Some((name, r)) = agent.and_then(|a| scope.agents.get_key_value(a)) {
        out.push((
            format!("subagents.modelScope.agents.{name}"),
            ScopeRule {
                enforce: r.enforce.or(scope.rule.enforce),
                strict: r.strict.or(scope.rule.strict),
                allow: r.allow.clone(),
            },
        ));
    }
    out
}

fn tasks(chain: &[ChainStep]) -> impl Iterator<Item = &TaskSpec> {
    chain.iter().flat_map(|s| match s {
        ChainStep::Task(t) => std::slice::from_ref(t).iter(),
        ChainStep::Parallel(p) => p.parallel.iter(),
        ChainStep::Expand(e) => std::slice::from_ref(&e.parallel).iter(),
    })
}

/// The config keys pi-subagents' `config.json` holds that cohort reads (pure): for the docs
/// table test.
pub fn config_keys() -> Vec<&'static str> {
    CONFIG_HONOURED
        .iter()
        .map(|(k, _)| *k)
        .chain(CONFIG_NO_EFFECT)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn global_limit_sets_the_default_queue() {
        assert_eq!(default_queue(None), None);
        assert_eq!(default_queue(Some(0)), None);
        let q = default_queue(Some(3)).unwrap();
        assert_eq!((q.name.as_str(), q.slots), (DEFAULT_QUEUE, 3));
    }
    use cohort_common::format::spec::{ParallelSpec, TaskSpec};

    fn task(agent: Option<&str>, model: Option<&str>, thinking: Option<&str>) -> ChainStep {
        ChainStep::Task(TaskSpec {
            task: "t".into(),
            agent: agent.map(str::to_string),
            model: model.map(str::to_string),
            thinking: thinking.map(str::to_string),
            ..TaskSpec::default()
        })
    }

    fn gov(settings: &str, config: &str) -> Governance {
        let user = crate::agents::settings::parse(Path::new("/u/settings.json"), settings).unwrap();
        let cfg = parse_config(Path::new("/u/config.json"), config).unwrap();
        Governance::of(&user, None, cfg, "/u/config.json".into())
    }

    #[test]
    fn patterns_match_the_whole_model_case_insensitive_with_star() {
        let allow = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(in_scope(
            "openai/gpt-5-mini",
            &allow(&["openai/gpt-5-*"]),
            None
        ));
        assert!(in_scope(
            "OpenAI/GPT-5:high",
            &allow(&["openai/gpt-5"]),
            None
        ));
        assert!(!in_scope("openai/gpt-4", &allow(&["openai/gpt-5*"]), None));
        assert!(!in_scope("x/openai/gpt-5", &allow(&["openai/*"]), None));
        assert!(in_scope("p/m", &allow(&["inherit"]), Some("p/m:low")));
        assert!(!in_scope("p/m", &allow(&["inherit"]), None));
        assert!(in_scope("a/b-c-d", &allow(&["a/*-*-d"]), None));
    }

    #[test]
    fn an_enforced_scope_refuses_the_command_lines_model_and_warns_of_the_files() {
        let g = gov(
            r#"{"subagents": {"modelScope": {"enforce": true, "allow": ["fake/*"],
                "agents": {"worker": {"allow": ["fake/plain"]}}}}}"#,
            "{}",
        );
        let chain = [task(None, Some("other/m"), None)];
        let e = check(&chain, &g, true, None).unwrap_err();
        assert!(
            e.contains("step 0: model \"other/m\" is outside `subagents.modelScope` in /u/settings.json (allowed: fake/*)"),
            "{e}"
        );
        let w = check(&chain, &g, false, None).unwrap();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(check(&[task(None, Some("fake/x"), None)], &g, true, None)
            .unwrap()
            .is_empty());
        // The agent's own list narrows the global one.
        let e = check(
            &[task(Some("worker"), Some("fake/x"), None)],
            &g,
            true,
            None,
        )
        .unwrap_err();
        assert!(e.contains("subagents.modelScope.agents.worker"), "{e}");
        // strict refuses every model outside; no enforce only warns.
        let strict = gov(
            r#"{"subagents": {"modelScope": {"enforce": true, "strict": true, "allow": ["fake/*"]}}}"#,
            "{}",
        );
        assert!(check(&chain, &strict, false, None).is_err());
        let loose = gov(
            r#"{"subagents": {"modelScope": {"allow": ["fake/*"]}}}"#,
            "{}",
        );
        let w = check(&chain, &loose, true, None).unwrap();
        assert!(w[0].contains("not enforced"), "{w:?}");
        // No model: the caller's is checked, as one the command line did not give.
        let bare = [task(None, None, None)];
        assert_eq!(check(&bare, &g, true, Some("other/m")).unwrap().len(), 1);
        assert!(check(&bare, &strict, true, Some("other/m")).is_err());
        assert!(check(&bare, &g, true, Some("fake/ok")).unwrap().is_empty());
    }

    #[test]
    fn thinking_above_the_ceiling_is_refused_from_the_field_or_the_model_suffix() {
        let g = gov(r#"{"subagents": {"maxThinking": "medium"}}"#, "{}");
        assert!(check(&[task(None, None, Some("low"))], &g, false, None)
            .unwrap()
            .is_empty());
        assert!(check(&[task(None, None, Some("medium"))], &g, false, None).is_ok());
        let e = check(&[task(None, None, Some("high"))], &g, false, None).unwrap_err();
        assert!(
            e.contains("thinking `high` is above `subagents.maxThinking` `medium`"),
            "{e}"
        );
        assert!(check(&[task(None, Some("p/m:xhigh"), None)], &g, false, None).is_err());
        assert!(check(&[task(None, Some("p/m"), None)], &g, false, None).is_ok());
    }

    #[test]
    fn the_config_maps_what_cohort_has_and_names_the_rest() {
        let c = parse_config(
            Path::new("/c.json"),
            r#"{"timeoutMs": 60000, "maxSubagentDepth": 1, "globalConcurrencyLimit": 3,
                "parallel": {"maxTasks": 2, "concurrency": 1}, "fleetView": false,
                "asyncByDefault": true, "timeoutMS": 5, "worktreeSetupHook": "./s.sh"}"#,
        )
        .unwrap();
        assert_eq!(c.timeout_ms, Some(60000));
        assert_eq!(c.max_subagent_depth, Some(1));
        assert_eq!(c.global_concurrency_limit, Some(3));
        assert_eq!(
            (c.parallel_max_tasks, c.parallel_concurrency),
            (Some(2), Some(1))
        );
        assert_eq!(c.warnings.len(), 2, "{:?}", c.warnings);
        assert!(
            c.warnings[0].contains("`fleetView`, `asyncByDefault`")
                || c.warnings[0].contains("`asyncByDefault`, `fleetView`"),
            "{:?}",
            c.warnings
        );
        assert!(
            c.warnings[1].contains("`timeoutMS`")
                && c.warnings[1].contains("did you mean `timeoutMs`"),
            "{:?}",
            c.warnings
        );
        let bad =
            parse_config(Path::new("/c.json"), r#"{"timeoutMs": -1, "parallel": 3}"#).unwrap();
        assert_eq!(bad.timeout_ms, None);
        assert_eq!(bad.warnings.len(), 2, "{:?}", bad.warnings);
        assert!(parse_config(Path::new("/c.json"), "[]").is_err());
    }

    #[test]
    fn the_config_table_names_exactly_the_keys_the_parser_knows() {
        let doc = include_str!("../../../docs/agents.md");
        let section = doc
            .split("### Governance")
            .nth(1)
            .expect("the Governance section");
        let mut keys = Vec::new();
        for l in section
            .lines()
            .skip_while(|l| !l.starts_with("| config key |"))
            .skip(2)
            .take_while(|l| l.starts_with('|'))
        {
            let mut cells = l.split('|').skip(1);
            let first: Vec<String> = cells
                .next()
                .unwrap()
                .split(", ")
                .map(|k| k.trim().trim_matches('`').to_string())
                .collect();
            let no_effect = cells.next().unwrap().trim_start().starts_with("no effect");
            for k in first {
                assert_eq!(no_effect, CONFIG_NO_EFFECT.contains(&k.as_str()), "{k}");
                keys.push(k);
            }
        }
        assert_eq!(
            keys,
            config_keys(),
            "docs/agents.md's config table and the parser, in one order"
        );
    }

    #[test]
    fn a_parallel_group_above_max_tasks_is_refused() {
        let g = gov("{}", r#"{"parallel": {"maxTasks": 1}}"#);
        let group = ChainStep::Parallel(ParallelSpec {
            parallel: vec![TaskSpec::default(), TaskSpec::default()],
            concurrency: None,
            worktree: false,
            fail_fast: None,
        });
        let e = check(&[group], &g, false, None).unwrap_err();
        assert!(e.contains("more than `parallel.maxTasks` (1)"), "{e}");
    }
}
