//! Whether a JSON text is already in the canonical form payloads are stored in (compact, object
//! keys sorted and unique, strings and numbers written as serde_json writes them), so that an
//! append can keep the client's bytes instead of parsing them into a value tree and writing
//! them out again (issue 31). A text this does not recognise is not wrong, only not known to be
//! canonical: it goes the long way (parse, re-encode), which gives the same bytes when it is.

/// Nested deeper than this (objects and arrays inside the payload object) is judged the long
/// way: well inside serde_json's recursion limit (128 levels for a whole document, a request
/// body's own levels included), so a text taken here always parses back.
pub const MAX_DEPTH: usize = 100;

/// How deeply a JSON text nests objects and arrays (`{}` is 1), counted without parsing it:
/// brackets inside strings do not count. Meant for text already known to be JSON.
pub fn nesting_depth(text: &str) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for b in text.bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// True when `text` is a JSON object exactly as `serde_json::to_string` writes the value it
/// parses to (without `preserve_order`): no whitespace, keys in ascending byte order and
/// unique, strings with only the short escapes serde_json uses (`\"` `\\` `\n` `\r` `\t` `\b`
/// `\f`; keys with none), and integers only (`0` or `-?[1-9][0-9]*` within `i64`/`u64`; a
/// float's shortest form is left to serde_json). `false` is always safe.
pub fn is_canonical_object(text: &str) -> bool {
    let b = text.as_bytes();
    let mut s = Scan { b, i: 0 };
    b.first() == Some(&b'{') && s.value(0) && s.i == b.len()
}

