"""The networks in plain torch, as the checkpoints hold them, with no fast paths (engine/fast swaps those in at
load)."""
