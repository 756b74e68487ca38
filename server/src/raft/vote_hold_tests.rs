//! `super::vote_hold`: when a restarted member refuses votes.

use std::time::Duration;

use tokio::time::Instant;

use super::vote_hold::VoteHold;

#[test]
fn a_member_restarted_under_an_established_leader_refuses_votes_for_one_lease() {
    let lease = Duration::from_millis(750);
    let started = Instant::now();
    let hold = VoteHold::at_start(true, started, lease);
    let err = hold.check(started).unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert!(err.message().contains("holds its vote"), "{}", err.message());
    assert!(hold.check(started + lease - Duration::from_millis(1)).is_err());
    assert!(hold.check(started + lease).is_ok());
}

#[test]
fn a_member_without_an_established_leader_votes_at_once() {
    let started = Instant::now();
    let hold = VoteHold::at_start(false, started, Duration::from_millis(750));
    assert!(hold.check(started).is_ok());
}
