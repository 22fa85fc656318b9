//! PostgreSQL source → PostgreSQL sink, against real servers started on loopback (see
//! `support`): one server per test, the source and the replica as two databases of it.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use dedupwire_replicate::pg::{
    server, BodyType, PgError, PgSink, PgSinkConfig, PgSource, PgSourceConfig, Plugin, Tables,
};
use dedupwire_replicate::{Change, ChangeSink, ChangeSource, Op};
use postgres::Client;

const SLOT: &str = "dedupwire_test";

fn source_config(tables: Tables) -> PgSourceConfig {
    PgSourceConfig {
        tables,
        idle_wait: Duration::ZERO,
        initial_copy: false,
        ..PgSourceConfig::with_slot(SLOT)
    }
}

fn open_source(url: &str, tables: Tables) -> PgSource {
    PgSource::connect(url, source_config(tables)).unwrap_or_else(|e| panic!("open source: {e}"))
}

fn open_sink(url: &str) -> PgSink {
    PgSink::connect(url, PgSinkConfig::with_stream(SLOT))
        .unwrap_or_else(|e| panic!("open sink: {e}"))
}

/// poll → apply → ack until the source is empty; returns every change seen.
fn replicate(source: &mut PgSource, sink: &mut PgSink, max: usize) -> Vec<Change> {
    let mut all = Vec::new();
    for _ in 0..10_000 {
        let batch = source.poll(max).expect("poll");
        if batch.is_empty() {
            return all;
        }
        assert!(batch.len() <= max);
        sink.apply(&batch).expect("apply");
        source.ack(batch.last().unwrap().pos).expect("ack");
        all.extend(batch);
    }
    panic!("replication did not finish");
}

/// `id::text → body::text` of a table (SQL NULL bodies as `null`, as they replicate).
fn rows(client: &mut Client, table: &str) -> BTreeMap<String, String> {
    client
        .query(
            &format!("SELECT id::text, coalesce(body::text, 'null') FROM {table}"),
            &[],
        )
        .unwrap_or_else(|e| panic!("read {table}: {e}"))
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

fn assert_same(src: &mut Client, rep: &mut Client, src_table: &str, rep_table: &str) {
    let a = rows(src, src_table);
    let b = rows(rep, rep_table);
    assert_eq!(a.len(), b.len(), "{src_table}: row counts differ");
    for (id, body) in &a {
        assert_eq!(b.get(id), Some(body), "{src_table}: row {id} differs");
    }
}

fn confirmed_flush(client: &mut Client) -> String {
    client
        .query_one(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
            &[&SLOT],
        )
        .expect("read slot")
        .get(0)
}

fn lsn(text: &str) -> u64 {
    let (hi, lo) = text.split_once('/').unwrap();
    (u64::from_str_radix(hi, 16).unwrap() << 32) | u64::from_str_radix(lo, 16).unwrap()
}

/// A body PostgreSQL cannot compress, so it is stored out of line (TOAST).
const BIG: &str = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 300))";

