//! `Purge`: what left the retention window leaves the read models.

use super::*;

/// Purge what left the window by now (at most `max` ids in one command: run it again while
/// it reports `more`); answers what it purged.
#[derive(Debug, Clone)]
pub struct Purge {
    pub window_ms: u64,
    pub max: usize,
    /// Run by hand: `Some(token name)`, `Some(None)` in open mode; `None` for the periodic
    /// run (section 8).
    pub by: Option<Option<String>>,
}

impl Command for Purge {
    type Answer = RetentionReport;

    fn decide(&self, txn: &ModelsTxn, round: &mut Round<'_>) -> DecideResult<Self::Answer> {
        let (now_us, head, privacy) = (round.now_us, round.head, round.privacy);
        let before = now_us.saturating_sub((self.window_ms as i64).saturating_mul(1_000));
        let mut rep = RetentionReport {
            before_us: before,
            through_seq: head,
            ..RetentionReport::default()
        };
        let mut dl: BTreeSet<String> = BTreeSet::new();
        let mut nl: Vec<String> = Vec::new();
        let mut tl: Vec<String> = Vec::new();
        let done = |d: &Delivery| !d.is_pending() && d.updated_at_us < before && d.last_seq <= head;

        // Notifications, oldest first: event times never go back along seq.
        let dt = deliveries::View::new(txn)?;
        for note in notifications::View::new(txn)?.older_than(head, before, self.max)? {
            if dl.len() + nl.len() >= self.max {
                rep.more = true;
                break;
            }
            let mut ids = dt.of_notification(&note.notification_id)?;
            if let Some(p) = privacy {
                ids.extend(dt.of_notification(&p.intent_key(&note.notification_id))?);
            }
            let mut all_done = true;
            for id in &ids {
                match dt.row(id)? {
                    Some(row) if !done(&row) => {
                        all_done = false;
                        break;
                    }
                    _ => {}
                }
            }
            if all_done {
                nl.push(note.notification_id.clone());
                dl.extend(ids);
            }
        }

        // Terminal tasks nobody follows.
        // A cursor with no progress for the window pins nothing (section 13).
        let followers: Vec<Cursor> = cursors::View::new(txn)?
            .all()?
            .into_iter()
            .filter(|c| {
                c.stream_name == Stream::TaskEvents.as_str()
                    && c.updated_at_us.is_some_and(|u| u >= before)
            })
            .collect();
        let tt = tasks::View::new(txn)?;
        let bt = bridges::View::new(txn)?;
        'status: for status in [
            TaskStatus::Completed,
            TaskStatus::Failed,
            TaskStatus::Canceled,
        ] {
            for id in tt.with_status(status)? {
                if dl.len() + nl.len() + tl.len() >= self.max {
                    rep.more = true;
                    break 'status;
                }
                let Some(task) = tt.row(&id)? else {
                    continue;
                };
                if task.updated_at_us >= before || task.latest_event_seq > head {
                    continue;
                }
                if bt.follows_task(&id)? {
                    continue;
                }
                let pinned = followers.iter().any(|c| {
                    (c.subject_id.is_empty() || c.subject_id == id)
                        && c.last_sequence < task.latest_event_seq
                });
                if !pinned {
                    tl.push(id);
                }
            }
        }

        rep.deliveries = dl.len();
        rep.notifications = nl.len();
        rep.tasks = tl.len();
        let before_text = tidemark_log::time::format_micros(before);
        let mut events = Vec::new();
        let mut dl = dl.into_iter();
        let (mut nl, mut tl) = (nl.into_iter(), tl.into_iter());
        loop {
            let mut p = Purged {
                before: before_text.clone(),
                through_seq: head,
                by: self.by.clone(),
                ..Purged::default()
            };
            let mut room = IDS_PER_EVENT;
            for (list, src) in [
                (
                    &mut p.deliveries,
                    &mut dl as &mut dyn Iterator<Item = String>,
                ),
                (&mut p.notifications, &mut nl),
                (&mut p.tasks, &mut tl),
            ] {
                while room > 0 {
                    let Some(id) = src.next() else { break };
                    list.push(id);
                    room -= 1;
                }
            }
            if room == IDS_PER_EVENT {
                break;
            }
            let v = serde_json::to_value(&p).map_err(se)?;
            events.push(
                NewEvent::new(None, Stream::Retention, "", EventType::RetentionPurged, &v)
                    .map_err(se)?,
            );
        }
        rep.events = events.len();
        Ok(Decided::new(rep, events))
    }
}
