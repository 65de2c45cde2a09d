"""The generated blocks of docs/STUDIES.md, docs/VERIFIER.md and docs/GLM_MAPPING.md that come from committed
receipts or from the code's own constants (the studies' answers are rendered by experiments/analysis.py):
the units of the compositions suite, the pretraining budgets, the studies' times, the headline's and the
vision study's answers, the verifier's settings and speed, the cheat suite, and the GLM mapping table.
commands/docs.py `blocks` names them for `glm53 docs build` and `glm53 docs check`.
"""

from __future__ import annotations

import json
from pathlib import Path

from glm53_flash.report.tables import markdown_table


def _read(root: Path, relative: str):
    path = Path(root) / relative
    return json.loads(path.read_text()) if path.is_file() else None


def _missing(relative: str, command: str) -> str:
    return f"`{relative}` has not been committed yet (`{command}`)."


def _table(table: dict) -> str:
    return "\n".join(markdown_table(table["columns"], table["rows"]))


def _percent(value: float) -> str:
    return f"{100 * value:.1f}%"


# --------------------------------------------------------------------------- docs/STUDIES.md


def render_compositions_splits(root: Path) -> str:
    """Each split of the compositions suite: behaviours, structure groups (the unit) and what a paired
    comparison over its groups can detect (results/tasks/compositions.json)."""
    summary = _read(root, "results/tasks/compositions.json")
    if summary is None:
        return _missing("results/tasks/compositions.json", "glm53 tasks summary --suite compositions")
    rows = []
    for name, split in summary["splits"].items():
        power = split.get("power")
        detects = "-" if power is None else (f"{100 * power['mdd_at_sd_0.3']:.1f} / {100 * power['mdd_at_sd_0.5']:.1f} "
                                            f"points ({round(100 * power['power'])}% power, alpha {power['alpha']})")
        rows.append([f"`{name}`", "sealed" if split["sealed"] else "open", f"{split['behaviours']:,}",
                     f"{split['structure_groups']:,}", detects])
    return _table({"columns": ["split", "access", "behaviours", "structure groups (the unit)",
                               "a paired comparison over groups detects (group sd 0.3 / 0.5)"], "rows": rows})


def render_budget(root: Path, name: str) -> str:
    """A pretraining budget chosen on dev (results/NAME/summary.json): the rule, the step it chose, and every
    checkpoint's dev pass rate."""
    summary = _read(root, f"results/{name}/summary.json")
    if summary is None:
        return _missing(f"results/{name}/summary.json", "glm53 tasks budget")
    budget = summary["budget"]
    kinds = ", ".join(f"{kind} {_percent(rate)}" for kind, rate in budget["by_kind"].items())
    return "\n".join([f"The rule, {budget['rule']}, chose step {budget['step']:,} ({budget['tokens_seen'] / 1e6:.2f}M "
                      f"tokens): dev pass@1 {_percent(budget['pass_at_1'])} ({kinds}).", "",
                      _table(summary["headline_table"])])


def render_study_model(root: Path) -> str:
    """The `study` preset the compositions studies train, from its config and its parameter count."""
    import torch

    from glm53_flash.model.config import ModelConfig
    from glm53_flash.model.lm import GLM53Flash

    cfg = ModelConfig.preset("study")
    with torch.device("meta"):
        counts = GLM53Flash(cfg).parameter_counts()
    rhythm = ", ".join(cfg.attention_pattern)
    return (f"The `study` preset: {counts['total']:,} parameters ({counts['active']:,} active per token), {cfg.layers} "
            f"layers ({rhythm}), width {cfg.dim}, {cfg.experts} routed experts (top {cfg.top_k}), {cfg.streams} "
            "residual streams.")


def render_study_times(root: Path) -> str:
    """Each committed study's stated time beside the time its runs took (results/study-times.json)."""
    table = _read(root, "results/study-times.json")
    return _missing("results/study-times.json", "glm53 docs times") if table is None else _table(table["headline_table"])


