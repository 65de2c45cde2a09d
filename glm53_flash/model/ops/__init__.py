"""The model's CPU kernels as ops: one file per op, each with its public wrapper (tensors and sizes
checked, `KernelArgumentError` naming the op and the rule), its dispatch rule (the `*_serves`
function: where it says no, the layer takes its torch path) and its plain torch reference beside it
(`reference_*`, the test oracle: tests/test_kernel_ops.py drives each op with random legal shapes
against it). The C code is ops/kernels.c; `library` builds and loads it, holds the switches
(`library.ENABLED`, `library.FUSED_DECODE`; model/dispatch.py names every switch and records them in
receipts) and the limits its fixed buffers hold (`LIMITS`, asserted again in C).

| op file | ops | served where |
|---|---|---|
| dense.py | `linear`, `Linear` | decoding: at most `MAX_ROWS` rows, no gradients |
| rmsnorm.py | `rms_norm`; `rms_norm_forward` / `rms_norm_backward`; `rms_norm_layer` (norm.py's entry point) | decoding; training (any rows) |
| streams.py | `add_outer` (streams.py's write, a hand-written backward) | training and decoding |
| swiglu.py | `swiglu_forward` / `swiglu_backward` | training and decoding (any rows) |
| grouped.py | `grouped_linear`, `grouped_matmul` | routed experts, at most `MAX_GROUPED_ROWS` slots |
| experts.py | `routed_experts`, `moe_layer_in_c` (moe.py's entry points) | the routed experts' paths (skinny C, blocked bf16, padded, grouped_mm), chosen by `expert_path` |
| moe_routing.py | `moe_dispatch`, `moe_combine`; `combine_rows_bf16` / `_backward` | a MoE layer's decode step; the bf16 experts' combine (training too) |
| linear_attention.py | `linear_attention_step`; `linear_attention_scan_forward` / `_backward` | a linear layer's decode step; a sequence longer than its chunk (training too) |
| sparse_attention.py | `sparse_attention_step` | a sparse layer's decode step |
| decode_block.py | `DecodeStack` (from `decode_attention_in`, an attention step, `decode_moe_out` per layer) | a decode step of every block in one call |

Everything but the bf16 SwiGLU and combine serves CPU float32 only, outside autocast and compile tracing, with inner sizes that are
multiples of 8; anything else (and a CPU without AVX2 and FMA, no compiler, a failed build,
`GLM53_KERNELS=0`) takes the eager torch path; `status()` says which and why.
"""

from __future__ import annotations

from glm53_flash.model.ops import library  # noqa: F401 - the switches: ops.library.ENABLED
from glm53_flash.model.ops.decode_block import *  # noqa: F401,F403
from glm53_flash.model.ops.grouped import *  # noqa: F401,F403
from glm53_flash.model.ops.library import (  # noqa: F401
    LIMITS, MAX_FUSED_ROWS, MAX_GROUPED_ROWS, MAX_ROWS, MAX_SPARSE_KEYS, KernelArgumentError, available, c_limits, head_dim_serves, observed, status,
    supported_isas,
)
from glm53_flash.model.ops.dense import *  # noqa: F401,F403
from glm53_flash.model.ops.experts import *  # noqa: F401,F403
from glm53_flash.model.ops.linear_attention import *  # noqa: F401,F403
from glm53_flash.model.ops.moe_routing import *  # noqa: F401,F403
from glm53_flash.model.ops.rmsnorm import *  # noqa: F401,F403
from glm53_flash.model.ops.sparse_attention import *  # noqa: F401,F403
from glm53_flash.model.ops.streams import *  # noqa: F401,F403
from glm53_flash.model.ops.swiglu import *  # noqa: F401,F403
