"""Train the project's own byte-level BPE tokenizer locally (no hub downloads)."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"
# 256 byte symbols + EOS: a smaller vocabulary could not hold a single merge.
MIN_VOCAB_SIZE = 257 + 1


def train_tokenizer(texts: list[str], vocab_size: int, seed: int = 0) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on `texts` and wrap it for transformers.

    Byte-level means every string (also text never seen in training) is encodable and decodes
    back exactly. The only special token is EOS "<|endoftext|>" (id 0), which also serves as the
    pad token; there is no BOS and no UNK. Padding is on the left, as decoder-only generation
    needs. Digits are always single tokens. The vocabulary may come out smaller than `vocab_size` when `texts` hold fewer merges.

    `seed` is accepted for a uniform builder signature; BPE training in `tokenizers` is
    deterministic (merges are chosen by count with a fixed tie-break), so it is not used.
    """
    del seed
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(f"vocab_size must be at least {MIN_VOCAB_SIZE}, got {vocab_size}")
    if not texts:
        raise ValueError("texts must not be empty: the tokenizer needs something to learn merges from")
    tokenizer = Tokenizer(models.BPE())
    # Digits are split one per token (as Qwen2 and Llama do): with multi-digit number tokens a
    # tiny model would have to memorise arithmetic over each number token separately.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        padding_side="left",
    )
    return wrapped
