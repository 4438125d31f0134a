//! `tidemark append` and `tidemark tail`.

use std::io::BufRead;
use std::path::Path;
use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;

use super::client::Client;
use super::error::CliError;
use super::output::{Output, Records, stdout_closed};
use super::{AppendArgs, CliResult, TailArgs};

const APPEND_BATCH_EVENTS: usize = 1000;
const APPEND_BATCH_BYTES: usize = 900 * 1024;
const RECEIPT_COLUMNS: &[&str] = &["event_id", "seq", "duplicate"];
const EVENT_COLUMNS: &[&str] = &["seq", "time", "stream", "subject", "type", "payload"];

/// One event of the input: the 1-based number of its line (blank lines counted) and its text.
type Line = (usize, String);

pub(crate) async fn append(a: AppendArgs) -> CliResult {
    let c = Client::new(&a.client)?;
    let out = a.client.output();
    let name = a
        .file
        .as_ref()
        .map_or_else(|| "stdin".to_owned(), |p| p.display().to_string());
    // Every line is checked before anything is sent, so a malformed line 5000 does not leave
    // lines 1-4999 appended. A file is read twice rather than held in memory; stdin can only
    // be read once, so it is kept.
    let input: Box<dyn Iterator<Item = Result<Line, CliError>>> = match &a.file {
        Some(p) => {
            for l in lines(open(p)?, &name) {
                l?;
            }
            Box::new(lines(open(p)?, &name))
        }
        None => {
            let stdin = std::io::BufReader::new(std::io::stdin());
            let all = lines(stdin, &name).collect::<Result<Vec<Line>, CliError>>()?;
            Box::new(all.into_iter().map(Ok))
        }
    };
    let mut receipts = Receipts {
        records: Records::new(out, RECEIPT_COLUMNS),
        stdout_gone: false,
    };
    let sent = send_all(&c, input, &name, &mut receipts).await;
    // The receipts of what was appended are printed also when a later batch failed (but no
    // empty list when nothing was).
    let printed = if sent.is_ok() || !receipts.records.is_empty() {
        receipts.finish()
    } else {
        Ok(())
    };
    let appended = sent?;
    printed?;
    eprintln!("appended {appended} events");
    Ok(())
}

/// Send `input` in batches; the number of events appended.
async fn send_all(
    c: &Client,
    input: impl Iterator<Item = Result<Line, CliError>>,
    name: &str,
    receipts: &mut Receipts<'_>,
) -> Result<u64, CliError> {
    let mut batch: Vec<Line> = Vec::new();
    let mut bytes = 0usize;
    let mut sent = Sent::default();
    for line in input {
        let line = line?;
        if batch.len() >= APPEND_BATCH_EVENTS || bytes + line.1.len() > APPEND_BATCH_BYTES {
            let b = std::mem::take(&mut batch);
            let n = post_batch(c, &b, name, &sent, receipts).await?;
            sent.through(&b, sent.events + n);
            bytes = 0;
            eprintln!("appended {} events", sent.events);
        }
        bytes += line.1.len();
        batch.push(line);
    }
    if !batch.is_empty() {
        sent.events += post_batch(c, &batch, name, &sent, receipts).await?;
    }
    Ok(sent.events)
}

/// The receipts printed so far. Once nobody reads stdout the events are still appended: the
/// receipts are only the echo of the work.
struct Receipts<'a> {
    records: Records<'a>,
    stdout_gone: bool,
}

impl Receipts<'_> {
    fn push(&mut self, v: Value) -> Result<(), CliError> {
        if self.stdout_gone {
            return Ok(());
        }
        match self.records.push(v) {
            Err(CliError::ClosedPipe) => {
                self.stdout_gone = true;
                Ok(())
            }
            other => other,
        }
    }

    /// Print what is gathered (the receipts of what was appended, also before an error).
    fn finish(self) -> Result<(), CliError> {
        if self.stdout_gone {
            return Ok(());
        }
        self.records.finish()
    }
}

/// What earlier batches appended, for an error in a later one.
#[derive(Default)]
struct Sent {
    last_line: Option<usize>,
    events: u64,
}

impl Sent {
    fn through(&mut self, batch: &[Line], events: u64) {
        self.last_line = batch.last().map(|l| l.0);
        self.events = events;
    }
}

fn open(p: &Path) -> Result<std::io::BufReader<std::fs::File>, CliError> {
    std::fs::File::open(p)
        .map(std::io::BufReader::new)
        .map_err(|e| CliError::Other(format!("cannot read {}: {e}", p.display())))
}

/// The non-blank lines of `reader`, numbered, each checked to be a JSON object.
fn lines<'a>(
    reader: impl BufRead + 'a,
    name: &'a str,
) -> impl Iterator<Item = Result<Line, CliError>> + 'a {
    reader
        .lines()
        .enumerate()
        .filter_map(move |(i, l)| {
            let n = i + 1;
            let l = match l {
                Ok(l) => l,
                Err(e) => {
                    return Some(Err(CliError::Other(format!(
                        "cannot read line {n} of {name}: {e}; nothing was sent"
                    ))));
                }
            };
            if l.trim().is_empty() {
                return None;
            }
            Some(
                match serde_json::from_str::<serde_json::Map<String, Value>>(&l) {
                    Ok(_) => Ok((n, l)),
                    Err(e) => {
                        // serde's own position is within the line: say the column only.
                        let why = e.to_string();
                        let why = why
                            .strip_suffix(&format!(" at line {} column {}", e.line(), e.column()))
                            .unwrap_or(&why);
                        Err(CliError::Other(format!(
                            "line {n} of {name} is not a JSON object (one event per line): \
                             {why} (column {}); nothing was sent",
                            e.column()
                        )))
                    }
                },
            )
        })
        // A read error ends the input: what follows it cannot be trusted.
        .scan(false, |failed, l| {
            if *failed {
                return None;
            }
            *failed = l.is_err();
            Some(l)
        })
}