#[test]
fn replicates_inserts_updates_deletes_exactly() {
    let Some(pg) = support::start() else { return };
    let src_url = pg.create_database("src");
    let rep_url = pg.create_database("replica");
    let mut src = pg.client("src");
    src.batch_execute(
        "CREATE TABLE docs (id text PRIMARY KEY, body jsonb NOT NULL);
         CREATE TABLE notes (id int PRIMARY KEY, body text, rev int NOT NULL DEFAULT 0);
         CREATE SCHEMA app;
         CREATE TABLE app.items (id bigint PRIMARY KEY, body json);
         CREATE TABLE not_docs (k int PRIMARY KEY, v text);",
    )
    .unwrap();
    let mut source = open_source(&src_url, Tables::All);
    let mut sink = open_sink(&rep_url);
    assert_eq!(source.collections(), vec!["app.items", "docs", "notes"]);

    // Single-statement transactions, odd documents.
    src.batch_execute(&format!(
        r#"INSERT INTO docs SELECT 'd' || i, jsonb_build_object('n', i, 'tags', jsonb_build_array('a', i % 3), 's', repeat('x', i))
             FROM generate_series(1, 25) i;
           INSERT INTO docs VALUES ('quote"back\slash', '{{"é": "\u00e9\t", "nested": {{"a": [1, 2.50, null, true]}}}}');
           INSERT INTO notes (id, body) VALUES (1, '  {{"raw" :  true, "dup": 1, "dup": 2}}  '), (2, NULL), (3, 'not json at all');
           INSERT INTO notes (id, body) VALUES (4, {BIG});
           INSERT INTO app.items VALUES (1, '{{"b":1,   "a":2}}'), (2, '[]');
           INSERT INTO not_docs VALUES (1, 'ignored');"#
    ))
    .unwrap();
    // Multi-statement transactions: updates, a key change, deletes, an update that leaves a
    // TOASTed body unchanged (it must still arrive whole).
    src.batch_execute(
        r#"BEGIN;
           UPDATE docs SET body = body || '{"updated": true}' WHERE id IN ('d1', 'd2', 'd3');
           UPDATE docs SET id = 'd4-moved' WHERE id = 'd4';
           DELETE FROM docs WHERE id IN ('d5', 'd6');
           UPDATE notes SET rev = rev + 1 WHERE id = 4;
           UPDATE notes SET id = 40 WHERE id = 4;
           COMMIT;
           BEGIN;
           INSERT INTO docs VALUES ('d5', '{"back": "again"}');
           UPDATE docs SET body = '{"v": 1}' WHERE id = 'd7';
           UPDATE docs SET body = '{"v": 2}' WHERE id = 'd7';
           DELETE FROM docs WHERE id = 'd8';
           UPDATE not_docs SET v = 'still ignored';
           COMMIT;"#,
    )
    .unwrap();
    // Interleaved transactions: the first writes many changes before the second commits, and
    // commits after it, so its changes' LSNs are below the second's.
    let mut other = pg.client("src");
    src.batch_execute("BEGIN").unwrap();
    src.batch_execute(
        "INSERT INTO docs SELECT 'long' || i, jsonb_build_object('i', i) FROM generate_series(1, 60) i;
         UPDATE docs SET body = '{\"by\": \"long\"}' WHERE id = 'd9';",
    )
    .unwrap();
    other
        .batch_execute(
            "BEGIN; INSERT INTO docs VALUES ('short', '{}'); UPDATE docs SET body = '{\"by\": \"short\"}' WHERE id = 'd10'; COMMIT;",
        )
        .unwrap();
    src.batch_execute("INSERT INTO docs VALUES ('long-last', '{}'); COMMIT")
        .unwrap();
    other
        .batch_execute("INSERT INTO docs VALUES ('after', '{\"x\": 1}')")
        .unwrap();

    let changes = replicate(&mut source, &mut sink, 7);
    assert!(
        changes.windows(2).all(|w| w[0].pos < w[1].pos),
        "positions must increase"
    );
    assert!(changes.iter().all(|c| c.collection != "not_docs"));
    // The key change arrives as a delete of the old key and an insert of the new one.
    let moved = changes.iter().position(|c| c.id == "d4-moved").unwrap();
    assert_eq!(
        (changes[moved - 1].op, changes[moved - 1].id.as_str()),
        (Op::Delete, "d4")
    );
    assert_eq!(changes[moved].op, Op::Insert);
    // The rev-only update of the TOASTed note carries its body.
    let note4 = changes
        .iter()
        .find(|c| c.collection == "notes" && c.id == "4" && c.op == Op::Update)
        .unwrap();
    assert_eq!(note4.doc.as_ref().unwrap().len(), 300 * 32);
    // Interleaving: "short" committed first although "long*" wrote first.
    let short = changes.iter().position(|c| c.id == "short").unwrap();
    let long1 = changes.iter().position(|c| c.id == "long1").unwrap();
    assert!(short < long1);

    let mut rep = pg.client("replica");
    assert_same(&mut src, &mut rep, "docs", "docs");
    assert_same(&mut src, &mut rep, "notes", "notes");
    assert_same(&mut src, &mut rep, "app.items", "app.items");
    assert_eq!(rows(&mut src, "docs").len(), 25 + 1 - 2 + 1 - 1 + 60 + 3);
    assert_eq!(
        sink.get("notes", "1").unwrap().as_deref(),
        Some(&b"  {\"raw\" :  true, \"dup\": 1, \"dup\": 2}  "[..])
    );
    assert_eq!(sink.get("docs", "no such id").unwrap(), None);
    assert_eq!(sink.get("no_such_table", "1").unwrap(), None);
    assert_eq!(
        sink.applied_position().unwrap(),
        Some(changes.last().unwrap().pos)
    );

    // A table created later is picked up (Tables::All); the slot keeps up.
    src.batch_execute(
        "CREATE TABLE late (id text PRIMARY KEY, body jsonb);
         INSERT INTO late VALUES ('x', '{\"late\": true}');
         UPDATE late SET body = '{\"late\": 2}';",
    )
    .unwrap();
    let more = replicate(&mut source, &mut sink, 100);
    assert_eq!(more.len(), 2);
    assert!(more[0].pos > changes.last().unwrap().pos);
    assert_same(&mut src, &mut rep, "late", "late");
    assert!(
        lsn(&confirmed_flush(&mut src)) > more[1].pos,
        "the slot is released after the last ack"
    );
}

