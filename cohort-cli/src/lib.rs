//! cohort-cli: the command-line conventions all four binaries share, so a script meets the same
//! behaviour whichever tool it calls. Kept apart from `cohort-common` (the run-directory
//! contract) because it is about the shell, not about runs: the whole `main` of a binary
//! ([`main`]), parsing the command line with usage errors on one line, completion scripts and
//! man pages generated from the command line (`--generate`), printing an error chain once with
//! the right exit code, treating a closed stdout (`cohort-status | head -1`) as success, aligned
//! tables ([`table`]), and byte sizes in the same human units everywhere.
//!
//! Usage errors are rendered here rather than by clap: clap prints three to seven lines (a tip,
//! the usage, "For more information…"), and its tip for a value that starts with `-` ("use
//! `-- -5m`") is wrong for cohort, where everything after `--` goes to Pi.

#![deny(missing_docs)]

use std::error::Error as StdError;
use std::io::{self, IsTerminal, Write};
use std::process::ExitCode;

use clap::error::{ContextKind, ContextValue, ErrorKind};

pub mod complete;
pub mod duration;
pub mod table;
pub mod text;

use cohort_common::exit;

/// What a binary's positional arguments are, which decides the hint a usage error gets
/// ([`usage_line`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operands {
    /// Names (run ids, a run directory): an unexpected argument is only reported.
    Names,
    /// Free-text tasks: an unexpected argument that looks like a task starting with `-` gets a
    /// hint to read it from stdin.
    Tasks,
}

/// The whole `main` of a cohort binary: answer a shell's completion request and exit
/// ([`complete`]: `COMPLETE=<shell>` set), else parse the command line into `A`
/// ([`parse_args`]), call `run` with it, and map its result to the exit code: `Ok(code)` exits
/// `code`; an error is printed once, on one line of stderr, and exits with its code ([`fail`]),
/// a closed stdout exiting 0.
pub fn main<A: clap::Parser>(
    bin: &str,
    operands: Operands,
    run: impl FnOnce(A) -> anyhow::Result<u8>,
) -> ExitCode {
    complete::answer_and_exit_if_asked(A::command);
    let args = match parse_args::<A>(bin, operands) {
        Ok(args) => args,
        Err(code) => return code,
    };
    match run(args) {
        Ok(code) => ExitCode::from(code),
        Err(err) => fail(bin, err.as_ref()),
    }
}

/// Parse the command line into `A`, the way every cohort binary does: `--help` and `--version`
/// print in full on stdout and exit 0; any other error is one line on stderr,
/// `<bin>: error: …` ([`usage_line`], with the hint `operands` calls for), and exit 2
/// ([`exit::ERROR`]). `Err` carries the exit code to return from `main`.
pub fn parse_args<A: clap::Parser>(bin: &str, operands: Operands) -> Result<A, ExitCode> {
    A::try_parse().map_err(|e| match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            ExitCode::from(exit::SUCCESS)
        }
        _ => {
            let _ = writeln!(io::stderr(), "{}", usage_line(bin, &e, operands));
            ExitCode::from(exit::ERROR)
        }
    })
}

/// The one line a usage error prints (pure over the error): `<bin>: error: <what clap found>;
/// try '<bin> --help'`, with clap's tips and usage dropped and a multi-line message (a list of
/// missing arguments) joined with spaces; a near miss (`--modle`) adds clap's suggestion,
/// `did you mean '--model'?`. For [`Operands::Tasks`], an unexpected argument that
/// starts with a single `-` or holds a space — a task, not a mistyped flag — is followed by how
/// to pass it: from stdin with `-`.
pub fn usage_line(bin: &str, err: &clap::Error, operands: Operands) -> String {
    let rendered = err.render().to_string();
    let head = rendered.split("\n\n").next().unwrap_or("");
    let mut msg = head
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("tip:"))
        .collect::<Vec<_>>()
        .join(" ");
    if let Some(rest) = msg.strip_prefix("error: ") {
        msg = rest.to_string();
    }
    // clap's near-miss suggestion (its "tip: a similar argument exists") sits below the head.
    if let Some(ContextValue::String(similar)) = err.get(ContextKind::SuggestedArg) {
        msg.push_str(&format!(" (did you mean '{similar}'?)"));
    } else if let Some(ContextValue::Strings(values)) = err.get(ContextKind::SuggestedValue) {
        if let Some(v) = values.first() {
            msg.push_str(&format!(" (did you mean '{v}'?)"));
        }
    }
    let invalid = match err.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(s)) => Some(s.as_str()),
        _ => None,
    };
    match invalid {
        Some(arg)
            if operands == Operands::Tasks
                && err.kind() == ErrorKind::UnknownArgument
                && ((arg.starts_with('-') && !arg.starts_with("--")) || arg.contains(' ')) =>
        {
            format!(
                "{bin}: error: {msg}; a task that starts with '-' is read from stdin: echo '{arg} …' | {bin} -"
            )
        }
        _ => format!("{bin}: error: {msg}; try '{bin} --help'"),
    }
}

