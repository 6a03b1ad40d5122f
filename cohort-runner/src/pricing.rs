//! What one assistant message cost: Pi's own figure when its event carries one, else the
//! model's prices in the profile's `models.json`, else unknown.
//!
//! Both Pi generations put `usage.cost` on every assistant message, computed from the model's
//! prices (Pi's catalog, or the `cost` of a `models.json` entry: dollars per million tokens of
//! `input`, `output`, `cacheRead`, `cacheWrite`). A model without prices gets a cost of 0 from
//! Pi, which cannot be told from a free model, so a zero from Pi for tokens is not taken as
//! known: cohort looks the model up in `models.json` (`providers.<provider>.models[]` by `id`)
//! and, when the entry has prices, computes the cost as Pi does ([`price`]); without prices
//! the cost is unknown. [`decide`] is that rule, over data; [`PriceBook`] reads `models.json`
//! once, and only when a message needs it.

use std::collections::HashMap;
use std::path::PathBuf;

use cohort_common::format::cost::CostSource;
pub use cohort_common::format::models_json::{parse_models_json, Prices, Rates, Tier};
use cohort_common::os::files;

/// A message's token counts as Pi reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tokens {
    /// `input`.
    pub input: u64,
    /// `output`.
    pub output: u64,
    /// `cacheRead`.
    pub cache_read: u64,
    /// `cacheWrite`.
    pub cache_write: u64,
    /// `cacheWrite1h` (Pi 1.x): the share of `cacheWrite` kept for an hour.
    pub cache_write_1h: u64,
    /// `totalTokens`.
    pub total: u64,
}

impl Tokens {
    fn any(&self) -> bool {
        self.input + self.output + self.cache_read + self.cache_write + self.total > 0
    }
}

/// The cost of `t` at `p`, in dollars (pure): Pi's `calculateCost`. The highest tier whose
/// threshold the request's input exceeds replaces the base rates; tokens written to the cache
/// for an hour cost twice the input rate; every part is rate / 1,000,000 × tokens. Without
/// tiers and hour-long writes (all Pi 0.73 knows) this is Pi 0.73's formula too.
pub fn price(p: &Prices, t: &Tokens) -> f64 {
    let request_input = (t.input + t.cache_read + t.cache_write) as f64;
    let mut rates = &p.rates;
    let mut threshold = -1.0;
    for tier in &p.tiers {
        if request_input > tier.input_tokens_above && tier.input_tokens_above > threshold {
            rates = &tier.rates;
            threshold = tier.input_tokens_above;
        }
    }
    let long_write = t.cache_write_1h.min(t.cache_write) as f64;
    let short_write = t.cache_write as f64 - long_write;
    let input = rates.input / 1e6 * t.input as f64;
    let output = rates.output / 1e6 * t.output as f64;
    let cache_read = rates.cache_read / 1e6 * t.cache_read as f64;
    let cache_write = (rates.cache_write * short_write + rates.input * 2.0 * long_write) / 1e6;
    input + output + cache_read + cache_write
}

/// A message's cost (pure): `(dollars, source)`, the source `None` when no token was counted
/// (nothing to price); `None` when unknown. `reported` is Pi's `usage.cost.total`; `prices`
/// gives the model's `models.json` prices, asked only when Pi's figure is absent or zero.
pub fn decide(
    t: &Tokens,
    reported: Option<f64>,
    prices: impl FnOnce() -> Option<Prices>,
) -> Option<(f64, Option<CostSource>)> {
    if !t.any() {
        return Some((0.0, None));
    }
    let reported = reported.filter(|c| c.is_finite() && *c >= 0.0);
    if let Some(c) = reported.filter(|c| *c > 0.0) {
        return Some((c, Some(CostSource::Pi)));
    }
    prices().map(|p| (price(&p, t), Some(CostSource::Prices)))
}

/// The prices of a profile's `models.json`, read on first use (once per step's reader).
#[derive(Debug, Default)]
pub struct PriceBook {
    /// `models.json`; `None`: no profile, no prices.
    path: Option<PathBuf>,
    loaded: Option<HashMap<(String, String), Prices>>,
}

impl PriceBook {
    /// The prices in the profile `profile_dir` (its `models.json`).
    pub fn of_profile(profile_dir: &std::path::Path) -> PriceBook {
        PriceBook {
            path: Some(profile_dir.join("models.json")),
            loaded: None,
        }
    }

