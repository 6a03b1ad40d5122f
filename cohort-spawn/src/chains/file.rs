//! JSON chain files (`docs/chain.md`): the upstream shape `{"name", "description", "package"?,
//! "chain": [...]}` and cohort's `{"steps": [...]}`, parsed into the launch spec's
//! [`ChainStep`]s with every problem reported on the line it is on.
//!
//! A step is a task, a static parallel group (`parallel` an array), or a dynamic fan-out
//! (`expand`, a `parallel` template object and `collect`). Unknown keys are errors, and so are
//! the upstream keys cohort does not carry out (`acceptance`, `toolBudget`). `count: N` is
//! expanded here into N members. After parsing, [`crate::chains::check::check`] checks names,
//! references and the fan-out's shape; paths, schemas, skills and git are checked later against
//! the file system ([`crate::chains::resolve`](mod@crate::chains::resolve)).
//!
//! Only spawn reads chain files; the runner reads the launch spec's `chain`
//! (`cohort_common::format::spec`).

use serde_json::{Map, Value};

use cohort_common::error::{Error, Result};
use cohort_common::format::spec::{
    ChainStep, ExpandStep, ParallelSpec, TaskSpec, DEFAULT_EXPAND_MAX_ITEMS, MAX_FANOUT_WIDTH,
};

use crate::frontmatter::{split_list, TextError};

/// A chain file, parsed (either shape; a `.chain.md` too, [`crate::chains::parse_chain_md`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedChain {
    /// `name` (a `.chain.json` without one, and a `{"steps": …}` file, are named by their
    /// file name).
    pub name: String,
    /// `description`.
    pub description: Option<String>,
    /// `package`: the chain's runtime name is `PACKAGE.NAME` ([`ParsedChain::runtime_name`]).
    pub package: Option<String>,
    /// The steps.
    pub steps: Vec<ChainStep>,
    /// The 1-based line each step starts on, one per step.
    pub lines: Vec<usize>,
    /// Step keys that were accepted and ignored ([`crate::chains::IGNORED_STEP_KEYS`]), once
    /// each.
    pub ignored: Vec<String>,
}

impl ParsedChain {
    /// The name the chain is run by: `PACKAGE.NAME` with a package, else `NAME`.
    pub fn runtime_name(&self) -> String {
        match &self.package {
            Some(p) => format!("{p}.{}", self.name),
            None => self.name.clone(),
        }
    }

    /// The line step `step` starts on (1 when unknown).
    pub fn line_of(&self, step: usize) -> usize {
        self.lines.get(step).copied().unwrap_or(1)
    }
}

/// Keys of a task (a step or a group member) in a JSON chain.
pub const TASK_KEYS: &[&str] = &[
    "task",
    "agent",
    "label",
    "model",
    "thinking",
    "tools",
    "piArgs",
    "phase",
    "as",
    "output",
    "reads",
    "progress",
    "outputMode",
    "outputSchema",
    "cwd",
    "skills",
    "skill",
    "count",
];
/// Keys of a static parallel group.
pub const GROUP_KEYS: &[&str] = &["parallel", "concurrency", "worktree", "failFast"];
/// Keys of a dynamic fan-out step.
pub const EXPAND_STEP_KEYS: &[&str] = &[
    "expand",
    "parallel",
    "collect",
    "concurrency",
    "failFast",
    "phase",
    "label",
];
/// Keys of `expand`.
pub const EXPAND_KEYS: &[&str] = &["from", "item", "key", "maxItems", "onEmpty"];
/// Keys of `expand.from`.
pub const FROM_KEYS: &[&str] = &["output", "path"];
/// Keys of `collect`.
pub const COLLECT_KEYS: &[&str] = &["as", "outputSchema"];
/// Upstream keys cohort refuses, each with why.
pub const REFUSED_KEYS: &[(&str, &str)] = &[
    (
        "acceptance",
        "cohort does not enforce acceptance gates; remove `acceptance`",
    ),
    (
        "toolBudget",
        "cohort does not enforce tool-call budgets; remove `toolBudget` (bound a step with --step-timeout)",
    ),
    (
        "sessionFile",
        "`sessionFile` is not accepted in a chain file; use cohort-spawn --session",
    ),
    (
        "resolvedAgent",
        "`resolvedAgent` is written by cohort-spawn, not accepted in a chain file; name the agent with `agent`",
    ),
];

/// Parse a chain file (either shape) as a `Vec<ChainStep>`; errors are [`Error::Usage`],
/// `chain file:LINE: …`.
pub fn parse_chain(text: &str) -> Result<Vec<ChainStep>> {
    parse_json(text, "chain")
        .map(|c| c.steps)
        .map_err(|e| Error::Usage(format!("chain file:{}: {}", e.line, e.message)))
}

