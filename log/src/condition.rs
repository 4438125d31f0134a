//! Conditions of a conditional append (spec section 3): the head, and for each of several
//! (stream, subject) pairs the seq of that subject's last event. A backend judges them when it
//! appends (the embedded backend: `embedded/condition.rs`).

/// What a conditional append expects of the log (JetStream's expected last sequence and
/// expected last subject sequence, spec section 16). Every part must hold; the empty condition
/// always holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Condition {
    /// The log's head is this seq.
    pub head: Option<u64>,
    /// For each, the last event of its stream with its subject has its seq.
    pub subjects: Vec<SubjectSeq>,
}

/// One subject's part of a [`Condition`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubjectSeq {
    pub stream: String,
    pub subject: String,
    /// The seq of the last event of `stream` with `subject`; 0: there is none yet.
    pub last_seq: u64,
}

impl Condition {
    /// The condition that always holds (a plain append).
    pub fn none() -> Condition {
        Condition::default()
    }

    /// The log's head is `seq`.
    pub fn head(seq: u64) -> Condition {
        Condition::none().and_head(seq)
    }

    /// The last event of `stream` with `subject` is at `last_seq` (0: there is none).
    pub fn subject(
        stream: impl Into<String>,
        subject: impl Into<String>,
        last_seq: u64,
    ) -> Condition {
        Condition::none().and_subject(stream, subject, last_seq)
    }

    /// This condition, and the log's head is `seq`.
    #[must_use]
    pub fn and_head(mut self, seq: u64) -> Condition {
        self.head = Some(seq);
        self
    }

    /// This condition, and the last event of `stream` with `subject` is at `last_seq`.
    #[must_use]
    pub fn and_subject(
        mut self,
        stream: impl Into<String>,
        subject: impl Into<String>,
        last_seq: u64,
    ) -> Condition {
        self.subjects.push(SubjectSeq {
            stream: stream.into(),
            subject: subject.into(),
            last_seq,
        });
        self
    }

    /// Whether it always holds.
    pub fn is_none(&self) -> bool {
        self.head.is_none() && self.subjects.is_empty()
    }
}

/// The seq a failed condition was about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConditionOn {
    /// The log's head.
    Head,
    /// The last event of `stream` with `subject`.
    Subject { stream: String, subject: String },
}

impl std::fmt::Display for ConditionOn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConditionOn::Head => f.write_str("the log"),
            ConditionOn::Subject { stream, subject } => {
                write!(f, "stream {stream:?} subject {subject:?}")
            }
        }
    }
}

/// `Some(ExpectationFailed)` naming the first part of `cond` that does not hold — the head
/// first, then the subjects in the order given — for a log whose head is `head` and whose last
/// seq of a (stream, subject) `last_of` answers. Every backend judges a condition with it, so
/// they refuse alike.
pub(crate) fn first_failed<E>(
    cond: &Condition,
    head: u64,
    mut last_of: impl FnMut(&str, &str) -> Result<u64, E>,
) -> Result<Option<crate::AppendError>, E> {
    use crate::AppendError::ExpectationFailed;
    if let Some(expected) = cond.head
        && head != expected
    {
        return Ok(Some(ExpectationFailed {
            on: ConditionOn::Head,
            expected,
            actual: head,
        }));
    }
    for c in &cond.subjects {
        let actual = last_of(&c.stream, &c.subject)?;
        if actual != c.last_seq {
            return Ok(Some(ExpectationFailed {
                on: ConditionOn::Subject {
                    stream: c.stream.clone(),
                    subject: c.subject.clone(),
                },
                expected: c.last_seq,
                actual,
            }));
        }
    }
    Ok(None)
}
