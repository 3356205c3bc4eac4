#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizer/synthetic.json: small tokenizers built with
Hugging Face `tokenizers` for the components the three real files do not use
(every Split behavior with and without invert, Metaspace's prepend schemes,
Strip/Replace/NFD normalizers, added tokens with lstrip/rstrip/single_word and
normalized=true, ByteLevel with add_prefix_space and use_regex), each with its
reference encodings and decodings of a small corpus.

Usage: python3 tools/make_synthetic_tokenizer_fixtures.py
"""
import json
import os
import random

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors

SEED = 99


def sentencepiece_model():
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for c in "\u2581" + "".join(chr(c) for c in range(0x21, 0x7F)) + "é":
        vocab.setdefault(c, len(vocab))
    merges = []
    for a, b in [("t", "h"), ("th", "e"), ("\u2581", "the"), ("i", "n"), ("in", "g"),
                 ("\u2581", "a"), ("a", "t"), ("h", "at"), ("\u2581", "hat"), ("e", "r"),
                 ("\u2581", "t"), ("o", "n"), ("\u2581", "on"), ("1", "2")]:
        merges.append((a, b))
        vocab.setdefault(a + b, len(vocab))
    return models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=False)


def byte_level_model():
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(alphabet))}
    merges = []
    for a, b in [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("Ġ", "Ġ")]:
        merges.append((a, b))
        vocab.setdefault(a + b, len(vocab))
    return models.BPE(vocab, merges)


def variants():
    out = []
    for behavior in ["removed", "isolated", "merged_with_previous", "merged_with_next",
                     "contiguous"]:
        for invert in [False, True]:
            t = Tokenizer(sentencepiece_model())
            t.pre_tokenizer = pre_tokenizers.Split(Regex(r"\s+|[,.!?]+"), behavior, invert=invert)
            out.append(("split_%s_%s" % (behavior, "inverted" if invert else "plain"), t))
    t = Tokenizer(sentencepiece_model())
    t.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_next")
    out.append(("split_string_pattern", t))
    for scheme in ["always", "first", "never"]:
        for split in [True, False]:
            t = Tokenizer(sentencepiece_model())
            t.pre_tokenizer = pre_tokenizers.Metaspace("\u2581", prepend_scheme=scheme, split=split)
            t.decoder = decoders.Metaspace("\u2581", prepend_scheme=scheme, split=split)
            t.add_special_tokens(["<s>"])
            out.append(("metaspace_%s_%s" % (scheme, "split" if split else "whole"), t))
    t = Tokenizer(sentencepiece_model())
    t.normalizer = normalizers.Sequence([normalizers.Strip(left=True, right=False),
                                         normalizers.Replace(Regex(r"[0-9]+"), "#"),
                                         normalizers.NFD()])
    t.pre_tokenizer = pre_tokenizers.Metaspace("\u2581", prepend_scheme="always", split=True)
    t.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                   decoders.Fuse(), decoders.Strip(" ", 1, 1)])
    t.post_processor = processors.TemplateProcessing(single="<s> $A </s>",
                                                     special_tokens=[("<s>", 1), ("</s>", 2)])
    out.append(("normalizers_strip_replace_nfd", t))
    t = Tokenizer(sentencepiece_model())
    t.normalizer = normalizers.Replace("Q", "NORM")
    t.pre_tokenizer = pre_tokenizers.Metaspace("\u2581", prepend_scheme="first", split=True)
    t.decoder = decoders.Metaspace("\u2581", prepend_scheme="first", split=True)
    t.add_tokens([AddedToken("<x>", lstrip=True, normalized=False),
                  AddedToken("[y]", rstrip=True, normalized=False),
                  AddedToken("hat", single_word=True, normalized=False),
                  AddedToken("NORM", normalized=True)])
    t.add_special_tokens([AddedToken("<s>"), AddedToken("</s>")])
    out.append(("added_tokens_strip_single_word_normalized", t))
    for prefix in [True, False]:
        t = Tokenizer(byte_level_model())
        t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix, use_regex=True)
        t.decoder = decoders.ByteLevel()
        t.add_special_tokens(["<|end|>"])
        out.append(("byte_level_prefix_%s" % ("on" if prefix else "off"), t))
    return out


CORPUS = [
    "", " ", "the hat", "  the  hat  ", "Hello, world! How are you?", "a,b,,c...d!?e",
    "on the thing\tin\nthe\r\nhat", "12 123 1234", "café cafe\u0301", "naïve ünïcödé 😀 中文",
    "<x>hat [y] hat", "that hat hats hat_ hat1 hat.", " <x>  [y]   z", "Q q QQ", "<s>the</s>",
    "the<s> hat </s>hat", "<|end|> the <|end|>", "     ", "\n\n", "'s 're THE",
]


def random_text(rng):
    pieces = ["the", "hat", " ", "  ", ",", ".", "!", "<x>", "[y]", "Q", "<s>", "</s>", "é",
              "e\u0301", "12", "\t", "\n", "😀", "in", "on", "ing", "<|end|>", "_"]
    return "".join(rng.choice(pieces) for _ in range(rng.randint(1, 10)))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out_path = os.path.join(here, "..", "tests", "fixtures", "tokenizer", "synthetic.json")
    rng = random.Random(SEED)
    texts = CORPUS + [random_text(rng) for _ in range(120)]
    docs = []
    for name, tok in variants():
        cases = []
        for text in texts:
            ids = tok.encode(text, add_special_tokens=True).ids
            plain = tok.encode(text, add_special_tokens=False).ids
            cases.append({"text": text, "ids": ids, "ids_plain": plain,
                          "decoded": tok.decode(ids, skip_special_tokens=False),
                          "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
        docs.append({"name": name, "tokenizer": json.loads(tok.to_str()), "cases": cases})
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"variants": docs}, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print("%s: %d variants, %d bytes" % (out_path, len(docs), os.path.getsize(out_path)))


if __name__ == "__main__":
    main()
