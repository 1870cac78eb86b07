"""ta.models.train: validation, best weights, early stopping, schedules, the log, and resuming
a run bit for bit."""

import json
import logging
import math
import os
import signal
import threading

import numpy as np
import pytest

import tinygrad_attn as ta
from tests.optional import needs_torch, torch
from tinygrad_attn.models import training
from tinygrad_attn.optim import ReduceLROnPlateau, WarmupCosine


def small_task():
    """Reverse at length 4 with a validation split carved out of its training pairs."""
    task = ta.data.load("reverse", length=4, n_train=200, n_test=20, symbols=6, seed=3)
    return ta.data.Task("reverse", task.train[:160], task.test, task.src_vocab, task.tgt_vocab, "char",
                        valid=task.train[160:])


def small_model(task, dropout=0.1):
    ta.manual_seed(0)
    return ta.models.Seq2Seq(task.src_vocab, task.tgt_vocab, embed=8, hidden=12, dropout=dropout)


RUN = dict(steps=12, batch_size=8, lr=1e-2, eval_every=4, schedule="cosine", warmup=3)


def weights(model):
    return {name: value.copy() for name, value in model.state_dict().items()}


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


# ---------------------------------------------------------------- resume


def test_train_resumed_after_ctrl_c_ends_bitwise_equal_to_uninterrupted(tmp_path):
    task = small_task()
    straight = small_model(task)
    history = ta.models.train(straight, task, **RUN, checkpoint=tmp_path / "a.ckpt")
    assert [r["step"] for r in history] == list(range(1, 13))

    def ctrl_c_at_step_6(record):
        if record["step"] == 6:
            os.kill(os.getpid(), signal.SIGINT)        # what Ctrl-C sends

    interrupted = small_model(task)
    with pytest.raises(KeyboardInterrupt, match="step 6"):
        ta.models.train(interrupted, task, **RUN, checkpoint=tmp_path / "b.ckpt", callback=ctrl_c_at_step_6)
    model, info = ta.models.load_checkpoint(tmp_path / "b.ckpt")
    assert info.training["step"] == 6
    resumed_history = ta.models.train(model, task, steps=12, checkpoint=tmp_path / "b.ckpt", resume=True)
    assert [r["step"] for r in resumed_history] == list(range(7, 13))
    assert [r["loss"] for r in resumed_history] == [r["loss"] for r in history[6:]]
    assert [r["lr"] for r in resumed_history] == [r["lr"] for r in history[6:]]
    assert_same_weights(weights(model), weights(straight))           # the best weights, restored
    last_a = ta.models.load_checkpoint(tmp_path / "a.ckpt")[1].training
    last_b = ta.models.load_checkpoint(tmp_path / "b.ckpt")[1].training
    assert_same_weights(last_a["model"], last_b["model"])             # the last step's weights
    for a, b in zip(last_a["optimizer"]["state"], last_b["optimizer"]["state"], strict=True):
        assert_same_weights(a, b)

    def evaluations(name):
        lines = [json.loads(line) for line in (tmp_path / name).read_text().splitlines()]
        return [{k: v for k, v in line.items() if k != "seconds"} for line in lines]

    assert evaluations("a.jsonl") == evaluations("b.jsonl")
    assert [line["step"] for line in evaluations("a.jsonl")] == [4, 8, 12]


def test_a_float64_run_resumes_in_float64(tmp_path):
    """load_checkpoint rebuilds the model in its weights' dtype (it built the default float,
    and a float64 run resumed in float32, off the straight run by rounding)."""
    task = small_task()
    straight = small_model(task).astype(np.float64)
    history = ta.models.train(straight, task, **RUN, checkpoint=tmp_path / "a.ckpt")

    def stop_at_step_6(record):
        if record["step"] == 6:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        ta.models.train(small_model(task).astype(np.float64), task, **RUN, checkpoint=tmp_path / "b.ckpt",
                        callback=stop_at_step_6)
    model, _ = ta.models.load_checkpoint(tmp_path / "b.ckpt")
    assert model.out.weight.dtype == np.float64
    resumed = ta.models.train(model, task, steps=12, checkpoint=tmp_path / "b.ckpt", resume=True)
    assert [r["loss"] for r in resumed] == [r["loss"] for r in history[6:]]
    assert_same_weights(weights(model), weights(straight))


class _TestTerminated(Exception):
    """What the test's own SIGTERM handler raises: train must have replaced it while it runs."""


def test_train_resumed_after_sigterm_ends_bitwise_equal_and_restores_the_handler(tmp_path):
    task = small_task()
    straight = small_model(task)
    ta.models.train(straight, task, **RUN, checkpoint=tmp_path / "a.ckpt")

    def sigterm_at_step_5(record):
        if record["step"] == 5:
            os.kill(os.getpid(), signal.SIGTERM)       # what timeout, a scheduler or a container stop send

    def own_handler(signum, frame):
        raise _TestTerminated

    previous = signal.signal(signal.SIGTERM, own_handler)
    try:
        with pytest.raises(KeyboardInterrupt, match="SIGTERM.*step 5") as stop:
            ta.models.train(small_model(task), task, **RUN, checkpoint=tmp_path / "b.ckpt",
                            callback=sigterm_at_step_5)
        assert signal.getsignal(signal.SIGTERM) is own_handler
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert stop.value.signal == signal.SIGTERM
    model, info = ta.models.load_checkpoint(tmp_path / "b.ckpt")
    assert info.training["step"] == 5
    ta.models.train(model, task, steps=12, checkpoint=tmp_path / "b.ckpt", resume=True)
    assert_same_weights(weights(model), weights(straight))
    last_a = ta.models.load_checkpoint(tmp_path / "a.ckpt")[1].training
    last_b = ta.models.load_checkpoint(tmp_path / "b.ckpt")[1].training
    assert_same_weights(last_a["model"], last_b["model"])


