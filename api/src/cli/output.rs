//! `-o table|json|jsonl` (spec section 9): how a command prints records. Table on a terminal,
//! JSON otherwise, unless `-o` says. Every write to stdout goes through here, so a reader that
//! went away (`| head -1`) ends the command quietly instead of with `Broken pipe`.

use std::io::{IsTerminal, Write};

use serde_json::Value;

use super::error::CliError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Aligned columns with a header line, for people (a single record: `key  value` lines).
    Table,
    /// One JSON document: an array of the records (a single record: the object).
    Json,
    /// One JSON record per line, each printed as soon as it is known.
    Jsonl,
}

impl Output {
    /// What `-o` asked for, else table on a terminal and `otherwise` off one.
    pub fn resolve_or(o: Option<Output>, otherwise: Output) -> Output {
        o.unwrap_or_else(|| {
            if std::io::stdout().is_terminal() {
                Output::Table
            } else {
                otherwise
            }
        })
    }

    /// What `-o` asked for, else table on a terminal and JSON otherwise.
    pub fn resolve(o: Option<Output>) -> Output {
        Self::resolve_or(o, Output::Json)
    }

    /// Print `rows`; a table shows `columns` (a nested field as `a.b`).
    pub(crate) fn list(self, rows: &[Value], columns: &[&str]) -> Result<(), CliError> {
        let mut text = String::new();
        match self {
            Output::Json => {
                text = Value::Array(rows.to_vec()).to_string();
                text.push('\n');
            }
            Output::Jsonl => {
                for r in rows {
                    text.push_str(&r.to_string());
                    text.push('\n');
                }
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
                text.push_str(&header(columns, &widths));
                for r in &cells {
                    text.push_str(&table_line(r, &widths));
                }
            }
        }
        write_out(&text)
    }

    /// Print one record; a table shows it as `key  value` lines.
    pub(crate) fn one(self, v: &Value) -> Result<(), CliError> {
        match (self, v.as_object()) {
            (Output::Table, Some(m)) => {
                let width = m.keys().map(String::len).max().unwrap_or(0);
                let mut text = String::new();
                for (k, x) in m {
                    text.push_str(&format!("{k:<width$}  {}\n", one_line(&scalar(x))));
                }
                write_out(&text)
            }
            _ => write_out(&format!("{v}\n")),
        }
    }
}

/// Records printed as they come: a JSON line each at once under `jsonl`; gathered and printed
/// whole by [`Records::finish`] under `json` (one array) and `table` (aligned columns), or, for
/// a table that never ends (`tail` following the log), printed a row at a time in columns of
/// fixed width.
pub(crate) struct Records<'a> {
    out: Output,
    columns: &'a [&'a str],
    rows: Vec<Value>,
    /// A table printed a row at a time, and its column widths.
    streaming: Option<Vec<usize>>,
    header_done: bool,
}

impl<'a> Records<'a> {
    pub(crate) fn new(out: Output, columns: &'a [&'a str]) -> Self {
        Records {
            out,
            columns,
            rows: Vec::new(),
            streaming: None,
            header_done: false,
        }
    }

    /// A table printed row by row, each column at least `widths[i]` wide.
    pub(crate) fn streaming_table(mut self, widths: &[usize]) -> Self {
        let widths = self
            .columns
            .iter()
            .zip(widths.iter().chain(std::iter::repeat(&0)))
            .map(|(c, w)| c.len().max(*w))
            .collect();
        self.streaming = Some(widths);
        self
    }

    pub(crate) fn push(&mut self, v: Value) -> Result<(), CliError> {
        match (self.out, &self.streaming) {
            (Output::Jsonl, _) => write_out(&format!("{v}\n")),
            (Output::Table, Some(widths)) => {
                let mut text = String::new();
                if !self.header_done {
                    text.push_str(&header(self.columns, widths));
                    self.header_done = true;
                }
                let cells: Vec<String> = self.columns.iter().map(|c| cell(&v, c)).collect();
                text.push_str(&table_line(&cells, widths));
                write_out(&text)
            }
            _ => {
                self.rows.push(v);
                Ok(())
            }
        }
    }

    /// Nothing pushed yet (or nothing left to print: `jsonl` and streaming tables print at
    /// once).
    pub(crate) fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Print what was gathered (nothing more under `jsonl` or a streaming table).
    pub(crate) fn finish(self) -> Result<(), CliError> {
        match (self.out, &self.streaming) {
            (Output::Jsonl, _) => Ok(()),
            (Output::Table, Some(widths)) if !self.header_done => {
                write_out(&header(self.columns, widths))
            }
            (Output::Table, Some(_)) => Ok(()),
            (out, None) | (out @ Output::Json, Some(_)) => out.list(&self.rows, self.columns),
        }
    }
}

/// Write `text` to stdout now. A closed stdout is [`CliError::ClosedPipe`].
pub(crate) fn write_out(text: &str) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                CliError::ClosedPipe
            } else {
                CliError::Other(format!("cannot write to stdout: {e}"))
            }
        })
}

/// Resolves once nobody reads stdout any more (the reader of the pipe went away, as `head -1`
/// does after its line), so a command that waits for records (`tail`) can end then, not only
/// at its next write. Never resolves when stdout cannot be watched (a file, say).
pub(crate) async fn stdout_closed() {
    #[cfg(unix)]
    {
        use std::os::fd::AsFd;
        use tokio::io::Interest;
        use tokio::io::unix::AsyncFd;
        // Its successor is `unsafe` (the crate forbids that); the fd stays open for as long as
        // it is watched: it is a duplicate of stdout that the `AsyncFd` owns.
        #[expect(
            deprecated,
            reason = "sound here: the AsyncFd owns the file it watches"
        )]
        let watch = |f: std::fs::File| AsyncFd::with_interest(f, Interest::ERROR);
        if let Ok(fd) = std::io::stdout().as_fd().try_clone_to_owned()
            && let Ok(fd) = watch(std::fs::File::from(fd))
            && fd.ready(Interest::ERROR).await.is_ok()
        {
            return;
        }
    }
    std::future::pending::<()>().await;
}

fn header(columns: &[&str], widths: &[usize]) -> String {
    let upper: Vec<String> = columns.iter().map(|c| c.to_uppercase()).collect();
    table_line(&upper, widths)
}

fn table_line(cells: &[String], widths: &[usize]) -> String {
    let mut line = cells
        .iter()
        .zip(widths)
        .map(|(v, w)| format!("{v:<w$}"))
        .collect::<Vec<_>>()
        .join("  ")
        .trim_end()
        .to_owned();
    line.push('\n');
    line
}

fn scalar(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn one_line(s: &str) -> String {
    s.replace(['\n', '\r', '\t'], " ")
}

fn cell(row: &Value, column: &str) -> String {
    let mut v = row;
    for part in column.split('.') {
        v = &v[part];
    }
    // Keep a table a table: one line per row, long values cut.
    let s = one_line(&scalar(v));
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

    #[test]
    fn table_lines_are_padded_to_the_widths_and_trimmed() {
        let cells = vec!["a".to_owned(), "bb".to_owned(), String::new()];
        assert_eq!(table_line(&cells, &[3, 4, 2]), "a    bb\n");
        assert_eq!(header(&["id", "seq"], &[4, 3]), "ID    SEQ\n");
    }
}
