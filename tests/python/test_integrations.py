"""accelerate and transformers use brick when asked (torch_brickdev.integrations).

* Under torchrun, ``ACCELERATE_TORCH_DEVICE=brick`` makes transformers' Trainer really distributed
  on brick (each rank on its own brick device, gradients all-reduced over brick's backend): its
  losses and parameters equal the same run on the CPU (``use_cpu=True``, gloo). Before, each rank
  trained alone on the full data and exited 0.
* A pipeline given a model on brick and no ``device`` runs on brick (it moved the model to the
  CPU, silently).
* A Trainer whose arguments resolved to the CPU warns when it moves a brick model there, naming
  the fix.
* Where transformers knows no accelerator, ``pipeline(..., device=0)``, ``from_pretrained(...,
  device_map="auto")`` and ``pipeline(..., device_map="auto")`` put the model on brick (they chose
  the CPU, silently); their outputs equal the CPU's.
* accelerate's ``PartialState()`` that falls back to the CPU with brick registered says so, naming
  ``ACCELERATE_TORCH_DEVICE=brick``; asking for the CPU (``cpu=True``) or for brick stays quiet.
"""

import json
import os
import tempfile
import warnings

import pytest
import torch

import torch_brickdev  # noqa: F401
from helpers import run_torchrun

transformers = pytest.importorskip("transformers")
SCRIPT = os.path.join(os.path.dirname(__file__), "accelerate_trainer_script.py")


def _torchrun(device):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ACCELERATE_", "MASTER_", "LOCAL_RANK", "WORLD_SIZE", "RANK"))}
    env["OMP_NUM_THREADS"] = "1"
    if device == "brick":
        env["ACCELERATE_TORCH_DEVICE"] = "brick"  # the recipe
    done = run_torchrun(2, SCRIPT, device, timeout=180, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, (
        f"torchrun {SCRIPT} {device} exited with {done.returncode}:\n{done.stdout[-3000:]}\n"
        f"{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.timeout(420)
def test_trainer_under_torchrun_is_distributed_on_brick():
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate")
    if torch.cuda.is_available():
        pytest.skip("TrainingArguments takes cuda whenever torch.cuda.is_available()")
    brick, cpu = _torchrun("brick"), _torchrun("cpu")
    assert (brick["world_size"], brick["backend"], brick["device"]) == (2, "brick", "brick:0")
    assert brick["distributed_type"].endswith("MULTI_CPU")  # accelerate's DDP without device_ids
    assert brick["batch_devices"] == [["brick:0"], ["brick:1"]]
    assert (cpu["world_size"], cpu["backend"]) == (2, "gloo")
    assert brick["losses"] == cpu["losses"] and len(brick["losses"]) == 3
    assert brick["parameters"] == cpu["parameters"]


def _tiny_gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=8, n_positions=32, n_embd=16, n_layer=1, n_head=2)
    return transformers.GPT2LMHeadModel(config).eval()


def _tokenizer():
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {word: i for i, word in enumerate(["<unk>", "a", "b", "c", "d", "e", "f", "g"])}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>",
                                                eos_token="g", pad_token="<unk>")


def test_pipeline_runs_where_its_brick_model_is():
    tokenizer = _tokenizer()
    outputs = {}
    for device in ("cpu", "brick"):
        model = _tiny_gpt2().to(device)
        generate = transformers.pipeline("text-generation", model=model, tokenizer=tokenizer)
        assert generate.device.type == device and next(model.parameters()).device.type == device
        outputs[device] = generate("a b c", max_new_tokens=5, do_sample=False)
    assert outputs["brick"] == outputs["cpu"]


def test_trainer_warns_when_it_moves_a_brick_model_elsewhere(monkeypatch):
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate")
    monkeypatch.delenv("ACCELERATE_TORCH_DEVICE", raising=False)
    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(output_dir=out, use_cpu=True, report_to=[])
        with pytest.warns(UserWarning, match="ACCELERATE_TORCH_DEVICE=brick"):
            trainer = transformers.Trainer(model=_tiny_gpt2().to("brick"), args=args)
    assert next(trainer.model.parameters()).device.type == "cpu"  # moved, but said so


