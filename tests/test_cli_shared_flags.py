"""The flags the ``rpm`` commands share (the run group of ``add_common_arguments``, the training
group of ``add_training_arguments``, ``--data`` and ``--window``): every command's parser takes
them with the defaults written here, a stable API that a refactor must not move."""

import argparse

import pytest

from rpm.cli import build_parser
from rpm.experiments.common import add_training_arguments

#: The run flags of every command: the same defaults everywhere but --out and
#: --checkpoint-every.
RUN = {"seed": 0, "device": "auto", "threads": 1, "resume": False, "overwrite": False,
       "progress": True}

#: Every command's defaults of the shared flags it takes (a flag absent here must be absent
#: from the command).
EXPECTED = {
    "benchmark": {"out": "runs/benchmark", "checkpoint_every": 0, "batch_size": 100, "lr": 1e-2},
    "bouncing-balls": {"out": "runs/bouncing-balls", "checkpoint_every": 100, "batch_size": 128,
                       "lr": 1e-2, "prior_lr": 3e-4, "eval_every": 50, "window": 8},
    "causal-ident": {"out": "runs/causal-ident", "checkpoint_every": 500, "steps": 1500,
                     "batch_size": 256, "lr": 1e-3, "warmup": 0.05, "eval_every": 250,
                     "eval_samples": 2000},
    "content-style": {"out": "runs/content-style", "checkpoint_every": 1000, "steps": 6000,
                      "batch_size": 1024, "lr": 1e-3, "warmup": 0.05, "eval_every": 500,
                      "eval_samples": 4000, "chunk_steps": 16},
    "digits": {"out": "runs/digits", "checkpoint_every": 500, "steps": 800, "batch_size": 256,
               "lr": 2e-3, "warmup": 0.05, "eval_every": 100, "data": None},
    "identifiability": {"out": "runs/identifiability", "checkpoint_every": 1000, "steps": 3000,
                        "batch_size": 256, "lr": 1e-3, "warmup": 0.05, "eval_every": 250,
                        "eval_samples": 10000, "chunk_steps": 16, "data": None},
    "lds": {"out": "runs/lds", "checkpoint_every": 200, "steps": 600, "batch_size": 64,
            "lr": 3e-3, "prior_lr": 3e-2, "eval_every": 100, "window": 25, "data": None},
    "masks": {"out": "runs/masks", "checkpoint_every": 1000, "steps": 2000, "batch_size": 256,
              "lr": 1e-3, "prior_lr": 1e-2, "eval_every": 250, "window": 2},
    "mutual-information": {"out": "runs/mutual-information", "checkpoint_every": 0,
                           "steps": 4000, "batch_size": 64, "lr": 5e-4, "prior_lr": 1e-3},
    "peer-supervision": {"out": "runs/peer-supervision", "checkpoint_every": 100, "steps": 300,
                         "batch_size": 256, "lr": 3e-3, "warmup": 0.05, "eval_every": 100},
    "pendulum": {"out": "runs/pendulum", "checkpoint_every": 200, "steps": 300, "batch_size": 16,
                 "lr": 1e-3, "prior_lr": 1e-2, "eval_every": 100, "window": 20, "data": None},
    "rpm-hmm": {"out": "runs/rpm-hmm", "checkpoint_every": 200, "steps": 800, "batch_size": 32,
                "lr": 1e-3, "prior_lr": 1e-2, "warmup": 0.05, "eval_every": 100, "window": 100},
    "uncertainty": {"out": "runs/uncertainty", "checkpoint_every": 500, "steps": 1000,
                    "batch_size": 512, "lr": 2e-3, "warmup": 0.0, "eval_every": 250,
                    "eval_samples": 10000},
}
#: The commands whose minibatch gives each pair the others as negatives: --batch-size >= 2.
CONTRASTIVE = {"benchmark", "bouncing-balls", "causal-ident", "content-style", "digits",
               "identifiability", "masks", "peer-supervision", "uncertainty"}
SHARED = set(RUN).union(*EXPECTED.values())