    /// The prices of `model` of `provider`, when `models.json` gives them. A file that cannot
    /// be read or parsed gives none.
    pub fn get(&mut self, provider: &str, model: &str) -> Option<Prices> {
        let path = &self.path;
        let table = self.loaded.get_or_insert_with(|| {
            path.as_ref()
                .and_then(|p| files::read_regular(p).ok())
                .and_then(|bytes| String::from_utf8(bytes).ok())
                .map(|text| parse_models_json(&text))
                .unwrap_or_default()
        });
        table
            .get(&(provider.to_string(), model.to_string()))
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prices(input: f64, output: f64, cache_read: f64, cache_write: f64) -> Prices {
        Prices {
            rates: Rates {
                input,
                output,
                cache_read,
                cache_write,
            },
            tiers: Vec::new(),
        }
    }

    const TOKENS: Tokens = Tokens {
        input: 700,
        output: 200,
        cache_read: 200,
        cache_write: 100,
        cache_write_1h: 0,
        total: 1200,
    };

    #[test]
    fn prices_are_per_million_tokens_as_pi_computes_them() {
        let p = prices(3.0, 15.0, 0.3, 3.75);
        let want = 3.0 / 1e6 * 700.0 + 15.0 / 1e6 * 200.0 + 0.3 / 1e6 * 200.0 + 375.0 / 1e6;
        assert_eq!(price(&p, &TOKENS), want);
        // An hour-long write costs twice the input rate.
        let hour = Tokens {
            cache_write_1h: 40,
            ..TOKENS
        };
        let want_hour = want - 3.75 * 40.0 / 1e6 + 3.0 * 2.0 * 40.0 / 1e6;
        assert!((price(&p, &hour) - want_hour).abs() < 1e-15);
        // The highest tier the request's input (700 + 200 + 100) exceeds applies throughout.
        let tiered = Prices {
            tiers: vec![
                Tier {
                    input_tokens_above: 500.0,
                    rates: prices(6.0, 30.0, 0.6, 7.5).rates,
                },
                Tier {
                    input_tokens_above: 1000.0,
                    rates: prices(60.0, 300.0, 6.0, 75.0).rates,
                },
            ],
            ..p.clone()
        };
        assert!((price(&tiered, &TOKENS) - 2.0 * want).abs() < 1e-15);
    }

    #[test]
    fn pi_first_then_prices_then_unknown() {
        let none = || None;
        let free = || Some(prices(0.0, 0.0, 0.0, 0.0));
        let priced = || Some(prices(3.0, 15.0, 0.3, 3.75));
        let pi = Some(CostSource::Pi);
        assert_eq!(decide(&TOKENS, Some(0.5), priced), Some((0.5, pi)));
        assert_eq!(decide(&TOKENS, Some(0.5), none), Some((0.5, pi)));
        // Pi's zero is a model without prices or a free one: models.json tells which.
        assert_eq!(decide(&TOKENS, Some(0.0), none), None);
        assert_eq!(
            decide(&TOKENS, Some(0.0), free),
            Some((0.0, Some(CostSource::Prices)))
        );
        let computed = decide(&TOKENS, None, priced).unwrap();
        assert_eq!(computed.1, Some(CostSource::Prices));
        assert_eq!(computed.0, price(&priced().unwrap(), &TOKENS));
        assert_eq!(decide(&TOKENS, Some(f64::NAN), none), None);
        // No tokens, nothing to pay, whatever is known.
        assert_eq!(decide(&Tokens::default(), None, none), Some((0.0, None)));
    }

    #[test]
    fn models_json_prices_by_provider_and_id() {
        let text = r#"{
          // Pi allows comments
          "providers": {
            "fake": {"baseUrl": "http://x//y", "models": [
              {"id": "metered", "cost": {"input": 3, "output": 15, "cacheRead": 0.3, "cacheWrite": 3.75}},
              {"id": "plain"},
              /* half a price is no price */
              {"id": "half", "cost": {"input": 3}},
              {"id": "tiered", "cost": {"input": 1, "output": 2, "cacheRead": 0, "cacheWrite": 0,
                "tiers": [{"inputTokensAbove": 10, "input": 2, "output": 4, "cacheRead": 0, "cacheWrite": 0}]}}
            ]}
          }
        }"#;
        let t = parse_models_json(text);
        assert_eq!(t.len(), 2, "{t:?}");
        let key = |m: &str| ("fake".to_string(), m.to_string());
        assert_eq!(t[&key("metered")], prices(3.0, 15.0, 0.3, 3.75));
        assert_eq!(t[&key("tiered")].tiers[0].input_tokens_above, 10.0);
        assert!(parse_models_json("not json").is_empty());
        assert!(parse_models_json(r#"{"providers": 3}"#).is_empty());
    }
}
