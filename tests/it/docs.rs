//! The docs stay true (issue 35 §1): the guide's runnable examples run as written against the
//! local store; every `blobsnap` command line in the README and `docs/` names commands and
//! flags that exist; `docs/cli-reference.md` is the command's own help, regenerated with
//! `BLOBSNAP_UPDATE_DOCS=1`; every TOML example of the configuration page loads.

use std::collections::BTreeMap;
use std::path::PathBuf;

const BIN: &str = env!("CARGO_BIN_EXE_blobsnap");

/// `cmd` without the caller's `BLOBSNAP_*` and `AWS_*` variables: the docs' commands run
/// against the local store they name, whatever the environment says.
fn clean(cmd: &mut std::process::Command) -> &mut std::process::Command {
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().to_string();
        if k.starts_with("BLOBSNAP_") || k.starts_with("AWS_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The README and every page of `docs/`, by path.
fn pages() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    out.insert(
        "README.md".to_string(),
        std::fs::read_to_string(repo().join("README.md")).unwrap(),
    );
    for e in std::fs::read_dir(repo().join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            let name = format!("docs/{}", p.file_name().unwrap().to_string_lossy());
            out.insert(name, std::fs::read_to_string(&p).unwrap());
        }
    }
    out
}

/// The fenced blocks of `text` with their info string, and whether a `<!-- runnable -->`
/// line comes right before.
fn blocks(text: &str) -> Vec<(String, bool, Vec<String>)> {
    let mut out = Vec::new();
    let mut lines = text.lines().peekable();
    let mut runnable = false;
    while let Some(l) = lines.next() {
        let t = l.trim();
        if t == "<!-- runnable -->" {
            runnable = true;
            continue;
        }
        if let Some(info) = t.strip_prefix("```") {
            let mut body = Vec::new();
            for l in lines.by_ref() {
                if l.trim().starts_with("```") {
                    break;
                }
                body.push(l.to_string());
            }
            out.push((info.to_string(), runnable, body));
        }
        runnable = false;
    }
    out
}

/// Shell words of `line` (single and double quotes; no expansion).
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut any = false;
    for c in line.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => cur.push(c),
            None if c == '\'' || c == '"' => {
                quote = Some(c);
                any = true;
            }
            None if c.is_whitespace() => {
                if any || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            None => cur.push(c),
        }
    }
    if any || !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The command lines of a block: continuations joined, a trailing `# comment` cut, `$ `
/// prompts removed; only those that run `blobsnap`.
fn command_lines(body: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for l in body {
        let l = l.trim_end();
        if let Some(head) = l.strip_suffix('\\') {
            cur.push_str(head);
            cur.push(' ');
            continue;
        }
        cur.push_str(l);
        let mut line = std::mem::take(&mut cur);
        if let Some(i) = line.find(" # ").or_else(|| line.find("  #")) {
            line.truncate(i);
        }
        let line = line.trim().trim_start_matches("$ ").to_string();
        if line.starts_with("blobsnap ") {
            out.push(line);
        }
    }
    out
}

fn help(path: &[&str]) -> String {
    let out = clean(&mut std::process::Command::new(BIN))
        .args(path)
        .arg("--help")
        .env("COLUMNS", "100")
        .output()
        .unwrap();
    assert!(out.status.success(), "blobsnap {path:?} --help");
    String::from_utf8(out.stdout).unwrap()
}

/// The subcommands a help text lists.
fn subcommands(help: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for l in help.lines() {
        if l.starts_with("Commands:") {
            inside = true;
            continue;
        }
        if inside {
            if !l.starts_with("  ") {
                break;
            }
            if l.starts_with("   ") {
                continue; // a description wrapped onto the next line
            }
            if let Some(name) = l.split_whitespace().next() {
                if name != "help" {
                    out.push(name.to_string());
                }
            }
        }
    }
    out
}

/// Every command path and its help, depth first.
fn all_help() -> Vec<(Vec<String>, String)> {
    let mut out = Vec::new();
    let mut todo = vec![Vec::<String>::new()];
    while let Some(path) = todo.pop() {
        let p: Vec<&str> = path.iter().map(String::as_str).collect();
        let h = help(&p);
        for s in subcommands(&h).into_iter().rev() {
            let mut next = path.clone();
            next.push(s);
            todo.push(next);
        }
        out.push((path, h));
    }
    out
}

