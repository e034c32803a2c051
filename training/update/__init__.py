"""The policy update: tree-aware advantages, the clipped loss, the learner, tree packing, optimisers and the
data-parallel update."""
