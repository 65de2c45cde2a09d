"""The course deck: one self-contained HTML file built only from receipts and from the code itself.

The deck tells one story a learner can follow, in five parts: what the model is (bytes, the linear/sparse
rhythm, experts, streams), how it learns (pretraining, then RL whose only reward is running tests), how we
know what it learned (sealed splits, seeds, why one run is not a result), what we found (the headline as a
distribution, each study's answer in a sentence: report/findings.py) and "now try it" (the playground).
One idea per slide, at most about 90 words of body text (BODY_WORDS); every technical term is defined
where it first appears (`dfn`, from report/glossary.py's GLOSSARY) and again in the glossary that opens
the appendix; the statistics (tests, corrections, power, each study's tables and its own `answer()`) are
in the appendix; one slide at the end says where every number came from, with the commit and the state
of the code that built the deck.

`glm53 slides build --runs DIR` reads DIR/headline/summary.json (the committed `results/`) or
DIR/summary.json (a `glm53 reproduce` run directory such as runs/demo), the charts' receipts next to it,
the confirm receipts when the run has them (for example completions), DIR/headline-distribution/
distribution.json (the headline as a distribution, read as it is when the deck is built: it grows while
its runs go on) and the study summaries its caller names (`studies`: the vision path's and every
registered study's, experiments/registry.py). Charts are drawn here from the same numbers as inline SVG
sized for their slide, each condition in its palette colour (report/figures.PALETTE). Numbers about the
miniature come from ModelConfig and GLM53Flash.parameter_counts(); numbers about the released model come
from RELEASED below, each with its source. The output embeds its CSS, script and charts (no network
fetch), so it opens from file:// as well as from `glm53 serve`, and carries its content security policy
(report/page_policy.py: only its own script and stylesheet run; every value from a receipt is escaped as
well). The build is deterministic: the same inputs (and the same code) give the same bytes.

One function per slide or group of slides (`SLIDES` lists them in order); each takes the `Inputs` and
returns its slides (none, one or more). Every slide has speaker notes, shown under the slide (key S) and
in the presenter view (key P or `?presenter`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from glm53_flash.core.receipts import read_json
from glm53_flash.train.plan import ReproducePlan
from glm53_flash.report import figures, findings
from glm53_flash.report.format import format_interval, format_p, format_signed
from glm53_flash.report.glossary import GLOSSARY, TERMS, cell, label, plain, rl_arm_names
from glm53_flash.report.headline import (confirm_history, ORIGINAL, draw_family_changes, draw_greedy, draw_panels,
                                         family_chart_data, goal_lines, greedy_chart_data, learning_chart_data,
                                         loss_panel, result_table, reward_panel, selection_chart_data, selection_panel)
from glm53_flash.report.page_policy import content_security_policy
from glm53_flash.report.summary import RunSummary
from glm53_flash.report.tables import esc, html_from_markdown, html_table

ASSETS = Path(__file__).resolve().parent / "assets"
TOKEN_PLACEHOLDER = "__GLM53_TOKEN__"
BODY_WORDS = 90  # the most words of body text on a story slide (charts and code blocks aside)
DISTRIBUTION = "headline-distribution/distribution.json"

# GLM-5.3-Flash's published numbers (the released config.json and the HF Transformers `glm5_next`
# model code), as tabulated with their sources in docs/GLM_MAPPING.md; tests check that they agree.
RELEASED = {
    "total_parameters": "320B",
    "active_parameters": "18B",
    "layers": "45 (+1 MTP layer)",
    "attention": "34 KDA linear + 11 sparse (DSA), every 4th layer sparse",
    "hidden": "4096",
    "experts": "288 routed, top-8, + 1 shared",
    "streams": "4 (mHC, Sinkhorn-projected mixing)",
    "vocab": "154,880 (byte-level BPE)",
    "context": "1,048,576",
    "position": "NoPE in the sparse layers",
    "bpe_example_tokens": 4,  # "def increment(x):" -> def, increment, (x,): (original README)
}
# The same numbers in a learner's words, for the slides: no name the deck has not defined.
PLAIN_RELEASED = {**RELEASED, "layers": "45", "attention": "34 linear + 11 sparse, every 4th layer sparse",
                  "experts": "288 + 1 shared, 8 used per token", "streams": "4", "vocab": "154,880"}
RELEASED_SOURCE_PATH = "docs/GLM_MAPPING.md"
RELEASED_SOURCE = ("the released GLM-5.3-Flash config.json and Hugging Face Transformers code, "
                   f"tabulated in {RELEASED_SOURCE_PATH}")

# The five parts of the story, and the appendix; each slide names its part.
PARTS = ("What the model is", "How it learns", "How we know what it learned", "What we found", "Now try it")
APPENDIX = "Appendix"


def headline_dir(runs: Path) -> Path:
    """Where the headline summary lives: DIR/headline (committed results) or DIR (a reproduce run)."""
    for candidate in (runs / "headline", runs):
        if (candidate / "summary.json").is_file():
            return candidate
    raise FileNotFoundError(f"no headline summary.json in {runs} or {runs / 'headline'}; `make demo` writes "
                            f"runs/demo/summary.json and results/headline/ holds the committed one")


# Wide study tables are split over slides: at most this many columns each, the leading key columns repeated.
TABLE_COLUMNS = 7


def chart(fig, name: str, alt: str) -> str:
    """A figure as inline SVG in a <figure>. On a slide whose body fills the window (Slide.fill) the
    figure takes the space left to it, growing with its height/width ratio beside other figures
    (data-grow, which deck.js sets as its flex-grow: the page allows no inline style), and the drawing
    scales to the largest size that fits (text scales with it)."""
    width, height = fig.get_size_inches()
    # flex-grow in hundredths: grow factors summing below 1 would leave part of the space unused
    return (f'<figure class="chart" data-grow="{100 * height / width:.1f}" role="img" aria-label="{esc(alt)}">'
            f"{figures.to_svg(fig, name)}</figure>")


def cite(path: str) -> str:
    """A file of this repository named on a slide (tests check that it exists)."""
    return f'<code class="path" data-path="{esc(path)}">{esc(path)}</code>'


def code(text: str) -> str:
    return f"<pre><code>{esc(text)}</code></pre>"


def dfn(key: str, text: str | None = None) -> str:
    """A term where the deck defines it (the sentence around it says what it is; the glossary's
    definition is its tooltip). tests/test_slides.py checks that a slide uses only terms defined on it or
    before it."""
    term = TERMS[key]
    return f'<dfn data-term="{esc(key)}" title="{esc(term.definition)}">{esc(text or term.name)}</dfn>'


def unbreakable(text: str) -> str:
    """Numbers that must not wrap in a table cell: an interval's two ends stay together, and so do the
    parts of a number in scientific notation (3.05e-05) and the two ends of a range (48.75-62.75)."""
    text = re.sub(r"\[[^\]]{1,40}\]", lambda m: m.group(0).replace(" ", "\u00a0"), str(text))
    text = re.sub(r"(\d)e-(\d)", lambda m: f"{m.group(1)}e\u2011{m.group(2)}", text)
    return re.sub(r"([\d%])-(?=\d)", "\\1\u2011", text)


def table(columns, rows, numbers: bool = True, names: dict | None = None) -> str:
    """An HTML table of receipt values (escaped), the code's identifiers in words (glossary.cell, with a
    study's own `names`) and, with `numbers`, intervals and scientific notation kept on one line."""
    clean = (lambda c: unbreakable(cell(c, names))) if numbers else (lambda c: cell(c, names))
    return html_table([clean(c) for c in columns], [[clean(c) for c in row] for row in rows])


def markdown_inline(text: str) -> str:
    """**bold** and `code` in the goal sentences of report/headline.py."""
    parts = esc(text).split("**")
    text = "".join(f"<strong>{p}</strong>" if i % 2 else p for i, p in enumerate(parts))
    parts = text.split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


@dataclass
class Slide:
    """body is HTML built by this module; title and notes are plain text and are escaped. A slide with
    charts fills the window (`fill`): its body is a column whose charts take the height the rest leaves.
    `part` is the story's part the slide belongs to (PARTS), or APPENDIX."""
    id: str
    title: str
    body: str
    notes: str
    fill: bool = False
    part: str = ""

    @property
    def appendix(self) -> bool:
        return self.part == APPENDIX

    def html(self) -> str:
        body_class = "body fill" if self.fill else "body"
        kicker = (f'<p class="part">{esc(self.part)}</p>' if self.part else "")
        return (f'<section class="slide{" appendix" if self.appendix else ""}" id="{esc(self.id)}" '
                f'data-title="{esc(self.title)}" data-part="{esc(self.part)}">{kicker}'
                f'<h2 data-edit="{esc(self.id)}/title">{esc(self.title)}</h2><div class="{body_class}">{self.body}</div>'
                f'<aside class="notes">{esc(self.notes)}</aside></section>')


