//! The `subagents` keys of Pi's `settings.json` that shape agents and govern runs, read the
//! way pi-subagents reads them (`docs/agents.md`, "Settings"): `agentScanDirs`,
//! `agentOverrides`, `agentOverridesByProvider`, `disableBuiltins`, `defaultModel`,
//! `defaultThinking`, `defaultExtensions`, `modelScope`, `maxThinking`, `disableThinking`
//! ([`SETTINGS`]; the others pi-subagents reads are named in a warning, and so is an unknown
//! key), and the top-level `packages` list (where installed Pi packages that may declare
//! agents live) and `defaultProvider` (Pi's own default provider). What the governance keys
//! decide at spawn is [`crate::agents::governance`].
//!
//! [`parse`] reads one file's text (pure); [`apply`] lays an agent's overrides over its parsed
//! frontmatter (pure). An override replaces the frontmatter's value field by field, `false`
//! clears a field, `tools: "inherit"` drops the allow-list and `tools: false` empties it,
//! `systemPrompt` replaces the body, `disabled: true` drops the agent. The result is given back
//! to the ordinary frontmatter reader, so an override value cohort would refuse in a file is
//! refused the same way.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value as Json};
use serde_yaml_ng::{Mapping, Value as Yaml};

/// The override fields pi-subagents knows. A key outside this list is refused (pi-subagents
/// ignores it; cohort refuses it so that a typo is never taken for a setting).
pub const OVERRIDE_KEYS: [&str; 26] = [
    "description",
    "output",
    "outputMode",
    "defaultReads",
    "model",
    "defaultProvider",
    "fallbackModels",
    "fast",
    "thinking",
    "systemPromptMode",
    "inheritProjectContext",
    "inheritGlobalContext",
    "inheritSkills",
    "defaultContext",
    "acceptanceRole",
    "disabled",
    "systemPrompt",
    "skills",
    "tools",
    "excludeTools",
    "allowNestedSubagents",
    "extensions",
    "subagentOnlyExtensions",
    "mutationTools",
    "completionGuard",
    "toolBudget",
];

/// The override fields that `false` clears (the agent then has no value for them).
pub const CLEARABLE: [&str; 14] = [
    "output",
    "defaultReads",
    "model",
    "defaultProvider",
    "fallbackModels",
    "thinking",
    "defaultContext",
    "acceptanceRole",
    "skills",
    "excludeTools",
    "extensions",
    "subagentOnlyExtensions",
    "mutationTools",
    "toolBudget",
];

/// How cohort treats a `subagents` key pi-subagents 0.67 reads from `settings.json`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setting {
    /// Honoured with pi-subagents' meaning (`docs/agents.md`, "Settings").
    Honoured,
    /// Read by pi-subagents, without effect in cohort: spawn warns, naming why.
    NoEffect(&'static str),
}

/// Every `subagents` key pi-subagents 0.67 reads (`src/agents/agents.ts`,
/// `readSubagentSettings`; watchdog settings, `docs/watchdog.md`), and what cohort does with
/// it. A key outside this list gets one warning, with the closest names.
pub const SETTINGS: [(&str, Setting); 13] = [
    ("agentScanDirs", Setting::Honoured),
    ("agentOverrides", Setting::Honoured),
    ("agentOverridesByProvider", Setting::Honoured),
    ("disableBuiltins", Setting::Honoured),
    ("defaultModel", Setting::Honoured),
    ("defaultThinking", Setting::Honoured),
    ("defaultExtensions", Setting::Honoured),
    ("modelScope", Setting::Honoured),
    ("maxThinking", Setting::Honoured),
    ("disableThinking", Setting::Honoured),
    (
        "defaultProvider",
        Setting::NoEffect("cohort takes a model's provider from `provider/id` only"),
    ),
    (
        "projectRootResolution",
        Setting::NoEffect("cohort reads the settings of the nearest project level"),
    ),
    (
        "watchdog",
        Setting::NoEffect("cohort has no watchdog; bound runs with --timeout and the limits"),
    ),
];

/// What cohort does with `subagents` key `key` (pure); `None` for a key pi-subagents does not
/// read.
pub fn setting(key: &str) -> Option<Setting> {
    SETTINGS.iter().find(|(k, _)| *k == key).map(|(_, t)| *t)
}

