# Trains augur-tiny on the device machine (PyTorch + transformers 5.17 +
# tokenizers, one GPU): a byte-level BPE tokenizer on the corpus, then a ~20M
# parameter Qwen3.5 hybrid (qwen3_5_text: Gated DeltaNet layers with full
# attention every fourth layer) with a native MTP head, trained jointly; then
# exports the Hugging Face checkpoint and measures it with transformers.
#
# Usage there:  python3 tools/train/train_tiny.py --corpus build/corpus --out DIR
# Reads DIR_CORPUS/{train,heldout}.jsonl (tools/corpus/build_corpus.sh).
# Writes DIR/augur-tiny/ (config.json, generation_config.json,
# model.safetensors, tokenizer.json, tokenizer_config.json), DIR/train_log.json
# (hyper-parameters, seed, loss curve, held-out figures) and
# DIR/reference.safetensors (transformers' f32 CPU logits on held-out text, for
# augur's golden test).
#
# The model is transformers' own Qwen3_5ForCausalLM, so the trunk is the
# reference by construction. The MTP head follows the layout of Qwen3.5's
# checkpoints (mtp.fc, mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden,
# mtp.layers.0.*, mtp.norm; the embedding and lm_head shared with the trunk):
#   h_t   = the trunk's final (normed) hidden state at t
#   e_t+1 = embed(token t+1)
#   y     = mtp.fc(cat(norm_e(e_t+1), norm_h(h_t)))      [2d -> d]
#   y     = mtp.layers.0(y) at position t+1               (full attention)
#   logits(t+2) = lm_head(mtp.norm(y))
import argparse
import copy
import json
import math
import os
import random
import re
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS, IM_START, IM_END = 0, 1, 2
# Qwen2/Qwen3's pre-tokenizer pattern: letters runs with one leading non-letter,
# single digits, punctuation runs, newlines, spaces.
PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def log(*a):
    print(*a, flush=True)


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# ---------------------------------------------------------------- tokenizer

def train_tokenizer(texts, vocab):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    return tok


def tokenizer_config():
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 2048,
        "chat_template": CHAT_TEMPLATE,
    }


# ---------------------------------------------------------------- chat data

QUESTIONS = ["What is {}?", "Define {}.", "What does {} mean?", "Tell me about {}.", "What is the meaning of {}?"]
POS = r"(?:n|v|vt|vi|adj|adv|interj|pron|prep|conj|pref|suff|abbrev|excl|x)\."


def chat_turns(doc, rng):
    """Dictionary entries (Jargon File, Devil's Dictionary) also as ChatML
    turns, so that `augur chat` answers 'What is X?' in the corpus' voice.
    Devil: 'WORD, n. definition' paragraphs. Jargon: a headword line
    ('word /pron/, n.') followed by the entry's first paragraph."""
    paras = [p.strip() for p in doc["text"].split("\n\n") if p.strip()]
    out = []
    if doc["source"] == "devil":
        for p in paras:
            m = re.match(r"^([A-Z][A-Z' .\-]{0,38}?), " + POS + r"(?:\s*(?:and|or)\s*" + POS + r")?\s+\S", p)
            if m and len(p) >= 40:
                out.append((m.group(1).title(), p))
    elif doc["source"] == "jargon":
        for head, body in zip(paras, paras[1:]):
            if len(head) > 80 or "\n" in head or len(body) < 60:
                continue
            m = re.match(r"^(.{1,40}?)(?: /[^/]+/)?(?:, " + POS + r".*)?$", head)
            if not m or head.count(" ") > 6 or re.search(r"[.!?]$", head) and not re.search(POS + r"$", head):
                continue
            out.append((m.group(1).strip(), body))
    return [(rng.choice(QUESTIONS).format(w), a) for w, a in out]


# ---------------------------------------------------------------- model

def model_config(vocab):
    layer_types = ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 2
    return dict(
        vocab_size=vocab, hidden_size=384, intermediate_size=1024, num_hidden_layers=len(layer_types),
        layer_types=layer_types, num_attention_heads=6, num_key_value_heads=2, head_dim=64,
        linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=64, linear_value_head_dim=64,
        linear_conv_kernel_dim=4, max_position_embeddings=2048, rms_norm_eps=1e-6, hidden_act="silu",
        attention_bias=False, attention_dropout=0.0, tie_word_embeddings=True, initializer_range=0.02,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        bos_token_id=None, eos_token_id=EOS, pad_token_id=EOS,
        mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False)