def test_train_stops_at_a_non_finite_loss_naming_the_step_and_keeps_the_last_finite_checkpoint(tmp_path):
    task = small_task()
    model = small_model(task)
    optimizer = ta.optim.Adam(model.parameters(), lr=1e-2)
    seen = {}

    def diverge_after_step_4(record):
        seen[record["step"]] = weights(model)
        if record["step"] == 4:
            optimizer.lr = 1e30                        # step 5 moves every weight by about 1e30

    # Step 5's update or step 6's makes the weights huge, then infinite: the run stops at the
    # first loss or weight that is not finite, at step 5 or 6, before saving at step 6.
    stopped = r"train: the (loss is -?(nan|inf) at|weights are not finite after) step [56] "
    with pytest.raises(FloatingPointError, match=stopped) as failure:
        ta.models.train(model, task, steps=12, batch_size=8, eval_every=2, optimizer=optimizer,
                        checkpoint=tmp_path / "run.ckpt", callback=diverge_after_step_4)
    assert "step 4" in str(failure.value)              # where the checkpoint stands
    _, info = ta.models.load_checkpoint(tmp_path / "run.ckpt")
    assert info.training["step"] == 4
    assert_same_weights(info.training["model"], seen[4])

    def refuse(constant):
        raise ValueError(constant)

    lines = (tmp_path / "run.jsonl").read_text().splitlines()
    assert [json.loads(line, parse_constant=refuse)["step"] for line in lines] == [2, 4]


