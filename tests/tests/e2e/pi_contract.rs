//! End-to-end: the Pi behaviour cohort depends on, checked on the Pi generation under test
//! (`COHORT_TEST_PI`; `.ci/run` runs this file on 0.73.1 and on 1.6.0).
//!
//! Each test runs the pinned Pi CLI directly against the fake model server. The runner launches
//! Pi in RPC mode (`--mode rpc`, [`Rpc`]): the `rpc_*` tests pin each message kind it writes
//! (`prompt`, `steer`, `follow_up`, `abort`), each `response` it reads, the end of a session
//! (`agent_end` on 0.73, `agent_settled` on 1.6) and the clean exit when stdin closes. The others
//! run `--mode json -p …`, whose events RPC mode streams unchanged, and check one fact cohort
//! relies on: the event
//! stream (fed through the runner's own parser and step decision), the exit codes, session files
//! and their continuation, `--system-prompt FILE` and `--append-system-prompt FILE` (Pi's own
//! prompt gone or kept), the last `--model` winning, and stdin (a pipe, or a file as the runner
//! gives it) as the message in `-p` mode, whatever its first character. Where
//! the generations differ in a way cohort does not depend on, the test says so.

use std::io::Write;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use cohort_e2e::fake_server::message_text as text;
use cohort_e2e::harness::{stderr, stdout, wait_for, TestEnv, HERMETIC};
use cohort_runner::step::{decide_step, ChildExit, StepVerdict};
use cohort_runner::stream::{StreamParser, UPDATE_HEAD};
use serde_json::Value;

/// Run `node <entry> --mode json -p <hermetic flags> ARGS` in the env's temp dir with `stdin`
/// piped (none: `/dev/null`), waiting at most 60 s.
fn pi(env: &TestEnv, args: &[&str], stdin: Option<&str>) -> Output {
    pi_with(env, args, stdin.map(Stdin::Pipe))
}

/// What a Pi child reads on stdin.
enum Stdin<'a> {
    /// This text, through a pipe.
    Pipe(&'a str),
    /// This file, opened as stdin (what the runner does: the task is in `task-<i>.md`).
    File(&'a Path),
}

/// [`pi`] with stdin from a pipe or a file.
fn pi_with(env: &TestEnv, args: &[&str], stdin: Option<Stdin>) -> Output {
    let dir = env.tmp.path();
    let out_path = dir.join("pi.stdout");
    let err_path = dir.join("pi.stderr");
    let mut c = env.program(&env.node);
    c.arg(&env.pi_entry)
        .args(["--mode", "json", "-p"])
        .args(HERMETIC)
        .args(args)
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap());
    match &stdin {
        Some(Stdin::Pipe(_)) => {
            c.stdin(Stdio::piped());
        }
        Some(Stdin::File(p)) => {
            c.stdin(std::fs::File::open(p).unwrap());
        }
        None => {}
    }
    let mut child = c.spawn().expect("start Pi");
    if let Some(Stdin::Pipe(text)) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(text.as_bytes()).unwrap();
    }
    let mut status = None;
    wait_for(Duration::from_secs(60), || {
        status = child.try_wait().unwrap();
        status.is_some()
    })
    .unwrap_or_else(|_| {
        let _ = child.kill();
        panic!("Pi {args:?} did not exit within 60 s");
    });
    Output {
        status: status.unwrap(),
        stdout: std::fs::read(&out_path).unwrap(),
        stderr: std::fs::read(&err_path).unwrap(),
    }
}

