#!/usr/bin/python3
"""Writes tests/fixtures/torch_tiny/: a tiny Llama-ish pytorch_model.bin saved by real PyTorch
(torch.save, zip format, pickle protocol 2) and expected.json with every tensor's dtype, shape
and values (as fp32) for torch_zip_test.

It covers bf16, f16 and f32 storages, two tensors that are views of one storage (k_proj and
v_proj; v_proj has a non-zero storage offset), an nn.Parameter (_rebuild_parameter) and the
OrderedDict `_metadata` state that Module.state_dict() carries (BUILD).

Run with Debian's python3-torch:  /usr/bin/python3 scripts/make_torch_fixture.py
"""
import collections
import json
import os

import torch

HIDDEN, VOCAB, INTER = 4, 8, 6
OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "torch_tiny")


def rand(*shape, dtype):
    return torch.randn(*shape).to(dtype)


def state_dict():
    torch.manual_seed(0)
    p = "model.layers.0."
    kv = rand(2 * HIDDEN, HIDDEN, dtype=torch.float16)  # one storage, two views
    sd = collections.OrderedDict()
    sd["model.embed_tokens.weight"] = rand(VOCAB, HIDDEN, dtype=torch.bfloat16)
    sd[p + "self_attn.q_proj.weight"] = rand(HIDDEN, HIDDEN, dtype=torch.bfloat16)
    sd[p + "self_attn.k_proj.weight"] = kv[:HIDDEN]
    sd[p + "self_attn.v_proj.weight"] = kv[HIDDEN:]
    sd[p + "self_attn.o_proj.weight"] = rand(HIDDEN, HIDDEN, dtype=torch.bfloat16)
    sd[p + "mlp.gate_proj.weight"] = rand(INTER, HIDDEN, dtype=torch.float32)
    sd[p + "mlp.up_proj.weight"] = rand(INTER, HIDDEN, dtype=torch.float32)
    sd[p + "mlp.down_proj.weight"] = rand(HIDDEN, INTER, dtype=torch.float32)
    sd[p + "input_layernorm.weight"] = rand(HIDDEN, dtype=torch.float32)
    sd[p + "post_attention_layernorm.weight"] = rand(HIDDEN, dtype=torch.float32)
    sd["model.norm.weight"] = rand(HIDDEN, dtype=torch.bfloat16)
    sd["lm_head.weight"] = torch.nn.Parameter(rand(VOCAB, HIDDEN, dtype=torch.float16),
                                              requires_grad=False)
    sd._metadata = collections.OrderedDict([("", {"version": 1}), ("model", {"version": 1})])
    return sd


def main():
    os.makedirs(OUT, exist_ok=True)
    sd = state_dict()
    assert sd["model.layers.0.self_attn.v_proj.weight"].storage_offset() == HIDDEN * HIDDEN
    torch.save(sd, os.path.join(OUT, "pytorch_model.bin"))
    expected = collections.OrderedDict()
    for name, t in sd.items():
        expected[name] = {
            "dtype": {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}[t.dtype],
            "shape": list(t.shape),
            "values": [float(v) for v in t.detach().float().flatten().tolist()],
        }
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump({"torch_version": torch.__version__, "tensors": expected}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
