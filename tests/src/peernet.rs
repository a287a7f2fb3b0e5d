//! Peer links a test can cut, on loopback: a TCP proxy in front of each
//! etcd member's peer port, so that one member can be cut off from the
//! others while its client port keeps answering, which is what a network
//! partition does to a member and what loopback alone cannot.
//!
//! Every member advertises its proxy's port, so its peers reach it only
//! through the proxy. etcd's peer requests (`rafthttp`: the Raft streams,
//! pipelined messages and snapshots) name their sender in an
//! `X-Server-From` header; the proxy reads the first request's headers of
//! each connection to learn it. Cutting member `i` off closes, and refuses
//! from then on, every connection to `i`'s proxy and every connection that
//! `i` opened to another member's.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The member cut off, if one is: its index and its member ID as etcd
/// writes it in `X-Server-From` (lower-case hex).
type Cut = Option<(usize, String)>;

struct State {
    cut: Mutex<Cut>,
    changed: tokio::sync::watch::Sender<u64>,
}

impl State {
    fn cut(&self) -> Cut {
        self.cut.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether a connection to member `to`, opened by `from`, is cut.
    fn severs(&self, to: usize, from: Option<&str>) -> bool {
        match self.cut() {
            Some((i, id)) => i == to || from == Some(id.as_str()),
            None => false,
        }
    }
}

/// One proxy per member.
pub struct PeerNet {
    state: Arc<State>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl PeerNet {
    /// Starts a proxy for each member listening on its peer port `listen[i]`,
    /// on a free port each; returns them in the same order (what each
    /// member must advertise).
    pub async fn start(listen: &[u16]) -> (PeerNet, Vec<u16>) {
        let state = Arc::new(State { cut: Mutex::new(None), changed: tokio::sync::watch::channel(0).0 });
        let mut tasks = Vec::new();
        let mut ports = Vec::new();
        for (to, upstream) in listen.iter().copied().enumerate() {
            let listener = TcpListener::bind(("127.0.0.1", 0)).await.expect("bind a peer proxy");
            ports.push(listener.local_addr().expect("proxy address").port());
            let state = state.clone();
            tasks.push(tokio::spawn(async move {
                while let Ok((conn, _)) = listener.accept().await {
                    tokio::spawn(relay(conn, to, upstream, state.clone()));
                }
            }));
        }
        (PeerNet { state, tasks }, ports)
    }

    /// Cuts member `i` (etcd member ID `id`, lower-case hex) off from the
    /// others, until [`PeerNet::heal`].
    pub fn isolate(&self, i: usize, id: &str) {
        *self.state.cut.lock().unwrap_or_else(|e| e.into_inner()) = Some((i, id.to_string()));
        self.state.changed.send_modify(|n| *n += 1);
    }

    pub fn heal(&self) {
        *self.state.cut.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.state.changed.send_modify(|n| *n += 1);
    }
}

impl Drop for PeerNet {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The value of the `X-Server-From` header in `head`, if any.
fn sender(head: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(head);
    text.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.trim().eq_ignore_ascii_case("x-server-from").then(|| value.trim().to_ascii_lowercase())
    })
}

/// Relays one connection to member `to`, unless or until it is cut.
async fn relay(mut conn: TcpStream, to: usize, upstream: u16, state: Arc<State>) {
    if state.severs(to, None) {
        return;
    }
    // The first request's head (up to its blank line), to learn the sender.
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 64 * 1024 {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
        true
    })
    .await;
    if !matches!(read, Ok(true)) {
        return;
    }
    let from = sender(&head);
    if state.severs(to, from.as_deref()) {
        return;
    }
    let Ok(mut up) = TcpStream::connect(("127.0.0.1", upstream)).await else { return };
    if up.write_all(&head).await.is_err() {
        return;
    }
    let mut changed = state.changed.subscribe();
    let cut = async {
        while changed.changed().await.is_ok() {
            if state.severs(to, from.as_deref()) {
                return;
            }
        }
        std::future::pending::<()>().await
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut conn, &mut up) => {}
        _ = cut => {}
    }
}