@dataclass
class Inputs:
    """Everything the slides read: the results directory, the headline summary and its run directory, the
    headline distribution (None when the results directory has none), and the state of the code."""
    runs: Path
    run: Path
    summary: RunSummary
    facts: dict = field(default_factory=dict)
    arms: dict | None = None  # the two-arm summary, when the headline directory has one
    studies: tuple = ()  # the study slides' entries, in order (experiments/registry.py deck_entries)
    distribution: dict | None = None
    code: str | None = None  # the git commit of the code building the deck, "+dirty" with uncommitted changes
    study_of: Callable | None = None  # a plan.json -> its registered study (experiments/registry.py study_of)

    @property
    def plan(self) -> ReproducePlan:
        return self.summary.plan

    @property
    def seeds(self) -> list[str]:
        return self.summary.rl_seeds

    @property
    def arm(self) -> str:
        """The arm the headline run's slides describe (its charts' colour)."""
        return "ours"

    @property
    def size(self) -> str:
        total = self.facts["counts"]["total"]
        return f"{total / 1e6:.1f} million" if total >= 1e6 else f"{total / 1e3:.0f} thousand"

    @classmethod
    def load(cls, runs: str | Path, studies: tuple = (), study_of: Callable | None = None) -> "Inputs":
        """The headline's slides describe one run: a one-arm directory's, or a two-arm directory's
        `ours` arm (the two-arm summary is kept for the slide that compares the arms)."""
        from glm53_flash.core.receipts import git_commit

        runs = Path(runs)
        run = headline_dir(runs)
        top = read_json(run / "summary.json")
        arms = None
        if isinstance(top, dict) and "arms" in top:
            if not isinstance(top["arms"], dict) or "ours" not in top["arms"] or "comparison" not in top:
                raise ValueError(f"{run / 'summary.json'} is a two-arm summary without the 'ours' arm or the "
                                 "comparison")
            arms, run = top, run / "ours"
        summary = RunSummary.read(run / "summary.json")
        plan = summary.plan
        distribution = read_json(runs / DISTRIBUTION) if (runs / DISTRIBUTION).is_file() else None
        return cls(runs, run, summary, miniature_facts(plan.pretrain.preset, plan.pretrain.model_overrides), arms,
                   tuple(studies), distribution, git_commit(), study_of)


# --------------------------------------------------------------------------- facts from the code


def miniature_facts(preset: str = "flash", overrides: dict | None = None) -> dict:
    """Architecture facts of the model a run trained (its plan's preset and overrides)."""
    import torch

    from glm53_flash.model.config import ModelConfig
    from glm53_flash.model import GLM53Flash

    cfg = ModelConfig.preset(preset, **(overrides or {}))
    with torch.device("meta"):  # shapes only: counting parameters needs no memory or random init
        counts = GLM53Flash(cfg).parameter_counts()
    pattern = cfg.attention_pattern
    return {"config": cfg, "counts": counts, "pattern": pattern,
            "linear": pattern.count("linear"), "sparse": pattern.count("sparse"),
            "sparse_layers": [i for i, kind in enumerate(pattern) if kind == "sparse"]}


def verifier_examples(task) -> list[tuple[str, str, dict]]:
    """Three programs for one task, judged by the real sandbox at build time."""
    from glm53_flash.verifier import Verifier

    programs = [("the reference body", task.reference_source),
                ("a wrong body", task.prompt + "\n    return x * 3\n"),
                ("a forbidden import", task.prompt + "\n    import os\n    return x\n")]
    with Verifier(workers=1) as verifier:
        verdicts = verifier.evaluate_many([(task, source) for _, source in programs])
    return [(name, source, verdict.to_dict()) for (name, source), verdict in zip(programs, verdicts)]


def example_completion(run: Path, summary: RunSummary) -> dict | None:
    """A confirm task the first RL seed gained, with both greedy completions, from the confirm receipts."""
    seed = summary.rl_seeds[0]
    before_path, after_path = run / "confirm" / "before-greedy.json", run / "confirm" / f"rl-{seed}-greedy.json"
    if not (before_path.is_file() and after_path.is_file()):
        return None
    before = {e["task_id"]: e for e in read_json(before_path)["episodes"]}
    after = {e["task_id"]: e for e in read_json(after_path)["episodes"]}
    for task_id, episode in after.items():
        if episode["evaluation"]["passed"] and task_id in before and not before[task_id]["evaluation"]["passed"]:
            return {"seed": seed, "task_id": task_id, "prompt": episode["prompt"],
                    "before": before[task_id]["generated_completion"], "before_eval": before[task_id]["evaluation"],
                    "after": episode["generated_completion"], "after_eval": episode["evaluation"]}
    return None


# --------------------------------------------------------------------------- the story: the title


def slide_title(x: Inputs) -> Slide:
    parts = "".join(f"<li>{esc(part)}</li>" for part in PARTS)
    return Slide(
        "title", "From random bytes to passing unit tests",
        f"<p class='lead'>A language model of {x.size} {dfn('parameter', 'parameters')} (the numbers it learns), "
        "written from scratch, learns to write tiny Python functions. First it reads many of them "
        f"({dfn('pretraining')}); then its only teacher is a test runner: do the hidden unit tests pass?</p>"
        f"<ol class='arc'>{parts}</ol>"
        '<p class="aside">A dotted underline marks a term where it is defined; every term is also in the '
        '<a href="#glossary">glossary</a>, and the statistics are in the appendix after it.</p>',
        "The course in one breath: a small model, built from nothing, pretrained on generated Python, then "
        "post-trained by reinforcement learning whose only reward is whether hidden unit tests pass. The five "
        "parts: what the model is; how it learns; how we know what it learned (sealed splits, seeds, and why "
        "one run is not a result); what we found; and the playground, where you judge your own function. "
        "Everything on these slides is generated from committed receipts or from the code itself when the "
        "deck is built; nothing is typed by hand. Point at the glossary link: hovering a dotted term shows "
        "its definition too.")


# --------------------------------------------------------------------------- part 1: what the model is


def slide_bytes(x: Inputs) -> Slide:
    from glm53_flash.data.tokenizer import ByteTokenizer

    tok = ByteTokenizer()
    sample = "def increment(x):"
    ids = tok.encode(sample)
    return Slide(
        "bytes-vs-bpe", "Text goes in as bytes",
        code(f"{sample!r}\n-> {ids}")
        + f"<p>Each byte of the text becomes one {dfn('token')}, the piece the model reads and writes: its id "
          f"is the byte's value plus {tok.byte_offset}. The {dfn('vocabulary')}, every token the model knows, "
          f"is the 256 byte values and {tok.byte_offset} markers (padding, begin, end, separator): "
          f"{tok.vocab_size} tokens.</p>"
          f"<p>GLM-5.3-Flash uses {dfn('bpe', 'BPE')}, which merges frequent runs of bytes into one token: "
          f"{PLAIN_RELEASED['vocab']} tokens, and {PLAIN_RELEASED['bpe_example_tokens']} for this line instead of "
          f"{len(ids)}.</p>",
        "Bytes need no learned vocabulary, round-trip any text exactly and keep the embedding table at 260 "
        "rows; the price is longer sequences. Count the ids on the slide against BPE's four tokens. The four "
        "special ids are PAD (padding a batch to one length), BOS and EOS (begin and end of a text) and SEP "
        "(a separator).", part=PARTS[0])


def slide_attention(x: Inputs) -> Slide:
    cfg = x.facts["config"]
    rhythm = " ".join("S" if kind == "sparse" else "L" for kind in x.facts["pattern"])
    return Slide(
        "architecture-block", f"Attention in a rhythm: {x.facts['linear']} linear, {x.facts['sparse']} sparse",
        f"<p>{dfn('attention', 'Attention')} is how each position of the text reads the earlier ones. Our "
        f"{cfg.layers} layers use two kinds:</p><ul>"
        f"<li>{dfn('linear-attention', 'Linear attention')} keeps a fixed-size running summary of the past: "
        "each new byte costs the same, however long the text.</li>"
        f"<li>{dfn('sparse-attention', 'Sparse attention')} reads exact earlier bytes, but only the last "
        f"{cfg.sparse_window}, and one in every {cfg.sparse_stride} before them.</li></ul>"
        + code(f"{rhythm}   ({cfg.layers} layers, first to last: L linear, S sparse)")
        + "<p>GLM-5.3-Flash keeps the same rhythm: every fourth layer sparse.</p>",
        "Linear attention replaces the softmax over all earlier positions by a feature map, so the past "
        f"folds into a state of fixed size ({cfg.heads} heads; in training, sequences longer than {cfg.linear_chunk} bytes "
        "are computed chunk by chunk): "
        "decoding costs the same per byte at any length. It blurs, though; the sparse layers see exact "
        "bytes in a window plus strided anchors further back. The rhythm mixes cheap, blurry memory with "
        "exact, local reading. Open glm53_flash/model/linear_attention.py and sparse_attention.py: each reads "
        "top to bottom like its equations.", part=PARTS[0])