/// Whether `help` documents `flag`, and whether it takes a value.
fn flag_in(help: &str, flag: &str) -> Option<bool> {
    help.lines().find_map(|l| {
        let t = l.trim_start();
        // `-h, --help`: the long form after the short one.
        let t = if t.starts_with('-') && !t.starts_with("--") {
            t.split_once(", ").map(|(_, r)| r).unwrap_or(t)
        } else {
            t
        };
        let rest = t.strip_prefix(flag)?;
        match rest.chars().next() {
            None | Some(' ') => Some(rest.trim_start().starts_with('<')),
            Some('=') | Some('<') => Some(true),
            _ => None,
        }
    })
}

#[test]
fn every_command_and_flag_the_docs_name_exists() {
    let helps: BTreeMap<Vec<String>, String> = all_help().into_iter().collect();
    let global = helps[&Vec::new()].clone();
    let mut checked = 0;
    let mut bad = Vec::new();
    for (page, text) in pages() {
        for (info, _, body) in blocks(&text) {
            if !matches!(info.as_str(), "sh" | "console" | "bash" | "") {
                continue;
            }
            for line in command_lines(&body) {
                let toks: Vec<String> = words(&line)
                    .into_iter()
                    .map(|t| t.trim_matches(|c| c == '[' || c == ']').to_string())
                    .filter(|t| !t.is_empty())
                    .collect();
                let mut path: Vec<String> = Vec::new();
                let mut i = 1;
                while i < toks.len() {
                    let t = &toks[i];
                    i += 1;
                    if t == "|" || t == "&&" || t == ">" {
                        break;
                    }
                    if let Some(flag) = t
                        .strip_prefix("--")
                        .map(|f| format!("--{}", f.split('=').next().unwrap_or(f)))
                    {
                        let here = &helps[&path];
                        let found = flag_in(here, &flag).or_else(|| flag_in(&global, &flag));
                        match found {
                            Some(takes) => {
                                if takes && !t.contains('=') {
                                    i += 1;
                                }
                            }
                            None => bad.push(format!(
                                "{page}: `{line}`: blobsnap {} has no {flag}",
                                path.join(" ")
                            )),
                        }
                        checked += 1;
                        continue;
                    }
                    let alts: Vec<&str> = t.split('|').collect();
                    let known = |a: &str| {
                        let mut p = path.clone();
                        p.push(a.to_string());
                        helps.contains_key(&p)
                    };
                    if alts.iter().any(|a| known(a)) {
                        for a in &alts {
                            if !known(a) {
                                bad.push(format!("{page}: `{line}`: no command {a}"));
                            }
                        }
                        path.push(alts[0].to_string());
                        checked += 1;
                    } else if path.is_empty() && !t.starts_with('-') {
                        bad.push(format!("{page}: `{line}`: no command {t}"));
                    }
                }
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    assert!(checked > 100, "{checked} commands and flags checked");
}

fn reference() -> String {
    let mut out = String::from(
        "# CLI reference\n\nEvery command's own `--help`, generated (`BLOBSNAP_UPDATE_DOCS=1 cargo test --test it -- docs::` rewrites\nthis page; the docs test fails when it is stale).\n",
    );
    let mut all = all_help();
    all.sort();
    for (path, h) in all {
        out.push_str(&format!(
            "\n## blobsnap{}{}\n\n```text\n{}```\n",
            if path.is_empty() { "" } else { " " },
            path.join(" "),
            h
        ));
    }
    out
}

#[test]
fn the_cli_reference_is_the_command_s_own_help() {
    let path = repo().join("docs/cli-reference.md");
    let want = reference();
    if std::env::var_os("BLOBSNAP_UPDATE_DOCS").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "docs/cli-reference.md is stale: run BLOBSNAP_UPDATE_DOCS=1 cargo test --test it -- docs::"
    );
}

#[test]
fn every_toml_example_of_the_configuration_page_loads() {
    let text = std::fs::read_to_string(repo().join("docs/configuration.md")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let mut n = 0;
    for (info, _, body) in blocks(&text) {
        if info != "toml" {
            continue;
        }
        let p = tmp.path().join(format!("{n}.toml"));
        std::fs::write(&p, body.join("\n")).unwrap();
        blobsnap::config::Settings::load(Some(&p))
            .unwrap_or_else(|e| panic!("docs/configuration.md TOML example {n}: {e}"));
        n += 1;
    }
    assert!(n > 0);
}

/// Every `<!-- runnable -->` block of the guide, line by line, in one empty directory, with
/// this build as `blobsnap` on the PATH: each line must exit 0.
#[test]
fn the_guide_s_runnable_examples_run() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(BIN, bin.join("blobsnap")).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut ran = 0;
    for (page, text) in pages() {
        for (_, runnable, body) in blocks(&text) {
            if !runnable {
                continue;
            }
            let work = tmp.path().join(format!("run-{ran}"));
            std::fs::create_dir_all(&work).unwrap();
            for line in command_lines(&body) {
                let out = clean(&mut std::process::Command::new("bash"))
                    .arg("-c")
                    .arg(&line)
                    .current_dir(&work)
                    .env("PATH", &path)
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "{page}: `{line}` exited {:?}: {}",
                    out.status.code(),
                    String::from_utf8_lossy(&out.stderr)
                );
                ran += 1;
            }
        }
    }
    assert!(ran >= 10, "{ran} runnable lines");
}

/// Every setting (every key of every section of the settings file) is named on the
/// configuration page.
#[test]
fn every_setting_is_documented() {
    let text = std::fs::read_to_string(repo().join("docs/configuration.md")).unwrap();
    let all = serde_json::to_value(blobsnap::config::Settings::default()).unwrap();
    let mut missing = Vec::new();
    let mut n = 0;
    for (section, keys) in all.as_object().unwrap() {
        assert!(
            text.contains(&format!("[{section}]")),
            "[{section}] is not documented"
        );
        for key in keys.as_object().into_iter().flatten().map(|(k, _)| k) {
            n += 1;
            if !text.contains(&format!("`{key}`")) && !text.contains(&format!("{key} =")) {
                missing.push(format!("[{section}] {key}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "not on docs/configuration.md: {missing:?}"
    );
    assert!(n > 20, "{n} settings");
}

/// Every `--json` document of every command uses one key style, kebab-case (issue 35 §2): a
/// key that looks like a `snake_case`, `camelCase` or `PascalCase` identifier fails, naming the
/// command and the path.
#[test]
fn every_json_document_is_kebab_case() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let out = clean(&mut std::process::Command::new(BIN))
            .args(args)
            .current_dir(tmp.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    run(&[
        "demo",
        "--partitions",
        "1",
        "--lines",
        "1500",
        "--commit-every",
        "300",
    ]);
    let l = ["--json", "--local", "blobsnap-demo/store"];
    let snap = [
        "--job",
        "wordcount",
        "--task",
        "Partition 0",
        "--store",
        "counts",
    ];
    let cmds: Vec<Vec<&str>> = vec![
        vec!["ls"],
        vec!["checkpoints", "--job", "wordcount"],
        vec!["savepoint", "create", "--job", "wordcount", "--name", "s1"],
        vec!["savepoint", "ls", "--job", "wordcount"],
        vec!["savepoint", "show", "--job", "wordcount", "--name", "s1"],
        vec!["cost", "--job", "wordcount", "--commit-interval", "60s"],
        vec!["usage", "--job", "wordcount"],
        vec!["check", "--job", "wordcount"],
        vec!["gc", "--job", "wordcount", "--dry-run"],
        vec!["gc", "--job", "wordcount"],
        [&["verify"][..], &snap[..]].concat(),
        [&["inspect"][..], &snap[..]].concat(),
        [&["restore", "--dry-run", "--to", "r"][..], &snap[..]].concat(),
        [&["restore", "--to", "r"][..], &snap[..]].concat(),
        [&["diff"][..], &snap[..], &["savepoint:s1", "latest"]].concat(),
        vec!["backup", "--db", "r", "--name", "nb"],
        vec!["forget", "--name", "nb", "--keep", "1", "--dry-run"],
        vec!["unlock", "--job", "wordcount", "--dry-run"],
        vec![
            "forget",
            "--all",
            "--job",
            "wordcount",
            "--job-id",
            "1",
            "--dry-run",
        ],
        // The demo again on its store (nothing new to read: it resumes, commits, checks).
        vec![
            "demo",
            "--partitions",
            "1",
            "--lines",
            "1500",
            "--commit-every",
            "300",
        ],
        // A standby of the demo's task on another dir, up to the checkpoint it finds.
        vec![
            "standby",
            "--dir",
            "standby-dir",
            "--task",
            "Partition 0",
            "--stores",
            "counts",
            "--until-seq",
            "1",
        ],
        vec![
            "savepoint",
            "rm",
            "--job",
            "wordcount",
            "--name",
            "s1",
            "--dry-run",
        ],
    ];
    let mut bad = Vec::new();
    let mut schemas = String::new();
    // Each command's key paths, to hold a dry run to its real run's shape.
    let mut shapes: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for c in cmds {
        let args: Vec<&str> = l.iter().chain(c.iter()).copied().collect();
        let out = run(&args);
        let mut shape: BTreeMap<String, std::collections::BTreeSet<&'static str>> = BTreeMap::new();
        for line in String::from_utf8_lossy(&out)
            .lines()
            .filter(|l| l.starts_with('{'))
        {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{c:?}: not JSON ({e}): {line}"));
            shape_of(&v, "", &mut shape);
            walk(&v, &mut String::new(), &mut |path, key| {
                // An identifier-like key (letters, digits, `_`; no space, dot or hyphen: those
                // are data — a task, an input, a factory's class) in snake_case, camelCase or
                // PascalCase.
                let ident = key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
                let snake = key.contains('_');
                let cased = key.bytes().any(|b| b.is_ascii_uppercase())
                    && key.bytes().any(|b| b.is_ascii_lowercase());
                if ident && (snake || cased) {
                    bad.push(format!("{}: {path}.{key}", c.join(" ")));
                }
            });
        }
        let shown: Vec<String> = c
            .iter()
            .map(|a| {
                if a.contains(' ') {
                    format!("'{a}'")
                } else {
                    a.to_string()
                }
            })
            .collect();
        shapes.insert(c.join(" "), shape.keys().cloned().collect());
        schemas.push_str(&format!(
            "\n## `blobsnap --json {}`\n\n| key | type |\n|---|---|\n",
            shown.join(" ")
        ));
        for (path, types) in &shape {
            let types: Vec<&str> = types.iter().copied().collect();
            schemas.push_str(&format!("| `{path}` | {} |\n", types.join(" or ")));
        }
    }
    bad.sort();
    bad.dedup();
    assert!(
        bad.is_empty(),
        "keys not in kebab-case:\n{}",
        bad.join("\n")
    );
    // A dry run prints the document of the real run, its per-file plan included (issue 35 §2).
    for (dry, real) in [
        (
            "gc --job wordcount --dry-run",
            "gc --job wordcount".to_string(),
        ),
        (
            "restore --dry-run --to r --job wordcount --task Partition 0 --store counts",
            "restore --to r --job wordcount --task Partition 0 --store counts".to_string(),
        ),
    ] {
        assert_eq!(
            shapes.get(dry),
            shapes.get(&real),
            "{dry:?} and {real:?} print documents of different shapes"
        );
        assert!(shapes.get(dry).is_some_and(|k| !k.is_empty()), "{dry:?}");
    }
    assert!(
        shapes
            .get("restore --to r --job wordcount --task Partition 0 --store counts")
            .is_some_and(|k| k.iter().any(|k| k == "files[].action")),
        "a restore's document lists its files and what was done with each"
    );

    // docs/json.md documents each of these documents' shape: every key (a path: `a.b`, `a[]`
    // for an array's elements) and its JSON type, as this run printed them.
    let path = repo().join("docs/json.md");
    let page = std::fs::read_to_string(&path).unwrap();
    let (open, close) = (
        "<!-- json-schemas: generated -->\n",
        "<!-- /json-schemas -->",
    );
    let start = page.find(open).expect("the page marks its tables") + open.len();
    let end = page[start..]
        .find(close)
        .expect("the tables' end is marked")
        + start;
    if std::env::var_os("BLOBSNAP_UPDATE_DOCS").is_some() {
        std::fs::write(
            &path,
            format!("{}{schemas}{}", &page[..start], &page[end..]),
        )
        .unwrap();
    } else {
        // The same commands, the same key paths, the same types — a value that is null in one
        // run (an empty class's oldest object) may be a string in another.
        let (documented, now) = (tables(&page[start..end]), tables(&schemas));
        let mut stale = Vec::new();
        for (key, row) in documented.iter().chain(now.iter()) {
            let (a, b) = (documented.get(key), now.get(key));
            let same = match (a, b) {
                (Some(a), Some(b)) => {
                    let strip = |t: &Vec<String>| -> Vec<String> {
                        t.iter().filter(|x| *x != "null").cloned().collect()
                    };
                    strip(a) == strip(b) || strip(a).is_empty() || strip(b).is_empty()
                }
                _ => false,
            };
            if !same {
                stale.push(format!(
                    "{key:?}: documented {a:?}, printed {b:?} ({row:?})"
                ));
            }
        }
        stale.sort();
        stale.dedup();
        assert!(
            stale.is_empty(),
            "docs/json.md is stale (a --json document changed shape; BLOBSNAP_UPDATE_DOCS=1 cargo test --test it -- docs:: rewrites it):\n{}",
            stale.join("\n")
        );
    }
}

/// The tables of docs/json.md's generated part: (command, key path) → types.
fn tables(text: &str) -> BTreeMap<(String, String), Vec<String>> {
    let mut out = BTreeMap::new();
    let mut command = String::new();
    for line in text.lines() {
        if let Some(c) = line.strip_prefix("## ") {
            command = c.to_string();
        } else if let Some(row) = line.strip_prefix("| `") {
            if let Some((key, rest)) = row.split_once("` | ") {
                let types = rest
                    .trim_end_matches(" |")
                    .split(" or ")
                    .map(str::to_string)
                    .collect();
                out.insert((command.clone(), key.to_string()), types);
            }
        }
    }
    out
}

/// Every key path of `v` under `at` (`a.b`; `a[]` for the elements of an array) with the JSON
/// types seen there.
fn shape_of(
    v: &serde_json::Value,
    at: &str,
    out: &mut BTreeMap<String, std::collections::BTreeSet<&'static str>>,
) {
    let kind = match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "array",
        serde_json::Value::Object(_) => "object",
    };
    if !at.is_empty() {
        out.entry(at.to_string()).or_default().insert(kind);
    }
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                let p = if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                };
                shape_of(x, &p, out);
            }
        }
        serde_json::Value::Array(a) => {
            for x in a {
                shape_of(x, &format!("{at}[]"), out);
            }
        }
        _ => {}
    }
}

