"""The scipy min-cut solver against the networkx reference: same cut value, valid cut sides."""

from __future__ import annotations

import math

import numpy as np
import pytest
from aot_partition.core.mincut import FlowNetwork, get_solver, networkx_min_cut
from aot_partition.core.mincut_scipy import FINITE_CAPACITY_TOTAL, scipy_min_cut


def random_network(seed: int, num_nodes: int = 12, num_edges: int = 40,
                   infinite_fraction: float = 0.15) -> FlowNetwork:
    rng = np.random.default_rng(seed)
    tails = rng.integers(0, num_nodes, num_edges)
    heads = rng.integers(0, num_nodes, num_edges)
    # Spread capacities over six orders of magnitude, like byte sizes of activations.
    caps = np.exp(rng.uniform(0, 14, num_edges)).round()
    caps[rng.random(num_edges) < infinite_fraction] = math.inf
    return FlowNetwork(num_nodes, 0, num_nodes - 1, tails.astype(np.int64),
                       heads.astype(np.int64), caps, [f"v{i}" for i in range(num_nodes)])


def cut_value(network: FlowNetwork, side: np.ndarray) -> float:
    crossing = side[network.tails] & ~side[network.heads]
    return float(network.capacities[crossing].sum())


def quantization_slack(network: FlowNetwork) -> float:
    finite = network.capacities[np.isfinite(network.capacities)]
    # Each cut edge is off by at most half a quantum (or one quantum when rounded up from 0).
    return 2 * network.num_edges * finite.sum() / FINITE_CAPACITY_TOTAL


@pytest.mark.parametrize("seed", range(60))
def test_scipy_matches_networkx_on_random_networks(seed):
    network = random_network(seed, num_nodes=6 + seed % 20, num_edges=10 + 3 * seed)
    reference = networkx_min_cut(network)
    got = scipy_min_cut(network)
    assert got.source_side[network.source] and not got.source_side[network.sink]
    if math.isinf(reference.value):
        assert math.isinf(got.value)
        return
    assert got.value == pytest.approx(cut_value(network, got.source_side))
    assert got.value == pytest.approx(reference.value, abs=quantization_slack(network))
    finite = network.capacities[np.isfinite(network.capacities)]
    if finite.sum() <= FINITE_CAPACITY_TOTAL:  # whole numbers that fit: exact, networkx's cut
        assert got.value == reference.value
        assert got.source_side.tolist() == reference.source_side.tolist()


def test_tied_cuts_give_networkx_s_largest_source_side():
    # s -> a -> t, both edges 1: cutting either costs 1. networkx (torch's solver) puts a on
    # the source side (the backward reads the value nearest to it); so must scipy.
    network = FlowNetwork(3, 0, 2, np.array([0, 1]), np.array([1, 2]), np.array([1.0, 1.0]),
                          ["s", "a", "t"])
    assert networkx_min_cut(network).source_side.tolist() == [True, True, False]
    assert scipy_min_cut(network).source_side.tolist() == [True, True, False]


def test_without_a_tie_the_cheaper_edge_is_cut():
    # The opposite case: no tie, so the side follows the capacities, not the tie-break.
    network = FlowNetwork(3, 0, 2, np.array([0, 1]), np.array([1, 2]), np.array([1.0, 5.0]),
                          ["s", "a", "t"])
    cut = scipy_min_cut(network)
    assert cut.source_side.tolist() == [True, False, False] and cut.value == 1.0


def test_scipy_is_registered_under_its_flag_name():
    assert get_solver("scipy") is scipy_min_cut


def test_infinite_path_gives_infinite_cut():
    inf = math.inf
    network = FlowNetwork(4, 0, 3, np.array([0, 1, 2, 0]), np.array([1, 2, 3, 3]),
                          np.array([inf, inf, inf, 5.0]), ["s", "a", "b", "t"])
    cut = scipy_min_cut(network)
    assert math.isinf(cut.value)
    assert cut.source_side[:3].all()


def test_tiny_capacities_are_not_free_to_cut():
    # One edge is 1e-12 of the total: rounded naively it would cost 0 and be cut for free.
    network = FlowNetwork(4, 0, 3, np.array([0, 0, 1, 2]), np.array([1, 2, 3, 3]),
                          np.array([1e12, 1e12, 1.0, 2.0]), ["s", "a", "b", "t"])
    cut = scipy_min_cut(network)
    assert cut.value == 3.0
    assert cut.source_side.tolist() == [True, True, True, False]


def test_self_loops_and_parallel_edges():
    network = FlowNetwork(3, 0, 2, np.array([0, 0, 1, 1]), np.array([1, 1, 1, 2]),
                          np.array([2.0, 3.0, 7.0, 10.0]), ["s", "a", "t"])
    assert scipy_min_cut(network).value == 5.0
    assert networkx_min_cut(network).value == 5.0


def test_bad_networks_are_rejected_by_name():
    network = FlowNetwork(2, 0, 1, np.array([0]), np.array([1]), np.array([-1.0]), ["s", "t"])
    with pytest.raises(ValueError, match="capacities must be >= 0"):
        scipy_min_cut(network)
    same = FlowNetwork(2, 0, 0, np.array([0]), np.array([1]), np.array([1.0]), ["s", "t"])
    with pytest.raises(ValueError, match="source and sink are the same node"):
        scipy_min_cut(same)