/// A usage error a binary finds after clap has parsed its command line (`no task given`,
/// `--output takes exactly one run`): exit 2, and [`fail`] ends its line with the same
/// `try '<bin> --help'` hint as a parse error. Made with [`usage_error`].
#[derive(Debug)]
pub struct CommandLineError(pub String);

impl std::fmt::Display for CommandLineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl StdError for CommandLineError {}

/// A [`CommandLineError`] saying `msg`, as an `anyhow::Error` to return from a binary's `run`.
pub fn usage_error(msg: impl Into<String>) -> anyhow::Error {
    CommandLineError(msg.into()).into()
}

/// What `--generate KIND` prints on stdout, the ripgrep way: a shell's completion
/// registration (which asks the binary for candidates as the user types: [`complete`]), or
/// the man page (roff).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Generate {
    /// A bash completion script.
    CompleteBash,
    /// A zsh completion script.
    CompleteZsh,
    /// A fish completion script.
    CompleteFish,
    /// The man page, section 1, in roff.
    Man,
}

/// The `--generate KIND` flag, flattened into each binary's command line
/// (`#[command(flatten)]`) so the three define it once.
#[derive(Clone, Copy, Debug, clap::Args)]
pub struct GenerateArg {
    /// Print a completion script (complete-bash, complete-zsh, complete-fish) or the man page
    /// (man) on stdout, and exit.
    #[arg(long, value_name = "KIND", exclusive = true)]
    pub generate: Option<Generate>,
}

/// Print what `--generate kind` asks for the command line `A` ([`generate`]) on stdout.
pub fn print_generated<A: clap::CommandFactory>(kind: Generate, page: &ManPage) -> io::Result<()> {
    out_bytes(&generate(A::command(), kind, page))
}

/// What a binary's man page adds to what clap knows of its command line. Kept as data so the
/// same table also feeds `--help` ([`exit_codes_help`]).
#[derive(Clone, Copy, Debug)]
pub struct ManPage {
    /// The exit codes this binary uses and what each means for it (from [`cohort_common::exit`]).
    pub exit_codes: &'static [(u8, &'static str)],
    /// Examples: (command line, what it does).
    pub examples: &'static [(&'static str, &'static str)],
    /// Further sections: (title, text). Paragraphs are separated by a blank line; a paragraph
    /// whose lines all start with two spaces is kept as preformatted text.
    pub sections: &'static [(&'static str, &'static str)],
}

/// The exit-code table as one paragraph for `--help` (`after_help`): `Exit codes: 0 …; 1 …`.
pub fn exit_codes_help(codes: &[(u8, &str)]) -> String {
    let parts: Vec<String> = codes.iter().map(|(c, m)| format!("{c} {m}")).collect();
    format!("Exit codes: {}.", parts.join("; "))
}

/// Render what `--generate what` prints for the command `cmd` (its name is the binary's):
/// the shell's completion registration, calling this executable back
/// ([`complete::registration`]), or a man page from `clap_mangen` (name, synopsis,
/// description, options) followed by `page`'s sections, EXIT STATUS and EXAMPLES.
pub fn generate(cmd: clap::Command, what: Generate, page: &ManPage) -> Vec<u8> {
    use clap_complete::Shell;
    let name = cmd.get_name().to_string();
    let shell = match what {
        Generate::CompleteBash => Shell::Bash,
        Generate::CompleteZsh => Shell::Zsh,
        Generate::CompleteFish => Shell::Fish,
        Generate::Man => return man_page(cmd, page),
    };
    complete::registration(shell, &name, &complete::this_executable(&name))
}

