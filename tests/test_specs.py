

def test_with_nodes_after_topology_was_built_gets_a_fresh_topology():
    """Regression: model_copy used to carry the cached topology of the old node count."""
    from paraplan import load_cluster

    small = load_cluster("dgx-a100-80gb", nodes=2)
    assert small.topology.num_gpus == 16
    big = small.with_nodes(4)
    assert big.topology.num_gpus == 32
    assert small.topology.num_gpus == 16
