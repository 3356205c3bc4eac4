"""Random walks through cellm's grammars over real vocabularies always produce
valid output: JSON schemas checked with `jsonschema`, json_object mode with
`json`, regexes and GBNF (through an equivalent regex) with `re`, choices by
membership.

Each case runs the `grammar_walk` test tool (tests/grammar/grammar_walk.cpp,
path in $GRAMMAR_WALK): at every step it draws uniformly among the tokens the
grammar's mask allows until EOS. The walks are seeded, so a failure reproduces
with the printed seed. Skips without jsonschema, the tool or ../shared/tokenizers.
"""

import json
import os
import pathlib
import re
import subprocess

import pytest

jsonschema = pytest.importorskip("jsonschema")

HERE = pathlib.Path(__file__).resolve().parent
SCHEMAS = sorted((HERE / "schemas").glob("*.json"))
WALK = os.environ.get("GRAMMAR_WALK", "")
SHARED = pathlib.Path(os.environ.get("CELLM_SHARED_DIR", HERE / "../../../shared"))
WALKS = 200

if not WALK or not os.path.exists(WALK):
    pytest.skip("GRAMMAR_WALK (the grammar_walk tool) is not set", allow_module_level=True)
if not (SHARED / "tokenizers").is_dir():
    pytest.skip(f"{SHARED}/tokenizers is absent", allow_module_level=True)


def walk(kind, spec_text=None, tokenizer="llama3", seed=0, walks=WALKS, max_tokens=20000,
         tmp_path=None):
    """Runs grammar_walk; returns [(seed, complete, text bytes)]."""
    args = [WALK, "--tokenizer", str(SHARED / "tokenizers" / tokenizer), "--kind", kind,
            "--seed", str(seed), "--walks", str(walks), "--max-tokens", str(max_tokens)]
    if spec_text is not None:
        spec = tmp_path / "spec.txt"
        spec.write_bytes(spec_text.encode("utf-8"))
        args += ["--spec", str(spec)]
    run = subprocess.run(args, capture_output=True, timeout=600)
    assert run.returncode == 0, run.stderr.decode("utf-8", "replace")
    rows = [json.loads(line) for line in run.stdout.decode().splitlines()]
    assert len(rows) == walks
    return [(r["seed"], r["complete"], bytes.fromhex(r["hex"])) for r in rows]


@pytest.mark.parametrize("tokenizer", ["llama3", "qwen3"])
@pytest.mark.parametrize("schema_path", SCHEMAS, ids=[p.stem for p in SCHEMAS])
def test_schema_walks_always_validate(schema_path, tokenizer, tmp_path):
    schema = json.loads(schema_path.read_text())
    validator = jsonschema.Draft202012Validator(schema)
    rows = walk("schema", schema_path.read_text(), tokenizer=tokenizer, seed=1000,
                tmp_path=tmp_path)
    for seed, complete, raw in rows:
        assert complete, f"walk {seed} did not finish: {raw[:200]!r}"
        text = raw.decode("utf-8")  # the grammar only makes valid UTF-8
        value = json.loads(text)
        errors = list(validator.iter_errors(value))
        assert not errors, f"walk {seed}: {text!r}: {errors[0].message}"


def test_json_object_walks_are_objects(tmp_path):
    rows = walk("json_object", seed=7, walks=WALKS, max_tokens=4000, tmp_path=tmp_path)
    complete = [(seed, raw) for seed, done, raw in rows if done]
    # Unbounded nesting: a uniform walk may still be open at the cap; most finish.
    assert len(complete) >= 0.9 * len(rows)
    for seed, raw in complete:
        value = json.loads(raw.decode("utf-8"))
        assert isinstance(value, dict), f"walk {seed}: {raw[:200]!r}"


REGEXES = [
    r"\d{3}-\d{2,4}",
    r"^(yes|no|maybe)!?$",
    r"[A-Z][a-z]{0,8}( [A-Z][a-z]{0,8}){0,2}",
    r"(\w+@[a-z]+\.(com|org))",
    r"-?(0|[1-9]\d{0,5})(\.\d{1,3})?",
    r"[^\s,]{1,5}(,[^\s,]{1,5}){0,3}",
    r"\(\d\)\s?[+*/-]\s?\[\w\]",
    r"é+\.{2}[αβγ]?",
]


@pytest.mark.parametrize("pattern", REGEXES)
def test_regex_walks_always_match(pattern, tmp_path):
    rows = walk("regex", pattern, seed=2000, tmp_path=tmp_path)
    compiled = re.compile(pattern, re.ASCII)
    for seed, complete, raw in rows:
        assert complete, f"walk {seed} did not finish: {raw!r}"
        text = raw.decode("utf-8")
        assert compiled.fullmatch(text), f"walk {seed}: {text!r} does not match {pattern}"


def test_choice_walks_are_one_of_the_choices(tmp_path):
    choices = ["positive", "negative", "neutral", "pos", "n/a", "très bien"]
    rows = walk("choice", json.dumps(choices), tokenizer="qwen3", seed=3000, tmp_path=tmp_path)
    seen = set()
    for seed, complete, raw in rows:
        assert complete
        text = raw.decode("utf-8")
        assert text in choices, f"walk {seed}: {text!r}"
        seen.add(text)
    assert len(seen) == len(choices)


def test_gbnf_walks_match_the_equivalent_regex(tmp_path):
    grammar = (
        'root ::= word ("-" num)* "."?\n'
        "word ::= [a-c]+\n"
        "num  ::= [0-9] [0-9]?  # one or two digits\n"
    )
    rows = walk("gbnf", grammar, tokenizer="llama3", seed=4000, tmp_path=tmp_path)
    for seed, complete, raw in rows:
        assert complete
        text = raw.decode("utf-8")
        assert re.fullmatch(r"[a-c]+(-[0-9]{1,2})*\.?", text), f"walk {seed}: {text!r}"
