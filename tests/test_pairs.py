"""ta.data.read_pairs, from_pairs and references: tasks from files of source<TAB>target lines."""

import hashlib
import random
import re
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinygrad_attn.data as data
from tinygrad_attn.data import UNK, DataError
from tinygrad_attn.data.tokens import tokenize


def write(tmp_path, content, name="pairs.tsv"):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


def numbered_pairs(count, targets_per_source=1):
    """``count`` distinct sources ("w0", "w1", ...) as char tokens, each with its targets
    (drawn from a few symbols, so that every split's are in the training vocabulary)."""
    return [(list(f"w{k}"), [f"T{k % 5}", f"V{variant}"])
            for k in range(count) for variant in range(targets_per_source)]


def split_of(task):
    """source -> the split it landed in."""
    where = {}
    for split in ("train", "valid", "test"):
        for source, _ in getattr(task, split):
            where.setdefault(tuple(source), set()).add(split)
    return where


# ---------------------------------------------------------------------------------------------
# read_pairs: good files


def test_read_pairs_reads_tabs_and_levels(tmp_path):
    path = write(tmp_path, "hello\tHH AH L OW\nab c\tX,  Y\n")
    assert data.read_pairs(path, src_tokens="char", tgt_tokens="space") == [
        (list("hello"), ["HH", "AH", "L", "OW"]),
        (["a", "b", " ", "c"], ["X,", "Y"]),
    ]
    assert data.read_pairs(str(path), src_tokens="space", tgt_tokens="word")[1] == (["ab", "c"], ["X", "Y"])


def test_read_pairs_accepts_crlf_bom_blank_lines_and_keeps_case(tmp_path):
    content = "\ufeffHello\tWorld\r\n\r\n   \r\n  Ab  C \t x\r\n\n"
    path = write(tmp_path, content)
    assert data.read_pairs(path) == [(list("Hello"), list("World")), (list("Ab  C"), ["x"])]


def test_read_pairs_reads_unicode_and_only_newline_ends_a_line(tmp_path):
    path = write(tmp_path, "straße\tШ ё\nä\u2028b\tc\u0085d\n日本\t🙂\n")
    assert data.read_pairs(path, tgt_tokens="space") == [
        (list("straße"), ["Ш", "ё"]),
        (["ä", "\u2028", "b"], ["c", "d"]),          # U+0085 is whitespace to str.split
        (["日", "本"], ["🙂"]),
    ]


side_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\t\n\r\ufeff"),
    min_size=1, max_size=12,
).filter(lambda text: text.strip())


@settings(deadline=None, max_examples=60)
@given(st.lists(st.tuples(side_text, side_text), min_size=1, max_size=8),
       st.sampled_from(["char", "space"]), st.sampled_from(["char", "space"]),
       st.sampled_from(["\n", "\r\n"]))
def test_read_pairs_round_trips_any_text(tmp_path_factory, lines, src_tokens, tgt_tokens, newline):
    path = tmp_path_factory.mktemp("pairs") / "random.tsv"
    path.write_bytes(newline.join(f"{source}\t{target}" for source, target in lines).encode("utf-8"))
    expected = [(tokenize(source, src_tokens, lowercase=False), tokenize(target, tgt_tokens, lowercase=False))
                for source, target in lines]
    assert data.read_pairs(path, src_tokens, tgt_tokens) == expected
    # The file's tokens and a Task's tokenize agree, whatever the text.
    task = data.from_pairs(expected, src_tokens=src_tokens, tgt_tokens=tgt_tokens, valid=[], test=[])
    assert [task.tokenize(source) for source, _ in lines] == [source for source, _ in expected]
    assert [task.tokenize_target(target) for _, target in lines] == [target for _, target in expected]


# ---------------------------------------------------------------------------------------------
# read_pairs: bad files


@pytest.mark.parametrize("content, message", [
    ("a\tb\nno tab here\n",
     r":2: expected one tab between source and target, found no tab in 'no tab here'$"),
    ("a\tb\nc\td\ne\tf\tg\n", r":3: expected one tab between source and target, found 2 tabs"),
    ("a\tb\n  \tx\n", r":2: empty source; expected 'source<TAB>target'$"),
    ("a\tb\r\nx\t \r\n", r":2: empty target"),
    (b"a\tb\nc\td\ne\xff\tf\n", r":3: invalid UTF-8 \(byte 0xff at byte column 2\); save the file as UTF-8$"),
    ("", r": the file is empty; expected lines of 'source<TAB>target'$"),
    ("\n  \n\r\n", r": no pairs: all 3 lines are blank$"),
])
def test_read_pairs_errors_name_the_file_and_line(tmp_path, content, message):
    path = write(tmp_path, content)
    with pytest.raises(DataError, match=re.escape(str(path)) + message) as caught:
        data.read_pairs(path)
    assert "\n" not in str(caught.value) and caught.value.__cause__ is None
    assert isinstance(caught.value, ValueError)


