//! The configuration reference (`docs/configuration.md`) is checked against the code (spec
//! section 18): every key the server accepts, found by asking the code itself — a probe key in
//! each table makes the loader name the keys it knows (serde's `deny_unknown_fields`, and the
//! `[notifications]` checker) — must be on the page, and every key on the page must be one the
//! code accepts. The packaged configuration (`deploy/debian/config.sh`) must load and differ
//! from the built-in defaults only in the data and backup directories.

use std::collections::BTreeSet;
use std::path::Path;

use tidemark_api::config::Config;

const PROBE: &str = "zz_probe_key";

/// The error of loading `text` as the config file (`None`: it loaded).
fn load_error(text: &str) -> Option<String> {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("c.toml");
    std::fs::write(&f, text).expect("write");
    Config::load(Some(&f)).err().map(|e| e.to_string())
}

/// The keys an error lists as the ones known where the probe key was.
fn known_keys(err: &str) -> Option<Vec<String>> {
    // serde through figment: "unknown field: found `x`, expected `one of `a`, `b``" or
    // "expected `a`".
    if err.contains("unknown field")
        && let Some(i) = err.find("expected `")
    {
        // What serde expected, quoted once more by figment: "`a`", "`a` or `b`", or
        // "one of `a`, `b`, `c`".
        let rest = &err[i + "expected `".len()..];
        let expected = rest.split("`` ").next()?.trim_end_matches('`');
        let expected = expected.strip_prefix("one of ").unwrap_or(expected);
        let expected = format!("{expected}`");
        return Some(
            expected
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect(),
        );
    }
    if err.contains("there are no fields") {
        return Some(Vec::new());
    }
    let i = err.find("(known: ")?;
    let rest = &err[i + "(known: ".len()..];
    let list = rest.split(')').next()?;
    Some(list.split(", ").map(str::to_owned).collect())
}

/// One step of a key path: a key, an element of an array of tables, or a table of names.
#[derive(Clone)]
enum Step {
    Key(String),
    Array(String),
    Name(String),
}

/// The TOML text that opens the table at `path` (arrays of tables opened as one element).
fn header(path: &[Step]) -> String {
    let mut text = String::new();
    let mut dotted: Vec<String> = Vec::new();
    for (i, s) in path.iter().enumerate() {
        match s {
            Step::Key(k) => dotted.push(k.clone()),
            Step::Name(k) => {
                dotted.push(k.clone());
                dotted.push("x".into());
            }
            Step::Array(k) => {
                dotted.push(k.clone());
                text.push_str(&format!("[[{}]]\n", dotted.join(".")));
                if i + 1 == path.len() {
                    return text;
                }
                continue;
            }
        }
    }
    if !dotted.is_empty() {
        text.push_str(&format!("[{}]\n", dotted.join(".")));
    }
    text
}

fn name(path: &[Step]) -> String {
    path.iter()
        .map(|s| match s {
            Step::Key(k) => k.clone(),
            Step::Array(k) => format!("{k}[]"),
            Step::Name(k) => format!("{k}.<name>"),
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// The keys the table at `path` knows, if it is a table whose keys the loader lists.
fn keys_at(path: &[Step]) -> Option<Vec<String>> {
    let err = load_error(&format!("{}{PROBE} = 1\n", header(path)))?;
    known_keys(&err)
}

/// Every key path the code accepts, below `path`.
fn explore(path: Vec<Step>, out: &mut BTreeSet<String>) {
    assert!(path.len() < 8, "the probe went too deep: {}", name(&path));
    let Some(keys) = keys_at(&path) else {
        return;
    };
    for k in keys {
        let mut sub = path.clone();
        sub.push(Step::Key(k.clone()));
        if keys_at(&sub).is_some() {
            explore(sub, out);
            continue;
        }
        let mut arr = path.clone();
        arr.push(Step::Array(k.clone()));
        if keys_at(&arr).is_some() {
            explore(arr, out);
            continue;
        }
        let mut named = path.clone();
        named.push(Step::Name(k.clone()));
        if keys_at(&named).is_some() {
            explore(named, out);
            continue;
        }
        out.insert(name(&sub));
    }
}

fn accepted() -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    explore(Vec::new(), &mut keys);
    keys
}

/// The key paths of the page: the first cell of each table row, in backticks.
fn documented() -> BTreeSet<String> {
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md");
    let text = std::fs::read_to_string(&page).expect("docs/configuration.md");
    text.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_key_the_code_accepts_is_on_the_reference_page_and_no_other() {
    let code = accepted();
    assert!(code.len() > 50, "the probe found too few keys: {code:?}");
    for k in [
        "server.listen",
        "log.min_free",
        "notifications.routes.<name>.sink",
        "sources[].name",
    ] {
        assert!(code.contains(k), "the probe misses {k}: {code:?}");
    }
    let page = documented();
    let missing: Vec<&String> = code.difference(&page).collect();
    let unknown: Vec<&String> = page.difference(&code).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "docs/configuration.md is not the code's list of keys.\n\
         Accepted by the code, not on the page: {missing:#?}\n\
         On the page, not accepted by the code: {unknown:#?}"
    );
}

#[test]
fn the_packaged_configuration_is_the_defaults_but_for_its_directories() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/debian/config.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .output()
        .expect("run config.sh");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("tidemark.toml");
    std::fs::write(&f, &out.stdout).expect("write");
    let packaged = Config::load(Some(&f)).expect("the packaged configuration loads");
    let mut defaults = Config::defaults();
    assert_eq!(packaged.server.data, Path::new("/var/lib/tidemark"));
    assert_eq!(
        packaged.server.backup_dir,
        Path::new("/var/backups/tidemark")
    );
    defaults.server.data = packaged.server.data.clone();
    defaults.server.backup_dir = packaged.server.backup_dir.clone();
    assert_eq!(
        serde_json::to_value(&packaged).expect("json"),
        serde_json::to_value(&defaults).expect("json"),
        "the packaged file changes more than the directories"
    );
}
