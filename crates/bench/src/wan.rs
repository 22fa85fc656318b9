//! A WAN delay for the shaped-link benchmark (`bench/links.sh`): forwards every Ethernet frame
//! between two interfaces after a fixed one-way delay, both ways.
//!
//! Why it exists: the kernels this project benchmarks on have `tbf` but not `netem`, so `tc`
//! can shape a rate but not add latency. `links.sh` therefore puts a middle namespace between
//! the two ends, with one veth towards each, and runs this relay there: frames read from one
//! interface (a packet socket) are written to the other `delay` later, where `tbf` on that
//! interface's egress then shapes the rate. The two ends keep one end-to-end TCP connection
//! (the relay is a wire, not a proxy). Packet sockets use `PACKET_VNET_HDR`, so segmentation
//! offload packets and partial checksums pass through as the kernel made them.

use std::collections::VecDeque;
use std::ffi::CString;
use std::io;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Options of the delay relay.
#[derive(clap::Args)]
pub struct Args {
    /// One interface (in this network namespace).
    #[arg(long)]
    a: String,
    /// The other interface.
    #[arg(long)]
    b: String,
    /// One-way delay in milliseconds, applied in each direction.
    #[arg(long, default_value_t = 20.0)]
    delay_ms: f64,
}

/// `<linux/if_packet.h>`: prepend a `virtio_net_hdr` to every frame read and written.
const PACKET_VNET_HDR: libc::c_int = 15;
/// `<linux/if_packet.h>`: the frame was sent by this host (our own writes, seen again).
const PACKET_OUTGOING: u8 = 4;
/// Largest frame read: a 64 KiB offload packet, its Ethernet and virtio headers, and room.
const MAX_FRAME: usize = 256 << 10;

/// A packet socket bound to one interface.
struct Port {
    fd: libc::c_int,
}

impl Port {
    fn open(name: &str) -> Result<Port> {
        let cname = CString::new(name)?;
        // SAFETY: plain libc calls on values we own; every return value is checked, and
        // `addr` is a zeroed `sockaddr_ll` whose size is passed with it.
        unsafe {
            let index = libc::if_nametoindex(cname.as_ptr());
            if index == 0 {
                bail!("no interface {name}: {}", io::Error::last_os_error());
            }
            let proto = (libc::ETH_P_ALL as u16).to_be();
            let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, proto as libc::c_int);
            if fd < 0 {
                bail!("packet socket on {name}: {}", io::Error::last_os_error());
            }
            let port = Port { fd };
            let on: libc::c_int = 1;
            for opt in [PACKET_VNET_HDR, libc::PACKET_IGNORE_OUTGOING] {
                let r = libc::setsockopt(
                    fd,
                    libc::SOL_PACKET,
                    opt,
                    (&on as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                );
                // PACKET_IGNORE_OUTGOING is an optimisation (older kernels lack it): the
                // pkttype check in `pump` drops our own frames either way.
                if r < 0 && opt == PACKET_VNET_HDR {
                    bail!("PACKET_VNET_HDR on {name}: {}", io::Error::last_os_error());
                }
            }
            let mut addr: libc::sockaddr_ll = std::mem::zeroed();
            addr.sll_family = libc::AF_PACKET as u16;
            addr.sll_protocol = proto;
            addr.sll_ifindex = index as libc::c_int;
            let r = libc::bind(
                fd,
                (&addr as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            );
            if r < 0 {
                bail!("bind to {name}: {}", io::Error::last_os_error());
            }
            Ok(port)
        }
    }

    /// Waits up to `timeout` (forever if `None`) for a frame to read; true if one is there.
    fn wait(&self, timeout: Option<Duration>) -> io::Result<bool> {
        let mut pfd = libc::pollfd {
            fd: self.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ts = timeout.map(|t| libc::timespec {
            tv_sec: t.as_secs() as libc::time_t,
            tv_nsec: t.subsec_nanos() as libc::c_long,
        });
        let tsp = ts.as_ref().map_or(std::ptr::null(), |t| t as *const _);
        // SAFETY: one valid pollfd, a timespec that outlives the call or null, no signal mask.
        let r = unsafe { libc::ppoll(&mut pfd, 1, tsp, std::ptr::null()) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            };
        }
        Ok(r > 0)
    }

    /// Reads one frame without blocking: `Ok(None)` when none is waiting. Frames this host
    /// sent itself come back as empty vectors (to be skipped).
    fn read(&self, buf: &mut [u8]) -> io::Result<Option<Vec<u8>>> {
        // SAFETY: `buf` and `from` are valid for the lengths passed; the kernel writes at most
        // that much into each.
        let (n, from) = unsafe {
            let mut from: libc::sockaddr_ll = std::mem::zeroed();
            let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            let n = libc::recvfrom(
                self.fd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                (&mut from as *mut libc::sockaddr_ll).cast(),
                &mut len,
            );
            (n, from)
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(e),
            };
        }
        let n = n as usize;
        if from.sll_pkttype == PACKET_OUTGOING || n > buf.len() {
            // Our own writes, or a frame larger than any offload packet: skip (a loss).
            return Ok(Some(Vec::new()));
        }
        Ok(Some(buf[..n].to_vec()))
    }

    /// Writes one frame (with its virtio header); a full queue drops it, as a router would.
    fn write(&self, frame: &[u8]) {
        // SAFETY: `frame` is valid for its length.
        unsafe {
            libc::send(self.fd, frame.as_ptr().cast(), frame.len(), 0);
        }
    }
}

impl Drop for Port {
    fn drop(&mut self) {
        // SAFETY: the descriptor is ours and closed once.
        unsafe {
            libc::close(self.fd);
        }
    }
}

/// Forwards frames from `from` to `to`, each `delay` after it arrived, until an error.
fn pump(from: &Port, to: &Port, delay: Duration) -> Result<()> {
    let mut queue: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
    let mut buf = vec![0u8; MAX_FRAME];
    loop {
        let timeout = queue
            .front()
            .map(|(due, _)| due.saturating_duration_since(Instant::now()));
        if from.wait(timeout)? {
            while let Some(frame) = from.read(&mut buf)? {
                if !frame.is_empty() {
                    queue.push_back((Instant::now() + delay, frame));
                }
            }
        }
        let now = Instant::now();
        while queue.front().is_some_and(|(due, _)| *due <= now) {
            let (_, frame) = queue.pop_front().expect("front checked");
            to.write(&frame);
        }
    }
}

/// Runs the relay until killed.
pub fn run(args: &Args) -> Result<()> {
    let delay = Duration::from_secs_f64(args.delay_ms / 1000.0);
    let a = Port::open(&args.a).with_context(|| format!("interface {}", args.a))?;
    let b = Port::open(&args.b).with_context(|| format!("interface {}", args.b))?;
    thread::scope(|s| {
        let back = s.spawn(|| pump(&b, &a, delay));
        let r = pump(&a, &b, delay);
        back.join().expect("relay thread")?;
        r
    })
}
