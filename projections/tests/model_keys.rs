//! A model's keys are written by its fold and read by its view, nowhere else (issue 57): no
//! file outside a model's own (`projections/src/<model>.rs` and `projections/src/<model>/`)
//! names one of its tables (the names its `Fold::TABLES` lists) or one of its key builders (its
//! `fn …_key` and `fn …_prefix`), in projections, the engine, the reactors or the API.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Code without its comments (a doc link to a key is not a read of it).
fn code(text: &str) -> String {
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
}

/// Each model's home files and the names of its keys: the tables its `Fold::TABLES` lists and
/// the key builders it defines.
fn models(src: &Path) -> BTreeMap<String, (Vec<PathBuf>, Vec<String>)> {
    let mut out = BTreeMap::new();
    let mut files = Vec::new();
    rust_files(src, &mut files);
    for f in &files {
        let rel = f.strip_prefix(src).unwrap();
        let model = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_owned();
        let entry = out.entry(model).or_insert_with(|| (Vec::new(), Vec::new()));
        entry.0.push(f.clone());
    }
    for (home, keys) in out.values_mut() {
        for f in home.iter() {
            let text = code(&std::fs::read_to_string(f).unwrap());
            let decl = "const TABLES: &'static [&'static str]";
            if let Some(at) = text.find(decl) {
                // `= &[ROWS, …];`, or `;` in the trait.
                let rest = &text[at + decl.len()..];
                keys.extend(words(&rest[..rest.find(';').unwrap()]).map(str::to_owned));
            }
            for line in text.lines() {
                let line = line.trim_start();
                let Some(rest) = line
                    .strip_prefix("pub fn ")
                    .or_else(|| line.strip_prefix("pub(crate) fn "))
                else {
                    continue;
                };
                let name = rest.split(['(', '<']).next().unwrap();
                if name.ends_with("_key") || name.ends_with("_prefix") {
                    keys.push(name.to_owned());
                }
            }
        }
    }
    out.retain(|_, (_, keys)| !keys.is_empty());
    out
}

#[test]
fn no_key_of_a_model_is_named_outside_its_folder() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let src = root.join("projections/src");
    let models = models(&src);
    assert!(
        models.contains_key("deliveries") && models["deliveries"].1.contains(&"DUE".to_owned()),
        "the deliveries model's keys were not found: {models:?}"
    );
    let mut files = Vec::new();
    for dir in ["projections/src", "engine/src", "consumers/src", "api/src"] {
        rust_files(&root.join(dir), &mut files);
    }
    let mut found = Vec::new();
    for f in &files {
        let text = code(&std::fs::read_to_string(f).unwrap());
        for (model, (home, keys)) in &models {
            if home.contains(f) {
                continue;
            }
            for key in keys {
                let named = [format!("{model}::{key}"), format!("{model}::{{")]
                    .iter()
                    .any(|p| {
                        text.match_indices(p.as_str()).any(|(at, _)| {
                            // `model::KEY`, or `KEY` inside a `use model::{…}`.
                            p.ends_with(key.as_str())
                                && !text[at + p.len()..]
                                    .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
                                || p.ends_with('{') && {
                                    let list = &text[at + p.len()..];
                                    let list = &list[..list.find('}').unwrap_or(list.len())];
                                    words(list).any(|w| w == key)
                                }
                        })
                    });
                if named {
                    found.push(format!(
                        "{} names {model}::{key}",
                        f.strip_prefix(root).unwrap().display()
                    ));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "model keys named outside their folder:\n{}",
        found.join("\n")
    );
}
