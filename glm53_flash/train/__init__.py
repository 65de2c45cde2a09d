"""Training loops (pretraining, RL) and the checkpoint format they share."""