@pytest.mark.parametrize(("options", "message"), [
    ({"checkpoint": "a folder"}, "checkpoint"),
    ({"checkpoint": "missing/run.ckpt"}, "checkpoint"),
    ({"checkpoint": "run.jsonl"}, "its own log"),
    ({"eval_batch_size": 0}, "eval_batch_size must be >= 1"),
    ({"eval_batch_size": 2.0}, "eval_batch_size must be an int"),
    ({"time_limit": -1.0}, "time_limit"),
    ({"time_limit": math.nan}, "time_limit"),
    ({"callback": 3}, "callback must be callable"),
    ({"optimizer": "adam"}, "optimizer"),
    ({"extras": [1]}, "extras must be a dict"),
    ({"resume": "yes"}, "resume must be True or False"),
    ({"restore_best": None}, "restore_best must be True or False"),
    ({"patience": 1.5}, "patience must be an int"),
    ({"warmup": -1}, "warmup must be >= 0"),
    ({"seed": True}, "seed must be an int"),
    ({"clip": math.nan}, "clip"),
    ({"task": "not a task"}, "task must be a ta.data.Task"),
    ({"model": "not a model"}, "model must be"),
])
def test_train_checks_every_argument_before_the_first_step(options, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a folder").mkdir()
    task = small_task()
    arguments = {"model": small_model(task), "task": task, "steps": 3, "batch_size": 8, **options}
    steps = []
    if "callback" not in options:
        arguments["callback"] = steps.append
    with pytest.raises((TypeError, ValueError), match=message):
        ta.models.train(**arguments)
    assert steps == []


def test_train_refuses_pairs_longer_than_the_transformer_position_table_before_the_first_step():
    task = small_task()                                  # sources of 4 tokens, targets of 4 (+1)
    steps = []
    for split in ("train", "valid"):
        pairs = list(getattr(task, split))
        pairs[3] = (list("abcdef"), pairs[3][1])         # 6 source tokens
        longer = ta.data.Task("reverse", pairs if split == "train" else task.train, task.test,
                              task.src_vocab, task.tgt_vocab, "char",
                              valid=pairs if split == "valid" else task.valid)
        ta.manual_seed(0)
        model = ta.models.Transformer(task.src_vocab, task.tgt_vocab, d_model=8, nhead=2,
                                      num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=16,
                                      max_len=5)
        with pytest.raises(ValueError, match=f"{split}.* 6 tokens.*max_len=5"):
            ta.models.train(model, longer, steps=2, batch_size=8, eval_every=2, callback=steps.append)
    assert steps == []
    ta.models.train(model, task, steps=1, batch_size=8)     # 4 tokens, 5 with <start>: they fit



def test_train_names_the_longest_pair_past_the_position_table_counting_start():
    """A target reads <start> first: 5 tokens need 6 positions.  Of several pairs too long,
    the longest is named, so the max_len the message gives takes them all."""
    task = small_task()                                  # sources of 4 tokens, targets of 4 (+1)
    train, valid = list(task.train), list(task.valid)
    train[2] = (train[2][0], list("abcab"))              # 5 target tokens: 6 positions
    valid[1] = (list("abcabca"), valid[1][1])            # 7 source tokens
    longer = ta.data.Task("reverse", train, task.test, task.src_vocab, task.tgt_vocab, "char", valid=valid)
    ta.manual_seed(0)
    model = ta.models.Transformer(task.src_vocab, task.tgt_vocab, d_model=8, nhead=2, num_encoder_layers=1,
                                  num_decoder_layers=1, dim_feedforward=16, max_len=5)
    with pytest.raises(ValueError, match=r"^train: valid pair 1 of task 'reverse' has a source of 7 tokens, "
                                         r"longer than the Transformer's position table \(max_len=5\); build "
                                         r"the model with max_len >= 7$"):
        ta.models.train(model, longer, steps=1, batch_size=8, eval_every=1)
    longer = ta.data.Task("reverse", train, task.test, task.src_vocab, task.tgt_vocab, "char",
                          valid=task.valid)
    with pytest.raises(ValueError, match=r"train pair 2 .* a target of 5 tokens \(6 with <start>\).*"
                                         r"max_len=5\); build the model with max_len >= 6$"):
        ta.models.train(model, longer, steps=1, batch_size=8, eval_every=1)

def test_train_resume_needs_the_same_model_and_a_training_state(tmp_path):
    task = small_task()
    ta.models.train(small_model(task), task, steps=2, batch_size=8, eval_every=0,
                    checkpoint=tmp_path / "c.ckpt")
    other = ta.models.Seq2Seq(task.src_vocab, task.tgt_vocab, embed=8, hidden=16)
    with pytest.raises(ValueError, match="the model differs"):
        ta.models.train(other, task, steps=4, checkpoint=tmp_path / "c.ckpt", resume=True)
    with pytest.raises(ValueError, match="past steps=1"):
        ta.models.train(small_model(task), task, steps=1, checkpoint=tmp_path / "c.ckpt", resume=True)
    model = small_model(task)
    ta.models.save_checkpoint(tmp_path / "plain.ckpt", model, task)
    with pytest.raises(ValueError, match="no training state"):
        ta.models.train(model, task, steps=4, checkpoint=tmp_path / "plain.ckpt", resume=True)
    with pytest.raises(ValueError, match="needs the checkpoint"):
        ta.models.train(model, task, steps=4, resume=True)


def test_train_log_drops_evaluations_past_the_resumed_step(tmp_path):
    log = tmp_path / "run.jsonl"
    log.write_text("".join(json.dumps({"step": step}) + "\n" for step in (4, 8, 12)))
    training._truncate_log(log, 8)
    assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == [4, 8]


# ---------------------------------------------------------------- validation, best weights, early stopping


def scripted_validation(monkeypatch, exact_matches):
    """Make the validation scores a given sequence (losses constant), to test the bookkeeping."""
    scores = iter(exact_matches)
    monkeypatch.setattr(training, "validation_loss", lambda *args, **kwargs: 1.0)
    monkeypatch.setattr(training, "evaluate", lambda *args, **kwargs: {"exact_match": next(scores)})


def test_train_keeps_and_restores_the_best_weights(monkeypatch, tmp_path):
    scripted_validation(monkeypatch, [0.5, 0.9, 0.2])
    task = small_task()
    model = small_model(task)
    seen = {}
    history = ta.models.train(model, task, steps=6, batch_size=8, eval_every=2,
                              checkpoint=tmp_path / "r.ckpt",
                              callback=lambda record: seen.update({record["step"]: weights(model)}))
    assert history[3]["valid_exact_match"] == 0.9 and history[3]["best_step"] == 4
    assert history[5]["best_exact_match"] == 0.9
    assert_same_weights(weights(model), seen[4])
    saved, info = ta.models.load_checkpoint(tmp_path / "r.ckpt")
    assert_same_weights(weights(saved), seen[4])                       # the file's model is the best one
    assert_same_weights(info.training["model"], seen[6])               # and it resumes from the last
    assert info.extras["best"]["step"] == 4


def test_train_stops_early_after_patience_evaluations(monkeypatch):
    scripted_validation(monkeypatch, [0.5, 0.5, 0.4, 0.9])
    task = small_task()
    history = ta.models.train(small_model(task), task, steps=20, batch_size=8, eval_every=2, patience=2)
    assert history[-1]["step"] == 6                # evaluations at 2 (best), 4 and 6 (no better)


def test_train_plateau_schedule_halves_the_rate(monkeypatch):
    scripted_validation(monkeypatch, [0.5, 0.5, 0.5, 0.5, 0.5])
    task = small_task()
    history = ta.models.train(small_model(task), task, steps=10, batch_size=8, lr=4e-3, eval_every=2,
                              schedule="plateau")
    # three evaluations without improvement (patience 2) lower the rate after step 8
    assert [r["lr"] for r in history] == [4e-3] * 8 + [2e-3] * 2


def test_train_validates_by_default_when_the_task_has_validation_pairs():
    task = small_task()
    history = ta.models.train(small_model(task), task, steps=10, batch_size=8)
    evaluated = [r["step"] for r in history if "valid_exact_match" in r]
    assert evaluated == list(range(1, 11))          # steps // 10 = 1
    assert all(0 <= r["valid_exact_match"] <= 1 and r["valid_loss"] > 0 for r in history)


@pytest.mark.parametrize(("options", "message"), [
    ({"eval_every": 2, "task": "no-valid"}, "no validation pairs"),
    ({"patience": 2, "eval_every": 0}, "need validation"),
    ({"schedule": "plateau", "warmup": 2}, "warmup applies"),
    ({"schedule": "linear"}, "schedule must be one of"),
    ({"lr": math.inf}, "lr must be a finite number"),
    ({"clip": -1.0}, "clip must be"),
    ({"steps": 0}, "steps must be >= 1"),
])
def test_train_rejects_bad_settings(options, message):
    task = small_task()
    if options.pop("task", None) == "no-valid":
        task = ta.data.load("reverse", length=4, n_train=50, n_test=5)
    with pytest.raises(ValueError, match=message):
        ta.models.train(small_model(task), task, **{"steps": 4, **options})


def test_train_runs_in_a_thread_without_signal_handling():
    task = small_task()
    results = []
    thread = threading.Thread(target=lambda: results.append(
        ta.models.train(small_model(task, dropout=0.0), task, steps=3, batch_size=8, eval_every=0)))
    thread.start()
    thread.join()
    assert [r["step"] for r in results[0]] == [1, 2, 3]


# ---------------------------------------------------------------- schedules


def test_warmup_cosine_rates_by_hand():
    model = ta.nn.Linear(2, 2)
    opt = ta.optim.Adam(model.parameters(), lr=1.0)
    schedule = WarmupCosine(opt, warmup=4, total=12)
    rates = [opt.lr]
    for _ in range(13):
        schedule.step()
        rates.append(opt.lr)
    # warm-up: (step + 1) / 4 for steps 0-3; then (1 + cos(pi * (step - 4) / 8)) / 2 up to step 12
    warm = [0.25, 0.5, 0.75, 1.0]
    decay = [(1 + math.cos(math.pi * (step - 4) / 8)) / 2 for step in range(4, 13)]
    expected = warm + decay + [0.0]
    assert decay[0] == 1.0 and decay[-1] == pytest.approx(0.0)
    assert rates == pytest.approx(expected)


@needs_torch
def test_reduce_on_plateau_matches_torch():
    scores = [0.1, 0.2, 0.2, 0.2, 0.2, 0.3, 0.3, 0.3, 0.3, 0.3, 0.1, 0.35]
    model = ta.nn.Linear(2, 2)
    opt = ta.optim.Adam(model.parameters(), lr=1.0)
    ours = ReduceLROnPlateau(opt, mode="max", factor=0.5, patience=2)
    reference = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    theirs = torch.optim.lr_scheduler.ReduceLROnPlateau(reference, mode="max", factor=0.5, patience=2)
    for score in scores:
        ours.step(score)
        theirs.step(score)
        assert opt.lr == pytest.approx(reference.param_groups[0]["lr"])


def test_schedule_state_round_trips():
    model = ta.nn.Linear(2, 2)
    opt = ta.optim.Adam(model.parameters(), lr=1.0)
    schedule = WarmupCosine(opt, warmup=2, total=10)
    for _ in range(5):
        schedule.step()
    again = WarmupCosine(ta.optim.Adam(model.parameters(), lr=1.0), warmup=0, total=1)
    again.load_state_dict(schedule.state_dict())
    assert again.optimizer.lr == opt.lr and again.last_step == 5
    with pytest.raises(ValueError, match="expected the dict"):
        again.load_state_dict({"schedule": "ReduceLROnPlateau"})


# ---------------------------------------------------------------- found in review


def test_train_keeps_a_given_optimizers_learning_rate():
    task = small_task()
    model = small_model(task)
    optimizer = ta.optim.Adam(model.parameters(), lr=5e-3)
    history = ta.models.train(model, task, steps=2, batch_size=8, eval_every=0, optimizer=optimizer)
    assert [r["lr"] for r in history] == [5e-3, 5e-3]


def test_train_stopped_by_the_time_limit_resumes_exactly_with_a_plateau_schedule(tmp_path):
    task = small_task()
    run = dict(steps=20, batch_size=8, eval_every=4, schedule="plateau", lr=2e-2)
    straight = small_model(task)
    ta.models.train(straight, task, **run, checkpoint=tmp_path / "a.ckpt")
    stopped = small_model(task)
    history = ta.models.train(stopped, task, **run, checkpoint=tmp_path / "b.ckpt", time_limit=1e-9)
    assert len(history) == 1
    model, _ = ta.models.load_checkpoint(tmp_path / "b.ckpt")
    ta.models.train(model, task, steps=20, checkpoint=tmp_path / "b.ckpt", resume=True)
    assert_same_weights(weights(model), weights(straight))
    lines = [(tmp_path / name).read_text().count("\n") for name in ("a.jsonl", "b.jsonl")]
    assert lines == [5, 5]


def test_train_resumed_after_stopping_early_trains_no_further(monkeypatch, tmp_path):
    scripted_validation(monkeypatch, [0.5, 0.4, 0.4])
    task = small_task()
    ta.models.train(small_model(task), task, steps=20, batch_size=8, eval_every=2, patience=2,
                    checkpoint=tmp_path / "e.ckpt")
    model, info = ta.models.load_checkpoint(tmp_path / "e.ckpt")
    assert info.training["step"] == 6
    assert ta.models.train(model, task, steps=20, checkpoint=tmp_path / "e.ckpt", resume=True) == []


def test_train_log_drops_a_last_line_cut_short_and_a_new_run_starts_a_new_log(tmp_path):
    log = tmp_path / "run.jsonl"
    log.write_text('{"step": 4}\n{"step": 8, "valid_lo')
    training._truncate_log(log, 8)
    assert log.read_text() == '{"step": 4}\n'
    log.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match="run.jsonl:2 is not an evaluation"):
        training._truncate_log(log, 8)
    task = small_task()
    ta.models.train(small_model(task), task, steps=2, batch_size=8, eval_every=2,
                    checkpoint=tmp_path / "run.ckpt")
    assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == [2]


