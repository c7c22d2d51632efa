import pytest
from graphlib2.graph import Graph, GraphError


def test_empty_graph():
    graph = Graph()
    assert graph.directed is False
    assert len(graph) == 0
    assert graph.nodes() == []
    assert graph.edges() == []
    assert graph.density() == 0.0


def test_add_edge_undirected_goes_both_ways():
    graph = Graph()
    graph.add_edge("a", "b")
    assert graph.has_edge("a", "b")
    assert graph.has_edge("b", "a")
    assert graph.weight("b", "a") == 1.0
    assert len(graph) == 2
    assert "a" in graph
    assert "z" not in graph


def test_add_edge_directed_one_way():
    graph = Graph(directed=True)
    graph.add_edge("a", "b", 2.5)
    assert graph.has_edge("a", "b")
    assert not graph.has_edge("b", "a")
    assert not graph.has_edge("z", "a")
    assert graph.weight("a", "b") == 2.5
    with pytest.raises(GraphError):
        graph.weight("b", "a")


def test_weights_must_not_be_negative():
    graph = Graph()
    with pytest.raises(GraphError):
        graph.add_edge("a", "b", -1)
    graph.add_edge("a", "b", 0)
    assert graph.weight("a", "b") == 0
    graph.add_edge("a", "b", 7)
    assert graph.weight("b", "a") == 7


def test_from_edges():
    graph = Graph.from_edges([("a", "b"), ("b", "c", 2.5)], directed=True)
    assert graph.directed is True
    assert graph.edges() == [("a", "b", 1.0), ("b", "c", 2.5)]
    undirected = Graph.from_edges([("x", "y", 3)])
    assert undirected.directed is False
    assert undirected.weight("y", "x") == 3


def test_nodes_keep_insertion_order():
    graph = Graph()
    graph.add_node("c")
    graph.add_edge("a", "c")
    graph.add_node("a")
    graph.add_edge("b", "a")
    assert graph.nodes() == ["c", "a", "b"]
    assert graph.neighbors("a") == ["c", "b"]
    with pytest.raises(GraphError):
        graph.neighbors("z")


def test_remove_edge():
    graph = Graph()
    graph.add_edge("a", "b")
    graph.add_edge("a", "a")
    graph.remove_edge("b", "a")
    assert not graph.has_edge("a", "b")
    assert not graph.has_edge("b", "a")
    graph.remove_edge("a", "a")
    assert graph.neighbors("a") == []
    with pytest.raises(GraphError):
        graph.remove_edge("a", "b")


def test_remove_edge_directed_keeps_reverse():
    graph = Graph(directed=True)
    graph.add_edge("a", "b")
    graph.add_edge("b", "a")
    graph.remove_edge("a", "b")
    assert graph.has_edge("b", "a")
    assert not graph.has_edge("a", "b")
    with pytest.raises(GraphError):
        graph.remove_edge("a", "b")


def test_remove_node_drops_incident_edges():
    graph = Graph(directed=True)
    graph.add_edge("a", "b")
    graph.add_edge("c", "b")
    graph.add_edge("b", "d")
    graph.remove_node("b")
    assert graph.nodes() == ["a", "c", "d"]
    assert graph.edges() == []
    with pytest.raises(GraphError):
        graph.remove_node("b")


def test_edges_undirected_listed_once():
    graph = Graph()
    graph.add_edge("a", "b")
    graph.add_edge("b", "c", 2)
    graph.add_edge("a", "c", 3)
    graph.add_edge("c", "c", 4)
    assert graph.edges() == [("a", "b", 1.0), ("a", "c", 3), ("b", "c", 2), ("c", "c", 4)]


def test_edges_directed_lists_all():
    graph = Graph(directed=True)
    graph.add_edge("a", "b")
    graph.add_edge("b", "a", 2)
    assert graph.edges() == [("a", "b", 1.0), ("b", "a", 2)]


def test_degree_and_self_loops():
    graph = Graph()
    graph.add_edge("a", "b")
    graph.add_edge("a", "c")
    graph.add_edge("c", "c")
    assert graph.degree("a") == 2
    assert graph.degree("b") == 1
    assert graph.degree("c") == 3
    directed = Graph(directed=True)
    directed.add_edge("x", "x")
    directed.add_edge("x", "y")
    assert directed.degree("x") == 2
    assert directed.degree("y") == 0


def test_in_degree():
    graph = Graph(directed=True)
    graph.add_edge("a", "c")
    graph.add_edge("b", "c")
    graph.add_edge("c", "a")
    assert graph.in_degree("c") == 2
    assert graph.in_degree("a") == 1
    assert graph.in_degree("b") == 0
    with pytest.raises(GraphError):
        graph.in_degree("z")


def test_reverse_directed():
    graph = Graph(directed=True)
    graph.add_node("lonely")
    graph.add_edge("a", "b", 5)
    graph.add_edge("b", "c")
    flipped = graph.reverse()
    assert flipped.directed is True
    assert flipped.nodes() == ["lonely", "a", "b", "c"]
    assert sorted(flipped.edges()) == [("b", "a", 5), ("c", "b", 1.0)]
    assert graph.has_edge("a", "b")


def test_reverse_undirected_keeps_edges():
    graph = Graph()
    graph.add_edge("a", "b", 2)
    flipped = graph.reverse()
    assert flipped.directed is False
    assert flipped.weight("a", "b") == 2
    assert flipped.weight("b", "a") == 2


def test_density():
    single = Graph()
    single.add_node("a")
    assert single.density() == 0.0
    pair = Graph()
    pair.add_edge("a", "b")
    assert pair.density() == 1.0
    directed_pair = Graph(directed=True)
    directed_pair.add_edge("a", "b")
    assert directed_pair.density() == 0.5
    graph = Graph()
    graph.add_edge("a", "b")
    graph.add_edge("c", "d")
    assert graph.density() == pytest.approx(2 / 6)
    directed = Graph(directed=True)
    for u, v in [("a", "b"), ("b", "c"), ("c", "a")]:
        directed.add_edge(u, v)
    assert directed.density() == 0.5
