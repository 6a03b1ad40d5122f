//! The run flags checked the way an agent file's fields are (`agents/fields.rs`): `--thinking`
//! must be one of Pi's thinking levels and each `--tools` name a tool name, with the same rules
//! and messages, so a typo on the command line is refused (exit 2) instead of reaching Pi as a
//! child without tools or without thinking.

use crate::agents::fields::{check_tool_name, THINKING_LEVELS};

/// Why `--thinking LEVEL` / `--tools NAMES` cannot run, if they cannot (pure): one line naming
/// the flag. A tool name is checked as in a file that loads extensions (the profile's
/// extensions may register it; the runner's tool check proves it at start), so whitespace in a
/// name, a builtin in another case, an MCP selector or a path is refused.
pub(super) fn check(thinking: Option<&str>, tools: Option<&[String]>) -> Result<(), String> {
    if let Some(t) = thinking {
        if !THINKING_LEVELS.contains(&t.trim()) {
            return Err(format!(
                "--thinking is {t:?}; expected one of {}",
                THINKING_LEVELS.join(", ")
            ));
        }
    }
    for name in tools.unwrap_or_default() {
        check_tool_name(name.trim(), true).map_err(|why| format!("--tools: {why}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check;

    fn tools(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_thinking_level_outside_pis_is_refused() {
        assert_eq!(check(Some("high"), None), Ok(()));
        let e = check(Some("bogus"), None).unwrap_err();
        assert!(
            e.starts_with("--thinking is \"bogus\"; expected one of off,"),
            "{e}"
        );
    }

    #[test]
    fn tool_names_follow_the_file_rules() {
        assert_eq!(check(None, Some(&tools(&["read", "bash"]))), Ok(()));
        assert_eq!(check(None, Some(&tools(&["web_search"]))), Ok(()));
        let e = check(None, Some(&tools(&["read bash"]))).unwrap_err();
        assert!(
            e.starts_with(
                "--tools: \"read bash\" is not a tool name; separate tool names with commas"
            ),
            "{e}"
        );
        let e = check(None, Some(&tools(&["Read"]))).unwrap_err();
        assert!(e.contains("write `read`"), "{e}");
        let e = check(None, Some(&tools(&["./web.ts"]))).unwrap_err();
        assert!(e.contains("is a path"), "{e}");
    }
}