/// One allow-list of `subagents.modelScope` (pi-subagents' `ModelScopeRule`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScopeRule {
    /// `enforce`: refuse (or warn of) models outside `allow`.
    pub enforce: Option<bool>,
    /// `strict`: with `enforce`, refuse every out-of-scope model, not only the command line's.
    pub strict: Option<bool>,
    /// `allow`: glob patterns (`*` only, case-insensitive) over `provider/id`; `inherit` is
    /// the caller's model. Never empty when present.
    pub allow: Option<Vec<String>>,
}

/// `subagents.modelScope`: the global allow-list and one per agent name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelScope {
    /// The top-level `enforce`, `strict`, `allow`.
    pub rule: ScopeRule,
    /// `agents.NAME`: a second list a model of agent NAME must also pass; its `enforce` and
    /// `strict` default to the top-level ones.
    pub agents: BTreeMap<String, ScopeRule>,
}

/// What one `settings.json` says about agents.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AgentSettings {
    /// The file.
    pub file: PathBuf,
    /// `subagents.agentScanDirs`: directory patterns, as written.
    pub agent_scan_dirs: Vec<String>,
    /// `subagents.agentOverrides`: the override object of each agent, by its name.
    pub overrides: BTreeMap<String, Map<String, Json>>,
    /// `subagents.disableBuiltins`, when set.
    pub disable_builtins: Option<bool>,
    /// `subagents.defaultModel`, when set: the model of every agent that names none.
    pub default_model: Option<String>,
    /// The top-level `packages`: each entry's source (`npm:NAME`, `git:HOST/PATH`, a path).
    pub packages: Vec<String>,
    /// `subagents.defaultThinking`, when set: the thinking level of every agent that says
    /// nothing about `thinking` (`thinking: false` stays none).
    pub default_thinking: Option<String>,
    /// `subagents.defaultExtensions`, when set: the `extensions` of every agent without that
    /// field, as written (`[]`: none).
    pub default_extensions: Option<Vec<String>>,
    /// `subagents.agentOverridesByProvider`: per provider, the override object of each agent,
    /// laid over `agentOverrides` when the caller's model is of that provider
    /// ([`AgentSettings::for_provider`]).
    pub provider_overrides: BTreeMap<String, BTreeMap<String, Map<String, Json>>>,
    /// The top-level `defaultProvider` (Pi's own setting): the provider of a top-level
    /// caller's model.
    pub pi_default_provider: Option<String>,
    /// `subagents.modelScope`, when set.
    pub model_scope: Option<ModelScope>,
    /// `subagents.maxThinking`, when set: the most thinking any step may ask for.
    pub max_thinking: Option<String>,
    /// `subagents.disableThinking`, when set: `true` clears the builtin agents' thinking.
    pub disable_thinking: Option<bool>,
    /// One line each (no `warning:` prefix): a `subagents` key without effect in cohort, or
    /// unknown (with the closest known names).
    pub warnings: Vec<String>,
}

impl AgentSettings {
    /// These settings for a caller whose model is of `provider` (pure): each agent's
    /// `agentOverridesByProvider.PROVIDER.NAME` laid over its `agentOverrides.NAME` key by key
    /// (a key of the provider's wins). No provider, or none of its overrides: unchanged.
    pub fn for_provider(&self, provider: Option<&str>) -> AgentSettings {
        let mut out = self.clone();
        let Some(selected) = provider.and_then(|p| self.provider_overrides.get(p)) else {
            return out;
        };
        for (name, over) in selected {
            let entry = out.overrides.entry(name.clone()).or_default();
            for (k, v) in over {
                entry.insert(k.clone(), v.clone());
            }
        }
        out
    }
}

