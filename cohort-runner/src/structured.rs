//! Structured output (`docs/chain.md`, "Structured output"): a step with `outputSchema` must
//! answer with JSON that validates against the schema; the parsed value is what later steps get.
//!
//! cohort runs plain Pi, with no tool to capture the value, so the answer itself is the value:
//! [`parse_answer`] takes a bare JSON document, or one fenced code block (```` ```json ````
//! or ```` ``` ````) and nothing around it; prose is never searched for JSON. [`validate`]
//! checks it with the `jsonschema` crate and returns at most [`MAX_ERRORS`] `PATH: message`
//! lines. [`instruction`] is what the step's task is told. All pure.

use serde_json::Value;

/// Most validation errors recorded for one step (the upstream's cap).
pub const MAX_ERRORS: usize = 8;

/// The JSON value of a step's answer (pure): the trimmed answer as one JSON document, else the
/// content of the one fenced code block the trimmed answer consists of.
///
/// Errors: a one-line reason naming what was wrong.
pub fn parse_answer(text: &str) -> Result<Value, String> {
    let t = text.trim();
    if let Ok(v) = serde_json::from_str::<Value>(t) {
        return Ok(v);
    }
    let body = fenced_body(t).ok_or_else(|| {
        "the answer is not JSON (a bare JSON document, or one ```json block and nothing else)"
            .to_string()
    })?;
    serde_json::from_str(body).map_err(|e| format!("the answer's ```json block is not JSON: {e}"))
}

/// The body of `t` when `t` is exactly one fenced block: a first line of three backticks and
/// an optional `json` tag, a last line of three backticks, and no other fence between.
fn fenced_body(t: &str) -> Option<&str> {
    let (first, rest) = t.split_once('\n')?;
    let tag = first.strip_prefix("```")?.trim();
    if !(tag.is_empty() || tag.eq_ignore_ascii_case("json")) {
        return None;
    }
    let body = rest.trim_end().strip_suffix("```")?;
    (!body.contains("```")).then_some(body)
}

/// Check `value` against `schema` (pure). A schema that does not compile is itself a failure.
///
/// Errors: at most [`MAX_ERRORS`] lines `PATH: message` (PATH a JSON Pointer, `/` for the
/// root), and a last line saying how many more there were.
pub fn validate(schema: &Value, value: &Value) -> Result<(), Vec<String>> {
    let validator = jsonschema::validator_for(schema)
        .map_err(|e| vec![format!("the schema is invalid: {e}")])?;
    let all: Vec<String> = validator
        .iter_errors(value)
        .map(|e| {
            let path = e.instance_path().to_string();
            let path = if path.is_empty() { "/".into() } else { path };
            format!("{path}: {e}")
        })
        .collect();
    if all.is_empty() {
        return Ok(());
    }
    let more = all.len().saturating_sub(MAX_ERRORS);
    let mut errors: Vec<String> = all.into_iter().take(MAX_ERRORS).collect();
    if more > 0 {
        errors.push(format!("… and {more} more"));
    }
    Err(errors)
}

/// What a step with a schema is told, after its task (pure): answer with JSON only, and the
/// schema itself.
pub fn instruction(schema: &Value) -> String {
    format!(
        "Your final answer must be a single JSON value, and nothing else (no prose; one ```json \
         block is also accepted), that validates against this JSON Schema:\n{}",
        serde_json::to_string_pretty(schema).unwrap_or_else(|_| schema.to_string())
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_answer_is_bare_json_or_one_fence() {
        assert_eq!(parse_answer(" {\"a\":1}\n").unwrap(), json!({"a": 1}));
        assert_eq!(parse_answer("```json\n[1,2]\n```").unwrap(), json!([1, 2]));
        assert_eq!(parse_answer("```\n\"x\"\n```\n").unwrap(), json!("x"));
        for bad in [
            "Here it is: {\"a\":1}",
            "```json\n[1]\n```\nand more",
            "```json\n[1]\n```\n```json\n[2]\n```",
            "```yaml\na: 1\n```",
            "",
        ] {
            assert!(parse_answer(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn validation_names_the_path_and_caps_the_errors() {
        let schema = json!({"type": "object", "required": ["items"],
                            "properties": {"items": {"type": "array", "items": {"type": "string"}}}});
        assert!(validate(&schema, &json!({"items": ["a"]})).is_ok());
        let e = validate(&schema, &json!({"items": [1]})).unwrap_err();
        assert_eq!(e.len(), 1);
        assert!(e[0].starts_with("/items/0: "), "{e:?}");
        let e = validate(&schema, &json!([])).unwrap_err();
        assert!(e[0].starts_with("/: "), "{e:?}");
        let many = json!({"type": "array", "items": {"type": "string"}});
        let e = validate(&many, &json!([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])).unwrap_err();
        assert_eq!(e.len(), MAX_ERRORS + 1);
        assert_eq!(e[MAX_ERRORS], "… and 2 more");
        let e = validate(&json!({"type": 12}), &json!(1)).unwrap_err();
        assert!(e[0].starts_with("the schema is invalid"), "{e:?}");
    }

    #[test]
    fn the_instruction_carries_the_schema() {
        let i = instruction(&json!({"type": "object"}));
        assert!(i.contains("\"type\": \"object\""), "{i}");
    }
}
