"""A PyTorch Lightning script as its users write it: `Trainer` on CPU with DDP over
`--num-nodes` nodes, `ModelCheckpoint(save_last=True)` every few steps and `fit(...,
ckpt_path="last")` to resume. No NVRx, nothing of resilient_slurm; the step time stands for
the compute."""

import argparse
import time

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--num-nodes", type=int, default=1)
p.add_argument("--devices", type=int, default=1)
p.add_argument("--max-steps", type=int, default=60)
p.add_argument("--step-time", type=float, default=0.2)
p.add_argument("--ckpt-dir", default="checkpoints")
p.add_argument("--every", type=int, default=10)
args = p.parse_args()


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(16, 4)

    def training_step(self, batch, batch_idx):
        time.sleep(args.step_time)
        (x,) = batch
        loss = self.layer(x).square().mean()
        if self.global_rank == 0:
            print(f"[script] step={self.global_step + 1} t={time.time():.3f}", flush=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


torch.set_num_threads(1)
data = DataLoader(TensorDataset(torch.randn(100_000, 16)), batch_size=8)
checkpoint = ModelCheckpoint(dirpath=args.ckpt_dir, every_n_train_steps=args.every,
                             save_last=True)
trainer = pl.Trainer(accelerator="cpu", devices=args.devices, num_nodes=args.num_nodes,
                     strategy="ddp",
                     max_steps=args.max_steps, callbacks=[checkpoint], logger=False,
                     enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Model(), data, ckpt_path="last")
if trainer.global_rank == 0:
    print(f"[script] done step={trainer.global_step} t={time.time():.3f}", flush=True)
