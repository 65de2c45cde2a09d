"""Text as the model sees it: the byte tokenizer (tokenizer.py) and the pretraining batches (batches.py:
BOS + text + EOS, padding, the shifted labels) drawn from a task suite's stream."""
