"""Unweighted traversals: BFS, DFS, hop distances and components."""

from __future__ import annotations

from collections import deque

from .graph import Graph, GraphError, Node


def _require(graph: Graph, node: Node) -> None:
    if node not in graph:
        raise GraphError(f"no node {node!r}")


def bfs_order(graph: Graph, start: Node) -> list[Node]:
    """Nodes reachable from ``start`` in breadth-first order."""
    _require(graph, start)
    order = [start]
    seen = {start}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for neighbor in graph.neighbors(node):
            if neighbor not in seen:
                seen.add(neighbor)
                order.append(neighbor)
                queue.append(neighbor)
    return order


def dfs_order(graph: Graph, start: Node) -> list[Node]:
    """Depth-first preorder from ``start``; neighbours are tried in insertion order."""
    _require(graph, start)
    order: list[Node] = []
    seen: set[Node] = set()
    stack = [start]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        order.append(node)
        neighbors = graph.neighbors(node)
        for index in range(len(neighbors) - 1, -1, -1):
            if neighbors[index] not in seen:
                stack.append(neighbors[index])
    return order


def bfs_distances(graph: Graph, start: Node, max_hops: int | None = None) -> dict[Node, int]:
    """Hop count from ``start`` to every node reachable within ``max_hops``."""
    _require(graph, start)
    distances = {start: 0}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        if max_hops is not None and distances[node] >= max_hops:
            continue
        for neighbor in graph.neighbors(node):
            if neighbor not in distances:
                distances[neighbor] = distances[node] + 1
                queue.append(neighbor)
    return distances


def shortest_hop_path(graph: Graph, start: Node, goal: Node) -> list[Node] | None:
    """A path with the fewest edges from ``start`` to ``goal``, or ``None``."""
    _require(graph, start)
    parents: dict[Node, Node | None] = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        if node == goal:
            break
        for neighbor in graph.neighbors(node):
            if neighbor not in parents:
                parents[neighbor] = node
                queue.append(neighbor)
    if goal not in parents:
        return None
    path = [goal]
    while path[-1] != start:
        path.append(parents[path[-1]])
    return path[::-1]


def connected_components(graph: Graph) -> list[list[Node]]:
    """Components (weak components if directed), nodes in insertion order."""
    position = {node: index for index, node in enumerate(graph.nodes())}
    links: dict[Node, list[Node]] = {node: [] for node in position}
    for u, v, _ in graph.edges():
        links[u].append(v)
        links[v].append(u)
    seen: set[Node] = set()
    components = []
    for node in position:
        if node in seen:
            continue
        seen.add(node)
        component = []
        stack = [node]
        while stack:
            current = stack.pop()
            component.append(current)
            for neighbor in links[current]:
                if neighbor not in seen:
                    seen.add(neighbor)
                    stack.append(neighbor)
        components.append(sorted(component, key=position.__getitem__))
    return components


def is_bipartite(graph: Graph) -> bool:
    """True when the nodes can be two-coloured with no edge inside a colour."""
    color: dict[Node, bool] = {}
    for root in graph.nodes():
        if root in color:
            continue
        color[root] = False
        queue = deque([root])
        while queue:
            node = queue.popleft()
            for neighbor in graph.neighbors(node):
                if neighbor not in color:
                    color[neighbor] = not color[node]
                    queue.append(neighbor)
                elif color[neighbor] == color[node]:
                    return False
    return True