def slide_experts(x: Inputs) -> Slide:
    cfg, counts = x.facts["config"], x.facts["counts"]
    return Slide(
        "experts", "Experts: each token uses part of the model",
        f"<p>After attention, every layer holds {cfg.experts} small networks, the {dfn('expert', 'experts')}, "
        f"and one shared expert. A router scores the {cfg.experts} for each token and sends it to the best "
        f"{cfg.top_k}; the shared one always runs.</p>"
        + code(f"token -> router -> best {cfg.top_k} of {cfg.experts} experts + the shared one -> weighted sum")
        + f"<p>So of {counts['total']:,} parameters, only {counts['active']:,} are active for one token: the "
          f"knowledge of a larger model at the cost of a smaller one. GLM-5.3-Flash: {PLAIN_RELEASED['experts']}.</p>",
        f"A mixture of experts: each expert is a SwiGLU feed-forward network of width {cfg.expert_hidden}. The "
        "router is a linear layer whose top scores pick the experts and weight their outputs. A balance loss "
        f"(weight {cfg.balance_loss_weight}) keeps the router from sending everything to one expert. Active "
        "parameters count the routed experts at k of E, plus everything every token uses. glm53_flash/model/"
        "moe.py is the file.", part=PARTS[0])


def slide_streams(x: Inputs) -> Slide:
    cfg = x.facts["config"]
    return Slide(
        "streams", f"{cfg.streams} residual streams: the model's working memory",
        f"<p>Each token's running state is not one vector but {cfg.streams}, the "
        f"{dfn('stream', 'residual streams')}. Every layer reads a learned mix of them and adds its output "
        "back; at the end they are averaged into the scores of the next byte.</p>"
        + code(f"bytes -> embedding -> {cfg.streams} streams\n"
               f"  -> {cfg.layers} x (mix streams -> attention -> experts)\n"
               f"  -> average the streams -> a score for each of {cfg.vocab_size} next tokens")
        + "<p>GLM-5.3-Flash has 4 streams too, mixed by a more constrained rule.</p>",
        f"A residual stream is the running sum each layer adds to; several of them let layers keep separate "
        f"lanes. The shapes: bytes become an embedding [batch, length, {cfg.dim}]; each block normalises "
        "(RMSNorm) before attention and before the experts; the head shares its weights with the embedding "
        "(tied). GLM-5.3-Flash mixes its streams with mHC (Sinkhorn-projected mixing); ours is the simpler "
        f"form by default (stream mode '{cfg.stream_mode}'). glm53_flash/model/streams.py and lm.py.",
        part=PARTS[0])


def slide_architecture(x: Inputs) -> Slide:
    cfg, counts = x.facts["config"], x.facts["counts"]
    rows = [
        ("parameters", PLAIN_RELEASED["total_parameters"], f"{counts['total']:,}"),
        ("active per token", PLAIN_RELEASED["active_parameters"], f"{counts['active']:,}"),
        ("layers", PLAIN_RELEASED["layers"], str(cfg.layers)),
        ("attention", PLAIN_RELEASED["attention"], f"{x.facts['linear']} linear + {x.facts['sparse']} sparse"),
        ("experts per layer", PLAIN_RELEASED["experts"], f"{cfg.experts} + 1 shared, {cfg.top_k} used per token"),
        ("residual streams", PLAIN_RELEASED["streams"], str(cfg.streams)),
        ("vocabulary", PLAIN_RELEASED["vocab"], f"{cfg.vocab_size}"),
        ("context (tokens)", PLAIN_RELEASED["context"], f"{cfg.max_sequence_length}"),
    ]
    return Slide(
        "architecture", "The whole model, beside GLM-5.3-Flash",
        html_table(["", "GLM-5.3-Flash (published)", "our miniature (from the code)"], rows)
        + f"<p class='source'>Published numbers: {cite(RELEASED_SOURCE_PATH)}. Ours: counted from the model "
          "when this deck was built.</p>",
        "The right-hand column is computed from the code when the deck is built (the run's preset "
        f"'{x.plan.pretrain.preset}', GLM53Flash.parameter_counts()). The shape is kept: linear and sparse "
        "layers in a fixed rhythm, shared plus routed experts, several residual streams. The scale is not: "
        f"GLM-5.3-Flash's hidden size is {PLAIN_RELEASED['hidden']}, ours {cfg.dim}. docs/GLM_MAPPING.md lists every "
        "deviation and its reason, with the sources of the published numbers (the released config.json and "
        "the Hugging Face Transformers model code).", part=PARTS[0])


# --------------------------------------------------------------------------- part 2: how it learns


def slide_pretraining(x: Inputs) -> Slide:
    from glm53_flash.tasks import pretraining_text

    learning = learning_chart_data(x.run, x.summary)
    text = (f"<p>{dfn('pretraining', 'Pretraining')} starts from random weights. The model reads "
            f"{x.plan.pretrain.steps} batches, each {x.plan.pretrain.batch_size} stretches of "
            f"{x.plan.pretrain.sequence_length} bytes of generated functions like this one, and learns to predict "
            "each next byte.</p>"
            f"<p>The {dfn('loss')} is its surprise at the true next byte, in {dfn('nats')}: 5.5 is a blind guess "
            f"among 256 bytes, 0 is certainty. Each {dfn('step')} changes the weights once.</p>")
    left = code(pretraining_text(0)) + text
    if learning:
        figure = chart(draw_panels([(loss_panel, learning)], size=(6.4, 4.4)), "pretraining",
                       "the pretraining loss, step by step")
        body = f"<div class='cols'><div>{left}</div><div class='chart-column'>{figure}</div></div>"
    else:
        body = left
    return Slide(
        "pretraining", "Pretraining: predict the next byte", body,
        "The corpus is generated: the first example of the pretraining stream is shown verbatim. The model "
        "sees the same families of tasks that are later evaluated; only the function names differ. The loss "
        "is the cross-entropy of the next byte: minus the log of the probability the model gave the true "
        "byte, averaged over the batch. With natural logarithms its unit is the nat; ln(256) = 5.5 nats is a "
        "uniform guess over the 256 byte values, and 1 nat is 1.44 bits. "
        + ("The curve is the committed run's; watch it fall fast, then flatten." if learning else
           "The loss curve is drawn when the deck is built from a run directory with its metrics receipts."),
        fill=bool(learning), part=PARTS[1])


def slide_verifier(x: Inputs) -> Slide:
    from glm53_flash.tasks import frozen_tasks

    task = frozen_tasks("dev", 1, ("double",))[0]
    verdicts = verifier_examples(task)
    cases = ", ".join(f"{', '.join(repr(a) for a in c.arguments)} -> {c.expected!r}" for c in task.cases)
    return Slide(
        "verifier", "The verifier: hidden tests in a sandbox",
        code(task.prompt)
        + f"<p>The {dfn('verifier')} runs a program against the task's hidden tests ({esc(cases)}), which the "
          "model never sees. A static check refuses anything outside a small part of Python; what passes runs "
          f"in a {dfn('sandbox')}: a confined process with no files, no network and limits on time and "
          "memory. Verdicts computed when this deck was built:</p>"
        + html_table(["program", "verdict", "tests passed"],
                     [(name, v["status"], f"{v['tests_passed']} of {v['tests_total']}") for name, _, v in verdicts]),
        "These verdicts were computed by the sandboxed verifier when this deck was built. The forbidden "
        "import never runs: the static policy refuses it before any process starts, so its verdict is "
        "'invalid'. The wrong body runs and fails. Two layers, each tested alone against hostile programs: "
        "the policy (an allow-list of Python's syntax) and the confined process (its own namespaces, no new "
        "privileges, seccomp). docs/VERIFIER.md tells it layer by layer. "
        "The messages: " + "; ".join(f"{name}: {v['message'] or 'none'}" for name, _, v in verdicts) + ".",
        part=PARTS[1])


def slide_rloo(x: Inputs) -> Slide:
    learning = learning_chart_data(x.run, x.summary)
    rl = x.plan.rl
    text = (f"<p>In {dfn('rl', 'RL')} (reinforcement learning) the model learns from its own attempts. For "
            f"each prompt it samples a group of {rl.group_size} completions (its answers); each earns a "
            f"{dfn('reward')}: 1 if the hidden tests pass, 0 if not, {rl.invalid_penalty:g} if the verifier "
            "refuses it.</p>"
            f"<p>{dfn('rloo', 'RLOO')} (leave one out): a completion's advantage is its reward minus the mean of "
            f"the other {rl.group_size - 1}; the update makes above-average completions likelier.</p>")
    formula = code("advantage_i = reward_i - mean(reward_j, j != i)\nloss = - sum_i advantage_i * log p(completion_i)")
    if learning:
        figure = chart(draw_panels([(reward_panel, learning, x.arm)], size=(6.6, 4.6)), "rloo",
                       "RL reward per group, one line per RL seed")
        seeds = (f"<p>The chart: {len(x.seeds)} RL runs that differ only in their random "
                 f"{dfn('seed', 'seed')}.</p>")
        body = f"<div class='cols'><div>{text}{formula}{seeds}</div><div class='chart-column'>{figure}</div></div>"
    else:
        body = text + formula
    return Slide(
        "rloo", "RL: the only reward is passing the tests", body,
        "RLOO is REINFORCE with a leave-one-out baseline: the other samples of the same prompt say what an "
        "ordinary attempt scores, so a completion is pushed up only when it beats them. A group whose samples "
        "all get the same reward (all fail, or all pass) has zero advantage everywhere and makes no update: "
        "early on, most groups teach nothing, which is why RL can fail to take off. Settings of the committed "
        f"run: families {', '.join(x.summary.trained_families)}; {rl.groups} groups of {rl.group_size} samples; "
        f"sampling temperature {rl.temperature}; learning rate {rl.learning_rate}; only the last block and the "
        "head train. The reward axis runs from the penalty for a refused program up to 1, every sample "
        "passing." + ("" if learning else " The reward curves are drawn when the run directory has its receipts."),
        fill=bool(learning), part=PARTS[1])