/// Parse a JSON chain file's text (pure), naming a chain without `name` `fallback_name`.
/// Errors carry the line of the offending key or step.
pub fn parse_json(text: &str, fallback_name: &str) -> std::result::Result<ParsedChain, TextError> {
    let value: Value = serde_json::from_str(text).map_err(|e| {
        TextError::at(
            e.line().max(1),
            format!("not valid JSON: {}", strip_position(&e.to_string())),
        )
    })?;
    let Value::Object(root) = value else {
        return Err(TextError::at(
            1,
            "expected a JSON object {\"name\", \"description\", \"chain\": [...]} or {\"steps\": [...]} (see docs/chain.md)",
        ));
    };
    let at = Locator { text };
    let (key, name, description, package) = if root.contains_key("chain") {
        for k in root.keys() {
            if !["name", "description", "package", "chain"].contains(&k.as_str()) {
                return Err(TextError::at(
                    at.line(&[Seg::Key(k)]),
                    format!("unknown key `{k}` (known: name, description, package, chain)"),
                ));
            }
        }
        let text_field = |k: &str| -> std::result::Result<Option<String>, TextError> {
            match root.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) if !s.trim().is_empty() => Ok(Some(s.trim().to_string())),
                Some(_) => Err(TextError::at(
                    at.line(&[Seg::Key(k)]),
                    format!("`{k}` must be a non-empty string"),
                )),
            }
        };
        let name = text_field("name")?.unwrap_or_else(|| fallback_name.to_string());
        let package = text_field("package")?;
        if let Some(p) = &package {
            check_package(p).map_err(|m| TextError::at(at.line(&[Seg::Key("package")]), m))?;
        }
        ("chain", name, text_field("description")?, package)
    } else {
        for k in root.keys() {
            if k != "steps" {
                return Err(TextError::at(
                    at.line(&[Seg::Key(k)]),
                    format!("unknown key `{k}`: a chain file has `chain` (with `name`, `description`, `package`) or `steps`"),
                ));
            }
        }
        ("steps", fallback_name.to_string(), None, None)
    };
    let Some(Value::Array(raw)) = root.get(key) else {
        return Err(TextError::at(
            at.line(&[Seg::Key(key)]),
            format!("`{key}` must be a list of steps"),
        ));
    };
    if raw.is_empty() {
        return Err(TextError::at(
            at.line(&[Seg::Key(key)]),
            format!("`{key}` is empty"),
        ));
    }
    let mut steps = Vec::new();
    let mut lines = Vec::new();
    for (n, step) in raw.iter().enumerate() {
        let path = [Seg::Key(key), Seg::Index(n)];
        lines.push(at.line(&path));
        steps.push(parse_step(&at, &path, n, step)?);
    }
    let chain = ParsedChain {
        name,
        description,
        package,
        steps,
        lines,
        ignored: Vec::new(),
    };
    crate::chains::check::check(&chain.steps)
        .map_err(|(step, m)| TextError::at(chain.line_of(step), format!("step {step}: {m}")))?;
    Ok(chain)
}

/// A `package` name: non-empty, no whitespace, `/` or `.` at its ends.
pub fn check_package(p: &str) -> std::result::Result<(), String> {
    let ok = !p.is_empty()
        && !p.starts_with('.')
        && !p.ends_with('.')
        && p.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`package` {p:?} must be letters, digits, `-`, `_`, `.` and `@` (the chain is then run as PACKAGE.NAME)"
        ))
    }
}

