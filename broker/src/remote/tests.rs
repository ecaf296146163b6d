//! Tests of [`super`].

use super::*;

#[test]
fn a_full_inbox_answers_overloaded_and_makes_room_as_requests_end() {
    let inbox = Arc::new(DataInbox::with_max(2));
    let mut receivers = inbox.wire(1);
    let request = encode_request(&DataRequest::Stats {
        topic: "t".into(),
        incarnation: 0,
        partitions: vec![0],
    })
    .expect("encode");
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    let mut first = inbox.handle(request.clone());
    let mut second = inbox.handle(request.clone());
    assert!(first.as_mut().poll(&mut cx).is_pending());
    assert!(second.as_mut().poll(&mut cx).is_pending());
    assert_eq!(inbox.held(), 2);
    let mut third = inbox.handle(request.clone());
    let std::task::Poll::Ready(Ok(answer)) = third.as_mut().poll(&mut cx) else {
        panic!("a third request waits instead of being refused");
    };
    assert!(matches!(
        decode_answer(&answer),
        Ok(DataAnswer::Failed(error)) if error.code == "overloaded"
    ));
    drop(first);
    assert_eq!(inbox.held(), 1, "a dropped request gives its place back");
    drop((second, receivers.pop()));
    // Once the shards stopped, a request is answered at once.
    inbox.close();
    let mut late = inbox.handle(request);
    let std::task::Poll::Ready(Ok(answer)) = late.as_mut().poll(&mut cx) else {
        panic!("a request to a stopped node waits");
    };
    assert!(matches!(
        decode_answer(&answer),
        Ok(DataAnswer::Failed(error)) if error.code == "stopping"
    ));
}

#[test]
fn requests_and_answers_round_trip_and_garbage_is_refused() {
    let request = DataRequest::Commit {
        topic: "orders".into(),
        incarnation: 3,
        partition: 7,
        messages: vec![WireMessage {
            id: u128::MAX - 5,
            produced_at_ms: 42,
            key: Some(b"k".to_vec()),
            value: vec![0, 1, 2, 255],
        }],
    };
    let bytes = encode_request(&request).expect("encode");
    // What QUIC hands over has no alignment guarantee.
    let mut shifted = vec![0u8];
    shifted.extend_from_slice(&bytes);
    assert_eq!(decode_request(&shifted[1..]).expect("decode"), request);

    let answer = DataAnswer::Settled(vec![
        WireOutcome {
            error: Some(WireError::from(&ApiError::new(
                ErrorCode::LeaseGone,
                "ended",
            ))),
            lease_expires_at_ms: None,
        },
        WireOutcome {
            error: None,
            lease_expires_at_ms: Some(9),
        },
    ]);
    let decoded = decode_answer(&encode_answer(&answer).expect("encode")).expect("decode");
    assert_eq!(decoded, answer);
    let DataAnswer::Settled(outcomes) = decoded else {
        panic!("settled")
    };
    let error = outcomes[0].error.as_ref().expect("error").to_api();
    assert_eq!(error.code, ErrorCode::LeaseGone);

    assert!(decode_request(b"not rkyv at all").is_err());
    assert!(decode_answer(&[]).is_err());
}
