//! `dedupwire send` of files much bigger than its memory: the real binary at both ends over
//! loopback TCP (plaintext: the debug build's cipher would take minutes). The sender's peak
//! resident memory is read from `/proc/<pid>/status` (VmHWM, a high-water mark) while it
//! runs, up to its exit.

use std::fs::{self, File};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

fn dedupwire(cache: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dedupwire"));
    c.env_remove("DEDUPWIRE_KEY").env("XDG_CACHE_HOME", cache);
    c
}

fn tempdir(tag: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("dedupwire-big-files-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// A running `dedupwire serve --once`, killed when dropped.
struct Server(Child, String);

impl Server {
    fn start(root: &Path, cache: &Path) -> Server {
        let mut child = dedupwire(cache)
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--insecure-plaintext",
                "--once",
            ])
            .arg("--root")
            .arg(root)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (addr, lines) = common::listening_address(&mut child);
        std::thread::spawn(move || {
            for l in lines.map_while(Result::ok) {
                eprintln!("[serve] {l}");
            }
        });
        Server(child, addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends `src` as NAME to `server`; returns the `--json` statistics and the sender's peak
/// resident memory in bytes.
fn send(src: &Path, server: &Server, name: &str, cache: &Path) -> (serde_json::Value, u64) {
    let child = dedupwire(cache)
        .arg("send")
        .arg(src)
        .arg(format!("{}:{name}", server.1))
        .args(["--insecure-plaintext", "--json", "-", "-q"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    // VmHWM only grows; the process keeps its status file (without VmHWM) until reaped.
    while let Some(kib) = fs::read_to_string(&status).ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("VmHWM:"))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
    }) {
        peak = kib << 10;
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "send failed: {err}");
    let json = serde_json::from_slice(&out.stdout).unwrap();
    (json, peak)
}

/// xorshift64 words: incompressible, and unlike for every seed.
fn noise(seed: u64, out: &mut [u8]) {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for w in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w.copy_from_slice(&x.to_le_bytes()[..w.len()]);
    }
}

fn hash_file(path: &Path) -> blake3::Hash {
    let mut f = File::open(path).unwrap();
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0; 4 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            return h.finalize();
        }
        h.update(&buf[..n]);
    }
}

const MIB: u64 = 1 << 20;