fn parse_step(
    at: &Locator,
    path: &[Seg],
    n: usize,
    raw: &Value,
) -> std::result::Result<ChainStep, TextError> {
    let line = at.line(path);
    let Value::Object(obj) = raw else {
        return Err(TextError::at(line, format!("step {n}: expected an object")));
    };
    match obj.get("parallel") {
        Some(Value::Array(members)) => {
            check_keys(at, path, obj, GROUP_KEYS, &format!("step {n} (a parallel group)"))?;
            if members.is_empty() {
                return Err(TextError::at(line, format!("step {n}: `parallel` is empty")));
            }
            let mut group: ParallelSpec = typed(obj_without(obj, &["parallel"]), line, n)?;
            for (m, member) in members.iter().enumerate() {
                let mpath = [path, &[Seg::Key("parallel"), Seg::Index(m)]].concat();
                let what = format!("step {n}, member {m}");
                let Value::Object(mobj) = member else {
                    return Err(TextError::at(at.line(&mpath), format!("{what}: expected an object")));
                };
                let (t, count) = parse_task(at, &mpath, mobj, &what, "{previous}")?;
                group.parallel.extend(copies(t, count));
            }
            finish_group(group, line, n).map(ChainStep::Parallel)
        }
        Some(Value::Object(template)) => {
            check_keys(at, path, obj, EXPAND_STEP_KEYS, &format!("step {n} (a dynamic fan-out)"))?;
            let tpath = [path, &[Seg::Key("parallel")]].concat();
            let what = format!("step {n}, the `parallel` template");
            for k in ["as", "count"] {
                if template.contains_key(k) {
                    return Err(TextError::at(
                        at.line(&[&tpath[..], &[Seg::Key(k)]].concat()),
                        format!("{what}: `{k}` is not allowed in a fan-out template (name the collected answers with `collect.as`)"),
                    ));
                }
            }
            let (template, _) = parse_task(at, &tpath, template, &what, "{previous}")?;
            for (k, keys) in [("expand", EXPAND_KEYS), ("collect", COLLECT_KEYS)] {
                let kpath = [path, &[Seg::Key(k)]].concat();
                match obj.get(k) {
                    Some(Value::Object(o)) => check_keys(at, &kpath, o, keys, &format!("step {n}: `{k}`"))?,
                    _ => {
                        return Err(TextError::at(
                            line,
                            format!("step {n}: a dynamic fan-out needs `{k}`, an object"),
                        ))
                    }
                }
            }
            if let Some(Value::Object(from)) = obj["expand"].get("from") {
                let fpath = [path, &[Seg::Key("expand"), Seg::Key("from")]].concat();
                check_keys(at, &fpath, from, FROM_KEYS, &format!("step {n}: `expand.from`"))?;
            }
            if let Some(m) = obj["expand"].get("maxItems") {
                if m.as_u64().is_none() {
                    return Err(TextError::at(
                        at.line(&[path, &[Seg::Key("expand"), Seg::Key("maxItems")]].concat()),
                        format!("step {n}: `expand.maxItems` must be a whole number, not {m}"),
                    ));
                }
            }
            let mut rest = obj_without(obj, &["parallel"]);
            if let Some(Value::Object(e)) = rest.get_mut("expand") {
                e.entry("maxItems").or_insert(Value::from(DEFAULT_EXPAND_MAX_ITEMS));
            }
            rest.insert("parallel".into(), serde_json::to_value(&template).expect("a task serializes"));
            let step: ExpandStep = typed(rest, line, n)?;
            if step.concurrency == Some(0) {
                return Err(TextError::at(line, format!("step {n}: `concurrency` must be at least 1")));
            }
            if let Some(c) = step.concurrency.filter(|c| *c > MAX_FANOUT_WIDTH) {
                return Err(TextError::at(
                    line,
                    format!("step {n}: a fan-out's `concurrency` is at most {MAX_FANOUT_WIDTH} members alive at once, not {c}"),
                ));
            }
            Ok(ChainStep::Expand(step))
        }
        Some(_) => Err(TextError::at(
            at.line(&[path, &[Seg::Key("parallel")]].concat()),
            format!("step {n}: `parallel` is a list of members (a static group) or an object (the template of a dynamic fan-out with `expand` and `collect`)"),
        )),
        None => {
            if let Some(k) = ["expand", "collect"].iter().find(|k| obj.contains_key(**k)) {
                return Err(TextError::at(
                    at.line(&[path, &[Seg::Key(k)]].concat()),
                    format!("step {n}: `{k}` needs a `parallel` template object, with both `expand` and `collect`"),
                ));
            }
            let default = if n == 0 { "{task}" } else { "{previous}" };
            let (t, count) = parse_task(at, path, obj, &format!("step {n}"), default)?;
            if count > 1 {
                let group = ParallelSpec {
                    parallel: copies(t, count),
                    ..Default::default()
                };
                return finish_group(group, line, n).map(ChainStep::Parallel);
            }
            Ok(ChainStep::Task(t))
        }
    }
}

/// The checks every group gets: a non-zero concurrency and distinct labels, after the
/// unlabelled members of one agent are numbered ([`number_unlabelled`]).
fn finish_group(
    mut group: ParallelSpec,
    line: usize,
    n: usize,
) -> std::result::Result<ParallelSpec, TextError> {
    if group.concurrency == Some(0) {
        return Err(TextError::at(
            line,
            format!("step {n}: `concurrency` must be at least 1"),
        ));
    }
    number_unlabelled(&mut group.parallel);
    if let Some(dup) = duplicate_label(&group.parallel) {
        return Err(TextError::at(line, format!(
            "step {n}: two members are labelled {dup:?} (an unlabelled member of an agent that runs more than once in the group is labelled AGENT-N, N its place in the group); labels head each member's text in {{previous}} and --output, so they must differ"
        )));
    }
    Ok(group)
}

/// `n` copies of `t` for `count: n`: labelled `L-0` … `L-(n-1)` where L is its label or agent
/// (unlabelled otherwise); one copy, unchanged, for 1.
pub fn copies(t: TaskSpec, n: usize) -> Vec<TaskSpec> {
    if n <= 1 {
        return vec![t];
    }
    let base = t.label.clone().or_else(|| t.agent.clone());
    (0..n)
        .map(|i| TaskSpec {
            label: base.as_ref().map(|b| format!("{b}-{i}")),
            ..t.clone()
        })
        .collect()
}

