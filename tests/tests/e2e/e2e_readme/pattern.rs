//! The answers the README shows: JSON in which `…` stands for what the README leaves out.
//!
//! - `…` as a value matches any value; as an object member, any further members (without
//!   it an object must have exactly the members shown); as an array element, any number of
//!   elements; as a whole document, any number of documents.
//! - Inside a string, `…` matches any text: `"dlv:5c1f…:desktop"`.
//! - What differs from run to run needs no `…`: a time (RFC 3339) matches any time, a UUID any
//!   UUID, a hex digest (16 hex digits or more) any digest of the same length, and a number
//!   under a duration key (`*_ms`, `*_s`, `*_us`, `*_seconds`) any number.

use serde_json::Value;

/// One value of an answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Pat {
    /// `…`
    Any,
    Null,
    Bool(bool),
    Num(serde_json::Number),
    /// The literal pieces between the `…` of a string (one piece: an exact string).
    Str(Vec<String>),
    Arr(Vec<Pat>),
    /// The members shown, and whether `…` allows more.
    Obj(Vec<(String, Pat)>, bool),
}

/// Why an answer's text is not a sequence of patterns.
#[derive(Debug, PartialEq)]
pub enum ParseError {
    /// The text ended inside a value: more lines may complete it.
    Incomplete,
    /// Malformed at this byte offset.
    Bad(usize, String),
}

const ELLIPSIS: char = '…';

/// Parse every pattern in `text`, in order.
pub fn parse_all(text: &str) -> Result<Vec<Pat>, ParseError> {
    let mut p = Parser { s: text, i: 0 };
    let mut out = Vec::new();
    loop {
        p.skip_ws();
        if p.i >= p.s.len() {
            return Ok(out);
        }
        out.push(p.value()?);
    }
}

struct Parser<'a> {
    s: &'a str,
    i: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.s[self.i..].chars().next()
    }

    fn skip_ws(&mut self) {
        while let Some(c) = self.peek() {
            if !c.is_whitespace() {
                break;
            }
            self.i += c.len_utf8();
        }
    }

    fn bad<T>(&self, what: &str) -> Result<T, ParseError> {
        Err(ParseError::Bad(self.i, what.to_owned()))
    }

    fn expect(&mut self, c: char) -> Result<(), ParseError> {
        self.skip_ws();
        match self.peek() {
            None => Err(ParseError::Incomplete),
            Some(x) if x == c => {
                self.i += c.len_utf8();
                Ok(())
            }
            Some(x) => self.bad(&format!("expected {c:?}, found {x:?}")),
        }
    }

    fn value(&mut self) -> Result<Pat, ParseError> {
        self.skip_ws();
        let Some(c) = self.peek() else {
            return Err(ParseError::Incomplete);
        };
        match c {
            ELLIPSIS => {
                self.i += c.len_utf8();
                Ok(Pat::Any)
            }
            '{' => self.object(),
            '[' => self.array(),
            '"' => Ok(Pat::Str(self.string()?)),
            't' => self.word("true", Pat::Bool(true)),
            'f' => self.word("false", Pat::Bool(false)),
            'n' => self.word("null", Pat::Null),
            '-' | '0'..='9' => self.number(),
            _ => self.bad(&format!("unexpected {c:?}")),
        }
    }

    fn word(&mut self, w: &str, p: Pat) -> Result<Pat, ParseError> {
        let rest = &self.s[self.i..];
        if rest.starts_with(w) {
            self.i += w.len();
            Ok(p)
        } else if w.starts_with(rest) {
            Err(ParseError::Incomplete)
        } else {
            self.bad(&format!("expected {w}"))
        }
    }

    fn number(&mut self) -> Result<Pat, ParseError> {
        let start = self.i;
        while let Some(c) = self.peek() {
            if !(c.is_ascii_digit() || "+-.eE".contains(c)) {
                break;
            }
            self.i += 1;
        }
        serde_json::from_str::<serde_json::Number>(&self.s[start..self.i])
            .map(Pat::Num)
            .or_else(|e| self.bad(&format!("bad number: {e}")))
    }

    /// A JSON string (the cursor on its opening quote), split at each `…`.
    fn string(&mut self) -> Result<Vec<String>, ParseError> {
        let start = self.i;
        self.i += 1;
        let mut escaped = false;
        loop {
            let Some(c) = self.peek() else {
                return Err(ParseError::Incomplete);
            };
            self.i += c.len_utf8();
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => break,
                '\n' => {
                    self.i = start;
                    return self.bad("a line break inside a string");
                }
                _ => {}
            }
        }
        let text: String = serde_json::from_str(&self.s[start..self.i])
            .or_else(|e| self.bad(&format!("bad string: {e}")))?;
        Ok(text.split(ELLIPSIS).map(str::to_owned).collect())
    }

    fn array(&mut self) -> Result<Pat, ParseError> {
        self.expect('[')?;
        let mut items = Vec::new();
        self.skip_ws();
        if self.peek() == Some(']') {
            self.i += 1;
            return Ok(Pat::Arr(items));
        }
        loop {
            items.push(self.value()?);
            self.skip_ws();
            match self.peek() {
                None => return Err(ParseError::Incomplete),
                Some(',') => self.i += 1,
                Some(']') => {
                    self.i += 1;
                    return Ok(Pat::Arr(items));
                }
                Some(c) => return self.bad(&format!("expected , or ] in an array, found {c:?}")),
            }
        }
    }

    fn object(&mut self) -> Result<Pat, ParseError> {
        self.expect('{')?;
        let mut members = Vec::new();
        let mut open = false;
        self.skip_ws();
        if self.peek() == Some('}') {
            self.i += 1;
            return Ok(Pat::Obj(members, open));
        }
        loop {
            self.skip_ws();
            match self.peek() {
                None => return Err(ParseError::Incomplete),
                Some(ELLIPSIS) => {
                    self.i += ELLIPSIS.len_utf8();
                    open = true;
                }
                Some('"') => {
                    let key = self.string()?;
                    if key.len() != 1 {
                        return self.bad("a key cannot hold …");
                    }
                    self.expect(':')?;
                    let v = self.value()?;
                    members.push((key.concat(), v));
                }
                Some(c) => {
                    return self.bad(&format!("expected a key or … in an object, found {c:?}"));
                }
            }
            self.skip_ws();
            match self.peek() {
                None => return Err(ParseError::Incomplete),
                Some(',') => self.i += 1,
                Some('}') => {
                    self.i += 1;
                    return Ok(Pat::Obj(members, open));
                }
                Some(c) => return self.bad(&format!("expected , or }} in an object, found {c:?}")),
            }
        }
    }
}