#[test]
fn exactly_once_across_replays_and_crashes() {
    let Some(pg) = support::start() else { return };
    let src_url = pg.create_database("src");
    let rep_url = pg.create_database("replica");
    let mut src = pg.client("src");
    src.batch_execute("CREATE TABLE docs (id text PRIMARY KEY, body jsonb NOT NULL)")
        .unwrap();
    let tables = || Tables::Only(vec!["docs".to_string()]);
    let mut source = open_source(&src_url, tables());
    let mut sink = open_sink(&rep_url);
    for i in 0..12 {
        src.execute(
            "INSERT INTO docs VALUES ($1, jsonb_build_object('i', $2::int))",
            &[&format!("k{i}"), &i],
        )
        .unwrap();
    }
    // One transaction of 8 changes, to be cut by small batches.
    src.batch_execute(
        "BEGIN;
         UPDATE docs SET body = '{\"big\": 1}' WHERE id IN ('k0', 'k1', 'k2', 'k3');
         DELETE FROM docs WHERE id IN ('k4', 'k5');
         INSERT INTO docs VALUES ('t1', '{}'), ('t2', '[]');
         COMMIT;",
    )
    .unwrap();
    let mut rep = pg.client("replica");

    // The same batch twice: applied once, position unchanged.
    let b1 = source.poll(5).unwrap();
    assert_eq!(b1.len(), 5);
    sink.apply(&b1).unwrap();
    let after_first = rows(&mut rep, "docs");
    sink.apply(&b1).unwrap();
    assert_eq!(rows(&mut rep, "docs"), after_first);
    assert_eq!(after_first.len(), 5);
    assert_eq!(sink.applied_position().unwrap(), Some(b1[4].pos));
    // A replayed prefix plus new changes: only the new ones apply.
    source.ack(b1[4].pos).unwrap();
    let b2 = source.poll(5).unwrap();
    assert!(b2[0].pos > b1[4].pos);
    let mut overlap = b1[2..].to_vec();
    overlap.extend(b2.iter().cloned());
    sink.apply(&overlap).unwrap();
    assert_eq!(sink.applied_position().unwrap(), Some(b2[4].pos));
    assert_eq!(rows(&mut rep, "docs").len(), 10);

    // Crash after apply, before ack: the reopened source returns the same changes with the
    // same positions, and the sink skips them.
    drop(source);
    let mut source = open_source(&src_url, tables());
    let again = source.poll(5).unwrap();
    assert_eq!(
        again, b2,
        "a reopened source replays the unacknowledged changes identically"
    );
    sink.apply(&again).unwrap();
    assert_eq!(sink.applied_position().unwrap(), Some(b2[4].pos));
    assert_eq!(rows(&mut rep, "docs").len(), 10);
    source.ack(b2[4].pos).unwrap();

    // Crash in the middle of the 8-change transaction: acked up to its 3rd change, the slot
    // cannot release the transaction, so it comes back whole; the sink skips the applied part.
    let b3 = source.poll(2).unwrap(); // k10, k11
    sink.apply(&b3).unwrap();
    source.ack(b3[1].pos).unwrap();
    let b4 = source.poll(3).unwrap(); // the transaction's first 3 changes
    assert!(b4
        .iter()
        .all(|c| c.id.starts_with('k') && c.op == Op::Update));
    sink.apply(&b4).unwrap();
    source.ack(b4[2].pos).unwrap();
    let held = confirmed_flush(&mut src);
    let b5 = source.poll(2).unwrap();
    sink.apply(&b5).unwrap(); // applied, never acked
    drop(source);
    let mut source = open_source(&src_url, tables());
    assert_eq!(confirmed_flush(&mut src), held);
    let replay = source.poll(100).unwrap();
    assert_eq!(replay.len(), 8, "the whole transaction comes back");
    assert_eq!(&replay[..3], &b4[..]);
    assert_eq!(&replay[3..5], &b5[..]);
    drop(source);

    // Resuming the documented way: ack what the replica has before the first poll.
    let mut source = open_source(&src_url, tables());
    source
        .ack(sink.applied_position().unwrap().unwrap())
        .unwrap();
    let rest = replicate(&mut source, &mut sink, 4);
    assert_eq!(rest, replay[5..].to_vec());
    assert_same(&mut src, &mut rep, "docs", "docs");
    assert!(lsn(&confirmed_flush(&mut src)) > lsn(&held));
}

