//! A fake OpenAI-compatible model server for end-to-end tests and the demo.
//!
//! Listens on 127.0.0.1 only (an ephemeral port). Pi POSTs `/v1/chat/completions` with
//! `stream: true` and reads SSE chunks ending in `data: [DONE]`. The behaviour is chosen by the
//! model id:
//!
//! | model | behaviour |
//! |---|---|
//! | `plain` | replies `ECHO: <last user text>` |
//! | `tool` | first asks for a `bash` tool call (the command is the text after `RUN:` in the last user message, else `echo hi`), then replies `TOOL DONE: <tool output>` |
//! | `err400` | HTTP 400 with an OpenAI-style error `bad request from fake model` |
//! | `err500` | HTTP 500 |
//! | `ratelimit` | HTTP 429 with an OpenAI-style error `Rate limit reached for fake model` (type `requests`, code `rate_limit_exceeded`) and `x-should-retry: false`, so the OpenAI client in Pi does not retry it itself: one request per attempt |
//! | `partial` | streams `PARTIAL ANSWER` and ends with `finish_reason` `overloaded` (Pi records a model error after text: an answer cut short) |
//! | `slow` | streams `tick ` every 200 ms for 60 s |
//! | `say` | replies with the text after the first `SAY:` in the last user message, up to a line `---` (where cohort's handoff instructions start) or its end, trimmed (`SAY:` absent: the whole message) |
//! | `ask` | calls `contact_supervisor` with `reason` `need_decision` and the last user message as `message`; once the tool has answered, replies `GOT: <tool result>` |
//! | `intercom` | calls `intercom` with `action` `ask`, `to` `supervisor` and the last user message as `message`; once the tool has answered, replies `GOT: <tool result>` |
//! | `report` | calls `contact_supervisor` with `reason` `progress_update` and the last user message as `message`; once the tool has answered, replies `GOT: <tool result>` |
//! | `busy` | after 100 ms (a model's latency), calls `bash` (`echo BUSY`) every turn; but when the task (the first user message) says `OBEY` and the last message is a user message saying `one turn left` (`--max-turns`' wrap-up), replies `WRAPPED UP after N tool calls` |
//! | `metered` | replies as `plain`, reporting 1000 prompt tokens of which 300 were cached, and 200 completion tokens; the profile gives it prices ([`METERED_PRICES`]) |
//! | `meteredtool` | behaves as `tool`, reporting `metered`'s tokens on each of its two replies, at `metered`'s prices |
//! | `delegate` | delegates as the `cohort` skill teaches: first `read`s the skill's file, from the `<location>` of the skill named `cohort` in the system prompt (no such skill: replies `NO COHORT SKILL`); then runs with `bash` the skill's first `cohort-spawn --wait "TASK"` line, `TASK` replaced by the text after `DELEGATE:` in the user's message (no such line: replies `NO WAIT EXAMPLE`); then replies `DELEGATED: <bash output>` |
//! | `big` | replies with 10 MiB of text in 1 MiB chunks (Pi 0.73.1 on Node 20 dies with ENOBUFS writing much larger lines to a pipe) |
//!
//! Every request is appended to the request log (JSON Lines: `ts`, `model`, `messages` (the
//! system prompt is the first), `tools` (the names of the tools offered), `active` = requests in
//! flight when it arrived) so tests can check what Pi sent.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

/// The model ids the server knows.
pub const MODELS: [&str; 16] = [
    "plain",
    "metered",
    "meteredtool",
    "delegate",
    "tool",
    "err400",
    "err500",
    "slow",
    "big",
    "ratelimit",
    "partial",
    "say",
    "ask",
    "intercom",
    "report",
    "busy",
];

/// The prices `models.json` gives models `metered` and `meteredtool`: dollars per million
/// input, output, cache-read and cache-write tokens. No other model has prices.
pub const METERED_PRICES: [f64; 4] = [3.0, 15.0, 0.3, 3.75];

/// A running server.
pub struct FakeServer {
    /// The port on 127.0.0.1.
    pub port: u16,
    /// Where requests are logged.
    pub log: PathBuf,
}

struct Shared {
    log: Mutex<std::fs::File>,
    active: AtomicUsize,
}