def slide_example(x: Inputs) -> list[Slide]:
    example = example_completion(x.run, x.summary)
    if not example:
        return []  # the committed results/ hold no confirm receipts: no example rather than an invented one
    columns = []
    for when in ("before", "after"):
        verdict = example[f"{when}_eval"]
        columns.append(f"<div><h3>{when} RL: {esc(verdict['status'])}, {esc(verdict['tests_passed'])} of "
                       f"{esc(verdict['tests_total'])} tests</h3>" + code(example["prompt"] + example[when]) + "</div>")
    return [Slide(
        "example", "One task, before and after RL",
        "<p>A task RL never trained on, which the first RL run learned to solve. Each answer takes the "
        "likeliest byte at every step.</p>"
        "<div class='cols'>" + "".join(columns) + "</div>",
        f"Both completions are copied from the confirm receipts of this run (task {example['task_id']}, RL "
        f"seed {example['seed']}): the first task that seed gained. Point at what changed in the body, then "
        "at the verdict the sandbox gave each.", part=PARTS[1])]


# --------------------------------------------------------------------------- part 3: how we know


def slide_splits(x: Inputs) -> Slide:
    return Slide(
        "splits", "Sealed splits: grade on tasks no choice has seen",
        f"<p>Tasks come in fixed {dfn('split', 'splits')}. RL trains on the rl split. Every choice, such as "
        f"which saved {dfn('checkpoint')} of a run to keep, is made on the {dfn('dev', 'dev split')}.</p>"
        f"<p>The {dfn('sealed', 'sealed splits')} (confirm, holdout, final) are opened once, after every "
        "choice, and each opening is recorded before a single task is built.</p>"
        "<p>Why: a score on the tasks you chose with is flattered by the choosing. Chosen on dev, scored on a "
        "sealed split, it is honest.</p>",
        "Selection is a hidden form of training: pick the best of ten checkpoints on a split and that split's "
        "score is the best of ten draws, biased upwards. So every choice is made on dev, and the sealed splits "
        "answer only the question asked before they were opened. Each opening is written, hash-chained, to "
        "results/ledger.jsonl before any sealed task exists, naming the decision it follows; `glm53 ledger "
        "verify` checks the chain and that every sealed receipt is vouched for. A reopened split is no longer "
        "untouched, and the reports say so.", part=PARTS[2])


def slide_scoring(x: Inputs) -> Slide:
    g = x.summary.seeds[x.seeds[0]]["greedy_trained"]
    after = ", ".join(str(x.summary.seeds[s]["greedy_trained"]["after_solved"]) for s in x.seeds)
    k = x.plan.confirm_sampled.samples
    return Slide(
        "scoring", "Scoring: pass@1 and pass@k",
        f"<p>{dfn('pass-at-1', 'pass@1')}: the share of tasks whose one {dfn('greedy')} answer (the likeliest "
        "byte at every step) passes the hidden tests. "
        f"{dfn('pass-at-k', 'pass@k')}: the share where at least one of k sampled answers passes (here k = "
        f"{k}).</p>"
        f"<p>Tasks come in {dfn('family', 'families')} (double, increment, even, ...). A family's tasks compute "
        f"one function under different names, so {g['tasks']} tasks of {len(x.summary.trained_families)} "
        f"families are {len(x.summary.trained_families)} independent functions, not {g['tasks']}.</p>"
        f"<p>One {dfn('draw', 'draw')}, confirm split: {g['before_solved']} of {g['tasks']} before RL; {after} "
        f"after ({len(x.seeds)} RL seeds); the headline places it.</p>",
        f"pass@k is estimated without bias from n samples per task: 1 - C(n-c, k) / C(n, k), where c of the n "
        "samples pass. pass@1 with greedy decoding is one answer per task, so it is an exact count. The "
        "families: the original's eight (increment, double, even, square, absolute, nonnegative, reverse, "
        f"list_sum); RL trains on {', '.join(x.summary.trained_families)} only, so the other five show whether "
        "RL's gains spill over, or cost something. Counting functions, not tasks, is the first thing any "
        "test here does.", part=PARTS[2])


def slide_draws(x: Inputs) -> Slide:
    return Slide(
        "draws", "One run is a draw",
        f"<p>A {dfn('seed')} fixes a run's random choices: initial weights, data order, samples. The same "
        "recipe with another pretraining seed, another RL seed, or another CPU's arithmetic gives another "
        f"result. Each run is one {dfn('draw')} from a distribution.</p>"
        f"<p>Even the number format matters: {dfn('precision', 'fp32')} (32-bit floats) and bf16 (16-bit, "
        "fewer digits, faster on CPUs that have it) round differently, and a small model amplifies that.</p>"
        "<p>So a result is a distribution of draws, and one run is placed inside it.</p>",
        "The original miniature reported one run. If RL had landed on a lucky draw, or an unlucky one, one "
        "run could not tell. The headline therefore repeats the recipe over pretraining seeds (each a fresh "
        "model) and, within each, three RL seeds, in both precisions on the same seeds. `make demo` runs one "
        "draw on your machine and tells you where it falls among the committed ones. Your last digits may "
        "differ from ours: another CPU's math kernels round differently, which is exactly the point.",
        part=PARTS[2])


def slide_counting(x: Inputs) -> Slide:
    return Slide(
        "counting", "When does a difference count?",
        f"<p>Compare two recipes on the same {dfn('unit', 'units')}, the things that vary independently "
        f"(a distinct function, a seed): a {dfn('paired', 'paired')} comparison.</p>"
        f"<p>A test gives a {dfn('p-value')}: how often chance alone would give a gap this large. Many tests make "
        f"some gaps look real by luck, so a study corrects its p-values together ({dfn('holm', 'Holm')}).</p>"
        f"<p>A gap is {dfn('shown', 'shown')} when its corrected p is below 0.05; not shown means the data cannot tell. "
        f"Gaps are in {dfn('points')}: 60% to 62% is +2.</p>",
        "Three questions before anything holds. What varies independently? On the original suite a family's "
        "tasks compute one function, so the unit is the function; on the compositions suite behaviours of "
        "one structure group are alike, so the unit is the group; seeds are the outer level. How many "
        "comparisons? Holm's method sorts a study's p-values and multiplies the smallest by the number of "
        "tests, the next by one fewer, and so on: a result holds only if its corrected p stays below the "
        "level the plan chose (0.05). What could the plan detect? Its power, stated before the first run: "
        "the smallest true difference it would find 80% of the time. A gap smaller than that which shows "
        "nothing is not evidence of no gap. The appendix has each study's tests.", part=PARTS[2])


# --------------------------------------------------------------------------- part 4: what we found


def slide_headline(x: Inputs) -> Slide:
    from glm53_flash.report.distribution import distribution_figure

    if x.distribution is None:
        return Slide(
            "headline", "The headline: the original's experiment, many times",
            f"<p class='missing'>Not in this build: {esc(x.runs.name)}/{esc(DISTRIBUTION)} is missing. "
            "<code>glm53 reproduce --distribution</code> produces it; then rebuild with "
            "<code>glm53 slides build</code>.</p>",
            "No numbers are shown for a distribution that has not been run.", part=PARTS[3])
    sentences = findings.headline_findings(x.distribution)
    return Slide(
        "headline", "The headline: the original's experiment, many times",
        f"<p>The {dfn('original', 'original miniature')} published one run. We repeat it for two "
        f"{dfn('arm', 'arms')}, faithful (its settings) and ours (our defaults), over seeds, in fp32 and bf16.</p>"
        + "<ul class='findings'>" + "".join(f"<li>{_with_takeoff(esc(s))}</li>" for s in sentences) + "</ul>"
        + chart(distribution_figure(x.distribution), "headline", "tasks solved after RL, every draw, per arm and "
                                                                  "precision, with the original's result"),
        "The chart: each dot is one draw (a pretraining seed times an RL seed), a box per arm and precision "
        "(its median line and quartiles), the dashed red line the original's published 16 of 24. Confirm has "
        "24 tasks of 3 distinct functions; holdout 96. RL 'takes off' when it finds at least "
        f"{x.distribution['plan']['takeoff_min_exact']} exact rollouts in training; when it does not, the model "
        "barely moves, which is what the low bf16 dots are. The summary is read when the deck is built: it "
        "grows as draws land, so rebuild to see the latest. The tests and the power stated before the runs "
        "are in the appendix.", fill=True, part=PARTS[3])


