#!/usr/bin/env python3
"""Exports a tiny Llama (transformers' LlamaForCausalLM: 2 layers, hidden 64, 4 heads, 2 kv heads, SwiGLU 128,
vocabulary 128, RoPE, untied head) with torch.onnx.export(dynamo=True) at opset 18, logits only, the batch dynamic.

This is how tests/data/torch_export/llama_tiny_dynamo.onnx was made; CI reads the committed file and never runs
this script (it needs torch, transformers and onnxscript from PyPI):
    python3 -m venv venv && venv/bin/pip install torch transformers onnxscript onnx
    venv/bin/python scripts/export_llama_tiny.py tests/data/torch_export/llama_tiny_dynamo.onnx
"""
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM


class Logits(torch.nn.Module):
    """input_ids [batch, seq] -> logits [batch, seq, vocab] (no cache). The causal mask is given as the 4-D additive
    mask transformers takes as is: without a mask it looks for packed sequences in the position ids (CumSum), and
    from a 2-D padding mask it indexes (GatherND); apart's runtime has kernels for neither."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        seq = input_ids.shape[1]
        # [1, 1, S, S]: 0 on and below the diagonal, the float minimum above (as transformers writes its masks)
        causal = torch.full((seq, seq), torch.finfo(torch.float32).min).triu(1)[None, None]
        return self.model(input_ids=input_ids, attention_mask=causal, use_cache=False).logits


def main(out):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                         rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                         attn_implementation="eager")
    model = Logits(LlamaForCausalLM(config)).eval()
    with torch.no_grad():  # norm scales start at one: the exporter would fold the five equal tensors into one
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.8, 1.2)
    ids = torch.randint(0, 128, (2, 16))
    batch = torch.export.Dim("batch", min=1, max=1024)
    program = torch.onnx.export(model, (ids,), dynamo=True, opset_version=18, input_names=["input_ids"],
                                output_names=["logits"], dynamic_shapes={"input_ids": {0: batch}},
                                external_data=False)
    program.save(out)
    params = {name: p.detach().numpy() for name, p in model.named_parameters()}
    kept, constants = buffers_as_constants(out, params)
    print("wrote", out, "torch", torch.__version__, f"({kept} parameters, {constants} constants)")


def buffers_as_constants(path, params):
    """ONNX has no mark for what torch trains: every float initializer is a weight to apart. The export's buffers and
    folded constants (the causal mask, RoPE's cos/sin tables, Pow's exponent 2.0) become Constant nodes, so apart
    trains what torch trains. An initializer is a parameter when it holds one of `params` (name -> array) as is or
    transposed (the exporter folds a Linear's weight transpose into a new initializer)."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    m = onnx.load(path)
    g = m.graph
    kept, constants = [], []
    for t in g.initializer:
        a = numpy_helper.to_array(t)
        is_param = any(a.shape == p.shape and np.array_equal(a, p) or a.ndim == 2 and a.T.shape == p.shape and
                       np.array_equal(a.T, p) for p in params.values())
        if is_param:
            kept.append(t)
        else:
            constants.append(onnx.helper.make_node("Constant", [], [t.name], name=t.name + "/constant", value=t))
    del g.initializer[:]
    g.initializer.extend(kept)
    nodes = constants + list(g.node)
    del g.node[:]
    g.node.extend(nodes)
    onnx.save(m, path)
    return len(kept), len(constants)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "llama_tiny_dynamo.onnx")
