#!/usr/bin/env python3
"""Writes small synthetic tokenizer.json files that exercise the components
the four real tokenizers do not use (Split behaviours, Metaspace schemes,
Strip/Replace/Metaspace decoders, added-token lstrip/rstrip/single_word,
TemplateProcessing, unk and byte fallback ...), plus the cases to run.

    scripts/gen_synthetic_tokenizers.py OUT_DIR

The expected ids and texts come from Hugging Face tokenizers itself:
scripts/gen_synthetic_reference.js runs them through the npm `tokenizers`
package and writes tests/data/tokenizer/synthetic_reference.json.
"""
import json
import os
import sys

CHARS = list("▁ abcdehlorwxyz.,!'123-+é\u0301")
WORDS = ["ab", "abc", "▁a", "▁ab", "▁abc", "he", "hel", "hell", "hello", "▁h", "▁he", "▁hel",
         "▁hell", "▁hello", "wo", "wor", "worl", "world", "▁w", "▁wo", "▁wor", "▁worl",
         "▁world", "▁▁", "12", "123", "a-", "a-b", "-b", "a+", "a+b", "+b", "--", "++", "+-",
         " a", " ab", "  ", "-a", "b-", "x-", "x+", "1-", "-1"]


def model():
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for c in CHARS:
        vocab.setdefault(c, len(vocab))
    merges = []
    for w in WORDS:
        chars = list(w)
        # Build the word left to right: ((a b) c) ...
        left = chars[0]
        for c in chars[1:]:
            if left + c not in vocab:
                vocab[left + c] = len(vocab)
                merges.append([left, c])
            left = left + c
    return {"type": "BPE", "dropout": None, "unk_token": "<unk>",
            "continuing_subword_prefix": None, "end_of_word_suffix": None,
            "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
            "vocab": vocab, "merges": merges}


def added(extra_start):
    toks = [
        {"id": 0, "content": "<unk>", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True},
        {"id": 1, "content": "<s>", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True},
        {"id": 2, "content": "</s>", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True},
        {"id": extra_start, "content": "<tag>", "single_word": False, "lstrip": True,
         "rstrip": True, "normalized": False, "special": False},
        {"id": extra_start + 1, "content": "word", "single_word": True, "lstrip": False,
         "rstrip": False, "normalized": True, "special": False},
        {"id": extra_start + 2, "content": "<sp>", "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": True},
        {"id": extra_start + 3, "content": "Hi There", "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": True, "special": False},
    ]
    return toks


SPM_DECODER = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
    {"type": "ByteFallback"}, {"type": "Fuse"},
    {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
PLAIN_DECODER = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
    {"type": "ByteFallback"}, {"type": "Fuse"}]}
BOS_TEMPLATE = {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                           {"Sequence": {"id": "A", "type_id": 0}},
                           {"SpecialToken": {"id": "</s>", "type_id": 0}}],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                         {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]},
                                   "</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]}}}


def split(pattern, behavior, invert=False, regex=True):
    return {"type": "Split", "pattern": {"Regex" if regex else "String": pattern},
            "behavior": behavior, "invert": invert}


