"""What the studies measure with: benchmarks and statistics, training of models, heads and adapters,
the training and evaluation data, the workloads and Spec-Bench, and side-by-side peers."""
