use super::*;
use holdfast_model::layout::{encode, hold_key, session_key};

const ALICE: &str = "spiffe://t/alice";

fn session(lease: i64, revision: i64) -> Change {
    Change::put(&session_key(lease), encode(&SessionRecord { spiffe_id: ALICE.into(), ttl_secs: 10, coord: false }), revision)
}

fn hold_record(lease: i64) -> Vec<u8> {
    encode(&HoldRecord { spiffe_id: ALICE.into(), session: lease, epoch: 3, granted_unix_ms: 1_000 })
}

fn hold(key: &str) -> String {
    hold_key(&holdfast_model::LockKey::parse(key).unwrap())
}

fn kinds(events: &[Event]) -> Vec<Kind> {
    events.iter().map(|e| e.kind).collect()
}

/// Opens session `lease` and grants `key` on it at revisions 10 and 11.
fn granted(c: &mut Classifier, lease: i64, key: &str) {
    assert_eq!(kinds(&c.revision(10, &[session(lease, 10)], 5)), [Kind::SessionOpen]);
    let grant = c.revision(11, &[Change::put(&hold(key), hold_record(lease), 11)], 5);
    assert_eq!(kinds(&grant), [Kind::Grant]);
    let g = &grant[0];
    assert_eq!((g.identity.as_deref(), g.key.as_deref(), g.namespace.as_deref()), (Some(ALICE), Some(key), Some("pay")));
    assert_eq!((g.epoch, g.time_unix_ms, g.time_source), (Some(3), 1_000, TimeSource::Record));
    assert_eq!(g.session.as_deref(), Some(lease_hex(lease).as_str()));
}

#[test]
fn a_release_is_a_delete_while_the_session_record_lives() {
    let mut c = Classifier::new(1);
    granted(&mut c, 7, "pay/a");
    let e = c.revision(12, &[Change::delete(&hold("pay/a"), Some(hold_record(7)))], 4_000);
    assert_eq!(kinds(&e), [Kind::Release]);
    assert_eq!(e[0].held_ms, Some(3_000));
}

#[test]
fn an_expiry_deletes_the_record_and_its_holds_in_one_revision() {
    let mut c = Classifier::new(1);
    granted(&mut c, 7, "pay/a");
    let lapse = [
        Change::delete(&hold("pay/a"), Some(hold_record(7))),
        Change::delete(&session_key(7), Some(encode(&SessionRecord { spiffe_id: ALICE.into(), ttl_secs: 10, coord: false }))),
    ];
    let e = c.revision(12, &lapse, 9);
    assert_eq!(kinds(&e), [Kind::Expiry, Kind::SessionLapse]);
    assert_eq!(e[1].identity.as_deref(), Some(ALICE));
    assert_eq!((e[0].index, e[1].index), (0, 1));
    assert_eq!(c.live_sessions(), 0);
}

#[test]
fn a_close_is_the_marked_record_delete_then_the_revoke() {
    let mut c = Classifier::new(1);
    granted(&mut c, 7, "pay/a");
    let close = [Change::delete(&session_key(7), None), Change::put(&layout::closed_key(7), Vec::new(), 12)];
    assert_eq!(kinds(&c.revision(12, &close, 9)), [Kind::SessionClose, Kind::Record]);
    // A release racing the close cannot commit (its compare on the record
    // fails); the revoke then deletes the hold and the marker.
    let revoke = [Change::delete(&hold("pay/a"), Some(hold_record(7))), Change::delete(&layout::closed_key(7), Some(Vec::new()))];
    assert_eq!(kinds(&c.revision(13, &revoke, 9)), [Kind::Close, Kind::Record]);
}

#[test]
fn withdrawals_force_releases_and_advances_are_named_by_their_transaction() {
    let mut c = Classifier::new(1);
    granted(&mut c, 7, "pay/a");
    let marker = WithdrawnRecord { create_revision: 11, session: 7, reason: "sealed".into() };
    let withdraw =
        [Change::delete(&hold("pay/a"), Some(hold_record(7))), Change::put(&layout::withdrawn_key(&hold("pay/a")), encode(&marker), 12)];
    let e = c.revision(12, &withdraw, 9);
    assert_eq!(kinds(&e), [Kind::Withdrawal, Kind::Record]);
    assert_eq!(e[0].reason.as_deref(), Some("sealed"));
    // No event names the create revision the marker holds.
    assert!(!serde_json::to_string(&e).unwrap().contains("create_revision"));

    c.revision(13, &[Change::put(&hold("pay/b"), hold_record(7), 13)], 9);
    let record = ForceRecord {
        namespace: "pay".into(),
        key: "b".into(),
        holder: ALICE.into(),
        session: 7,
        granted_unix_ms: 1_000,
        class: "ledger".into(),
        fenced: true,
        requester: "spiffe://t/ops-1".into(),
        approver: "ops-2".into(),
        reason: "stuck".into(),
        revoked_session: false,
        at_unix: 5,
    };
    let force = [
        Change::delete(&hold("pay/b"), Some(hold_record(7))),
        Change::put(&layout::force_key("n1"), encode(&record), 14),
        Change::put(&layout::nonce_key("n1"), b"{}".to_vec(), 14),
    ];
    let e = c.revision(14, &force, 9);
    assert_eq!(kinds(&e), [Kind::ForceRelease, Kind::Record, Kind::Record]);
    assert_eq!((e[0].requester.as_deref(), e[0].approver.as_deref(), e[0].fenced), (Some("spiffe://t/ops-1"), Some("ops-2"), Some(true)));
    assert_eq!((e[0].time_unix_ms, e[0].held_ms), (5_000, Some(4_000)));

    c.revision(15, &[Change::put(&hold("pay/c"), hold_record(7), 15)], 9);
    let epoch = layout::EpochRecord { epoch: 4, cluster_id: 1, log_floor: 0, mint: String::new() };
    let advance = [
        Change::put(layout::EPOCH_KEY, encode(&epoch), 2),
        Change::delete(&hold("pay/c"), Some(hold_record(7))),
        Change::delete(&session_key(7), None),
    ];
    let e = c.revision(16, &advance, 9);
    assert_eq!(kinds(&e), [Kind::Epoch, Kind::Advance, Kind::SessionEnd]);
    assert_eq!(e[0].epoch, Some(4));
    let later = c.revision(17, &[Change::put(layout::WATERMARK_KEY, b"{}".to_vec(), 3)], 9);
    assert_eq!((later[0].kind, later[0].epoch), (Kind::Record, Some(4)));
}

