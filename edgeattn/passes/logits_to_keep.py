"""A decoder input `logits_to_keep` (int64 scalar): the LM head runs for the last n positions of a chunk only.

Generation reads the logits of a chunk's last position; the exported decoder computes them for every position
([B, S, V]: 50 MB for a 256-token chunk of SmolLM2, whose LM head is a fifth of its weights). The pass
slices the LM head's input to the last `logits_to_keep` positions (0 keeps all of them, the exported
behaviour, which perplexity over a stream needs): `logits` becomes [B, min(n, S), V]. The runtime feeds 1
while generating (edgeattn.runtime.generation.decoder_bundle). Hugging Face calls the same argument
`logits_to_keep`. The input has a default (0), so a caller that does not know it is served as before; only
decoders with a cache (`edgeattn export --decoder`) get it.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from edgeattn.passes import PassContext, PassResult
from edgeattn.passes.rewiring import constant

INPUT = "logits_to_keep"
POSITION_INPUT = "cache_position"  # what makes a decoder with a cache (edgeattn.decoder.metadata)
HEADS = ("MatMul", "MatMulNBits", "Gemm")


class LogitsToKeep:
    name = "logits-to-keep"

    def __call__(self, model: ir.Model, ctx: PassContext) -> PassResult:
        graph = model.graph
        logits = next((v for v in graph.outputs if v.name == "logits"), None)
        if logits is None:
            return PassResult(self.name, False, "no `logits` output (not a decoder)", {"added": False})
        if not any(v.name == POSITION_INPUT for v in graph.inputs):
            return PassResult(self.name, False, f"not a decoder with a cache (no `{POSITION_INPUT}` input): its "
                              "inputs are kept as they are", {"added": False})
        if any(v.name == INPUT for v in graph.inputs):
            return PassResult(self.name, False, f"the model already has an input {INPUT}", {"added": False})
        head = logits.producer()
        why = None
        if head is None or head.op_type not in HEADS:
            why = f"`logits` is made by {head.op_type if head else 'no node'}, expected the LM head ({', '.join(HEADS)})"
        elif head.inputs[0].shape is None or len(head.inputs[0].shape) != 3:
            why = "the LM head's input is not [B, S, hidden]"
        if why:
            return PassResult(self.name, False, f"logits for every position kept: {why}", {"added": False},
                              [f"logits-to-keep: {why}"])
        # an input with a default (an initializer of the same name): 0, every position, when it is not fed
        keep = ir.Value(name=INPUT, shape=ir.Shape([]), type=ir.TensorType(ir.DataType.INT64),
                        const_value=ir.tensor(np.array(0, np.int64), name=INPUT))
        graph.inputs.append(keep)
        graph.register_initializer(keep)
        x = head.inputs[0]
        nodes = []

        def op(op_type, *inputs, **attrs):
            n = ir.node(op_type, list(inputs), attributes=attrs, name=f"logits_to_keep/{op_type}{len(nodes)}")
            nodes.append(n)
            return n.outputs[0]

        start = op("Neg", op("Reshape", keep, constant(graph, "edgeattn_logits_one", np.array([1], np.int64))))
        end = constant(graph, "edgeattn_logits_end", np.array([np.iinfo(np.int64).max], np.int64))
        kept = op("Slice", x, start, end, constant(graph, "edgeattn_logits_axis1", np.array([1], np.int64)))
        kept.dtype = x.dtype
        graph.insert_before(head, nodes)
        head.replace_input_with(0, kept)
        logits.shape = ir.Shape([logits.shape[0] if logits.shape else None, "logits_kept",
                                 logits.shape[2] if logits.shape else None])
        return PassResult(self.name, True, f"input {INPUT}: the LM head ({head.op_type}) runs for the last n "
                          "positions (0 = all)", {"added": True, "head": head.name})
