//! Scenarios every fence is held to, run against real PostgreSQL and a real
//! S3-compatible server by `postgres.rs` and `s3.rs`.

#![allow(dead_code)]

use holdfast_fence::{FenceMode, SharedFence, Token, Written};
use std::sync::{Arc, Mutex};

/// The scenarios as tests, for a `Fixture` with `start()`,
/// `fence(FenceMode) -> SharedFence` (set up, on its own connection) and
/// `expected(&self) -> (kind, description)`.
macro_rules! scenarios {
    () => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn correct_fence_accepts_only_strictly_newer_tokens() {
            let fx = Fixture::start();
            let f = fx.fence(FenceMode::Correct).await;
            assert_eq!((f.kind(), f.describe()), fx.expected());
            common::accepts_only_strictly_newer_tokens(&f).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn concurrent_writers_on_the_correct_fence_keep_the_log_increasing() {
            let fx = Fixture::start();
            let mut fences = Vec::new();
            for _ in 0..6 {
                fences.push(fx.fence(FenceMode::Correct).await);
            }
            common::concurrent_writers_keep_the_log_increasing(fences, 30).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn wrong_fences_fail_and_the_correct_one_holds_under_a_pause() {
            let fx = Fixture::start();
            let (a, b) = (fx.fence(FenceMode::Correct).await, fx.fence(FenceMode::Correct).await);
            common::correct_fence_rejects_a_resumed_stale_write(a, b).await;
            let (a, b) = (fx.fence(FenceMode::TwoStatements).await, fx.fence(FenceMode::TwoStatements).await);
            common::two_statements_let_a_resumed_stale_write_through(a, b).await;
            common::less_or_equal_accepts_a_repeated_token(fx.fence(FenceMode::LessOrEqual).await).await;
            let (a, b) = (fx.fence(FenceMode::Unfenced).await, fx.fence(FenceMode::Unfenced).await);
            common::unfenced_loses_an_update(a, b).await;
        }
    };
}
pub(crate) use scenarios;

pub fn token(revision: u64) -> Token {
    Token::new(1, revision).expect("token")
}

pub fn raw(revision: u64) -> u64 {
    token(revision).expose()
}

/// A `between` callback that runs `other`'s whole increment, to completion,
/// at the pause point of the write it is passed to: the deterministic form
/// of "a second writer got in while the first was paused". Needs a
/// multi-threaded runtime.
pub fn interleave(other: SharedFence, record: &str, with: Token) -> (impl FnMut() + Send, Arc<Mutex<Option<Written>>>) {
    let handle = tokio::runtime::Handle::current();
    let record = record.to_string();
    let result = Arc::new(Mutex::new(None));
    let out = result.clone();
    let f = move || {
        if out.lock().unwrap().is_some() {
            return;
        }
        let w = tokio::task::block_in_place(|| handle.block_on(other.increment(&record, with, &mut || {}))).expect("interleaved increment");
        *out.lock().unwrap() = Some(w);
    };
    (f, result)
}

/// The rule itself, one writer at a time: only a strictly newer token writes.
pub async fn accepts_only_strictly_newer_tokens(f: &SharedFence) {
    assert_eq!(f.mode(), FenceMode::Correct);
    let r = "strict";
    assert_eq!(f.read(r).await.unwrap(), 0);
    assert_eq!(f.increment(r, token(10), &mut || {}).await.unwrap(), Written::Accepted { value: 1 });
    assert_eq!(f.increment(r, token(10), &mut || {}).await.unwrap(), Written::Rejected, "a repeated token must be refused");
    assert_eq!(f.increment(r, token(9), &mut || {}).await.unwrap(), Written::Rejected, "an older token must be refused");
    assert_eq!(f.increment(r, token(11), &mut || {}).await.unwrap(), Written::Accepted { value: 2 });
    // A later epoch beats any revision of an earlier one.
    let next_epoch = Token::new(2, 1).unwrap();
    assert_eq!(f.increment(r, next_epoch, &mut || {}).await.unwrap(), Written::Accepted { value: 3 });
    assert_eq!(f.read(r).await.unwrap(), 3);
    assert_eq!(f.accepted_log(r).await.unwrap(), vec![raw(10), raw(11), next_epoch.expose()]);
    // Records are independent.
    assert_eq!(f.increment("strict-other", token(5), &mut || {}).await.unwrap(), Written::Accepted { value: 1 });
    assert!(f.accepted_log("never-written").await.unwrap().is_empty());
    assert!(f.read("bad/name").await.unwrap_err().to_string().contains("'/'"));
}

/// Many writers race with tokens handed out in increasing order (as grants
/// are): the resource's log of accepted tokens strictly increases and the
/// counter equals the number of accepted writes.
pub async fn concurrent_writers_keep_the_log_increasing(fences: Vec<SharedFence>, per_writer: u64) {
    let r = "race";
    let next = Arc::new(std::sync::atomic::AtomicU64::new(100));
    let mut tasks = Vec::new();
    for f in fences.clone() {
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            let mut accepted = 0u64;
            for _ in 0..per_writer {
                let t = token(next.fetch_add(1, std::sync::atomic::Ordering::SeqCst));
                if f.increment(r, t, &mut || {}).await.expect("increment").is_accepted() {
                    accepted += 1;
                }
            }
            accepted
        }));
    }
    let mut accepted = 0;
    for t in tasks {
        accepted += t.await.unwrap();
    }
    let log = fences[0].accepted_log(r).await.unwrap();
    assert!(log.windows(2).all(|w| w[0] < w[1]), "accepted tokens must strictly increase in resource order");
    assert_eq!(log.len() as u64, accepted, "every accepted write is in the log, and nothing else");
    assert_eq!(fences[0].read(r).await.unwrap(), accepted, "the counter counts exactly the accepted writes");
    assert!(accepted > 0);
}

