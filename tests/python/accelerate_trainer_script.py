"""transformers' Trainer under torchrun, as a user runs it; started by test_integrations.py.

``torchrun --nproc_per_node 2 accelerate_trainer_script.py DEVICE``: with ``DEVICE=brick`` the
environment carries ``ACCELERATE_TORCH_DEVICE=brick`` (the recipe), with ``cpu`` the arguments say
``use_cpu=True``. Three Trainer steps of a tiny GPT-2 on eight sequences; rank 0 prints one
``RESULT {json}`` line: world size, accelerate's distributed type, the device, the ranks' batch
devices, the logged losses and the trained parameters' sums.
"""

import json
import os
import sys
import tempfile

import torch

import torch_brickdev  # noqa: F401  (asks for brick)
import transformers  # noqa: E402


class Sequences(torch.utils.data.Dataset):
    def __init__(self):
        generator = torch.Generator().manual_seed(20)
        self.ids = torch.randint(0, 64, (8, 9), generator=generator)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main():
    device = sys.argv[1]
    torch.manual_seed(0)
    # No dropout: brick's draws from brick's generator (as CUDA's from CUDA's) and the sampler's
    # from the CPU's, where the CPU-only run draws both from one stream.
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2,
                                     n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config)
    seen = set()
    model.register_forward_pre_hook(lambda module, args, kwargs: seen.add(
        str(kwargs["input_ids"].device)), with_kwargs=True)
    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(
            output_dir=out, max_steps=3, per_device_train_batch_size=2, learning_rate=1e-2,
            logging_steps=1, save_strategy="no", report_to=[], seed=0, use_cpu=device == "cpu",
            dataloader_num_workers=0, disable_tqdm=True)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=Sequences())
        trainer.train()
    state = trainer.accelerator.state
    devices = [None] * state.num_processes
    torch.distributed.all_gather_object(devices, sorted(seen))
    if state.process_index == 0:
        print("RESULT " + json.dumps({
            "world_size": state.num_processes,
            "distributed_type": str(state.distributed_type),
            "device": str(args.device),
            "backend": torch.distributed.get_backend(),
            "batch_devices": devices,
            "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
            "parameters": [p.detach().cpu().double().sum().item()
                           for p in trainer.model.parameters()],
        }), flush=True)
    torch.distributed.barrier()
    os._exit(0)  # after the results: the process group's teardown is not under test


if __name__ == "__main__":
    main()
