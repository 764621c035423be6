"""accelerate and transformers use brick when asked (torch_brickdev.integrations).

* Under torchrun, ``ACCELERATE_TORCH_DEVICE=brick`` makes transformers' Trainer really distributed
  on brick (each rank on its own brick device, gradients all-reduced over brick's backend): its
  losses and parameters equal the same run on the CPU (``use_cpu=True``, gloo). Before, each rank
  trained alone on the full data and exited 0.
* A pipeline given a model on brick and no ``device`` runs on brick (it moved the model to the
  CPU, silently).
* A Trainer whose arguments resolved to the CPU warns when it moves a brick model there, naming
  the fix.
"""

import json
import os
import subprocess
import sys
import tempfile

import pytest
import torch

import torch_brickdev  # noqa: F401

transformers = pytest.importorskip("transformers")
SCRIPT = os.path.join(os.path.dirname(__file__), "accelerate_trainer_script.py")


def _torchrun(device):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ACCELERATE_", "MASTER_", "LOCAL_RANK", "WORLD_SIZE", "RANK"))}
    env["OMP_NUM_THREADS"] = "1"
    if device == "brick":
        env["ACCELERATE_TORCH_DEVICE"] = "brick"  # the recipe
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
               "2", SCRIPT, device]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"torchrun {SCRIPT} {device} ran past 180 s: {str(expired.stdout)[-2000:]}"
                    f"\n{str(expired.stderr)[-2000:]}")
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