#[test]
fn interleaved_transactions_replay_identically() {
    let Some(pg) = support::start() else { return };
    let src_url = pg.create_database("src");
    let rep_url = pg.create_database("replica");
    let mut src = pg.client("src");
    src.batch_execute("CREATE TABLE docs (id text PRIMARY KEY, body jsonb NOT NULL)")
        .unwrap();
    let tables = || Tables::Only(vec!["docs".to_string()]);
    let mut source = open_source(&src_url, tables());
    let mut sink = open_sink(&rep_url);
    // A writes 50 changes, B writes and commits, A commits right after B: A's 50 changes have
    // LSNs below B's and must be numbered past B's commit, past A's own commit end too.
    let mut a = pg.client("src");
    let mut b = pg.client("src");
    for round in 0..3 {
        a.batch_execute(&format!(
            "BEGIN; INSERT INTO docs SELECT 'a{round}-' || i, '{{}}' FROM generate_series(1, 50) i"
        ))
        .unwrap();
        b.batch_execute(&format!("INSERT INTO docs VALUES ('b{round}', '{{}}')"))
            .unwrap();
        a.batch_execute("COMMIT").unwrap();
        b.batch_execute(&format!("INSERT INTO docs VALUES ('c{round}', '{{}}')"))
            .unwrap();
    }
    let all = source.poll(10_000).unwrap();
    assert_eq!(all.len(), 3 * 52);
    assert!(all.windows(2).all(|w| w[0].pos < w[1].pos));
    assert_eq!(all[0].id, "b0", "commit order");
    // The case this test is about did happen: A's numbering ran past A's commit end.
    let commit_ends: Vec<u64> = src
        .query(
            "SELECT lsn::text FROM pg_logical_slot_peek_binary_changes($1::text::name, NULL, NULL,
                    'proto_version', '1', 'publication_names', $1::text)
              WHERE get_byte(data, 0) = ascii('C')",
            &[&SLOT],
        )
        .unwrap()
        .iter()
        .map(|r| lsn(r.get(0)))
        .collect();
    let a_last = all.iter().find(|c| c.id == "a0-50").unwrap().pos;
    assert!(
        a_last > commit_ends[1],
        "A's positions ({a_last}) end past its commit ({})",
        commit_ends[1]
    );

    // Small batches, and a crash after every ack: every reopened source renumbers from the
    // slot's restart point exactly as before.
    source.rewind().unwrap();
    let mut done = 0;
    while done < all.len() {
        let batch = source.poll(7).unwrap();
        assert_eq!(batch, all[done..(done + 7).min(all.len())].to_vec());
        sink.apply(&batch).unwrap();
        source.ack(batch.last().unwrap().pos).unwrap();
        done += batch.len();
        drop(source);
        source = open_source(&src_url, tables());
        let replay = source.poll(10_000).unwrap();
        let from = all.len() - replay.len();
        assert!(
            from <= done,
            "the slot was released past unacknowledged changes"
        );
        assert_eq!(
            replay,
            all[from..].to_vec(),
            "a reopened source renumbers identically"
        );
        source
            .ack(sink.applied_position().unwrap().unwrap())
            .unwrap();
        source.rewind().unwrap();
    }
    assert!(source.poll(10).unwrap().is_empty());
    let mut rep = pg.client("replica");
    assert_same(&mut src, &mut rep, "docs", "docs");
}