class MtpHead(nn.Module):
    """Qwen3.5's multi-token-prediction module (one full-attention layer)."""

    def __init__(self, config):
        super().__init__()
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm
        c = copy.deepcopy(config)
        c.layer_types = ["full_attention"]
        c.num_hidden_layers = 1
        c._attn_implementation = "sdpa"
        d = config.hidden_size
        self.fc = nn.Linear(2 * d, d, bias=False)
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(d, eps=config.rms_norm_eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(d, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(c, 0)])
        self.norm = Qwen3_5RMSNorm(d, eps=config.rms_norm_eps)
        nn.init.normal_(self.fc.weight, std=config.initializer_range)

    def forward(self, trunk, hidden, next_ids):
        # hidden: [B, T, d] at positions 0..T-1; next_ids: [B, T] tokens at 1..T.
        B, T, _ = hidden.shape
        e = trunk.model.embed_tokens(next_ids)
        y = self.fc(torch.cat([self.pre_fc_norm_embedding(e), self.pre_fc_norm_hidden(hidden)], dim=-1))
        pos = torch.arange(1, T + 1, device=hidden.device).view(1, 1, T).expand(3, B, T)
        cos_sin = trunk.model.rotary_emb(y, pos)
        y = self.layers[0](y, position_embeddings=cos_sin, attention_mask=None, position_ids=pos[0])
        if isinstance(y, tuple):
            y = y[0]
        return trunk.lm_head(self.norm(y))


def count(params):
    return sum(p.numel() for p in params)


def lr_at(step, total, peak, warmup, floor):
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return floor * peak + (1 - floor) * peak * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))


# ---------------------------------------------------------------- evaluation

def windows(ids, width):
    """Non-overlapping windows of `width` predicted tokens (width + 1 ids each,
    consecutive windows sharing one id); the last may be shorter."""
    out, i = [], 0
    while i + 1 < len(ids):
        out.append(ids[i:i + width + 1])
        i += width
    return out


