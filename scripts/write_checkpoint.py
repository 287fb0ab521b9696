#!/usr/bin/env python3
"""Writes a random-weight Hugging Face checkpoint of a known shape with
transformers (bf16 safetensors, config.json), for benchmarks of the real
loading path on a GPU machine; with --tokenizer DIR, that tokenizer's files
beside it (the server's text path).

  python3 scripts/write_checkpoint.py qwen3-8b /tmp/q8 [--tokenizer tests/data/tokenizers/qwen3]
"""
import argparse
import shutil
import sys
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, Qwen3Config

SHAPES = {
    # augur's --synthetic qwen3-8b
    "qwen3-8b": lambda: Qwen3Config(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
                                    num_key_value_heads=8, head_dim=128, intermediate_size=12288,
                                    vocab_size=151936, max_position_embeddings=40960, rms_norm_eps=1e-6,
                                    rope_theta=1000000, tie_word_embeddings=False, eos_token_id=151645),
    # Shapes no preset of augur's has (scripts/shapes_bench.sh): a dense Qwen3
    # (3.0 B parameters outside the embeddings, 4.0 B in all) and a Qwen3.5
    # hybrid (three Gated DeltaNet layers to one gated attention layer; 5.6 B
    # outside the embeddings, 7.4 B in all).
    "qwen3-dense-3b": lambda: Qwen3Config(hidden_size=3072, num_hidden_layers=30, num_attention_heads=24,
                                          num_key_value_heads=8, head_dim=128, intermediate_size=8192,
                                          vocab_size=151936, max_position_embeddings=40960, rms_norm_eps=1e-6,
                                          rope_theta=1000000, tie_word_embeddings=False, eos_token_id=151645),
    "qwen3.5-hybrid-6b": lambda: AutoConfig.for_model(
        "qwen3_5_text", hidden_size=3584, num_hidden_layers=32, num_attention_heads=16, num_key_value_heads=4,
        head_dim=256, intermediate_size=11008, vocab_size=248320, max_position_embeddings=262144, rms_norm_eps=1e-6,
        full_attention_interval=4, linear_conv_kernel_dim=4, linear_num_key_heads=16, linear_num_value_heads=32,
        linear_key_head_dim=128, linear_value_head_dim=128, partial_rotary_factor=0.25, rope_theta=10000000,
        tie_word_embeddings=False, eos_token_id=248044),
}


def write(name, out, tokenizer=None):
    cfg = SHAPES[name]()
    t = time.time()
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.eval()
    print(f"{name}: init {time.time() - t:.1f} s", flush=True)
    t = time.time()
    model.save_pretrained(out)
    print(f"{name}: saved to {out} in {time.time() - t:.1f} s", flush=True)
    if tokenizer:
        for f in Path(tokenizer).iterdir():
            if f.name.startswith("tokenizer"):
                shutil.copy(f, Path(out) / f.name)
    return model, cfg


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("out")
    ap.add_argument("--tokenizer", help="a folder whose tokenizer* files are copied beside the weights")
    a = ap.parse_args()
    write(a.shape, a.out, a.tokenizer)
    sys.exit(0)
