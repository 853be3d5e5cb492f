# Loss of gpt-tiny on given ids/labels (.pb TensorProtos) by the numpy interpreter of tests/models.
import os, sys
import onnx
from onnx import numpy_helper
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'models'))
from zoo_semantics import run

model, ids, labels = sys.argv[1:4]
feeds = {'input_ids': numpy_helper.to_array(onnx.load_tensor(ids)),
         'labels': numpy_helper.to_array(onnx.load_tensor(labels))}
loss, = run(onnx.load(model), feeds)
print('%.9f' % float(loss))
