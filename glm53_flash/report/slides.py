"""The course deck: one self-contained HTML file built only from receipts and from the code itself.

`glm53 slides build --runs DIR` reads DIR/headline/summary.json (the committed `results/`) or
DIR/summary.json (a `glm53 reproduce` run directory such as runs/demo), the charts next to it, the
confirm receipts when the run has them (for example completions), and the optional study summaries
DIR/vision, DIR/pretraining-data and DIR/rl-choices. Numbers about the miniature come from
ModelConfig and GLM53Flash.parameter_counts(); numbers about the released model come from
RELEASED below, each with its source. The output embeds its CSS, script and charts (no network
fetch), so it opens from file:// as well as from `glm53 serve`. The build is deterministic: the
same inputs give the same bytes.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from ..reproduce import ReproducePlan
from ..stats import format_p
from .headline import ORIGINAL, goal_lines, result_table, seed_order
from .tables import esc, html_from_markdown, html_table

ASSETS = Path(__file__).resolve().parent / "assets"
TOKEN_PLACEHOLDER = "__GLM53_TOKEN__"

# GLM-5.3-Flash's published numbers. Source: the team's reference notes
# (shared/reference/anchors.md section E, read from the released config.json and the HF Transformers
# `glm5_next` model code; and the original miniature's README, "What was built").
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
    "bpe_example_tokens": 4,  # "def increment(x):" -> def, increment, (x, ): (original README)
}
RELEASED_SOURCE = ("released GLM-5.3-Flash config.json and HF Transformers glm5_next code, as recorded in "
                   "shared/reference/anchors.md section E; BPE example from the original miniature's README")

# Study summaries rendered generically, and the command that produces each.
STUDIES = (
    ("vision", "Vision: images as tokens", "glm53 vision train --architecture both",
     "vision/summary.json"),
    ("research-pretraining-data", "Research study: pretraining data", "glm53 experiment pretraining-data",
     "pretraining-data/summary.json"),
    ("research-rl-choices", "Research study: RL choices", "glm53 experiment rl-choices",
     "rl-choices/summary.json"),
)


def headline_dir(runs: Path) -> Path:
    """Where the headline summary lives: DIR/headline (committed results) or DIR (a reproduce run)."""
    for candidate in (runs / "headline", runs):
        if (candidate / "summary.json").is_file():
            return candidate
    raise FileNotFoundError(f"no headline summary.json in {runs} or {runs / 'headline'}; `make demo` writes "
                            f"runs/demo/summary.json and results/headline/ holds the committed one")


def image(path: Path, alt: str) -> str:
    if not path.is_file():
        return f'<p class="missing">chart {esc(path.name)} is missing from the run directory</p>'
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{data}">'


def code(text: str) -> str:
    return f"<pre><code>{esc(text)}</code></pre>"


def markdown_inline(text: str) -> str:
    """**bold** and `code` in the goal sentences of report/headline.py."""
    parts = esc(text).split("**")
    text = "".join(f"<strong>{p}</strong>" if i % 2 else p for i, p in enumerate(parts))
    parts = text.split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


class Deck:
    def __init__(self) -> None:
        self.slides: list[str] = []

    def add(self, slide_id: str, title: str, body: str, notes: str) -> None:
        """body is HTML built by this module; title and notes are plain text and are escaped."""
        self.slides.append(
            f'<section class="slide" id="{esc(slide_id)}" data-title="{esc(title)}">'
            f'<h2 data-edit="{esc(slide_id)}/title">{esc(title)}</h2><div class="body">{body}</div>'
            f'<aside class="notes">{esc(notes)}</aside></section>')  # notes are plain text from receipts


# --------------------------------------------------------------------------- facts from the code


def miniature_facts(preset: str = "flash", overrides: dict | None = None) -> dict:
    """Architecture facts of the model a run trained (its plan's preset and overrides)."""
    import torch

    from ..config import ModelConfig
    from ..model import GLM53Flash

    cfg = ModelConfig.preset(preset, **(overrides or {}))
    with torch.device("meta"):  # shapes only: counting parameters needs no memory or random init
        counts = GLM53Flash(cfg).parameter_counts()
    pattern = cfg.attention_pattern
    return {"config": cfg, "counts": counts, "pattern": pattern,
            "linear": pattern.count("linear"), "sparse": pattern.count("sparse"),
            "sparse_layers": [i for i, kind in enumerate(pattern) if kind == "sparse"]}


def verifier_examples(task) -> list[tuple[str, str, dict]]:
    """Three programs for one task, judged by the real sandbox at build time."""
    from ..verifier import Verifier

    programs = [("the reference body", task.reference_source),
                ("a wrong body", task.prompt + "\n    return x * 3\n"),
                ("a forbidden import", task.prompt + "\n    import os\n    return x\n")]
    with Verifier(workers=1) as verifier:
        verdicts = verifier.evaluate_many([(task, source) for _, source in programs])
    return [(label, source, verdict.to_dict()) for (label, source), verdict in zip(programs, verdicts)]


def example_completion(run: Path, summary: dict) -> dict | None:
    """A confirm task the first RL seed gained, with both greedy completions, from the confirm receipts."""
    seed = seed_order(summary)[0]
    before_path, after_path = run / "confirm" / "before-greedy.json", run / "confirm" / f"rl-{seed}-greedy.json"
    if not (before_path.is_file() and after_path.is_file()):
        return None
    before = {e["task_id"]: e for e in json.loads(before_path.read_text())["episodes"]}
    after = {e["task_id"]: e for e in json.loads(after_path.read_text())["episodes"]}
    for task_id, episode in after.items():
        if episode["evaluation"]["passed"] and task_id in before and not before[task_id]["evaluation"]["passed"]:
            return {"seed": seed, "task_id": task_id, "prompt": episode["prompt"],
                    "before": before[task_id]["generated_completion"], "before_eval": before[task_id]["evaluation"],
                    "after": episode["generated_completion"], "after_eval": episode["evaluation"]}
    return None


# --------------------------------------------------------------------------- the slides


def build_deck(runs: str | Path) -> str:
    """The whole deck as one HTML string (with a token placeholder the server fills in)."""
    from ..tasks import FAMILIES, frozen_tasks, pretraining_text
    from ..tokenizer import ByteTokenizer

    runs = Path(runs)
    run = headline_dir(runs)
    summary = json.loads((run / "summary.json").read_text())
    plan = ReproducePlan.from_dict(summary["plan"])
    seeds = seed_order(summary)
    first = summary["seeds"][seeds[0]]
    facts = miniature_facts(plan.pretrain.preset, plan.pretrain.model_overrides)
    cfg, counts = facts["config"], facts["counts"]
    size = f"{counts['total'] / 1e6:.1f}M" if counts["total"] >= 1e6 else f"{counts['total'] / 1e3:.0f}K"
    deck = Deck()

    # 1. result first
    g = [summary["seeds"][s]["greedy_trained"] for s in seeds]
    deck.add("result", "Result first: RL on hidden unit tests",
             f"<p>A {size}-parameter byte-level model, pretrained from random weights, then post-trained with a "
             "reward that is only <em>did the hidden unit tests pass</em>. Confirm split, opened once after "
             "all selection:</p>" + html_from_markdown(result_table(summary))
             + "".join(f"<p>{markdown_inline(line)}</p>" for line in goal_lines(summary) if line),
             f"Greedy pass@1 on the trained families went from {g[0]['before_solved']}/{g[0]['tasks']} to "
             + ", ".join(f"{x['after_solved']}/{x['tasks']} (seed {s})" for s, x in zip(seeds, g))
             + f". The original miniature reported {ORIGINAL['greedy_trained'][0]}/{ORIGINAL['greedy_trained'][2]} to "
               f"{ORIGINAL['greedy_trained'][1]}/{ORIGINAL['greedy_trained'][2]} with one seed. Say plainly where we fall short.")

    example = example_completion(run, summary)
    if example:
        ex_body = (f"<p>Confirm task <code>{esc(example['task_id'])}</code>, greedy, before and after RL "
                   f"(seed {esc(example['seed'])}):</p><div class='cols'><div><h3>before: "
                   f"{esc(example['before_eval']['status'])} {example['before_eval']['tests_passed']}/"
                   f"{example['before_eval']['tests_total']}</h3>"
                   + code(example["prompt"] + example["before"]) + "</div><div><h3>after: "
                   f"{esc(example['after_eval']['status'])} {example['after_eval']['tests_passed']}/"
                   f"{example['after_eval']['tests_total']}</h3>" + code(example["prompt"] + example["after"])
                   + "</div></div>")
        ex_notes = "Both completions are copied from the confirm receipts of this run."
    else:
        ex_body = ("<p class='missing'>Example completions come from the confirm receipts of a full run, which "
                   "the committed results/ do not include. Run <code>make demo</code>, then "
                   "<code>glm53 slides build --runs runs/demo</code>; or try the model live in the "
                   "playground (<code>glm53 serve</code>, then /playground).</p>")
        ex_notes = "No example is shown rather than an invented one."
    deck.add("result-chart", "Per seed, and one completion",
             "<div class='cols'><div>" + image(run / "charts" / "per-seed-greedy.png", "per-seed greedy chart")
             + "</div><div>" + ex_body + "</div></div>", ex_notes)

    # 2. architecture
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
    deck.add("architecture", "GLM-5.3-Flash, and our miniature of it",
             html_table(["", "GLM-5.3-Flash (published)", "this miniature (from the code)"], released_rows)
             + f"<p class='source'>Published numbers: {esc(RELEASED_SOURCE)}. Miniature: the run's ModelConfig "
               f"(preset {esc(plan.pretrain.preset)}) and GLM53Flash.parameter_counts().</p>",
             "The right-hand column is computed from the code when the deck is built. docs/GLM_MAPPING.md has "
             "every deviation and its reason.")
    rhythm = " ".join("S" if kind == "sparse" else "L" for kind in facts["pattern"])
    deck.add("architecture-block", f"One hybrid block, {cfg.layers} times",
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
             "sparse layers see exact keys in a window plus strided anchors.")

    # 3. bytes vs BPE
    tok = ByteTokenizer()
    sample = "def increment(x):"
    ids = tok.encode(sample)
    deck.add("bytes-vs-bpe", "Bytes, not BPE",
             html_table(["", "GLM-5.3-Flash tokenizer", "ByteTokenizer"], [
                 ("vocabulary", RELEASED["vocab"], f"{tok.vocab_size}"),
                 (f"tokens for '{sample}'", f"{RELEASED['bpe_example_tokens']} (published example)", str(len(ids))),
             ]) + code(f"{sample!r} -> {ids}")
             + f"<p>Every UTF-8 byte b becomes id b + {tok.byte_offset}; ids 0-3 are PAD, BOS, EOS, SEP.</p>",
             "No learned vocabulary, exact round trip for any text, a 260-row embedding table; the price is "
             "longer sequences.")

    # 4. pretraining
    selection = summary["pretrain_selection"]
    deck.add("pretraining", "Pretraining: next byte on tiny Python functions",
             "<div class='cols'><div>"
             + code(pretraining_text(0))
             + html_table(["setting", "value"], [
                 ("steps", plan.pretrain.steps),
                 ("batch x sequence", f"{plan.pretrain.batch_size} x {plan.pretrain.sequence_length}"),
                 ("learning rate", plan.pretrain.learning_rate), ("seconds (this run)", f"{summary['stage_seconds']['pretrain']:.0f}"),
                 ("families in the corpus", len(FAMILIES)),
             ])
             + "</div><div>" + image(run / "charts" / "learning-curves.png", "learning curves")
             + html_table(["checkpoint step", "exact dev rollouts"],
                     [(e["step"], e["score"][0]) for e in selection["checkpoints"]])
             + f"<p>Selected: <code>{esc(Path(selection['selected']).name)}</code> ({esc(selection['rule'])}).</p>"
             + "</div></div>",
             "The first example of the pretraining stream is shown verbatim; the model sees the same families "
             "that are later evaluated, only the function names differ.")

    # 5. verifier
    task = frozen_tasks("dev", 1, ("double",))[0]
    verdicts = verifier_examples(task)
    deck.add("verifier", "The verifier: hidden tests in a sandbox",
             code(task.prompt)
             + html_table(["hidden case", "expected"],
                     [(", ".join(repr(a) for a in c.arguments), repr(c.expected)) for c in task.cases])
             + html_table(["program", "status", "tests passed", "message"],
                     [(label, v["status"], f"{v['tests_passed']}/{v['tests_total']}", v["message"])
                      for label, _, v in verdicts]),
             "These three verdicts were computed by the sandboxed verifier when this deck was built: a static "
             "policy first, then isolated worker processes with CPU, memory and output limits.")

    # 6. RLOO
    deck.add("rloo", "RLOO: the reward is the test result",
             code("advantage_i = reward_i - mean(reward_j for j != i)      # G samples of one prompt\n"
                  "loss        = - sum_i advantage_i * log p(completion_i)")
             + html_table(["setting", "value"], [
                 ("trained families", ", ".join(summary["trained_families"])),
                 ("groups x samples per group", f"{plan.rl.groups} x {plan.rl.group_size}"),
                 ("temperature", plan.rl.temperature), ("learning rate", plan.rl.learning_rate),
                 ("trainable scope", plan.rl.train_scope), ("reward", plan.rl.reward_mode),
                 ("seeds", ", ".join(seeds)),
             ])
             + image(run / "charts" / "dev-selection.png", "dev selection curves"),
             "A group whose samples all get the same reward carries no signal and makes no update. Each seed's "
             "checkpoint is chosen on dev, never on confirm.")

    # 7. confirmation statistics
    rows = []
    for s in seeds:
        v = summary["seeds"][s]
        gt, st = v["greedy_trained"], v["sampled_trained"]
        rows.append((s, f"{gt['before_solved']}/{gt['tasks']} -> {gt['after_solved']}/{gt['tasks']}",
                     f"{gt['gains']} / {gt['losses']}", format_p(gt["mcnemar_p"]),
                     (f"{100 * st['rate_difference']:+.1f} [{100 * st['rate_difference_ci'][0]:+.1f}, "
                      f"{100 * st['rate_difference_ci'][1]:+.1f}]")))
    opened = ("opened after the last selection receipt" if summary["confirm_opened_after_selection"]
              else "NOT opened after all selection")
    deck.add("confirmation", "Confirmation: paired tests on a held-out split",
             html_table(["seed", "greedy pass@1, trained", "gains / losses", "McNemar p",
                    "sampled exact rate change, points [95% CI]"], rows)
             + f"<p>Confirm split {opened}: first confirm receipt {esc(summary['first_confirm_utc'])}, last "
               f"selection receipt {esc(summary['last_selection_utc'])}.</p>",
             "McNemar's exact test counts only the tasks that changed; the CI is a task bootstrap. A dev win "
             "is not a discovery until the untouched split agrees.")

    # 8. failures and interference
    families = summary["untrained_families"]
    rows = []
    for family in families:
        row = [family]
        for s in seeds:
            v = summary["seeds"][s]["untrained_interference"][family]
            mark = " (significant drop)" if v["significant_drop"] else ""
            row.append(f"{v['before_exact']} -> {v['after_exact']}/{v['rollouts']} "
                       f"[{100 * v['ci'][0]:+.1f}, {100 * v['ci'][1]:+.1f}]{mark}")
        rows.append(row)
    drops = sorted({f for s in seeds for f, v in summary["seeds"][s]["untrained_interference"].items()
                    if v["significant_drop"]})
    deck.add("failures", "Failures and interference",
             html_table(["untrained family"] + [f"seed {s}" for s in seeds], rows)
             + image(run / "charts" / "family-before-after.png", "per-family chart"),
             ("Untrained families that dropped beyond their confidence interval on some seed: " + ", ".join(drops)
              + "." if drops else "No untrained family dropped beyond its confidence interval.")
             + f" Greedy losses on the trained families, seed {seeds[0]}: {first['losses_on_trained_greedy']}.")

    # 9-10. vision and the research studies, rendered generically
    for slide_id, title, command, relative in STUDIES:
        path = runs / relative
        if path.is_file():
            study = json.loads(path.read_text())
            headline = study.get("headline_table", {})
            body = html_table(headline.get("columns", []), headline.get("rows", []))
            body += "".join(f"<p>{esc(answer)}</p>" for answer in study.get("answers", []))
            notes = f"Read from {esc(relative)}."
        else:
            body = (f"<p class='missing'>Not in this build: <code>{esc(runs.name)}/{esc(relative)}</code> is "
                    f"missing. <code>{esc(command)}</code> produces it; then rebuild with "
                    f"<code>glm53 slides build</code>.</p>")
            notes = "No numbers are shown for a study that has not been run."
        deck.add(slide_id, title, body, notes)

    # sources
    prov = summary["provenance"]
    deck.add("sources", "Where every number came from",
             html_table(["", ""], [
                 ("headline summary", str(Path(runs.name) / run.relative_to(runs) / "summary.json")),
                 ("written by", " ".join(prov["argv"])),
                 ("code version", prov["git_commit"]), ("created", prov["created_utc"]),
                 ("machine", f"{prov['platform']}, {prov['cpu_count']} CPUs"),
                 ("released-model numbers", RELEASED_SOURCE),
             ]),
             "Rebuild with `glm53 slides build --runs DIR`; nothing on these slides is typed by hand.")
    return render(deck)


def render(deck: Deck) -> str:
    css = (ASSETS / "deck.css").read_text()
    script = (ASSETS / "deck.js").read_text()
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<meta name=\"glm53-token\" content=\"{TOKEN_PLACEHOLDER}\">"
            "<title>glm53_flash: the course</title>"
            f"<style>{css}</style></head><body>"
            "<div id=\"progress\"><div id=\"bar\"></div></div>"
            "<main id=\"deck\">" + "".join(deck.slides) + "</main>"
            "<footer id=\"chrome\"><span id=\"counter\"></span>"
            "<button id=\"toggle-notes\" title=\"speaker notes (S)\">notes</button>"
            "<button id=\"toggle-feedback\" title=\"feedback (F)\">feedback</button>"
            "<a id=\"playground-link\" href=\"/playground\">playground</a></footer>"
            "<div id=\"feedback\" hidden><label for=\"feedback-text\">Feedback on this slide</label>"
            "<textarea id=\"feedback-text\" rows=\"5\"></textarea><span id=\"feedback-status\"></span></div>"
            f"<script>{script}</script></body></html>\n")


def write_deck(runs: str | Path, output: str | Path) -> Path:
    from ..receipts import write_text

    return write_text(output, build_deck(runs))
