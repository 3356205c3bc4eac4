#!/usr/bin/env python3
"""Prepare the corpus and the tokenizer of cellm's bundled model (models/kjv-small).

Source. The King James Bible as printed by Debian's `bible-kjv` package (4.38):

    bible -f -l1000 "Gen1:1-Rev22:21"

prints one verse a line, `<Book><chapter>:<verse> <text>` (e.g. `Ge1:1 In the
beginning God created the heaven and the earth.`), 31,102 lines. Those exact bytes
are committed, xz-compressed (~1 MB), as data/kjv/bible-kjv-4.38.txt.xz, so this
script needs neither the package nor a network: it reads the archive by default.
`--refresh-archive` rewrites the archive from the local `bible` binary
(`apt-get install bible-kjv`) and fails if the text would change.

Cleaning. The reference is split off and kept only as metadata; in the text,
runs of whitespace become one space and the ends are stripped (the package has
two double spaces and one trailing space). Nothing else changes: spelling,
capitals (LORD), punctuation and the text's own `--` stay exactly as printed.
The package has no headings, italics or pilcrow markers to strip.

Split. Chapters are numbered 0..1188 in canonical order; every chapter whose
number is 9 mod 10 (Genesis 10, 20, ..., Revelation 13) is held out: 118
chapters, 3,057 verses, 9.8% of the verses and 9.6% of the characters. The
held-out tenth is only ever scored, never used to choose anything. Of the rest,
every chapter whose number is 4 mod 40 (Genesis 5, 45, ...) is the validation
split (30 chapters, 2.5% of the text) that training uses to pick its checkpoint;
the remaining 1,041 chapters are the training split. Whole
chapters are held out, not single verses, so a held-out verse's neighbours are
never in training and held-out perplexity measures generalisation to unseen
passages rather than interpolation between adjacent verses; taking one chapter
in ten spreads it over every book and genre (law, history, poetry, prophecy,
gospels, epistles). Caveat: the KJV has parallel passages (Kings/Chronicles,
the synoptic gospels, Psalm 18 = 2 Samuel 22), so some held-out text has a
near-duplicate in training; this is a property of the book, not a leak of the
split.

Documents. A chapter is one document: its verses joined with "\n", wrapped as
<|bos|> text <|eos|>. The training stream is the training chapters' documents
concatenated in canonical order; the validation and held-out streams likewise.

Tokenizer. Byte-level BPE (GPT-2 style: ByteLevel pre-tokenizer with the GPT-2
regex and no prefix space, ByteLevel decoder, all 256 bytes in the alphabet so
any text round-trips), 4,096 ids: 0 = <|bos|>, 1 = <|eos|>, then the 256 bytes,
then merges. Trained with the `tokenizers` package on the training split's
verses only. Its post-processor (TemplateProcessing) prepends <|bos|> when
special tokens are added.

Outputs (all regenerated; nothing here is needed in git except the tokenizer):
    <build>/                        default build/kjv (ignored by git)
        verses.tsv                  book, chapter, verse, split, cleaned text
        {train,validation,heldout}.txt  one verse a line, a blank line between chapters
        {train,validation,heldout}.bin  uint16 token ids of the document streams
        tokenizer.json, tokenizer_config.json
        meta.json                   counts, hashes, split rule, tokenizer summary
    <tokenizer-out>/                default models/kjv-small (committed)
        tokenizer.json, tokenizer_config.json

Usage:
    python3 tools/prepare_kjv.py                 # a few seconds on one core
    python3 tools/prepare_kjv.py --build-dir /tmp/kjv --tokenizer-out /tmp/kjv
"""

import argparse
import hashlib
import json
import lzma
import os
import re
import shutil
import subprocess
import sys

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARCHIVE = os.path.join(REPO_ROOT, "data", "kjv", "bible-kjv-4.38.txt.xz")
BIBLE_COMMAND = ["bible", "-f", "-l1000", "Gen1:1-Rev22:21"]
RAW_SHA256 = "cd45f0c9cedab8e4439bd6486c8952c77cc8b0ecc5d1f6ae3513f2039f47229d"

NUM_BOOKS = 66
NUM_CHAPTERS = 1189
NUM_VERSES = 31102
HELDOUT_EVERY = 10       # chapter number % HELDOUT_EVERY == HELDOUT_REMAINDER is held out
HELDOUT_REMAINDER = 9
VALIDATION_EVERY = 40    # of the rest, chapter number % 40 == 4 is the validation split
VALIDATION_REMAINDER = 4
SPLITS = ("train", "validation", "heldout")

