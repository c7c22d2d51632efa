"""graphlib2: a small graph library with traversals and path algorithms."""

from .graph import Graph, GraphError
from .paths import (
    CycleError,
    dijkstra,
    find_cycle,
    longest_path_dag,
    minimum_spanning_tree,
    shortest_path,
    topological_sort,
)
from .traversal import (
    bfs_distances,
    bfs_order,
    connected_components,
    dfs_order,
    is_bipartite,
    shortest_hop_path,
)

__all__ = [
    "CycleError",
    "Graph",
    "GraphError",
    "bfs_distances",
    "bfs_order",
    "connected_components",
    "dfs_order",
    "dijkstra",
    "find_cycle",
    "is_bipartite",
    "longest_path_dag",
    "minimum_spanning_tree",
    "shortest_hop_path",
    "shortest_path",
    "topological_sort",
]
