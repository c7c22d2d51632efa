import pytest
from graphlib2 import Graph, GraphError
from graphlib2.traversal import (
    bfs_distances,
    bfs_order,
    connected_components,
    dfs_order,
    is_bipartite,
    shortest_hop_path,
)


def test_bfs_order():
    graph = Graph.from_edges([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"), ("d", "e")])
    graph.add_node("f")
    assert bfs_order(graph, "a") == ["a", "b", "c", "d", "e"]
    assert bfs_order(graph, "e") == ["e", "d", "b", "c", "a"]
    assert bfs_order(graph, "f") == ["f"]
    with pytest.raises(GraphError):
        bfs_order(graph, "z")


def test_dfs_order():
    graph = Graph.from_edges([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"), ("d", "e")])
    graph.add_node("f")
    assert dfs_order(graph, "a") == ["a", "b", "d", "c", "e"]
    assert dfs_order(graph, "c") == ["c", "a", "b", "d", "e"]
    assert dfs_order(graph, "f") == ["f"]
    with pytest.raises(GraphError):
        dfs_order(graph, "z")


def test_dfs_order_directed_tree():
    graph = Graph.from_edges(
        [("r", "x"), ("r", "y"), ("r", "z"), ("x", "x1"), ("y", "y1")], directed=True
    )
    assert dfs_order(graph, "r") == ["r", "x", "x1", "y", "y1", "z"]
    assert dfs_order(graph, "y") == ["y", "y1"]


def test_bfs_distances():
    graph = Graph.from_edges([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"), ("d", "e")])
    graph.add_node("f")
    assert bfs_distances(graph, "a") == {"a": 0, "b": 1, "c": 1, "d": 2, "e": 3}
    with pytest.raises(GraphError):
        bfs_distances(graph, "z")


def test_bfs_distances_max_hops():
    graph = Graph.from_edges([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"), ("d", "e")])
    assert bfs_distances(graph, "a", 2) == {"a": 0, "b": 1, "c": 1, "d": 2}
    assert bfs_distances(graph, "a", max_hops=1) == {"a": 0, "b": 1, "c": 1}
    assert bfs_distances(graph, "a", 0) == {"a": 0}


def test_shortest_hop_path():
    graph = Graph.from_edges([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"), ("d", "e")])
    graph.add_node("f")
    assert shortest_hop_path(graph, "a", "e") == ["a", "b", "d", "e"]
    assert shortest_hop_path(graph, "e", "a") == ["e", "d", "b", "a"]
    assert shortest_hop_path(graph, "a", "a") == ["a"]
    assert shortest_hop_path(graph, "a", "f") is None
    with pytest.raises(GraphError):
        shortest_hop_path(graph, "z", "a")


def test_shortest_hop_path_directed():
    graph = Graph.from_edges([("x", "y"), ("y", "z"), ("x", "z")], directed=True)
    assert shortest_hop_path(graph, "x", "z") == ["x", "z"]
    assert shortest_hop_path(graph, "z", "x") is None
    assert shortest_hop_path(graph, "x", "missing") is None


def test_connected_components():
    graph = Graph.from_edges([("a", "b"), ("c", "d"), ("e", "a"), ("d", "f")])
    graph.add_node("g")
    assert connected_components(graph) == [["a", "b", "e"], ["c", "d", "f"], ["g"]]
    assert connected_components(Graph()) == []


def test_connected_components_keep_insertion_order():
    graph = Graph.from_edges([("a", "d"), ("a", "b"), ("d", "c"), ("b", "c")])
    assert connected_components(graph) == [["a", "d", "b", "c"]]


def test_weak_components_of_directed_graph():
    graph = Graph.from_edges([("x", "y"), ("z", "y"), ("w", "v")], directed=True)
    graph.add_node("u")
    assert connected_components(graph) == [["x", "y", "z"], ["w", "v"], ["u"]]


def test_is_bipartite():
    square = Graph.from_edges([("a", "b"), ("b", "c"), ("c", "d"), ("d", "a")])
    assert is_bipartite(square) is True
    triangle = Graph.from_edges([("a", "b"), ("b", "c"), ("c", "a")])
    assert is_bipartite(triangle) is False
    assert is_bipartite(Graph()) is True


def test_is_bipartite_checks_every_component():
    graph = Graph.from_edges([("a", "b"), ("c", "d"), ("d", "e"), ("e", "c")])
    assert is_bipartite(graph) is False
    forest = Graph.from_edges([("a", "b"), ("c", "d"), ("d", "e")])
    forest.add_node("f")
    assert is_bipartite(forest) is True