/// Read a `settings.json`'s text (pure). A file without `subagents` or `packages` is empty
/// settings. Errors, one line naming the file and the key: text that is not a JSON object,
/// a key of the wrong type, an override that is not an object or has a key outside
/// [`OVERRIDE_KEYS`].
pub fn parse(file: &Path, text: &str) -> Result<AgentSettings, String> {
    let at = file.display();
    let root: Json = serde_json::from_str(text).map_err(|e| format!("{at}: invalid JSON: {e}"))?;
    let Json::Object(root) = root else {
        return Err(format!("{at}: the settings must be a JSON object"));
    };
    let mut out = AgentSettings {
        file: file.to_path_buf(),
        ..Default::default()
    };
    if let Some(p) = root.get("packages") {
        let Json::Array(items) = p else {
            return Err(format!("{at}: `packages` must be a list"));
        };
        for item in items {
            match item {
                Json::String(s) => out.packages.push(s.clone()),
                Json::Object(o) => {
                    if let Some(Json::String(s)) = o.get("source") {
                        out.packages.push(s.clone());
                    }
                }
                _ => {}
            }
        }
    }
    if let Some(Json::String(p)) = root.get("defaultProvider") {
        out.pi_default_provider = Some(p.trim().to_string()).filter(|p| !p.is_empty());
    }
    let sub = match root.get("subagents") {
        None | Some(Json::Null) => return Ok(out),
        Some(Json::Object(o)) => o,
        Some(_) => return Err(format!("{at}: `subagents` must be an object")),
    };
    out.warnings = key_warnings(&at, sub);
    match sub.get("disableThinking") {
        None | Some(Json::Null) => {}
        Some(Json::Bool(b)) => out.disable_thinking = Some(*b),
        Some(_) => {
            return Err(format!(
                "{at}: `subagents.disableThinking` must be true or false"
            ))
        }
    }
    match sub.get("maxThinking") {
        None | Some(Json::Null) => {}
        Some(Json::String(t)) if crate::agents::fields::THINKING_LEVELS.contains(&t.trim()) => {
            out.max_thinking = Some(t.trim().to_string())
        }
        Some(_) => {
            return Err(format!(
                "{at}: `subagents.maxThinking` must be one of {}",
                crate::agents::fields::THINKING_LEVELS.join(", ")
            ))
        }
    }
    match sub.get("modelScope") {
        None | Some(Json::Null) => {}
        Some(v) => out.model_scope = Some(model_scope(&at, v)?),
    }
    if let Some(v) = sub.get("agentScanDirs") {
        let list = v.as_array().and_then(|a| {
            a.iter()
                .map(|s| s.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
        });
        let Some(list) = list else {
            return Err(format!(
                "{at}: `subagents.agentScanDirs` must be a list of directory strings"
            ));
        };
        out.agent_scan_dirs = list.into_iter().filter(|s| !s.trim().is_empty()).collect();
    }
    match sub.get("disableBuiltins") {
        None | Some(Json::Null) => {}
        Some(Json::Bool(b)) => out.disable_builtins = Some(*b),
        Some(_) => {
            return Err(format!(
                "{at}: `subagents.disableBuiltins` must be true or false"
            ))
        }
    }
    match sub.get("defaultModel") {
        None | Some(Json::Null) => {}
        Some(Json::String(s)) if !s.trim().is_empty() => {
            out.default_model = Some(s.trim().to_string())
        }
        Some(_) => {
            return Err(format!(
                "{at}: `subagents.defaultModel` must be a model name such as provider/id"
            ))
        }
    }
    match sub.get("defaultThinking") {
        None | Some(Json::Null) => {}
        Some(Json::String(s)) if !s.trim().is_empty() => {
            out.default_thinking = Some(s.trim().to_string())
        }
        Some(_) => {
            return Err(format!(
                "{at}: `subagents.defaultThinking` must be a thinking level such as medium"
            ))
        }
    }
    match sub.get("defaultExtensions") {
        None | Some(Json::Null) => {}
        Some(Json::Array(items)) => {
            let list = items
                .iter()
                .map(|i| i.as_str().map(str::trim).filter(|s| !s.is_empty()))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    format!("{at}: `subagents.defaultExtensions` must be a list of extension paths")
                })?;
            out.default_extensions = Some(list.into_iter().map(str::to_string).collect());
        }
        Some(_) => {
            return Err(format!(
                "{at}: `subagents.defaultExtensions` must be a list of extension paths"
            ))
        }
    }
    match sub.get("agentOverrides") {
        None | Some(Json::Null) => {}
        Some(v) => out.overrides = overrides(&at, "subagents.agentOverrides", v)?,
    }
    match sub.get("agentOverridesByProvider") {
        None | Some(Json::Null) => {}
        Some(Json::Object(all)) => {
            for (provider, v) in all {
                let key = format!("subagents.agentOverridesByProvider.{provider}");
                out.provider_overrides
                    .insert(provider.clone(), overrides(&at, &key, v)?);
            }
        }
        Some(_) => {
            return Err(format!(
                "{at}: `subagents.agentOverridesByProvider` must be an object keyed by provider"
            ))
        }
    }
    Ok(out)
}