#[test]
fn waiters_seals_and_class_sets() {
    let mut c = Classifier::new(1);
    granted(&mut c, 7, "pay/a");
    let waiter = format!("{}pay/a/{}", layout::WAITER_PREFIX, lease_hex(7));
    let e = c.revision(12, &[Change::put(&waiter, Vec::new(), 12)], 9);
    assert_eq!(kinds(&e), [Kind::Wait]);
    assert_eq!((e[0].key.as_deref(), e[0].identity.as_deref()), (Some("pay/a"), Some(ALICE)));
    let seal = SealRecord { reason: "rewind".into(), sealed_at_unix: 1 };
    assert_eq!(kinds(&c.revision(13, &[Change::put(layout::SEAL_KEY, encode(&seal), 13)], 9)), [Kind::Seal]);
    assert_eq!(kinds(&c.revision(14, &[Change::delete(layout::SEAL_KEY, None)], 9)), [Kind::Unseal]);
}

#[test]
fn a_seeded_classifier_classifies_as_one_that_saw_everything() {
    let mut whole = Classifier::new(1);
    granted(&mut whole, 7, "pay/a");
    let close = [Change::delete(&session_key(7), None), Change::put(&layout::closed_key(7), Vec::new(), 12)];
    whole.revision(12, &close, 9);
    // Restarted after revision 12: the key space then has the hold, the
    // marker, and no session record.
    let mut seeded = Classifier::new(1);
    let hold_value = hold_record(7);
    seeded.seed([(hold("pay/a").as_str(), hold_value.as_slice()), (layout::closed_key(7).as_str(), &[][..])]);
    let revoke = [Change::delete(&hold("pay/a"), Some(hold_record(7)))];
    assert_eq!(kinds(&seeded.revision(13, &revoke, 9)), kinds(&whole.revision(13, &revoke, 9)));
    assert_eq!(kinds(&seeded.revision(14, &revoke, 9)), [Kind::Close]);
    // And a live session seeded is a release.
    let mut live = Classifier::new(1);
    let s = encode(&SessionRecord { spiffe_id: ALICE.into(), ttl_secs: 10, coord: false });
    live.seed([(session_key(7).as_str(), s.as_slice())]);
    assert_eq!(kinds(&live.revision(13, &revoke, 9)), [Kind::Release]);
}

#[test]
fn a_shipped_spool_record_is_an_unprotected_event_with_no_epoch_and_its_recorded_time() {
    use holdfast_model::spool::{Entry, Event as Spooled};
    let mut c = Classifier::new(1);
    let record = |event, seq, why: &str| Entry {
        spool: "00000000000000aa".into(),
        seq,
        event,
        at_unix_ms: 1_700_000_000_000 + seq,
        cluster: "test".into(),
        namespace: "cache".into(),
        key: "warm/1".into(),
        class: "cache-warm".into(),
        identity: ALICE.into(),
        session: 0x2a,
        why: why.into(),
    };
    let put = |e: &Entry, rev| Change::put(&layout::unprotected_key(&e.spool, e.seq), serde_json::to_vec(e).unwrap(), rev);
    let (g, x) = (record(Spooled::Grant, 1, ""), record(Spooled::End, 2, "quorum_back"));
    let events = c.revision(20, &[put(&g, 20), put(&x, 20)], 9);
    assert_eq!(kinds(&events), [Kind::UnprotectedGrant, Kind::UnprotectedEnd]);
    for (e, r) in events.iter().zip([&g, &x]) {
        assert_eq!(e.unprotected, Some(true));
        assert_eq!(
            (e.key.as_deref(), e.namespace.as_deref(), e.class.as_deref()),
            (Some("cache/warm/1"), Some("cache"), Some("cache-warm"))
        );
        assert_eq!((e.identity.as_deref(), e.session.as_deref(), e.epoch), (Some(ALICE), Some("000000000000002a"), None));
        assert_eq!((e.time_unix_ms, e.time_source), (r.at_unix_ms, TimeSource::Record));
        assert!(!e.kind.ends_hold(), "an unprotected end never ends a protected hold's withholding");
    }
    assert_eq!(events[1].reason.as_deref(), Some("quorum_back"));
    // Protected events never carry the flag.
    granted(&mut c, 7, "pay/a");
}
