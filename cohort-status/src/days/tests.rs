use super::*;
use crate::ledger::Group;
use cohort_common::format::record::Usage;
use proptest::prelude::*;

fn tree(started_at: Option<u64>, groups: Vec<Group>) -> TreeUsage {
    TreeUsage {
        started_at,
        runs: 1,
        groups,
    }
}

fn group(
    agent: Option<&str>,
    model: Option<&str>,
    steps: u64,
    tokens: u64,
    cost: Option<f64>,
) -> Group {
    Group {
        agent: agent.map(str::to_string),
        model: model.map(str::to_string),
        steps,
        usage: Usage {
            input: tokens,
            output: tokens / 3,
            cache_read: tokens / 5,
            cache_write: tokens / 7,
            total_tokens: tokens + tokens / 3,
            cost,
            cost_source: None,
        },
    }
}

/// The rows agree with the per-tree computation: every count exactly, the known cost to
/// rounding (the sums add in another order).
fn assert_same(got: &(Vec<Line>, Line), want: &(Vec<Line>, Line), by: Option<By>) {
    let same = |g: &Line, w: &Line| {
        assert_eq!(
            (
                &g.key,
                g.runs,
                g.steps,
                g.input,
                g.output,
                g.cache_read,
                g.cache_write
            ),
            (
                &w.key,
                w.runs,
                w.steps,
                w.input,
                w.output,
                w.cache_read,
                w.cache_write
            ),
            "{by:?}"
        );
        assert_eq!(
            (g.total_tokens, g.tokens_unpriced, g.cost.is_some()),
            (w.total_tokens, w.tokens_unpriced, w.cost.is_some()),
            "{by:?} {}",
            w.key
        );
        assert!(
            (g.cost_known - w.cost_known).abs() < 1e-9,
            "{by:?} {g:?} {w:?}"
        );
    };
    assert_eq!(
        got.0.len(),
        want.0.len(),
        "{by:?}: {:?} {:?}",
        got.0,
        want.0
    );
    for (g, w) in got.0.iter().zip(&want.0) {
        same(g, w);
    }
    same(&got.1, &want.1);
}

const DAY: u64 = 86_400_000;

#[test]
fn the_sums_give_the_rows_of_the_trees_themselves() {
    let trees = [
        tree(
            Some(19_000 * DAY + 5),
            vec![
                group(Some("scout"), Some("fake/a"), 2, 10, Some(0.5)),
                group(None, Some("fake/b"), 1, 3, None),
            ],
        ),
        tree(
            Some(19_000 * DAY + 9),
            vec![group(Some("scout"), Some("fake/b"), 1, 4, Some(0.25))],
        ),
        tree(Some(19_001 * DAY), vec![]),
        tree(None, vec![group(Some("-"), None, 1, 2, Some(0.0))]),
    ];
    let ids: Vec<String> = (0..trees.len()).map(|i| format!("id{i}")).collect();
    let mut sums = DaySums::default();
    for t in &trees {
        sums.add(t);
    }
    for by in [None, Some(By::Agent), Some(By::Model), Some(By::Day)] {
        let want = crate::usage::lines(ids.iter().map(String::as_str).zip(&trees), by);
        assert_same(&sums.lines(by), &want, by);
    }
    // A day whose only tree ran no step is in the total, not a row of its own.
    let (rows, total) = sums.lines(Some(By::Day));
    assert_eq!(total.runs, 4);
    assert_eq!(
        rows.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(),
        ["-", "2022-01-08"]
    );
    assert_eq!(rows[1].runs, 2);
}

#[test]
fn the_file_reads_back_as_written() {
    let mut c = Covered {
        watermark: Some("01a22a44-9e62-7266-ab9d-e5b500ee829c".into()),
        count: 12,
        pending: vec![
            "01a22a44-9e62-7266-ab9d-e5b500ee8290".into(),
            "a stray name".into(),
        ],
        sums: DaySums::default(),
    };
    c.sums.add(&tree(
        Some(3 * DAY),
        vec![
            group(Some("my agent"), Some("fake/a"), 2, 10, Some(0.1 + 0.2)),
            group(None, None, 1, 3, None),
        ],
    ));
    c.sums.add(&tree(None, vec![]));
    let text = render(&c);
    assert_eq!(parse(&text), Some(c.clone()));
    assert!(text.contains(" a:my%20agent "), "{text}");
    assert_eq!(parse("cohort-status-usage-days 2 - 0\n"), None);
    assert_eq!(parse(&text.replace(" 12\n", " x\n")), None);
    let torn = &text[..text.len() - 4];
    assert_eq!(parse(torn), None, "a torn line is no file: it is rebuilt");
}

#[test]
fn the_watermark_moves_to_the_newest_run_id_read() {
    let id = |i: u32| format!("01a22a44-9e62-7266-ab9d-e5b500ee{i:04}");
    let mut c = Covered::default();
    c.cover(
        vec![id(1), id(2), "zz-not-a-run".into()],
        vec![id(2), "zz-not-a-run".into()],
        3,
    );
    assert_eq!(c.watermark, Some(id(2)));
    // The stray name sorts after every id: it is read again each time, never pending.
    assert_eq!((c.count, c.pending.clone()), (2, vec![id(2)]));
    c.cover(vec![id(3), "zz-not-a-run".into()], vec![], 4);
    assert_eq!((c.watermark.clone(), c.count), (Some(id(3)), 3));
}

