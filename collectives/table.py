"""The allreduce algorithms by name: the table that ``collectives.allreduce(..., algorithm=name)`` reads."""
from . import auto, butterfly, hierarchical, hierarchical_tree, naive, rabenseifner, ring, tree

ALGORITHMS = ("naive", "tree", "butterfly", "ring", "rabenseifner", "auto", "hierarchical", "hierarchical_tree")
MODULES = {"naive": naive, "tree": tree, "butterfly": butterfly, "ring": ring, "rabenseifner": rabenseifner,
           "auto": auto, "hierarchical": hierarchical, "hierarchical_tree": hierarchical_tree}
TWO_LEVEL = ("hierarchical", "hierarchical_tree")      # the algorithms that read the node size
# every algorithm's heart, `heart(comm, data, op, source=None)` (collectives.persistent, collectives.sim.simulate)
HEARTS = {**auto.HEARTS, "auto": auto.auto_allreduce_in_place,
          "hierarchical": hierarchical.hierarchical_allreduce_in_place,
          "hierarchical_tree": hierarchical_tree.hierarchical_tree_allreduce_in_place}


def algorithm_module(name):
    """The module of the named algorithm (one of ALGORITHMS); each has `allreduce` and a heart."""
    if name not in MODULES:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {ALGORITHMS}")
    return MODULES[name]
