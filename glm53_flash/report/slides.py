"""The course deck: one self-contained HTML file built only from receipts and from the code itself.

`glm53 slides build --runs DIR` reads DIR/headline/summary.json (the committed `results/`) or
DIR/summary.json (a `glm53 reproduce` run directory such as runs/demo), the charts next to it, the
confirm receipts when the run has them (for example completions), and the study summaries its caller
names (`studies`: the vision path's and every registered study's, experiments/registry.py). Charts are
drawn here from the same numbers (report/headline.py's chart data and drawing functions) as inline SVG sized for their slide, so their
text stays readable on a 1280x800 screen. Numbers about the miniature come from
ModelConfig and GLM53Flash.parameter_counts(); numbers about the released model come from
RELEASED below, each with its source. The output embeds its CSS, script and charts (no network
fetch), so it opens from file:// as well as from `glm53 serve`, and carries its content security
policy (report/page_policy.py: only its own script and stylesheet run; every value from a receipt is
escaped as well). The build is deterministic: the same inputs give the same bytes.

One function per slide (`SLIDES` lists them in order); each takes the `Inputs` and returns its
slides (none, one or more). Every slide has speaker notes, shown under the slide (key S) and in the
presenter view (key P or `?presenter`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from glm53_flash.core.receipts import read_json
from glm53_flash.train.plan import ReproducePlan
from glm53_flash.report import figures
from glm53_flash.report.format import format_interval, format_p, format_signed
from glm53_flash.report.headline import (confirm_history, ORIGINAL, draw_family_changes, draw_greedy, draw_panels, family_chart_data, goal_lines,
                       greedy_chart_data, learning_chart_data, loss_panel, result_table, reward_panel,
                       selection_chart_data, selection_panel)
from glm53_flash.report.page_policy import content_security_policy
from glm53_flash.report.summary import RunSummary
from glm53_flash.report.tables import esc, html_from_markdown, html_table

ASSETS = Path(__file__).resolve().parent / "assets"
TOKEN_PLACEHOLDER = "__GLM53_TOKEN__"

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
RELEASED_SOURCE_PATH = "docs/GLM_MAPPING.md"
RELEASED_SOURCE = ("the released GLM-5.3-Flash config.json and Hugging Face Transformers glm5_next code, "
                   f"tabulated in {RELEASED_SOURCE_PATH}")

def headline_dir(runs: Path) -> Path:
    """Where the headline summary lives: DIR/headline (committed results) or DIR (a reproduce run)."""
    for candidate in (runs / "headline", runs):
        if (candidate / "summary.json").is_file():
            return candidate
    raise FileNotFoundError(f"no headline summary.json in {runs} or {runs / 'headline'}; `make demo` writes "
                            f"runs/demo/summary.json and results/headline/ holds the committed one")


# What one study slide holds at 1280x800, in characters: about 80 per table row plus the answers' text.
STUDY_SLIDE_BUDGET = 1500
ROW_CHARACTERS = 80


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


def markdown_inline(text: str) -> str:
    """**bold** and `code` in the goal sentences of report/headline.py."""
    parts = esc(text).split("**")
    text = "".join(f"<strong>{p}</strong>" if i % 2 else p for i, p in enumerate(parts))
    parts = text.split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


@dataclass
class Slide:
    """body is HTML built by this module; title and notes are plain text and are escaped. A slide with
    charts fills the window (`fill`): its body is a column whose charts take the height the rest leaves."""
    id: str
    title: str
    body: str
    notes: str
    fill: bool = False

    def html(self) -> str:
        body_class = "body fill" if self.fill else "body"
        return (f'<section class="slide" id="{esc(self.id)}" data-title="{esc(self.title)}">'
                f'<h2 data-edit="{esc(self.id)}/title">{esc(self.title)}</h2><div class="{body_class}">{self.body}</div>'
                f'<aside class="notes">{esc(self.notes)}</aside></section>')


@dataclass
class Inputs:
    """Everything the slides read: the results directory, the headline summary and its run directory."""
    runs: Path
    run: Path
    summary: RunSummary
    facts: dict = field(default_factory=dict)
    arms: dict | None = None  # the two-arm summary, when the headline directory has one
    studies: tuple = ()  # the study slides' entries, in order (experiments/registry.py deck_entries)

    @property
    def plan(self) -> ReproducePlan:
        return self.summary.plan

    @property
    def seeds(self) -> list[str]:
        return self.summary.rl_seeds

    @property
    def size(self) -> str:
        total = self.facts["counts"]["total"]
        return f"{total / 1e6:.1f}M" if total >= 1e6 else f"{total / 1e3:.0f}K"

    @classmethod
    def load(cls, runs: str | Path, studies: tuple = ()) -> "Inputs":
        """The headline's slides describe one run: a one-arm directory's, or a two-arm directory's
        `ours` arm (the two-arm summary is kept for the slide that compares the arms)."""
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
        return cls(runs, run, summary, miniature_facts(plan.pretrain.preset, plan.pretrain.model_overrides), arms,
                   tuple(studies))


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
    return [(label, source, verdict.to_dict()) for (label, source), verdict in zip(programs, verdicts)]


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


# --------------------------------------------------------------------------- the slides, in order


def slide_result(x: Inputs) -> Slide:
    g = [x.summary.seeds[s]["greedy_trained"] for s in x.seeds]
    return Slide(
        "result", "Result first: RL on hidden unit tests",
        f"<p>A {x.size}-parameter byte-level model, pretrained from random weights, then post-trained with a "
        "reward that is only <em>did the hidden unit tests pass</em>. Confirm split, after all selection:</p>"
        + html_from_markdown(result_table(x.summary))
        + "".join(f"<p>{markdown_inline(line)}</p>" for line in goal_lines(x.summary) if line),
        # The split's ledger history is process, not result: the speaker's notes carry it, not the slide.
        f"{confirm_history(x.summary)} Greedy pass@1 on the trained families went from {g[0]['before_solved']}/{g[0]['tasks']} to "
        + ", ".join(f"{r['after_solved']}/{r['tasks']} (seed {s})" for s, r in zip(x.seeds, g))
        + f". The original miniature reported {ORIGINAL['greedy_trained'][0]}/{ORIGINAL['greedy_trained'][2]} to "
          f"{ORIGINAL['greedy_trained'][1]}/{ORIGINAL['greedy_trained'][2]} with one seed. Say plainly where we fall "
          "short: read the goal lines aloud, then move to the per-seed chart.")


def slide_arms(x: Inputs) -> list[Slide]:
    """The two arms side by side and the two questions they answer (none for a one-arm run)."""
    if x.arms is None:
        return []
    from glm53_flash.report.arms import arm_table, checkpoint_label, holdout_history

    comparison = x.arms["comparison"]
    equivalence = comparison.get("faithful_equivalent_to_original")
    holdout = comparison.get("ours_vs_faithful_holdout")
    both = comparison.get("units_and_seeds")
    lines = []
    if equivalence and equivalence.get("interval"):
        low, high = equivalence["interval"]
        lines.append(f"Reproduces the original's 16/24? Equivalence within &plusmn;{100 * equivalence['margin']:.0f} "
                     f"points over {len(equivalence['values'])} pretraining seeds: <strong>"
                     f"{'shown' if equivalence['equivalent'] else 'not shown'}</strong> (90% interval "
                     f"{100 * low:.0f}% to {100 * high:.0f}% against {100 * equivalence['original']:.0f}%).")
    if holdout:
        first = next(iter(holdout["rows"].values()))
        better = [n for n, r in holdout["rows"].items() if r["ours_better"]]
        worse = [n for n, r in holdout["rows"].items() if r["faithful_better"]]
        lines.append(f"Ours vs faithful on holdout ({esc(first['tasks'])} tasks are {esc(first['units'])} units; sign-flip over "
                     "units, Holm over checkpoints): "
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
        lines.append(f"Power: this plan detects differences of {100 * q['mdd_units']:.0f} points over units and "
                     f"{100 * q['mdd_seeds']:.0f} over seeds, not the {100 * q['effect_of_interest']:.0f} points it asks about."
                     if not q["detectable"] and q["mdd_units"] is not None and q["mdd_seeds"] is not None else
                     "Power: see the report.")
    return [Slide(
        "arms", "Two arms: the original's switches against ours",
        "<p>Same data, budget and hyperparameters; the faithful arm turns every switch back to the original's.</p>"
        + html_from_markdown(arm_table(x.arms)) + "".join(f"<p>{line}</p>" for line in lines),
        "The faithful arm is the like-for-like comparison with the original's published numbers; each run opened "
        f"the holdout split after its own selection ({esc(holdout_history(x.arms))}; results/ledger.jsonl has "
        "every opening and its reason). Read the two answers, then the seed spread in the report.")]


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
    gains = ", ".join(f"seed {s}: {x.summary.seeds[s]['greedy_trained']['gains']} gained, "
                      f"{x.summary.seeds[s]['greedy_trained']['losses']} lost" for s in x.seeds)
    return Slide(
        "result-chart", "Per seed and per family",
        "<div class='cols chart-first'><div class='chart-column'>"
        + chart(draw_greedy(data, size=(6.6, 5.4)), "per-seed", "greedy pass@1 before RL and after it, per seed")
        + "</div><div><h3>greedy tasks solved on the confirm split, per trained family</h3>"
        + html_table(["family", "before RL"] + [f"seed {s}" for s in x.seeds], rows)
        + f"<p>Paired per task: {esc(gains)}.</p></div></div>",
        f"Each bar is one RL seed started from the same pretrained checkpoint; the whiskers are the receipts' 95% "
        f"task-bootstrap interval of the paired change, drawn from the before-RL level. The dashed line is the "
        f"original miniature's published {ORIGINAL['greedy_trained'][1]}/{ORIGINAL['greedy_trained'][2]}, as a rate. "
        "The table splits the same greedy results by family: the even family is where RL gains nothing.", fill=True)


def slide_example(x: Inputs) -> list[Slide]:
    example = example_completion(x.run, x.summary)
    if not example:
        return []  # the committed results/ hold no confirm receipts: no example rather than an invented one
    columns = []
    for when in ("before", "after"):
        verdict = example[f"{when}_eval"]
        columns.append(f"<div><h3>{when} RL: {esc(verdict['status'])} {esc(verdict['tests_passed'])}/"
                       f"{esc(verdict['tests_total'])}</h3>" + code(example["prompt"] + example[when]) + "</div>")
    return [Slide(
        "example", "One confirm task, before and after RL",
        f"<p>Confirm task <code>{esc(example['task_id'])}</code>, greedy, seed {esc(example['seed'])}:</p>"
        "<div class='cols'>" + "".join(columns) + "</div>",
        "Both completions are copied from the confirm receipts of this run: the first task the first seed "
        "gained. Point at what changed in the body, then at the verdict the sandbox gave each.")]


def slide_architecture(x: Inputs) -> Slide:
    cfg, counts, facts = x.facts["config"], x.facts["counts"], x.facts
    released_rows = [
        ("total parameters", RELEASED["total_parameters"], f"{counts['total']:,}"),
        ("active parameters per token", RELEASED["active_parameters"], f"{counts['active']:,} (routed experts at k/E)"),
        ("layers", RELEASED["layers"], str(cfg.layers)),
        ("attention", RELEASED["attention"],
         (f"{facts['linear']} linear + {facts['sparse']} local+strided sparse (layers "
          f"{', '.join(map(str, facts['sparse_layers']))})")),
        ("hidden size", RELEASED["hidden"], str(cfg.dim)),
        ("experts", RELEASED["experts"], f"{cfg.experts} routed, top-{cfg.top_k}, + 1 shared"),
        ("residual streams", RELEASED["streams"], f"{cfg.streams} (stream mode '{cfg.stream_mode}')"),
        ("vocabulary", RELEASED["vocab"], f"{cfg.vocab_size} (bytes + 4 specials)"),
        ("context", RELEASED["context"], str(cfg.max_sequence_length)),
        ("positions", RELEASED["position"], f"RoPE in the sparse layers; linear layers: '{cfg.linear_rope}'"),
    ]
    return Slide(
        "architecture", "GLM-5.3-Flash, and our miniature of it",
        html_table(["", "GLM-5.3-Flash (published)", "this miniature (from the code)"], released_rows)
        + f"<p class='source'>Published numbers: {esc(RELEASED_SOURCE.replace(RELEASED_SOURCE_PATH, ''))}"
          f"{cite(RELEASED_SOURCE_PATH)}. Miniature: the run's ModelConfig (preset "
          f"{esc(x.plan.pretrain.preset)}) and GLM53Flash.parameter_counts().</p>",
        "The right-hand column is computed from the code when the deck is built. docs/GLM_MAPPING.md has "
        "every deviation and its reason. Stress the shape that is kept (linear and sparse layers in a fixed "
        "rhythm, shared plus routed experts, several residual streams) and the scale that is not.")


def slide_block(x: Inputs) -> Slide:
    cfg = x.facts["config"]
    rhythm = " ".join("S" if kind == "sparse" else "L" for kind in x.facts["pattern"])
    return Slide(
        "architecture-block", f"One hybrid block, {cfg.layers} times",
        code(f"bytes -> embedding [B, T, {cfg.dim}] -> {cfg.streams} residual streams\n"
             f"  -> {cfg.layers} x HybridBlock:  mix streams -> RMSNorm -> attention -> RMSNorm -> MoE\n"
             f"     layer rhythm: {rhythm}   (L = linear, S = sparse)\n"
             f"  -> mean over streams -> RMSNorm -> tied head -> logits [B, T, {cfg.vocab_size}]")
        + html_table(["piece", "setting"], [
            ("linear attention", f"ELU+1 feature map, {cfg.heads} heads, chunk {cfg.linear_chunk}"),
            ("sparse attention", f"window {cfg.sparse_window} + every {cfg.sparse_stride}th key"),
            ("mixture of experts", (f"{cfg.experts} SwiGLU experts of width {cfg.expert_hidden}, "
                                    f"top-{cfg.top_k}, + 1 shared; balance loss weight {cfg.balance_loss_weight}")),
        ]),
        "Linear layers carry a fixed-size state, so decoding costs the same per token at any length; the "
        "sparse layers see exact keys in a window plus strided anchors. Walk the arrow line left to right once.")


def slide_bytes(x: Inputs) -> Slide:
    from glm53_flash.data.tokenizer import ByteTokenizer

    tok = ByteTokenizer()
    sample = "def increment(x):"
    ids = tok.encode(sample)
    return Slide(
        "bytes-vs-bpe", "Bytes, not BPE",
        html_table(["", "GLM-5.3-Flash tokenizer", "ByteTokenizer"], [
            ("vocabulary", RELEASED["vocab"], f"{tok.vocab_size}"),
            (f"tokens for '{sample}'", f"{RELEASED['bpe_example_tokens']} (published example)", str(len(ids))),
        ]) + code(f"{sample!r} -> {ids}")
        + f"<p>Every UTF-8 byte b becomes id b + {tok.byte_offset}; ids 0-3 are PAD, BOS, EOS, SEP.</p>",
        "No learned vocabulary, exact round trip for any text, a 260-row embedding table; the price is "
        "longer sequences: count the ids on the slide against the published four tokens.")


def slide_pretraining(x: Inputs) -> Slide:
    from glm53_flash.tasks import FAMILIES, pretraining_text

    selection = x.summary.pretrain_selection
    learning = learning_chart_data(x.run, x.summary)
    panels = ([(loss_panel, learning)] if learning else []) + [(selection_panel, selection_chart_data(x.run, x.summary),
                                                               "pretrain")]
    figure = chart(draw_panels(panels, size=(6.4, 3.1 * len(panels) + 0.3), stacked=True), "pretraining",
                   "pretraining loss and dev selection" if learning else "dev selection of pretraining checkpoints")
    return Slide(
        "pretraining", "Pretraining: next byte on tiny Python functions",
        "<div class='cols'><div>" + code(pretraining_text(0))
        + html_table(["setting", "value"], [
            ("steps", x.plan.pretrain.steps),
            ("batch x sequence", f"{x.plan.pretrain.batch_size} x {x.plan.pretrain.sequence_length}"),
            ("learning rate", x.plan.pretrain.learning_rate),
            ("seconds (this run)", f"{x.summary.stage_seconds['pretrain']:.0f}"),
            ("families in the corpus", len(FAMILIES)),
        ])
        + f"<p>Selected: <code>{esc(Path(selection['selected']).name)}</code> ({esc(selection['rule'])}).</p>"
        + "</div><div class='chart-column'>" + figure + "</div></div>",
        "The first example of the pretraining stream is shown verbatim; the model sees the same families "
        "that are later evaluated, only the function names differ. The chart counts exact sampled dev "
        "rollouts per saved checkpoint: the selection rule picks the best one before RL starts"
        + (", and the loss curve shows the run that produced them." if learning else
           ". (The loss curve is drawn when the deck is built from a run directory with its metrics receipts.)"),
        fill=True)


def slide_verifier(x: Inputs) -> Slide:
    from glm53_flash.tasks import frozen_tasks

    task = frozen_tasks("dev", 1, ("double",))[0]
    verdicts = verifier_examples(task)
    return Slide(
        "verifier", "The verifier: hidden tests in a sandbox",
        code(task.prompt)
        + html_table(["hidden case", "expected"],
                     [(", ".join(repr(a) for a in c.arguments), repr(c.expected)) for c in task.cases])
        + html_table(["program", "status", "tests passed", "message"],
                     [(label, v["status"], f"{v['tests_passed']}/{v['tests_total']}", v["message"])
                      for label, _, v in verdicts]),
        "These three verdicts were computed by the sandboxed verifier when this deck was built: a static "
        "policy first, then isolated worker processes with CPU, memory and output limits. The forbidden "
        "import never runs: the policy refuses it before any process starts.")


def slide_rloo(x: Inputs) -> Slide:
    learning = learning_chart_data(x.run, x.summary)
    selection = selection_chart_data(x.run, x.summary)
    panels = ([(reward_panel, learning)] if learning else []) + ([(selection_panel, selection, "rl")]
                                                                 if selection["rl"] else [])
    if panels:
        right = chart(draw_panels(panels, size=(6.4, 2.9 * len(panels) + 0.5), stacked=True), "rloo",
                      "RL reward and dev selection per seed")
    else:
        right = ("<h3>checkpoint chosen on dev, per seed</h3>"
                 + html_table(["seed", "selected checkpoint"],
                              [(s, Path(x.summary.seeds[s]["selected_checkpoint"]).name) for s in x.seeds]))
    return Slide(
        "rloo", "RLOO: the reward is the test result",
        code("advantage_i = reward_i - mean(reward_j for j != i)   # G samples\n"
             "loss        = - sum_i advantage_i * log p(completion_i)")
        + "<div class='cols'><div>"
        + html_table(["setting", "value"], [
            ("trained families", ", ".join(x.summary.trained_families)),
            ("groups x samples per group", f"{x.plan.rl.groups} x {x.plan.rl.group_size}"),
            ("temperature", x.plan.rl.temperature), ("learning rate", x.plan.rl.learning_rate),
            ("trainable scope", x.plan.rl.train_scope), ("reward", x.plan.rl.reward_mode),
            ("seeds", ", ".join(x.seeds)),
        ]) + "</div><div class='chart-column'>" + right + "</div></div>",
        "A group whose samples all get the same reward carries no signal and makes no update. Each seed's "
        "checkpoint is chosen on dev, never on confirm"
        + (": the chart shows the mean reward per update and the dev score of every saved checkpoint." if panels
           else "; the reward curves are drawn when the deck is built from a run directory with its receipts."),
        fill=bool(panels))


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
        "confirmation", "Confirmation: paired tests on a held-out split",
        html_table(["seed", "greedy pass@1, trained", "gains / losses", "McNemar p",
                    "sampled exact rate change, points [95% CI]"], rows)
        + f"<p>Confirm split {opened}: first confirm receipt {esc(x.summary.first_confirm_utc)}, last "
          f"selection receipt {esc(x.summary.last_selection_utc)}.</p>",
        "McNemar's exact test counts only the tasks that changed; the CI is a task bootstrap. A dev win "
        "is not a discovery until the untouched split agrees.")


def slide_failures(x: Inputs) -> Slide:
    rows = []
    for family in x.summary.untrained_families:
        row = [family]
        for s in x.seeds:
            v = x.summary.seeds[s]["untrained_interference"][family]
            mark = " (CI below 0)" if v["significant_drop"] else ""
            row.append(f"{v['before_exact']} -> {v['after_exact']}/{v['rollouts']} "
                       f"{format_interval(v['ci'], scale=100)}{mark}")
        rows.append(row)
    drops = sorted({f for s in x.seeds for f, v in x.summary.seeds[s]["untrained_interference"].items()
                    if v["significant_drop"]})
    first = x.summary.seeds[x.seeds[0]]
    return Slide(
        "failures", "Failures and interference",
        html_table(["untrained family"] + [f"seed {s}" for s in x.seeds], rows)
        + chart(draw_family_changes(family_chart_data(x.summary), size=(14, 4.6)), "families",
                "change in exact sampled completions per family and seed"),
        ("Untrained families that dropped beyond their confidence interval on some seed: " + ", ".join(drops)
         + "." if drops else "No untrained family dropped beyond its confidence interval.")
        + f" Greedy losses on the trained families, seed {x.seeds[0]}: {first['losses_on_trained_greedy']}."
        + " Solid bars are the families RL trained on, hatched ones it never saw; whiskers are 95% CIs.", fill=True)


def study_slides(x: Inputs) -> list[Slide]:
    """Vision and the research studies, rendered generically from their summary.json: each entry of
    `x.studies` names its slide id, title, the command that produces it, its summary under the runs
    directory and its charts at the deck's sizes (`figures(slide_id, summary, directory)`)."""
    slides = []
    for entry in x.studies:
        slide_id, title, command, relative = entry.slide_id, entry.title, entry.command, entry.summary
        path = x.runs / relative
        if not path.is_file():
            slides.append(Slide(
                slide_id, title,
                f"<p class='missing'>Not in this build: <code>{esc(x.runs.name)}/{esc(relative)}</code> is "
                f"missing. <code>{esc(command)}</code> produces it; then rebuild with "
                f"<code>glm53 slides build</code>.</p>",
                "No numbers are shown for a study that has not been run."))
            continue
        study = read_json(path)
        headline = study.get("headline_table", {})
        table = html_table(headline.get("columns", []), headline.get("rows", []))
        answers = "".join(f"<p>{esc(answer)}</p>" for answer in study.get("answers", []))
        source = f"{x.runs.name}/{relative}"
        notes = f"Read from {source}; its REPORT.md next to it has every table and chart."
        size = ROW_CHARACTERS * len(headline.get("rows", [])) + sum(len(a) for a in study.get("answers", []))
        if size <= STUDY_SLIDE_BUDGET:
            slides.append(Slide(slide_id, title, table + answers, notes))
        else:
            slides.append(Slide(slide_id, title, answers, notes + " The next slide has the table behind these answers."))
            slides.append(Slide(f"{slide_id}-table", f"{title}: the numbers", f"<div class='dense'>{table}</div>",
                                notes + " Differences are right minus left, paired by seed."))
        drawn, stacked = entry.figures(slide_id, study, path.parent) if entry.figures else ([], False)
        drawn = [(fig, name, alt) for fig, name, alt in drawn if fig is not None]
        if drawn:
            if stacked or len(drawn) == 1:
                body = "".join(chart(fig, name, alt) for fig, name, alt in drawn)
            else:
                body = ("<div class='cols charts'>" + "".join(f"<div class='chart-column'>{chart(fig, name, alt)}</div>"
                                                               for fig, name, alt in drawn) + "</div>")
            slides.append(Slide(
                f"{slide_id}-charts", f"{title}, in charts", body,
                f"The charts of {x.runs.name}/{path.parent.name}/REPORT.md, drawn here from the same summary.json. "
                "Every dot is one seed: read the spread before the means.", fill=True))
    return slides