def _transformers_knows_no_accelerator():
    if transformers.utils.get_available_devices() != {"cpu"}:
        pytest.skip("transformers knows an accelerator here and picks it for ordinals and maps")


def _greedy(generate):
    return generate("a b c", max_new_tokens=5, do_sample=False)


def test_pipeline_device_ordinal_runs_on_brick():
    _transformers_knows_no_accelerator()
    tokenizer = _tokenizer()
    on_cpu = transformers.pipeline("text-generation", model=_tiny_gpt2(), tokenizer=tokenizer,
                                   device=-1)
    assert on_cpu.device == torch.device("cpu")  # the CPU when asked for
    for ordinal in (0, 1):
        model = _tiny_gpt2()
        generate = transformers.pipeline("text-generation", model=model, tokenizer=tokenizer,
                                         device=ordinal)
        assert generate.device == torch.device("brick", ordinal)
        assert next(model.parameters()).device == torch.device("brick", ordinal)
        assert _greedy(generate) == _greedy(on_cpu)


@pytest.fixture
def saved_gpt2():
    """A tiny GPT-2 and its tokenizer saved to a directory, as from_pretrained reads them."""
    with tempfile.TemporaryDirectory() as directory:
        _tiny_gpt2().save_pretrained(directory)
        _tokenizer().save_pretrained(directory)
        yield directory


def test_from_pretrained_device_map_auto_places_on_brick(saved_gpt2):
    pytest.importorskip("accelerate", reason="device_map needs accelerate")
    _transformers_knows_no_accelerator()
    model = transformers.GPT2LMHeadModel.from_pretrained(saved_gpt2, device_map="auto")
    assert {p.device.type for p in model.parameters()} == {"brick"}
    budgeted = transformers.GPT2LMHeadModel.from_pretrained(
        saved_gpt2, device_map="auto", max_memory={1: "1GB", "cpu": "1GB"})  # brick's ordinals
    assert {p.device for p in budgeted.parameters()} == {torch.device("brick", 1)}
    reference = transformers.GPT2LMHeadModel.from_pretrained(saved_gpt2)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        logits = model(ids.to(next(model.parameters()).device)).logits
        torch.testing.assert_close(logits.cpu(), reference(ids).logits, rtol=0, atol=0)


def test_pipeline_device_map_auto_runs_on_brick(saved_gpt2):
    pytest.importorskip("accelerate", reason="device_map needs accelerate")
    _transformers_knows_no_accelerator()
    generate = transformers.pipeline("text-generation", model=saved_gpt2, device_map="auto")
    assert generate.device.type == "brick"
    assert {p.device.type for p in generate.model.parameters()} == {"brick"}
    on_cpu = transformers.pipeline("text-generation", model=saved_gpt2, device="cpu")
    assert _greedy(generate) == _greedy(on_cpu)


@pytest.fixture
def fresh_accelerate_state(monkeypatch):
    pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState

    monkeypatch.delenv("ACCELERATE_TORCH_DEVICE", raising=False)
    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def test_partial_state_warns_when_accelerate_picks_the_cpu(fresh_accelerate_state, monkeypatch):
    pytest.importorskip("accelerate")
    from accelerate.state import PartialState

    if torch.cuda.is_available():
        pytest.skip("accelerate picks cuda here")
    with pytest.warns(UserWarning, match="ACCELERATE_TORCH_DEVICE=brick") as caught:
        assert PartialState().device == torch.device("cpu")  # accelerate's choice, now said
    assert "accelerate chose cpu" in str(caught[0].message)
    PartialState._reset_state()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # asked for: no warning
        assert PartialState(cpu=True).device == torch.device("cpu")
        PartialState._reset_state()
        monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "brick")
        assert PartialState().device.type == "brick"
