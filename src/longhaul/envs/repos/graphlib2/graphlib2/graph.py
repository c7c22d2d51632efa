"""An adjacency-map graph with optional direction and edge weights."""

from __future__ import annotations

from collections.abc import Hashable, Iterable

Node = Hashable


class GraphError(Exception):
    """Raised for invalid graph operations."""


class Graph:
    """A simple graph; nodes and neighbours keep their insertion order."""

    def __init__(self, directed: bool = False) -> None:
        self.directed = directed
        self._adj: dict[Node, dict[Node, float]] = {}

    @classmethod
    def from_edges(cls, edges: Iterable[tuple], directed: bool = False) -> Graph:
        """Build a graph from ``(u, v)`` or ``(u, v, weight)`` tuples."""
        graph = cls(directed)
        for edge in edges:
            if len(edge) == 2:
                graph.add_edge(edge[0], edge[1])
            else:
                graph.add_edge(edge[0], edge[1], edge[2])
        return graph

    def __len__(self) -> int:
        return len(self._adj)

    def __contains__(self, node: object) -> bool:
        return node in self._adj

    def add_node(self, node: Node) -> None:
        self._adj.setdefault(node, {})

    def add_edge(self, u: Node, v: Node, weight: float = 1.0) -> None:
        """Add (or re-weight) the edge ``u -> v``; undirected graphs add both ways."""
        if weight < 0:
            raise GraphError("negative weights are not supported")
        self.add_node(u)
        self.add_node(v)
        self._adj[u][v] = weight
        if not self.directed:
            self._adj[v][u] = weight

    def has_edge(self, u: Node, v: Node) -> bool:
        return u in self._adj and v in self._adj[u]

    def weight(self, u: Node, v: Node) -> float:
        if not self.has_edge(u, v):
            raise GraphError(f"no edge {u!r} -> {v!r}")
        return self._adj[u][v]

    def remove_edge(self, u: Node, v: Node) -> None:
        if not self.has_edge(u, v):
            raise GraphError(f"no edge {u!r} -> {v!r}")
        del self._adj[u][v]
        if not self.directed and u != v:
            del self._adj[v][u]

    def remove_node(self, node: Node) -> None:
        """Delete ``node`` together with every edge that touches it."""
        if node not in self._adj:
            raise GraphError(f"no node {node!r}")
        del self._adj[node]
        for targets in self._adj.values():
            targets.pop(node, None)

    def nodes(self) -> list[Node]:
        return list(self._adj)

    def neighbors(self, node: Node) -> list[Node]:
        if node not in self._adj:
            raise GraphError(f"no node {node!r}")
        return list(self._adj[node])

    def edges(self) -> list[tuple[Node, Node, float]]:
        """All edges as ``(u, v, weight)``; undirected edges are listed once."""
        result = []
        seen: set[Node] = set()
        for u, targets in self._adj.items():
            for v, weight in targets.items():
                if self.directed or v not in seen:
                    result.append((u, v, weight))
            seen.add(u)
        return result

    def degree(self, node: Node) -> int:
        """Out-degree; in an undirected graph a self-loop counts twice."""
        targets = self._adj[node]
        loops = 1 if node in targets and not self.directed else 0
        return len(targets) + loops

    def in_degree(self, node: Node) -> int:
        if node not in self._adj:
            raise GraphError(f"no node {node!r}")
        return sum(1 for targets in self._adj.values() if node in targets)

    def reverse(self) -> Graph:
        """A copy with every directed edge flipped (undirected graphs are copied)."""
        result = Graph(self.directed)
        for node in self._adj:
            result.add_node(node)
        for u, v, weight in self.edges():
            result.add_edge(v, u, weight)
        return result

    def density(self) -> float:
        """Edges present divided by the edges possible without self-loops."""
        n = len(self._adj)
        if n < 2:
            return 0.0
        possible = n * (n - 1)
        if not self.directed:
            possible //= 2
        return len(self.edges()) / possible