def test_two_threads_training_with_dropout_equal_sequential_runs():
    task = small_task()

    def train(model, seed):
        ta.models.train(model, task, steps=6, batch_size=8, eval_every=0, seed=seed)
        return weights(model)

    alone = [train(small_model(task, dropout=0.3), seed) for seed in (1, 2)]
    models = [small_model(task, dropout=0.3) for _ in range(2)]      # made here: init draws too
    together = [None, None]

    def in_thread(index):
        together[index] = train(models[index], index + 1)

    threads = [threading.Thread(target=in_thread, args=(index,)) for index in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for a, b in zip(alone, together, strict=True):
        assert_same_weights(a, b)
    with ta.random.using(np.random.default_rng(5)):
        first = ta.random.generator().random()
    assert first == np.random.default_rng(5).random() and ta.random.generator() is not None


def _trained(task, make, **options):
    ta.manual_seed(0)
    model = make(task)
    history = ta.models.train(model, task, steps=24, batch_size=8, eval_every=0, schedule="cosine",
                              warmup=4, **options)
    return model, [record["loss"] for record in history]


@pytest.mark.parametrize("pad_to", [8, "auto"])
@pytest.mark.parametrize("make", [
    lambda task: small_model(task, dropout=0.2),
    lambda task: ta.models.Transformer(len(task.src_vocab), len(task.tgt_vocab), d_model=16, nhead=2,
                                       num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=32,
                                       dropout=0.2)], ids=["seq2seq", "transformer"])
def test_train_compiled_equals_eager_on_the_same_padded_batches(make, pad_to):
    """train(compile=True) replays each step's plan: losses and weights bit for bit those of an
    eager run on the same batches (padded to multiples of 8, or by "auto", the compiled
    default), dropout's random stream included."""
    task = small_task()
    compiled, compiled_losses = _trained(task, make, compile=True, **({"pad_to": 8} if pad_to == 8 else {}))
    eager, eager_losses = _trained(task, make, pad_to=pad_to)
    assert compiled_losses == eager_losses
    assert_same_weights(compiled.state_dict(), weights(eager))


def test_train_compiled_validates_with_compiled_decoding():
    """A compiled run decodes its validation pairs with compiled steps, replayed at every
    evaluation after the first: the scores each evaluation records are those of an eager run.
    Trained long enough that the exact matches differ from one evaluation to the next (all
    zeros would hide a wrong decode)."""
    from tinygrad_attn.models.decoding import compiled_functions

    task = small_task()
    runs = {}
    for compiled in (True, False):
        ta.manual_seed(0)
        model = small_model(task, dropout=0.0)
        history = ta.models.train(model, task, steps=80, batch_size=8, lr=3e-2, eval_every=20,
                                  compile=compiled, pad_to="auto")
        runs[compiled] = (model, [(r["valid_loss"], r["valid_exact_match"]) for r in history
                                  if "valid_loss" in r])
    (compiled_model, compiled_scores), (eager_model, eager_scores) = runs[True], runs[False]
    assert len({exact for _, exact in eager_scores}) == 4 and min(e for _, e in eager_scores) > 0
    assert compiled_scores == eager_scores
    [step] = [f for f in compiled_functions(compiled_model) if f.stats.replays]
    assert step.stats.captures >= 1 and step.stats.eager_calls == 0
    assert compiled_functions(eager_model) == []


def test_train_compiled_captures_each_shape_once(caplog):
    """The gradients exist before the first compiled step, as at every later one: the first
    step's capture serves the run (one shape here: every pair has the same lengths), not a
    second capture at step 2; the weights still equal eager training's bit for bit."""
    task = small_task()
    with caplog.at_level(logging.INFO, logger="tinygrad_attn.compile"):
        compiled, compiled_losses = _trained(task, lambda task: small_model(task, dropout=0.0), compile=True)
    assert [r.getMessage().split(": ")[1].split(" (")[0] for r in caplog.records] == ["captured plan 1"]
    eager, eager_losses = _trained(task, lambda task: small_model(task, dropout=0.0), pad_to="auto")
    assert compiled_losses == eager_losses
    assert_same_weights(compiled.state_dict(), weights(eager))


def test_auto_padding_reuses_longer_shapes_until_their_padding_costs_a_capture():
    """"auto" pads to the least padding shape already met when each length grows by at most a
    quarter (at least 2); a batch further from every shape met, but shorter than one, pads
    to it, charging its extra columns (over its own) to its own rung shape until they add up
    to a capture's cost; a batch longer than every shape makes a new shape of rungs at most an
    eighth apart."""
    from tinygrad_attn.models import BatchPadding
    from tinygrad_attn.models.training import CAPTURE_STEPS

    def shapes(padding, lengths):
        out = []
        for s, t in lengths:
            src, tgt_in, tgt_out = padding(np.full((2, s), 5), np.full((2, t), 6), np.full((2, t), 7))
            assert tgt_in.shape == tgt_out.shape
            assert (src[:, s:] == ta.data.PAD).all() and (src[:, :s] == 5).all()
            assert (tgt_in[:, t:] == ta.data.PAD).all() and (tgt_out[:, :t] == 7).all()
            out.append((src.shape[1], tgt_in.shape[1]))
        return out

    dates = [(27, 11), (25, 11), (22, 11), (28, 11), (24, 11), (23, 11), (21, 11), (29, 11), (3, 2)]
    assert shapes(BatchPadding("auto", (None, None)), dates) == [(28, 11)] * 7 + [(30, 11), (28, 11)]
    # (8, 2) padded to (28, 11) is 29 extra columns over 10: 2.9 steps charged each time.
    assert CAPTURE_STEPS == 8.0
    short = [(27, 11)] + [(8, 2)] * 4
    assert shapes(BatchPadding("auto", (None, None)), short) == [(28, 11)] * 3 + [(8, 2)] * 2
    # The least padding among the shapes within the bound, not the shortest longer shape overall.
    met = [(40, 12), (48, 5), (39, 4)]
    assert shapes(BatchPadding("auto", (None, None)), met) == [(40, 12), (48, 5), (48, 5)]
    # Never past a position table's length; ints pad to their multiples.
    assert shapes(BatchPadding("auto", (27, 12)), [(25, 11), (27, 11)]) == [(26, 11), (27, 11)]
    assert shapes(BatchPadding(8, (None, 12)), [(27, 11), (8, 1)]) == [(32, 12), (8, 8)]


def test_batch_padding_names_its_bad_arguments():
    from tinygrad_attn.models import BatchPadding

    with pytest.raises(ValueError, match=r"BatchPadding: pad_to must be >= 1, got 0"):
        BatchPadding(0)
    with pytest.raises(TypeError, match=r"BatchPadding: pad_to must be an int, got 'eight'"):
        BatchPadding("eight")
    with pytest.raises(ValueError, match=r"BatchPadding: limits must be \(max_src_len, max_tgt_len\)"):
        BatchPadding("auto", 12)
    with pytest.raises(ValueError, match=r"limits' max_tgt_len must be >= 1, got 0"):
        BatchPadding("auto", (None, 0))
    ids = np.full((2, 5), 4)
    with pytest.raises(ValueError, match=r"tgt_out, got shapes \[\(2, 5\), \(2, 5\), \(2, 4\)\]"):
        BatchPadding(8)(ids, ids, ids[:, :4])
    with pytest.raises(ValueError, match=r"one batch size"):
        BatchPadding(8)(ids[:1], ids, ids)


def test_train_compiled_stops_at_a_non_finite_loss_before_updating():
    """The loss is checked inside the plan, before backward: the step that meets a NaN loss
    changes no weight, compiled as eager."""
    task = small_task()
    model = small_model(task, dropout=0.0)
    optimizer = ta.optim.Adam(model.parameters(), lr=1e-2)
    seen = {}

    def poison_after_step_3(record):
        seen[record["step"]] = weights(model)
        if record["step"] == 3:
            model.out.bias.data[...] = np.nan          # the next loss is NaN

    with pytest.raises(FloatingPointError, match=r"train: the loss is nan at step 4 "):
        ta.models.train(model, task, steps=8, batch_size=8, eval_every=0, optimizer=optimizer, compile=True,
                        callback=poison_after_step_3)
    poisoned = {name: value for name, value in seen[3].items() if name != "out.bias"}
    assert_same_weights({name: value for name, value in weights(model).items() if name in poisoned}, poisoned)


@pytest.mark.parametrize(("options", "message"), [({"compile": 1}, "compile must be True or False"),
                                                  ({"pad_to": 0}, "pad_to must be >= 1"),
                                                  ({"pad_to": "8"}, "pad_to must be an int >= 1 or 'auto'")])
def test_train_compile_arguments_are_checked(options, message):
    task = small_task()
    with pytest.raises((TypeError, ValueError), match=message):
        ta.models.train(small_model(task), task, steps=1, **options)


# ---------------------------------------------------------------- label smoothing, checkpoint averaging


@needs_torch
@pytest.mark.parametrize("eps", [0.0, 0.1, 0.35])
def test_seq2seq_loss_with_label_smoothing_equals_torchs_cross_entropy(eps):
    """Seq2Seq.loss(label_smoothing=eps) against torch's F.cross_entropy(label_smoothing=eps)
    on the float64 torch twin's logits: loss and every gradient, padding ignored."""
    task = small_task()
    model = small_model(task, dropout=0.0).double()
    twin = model.to_torch(torch.float64)
    batch = next(ta.data.batches(task.train[:9], task.src_vocab, task.tgt_vocab, 9, shuffle=False))
    tgt_out = batch.tgt_out.copy()
    tgt_out[:3, -2:] = ta.data.PAD                       # rows with padding, which both must skip
    loss = model.loss(batch.src, batch.tgt_in, tgt_out, label_smoothing=eps)
    loss.backward()
    logits = twin(*(torch.from_numpy(a) for a in (batch.src, batch.tgt_in)))
    theirs = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                               torch.from_numpy(tgt_out).reshape(-1),
                                               ignore_index=ta.data.PAD, label_smoothing=eps)
    theirs.backward()
    assert abs(loss.item() - theirs.item()) <= 1e-12 * abs(theirs.item())
    grads = dict(twin.named_parameters())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), grads[name].grad.numpy(), rtol=1e-9, atol=1e-13,
                                   err_msg=name)


