# Evaluates zoo models with a tiny numpy interpreter: initial loss, causality, cross-attention reach. Run by zoo_files_test.
import sys, math, numpy as np, onnx
from onnx import numpy_helper
erf = np.vectorize(math.erf)
def run(m, feeds):
    env = {t.name: numpy_helper.to_array(t).astype(np.float32) if t.data_type==1 else numpy_helper.to_array(t) for t in m.graph.initializer}
    env.update(feeds)
    for n in m.graph.node:
        a = {x.name: onnx.helper.get_attribute_value(x) for x in n.attribute}
        i = [env[x] for x in n.input]
        op = n.op_type
        if op == 'Constant': o = [numpy_helper.to_array(a['value'])]
        elif op == 'Gather': o = [np.take(i[0], i[1], axis=a.get('axis',0))]
        elif op in ('Add','Sub','Mul','Div','Pow'):
            o = [{'Add':np.add,'Sub':np.subtract,'Mul':np.multiply,'Div':np.divide,'Pow':np.power}[op](i[0], i[1])]
        elif op == 'Sqrt': o=[np.sqrt(i[0])]
        elif op == 'Reciprocal': o=[1/i[0]]
        elif op == 'Relu': o=[np.maximum(i[0],0)]
        elif op == 'Erf': o=[erf(i[0]).astype(i[0].dtype)]
        elif op == 'ReduceMean':
            ax = a.get('axes'); kd = a.get('keepdims',1)
            o=[np.mean(i[0], axis=tuple(ax) if ax else None, keepdims=bool(kd))]
        elif op == 'MatMul': o=[np.matmul(i[0],i[1])]
        elif op == 'Split': o=np.split(i[0], np.cumsum(i[1])[:-1], axis=a['axis'])
        elif op == 'Reshape':
            shp=[i[0].shape[k] if d==0 else d for k,d in enumerate(i[1])]; o=[i[0].reshape(shp)]
        elif op == 'Transpose': o=[np.transpose(i[0], a['perm'])]
        elif op == 'Unsqueeze': o=[np.expand_dims(i[0], tuple(i[1]))]
        elif op == 'Where': o=[np.where(i[0], i[1], i[2])]
        elif op == 'Softmax':
            x=i[0]-i[0].max(axis=a['axis'],keepdims=True); e=np.exp(x); o=[e/e.sum(axis=a['axis'],keepdims=True)]
        elif op == 'LayerNormalization':
            x=i[0]; mu=x.mean(-1,keepdims=True); v=((x-mu)**2).mean(-1,keepdims=True); o=[(x-mu)/np.sqrt(v+a['epsilon'])*i[1]+i[2]]
        elif op == 'SoftmaxCrossEntropyLoss':
            x=i[0]-i[0].max(1,keepdims=True); lp=x-np.log(np.exp(x).sum(1,keepdims=True)); o=[np.array(-lp[np.arange(len(i[1])), i[1]].mean(), dtype=np.float32)]
        else: raise SystemExit('op '+op)
        for name,val in zip(n.output,o): env[name]=val
    return [env[x.name] for x in m.graph.output]


def main(bundled, gpt, t5, bert):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 512, (3, 32))
    labels = rng.integers(0, 512, (3, 32))
    ids2 = ids.copy()
    ids2[:, 20] = (ids2[:, 20] + 1) % 512
    diff = lambda a, b: np.abs(a - b).max(axis=(0, 2))  # per position

    loss, = run(onnx.load(bundled), {'input_ids': ids, 'labels': labels})
    assert abs(loss - np.log(512)) < 0.1, f'gpt-tiny initial loss {loss}, expected about ln(512)'
    m = onnx.load(gpt)
    d = diff(run(m, {'input_ids': ids})[0], run(m, {'input_ids': ids2})[0])
    assert d[:20].max() == 0 and d[20:].min() > 0, f'gpt is not causal: {d}'
    m = onnx.load(t5)
    base = run(m, {'input_ids': ids, 'decoder_input_ids': ids})[0]
    d = diff(base, run(m, {'input_ids': ids, 'decoder_input_ids': ids2})[0])
    assert d[:20].max() == 0 and d[20:].min() > 0, f't5 decoder is not causal: {d}'
    d = diff(base, run(m, {'input_ids': ids2, 'decoder_input_ids': ids})[0])
    assert d.min() > 0, f'the t5 encoder does not reach every decoder position: {d}'
    m = onnx.load(bert)
    d = diff(run(m, {'input_ids': ids})[0], run(m, {'input_ids': ids2})[0])
    assert d.min() > 0, f'bert is not bidirectional: {d}'
    print('ok')


if __name__ == '__main__':
    main(*sys.argv[1:5])
