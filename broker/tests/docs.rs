//! The pages that map the code quote only code that exists.
//!
//! `docs/architecture.md`, `docs/storage-engine.md` and
//! `docs/produce-path.md` quote files, functions, types and metric names in
//! backticks so that a reader can grep for them. A rename that forgets the
//! page leaves the reader grepping for nothing. This test reads each page,
//! takes every backticked span outside fenced code blocks, sorts it into a
//! [`Kind`], and checks that what it names is in the workspace:
//!
//! - a path (`src/shard/moves.rs`, `tests/sim/`) is a file or folder,
//!   relative to the workspace root, to a crate's folder, or to a crate's
//!   `src/` or `tests/`;
//! - a file name without a folder (`faults.rs`, `peers.sh`) names some file
//!   of the workspace;
//! - an identifier or a path of them (`Shard::produce`, `run_moves()`,
//!   `Topic(action)`): every segment is a whole word of some `.rs` file; a
//!   function named after a type (`Wal::append`) is declared in a top-level
//!   `impl` or `trait` block of that type; a function named after a module
//!   (`log::messages_in_segments`) or called (`sweep_owner()`) is declared
//!   with `fn` somewhere;
//! - a metric name (`narad_acks_total`, or a prefix such as
//!   `narad_fanout_child_*`) is a string in `broker/src/metric_names.rs` or
//!   `storage/src/metric_names.rs` (whose names the broker re-exports); a
//!   `narad_` span that is no metric is checked as an identifier (a crate
//!   path such as `narad_storage`);
//! - a package or thread name (`narad-storage`, `narad-peer`), a config key
//!   (`cluster.move_bytes_per_s`) or the name of a file the node writes
//!   (`node.epoch`) is a quoted string in some `Cargo.toml` or `.rs` file
//!   (config keys are all in the key table of `broker/src/config.rs`).
//!
//! What is skipped, and why, is in [`classify`]. The test fails naming every
//! missing name at once.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The pages checked, relative to the workspace root.
const PAGES: &[&str] = &[
    "docs/architecture.md",
    "docs/storage-engine.md",
    "docs/produce-path.md",
];

/// Folders a relative path in a page may start from, besides the root.
const CRATES: &[&str] = &[
    "broker",
    "storage",
    "raft",
    "net",
    "net/client",
    "check",
    "bench",
];

/// Where metric names are defined, as string constants.
const METRIC_FILES: &[&str] = &["broker/src/metric_names.rs", "storage/src/metric_names.rs"];

/// Spans that look like code names but are not found by the rules above,
/// each with its reason. Empty, and best kept so.
const ALLOWED: &[(&str, &str)] = &[];

/// What a backticked span is, and so how it is checked.
#[derive(Debug, PartialEq)]
enum Kind {
    /// A file or folder path: it must exist.
    Path,
    /// A file name without a folder: some file has that name.
    FileName,
    /// Rust names joined by `::`, maybe called (`f()`, `Topic(action)`).
    Identifier(Vec<String>),
    /// A metric name, or a prefix of metric names ending in `*`.
    Metric,
    /// A name the code spells as a string: a package (`narad-storage`), a
    /// thread (`narad-peer`), a config key (`storage.segment_bytes`), a file
    /// the node writes (`ring.wal`).
    Quoted,
    /// Not a code name; the reason says what it is.
    Skip(&'static str),
}

/// Sorts a span into the kind that checks it. Skipped, each for its reason:
/// phrases, commands and log lines (they hold a space), flags, HTTP paths,
/// numbers and status codes, URLs, `.await` and hidden file names, names
/// with placeholders (`{topic}`, or capitals as in `SEQ-BASE.seg`), and
/// other syntax (headers such as `Narad-Key`, generic types, token shapes).
fn classify(span: &str) -> Kind {
    if span.is_empty() {
        return Kind::Skip("empty");
    }
    if span.chars().any(char::is_whitespace) {
        return Kind::Skip("a phrase, command line, log line or method and path");
    }
    if span.starts_with('-') {
        return Kind::Skip("a command-line flag");
    }
    if span.starts_with('/') {
        return Kind::Skip("an HTTP path");
    }
    if span.starts_with('.') {
        return Kind::Skip("`.await` or a hidden file the node writes");
    }
    if span.starts_with(|c: char| c.is_ascii_digit()) {
        return Kind::Skip("a number, size or status code");
    }
    if span.contains("://") {
        return Kind::Skip("a URL");
    }
    if span.contains('/') {
        if span.chars().all(is_path_char) {
            return Kind::Path;
        }
        return Kind::Skip("a path with placeholders");
    }
    if span.starts_with("narad_") && !span.contains("::") {
        return Kind::Metric;
    }
    if span.starts_with("narad-") && span.chars().all(is_path_char) {
        return Kind::Quoted;
    }
    if let Some(segments) = identifier_segments(span) {
        return Kind::Identifier(segments);
    }
    if let Some((_, extension)) = span.rsplit_once('.') {
        if !span.chars().all(is_path_char) || span.chars().any(|c| c.is_ascii_uppercase()) {
            return Kind::Skip("a file name with placeholders");
        }
        if ["rs", "sh", "md"].contains(&extension) {
            return Kind::FileName;
        }
        return Kind::Quoted;
    }
    Kind::Skip("other syntax: a header, a generic type, a placeholder, a token shape")
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-')
}

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(is_word_char)
}