impl FakeServer {
    /// Start on 127.0.0.1 with an ephemeral port, logging requests to `log`.
    pub fn start(log: &Path) -> std::io::Result<FakeServer> {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared {
            log: Mutex::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(log)?,
            ),
            active: AtomicUsize::new(0),
        });
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let shared = shared.clone();
                std::thread::spawn(move || {
                    let _ = handle(stream, &shared);
                });
            }
        });
        Ok(FakeServer {
            port,
            log: log.to_path_buf(),
        })
    }

    /// The base URL Pi's `models.json` should name.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// The last logged request; panics when Pi sent none.
    pub fn last_request(&self) -> Value {
        self.requests()
            .pop()
            .expect("Pi sent a request to the fake server")
    }

    /// Every logged request so far.
    pub fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The text of the last user message of every logged request, in order (requests without
    /// one are left out).
    pub fn user_texts(&self) -> Vec<String> {
        self.requests()
            .iter()
            .filter_map(|r| {
                r["messages"]
                    .as_array()?
                    .iter()
                    .rev()
                    .find(|m| m["role"] == "user")
                    .map(message_text)
            })
            .collect()
    }
}

/// Write `models.json` (provider `fake`, all [`MODELS`]) and `settings.json` (retries off) into
/// a Pi profile dir.
pub fn write_pi_profile(agent_dir: &Path, server: &FakeServer) -> std::io::Result<()> {
    std::fs::create_dir_all(agent_dir)?;
    let [input, output, cache_read, cache_write] = METERED_PRICES;
    let models: Vec<Value> = MODELS
        .iter()
        .map(|&m| match m {
            "metered" | "meteredtool" => json!({"id": m, "cost": {
                "input": input, "output": output, "cacheRead": cache_read, "cacheWrite": cache_write,
            }}),
            _ => json!({"id": m}),
        })
        .collect();
    std::fs::write(
        agent_dir.join("models.json"),
        json!({"providers": {"fake": {
            "baseUrl": server.base_url(),
            "api": "openai-completions",
            "apiKey": "fake-key",
            "models": models,
        }}})
        .to_string(),
    )?;
    std::fs::write(
        agent_dir.join("settings.json"),
        json!({"retry": {"enabled": false}}).to_string(),
    )
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn handle(stream: TcpStream, shared: &Shared) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut out = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line)? == 0 {
            return Ok(());
        }
        let mut len = 0usize;
        loop {
            let mut h = String::new();
            reader.read_line(&mut h)?;
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; len];
        reader.read_exact(&mut body)?;
        if !request_line.starts_with("POST") || !request_line.contains("/chat/completions") {
            write!(out, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")?;
            continue;
        }
        let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let active = shared.active.fetch_add(1, Ordering::SeqCst) + 1;
        let model = req["model"].as_str().unwrap_or("").to_string();
        if let Ok(mut log) = shared.log.lock() {
            let tools: Vec<Value> = req["tools"]
                .as_array()
                .map(|t| t.iter().map(|t| t["function"]["name"].clone()).collect())
                .unwrap_or_default();
            let line = json!({"ts": now_ms(), "model": model, "messages": req["messages"], "tools": tools, "active": active});
            let _ = writeln!(log, "{line}");
        }
        let result = respond(&mut out, &model, &req);
        shared.active.fetch_sub(1, Ordering::SeqCst);
        result?;
        // One request per connection keeps the SSE framing simple.
        return Ok(());
    }
}

/// The roles and texts of a logged request's messages, as `role: text` lines (the system
/// prompt first).
pub fn transcript(req: &Value) -> Vec<String> {
    req["messages"]
        .as_array()
        .map(|ms| {
            ms.iter()
                .map(|m| format!("{}: {}", m["role"].as_str().unwrap_or(""), message_text(m)))
                .collect()
        })
        .unwrap_or_default()
}