/// Match a sequence of documents (or array elements), `…` standing for any number of them.
pub fn match_seq(pats: &[Pat], vals: &[Value], path: &str) -> Result<(), String> {
    seq_from(pats, vals, 0, path)
}

/// [`match_seq`] of `vals`, which start at index `at` of the whole sequence.
fn seq_from(pats: &[Pat], vals: &[Value], at: usize, path: &str) -> Result<(), String> {
    match pats.split_first() {
        None if vals.is_empty() => Ok(()),
        None => Err(format!(
            "{path}[{at}..]: {} more than the README shows, the first: {}",
            vals.len(),
            short(&vals[0])
        )),
        Some((Pat::Any, [])) => Ok(()),
        Some((Pat::Any, rest)) => {
            let mut last = String::new();
            for k in 0..=vals.len() {
                match seq_from(rest, &vals[k..], at + k, path) {
                    Ok(()) => return Ok(()),
                    Err(e) => last = e,
                }
            }
            Err(last)
        }
        Some((first, rest)) => {
            let Some((v, vs)) = vals.split_first() else {
                return Err(format!(
                    "{path}[{at}]: the README shows {}, the answer has nothing more",
                    show(first)
                ));
            };
            matches(first, v, None, &format!("{path}[{at}]"))?;
            seq_from(rest, vs, at + 1, path)
        }
    }
}

/// Match one value; `key` is the member name it sits under, `path` names it in errors.
pub fn matches(p: &Pat, v: &Value, key: Option<&str>, path: &str) -> Result<(), String> {
    let mismatch = || {
        Err(format!(
            "{path}: the README shows {}, the answer is {}",
            show(p),
            short(v)
        ))
    };
    match (p, v) {
        (Pat::Any, _) | (Pat::Null, Value::Null) => Ok(()),
        (Pat::Bool(a), Value::Bool(b)) if a == b => Ok(()),
        (Pat::Num(_), Value::Number(_)) if key.is_some_and(is_duration_key) => Ok(()),
        (Pat::Num(a), Value::Number(b)) if num_eq(a, b) => Ok(()),
        (Pat::Str(pieces), Value::String(s)) if str_matches(pieces, s) => Ok(()),
        (Pat::Arr(items), Value::Array(vals)) => match_seq(items, vals, path),
        (Pat::Obj(members, open), Value::Object(map)) => {
            for (k, mp) in members {
                let Some(mv) = map.get(k) else {
                    return Err(format!(
                        "{path}: the answer has no member {k:?}: {}",
                        short(v)
                    ));
                };
                matches(mp, mv, Some(k), &format!("{path}.{k}"))?;
            }
            if !open {
                let extra: Vec<&String> = map
                    .keys()
                    .filter(|k| !members.iter().any(|(m, _)| m == *k))
                    .collect();
                if !extra.is_empty() {
                    return Err(format!(
                        "{path}: the answer has members the README does not show (add them, \
                         or … for the rest): {extra:?} in {}",
                        short(v)
                    ));
                }
            }
            Ok(())
        }
        _ => mismatch(),
    }
}