#[test]
fn slot_advances_only_on_ack() {
    let Some(pg) = support::start() else { return };
    let src_url = pg.create_database("src");
    let rep_url = pg.create_database("replica");
    let mut src = pg.client("src");
    src.batch_execute("CREATE TABLE docs (id int PRIMARY KEY, body text)")
        .unwrap();
    let mut source = open_source(&src_url, Tables::All);
    let mut sink = open_sink(&rep_url);
    let start = confirmed_flush(&mut src);
    assert_eq!(lsn(&start), source.confirmed_flush_lsn().unwrap());
    for i in 0..3 {
        src.execute("INSERT INTO docs VALUES ($1, 'doc')", &[&i])
            .unwrap();
    }
    src.batch_execute("BEGIN; INSERT INTO docs VALUES (10, 'a'), (11, 'b'), (12, 'c'); COMMIT;")
        .unwrap();

    let first = source.poll(100).unwrap();
    assert_eq!(first.len(), 6);
    assert_eq!(confirmed_flush(&mut src), start, "poll consumes nothing");
    assert!(
        source.poll(100).unwrap().is_empty(),
        "changes in flight are not returned twice"
    );
    source.rewind().unwrap();
    assert_eq!(
        source.poll(100).unwrap(),
        first,
        "without an ack, a rewound source returns the same changes"
    );
    sink.apply(&first).unwrap();
    assert_eq!(
        confirmed_flush(&mut src),
        start,
        "apply alone does not release"
    );

    source.ack(first[1].pos).unwrap();
    let after_two = confirmed_flush(&mut src);
    assert!(lsn(&after_two) > lsn(&start));
    assert!(
        lsn(&after_two) <= first[2].pos,
        "the third transaction is still held"
    );
    source.rewind().unwrap();
    assert_eq!(source.poll(100).unwrap(), first[2..].to_vec());

    // Acknowledging part of a transaction keeps all of it in the slot.
    source.ack(first[4].pos).unwrap();
    let partial = confirmed_flush(&mut src);
    assert!(lsn(&partial) <= first[3].pos);
    source.rewind().unwrap();
    assert_eq!(source.poll(100).unwrap(), first[5..].to_vec());

    source.ack(first[5].pos).unwrap();
    assert!(lsn(&confirmed_flush(&mut src)) > first[5].pos);
    assert!(source.poll(100).unwrap().is_empty());
    // The acknowledged position survives only in the replica: a new source starts at the slot.
    drop(source);
    let mut source = open_source(&src_url, Tables::All);
    assert!(source.poll(100).unwrap().is_empty());
    source.drop_slot().unwrap();
    assert_eq!(
        src.query(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1",
            &[&SLOT]
        )
        .unwrap()
        .len(),
        0
    );
}

fn expect_err<T>(result: Result<T, PgError>, what: &str, needles: &[&str]) -> PgError {
    let Err(err) = result else {
        panic!("{what}: expected an error")
    };
    let text = err.to_string();
    for needle in needles {
        assert!(
            text.contains(needle),
            "{what}: error {text:?} should mention {needle:?}"
        );
    }
    err
}

