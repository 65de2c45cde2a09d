"""From a model to numbers: batched cached sampling (sampling.py) and its parse stop rule (stop.py),
greedy and sampled evaluation receipts (evaluate.py, from an EvalConfig in config.py), the ledger of
sealed-split openings (ledger.py), paired comparison of two receipts (compare.py) and the two-arm
headline questions at units and seeds (headline_stats.py)."""