@torch.no_grad()
def evaluate(model, mtp, ids, width, device):
    """Held-out NLL of the trunk, and the MTP head's top-1 accuracy at t+2
    against the text and against the trunk's own greedy choice at t+2 (what a
    one-token MTP draft would have accepted under greedy decoding)."""
    nll, n, hit_text, hit_greedy, m = 0.0, 0, 0, 0, 0
    for w in windows(ids, width):
        x = torch.tensor([w], device=device)
        inp, tgt = x[:, :-1], x[:, 1:]
        h = model.model(input_ids=inp, use_cache=False).last_hidden_state
        logits = model.lm_head(h).float()
        nll += F.cross_entropy(logits[0], tgt[0], reduction="sum").item()
        n += tgt.shape[1]
        T = inp.shape[1]
        if mtp is not None and T >= 2:
            draft = mtp(model, h[:, :T - 1], inp[:, 1:T]).float().argmax(-1)[0]   # guesses for t+2
            truth = tgt[0, 1:T]
            greedy = logits[0, 1:T].argmax(-1)                                    # trunk's choice at t+2
            hit_text += (draft == truth).sum().item()
            hit_greedy += (draft == greedy).sum().item()
            m += T - 1
    return {"tokens": n, "nll": nll / n, "ppl": math.exp(nll / n),
            "mtp_top1_vs_text": hit_text / max(1, m), "mtp_top1_vs_trunk_greedy": hit_greedy / max(1, m)}


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default="build/corpus")
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--tokens", type=float, default=45e6, help="training tokens, if time allows")
    ap.add_argument("--budget", type=float, default=330.0, help="seconds of training at most")
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--eval-window", type=int, default=1024)
    ap.add_argument("--smoke", action="store_true", help="the whole pipeline on a sliver of the corpus, in seconds")
    a = ap.parse_args()

    import transformers
    from tokenizers import Tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM
    from safetensors.torch import save_file

    t_start = time.time()
    random.seed(a.seed)
    torch.manual_seed(a.seed)
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    log("torch", torch.__version__, "transformers", transformers.__version__, torch.cuda.get_device_name())

    train_docs = read_jsonl(os.path.join(a.corpus, "train.jsonl"))
    held_docs = read_jsonl(os.path.join(a.corpus, "heldout.jsonl"))
    if a.smoke:
        train_docs, held_docs = train_docs[:40] + train_docs[-60:], held_docs[:3]
        a.vocab, a.tokens, a.budget, a.batch = 1024, 2e5, 4.0, 8
    log(f"corpus: {len(train_docs)} train docs, {len(held_docs)} held-out docs")

    # Tokenizer, on the training part only.
    tok = train_tokenizer((d["text"] for d in train_docs), a.vocab)
    mdir = os.path.join(a.out, "augur-tiny")
    os.makedirs(mdir, exist_ok=True)
    tok.save(os.path.join(mdir, "tokenizer.json"))
    with open(os.path.join(mdir, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config(), f, indent=2)
    tok = Tokenizer.from_file(os.path.join(mdir, "tokenizer.json"))
    log(f"tokenizer: {tok.get_vocab_size()} tokens ({time.time() - t_start:.0f}s)")

    # Token streams: each document followed by <|endoftext|>; dictionary entries
    # once more as ChatML turns.
    rng = random.Random(a.seed)
    order = list(range(len(train_docs)))
    rng.shuffle(order)
    texts = [train_docs[i]["text"] for i in order]
    encs = tok.encode_batch(texts, add_special_tokens=False)
    stream = []
    for e in encs:
        stream.extend(e.ids)
        stream.append(EOS)
    n_plain = len(stream)
    chats = []
    for d in train_docs:
        chats.extend(chat_turns(d, rng))
    chat_texts = [f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n{r}<|im_end|>\n" for q, r in chats]
    for e in tok.encode_batch(chat_texts, add_special_tokens=False):
        stream.extend(e.ids)
        stream.append(EOS)
    data = torch.tensor(stream, dtype=torch.int32)
    held_text = "<|endoftext|>".join(d["text"] for d in held_docs)
    held_ids = tok.encode(held_text, add_special_tokens=False).ids
    log(f"tokens: train {n_plain} + chat {len(stream) - n_plain} ({len(chats)} turns), held-out {len(held_ids)}; "
        f"{sum(len(t) for t in texts) / n_plain:.2f} chars/token")

    # Model.
    cfg = model_config(a.vocab)
    config = AutoConfig.for_model("qwen3_5_text", **cfg)
    config.architectures = ["Qwen3_5ForCausalLM"]
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa").to(dev)
    mtp = MtpHead(model.config).to(dev)
    log(f"model: {type(model).__name__}, trunk {count(model.parameters()) / 1e6:.2f}M, "
        f"mtp {count(mtp.parameters()) / 1e6:.2f}M parameters")

    params = [p for p in list(model.parameters()) + list(mtp.parameters()) if p.requires_grad]
    seen = set()
    decay, no_decay = [], []
    for p in params:
        if id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)

    gen = torch.Generator().manual_seed(a.seed)
    L, B = a.seq, a.batch

    def batch():
        starts = torch.randint(0, len(data) - L - 1, (B,), generator=gen)
        x = torch.stack([data[s:s + L + 1] for s in starts.tolist()]).to(dev, non_blocking=True).long()
        return x[:, :-1], x[:, 1:]

    def train_step(step, total):
        lr = lr_at(step, total, a.lr, warmup, 0.1)
        for g in opt.param_groups:
            g["lr"] = lr
        inp, tgt = batch()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            h = model.model(input_ids=inp, use_cache=False).last_hidden_state
            logits = model.lm_head(h)
            loss_main = F.cross_entropy(logits.float().reshape(-1, a.vocab), tgt.reshape(-1))
            mlog = mtp(model, h[:, :L - 1], inp[:, 1:L])
            loss_mtp = F.cross_entropy(mlog.float().reshape(-1, a.vocab), tgt[:, 1:L].reshape(-1))
        loss = loss_main + a.mtp_weight * loss_mtp
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss_main, loss_mtp, gnorm, lr

    # Plan the steps from the measured speed: as many tokens as asked for, or
    # as fit in the budget.
    planned = int(a.tokens // (B * L))
    warmup = 60
    model.train()
    mtp.train()
    curve = []
    t0 = time.time()
    probe = 12
    for step in range(probe):
        lm, lt, gn, lr = train_step(step, planned)
    torch.cuda.synchronize()
    per_step = (time.time() - t0) / probe
    total = max(probe + 50, min(planned, int(a.budget / per_step)))
    log(f"{per_step * 1000:.0f} ms/step ({B * L / per_step / 1e3:.0f}k tok/s): {total} steps, "
        f"{total * B * L / 1e6:.1f}M tokens = {total * B * L / len(data):.2f} epochs")
    t_train = time.time()
    for step in range(probe, total):
        lm, lt, gn, lr = train_step(step, total)
        if step % 25 == 0 or step == total - 1:
            rec = {"step": step, "tokens": (step + 1) * B * L, "loss": round(lm.item(), 4),
                   "mtp_loss": round(lt.item(), 4), "grad_norm": round(gn.item(), 3), "lr": lr,
                   "seconds": round(time.time() - t0, 1)}
            curve.append(rec)
            log(json.dumps(rec))
    torch.cuda.synchronize()
    train_seconds = time.time() - t0
    log(f"trained {total} steps in {train_seconds:.0f}s")

    # Round to bf16 (what the checkpoint stores), evaluate from there.
    model.eval()
    mtp.eval()
    with torch.no_grad():
        for p in list(model.parameters()) + list(mtp.parameters()):
            p.copy_(p.to(torch.bfloat16).float())
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    held_gpu = evaluate(model, mtp, held_ids, a.eval_window, dev)
    log("held-out (trained model, GPU f32):", json.dumps(held_gpu))

    # Export in Hugging Face layout, the MTP tensors beside the trunk's.
    tensors = {}
    for k, v in model.state_dict().items():
        if k == "lm_head.weight":
            continue  # tied to model.embed_tokens.weight
        tensors[k] = v.detach().to(torch.bfloat16).contiguous().cpu()
    for k, v in mtp.state_dict().items():
        tensors["mtp." + k] = v.detach().to(torch.bfloat16).contiguous().cpu()
    save_file(tensors, os.path.join(mdir, "model.safetensors"), metadata={"format": "pt"})
    config.dtype = "bfloat16"
    config.save_pretrained(mdir)
    with open(os.path.join(mdir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": None, "eos_token_id": [EOS, IM_END], "pad_token_id": EOS,
                   "do_sample": True, "temperature": 0.8, "top_p": 0.95, "top_k": 40}, f, indent=2)
    size = os.path.getsize(os.path.join(mdir, "model.safetensors"))
    log(f"exported {len(tensors)} tensors, model.safetensors {size / 1e6:.1f} MB")

    # transformers loads the checkpoint as people would (mtp.* ignored).
    ref = AutoModelForCausalLM.from_pretrained(mdir, dtype=torch.float32, attn_implementation="sdpa").to(dev).eval()
    held_hf = evaluate(ref, None, held_ids, a.eval_window, dev)
    log("held-out (transformers from_pretrained, GPU f32):", json.dumps(held_hf))

    # Golden reference for augur: f32 CPU logits over the start of the held-out
    # text, per-token NLL over the first windows, and a greedy continuation.
    cpu = AutoModelForCausalLM.from_pretrained(mdir, dtype=torch.float32, attn_implementation="eager").eval()
    ref_tensors = {}
    with torch.no_grad():
        x = torch.tensor([held_ids[:96]])
        ref_tensors["prompt_0"] = x[0].to(torch.int32)
        ref_tensors["logits_0"] = cpu(x, use_cache=False).logits[0].float().contiguous()
        ids = held_ids[:24]
        for _ in range(24):
            ids.append(int(cpu(torch.tensor([ids]), use_cache=False).logits[0, -1].argmax()))
        ref_tensors["greedy_prompt"] = torch.tensor(held_ids[:24], dtype=torch.int32)
        ref_tensors["greedy_0"] = torch.tensor(ids[24:], dtype=torch.int32)
        w = torch.tensor([held_ids[:a.eval_window + 1]])
        lp = F.log_softmax(cpu(w[:, :-1], use_cache=False).logits[0].float(), -1)
        ref_tensors["window_ids"] = w[0].to(torch.int32)
        ref_tensors["window_nll"] = (-lp.gather(1, w[0, 1:, None])[:, 0]).contiguous()
    # The tokenizer's own check: the start of the held-out text and its ids.
    ref_text = held_text[:3000]
    ref_tensors["text_ids"] = torch.tensor(tok.encode(ref_text, add_special_tokens=False).ids, dtype=torch.int32)
    save_file(ref_tensors, os.path.join(a.out, "reference.safetensors"), metadata={"text": ref_text})
    with open(os.path.join(a.out, "heldout.txt"), "w", encoding="utf-8") as f:
        f.write(held_text)

    samples = []
    for prompt in ["The", "Call me", "Mr. Speaker,", "HACKER, n."]:
        ids = tok.encode(prompt).ids
        with torch.no_grad():
            outs = ref.generate(torch.tensor([ids], device=dev), max_new_tokens=40, do_sample=False)
        samples.append({"prompt": prompt, "greedy": tok.decode(outs[0].tolist()[len(ids):])})
        log(json.dumps(samples[-1]))

    with open(os.path.join(a.out, "train_log.json"), "w") as f:
        json.dump({
            "seed": a.seed, "torch": torch.__version__, "transformers": transformers.__version__,
            "device": torch.cuda.get_device_name(), "config": cfg,
            "hyper": {"seq": L, "batch": B, "lr": a.lr, "warmup": warmup, "schedule": "cosine to 0.1x",
                      "betas": [0.9, 0.95], "weight_decay": 0.1, "grad_clip": 1.0, "mtp_weight": a.mtp_weight,
                      "autocast": "bf16", "steps": total},
            "params": {"trunk": count(model.parameters()), "mtp": count(mtp.parameters())},
            "tokens": {"train": n_plain, "chat": len(stream) - n_plain, "heldout": len(held_ids),
                       "trained_on": total * B * L},
            "train_seconds": train_seconds, "ms_per_step": per_step * 1000,
            "curve": curve, "heldout": {"trained_gpu": held_gpu, "transformers_gpu": held_hf},
            "samples": samples, "total_seconds": time.time() - t_start,
        }, f, indent=1)
    log(f"done in {time.time() - t_start:.0f}s")


if __name__ == "__main__":
    main()
