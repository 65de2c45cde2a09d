"""Research studies: pretraining data (diversity, order, curriculum) and RL choices, with their analysis."""
