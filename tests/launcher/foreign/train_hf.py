"""A Hugging Face `Trainer` script as its users write it: a small GPT-2 built from its config
(nothing downloaded), `TrainingArguments(output_dir=..., save_steps=...)` on CPU with DDP over
gloo, resumed with `get_last_checkpoint`. No NVRx, nothing of resilient_slurm; the step time
(spent loading each batch) stands for the compute."""

import argparse
import os
import time

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

p = argparse.ArgumentParser()
p.add_argument("--output_dir", default="out")
p.add_argument("--max_steps", type=int, default=60)
p.add_argument("--save_steps", type=int, default=10)
p.add_argument("--step_time", type=float, default=0.2)
args = p.parse_args()

BATCH = 4


class Tokens(Dataset):
    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        time.sleep(args.step_time / BATCH)
        ids = torch.randint(0, 128, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


torch.set_num_threads(1)
model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=16, n_embd=32, n_layer=1,
                                   n_head=2))
training_args = TrainingArguments(
    output_dir=args.output_dir, max_steps=args.max_steps, save_steps=args.save_steps,
    per_device_train_batch_size=BATCH, logging_steps=10, report_to="none", use_cpu=True,
    ddp_backend="gloo", ddp_find_unused_parameters=False, dataloader_num_workers=0,
    disable_tqdm=True, save_total_limit=2)
last = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
trainer = Trainer(model=model, args=training_args, train_dataset=Tokens())
trainer.train(resume_from_checkpoint=last)
if trainer.is_world_process_zero():
    print(f"[script] done step={trainer.state.global_step} t={time.time():.3f}", flush=True)
