"""A small Lightning training run, as a user writes it; run by test_lightning.py in a fresh process.

``python lightning_script.py ACCELERATOR DEVICES STRATEGY PRECISION [--profile]`` trains a tiny
regression model for two epochs and prints, from rank 0, one ``RESULT {json}`` line: the strategy,
its device, the devices the batches were on, the dtype the model computed in, the process group
backend and the trained parameters. Lightning's DDP launcher re-runs this script for rank 1.
"""

import json
import sys

import torch

import torch_brickdev  # noqa: F401  (asks for brick: Trainer(accelerator="brick") from here on)
import lightning.pytorch as pl  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402


class Regression(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                          torch.nn.Linear(16, 4))
        self.batch_devices, self.compute_dtypes = set(), set()

    def training_step(self, batch, batch_index):
        x, y = batch
        self.batch_devices.add(str(x.device))
        out = self.layers(x)
        self.compute_dtypes.add(str(out.dtype))
        return torch.nn.functional.mse_loss(out.float(), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main():
    accelerator, devices, strategy, precision = sys.argv[1:5]
    profile = "--profile" in sys.argv[5:]
    data = TensorDataset(torch.randn(64, 8, generator=torch.Generator().manual_seed(1)),
                         torch.randn(64, 4, generator=torch.Generator().manual_seed(2)))
    profiler = None
    if profile:
        from lightning.pytorch.profilers import PyTorchProfiler
        from torch.profiler import ProfilerActivity

        profiler = PyTorchProfiler(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                                   sort_by_key="cpu_time_total", row_limit=-1)
    torch.manual_seed(0)
    model = Regression()
    trainer = pl.Trainer(max_epochs=2, accelerator=accelerator, devices=int(devices),
                         strategy=strategy, precision=precision, profiler=profiler, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(model, DataLoader(data, batch_size=16))
    if trainer.global_rank == 0:
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        print("RESULT " + json.dumps({
            "accelerator": type(trainer.accelerator).__name__,
            "strategy": type(trainer.strategy).__name__,
            "root_device": str(trainer.strategy.root_device),
            "batch_devices": sorted(model.batch_devices),
            "compute_dtypes": sorted(model.compute_dtypes),
            "backend": torch.distributed.get_backend() if distributed else None,
            "parameters": [p.detach().cpu().double().flatten().tolist()
                           for p in model.parameters()],
        }), flush=True)


if __name__ == "__main__":
    main()
    # Lightning leaves its process group to the interpreter's exit, where torch 2.14.1 aborts
    # now and then ("terminate called without an active exception", 3 of 11 runs of this script
    # on accelerator="cpu" with brick never imported; 0 of 14 with the group destroyed first).
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
