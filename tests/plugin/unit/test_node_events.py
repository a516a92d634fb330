"""Which problems become an Event post when: new ones at once, lasting ones every REPEAT
seconds, at most BURST a minute, none lost while the API refuses them."""

from __future__ import annotations

from plugin.core.kube.node_events import BURST, REPEAT, Ledger, Post
from plugin.core.node.problems import HCA_UNHEALTHY, POOL_EMPTY, NodeProblem

A = NodeProblem(POOL_EMPTY, "rdma/hca: no HCA matches its selector")
B = NodeProblem(HCA_UNHEALTHY, "rdma/hca: mlx5_1 port 1 DOWN: left out of allocations")


def test_a_new_problem_is_posted_once_then_its_count_raised_after_repeat() -> None:
    ledger = Ledger()

    first = ledger.due([A], 0.0)
    ledger.named(A, "node1.abc")
    meanwhile = [ledger.due([A], t) for t in (5.0, 60.0, REPEAT - 1)]
    later = ledger.due([A], REPEAT)

    assert first == [Post(A, "", 1)]
    assert meanwhile == [[], [], []]
    assert later == [Post(A, "node1.abc", 2)]


def test_a_problem_gone_and_back_is_a_new_event() -> None:
    ledger = Ledger()
    ledger.due([A, B], 0.0)
    ledger.named(A, "node1.abc")

    ledger.due([B], 10.0)  # A is fixed
    back = ledger.due([A, B], 20.0)

    assert back == [Post(A, "", 1)]


def test_a_post_that_failed_is_tried_again_at_the_next_scan() -> None:
    ledger = Ledger()
    ledger.due([A], 0.0)

    ledger.failed(A)  # the API server refused it, or was away

    assert ledger.due([A], 5.0) == [Post(A, "", 1)]


def test_at_most_burst_posts_a_minute_and_the_rest_later() -> None:
    problems = [NodeProblem(HCA_UNHEALTHY, f"mlx5_{i} port 1 DOWN") for i in range(BURST + 5)]
    ledger = Ledger()

    first = ledger.due(problems, 0.0)
    within = ledger.due(problems, 30.0)
    after = ledger.due(problems, 61.0)

    assert [p.problem for p in first] == problems[:BURST]
    assert within == []
    assert [p.problem for p in after] == problems[BURST:]
