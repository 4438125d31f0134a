//! `-o table|json|jsonl` (spec section 9): how a command prints records. Table on a terminal,
//! JSON otherwise, unless `-o` says.

use std::io::{IsTerminal, Write};

use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Aligned columns, for people.
    Table,
    /// One JSON document: an array of records (or the record).
    Json,
    /// One JSON record per line.
    Jsonl,
}

impl Output {
    /// What `-o` asked for, else table on a terminal and JSON otherwise.
    pub fn resolve(o: Option<Output>) -> Output {
        o.unwrap_or_else(|| {
            if std::io::stdout().is_terminal() {
                Output::Table
            } else {
                Output::Json
            }
        })
    }

    /// Print `rows`; a table shows `columns` (a nested field as `a.b`).
    pub fn list(self, rows: &[Value], columns: &[&str]) -> Result<(), String> {
        let mut out = std::io::stdout().lock();
        let w = |e: std::io::Error| e.to_string();
        match self {
            Output::Json => writeln!(out, "{}", Value::Array(rows.to_vec())).map_err(w),
            Output::Jsonl => {
                for r in rows {
                    writeln!(out, "{r}").map_err(w)?;
                }
                Ok(())
            }
            Output::Table => {
                let cells: Vec<Vec<String>> = rows
                    .iter()
                    .map(|r| columns.iter().map(|c| cell(r, c)).collect())
                    .collect();
                let widths: Vec<usize> = columns
                    .iter()
                    .enumerate()
                    .map(|(i, c)| {
                        cells
                            .iter()
                            .map(|r| r[i].chars().count())
                            .chain([c.len()])
                            .max()
                            .unwrap_or(0)
                    })
                    .collect();
                let line = |vals: Vec<&str>| {
                    vals.iter()
                        .zip(&widths)
                        .map(|(v, w)| format!("{v:<w$}"))
                        .collect::<Vec<_>>()
                        .join("  ")
                        .trim_end()
                        .to_owned()
                };
                writeln!(out, "{}", line(columns.to_vec()).to_uppercase()).map_err(w)?;
                for r in &cells {
                    writeln!(out, "{}", line(r.iter().map(String::as_str).collect())).map_err(w)?;
                }
                Ok(())
            }
        }
    }

    /// Print one record; a table shows it as `key  value` lines.
    pub fn one(self, v: &Value) -> Result<(), String> {
        let mut out = std::io::stdout().lock();
        let w = |e: std::io::Error| e.to_string();
        match (self, v.as_object()) {
            (Output::Table, Some(m)) => {
                let width = m.keys().map(String::len).max().unwrap_or(0);
                for (k, x) in m {
                    writeln!(out, "{k:<width$}  {}", scalar(x)).map_err(w)?;
                }
                Ok(())
            }
            _ => writeln!(out, "{v}").map_err(w),
        }
    }
}

fn scalar(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn cell(row: &Value, column: &str) -> String {
    let mut v = row;
    for part in column.split('.') {
        v = &v[part];
    }
    let s = scalar(v);
    // Keep a table a table: one line per row, long values cut.
    let s = s.replace(['\n', '\r', '\t'], " ");
    if s.chars().count() > 72 {
        format!("{}…", s.chars().take(71).collect::<String>())
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn cells_read_nested_fields_and_stay_on_one_line() {
        let r = json!({"a": {"b": 7}, "t": "x\ny", "long": "z".repeat(90), "n": null});
        assert_eq!(cell(&r, "a.b"), "7");
        assert_eq!(cell(&r, "t"), "x y");
        assert_eq!(cell(&r, "long").chars().count(), 72);
        assert_eq!(cell(&r, "n"), "");
        assert_eq!(cell(&r, "missing"), "");
    }
}