def _with_takeoff(sentence: str) -> str:
    """The findings' first 'took off' defined where it is said."""
    return sentence.replace("took off", dfn("takeoff", "took off") + " (found passing programs to learn from)", 1)


# --------------------------------------------------------------------------- part 4: the studies


@dataclass
class StudyRead:
    """One deck entry's committed study as the slides read it: its summary, its plan (None for the vision
    path, which has none) and its charts at the deck's sizes."""
    entry: object
    summary: dict
    plan: dict | None
    charts: list
    stacked: bool

    @property
    def rerun(self) -> bool:
        return "rerun" in self.summary

    def close(self) -> None:
        """Release every chart drawn for this read (those a slide showed are closed already)."""
        for fig, _, _ in self.charts:
            figures.pyplot().close(fig)


def read_study(x: Inputs, entry) -> StudyRead | None:
    path = x.runs / entry.summary
    if not path.is_file():
        return None
    summary = read_json(path)
    plan = read_json(path.parent / "plan.json") if (path.parent / "plan.json").is_file() else None
    drawn, stacked = entry.figures(entry.slide_id, summary, path.parent) if entry.figures else ([], False)
    return StudyRead(entry, summary, plan, [(fig, name, alt) for fig, name, alt in drawn if fig is not None], stacked)


def study_groups(x: Inputs) -> list[list]:
    """The deck's study entries, each rerun with the study it repeats (its slide id + '-rerun')."""
    groups: list[list] = []
    for entry in x.studies:
        if groups and entry.slide_id == groups[-1][0].slide_id + "-rerun":
            groups[-1].append(entry)
        else:
            groups.append([entry])
    return groups


# What each study's slide says before its answer: the setting in a sentence, with the terms it needs.
def _vision_intro(read: StudyRead) -> str:
    return ("<p>The same kind of model can read images: an encoder cuts a digit's image into patches and turns "
            f"them into tokens. The GLM-style encoder (faithful) against a simpler {dfn('baseline')}. Right: "
            f"{dfn('confusion', 'confusion matrices')}, digit drawn against digit named.</p>")


def _pretraining_data_intro(read: StudyRead) -> str:
    conditions = len(read.summary.get("curves", {}).get(read.summary.get("primary_metric"), {}))
    return (f"<p>{conditions} mixes of {dfn('structure', 'structures')} (templates of generated functions), "
            f"{len(read.summary['seeds_completed'])} seeds each. {dfn('byte-accuracy', 'Byte accuracy')}: the "
            f"share of held-out bytes the model ranks first. Shaded: the 95% {dfn('interval', 'interval')}, the "
            "range that would hold the true mean in 95% of repeats.</p>")


def _rl_choices_intro(read: StudyRead) -> str:
    design = read.plan["design"]
    compositions = design.get("suite", "families") != "families"
    arms = len(design.get("arm_settings", {}))
    return ((f"<p>On the {dfn('compositions', 'compositions suite')}: functions built from generated steps. "
             if compositions else "<p>")
            + f"A {dfn('screen')} tries {arms} RL settings on dev; its pick is then confirmed against the "
              f"{dfn('baseline')} (the default recipe) on fresh seeds and a sealed split. "
            + f"{dfn('temperature', 'Temperature')}: how random sampling is.</p>")


def _generalisation_intro(read: StudyRead) -> str:
    return ("<p>RL on the compositions suite, then two sealed splits of tasks it never trained on. Scored with "
            f"the {dfn('strong-tests', 'strong tests')}: 50 or more extra cases per task that no reward "
            "sees.</p>")


def _rl_switches_intro(read: StudyRead) -> str:
    return (f"<p>The two arms differ in three RL {dfn('switch', 'switches')}. Each is flipped alone to the "
            "other arm's value; the chart shows what that does to the dev pass rate.</p>")


def _pretrain_switches_intro(read: StudyRead) -> str:
    return (f"<p>The two arms differ in three pretraining {dfn('switch', 'switches')}. Every combination is "
            "trained; the chart shows each switch's effect, the original's value minus ours, on dev and on a "
            "sealed split.</p>")


INTROS = {None: _vision_intro, "pretraining-data": _pretraining_data_intro, "rl-choices": _rl_choices_intro,
          "rl-generalisation": _generalisation_intro, "rl-switches": _rl_switches_intro,
          "pretrain-switches": _pretrain_switches_intro}


def story_charts(read: StudyRead) -> list:
    """The charts a study's story slide shows: all of them side by side, or the first of charts drawn one
    above the other (the others go to the appendix: more_charts)."""
    return read.charts[:1] if read.stacked else read.charts


def more_charts(read: StudyRead) -> list:
    return read.charts[1:] if read.stacked else []


def _study_charts(charts: list) -> str:
    if len(charts) == 1:
        return "".join(chart(fig, name, alt) for fig, name, alt in charts)
    return ("<div class='cols charts'>" + "".join(f"<div class='chart-column'>{chart(fig, name, alt)}</div>"
                                                  for fig, name, alt in charts) + "</div>")


def study_slides(x: Inputs) -> list[Slide]:
    """Each study's question, its answer in a sentence (a rerun's agreement in another) and its charts,
    drawn from its summary.json; a study not in this build names the command that makes it."""
    study_of = x.study_of
    slides = []
    for group in study_groups(x):
        entry = group[0]
        read = read_study(x, entry)
        missing = "".join(
            f"<p class='missing'>Not in this build: <code>{esc(x.runs.name)}/{esc(e.summary)}</code> is missing. "
            f"<code>{esc(e.command)}</code> produces it; then rebuild with <code>glm53 slides build</code>.</p>"
            for e in group if not (x.runs / e.summary).is_file())
        if read is None:
            slides.append(Slide(entry.slide_id, entry.title.removeprefix("Research study: "), missing,
                                "No numbers are shown for a study that has not been run.", part=PARTS[3]))
            continue
        study = read.plan.get("study") if read.plan else None
        answer = (findings.study_finding(read.plan, read.summary) if read.plan else
                  findings.vision_finding(read.summary))
        reruns = []
        for other in group[1:]:
            again = read_study(x, other)
            if again is not None:
                again.close()  # its charts are the appendix's
                if again.plan and again.rerun:
                    reruns.append(findings.rerun_finding(study_of(again.plan), again.summary))
        intro = INTROS.get(study, lambda read: "")(read)
        body = (intro + f"<p class='finding'>{esc(answer)}</p>" + missing
                + "".join(f"<p class='finding'>{esc(r)}</p>" for r in reruns) + _study_charts(story_charts(read)))
        source = f"{x.runs.name}/{entry.summary}"
        notes = (f"Read from {source} when the deck was built; its REPORT.md has every table and chart. The "
                 + ("sentence keeps the study's own verdicts (after its Holm correction, at the levels it names); "
                    if read.plan else "sentence is the exact sign-flip test over seeds, the study's one test; ")
                 + "the appendix shows the study's answer as it wrote it, and its table. " + CHART_NOTES.get(study, ""))
        slides.append(Slide(entry.slide_id, findings.question(read.plan), body, notes, fill=bool(read.charts),
                            part=PARTS[3]))
        read.close()  # the charts not shown here are drawn again by the appendix
    return slides


CHART_NOTES = {
    None: "Left: each seed's held-out accuracy for both encoders, a grey line joining the same seed. Right: "
          "what each encoder said for each digit drawn, pooled over seeds; darker is more.",
    "pretraining-data": "Left: byte accuracy over training, one colour per data mix (the same colours on every "
                        "slide). Right: each comparison's paired difference, right minus left, over training, one "
                        "marker and line style each. The appendix has each seed's difference at the last update. "
                        "Byte accuracy is teacher-forced: the model sees the true text before each byte, so it "
                        "measures prediction, not whether the model can write the expression itself, and none "
                        "could.",
    "rl-choices": "Left, the screen: every RL setting on dev, one dot per seed, the diamond their mean, the grey "
                  "dashed line the pretrained model. The screen only picks; with three seeds a setting can look "
                  "good by luck, which is why the pick is confirmed on ten fresh seeds. Right, the confirmation: "
                  "one grey line per fresh seed, from the baseline to the pick.",
    "rl-generalisation": "One row per arm, reward and sealed split, in the arm's colour: small dots are "
                         "pretraining seeds, the large dot the mean, the thick bar its 95% interval over "
                         "structure groups, the thin one over seeds. The three-case reward is the original's; "
                         "the strong-test reward rewards only programs that pass every strong case.",
    "rl-switches": "One row per arm and switch, in the arm's colour: each switch set alone to the other arm's "
                   "value, its effect on the dev pass rate. Small dots are pretraining seeds; thick bar: 95% "
                   "interval over structure groups; thin bar: over seeds.",
    "pretrain-switches": "One row per switch: the original's value minus ours, on dev (circles) and on the sealed "
                         "split (squares). Thick bar: 95% interval over structure groups; thin: over runs. "
                         "Rotary positions in the linear layers is the switch that matters: the original's "
                         "setting costs several points.",
}