proptest! {
    #[test]
    fn sums_agree_with_the_per_run_computation(
        trees in prop::collection::vec(
            (
                prop::option::of(0u64..4),
                prop::collection::vec(
                    (0usize..3, 0usize..3, 1u64..4, 0u64..10_000, prop::option::of(0u32..1000)),
                    0..4,
                ),
            ),
            0..30,
        )
    ) {
        let agents = [None, Some("scout"), Some("worker")];
        let models = [None, Some("fake/a"), Some("fake/b")];
        let trees: Vec<TreeUsage> = trees
            .into_iter()
            .map(|(day, gs)| {
                tree(
                    day.map(|d| (19_000 + d) * DAY + 1234),
                    gs.into_iter()
                        .map(|(a, m, steps, tokens, cents)| {
                            group(agents[a], models[m], steps, tokens, cents.map(|c| f64::from(c) / 100.0))
                        })
                        .collect(),
                )
            })
            .collect();
        let ids: Vec<String> = (0..trees.len()).map(|i| format!("{i:08}")).collect();
        // Summed in two halves and merged, as the file's sums and the open trees are.
        let (a, b) = trees.split_at(trees.len() / 2);
        let mut sums = DaySums::default();
        a.iter().for_each(|t| sums.add(t));
        let mut rest = DaySums::default();
        b.iter().for_each(|t| rest.add(t));
        sums.merge(&rest);
        for by in [None, Some(By::Agent), Some(By::Model), Some(By::Day)] {
            let want = crate::usage::lines(ids.iter().map(String::as_str).zip(&trees), by);
            assert_same(&sums.lines(by), &want, by);
        }
    }
}

/// A top-level run on disk: its lock file and a record in `state` with one step of `tokens`.
fn write_run(
    root: &StateRoot,
    prev: Option<&str>,
    state: cohort_common::format::record::RunState,
    tokens: u64,
) -> String {
    use cohort_common::format::id::RunId;
    use cohort_common::format::record::{self, RunMode, StepRecord};
    let prev: Option<RunId> = prev.map(|p| p.parse().unwrap());
    let id = RunId::after(prev.as_ref(), record::now_ms());
    let dir = root.run_dir(&id.to_string());
    files::create_dir_all_private(dir.path()).unwrap();
    std::fs::File::create(dir.lock()).unwrap();
    let mut r = RunRecord::queued(&id, RunMode::Single);
    r.state = state;
    r.started_at = Some(record::now_ms());
    r.steps = vec![StepRecord {
        model: Some("fake/a".into()),
        usage: group(None, None, 1, tokens, Some(0.5)).usage,
        ..StepRecord::default()
    }];
    record::store(&dir.status(), &r).unwrap();
    id.to_string()
}

#[test]
fn the_sums_follow_the_runs_directory_through_new_ended_and_reaped_runs() {
    use cohort_common::format::record::{self, RunState};
    let t = tempfile::tempdir().unwrap();
    let root = StateRoot::for_profile(t.path());
    let mut ids = Vec::new();
    for i in 0..5 {
        let prev = ids.last().cloned();
        ids.push(write_run(
            &root,
            prev.as_deref(),
            RunState::Complete,
            100 + i,
        ));
    }
    // A running run with its lock held: open, read afresh each time.
    let live = write_run(&root, ids.last().map(String::as_str), RunState::Running, 7);
    let held = cohort_common::os::lock::RunLock::acquire(
        &root.run_dir(&live).lock(),
        std::time::Duration::from_secs(1),
    )
    .unwrap();
    ids.push(live.clone());
    let check = |why: &str| {
        let (sums, unreadable) = collect(&root).unwrap();
        let trees = crate::usage::collect(&root, None).unwrap();
        assert_eq!(unreadable, trees.unreadable, "{why}");
        for by in [None, Some(By::Model), Some(By::Day)] {
            assert_same(&sums.lines(by), &crate::usage::lines(trees.iter(), by), by);
        }
        sums.lines(None).1
    };
    assert_eq!(check("first: rebuilt").runs, 6);
    let text = std::fs::read_to_string(root.index_dir().join(DAYS_FILE)).unwrap();
    assert!(text.contains(&format!("\np {live}\n")), "{text}");
    // The live run ends and two more start: read from the sums and those three.
    let mut r = record::load(&root.run_dir(&live).status()).unwrap();
    r.finish(RunState::Complete, None);
    record::store(&root.run_dir(&live).status(), &r).unwrap();
    drop(held);
    for _ in 0..2 {
        let prev = ids.last().cloned();
        ids.push(write_run(&root, prev.as_deref(), RunState::Complete, 1));
    }
    assert_eq!(check("grown").runs, 8);
    let text = std::fs::read_to_string(root.index_dir().join(DAYS_FILE)).unwrap();
    assert!(!text.contains("\np "), "nothing is pending: {text}");
    assert!(text.contains(&format!(" {} 8\n", ids[7])), "{text}");
    // A reap removes two old runs: the sums no longer cover the directory and are rebuilt.
    for id in &ids[..2] {
        std::fs::remove_dir_all(root.run_dir(id).path()).unwrap();
    }
    let total = check("reaped");
    assert_eq!((total.runs, total.input), (6, 7 + 102 + 103 + 104 + 1 + 1));
}
