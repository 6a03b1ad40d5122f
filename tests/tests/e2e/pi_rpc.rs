//! End-to-end: Pi's RPC mode (`--mode rpc`), the channel a run you can talk to is built on,
//! checked on the Pi generation under test (`COHORT_TEST_PI`).
//!
//! Each test starts the pinned Pi CLI as `node <entry> --mode rpc` against the fake model
//! server, writes JSON commands on its stdin and reads its stdout, and pins one fact per
//! message kind: a command's `id` comes back on its `response`; a `steer` sent while a tool
//! runs is in the very next model call; a `follow_up` is sent after the answer; an `abort`
//! ends the turn with `stopReason: "aborted"`; an extension's `ctx.ui.input` (loaded with `-e`,
//! even beside `--no-extensions`) becomes an `extension_ui_request` on stdout, answered by an
//! `extension_ui_response` on stdin, and resolves `undefined` after its `timeout` when nobody
//! answers. Both generations (0.73.1 and 1.6.0) document
//! these commands in their `docs/rpc.md` (1.6.0: `docs/rpc-commands.md`).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use cohort_e2e::fake_server::{message_text, transcript};
use cohort_e2e::harness::{TestEnv, HERMETIC};
use serde_json::{json, Value};

/// A Pi process in RPC mode: its stdin, and its stdout's records, one per line, read by a
/// thread of their own so the test never blocks on Pi.
struct Rpc {
    child: Child,
    stdin: ChildStdin,
    records: Receiver<Value>,
    /// Every record read so far, in order.
    seen: Vec<Value>,
}

impl Rpc {
    /// Start `node <entry> --mode rpc --no-session <hermetic flags> --model MODEL` in the
    /// env's temp dir.
    fn start(env: &TestEnv, model: &str) -> Rpc {
        Rpc::start_with(env, model, &[])
    }

    /// [`Rpc::start`] with more arguments.
    fn start_with(env: &TestEnv, model: &str, args: &[&str]) -> Rpc {
        let mut c = env.program(&env.node);
        c.arg(&env.pi_entry)
            .args(["--mode", "rpc", "--no-session"])
            .args(HERMETIC)
            .args(["--model", model])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = c.spawn().expect("start Pi in RPC mode");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, records) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        Rpc {
            child,
            stdin,
            records,
            seen: Vec::new(),
        }
    }

    /// Write one command as one JSON line.
    fn send(&mut self, command: Value) {
        writeln!(self.stdin, "{command}").expect("write an RPC command");
        self.stdin.flush().unwrap();
    }

    /// The first record, read already or read now, that satisfies `pred`, waiting at most
    /// `secs` seconds. (Pi may write a command's events before its response.)
    fn until(&mut self, secs: u64, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        if let Some(v) = self.seen.iter().find(|v| pred(v)) {
            return v.clone();
        }
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.records.recv_timeout(left) {
                Ok(v) => {
                    self.seen.push(v.clone());
                    if pred(&v) {
                        return v;
                    }
                }
                Err(_) => panic!(
                    "no {what} within {secs} s; records: {:#?}",
                    self.seen.iter().map(|v| &v["type"]).collect::<Vec<_>>()
                ),
            }
        }
    }

    /// The response to the command whose id is `id`.
    fn response(&mut self, id: &str) -> Value {
        self.until(30, &format!("response {id}"), |v| {
            v["type"] == "response" && v["id"] == id
        })
    }
}