/// The warnings for the `subagents` keys of file `at` (pure): each key without effect in
/// cohort ([`Setting::NoEffect`]), and each key pi-subagents does not read, with the closest
/// known names ([`crate::agents::did_you_mean`]), in file order.
fn key_warnings(at: &std::path::Display, sub: &Map<String, Json>) -> Vec<String> {
    let known: Vec<&str> = SETTINGS.iter().map(|(k, _)| *k).collect();
    sub.keys()
        .filter_map(|k| match setting(k) {
            Some(Setting::Honoured) => None,
            Some(Setting::NoEffect(why)) => Some(format!(
                "{at}: `subagents.{k}` has no effect in cohort: {why}"
            )),
            None => {
                let hint = crate::agents::did_you_mean(k, &known, "subagents.");
                Some(format!(
                    "{at}: `subagents.{k}` is not a setting pi-subagents or cohort knows, so it has no effect{hint}"
                ))
            }
        })
        .collect()
}

/// `subagents.modelScope` of file `at` (pure), checked as pi-subagents checks it
/// (`src/runs/shared/model-scope.ts`, `parseModelScopeConfig`): an object of `enforce`,
/// `strict` (booleans), `allow` (a non-empty list of patterns) and `agents` (an object of such
/// rules by agent name, not nested); `enforce: true` needs at least one `allow` list.
fn model_scope(at: &std::path::Display, v: &Json) -> Result<ModelScope, String> {
    let Json::Object(o) = v else {
        return Err(format!("{at}: `subagents.modelScope` must be an object"));
    };
    let mut out = ModelScope {
        rule: scope_rule(at, "subagents.modelScope", o)?,
        ..Default::default()
    };
    match o.get("agents") {
        None => {}
        Some(Json::Object(agents)) => {
            for (name, r) in agents {
                let key = format!("subagents.modelScope.agents.{name}");
                let Json::Object(r) = r else {
                    return Err(format!("{at}: `{key}` must be an object"));
                };
                if r.contains_key("agents") {
                    return Err(format!("{at}: `{key}.agents`: agent scopes do not nest"));
                }
                out.agents
                    .insert(name.trim().to_string(), scope_rule(at, &key, r)?);
            }
        }
        Some(_) => {
            return Err(format!(
                "{at}: `subagents.modelScope.agents` must be an object keyed by agent name"
            ))
        }
    }
    let any_allow = out.rule.allow.is_some() || out.agents.values().any(|r| r.allow.is_some());
    if out.rule.enforce == Some(true) && !any_allow {
        return Err(format!(
            "{at}: `subagents.modelScope.enforce` is true but there is no `allow` list: list the allowed models or drop `enforce`"
        ));
    }
    Ok(out)
}

fn scope_rule(
    at: &std::path::Display,
    key: &str,
    o: &Map<String, Json>,
) -> Result<ScopeRule, String> {
    let flag = |k: &str| match o.get(k) {
        None => Ok(None),
        Some(Json::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(format!("{at}: `{key}.{k}` must be true or false")),
    };
    let allow = match o.get("allow") {
        None => None,
        Some(Json::Array(items)) => {
            let list: Vec<String> = items
                .iter()
                .map(|i| i.as_str().map(|s| s.trim().to_string()))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| format!("{at}: `{key}.allow` must be a list of model patterns"))?
                .into_iter()
                .filter(|s| !s.is_empty())
                .collect();
            if list.is_empty() {
                return Err(format!(
                    "{at}: `{key}.allow` must name at least one model pattern"
                ));
            }
            Some(list)
        }
        Some(_) => {
            return Err(format!(
                "{at}: `{key}.allow` must be a list of model patterns"
            ))
        }
    };
    Ok(ScopeRule {
        enforce: flag("enforce")?,
        strict: flag("strict")?,
        allow,
    })
}