VOCAB_SIZE = 4096
BOS = "<|bos|>"
EOS = "<|eos|>"

LINE_RE = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$")


def read_raw(refresh_archive):
    """Returns the package's output as text (the committed archive by default)."""
    if refresh_archive:
        if shutil.which("bible") is None:
            sys.exit("prepare_kjv: --refresh-archive needs the `bible` command (apt-get install bible-kjv)")
        raw = subprocess.run(BIBLE_COMMAND, check=True, capture_output=True).stdout
        digest = hashlib.sha256(raw).hexdigest()
        if digest != RAW_SHA256:
            sys.exit(f"prepare_kjv: `{' '.join(BIBLE_COMMAND)}` printed sha256 {digest}, expected "
                     f"{RAW_SHA256}; a different package version? Not overwriting {ARCHIVE}.")
        with lzma.open(ARCHIVE, "wb", preset=9 | lzma.PRESET_EXTREME) as f:
            f.write(raw)
        print(f"prepare_kjv: wrote {ARCHIVE} ({os.path.getsize(ARCHIVE)} bytes)")
    else:
        if not os.path.exists(ARCHIVE):
            sys.exit(f"prepare_kjv: {ARCHIVE} is missing (it is committed; or use --refresh-archive)")
        with lzma.open(ARCHIVE, "rb") as f:
            raw = f.read()
        digest = hashlib.sha256(raw).hexdigest()
        if digest != RAW_SHA256:
            sys.exit(f"prepare_kjv: {ARCHIVE} decompresses to sha256 {digest}, expected {RAW_SHA256}")
    return raw.decode("ascii")


def clean_text(text):
    return " ".join(text.split())


def parse_verses(raw):
    """Returns [(book, chapter, verse, text)] in canonical order, validated."""
    verses = []
    for line_number, line in enumerate(raw.split("\n"), start=1):
        if not line:
            continue
        m = LINE_RE.match(line)
        if m is None:
            sys.exit(f"prepare_kjv: line {line_number} is not `<ref> <text>`: {line[:80]!r}")
        book, chapter, verse, text = m.group(1), int(m.group(2)), int(m.group(3)), clean_text(m.group(4))
        if not text or not all(" " <= ch <= "~" for ch in text):
            sys.exit(f"prepare_kjv: line {line_number} has empty or non-printable text")
        verses.append((book, chapter, verse, text))
    books = list(dict.fromkeys(v[0] for v in verses))
    chapters = list(dict.fromkeys((v[0], v[1]) for v in verses))
    if (len(books), len(chapters), len(verses)) != (NUM_BOOKS, NUM_CHAPTERS, NUM_VERSES):
        sys.exit(f"prepare_kjv: found {len(books)} books, {len(chapters)} chapters, {len(verses)} verses; "
                 f"expected {NUM_BOOKS}, {NUM_CHAPTERS}, {NUM_VERSES}")
    return verses


def split_of(chapter_number):
    if chapter_number % HELDOUT_EVERY == HELDOUT_REMAINDER:
        return "heldout"
    if chapter_number % VALIDATION_EVERY == VALIDATION_REMAINDER:
        return "validation"
    return "train"


def split_chapters(verses):
    """Returns {split: [chapter]}, a chapter being [(book, chapter, verse, text)]."""
    chapters = {}
    for v in verses:
        chapters.setdefault((v[0], v[1]), []).append(v)
    splits = {name: [] for name in SPLITS}
    for number, key in enumerate(chapters):
        splits[split_of(number)].append(chapters[key])
    return splits


def train_tokenizer(train_chapters):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator((v[3] for chapter in train_chapters for v in chapter), trainer=trainer)
    bos_id, eos_id = tokenizer.token_to_id(BOS), tokenizer.token_to_id(EOS)
    assert (bos_id, eos_id) == (0, 1), (bos_id, eos_id)
    assert tokenizer.get_vocab_size() == VOCAB_SIZE, tokenizer.get_vocab_size()
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A {BOS} $B",
        special_tokens=[(BOS, bos_id)],
    )
    return tokenizer


def tokenizer_config():
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": None,
        "unk_token": None,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 256,
        "added_tokens_decoder": {
            "0": {"content": BOS, "lstrip": False, "normalized": False, "rstrip": False,
                  "single_word": False, "special": True},
            "1": {"content": EOS, "lstrip": False, "normalized": False, "rstrip": False,
                  "single_word": False, "special": True},
        },
    }


def document_text(chapter):
    return "\n".join(v[3] for v in chapter)