# --------------------------------------------------------------------------- part 5: now try it


def slide_playground(x: Inputs) -> Slide:
    return Slide(
        "playground", "Now try it: the playground",
        code("glm53 serve")
        + f"<p>The {dfn('playground')} opens beside this deck (the link at the bottom).</p><ol>"
          "<li>Pick a dev task and press <em>complete</em>: the model writes its answer token by token, then "
          "the verifier judges each hidden test.</li>"
          "<li>Or choose <em>your own function and tests</em>: write a function and rows such as "
          "<code>3, 4 -&gt; 7</code>, then press <em>judge my function</em>. The same verifier judges it, as "
          "it judges RL's rewards.</li></ol>"
          f"<p>Then the exercises of {cite('docs/TUTORIAL.md')}.</p>",
        "`glm53 serve --checkpoint DIR` prints two links with a token that is new at each launch: the deck "
        "and the playground. Without a checkpoint the page says which command makes one, and you can still "
        "judge your own function. Try: a function that passes two of your rows and fails a third; then a "
        "program that reads a file, and ask which layer stops it. A row that is not 'arguments -> expected' "
        "gets a one-line error. The exercises in docs/TUTORIAL.md go further: change the RL learning rate, "
        "compare two seeds of one checkpoint, find the leave-one-out line in glm53_flash/train/rl.py.",
        part=PARTS[4])


# --------------------------------------------------------------------------- the appendix: the glossary

GLOSSARY_PER_SLIDE = 20


def glossary_slides(x: Inputs) -> list[Slide]:
    """Every term of report/glossary.py, in the order the story meets them, a fixed number per slide."""
    pages = [GLOSSARY[i:i + GLOSSARY_PER_SLIDE] for i in range(0, len(GLOSSARY), GLOSSARY_PER_SLIDE)]
    slides = []
    for number, page in enumerate(pages, 1):
        items = "".join(f"<dt>{dfn(term.key)}</dt><dd>{esc(term.definition)}</dd>" for term in page)
        slides.append(Slide(
            "glossary" if number == 1 else f"glossary-{number}",
            "Glossary" + (f" ({number} of {len(pages)})" if len(pages) > 1 else ""),
            f"<dl class='glossary'>{items}</dl>",
            "Every term the slides use, in the order the story meets them; each is defined again where it "
            "first appears. The appendix after this uses them freely.", part=APPENDIX))
    return slides


# --------------------------------------------------------------------------- the appendix: how claims are tested


def slide_methods(x: Inputs) -> Slide:
    return Slide(
        "methods", "How every claim is tested",
        "<ul>"
        "<li><strong>The unit.</strong> A test counts what varies independently: on the original suite a distinct "
        "function (a family's tasks compute one), on the compositions suite a structure group, and seeds "
        "(pretraining, then RL) as the outer level. Never a task id.</li>"
        "<li><strong>Paired tests.</strong> The sign-flip test over units or seeds (exact for few units); McNemar's "
        "exact test on the tasks that changed, where tasks are pooled and said to be.</li>"
        "<li><strong>Intervals.</strong> 95% intervals from the bootstrap over units, or t intervals over seeds.</li>"
        "<li><strong>Many tests.</strong> Each study corrects its own family of tests with Holm's method; a result "
        "holds only if its corrected p is below the level its plan chose (0.05), at every level it names.</li>"
        "<li><strong>Power.</strong> Before its first run, each plan states the smallest difference it would detect "
        "80% of the time. A difference below that which shows nothing is not evidence of no difference.</li>"
        "<li><strong>Reproduces.</strong> \"Reproduces\" and \"no worse\" are equivalence tests with a margin stated "
        "in advance.</li></ul>",
        "Every report of the project follows these rules. Holm's method, step "
        "by step: sort the m p-values from the smallest; multiply the smallest by m, the next by m - 1, and "
        "so on, each at least as large as the one before; compare each with 0.05. It controls the chance of "
        "any false claim in the family at 5%, without assuming the tests are independent. Power uses the "
        "exact noncentral t distribution from the spread the plan assumed.", part=APPENDIX)


def headline_appendix(x: Inputs) -> list[Slide]:
    from glm53_flash.report.distribution import cell_rows, primary_rows

    if x.distribution is None:
        return []
    summary = x.distribution
    columns, rows = primary_rows(summary)
    power = summary.get("power") or {}
    power_line = ("" if not power else
                  f"<p>Power, stated {esc(summary.get('power_stated', 'before the runs'))}: with "
                  f"{esc(power.get('seeds'))} pretraining seeds the plan detects "
                  f"{power.get('mdd_confirm_tasks', 0):.1f} confirm tasks of difference, and "
                  f"{100 * power.get('mdd_takeoff_fraction', 0):.0f} points of the share of RL runs that take off, "
                  "80% of the time.</p>")
    cell_columns, cells = cell_rows(summary)
    return [
        Slide("headline-tests", "The headline's tests",
              table(columns, rows) + power_line
              + "<p>Unit: the pretraining seed (each seed's value is the mean of its three RL seeds); the exact "
                "sign-flip test over seeds, Holm over the four primary comparisons.</p>",
              "A comparison not yet run has too few pretraining seeds for any test: the sign-flip test over one "
              "seed cannot give a p-value. The notes of the plan: " + " ".join(summary["plan"].get("notes", [])),
              part=APPENDIX),
        Slide("headline-cells", "The headline's draws, arm by arm",
              f"<div class='dense'>{table(cell_columns, cells)}</div>",
              "Median, quartiles and range over every draw of each arm and precision; how often RL took off; and "
              "where the original's 16 of 24 falls among the draws.", part=APPENDIX),
    ]


# --------------------------------------------------------------------------- the appendix: one draw in detail


def slide_result(x: Inputs) -> Slide:
    g = [x.summary.seeds[s]["greedy_trained"] for s in x.seeds]
    return Slide(
        "result", "One draw in detail: the confirm split",
        f"<p>The committed run of our arm, one pretraining seed, {len(x.seeds)} RL seeds; confirm split, after "
        "all selection, beside the original's published numbers.</p>"
        f"<div class='dense'>{html_from_markdown([unbreakable(line) for line in result_table(x.summary)])}</div>"
        + "".join(f"<p>{markdown_inline(line)}</p>" for line in goal_lines(x.summary) if line),
        # The split's ledger history is process, not result: the speaker's notes carry it, not the slide.
        f"{confirm_history(x.summary)} Greedy pass@1 on the trained families went from {g[0]['before_solved']}/{g[0]['tasks']} to "
        + ", ".join(f"{r['after_solved']}/{r['tasks']} (seed {s})" for s, r in zip(x.seeds, g))
        + f". The original miniature reported {ORIGINAL['greedy_trained'][0]}/{ORIGINAL['greedy_trained'][2]} to "
          f"{ORIGINAL['greedy_trained'][1]}/{ORIGINAL['greedy_trained'][2]} with one seed. The goals were the "
          "original issue's: match its greedy result with no losses, and harm no untrained family.",
        part=APPENDIX)