fn is_type_name(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_uppercase()) && s.chars().any(|c| c.is_ascii_lowercase())
}

fn is_function_name(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
}

/// `a::b::c`, `a::b()`, `Topic(action)`: the identifier segments, or `None`
/// if the span has another shape.
fn identifier_segments(span: &str) -> Option<Vec<String>> {
    let name = match span.find('(') {
        Some(open) => {
            let inner = span.get(open + 1..)?.strip_suffix(')')?;
            if !(inner.is_empty() || is_identifier(inner)) {
                return None;
            }
            span.get(..open)?
        }
        None => span,
    };
    let segments: Vec<String> = name.split("::").map(str::to_owned).collect();
    segments
        .iter()
        .all(|segment| is_identifier(segment))
        .then_some(segments)
}

/// The backticked spans of a Markdown page, outside fenced code blocks, in
/// order. A span may run over a line break (it then holds a space there).
fn backticked_spans(markdown: &str) -> Vec<String> {
    let mut prose = String::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    let mut spans = Vec::new();
    let mut rest = prose.as_str();
    while let Some(open) = rest.find('`') {
        let after_open = rest.get(open..).unwrap_or_default();
        let ticks = after_open.chars().take_while(|&c| c == '`').count();
        let fence = "`".repeat(ticks);
        let body = after_open.get(ticks..).unwrap_or_default();
        let Some(close) = body.find(&fence) else {
            break;
        };
        let span = body.get(..close).unwrap_or_default();
        spans.push(span.split_whitespace().collect::<Vec<_>>().join(" "));
        rest = body.get(close + ticks..).unwrap_or_default();
    }
    spans
}

/// Every file under `folder`, leaving out build output and hidden folders.
fn files_under(folder: &Path, files: &mut Vec<PathBuf>) {
    let entries = fs::read_dir(folder)
        .unwrap_or_else(|error| panic!("reading folder {}: {error}", folder.display()));
    for entry in entries {
        let path = entry
            .unwrap_or_else(|error| panic!("listing {}: {error}", folder.display()))
            .path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                files_under(&path, files);
            }
        } else {
            files.push(path);
        }
    }
}

