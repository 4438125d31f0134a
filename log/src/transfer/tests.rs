use super::*;

fn lines(seqs: impl IntoIterator<Item = u64>) -> Vec<u8> {
    let mut out = Vec::new();
    for s in seqs {
        out.extend_from_slice(format!("{{\"seq\":{s},\"type\":\"t.x\"}}\n").as_bytes());
    }
    out
}

/// A streamed backup is the same backup: its manifest opens and matches its file; a stream
/// with a gap, a repeat, a cut-off line or missing tail is refused and leaves nothing.
#[test]
fn a_streamed_backup_checks_every_seq_arrived() {
    let tmp = tempfile::tempdir().unwrap();
    let ok = tmp.path().join("ok");
    let m = backup_from(&lines(4..=9)[..], &ok, 3, 9).unwrap();
    assert_eq!((m.after_seq, m.through_seq, m.events), (3, 9, 6));
    assert_eq!(open_backup(&ok).unwrap(), m);
    let empty = tmp.path().join("empty");
    assert_eq!(backup_from(&b""[..], &empty, 9, 9).unwrap().events, 0);
    let mut cut = lines(4..=9);
    cut.truncate(cut.len() - 3);
    for (what, input, why) in [
        ("short", lines(4..=8), "ended at seq 8, before seq 9"),
        ("gap", lines([4, 5, 7, 8, 9]), "gap or a repeat"),
        ("repeat", lines([4, 5, 5, 6, 7, 8, 9]), "gap or a repeat"),
        ("past", lines(4..=10), "gap or a repeat"),
        ("cut", cut, "cut off"),
    ] {
        let dir = tmp.path().join(what);
        let e = backup_from(&input[..], &dir, 3, 9).unwrap_err().to_string();
        assert!(e.contains(why), "{what}: {e}");
        assert!(
            !dir.exists(),
            "{what}: a refused stream left {}",
            dir.display()
        );
    }
}