def slide_arms(x: Inputs) -> list[Slide]:
    """The two arms side by side and the tests that compare them (none for a one-arm run)."""
    if x.arms is None:
        return []
    from glm53_flash.report.arms import arm_rows, checkpoint_label, holdout_history

    comparison = x.arms["comparison"]
    equivalence = comparison.get("faithful_equivalent_to_original")
    holdout = comparison.get("ours_vs_faithful_holdout")
    both = comparison.get("units_and_seeds")
    lines = []
    if equivalence and equivalence.get("interval"):
        low, high = equivalence["interval"]
        lines.append(f"Does faithful reproduce the original's 16/24? Equivalence test, margin &plusmn;"
                     f"{100 * equivalence['margin']:.0f} points, over {len(equivalence['values'])} pretraining seeds: "
                     f"<strong>{'shown' if equivalence['equivalent'] else 'not shown'}</strong> (90% interval "
                     f"{100 * low:.0f}% to {100 * high:.0f}% against {100 * equivalence['original']:.0f}%).")
    if holdout:
        first = next(iter(holdout["rows"].values()))
        better = [n for n, r in holdout["rows"].items() if r["ours_better"]]
        worse = [n for n, r in holdout["rows"].items() if r["faithful_better"]]
        lines.append(f"Ours against faithful on holdout ({esc(first['tasks'])} tasks, {esc(first['units'])} units; "
                     "sign-flip test over units, Holm over the checkpoints compared): "
                     + (f"ours better {esc(', '.join(map(checkpoint_label, better)))}" if better else
                        "ours not shown better")
                     + (f"; faithful better {esc(', '.join(map(checkpoint_label, worse)))}" if worse else "") + ".")

    def gain(result):
        return "shown at both levels" if result["verdict"] != "not shown" else "not shown at both levels"

    if both:
        after = both["ours_minus_faithful_after"]
        lines.append(f"Units and {esc(after['seeds']['n'])} pretraining seeds together, ours minus faithful after RL: "
                     f"{100 * after['mean_difference']:+.1f} points, <strong>{esc(after['verdict'])}</strong>; RL's gain "
                     f"{gain(both['rl_gain_faithful'])} (faithful), {gain(both['rl_gain_ours'])} (ours).")
    power = x.arms.get("power")
    if power and "ours_vs_faithful_holdout" in power["questions"]:
        q = power["questions"]["ours_vs_faithful_holdout"]
        if not q["detectable"] and q["mdd_units"] is not None and q["mdd_seeds"] is not None:
            lines.append(f"Power: this plan detects differences of {100 * q['mdd_units']:.0f} points over units and "
                         f"{100 * q['mdd_seeds']:.0f} over seeds, not the {100 * q['effect_of_interest']:.0f} points "
                         "it asks about.")
    columns, rows = arm_rows(x.arms)
    return [Slide(
        "arms", "The two arms' first draws, tested",
        "<p>Same data, budget and settings; the faithful arm turns every switch back to the original's.</p>"
        + table(columns, rows) + "".join(f"<p>{line}</p>" for line in lines),
        "The faithful arm is the like-for-like comparison with the original's published numbers; each run opened "
        f"the holdout split after its own selection ({holdout_history(x.arms)}). Equivalence: the 90% interval of "
        "the faithful arm's mean must lie inside the original's value plus or minus the margin stated in "
        "advance. 'Not shown' is not 'different': with three pretraining seeds little can be shown either way, "
        "which is why the headline became a distribution.", part=APPENDIX)]


def slide_per_seed(x: Inputs) -> Slide:
    first = x.summary.seeds[x.seeds[0]]
    families = [f for f in x.summary.trained_families if f in first["greedy_by_family"]]
    rows = []
    for family in families:
        before = first["greedy_by_family"][family]
        rows.append([family, f"{before['before_solved']}/{before['tasks']}"]
                    + [f"{x.summary.seeds[s]['greedy_by_family'][family]['after_solved']}/{before['tasks']}"
                       for s in x.seeds])
    data = greedy_chart_data(x.summary)
    return Slide(
        "result-chart", "One draw: per RL seed and per family",
        "<div class='cols chart-first'><div class='chart-column'>"
        + chart(draw_greedy(data, size=(6.6, 5.4), arm=x.arm), "per-seed", "greedy pass@1 before RL and after it, "
                                                                           "per RL seed")
        + "</div><div><h3>greedy tasks solved on the confirm split, per trained family</h3>"
        + html_table(["family", "before RL"] + [f"seed {s}" for s in x.seeds], rows) + "</div></div>",
        "Each bar is one RL seed started from the same pretrained checkpoint; the whiskers are the receipts' 95% "
        "task-bootstrap interval of the paired change, drawn from the before-RL level. The dashed line is the "
        f"original miniature's published {ORIGINAL['greedy_trained'][1]}/{ORIGINAL['greedy_trained'][2]}, as a "
        "rate. The table splits the same greedy results by family: the even family is where RL gains nothing. "
        + "; ".join(f"Seed {s}: {x.summary.seeds[s]['greedy_trained']['gains']} tasks gained, "
                    f"{x.summary.seeds[s]['greedy_trained']['losses']} lost" for s in x.seeds) + ".",
        fill=True, part=APPENDIX)


def slide_selection(x: Inputs) -> list[Slide]:
    selection = selection_chart_data(x.run, x.summary)
    panels = [(selection_panel, selection, "pretrain")] + ([(selection_panel, selection, "rl", x.arm)]
                                                           if selection["rl"] else [])
    rule = x.summary.pretrain_selection["rule"]
    return [Slide(
        "selection", "One draw: choosing checkpoints on dev",
        f"<p>Rule, fixed in advance: {esc(rule)}.</p>"
        + chart(draw_panels(panels, size=(12, 4.4)), "selection", "exact dev rollouts per saved checkpoint, "
                                                                  "pretraining and each RL seed"),
        "Every saved checkpoint is scored on dev by sampled rollouts; the rule picks one before any sealed split "
        f"is opened. Pretraining kept {Path(x.summary.pretrain_selection['selected']).name}; RL kept, per seed: "
        + ", ".join(f"{s}: {Path(x.summary.seeds[s]['selected_checkpoint']).name}" for s in x.seeds) + ".",
        fill=True, part=APPENDIX)]


def slide_confirmation(x: Inputs) -> Slide:
    rows = []
    for s in x.seeds:
        v = x.summary.seeds[s]
        gt, st = v["greedy_trained"], v["sampled_trained"]
        rows.append((s, f"{gt['before_solved']}/{gt['tasks']} -> {gt['after_solved']}/{gt['tasks']}",
                     f"{gt['gains']} / {gt['losses']}", format_p(gt["mcnemar_p"]),
                     f"{format_signed(st['rate_difference'], scale=100)} "
                     f"{format_interval(st['rate_difference_ci'], scale=100)}"))
    opened = ("opened after the last selection receipt" if x.summary.confirm_opened_after_selection
              else "NOT opened after all selection")
    return Slide(
        "confirmation", "One draw: paired tests on the confirm split",
        table(["RL seed", "greedy pass@1, trained", "gains / losses", "McNemar p",
               "sampled exact rate change, points [95% interval]"], rows)
        + f"<p>The confirm split was {opened}.</p>",
        "McNemar's exact test counts only the tasks that changed, pooled over tasks (which are not independent: "
        "24 tasks are 3 functions). The interval is a task bootstrap. First confirm receipt "
        f"{x.summary.first_confirm_utc}, last selection receipt {x.summary.last_selection_utc}.", part=APPENDIX)


def slide_failures(x: Inputs) -> Slide:
    rows = []
    for family in x.summary.untrained_families:
        row = [label(family)]
        for s in x.seeds:
            v = x.summary.seeds[s]["untrained_interference"][family]
            mark = " (below 0)" if v["significant_drop"] else ""
            row.append(f"{v['before_exact']} -> {v['after_exact']}/{v['rollouts']} "
                       f"{format_interval(v['ci'], scale=100)}{mark}")
        rows.append(row)
    drops = sorted({f for s in x.seeds for f, v in x.summary.seeds[s]["untrained_interference"].items()
                    if v["significant_drop"]})
    first = x.summary.seeds[x.seeds[0]]
    return Slide(
        "failures", "One draw: did RL cost the untrained families?",
        table(["untrained family"] + [f"RL seed {s}" for s in x.seeds], rows)
        + chart(draw_family_changes(family_chart_data(x.summary), size=(14, 4.6), arm=x.arm), "families",
                "change in exact sampled completions per family and RL seed"),
        ("Untrained families that dropped beyond their interval on some seed: " + ", ".join(drops)
         + "." if drops else "No untrained family dropped beyond its interval.")
        + f" Greedy losses on the trained families, seed {x.seeds[0]}: {first['losses_on_trained_greedy']}."
        + " Solid bars are the families RL trained on, hatched ones it never saw; whiskers are 95% intervals.",
        fill=True, part=APPENDIX)


# --------------------------------------------------------------------------- the appendix: the studies

TOPICS = {"vision": "Vision", "pretraining-data": "Pretraining data", "rl-choices/families": "RL settings",
          "rl-choices/compositions": "RL settings, compositions suite", "rl-generalisation": "Generalisation",
          "rl-switches": "RL switches", "pretrain-switches": "Pretraining switches"}


def key_columns(rows: list[list]) -> int:
    """How many leading columns name a row (no cell of theirs starts with a number): repeated on every
    slide of a split table."""
    count = 0
    for column in range(len(rows[0]) if rows else 0):
        if any(re.match(r"\s*[-+\u2212]?\d", str(row[column])) for row in rows):
            break
        count += 1
    return max(1, min(count, TABLE_COLUMNS - 1))


