// Writes a Llama checkpoint whose greedy continuation is a chosen sequence
// of tokens, so that an end-to-end test can see the server handle output a
// random model would never produce (a tool call).
//
// How: one layer whose attention and MLP output projections are zero, so
// each position's final hidden state is rms_norm(embed(token)); embeddings
// are one-hot (hidden size >= vocabulary), and lm_head's column for token t
// is one-hot at next(t). The logit of next(t) is sqrt(hidden), every other
// logit 0: the next token is a function of the current one. The chain
// continues from the prompt's last token, and every token off the chain
// leads to <|im_end|>, the end of a turn.
//
// Tokenizer: byte-level BPE with no merges (a prompt encodes to bytes), the
// chat specials, <tool_call> and </tool_call> as added tokens (as Qwen's
// tokenizers have them), and each `piece` as one token of its own.
import fs from "node:fs";
import path from "node:path";

// GPT-2's byte-to-character map of byte-level BPE.
function byteChars() {
  const keep = [];
  for (let b = 33; b <= 126; ++b) keep.push(b);
  for (let b = 161; b <= 172; ++b) keep.push(b);
  for (let b = 174; b <= 255; ++b) keep.push(b);
  const map = new Array(256);
  let extra = 0;
  for (let b = 0; b < 256; ++b) map[b] = keep.includes(b) ? String.fromCodePoint(b) : String.fromCodePoint(256 + extra++);
  return map;
}

function writeSafetensors(file, tensors) {
  const header = {};
  let offset = 0;
  for (const [name, { shape, data }] of Object.entries(tensors)) {
    header[name] = { dtype: "F32", shape, data_offsets: [offset, offset + data.byteLength] };
    offset += data.byteLength;
  }
  let json = JSON.stringify(header);
  json += " ".repeat((8 - (json.length % 8)) % 8);
  const head = Buffer.alloc(8);
  head.writeBigUInt64LE(BigInt(json.length));
  const parts = [head, Buffer.from(json, "utf8")];
  for (const { data } of Object.values(tensors)) parts.push(Buffer.from(data.buffer, data.byteOffset, data.byteLength));
  fs.writeFileSync(file, Buffer.concat(parts));
}

// A byte-level tokenizer (tokenizer.json and tokenizer_config.json in dir):
// 256 byte tokens, the ChatML specials, <tool_call> and </tool_call>, then
// each of `pieces` as a token of its own. Returns each added token's and
// piece's id, and the vocabulary's size.
export function writeByteTokenizer(dir, pieces, chatTemplate) {
  const chars = byteChars();
  const vocab = {};
  for (let b = 0; b < 256; ++b) vocab[chars[b]] = b;
  const specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
  const added = [...specials, "<tool_call>", "</tool_call>"];
  const idOf = new Map();
  let next = 256;
  for (const t of added) {
    vocab[t] = next;
    idOf.set(t, next++);
  }
  for (const p of pieces) {
    if (idOf.has(p)) continue;
    const text = [...Buffer.from(p, "utf8")].map((b) => chars[b]).join("");
    vocab[text] = next;
    idOf.set(p, next++);
  }
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, "tokenizer.json"), JSON.stringify({
    version: "1.0", truncation: null, padding: null,
    added_tokens: added.map((t) => ({ id: idOf.get(t), content: t, single_word: false, lstrip: false, rstrip: false,
      normalized: false, special: specials.includes(t) })),
    normalizer: null,
    pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: null,
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges: [] },
  }));
  fs.writeFileSync(path.join(dir, "tokenizer_config.json"), JSON.stringify({
    tokenizer_class: "PreTrainedTokenizerFast", bos_token: null, eos_token: "<|im_end|>", pad_token: "<|endoftext|>",
    add_bos_token: false, chat_template: chatTemplate,
  }));
  return { idOf, size: next };
}

// dir: where to write; pieces: strings (or the names of added tokens) that
// follow the prompt's last token "\n" in order; chatTemplate: the
// tokenizer_config's template. Returns the ids of the chain.
export function writeChainModel(dir, pieces, chatTemplate) {
  const { idOf, size } = writeByteTokenizer(dir, pieces, chatTemplate);
  const V = 320, D = 320, I = 64, L = 1;
  if (size > V) throw new Error("chain model: too many pieces");
  const imEnd = idOf.get("<|im_end|>");

  const successor = new Array(V).fill(imEnd);
  let prev = "\n".charCodeAt(0);
  const chain = [];
  for (const p of pieces) {
    const id = idOf.get(p);
    if (chain.includes(id) || id === prev) throw new Error(`chain model: "${p}" repeats`);
    successor[prev] = id;
    chain.push(id);
    prev = id;
  }
  successor[prev] = imEnd;

  const zeros = (n) => new Float32Array(n);
  const ones = (n) => new Float32Array(n).fill(1);
  const embed = zeros(V * D), head = zeros(V * D);
  for (let t = 0; t < V; ++t) {
    embed[t * D + t] = 1;
    head[successor[t] * D + t] = 1;
  }
  const tensors = { "model.embed_tokens.weight": { shape: [V, D], data: embed } };
  for (let l = 0; l < L; ++l) {
    const p = `model.layers.${l}.`;
    tensors[p + "input_layernorm.weight"] = { shape: [D], data: ones(D) };
    for (const m of ["q", "k", "v", "o"]) tensors[p + `self_attn.${m}_proj.weight`] = { shape: [D, D], data: zeros(D * D) };
    tensors[p + "post_attention_layernorm.weight"] = { shape: [D], data: ones(D) };
    tensors[p + "mlp.gate_proj.weight"] = { shape: [I, D], data: zeros(I * D) };
    tensors[p + "mlp.up_proj.weight"] = { shape: [I, D], data: zeros(I * D) };
    tensors[p + "mlp.down_proj.weight"] = { shape: [D, I], data: zeros(D * I) };
  }
  tensors["model.norm.weight"] = { shape: [D], data: ones(D) };
  tensors["lm_head.weight"] = { shape: [V, D], data: head };

  writeSafetensors(path.join(dir, "model.safetensors"), tensors);
  fs.writeFileSync(path.join(dir, "config.json"), JSON.stringify({
    architectures: ["LlamaForCausalLM"], model_type: "llama", dtype: "float32", hidden_act: "silu",
    hidden_size: D, intermediate_size: I, num_hidden_layers: L, num_attention_heads: 4, num_key_value_heads: 4,
    head_dim: D / 4, max_position_embeddings: 4096, rms_norm_eps: 1e-6,
    rope_parameters: { rope_theta: 10000.0, rope_type: "default" }, tie_word_embeddings: false,
    attention_bias: false, mlp_bias: false, vocab_size: V, bos_token_id: null, eos_token_id: imEnd,
  }, null, 1));
  fs.writeFileSync(path.join(dir, "generation_config.json"), JSON.stringify({ eos_token_id: [imEnd], pad_token_id: idOf.get("<|endoftext|>") }));
  return chain;
}