fn man_page(cmd: clap::Command, page: &ManPage) -> Vec<u8> {
    use roff::{bold, roman, Roff};
    // The exit codes get their own section; clap's "EXTRA" (after_help) would repeat them.
    let cmd = cmd.after_help(None::<&str>).after_long_help(None::<&str>);
    let mut built = cmd.clone();
    built.build();
    let man_cmd = &built;
    let man = clap_mangen::Man::new(cmd.clone());
    // Each render_* call writes roff's preamble; keep the first only.
    let preamble = Roff::new().render();
    let mut out = String::new();
    type Render = fn(&clap_mangen::Man, &mut dyn Write) -> io::Result<()>;
    let synopsis = synopsis(man_cmd);
    let parts: [Render; 4] = [
        clap_mangen::Man::render_title,
        clap_mangen::Man::render_name_section,
        clap_mangen::Man::render_description_section,
        clap_mangen::Man::render_options_section,
    ];
    for (i, render) in parts.iter().enumerate() {
        if i == 2 {
            out.push_str(&synopsis);
        }
        let mut buf = Vec::new();
        render(&man, &mut buf).expect("writing to a Vec cannot fail");
        let text = String::from_utf8_lossy(&buf).into_owned();
        match text.strip_prefix(&preamble) {
            Some(rest) if i > 0 => out.push_str(rest),
            _ => out.push_str(&text),
        }
    }
    let mut r = Roff::new();
    for (title, text) in page.sections {
        r.control("SH", [title.to_uppercase().as_str()]);
        for para in text.split("\n\n") {
            if para.lines().all(|l| l.starts_with("  ")) {
                r.control("PP", []).control("nf", []);
                for l in para.lines() {
                    r.text([roman(l)]);
                }
                r.control("fi", []);
            } else {
                r.control("PP", []).text([roman(para.replace('\n', " "))]);
            }
        }
    }
    r.control("SH", ["EXIT STATUS"]);
    for (code, meaning) in page.exit_codes {
        r.control("TP", []).text([bold(code.to_string())]);
        r.text([roman(*meaning)]);
    }
    r.control("SH", ["EXAMPLES"]);
    for (command, what) in page.examples {
        r.control("TP", []).text([bold(*command)]);
        r.text([roman(*what)]);
    }
    out.push_str(&r.to_roff());
    out.into_bytes()
}

/// The man page's SYNOPSIS section (roff, pure over `cmd`): the name, then each option that is
/// not hidden as `[--long VALUE]` (its value placeholders, `...` when it repeats) or `[--flag]`,
/// then the operands as `[NAME]...`.
fn synopsis(cmd: &clap::Command) -> String {
    use roff::{bold, italic, roman, Inline, Roff};
    let mut parts: Vec<Inline> = vec![bold(cmd.get_name())];
    let (operands, options): (Vec<&clap::Arg>, Vec<&clap::Arg>) = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set())
        .partition(|a| a.is_positional());
    let many = |a: &clap::Arg| {
        matches!(
            a.get_action(),
            clap::ArgAction::Append | clap::ArgAction::Count
        )
    };
    for a in options {
        let flag = match (a.get_long(), a.get_short()) {
            (Some(l), _) => format!("--{l}"),
            (None, Some(c)) => format!("-{c}"),
            (None, None) => continue,
        };
        parts.push(roman(" ["));
        parts.push(bold(flag));
        if a.get_action().takes_values() {
            let names: Vec<String> = match a.get_value_names() {
                Some(n) => n.iter().map(|n| n.to_string()).collect(),
                None => vec![a.get_id().as_str().to_uppercase()],
            };
            for n in names {
                parts.push(roman(" "));
                parts.push(italic(n));
            }
        }
        parts.push(roman(if many(a) { "]..." } else { "]" }));
    }
    for a in operands {
        let name = a
            .get_value_names()
            .and_then(|n| n.first().map(|n| n.to_string()))
            .unwrap_or_else(|| a.get_id().as_str().to_uppercase());
        let open = if a.is_required_set() { " " } else { " [" };
        let close = if a.is_required_set() { "" } else { "]" };
        parts.push(roman(open));
        parts.push(italic(name));
        parts.push(roman(close));
        if many(a) {
            parts.push(roman("..."));
        }
    }
    let mut r = Roff::new();
    r.control("SH", ["SYNOPSIS"]).text(parts);
    r.to_roff()
}

