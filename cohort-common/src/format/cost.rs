//! What a run's tokens cost, as the record stores it: where a cost comes from
//! ([`CostSource`]) and how the costs of several messages, steps or runs add up ([`sum`]). How a
//! cost is written for people is `cohort-status`'s (`summary::usd`).
//!
//! A cost is US dollars, as Pi counts it (its models' prices are per million tokens). It is
//! either known for everything counted or unknown: a sum with one unknown part is unknown,
//! never a partial figure passed off as the whole. Usage of no tokens costs nothing, whatever
//! its record says. The runner decides each message's cost; readers only add.

crate::word_enum! {
    /// Where a known cost comes from (`costSource` in `status.json`).
    pub enum CostSource {
        /// Pi's own event said it (`usage.cost.total` of an assistant message).
        Pi = "pi",
        /// cohort computed it from the model's prices in the profile's `models.json`, as Pi
        /// computes it, because Pi's event gave none.
        Prices = "prices",
        /// The parts added up came from both.
        Mixed = "mixed",
    }
    /// A source word this binary does not know.
    else Unknown = "unknown";
}

/// A cost as a sum part: `None` unknown, else dollars and, when tokens were counted, where
/// they come from.
pub type Part = Option<(f64, Option<CostSource>)>;

/// The sum of two parts (pure): unknown when either is; the source is the one both share,
/// [`CostSource::Mixed`] when they differ, and a part without a source (no tokens) takes the
/// other's.
pub fn sum(a: Part, b: Part) -> Part {
    let ((x, sx), (y, sy)) = (a?, b?);
    let source = match (sx, sy) {
        (Some(p), Some(q)) if p == q => Some(p),
        (Some(_), Some(_)) => Some(CostSource::Mixed),
        (p, None) => p,
        (None, q) => q,
    };
    Some((x + y, source))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_part_makes_the_sum_unknown() {
        let pi = Some((0.5, Some(CostSource::Pi)));
        let prices = Some((0.25, Some(CostSource::Prices)));
        let nothing = Some((0.0, None));
        assert_eq!(sum(pi, pi), Some((1.0, Some(CostSource::Pi))));
        assert_eq!(sum(pi, prices), Some((0.75, Some(CostSource::Mixed))));
        assert_eq!(sum(nothing, prices), prices);
        assert_eq!(sum(pi, nothing), pi);
        assert_eq!(sum(pi, None), None);
        assert_eq!(sum(None, nothing), None);
    }
}
