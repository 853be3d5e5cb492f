#!/usr/bin/env python3
"""Writes the small models of tests/data/opset/ and expected_shapes.txt, the shapes ONNX itself infers for them.

Each model is at opset 18, 20, 21 or 23: the opset-17 forms below converted by onnx.version_converter (ReduceMean's
axes attribute becomes input 1 at 18, and so on), and the ops and forms only newer opsets have, written directly
(Split's num_outputs, Pad's axes input, Resize's axes and keep_aspect_ratio_policy, Gelu, GroupNormalization,
RMSNormalization, RotaryEmbedding, Attention). Every model, its shapes inferred, passes onnx.checker's full check at its opset, and
onnx.shape_inference (strict, with data propagation) gives the shapes tests/importer/onnx_written_models_test.cpp
expects apart's importer to find. Needs the onnx package (1.18 or newer, for opset 23); CI only reads the output:

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install onnx && /tmp/venv/bin/python make_models.py
"""
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, shape_inference, version_converter

HERE = os.path.dirname(os.path.abspath(__file__))
OPSETS = (18, 20, 21, 23)
F = TensorProto.FLOAT


def ints(name, values):
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def floats(name, values):
    return numpy_helper.from_array(np.array(values, dtype=np.float32), name)


def weight(name, shape):
    return numpy_helper.from_array(np.random.RandomState(0).randn(*shape).astype(np.float32), name)


def model(name, nodes, inputs, outputs, initializers, opset):
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(o[0], o[1], o[2] if len(o) > 2 else None) for o in outputs],
                              initializers)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="make_models.py")
    m.ir_version = 8 if opset <= 17 else 10
    # The outputs' types and shapes as ONNX infers them (the checker wants a shape on every graph output).
    m = shape_inference.infer_shapes(m, strict_mode=True, data_prop=True)
    del m.graph.value_info[:]
    return m


# --- Opset-17 forms, converted --------------------------------------------------------------------------------------

def layer_norm_split_pad():
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("ReduceMean", ["h"], ["mu"], axes=[-1]),
        helper.make_node("Sub", ["h", "mu"], ["centred"]),
        helper.make_node("Mul", ["centred", "centred"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]),
        helper.make_node("Div", ["centred", "var"], ["normed"]),
        helper.make_node("Split", ["normed", "halves"], ["a", "gate"], axis=1),
        helper.make_node("Sigmoid", ["gate"], ["sig"]),
        helper.make_node("Mul", ["a", "sig"], ["gated"]),
        helper.make_node("Pad", ["gated", "pads"], ["padded"]),
        helper.make_node("ReduceMean", ["padded"], ["loss"], keepdims=0),
    ]
    return model("layer_norm_split_pad", nodes, [("x", F, [4, 8])], [("loss", F)],
                 [weight("w", (8, 16)), ints("halves", [8, 8]), ints("pads", [0, 0, 0, 1])], 17)


def reductions():
    ops = ["ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
           "ReduceLogSumExp", "ReduceSumSquare"]
    nodes, outputs = [], []
    for op in ops:
        nodes.append(helper.make_node(op, ["x"], [op + "_kept"], axes=[1]))
        nodes.append(helper.make_node(op, ["x"], [op + "_dropped"], axes=[0, -1], keepdims=0))
        nodes.append(helper.make_node(op, ["x"], [op + "_all"]))
        outputs += [(op + "_kept", F), (op + "_dropped", F), (op + "_all", F)]
    return model("reductions", nodes, [("x", F, [2, 3, 4])], outputs, [], 17)


def resize():
    nodes = [helper.make_node("Resize", ["x", "", "scales"], ["up"], mode="nearest"),
             helper.make_node("Resize", ["x", "", "", "sizes"], ["down"], mode="linear")]
    return model("resize", nodes, [("x", F, [1, 3, 8, 6])], [("up", F), ("down", F)],
                 [floats("scales", [1, 1, 2, 2]), ints("sizes", [1, 3, 4, 3])], 17)


def casts_and_shapes():
    nodes = [
        helper.make_node("Cast", ["x"], ["half"], to=TensorProto.FLOAT16),
        helper.make_node("CastLike", ["half", "x"], ["back"]),
        helper.make_node("Identity", ["back"], ["same"]),
        helper.make_node("Shape", ["same"], ["shape"]),
        helper.make_node("Size", ["same"], ["size"]),
        helper.make_node("Reshape", ["same", "flat"], ["reshaped"]),
        helper.make_node("Unsqueeze", ["reshaped", "axes0"], ["unsq"]),
        helper.make_node("Squeeze", ["unsq", "axes0"], ["sq"]),
        helper.make_node("Transpose", ["sq"], ["t"], perm=[1, 0]),
        helper.make_node("Flatten", ["x"], ["flat2"], axis=2),
        helper.make_node("ConstantOfShape", ["shape"], ["zeros"]),
    ]
    return model("casts_and_shapes", nodes, [("x", F, [2, 3, 4])],
                 [("size", TensorProto.INT64), ("t", F), ("flat2", F), ("zeros", F)],
                 [ints("flat", [0, 12]), ints("axes0", [0])], 17)