/// Print `err` and its causes on stderr as one line, `<bin>: error: …`, and return the exit code:
/// the [`cohort_common::Error::exit_code`] of the first library error in the chain, else
/// [`exit::ERROR`]. Control characters in the message are shown escaped
/// ([`crate::text::untrusted`]). A broken pipe anywhere in the chain exits 0 quietly: the reader has all it
/// wanted.
pub fn fail(bin: &str, err: &(dyn StdError + 'static)) -> ExitCode {
    let mut code = None;
    let mut hint = false;
    let mut parts: Vec<String> = Vec::new();
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            if io.kind() == io::ErrorKind::BrokenPipe {
                return ExitCode::from(exit::SUCCESS);
            }
        }
        if code.is_none() {
            code = e
                .downcast_ref::<cohort_common::Error>()
                .map(cohort_common::Error::exit_code);
        }
        if code.is_none() && e.downcast_ref::<CommandLineError>().is_some() {
            code = Some(exit::ERROR);
            hint = true;
        }
        let m = e.to_string();
        // A wrapper that already prints its source inline is not printed twice.
        if !parts.last().map(|p| p.contains(&m)).unwrap_or(false) {
            parts.push(m);
        }
        cur = e.source();
    }
    // Messages quote names, paths and errors that may have come from a run: escaped, one line.
    let hint = if hint {
        format!("; try '{bin} --help'")
    } else {
        String::new()
    };
    let _ = writeln!(
        io::stderr(),
        "{bin}: error: {}{hint}",
        crate::text::untrusted(&parts.join(": "))
    );
    ExitCode::from(code.unwrap_or(exit::ERROR))
}

/// Write `text` to stdout and flush. A closed pipe is `Err(BrokenPipe)`, which [`fail`] turns
/// into exit 0.
pub fn out(text: &str) -> io::Result<()> {
    out_bytes(text.as_bytes())
}

/// Write the model's own text (a run's answer, its output log) to stdout and flush: byte for
/// byte to a pipe or a file, where it is data; on a terminal with every escape sequence and
/// control character shown as a visible escape, newlines and tabs kept
/// ([`crate::text::escape`] with [`crate::text::Keep::LineBreaks`]), so a reply steered by
/// prompt injection cannot drive the terminal.
pub fn out_model(bytes: &[u8]) -> io::Result<()> {
    if io::stdout().is_terminal() {
        out(&crate::text::escape(bytes, crate::text::Keep::LineBreaks))
    } else {
        out_bytes(bytes)
    }
}

/// A run's answer through [`out_model`], with a newline after it unless it is empty or
/// already ends with one.
pub fn out_answer(text: &str) -> io::Result<()> {
    out_model(text.as_bytes())?;
    if !text.is_empty() && !text.ends_with('\n') {
        out("\n")?;
    }
    Ok(())
}

/// Write `bytes` to stdout and flush, like [`out`].
pub fn out_bytes(bytes: &[u8]) -> io::Result<()> {
    let mut o = io::stdout().lock();
    o.write_all(bytes)?;
    o.flush()
}

