#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizer/<name>.json: reference encodings and decodings
of a varied corpus by Hugging Face `tokenizers`, for tests/text/tokenizer_test.cpp.

Usage: python3 tools/make_tokenizer_fixtures.py [--shared /work/shared]

Each case holds:
  text         the input
  ids          encode(text, add_special_tokens=True)
  plain_from   when present, encode(text, add_special_tokens=False) is ids[plain_from:]
  ids_plain    encode(text, add_special_tokens=False), when it is no suffix of ids
  decoded      decode(ids, skip_special_tokens=False)
  decoded_skip decode(ids, skip_special_tokens=True), omitted when equal to decoded
  stream       (some cases) the non-empty chunks of DecodeStream over ids

"id_cases" hold random id lists (any id, special ones included) with their
decoded, decoded_skip and, where DecodeStream accepts them, stream.
"""
import argparse
import json
import os
import random
import unicodedata

import tokenizers
from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

NAMES = ["llama3", "qwen3", "llama2"]
NUM_RANDOM = 2200
NUM_RANDOM_ID_LISTS = 300
SEED = 20240607

NAMED_CASES = [
    ("empty", ""),
    ("space", " "),
    ("english", "The quick brown fox jumps over the lazy dog. It's 5 o'clock; we'll see."),
    ("english_paragraph",
     "Tokenization is the first step of every language model. Words such as "
     "\"unbelievably\" and 'counter-intuitive' split into several pieces, while "
     "common words like the, and, of stay whole."),
    ("contractions", "I'm you're he'll she'd we've it's DON'T WON'T They'RE ſ's"),
    ("code_python",
     "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n"),
    ("code_cpp",
     "#include <vector>\nint main() {\n\tstd::vector<int> v{1, 2, 3};\n\tfor (auto& x : v) x *= 2;"
     "\n\treturn v[0] == 2 ? 0 : 1; // done\n}\n"),
    ("numbers", "0 7 42 123 1234 12345 123456789 3.14159 -2.5e10 1,000,000 0x1F 007 2024-06-07"),
    ("whitespace_runs", "a  b   c    d     e      f\u00a0\u00a0g\u3000h"),
    ("leading_trailing_spaces", "   leading and trailing   "),
    ("tabs_newlines", "\tfoo\n\tbar\n\n\nbaz\t\t\tqux\n"),
    ("crlf", "line one\r\nline two\r\n\r\nline four\r"),
    ("only_newlines", "\n\n\n"),
    ("accents_composed", "café naïve résumé Ångström façade São Paulo Zürich"),
    ("accents_decomposed", "cafe\u0301 nai\u0308ve re\u0301sume\u0301 A\u030angstro\u0308m"),
    ("combining_order", "a\u0328\u0301 a\u0301\u0328 q\u0307\u0323 \u1e0b\u0323"),
    ("hangul", "한국어 텍스트 \u1100\u1161\u11a8 \u1112\u1161\u11ab"),
    ("cjk", "你好，世界！日本語のテキストです。中文分词测试。"),
    ("emoji", "Hi 😀😃 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🧑🏿‍💻 🇺🇳"),
    ("greek", "Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο."),
    ("cyrillic", "Съешь же ещё этих мягких французских булок, да выпей чаю."),
    ("arabic", "مرحبا بالعالم، هذا نص تجريبي."),
    ("hebrew", "שלום עולם, זהו טקסט לדוגמה."),
    ("devanagari", "नमस्ते दुनिया, यह एक परीक्षण है।"),
    ("thai", "สวัสดีชาวโลก นี่คือข้อความทดสอบ"),
    ("mixed_scripts", "English, Ελληνικά, Русский, 中文, العربية, עברית, हिन्दी, ไทย 🙂"),
    ("llama3_specials", "<|begin_of_text|>Hello<|end_of_text|> <|eot_id|>x<|start_header_id|>"),
    ("sentencepiece_specials", "<s>Hello</s> <s> </s><unk>"),
    ("qwen_specials", "<|im_start|>user\nHi<|im_end|>\n<|endoftext|><think>ok</think>"),
    ("partial_specials", "<|begin_of_text <|im_start <s </s <| |> <|im_end| <|endoftext|"),
    ("nested_specials", "<<s>> <<|im_start|>> <|<|begin_of_text|>|>"),
    ("unicode_spaces", "a\u0085b\u2028c\u2029d\u200be\u2009f\u202fg\u205fh\u180ei"),
    ("control_chars", "\x00\x01\x02\x7f bell\x07 esc\x1b[0m"),
    ("fullwidth_digits", "\uff11\uff12\uff13 \u0661\u0662\u0663 \u0967\u0968\u0969 ½ ² Ⅻ"),
    ("punctuation_runs", "!!!??? ... --- *** ((())) \"\"\" ''' ``` ~~~ ;;; ::"),
    ("replacement_char", "bad \ufffd byte \ufffd\ufffd end"),
    ("url_email", "https://example.com/path?q=1&r=two#frag mail@example.org"),
    ("json_snippet", "{\"key\": [1, 2.5, true, null], \"nested\": {\"a\": \"b\"}}"),
]

WORDS = ("the of and to in is you that it he was for on are as with his they at be this "
         "have from or one had by word but not what all were we when your can said there "
         "use an each which she do how their if will up other about out many then them "
         "tokenizer model llama qwen café naïve 東京 москва αθήνα").split()

# (first, last) code point ranges, and a weight for each.
RANGES = [
    ((0x20, 0x7E), 40), ((0xA0, 0x24F), 6), ((0x300, 0x36F), 4), ((0x370, 0x3FF), 3),
    ((0x400, 0x4FF), 3), ((0x5D0, 0x5EA), 2), ((0x620, 0x64A), 2), ((0x660, 0x669), 1),
    ((0x900, 0x97F), 2), ((0xE01, 0xE5B), 2), ((0x1100, 0x11FF), 1), ((0x1E00, 0x1EFF), 2),
    ((0x2000, 0x206F), 2), ((0x2190, 0x22FF), 1), ((0x3000, 0x30FF), 3), ((0x4E00, 0x9FFF), 5),
    ((0xAC00, 0xD7A3), 3), ((0xFF01, 0xFF5E), 1), ((0x1F300, 0x1F64F), 4), ((0x1F900, 0x1F9FF), 2),
    ((0x1D400, 0x1D7FF), 1),
]
SPECIAL_CHARS = ["\u200d", "\ufe0f", "\U0001F3FB", "\U0001F3FF", "\u0085", "\u00a0", "\t", "\n",
                 "\r\n", "\r", "  ", "\u3000"]
FRAGMENTS = ["<s>", "</s>", "<unk>", "<|", "|>", "<|im_start|>", "<|im_end|>", "<|endoftext|>",
             "<|begin_of_text|>", "<|eot_id|>", "<think>", "'s", "'ll", "'RE", "\u2581", "Ġ",
             "<0x41>"]


def random_char(rng):
    (first, last), = rng.choices([r for r, _ in RANGES], weights=[w for _, w in RANGES])
    while True:
        c = chr(rng.randint(first, last))
        if unicodedata.category(c) not in ("Cn", "Cs", "Co"):
            return c


def random_string(rng):
    parts = []
    for _ in range(rng.randint(1, 12)):
        roll = rng.random()
        if roll < 0.25:
            parts.append((" " if rng.random() < 0.6 else "") + rng.choice(WORDS))
        elif roll < 0.35:
            parts.append(rng.choice(SPECIAL_CHARS))
        elif roll < 0.42:
            parts.append(rng.choice(FRAGMENTS))
        else:
            parts.append("".join(random_char(rng) for _ in range(rng.randint(1, 4))))
    return "".join(parts)


def long_text():
    base = ("Large language models read text as tokens. 大型语言模型把文本读作词元。 "
            "Модели читают текст токенами. 🧠✨ Numbers: 3141592653589793 and code `x += 1;`\n\t")
    return "".join(base + str(i) + " " for i in range(180))


def stream_chunks(tok, ids):
    """The non-empty DecodeStream chunks, or None where DecodeStream fails."""
    ds = DecodeStream(skip_special_tokens=False)
    chunks = []
    try:
        for i in ids:
            out = ds.step(tok, i)
            if out:
                chunks.append(out)
    except Exception:  # DecodeStream rejects some invalid byte sequences
        return None
    return chunks


def random_ids(rng, tok):
    """Ids from the whole vocabulary, biased to byte tokens and added tokens."""
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    byte_ids = [tok.token_to_id("<0x%02X>" % b) for b in range(256)]
    byte_ids = [i for i in byte_ids if i is not None]
    if not byte_ids:  # byte-level vocabularies start with the 256 single-byte tokens
        byte_ids = list(range(256))
    added = list(tok.get_added_tokens_decoder().keys())
    ids = []
    for _ in range(rng.randint(1, 16)):
        roll = rng.random()
        if roll < 0.45:
            ids.append(rng.choice(byte_ids))
        elif roll < 0.55:
            ids.append(rng.choice(added))
        else:
            ids.append(rng.randrange(vocab_size))
    return ids


def make_case(tok, text, with_stream):
    ids = tok.encode(text, add_special_tokens=True).ids
    plain = tok.encode(text, add_special_tokens=False).ids
    case = {"text": text, "ids": ids}
    offset = len(ids) - len(plain)
    if offset >= 0 and ids[offset:] == plain:
        if offset > 0:
            case["plain_from"] = offset
    else:
        case["ids_plain"] = plain
    case["decoded"] = tok.decode(ids, skip_special_tokens=False)
    skip = tok.decode(ids, skip_special_tokens=True)
    if skip != case["decoded"]:
        case["decoded_skip"] = skip
    if with_stream:
        case["stream"] = stream_chunks(tok, ids)
    return case


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser()
    parser.add_argument("--shared", default=os.path.join(here, "..", "..", "shared"))
    parser.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "tokenizer"))
    args = parser.parse_args()
    rng = random.Random(SEED)
    random_texts = [random_string(rng) for _ in range(NUM_RANDOM)]
    named = NAMED_CASES + [("very_long", long_text())]
    os.makedirs(args.out, exist_ok=True)
    for name in NAMES:
        tok = Tokenizer.from_file(os.path.join(args.shared, "tokenizers", name, "tokenizer.json"))
        cases = []
        for case_name, text in named:
            case = make_case(tok, text, with_stream=True)
            case["name"] = case_name
            cases.append(case)
        for i, text in enumerate(random_texts):
            case = make_case(tok, text, with_stream=i < 200)
            case["name"] = "random_%d" % i
            cases.append(case)
        id_cases = []
        id_rng = random.Random(SEED + 1)
        for i in range(NUM_RANDOM_ID_LISTS):
            ids = random_ids(id_rng, tok)
            case = {"name": "ids_%d" % i, "ids": ids,
                    "decoded": tok.decode(ids, skip_special_tokens=False)}
            skip = tok.decode(ids, skip_special_tokens=True)
            if skip != case["decoded"]:
                case["decoded_skip"] = skip
            chunks = stream_chunks(tok, ids)
            if chunks is not None:
                case["stream"] = chunks
            id_cases.append(case)
        doc = {"tokenizer": name, "tokenizers_version": tokenizers.__version__, "seed": SEED,
               "unicode_version": unicodedata.unidata_version, "cases": cases, "id_cases": id_cases}
        path = os.path.join(args.out, name + ".json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
            f.write("\n")
        print("%s: %d cases, %d bytes" % (path, len(cases), os.path.getsize(path)))


if __name__ == "__main__":
    main()
