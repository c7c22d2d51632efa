import pytest
from graphlib2 import Graph, GraphError
from graphlib2.paths import (
    CycleError,
    dijkstra,
    find_cycle,
    longest_path_dag,
    minimum_spanning_tree,
    shortest_path,
    topological_sort,
)


def test_dijkstra_distances_and_predecessors():
    graph = Graph.from_edges(
        [("a", "b", 4), ("a", "c", 1), ("c", "b", 2), ("b", "d", 1), ("c", "d", 5), ("d", "e", 3)]
    )
    dist, prev = dijkstra(graph, "a")
    assert dist == {"a": 0, "b": 3, "c": 1, "d": 4, "e": 7}
    assert prev == {"a": None, "b": "c", "c": "a", "d": "b", "e": "d"}
    with pytest.raises(GraphError):
        dijkstra(graph, "z")


def test_shortest_path():
    graph = Graph.from_edges(
        [("a", "b", 4), ("a", "c", 1), ("c", "b", 2), ("b", "d", 1), ("c", "d", 5), ("d", "e", 3)]
    )
    assert shortest_path(graph, "a", "e") == (7, ["a", "c", "b", "d", "e"])
    assert shortest_path(graph, "e", "c") == (6, ["e", "d", "b", "c"])
    assert shortest_path(graph, "a", "a") == (0, ["a"])


def test_shortest_path_unreachable():
    graph = Graph.from_edges([("a", "b", 1), ("b", "c", 1)], directed=True)
    graph.add_node("z")
    with pytest.raises(GraphError):
        shortest_path(graph, "a", "z")
    with pytest.raises(GraphError):
        shortest_path(graph, "c", "a")
    assert shortest_path(graph, "a", "c") == (2, ["a", "b", "c"])


def test_shortest_path_ties_keep_first_discovered_route():
    graph = Graph.from_edges([("s", "y", 1), ("s", "x", 1), ("x", "t", 1), ("y", "t", 1)])
    assert shortest_path(graph, "s", "t") == (2, ["s", "y", "t"])


def test_dijkstra_prefers_cheaper_longer_route():
    graph = Graph.from_edges([("s", "t", 10), ("s", "m", 3), ("m", "n", 3), ("n", "t", 3)], directed=True)
    assert shortest_path(graph, "s", "t") == (9, ["s", "m", "n", "t"])
    graph.add_edge("s", "t", 9)
    assert shortest_path(graph, "s", "t") == (9, ["s", "t"])


def test_topological_sort():
    graph = Graph.from_edges([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")], directed=True)
    graph.add_node("e")
    assert topological_sort(graph) == ["a", "e", "b", "c", "d"]
    assert topological_sort(Graph(directed=True)) == []


def test_topological_sort_chain_inserted_backwards():
    graph = Graph(directed=True)
    graph.add_edge("c", "d")
    graph.add_edge("b", "c")
    graph.add_edge("a", "b")
    assert topological_sort(graph) == ["a", "b", "c", "d"]


def test_topological_sort_detects_cycle():
    graph = Graph.from_edges([("x", "a"), ("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")], directed=True)
    with pytest.raises(CycleError) as info:
        topological_sort(graph)
    assert info.value.nodes == ["a", "b", "c", "d"]
    assert isinstance(info.value, GraphError)


def test_topological_sort_requires_directed():
    with pytest.raises(GraphError):
        topological_sort(Graph.from_edges([("a", "b")]))


def test_find_cycle():
    graph = Graph.from_edges([("x", "a"), ("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")], directed=True)
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    loop = Graph.from_edges([("p", "q"), ("q", "q")], directed=True)
    assert find_cycle(loop) == ["q", "q"]


def test_find_cycle_in_later_component():
    graph = Graph.from_edges([("a", "b"), ("c", "d"), ("d", "c")], directed=True)
    assert find_cycle(graph) == ["c", "d", "c"]


def test_find_cycle_none_for_dags_with_cross_edges():
    graph = Graph.from_edges([("a", "b"), ("a", "c"), ("c", "b"), ("d", "b")], directed=True)
    assert find_cycle(graph) is None
    assert find_cycle(Graph(directed=True)) is None
    with pytest.raises(GraphError):
        find_cycle(Graph.from_edges([("a", "b")]))


def test_minimum_spanning_tree():
    graph = Graph.from_edges(
        [("a", "b", 4), ("a", "c", 1), ("c", "b", 2), ("b", "d", 1), ("c", "d", 5), ("d", "e", 3)]
    )
    tree = minimum_spanning_tree(graph)
    assert tree == [("a", "c", 1), ("b", "d", 1), ("b", "c", 2), ("d", "e", 3)]
    assert sum(edge[2] for edge in tree) == 7


def test_minimum_spanning_forest_and_errors():
    graph = Graph.from_edges([("a", "b", 2), ("c", "d", 1), ("b", "a", 2)])
    graph.add_node("e")
    assert minimum_spanning_tree(graph) == [("c", "d", 1), ("a", "b", 2)]
    assert minimum_spanning_tree(Graph()) == []
    with pytest.raises(GraphError):
        minimum_spanning_tree(Graph(directed=True))


def test_minimum_spanning_tree_long_chain_uses_union_find():
    edges = [(i, i + 1, 1) for i in range(6)] + [(0, 6, 2), (2, 5, 2)]
    tree = minimum_spanning_tree(Graph.from_edges(edges))
    assert tree == [(i, i + 1, 1) for i in range(6)]


def test_longest_path_dag():
    graph = Graph.from_edges(
        [("a", "b", 3), ("a", "c", 2), ("b", "d", 4), ("c", "d", 1), ("d", "e", 2), ("c", "e", 7)],
        directed=True,
    )
    assert longest_path_dag(graph) == (9, ["a", "c", "e"])
    graph.add_edge("e", "f", 0.5)
    assert longest_path_dag(graph) == (9.5, ["a", "c", "e", "f"])


def test_longest_path_dag_trivial_cases():
    assert longest_path_dag(Graph(directed=True)) == (0, [])
    single = Graph(directed=True)
    single.add_node("x")
    assert longest_path_dag(single) == (0.0, ["x"])
    with pytest.raises(CycleError):
        longest_path_dag(Graph.from_edges([("a", "b"), ("b", "a")], directed=True))