@pytest.mark.parametrize(("options", "error", "message"), [
    ({"label_smoothing": 1.0}, ValueError, r"train: label_smoothing must be a finite number in \[0.0, 1.0\)"),
    ({"label_smoothing": -0.1}, ValueError, "label_smoothing must be a finite number in"),
    ({"label_smoothing": "0.1"}, TypeError, "train: label_smoothing must be a number, got str"),
    ({"average_last": -1}, ValueError, "average_last must be >= 0"),
    ({"average_last": 2.0}, TypeError, "average_last must be an int"),
    ({"average_last": 2, "eval_every": 0}, ValueError, "average_last=2 averages the weights of evaluations"),
    ({"average_last": 2, "restore_best": False}, ValueError, "restore_best=False .* give one of them"),
])
def test_train_refuses_bad_smoothing_and_averaging(options, error, message):
    task = small_task()
    steps = []
    with pytest.raises(error, match=message):
        ta.models.train(small_model(task), task, steps=4, batch_size=8, callback=steps.append, **options)
    assert steps == []


def test_train_with_label_smoothing_optimizes_the_smoothed_loss_and_validates_the_plain_one():
    task = small_task()
    eps = 0.3
    model = small_model(task, dropout=0.0)
    first = next(ta.data.sample_batches(task.train, task.src_vocab, task.tgt_vocab, 8, seed=0))
    smoothed = model.loss(first.src, first.tgt_in, first.tgt_out, label_smoothing=eps).item()
    plain = model.loss(first.src, first.tgt_in, first.tgt_out).item()
    history = ta.models.train(model, task, steps=2, batch_size=8, eval_every=2, label_smoothing=eps)
    assert history[0]["loss"] == smoothed != plain                  # the first step's, before its update
    # The best weights are step 2's, the only evaluation: the validation loss is not smoothed.
    expected = ta.models.evaluation.validation_loss(model, task.valid, task.src_vocab, task.tgt_vocab)
    assert history[1]["valid_loss"] == expected