/// The type a top-level `impl` or `trait` line is about: `Shard` for
/// `impl<F: FileSystem> Shard<F> {`, `OpeningSlot` for
/// `impl<F> Drop for OpeningSlot<'_, F> {`, `Transport` for
/// `pub trait Transport {`.
fn block_type(line: &str) -> Option<String> {
    let head = [
        "pub trait ",
        "pub(crate) trait ",
        "trait ",
        "unsafe impl",
        "impl",
    ]
    .iter()
    .find_map(|prefix| line.strip_prefix(prefix))?;
    let mut rest = head;
    if let Some(generics) = rest.strip_prefix('<') {
        let mut depth = 1;
        let end = generics.char_indices().find_map(|(i, c)| {
            match c {
                '<' => depth += 1,
                '>' => depth -= 1,
                _ => {}
            }
            (depth == 0).then_some(i)
        })?;
        rest = generics.get(end + 1..)?;
    }
    if let Some((_, target)) = rest.split_once(" for ") {
        rest = target;
    }
    let rest = rest
        .trim_start()
        .trim_start_matches('&')
        .trim_start_matches("dyn ");
    let path: String = rest
        .chars()
        .take_while(|&c| is_word_char(c) || c == ':')
        .collect();
    path.trim_end_matches(':')
        .rsplit("::")
        .next()
        .map(str::to_owned)
}

/// The function a line of an `impl` or `trait` block declares at its first
/// level of indentation, if any.
fn method_name(line: &str) -> Option<String> {
    let mut rest = line.strip_prefix("    ")?;
    if rest.starts_with(' ') {
        return None;
    }
    loop {
        let stripped = [
            "pub(crate) ",
            "pub(super) ",
            "pub ",
            "const ",
            "async ",
            "unsafe ",
        ]
        .iter()
        .find_map(|prefix| rest.strip_prefix(prefix));
        match stripped {
            Some(shorter) => rest = shorter,
            None => break,
        }
    }
    let name: String = rest
        .strip_prefix("fn ")?
        .chars()
        .take_while(|&c| is_word_char(c))
        .collect();
    (!name.is_empty()).then_some(name)
}

/// What the workspace holds, read once.
struct Workspace {
    root: PathBuf,
    file_names: HashSet<String>,
    /// Every identifier of every `.rs` file.
    words: HashSet<String>,
    /// Names declared with `fn` or `mod`.
    functions: HashSet<String>,
    modules: HashSet<String>,
    /// Functions declared in top-level `impl` and `trait` blocks, by type.
    methods: HashMap<String, HashSet<String>>,
    /// Every `.rs` and `Cargo.toml` file, for quoted names.
    sources: String,
    metric_sources: String,
}

impl Workspace {
    fn read(root: PathBuf) -> Self {
        let mut files = Vec::new();
        files_under(&root, &mut files);
        let mut workspace = Workspace {
            metric_sources: METRIC_FILES
                .iter()
                .map(|file| {
                    fs::read_to_string(root.join(file))
                        .unwrap_or_else(|error| panic!("reading {file}: {error}"))
                })
                .collect(),
            root,
            file_names: HashSet::new(),
            words: HashSet::new(),
            functions: HashSet::new(),
            modules: HashSet::new(),
            methods: HashMap::new(),
            sources: String::new(),
        };
        for file in &files {
            if let Some(name) = file.file_name().and_then(|n| n.to_str()) {
                workspace.file_names.insert(name.to_owned());
            }
            // This file names missing things on purpose: its words do not count.
            let is_this_test = file.ends_with("broker/tests/docs.rs");
            let is_rust = file.extension().and_then(|e| e.to_str()) == Some("rs");
            if (is_rust && !is_this_test) || file.ends_with("Cargo.toml") {
                let text = fs::read_to_string(file)
                    .unwrap_or_else(|error| panic!("reading {}: {error}", file.display()));
                if is_rust {
                    workspace.learn_rust(&text);
                }
                workspace.sources.push_str(&text);
            }
        }
        workspace
    }

    fn learn_rust(&mut self, text: &str) {
        let mut previous = "";
        for word in text
            .split(|c: char| !is_word_char(c))
            .filter(|w| !w.is_empty())
        {
            match previous {
                "fn" => self.functions.insert(word.to_owned()),
                "mod" => self.modules.insert(word.to_owned()),
                _ => false,
            };
            self.words.insert(word.to_owned());
            previous = word;
        }
        let mut block: Option<String> = None;
        for line in text.lines() {
            if line == "}" {
                block = None;
            } else if let Some(name) = block_type(line) {
                block = (!line.ends_with("{}")).then_some(name);
            } else if let (Some(name), Some(method)) = (&block, method_name(line)) {
                self.methods.entry(name.clone()).or_default().insert(method);
            }
        }
    }

