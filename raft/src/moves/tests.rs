use super::*;
use crate::state::{Command, TopicConfig};

fn config(partitions: u32) -> TopicConfig {
    TopicConfig {
        partitions,
        visibility_timeout_ms: 30_000,
        retention_ms: 0,
        max_deliveries: 0,
        dead_letter_topic: None,
        schema: None,
        max_message_bytes: 1 << 20,
        idempotency_window_ms: 300_000,
    }
}

fn cluster(nodes: &[NodeId]) -> MetaState {
    let mut state = MetaState::default();
    for node in nodes {
        state
            .apply(&Command::SetNodeState {
                id: *node,
                addr: format!("n{node}:7000"),
                alive: true,
                now_ms: 1,
            })
            .expect("applied");
    }
    state
}

fn topic(state: &mut MetaState, name: &str, owners: &[NodeId]) {
    let partitions = u32::try_from(owners.len()).expect("few");
    state
        .apply(&Command::PutTopic {
            name: name.into(),
            config: config(partitions),
            new_owners: owners.to_vec(),
            now_ms: 1,
        })
        .expect("applied");
}

fn counts(state: &MetaState, nodes: &[NodeId]) -> Vec<usize> {
    nodes.iter().map(|n| state.partitions_of(*n)).collect()
}

/// Plans, starts and hands over every move of a plan.
fn carry_out(state: &mut MetaState, plans: Vec<MovePlan>) {
    let Applied::MovesPlanned(moves) = state
        .apply(&Command::PlanMoves {
            moves: plans,
            decommission: None,
            now_ms: 2,
        })
        .expect("applied")
    else {
        panic!("not planned")
    };
    for planned in moves {
        let start = Command::StartMove {
            id: planned.id.clone(),
            max_running: 1,
            now_ms: 3,
        };
        state.apply(&start).expect("applied");
        let end = Command::EndMove {
            id: planned.id,
            end: MoveEnd::Done,
            now_ms: 4,
        };
        state.apply(&end).expect("applied");
    }
}

#[test]
fn a_move_hands_the_partition_over_once_and_only_from_its_owner() {
    let mut state = cluster(&[1, 2]);
    topic(&mut state, "t", &[1, 1]);
    let plan = |from, to| MovePlan {
        topic: "t".into(),
        partition: 0,
        from,
        to,
    };
    let refused = state.apply(&Command::PlanMoves {
        moves: vec![plan(2, 1)],
        decommission: None,
        now_ms: 2,
    });
    assert!(matches!(refused, Err(Refused::MoveSourceNotOwner { .. })));
    let refused = state.apply(&Command::PlanMoves {
        moves: vec![plan(1, 3)],
        decommission: None,
        now_ms: 2,
    });
    assert_eq!(refused, Err(Refused::MoveTargetUnfit(3)));
    let Ok(Applied::MovesPlanned(moves)) = state.apply(&Command::PlanMoves {
        moves: vec![plan(1, 2)],
        decommission: None,
        now_ms: 2,
    }) else {
        panic!("plan refused")
    };
    let id = moves[0].id.clone();
    // A second plan for a moving partition is refused.
    assert!(matches!(
        state.apply(&Command::PlanMoves {
            moves: vec![plan(1, 2)],
            decommission: None,
            now_ms: 2,
        }),
        Err(Refused::PartitionMoving { .. })
    ));
    // Not started: it cannot be handed over.
    let done = Command::EndMove {
        id: id.clone(),
        end: MoveEnd::Done,
        now_ms: 3,
    };
    assert!(matches!(
        state.apply(&done),
        Err(Refused::MoveNotRunning { .. })
    ));
    let start = Command::StartMove {
        id: id.clone(),
        max_running: 2,
        now_ms: 3,
    };
    state.apply(&start).expect("applied");
    assert_eq!(state.moves[&id].state, MoveState::Copying);
    state.apply(&done).expect("applied");
    assert_eq!(state.topics["t"].owners, vec![2, 1]);
    assert_eq!(state.moves[&id].state, MoveState::Done);
    // Ended: neither a second handover nor an abandon changes it.
    assert!(state.apply(&done).is_err());
    let abandon = Command::EndMove {
        id,
        end: MoveEnd::Abandoned {
            reason: "late".into(),
        },
        now_ms: 5,
    };
    assert!(state.apply(&abandon).is_err());
    assert_eq!(state.topics["t"].owners, vec![2, 1]);
}

#[test]
fn no_more_moves_run_than_allowed_and_an_abandoned_one_changes_no_owner() {
    let mut state = cluster(&[1, 2]);
    topic(&mut state, "t", &[1, 1, 1]);
    let plans = (0..3)
        .map(|partition| MovePlan {
            topic: "t".into(),
            partition,
            from: 1,
            to: 2,
        })
        .collect();
    let Ok(Applied::MovesPlanned(moves)) = state.apply(&Command::PlanMoves {
        moves: plans,
        decommission: None,
        now_ms: 2,
    }) else {
        panic!("plan refused")
    };
    let start = |id: &str| Command::StartMove {
        id: id.into(),
        max_running: 2,
        now_ms: 3,
    };
    state.apply(&start(&moves[0].id)).expect("applied");
    state.apply(&start(&moves[1].id)).expect("applied");
    assert_eq!(
        state.apply(&start(&moves[2].id)),
        Err(Refused::TooManyMoves { running: 2 })
    );
    state
        .apply(&Command::EndMove {
            id: moves[0].id.clone(),
            end: MoveEnd::Abandoned {
                reason: "destination restarted".into(),
            },
            now_ms: 4,
        })
        .expect("applied");
    assert_eq!(state.topics["t"].owners, vec![1, 1, 1]);
    state.apply(&start(&moves[2].id)).expect("applied");
    state
        .apply(&Command::EndMove {
            id: moves[2].id.clone(),
            end: MoveEnd::Promoted { offset: 7 },
            now_ms: 5,
        })
        .expect("applied");
    assert_eq!(state.topics["t"].owners, vec![1, 1, 2]);
    assert_eq!(state.moves[&moves[2].id].promoted_at_offset, Some(7));
}

