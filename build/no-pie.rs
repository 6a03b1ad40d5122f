//! Build script shared by the four programs (`build = "../build/no-pie.rs"` in each manifest):
//! links their binaries as position-dependent executables on Linux.
//!
//! Why: every run starts `cohort-spawn` and `cohort-runner`, so their start-up is on the path
//! that `benches/peers.sh` measures. A position-independent executable makes the dynamic loader
//! apply one relocation per pointer in the binary's data before `main` (about 12,400 for spawn),
//! writing, and so copying, every page that holds one. Linked with `-no-pie` those addresses
//! are fixed at link time: `cohort-spawn --version` took 0.85–0.92 ms of CPU with 115 page
//! faults against 1.11–1.51 ms with 175 (`perf stat -r 200`, two rounds alternating;
//! docs/benchmarks.md). The cost is that the executable's own image is not placed at a random
//! address; the libraries, the stack and the heap still are.
fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        // Given after rustc's own `-pie`, so the C compiler driver that links takes this one.
        println!("cargo:rustc-link-arg-bins=-no-pie");
    }
    println!("cargo:rerun-if-changed=../build/no-pie.rs");
}
