//! `dedupwire replicate send/receive` between two FerretDB servers (MongoDB protocol): the
//! binary chooses the adapter by the URL scheme. The FerretDB binary is built by
//! `scripts/ferretdb.sh` when missing; without Go the test prints SKIP (fails under CI).

use std::process::{Command, Stdio};
use std::time::Duration;

use dedupwire_replicate::mongo::server::{find_binary, FerretServer};
use mongodb::bson::{doc, Document};

/// Both ends share this passphrase: the connection is encrypted, as by default.
mod common;

fn dedupwire() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dedupwire"));
    cmd.env("DEDUPWIRE_KEY", "mongo cli test passphrase");
    cmd
}

fn docs(server: &FerretServer) -> Vec<Vec<u8>> {
    let client = server.client().unwrap();
    let mut all: Vec<Vec<u8>> = client
        .database("app")
        .collection::<Document>("docs")
        .find(doc! {})
        .run()
        .unwrap()
        .map(|d| mongodb::bson::to_vec(&d.unwrap()).unwrap())
        .collect();
    all.sort();
    all
}

#[test]
fn send_and_receive_replicate_a_mongodb_database() {
    let binary = match find_binary(true) {
        Ok(b) => b,
        Err(msg) => {
            assert!(std::env::var_os("CI").is_none(), "{msg}");
            eprintln!("SKIP: {msg}");
            return;
        }
    };
    let src = FerretServer::start(&binary, Duration::from_secs(60)).unwrap();
    let rep = FerretServer::start(&binary, Duration::from_secs(60)).unwrap();
    let coll = src
        .client()
        .unwrap()
        .database("app")
        .collection::<Document>("docs");
    let text = "lorem ipsum dolor sit amet ".repeat(100);
    for i in 0..40i64 {
        coll.insert_one(doc! {"_id": i, "n": i, "text": format!("{text}{i}")})
            .run()
            .unwrap();
    }
    for i in 0..20i64 {
        coll.replace_one(
            doc! {"_id": i},
            doc! {"n": i + 1, "text": format!("{text}{i}!")},
        )
        .run()
        .unwrap();
    }
    coll.delete_one(doc! {"_id": 39i64}).run().unwrap();

    let mut receiver = dedupwire()
        .args(["replicate", "receive", "--listen", "127.0.0.1:0", "--once"])
        .args(["--into", &rep.url("")])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (addr, _stderr) = common::listening_address(&mut receiver);
    let out = dedupwire()
        .args(["replicate", "send", "--until-drained", "--stats"])
        .args(["--from", &src.url("app"), "--to", &addr])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "send failed: {stderr}");
    assert!(receiver.wait().unwrap().success());
    assert!(stderr.contains("\"changes\": 61"), "{stderr}");
    assert_eq!(docs(&src), docs(&rep));
    assert_eq!(docs(&rep).len(), 39);

    let out = dedupwire()
        .args(["replicate", "send", "--from", "mysql://h/db", "--to", &addr])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("unknown database scheme \"mysql\""),
        "{stderr}"
    );
}
