//! The README as the test reads it: its fenced blocks, the commands of each shell block with
//! the answers shown under them, and the `<!-- readme-test: … -->` directives.
//!
//! In a ```` ```sh ```` block, a command is a line and the lines it continues onto (a
//! trailing `\`, an open quote, a here-document). The comment lines right under a command
//! that start with `{`, `[` or `…` are its answer (see [`super::pattern`]), and so are SSE
//! frames there (`id: 3`, `event: task.created`, `data: {…}` lines; `…` for more frames);
//! other comments are prose. A directive on its own line before a block applies to that block:
//!
//! - `<!-- readme-test: skip: REASON -->`: the block is not run;
//! - `<!-- readme-test: skip "PREFIX": REASON -->`: its command that starts with PREFIX is not
//!   run (a directive that matches no command fails the test).

use super::pattern::{self, ParseError, Pat};

/// A fenced block.
#[derive(Debug)]
pub struct Block {
    /// The info string: `sh`, `toml`, ...
    pub lang: String,
    /// 1-based line of the opening fence.
    pub line: usize,
    /// The lines between the fences.
    pub body: Vec<String>,
    pub skip: Option<String>,
    /// (command prefix, reason)
    pub skip_commands: Vec<(String, String)>,
}

/// One command of a shell block.
#[derive(Debug)]
pub struct Example {
    /// 1-based README line of its first line.
    pub line: usize,
    /// As written (continuation lines, quotes and trailing comments included).
    pub text: String,
    /// The text without its comments, for the harness to recognise what it handles itself.
    pub code: String,
    pub answer: Option<Answer>,
}

/// The answer shown under a command.
#[derive(Debug)]
pub struct Answer {
    /// 1-based README line where it starts.
    pub line: usize,
    /// The documents it shows; an SSE answer's frames as `{"id", "event", "data"}` objects.
    pub docs: Vec<Pat>,
    /// Shown as SSE frames (`id: …`, `event: …`, `data: …` lines).
    pub sse: bool,
}

impl Block {
    /// Whether the harness runs it as shell.
    pub fn is_shell(&self) -> bool {
        matches!(self.lang.as_str(), "sh" | "bash" | "shell" | "console")
    }
}

/// The fenced blocks of `text`, with the directives before each.
pub fn blocks(text: &str) -> Result<Vec<Block>, String> {
    let mut out = Vec::new();
    let mut pending: Vec<(usize, String)> = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((i, line)) = lines.next() {
        let t = line.trim();
        if let Some(d) = t
            .strip_prefix("<!-- readme-test:")
            .and_then(|r| r.strip_suffix("-->"))
        {
            pending.push((i + 1, d.trim().to_owned()));
            continue;
        }
        let Some(lang) = t.strip_prefix("```") else {
            continue;
        };
        let mut block = Block {
            lang: lang.trim().to_owned(),
            line: i + 1,
            body: Vec::new(),
            skip: None,
            skip_commands: Vec::new(),
        };
        for (at, d) in pending.drain(..) {
            apply(&mut block, at, &d)?;
        }
        loop {
            let Some((_, l)) = lines.next() else {
                return Err(format!("the block at line {} is never closed", block.line));
            };
            if l.trim() == "```" {
                break;
            }
            block.body.push(l.to_owned());
        }
        out.push(block);
    }
    if let Some((at, _)) = pending.first() {
        return Err(format!(
            "the readme-test directive at line {at} is followed by no block"
        ));
    }
    Ok(out)
}

fn apply(block: &mut Block, at: usize, d: &str) -> Result<(), String> {
    let bad = || {
        format!(
            "line {at}: a readme-test directive is `skip: REASON` or `skip \"PREFIX\": \
             REASON`, not {d:?}"
        )
    };
    let rest = d.strip_prefix("skip").ok_or_else(bad)?.trim_start();
    if let Some(reason) = rest.strip_prefix(':') {
        let reason = reason.trim();
        if reason.is_empty() {
            return Err(bad());
        }
        block.skip = Some(reason.to_owned());
        return Ok(());
    }
    let rest = rest.strip_prefix('"').ok_or_else(bad)?;
    let (prefix, reason) = rest.split_once("\":").ok_or_else(bad)?;
    if prefix.is_empty() || reason.trim().is_empty() {
        return Err(bad());
    }
    block
        .skip_commands
        .push((prefix.to_owned(), reason.trim().to_owned()));
    Ok(())
}

/// Quote state carried from one line of a command to the next.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
enum Quote {
    #[default]
    None,
    Single,
    Double,
}

/// What scanning one line found.
struct Scan {
    quote: Quote,
    /// The line without its comment (the whole line while inside a quote).
    code: String,
    comment: Option<String>,
    /// It ends with a `\` outside quotes and comments.
    continues: bool,
    /// Delimiters of here-documents it opens.
    heredocs: Vec<String>,
}

