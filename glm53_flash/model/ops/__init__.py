"""The model's fast paths: every way of computing a mechanism faster than its model file's formulation
(C kernels, fused or padded variants, bf16 blocks, hand-written backwards, the one-call decode step), one
file per mechanism, each beside its plain reference and chosen by one rule. A model file makes one call
here (the entry points below); where no fast path serves, the call says None (or runs the plain formula)
and the model file's own formulation runs. Each C op has its public wrapper (tensors and sizes checked,
`KernelArgumentError` naming the op and the rule), its dispatch rule (the `*_serves` function) and its
plain torch reference (`reference_*`, the test oracle: tests/test_kernel_ops.py drives each op with random
legal shapes against it). The C code is ops/kernels.c; `library` builds and loads it, holds the switches
`library.ENABLED` and `library.FUSED_DECODE` and the limits its fixed buffers hold (`LIMITS`, asserted again
in C); dispatch.py names every switch and records them in receipts.

| file | entry point (the model file calling it) | paths |
|---|---|---|
| dense.py | `linear`, `Linear` (every product) | C for at most `MAX_ROWS` rows without gradients, else `precision.mixed_linear` |
| rmsnorm.py | `rms_norm_layer` (norm.py) | C decode form; torch's fused op; C training pair |
| swiglu.py | `swiglu_activation`, `swiglu_mlp` (moe.py) | C forward/backward (float32, bf16); eager with a hand-written backward; bf16 blocks |
| experts.py | `routed_experts`, `moe_layer_in_c` (moe.py) | skinny C, blocked bf16, padded, torch's grouped_mm (table there) |
| grouped.py, moe_routing.py | (experts.py) | the C grouped products; routing, combine, the bf16 combine |
| linear_attention.py | `linear_attention_layer`, `feature_map`, `block_dtype` / `masked_block` (linear_attention.py) | C decode step, C scan; the feature map's backward; bf16 blocks |
| streams.py | `add_outer` (streams.py) | a hand-written backward |
| sparse_attention.py | (decode_block.py) | a sparse layer's C decode step |
| decode_block.py | `DecodeStack` (decode_model.py) | every block's decode step in one C call (`decode_attention_in`, an attention step, `decode_moe_out` per layer) |
| decode_model.py | `decode_step` (lm.py) | the model's one-call decode step and its operands, kept per weight version |

The C paths serve CPU float32 (the SwiGLU and the combine bf16 too), outside autocast and compile tracing,
with inner sizes that are multiples of 8; anything else (and a CPU without AVX2 and FMA, no compiler, a
failed build, `GLM53_KERNELS=0`) takes the torch path; `status()` says which and why. decode_model.py reads
the model's modules, so it sits above them and is imported from its own path, not re-exported here.
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
from glm53_flash.model.ops import dispatch  # noqa: F401,E402 - its switches go into receipts
