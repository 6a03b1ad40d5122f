//! Build script of the end-to-end tests: sets `cfg(e2e_root)` when the tests are built by
//! root (effective uid 0, from `/proc/self/status`), so the tests that need root (a second
//! user, `setpriv`, mounting a tmpfs) are compiled as `#[ignore]`d for anyone else, and the
//! totals say "ignored" rather than counting a test that skipped itself as passed. Each such
//! test still checks at run time and says why it skips, for a target dir built by another uid.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(e2e_root)");
    println!("cargo::rerun-if-changed=build.rs");
    let euid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(str::to_string))
        });
    if euid.as_deref() == Some("0") {
        println!("cargo::rustc-cfg=e2e_root");
    }
}