@pytest.mark.parametrize("make", [
    lambda task: small_model(task, dropout=0.2),
    lambda task: ta.models.Transformer(len(task.src_vocab), len(task.tgt_vocab), d_model=16, nhead=2,
                                       num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=32,
                                       dropout=0.2)], ids=["seq2seq", "transformer"])
def test_train_compiled_with_label_smoothing_equals_eager(make):
    """The smoothing is a constant of the compiled step's plans (not an argument): losses and
    weights those of eager training with the same smoothing, bit for bit, and not those
    without."""
    task = small_task()
    compiled, compiled_losses = _trained(task, make, compile=True, label_smoothing=0.1)
    eager, eager_losses = _trained(task, make, pad_to="auto", label_smoothing=0.1)
    _, plain_losses = _trained(task, make, pad_to="auto")
    assert compiled_losses == eager_losses and compiled_losses[0] != plain_losses[0]
    assert_same_weights(compiled.state_dict(), weights(eager))


def test_train_average_last_ends_with_the_mean_of_the_last_evaluations_weights(tmp_path):
    """float64: the run's weights, and the checkpoint's model, equal the mean (summed in
    order, divided by the count) of the weights a callback saw at the last 3 of 5
    evaluations, exactly; the history, the log and the checkpoint name those steps."""
    task = small_task()
    model = small_model(task).double()
    seen = {}

    def snapshot(record):
        if "valid_exact_match" in record:
            seen[record["step"]] = weights(model)

    history = ta.models.train(model, task, steps=10, batch_size=8, eval_every=2, average_last=3,
                              checkpoint=tmp_path / "avg.ckpt", callback=snapshot)
    assert sorted(seen) == [2, 4, 6, 8, 10]
    mean = {name: (seen[6][name] + seen[8][name] + seen[10][name]) / 3 for name in seen[6]}
    assert_same_weights(weights(model), mean)
    assert not any(np.array_equal(mean[name], seen[10][name]) for name in mean)   # not the last step's
    assert_same_weights(ta.load(tmp_path / "avg.ckpt")["model"], mean)      # (a loaded model is float32)
    info = ta.models.load_checkpoint(tmp_path / "avg.ckpt")[1]
    assert_same_weights(info.training["model"], seen[10])                # it resumes from the last step
    assert info.extras["averaged_steps"] == [6, 8, 10]
    assert [r["averaged_steps"] for r in history if "averaged_steps" in r] == \
        [[2], [2, 4], [2, 4, 6], [4, 6, 8], [6, 8, 10]]
    log = [json.loads(line) for line in (tmp_path / "avg.jsonl").read_text().splitlines()]
    assert [line["averaged_steps"] for line in log][-1] == [6, 8, 10]
    assert "best_step" in log[-1]


