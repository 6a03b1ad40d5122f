//! Run ids against their contract: UUIDv7 that sort by creation (after a floor when the clock
//! stepped back), resolution of full ids, short ids and prefixes, and names that are refused.

use cohort_common::error::Error;
use cohort_common::format::id::*;

const A: &str = "01a22a44-9e62-7266-ab9d-e5b500ee829c";
const B: &str = "01a22a44-b1f7-7440-8179-f67becacc1b9";

#[test]
fn new_ids_are_v7_and_sort_by_creation() {
    let a = RunId::new();
    std::thread::sleep(std::time::Duration::from_millis(2));
    let b = RunId::new();
    assert!(a.to_string() < b.to_string());
    assert_eq!(a.to_string().len(), 36);
    assert_eq!(a.short().len(), 12);
    assert!(a.to_string().ends_with(&a.short()));
    assert_eq!(a.to_string().parse::<RunId>().unwrap(), a);
}

#[test]
fn ids_after_a_floor_sort_after_it_whatever_the_clock_says() {
    let floor = RunId::after(None, 5_000_000);
    assert_eq!(id_time(&floor.to_string()), Some(5_000_000));
    // The wall clock stepped back an hour.
    let next = RunId::after(Some(&floor), 5_000_000 - 3_600_000);
    assert!(next > floor && next.to_string() > floor.to_string());
    assert_eq!(id_time(&next.to_string()), Some(5_000_001));
    // A clock ahead of the floor wins.
    assert_eq!(
        id_time(&RunId::after(Some(&floor), 9_000_000).to_string()),
        Some(9_000_000)
    );
}

#[test]
fn resolves_full_short_and_prefixes() {
    let ids = [A, B];
    assert_eq!(resolve(A, ids).unwrap(), A);
    assert_eq!(resolve("e5b500ee829c", ids).unwrap(), A);
    assert_eq!(resolve("E5B500EE", ids).unwrap(), A);
    assert_eq!(resolve("01a22a44-b1", ids).unwrap(), B);
    assert_eq!(resolve("f67becac", ids).unwrap(), B);
}

#[test]
fn ambiguity_names_a_few_short_ids_and_counts_the_rest() {
    let many: Vec<String> = (0..10)
        .map(|i| format!("01a22a44-9e62-7266-ab9d-e5b500ee82{i:02}"))
        .collect();
    let text = describe_candidates(&many);
    assert_eq!(
        text,
        "10 runs: e5b500ee8200, e5b500ee8201, e5b500ee8202 and 7 more"
    );
    assert_eq!(
        describe_candidates(&[A.into(), B.into()]),
        "2 runs: e5b500ee829c, f67becacc1b9"
    );
    let err = Error::AmbiguousRun {
        name: "01a22a44".into(),
        candidates: many,
    };
    assert!(err.to_string().len() < 120, "{err}");
}

#[test]
fn ambiguous_prefix_lists_candidates() {
    let err = resolve("01a22a44", [A, B]).unwrap_err();
    match err {
        Error::AmbiguousRun { candidates, .. } => assert_eq!(candidates, vec![A, B]),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn rejects_short_and_hostile_names() {
    for bad in [
        "0123",
        "../../etc",
        "abcdefgh/",
        "abc\0defgh",
        "zzzzzzzz",
        "",
    ] {
        assert!(matches!(
            resolve(bad, [A]),
            Err(Error::InvalidRunName { .. })
        ));
    }
    assert!(matches!(
        resolve("deadbeef", [A]),
        Err(Error::NoSuchRun { .. })
    ));
    assert!("../x".parse::<RunId>().is_err());
}

#[test]
fn uuid_v7_time() {
    let id = RunId::new().to_string();
    let t = id_time(&id).unwrap();
    assert!(cohort_common::format::record::now_ms().abs_diff(t) < 5_000);
    assert_eq!(id_time("3f2a9c1e"), None);
    // A v4 uuid has no time.
    assert_eq!(id_time("0b0f4c52-8f3e-4d8e-9d7a-6b1c2f3e4a5b"), None);
}