def test_read_pairs_word_level_side_without_words(tmp_path):
    path = write(tmp_path, "a b\tc\n!!\td\n")
    message = f"{path}:2: the source '!!' has no tokens at level 'word'"
    with pytest.raises(DataError, match=re.escape(message)):
        data.read_pairs(path, src_tokens="word")


def test_read_pairs_missing_file_and_directory(tmp_path):
    missing = tmp_path / "nope.tsv"
    with pytest.raises(DataError, match=re.escape(f"{missing}: no such file")):
        data.read_pairs(missing)
    with pytest.raises(DataError, match=re.escape(f"{tmp_path}: is a directory")):
        data.read_pairs(tmp_path)


def test_read_pairs_argument_errors(tmp_path):
    with pytest.raises(ValueError,
                       match=r"read_pairs: src_tokens must be one of \('char', 'word', 'space'\)"):
        data.read_pairs(tmp_path / "x", src_tokens="bpe")
    with pytest.raises(TypeError, match=r"read_pairs: path must be a str or a path, got 3"):
        data.read_pairs(3)


# ---------------------------------------------------------------------------------------------
# from_pairs: the split


def test_split_point_is_a_fixed_hash_of_the_source():
    digest = hashlib.blake2b(b"h\x1fi").digest()
    assert data.split_point(["h", "i"]) == int.from_bytes(digest[:8], "big") / 2**64
    assert data.split_point(["hi"]) != data.split_point(["h", "i"])
    assert 0 <= data.split_point(["\udcff"]) < 1          # a lone surrogate still hashes


def test_from_pairs_split_is_the_same_for_any_order():
    pairs = numbered_pairs(500, targets_per_source=2)
    task = data.from_pairs(pairs)
    shuffled = list(pairs)
    random.Random(4).shuffle(shuffled)
    again = data.from_pairs(shuffled)
    for split in ("train", "valid", "test"):
        first = sorted(map(str, getattr(task, split)))
        assert first == sorted(map(str, getattr(again, split)))


def test_from_pairs_keeps_every_target_of_a_source_in_one_split():
    task = data.from_pairs(numbered_pairs(1000, targets_per_source=3))
    where = split_of(task)
    assert len(where) == 1000 and all(len(splits) == 1 for splits in where.values())
    for split in ("train", "valid", "test"):
        assert all(len(targets) == 3 for _, targets in data.references(getattr(task, split)))


def test_from_pairs_fractions_are_roughly_respected():
    task = data.from_pairs(numbered_pairs(2000), valid_fraction=0.1, test_fraction=0.2)
    assert len(task.train) + len(task.valid) + len(task.test) == 2000
    assert 0.17 < len(task.test) / 2000 < 0.23
    assert 0.07 < len(task.valid) / 2000 < 0.13
    nothing_held = data.from_pairs(numbered_pairs(50), valid_fraction=0, test_fraction=0)
    assert len(nothing_held.train) == 50 and nothing_held.valid == nothing_held.test == []


def test_from_pairs_given_splits_are_used_and_their_sources_leave_pairs():
    pairs = numbered_pairs(300)
    test = [(list("w7"), ["T0"]), (list("w0w"), ["T1"])]
    with pytest.warns(UserWarning, match=r"from_pairs: left out 1 of the 300 pairs whose source is also "
                                         r"in the given test pairs"):
        task = data.from_pairs(pairs, test=test, valid_fraction=0.1)
    assert task.test == test
    assert 10 < len(task.valid) < 50
    assert (list("w7"), ["T2", "V0"]) not in task.train + task.valid
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # Both splits given: nothing is carved out, nothing to warn about.
        both = data.from_pairs(pairs[:10], valid=[pairs[10]], test=[pairs[11]])
    assert both.train == pairs[:10] and both.valid == [pairs[10]] and both.test == [pairs[11]]


# ---------------------------------------------------------------------------------------------
# from_pairs: vocabularies, lengths, the Task


def test_from_pairs_builds_the_vocabularies_from_train_only_and_warns_of_unknown_symbols():
    train = [(list("ab"), ["X"]), (list("ba"), ["Y"])]
    valid = [(list("abz"), ["X", "Q"])]                        # z and Q are unknown: 2 tokens, 1 pair
    test = [(list("aab"), ["X"]), (list("zz"), ["Y"]), (list("é"), ["X"])]  # 3 tokens in 2 pairs
    with pytest.warns(UserWarning) as caught:
        task = data.from_pairs(train, valid=valid, test=test)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert message.startswith("from_pairs: 2 tokens in 1 of the 1 valid pairs and 3 tokens in 2 of the "
                              "3 test pairs are not in the training vocabularies and will encode to <unk>")
    assert "source 'z'" in message and "target 'Q'" in message and "source 'é'" in message
    assert task.src_vocab.tokens[4:] == ["a", "b"] and task.tgt_vocab.tokens[4:] == ["X", "Y"]
    assert task.src_vocab.encode(task.valid[0][0]) == [4, 5, UNK]


