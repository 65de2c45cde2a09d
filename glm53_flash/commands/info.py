"""`glm53 info`: the parameter table, layer pattern and a cached greedy generation for a preset."""

from __future__ import annotations

import time

from glm53_flash.model.config import PRESETS, ModelConfig
from glm53_flash.tasks import frozen_tasks
from glm53_flash.data.tokenizer import ByteTokenizer


def register(sub) -> None:
    parser = sub.add_parser("info", help="print a preset's parameter table, layer pattern and a sample generation")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="flash")
    parser.add_argument("--no-generate", action="store_true", help="skip the sample generation")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.set_defaults(func=lambda args: describe(args.preset, not args.no_generate, args.max_new_tokens))


def parameter_table(model) -> list[tuple[str, int]]:
    """Parameters grouped by component, summing to the model's total."""
    groups: dict[str, int] = {}
    for name, param in model.named_parameters():
        if name.startswith("embedding"):
            key = "embedding (tied with the output head)"
        elif name.startswith("norm"):
            key = "final norm"
        else:
            part = name.split(".")[2]
            key = {
                "attention": "attention (qkv + output)",
                "attn_norm": "norms", "moe_norm": "norms",
                "connection": "stream mixing logits",
            }.get(part, None)
            if part == "moe":
                sub = name.split(".")[3]
                key = {"router": "MoE router", "shared": "shared expert"}.get(sub, "routed experts")
        groups[key] = groups.get(key, 0) + param.numel()
    return sorted(groups.items(), key=lambda kv: -kv[1])


def greedy_complete(model, prompt: str, max_new_tokens: int) -> str:
    import torch

    tok = ByteTokenizer()
    ids = torch.tensor([tok.encode(prompt, bos=True)])
    max_new_tokens = min(max_new_tokens, model.config.max_sequence_length - ids.shape[1])
    cache = model.new_cache(1)
    out = []
    with torch.inference_mode():
        logits = model(ids, cache=cache).logits[:, -1]
        for step in range(max_new_tokens):
            logits[:, [tok.pad_id, tok.bos_id, tok.sep_id]] = float("-inf")
            nxt = int(logits.argmax(-1))
            if nxt == tok.eos_id:
                break
            out.append(nxt)
            if step + 1 < max_new_tokens:
                logits = model(torch.tensor([[nxt]]), cache=cache).logits[:, -1]
    return tok.decode(out)


def describe(preset: str = "flash", generate: bool = True, max_new_tokens: int = 32) -> int:
    import torch

    from glm53_flash.model import GLM53Flash

    cfg = ModelConfig.preset(preset)
    torch.manual_seed(0)
    model = GLM53Flash(cfg).eval()
    counts = model.parameter_counts()
    print(f"preset {preset}: dim {cfg.dim}, {cfg.layers} layers, {cfg.heads} heads, {cfg.experts} experts "
          f"top-{cfg.top_k} + 1 shared, {cfg.streams} streams, context {cfg.max_sequence_length}")
    print("layer pattern: " + " ".join("S" if k == "sparse" else "L" for k in cfg.attention_pattern)
          + "  (L = linear attention, S = local+strided sparse attention)")
    for name, count in parameter_table(model):
        print(f"  {name:<40} {count:>12,}")
    print(f"  {'total':<40} {counts['total']:>12,}")
    print(f"  {'active per token (estimate)':<40} {counts['active']:>12,}")
    from glm53_flash.model import kernels

    state = kernels.status()
    print(f"decode kernels: {'in use' if state['available'] else 'not in use, the torch path serves'} "
          f"({state['reason']}{', ' + state['library'] if state['library'] else ''})")
    if generate:
        task = frozen_tasks("dev", 1)[0]
        if len(ByteTokenizer().encode(task.prompt, bos=True)) >= cfg.max_sequence_length:
            print(f"\n(no sample generation: the task prompt does not fit context {cfg.max_sequence_length})")
            return 0
        start = time.perf_counter()
        text = greedy_complete(model, task.prompt, max_new_tokens)
        seconds = time.perf_counter() - start
        print(f"\nprompt ({task.task_id}):\n{task.prompt}")
        print(f"greedy completion from random weights ({seconds:.2f} s, cached decoding):\n{text!r}")
        print("(random weights produce noise; `glm53 pretrain` is what teaches the model)")
    return 0