class _Clock:
    """training's ``time`` module with a clock the test moves (perf_counter only)."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


def _snapshots_until_out_of_time(clock, model, seen: dict, step: int):
    """A training callback: the model's weights into ``seen`` at each evaluation and at
    ``step``, where it moves ``clock`` past any time limit."""
    def callback(record):
        if "valid_exact_match" in record or record["step"] == step:
            seen[record["step"]] = weights(model)
        if record["step"] == step:
            clock.now = 100.0
    return callback


def test_a_time_limit_between_evaluations_closes_the_average_with_the_last_step(monkeypatch, tmp_path):
    """float64: stopped by the time limit at step 7 (evaluations at 2, 4, 6), the run ends
    with the mean of the weights at steps 4, 6 and 7, exactly; the checkpoint's model is that
    mean and names those steps, its training state keeps step 7's weights and the
    evaluations' snapshots, and the resumed run ends bit for bit as an unstopped one."""
    clock = _Clock()
    monkeypatch.setattr(training, "time", clock)
    task = small_task()
    run = dict(steps=12, batch_size=8, lr=1e-2, eval_every=2, average_last=3)
    straight = small_model(task).double()
    ta.models.train(straight, task, **run, checkpoint=tmp_path / "a.ckpt")
    model = small_model(task).double()
    seen = {}
    snapshot_and_run_out_of_time_at_step_7 = _snapshots_until_out_of_time(clock, model, seen, 7)

    history = ta.models.train(model, task, **run, checkpoint=tmp_path / "b.ckpt", time_limit=50.0,
                              callback=snapshot_and_run_out_of_time_at_step_7)
    assert sorted(seen) == [2, 4, 6, 7] and history[-1]["step"] == 7
    assert history[-1]["averaged_steps"] == [4, 6, 7]
    mean = {name: (seen[4][name] + seen[6][name] + seen[7][name]) / 3 for name in seen[4]}
    assert_same_weights(weights(model), mean)
    assert_same_weights(ta.load(tmp_path / "b.ckpt")["model"], mean)
    resumed, info = ta.models.load_checkpoint(tmp_path / "b.ckpt")
    assert info.extras["averaged_steps"] == [4, 6, 7]
    assert_same_weights(info.training["model"], seen[7])
    assert [entry["step"] for entry in info.training["snapshots"]] == [2, 4, 6]
    resumed.double()
    history = ta.models.train(resumed, task, steps=12, checkpoint=tmp_path / "b.ckpt", resume=True)
    assert history[-1]["averaged_steps"] == [8, 10, 12]
    assert_same_weights(weights(resumed), weights(straight))


