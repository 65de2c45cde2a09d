"""The course's words: every technical term the deck uses, with a definition a learner can read, and the
plain names the deck and the charts show for the code's identifiers (a switch, a split, an RL setting).

The deck marks a term where it is defined (`<dfn data-term=KEY>`, report/slides.py) and ends with a
glossary built from GLOSSARY; tests/test_slides.py checks that every term a slide uses is defined on
that slide or an earlier one. A term's `pattern` is how a slide's text is searched for it (a regular
expression, case-insensitive unless it says otherwise).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Term:
    key: str
    name: str
    definition: str
    pattern: str

    def used_in(self, text: str) -> bool:
        return re.search(self.pattern, text, flags=re.IGNORECASE) is not None


GLOSSARY: tuple[Term, ...] = (
    # the model
    Term("token", "token", "one piece of text the model reads or writes; here one byte.", r"\btokens?\b"),
    Term("vocabulary", "vocabulary", "every token the model knows: here the 256 byte values and 4 special markers.",
         r"\bvocabulary\b"),
    Term("bpe", "BPE (byte-pair encoding)", "a tokenizer that merges frequent runs of bytes into one token, as "
         "GLM-5.3-Flash's does; fewer, longer tokens.", r"\bBPE\b"),
    Term("parameter", "parameter", "one learned number of the model. Active parameters: those one token actually "
         "uses.", r"\bparameters?\b"),
    Term("attention", "attention", "how each position of the text reads the earlier positions.",
         r"\battention\b"),
    Term("linear-attention", "linear attention", "attention that keeps a fixed-size running summary of the past, "
         "so each new byte costs the same however long the text.", r"\blinear (?:attention|layers?)\b"),
    Term("sparse-attention", "sparse attention", "attention to exact earlier bytes, but only to a window of recent "
         "ones plus every k-th one further back.", r"\bsparse (?:attention|layers?)\b"),
    Term("expert", "expert (mixture of experts)", "one of several small feed-forward networks in a layer; a router "
         "sends each token to a few of them (here 2 of 8), plus one shared expert every token uses.",
         r"\bexperts?\b"),
    Term("stream", "residual stream", "the running state each layer reads and adds its output to; here 4 run "
         "side by side and each layer reads a mix of them.", r"\bstreams?\b"),
    # learning
    Term("pretraining", "pretraining", "learning to predict the next byte of a large text, from random weights.",
         r"\bpretrain(?:ing|ed)?\b"),
    Term("loss", "loss", "how surprised the model is by the true next byte, averaged: lower is better.",
         r"\bloss\b"),
    Term("nats", "nats", "the unit of a loss computed with natural logarithms: a loss of ln(256) = 5.5 nats is "
         "a uniform guess over bytes; 0 is certainty. 1 nat is 1.44 bits.", r"\bnats?\b"),
    Term("step", "step (update)", "one change of the weights, computed from one batch of examples.",
         r"\b(?:steps?|updates?)\b"),
    Term("checkpoint", "checkpoint", "the model's weights saved at one step.", r"\bcheckpoints?\b"),
    Term("verifier", "verifier", "runs a program against a task's hidden tests and returns its verdict.",
         r"\bverifier\b"),
    Term("sandbox", "sandbox", "a confined process the program runs in: no files, no network, limits on time "
         "and memory; a static check refuses anything outside a small part of Python first.", r"\bsandbox(?:ed)?\b"),
    Term("rl", "RL (reinforcement learning)", "learning from a reward given to the model's own outputs.",
         r"\bRL\b"),
    Term("reward", "reward", "the score of one sampled program: the share of its task's hidden test cases it passes "
         "(1 when all pass), a small penalty when the verifier refuses it.", r"\brewards?\b"),
    Term("rloo", "RLOO (REINFORCE leave-one-out)", "sample a group of completions per prompt; each one's advantage "
         "is its reward minus the mean reward of the others; make above-average completions more likely.",
         r"\bRLOO\b"),
    Term("temperature", "temperature", "how random sampling is: 0 always takes the likeliest byte, higher values "
         "spread the choice.", r"\btemperatures?\b|\btemp-(?:low|high)\b"),
    Term("greedy", "greedy", "decoding that always takes the likeliest next byte: one answer per task.",
         r"\bgreedy\b"),
    Term("rollout", "rollout", "one sampled completion, judged by the verifier.", r"\brollouts?\b"),
    Term("takeoff", "RL takes off", "RL finds enough passing programs to learn from (here at least 50 exact "
         "rollouts in training); when it does not, the model barely changes.", r"\btak(?:e|es|ing) off\b|\btook off\b"),
    # measuring
    Term("family", "family", "one kind of task (double, increment, even, ...): its tasks compute the same "
         "function under different names.", r"\bfamil(?:y|ies)\b"),
    Term("split", "split", "a fixed set of tasks with one purpose: rl (training prompts), dev (for every choice), "
         "and the sealed ones.", r"\bsplits?\b"),
    Term("dev", "dev split", "the split every choice is made on: which checkpoint, which setting.",
         r"\bdev\b"),
    Term("sealed", "sealed split", "a split (confirm, holdout, final, and the studies' unseen ones) opened only "
         "after every choice is made, once, each opening recorded before the split is built.",
         r"\bsealed\b|\bconfirm split\b|\bholdout\b"),
    Term("pass-at-1", "pass@1", "the share of tasks whose one (greedy) answer passes the hidden tests.",
         r"pass@1\b"),
    Term("pass-at-k", "pass@k", "the share of tasks where at least one of k sampled answers passes.",
         r"pass@(?:k|[2-9]|\d\d)\b"),
    Term("byte-accuracy", "byte accuracy (teacher-forced)", "the share of a held-out text's bytes the model "
         "ranks first when shown the true text before each one: how well it predicts, not whether it can "
         "solve the task.", r"\bbyte accuracy\b|\bbyte-accuracy\b"),
    Term("strong-tests", "strong tests", "50 or more extra cases per task generated from the reference "
         "(zero, negatives, large numbers, empty inputs); rewards never see them.",
         r"\bstrong(?: tests| pass rate| set|-set|-case)\b"),
    Term("compositions", "compositions suite", "the second task suite: functions built by composing generated "
         "steps; behaviours that share a structure form a structure group.", r"\bcompositions?\b"),
    Term("seed", "seed", "the number that fixes a run's random choices (initial weights, data order, samples).",
         r"\bseeds?\b"),
    Term("draw", "draw", "one run of a recipe: another seed, or another CPU's arithmetic, gives another draw.",
         r"\bdraws?\b"),
    Term("precision", "fp32 and bf16", "two ways to store numbers: 32-bit floats, and 16-bit 'brain floats' "
         "with fewer digits, faster on CPUs that have them.", r"\b(?:fp32|bf16)\b"),
    Term("baseline", "baseline", "the recipe a study measures the others against: its default.", r"\bbaseline\b"),
    Term("switch", "switch", "a setting on which the faithful arm and ours differ, such as whether RL's update "
         "keeps the temperature it sampled at.", r"\bswitch(?:es)?\b"),
    Term("structure", "structure", "a template of generated functions: tasks of one structure behave alike, so "
         "a structure group is one independent unit.", r"\bstructures?\b"),
    Term("screen", "screen", "a first round that tries every setting briefly, on dev, only to pick the one to "
         "confirm on fresh seeds.", r"\bscreen(?:ing|'s)?\b"),
    Term("arm", "arm", "one recipe in a comparison: faithful (every switch as in the original miniature) or "
         "ours (our defaults).", r"\barms?\b|\bfaithful\b"),
    Term("original", "the original miniature", "the published miniature of GLM-5.3-Flash this project "
         "reproduces: one run, 0 of 24 confirm tasks before RL and 16 after.", r"\bthe original\b|\boriginal's\b"),
    Term("unit", "independent unit", "what varies independently, and so what a test counts: a distinct function, "
         "a structure group, a seed; never a task id.", r"\bunits?\b(?!\s+tests?)|\bstructure groups?\b"),
    Term("paired", "paired comparison", "both conditions measured on the same units or seeds; the test looks at "
         "the differences, one per unit.", r"\bpaired\b"),
    Term("points", "points", "percentage points: a rate going from 60% to 62% is +2 points.", r"\bpoints\b"),
    Term("shown", "shown / not shown", "a difference is shown when its test, after the correction for "
         "multiple comparisons, gives p below 0.05; not shown means the data cannot tell, not that there is no "
         "difference.", r"\bshown\b"),
    Term("p-value", "p-value", "how often chance alone would give a difference at least this large if there were "
         "none.", r"\bp-values?\b|\bp\s*(?:=|<|>)|\bp \d|\bHolm p\b"),
    Term("holm", "Holm correction", "a correction for running several tests at once: sort the p-values, multiply "
         "the smallest by the number of tests, the next by one fewer, and so on; a result holds only if its "
         "corrected p stays below 0.05.", r"\bHolm\b"),
    Term("interval", "95% interval", "a range computed so that, in 95% of repeated experiments, it would hold the "
         "true value.", r"\binterval\b|\bCI\b"),
    Term("power", "power", "how likely a plan is to find a difference of a given size; the plan states the "
         "smallest difference it would find 80% of the time before it runs.", r"\bpower\b|\bdetectable\b"),
    Term("equivalence", "equivalence test", "a test that a value lies within a margin stated in advance: how "
         "'reproduces' is tested.", r"\bequivalen(?:ce|t)\b"),
    Term("sign-flip", "sign-flip test", "a paired test that asks how often random signs on the per-unit "
         "differences give a mean as large as the one seen; exact for few units.", r"\bsign-flip\b"),
    Term("mcnemar", "McNemar test", "a paired test on the tasks that changed: gained against lost.",
         r"\bMcNemar\b"),
    Term("bootstrap", "bootstrap", "resampling the units with replacement to see how much an estimate "
         "moves.", r"\bbootstrap\b"),
    Term("quartiles", "median and quartiles", "the middle value, and the values a quarter and three quarters "
         "of the way up the sorted draws.", r"\bmedian\b|\bquartiles?\b"),
    Term("confusion", "confusion matrix", "a table of what was drawn (rows) against what the model said "
         "(columns): the diagonal is right.", r"\bconfusion\b"),
    Term("playground", "playground", "the page `glm53 serve` opens beside the deck: the model completes a task "
         "token by token, and the verifier judges it, or your own function against your own tests.",
         r"\bplayground\b"),
)
TERMS = {term.key: term for term in GLOSSARY}


# The plain names the deck shows for the code's identifiers (a slide never shows an identifier).
PLAIN = {
    # pretraining switches
    "linear_rope": "rotary positions in the linear layers",
    "balance_loss": "the experts' balance loss",
    "decay_all_parameters": "weight decay on every parameter",
    "rope-before-feature-map": "rotary, before the feature map",
    "hard-count": "hard counts (no gradient)",
    # RL switches and their values
    "logprob_source": "temperature in the update",
    "loss_normalization": "loss averaged",
    "eos_handling": "end-of-text token",
    "untempered": "dropped",
    "sampler": "kept",
    "sequence-mean": "per answer",
    "constant": "over a fixed length",
    "omit": "not trained",
    "append": "trained",
    # task families
    "list_sum": "list sum",
    # splits
    "compositions.unseen_structures": "unseen compositions",
    "compositions.new_constants": "new constants",
    "compositions.dev": "compositions dev",
    "unseen": "unseen compositions",
    "new-constants": "new constants",
    # rewards
    "three": "three-case",
    "strong": "strong-test",
    "case-fraction": "share of tests passed",
    "binary": "all tests pass",
    # the pretraining-data study's conditions and the comparison whose name is not a word
    "repeated-8": "8 structures",
    "diverse-88": "88 structures, interleaved",
    "diverse-blocked": "88 structures, blocked",
    "curriculum-8-to-88": "8, then 88 structures",
    "curriculum-vs-repeated": "curriculum vs repeated",
}
# The pretraining-data study's comparisons as the story says them (right over left).
COMPARISONS = {
    "diversity": "88 structures over 8",
    "order": "interleaved over blocked",
    "curriculum": "8 then 88 over 88 only",
    "curriculum-vs-repeated": "8 then 88 over 8 only",
}
# An RL setting and its value in words (report/glossary.rl_setting).
SETTINGS = {
    "temperature": lambda value: f"temperature {value:g}",
    "invalid_penalty": lambda value: f"refusal penalty {value:g}",
    "reward_mode": lambda value: f"reward: {label(value)}",
    "reward_cases": lambda value: f"{label(value)} reward",
    "groups": lambda value: f"{value} groups",
}


def label(identifier: str) -> str:
    """The plain name of one identifier (a field's value), or the value itself when it has none."""
    return PLAIN.get(str(identifier), str(identifier))


def plain(text: str, names: dict | None = None) -> str:
    """`text` (a sentence a study wrote) with the code's identifiers in it in words: only those that cannot
    be ordinary words (with '_', '.' or '-'), whole words, longest first; `names` adds a study's own (its
    RL arms, rl_arm_names). A change written 'A -> B' is named in words when both sides have plain names."""
    known = {**PLAIN, **(names or {})}
    text = re.sub(r"(?<![\w.-])([\w.-]+) -> ([\w.-]+)(?![\w-])",
                  lambda m: (f"{known[m[1]]} -> {known[m[2]]}" if m[1] in known and m[2] in known else m[0]), text)
    for identifier in sorted((k for k in known if re.search(r"[_.-]", k)), key=len, reverse=True):
        text = re.sub(rf"(?<![\w.-]){re.escape(identifier)}(?![\w-])", known[identifier], text)
    return text


def cell(value, names: dict | None = None) -> str:
    """One table cell in words: a cell that is one identifier by its plain name, any other (an 'A -> B'
    change among them) through plain()."""
    text = str(value)
    return {**PLAIN, **(names or {})}.get(text) or plain(text, names)


def rl_setting(settings: dict, baseline: dict) -> str:
    """An RL arm in words, by the settings where it differs from the baseline's: 'temperature 0.2',
    'groups of 4 (as many samples)'; the baseline itself is 'baseline'."""
    changed = [key for key in settings if key in baseline and settings[key] != baseline[key]]
    words = []
    if "group_size" in changed:
        size, groups = settings["group_size"], settings.get("groups")
        if groups is not None and size * groups == baseline["group_size"] * baseline.get("groups", 0):
            words.append(f"groups of {size} (as many samples)")
        elif groups == baseline.get("groups"):
            words.append(f"groups of {size} (as many updates)")
        else:
            words.append(f"groups of {size}, {groups} groups")
    for key in changed:
        if key not in ("group_size", "groups"):
            value = settings[key]
            words.append(SETTINGS[key](value) if key in SETTINGS else f"{key.replace('_', ' ')} {label(value)}")
    return "; ".join(words) or "baseline"


def rl_arm_names(arms) -> dict[str, str]:
    """An RL-choices summary's arms (a list, each with its `settings`) by name, in words (rl_setting against
    the arm named 'baseline'); {} for anything else (another study's arms, arms without settings)."""
    if not isinstance(arms, list):
        return {}
    baseline = next((arm.get("settings") for arm in arms if arm.get("arm") == "baseline"), None)
    if not baseline:
        return {}
    return {arm["arm"]: rl_setting(arm["settings"], baseline) for arm in arms if arm.get("settings")}


__all__ = ["COMPARISONS", "GLOSSARY", "PLAIN", "SETTINGS", "TERMS", "Term", "cell", "label", "plain", "rl_arm_names",
           "rl_setting"]
