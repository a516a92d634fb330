"""Each problem the core finds, as a Warning Event on its Node (`kubectl describe node`, and any
event exporter): posted when it appears, its count raised when it is still there REPEAT seconds
later, at most BURST posts a minute. The Events go where the kubelet posts a Node's, the
`default` namespace. Without API access (no token, RBAC refusing, the API server away) the
problems are in the log only, said once; posting resumes when the API answers again."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from common.secret import masked
from plugin.core.kube.kubeapi import KubeApi, KubeApiError, in_background
from plugin.core.node.problems import NodeProblem
from plugin.launch import EVENT_NAMESPACE

logger = logging.getLogger(__name__)

EVENTS = f"/api/v1/namespaces/{EVENT_NAMESPACE}/events"
# A problem still there after this long has its Event's count raised (the kubelet's own
# aggregation keeps a similar pace); one gone and back is a new Event.
REPEAT = 600.0
# Posts a minute at most, whatever a flapping node finds.
BURST = 10


@dataclass
class _Posted:
    name: str  # the Event's, "" until the API server named it
    count: int
    at: float


@dataclass(frozen=True)
class Post:
    """One call to make: a new Event (`name` ""), or a count raised on the named one."""

    problem: NodeProblem
    name: str
    count: int


class Ledger:
    """Which problems need a post now: pure, given the time."""

    def __init__(self) -> None:
        self._posted: dict[NodeProblem, _Posted] = {}
        self._recent: list[float] = []

    def due(self, problems: Sequence[NodeProblem], now: float) -> list[Post]:
        for gone in set(self._posted) - set(problems):
            del self._posted[gone]
        self._recent = [t for t in self._recent if now - t < 60.0]
        posts: list[Post] = []
        for problem in dict.fromkeys(problems):
            seen = self._posted.get(problem)
            if seen is not None and (now - seen.at < REPEAT or not seen.name):
                continue
            if len(self._recent) >= BURST:
                break  # the rest waits for a later scan
            self._recent.append(now)
            count = 1 if seen is None else seen.count + 1
            self._posted[problem] = _Posted(seen.name if seen else "", count, now)
            posts.append(Post(problem, seen.name if seen else "", count))
        return posts

    def named(self, problem: NodeProblem, name: str) -> None:
        """The API server's name for the problem's Event, to raise its count later."""
        if (seen := self._posted.get(problem)) is not None:
            seen.name = name

    def failed(self, problem: NodeProblem) -> None:
        """Not posted: tried again at the next scan."""
        self._posted.pop(problem, None)


class NodeEvents:
    def __init__(
        self,
        api: KubeApi | None,
        node: str,
        component: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api if node else None  # an Event is about a Node: without its name, none
        self.node = node
        self.component = component
        self.clock = clock
        self.ledger = Ledger()
        self._unposted = False  # said once until a post succeeds again
        self._tasks: set[asyncio.Task[None]] = set()
        if api is None:
            logger.info("no API access: the node's problems are in this log only, not Events")
        elif not node:
            logger.warning(
                "no Events: they are about this node, whose name is not given (--node-name or "
                "$NODE_NAME): the node's problems are in this log only"
            )

    def report(self, problems: Sequence[NodeProblem]) -> None:
        """On the event loop, at every scan: post what is due. Only the calls run in a thread;
        the ledger and what was said are the loop's alone."""
        if self.api is None:
            return
        for post in self.ledger.due(problems, self.clock()):
            task = asyncio.get_running_loop().create_task(self._send(post))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, post: Post) -> None:
        try:
            name = await in_background(lambda: self._call(post))
        except KubeApiError as exc:
            self.ledger.failed(post.problem)
            if not self._unposted:
                self._unposted = True
                (logger.debug if exc.said else logger.warning)(
                    "cannot post Events on node %s (%s): the node's problems are in this log",
                    self.node,
                    exc,
                )
            return
        if name:
            self.ledger.named(post.problem, name)
        if self._unposted:
            self._unposted = False
            logger.info("posting Events on node %s again", self.node)

    def _call(self, post: Post) -> str:
        """The API call (blocking, in a thread); the new Event's name ("" for a count raised)."""
        assert self.api is not None
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if post.name:
            self.api.call(
                "PATCH",
                f"{EVENTS}/{post.name}",
                {"count": post.count, "lastTimestamp": now},
                content_type="application/merge-patch+json",
            )
            return ""
        made = self.api.call(
            "POST", EVENTS, self._event(post.problem, masked(post.problem.message), now)
        )
        try:
            return str(made["metadata"]["name"])
        except (KeyError, TypeError):
            raise KubeApiError(f"POST {EVENTS}: the answer has no metadata.name") from None

    def _event(self, problem: NodeProblem, message: str, now: str) -> dict[str, object]:
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{self.node}.", "namespace": EVENT_NAMESPACE},
            # as the kubelet refers to its Node (the name as the UID)
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Node",
                "name": self.node,
                "uid": self.node,
            },
            "reason": problem.reason,
            "message": message,
            "type": "Warning",
            "source": {"component": self.component, "host": self.node},
            "reportingComponent": self.component,
            "reportingInstance": self.node,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