def render_headline_answer(root: Path) -> str:
    """The headline distribution's statements after its Holm correction, and its report."""
    from glm53_flash.report.distribution import statements

    summary = _read(root, "results/headline-distribution/distribution.json")
    if summary is None:
        return _missing("results/headline-distribution/distribution.json", "glm53 reproduce --distribution")
    return "\n".join(["**headline-distribution** ([report](../results/headline-distribution/REPORT.md)):", "",
                      *[f"- {line}" for line in statements(summary)]])


def render_vision_answer(root: Path) -> str:
    """The vision study's answer: its seed-level test and its effect size (results/vision/summary.json)."""
    summary = _read(root, "results/vision/summary.json")
    if summary is None:
        return _missing("results/vision/summary.json", "glm53 vision train --architecture both")
    return f"**vision** ([report](../results/vision/REPORT.md)): " + " ".join(summary["answers"][:2])


# --------------------------------------------------------------------------- docs/VERIFIER.md


def _bytes(count: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= size:
            return f"{count / size:g} {unit}"
    return f"{count} bytes"


def render_verifier_settings(root: Path) -> str:
    """The verifier's settings and limits, from the constants the code uses."""
    from glm53_flash.verifier import confinement, evaluation, policy, sandbox, worker

    limits, bounds = sandbox.SandboxLimits(), sandbox.LIMIT_BOUNDS
    rows = [
        ["a program's size", f"at most {policy.MAX_SOURCE_BYTES:,} UTF-8 bytes (`glm53 verify` reads "
                             f"{policy.MAX_SOURCE_BYTES + 1:,} bytes of a file)", "`policy.MAX_SOURCE_BYTES`"],
        ["the builtins a program may call", ", ".join(f"`{name}`" for name in sorted(policy.SAFE_CALL_NAMES)),
         "`policy.SAFE_CALL_NAMES`"],
        ["default limits per candidate", f"CPU {limits.cpu_seconds:g} s, wall clock {limits.wall_seconds:g} s, address "
                                         f"space {_bytes(limits.memory_bytes)}, output {_bytes(limits.output_bytes)}",
         "`sandbox.SandboxLimits`"],
        ["the limits allowed", f"CPU {bounds['cpu_seconds'][0]:g}-{bounds['cpu_seconds'][1]:g} s, wall "
                               f"{bounds['wall_seconds'][0]:g}-{bounds['wall_seconds'][1]:,g} s, memory "
                               f"{_bytes(bounds['memory_bytes'][0])}-{_bytes(bounds['memory_bytes'][1])}, output "
                               f"{_bytes(bounds['output_bytes'][0])}-{_bytes(bounds['output_bytes'][1])}",
         "`sandbox.LIMIT_BOUNDS`"],
        ["workers", f"1 to {sandbox.MAX_WORKERS}; the default, one per CPU, lowered to what fits in `MemAvailable`",
         "`sandbox.MAX_WORKERS`"],
        ["a verdict's message", f"clipped to {evaluation.MESSAGE_CHARS} characters", "`evaluation.MESSAGE_CHARS`"],
        ["an encoded value", f"an argument up to {worker.VALUE_BUDGET:,} characters, an expected value up to "
                             f"{worker.VALUE_BUDGET // 2:,}", "`worker.VALUE_BUDGET`"],
        ["queued signals (`RLIMIT_SIGPENDING`, soft = hard)", f"{worker.SIGPENDING_LIMIT}", "`worker.SIGPENDING_LIMIT`"],
        ["the uid a root start drops to", f"{confinement.NOBODY}", "`confinement.NOBODY`"],
        ["the newest syscall number reviewed", f"{confinement.NEWEST_REVIEWED} (any above fails with ENOSYS)",
         "`confinement.NEWEST_REVIEWED`"],
    ]
    return _table({"columns": ["setting", "value", "in the code"], "rows": rows})


VERIFY_RECEIPTS = ("results/bench/verify.json", "results/bench/verify-run2.json")


def render_verifier_speed(root: Path) -> str:
    """`glm53 bench verify`'s committed receipts: honest candidates per second in the sandbox, against the unsafe
    in-process evaluator, and whether any verdict differed."""
    rows = []
    for relative in VERIFY_RECEIPTS:
        receipt = _read(root, relative)
        if receipt is None:
            continue
        rows.append([f"`{relative}`", f"{receipt['workers']}",
                     receipt["isolation"]["level"], f"{receipt['isolated']['candidates']:,}",
                     f"{receipt['isolated']['candidates_per_second']:,.0f}",
                     f"{receipt['ratio_isolated_to_in_process']:.3f}", f"{receipt['status_mismatches_vs_in_process']}"])
    if not rows:
        return _missing(VERIFY_RECEIPTS[0], "glm53 bench verify")
    return _table({"columns": ["receipt", "workers", "isolation", "candidates", "candidates/s",
                               "of the in-process rate", "verdicts that differ"], "rows": rows})


def render_cheat_suite(root: Path) -> str:
    """The sizes the cheat suite and the strict set use (the code's constants) and the share of tasks each case set
    lets a kind of wrong program through on (results/tasks/cheats.json)."""
    from glm53_flash.tasks import cheats, strict
    from glm53_flash.tasks.grammar import INT, STR

    receipt = _read(root, "results/tasks/cheats.json")
    if receipt is None:
        return _missing("results/tasks/cheats.json", "glm53 tasks cheats")
    small = cheats.SIZE_LIMITS
    sizes = (f"Small-input cheats are right up to {small[STR][0]}-{small[STR][-1]} characters or items, or |x| up to "
             f"10^{len(str(small[INT][0])) - 1} to 10^{len(str(small[INT][-1])) - 1} (`cheats.SIZE_LIMITS`); the strict pool's long inputs reach "
             f"{strict.TEXT_BANDS[-1][1] - 1} characters, {strict.LIST_BANDS[-1][1] - 1} list values and ints of "
             f"{strict.INT_BANDS[-1][1] - 1} digits (`strict.TEXT_BANDS`, `LIST_BANDS`, `INT_BANDS`). A strict set may let "
             f"each kind through on at most {100 * cheats.BOUND:g}% of a split's tasks (`cheats.BOUND`, tested).")
    return "\n".join([sizes, "", _table(receipt["table"])])


# --------------------------------------------------------------------------- docs/GLM_MAPPING.md

# What the released GLM-5.3-Flash has where report/slides.py RELEASED does not say it (the released config.json
# and the Hugging Face Transformers `glm5_next` code, as recorded in the team's reference notes).
PUBLISHED = {
    "linear attention": "Kimi Delta Attention: 64 heads x 128, short conv 4, bounded per-channel gate, delta rule",
    "sparse attention": "DeepSeek Sparse Attention: MLA latents, a lightning indexer choosing top-2048 keys in pools of 4",
    "mixture of experts": "width 2048, sigmoid router with a selection-only bias (aux-loss free), routed scale 2.5, "
                          "clamped SwiGLU",
    "residual streams": "post weights, 20 Sinkhorn iterations, unweighted mean at the end",
    "training data": "30T-token multimodal corpus",
    "vision": "~564M-parameter vision tower, image placeholder tokens",
}


def _released_total(text: str) -> float:
    return float(text.rstrip("B")) * 1e9


def render_glm_mapping(root: Path) -> str:
    """Each part of the released model beside this miniature's, with the module, our value (from ModelConfig and
    the parameter count) and the reason for each deviation."""
    import torch

    from glm53_flash.model.config import ModelConfig
    from glm53_flash.model.lm import GLM53Flash
    from glm53_flash.data.tokenizer import ByteTokenizer
    from glm53_flash.report.slides import RELEASED
    from glm53_flash.tasks.families import FAMILIES

    cfg = ModelConfig()
    with torch.device("meta"):
        counts = GLM53Flash(cfg).parameter_counts()
    pattern = cfg.attention_pattern
    sparse = [i for i, kind in enumerate(pattern) if kind == "sparse"]
    scale = _released_total(RELEASED["total_parameters"]) / counts["total"]
    example = "def increment(x):"
    rows = [
        ["size", f"{RELEASED['total_parameters']} total, {RELEASED['active_parameters']} active",
         "`model/config.py` (`flash`), `model/lm.py` `parameter_counts()`",
         f"{counts['total']:,} total, {counts['active']:,} active (routed experts counted at k/E)",
         f"about 1/{float(f'{scale:.2g}'):,.0f} of the size, so that pretraining and RL run on a laptop CPU"],
        ["depth and rhythm", "layers: " + RELEASED["layers"] + "; " + RELEASED["attention"], "`model/config.py` `attention_pattern`",
         f"{cfg.layers} layers, {pattern.count('linear')} linear + {len(sparse)} sparse at "
         f"{', '.join(map(str, sparse))} (0-based)",
         "the rhythm is kept, the depth scaled down; no MTP layer (it serves speculative decoding)"],
        ["linear attention", PUBLISHED["linear attention"], "`model/linear_attention.py`",
         f"ELU+1 feature-map linear attention, {cfg.heads} heads, chunked parallel form + recurrent decode",
         "short enough to read in one file, with an exact recurrent oracle in the tests; no gate or delta rule, so "
         "it forgets nothing (a known capacity gap)"],
        ["sparse attention", PUBLISHED["sparse attention"], "`model/sparse_attention.py`",
         f"a fixed local window of {cfg.sparse_window} keys plus one key in every {cfg.sparse_stride}, softmax, cached mask",
         f"at a {cfg.max_sequence_length}-token context a learned indexer would keep every key; a fixed pattern stays "
         "sparse and testable"],
        ["positions", RELEASED["position"], "`model/rope.py`, `config.linear_rope`",
         f"RoPE in the sparse layers, `linear_rope=\"{cfg.linear_rope}\"` in the linear ones",
         "the original miniature's RoPE in the linear layers mixed into the positive kernel (docs/STUDIES.md, "
         "pretraining switches)"],
        ["mixture of experts", f"{RELEASED['experts']}; {PUBLISHED['mixture of experts']}", "`model/moe.py`",
         f"{cfg.experts} routed SwiGLU experts top-{cfg.top_k}, width {cfg.expert_hidden}, 1 shared; softmax over the "
         f"chosen logits; balance loss (weight {cfg.balance_loss_weight:g})",
         "the original miniature's router and loss, so results stay comparable"],
        ["residual streams", f"{RELEASED['streams']}; {PUBLISHED['residual streams']}",
         "`model/streams.py`, `config.stream_mode`",
         f"{cfg.streams} streams, `{cfg.stream_mode}` (the original miniature's mixer); `sinkhorn` and `delta` as switches",
         "the original form trained to the lowest loss of the three here (docs/BENCHMARKS-HISTORY.md)"],
        ["tokenizer", RELEASED["vocab"], "`data/tokenizer.py`", f"{cfg.vocab_size} ids: UTF-8 bytes + 4 specials",
         f"no learned vocabulary, exact round trip; longer sequences (`{example}`: "
         f"{len(ByteTokenizer().encode(example))} tokens, {RELEASED['bpe_example_tokens']} with the BPE)"],
        ["context", RELEASED["context"], "`config.max_sequence_length`", f"{cfg.max_sequence_length}",
         "the synthetic tasks fit well inside it"],
        ["output head", "separate LM head", "`model/lm.py`", "tied to the embedding",
         f"saves {cfg.vocab_size * cfg.dim:,} parameters, as in the original miniature"],
        ["normalisation", "RMSNorm", "`model/norm.py`", "RMSNorm with fp32 statistics", "none"],
        ["training data", PUBLISHED["training data"], "`tasks/`",
         f"generated tiny Python functions: the original's {len(FAMILIES)} families and the compositions suite",
         "a controlled benchmark whose hidden tests decide the RL reward"],
        ["post-training", "large-scale asynchronous RL (\"slime\")", "`train/rl.py`",
         "RLOO, reward = hidden unit tests in a sandbox",
         "the smallest policy gradient with a per-prompt baseline; the verifier is the reward model"],
        ["vision", PUBLISHED["vision"], "`vision/`", "a small patch encoder with a 2x2 merge, its tokens placed in the text",
         "teaching scale (docs/STUDIES.md, vision)"],
    ]
    return _table({"columns": ["component", "GLM-5.3-Flash", "our module", "our value", "deviation and reason"],
                   "rows": rows})


__all__ = ["PUBLISHED", "VERIFY_RECEIPTS", "render_budget", "render_cheat_suite", "render_compositions_splits",
           "render_glm_mapping", "render_headline_answer", "render_study_model", "render_study_times",
           "render_verifier_settings", "render_verifier_speed", "render_vision_answer"]
