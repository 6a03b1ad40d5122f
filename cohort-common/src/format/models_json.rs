//! The profile's `models.json` (`$PI_CODING_AGENT_DIR/models.json`, Pi's custom providers and
//! models), as far as cohort reads it: which models it gives prices (`cost`, US dollars per
//! million tokens), for the runner's cost of a message, and whether a model's price can be
//! known at all, for spawn's `--max-cost` check. Pi reads the file with comments allowed, and
//! so does this parser.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::Value;

/// One set of prices: US dollars per million tokens.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rates {
    /// Per million input tokens.
    pub input: f64,
    /// Per million output tokens.
    pub output: f64,
    /// Per million tokens read from the cache.
    pub cache_read: f64,
    /// Per million tokens written to the cache.
    pub cache_write: f64,
}

/// A pricing tier (Pi 1.x): its rates apply to the whole request when the request's input
/// (input, cache reads and writes) exceeds `input_tokens_above`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Tier {
    /// The threshold, in tokens.
    pub input_tokens_above: f64,
    /// The tier's rates.
    #[serde(flatten)]
    pub rates: Rates,
}

/// A model's `cost` in `models.json`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Prices {
    /// The base rates.
    #[serde(flatten)]
    pub rates: Rates,
    /// Tiers by request size (Pi 1.x; none in Pi 0.73).
    #[serde(default)]
    pub tiers: Vec<Tier>,
}

/// The models with prices in a `models.json` text, by (provider, model id) (pure). Pi reads
/// the file with comments allowed, so `//` and `/* */` comments are skipped; an entry whose
/// `cost` does not have all four rates is left out, as Pi refuses it.
pub fn parse_models_json(text: &str) -> HashMap<(String, String), Prices> {
    let mut out = HashMap::new();
    let Ok(doc) = serde_json::from_str::<Value>(&strip_comments(text)) else {
        return out;
    };
    let Some(providers) = doc.get("providers").and_then(Value::as_object) else {
        return out;
    };
    for (provider, conf) in providers {
        for m in conf
            .get("models")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let (Some(id), Some(cost)) = (m.get("id").and_then(Value::as_str), m.get("cost"))
            else {
                continue;
            };
            if let Ok(p) = serde_json::from_value::<Prices>(cost.clone()) {
                out.insert((provider.clone(), id.to_string()), p);
            }
        }
    }
    out
}

/// `text` without `//` line comments and `/* */` block comments outside strings (pure).
fn strip_comments(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let (mut i, mut in_string) = (0, false);
    while i < b.len() {
        let c = b[i];
        if in_string {
            out.push(c);
            if c == b'\\' && i + 1 < b.len() {
                out.push(b[i + 1]);
                i += 1;
            } else if c == b'"' {
                in_string = false;
            }
        } else if c == b'"' {
            in_string = true;
            out.push(c);
        } else if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
            continue;
        } else if b[i..].starts_with(b"/*") {
            i += 2;
            while i < b.len() && !b[i..].starts_with(b"*/") {
                i += 1;
            }
            i += 2;
            continue;
        } else {
            out.push(c);
        }
        i += 1;
    }
    String::from_utf8(out).unwrap_or_default()
}

/// The model entries a `models.json` text defines, by (provider, model id), each with whether
/// it has prices Pi accepts (pure; entries without an `id` are skipped).
pub fn model_entries(text: &str) -> HashMap<(String, String), bool> {
    let priced = parse_models_json(text);
    let mut out = HashMap::new();
    let Ok(doc) = serde_json::from_str::<Value>(&strip_comments(text)) else {
        return out;
    };
    for (provider, conf) in doc
        .get("providers")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        for m in conf
            .get("models")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(id) = m.get("id").and_then(Value::as_str) {
                let key = (provider.clone(), id.to_string());
                let has = priced.contains_key(&key);
                out.insert(key, has);
            }
        }
    }
    out
}

/// Whether the price of `model` (Pi's `--model`: `provider/id`, or a bare `id`) can be known
/// (pure), given the entries of the profile's `models.json` ([`model_entries`]): an entry of
/// that model with prices is priced from them; an entry without prices is priced 0 by Pi,
/// which cannot be told from a free model, so its price is unknown; a model with no entry is
/// one of Pi's own catalog, which Pi prices (a model Pi does not know fails at its start).
/// A bare `id` is looked up under every provider.
pub fn price_known(entries: &HashMap<(String, String), bool>, model: &str) -> bool {
    let matching: Vec<bool> = match model.split_once('/') {
        Some((provider, id)) => entries
            .get(&(provider.to_string(), id.to_string()))
            .copied()
            .into_iter()
            .collect(),
        None => entries
            .iter()
            .filter(|((_, id), _)| id == model)
            .map(|(_, has)| *has)
            .collect(),
    };
    matching.iter().all(|has| *has)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_price_is_known_from_prices_or_pis_catalog_and_never_from_an_entry_without_one() {
        let text = r#"{"providers": {"fake": {"models": [
            {"id": "metered", "cost": {"input": 3, "output": 15, "cacheRead": 0.3, "cacheWrite": 3.75}},
            {"id": "plain"}
        ]}}}"#;
        let e = model_entries(text);
        assert_eq!(e.len(), 2);
        assert!(price_known(&e, "fake/metered"));
        assert!(price_known(&e, "metered"));
        assert!(!price_known(&e, "fake/plain"));
        assert!(!price_known(&e, "plain"));
        assert!(price_known(&e, "anthropic/claude-sonnet-4"), "Pi's catalog");
        assert!(price_known(&model_entries("not json"), "fake/plain"));
    }
}