/// One task object: its keys checked, upstream spellings normalised, `count` taken out.
/// A missing or blank `task` is `default`.
fn parse_task(
    at: &Locator,
    path: &[Seg],
    obj: &Map<String, Value>,
    what: &str,
    default: &str,
) -> std::result::Result<(TaskSpec, usize), TextError> {
    for (k, why) in REFUSED_KEYS {
        if obj.contains_key(*k) {
            return Err(TextError::at(
                at.line(&[path, &[Seg::Key(k)]].concat()),
                format!("{what}: {why}"),
            ));
        }
    }
    check_keys(at, path, obj, TASK_KEYS, what)?;
    let line = at.line(path);
    let mut obj = obj.clone();
    let count = match obj.remove("count") {
        None => 1,
        Some(v) => match v.as_u64() {
            Some(c) if c >= 1 => c as usize,
            _ => {
                return Err(TextError::at(
                    at.line(&[path, &[Seg::Key("count")]].concat()),
                    format!("{what}: `count` must be a whole number of at least 1, not {v}"),
                ))
            }
        },
    };
    if obj.contains_key("skill") && obj.contains_key("skills") {
        return Err(TextError::at(
            line,
            format!("{what}: give `skill` or `skills`, not both"),
        ));
    }
    if let Some(v) = obj.remove("skill") {
        obj.insert("skills".into(), v);
    }
    for k in ["skills", "reads"] {
        if let Some(Value::String(s)) = obj.get(k) {
            let list = split_list(s);
            obj.insert(k.into(), Value::from(list));
        }
    }
    let blank = obj
        .get("task")
        .and_then(Value::as_str)
        .is_none_or(|t| t.trim().is_empty());
    if blank && !matches!(obj.get("task"), Some(v) if !v.is_string()) {
        obj.insert("task".into(), Value::from(default));
    }
    let t: TaskSpec = serde_json::from_value(Value::Object(obj))
        .map_err(|e| TextError::at(line, format!("{what}: {}", strip_position(&e.to_string()))))?;
    if t.agent.as_deref().is_some_and(|a| a.trim().is_empty()) {
        return Err(TextError::at(line, format!("{what}: empty `agent`")));
    }
    Ok((t, count))
}

fn check_keys(
    at: &Locator,
    path: &[Seg],
    obj: &Map<String, Value>,
    known: &[&str],
    what: &str,
) -> std::result::Result<(), TextError> {
    match obj.keys().find(|k| !known.contains(&k.as_str())) {
        None => Ok(()),
        Some(k) => Err(TextError::at(
            at.line(&[path, &[Seg::Key(k)]].concat()),
            format!("{what}: unknown key `{k}` (known: {})", known.join(", ")),
        )),
    }
}

fn obj_without(obj: &Map<String, Value>, keys: &[&str]) -> Map<String, Value> {
    let mut o = obj.clone();
    for k in keys {
        o.remove(*k);
    }
    o
}

fn typed<T: serde::de::DeserializeOwned>(
    mut obj: Map<String, Value>,
    line: usize,
    n: usize,
) -> std::result::Result<T, TextError> {
    // A group's members are parsed on their own; the typed group gets an empty list.
    if !obj.contains_key("parallel") {
        obj.insert("parallel".into(), Value::Array(Vec::new()));
    }
    serde_json::from_value(Value::Object(obj)).map_err(|e| {
        TextError::at(
            line,
            format!("step {n}: {}", strip_position(&e.to_string())),
        )
    })
}

/// serde_json's message without its " at line L column C" (the line is reported apart).
fn strip_position(m: &str) -> String {
    match m.rfind(" at line ") {
        Some(i) => m[..i].to_string(),
        None => m.to_string(),
    }
}

/// Labels the unlabelled members of an agent that has more than one unlabelled member in the
/// group `AGENT-N`, N the member's 1-based place in the group, so each keeps a label of its
/// own for `{previous}` and `--output`. This is pi-subagents 0.67's numbering: it tells a
/// group's results apart by their 1-based place and agent (`=== Parallel Task N (AGENT) ===`,
/// `aggregateParallelOutputs` in `src/runs/shared/parallel-utils.ts`), and runs such members
/// rather than refusing them. A member that is the only unlabelled one of its agent keeps the
/// agent's name as its label; labelled members are left alone.
pub fn number_unlabelled(members: &mut [TaskSpec]) {
    let mut unlabelled = std::collections::HashMap::<String, usize>::new();
    for a in members
        .iter()
        .filter(|t| t.label.is_none())
        .filter_map(|t| t.agent.clone())
    {
        *unlabelled.entry(a).or_default() += 1;
    }
    for (i, t) in members.iter_mut().enumerate() {
        if t.label.is_some() {
            continue;
        }
        if let Some(a) = t.agent.as_deref().filter(|a| unlabelled.get(*a) > Some(&1)) {
            t.label = Some(format!("{a}-{}", i + 1));
        }
    }
}

