//! The checks of a chain against the file system, at spawn, before anything runs
//! (`docs/chain.md`, "Checks at spawn"): each `outputSchema` read (a path is relative to the
//! chain file's directory) and compiled, each step `cwd` resolved against the run's cwd and
//! required to be a directory, each skill name resolved to its `SKILL.md` (passed to Pi as
//! `--skill PATH`), and a `worktree` group's cwd required to be inside a git work tree.
//!
//! [`resolve`] rewrites the steps so the launch spec holds only resolved values: schemas
//! themselves, absolute cwds, skill paths in `piArgs`.

use std::path::{Path, PathBuf};

use cohort_common::format::spec::{ChainStep, Setting, TaskSpec};
use serde_json::Value;

/// Where a chain's relative names are resolved.
#[derive(Clone, Debug)]
pub struct Places<'a> {
    /// The directory of the chain file (`outputSchema` paths are relative to it).
    pub chain_dir: &'a Path,
    /// The run's cwd (step `cwd`s are relative to it; skills and git are looked up from it).
    pub run_cwd: &'a Path,
    /// The Pi profile (`$PI_CODING_AGENT_DIR`), for the user's skills.
    pub profile: &'a Path,
}

/// Resolve every step of `steps` in place. The error is the chain step it is about and what
/// is wrong, one line naming the path.
pub fn resolve(steps: &mut [ChainStep], at: &Places) -> Result<(), (usize, String)> {
    for (i, step) in steps.iter_mut().enumerate() {
        resolve_step(step, at).map_err(|m| (i, m))?;
    }
    Ok(())
}

fn resolve_step(step: &mut ChainStep, at: &Places) -> Result<(), String> {
    match step {
        ChainStep::Task(t) => resolve_task(t, at),
        ChainStep::Parallel(p) => {
            for t in &mut p.parallel {
                resolve_task(t, at)?;
            }
            if p.worktree {
                let run_cwd = canonical_dir(at.run_cwd)?;
                if let Some(t) = p
                    .parallel
                    .iter()
                    .find(|t| t.cwd.as_ref().is_some_and(|c| *c != run_cwd))
                {
                    return Err(format!(
                        "a `worktree` group's members run in their worktree: member {:?} may not set its own `cwd`",
                        t.label.as_deref().or(t.agent.as_deref()).unwrap_or("")
                    ));
                }
                in_git_work_tree(&run_cwd, at.profile)?;
            }
            Ok(())
        }
        ChainStep::Expand(e) => {
            resolve_task(&mut e.parallel, at)?;
            if let Some(s) = e.collect.output_schema.take() {
                e.collect.output_schema = Some(
                    schema(s, at.chain_dir).map_err(|m| format!("`collect.outputSchema`: {m}"))?,
                );
            }
            Ok(())
        }
    }
}

fn resolve_task(t: &mut TaskSpec, at: &Places) -> Result<(), String> {
    if let Some(s) = t.output_schema.take() {
        t.output_schema =
            Some(schema(s, at.chain_dir).map_err(|m| format!("`outputSchema`: {m}"))?);
    }
    if let Some(c) = &t.cwd {
        let dir = at.run_cwd.join(c);
        t.cwd = Some(canonical_dir(&dir).map_err(|m| format!("`cwd`: {m}"))?);
    }
    if let Some(Setting::Value(names)) = &t.skills {
        for name in names {
            let path = find_skill(name, at)?;
            t.pi_args
                .extend(["--skill".to_string(), path.display().to_string()]);
        }
    }
    Ok(())
}

/// A schema as the launch spec holds it (the schema itself), checked to compile: a string is a
/// path (relative to `base`) to a JSON file; an object or boolean is the schema.
pub fn schema(value: Value, base: &Path) -> Result<Value, String> {
    let (schema, from) = match value {
        Value::String(p) => {
            let path = base.join(&p);
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("cannot read the schema file {}: {e}", path.display()))?;
            let v: Value = serde_json::from_str(&text)
                .map_err(|e| format!("{}: not valid JSON: {e}", path.display()))?;
            (v, Some(path))
        }
        v => (v, None),
    };
    let shown = from
        .map(|p| format!("{}: ", p.display()))
        .unwrap_or_default();
    if !(schema.is_object() || schema.is_boolean()) {
        return Err(format!("{shown}a JSON Schema is an object (or true/false)"));
    }
    jsonschema::validator_for(&schema)
        .map_err(|e| format!("{shown}not a valid JSON Schema: {e}"))?;
    Ok(schema)
}

fn canonical_dir(dir: &Path) -> Result<PathBuf, String> {
    match std::fs::canonicalize(dir) {
        Ok(c) if c.is_dir() => Ok(c),
        Ok(_) => Err(format!("{} is not a directory", dir.display())),
        Err(e) => Err(format!("{}: {e}", dir.display())),
    }
}

/// The `SKILL.md` of skill `name`: `DIR/NAME/SKILL.md` in the first of
/// [`crate::skills::chain_skill_dirs`] that has it and may be trusted. A name with a `/` is a
/// path (relative to the run's cwd) to a skill directory or file.
fn find_skill(name: &str, at: &Places) -> Result<PathBuf, String> {
    if name.contains('/') {
        let p = at.run_cwd.join(name);
        let file = if p.is_dir() { p.join("SKILL.md") } else { p };
        return if file.is_file() {
            Ok(file)
        } else {
            Err(format!("skill {name:?}: {} does not exist", file.display()))
        };
    }
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let dirs = crate::skills::chain_skill_dirs(at.run_cwd, at.profile, home.as_deref());
    crate::skills::find(name, &dirs).ok_or_else(|| {
        format!(
            "skill {name:?} not found: no {name}/SKILL.md in {} or {}",
            dirs[0].path.display(),
            at.profile.join("skills").display()
        )
    })
}

