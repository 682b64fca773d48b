"""The draft trainer: packing hidden-state samples, the TTT training loop, FSDP2, checkpoints."""