#[test]
fn clear_errors() {
    let Some(pg) = support::start() else { return };
    let src_url = pg.create_database("src");
    let mut src = pg.client("src");
    src.batch_execute(
        "CREATE TABLE docs (id text PRIMARY KEY, body jsonb);
         CREATE TABLE no_body (id int PRIMARY KEY, data text);
         CREATE TABLE no_pk (id int, body text);
         CREATE TABLE notes (id int PRIMARY KEY, body text, rev int NOT NULL DEFAULT 0);",
    )
    .unwrap();

    // Connection strings.
    let e = expect_err(
        PgSource::connect("host=127.0.0.1 port=notaport", PgSourceConfig::default()),
        "unparsable",
        &["invalid PostgreSQL connection string"],
    );
    assert!(matches!(e, PgError::ConnectionString(_)));
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let e = expect_err(
        PgSink::connect(
            &format!("host=127.0.0.1 port={closed} user=someone password=secret dbname=x"),
            PgSinkConfig::default(),
        ),
        "nothing listens",
        &["cannot connect to PostgreSQL at 127.0.0.1", "x as someone"],
    );
    assert!(!e.to_string().contains("secret"), "no password in messages");
    expect_err(
        PgSource::connect(&pg.url("no_such_db"), PgSourceConfig::default()),
        "missing database",
        &["no_such_db"],
    );

    // Tables that are not document tables.
    let only = |t: &str| source_config(Tables::Only(vec![t.to_string()]));
    expect_err(
        PgSource::connect(&src_url, only("no_body")),
        "no body",
        &["public.no_body", "no column `body`"],
    );
    expect_err(
        PgSource::connect(&src_url, only("no_pk")),
        "no pk",
        &["public.no_pk", "primary key"],
    );
    expect_err(
        PgSource::connect(&src_url, only("missing")),
        "missing",
        &["public.missing", "does not exist"],
    );

    // A TRUNCATE stops the stream at that point (what comes before it is delivered), unless
    // skipped.
    let mut source = PgSource::connect(&src_url, only("docs")).unwrap();
    src.batch_execute(
        "INSERT INTO docs VALUES ('a', '{}'); TRUNCATE docs; INSERT INTO docs VALUES ('b', '{}');",
    )
    .unwrap();
    let first = source.poll(10).unwrap();
    assert_eq!(first.len(), 1);
    source.ack(first[0].pos).unwrap();
    expect_err(
        source.poll(10),
        "truncate",
        &["TRUNCATE", "public.docs", "skip_truncate"],
    );
    drop(source);
    let mut config = only("docs");
    config.skip_truncate = true;
    let mut source = PgSource::connect(&src_url, config).unwrap();
    source.ack(first[0].pos).unwrap();
    let rest = source.poll(10).unwrap();
    assert_eq!(
        rest.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
        ["b"]
    );
    source.drop_slot().unwrap();

    // Without REPLICA IDENTITY FULL, an update that leaves a TOASTed body unchanged has no
    // body: a clear error, after the changes before it.
    let mut config = only("notes");
    config.replica_identity_full = false;
    let mut source = PgSource::connect(&src_url, config).unwrap();
    src.batch_execute(&format!(
        "INSERT INTO notes (id, body) VALUES (1, {BIG}); UPDATE notes SET rev = 1;"
    ))
    .unwrap();
    let first = source.poll(10).unwrap();
    assert_eq!(first.len(), 1);
    source.ack(first[0].pos).unwrap();
    let e = expect_err(
        source.poll(10),
        "toast",
        &["public.notes", "no `body`", "REPLICA IDENTITY"],
    );
    // The error is at a position: acknowledging it skips the change.
    let PgError::Unsupported { pos: Some(pos), .. } = e else {
        panic!("{e:?}")
    };
    assert!(pos > first[0].pos);
    source.ack(pos).unwrap();
    assert!(source.poll(10).unwrap().is_empty());
}