def test_a_time_limit_closes_an_average_of_fewer_evaluations_than_n_with_all_of_them(monkeypatch):
    """average_last=5 stopped at step 7 after three evaluations: all three and step 7."""
    clock = _Clock()
    monkeypatch.setattr(training, "time", clock)
    task = small_task()
    model = small_model(task).double()
    seen = {}
    snapshot_and_run_out_of_time_at_step_7 = _snapshots_until_out_of_time(clock, model, seen, 7)

    history = ta.models.train(model, task, steps=12, batch_size=8, eval_every=2, average_last=5,
                              time_limit=50.0, callback=snapshot_and_run_out_of_time_at_step_7)
    assert history[-1]["averaged_steps"] == [2, 4, 6, 7]
    mean = {name: (seen[2][name] + seen[4][name] + seen[6][name] + seen[7][name]) / 4 for name in seen[2]}
    assert_same_weights(weights(model), mean)


def test_a_time_limit_at_an_evaluation_keeps_the_evaluations_average(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(training, "time", clock)
    task = small_task()

    def run_out_of_time_at_step_4(record):
        if record["step"] == 4:
            clock.now = 100.0

    history = ta.models.train(small_model(task), task, steps=12, batch_size=8, eval_every=2, average_last=3,
                              time_limit=50.0, callback=run_out_of_time_at_step_4)
    assert history[-1]["step"] == 4 and history[-1]["averaged_steps"] == [2, 4]


def test_train_resumed_with_averaging_and_smoothing_ends_bitwise_equal_to_uninterrupted(tmp_path):
    """label_smoothing and average_last are the run's settings: resumed without them, the run
    continues with them (and its snapshots) and ends with an uninterrupted run's weights."""
    task = small_task()
    run = {**RUN, "eval_every": 2, "label_smoothing": 0.1, "average_last": 3}
    straight = small_model(task)
    ta.models.train(straight, task, **run, checkpoint=tmp_path / "a.ckpt")

    def ctrl_c_at_step_7(record):
        if record["step"] == 7:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt, match="step 7"):
        ta.models.train(small_model(task), task, **run, checkpoint=tmp_path / "b.ckpt",
                        callback=ctrl_c_at_step_7)
    model, info = ta.models.load_checkpoint(tmp_path / "b.ckpt")
    assert info.training["settings"]["label_smoothing"] == 0.1 and info.extras["averaged_steps"] == [2, 4, 6]
    history = ta.models.train(model, task, steps=12, checkpoint=tmp_path / "b.ckpt", resume=True)
    assert history[-1]["averaged_steps"] == [8, 10, 12]
    assert_same_weights(weights(model), weights(straight))
    for name in ("a.ckpt", "b.ckpt"):
        assert ta.models.load_checkpoint(tmp_path / name)[1].extras["averaged_steps"] == [8, 10, 12]
    assert_same_weights(weights(ta.models.load_checkpoint(tmp_path / "a.ckpt")[0]),
                        weights(ta.models.load_checkpoint(tmp_path / "b.ckpt")[0]))

    def evaluations(name):
        lines = [json.loads(line) for line in (tmp_path / name).read_text().splitlines()]
        return [{k: v for k, v in line.items() if k != "seconds"} for line in lines]

    assert evaluations("a.jsonl") == evaluations("b.jsonl")
    assert [(line["step"], line["averaged_steps"]) for line in evaluations("b.jsonl")][-2:] == \
        [(10, [6, 8, 10]), (12, [8, 10, 12])]


def test_train_resumes_a_checkpoint_written_before_smoothing_and_averaging(tmp_path):
    """A training state without the newer settings resumes as a run with neither."""
    task = small_task()
    ta.models.train(small_model(task), task, steps=2, batch_size=8, eval_every=2,
                    checkpoint=tmp_path / "o.ckpt")
    model, info = ta.models.load_checkpoint(tmp_path / "o.ckpt")
    state = info.training
    for key in ("label_smoothing", "average_last"):
        del state["settings"][key]
    del state["snapshots"]
    ta.models.save_checkpoint(tmp_path / "o.ckpt", model, task, training=state, **info.extras)
    history = ta.models.train(model, task, steps=4, checkpoint=tmp_path / "o.ckpt", resume=True)
    assert [r["step"] for r in history] == [3, 4] and "averaged_steps" not in history[-1]
    settings = ta.models.load_checkpoint(tmp_path / "o.ckpt")[1].training["settings"]
    assert settings["label_smoothing"] == 0.0 and settings["average_last"] == 0