/// The override objects of `v`, the value of settings key `key` in file `at` (pure): an object
/// keyed by agent name whose values are objects of [`OVERRIDE_KEYS`].
fn overrides(
    at: &std::path::Display,
    key: &str,
    v: &Json,
) -> Result<BTreeMap<String, Map<String, Json>>, String> {
    let Json::Object(all) = v else {
        return Err(format!(
            "{at}: `{key}` must be an object keyed by agent name"
        ));
    };
    let mut out = BTreeMap::new();
    for (name, ov) in all {
        let Json::Object(ov) = ov else {
            return Err(format!(
                "{at}: `{key}.{name}` must be an object of agent fields"
            ));
        };
        if let Some(k) = ov.keys().find(|k| !OVERRIDE_KEYS.contains(&k.as_str())) {
            return Err(format!(
                "{at}: `{key}.{name}.{k}` is not an override field; known: {}",
                OVERRIDE_KEYS.join(", ")
            ));
        }
        out.insert(name.clone(), ov.clone());
    }
    Ok(out)
}

/// Lay one override over an agent's frontmatter `fields` and prompt `body` (pure). Returns
/// `Some(disabled)` when the override sets `disabled`. Errors name the field: `disabled` not a
/// boolean, `systemPrompt` not a string, `tools` neither `"inherit"`, `false`, a string nor a
/// list, `defaultProvider` (cohort takes the provider from `model: provider/id` only).
pub fn apply(
    fields: &mut Mapping,
    body: &mut String,
    ov: &Map<String, Json>,
) -> Result<Option<bool>, String> {
    let mut disabled = None;
    for (k, v) in ov {
        match (k.as_str(), v) {
            ("disabled", Json::Bool(b)) => disabled = Some(*b),
            ("disabled", _) => return Err("`disabled` must be true or false".into()),
            ("systemPrompt", Json::String(s)) => *body = s.clone(),
            ("systemPrompt", _) => return Err("`systemPrompt` must be a string".into()),
            ("defaultProvider", _) => {
                return Err(
                    "`defaultProvider` is not supported; name the provider in `model` (provider/id)"
                        .into(),
                )
            }
            ("tools", Json::String(s)) if s == "inherit" => {
                fields.remove("tools");
            }
            ("tools", Json::Bool(false)) => {
                fields.insert("tools".into(), Yaml::Sequence(Vec::new()));
            }
            ("tools", Json::String(_) | Json::Array(_)) => {
                fields.insert("tools".into(), to_yaml(v));
            }
            ("tools", _) => {
                return Err(
                    "`tools` must be a list of tool names, \"inherit\" (Pi's default tools) or false (none)"
                        .into(),
                )
            }
            (key, Json::Bool(false)) if CLEARABLE.contains(&key) => {
                fields.remove(key);
            }
            (key, _) => {
                fields.insert(key.into(), to_yaml(v));
            }
        }
    }
    Ok(disabled)
}

fn to_yaml(v: &Json) -> Yaml {
    serde_yaml_ng::to_value(v).unwrap_or(Yaml::Null)
}