struct Scan<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Scan<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    /// A value whose enclosing objects and arrays number `depth`.
    fn value(&mut self, depth: usize) -> bool {
        match self.peek() {
            Some(b'{' | b'[') if depth >= MAX_DEPTH => false,
            Some(b'{') => self.object(depth),
            Some(b'[') => self.array(depth),
            Some(b'"') => self.string(true).is_some(),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            Some(b'-' | b'0'..=b'9') => self.integer(),
            _ => false,
        }
    }

    fn literal(&mut self, word: &[u8]) -> bool {
        if self.b[self.i..].starts_with(word) {
            self.i += word.len();
            true
        } else {
            false
        }
    }

    fn object(&mut self, depth: usize) -> bool {
        self.i += 1;
        if self.peek() == Some(b'}') {
            self.i += 1;
            return true;
        }
        let mut previous: Option<&'a [u8]> = None;
        loop {
            // A key with an escape would have to be compared unescaped: the long way.
            let Some(key) = self.string(false) else {
                return false;
            };
            if previous.is_some_and(|p| p >= key) {
                return false;
            }
            previous = Some(key);
            if self.peek() != Some(b':') {
                return false;
            }
            self.i += 1;
            if !self.value(depth + 1) {
                return false;
            }
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    return true;
                }
                _ => return false,
            }
        }
    }

    fn array(&mut self, depth: usize) -> bool {
        self.i += 1;
        if self.peek() == Some(b']') {
            self.i += 1;
            return true;
        }
        loop {
            if !self.value(depth + 1) {
                return false;
            }
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b']') => {
                    self.i += 1;
                    return true;
                }
                _ => return false,
            }
        }
    }

    /// A string's contents (between the quotes) when it is written as serde_json writes it.
    fn string(&mut self, escapes: bool) -> Option<&'a [u8]> {
        if self.peek() != Some(b'"') {
            return None;
        }
        self.i += 1;
        let start = self.i;
        loop {
            match *self.b.get(self.i)? {
                b'"' => {
                    let b: &'a [u8] = self.b;
                    let s = &b[start..self.i];
                    self.i += 1;
                    return Some(s);
                }
                b'\\' if escapes => match self.b.get(self.i + 1)? {
                    b'"' | b'\\' | b'n' | b'r' | b't' | b'b' | b'f' => self.i += 2,
                    _ => return None,
                },
                c if c < 0x20 || c == b'\\' => return None,
                _ => self.i += 1,
            }
        }
    }

    fn integer(&mut self) -> bool {
        let start = self.i;
        let negative = self.peek() == Some(b'-');
        if negative {
            self.i += 1;
        }
        let digits = self.i;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.i += 1;
        }
        let n = &self.b[digits..self.i];
        if n.is_empty() || (n[0] == b'0' && (n.len() > 1 || negative)) {
            return false;
        }
        // A fraction or an exponent makes a float: the long way.
        if matches!(self.peek(), Some(b'.' | b'e' | b'E')) {
            return false;
        }
        let text = std::str::from_utf8(&self.b[start..self.i]).unwrap_or("x");
        if negative {
            text.parse::<i64>().is_ok()
        } else {
            text.parse::<u64>().is_ok()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    fn long_way(text: &str) -> Option<String> {
        let v: Value = serde_json::from_str(text).ok()?;
        v.is_object().then(|| serde_json::to_string(&v).unwrap())
    }

    #[test]
    fn depth_is_counted_outside_strings_and_deep_texts_go_the_long_way() {
        assert_eq!(nesting_depth("{}"), 1);
        assert_eq!(nesting_depth(r#"{"a":[{"b":"[[{{\"]]"}],"c":{}}"#), 3);
        let nested = |n: usize| format!("{}{}{}", r#"{"a":"#.repeat(n), "1", "}".repeat(n));
        assert!(is_canonical_object(&nested(MAX_DEPTH)));
        assert!(!is_canonical_object(&nested(MAX_DEPTH + 1)));
        assert_eq!(nesting_depth(&nested(MAX_DEPTH + 1)), MAX_DEPTH + 1);
        // Whatever it takes, serde_json reads back inside a body of a few levels more.
        let body = format!(r#"{{"events":[{{"payload":{}}}]}}"#, nested(MAX_DEPTH));
        assert!(serde_json::from_str::<Value>(&body).is_ok());
    }

    #[test]
    fn recognises_what_serde_json_writes_and_nothing_else() {
        for yes in [
            r#"{}"#,
            r#"{"a":1,"b":[true,false,null,-3,"x\"\\\n"],"c":{"":0}}"#,
            r#"{"a":18446744073709551615,"b":-9223372036854775808}"#,
            "{\"é\":\"ü\u{7f}\"}",
        ] {
            assert!(is_canonical_object(yes), "{yes}");
            assert_eq!(long_way(yes).as_deref(), Some(yes));
        }
        for no in [
            r#"{ }"#,
            r#"{"b":1,"a":2}"#,
            r#"{"a":1,"a":2}"#,
            r#"{"a":1.0}"#,
            r#"{"a":1e3}"#,
            r#"{"a":-0}"#,
            r#"{"a":01}"#,
            r#"{"a":18446744073709551616}"#,
            r#"{"a":"\u0041"}"#,
            r#"{"a":"\/"}"#,
            r#"{"a\n":1}"#,
            r#"[1]"#,
            r#"{"a":1} "#,
        ] {
            assert!(!is_canonical_object(no), "{no}");
        }
    }

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            "\\PC{0,6}|[\\x00-\\x7f]{0,4}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::btree_map("[a-c\"\\\\é]{0,3}", inner, 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Whatever it accepts, the long way writes back byte for byte. (Floats are never
        /// accepted: serde_json's parse of its own float text is not always exact, so the long
        /// way is not even idempotent for them.)
        #[test]
        fn accepted_texts_are_their_own_canonical_form(v in json(), pretty in any::<bool>()) {
            let obj = Value::Object([("k".to_owned(), v)].into_iter().collect());
            let text = if pretty { serde_json::to_string_pretty(&obj).unwrap() } else { serde_json::to_string(&obj).unwrap() };
            if is_canonical_object(&text) {
                prop_assert_eq!(long_way(&text), Some(text.clone()));
            }
        }

        /// The common case is taken the short way: integers, booleans and plain strings.
        #[test]
        fn plain_payloads_are_recognised(m in prop::collection::btree_map("[a-z_]{0,8}", prop_oneof![
            any::<i64>().prop_map(Value::from),
            any::<bool>().prop_map(Value::from),
            "[ -!#-\\[\\]-~é]{0,12}".prop_map(Value::from),
        ], 0..8)) {
            let text = serde_json::to_string(&Value::Object(m.into_iter().collect())).unwrap();
            prop_assert!(is_canonical_object(&text), "{}", text);
        }

        /// Arbitrary texts: accepted only when the long way gives them back unchanged.
        #[test]
        fn arbitrary_texts_are_never_accepted_wrongly(text in "\\{(\"[ab\\\\\"]{0,2}\":[-0-9a-z.\\[\\]{},\" ]{0,8},?){0,3}\\}") {
            if is_canonical_object(&text) {
                prop_assert_eq!(long_way(&text), Some(text.clone()));
            }
        }
    }
}