    fn path_exists(&self, path: &str) -> bool {
        let bases = std::iter::once(String::new()).chain(CRATES.iter().flat_map(|krate| {
            [
                format!("{krate}/"),
                format!("{krate}/src/"),
                format!("{krate}/tests/"),
            ]
        }));
        bases
            .map(|base| self.root.join(format!("{base}{path}")))
            .any(|candidate| candidate.exists())
    }

    fn is_metric(&self, span: &str) -> bool {
        match span.strip_suffix('*') {
            Some(prefix) => self.metric_sources.contains(&format!("\"{prefix}")),
            None => self.metric_sources.contains(&format!("\"{span}\"")),
        }
    }

    /// Why the identifier `span` (its `segments`) names nothing, if it does not.
    fn missing_identifier(&self, span: &str, segments: &[String]) -> Option<String> {
        if let Some(absent) = segments.iter().find(|s| !self.words.contains(*s)) {
            return Some(format!("`{absent}` is not a word of any .rs file"));
        }
        let last = segments.last()?;
        if !is_function_name(last) {
            return None;
        }
        let owner = segments.len().checked_sub(2).and_then(|i| segments.get(i));
        match owner {
            Some(owner) if is_type_name(owner) => {
                let declared = self.methods.get(owner).is_some_and(|m| m.contains(last));
                (!declared).then(|| format!("no `fn {last}` in an impl or trait of `{owner}`"))
            }
            Some(_) => {
                let declared = self.functions.contains(last) || self.modules.contains(last);
                (!declared).then(|| format!("no `fn {last}` or `mod {last}` anywhere"))
            }
            None if span.ends_with(')') => {
                (!self.functions.contains(last)).then(|| format!("no `fn {last}` anywhere"))
            }
            None => None,
        }
    }