/// The event lines of a Pi run, parsed.
fn events(out: &Output) -> Vec<Value> {
    stdout(out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// The runner's verdict on a Pi run: its stream through [`StreamParser`], then [`decide_step`].
fn verdict(out: &Output) -> (StreamParser, StepVerdict, Vec<String>) {
    let mut parser = StreamParser::default();
    let mut deltas = Vec::new();
    parser
        .run(&mut &out.stdout[..], |_, n| {
            if let cohort_runner::stream::Notice::TextDelta { text } = n {
                deltas.push(text.into_owned());
            }
        })
        .unwrap();
    let exit = ChildExit::Code(out.status.code().expect("Pi exited, not signalled"));
    let v = decide_step(exit, &parser.summary, &stderr(out));
    (parser, v, deltas)
}

/// The last request the fake server got.
fn last_request(env: &TestEnv) -> Value {
    env.server.last_request()
}

#[test]
fn the_event_stream_carries_what_the_runner_reads() {
    let env = TestEnv::new();
    let out = pi(
        &env,
        &["--no-session", "--model", "fake/tool", "RUN: echo CONTRACT"],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // The runner classifies lines by their first bytes: the type is the first key.
    for line in stdout(&out).lines() {
        assert!(
            line.starts_with(r#"{"type":""#),
            "type not first: {line:.200}"
        );
    }
    let ev = events(&out);
    assert_eq!(ev[0]["type"], "session", "{:#}", ev[0]);
    assert!(ev[0]["id"].is_string(), "{:#}", ev[0]);
    assert_eq!(
        Path::new(ev[0]["cwd"].as_str().unwrap()),
        env.tmp.path().canonicalize().unwrap()
    );
    // Streaming text: the runner reads the delta from the head of a message_update line.
    // (1.6 puts `usage` before `assistantMessageEvent` and drops `partial`; still in the head.)
    let delta_line = stdout(&out)
        .lines()
        .find(|l| l.contains(r#""assistantMessageEvent":{"type":"text_delta""#))
        .expect("a text_delta update")
        .to_string();
    let head = &delta_line.as_bytes()[..delta_line.len().min(UPDATE_HEAD)];
    assert_eq!(
        cohort_runner::stream::text_delta(head).as_deref(),
        Some("TOOL DONE: CONTRACT")
    );
    let tool = ev
        .iter()
        .find(|e| e["type"] == "tool_execution_start")
        .expect("tool_execution_start");
    assert_eq!(tool["toolName"], "bash");
    assert_eq!(tool["args"]["command"], "echo CONTRACT");
    let end = ev
        .iter()
        .find(|e| e["type"] == "tool_execution_end")
        .expect("tool_execution_end");
    assert_eq!(end["isError"], false);
    assert_eq!(end["result"]["content"][0]["text"], "CONTRACT\n");

    let (parser, v, deltas) = verdict(&out);
    assert_eq!(v, StepVerdict::Complete);
    let s = &parser.summary;
    assert!(s.saw_agent_end);
    assert_eq!(s.last_stop_reason.as_deref(), Some("stop"));
    assert_eq!((s.turn_count, s.tool_count), (2, 1), "{s:?}");
    assert_eq!(s.final_text_len, "TOOL DONE: CONTRACT".len());
    assert_eq!(s.model.as_deref(), Some("fake/tool"));
    assert_eq!(s.garbage_lines, 0);
    // Two model calls, each reporting 11 in + 7 out (the fake server's usage chunk).
    assert_eq!(
        (s.usage.input, s.usage.output, s.usage.total_tokens),
        (22, 14, 36),
        "{:?}",
        s.usage
    );
    assert_eq!(deltas.concat(), "TOOL DONE: CONTRACT");
}

#[test]
fn a_model_error_exits_0_and_the_stream_says_error() {
    // Pi exits 0 even when the model call failed: cohort must read the stream.
    let env = TestEnv::new();
    let out = pi(&env, &["--no-session", "--model", "fake/err400", "x"], None);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let (parser, v, _) = verdict(&out);
    assert_eq!(parser.summary.last_stop_reason.as_deref(), Some("error"));
    // 0.73: "400 bad request from fake model"; 1.6: `400: {"message":"bad request from fake
    // model",…}`. cohort shows whatever Pi says.
    assert!(
        matches!(&v, StepVerdict::Failed(m) if m.contains("bad request from fake model")),
        "{v:?}"
    );
}

#[test]
fn usage_errors_exit_non_zero_with_one_line_on_stderr() {
    let env = TestEnv::new();
    for (args, needle) in [
        (
            vec!["--no-session", "--model", "nope/x", "x"],
            r#"Model "nope/x" not found"#,
        ),
        (
            vec!["--no-session", "--bogus-flag", "--model", "fake/plain", "x"],
            "Unknown option: --bogus-flag",
        ),
    ] {
        let out = pi(&env, &args, None);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(needle), "{args:?}: {}", stderr(&out));
        let (_, v, _) = verdict(&out);
        assert!(
            matches!(&v, StepVerdict::Failed(m) if m.contains("code 1") && m.contains(needle)),
            "{v:?}"
        );
    }
}

#[test]
fn a_session_file_starts_with_its_header_and_a_second_run_continues_it() {
    let env = TestEnv::new();
    let session = env.tmp.path().join("sessions/s.jsonl");
    std::fs::create_dir_all(session.parent().unwrap()).unwrap();
    let s = session.to_str().unwrap();
    let out = pi(
        &env,
        &["--session", s, "--model", "fake/plain", "remember KUMQUAT"],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // spawn's check of a file to continue: the first line is a Pi session header.
    let written = std::fs::read_to_string(&session).expect("Pi wrote the session file");
    let header: Value = serde_json::from_str(written.lines().next().unwrap()).unwrap();
    assert_eq!(header["type"], "session", "{header:#}");
    assert_eq!(header["id"], events(&out)[0]["id"], "the stream names it");
    assert!(written.contains("ECHO: remember KUMQUAT"), "{written}");

    // Continuing it (what a revival does) sends the earlier conversation to the model.
    let out = pi(
        &env,
        &["--session", s, "--model", "fake/plain", "and the word was?"],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let msgs: Vec<String> = last_request(&env)["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(text)
        .collect();
    assert!(
        msgs.iter().any(|m| m == "remember KUMQUAT")
            && msgs.iter().any(|m| m == "ECHO: remember KUMQUAT")
            && msgs.last().map(String::as_str) == Some("and the word was?"),
        "{msgs:#?}"
    );
    let after = std::fs::read_to_string(&session).unwrap();
    assert!(
        after.starts_with(written.lines().next().unwrap()),
        "one header"
    );
    assert!(after.contains("ECHO: and the word was?"), "{after}");
}

#[test]
fn system_prompt_names_a_file_whose_text_is_the_system_prompt() {
    let env = TestEnv::new();
    let file = env.tmp.path().join("prompt.md");
    std::fs::write(&file, "You are CONTRACT-PROMPT.\nLine two.\n").unwrap();
    let out = pi(
        &env,
        &[
            "--no-session",
            "--model",
            "fake/plain",
            "--system-prompt",
            file.to_str().unwrap(),
            "x",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let req = last_request(&env);
    let system = &req["messages"][0];
    assert_eq!(system["role"], "system", "{req:#}");
    // Pi appends its own context after the file's text (0.73: the date and cwd; 1.6: a <cwd>
    // block); the file's text comes first, whole.
    assert!(
        text(system).starts_with("You are CONTRACT-PROMPT.\nLine two."),
        "{}",
        text(system)
    );
    assert!(
        !text(system).contains(file.to_str().unwrap()),
        "not the path"
    );
}

#[test]
fn piped_stdin_is_the_message_in_print_mode() {
    let env = TestEnv::new();
    let task = "a task from stdin\nwith two lines";
    let out = pi(&env, &["--no-session", "--model", "fake/plain"], Some(task));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let req = last_request(&env);
    let user = req["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(user["role"], "user");
    assert_eq!(text(&user), task);
    let (_, v, _) = verdict(&out);
    assert_eq!(v, StepVerdict::Complete);
    // With a message argument too, Pi trims stdin's text and puts the argument right after it,
    // with no separator, in one message (from a pipe or a file alike); blank stdin adds
    // nothing. cohort-spawn joins a TASK and its stdin this way (cohort_spawn::stdin::join) and
    // hands the runner's child the joined text alone.
    let notes = env.tmp.path().join("notes.md");
    for (input, from_file, want) in [
        ("STDIN", false, "STDINARG"),
        ("\n  STDIN \n\n", false, "STDINARG"),
        (" \n\t", false, "ARG"),
        (
            "\n  notes, line one\nline two \n\n",
            true,
            "notes, line one\nline twoARG",
        ),
    ] {
        std::fs::write(&notes, input).unwrap();
        let stdin = if from_file {
            Stdin::File(&notes)
        } else {
            Stdin::Pipe(input)
        };
        let out = pi_with(
            &env,
            &["--no-session", "--model", "fake/plain", "ARG"],
            Some(stdin),
        );
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let req = last_request(&env);
        let sent = text(req["messages"].as_array().unwrap().last().unwrap());
        assert_eq!(sent, want, "{input:?}");
        assert_eq!(cohort_spawn::stdin::join(input, "ARG"), sent, "{input:?}");
    }
}

/// A phrase of Pi's own base prompt on both generations (0.73: "You are an expert coding
/// assistant operating inside pi, a coding agent harness."; 1.6: "You are a coding assistant
/// running inside pi, a coding agent harness.").
const BASE_PROMPT_MARK: &str = "inside pi, a coding agent harness";

#[test]
fn system_prompt_replaces_pis_prompt_and_append_keeps_it() {
    let env = TestEnv::new();
    let file = env.tmp.path().join("agent.md");
    std::fs::write(&file, "You are AGENT-PROMPT.").unwrap();
    let f = file.to_str().unwrap();
    for (flag, base) in [("--system-prompt", false), ("--append-system-prompt", true)] {
        let out = pi(
            &env,
            &["--no-session", "--model", "fake/plain", flag, f, "x"],
            None,
        );
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let system = text(&last_request(&env)["messages"][0]);
        assert!(system.contains("You are AGENT-PROMPT."), "{flag}: {system}");
        assert_eq!(system.contains(BASE_PROMPT_MARK), base, "{flag}: {system}");
    }
}

#[test]
fn the_last_model_and_tools_flags_win() {
    // The runner puts an agent's model and tools first and the user's Pi args after them.
    let env = TestEnv::new();
    let out = pi(
        &env,
        &[
            "--no-session",
            "--model",
            "fake/err400",
            "--tools",
            "read",
            "--model",
            "fake/plain",
            "--tools",
            "grep,ls",
            "x",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let req = last_request(&env);
    assert_eq!(req["model"], "plain", "{req:#}");
    let mut tools: Vec<&str> = req["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    tools.sort();
    assert_eq!(tools, ["grep", "ls"]);
}

#[test]
fn a_task_file_on_stdin_arrives_whole_whatever_it_starts_with() {
    let env = TestEnv::new();
    for task in ["-rf everything --help", "@notes.md please", "---\nfront"] {
        let file = env.tmp.path().join("task.md");
        std::fs::write(&file, task).unwrap();
        let out = pi_with(
            &env,
            &["--no-session", "--model", "fake/plain"],
            Some(Stdin::File(&file)),
        );
        assert_eq!(out.status.code(), Some(0), "{task:?}: {}", stderr(&out));
        let req = last_request(&env);
        let user = req["messages"].as_array().unwrap().last().unwrap().clone();
        assert_eq!(text(&user), task);
    }
}

#[test]
fn the_pinned_engines_range_is_the_packages() {
    // The harness and the demo judge a Node by the pinned range before downloading Pi.
    let g = cohort_e2e::pi::generation();
    let _ = TestEnv::new();
    let info = cohort_common::identity::runtime::package_info(&g.package_root_in(&g.install_dir()))
        .unwrap();
    assert_eq!(info.node_engines.as_deref(), Some(g.node_engines), "{g:?}");
}

/// A provider without a key: Pi refuses the prompt before it calls any model (in RPC mode, as
/// the runner runs it; in `-p` mode it exits 1 with the same text on stderr), giving the cause
/// and then the paths of its docs. The step's error leads with the cause, not a path.
#[test]
fn a_missing_api_key_fails_the_step_with_the_cause_first() {
    let env = TestEnv::new();
    let out = env
        .cmd("cohort-spawn")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("ANTHROPIC_OAUTH_TOKEN")
        .args([
            "--wait",
            "--quiet",
            "--model",
            "anthropic/claude-sonnet-4",
            "hi",
            "--",
        ])
        .args(HERMETIC)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("(step-0): Pi refused the task: No API key found for anthropic. ("),
        "{err}"
    );
    assert!(env.server.requests().is_empty(), "no model was called");
}

/// A Pi child in RPC mode (`node <entry> --mode rpc <hermetic flags> ARGS`), as the runner
/// runs a step: commands go on its stdin, its stdout lines come in on a channel.
struct Rpc {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    lines: std::sync::mpsc::Receiver<Value>,
    seen: Vec<Value>,
}

impl Rpc {
    fn start(env: &TestEnv, args: &[&str]) -> Rpc {
        let mut c = env.program(&env.node);
        c.arg(&env.pi_entry)
            .args(["--mode", "rpc"])
            .args(HERMETIC)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(env.tmp.path().join("rpc.stderr")).unwrap());
        let mut child = c.spawn().expect("start Pi");
        let stdin = child.stdin.take();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for l in std::io::BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                let v = serde_json::from_str(&l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        Rpc {
            child,
            stdin,
            lines,
            seen: Vec::new(),
        }
    }

    /// Write one command line, as [`cohort_runner::rpc::command_line`] makes it.
    fn send(&mut self, cmd: Value) {
        let line = cohort_runner::rpc::command_line(&cmd);
        self.stdin
            .as_mut()
            .expect("stdin open")
            .write_all(line.as_bytes())
            .unwrap();
    }

    /// Read lines until one satisfies `pred` (returned), within 60 s.
    fn until(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(v) => {
                    self.seen.push(v.clone());
                    if pred(&v) {
                        return v;
                    }
                }
                Err(_) => {
                    let _ = self.child.kill();
                    let kinds: Vec<_> = self.seen.iter().map(|v| v["type"].clone()).collect();
                    panic!("no {what} within 60 s; saw {kinds:?}");
                }
            }
        }
    }

    /// Wait for the end of the session as the runner judges it ([`cohort_runner::rpc`]).
    fn until_session_over(&mut self) -> Value {
        let major = major();
        self.until("the end of the session", |v| {
            let settled = v["type"] == "agent_settled";
            (settled || v["type"] == "agent_end")
                && cohort_runner::rpc::ends_session(settled, major)
        })
    }

    /// Close stdin and wait for Pi to exit (60 s); its exit status and the rest of its lines.
    fn close(mut self) -> (std::process::ExitStatus, Vec<Value>) {
        self.stdin.take();
        let mut status = None;
        wait_for(Duration::from_secs(60), || {
            status = self.child.try_wait().unwrap();
            status.is_some()
        })
        .unwrap_or_else(|_| {
            let _ = self.child.kill();
            panic!("Pi did not exit within 60 s of its stdin closing");
        });
        self.seen.extend(self.lines.iter());
        (status.unwrap(), self.seen)
    }
}

/// The major version of the Pi generation under test.
fn major() -> u64 {
    let v = cohort_e2e::pi::generation().version;
    v.split('.').next().unwrap().parse().unwrap()
}

fn is_response(v: &Value, command: &str) -> bool {
    v["type"] == "response" && v["command"] == command
}

/// The runner's verdict on RPC output lines, as for `-p` ([`verdict`]).
fn rpc_verdict(lines: &[Value], code: i32) -> (StreamParser, StepVerdict) {
    let text: String = lines.iter().map(|v| format!("{v}\n")).collect();
    let mut parser = StreamParser::default();
    parser.run(&mut text.as_bytes(), |_, _| {}).unwrap();
    let v = decide_step(ChildExit::Code(code), &parser.summary, "");
    (parser, v)
}

#[test]
fn rpc_prompt_streams_the_json_events_and_closing_stdin_ends_pi_cleanly() {
    let env = TestEnv::new();
    let session = env.tmp.path().join("s.jsonl");
    let s = session.to_str().unwrap();
    let mut pi = Rpc::start(&env, &["--session", s, "--model", "fake/plain"]);
    let task = "-rf \"quoted\"\nsecond line";
    pi.send(
        serde_json::json!({"id": cohort_runner::rpc::PROMPT_ID, "type": "prompt", "message": task}),
    );
    let r = pi.until("the prompt's response", |v| is_response(v, "prompt"));
    assert_eq!(r["id"], cohort_runner::rpc::PROMPT_ID, "{r}");
    assert_eq!(r["success"], true, "{r}");
    pi.until_session_over();
    let (status, lines) = pi.close();
    assert_eq!(status.code(), Some(0), "Pi exits 0 when its stdin closes");
    // The same events as `--mode json`, judged the same way; no `session` header line.
    let (parser, v) = rpc_verdict(&lines, 0);
    assert!(matches!(v, StepVerdict::Complete), "{v:?}");
    assert!(parser.summary.saw_agent_end);
    assert!(parser.summary.final_text_len > 0);
    assert_eq!(
        text(
            env.server.last_request()["messages"]
                .as_array()
                .unwrap()
                .last()
                .unwrap()
        ),
        task
    );
    // Unlike `--mode json`, no `session` header line comes first (the runner needs none).
    assert!(!lines.iter().any(|v| v["type"] == "session"), "{lines:?}");
    // 1.6 says `agent_settled` after `agent_end`; 0.73 never does.
    let settled = lines.iter().any(|v| v["type"] == "agent_settled");
    assert_eq!(
        settled,
        major() >= 1,
        "agent_settled on {}",
        cohort_e2e::pi::generation().version
    );
    // The session file was written and ends with the answer.
    let saved = std::fs::read_to_string(&session).unwrap();
    assert!(
        saved.contains(&format!(
            "ECHO: {}",
            task.replace('"', "\\\"").replace('\n', "\\n")
        )),
        "{saved}"
    );
}

#[test]
fn rpc_a_rejected_prompt_says_so_in_its_response() {
    // A second prompt while the first is streaming, without `streamingBehavior`, is refused:
    // the shape of a refusal the runner reads ([`Notice::PromptRejected`]).
    let env = TestEnv::new();
    let mut pi = Rpc::start(&env, &["--no-session", "--model", "fake/slow"]);
    pi.send(serde_json::json!({"type": "prompt", "message": "one"}));
    pi.until("a text delta", |v| v["type"] == "message_update");
    pi.send(serde_json::json!({"id": cohort_runner::rpc::PROMPT_ID, "type": "prompt", "message": "two"}));
    let r = pi.until("the second prompt's response", |v| {
        is_response(v, "prompt") && v["id"] == cohort_runner::rpc::PROMPT_ID
    });
    assert_eq!(r["success"], false, "{r}");
    assert!(r["error"].as_str().is_some_and(|e| !e.is_empty()), "{r}");
    let mut parser = StreamParser::default();
    let line = r.to_string();
    assert!(matches!(
        parser.parse_line(line.as_bytes()),
        Some(cohort_runner::stream::Notice::PromptRejected { .. })
    ));
    let (status, _) = pi.close();
    assert_eq!(status.code(), Some(0));
}

#[test]
fn rpc_a_steer_reaches_the_next_model_call() {
    let env = TestEnv::new();
    let mut pi = Rpc::start(&env, &["--no-session", "--model", "fake/tool"]);
    pi.send(serde_json::json!({"type": "prompt", "message": "RUN: sleep 1; echo SLEPT"}));
    pi.until("the tool's start", |v| v["type"] == "tool_execution_start");
    pi.send(serde_json::json!({"id": "s1", "type": "steer", "message": "STEER: use the red one"}));
    let r = pi.until("the steer's response", |v| is_response(v, "steer"));
    assert_eq!(
        (r["id"].as_str(), r["success"].as_bool()),
        (Some("s1"), Some(true)),
        "{r}"
    );
    pi.until_session_over();
    let (status, _) = pi.close();
    assert_eq!(status.code(), Some(0));
    // The model call after the tool (the second) carries the steer as its last user message,
    // after the tool's result. (The fake `tool` model then calls its tool again: the steer is
    // a new user message.)
    let texts = env.server.user_texts();
    assert_eq!(texts[0], "RUN: sleep 1; echo SLEPT", "{texts:?}");
    assert_eq!(texts[1], "STEER: use the red one", "{texts:?}");
    let second = &env.server.requests()[1];
    let roles: Vec<_> = second["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap_or_default().to_string())
        .collect();
    let tool = roles
        .iter()
        .position(|r| r == "tool")
        .expect("a tool result");
    assert!(
        tool < roles.len() - 1,
        "the steer comes after the tool result: {roles:?}"
    );
}

#[test]
fn rpc_a_follow_up_arrives_after_the_answer() {
    let env = TestEnv::new();
    let mut pi = Rpc::start(&env, &["--no-session", "--model", "fake/tool"]);
    pi.send(serde_json::json!({"type": "prompt", "message": "RUN: sleep 1; echo SLEPT"}));
    pi.until("the tool's start", |v| v["type"] == "tool_execution_start");
    pi.send(serde_json::json!({"id": "f1", "type": "follow_up", "message": "FOLLOW: and then?"}));
    let r = pi.until("the follow-up's response", |v| is_response(v, "follow_up"));
    assert_eq!(
        (r["id"].as_str(), r["success"].as_bool()),
        (Some("f1"), Some(true)),
        "{r}"
    );
    pi.until_session_over();
    let (status, lines) = pi.close();
    assert_eq!(status.code(), Some(0));
    // The model calls: the tool call, the answer (`TOOL DONE: SLEPT`), then the follow-up's,
    // whose conversation holds that answer before the follow-up. No call before the answer
    // carries the follow-up.
    let reqs = env.server.requests();
    let texts = env.server.user_texts();
    assert_eq!(texts[1], "RUN: sleep 1; echo SLEPT", "{texts:?}");
    assert_eq!(texts[2], "FOLLOW: and then?", "{texts:?}");
    let third: Vec<_> = reqs[2]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(text)
        .collect();
    let answer = third
        .iter()
        .position(|t| t == "TOOL DONE: SLEPT")
        .expect("the answer");
    let follow = third
        .iter()
        .position(|t| t == "FOLLOW: and then?")
        .expect("the follow-up");
    assert!(answer < follow, "{third:?}");
    let answers = lines
        .iter()
        .filter(|v| v["type"] == "message_end" && v["message"]["role"] == "assistant")
        .count();
    assert!(answers >= 3, "the follow-up got its own answer: {answers}");
}

#[test]
fn rpc_abort_ends_the_turn_and_the_session_is_saved() {
    let env = TestEnv::new();
    let session = env.tmp.path().join("s.jsonl");
    let s = session.to_str().unwrap();
    let mut pi = Rpc::start(&env, &["--session", s, "--model", "fake/slow"]);
    pi.send(serde_json::json!({"type": "prompt", "message": "count slowly"}));
    pi.until("a text delta", |v| v["type"] == "message_update");
    pi.send(serde_json::json!({"id": "a1", "type": "abort"}));
    let end = pi.until("the aborted message", |v| {
        v["type"] == "message_end" && v["message"]["role"] == "assistant"
    });
    assert_eq!(end["message"]["stopReason"], "aborted", "{end}");
    pi.until_session_over();
    let (status, lines) = pi.close();
    assert_eq!(status.code(), Some(0));
    assert!(lines
        .iter()
        .any(|v| is_response(v, "abort") && v["success"] == true));
    let (_, v) = rpc_verdict(&lines, 0);
    assert!(
        !matches!(v, StepVerdict::Complete),
        "an aborted turn is no answer: {v:?}"
    );
    // The session holds the prompt: a revival continues it.
    let saved = std::fs::read_to_string(&session).unwrap();
    assert!(saved.contains("count slowly"), "{saved}");
}

#[test]
fn rpc_an_extension_dialog_waits_for_an_answer_on_stdin_and_a_cancel_ends_it() {
    // In RPC mode an extension's `ctx.ui.confirm` is an `extension_ui_request` that blocks until
    // an `extension_ui_response` comes on stdin; the runner cancels every dialog at once
    // (`cohort_runner::rpc::dialog_answer`), and the extension gets `false`.
    let env = TestEnv::new();
    let ext = env.tmp.path().join("ask.ts");
    std::fs::write(
        &ext,
        r#"export default function (pi: any) {
  pi.on("before_agent_start", async (_e: any, ctx: any) => {
    const ok = await ctx.ui.confirm("Proceed?", "cohort contract");
    process.stderr.write("CONFIRMED=" + ok + "\n");
  });
}
"#,
    )
    .unwrap();
    let e = ext.to_str().unwrap();
    let mut pi = Rpc::start(&env, &["--no-session", "-e", e, "--model", "fake/plain"]);
    pi.send(serde_json::json!({"type": "prompt", "message": "hello"}));
    let req = pi.until("the dialog", |v| {
        v["type"] == "extension_ui_request" && v["method"] == "confirm"
    });
    assert_eq!(req["title"], "Proceed?", "{req}");
    // The dialog comes before the first model call (`before_agent_start`).
    assert!(
        env.server.requests().is_empty(),
        "the model was called before the answer"
    );
    let answer = cohort_runner::rpc::dialog_answer(req["id"].as_str().unwrap(), "confirm").unwrap();
    pi.stdin
        .as_mut()
        .unwrap()
        .write_all(answer.as_bytes())
        .unwrap();
    pi.until_session_over();
    let (status, lines) = pi.close();
    assert_eq!(status.code(), Some(0));
    let (_, v) = rpc_verdict(&lines, 0);
    assert!(matches!(v, StepVerdict::Complete), "{v:?}");
    let err = std::fs::read_to_string(env.tmp.path().join("rpc.stderr")).unwrap();
    assert!(err.contains("CONFIRMED=false"), "{err}");
}