fn num_eq(a: &serde_json::Number, b: &serde_json::Number) -> bool {
    match (a.as_i64(), b.as_i64()) {
        (Some(x), Some(y)) => x == y,
        _ => a.as_f64() == b.as_f64(),
    }
}

fn is_duration_key(k: &str) -> bool {
    ["_ms", "_s", "_us", "_seconds"]
        .iter()
        .any(|suffix| k.ends_with(suffix))
}

fn str_matches(pieces: &[String], s: &str) -> bool {
    if let [exact] = pieces {
        return exact == s
            || (is_time(exact) && is_time(s))
            || (is_uuid(exact) && is_uuid(s))
            || (is_digest(exact) && is_digest(s) && exact.len() == s.len());
    }
    // `a…b…c`: a prefix, pieces in order, a suffix.
    let (first, rest) = pieces
        .split_first()
        .expect("split gives one piece at least");
    let Some(mut tail) = s.strip_prefix(first.as_str()) else {
        return false;
    };
    let (last, middle) = rest.split_last().expect("more than one piece");
    for m in middle {
        match tail.find(m.as_str()) {
            Some(at) => tail = &tail[at + m.len()..],
            None => return false,
        }
    }
    tail.ends_with(last.as_str())
}

/// `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)`.
fn is_time(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() < 20 {
        return false;
    }
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19)
        && (s.ends_with('Z') || s[19..].contains(['+', '-']))
}

fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.char_indices().all(|(i, c)| {
            if [8, 13, 18, 23].contains(&i) {
                c == '-'
            } else {
                c.is_ascii_hexdigit()
            }
        })
}

fn is_digest(s: &str) -> bool {
    s.len() >= 16 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A pattern as the README would write it.
pub fn show(p: &Pat) -> String {
    match p {
        Pat::Any => "…".to_owned(),
        Pat::Null => "null".to_owned(),
        Pat::Bool(b) => b.to_string(),
        Pat::Num(n) => n.to_string(),
        Pat::Str(pieces) => Value::String(pieces.join("…")).to_string(),
        Pat::Arr(items) => format!("[{}]", items.iter().map(show).collect::<Vec<_>>().join(",")),
        Pat::Obj(members, open) => {
            let mut parts: Vec<String> = members
                .iter()
                .map(|(k, v)| format!("{}:{}", Value::String(k.clone()), show(v)))
                .collect();
            if *open {
                parts.push("…".to_owned());
            }
            format!("{{{}}}", parts.join(","))
        }
    }
}

/// A value, cut to a readable length.
pub fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() <= 400 {
        return s;
    }
    let cut: String = s.chars().take(400).collect();
    format!("{cut}…")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn one(text: &str) -> Pat {
        let mut all = parse_all(text).expect("parses");
        assert_eq!(all.len(), 1);
        all.remove(0)
    }

    #[test]
    fn ellipses_and_generated_values() {
        let p = one(r#"{"id":"dlv:5c1f…:desktop","time":"2026-01-01T00:00:00.000000Z","n":2,…}"#);
        let v = json!({"id": "dlv:5c1f0e:desktop", "time": "2031-05-05T10:11:12.131415Z", "n": 2, "x": 1});
        assert!(matches(&p, &v, None, "$").is_ok());
        let v = json!({"id": "dlv:5c1f0e:desktop", "time": "now", "n": 2});
        assert!(matches(&p, &v, None, "$").is_err());
        let closed = one(r#"{"n":2}"#);
        assert!(matches(&closed, &json!({"n": 2, "x": 1}), None, "$").is_err());
        let arr = one(r#"[1, …, 4]"#);
        assert!(matches(&arr, &json!([1, 2, 3, 4]), None, "$").is_ok());
        assert!(matches(&arr, &json!([1, 4]), None, "$").is_ok());
        assert!(matches(&arr, &json!([1, 3]), None, "$").is_err());
        let dur = one(r#"{"duration_ms":3}"#);
        assert!(matches(&dur, &json!({"duration_ms": 41}), None, "$").is_ok());
        assert_eq!(parse_all(r#"{"a":[1,"#), Err(ParseError::Incomplete));
        assert!(matches!(parse_all("{a}"), Err(ParseError::Bad(..))));
    }
}