def split_table(columns: list, rows: list[list]) -> list[tuple[list, list[list]]]:
    """A wide table as narrower ones of at most TABLE_COLUMNS columns, each with the key columns and as
    many of the others as the rest (so no part holds a lone column)."""
    if len(columns) <= TABLE_COLUMNS:
        return [(columns, rows)]
    keys = key_columns(rows)
    rest = list(range(keys, len(columns)))
    parts = -(-len(rest) // (TABLE_COLUMNS - keys))
    base, extra = divmod(len(rest), parts)  # the first `extra` parts take one column more
    starts = [i * base + min(i, extra) for i in range(parts + 1)]
    chunks = [rest[starts[i]:starts[i + 1]] for i in range(parts)]
    return [([columns[i] for i in range(keys)] + [columns[i] for i in chunk],
             [[row[i] for i in range(keys)] + [row[i] for i in chunk] for row in rows]) for chunk in chunks]


def study_appendix(x: Inputs) -> list[Slide]:
    """Per study in the build: its answer as the study wrote it (identifiers in words), its table (split
    over slides when wide), and a rerun's charts."""
    study_of = x.study_of
    slides = []
    for entry in x.studies:
        read = read_study(x, entry)
        if read is None:
            continue
        key = findings.study_key(read.plan) if read.plan else "vision"
        topic = TOPICS.get(key, key) + (", the rerun" if read.rerun else "")
        names = rl_arm_names(read.summary.get("arms") or [])  # an RL-choices study's arms, in words
        if read.plan:
            answer = study_of(read.plan).answer(read.plan, read.summary)
            sentences = [answer]
            if read.rerun:
                verdicts = study_of(read.plan).rerun_verdicts(read.summary["rerun"])
                sentences.append("Against the first study: " + "; ".join(
                    f"{name}: {'yes' if holds else 'no'}" for name, holds in verdicts.items()) + ".")
        else:
            sentences = list(read.summary.get("answers", []))
        source = f"{x.runs.name}/{entry.summary}"
        slides.append(Slide(
            f"{entry.slide_id}-answer", f"{topic}: the answer, as tested",
            "".join(f"<p>{esc(plain(s, names))}</p>" for s in sentences),
            f"The study's own sentence, from its answer() over {source}: what holds after its Holm correction, "
            "at the levels it names (groups, seeds, runs). The story slide says the same in fewer words.",
            part=APPENDIX))
        headline = read.summary.get("headline_table", {})
        parts = split_table(headline.get("columns", []), headline.get("rows", []))
        for number, (columns, rows) in enumerate(parts, 1):
            suffix = f" ({number} of {len(parts)})" if len(parts) > 1 else ""
            slides.append(Slide(
                f"{entry.slide_id}-table" + (f"-{number}" if number > 1 else ""), f"{topic}: the table{suffix}",
                f"<div class='dense'>{table(columns, rows, names=names)}</div>",
                f"From {source}. Differences are right minus left (or after minus before), paired by seed; 'Holm p' "
                "is the p-value after the study's correction." + (" A wide table is split over slides; the first "
                                                                   "columns repeat." if len(parts) > 1 else ""),
                part=APPENDIX))
        charts = read.charts if read.rerun else more_charts(read)
        if charts:
            slides.append(Slide(
                f"{entry.slide_id}-charts", f"{topic}: " + ("the chart" if len(charts) == 1 else "the charts"),
                _study_charts(charts),
                f"Drawn from {source}. " + ("The rerun's chart reads as the first study's on its story slide."
                                            if read.rerun else "One dot per seed and comparison, the diamond their "
                                                               "mean with its 95% interval: read the spread before "
                                                               "the mean."),
                fill=True, part=APPENDIX))
        read.close()  # the story slide showed the others
    return slides


# --------------------------------------------------------------------------- the appendix: sources


def code_version(commit: str | None) -> str:
    """A git commit as core.receipts.git_commit gives it ("+dirty": the tree had uncommitted changes), in
    words, its hash as a <code class="commit"> (the one place a slide shows a hash)."""
    if not commit:
        return "not recorded (not a git checkout)"
    clean = commit.removesuffix("+dirty")
    return (f"git commit <code class='commit'>{esc(clean[:12])}</code>, "
            + ("with uncommitted changes" if clean != commit else "a clean tree (no uncommitted change to a tracked "
                                                                  "file)"))


def slide_sources(x: Inputs) -> Slide:
    code_cell = code_version(x.code)
    rows = [
        ("this deck", f"<code>glm53 slides build --runs {esc(x.runs.name)}</code>"),
        ("the code that built it", code_cell),
        ("the headline run", f"{cite_or_text(x, x.run / 'summary.json')}, made by "
                             "<code>glm53 reproduce --preset headline</code>"),
    ]
    if x.distribution is not None:
        rows.append(("the headline distribution", f"{cite_or_text(x, x.runs / DISTRIBUTION)}, made by "
                                                  "<code>glm53 reproduce --distribution</code>"))
    for entry in x.studies:
        path = x.runs / entry.summary
        if path.is_file():
            plan = read_json(path.parent / "plan.json") if (path.parent / "plan.json").is_file() else None
            name = TOPICS.get(findings.study_key(plan) if plan else "vision", entry.slide_id)
            rows.append((name + (", the rerun" if entry.slide_id.endswith("-rerun") else ""),
                         f"{cite_or_text(x, path)}, made by <code>{esc(entry.command)}</code>"))
    rows.append(("GLM-5.3-Flash's numbers", f"{esc(RELEASED_SOURCE.replace(RELEASED_SOURCE_PATH, ''))}"
                                            f"{cite(RELEASED_SOURCE_PATH)}"))
    body = ("<table><thead><tr><th>numbers</th><th>source</th></tr></thead><tbody>"
            + "".join(f"<tr><td>{esc(name)}</td><td>{cell}</td></tr>" for name, cell in rows) + "</tbody></table>")
    prov = x.summary.provenance
    return Slide(
        "sources", "Where every number came from", f"<div class='dense'>{body}</div>",
        "Nothing on these slides is typed by hand: rebuild with `glm53 slides build --runs DIR`. The commit is "
        "read when the deck is built, with whether the working tree had uncommitted changes. The headline "
        f"run's own receipt records its machine: {prov['platform']}, {prov['cpu_count']} CPUs, created "
        f"{prov['created_utc']}.", part=APPENDIX)


def cite_or_text(x: Inputs, path: Path) -> str:
    """A file the deck read, as its path under the results directory's name (cited when it lies in this
    repository's results/)."""
    relative = Path(x.runs.name) / path.relative_to(x.runs)
    return f"<code>{esc(relative)}</code>"


SLIDES = (slide_title, slide_bytes, slide_attention, slide_experts, slide_streams, slide_architecture,
          slide_pretraining, slide_verifier, slide_rloo, slide_example,
          slide_splits, slide_scoring, slide_draws, slide_counting,
          slide_headline, study_slides,
          slide_playground,
          glossary_slides, slide_methods, headline_appendix, slide_result, slide_arms, slide_per_seed, slide_selection,
          slide_confirmation, slide_failures, study_appendix, slide_sources)


def build_deck(runs: str | Path, studies: tuple, study_of: Callable) -> str:
    """The whole deck as one HTML string (with a token placeholder the server fills in); `studies` are the
    study slides' entries and `study_of` finds a plan's study (experiments/registry.py deck_entries and
    study_of: the studies sit above the reports, so the caller hands them down)."""
    inputs = Inputs.load(runs, studies, study_of)
    slides: list[Slide] = []
    for make in SLIDES:
        made = make(inputs)
        slides += made if isinstance(made, list) else [made]
    return render(slides)


def deck_assets() -> tuple[str, str]:
    """(the deck's stylesheet, its script): the only style and script its pages allow."""
    return (ASSETS / "deck.css").read_text(encoding="utf-8"), (ASSETS / "deck.js").read_text(encoding="utf-8")


def deck_policy(header: bool = True) -> str:
    """The deck's content security policy: its own script and stylesheet, nothing inline else."""
    css, script = deck_assets()
    return content_security_policy([script], [css], header=header)


def render(slides: list[Slide]) -> str:
    css, script = deck_assets()
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{esc(deck_policy(header=False))}\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<meta name=\"glm53-token\" content=\"{TOKEN_PLACEHOLDER}\">"
            "<title>glm53_flash: the course</title>"
            f"<style>{css}</style></head><body>"
            "<div id=\"progress\"><div id=\"bar\"></div></div>"
            "<main id=\"deck\">" + "".join(slide.html() for slide in slides) + "</main>"
            "<div id=\"presenter\" hidden><div id=\"presenter-current\" class=\"preview\"></div>"
            "<div id=\"presenter-side\"><div id=\"presenter-next\" class=\"preview\"></div>"
            "<div id=\"presenter-clock\"></div><div id=\"presenter-notes\"></div></div></div>"
            "<footer id=\"chrome\"><span id=\"counter\"></span>"
            "<button id=\"toggle-notes\" title=\"speaker notes (S)\">notes</button>"
            "<button id=\"open-presenter\" title=\"presenter view (P)\">presenter</button>"
            "<button id=\"toggle-feedback\" title=\"feedback (F)\">feedback</button>"
            "<a id=\"playground-link\" href=\"/playground\">playground</a></footer>"
            "<div id=\"feedback\" hidden><label for=\"feedback-text\">Feedback on this slide</label>"
            "<textarea id=\"feedback-text\" rows=\"5\"></textarea><span id=\"feedback-status\"></span></div>"
            f"<script>{script}</script></body></html>\n")


def write_deck(runs: str | Path, output: str | Path, studies: tuple, study_of: Callable) -> Path:
    from glm53_flash.core.receipts import write_text

    return write_text(output, build_deck(runs, studies, study_of))
