"""A tiny transformers Trainer run on CPU for the integration tests (test_integrations.py,
test_hf_gradient_checkpointing.py): random token sequences with language-modelling labels, every
step's loss kept exactly."""
import torch
from transformers import Trainer, TrainingArguments


class TokenDataset(torch.utils.data.Dataset):
    """Random token sequences, language-modelling labels (in memory, fixed by the seed)."""

    def __init__(self, n=6, length=24):
        generator = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, 256, (n, length), generator=generator)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class LossRecordingTrainer(Trainer):
    """Keeps each step's loss exactly (the logged ones are rounded)."""

    def compute_loss(self, model, inputs, *args, **kwargs):
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        self.losses.append(loss.detach().clone())
        return loss


def make_trainer(model, tmp_path, steps: int, callbacks=(), **extra_args) -> LossRecordingTrainer:
    """A Trainer of `steps` steps on CPU, batch 2, fixed seed, nothing logged or saved; not trained
    yet. extra_args: more TrainingArguments (gradient_checkpointing=True, ...)."""
    args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, max_steps=steps,
                             per_device_train_batch_size=2, learning_rate=1e-2, seed=0, report_to=[],
                             save_strategy="no", logging_strategy="no", disable_tqdm=True,
                             dataloader_num_workers=0, **extra_args)
    trainer = LossRecordingTrainer(model=model, args=args, train_dataset=TokenDataset(), callbacks=list(callbacks))
    trainer.losses = []
    return trainer
