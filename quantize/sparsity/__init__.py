"""2:4 structured sparsity: masks, calibrated and sequential pruning, channel permutation, fine-tuning with
the masks kept, QAT after pruning, the speed table that says where it pays, and the `sparsify` pipeline."""