/// A new slot decodes with pgoutput, which a server with default settings allows. wal2json is
/// an option: where `output_plugin_libraries` (PostgreSQL's 2026 security releases) refuses
/// it, the error names that setting; where it is allowed, a wal2json slot replicates exactly,
/// and keeps its plugin when reopened by a source configured for pgoutput.
#[test]
fn pgoutput_by_default_and_wal2json_only_where_allowed() {
    let Some(pg) = support::start() else { return };
    let src_url = pg.create_database("src");
    let mut src = pg.client("src");
    src.batch_execute("CREATE TABLE docs (id text PRIMARY KEY, body jsonb NOT NULL)")
        .unwrap();
    let restricted = src
        .query_opt(
            "SELECT 1 FROM pg_settings WHERE name = 'output_plugin_libraries'",
            &[],
        )
        .unwrap()
        .is_some();
    let wal2json = |tables| PgSourceConfig {
        plugin: Plugin::Wal2Json,
        ..source_config(tables)
    };
    if restricted {
        expect_err(
            PgSource::connect(&src_url, wal2json(Tables::All)),
            "wal2json refused",
            &["output_plugin_libraries", "wal2json", "pgoutput"],
        );
    }
    let source = open_source(&src_url, Tables::All);
    let slot_plugin = |client: &mut Client| -> String {
        client
            .query_one(
                "SELECT plugin::text FROM pg_replication_slots WHERE slot_name = $1",
                &[&SLOT],
            )
            .unwrap()
            .get(0)
    };
    assert_eq!(slot_plugin(&mut src), "pgoutput");
    source.drop_slot().unwrap();
    drop(src);
    drop(pg);

    let lib = server::find_bindir(None)
        .ok()
        .and_then(|b| b.parent().map(|p| p.join("lib/wal2json.so")));
    if !lib.is_some_and(|l| l.is_file()) {
        eprintln!("SKIP: wal2json is not installed; only pgoutput was checked");
        return;
    }
    let settings: &[(&str, &str)] = if restricted {
        &[("output_plugin_libraries", "pgoutput,test_decoding,wal2json")]
    } else {
        &[]
    };
    let Some(pg) = support::start_with(settings) else {
        return;
    };
    let src_url = pg.create_database("src");
    let rep_url = pg.create_database("replica");
    let mut src = pg.client("src");
    let mut rep = pg.client("replica");
    src.batch_execute("CREATE TABLE docs (id text PRIMARY KEY, body jsonb NOT NULL)")
        .unwrap();
    let mut source = PgSource::connect(&src_url, wal2json(Tables::All)).unwrap();
    let mut sink = open_sink(&rep_url);
    src.batch_execute(&format!(
        "INSERT INTO docs SELECT 'd' || i, jsonb_build_object('n', i) FROM generate_series(1, 20) i;
         UPDATE docs SET body = jsonb_build_object('big', {BIG}) WHERE id = 'd3';
         UPDATE docs SET id = 'moved' WHERE id = 'd4';
         DELETE FROM docs WHERE id = 'd5';"
    ))
    .unwrap();
    replicate(&mut source, &mut sink, 7);
    assert_same(&mut src, &mut rep, "docs", "docs");
    drop(source);
    // Reopened with the default configuration: the slot keeps decoding with wal2json.
    let mut source = open_source(&src_url, Tables::All);
    src.batch_execute("UPDATE docs SET body = '{\"n\": 0}' WHERE id = 'd1'")
        .unwrap();
    replicate(&mut source, &mut sink, 7);
    assert_same(&mut src, &mut rep, "docs", "docs");
    assert_eq!(slot_plugin(&mut src), "wal2json");
}

#[test]
fn wal_level_must_be_logical() {
    let Some(pg) = support::start_with(&[("wal_level", "replica")]) else {
        return;
    };
    let url = pg.create_database("src");
    pg.client("src")
        .batch_execute("CREATE TABLE docs (id text PRIMARY KEY, body jsonb)")
        .unwrap();
    expect_err(
        PgSource::connect(&url, source_config(Tables::All)),
        "wal_level",
        &["wal_level is 'replica'", "logical"],
    );
}