/// Append one batch (whole or not at all) and print its receipts; a refusal names the line.
async fn post_batch(
    c: &Client,
    batch: &[Line],
    name: &str,
    sent: &Sent,
    receipts: &mut Receipts<'_>,
) -> Result<u64, CliError> {
    // Each line is a checked JSON object: the body is their concatenation.
    let mut body = String::with_capacity(batch.iter().map(|l| l.1.len() + 1).sum::<usize>() + 12);
    body.push_str("{\"events\":[");
    for (i, (_, text)) in batch.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        body.push_str(text);
    }
    body.push_str("]}");
    // Sent as the input's exact bytes (a re-encoded `Value` would reorder keys and round
    // numbers past `f64`).
    let body = serde_json::value::RawValue::from_string(body)
        .map_err(|e| CliError::Other(format!("the batch is not JSON: {e}")))?;
    loop {
        let v = match c.ops().append_events(&body).await {
            Ok(v) => v,
            Err(tidemark_client::Error::Api(p))
                if p.status == tidemark_client::StatusCode::TOO_MANY_REQUESTS =>
            {
                let secs = p.retry_after.map_or(1, |d| d.as_secs().max(1));
                eprintln!("the server is busy (429); retrying in {secs} s");
                tokio::time::sleep(Duration::from_secs(secs)).await;
                continue;
            }
            Err(e @ tidemark_client::Error::Api(_)) => {
                return Err(refused_at(c.failed(e), batch, name, sent));
            }
            Err(e) => return Err(c.failed(e)),
        };
        let mut n = 0;
        for r in v["events"].as_array().into_iter().flatten() {
            receipts.push(r.clone())?;
            n += 1;
        }
        return Ok(n);
    }
}

/// A refused batch, with the lines at fault (the problem's `index`, or `blocked` indexes)
/// and what was appended before it.
fn refused_at(mut e: CliError, batch: &[Line], name: &str, sent: &Sent) -> CliError {
    let line_of = |i: &Value| {
        i.as_u64()
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| batch.get(i))
            .map(|l| l.0)
    };
    let (at, blocked, detail): (Option<usize>, Vec<usize>, Option<String>) = match e.problem() {
        Some(p) => (
            line_of(&p["index"]),
            p["blocked"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(line_of)
                .collect(),
            // The server counts events in the batch; the line says more.
            p["index"]
                .as_u64()
                .zip(p["detail"].as_str())
                .and_then(|(i, d)| d.strip_prefix(&format!("event {i}: ")).map(str::to_owned)),
        ),
        None => (None, Vec::new(), None),
    };
    if let Some(d) = detail {
        e = e.detail(d);
    }
    if let Some(p) = e.problem_mut() {
        p["file"] = Value::from(name);
        if let Some(l) = at {
            p["line"] = Value::from(l);
        }
        if !blocked.is_empty() {
            p["blocked_lines"] = Value::from(blocked.clone());
        }
    }
    if let Some(l) = at {
        e = e.context(format!("at line {l} of {name}"));
    }
    if !blocked.is_empty() {
        let list: Vec<String> = blocked.iter().map(ToString::to_string).collect();
        e = e.context(format!("blocked: lines {} of {name}", list.join(", ")));
    }
    let (first, last) = (batch[0].0, batch[batch.len() - 1].0);
    e.context(match sent.last_line {
        None => format!(
            "nothing was appended (lines {first}-{last} go in one batch, whole or not at all)"
        ),
        Some(through) => format!(
            "{} events up to line {through} were appended (their receipts are on stdout); \
             lines {first}-{last} were not (one batch, whole or not at all)",
            sent.events
        ),
    })
}

pub(crate) async fn tail(a: TailArgs) -> CliResult {
    let c = Client::new(&a.client)?;
    // Following the log never ends: off a terminal it prints a line per event as it comes.
    let follows = a.count.is_none();
    let out = Output::resolve_or(
        a.client.output,
        if follows { Output::Jsonl } else { Output::Json },
    );
    if follows && out == Output::Json {
        return Err(
            "-o json prints one document, which needs an end: give --count N, or \
                    use -o jsonl to follow the log"
                .into(),
        );
    }
    let mut opts = tidemark_client::StreamOptions::after(a.after).give_up_after(5);
    opts.stream.clone_from(&a.stream);
    opts.subject.clone_from(&a.subject);
    opts.event_type.clone_from(&a.event_type);
    let mut records = Records::new(out, EVENT_COLUMNS);
    if follows {
        records = records.streaming_table(&[6, 27, 12, 16, 24]);
    }
    // Once nobody reads stdout (`| head -1`), stop waiting for events nobody will see.
    let closed = stdout_closed();
    tokio::pin!(closed);
    let mut printed = 0u64;
    // The client's stream resumes after the last event it yielded across restarts of the
    // server, and gives up when the server was never there or does not come back.
    let mut events = c.stream(opts);
    loop {
        let ev = tokio::select! {
            ev = events.next() => ev,
            () = &mut closed => return Ok(()),
        };
        let ev = match ev {
            Some(Ok(ev)) => ev,
            Some(Err(e)) => return Err(c.failed(e)),
            None => return records.finish(),
        };
        let v = serde_json::to_value(&ev)
            .map_err(|e| CliError::Other(format!("event {}: {e}", ev.seq)))?;
        records.push(v)?;
        printed += 1;
        if a.count.is_some_and(|c| printed >= c) {
            return records.finish();
        }
    }
}