def command_line(argv: list[str]) -> str:
    """The command a receipt recorded, as a user types it (the program's name, not its install path)."""
    return " ".join([Path(argv[0]).name] + list(argv[1:])) if argv else ""


def code_version(commit: str) -> str:
    """A recorded git commit in words: "+dirty" means the working tree had uncommitted changes."""
    if not commit:
        return "not recorded (not a git checkout)"
    clean = commit.removesuffix("+dirty")
    return f"git commit {clean[:12]}" + (", with uncommitted changes" if clean != commit else "")


def slide_sources(x: Inputs) -> Slide:
    prov = x.summary.provenance
    return Slide(
        "sources", "Where every number came from",
        html_table(["numbers", "source"], [
            ("this run's results", str(Path(x.runs.name) / x.run.relative_to(x.runs) / "summary.json")),
            ("made by", command_line(prov["argv"])),
            ("code", code_version(prov["git_commit"])), ("created", prov["created_utc"]),
            ("machine", f"{prov['platform']}, {prov['cpu_count']} CPUs"),
            ("GLM-5.3-Flash's numbers", RELEASED_SOURCE),
            ("studies", ", ".join(f"{x.runs.name}/{entry.summary}" for entry in x.studies
                                  if (x.runs / entry.summary).is_file()) or "none in this build"),
        ]),
        f"Rebuild with `glm53 slides build --runs DIR`; nothing on these slides is typed by hand. The run's "
        f"receipt records the exact command: {' '.join(prov['argv'])}.")


SLIDES = (slide_result, slide_arms, slide_per_seed, slide_example, slide_architecture, slide_block, slide_bytes,
          slide_pretraining, slide_verifier, slide_rloo, slide_confirmation, slide_failures, study_slides,
          slide_sources)


def build_deck(runs: str | Path, studies: tuple) -> str:
    """The whole deck as one HTML string (with a token placeholder the server fills in); `studies` are the
    study slides' entries (experiments/registry.py deck_entries)."""
    inputs = Inputs.load(runs, studies)
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


def write_deck(runs: str | Path, output: str | Path, studies: tuple) -> Path:
    from glm53_flash.core.receipts import write_text

    return write_text(output, build_deck(runs, studies))