fn scan(line: &str, mut quote: Quote) -> Scan {
    let chars: Vec<char> = line.chars().collect();
    let mut code = String::new();
    let mut comment = None;
    let mut heredocs = Vec::new();
    let mut continues = false;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match quote {
            Quote::Single => {
                if c == '\'' {
                    quote = Quote::None;
                }
            }
            Quote::Double => match c {
                '\\' => {
                    code.push(c);
                    i += 1;
                    if let Some(n) = chars.get(i) {
                        code.push(*n);
                    }
                    i += 1;
                    continue;
                }
                '"' => quote = Quote::None,
                _ => {}
            },
            Quote::None => match c {
                '\\' if i + 1 == chars.len() => {
                    continues = true;
                    break;
                }
                '\\' => {
                    code.push(c);
                    code.push(chars[i + 1]);
                    i += 2;
                    continue;
                }
                '\'' => quote = Quote::Single,
                '"' => quote = Quote::Double,
                '#' if i == 0 || chars[i - 1].is_whitespace() => {
                    comment = Some(chars[i + 1..].iter().collect::<String>().trim().to_owned());
                    break;
                }
                '<' if chars.get(i + 1) == Some(&'<') && chars.get(i + 2) != Some(&'<') => {
                    let rest: String = chars[i + 2..].iter().collect();
                    let word: String = rest
                        .trim_start_matches('-')
                        .trim_start()
                        .trim_start_matches(['\'', '"'])
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if !word.is_empty() {
                        heredocs.push(word);
                    }
                }
                _ => {}
            },
        }
        code.push(c);
        i += 1;
    }
    Scan {
        quote,
        code: code.trim_end().to_owned(),
        comment,
        continues,
        heredocs,
    }
}

/// The commands of a shell block, each with the answer shown under it.
pub fn examples(block: &Block) -> Result<Vec<Example>, String> {
    let mut out: Vec<Example> = Vec::new();
    let body = &block.body;
    let mut i = 0;
    // The last example may take an answer only from the comment lines right under it.
    let mut answer_open = false;
    while i < body.len() {
        let line_no = block.line + 1 + i;
        let t = body[i].trim();
        if t.is_empty() {
            answer_open = false;
            i += 1;
            continue;
        }
        if let Some(c) = t.strip_prefix('#') {
            let c = c.trim_start();
            let json = c.starts_with(['{', '[', '…']);
            let sse = SSE_FIELDS.iter().any(|f| c.starts_with(f));
            if answer_open && (json || sse) {
                let (docs, used) = if sse {
                    sse_answer_at(body, i)
                } else {
                    answer_at(body, i)
                }
                .map_err(|e| format!("README line {line_no}: the answer shown: {e}"))?;
                let last = out.last_mut().expect("an open answer follows an example");
                last.answer = Some(Answer {
                    line: line_no,
                    docs,
                    sse,
                });
                i += used;
            } else {
                i += 1;
            }
            answer_open = false;
            continue;
        }
        // A command: this line and those it continues onto.
        let mut text = String::new();
        let mut code = String::new();
        let mut quote = Quote::None;
        loop {
            let Some(l) = body.get(i) else {
                return Err(format!(
                    "README line {line_no}: the command never ends (an open quote or `\\`)"
                ));
            };
            i += 1;
            let s = scan(l, quote);
            if quote == Quote::None
                && let Some(c) = &s.comment
                && c.starts_with(['{', '['])
            {
                return Err(format!(
                    "README line {}: an answer in a trailing comment is not checked; put it \
                     on the lines under the command",
                    block.line + i
                ));
            }
            text.push_str(l);
            text.push('\n');
            code.push_str(&s.code);
            code.push(if s.quote == Quote::None { ' ' } else { '\n' });
            quote = s.quote;
            for delim in &s.heredocs {
                loop {
                    let Some(h) = body.get(i) else {
                        return Err(format!(
                            "README line {line_no}: the here-document {delim} never ends"
                        ));
                    };
                    i += 1;
                    text.push_str(h);
                    text.push('\n');
                    code.push_str(h);
                    code.push('\n');
                    if h.trim() == delim {
                        break;
                    }
                }
            }
            if !(s.continues || quote != Quote::None) {
                break;
            }
        }
        out.push(Example {
            line: line_no,
            text,
            code: code.trim().to_owned(),
            answer: None,
        });
        answer_open = true;
    }
    Ok(out)
}

/// The answer starting at `body[start]`: its patterns and how many lines it takes. It goes on
/// while a value is incomplete, and to each further comment line that starts another one.
fn answer_at(body: &[String], start: usize) -> Result<(Vec<Pat>, usize), String> {
    let mut text = String::new();
    let mut i = start;
    loop {
        let next = body
            .get(i)
            .and_then(|l| l.trim().strip_prefix('#'))
            .map(str::trim);
        match pattern::parse_all(&text) {
            Err(ParseError::Bad(at, why)) => {
                return Err(format!("not JSON with …: {why} at byte {at} of {text:?}"));
            }
            Ok(docs) if i > start && next.is_none_or(|c| !c.starts_with(['{', '[', '…'])) => {
                // The answer is complete, and what follows is prose, or not a comment.
                return Ok((docs, i - start));
            }
            Err(ParseError::Incomplete) if next.is_none() => {
                return Err(format!("the answer ends inside a value: {text:?}"));
            }
            _ => {}
        }
        text.push_str(next.expect("a comment line"));
        text.push('\n');
        i += 1;
    }
}

