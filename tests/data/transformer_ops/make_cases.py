#!/usr/bin/env python3
"""Writes ONNX's own backend node test cases of the opset-20/23 transformer ops (Attention, RMSNormalization,
RotaryEmbedding, Gelu) into this folder, in the backend-test layout (NAME/model.onnx, NAME/test_data_set_0/
input_K.pb and output_K.pb) that tests/runtime/conformance_test.cpp runs. Debian's libonnx-testdata (ONNX 1.12) has
none of them. The expected outputs are those of onnx.reference (op_attention.py, op_rms_normalization.py,
op_rotary_embedding.py, the Gelu formulas), as onnx's test generator computes them. The "_expanded" cases (the
function bodies) and those past opset 23 (Attention-24's nonpad_kv_seqlen) are left out. Needs the onnx package (1.18 or newer); CI only reads the output:

    python3 -m venv /work/venv_ops && /work/venv_ops/bin/pip install onnx && /work/venv_ops/bin/python make_cases.py
"""
import os
import shutil
import warnings

import onnx
from onnx import numpy_helper
from onnx.backend.test.case import node

HERE = os.path.dirname(os.path.abspath(__file__))
PREFIXES = ("test_attention_", "test_rms_normalization_", "test_rotary_embedding", "test_gelu_")


def default_opset(model):
    return max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def write_case(case):
    folder = os.path.join(HERE, case.name)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    onnx.save(case.model, os.path.join(folder, "model.onnx"))
    inputs, outputs = case.data_sets[0]
    data = os.path.join(folder, "test_data_set_0")
    os.makedirs(data)
    graph_inputs = [i.name for i in case.model.graph.input]
    graph_outputs = [o.name for o in case.model.graph.output]
    for k, value in enumerate(inputs):
        tensor = numpy_helper.from_array(value, graph_inputs[k])
        with open(os.path.join(data, f"input_{k}.pb"), "wb") as f:
            f.write(tensor.SerializeToString())
    for k, value in enumerate(outputs):
        tensor = numpy_helper.from_array(value, graph_outputs[k])
        with open(os.path.join(data, f"output_{k}.pb"), "wb") as f:
            f.write(tensor.SerializeToString())


def main():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = node.collect_testcases()
    chosen = sorted((c for c in cases if c.name.startswith(PREFIXES) and not c.name.endswith("_expanded")
                     and default_opset(c.model) <= 23), key=lambda c: c.name)
    for case in chosen:
        write_case(case)
    print(f"onnx {onnx.__version__}: wrote {len(chosen)} cases")


if __name__ == "__main__":
    main()
