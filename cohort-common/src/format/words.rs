//! Enums stored and printed as fixed words (a run's `state`, a step's `status`, a run's
//! `failure`, `--check`'s `kind`): one table per enum names each variant with its word, and
//! [`word_enum!`](crate::word_enum) derives the rest from it (`as_str`, `ALL`, parsing, serde,
//! `Display`), so no word is written out twice and no list of them is kept in sync by hand.

/// `a, b, c or d` (pure): `words` joined by commas, the last two by `conj` (`"or"`, `"and"`).
/// Help and error texts that list an enum's words build them from its `ALL` with this.
pub fn list<'a>(words: impl IntoIterator<Item = &'a str>, conj: &str) -> String {
    let words: Vec<&str> = words.into_iter().collect();
    match words.split_last() {
        None => String::new(),
        Some((last, [])) => (*last).to_string(),
        Some((last, rest)) => format!("{} {conj} {last}", rest.join(", ")),
    }
}

/// Define a fieldless enum whose values are stored as words, from one table:
///
/// ```
/// cohort_common::word_enum! {
///     /// A colour.
///     pub enum Colour {
///         /// The sky's.
///         Blue = "blue",
///         /// The sea's, some days.
///         DeepGreen = "deep-green",
///     }
///     /// A word this binary does not know (optional: without it an unknown word is an error).
///     else Other = "other";
/// }
/// assert_eq!(Colour::DeepGreen.as_str(), "deep-green");
/// assert_eq!(Colour::from_word("blue"), Some(Colour::Blue));
/// assert_eq!(Colour::ALL, [Colour::Blue, Colour::DeepGreen]);
/// assert_eq!(serde_json::to_string(&Colour::Blue).unwrap(), "\"blue\"");
/// let read: Colour = serde_json::from_str("\"mauve\"").unwrap();
/// assert_eq!(read, Colour::Other);
/// ```
///
/// The enum derives `Clone, Copy, Debug, PartialEq, Eq, Hash` (add more with `#[derive]` on
/// it). It gets `ALL` (the known values, in table order), `as_str`, `from_word` (known words
/// only: the `else` variant's word is never parsed to it), `Display` (the word), `Serialize`
/// (the word) and `Deserialize` (a known word; any other string is the `else` variant when
/// there is one, an error naming the known words when there is not).
#[macro_export]
macro_rules! word_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $var:ident = $word:literal, )+
        }
        $( $(#[$umeta:meta])* else $other:ident = $oword:literal; )?
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        $vis enum $name {
            $( $(#[$vmeta])* $var, )+
            $( $(#[$umeta])* $other, )?
        }

        impl $name {
            #[doc = concat!("Every known value of [`", stringify!($name), "`], in table order.")]
            pub const ALL: &'static [$name] = &[$( $name::$var ),+];

            /// The word as stored and printed.
            pub fn as_str(self) -> &'static str {
                match self {
                    $( $name::$var => $word, )+
                    $( $name::$other => $oword, )?
                }
            }

            /// The value a known word stands for (pure); `None` for any other text.
            pub fn from_word(word: &str) -> Option<$name> {
                match word {
                    $( $word => Some($name::$var), )+
                    _ => None,
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl $crate::__serde::Serialize for $name {
            fn serialize<S: $crate::__serde::Serializer>(
                &self,
                serializer: S,
            ) -> ::std::result::Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> $crate::__serde::Deserialize<'de> for $name {
            fn deserialize<D: $crate::__serde::Deserializer<'de>>(
                deserializer: D,
            ) -> ::std::result::Result<$name, D::Error> {
                struct Word;
                impl $crate::__serde::de::Visitor<'_> for Word {
                    type Value = $name;
                    fn expecting(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                        f.write_str(concat!("a ", stringify!($name), " word"))
                    }
                    #[allow(unreachable_code)]
                    fn visit_str<E: $crate::__serde::de::Error>(
                        self,
                        v: &str,
                    ) -> ::std::result::Result<$name, E> {
                        if let Some(known) = $name::from_word(v) {
                            return Ok(known);
                        }
                        $( return Ok($name::$other); )?
                        Err(E::unknown_variant(v, &[$( $word ),+]))
                    }
                }
                deserializer.deserialize_str(Word)
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::word_enum! {
        /// Without an `else` variant.
        enum Strict {
            /// One.
            One = "one",
            /// Two.
            TwoWords = "two-words",
        }
    }

    #[test]
    fn words_round_trip_and_unknown_words_are_refused_without_an_else() {
        for v in Strict::ALL {
            let json = serde_json::to_string(v).unwrap();
            assert_eq!(json, format!("\"{v}\""));
            assert_eq!(serde_json::from_str::<Strict>(&json).unwrap(), *v);
            assert_eq!(Strict::from_word(v.as_str()), Some(*v));
        }
        let err = serde_json::from_str::<Strict>("\"three\"").unwrap_err();
        assert!(err.to_string().contains("two-words"), "{err}");
        assert!(serde_json::from_str::<Strict>("3").is_err());
        // An escaped string is a word like any other.
        assert_eq!(
            serde_json::from_str::<Strict>("\"tw\\u006f-words\"").unwrap(),
            Strict::TwoWords
        );
    }

    #[test]
    fn lists() {
        assert_eq!(list([], "or"), "");
        assert_eq!(list(["a"], "or"), "a");
        assert_eq!(list(["a", "b"], "and"), "a and b");
        assert_eq!(list(["a", "b", "c"], "or"), "a, b or c");
    }
}
