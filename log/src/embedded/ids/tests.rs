use std::collections::HashMap;

use redb::{ReadableDatabase, TableHandle};

use super::*;

/// Carry out `steps` steps of the compactions owed (all of them: `usize::MAX`), `rows`
/// keys each, a transaction per step.
fn compact(db: &redb::Database, runs: &mut Runs, rows: usize, steps: usize) {
    for _ in 0..steps {
        let txn = db.begin_write().unwrap();
        let mut next = runs.clone();
        if next.upkeep(&txn, rows).unwrap() == Upkeep::Idle {
            return;
        }
        txn.commit().unwrap();
        *runs = next;
    }
}

/// Runs a finished compaction replaced whose tables are not dropped yet.
fn retired(db: &redb::Database) -> u64 {
    let txn = db.begin_read().unwrap();
    match txn.open_table(RETIRED) {
        Ok(t) => t.len().unwrap(),
        Err(redb::TableError::TableDoesNotExist(_)) => 0,
        Err(e) => panic!("{e}"),
    }
}

fn batch(
    seq: &mut u64,
    batch: usize,
    n: usize,
    model: &HashMap<String, u64>,
) -> Vec<(String, u64)> {
    let mut ids: Vec<(String, u64)> = (0..n)
        .map(|i| {
            *seq += 1;
            (
                format!("id-{}", (batch * 7919 + i * 104_729) % 10_000_019),
                *seq,
            )
        })
        .filter(|(id, _)| !model.contains_key(id))
        .collect();
    ids.sort();
    ids.dedup_by(|a, b| a.0 == b.0);
    ids
}

/// The run tables the file holds, by name.
fn run_tables(db: &redb::Database) -> Vec<String> {
    let mut tables: Vec<String> = db
        .begin_write()
        .unwrap()
        .list_tables()
        .unwrap()
        .map(|t| t.name().to_owned())
        .filter(|n| n.starts_with("event_ids.h"))
        .collect();
    tables.sort();
    tables
}

/// Against a map: every id ever added is found with its seq, through many runs and
/// compactions made in steps between the adds (so a compaction is often in progress while
/// runs are added and ids looked up), and ids never added are not.
#[test]
fn runs_answer_like_a_map() {
    let dir = tempfile::tempdir().unwrap();
    let db = redb::Database::create(dir.path().join("ids.redb")).unwrap();
    let mut runs = Runs::default();
    let mut model = HashMap::new();
    let mut seq = 0u64;
    for b in 0..(FANOUT * FANOUT + 3) {
        let ids = batch(&mut seq, b, 400, &model);
        let txn = db.begin_write().unwrap();
        let refs: Vec<(&str, u64)> = ids.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        runs = runs.add(&txn, &refs).unwrap();
        txn.commit().unwrap();
        for (k, v) in ids {
            model.insert(k, v);
        }
        // A step or two per add: the level-2 compaction (10 filter pages) spans adds.
        compact(&db, &mut runs, 1, 2);
        if b % 16 == 15 {
            let txn = db.begin_read().unwrap();
            for (id, seq) in &model {
                assert_eq!(runs.lookup(&txn, id).unwrap(), Some(*seq), "{id}");
            }
        }
    }
    compact(&db, &mut runs, 1, usize::MAX);
    assert!(runs.len() < 2 * FANOUT, "{} runs", runs.len());
    let txn = db.begin_read().unwrap();
    assert_eq!(txn.merging().unwrap(), None);
    let loaded = Runs::load(&txn, 1 << 20).unwrap();
    assert_eq!(loaded.len(), runs.len());
    // The smallest cache (16 pages, fewer than the filters have) answers the same.
    let starved = Runs::load(&txn, 0).unwrap();
    for (id, seq) in &model {
        assert_eq!(loaded.lookup(&txn, id).unwrap(), Some(*seq), "{id}");
        assert_eq!(starved.lookup(&txn, id).unwrap(), Some(*seq), "{id}");
    }
    assert!(
        starved.cache.len() <= 16,
        "{} pages cached",
        starved.cache.len()
    );
    let mut false_hits = 0;
    for i in 0..2000 {
        let id = format!("absent-{i}");
        assert_eq!(loaded.lookup(&txn, &id).unwrap(), None);
        let h = hashes(&id);
        false_hits += loaded
            .runs
            .iter()
            .filter(|r| loaded.may_contain(&txn, r, h).unwrap())
            .count();
    }
    assert!(
        false_hits < 200,
        "{false_hits} filter hits for 2000 absent ids"
    );
    // Every run table left is listed, and every listed one exists.
    let tables = run_tables(&db);
    let listed: Vec<String> = loaded.runs.iter().map(|r| table_name(r.n)).collect();
    assert_eq!(tables, listed);
}

