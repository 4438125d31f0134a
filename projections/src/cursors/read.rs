//! The cursors model's queries (served from [`crate::read`]).

use tidemark_log::StorageError;

/// One cursor, or its zero state.
pub fn cursor(
    db: &crate::models::ModelsRead,
    consumer_id: &str,
    stream_name: &str,
    subject_id: &str,
) -> Result<crate::cursors::Cursor, StorageError> {
    use crate::cursors;
    Ok(db
        .reader()?
        .get_val(
            cursors::NAME,
            cursors::ROWS,
            &cursors::key(consumer_id, stream_name, subject_id),
        )?
        .unwrap_or_else(|| cursors::Cursor::zero(consumer_id, stream_name, subject_id)))
}

/// Cursors whose key starts with `consumer_id` (all of that consumer's), or every cursor
/// when `None`; at most `limit`, after the key `after` (paging).
pub fn cursors(
    db: &crate::models::ModelsRead,
    consumer_id: Option<&str>,
    limit: usize,
) -> Result<Vec<crate::cursors::Cursor>, StorageError> {
    use crate::cursors;
    let r = db.reader()?;
    let Some(t) = r.table(cursors::NAME, cursors::ROWS)? else {
        return Ok(Vec::new());
    };
    let (from, to) = match consumer_id {
        Some(c) => {
            let mut from = c.as_bytes().to_vec();
            from.push(0);
            let mut to = c.as_bytes().to_vec();
            to.push(1);
            (from, Some(to))
        }
        None => (Vec::new(), None),
    };
    let mut out = Vec::new();
    let range = match &to {
        Some(to) => t.range(from.as_slice()..to.as_slice()),
        None => t.range(from.as_slice()..),
    }
    .map_err(StorageError::of)?;
    for row in range {
        let (_, v) = row.map_err(StorageError::of)?;
        out.push(postcard::from_bytes(v.value()).map_err(StorageError::of)?);
        if out.len() >= limit {
            break;
        }
    }
    Ok(out)
}