# --- Forms only newer opsets have -------------------------------------------------------------------------------

def split_pad_resize(opset):
    nodes = [
        helper.make_node("Split", ["x"], ["a", "b", "c"], axis=1, num_outputs=3),
        helper.make_node("Pad", ["x", "pads", "", "pad_axes"], ["padded"]),
        helper.make_node("ReduceMax", ["x", "axes"], ["max"], keepdims=0),
        helper.make_node("Resize", ["image", "", "", "sizes"], ["fit"], axes=[2, 3], keep_aspect_ratio_policy="not_larger"),
        helper.make_node("Resize", ["image", "", "", "sizes"], ["cover"], axes=[2, 3], keep_aspect_ratio_policy="not_smaller"),
    ]
    return model("split_pad_resize_%d" % opset, nodes, [("x", F, [2, 7]), ("image", F, [1, 3, 8, 6])],
                 [(n, F) for n in ("a", "b", "c", "padded", "max", "fit", "cover")],
                 [ints("pads", [1, 2]), ints("pad_axes", [-1]), ints("axes", [1]), ints("sizes", [4, 4])], opset)


def new_ops(opset):
    # ONNX infers no shapes through these function ops: the outputs declare theirs, and apart's own are checked by
    # tests/importer/opset_adapter_test.cpp. GroupNormalization-18 is deprecated (its scale was per group): from 21.
    shape = [2, 4, 6, 5]
    if opset >= 21:
        nodes = [helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["normed"], num_groups=2)]
        inits = [weight("scale", (4,)), weight("bias", (4,))]
    else:
        nodes, inits = [helper.make_node("Mish", ["x"], ["normed"])], []
    outputs = [("normed", F, shape)]
    if opset >= 20:
        nodes.append(helper.make_node("Gelu", ["normed"], ["gelu"], approximate="tanh"))
        outputs.append(("gelu", F, shape))
    return model("new_ops_%d" % opset, nodes, [("x", F, shape)], outputs, inits, opset)


def llama_ops_23():
    nodes = [
        helper.make_node("RMSNormalization", ["x", "g"], ["normed"]),
        helper.make_node("RotaryEmbedding", ["q", "cos", "sin", "pos"], ["q_rot"]),
        helper.make_node("Attention", ["q_rot", "k", "v", "", "past_k", "past_v"], ["y", "present_k", "present_v"],
                         is_causal=0),
        helper.make_node("Attention", ["q3", "k3", "v3"], ["y3"], q_num_heads=4, kv_num_heads=2),
    ]
    inputs = [("x", F, [2, 5, 16]), ("q", F, [2, 4, 5, 8]), ("k", F, [2, 2, 5, 8]), ("v", F, [2, 2, 5, 6]),
              ("past_k", F, [2, 2, 3, 8]), ("past_v", F, [2, 2, 3, 6]), ("pos", TensorProto.INT64, [2, 5]),
              ("q3", F, [2, 5, 32]), ("k3", F, [2, 7, 16]), ("v3", F, [2, 7, 12])]
    outputs = [(n, F) for n in ("normed", "y", "present_k", "present_v", "y3")]
    return model("llama_ops_23", nodes, inputs, outputs, [weight("g", (16,)), weight("cos", (8, 4)), weight("sin", (8, 4))], 23)


def main():
    models = []
    for make in (layer_norm_split_pad, reductions, resize, casts_and_shapes):
        base = make()
        onnx.checker.check_model(base)
        for opset in OPSETS:
            converted = version_converter.convert_version(base, opset)
            converted.graph.name = "%s_%d" % (base.graph.name, opset)
            models.append(converted)
    for opset in OPSETS:
        models += [split_pad_resize(opset), new_ops(opset)]
    models.append(llama_ops_23())
    lines = []
    for m in models:
        m.ClearField("metadata_props")
        del m.graph.value_info[:]
        onnx.checker.check_model(m)
        inferred = shape_inference.infer_shapes(m, strict_mode=True, data_prop=True)
        onnx.checker.check_model(inferred, full_check=True)
        file = m.graph.name + ".onnx"
        onnx.save(m, os.path.join(HERE, file))
        for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
            dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
            lines.append("%s %s %s" % (file, vi.name, "x".join(map(str, dims)) if dims else "scalar"))
    with open(os.path.join(HERE, "expected_shapes.txt"), "w") as out:
        out.write("# <model> <value> <shape>, as onnx %s infers them (make_models.py)\n" % onnx.__version__)
        out.write("\n".join(lines) + "\n")
    print("wrote %d models, %d shapes" % (len(models), len(lines)))


if __name__ == "__main__":
    main()
