#!/usr/bin/env python3
# Replays the tiny golden models (tests/data/{llama,qwen3}) in pure Python (f64, no
# numpy) with chosen rounding stages (GEMM inputs, K/V, Q, P to bf16 or f16) and
# prints max |logit - reference| per setting: which stage of the CUDA path costs
# the most precision (docs/cuda_kernels.md, "f16 instead of bf16").
#   python3 scripts/precision_replay.py qwen3 llama
import json, math, os, struct, sys

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tests', 'data')

def load(path):
    f = open(path, 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n)); base = 8 + n
    data = open(path, 'rb').read()
    out = {}
    for k, v in h.items():
        if k == '__metadata__': continue
        a, b = v['data_offsets']; raw = data[base + a: base + b]
        if v['dtype'] == 'BF16':
            vals = [struct.unpack('<f', struct.pack('<I', x << 16))[0] for x in struct.unpack('<%dH' % (len(raw)//2), raw)]
        elif v['dtype'] == 'F32':
            vals = list(struct.unpack('<%df' % (len(raw)//4), raw))
        elif v['dtype'] == 'I32':
            vals = list(struct.unpack('<%di' % (len(raw)//4), raw))
        shape = v['shape']
        if len(shape) == 2:
            vals = [vals[i*shape[1]:(i+1)*shape[1]] for i in range(shape[0])]
        out[k] = vals
    return out

def f32(x): return struct.unpack('<f', struct.pack('<f', x))[0]
def bf16(x):
    u = struct.unpack('<I', struct.pack('<f', x))[0]
    u = (u + 0x7fff + ((u >> 16) & 1)) & 0xffffffff
    return struct.unpack('<f', struct.pack('<I', u & 0xffff0000))[0]
def f16(x):
    try: return struct.unpack('<e', struct.pack('<e', x))[0]
    except OverflowError: return math.copysign(math.inf, x)

def run(m, cfg, ref, knobs):
    d = cfg['hidden_size']; H = cfg['num_attention_heads']; Hk = cfg['num_key_value_heads']; D = cfg['head_dim']
    L = cfg['num_hidden_layers']; eps = cfg['rms_norm_eps']; theta = cfg['rope_parameters']['rope_theta']
    qk_norm = cfg['model_type'] == 'qwen3'
    head = m.get('lm_head.weight', m['model.embed_tokens.weight'])
    inv_freq = [1.0 / theta ** (2*i / D) for i in range(D//2)]
    xr = knobs.get('x', None)      # rounding of GEMM inputs
    kvr = knobs.get('kv', None)    # rounding of K/V
    qr = knobs.get('q', None)      # rounding of scaled Q in prefill attention
    pr = knobs.get('p', None)      # rounding of P in prefill attention
    headr = knobs.get('head', xr)  # rounding of lm_head input
    ident = lambda v: v
    xr = xr or ident; kvr = kvr or ident; qr = qr or ident; pr = pr or ident; headr = headr or ident
    def lin(x, w, r=xr):
        xx = [r(v) for v in x]
        return [sum(a*b for a, b in zip(xx, row)) for row in w]
    def rms(x, w):
        ss = sum(v*v for v in x) / len(x); inv = 1.0 / math.sqrt(ss + eps)
        return [wi * (v * inv) for v, wi in zip(x, w)]
    def rope(v, pos):
        half = D // 2; out = list(v)
        for i in range(half):
            a = pos * inv_freq[i]; c, s = math.cos(a), math.sin(a)
            out[i] = v[i]*c - v[i+half]*s; out[i+half] = v[i+half]*c + v[i]*s
        return out
    worst = 0.0
    cases = [(ref['prompt_%d' % i], ref['logits_%d' % i], 0) for i in range(10) if 'prompt_%d' % i in ref]
    if knobs.get('long') and 'prompt_long' in ref:
        cases.append((ref['prompt_long'], ref['logits_long_last8'], len(ref['prompt_long']) - 8))
    for ids, want, first in cases:
        T = len(ids)
        x = [list(m['model.embed_tokens.weight'][t]) for t in ids]
        for l in range(L):
            p = 'model.layers.%d.' % l
            h = [rms(v, m[p+'input_layernorm.weight']) for v in x]
            q = [lin(v, m[p+'self_attn.q_proj.weight']) for v in h]
            k = [lin(v, m[p+'self_attn.k_proj.weight']) for v in h]
            vv = [lin(v, m[p+'self_attn.v_proj.weight']) for v in h]
            qh = [[q[t][hh*D:(hh+1)*D] for hh in range(H)] for t in range(T)]
            kh = [[k[t][hh*D:(hh+1)*D] for hh in range(Hk)] for t in range(T)]
            vh = [[vv[t][hh*D:(hh+1)*D] for hh in range(Hk)] for t in range(T)]
            if qk_norm:
                qh = [[rms(a, m[p+'self_attn.q_norm.weight']) for a in r] for r in qh]
                kh = [[rms(a, m[p+'self_attn.k_norm.weight']) for a in r] for r in kh]
            qh = [[rope(a, t) for a in qh[t]] for t in range(T)]
            kh = [[[kvr(e) for e in rope(a, t)] for a in kh[t]] for t in range(T)]
            vh = [[[kvr(e) for e in a] for a in vh[t]] for t in range(T)]
            scale = 1 / math.sqrt(D); l2e = 1.4426950408889634
            att = []
            for t in range(T):
                row = []
                for hh in range(H):
                    g = hh // (H // Hk)
                    qs = [qr(e * scale * l2e) for e in qh[t][hh]]
                    s = [sum(a*b for a, b in zip(qs, kh[j][g])) for j in range(t+1)]
                    mx = max(s); pv = [2 ** (e - mx) for e in s]; lsum = sum(pv)
                    o = [sum(pr(pv[j]) * vh[j][g][e] for j in range(t+1)) / lsum for e in range(D)]
                    row += o
                att.append(row)
            o = [lin(a, m[p+'self_attn.o_proj.weight']) for a in att]
            x = [[a+b for a, b in zip(x[t], o[t])] for t in range(T)]
            h = [rms(v, m[p+'post_attention_layernorm.weight']) for v in x]
            gt = [lin(v, m[p+'mlp.gate_proj.weight']) for v in h]
            up = [lin(v, m[p+'mlp.up_proj.weight']) for v in h]
            act = [[g / (1 + math.exp(-g)) * u for g, u in zip(gt[t], up[t])] for t in range(T)]
            o = [lin(a, m[p+'mlp.down_proj.weight']) for a in act]
            x = [[a+b for a, b in zip(x[t], o[t])] for t in range(T)]
        for t in range(first, T):
            hn = rms(x[t], m['model.norm.weight'])
            lg = lin(hn, head, headr)
            w = want[t - first]
            worst = max(worst, max(abs(a - b) for a, b in zip(lg, w)))
    return worst

for name in sys.argv[1:]:
    cfg = json.load(open(os.path.join(DATA, '%s/config.json' % name)))
    m = load(os.path.join(DATA, '%s/model.safetensors' % name))
    ref = load(os.path.join(DATA, '%s/reference.safetensors' % name))
    for label, knobs in [('exact', {}), ('x bf16', {'x': bf16}), ('x bf16, head exact', {'x': bf16, 'head': None}),
                         ('head bf16 only', {'head': bf16}),
                         ('kv bf16', {'kv': bf16}), ('q bf16', {'q': bf16}), ('p bf16', {'p': bf16}),
                         ('all bf16 (today)', {'x': bf16, 'kv': bf16, 'q': bf16, 'p': bf16}),
                         ('all, kv/q/p f16', {'x': bf16, 'kv': f16, 'q': f16, 'p': f16}),
                         ('all but x f16', {'x': f16, 'kv': bf16, 'q': bf16, 'p': bf16}),
                         ('all bf16, head exact', {'x': bf16, 'head': None, 'kv': bf16, 'q': bf16, 'p': bf16}),
                         ('x exact, kv/q/p bf16', {'kv': bf16, 'q': bf16, 'p': bf16}),
                         ('all f16 (CUDA now)', {'x': f16, 'kv': f16, 'q': f16, 'p': f16}),
                         ]:
        knobs['head'] = knobs.get('head', knobs.get('x'))
        print('%-6s %-28s max err %.4g' % (name, label, run(m, cfg, ref, knobs)), flush=True)