    /// Why `span` names nothing, or `None` when it names something (or is
    /// not a name).
    fn missing(&self, span: &str) -> Option<String> {
        match classify(span) {
            Kind::Path => (!self.path_exists(span)).then(|| "no such file or folder".into()),
            Kind::FileName => {
                (!self.file_names.contains(span)).then(|| "no file of that name".into())
            }
            Kind::Identifier(segments) => self.missing_identifier(span, &segments),
            Kind::Metric => {
                let as_identifier = identifier_segments(span)
                    .filter(|segments| self.missing_identifier(span, segments).is_none());
                (!self.is_metric(span) && as_identifier.is_none())
                    .then(|| "neither a metric name nor a word of any .rs file".into())
            }
            Kind::Quoted => (!self.sources.contains(&format!("\"{span}\"")))
                .then(|| "not a quoted string in any Cargo.toml or .rs file".into()),
            Kind::Skip(_) => None,
        }
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn every_code_name_the_docs_quote_exists_in_the_workspace() {
    let workspace = Workspace::read(workspace_root());
    let mut missing = Vec::new();
    let mut checked = 0;
    for page in PAGES {
        let text = fs::read_to_string(workspace.root.join(page))
            .unwrap_or_else(|error| panic!("reading {page}: {error}"));
        for span in backticked_spans(&text) {
            if ALLOWED.iter().any(|(allowed, _)| *allowed == span) {
                continue;
            }
            match classify(&span) {
                Kind::Skip(reason) => eprintln!("{page}: skipped `{span}`: {reason}"),
                _ => checked += 1,
            }
            if let Some(why) = workspace.missing(&span) {
                let line = format!("{page}: `{span}`: {why}");
                if !missing.contains(&line) {
                    missing.push(line);
                }
            }
        }
    }
    assert!(
        checked > 100,
        "the pages quote only {checked} code names: did the parsing break?"
    );
    assert!(
        missing.is_empty(),
        "{} code names in the docs name nothing in the workspace:\n{}",
        missing.len(),
        missing.join("\n")
    );
}

#[test]
fn spans_are_sorted_into_the_kind_that_checks_them() {
    let identifier =
        |segments: &[&str]| Kind::Identifier(segments.iter().map(|s| (*s).to_owned()).collect());
    assert_eq!(classify("src/shard/moves.rs"), Kind::Path);
    assert_eq!(classify("tests/sim/"), Kind::Path);
    assert_eq!(classify("faults.rs"), Kind::FileName);
    assert_eq!(
        classify("Shard::produce"),
        identifier(&["Shard", "produce"])
    );
    assert_eq!(classify("run_moves()"), identifier(&["run_moves"]));
    assert_eq!(classify("Topic(action)"), identifier(&["Topic"]));
    assert_eq!(classify("narad_acks_total"), Kind::Metric);
    assert_eq!(classify("narad-storage"), Kind::Quoted);
    assert_eq!(classify("cluster.move_bytes_per_s"), Kind::Quoted);
    assert_eq!(classify("node.epoch"), Kind::Quoted);
    assert_eq!(
        classify("narad_storage::frame"),
        identifier(&["narad_storage", "frame"])
    );
    for skipped in [
        "SEQ-BASE.seg",
        "--join",
        "503",
        "4xx",
        "/readyz",
        ".await",
        "POST /v1/topics/{t}/messages",
        "https://",
        "Narad-Key",
        "Rc<RefCell<_>>",
        "{partition}.incoming",
        "children/{child}-{incarnation}.cursor",
        "op(topic, op, reach)",
    ] {
        assert!(
            matches!(classify(skipped), Kind::Skip(_)),
            "`{skipped}` is skipped, not checked"
        );
    }
}

#[test]
fn spans_are_read_across_lines_and_not_from_fenced_blocks() {
    let page = "a `one` and `two\nparts`, ``x`y``\n```\n`fenced`\n```\n`three`";
    assert_eq!(backticked_spans(page), ["one", "two parts", "x`y", "three"]);
}

#[test]
fn impl_and_trait_lines_name_their_type_and_methods() {
    assert_eq!(
        block_type("impl<F: FileSystem> Shard<F> {").as_deref(),
        Some("Shard")
    );
    assert_eq!(
        block_type("impl<F: FileSystem> Drop for OpeningSlot<'_, F> {").as_deref(),
        Some("OpeningSlot")
    );
    assert_eq!(
        block_type("pub trait Operation: Wire + Send {").as_deref(),
        Some("Operation")
    );
    assert_eq!(
        block_type("impl Metastore for std::sync::Arc<MetaNode> {").as_deref(),
        Some("Arc")
    );
    assert_eq!(block_type("    impl Inner {"), None);
    assert_eq!(
        method_name("    pub(super) async fn commit_batch(&self) {").as_deref(),
        Some("commit_batch")
    );
    assert_eq!(method_name("        fn nested() {}"), None);
}

#[test]
fn a_name_that_is_not_in_the_sources_is_reported() {
    let workspace = Workspace::read(workspace_root());
    for missing in [
        "Shard::collect_local_that_never_was",
        "Turn::take",
        "sweep_owner_that_never_was()",
        "narad_storage::log::no_such_function",
        "src/no_such_file.rs",
        "no_such_file.rs",
        "narad_no_such_metric_total",
        "narad-no-such-thread",
        "cluster.no_such_key_ms",
    ] {
        assert!(
            workspace.missing(missing).is_some(),
            "`{missing}` is reported missing"
        );
    }
    for present in [
        "Shard",
        "Shard::produce",
        "TurnGate::take",
        "Transport::deliver",
        "sweep_owner()",
        "narad_storage::log::messages_in_segments",
        "narad_storage::frame",
        "broker/tests/docs.rs",
        "faults.rs",
        "narad_acks_total",
        "narad_fanout_child_*",
        "narad-storage",
        "narad-peer",
        "cluster.move_bytes_per_s",
        "ring.wal",
    ] {
        assert_eq!(workspace.missing(present), None, "`{present}` is found");
    }
}