/// A compaction cut between its steps (the process stopped) carries on from its stored
/// progress after a load: ids are found throughout, a run added meanwhile takes a number
/// of its own, and the finished index lists exactly the tables it holds.
#[test]
fn a_compaction_carries_on_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ids.redb");
    let mut model = HashMap::new();
    let mut seq = 0u64;
    let mut runs = Runs::default();
    {
        let db = redb::Database::create(&path).unwrap();
        for b in 0..FANOUT {
            let ids = batch(&mut seq, b, 3000, &model);
            let txn = db.begin_write().unwrap();
            let refs: Vec<(&str, u64)> = ids.iter().map(|(k, v)| (k.as_str(), *v)).collect();
            runs = runs.add(&txn, &refs).unwrap();
            txn.commit().unwrap();
            model.extend(ids);
        }
        // Two steps of a compaction of 24,000 ids (9 filter pages), then the process stops.
        compact(&db, &mut runs, 1, 2);
        let txn = db.begin_read().unwrap();
        let (n, level, after) = txn.merging().unwrap().expect("in progress");
        assert_eq!((n, level), (FANOUT as u64 + 1, 0));
        assert!(after.is_some());
    }
    let db = redb::Database::open(&path).unwrap();
    let txn = db.begin_read().unwrap();
    let mut runs = Runs::load(&txn, 1 << 20).unwrap();
    drop(txn);
    assert_eq!(
        runs.next,
        FANOUT as u64 + 2,
        "the output's number stays taken"
    );
    let ids = batch(&mut seq, 99, 100, &model);
    let txn = db.begin_write().unwrap();
    let refs: Vec<(&str, u64)> = ids.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    runs = runs.add(&txn, &refs).unwrap();
    txn.commit().unwrap();
    model.extend(ids);
    let mut steps = 0;
    loop {
        let txn = db.begin_read().unwrap();
        for (id, seq) in &model {
            assert_eq!(runs.lookup(&txn, id).unwrap(), Some(*seq), "{id}");
        }
        drop(txn);
        if runs.full_level().is_none()
            && db.begin_read().unwrap().merging().unwrap().is_none()
            && retired(&db) == 0
        {
            break;
        }
        compact(&db, &mut runs, 1, 1);
        steps += 1;
    }
    assert!(steps >= 3, "{steps} steps");
    let levels: Vec<(u64, u8)> = runs.runs.iter().map(|r| (r.n, r.level)).collect();
    assert_eq!(levels, vec![(FANOUT as u64 + 1, 1), (FANOUT as u64 + 2, 0)]);
    let tables = run_tables(&db);
    assert_eq!(
        tables,
        vec![table_name(FANOUT as u64 + 1), table_name(FANOUT as u64 + 2)]
    );
}

/// A lookup with the list of runs from before a compaction finished, through a transaction
/// begun after the commit that deleted the runs it merged, still finds every id: the window
/// between the indexer's commit and its install of the new list.
#[test]
fn an_old_list_of_runs_finds_ids_after_a_merge_deleted_its_runs() {
    let dir = tempfile::tempdir().unwrap();
    let db = redb::Database::create(dir.path().join("ids.redb")).unwrap();
    let mut runs = Runs::default();
    let mut seq = 0;
    let mut ids = Vec::new();
    for _ in 0..FANOUT {
        let batch: Vec<(String, u64)> = (0..20)
            .map(|i| {
                seq += 1;
                (format!("id-{seq}-{i}"), seq)
            })
            .collect();
        let txn = db.begin_write().unwrap();
        let refs: Vec<(&str, u64)> = batch.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        runs = runs.add(&txn, &refs).unwrap();
        txn.commit().unwrap();
        ids.extend(batch);
    }
    let before = runs.clone();
    // The FANOUT-th run filled level 0: its compaction merges (and deletes) every run.
    compact(&db, &mut runs, usize::MAX, usize::MAX);
    assert!(runs.runs.len() < before.runs.len());
    let txn = db.begin_read().unwrap();
    for (id, seq) in &ids {
        assert_eq!(before.lookup(&txn, id).unwrap(), Some(*seq), "{id}");
    }
    assert_eq!(before.lookup(&txn, "never-added").unwrap(), None);
}

/// A development build's id-ordered runs are moved into the legacy table at open and
/// found there.
#[test]
fn a_development_builds_runs_are_migrated() {
    let dir = tempfile::tempdir().unwrap();
    let db = redb::Database::create(dir.path().join("ids.redb")).unwrap();
    let txn = db.begin_write().unwrap();
    for n in [1u64, 2] {
        let name = format!("event_ids.r{n:010}");
        let mut t = txn
            .open_table(TableDefinition::<&str, u64>::new(&name))
            .unwrap();
        t.insert(format!("dev-{n}").as_str(), n * 10).unwrap();
        txn.open_table(DEV_FILTERS)
            .unwrap()
            .insert(n, [0u8, 0, 0, 0, 0, 0, 0, 0, 0].as_slice())
            .unwrap();
    }
    assert_eq!(migrate_dev_runs(&txn).unwrap(), 2);
    txn.commit().unwrap();
    let txn = db.begin_read().unwrap();
    let runs = Runs::load(&txn, 1 << 20).unwrap();
    assert_eq!(runs.lookup(&txn, "dev-1").unwrap(), Some(10));
    assert_eq!(runs.lookup(&txn, "dev-2").unwrap(), Some(20));
    assert!(matches!(
        txn.open_table(DEV_FILTERS),
        Err(redb::TableError::TableDoesNotExist(_))
    ));
}