/// The fields an SSE answer shows, one a line.
const SSE_FIELDS: [&str; 3] = ["id: ", "event: ", "data: "];

/// The SSE answer starting at `body[start]`: each frame (it starts at `id:`, or where a field
/// repeats) as an object pattern, `…` for any further frames.
fn sse_answer_at(body: &[String], start: usize) -> Result<(Vec<Pat>, usize), String> {
    let mut frames: Vec<Pat> = Vec::new();
    let mut frame: Vec<(String, Pat)> = Vec::new();
    let mut i = start;
    while let Some(c) = body
        .get(i)
        .and_then(|l| l.trim().strip_prefix('#'))
        .map(str::trim)
    {
        if c == "…" {
            if !frame.is_empty() {
                frames.push(Pat::Obj(std::mem::take(&mut frame), false));
            }
            frames.push(Pat::Any);
            i += 1;
            continue;
        }
        let Some((field, value)) = c
            .split_once(": ")
            .filter(|(f, _)| SSE_FIELDS.iter().any(|x| x.trim_end_matches(": ") == *f))
        else {
            break;
        };
        if (field == "id" || frame.iter().any(|(f, _)| f == field)) && !frame.is_empty() {
            frames.push(Pat::Obj(std::mem::take(&mut frame), false));
        }
        let pat = if field == "data" {
            let mut all =
                pattern::parse_all(value).map_err(|e| format!("data: {e:?} in {value:?}"))?;
            if all.len() != 1 {
                return Err(format!("data: one JSON value a line, not {value:?}"));
            }
            all.remove(0)
        } else {
            Pat::Str(value.split('…').map(str::to_owned).collect())
        };
        frame.push((field.to_owned(), pat));
        i += 1;
    }
    if !frame.is_empty() {
        frames.push(Pat::Obj(frame, false));
    }
    Ok((frames, i - start))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_block(text: &str) -> Block {
        let mut b = blocks(text).expect("parses");
        assert_eq!(b.len(), 1);
        b.remove(0)
    }

    #[test]
    fn commands_answers_and_prose() {
        let text = "intro\n\
            <!-- readme-test: skip \"rm \": it deletes -->\n\
            ```sh\n\
            cmd one \\\n  --flag   # trailing prose\n\
            # {\"a\":1,\n\
            #  \"b\":[…]}\n\
            # prose after the answer\n\
            curl -d '{\"x\":\n  1}'\n\
            cat > f <<'EOF'\n\
            # not a comment: inside the here-document\n\
            EOF\n\
            curl -N x\n\
            # id: 3\n\
            # event: t\n\
            # data: {\"seq\":3,…}\n\
            # …\n\
            \n\
            # {\"after\":\"a blank line: prose\"}\n\
            rm x\n\
            ```\n";
        let b = one_block(text);
        assert_eq!(
            b.skip_commands,
            vec![("rm ".to_owned(), "it deletes".to_owned())]
        );
        let ex = examples(&b).expect("examples");
        let codes: Vec<&str> = ex.iter().map(|e| e.code.as_str()).collect();
        assert_eq!(codes.len(), 5, "{codes:?}");
        assert_eq!(codes[0], "cmd one   --flag");
        assert!(
            ex[0]
                .answer
                .as_ref()
                .is_some_and(|a| a.docs.len() == 1 && a.line == 6)
        );
        assert!(ex[1].answer.is_none());
        assert!(codes[1].starts_with("curl -d '{\"x\":\n"), "{:?}", codes[1]);
        assert!(ex[2].text.contains("inside the here-document"));
        let sse = ex[3].answer.as_ref().expect("the SSE answer");
        assert!(sse.sse);
        assert_eq!(sse.docs.len(), 2, "{:?}", sse.docs);
        assert_eq!(sse.docs[1], Pat::Any);
        assert!(ex[4].answer.is_none());
    }

    #[test]
    fn bad_directives_and_inline_answers_are_refused() {
        assert!(blocks("<!-- readme-test: skip -->\n```sh\nx\n```\n").is_err());
        assert!(blocks("<!-- readme-test: run it -->\n```sh\nx\n```\n").is_err());
        assert!(blocks("<!-- readme-test: skip: why -->\n").is_err());
        let b = one_block("```sh\ncurl x   # {\"a\":1}\n```\n");
        assert!(examples(&b).is_err());
        let b = one_block("```sh\ncurl x\n# {\"a\": oops}\n```\n");
        assert!(examples(&b).is_err());
    }
}