/// The first label two members of a parallel group share, if any (pure). A member's label is
/// its `label`, else its agent's name; members with neither are `step-<i>`, distinct by
/// construction.
pub fn duplicate_label(members: &[TaskSpec]) -> Option<&str> {
    let mut seen = std::collections::HashSet::new();
    members
        .iter()
        .filter_map(|t| t.label.as_deref().or(t.agent.as_deref()))
        .find(|l| !seen.insert(*l))
}

/// Every task of a chain, in flat order, mutably (to resolve agents); a
/// fan-out step's template counts as its one task.
pub fn tasks_mut(chain: &mut [ChainStep]) -> impl Iterator<Item = &mut TaskSpec> {
    chain.iter_mut().flat_map(|s| match s {
        ChainStep::Task(t) => std::slice::from_mut(t).iter_mut(),
        ChainStep::Parallel(p) => p.parallel.iter_mut(),
        ChainStep::Expand(e) => std::slice::from_mut(&mut e.parallel).iter_mut(),
    })
}

/// One step of a path into a JSON document.
#[derive(Clone, Copy, Debug)]
enum Seg<'a> {
    Key(&'a str),
    Index(usize),
}

/// Finds the line a value of a JSON text is on, by a path of keys and indices (the parsed
/// [`Value`] keeps no positions). The text has already parsed, so a malformed part only makes
/// the answer less precise.
struct Locator<'a> {
    text: &'a str,
}

impl Locator<'_> {
    /// The 1-based line of the value at `path`, else of the deepest part of it found.
    fn line(&self, path: &[Seg]) -> usize {
        for len in (0..=path.len()).rev() {
            let mut c = Cursor {
                b: self.text.as_bytes(),
                i: 0,
            };
            if c.find(&path[..len]) {
                return self.text[..c.i.min(self.text.len())].matches('\n').count() + 1;
            }
        }
        1
    }
}

struct Cursor<'a> {
    b: &'a [u8],
    i: usize,
}