/// The text of a logged or received message: its `content` string, or its text parts joined.
pub fn message_text(m: &Value) -> String {
    match &m["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

fn chunk(
    out: &mut TcpStream,
    model: &str,
    delta: Value,
    finish: Option<&str>,
) -> std::io::Result<()> {
    let c = json!({
        "id": "fake", "object": "chat.completion.chunk", "created": 1, "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    });
    write!(out, "data: {c}\n\n")?;
    out.flush()
}

fn finish(out: &mut TcpStream, model: &str, reason: &str) -> std::io::Result<()> {
    let usage = match model {
        "metered" | "meteredtool" => {
            json!({"prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200,
            "prompt_tokens_details": {"cached_tokens": 300}})
        }
        _ => json!({"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}),
    };
    let c = json!({
        "id": "fake", "object": "chat.completion.chunk", "created": 1, "model": model,
        "choices": [{"index": 0, "delta": {}, "finish_reason": reason}],
        "usage": usage,
    });
    write!(out, "data: {c}\n\ndata: [DONE]\n\n")?;
    out.flush()
}

/// A whole text reply in one chunk, then `stop`.
fn reply(out: &mut TcpStream, model: &str, text: &str) -> std::io::Result<()> {
    chunk(
        out,
        model,
        json!({"role": "assistant", "content": text}),
        None,
    )?;
    finish(out, model, "stop")
}

fn respond(out: &mut TcpStream, model: &str, req: &Value) -> std::io::Result<()> {
    let messages = req["messages"].as_array().cloned().unwrap_or_default();
    let last_user = messages
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .map(message_text)
        .unwrap_or_default();
    let last_tool = messages
        .last()
        .filter(|m| m["role"] == "tool")
        .map(message_text);
    match model {
        "err400" | "err500" => {
            let (code, text) = if model == "err400" {
                (400, "Bad Request")
            } else {
                (500, "Internal Server Error")
            };
            let body = json!({"error": {"message": format!("{} from fake model", if code == 400 {"bad request"} else {"server error"}), "type": "invalid_request_error"}}).to_string();
            write!(out, "HTTP/1.1 {code} {text}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())?;
            return out.flush();
        }
        "ratelimit" => {
            let body = json!({"error": {"message": "Rate limit reached for fake model; try again later", "type": "requests", "code": "rate_limit_exceeded"}}).to_string();
            // `x-should-retry: false`: the OpenAI client Pi uses retries a 429 twice on its own
            // otherwise, whatever Pi's retry setting says.
            write!(out, "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nx-should-retry: false\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())?;
            return out.flush();
        }
        _ => {}
    }
    write!(out, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n")?;
    match model {
        "tool" | "meteredtool" if last_tool.is_none() => {
            let command = last_user
                .split_once("RUN:")
                .map(|(_, c)| c.trim().to_string())
                .unwrap_or_else(|| "echo hi".into());
            chunk(
                out,
                model,
                json!({"role": "assistant", "tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "bash", "arguments": json!({"command": command}).to_string()}}]}),
                None,
            )?;
            finish(out, model, "tool_calls")
        }
        "tool" | "meteredtool" => reply(
            out,
            model,
            &format!("TOOL DONE: {}", last_tool.unwrap_or_default().trim()),
        ),
        "slow" => {
            chunk(
                out,
                model,
                json!({"role": "assistant", "content": "tick "}),
                None,
            )?;
            for _ in 0..300 {
                std::thread::sleep(Duration::from_millis(200));
                chunk(out, model, json!({"content": "tick "}), None)?;
            }
            finish(out, model, "stop")
        }
        "big" => {
            let piece = "z".repeat(1 << 20);
            chunk(
                out,
                model,
                json!({"role": "assistant", "content": "BIG:"}),
                None,
            )?;
            for _ in 0..10 {
                chunk(out, model, json!({"content": piece}), None)?;
            }
            finish(out, model, "stop")
        }
        "partial" => {
            chunk(
                out,
                model,
                json!({"role": "assistant", "content": "PARTIAL ANSWER"}),
                None,
            )?;
            finish(out, model, "overloaded")
        }
        "say" => reply(out, model, say_text(&last_user)),
        "ask" => match last_tool {
            None => tool_call(
                out,
                model,
                "contact_supervisor",
                json!({"reason": "need_decision", "message": last_user}),
            ),
            Some(answer) => reply(out, model, &format!("GOT: {}", answer.trim())),
        },
        "busy" => {
            // A model's latency: the runner's reaction to a turn (its `--max-turns` abort) is
            // not raced against an instant loop, which a loaded machine can lose by turns.
            std::thread::sleep(Duration::from_millis(100));
            let first_user = messages
                .iter()
                .find(|m| m["role"] == "user")
                .map(message_text)
                .unwrap_or_default();
            let told = messages
                .last()
                .is_some_and(|m| m["role"] == "user" && message_text(m).contains("one turn left"));
            if told && first_user.contains("OBEY") {
                let calls = messages.iter().filter(|m| m["role"] == "tool").count();
                reply(out, model, &format!("WRAPPED UP after {calls} tool calls"))
            } else {
                tool_call(out, model, "bash", json!({"command": "echo BUSY"}))
            }
        }
        "report" => match last_tool {
            None => tool_call(
                out,
                model,
                "contact_supervisor",
                json!({"reason": "progress_update", "message": last_user}),
            ),
            Some(answer) => reply(out, model, &format!("GOT: {}", answer.trim())),
        },
        "intercom" => match last_tool {
            None => tool_call(
                out,
                model,
                "intercom",
                json!({"action": "ask", "to": "supervisor", "message": last_user}),
            ),
            Some(answer) => reply(out, model, &format!("GOT: {}", answer.trim())),
        },
        "delegate" => delegate(out, model, &messages, &last_user),
        _ => reply(out, model, &format!("ECHO: {last_user}")),
    }
}

/// One tool call of `name` with `args`, then `tool_calls`.
fn tool_call(out: &mut TcpStream, model: &str, name: &str, args: Value) -> std::io::Result<()> {
    chunk(
        out,
        model,
        json!({"role": "assistant", "tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": name, "arguments": args.to_string()}}]}),
        None,
    )?;
    finish(out, model, "tool_calls")
}

/// Model `delegate`'s turn, from the tool results so far (see the module's table).
fn delegate(
    out: &mut TcpStream,
    model: &str,
    messages: &[Value],
    last_user: &str,
) -> std::io::Result<()> {
    let tool_results: Vec<String> = messages
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(message_text)
        .collect();
    match tool_results.as_slice() {
        [] => {
            let system = messages.first().map(message_text).unwrap_or_default();
            match skill_location(&system, "cohort") {
                Some(path) => tool_call(out, model, "read", json!({"path": path})),
                None => reply(out, model, "NO COHORT SKILL"),
            }
        }
        [skill] => {
            let task = last_user
                .split_once("DELEGATE:")
                .map_or("", |(_, t)| t.trim());
            match wait_example(skill) {
                Some(line) => {
                    let command = line.replacen("TASK", task, 1);
                    tool_call(out, model, "bash", json!({"command": command}))
                }
                None => reply(out, model, "NO WAIT EXAMPLE"),
            }
        }
        [.., answer] => reply(out, model, &format!("DELEGATED: {}", answer.trim())),
    }
}

/// The `<location>` of the skill named `name` in a system prompt's `<available_skills>`.
pub fn skill_location(system: &str, name: &str) -> Option<String> {
    let at = system.find(&format!("<name>{name}</name>"))?;
    let rest = &system[at..];
    let end = rest.find("</skill>")?;
    let (_, loc) = rest[..end].split_once("<location>")?;
    let (loc, _) = loc.split_once("</location>")?;
    Some(loc.trim().to_string())
}

/// The first `cohort-spawn --wait --quiet "TASK"` command in a skill's text (up to the line's end, a
/// closing backtick or a `#` comment).
pub fn wait_example(skill: &str) -> Option<String> {
    let at = skill.find("cohort-spawn --wait --quiet \"TASK\"")?;
    let line = skill[at..].lines().next()?;
    let line = line.split('`').next().unwrap_or(line);
    let line = line.split(" #").next().unwrap_or(line);
    Some(line.trim_end().to_string())
}

/// What model `say` answers to `message`: the text after the first `SAY:`, up to a line `---`
/// or the end, trimmed.
pub fn say_text(message: &str) -> &str {
    let after = message.split_once("SAY:").map_or(message, |(_, a)| a);
    let body = after.split_once("\n---\n").map_or(after, |(b, _)| b);
    body.trim()
}