/// Bytes in a human unit: `512 B`, `3.4 KiB`, `12.0 MiB`, `1.2 GiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// A command line with the shapes the binaries use.
    #[derive(Parser, Debug)]
    #[command(name = "t", version)]
    struct T {
        tasks: Vec<String>,
        #[arg(long, value_parser = crate::duration::parse)]
        since: Option<std::time::Duration>,
        #[arg(long)]
        a: bool,
        #[arg(long, conflicts_with = "a")]
        b: bool,
        #[arg(long, required = true)]
        need: Option<String>,
    }

    fn line(args: &[&str], operands: Operands) -> String {
        let e = T::try_parse_from(std::iter::once("t").chain(args.iter().copied())).unwrap_err();
        usage_line("t", &e, operands)
    }

    #[test]
    fn usage_errors_are_one_line_without_clap_tips() {
        let cases: [(&[&str], &str); 5] = [
            (
                &["--need", "x", "--bogus"],
                "unexpected argument '--bogus' found",
            ),
            (
                &["--need", "x", "--since", "7"],
                "duration \"7\" has no unit",
            ),
            (&["--need", "x", "--a", "--b"], "cannot be used with"),
            (
                &[],
                "the following required arguments were not provided: --need <NEED>",
            ),
            (
                &["--need", "x", "--since", "-5m"],
                "unexpected argument '-5' found",
            ),
        ];
        for (args, want) in cases {
            let l = line(args, Operands::Names);
            assert!(!l.contains('\n'), "{args:?}: {l}");
            assert!(l.starts_with("t: error: "), "{args:?}: {l}");
            assert!(l.contains(want), "{args:?}: {l}");
            assert!(!l.contains("tip:") && !l.contains("'--'"), "{args:?}: {l}");
            assert!(l.ends_with("try 't --help'"), "{args:?}: {l}");
        }
    }

    const PAGE: ManPage = ManPage {
        exit_codes: &[(0, "success"), (2, "usage or operational error")],
        examples: &[("t --since 2h", "runs of the last two hours")],
        sections: &[(
            "Files",
            "One paragraph\nof two lines.\n\n  preformatted\n  block",
        )],
    };

    #[test]
    fn the_man_page_is_roff_with_exit_codes_and_examples() {
        use clap::CommandFactory;
        let man = String::from_utf8(generate(T::command(), Generate::Man, &PAGE)).unwrap();
        assert!(man.contains(".TH t 1"), "{man}");
        assert_eq!(
            man.matches(".ds Aq").count(),
            2,
            "one preamble (.ie/.el): {man}"
        );
        for want in [
            ".SH NAME",
            ".SH SYNOPSIS\n\\fBt\\fR [\\fB\\-\\-since\\fR \\fISINCE\\fR] [\\fB\\-\\-a\\fR]",
            "[\\fB\\-\\-need\\fR \\fINEED\\fR]",
            "[\\fITASKS\\fR]...\n.SH DESCRIPTION",
            ".SH OPTIONS",
            ".SH FILES\n.PP\nOne paragraph of two lines.\n.PP\n.nf\n  preformatted\n  block\n.fi",
            ".SH \"EXIT STATUS\"\n.TP\n\\fB0\\fR\nsuccess\n.TP\n\\fB2\\fR",
            ".SH EXAMPLES\n.TP\n\\fBt \\-\\-since 2h\\fR\nruns of the last two hours",
        ] {
            assert!(man.contains(want), "lacks {want:?}: {man}");
        }
        assert_eq!(
            exit_codes_help(PAGE.exit_codes),
            "Exit codes: 0 success; 2 usage or operational error."
        );
    }

    #[test]
    fn completion_scripts_name_the_binary() {
        use clap::CommandFactory;
        let zsh = String::from_utf8(generate(T::command(), Generate::CompleteZsh, &PAGE)).unwrap();
        assert!(zsh.starts_with("#compdef t"), "{zsh}");
        let bash =
            String::from_utf8(generate(T::command(), Generate::CompleteBash, &PAGE)).unwrap();
        assert!(bash.contains("-F _clap_complete_t t\n"), "{bash}");
        // The script asks this executable for the candidates as the user types.
        let exe = std::env::current_exe().unwrap();
        assert!(bash.contains(&*exe.to_string_lossy()), "{bash}");
    }

    #[test]
    fn a_near_miss_gets_clap_s_suggestion() {
        let l = line(&["--need", "x", "--sinse", "2h"], Operands::Names);
        assert!(
            l.contains("unexpected argument '--sinse' found (did you mean '--since'?)"),
            "{l}"
        );
        assert!(l.ends_with("try 't --help'"), "{l}");
        // Nothing near: no suggestion.
        let l = line(&["--need", "x", "--zzzzzz"], Operands::Names);
        assert!(!l.contains("did you mean"), "{l}");
    }

    #[test]
    fn a_task_that_looks_like_a_flag_gets_the_stdin_hint() {
        let l = line(&["--need", "x", "-v means verbose"], Operands::Tasks);
        assert!(l.contains("read from stdin: echo '-v …' | t -"), "{l}");
        // A mistyped long flag is not a task: no hint.
        let l = line(&["--need", "x", "--bogus"], Operands::Tasks);
        assert!(l.ends_with("try 't --help'"), "{l}");
    }

    #[test]
    fn bytes_in_binary_units() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3 * 1024 + 512), "3.5 KiB");
        assert_eq!(human_bytes(5 * 1024 * 1024), "5.0 MiB");
    }
}