impl Drop for Rpc {
    fn drop(&mut self) {
        // The test's own child, by its handle.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_prompt_is_answered_with_its_id_and_the_run_ends_with_agent_end() {
    let env = TestEnv::new();
    let mut pi = Rpc::start(&env, "fake/plain");
    pi.send(json!({"id": "p1", "type": "prompt", "message": "HELLO RPC"}));
    let r = pi.response("p1");
    assert_eq!(r["command"], "prompt", "{r:#}");
    assert_eq!(r["success"], true, "{r:#}");
    let end = pi.until(30, "agent_end", |v| v["type"] == "agent_end");
    let last = end["messages"].as_array().and_then(|m| m.last()).cloned();
    let last = last.expect("agent_end carries the run's messages");
    assert_eq!(last["role"], "assistant", "{last:#}");
    assert_eq!(message_text(&last), "ECHO: HELLO RPC", "{last:#}");
}

#[test]
fn a_steer_sent_while_a_tool_runs_is_in_the_next_model_call() {
    let env = TestEnv::new();
    let mut pi = Rpc::start(&env, "fake/tool");
    pi.send(json!({"id": "p1", "type": "prompt", "message": "RUN: sleep 2; echo SLEPT"}));
    pi.until(30, "tool_execution_start", |v| {
        v["type"] == "tool_execution_start"
    });
    pi.send(json!({"id": "s1", "type": "steer", "message": "STEER-CONTRACT"}));
    let r = pi.response("s1");
    assert_eq!(
        (r["command"].clone(), r["success"].clone()),
        (json!("steer"), json!(true)),
        "{r:#}"
    );
    let req = env.request_with("STEER-CONTRACT");
    let lines = transcript(&req);
    // The steer comes after the tool's result, in the call that follows the tool: Pi delivers
    // it once the turn's tool calls are done and before the next model call.
    let tool_at = lines
        .iter()
        .position(|l| l.contains("SLEPT"))
        .expect("tool result");
    let steer_at = lines
        .iter()
        .position(|l| l.contains("STEER-CONTRACT"))
        .unwrap();
    assert!(tool_at < steer_at, "{lines:#?}");
    assert!(lines[steer_at].starts_with("user: "), "{lines:#?}");
    // It was the model call right after the tool's: the only earlier one is the first.
    let before = env
        .server
        .requests()
        .iter()
        .take_while(|r| !transcript(r).iter().any(|l| l.contains("STEER-CONTRACT")))
        .count();
    assert_eq!(before, 1, "{:#?}", env.server.user_texts());
    pi.until(30, "agent_end", |v| v["type"] == "agent_end");
}

#[test]
fn a_follow_up_is_sent_after_the_answer() {
    let env = TestEnv::new();
    let mut pi = Rpc::start(&env, "fake/tool");
    pi.send(json!({"id": "p1", "type": "prompt", "message": "RUN: sleep 2; echo FIRST-DONE"}));
    pi.until(30, "tool_execution_start", |v| {
        v["type"] == "tool_execution_start"
    });
    pi.send(json!({"id": "f1", "type": "follow_up", "message": "FOLLOW-CONTRACT"}));
    let r = pi.response("f1");
    assert_eq!(
        (r["command"].clone(), r["success"].clone()),
        (json!("follow_up"), json!(true)),
        "{r:#}"
    );
    let req = env.request_with("FOLLOW-CONTRACT");
    let lines = transcript(&req);
    // The agent answered first (the model's reply to the tool's result), then the follow-up.
    let answer_at = lines
        .iter()
        .position(|l| l.starts_with("assistant: TOOL DONE: FIRST-DONE"))
        .unwrap_or_else(|| panic!("no answer before the follow-up: {lines:#?}"));
    let follow_at = lines
        .iter()
        .position(|l| l.contains("FOLLOW-CONTRACT"))
        .unwrap();
    assert!(answer_at < follow_at, "{lines:#?}");
    assert!(lines[follow_at].starts_with("user: "), "{lines:#?}");
}

#[test]
fn an_abort_ends_the_turn_as_aborted() {
    let env = TestEnv::new();
    let mut pi = Rpc::start(&env, "fake/slow");
    pi.send(json!({"id": "p1", "type": "prompt", "message": "TAKE YOUR TIME"}));
    pi.until(30, "a streamed update", |v| v["type"] == "message_update");
    let asked = Instant::now();
    pi.send(json!({"id": "a1", "type": "abort"}));
    let r = pi.response("a1");
    assert_eq!(
        (r["command"].clone(), r["success"].clone()),
        (json!("abort"), json!(true)),
        "{r:#}"
    );
    let end = pi.until(30, "agent_end", |v| v["type"] == "agent_end");
    // The slow model streams for 60 s; the turn ended long before.
    assert!(asked.elapsed() < Duration::from_secs(20));
    let last = end["messages"]
        .as_array()
        .and_then(|m| m.last())
        .cloned()
        .unwrap();
    assert_eq!(last["role"], "assistant", "{last:#}");
    assert_eq!(last["stopReason"], "aborted", "{last:#}");
    // Pi is still there to take the next prompt: a revived turn.
    pi.send(json!({"id": "p2", "type": "prompt", "message": "AGAIN"}));
    assert_eq!(pi.response("p2")["success"], true);
}

/// An extension registering `contact_supervisor`, whose call asks the RPC client through
/// `ctx.ui.input` and returns the answer as the tool's text.
const ASK_EXTENSION: &str = r#"
export default function (pi) {
  pi.registerTool({
    name: "contact_supervisor",
    label: "Contact supervisor",
    description: "Ask the supervisor a question and wait for the answer.",
    parameters: {
      type: "object",
      properties: { reason: { type: "string" }, message: { type: "string" } },
      required: ["reason", "message"],
    },
    async execute(_id, params, _signal, _onUpdate, ctx) {
      const answer = await ctx.ui.input(params.reason, params.message, { timeout: TIMEOUT_MS });
      return { content: [{ type: "text", text: "ANSWER: " + (answer ?? "none") }], details: {} };
    },
  });
}
"#;

#[test]
fn an_extensions_ui_input_is_an_extension_ui_request_answered_on_stdin() {
    let env = TestEnv::new();
    let ext = env.tmp.path().join("ask.ts");
    std::fs::write(&ext, ASK_EXTENSION.replace("TIMEOUT_MS", "20000")).unwrap();
    let mut pi = Rpc::start_with(&env, "fake/ask", &["-e", ext.to_str().unwrap()]);
    pi.send(json!({"id": "p1", "type": "prompt", "message": "WHICH WAY"}));
    let ask = pi.until(30, "extension_ui_request", |v| {
        v["type"] == "extension_ui_request"
    });
    assert_eq!(ask["method"], "input", "{ask:#}");
    let id = ask["id"].as_str().expect("the request's id").to_string();
    pi.send(json!({"type": "extension_ui_response", "id": id, "value": "GO LEFT"}));
    let req = env.request_with("ANSWER: GO LEFT");
    assert!(transcript(&req)
        .iter()
        .any(|l| l.starts_with("tool: ANSWER: GO LEFT")));
    let end = pi.until(30, "agent_end", |v| v["type"] == "agent_end");
    let last = end["messages"]
        .as_array()
        .and_then(|m| m.last())
        .cloned()
        .unwrap();
    assert_eq!(message_text(&last), "GOT: ANSWER: GO LEFT", "{last:#}");
}

/// An extension whose tool tells the RPC client something with `ctx.ui.notify`, expecting no
/// answer.
const NOTIFY_EXTENSION: &str = r#"
export default function (pi) {
  pi.registerTool({
    name: "contact_supervisor",
    label: "Contact supervisor",
    description: "Tell the supervisor.",
    parameters: {
      type: "object",
      properties: { reason: { type: "string" }, message: { type: "string" } },
      required: ["reason"],
    },
    async execute(_id, params, _signal, _onUpdate, ctx) {
      ctx.ui.notify("NOTE " + params.reason + "\n" + params.message, "info");
      return { content: [{ type: "text", text: "TOLD" }], details: {} };
    },
  });
}
"#;

#[test]
fn an_extensions_ui_notify_is_an_extension_ui_request_that_waits_for_nothing() {
    let env = TestEnv::new();
    let ext = env.tmp.path().join("notify.ts");
    std::fs::write(&ext, NOTIFY_EXTENSION).unwrap();
    let mut pi = Rpc::start_with(&env, "fake/report", &["-e", ext.to_str().unwrap()]);
    pi.send(json!({"id": "p1", "type": "prompt", "message": "HALFWAY"}));
    let note = pi.until(30, "extension_ui_request", |v| {
        v["type"] == "extension_ui_request"
    });
    assert_eq!(note["method"], "notify", "{note:#}");
    assert_eq!(note["message"], "NOTE progress_update\nHALFWAY", "{note:#}");
    // Nothing is answered, and the agent goes on at once.
    let end = pi.until(30, "agent_end", |v| v["type"] == "agent_end");
    let last = end["messages"]
        .as_array()
        .and_then(|m| m.last())
        .cloned()
        .unwrap();
    assert_eq!(message_text(&last), "GOT: TOLD", "{last:#}");
}

#[test]
fn an_unanswered_ui_input_resolves_undefined_after_its_timeout() {
    let env = TestEnv::new();
    let ext = env.tmp.path().join("ask.ts");
    std::fs::write(&ext, ASK_EXTENSION.replace("TIMEOUT_MS", "1500")).unwrap();
    let mut pi = Rpc::start_with(&env, "fake/ask", &["-e", ext.to_str().unwrap()]);
    let asked = Instant::now();
    pi.send(json!({"id": "p1", "type": "prompt", "message": "ANYONE THERE"}));
    let ask = pi.until(30, "extension_ui_request", |v| {
        v["type"] == "extension_ui_request"
    });
    assert_eq!(ask["method"], "input", "{ask:#}");
    // Nobody answers: the tool gets `undefined` once the timeout has passed, and the run goes on.
    let end = pi.until(30, "agent_end", |v| v["type"] == "agent_end");
    assert!(asked.elapsed() >= Duration::from_millis(1500));
    let last = end["messages"]
        .as_array()
        .and_then(|m| m.last())
        .cloned()
        .unwrap();
    assert_eq!(message_text(&last), "GOT: ANSWER: none", "{last:#}");
}
