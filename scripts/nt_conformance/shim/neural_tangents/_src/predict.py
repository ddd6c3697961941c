"""``neural_tangents._src.predict``: the one private helper predict_test.py imports at its top."""

import jax


def _is_on_cpu(tree) -> bool:
    """Whether every array leaf of ``tree`` lives on a CPU device (NumPy arrays count as on the CPU)."""

    def on_cpu(leaf) -> bool:
        if isinstance(leaf, jax.Array):
            return all(d.platform == "cpu" for d in leaf.devices())
        if hasattr(leaf, "__array__"):
            return True
        raise NotImplementedError(f"_is_on_cpu: unsupported leaf type {type(leaf).__name__}")

    return all(on_cpu(leaf) for leaf in jax.tree_util.tree_leaves(tree))
