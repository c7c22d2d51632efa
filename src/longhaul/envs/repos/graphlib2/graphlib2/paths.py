"""Weighted shortest paths, orderings of DAGs, cycles and spanning trees."""

from __future__ import annotations

import heapq
from collections import deque

from .graph import Graph, GraphError, Node

WHITE, GREY, BLACK = 0, 1, 2


class CycleError(GraphError):
    """Raised by :func:`topological_sort`; ``nodes`` lists the nodes left on cycles."""

    def __init__(self, nodes: list[Node]) -> None:
        super().__init__(f"graph has a cycle among {nodes!r}")
        self.nodes = nodes


def dijkstra(graph: Graph, source: Node) -> tuple[dict[Node, float], dict[Node, Node | None]]:
    """Distances and predecessors from ``source``; the first shortest path found wins ties."""
    if source not in graph:
        raise GraphError(f"no node {source!r}")
    dist: dict[Node, float] = {source: 0}
    prev: dict[Node, Node | None] = {source: None}
    heap = [(0.0, 0, source)]
    counter = 1
    done: set[Node] = set()
    while heap:
        distance, _, node = heapq.heappop(heap)
        if node in done:
            continue
        done.add(node)
        for neighbor in graph.neighbors(node):
            candidate = distance + graph.weight(node, neighbor)
            if neighbor not in dist or candidate < dist[neighbor]:
                dist[neighbor] = candidate
                prev[neighbor] = node
                heapq.heappush(heap, (candidate, counter, neighbor))
                counter += 1
    return dist, prev


def shortest_path(graph: Graph, source: Node, target: Node) -> tuple[float, list[Node]]:
    """Total weight and node list of a cheapest path from ``source`` to ``target``."""
    dist, prev = dijkstra(graph, source)
    if target not in dist:
        raise GraphError(f"{target!r} is unreachable from {source!r}")
    path = [target]
    while path[-1] != source:
        path.append(prev[path[-1]])
    path.reverse()
    return dist[target], path


def topological_sort(graph: Graph) -> list[Node]:
    """Kahn's algorithm; among ready nodes the earliest inserted comes first."""
    if not graph.directed:
        raise GraphError("topological sort needs a directed graph")
    indegree = {node: graph.in_degree(node) for node in graph.nodes()}
    queue = deque(node for node in graph.nodes() if indegree[node] == 0)
    order = []
    while queue:
        node = queue.popleft()
        order.append(node)
        for neighbor in graph.neighbors(node):
            indegree[neighbor] -= 1
            if indegree[neighbor] == 0:
                queue.append(neighbor)
    if len(order) < len(graph):
        raise CycleError([node for node in graph.nodes() if indegree[node] > 0])
    return order


def find_cycle(graph: Graph) -> list[Node] | None:
    """A directed cycle as ``[a, b, ..., a]``, or ``None`` when the graph is acyclic."""
    if not graph.directed:
        raise GraphError("find_cycle needs a directed graph")
    color = {node: WHITE for node in graph.nodes()}
    for root in graph.nodes():
        if color[root] != WHITE:
            continue
        color[root] = GREY
        stack = [(root, iter(graph.neighbors(root)))]
        while stack:
            node, pending = stack[-1]
            for neighbor in pending:
                if color[neighbor] == GREY:
                    names = [entry[0] for entry in stack]
                    return names[names.index(neighbor) :] + [neighbor]
                if color[neighbor] == WHITE:
                    color[neighbor] = GREY
                    stack.append((neighbor, iter(graph.neighbors(neighbor))))
                    break
            else:
                color[node] = BLACK
                stack.pop()
    return None


def minimum_spanning_tree(graph: Graph) -> list[tuple[Node, Node, float]]:
    """Kruskal's algorithm; equal weights keep their edge order."""
    if graph.directed:
        raise GraphError("spanning trees need an undirected graph")
    parent = {node: node for node in graph.nodes()}

    def find(node: Node) -> Node:
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    tree = []
    for u, v, weight in sorted(graph.edges(), key=lambda edge: edge[2]):
        root_u, root_v = find(u), find(v)
        if root_u != root_v:
            parent[root_u] = root_v
            tree.append((u, v, weight))
    return tree


def longest_path_dag(graph: Graph) -> tuple[float, list[Node]]:
    """Heaviest path in a DAG as ``(weight, nodes)``; ties keep the earliest node."""
    order = topological_sort(graph)
    if not order:
        return 0, []
    best = {node: 0.0 for node in order}
    prev: dict[Node, Node | None] = {node: None for node in order}
    for node in order:
        for neighbor in graph.neighbors(node):
            candidate = best[node] + graph.weight(node, neighbor)
            if candidate > best[neighbor]:
                best[neighbor] = candidate
                prev[neighbor] = node
    end = max(order, key=best.__getitem__)
    path = [end]
    while prev[path[-1]] is not None:
        path.append(prev[path[-1]])
    return best[end], path[::-1]