#: A value other than every default, for each shared flag, as written and as parsed.
OTHER = {"out": ("elsewhere", "elsewhere"), "checkpoint_every": ("7", 7), "seed": ("11", 11),
         "device": ("cpu", "cpu"), "threads": ("0", 0), "steps": ("9", 9),
         "batch_size": ("6", 6), "lr": ("0.5", 0.5), "prior_lr": ("0.25", 0.25),
         "warmup": ("0.5", 0.5), "eval_every": ("0", 0), "eval_samples": ("99", 99),
         "chunk_steps": ("3", 3), "window": ("5", 5), "data": ("mine.npz", "mine.npz")}


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


@pytest.fixture(scope="module")
def parser():
    return build_parser(prog="rpm")


def test_every_command_is_in_the_table(parser):
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(EXPECTED)


@pytest.mark.parametrize("command", sorted(EXPECTED))
def test_shared_flags_have_the_commands_defaults(parser, command):
    parsed = vars(parser.parse_args([command]))
    shared = {dest: value for dest, value in parsed.items() if dest in SHARED}
    assert shared == {**RUN, **EXPECTED[command]}
    for dest, value in EXPECTED[command].items():  # the same type, not just an equal value
        assert type(shared[dest]) is type(value), dest


@pytest.mark.parametrize("command", sorted(EXPECTED))
def test_shared_flags_take_other_values(parser, command):
    dests = list(EXPECTED[command])
    argv = [command, "--overwrite", "--no-progress"]
    for dest in dests:
        argv += [_flag(dest), OTHER[dest][0]]
    parsed = vars(parser.parse_args(argv))
    assert {dest: parsed[dest] for dest in dests} == {dest: OTHER[dest][1] for dest in dests}
    assert parsed["overwrite"] and not parsed["progress"]


@pytest.mark.parametrize("command", sorted(EXPECTED))
def test_shared_training_flags_refuse_out_of_range_values(parser, command, capsys):
    """--lr -1e-3 is a value (read as a negative number), refused by the range check; a batch
    of one pair is refused exactly by the contrastive commands."""
    with pytest.raises(SystemExit):
        parser.parse_args([command, "--lr", "-1e-3"])
    assert "argument --lr: expected a positive number (> 0), got '-1e-3'" in capsys.readouterr().err
    if command in CONTRASTIVE:
        with pytest.raises(SystemExit):
            parser.parse_args([command, "--batch-size", "1"])
        assert "expected a batch size >= 2" in capsys.readouterr().err
    else:
        assert parser.parse_args([command, "--batch-size", "1"]).batch_size == 1


def test_add_training_arguments_help_and_order():
    parser = argparse.ArgumentParser()
    group = add_training_arguments(parser, {"eval_every": 5, "lr": 3e-4, "steps": 10},
                                   descriptions={"lr": "learning rate of the encoder"})
    group.add_argument("--own", type=int, default=1)
    flags = [a.option_strings[0] for a in parser._actions if a.option_strings[0] != "-h"]
    assert flags == ["--steps", "--lr", "--eval-every", "--own"]  # the shared order, then its own
    helps = {a.dest: a.help for a in parser._actions}
    assert helps["lr"] == "learning rate of the encoder (default: 3e-4)"
    assert helps["steps"].endswith("(default: 10)")
    assert vars(parser.parse_args([])) == {"steps": 10, "lr": 3e-4, "eval_every": 5, "own": 1}


@pytest.mark.parametrize("defaults, descriptions, message", [
    ({"epochs": 3}, None, "no shared training flag epochs"),
    ({"steps": 3}, {"lr": "the rate"}, "descriptions of lr without a default"),
    ({"steps": 0}, None, "the default of --steps, 0, is refused"),
    ({"batch_size": 1}, None, None),  # a batch of one is fine unless contrastive
])
def test_add_training_arguments_refuses_bad_calls(defaults, descriptions, message):
    parser = argparse.ArgumentParser()
    if message is None:
        add_training_arguments(parser, defaults, descriptions=descriptions)
        with pytest.raises(ValueError, match="the default of --batch-size, 1, is refused"):
            add_training_arguments(argparse.ArgumentParser(), defaults, contrastive=True)
        return
    with pytest.raises(ValueError, match=message):
        add_training_arguments(parser, defaults, descriptions=descriptions)