#[test]
fn a_balanced_plan_evens_partitions_and_moves_as_few_as_it_can() {
    let mut state = cluster(&[1, 2, 3, 4]);
    topic(&mut state, "a", &[1, 2, 3, 1, 2, 3]);
    topic(&mut state, "b", &[1, 2, 3, 1, 2, 3]);
    let nodes = [1, 2, 3, 4];
    let plans = plan_balance(&state, &nodes, &[], 1000);
    // 12 partitions over 4 nodes: node 4 takes 3, one from each.
    assert_eq!(plans.len(), 3, "{plans:?}");
    assert!(plans.iter().all(|p| p.to == 4));
    carry_out(&mut state, plans);
    assert_eq!(counts(&state, &nodes), vec![3, 3, 3, 3]);
    // Balanced already: nothing to do.
    assert!(plan_balance(&state, &nodes, &[], 1000).is_empty());
    // Both topics spread over the new node.
    let on_four = |t: &str| state.topics[t].owners.iter().filter(|o| **o == 4).count();
    assert!(on_four("a") >= 1 && on_four("b") >= 1);
}

#[test]
fn a_drain_moves_every_partition_off_and_keeps_replica_pairs_apart() {
    let mut state = cluster(&[1, 2, 3]);
    topic(&mut state, "p", &[1, 2, 3]);
    state
        .apply(&Command::PutChild {
            parent: "p".into(),
            child: "r".into(),
            kind: ChildKind::Replica,
            config: config(3),
            new_owners: vec![2, 3, 1],
            now_ms: 1,
        })
        .expect("applied");
    let plans = plan_balance(&state, &[2, 3], &[1], 1000);
    assert_eq!(plans.len(), 2, "{plans:?}");
    carry_out(&mut state, plans);
    assert_eq!(state.partitions_of(1), 0);
    for partition in 0..3 {
        assert_ne!(
            state.topics["p"].owners[partition], state.topics["r"].owners[partition],
            "partition {partition} sits beside its replica"
        );
    }
}

#[test]
fn only_a_dead_or_decommissioned_node_that_owns_nothing_is_removed() {
    let mut state = cluster(&[1, 2]);
    topic(&mut state, "t", &[1, 2]);
    assert_eq!(
        state.apply(&Command::RemoveNode {
            id: 2,
            member: true
        }),
        Err(Refused::NodeOwnsPartitions {
            node: 2,
            partitions: 1
        })
    );
    let Ok(Applied::MovesPlanned(moves)) = state.apply(&Command::PlanMoves {
        moves: plan_balance(&state, &[1], &[2], 1000),
        decommission: Some(2),
        now_ms: 2,
    }) else {
        panic!("plan refused")
    };
    assert!(state.nodes[&2].decommissioning);
    assert!(matches!(
        state.apply(&Command::RemoveNode {
            id: 2,
            member: true
        }),
        Err(Refused::NodeOwnsPartitions { .. })
    ));
    for planned in moves {
        state
            .apply(&Command::StartMove {
                id: planned.id.clone(),
                max_running: 2,
                now_ms: 3,
            })
            .expect("applied");
        state
            .apply(&Command::EndMove {
                id: planned.id,
                end: MoveEnd::Done,
                now_ms: 4,
            })
            .expect("applied");
    }
    state
        .apply(&Command::RemoveNode {
            id: 2,
            member: true,
        })
        .expect("applied");
    assert!(!state.nodes.contains_key(&2));
    // The controller does not bring it back; admitting it again does.
    let alive = Command::SetNodeState {
        id: 2,
        addr: "n2:7000".into(),
        alive: true,
        now_ms: 5,
    };
    assert_eq!(state.apply(&alive), Ok(Applied::Nothing));
    state
        .apply(&Command::AdmitNode {
            id: 2,
            addr: "n2:7000".into(),
            now_ms: 6,
        })
        .expect("applied");
    assert!(state.nodes[&2].alive && !state.nodes[&2].decommissioning);
    // A member the controller has not judged is in service; a stranger is
    // not a member.
    assert_eq!(
        state.apply(&Command::RemoveNode {
            id: 7,
            member: true
        }),
        Err(Refused::NodeInService(7))
    );
    assert_eq!(
        state.apply(&Command::RemoveNode {
            id: 8,
            member: false
        }),
        Err(Refused::NoSuchNode(8))
    );
    // An alive node in service is not removed.
    assert_eq!(
        state.apply(&Command::RemoveNode {
            id: 1,
            member: true
        }),
        Err(Refused::NodeOwnsPartitions {
            node: 1,
            partitions: 2
        })
    );
}