/// A writer paused at its decisive point while a newer token writes: the
/// correct fence rejects the resumed write; the counter stays consistent.
pub async fn correct_fence_rejects_a_resumed_stale_write(paused: SharedFence, other: SharedFence) {
    let r = "paused";
    let (mut between, newer) = interleave(other, r, token(21));
    let stale = paused.increment(r, token(20), &mut between).await.unwrap();
    assert_eq!(*newer.lock().unwrap(), Some(Written::Accepted { value: 1 }));
    assert_eq!(stale, Written::Rejected, "the resumed stale write must be rejected");
    assert_eq!(paused.read(r).await.unwrap(), 1);
    assert_eq!(paused.accepted_log(r).await.unwrap(), vec![raw(21)]);
}

/// The same interleaving with a check and a write in two statements: the
/// stale write lands after the newer one.
pub async fn two_statements_let_a_resumed_stale_write_through(paused: SharedFence, other: SharedFence) {
    assert_eq!(paused.mode(), FenceMode::TwoStatements);
    let r = "two-statements";
    let (mut between, newer) = interleave(other, r, token(31));
    let stale = paused.increment(r, token(30), &mut between).await.unwrap();
    assert_eq!(*newer.lock().unwrap(), Some(Written::Accepted { value: 1 }));
    assert!(stale.is_accepted(), "two statements: the stale write is accepted (this is the bug being demonstrated)");
    // The older token was accepted last (PostgreSQL's log shows both, in
    // that order; an S3 overwrite replaced the whole object, log included).
    assert_eq!(paused.accepted_log(r).await.unwrap().last(), Some(&raw(30)), "the older token landed after the newer one");
    // And the newer writer's increment was lost: two accepted, counter 1.
    assert_eq!(paused.read(r).await.unwrap(), 1);
}

/// `<=`: a token the record already accepted is accepted again.
pub async fn less_or_equal_accepts_a_repeated_token(f: SharedFence) {
    assert_eq!(f.mode(), FenceMode::LessOrEqual);
    let r = "lte";
    assert!(f.increment(r, token(40), &mut || {}).await.unwrap().is_accepted());
    assert!(f.increment(r, token(40), &mut || {}).await.unwrap().is_accepted(), "<= accepts the same token again");
    assert_eq!(f.increment(r, token(39), &mut || {}).await.unwrap(), Written::Rejected, "but still refuses older tokens");
}

/// No fence: a read-modify-write race loses an update, deterministically.
pub async fn unfenced_loses_an_update(paused: SharedFence, other: SharedFence) {
    assert_eq!(paused.mode(), FenceMode::Unfenced);
    let r = "unfenced";
    let (mut between, newer) = interleave(other, r, token(51));
    let first = paused.increment(r, token(50), &mut between).await.unwrap();
    assert_eq!(*newer.lock().unwrap(), Some(Written::Accepted { value: 1 }));
    assert_eq!(first, Written::Accepted { value: 1 }, "both writers read 0 and wrote 1");
    assert_eq!(paused.read(r).await.unwrap(), 1, "two writes were accepted but the counter counts one: an update was lost");
}

/// setup is idempotent, safe to run concurrently, and records the schema.
pub async fn setup_is_idempotent(fences: Vec<SharedFence>) {
    let runs: Vec<_> = fences.iter().cloned().map(|f| tokio::spawn(async move { f.setup().await })).collect();
    for r in runs {
        r.await.unwrap().expect("concurrent setup");
    }
    fences[0].setup().await.expect("setup again");
    assert_eq!(fences[0].schema_version().await.unwrap(), holdfast_fence::SCHEMA_VERSION);
}