def metaspace(scheme, do_split=True):
    return {"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme, "split": do_split}


VARIANTS = {
    # Llama-2 / Mistral style sentencepiece BPE.
    "spm": dict(normalizer={"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        pre_tokenizer=None, decoder=SPM_DECODER, post_processor=BOS_TEMPLATE),
    "metaspace_first": dict(normalizer={"type": "NFKC"}, pre_tokenizer=metaspace("first"),
                            decoder={"type": "Metaspace", "replacement": "▁",
                                     "prepend_scheme": "first", "split": True}),
    "metaspace_always_nosplit": dict(normalizer={"type": "Lowercase"},
                                     pre_tokenizer=metaspace("always", False),
                                     decoder={"type": "Metaspace", "replacement": "▁",
                                              "prepend_scheme": "always", "split": False}),
    "metaspace_never": dict(normalizer=None, pre_tokenizer=metaspace("never"),
                            decoder={"type": "Metaspace", "replacement": "▁",
                                     "prepend_scheme": "never", "split": True}),
    "split_removed": dict(pre_tokenizer=split("[-+]", "Removed")),
    "split_isolated": dict(pre_tokenizer=split("[-+]", "Isolated")),
    "split_merged_prev": dict(pre_tokenizer=split("[-+]", "MergedWithPrevious")),
    "split_merged_next": dict(pre_tokenizer=split("[-+]", "MergedWithNext")),
    "split_contiguous": dict(pre_tokenizer=split("[-+]", "Contiguous")),
    "split_inverted": dict(pre_tokenizer=split("[a-z]+", "Isolated", invert=True)),
    "split_inverted_removed": dict(pre_tokenizer=split("[a-z]+", "Removed", invert=True)),
    "split_string": dict(pre_tokenizer=split("-", "MergedWithNext", regex=False)),
    "split_empty_matches": dict(pre_tokenizer=split("\\b", "Isolated")),
    "split_lookahead": dict(pre_tokenizer=split("(?=[-+])", "MergedWithNext")),
    "digits": dict(pre_tokenizer={"type": "Digits", "individual_digits": False}),
    "digits_individual": dict(pre_tokenizer={"type": "Digits", "individual_digits": True}),
    "whitespace": dict(pre_tokenizer={"type": "Whitespace"}),
    "whitespace_split": dict(pre_tokenizer={"type": "WhitespaceSplit"}),
    "punctuation": dict(pre_tokenizer={"type": "Punctuation", "behavior": "Isolated"}),
    "bytelevel_prefix": dict(pre_tokenizer={"type": "ByteLevel", "add_prefix_space": True,
                                            "trim_offsets": True, "use_regex": True},
                             decoder={"type": "ByteLevel", "add_prefix_space": True,
                                      "trim_offsets": True, "use_regex": True},
                             post_processor={"type": "ByteLevel", "add_prefix_space": True,
                                             "trim_offsets": True, "use_regex": True}),
    "sequence": dict(normalizer={"type": "Sequence", "normalizers": [
        {"type": "NFD"}, {"type": "StripAccents"}, {"type": "Lowercase"},
        {"type": "Strip", "strip_left": True, "strip_right": True},
        {"type": "Replace", "pattern": {"Regex": "[0-9]{2,}"}, "content": "12"}]},
        pre_tokenizer={"type": "Sequence", "pretokenizers": [
            {"type": "WhitespaceSplit"}, {"type": "Digits", "individual_digits": True},
            metaspace("always")]},
        decoder={"type": "Sequence", "decoders": [
            {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True},
            {"type": "Strip", "content": "a", "start": 2, "stop": 0}]}),
    "nfkd_replace_regex": dict(normalizer={"type": "Sequence", "normalizers": [
        {"type": "NFKD"},
        {"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": "▁"}]},
        decoder={"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"Regex": "▁+"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]}),
    "no_decoder": dict(decoder=None),
}

CASES = [
    "", " ", "ab", "a b", " ab abc", "hello world", "Hello World", "  hello   world  ",
    "a-b+c--d++e", "-a-", "+b+", "a - b + c", "x-1+23-456", "123456789", "١٢٣ 12",
    "a<tag>b", "a   <tag>   b", "<tag><tag>", "word", "a word b", "sword words", "_word_",
    "Hi There", "hi there", "<s>ab</s>", "<sp> <sp>", "<unk>",
    "é e\u0301 É", "İstanbul", "ﬁne ½ ²", "Zoë's café!", "tab\tnew\nline\r\n",
    "中文 ab 🙂", "\u00a0a\u3000b\u2028c", "a\u0085b", "q?q", "!!..,,", "▁a▁▁b",
]


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    m = model()
    extra = max(m["vocab"].values()) + 1
    for name, parts in VARIANTS.items():
        tj = {"version": "1.0", "truncation": None, "padding": None,
              "added_tokens": added(extra),
              "normalizer": parts.get("normalizer"),
              "pre_tokenizer": parts.get("pre_tokenizer"),
              "post_processor": parts.get("post_processor"),
              "decoder": parts.get("decoder", PLAIN_DECODER),
              "model": m}
        with open(os.path.join(out, name + ".json"), "w", encoding="utf-8") as f:
            json.dump(tj, f, ensure_ascii=False, indent=None, separators=(",", ":"))
    with open(os.path.join(out, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"variants": list(VARIANTS), "cases": CASES}, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