/// An agent file's text rebuilt from `fields` and `body` (pure), for the frontmatter reader.
pub fn render(fields: &Mapping, body: &str) -> String {
    let yaml = if fields.is_empty() {
        String::new()
    } else {
        serde_yaml_ng::to_string(&Yaml::Mapping(fields.clone())).unwrap_or_default()
    };
    format!("---\n{yaml}---\n{body}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(text: &str) -> Result<AgentSettings, String> {
        parse(Path::new("/p/settings.json"), text)
    }

    #[test]
    fn reads_the_subagents_keys_and_packages() {
        let s = settings(
            r#"{"defaultProvider": "x", "packages": ["npm:a", {"source": "git:h/o/r"}, 3],
                "subagents": {"agentScanDirs": ["~/a", " "], "disableBuiltins": true,
                "defaultModel": "p/m", "agentOverrides": {"scout": {"model": "p/n"}}}}"#,
        )
        .unwrap();
        assert_eq!(s.packages, vec!["npm:a", "git:h/o/r"]);
        assert_eq!(s.agent_scan_dirs, vec!["~/a"]);
        assert_eq!(s.disable_builtins, Some(true));
        assert_eq!(s.default_model.as_deref(), Some("p/m"));
        assert_eq!(s.overrides["scout"]["model"], "p/n");
        assert_eq!(settings("{}").unwrap().overrides.len(), 0);
    }

    #[test]
    fn reads_the_defaults_and_the_provider_overrides() {
        let s = settings(
            r#"{"defaultProvider": "acme", "subagents": {"defaultThinking": " high ",
                "defaultExtensions": ["./a.ts", "/b.ts"],
                "agentOverrides": {"scout": {"model": "p/n", "thinking": "low"}},
                "agentOverridesByProvider": {"acme": {"scout": {"model": "acme/fast"},
                                                      "worker": {"thinking": "off"}}}}}"#,
        )
        .unwrap();
        assert_eq!(s.pi_default_provider.as_deref(), Some("acme"));
        assert_eq!(s.default_thinking.as_deref(), Some("high"));
        assert_eq!(
            s.default_extensions,
            Some(vec!["./a.ts".to_string(), "/b.ts".to_string()])
        );
        let acme = s.for_provider(Some("acme"));
        assert_eq!(acme.overrides["scout"]["model"], "acme/fast");
        assert_eq!(
            acme.overrides["scout"]["thinking"], "low",
            "laid over, key by key"
        );
        assert_eq!(acme.overrides["worker"]["thinking"], "off");
        for other in [None, Some("other")] {
            assert_eq!(s.for_provider(other).overrides, s.overrides);
        }
        assert_eq!(
            settings(r#"{"subagents": {"defaultExtensions": []}}"#)
                .unwrap()
                .default_extensions,
            Some(vec![])
        );
    }

    #[test]
    fn bad_values_name_the_file_and_key() {
        for (text, needle) in [
            ("[1]", "must be a JSON object"),
            ("{", "invalid JSON"),
            (r#"{"subagents": 1}"#, "`subagents` must be an object"),
            (r#"{"subagents": {"agentScanDirs": "a"}}"#, "agentScanDirs"),
            (
                r#"{"subagents": {"disableBuiltins": "yes"}}"#,
                "disableBuiltins",
            ),
            (r#"{"subagents": {"defaultModel": ""}}"#, "defaultModel"),
            (
                r#"{"subagents": {"agentOverrides": {"a": 1}}}"#,
                "agentOverrides.a",
            ),
            (
                r#"{"subagents": {"agentOverrides": {"a": {"modle": "x"}}}}"#,
                "agentOverrides.a.modle` is not an override field",
            ),
            (
                r#"{"subagents": {"defaultThinking": 3}}"#,
                "defaultThinking",
            ),
            (
                r#"{"subagents": {"defaultExtensions": "a.ts"}}"#,
                "defaultExtensions",
            ),
            (
                r#"{"subagents": {"defaultExtensions": ["a.ts", ""]}}"#,
                "defaultExtensions",
            ),
            (
                r#"{"subagents": {"agentOverridesByProvider": []}}"#,
                "agentOverridesByProvider` must be an object keyed by provider",
            ),
            (
                r#"{"subagents": {"agentOverridesByProvider": {"p": {"a": {"x": 1}}}}}"#,
                "agentOverridesByProvider.p.a.x` is not an override field",
            ),
        ] {
            let e = settings(text).unwrap_err();
            assert!(
                e.starts_with("/p/settings.json: ") && e.contains(needle),
                "{text}: {e}"
            );
        }
    }

    #[test]
    fn reads_the_governance_keys_and_warns_of_the_others() {
        let s = settings(
            r#"{"subagents": {"maxThinking": "medium", "disableThinking": true,
                "modelScope": {"enforce": true, "allow": ["fake/*", "inherit"],
                               "agents": {"worker": {"allow": ["fake/plain"], "strict": true}}},
                "watchdog": {}, "defaultThinkng": "low", "zzz": 1}}"#,
        )
        .unwrap();
        assert_eq!(s.max_thinking.as_deref(), Some("medium"));
        assert_eq!(s.disable_thinking, Some(true));
        let scope = s.model_scope.unwrap();
        assert_eq!(scope.rule.enforce, Some(true));
        assert_eq!(
            scope.rule.allow.as_deref(),
            Some(&["fake/*".to_string(), "inherit".to_string()][..])
        );
        assert_eq!(scope.agents["worker"].strict, Some(true));
        assert_eq!(s.warnings.len(), 3, "{:?}", s.warnings);
        assert!(
            s.warnings[0].contains("`subagents.defaultThinkng` is not a setting")
                && s.warnings[0].contains("did you mean `subagents.defaultThinking`"),
            "{:?}",
            s.warnings
        );
        assert!(
            s.warnings[1].contains("`subagents.watchdog` has no effect in cohort"),
            "{:?}",
            s.warnings
        );
        assert!(
            s.warnings[2].contains("`subagents.zzz`") && !s.warnings[2].contains("did you mean"),
            "{:?}",
            s.warnings
        );
        for (text, needle) in [
            (
                r#"{"subagents": {"maxThinking": "huge"}}"#,
                "maxThinking` must be one of",
            ),
            (
                r#"{"subagents": {"disableThinking": "yes"}}"#,
                "disableThinking",
            ),
            (
                r#"{"subagents": {"modelScope": {"enforce": true}}}"#,
                "no `allow` list",
            ),
            (
                r#"{"subagents": {"modelScope": {"allow": []}}}"#,
                "at least one",
            ),
            (
                r#"{"subagents": {"modelScope": {"strict": 1}}}"#,
                "modelScope.strict",
            ),
            (
                r#"{"subagents": {"modelScope": {"agents": {"w": {"agents": {}}}}}}"#,
                "do not nest",
            ),
        ] {
            let e = settings(text).unwrap_err();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }

    /// The keys of docs/agents.md's "Settings" table, each row's first cell up to its first
    /// `.`, and whether its text says "no effect".
    fn table_rows() -> Vec<(String, bool)> {
        let doc = include_str!("../../../docs/agents.md");
        let section = doc
            .split("### Settings")
            .nth(1)
            .expect("the Settings section");
        section
            .lines()
            .skip_while(|l| !l.starts_with("| key |"))
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(|l| {
                let mut cells = l.split('|').skip(1);
                let key = cells.next().unwrap().trim().trim_matches('`');
                let key = key.split('.').next().unwrap().to_string();
                (
                    key,
                    cells.next().unwrap().trim_start().starts_with("no effect"),
                )
            })
            .collect()
    }

    #[test]
    fn the_settings_table_names_exactly_the_keys_the_parser_knows() {
        let rows = table_rows();
        let keys: Vec<&str> = rows.iter().map(|(k, _)| k.as_str()).collect();
        let known: Vec<&str> = SETTINGS.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            keys, known,
            "docs/agents.md's Settings table and SETTINGS, in one order"
        );
        for ((key, no_effect), (_, t)) in rows.iter().zip(SETTINGS) {
            assert_eq!(*no_effect, matches!(t, Setting::NoEffect(_)), "{key}");
        }
    }

    fn ov(json: &str) -> Map<String, Json> {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn an_override_replaces_clears_and_disables() {
        let doc = crate::frontmatter::split(
            "---\nname: r\nmodel: a/b\nthinking: low\ntools: read, bash\n---\nprompt\n",
        )
        .unwrap();
        let (mut fields, mut body) = (doc.fields.clone(), doc.body.clone());
        let d = apply(
            &mut fields,
            &mut body,
            &ov(r#"{"model": "c/d", "thinking": false, "tools": ["read"], "systemPrompt": "new"}"#),
        )
        .unwrap();
        assert_eq!(d, None);
        let text = render(&fields, &body);
        let again = crate::frontmatter::split(&text).unwrap();
        assert_eq!(again.string("model").unwrap().as_deref(), Some("c/d"));
        assert_eq!(again.string("thinking").unwrap(), None);
        assert_eq!(again.list("tools").unwrap(), Some(vec!["read".to_string()]));
        assert_eq!(again.body, "new");
        assert_eq!(again.string("name").unwrap().as_deref(), Some("r"));

        let d = apply(
            &mut fields,
            &mut body,
            &ov(r#"{"tools": "inherit", "disabled": true}"#),
        );
        assert_eq!(d, Ok(Some(true)));
        assert!(fields.get("tools").is_none());
        apply(&mut fields, &mut body, &ov(r#"{"tools": false}"#)).unwrap();
        assert_eq!(fields.get("tools"), Some(&Yaml::Sequence(vec![])));

        for (bad, needle) in [
            (r#"{"disabled": "yes"}"#, "disabled"),
            (r#"{"systemPrompt": 1}"#, "systemPrompt"),
            (r#"{"tools": 3}"#, "tools"),
            (r#"{"defaultProvider": "x"}"#, "defaultProvider"),
        ] {
            let e = apply(&mut fields, &mut body, &ov(bad)).unwrap_err();
            assert!(e.contains(needle), "{bad}: {e}");
        }
    }
}