#[test]
fn sink_rejects_a_table_without_body() {
    let Some(pg) = support::start() else { return };
    let rep_url = pg.create_database("replica");
    let mut rep = pg.client("replica");
    rep.batch_execute("CREATE TABLE docs (id text PRIMARY KEY, payload text)")
        .unwrap();
    let mut sink = open_sink(&rep_url);
    let change = Change {
        pos: 1,
        op: Op::Insert,
        collection: "docs".into(),
        id: "a".into(),
        doc: Some(b"{}".to_vec()),
    };
    expect_err(
        sink.apply(std::slice::from_ref(&change)),
        "no body",
        &["public.docs", "no column `body`"],
    );
    assert_eq!(sink.applied_position().unwrap(), None, "nothing applied");
    // Other collections still work; jsonb targets normalize, text targets keep bytes.
    let mut c = change.clone();
    c.collection = "other.docs".into();
    c.doc = Some(b" {\"b\":1,\"a\":2} ".to_vec());
    sink.apply(&[c]).unwrap();
    assert_eq!(
        sink.get("other.docs", "a").unwrap().unwrap(),
        b" {\"b\":1,\"a\":2} "
    );
    assert_eq!(sink.applied_position().unwrap(), Some(1));

    // A jsonb sink (another stream in the same database) stores PostgreSQL's canonical form.
    let mut config = PgSinkConfig::with_stream("jsonb-stream");
    config.body_type = BodyType::Jsonb;
    let mut sink = PgSink::connect(&rep_url, config).unwrap();
    let mut c = change.clone();
    c.collection = "as_jsonb".into();
    c.doc = Some(b" {\"b\":1,\"a\":2} ".to_vec());
    sink.apply(&[c]).unwrap();
    assert_eq!(
        sink.get("as_jsonb", "a").unwrap().unwrap(),
        b"{\"a\": 2, \"b\": 1}"
    );
    assert_eq!(sink.applied_position().unwrap(), Some(1));
    let body_type: String = rep
        .query_one("SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = 'as_jsonb'::regclass AND attname = 'body'", &[])
        .unwrap()
        .get(0);
    assert_eq!(body_type, "jsonb");
}

#[test]
fn a_replica_behind_the_slot_or_a_slot_moved_elsewhere_is_refused() {
    let Some(pg) = support::start() else { return };
    let src_url = pg.create_database("src");
    let mut src = pg.client("src");
    src.batch_execute("CREATE TABLE docs (id int PRIMARY KEY, body text)")
        .unwrap();
    let mut source = open_source(&src_url, Tables::All);
    for i in 0..4 {
        src.execute("INSERT INTO docs VALUES ($1, 'doc')", &[&i])
            .unwrap();
    }
    let changes = source.poll(100).unwrap();
    assert_eq!(changes.len(), 4);
    source.ack(changes[3].pos).unwrap();
    drop(source);

    // A replica restored from before the last release, or an empty one, would miss changes
    // the slot no longer holds.
    let mut source = open_source(&src_url, Tables::All);
    expect_err(
        source.resume(Some(changes[1].pos)),
        "a replica behind the released position",
        &["behind position", "re-seed the replica"],
    );
    expect_err(
        source.resume(None),
        "an empty replica on a used slot",
        &["the replica is empty", "drop the slot"],
    );
    source.resume(Some(changes[3].pos)).unwrap();
    assert!(source.poll(100).unwrap().is_empty());
    drop(source);

    // Something other than dedupwire moves the slot past changes no replica has seen.
    src.execute("INSERT INTO docs VALUES (10, 'doc')", &[])
        .unwrap();
    src.query(
        "SELECT pg_replication_slot_advance($1::text::name, pg_current_wal_lsn())",
        &[&SLOT],
    )
    .unwrap();
    expect_err(
        PgSource::connect(&src_url, source_config(Tables::All)),
        "a slot advanced elsewhere",
        &["advanced outside dedupwire", "drop the slot"],
    );
}