/// Whether `dir` is inside a git work tree (`git rev-parse --show-toplevel`, with git's
/// clean environment, [`cohort_common::os::git`]), and the setup hook pi-cohort's settings
/// name, if any, is usable ([`cohort_common::worktree::load_setup_hook`]).
fn in_git_work_tree(dir: &Path, profile: &Path) -> Result<(), String> {
    let out = cohort_common::os::git::run(dir, &["rev-parse", "--show-toplevel"])
        .map_err(|e| format!("`worktree: true` needs git: {e}"))?;
    if !out.ok {
        return Err(format!(
            "`worktree: true` needs the run's cwd in a git repository; {} is not in one",
            dir.display()
        ));
    }
    let top = PathBuf::from(out.stdout.trim_end_matches('\n'));
    cohort_common::worktree::load_setup_hook(profile, &top)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_common::format::spec::ParallelSpec;

    #[test]
    fn schemas_are_read_and_compiled() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("s.json"), r#"{"type":"array"}"#).unwrap();
        std::fs::write(d.path().join("bad.json"), r#"{"type":"nope"}"#).unwrap();
        std::fs::write(d.path().join("list.json"), r#"[1]"#).unwrap();
        assert_eq!(
            schema(Value::from("s.json"), d.path()).unwrap(),
            serde_json::json!({"type":"array"})
        );
        assert!(schema(serde_json::json!({"type":"object"}), d.path()).is_ok());
        for (v, needle) in [
            (Value::from("bad.json"), "not a valid JSON Schema"),
            (Value::from("list.json"), "is an object"),
            (Value::from("gone.json"), "cannot read the schema file"),
            (
                serde_json::json!({"minimum":"x"}),
                "not a valid JSON Schema",
            ),
        ] {
            let e = schema(v.clone(), d.path()).unwrap_err();
            assert!(e.contains(needle), "{v}: {e}");
        }
    }

    #[test]
    fn cwd_skills_and_worktree_are_resolved_or_refused() {
        let d = tempfile::tempdir().unwrap();
        let run = d.path().join("run");
        let profile = d.path().join("profile");
        std::fs::create_dir_all(run.join("sub")).unwrap();
        std::fs::create_dir_all(run.join(".pi/skills/lint")).unwrap();
        std::fs::write(run.join(".pi/skills/lint/SKILL.md"), "x").unwrap();
        std::fs::create_dir_all(profile.join("skills/fmt")).unwrap();
        std::fs::write(profile.join("skills/fmt/SKILL.md"), "y").unwrap();
        let at = Places {
            chain_dir: d.path(),
            run_cwd: &run,
            profile: &profile,
        };
        let task = |cwd: Option<&str>, skills: &[&str]| TaskSpec {
            task: "t".into(),
            cwd: cwd.map(PathBuf::from),
            skills: Some(Setting::Value(
                skills.iter().map(|s| s.to_string()).collect(),
            )),
            ..Default::default()
        };
        let mut steps = vec![ChainStep::Task(task(Some("sub"), &["lint", "fmt"]))];
        resolve(&mut steps, &at).unwrap();
        let ChainStep::Task(t) = &steps[0] else {
            panic!()
        };
        assert_eq!(t.cwd, Some(run.join("sub").canonicalize().unwrap()));
        assert_eq!(t.pi_args[0], "--skill");
        assert!(
            t.pi_args[1].ends_with(".pi/skills/lint/SKILL.md"),
            "{:?}",
            t.pi_args
        );
        assert!(
            t.pi_args[3].ends_with("profile/skills/fmt/SKILL.md"),
            "{:?}",
            t.pi_args
        );
        for (step, needle) in [
            (task(Some("missing"), &[]), "`cwd`"),
            (task(None, &["nope"]), "skill \"nope\" not found"),
        ] {
            let e = resolve(&mut [ChainStep::Task(step)], &at).unwrap_err();
            assert!(e.1.contains(needle), "{e:?}");
        }
        // `run` is not in a git repository (a temp dir).
        let group = || {
            ChainStep::Parallel(ParallelSpec {
                parallel: vec![task(None, &[])],
                worktree: true,
                ..Default::default()
            })
        };
        let e = resolve(&mut [group()], &at).unwrap_err();
        assert!(
            e.1.contains("needs the run's cwd in a git repository"),
            "{e:?}"
        );
        let git = std::process::Command::new("git")
            .args(["init", "-q"])
            .current_dir(&run)
            .status();
        if git.is_ok_and(|s| s.success()) {
            resolve(&mut [group()], &at).unwrap();
            // A setup hook pi-cohort's settings name must be usable.
            let config = cohort_common::worktree::config_file(&profile);
            std::fs::create_dir_all(config.parent().unwrap()).unwrap();
            std::fs::write(&config, r#"{"worktreeSetupHook":"setup.sh"}"#).unwrap();
            let e = resolve(&mut [group()], &at).unwrap_err();
            assert!(e.1.contains("config.json: `worktreeSetupHook`"), "{e:?}");
            assert!(e.1.contains("bare name"), "{e:?}");
        }
    }
}
