//! The tools upstream agent files declare that a Pi extension provides, and which extension
//! provides each upstream: what spawn and the runner's tool check say when such a tool is
//! missing, so that both name the same package.
//!
//! Sources: pi-subagents 0.67 `docs/agents.md` ("Web research prerequisites": its researcher
//! and evidence-auditor need `web_search`, `fetch_content`, `get_search_content` and
//! `source_check` from pi-web-access, `pi install npm:pi-web-access`); pi-cohort
//! `doc/specs/2026-06-15-drop-pi-web-access-remove-researcher.md` (its context-builder's
//! `fetch` comes from pi-essentials, `pi install git:github.com/jjuraszek/pi-essentials@v0.2.0`).

/// Each known extension tool and what provides it upstream, as one phrase.
pub const PROVIDERS: [(&str, &str); 5] = [
    ("web_search", PI_WEB_ACCESS),
    ("fetch_content", PI_WEB_ACCESS),
    ("get_search_content", PI_WEB_ACCESS),
    ("source_check", PI_WEB_ACCESS),
    (
        "fetch",
        "pi-essentials (pi install git:github.com/jjuraszek/pi-essentials@v0.2.0)",
    ),
];

const PI_WEB_ACCESS: &str = "pi-web-access (pi install npm:pi-web-access)";

/// What provides tool `name` upstream (pure), if cohort knows.
pub fn provider(name: &str) -> Option<&'static str> {
    PROVIDERS.iter().find(|(n, _)| *n == name).map(|(_, p)| *p)
}

/// `name`, followed by what provides it upstream when that is known (pure):
/// `web_search (from pi-web-access (pi install npm:pi-web-access))`.
pub fn described(name: &str) -> String {
    match provider(name) {
        Some(p) => format!("{name} (from {p})"),
        None => name.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_web_tools_name_their_upstream_package() {
        assert_eq!(
            described("source_check"),
            "source_check (from pi-web-access (pi install npm:pi-web-access))"
        );
        assert!(described("fetch").contains("pi-essentials"));
        assert_eq!(described("my_tool"), "my_tool");
    }
}