def test_from_pairs_min_freq_drops_rare_training_tokens():
    pairs = [(list("aab"), ["X"]), (list("ac"), ["X", "Y"])]
    task = data.from_pairs(pairs, valid=[], test=[], min_freq=2)
    assert task.src_vocab.tokens[4:] == ["a"] and task.tgt_vocab.tokens[4:] == ["X"]


def test_from_pairs_filters_long_pairs_with_one_warning():
    train = [(list("abc"), ["X"]), (list("abcdef"), ["X"]), (list("ab"), ["X", "Y", "Z"])]
    valid = [(list("abcdefg"), ["X"])]
    with pytest.warns(UserWarning, match=r"from_pairs: left out 3 pairs longer than max_src_len=4 source "
                                         r"or max_tgt_len=2 target tokens \(2 train, 1 valid, 0 test\)"):
        task = data.from_pairs(train, valid=valid, test=[], max_src_len=4, max_tgt_len=2)
    assert task.train == [(list("abc"), ["X"])] and task.valid == []


def test_from_pairs_makes_a_task_that_keeps_text_as_written():
    pairs = [(list("Hello"), ["HH", "AH", "L", "OW"])]
    task = data.from_pairs(pairs, name="g2p", tgt_tokens="space", valid=[], test=[])
    assert (task.name, task.level, task.tgt_level, task.lowercase) == ("g2p", "char", "space", False)
    assert task.tokenization == {"src": "char", "tgt": "space", "lowercase": False}
    assert task.tokenize(" Hello ") == list("Hello")
    assert task.tokenize_target("HH  AH L OW") == ["HH", "AH", "L", "OW"]
    assert task.detokenize(["HH", "AH"]) == "HH AH" and task.detokenize_source(list("Hi")) == "Hi"
    assert "valid=0 pairs" in repr(task) and "tgt_level='space'" in repr(task)


@pytest.mark.parametrize("call, error, pattern", [
    (lambda: data.from_pairs(numbered_pairs(3), valid_fraction=0.5, test_fraction=0.5), ValueError,
     r"from_pairs: valid_fraction \+ test_fraction must be below 1"),
    (lambda: data.from_pairs(numbered_pairs(3), test_fraction=-0.1), ValueError,
     r"from_pairs: test_fraction must be a finite number in \[0.0, 1.0\), got -0.1"),
    (lambda: data.from_pairs([("ab", ["x"])]), TypeError,
     r"from_pairs: the source of pairs\[0\] must be a list of token strings, got 'ab'"),
    (lambda: data.from_pairs([(["a"], ["x"]), (["a"],)]), TypeError,
     r"from_pairs: pairs\[1\] must be a \(source tokens, target tokens\) pair"),
    (lambda: data.from_pairs([([], ["x"])]), ValueError, r"from_pairs: pairs\[0\] has an empty source"),
    (lambda: data.from_pairs(numbered_pairs(3), max_src_len=0), ValueError,
     r"from_pairs: max_src_len must be None or an int >= 1, got 0"),
    (lambda: data.from_pairs(numbered_pairs(3), tgt_tokens="bytes"), ValueError,
     r"from_pairs: tgt_tokens must be one of"),
])
def test_from_pairs_argument_errors(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()


def test_from_pairs_without_training_pairs_is_a_data_error():
    overlap = r"left out 1 of the 1 pairs whose source is also in the given test pairs"
    with pytest.raises(DataError, match=r"from_pairs: no training pairs left out of 1 pairs"), \
            pytest.warns(UserWarning, match=overlap):
        data.from_pairs([(list("ab"), ["x"])], valid=[], test=[(list("ab"), ["y"])])
    with pytest.raises(DataError, match=r"from_pairs: no training pairs left"), pytest.warns(UserWarning):
        data.from_pairs([(list("abc"), ["x"])], valid=[], test=[], max_src_len=2)


# ---------------------------------------------------------------------------------------------
# references


def test_references_group_targets_by_source_in_first_seen_order():
    pairs = [(["a"], ["x"]), (["b"], ["y"]), (["a"], ["z"]), (["a"], ["x"]), (("b",), ("y",))]
    assert data.references(pairs) == [(["a"], [["x"], ["z"]]), (["b"], [["y"]])]
    assert data.references([]) == []