fn walk(v: &serde_json::Value, path: &mut String, f: &mut dyn FnMut(&str, &str)) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                f(path, k);
                let len = path.len();
                path.push('.');
                path.push_str(k);
                walk(x, path, f);
                path.truncate(len);
            }
        }
        serde_json::Value::Array(a) => {
            for x in a {
                walk(x, path, f);
            }
        }
        _ => {}
    }
}

/// The metrics table of `docs/metrics.md` is the library's catalog
/// (`blobsnap::telemetry::METRICS`) as rendered by `markdown_table`.
#[test]
fn the_metrics_page_is_the_catalog() {
    let path = repo().join("docs/metrics.md");
    let page = std::fs::read_to_string(&path).unwrap();
    let (open, close) = (
        "<!-- metrics-table: generated -->\n",
        "<!-- /metrics-table -->",
    );
    let start = page.find(open).expect("the page marks its table") + open.len();
    let end = page[start..]
        .find(close)
        .expect("the table's end is marked")
        + start;
    let want = blobsnap::telemetry::markdown_table();
    if std::env::var_os("BLOBSNAP_UPDATE_DOCS").is_some() {
        std::fs::write(&path, format!("{}{want}{}", &page[..start], &page[end..])).unwrap();
    } else {
        assert!(
            page[start..end] == want,
            "docs/metrics.md's table is stale: BLOBSNAP_UPDATE_DOCS=1 cargo test --test it -- docs::"
        );
    }
}
