//! Markdown files with YAML frontmatter: the shape of agent files and saved `.chain.md` chains
//! (`docs/agents.md`).
//!
//! A file opens with a line `---`, then YAML, then a closing `---` line, then the body. [`split`]
//! is pure and reports problems with the 1-based line they are on, so that every error about a
//! user's file can say "FILE:LINE". The YAML is read with `serde_yaml_ng`, a maintained fork of
//! `serde_yaml`.

use serde_yaml_ng::{Mapping, Value};

/// A problem in a file's text, with the 1-based line it is on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextError {
    /// The 1-based line number.
    pub line: usize,
    /// What is wrong, one line.
    pub message: String,
}

impl TextError {
    /// A problem on `line`.
    pub fn at(line: usize, message: impl Into<String>) -> Self {
        TextError {
            line,
            message: message.into(),
        }
    }
}

/// A file split into its frontmatter and body.
#[derive(Clone, Debug, PartialEq)]
pub struct Document {
    /// The frontmatter, a YAML mapping.
    pub fields: Mapping,
    /// The frontmatter's lines, as written (to find the line a key is on).
    pub yaml: String,
    /// The text after the closing `---` line.
    pub body: String,
    /// The 1-based line number of the body's first line.
    pub body_line: usize,
}

impl Document {
    /// The 1-based line of the file on which frontmatter key `key` is written (its first
    /// occurrence at the start of a line), else the opening `---` line.
    pub fn line_of(&self, key: &str) -> usize {
        self.yaml
            .lines()
            .position(|l| {
                l.strip_prefix(key)
                    .is_some_and(|rest| rest.trim_start().starts_with(':'))
            })
            .map(|i| i + 2)
            .unwrap_or(1)
    }

    /// Field `key` as a string, if present. A non-string value is an error on its line.
    pub fn string(&self, key: &str) -> Result<Option<String>, TextError> {
        match self.fields.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(Value::Number(n)) => Ok(Some(n.to_string())),
            Some(_) => Err(TextError::at(
                self.line_of(key),
                format!("`{key}` must be a string"),
            )),
        }
    }

    /// Field `key` as a boolean, if present. Anything but `true`/`false` is an error.
    pub fn boolean(&self, key: &str) -> Result<Option<bool>, TextError> {
        match self.fields.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(TextError::at(
                self.line_of(key),
                format!("`{key}` must be true or false"),
            )),
        }
    }

    /// Field `key` as a list of names: a comma-separated string or a YAML list of strings.
    /// Empty entries are dropped.
    pub fn list(&self, key: &str) -> Result<Option<Vec<String>>, TextError> {
        let bad = || {
            TextError::at(
                self.line_of(key),
                format!("`{key}` must be a comma-separated string or a list of strings"),
            )
        };
        match self.fields.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(split_list(s))),
            Some(Value::Sequence(items)) => items
                .iter()
                .map(|v| v.as_str().map(|s| s.trim().to_string()).ok_or_else(bad))
                .filter(|r| r.as_ref().map_or(true, |s| !s.is_empty()))
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(_) => Err(bad()),
        }
    }

    /// The keys of the frontmatter, as written (non-string keys shown as YAML).
    pub fn keys(&self) -> Vec<String> {
        self.fields
            .keys()
            .map(|k| match k {
                Value::String(s) => s.clone(),
                other => serde_yaml_ng::to_string(other)
                    .unwrap_or_default()
                    .trim()
                    .to_string(),
            })
            .collect()
    }
}

/// A comma-separated list, trimmed, without empty entries (pure).
pub fn split_list(s: &str) -> Vec<String> {
    s.split(',')
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
        .collect()
}

/// Split `text` into frontmatter and body (pure). Errors: no opening `---` on the first line,
/// no closing `---`, YAML that does not parse (at its line), frontmatter that is not a mapping.
pub fn split(text: &str) -> Result<Document, TextError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    let first = lines.next().unwrap_or("");
    if first.trim_end() != "---" {
        return Err(TextError::at(
            1,
            "no frontmatter: the file must start with a line `---`",
        ));
    }
    let mut yaml = String::new();
    let mut offset = first.len();
    let mut closed = None;
    for (i, line) in lines.enumerate() {
        offset += line.len();
        if line.trim_end() == "---" {
            closed = Some(i + 2);
            break;
        }
        yaml.push_str(line);
    }
    let Some(closing_line) = closed else {
        return Err(TextError::at(
            1,
            "the frontmatter opened with `---` on line 1 has no closing `---` line",
        ));
    };
    let fields = if yaml.trim().is_empty() {
        Mapping::new()
    } else {
        match serde_yaml_ng::from_str::<Value>(&yaml) {
            Ok(Value::Mapping(m)) => m,
            Ok(Value::Null) => Mapping::new(),
            Ok(_) => {
                return Err(TextError::at(
                    2,
                    "the frontmatter must be YAML `key: value` lines",
                ))
            }
            Err(e) => {
                let line = e.location().map(|l| l.line() + 1).unwrap_or(2);
                let msg = e.to_string();
                // serde_yaml_ng appends " at line L column C" (of the YAML alone): drop it, the
                // file's line is given instead.
                let msg = msg.split(" at line ").next().unwrap_or(&msg).to_string();
                return Err(TextError::at(line, format!("invalid YAML: {msg}")));
            }
        }
    };
    Ok(Document {
        fields,
        yaml,
        body: text[offset.min(text.len())..].to_string(),
        body_line: closing_line + 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_fields_and_body_with_line_numbers() {
        let d = split("---\nname: a\ntools: read, bash\n---\n\nBody line.\n").unwrap();
        assert_eq!(d.string("name").unwrap().as_deref(), Some("a"));
        assert_eq!(
            d.list("tools").unwrap().unwrap(),
            vec!["read".to_string(), "bash".to_string()]
        );
        assert_eq!(d.body, "\nBody line.\n");
        assert_eq!(d.body_line, 5);
        assert_eq!(d.line_of("tools"), 3);
        assert_eq!(d.keys(), vec!["name", "tools"]);
    }

    #[test]
    fn a_yaml_list_is_a_list() {
        let d = split("---\ntools:\n  - read\n  - grep\n---\n").unwrap();
        assert_eq!(d.list("tools").unwrap().unwrap(), vec!["read", "grep"]);
        let d = split("---\ntools: {a: 1}\n---\n").unwrap();
        assert_eq!(d.list("tools").unwrap_err().line, 2);
    }

    #[test]
    fn broken_frontmatter_names_its_line() {
        assert_eq!(split("name: a\n").unwrap_err().line, 1);
        let e = split("---\nname: a\n\nbody\n").unwrap_err();
        assert!(e.message.contains("no closing"), "{e:?}");
        // Line 3 of the file is the bad YAML (a tab-less mapping broken by a stray colon).
        let e = split("---\nname: a\ndescription: [unclosed\n---\nbody\n").unwrap_err();
        assert!(e.message.starts_with("invalid YAML"), "{e:?}");
        assert!((3..=4).contains(&e.line), "{e:?}");
        let e = split("---\n- a\n- b\n---\n").unwrap_err();
        assert_eq!(e.line, 2);
        let d = split("---\ninherit: yes please\n---\n").unwrap();
        assert_eq!(d.boolean("inherit").unwrap_err().line, 2);
    }
}