impl Cursor<'_> {
    fn ws(&mut self) {
        while self.i < self.b.len() && self.b[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    /// Moves to the start of the value at `path` (or as far as it gets).
    fn find(&mut self, path: &[Seg]) -> bool {
        self.ws();
        let Some((seg, rest)) = path.split_first() else {
            return true;
        };
        match (seg, self.peek()) {
            (Seg::Key(k), Some(b'{')) => {
                self.i += 1;
                loop {
                    self.ws();
                    if self.peek() != Some(b'"') {
                        return false;
                    }
                    let key_at = self.i;
                    let key = self.string();
                    self.ws();
                    if self.peek() == Some(b':') {
                        self.i += 1;
                    }
                    if key == *k {
                        if rest.is_empty() {
                            self.i = key_at;
                            return true;
                        }
                        return self.find(rest);
                    }
                    self.skip_value();
                    self.ws();
                    if self.peek() == Some(b',') {
                        self.i += 1;
                    } else {
                        return false;
                    }
                }
            }
            (Seg::Index(n), Some(b'[')) => {
                self.i += 1;
                for _ in 0..*n {
                    self.skip_value();
                    self.ws();
                    if self.peek() == Some(b',') {
                        self.i += 1;
                    } else {
                        return false;
                    }
                }
                self.find(rest)
            }
            _ => false,
        }
    }

    /// A string's content (escapes other than `\"` and `\\` kept as written), the cursor past it.
    fn string(&mut self) -> String {
        let mut out = Vec::new();
        self.i += 1;
        while let Some(c) = self.peek() {
            self.i += 1;
            match c {
                b'"' => break,
                b'\\' => {
                    if let Some(e) = self.peek() {
                        self.i += 1;
                        if e != b'"' && e != b'\\' {
                            out.push(b'\\');
                        }
                        out.push(e);
                    }
                }
                _ => out.push(c),
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    fn skip_value(&mut self) {
        self.ws();
        match self.peek() {
            Some(b'"') => {
                self.string();
            }
            Some(open @ (b'{' | b'[')) => {
                let close = if open == b'{' { b'}' } else { b']' };
                self.i += 1;
                loop {
                    self.ws();
                    match self.peek() {
                        None => return,
                        Some(c) if c == close => {
                            self.i += 1;
                            return;
                        }
                        Some(b',' | b':') => self.i += 1,
                        Some(_) => self.skip_value(),
                    }
                }
            }
            Some(_) => {
                while let Some(c) = self.peek() {
                    if c == b',' || c == b'}' || c == b']' || c.is_ascii_whitespace() {
                        break;
                    }
                    self.i += 1;
                }
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_common::format::record::ParallelGroup;
    use cohort_common::format::spec::{flatten, label_of, OutputMode, Setting};

    const EXAMPLE: &str = r#"{ "steps": [
        { "task": "List the modules in src/", "label": "scout", "model": "provider/id" },
        { "parallel": [ { "task": "Review {previous} for bugs", "label": "bugs" },
                        { "task": "Review {previous} for style", "label": "style" } ],
          "concurrency": 2 },
        { "task": "Summarize: {previous}", "thinking": "high", "tools": ["read"], "piArgs": ["--no-skills"] }
    ] }"#;

    #[test]
    fn numbers_the_unlabelled_members_of_one_agent_by_place() {
        let json = r#"{"steps":[{"parallel":[{"agent":"reviewer","task":"a"},{"agent":"reviewer","label":"style","task":"b"},{"agent":"scout","task":"c"},{"agent":"reviewer","task":"d"}]}]}"#;
        let chain = parse_chain(json).unwrap();
        let ChainStep::Parallel(p) = &chain[0] else {
            panic!("{:?}", chain[0]);
        };
        let labels: Vec<_> = p.parallel.iter().map(|t| t.label.as_deref()).collect();
        assert_eq!(
            labels,
            [Some("reviewer-1"), Some("style"), None, Some("reviewer-4")]
        );
        // A generated label an explicit one already takes is still two members of one label.
        let clash = r#"{"steps":[{"parallel":[{"agent":"r","task":"a"},{"agent":"r","task":"b"},{"label":"r-2","task":"c"}]}]}"#;
        let e = parse_json(clash, "f").unwrap_err();
        assert!(e.message.contains("labelled \"r-2\""), "{e:?}");
    }

    #[test]
    fn parses_the_design_example_and_flattens() {
        let chain = parse_chain(EXAMPLE).unwrap();
        assert_eq!(chain.len(), 3);
        let (flat, groups) = flatten(&chain);
        assert_eq!(flat.len(), 4);
        assert_eq!(
            groups,
            vec![ParallelGroup {
                start: 1,
                count: 2,
                step_index: 1
            }]
        );
        assert_eq!(flat[3].chain_index, 2);
        assert_eq!(flat[3].spec.pi_args, vec!["--no-skills"]);
        // Round trip through the launch-spec form.
        let json = serde_json::to_string(&chain).unwrap();
        let back: Vec<ChainStep> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, chain);
    }

    /// The upstream `dynamic-review.chain.json`, re-created from its documentation.
    pub(crate) const DYNAMIC_REVIEW: &str = r#"{
  "name": "dynamic-review",
  "description": "Find review targets, review each in parallel, then fix",
  "chain": [
    { "agent": "scout", "as": "targets", "outputSchema": { "type": "object" },
      "task": "List the files of {task} worth reviewing as {\"items\": [{\"path\", \"reason\"}]}" },
    { "expand": { "from": { "output": "targets", "path": "/items" }, "item": "target",
                  "key": "/path", "maxItems": 12 },
      "parallel": { "agent": "reviewer", "label": "Review {target.path}",
                    "task": "Review {target.path}: {target.reason}",
                    "outputSchema": { "type": "object" } },
      "collect": { "as": "reviews" },
      "concurrency": 4 },
    { "agent": "worker", "task": "Fix what these reviews found: {outputs.reviews}" }
  ]
}"#;

    #[test]
    fn fail_fast_is_a_key_of_groups_and_fan_outs() {
        let c = parse_json(
            r#"{"chain": [
  {"agent": "scout", "as": "t", "outputSchema": {"type": "array"}, "task": "x"},
  {"parallel": [{"task": "a"}, {"task": "b", "label": "b"}], "failFast": true},
  {"expand": {"from": {"output": "t"}}, "parallel": {"task": "{item}"},
   "collect": {"as": "c"}, "failFast": false}
]}"#,
            "f",
        )
        .unwrap();
        assert!(matches!(
            &c.steps[1],
            ChainStep::Parallel(p) if p.fail_fast == Some(true)
        ));
        assert!(matches!(
            &c.steps[2],
            ChainStep::Expand(e) if e.fail_fast == Some(false)
        ));
        let e = parse_json(
            r#"{"chain": [{"parallel": [{"task": "a"}], "failFast": "yes"}]}"#,
            "f",
        )
        .unwrap_err();
        assert_eq!(e.line, 1);
        assert!(e.message.contains("boolean"), "{}", e.message);
    }

    #[test]
    fn the_upstream_shape_parses_with_its_fan_out() {
        let c = parse_json(DYNAMIC_REVIEW, "file").unwrap();
        assert_eq!(c.name, "dynamic-review");
        assert_eq!(c.lines, vec![5, 7, 14]);
        let ChainStep::Expand(e) = &c.steps[1] else {
            panic!("{:?}", c.steps[1])
        };
        assert_eq!(e.expand.max_items, 12);
        assert_eq!(e.expand.item, "target");
        assert_eq!(e.parallel.agent.as_deref(), Some("reviewer"));
        assert_eq!(e.concurrency, Some(4));
        let no_max = DYNAMIC_REVIEW.replace(r#", "maxItems": 12"#, "");
        let ChainStep::Expand(e) = &parse_json(&no_max, "f").unwrap().steps[1] else {
            panic!()
        };
        assert_eq!(e.expand.max_items, DEFAULT_EXPAND_MAX_ITEMS);
    }

    #[test]
    fn every_task_key_reaches_the_spec() {
        let c = parse_json(
            r#"{"name":"n","chain":[{"agent":"a","task":"t","phase":"P","as":"x","output":"o.md",
"reads":"a.md, b.md","progress":true,"outputMode":"file-only","outputSchema":"s.json",
"cwd":"sub","skill":"lint,fmt","label":"L","model":"p/m:high","thinking":"low","tools":["read"],"piArgs":["--x"]},
{"task":"{outputs.x}","reads":false,"output":false,"skills":false}]}"#,
            "f",
        )
        .unwrap();
        let ChainStep::Task(t) = &c.steps[0] else {
            panic!()
        };
        assert_eq!(t.phase.as_deref(), Some("P"));
        assert_eq!(t.as_name.as_deref(), Some("x"));
        assert_eq!(t.output, Some(Setting::Value("o.md".into())));
        assert_eq!(
            t.reads,
            Some(Setting::Value(vec!["a.md".into(), "b.md".into()]))
        );
        assert_eq!(t.progress, Some(true));
        assert_eq!(t.output_mode, Some(OutputMode::FileOnly));
        assert_eq!(
            t.output_schema,
            Some(Value::from("s.json")),
            "a path until resolved"
        );
        assert_eq!(t.cwd.as_deref(), Some(std::path::Path::new("sub")));
        assert_eq!(
            t.skills,
            Some(Setting::Value(vec!["lint".into(), "fmt".into()]))
        );
        assert_eq!(t.model.as_deref(), Some("p/m:high"));
        let ChainStep::Task(u) = &c.steps[1] else {
            panic!()
        };
        assert_eq!(
            (&u.reads, &u.output, &u.skills),
            (
                &Some(Setting::Off),
                &Some(Setting::Off),
                &Some(Setting::Off)
            )
        );
    }

    #[test]
    fn count_makes_copies_labelled_apart() {
        let chain = parse_chain(
            r#"{"steps":[{"agent":"w","task":"a","count":3},{"parallel":[{"task":"b","label":"r","count":2},{"task":"c"}]}]}"#,
        )
        .unwrap();
        let (flat, groups) = flatten(&chain);
        let labels: Vec<String> = flat.iter().map(|f| label_of(&f.spec, f.index)).collect();
        assert_eq!(labels, ["w-0", "w-1", "w-2", "r-0", "r-1", "step-5"]);
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].count, 3);
        let one = parse_chain(r#"{"steps":[{"task":"a","count":1}]}"#).unwrap();
        assert!(matches!(one[0], ChainStep::Task(_)));
    }

    #[test]
    fn empty_tasks_take_the_upstream_defaults() {
        let chain = parse_chain(
            r#"{"steps":[{"agent":"a"},{"agent":"b","task":" "},{"parallel":[{"agent":"c"}]}]}"#,
        )
        .unwrap();
        let (flat, _) = flatten(&chain);
        let tasks: Vec<&str> = flat.iter().map(|f| f.spec.task.as_str()).collect();
        assert_eq!(tasks, ["{task}", "{previous}", "{previous}"]);
    }

    #[test]
    fn errors_name_the_line_and_the_key() {
        for (bad, line, needle) in [
            ("{\"steps\":[\n{\"tsk\":\"x\"}]}", 2, "step 0: unknown key `tsk`"),
            (
                "{\"steps\":[{\"task\":\"a\"},\n{\"parallel\":[{\"task\":\"b\"},\n{\"task\":\"c\",\n\"modle\":1}]}]}",
                4,
                "step 1, member 1: unknown key `modle`",
            ),
            ("[]", 1, "expected a JSON object"),
            (
                "{\"steps\":[{\"task\":\"a\",\"as\":\"t\",\"outputSchema\":{}},\n{\"expand\":{\"from\":{\"output\":\"t\"}},\"parallel\":{\"task\":\"x\"},\"collect\":{\"as\":\"c\"},\"concurrency\":33}]}",
                2,
                "at most 32 members alive at once, not 33",
            ),
            ("{\"steps\":[{\"parallel\":[]}]}", 1, "empty"),
            ("{\"steps\":[{\"parallel\":[{\"task\":\"a\"}],\"concurrency\":0}]}", 1, "at least 1"),
            ("{\"steps\":[]}", 1, "empty"),
            ("{\"stepz\":[]}", 1, "stepz"),
            ("{\n\"name\":\"x\",\n\"chain\":[{\"task\":\"a\"}],\n\"extra\":1}", 4, "unknown key `extra`"),
            ("{\"chain\":[{\"task\":\"a\",\n\"acceptance\":\"checked\"}]}", 2, "does not enforce acceptance"),
            ("{\"chain\":[{\"task\":\"a\",\n\"toolBudget\":{\"hard\":3}}]}", 2, "does not enforce tool-call budgets"),
            ("{\"chain\":[{\"task\":\"a\",\"count\":0}]}", 1, "`count` must be"),
            ("{\"chain\":[{\"task\":\"a\",\"outputMode\":\"both\"}]}", 1, "unknown variant `both`"),
            ("{\"chain\":[{\"task\":\"a\",\"output\":true}]}", 1, "`true` is not a value"),
            ("{\"chain\":[{\"task\":\"a\",\"skill\":\"x\",\"skills\":\"y\"}]}", 1, "not both"),
            ("{\"name\":\"x\",\"package\":\"a b\",\"chain\":[{\"task\":\"a\"}]}", 1, "`package`"),
            ("{\n\"steps\":[{\"task\":\"a\",\"sessionFile\":\"/s.jsonl\"}]}", 2, "use cohort-spawn --session"),
            ("{\"steps\":[{\"task\":\"x\",\"resolvedAgent\":{}}]}", 1, "resolvedAgent"),
            ("{\"steps\":[{\"task\":\"x\",\"agent\":\" \"}]}", 1, "empty `agent`"),
            (
                "{\"steps\":[{\"parallel\":[{\"task\":\"a\",\"label\":\"r\"},{\"task\":\"b\"},{\"task\":\"c\",\"label\":\"r\"}]}]}",
                1,
                "step 0: two members are labelled \"r\"",
            ),
            ("{\"steps\":[{\"parallel\":{\"task\":\"a\"}}]}", 1, "needs `expand`"),
            ("{\"steps\":[{\"expand\":{}}]}", 1, "needs a `parallel` template"),
            (
                "{\"steps\":[{\"task\":\"a\",\"as\":\"l\",\"outputSchema\":{}},\n{\"expand\":{\"from\":{\"output\":\"l\"},\"bogus\":1},\"parallel\":{\"task\":\"x\"},\"collect\":{\"as\":\"c\"}}]}",
                2,
                "`expand`: unknown key `bogus`",
            ),
            (
                "{\"steps\":[{\"task\":\"a\",\"as\":\"l\",\"outputSchema\":{}},\n{\"expand\":{\"from\":{\"output\":\"l\"}},\"parallel\":{\"task\":\"x\",\n\"as\":\"y\"},\"collect\":{\"as\":\"c\"}}]}",
                3,
                "`as` is not allowed",
            ),
            ("{\"steps\":[{\"task\":\"a\"}", 1, "not valid JSON"),
        ] {
            let e = parse_json(bad, "f").unwrap_err();
            assert!(e.message.contains(needle), "{bad}: {e:?}");
            assert_eq!(e.line, line, "{bad}: {e:?}");
        }
    }

    #[test]
    fn distinct_labels_in_a_group_are_accepted() {
        let ok = r#"{"steps":[{"task":"x","label":"r"},{"parallel":[{"task":"a","label":"r"},{"task":"b","label":"s"},{"task":"c"}]}]}"#;
        assert!(parse_chain(ok).is_ok());
    }

    #[test]
    fn a_chain_file_may_name_agents_but_not_resolve_them() {
        let chain = parse_chain(r#"{"steps":[{"task":"x","agent":"scout"}]}"#).unwrap();
        let (flat, _) = flatten(&chain);
        assert_eq!(flat[0].spec.agent.as_deref(), Some("scout"));
        assert_eq!(label_of(&flat[0].spec, 0), "scout");
    }

    #[test]
    fn the_locator_finds_nested_values() {
        let text = "{\"a\": [1,\n {\"b\": \"x\\\"y\",\n  \"c\": {\"d\": [true, null]}}]}";
        let at = Locator { text };
        assert_eq!(at.line(&[Seg::Key("a"), Seg::Index(1), Seg::Key("c")]), 3);
        assert_eq!(at.line(&[Seg::Key("a"), Seg::Index(1), Seg::Key("b")]), 2);
        assert_eq!(at.line(&[Seg::Key("zz")]), 1);
    }
}
