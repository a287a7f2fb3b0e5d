//! Records client operations and etcd's own log of the lock key space as a
//! `holdfast_checkers::History`, the input of the correctness gate.

use holdfast_checkers::history::{ClientOp, EtcdLog, History, OpKind, Outcome};
use holdfast_client::{Error, ErrorReason, Hold, Session};
use holdfast_model::LockKey;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub struct Recorder {
    start: Instant,
    ops: Mutex<Vec<ClientOp>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder { start: Instant::now(), ops: Mutex::new(Vec::new()) }
    }
}

/// A refusal that proves nothing happened is a failure; anything else
/// (timeouts, lost connections) leaves the outcome unknown.
fn outcome_of(e: &Error) -> Outcome {
    match e.reason() {
        Some(
            ErrorReason::Contention
            | ErrorReason::Leak
            | ErrorReason::Sealed
            | ErrorReason::InvalidArgument
            | ErrorReason::SessionNotFound
            | ErrorReason::Denied
            | ErrorReason::Unauthenticated
            | ErrorReason::Moving,
        ) => Outcome::Fail,
        _ => Outcome::Unknown,
    }
}

impl Recorder {
    /// Nanoseconds since the recorder was made: the clock of its ops.
    pub fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    fn push(&self, op: ClientOp) {
        self.ops.lock().unwrap().push(op);
    }

    /// Records an operation the test made by hand.
    pub fn record(&self, op: ClientOp) {
        self.push(op);
    }

    pub async fn acquire(&self, process: u64, session: &Session, key: &LockKey, wait: Duration) -> Option<Hold> {
        let invoke = self.now();
        let r = session.acquire(key, wait).await;
        let complete = self.now();
        let (outcome, token, hold) = match r {
            Ok(h) => (Outcome::Ok, Some(h.token().expose()), Some(h)),
            Err(e) => (outcome_of(&e), None, None),
        };
        self.push(ClientOp {
            process,
            kind: OpKind::Acquire { key: key.to_string() },
            session: Some(session.id() as i64),
            token,
            invoke_ns: invoke,
            complete_ns: (outcome != Outcome::Unknown).then_some(complete),
            outcome,
            gave_up_ns: (outcome == Outcome::Unknown).then_some(complete),
        });
        hold
    }

    /// Records a release; `Ok` only when the arbiter says it deleted a hold.
    pub async fn release(
        &self,
        process: u64,
        session_id: u64,
        key: &LockKey,
        token: u64,
        call: impl std::future::Future<Output = Result<bool, Error>>,
    ) -> bool {
        let invoke = self.now();
        let r = call.await;
        let complete = self.now();
        let outcome = match &r {
            Ok(true) => Outcome::Ok,
            Ok(false) => Outcome::Fail,
            Err(e) => outcome_of(e),
        };
        self.push(ClientOp {
            process,
            kind: OpKind::Release { key: key.to_string() },
            session: Some(session_id as i64),
            token: Some(token),
            invoke_ns: invoke,
            complete_ns: (outcome != Outcome::Unknown).then_some(complete),
            outcome,
            gave_up_ns: (outcome == Outcome::Unknown).then_some(complete),
        });
        matches!(r, Ok(true))
    }

    pub fn history(&self, etcd: EtcdLog) -> History {
        History { ops: self.ops.lock().unwrap().clone(), etcd, ..Default::default() }
    }
}

/// etcd's log of `/l/` from revision 1 (with the deleted values, expiries
/// marked, session-record deletes and epoch advances); the epoch at the
/// start is 1 (`epoch init`).
pub async fn etcd_lock_log(client: &etcd_client::Client) -> EtcdLog {
    holdfast_fixtures::etcdlog::read_log(client, "", 1, 1).await.expect("watch etcd's log")
}
