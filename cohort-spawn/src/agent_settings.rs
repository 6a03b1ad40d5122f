//! The `subagents` keys of Pi's `settings.json` that shape agents, read the way pi-subagents
//! reads them (`docs/agents.md`, "Settings"): `agentScanDirs`, `agentOverrides`,
//! `agentOverridesByProvider`, `disableBuiltins`, `defaultModel`, `defaultThinking`,
//! `defaultExtensions`, and the top-level `packages` list (where installed Pi packages that
//! may declare agents live) and `defaultProvider` (Pi's own default provider).
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
