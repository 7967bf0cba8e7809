"""Causal language modelling with the Hugging Face Trainer, as run_clm.py does it, small: a
tiny GPT-2 built from a local GPT2Config (no download), a character-level tokenizer made on the
spot, the text tokenized and grouped into blocks, ``Trainer.train()`` on CPU under torchrun.
Rank 0 writes the Trainer's own logged loss per step (``state.log_history``, logging_steps=1)
and the final weights to --out. It never imports rankscope."""

import argparse
import json
import os

import torch
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedTokenizerFast,
    Trainer,
    TrainingArguments,
    default_data_collator,
    set_seed,
)

TEXT = ("the quick brown fox jumps over the lazy dog while five boxing wizards jump quickly "
        "and a wizard's job is to vex chumps quickly in fog. ")


def char_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<unk>": 0, "<eos>": 1}
    for ch in sorted(set(TEXT)):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=float, default=2)
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--accumulate", type=int, default=1)
    args = p.parse_args()

    set_seed(0)
    tokenizer = char_tokenizer()
    ids = tokenizer(TEXT * 40)["input_ids"]
    n = len(ids) // args.block_size * args.block_size
    blocks = [ids[i:i + args.block_size] for i in range(0, n, args.block_size)]
    train = [{"input_ids": b, "labels": list(b)} for b in blocks]  # as run_clm's group_texts
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=args.block_size, n_embd=32,
                        n_layer=2, n_head=2, eos_token_id=tokenizer.eos_token_id,
                        bos_token_id=tokenizer.eos_token_id)
    model = GPT2LMHeadModel(config)
    training_args = TrainingArguments(
        output_dir=os.path.join(args.out, "trainer"), use_cpu=True, seed=0,
        per_device_train_batch_size=8, gradient_accumulation_steps=args.accumulate,
        num_train_epochs=args.epochs, learning_rate=3e-3, logging_steps=1,
        save_strategy="no", report_to=[], disable_tqdm=True, dataloader_num_workers=0)
    trainer = Trainer(model=model, args=training_args, train_dataset=train,
                      data_collator=default_data_collator, processing_class=tokenizer)
    trainer.train()
    if trainer.is_world_process_zero():
        losses = {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}
        with open(os.path.join(args.out, "losses.json"), "w") as f:
            json.dump(losses, f)
        torch.save(model.state_dict(), os.path.join(args.out, "weights.pt"))


if __name__ == "__main__":
    main()
