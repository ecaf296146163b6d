//! Tests of [`super`].

use super::*;
use crate::rpc::{decode_answer, Stats, TopicRef};

fn stats_request() -> Vec<u8> {
    encode_request(&Stats {
        topic: TopicRef {
            name: "t".into(),
            incarnation: 0,
        },
        partitions: vec![0],
    })
    .expect("encode")
}

fn refusal_code(answer: &[u8]) -> ErrorCode {
    match decode_answer::<crate::rpc::Figures>(answer).expect("an answer") {
        Err(refused) => refused.code,
        Ok(reply) => panic!("answered {reply:?} instead of refusing"),
    }
}

#[test]
fn a_full_inbox_answers_overloaded_and_makes_room_as_requests_end() {
    let inbox = Arc::new(DataInbox::with_max(2));
    let mut receivers = inbox.wire(1);
    let request = stats_request();
    let kind = <Stats as Operation>::KIND;
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    let mut first = inbox.handle(kind, request.clone());
    let mut second = inbox.handle(kind, request.clone());
    assert!(first.as_mut().poll(&mut cx).is_pending());
    assert!(second.as_mut().poll(&mut cx).is_pending());
    assert_eq!(inbox.held(), 2);
    let mut third = inbox.handle(kind, request.clone());
    let std::task::Poll::Ready(Ok(answer)) = third.as_mut().poll(&mut cx) else {
        panic!("a third request waits instead of being refused");
    };
    assert_eq!(refusal_code(&answer), ErrorCode::Overloaded);
    drop(first);
    assert_eq!(inbox.held(), 1, "a dropped request gives its place back");
    drop((second, receivers.pop()));
    // Once the shards stopped, a request is answered at once.
    inbox.close();
    let mut late = inbox.handle(kind, request);
    let std::task::Poll::Ready(Ok(answer)) = late.as_mut().poll(&mut cx) else {
        panic!("a request to a stopped node waits");
    };
    assert_eq!(refusal_code(&answer), ErrorCode::Stopping);
}

#[test]
fn a_request_reaches_the_shard_that_owns_its_first_partition_and_its_reply_comes_back() {
    let inbox = Arc::new(DataInbox::with_max(8));
    let mut receivers = inbox.wire(4);
    let op = Stats {
        topic: TopicRef {
            name: "orders".into(),
            incarnation: 3,
        },
        partitions: vec![5, 1],
    };
    let home = shard_for("orders", 5, 4);
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    let mut answer = inbox.handle(
        <Stats as Operation>::KIND,
        encode_request(&op).expect("encode"),
    );
    assert!(answer.as_mut().poll(&mut cx).is_pending());
    for (shard, receiver) in receivers.iter_mut().enumerate() {
        let got = receiver.try_recv().ok();
        if shard != home {
            assert!(got.is_none(), "shard {shard} got another shard's request");
            continue;
        }
        let Some(Envelope::Stats(received, reply)) = got else {
            panic!("the home shard got no stats request");
        };
        assert_eq!(received, op);
        let figures = crate::owner::PartitionStats {
            high_watermark: 9,
            ..Default::default()
        };
        let figures = crate::rpc::TopicFigures {
            partitions: vec![(5, figures)],
            copies: Vec::new(),
        };
        reply.send(Ok(figures)).expect("reply");
    }
    let std::task::Poll::Ready(Ok(bytes)) = answer.as_mut().poll(&mut cx) else {
        panic!("the reply did not come back");
    };
    let reply = decode_answer::<crate::rpc::Figures>(&bytes).expect("decode");
    let figures = reply.expect("answered").expect("ok");
    assert_eq!(figures.partitions[0].1.high_watermark, 9);
    // A kind nobody knows is refused, not guessed at.
    let mut unknown = inbox.handle(99, vec![1, 2, 3]);
    assert!(matches!(
        unknown.as_mut().poll(&mut cx),
        std::task::Poll::Ready(Err(_))
    ));
}

#[test]
fn a_topic_found_empty_at_a_node_hides_only_that_topic_there_and_only_a_while() {
    let members = (1..=3).map(|id| (id, format!("n{id}:9080"))).collect();
    let peers = Peers::new(1, &members);
    assert!(peers.worth_asking(2, "a", 1_000));
    peers.found_empty(2, "a", 1_000);
    assert!(!peers.worth_asking(2, "a", 1_500), "found empty just now");
    assert!(peers.worth_asking(2, "b", 1_500), "another topic there");
    assert!(
        peers.worth_asking(3, "a", 1_500),
        "the same topic elsewhere"
    );
    assert!(
        peers.worth_asking(2, "a", 1_000 + EMPTY_HINT_TTL_MS),
        "the hint ages out"
    );
    // A notice of new messages there, or messages found, clears it.
    peers.heard_available(2, 1_200);
    assert!(peers.worth_asking(2, "a", 1_300));
    peers.found_empty(2, "a", 1_400);
    peers.found_messages(2, "a");
    assert!(peers.worth_asking(2, "a", 1_450));
}

#[test]
fn the_peer_table_follows_nodes_that_join_move_and_leave() {
    let members = (1..=2).map(|id| (id, format!("n{id}:9080"))).collect();
    let peers = Peers::new(1, &members);
    assert_eq!(peers.others(), vec![2]);
    peers.learn([(1, "n1:9080"), (2, "n2:9080"), (3, "n3:9080")], []);
    assert_eq!(peers.others(), vec![2, 3], "a joined node, never itself");
    assert_eq!(peers.addr(3).as_deref(), Some("n3:9080"));
    peers.learn([(3, "n3-new:9080")], []);
    assert_eq!(peers.addr(3).as_deref(), Some("n3-new:9080"));
    peers.learn([], [2]);
    assert_eq!(peers.others(), vec![3]);
    assert_eq!(peers.addr(2), None);
}