#[test]
fn a_file_much_bigger_than_the_senders_memory_bound_is_sent_within_it() {
    let dir = tempdir("rss");
    let (src, root, cache) = (dir.join("src"), dir.join("root"), dir.join("cache"));
    fs::create_dir_all(&src).unwrap();
    fs::create_dir_all(&root).unwrap();
    // 512 MiB: 96 MiB of noise (more than the sender's chunk store holds), then copies of
    // it with a few bytes changed in every MiB (cheap for the channel, but all read).
    let unique = 96;
    let f = File::create(src.join("big")).unwrap();
    let mut block = vec![0u8; MIB as usize];
    for k in 0..512u64 {
        noise(k % unique + 1, &mut block);
        if k >= unique {
            block[..8].copy_from_slice(&k.to_le_bytes());
        }
        f.write_all_at(&block, k * MIB).unwrap();
    }
    drop(f);
    let server = Server::start(&root, &cache);
    let (j, peak) = send(&src, &server, "t", &cache);
    eprintln!(
        "512 MiB sent in {} s, peak {} MiB",
        j["elapsed_s"],
        peak / MIB
    );
    assert_eq!(j["bytes_needed"], 512 * MIB);
    // Before bounding it: about 550 MiB of read-ahead pieces alone for such a file; its
    // channel store and index grew with the data too.
    assert!(peak < 256 * MIB, "the sender peaked at {} MiB", peak / MIB);
    assert_eq!(hash_file(&root.join("t/big")), hash_file(&src.join("big")));
    drop(server);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_sparse_file_of_gigabytes_is_sent_quickly_without_reading_its_holes() {
    let dir = tempdir("sparse");
    let (src, root, cache) = (dir.join("src"), dir.join("root"), dir.join("cache"));
    fs::create_dir_all(&src).unwrap();
    fs::create_dir_all(&root).unwrap();
    let image = src.join("disk.img");
    let f = File::create(&image).unwrap();
    let size = 4 << 30;
    f.set_len(size).unwrap();
    let mut data = vec![0u8; 3 * MIB as usize];
    noise(1, &mut data);
    f.write_all_at(&data[..MIB as usize], 0).unwrap();
    f.write_all_at(&data, (1 << 30) + 12_345).unwrap();
    f.write_all_at(b"the end", size - 7).unwrap();
    drop(f);
    fs::write(src.join("small"), b"beside it").unwrap();
    let server = Server::start(&root, &cache);
    let started = Instant::now();
    let (j, _) = send(&src, &server, "vm", &cache);
    let took = started.elapsed();
    eprintln!("4 GiB sparse sent in {took:?}");
    assert_eq!(j["bytes_needed"], size + 9);
    // Scanned, then read to send: the data (in whole file-system blocks), never the holes.
    let read = j["bytes_read"].as_u64().unwrap();
    assert!(read < 32 * MIB, "{read} bytes read");
    let sent = j["socket_bytes_sent"].as_u64().unwrap();
    assert!(sent < 16 * MIB, "{sent} bytes sent");
    // Through the channel as zeros, 4 GiB took 108 s in a debug build.
    assert!(took < Duration::from_secs(60), "{took:?}");
    assert_eq!(hash_file(&root.join("vm/disk.img")), hash_file(&image));
    assert_eq!(fs::read(root.join("vm/small")).unwrap(), b"beside it");
    drop(server);
    fs::remove_dir_all(&dir).unwrap();
}

/// The files of `dir` (one level) by name, each hashed.
fn hashes(dir: &Path) -> Vec<(String, String)> {
    let mut v: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|d| {
            let d = d.unwrap();
            let hash = hash_file(&d.path()).to_hex().to_string();
            (d.file_name().into_string().unwrap(), hash)
        })
        .collect();
    v.sort();
    v
}

#[test]
fn every_file_is_read_once_per_send() {
    let dir = tempdir("once");
    let (src, root, cache) = (dir.join("src"), dir.join("root"), dir.join("cache"));
    fs::create_dir_all(&src).unwrap();
    fs::create_dir_all(&root).unwrap();
    // Small files batched together, files read whole, and one streamed in pieces.
    let mut total = 0;
    let mut block = vec![0u8; 64 << 10];
    for k in 0..150u64 {
        noise(100 + k, &mut block);
        fs::write(src.join(format!("small-{k:03}")), &block).unwrap();
        total += block.len() as u64;
    }
    let mut mid = vec![0u8; 4 * MIB as usize];
    for k in 0..3u64 {
        noise(200 + k, &mut mid);
        fs::write(src.join(format!("mid-{k}")), &mid).unwrap();
        total += mid.len() as u64;
    }
    let mut big = vec![0u8; 20 * MIB as usize];
    noise(300, &mut big);
    fs::write(src.join("big"), &big).unwrap();
    total += big.len() as u64;
    let read_at_most = total + total / 20;

    let server = Server::start(&root, &cache);
    let (j, _) = send(&src, &server, "t", &cache);
    drop(server);
    assert_eq!(j["bytes_needed"], total);
    let read = j["bytes_read"].as_u64().unwrap();
    assert!(
        read <= read_at_most,
        "a first send read {read} bytes of a {total}-byte tree"
    );
    assert_eq!(hashes(&root.join("t")), hashes(&src));

    // Again after one file grew: the rest is read once to be compared, that file once to
    // be sent.
    fs::write(src.join("small-007"), [&block[..], b"and more"].concat()).unwrap();
    total += 8;
    let server = Server::start(&root, &cache);
    let (j, _) = send(&src, &server, "t", &cache);
    drop(server);
    assert_eq!(j["files_sent"], 1);
    let read = j["bytes_read"].as_u64().unwrap();
    assert!(
        read <= read_at_most,
        "a send of one grown file read {read} bytes of a {total}-byte tree"
    );
    assert_eq!(hashes(&root.join("t")), hashes(&src));
    fs::remove_dir_all(&dir).unwrap();
}