def encode_stream(tokenizer, chapters):
    """<|bos|> chapter <|eos|> for each chapter, as one uint16 array."""
    texts = [document_text(c) for c in chapters]
    encodings = tokenizer.encode_batch(texts, add_special_tokens=False)
    ids = []
    for e in encodings:
        ids.append(0)
        ids.extend(e.ids)
        ids.append(1)
    return np.asarray(ids, dtype=np.uint16)


def check_round_trip(tokenizer, texts):
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        back = tokenizer.decode(ids, skip_special_tokens=False)
        if back != text:
            sys.exit(f"prepare_kjv: tokenizer does not round-trip {text[:60]!r} -> {back[:60]!r}")
    with_bos = tokenizer.encode("In the beginning").ids
    if with_bos[0] != 0:
        sys.exit("prepare_kjv: the post-processor did not prepend <|bos|>")


def write_text(path, chapters):
    with open(path, "w", encoding="ascii", newline="\n") as f:
        f.write("\n\n".join(document_text(c) for c in chapters) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-dir", default=os.path.join(REPO_ROOT, "build", "kjv"))
    parser.add_argument("--tokenizer-out", default=os.path.join(REPO_ROOT, "models", "kjv-small"),
                        help="also write tokenizer.json and tokenizer_config.json here ('' to skip)")
    parser.add_argument("--refresh-archive", action="store_true",
                        help="regenerate the committed archive from the local `bible` command")
    args = parser.parse_args()

    verses = parse_verses(read_raw(args.refresh_archive))
    splits = split_chapters(verses)
    os.makedirs(args.build_dir, exist_ok=True)

    split_by_key = {(c[0][0], c[0][1]): name for name, chapters in splits.items() for c in chapters}
    with open(os.path.join(args.build_dir, "verses.tsv"), "w", encoding="ascii", newline="\n") as f:
        f.write("book\tchapter\tverse\tsplit\ttext\n")
        for book, chapter, verse, text in verses:
            f.write(f"{book}\t{chapter}\t{verse}\t{split_by_key[(book, chapter)]}\t{text}\n")

    tokenizer = train_tokenizer(splits["train"])
    check_round_trip(tokenizer, [document_text(c) for c in splits["heldout"][:20]] +
                     ["Ünïcödé ✓ 日本語 🙂\t\r\n  x", "", " leading and trailing spaces  "])
    summary = {}
    for name, chapters in splits.items():
        write_text(os.path.join(args.build_dir, f"{name}.txt"), chapters)
        ids = encode_stream(tokenizer, chapters)
        ids.tofile(os.path.join(args.build_dir, f"{name}.bin"))
        summary[name] = {"chapters": len(chapters), "verses": sum(len(c) for c in chapters),
                         "chars": sum(len(document_text(c)) for c in chapters), "tokens": int(ids.size)}

    out_dirs = [args.build_dir] + ([args.tokenizer_out] if args.tokenizer_out else [])
    for out_dir in out_dirs:
        os.makedirs(out_dir, exist_ok=True)
        tokenizer.save(os.path.join(out_dir, "tokenizer.json"), pretty=True)
        with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
            json.dump(tokenizer_config(), f, indent=2)
            f.write("\n")

    with open(os.path.join(args.build_dir, "tokenizer.json"), "rb") as f:
        tokenizer_sha256 = hashlib.sha256(f.read()).hexdigest()
    meta = {
        "source": " ".join(BIBLE_COMMAND) + " (Debian bible-kjv 4.38)",
        "raw_sha256": RAW_SHA256,
        "split_rule": (f"chapters numbered 0..{NUM_CHAPTERS - 1} in canonical order; number % {HELDOUT_EVERY} == "
                       f"{HELDOUT_REMAINDER}: heldout; else number % {VALIDATION_EVERY} == {VALIDATION_REMAINDER}: "
                       f"validation; else train"),
        "document_format": "<|bos|> verses joined by \\n <|eos|>, one document per chapter",
        **summary,
        "vocab_size": tokenizer.get_vocab_size(),
        "bos_id": 0,
        "eos_id": 1,
        "tokenizer_sha256": tokenizer_sha256,
    }
    with open(os.path.join(args.build_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")

    train = summary["train"]
    print(f"prepare_kjv: {len(verses)} verses; " + "; ".join(
        f"{name} {v['chapters']} chapters, {v['verses']} verses, {v['tokens']} tokens" for name, v in summary.items()) +
        f"; {train['chars'] / (train['tokens'] - 2 * train['chapters']):.2f} chars/token in train")
    print(f"prepare_kjv: wrote {args.build_dir}" + (f" and the tokenizer to {args.tokenizer_out}"
                                                     if args.tokenizer_out else ""))


if __name__ == "__main__":
    main()
