"""Local model folders as transformers and the hub write them, built offline for tests.

Each builder starts from a random tiny Qwen2 (rlvr_core.models.tiny_policy.random_tiny_policy),
loads it with transformers and writes it again the way an organization's own model arrives:

- `save_pretrained_folder`: model.save_pretrained + tokenizer.save_pretrained, with a chat
  template (transformers 5 writes chat_template.jinja);
- `hub_folder`: the same plus what a hub snapshot holds beside it (README.md, LICENSE, an
  image, .gitattributes, vocab.json + merges.txt, and a pickled pytorch_model.bin);
- `sharded_folder`: weights split into model-0000N-of-0000M.safetensors + their index;
- `pickle_only_folder`: config + tokenizer + pytorch_model.bin, no safetensors (refused).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
VOCAB_TEXTS = [f"What is {a} plus {b}? Answer: {a + b}" for a in range(10) for b in range(10)] + [
    "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n0123456789 = + - Answer:"
]


def _base(root: Path) -> Path:
    from rlvr_core.models.tiny_policy import random_tiny_policy

    base = root / "_random_tiny"
    if not base.exists():
        random_tiny_policy(base, VOCAB_TEXTS, seed=3)
    return base


def _loaded(root: Path):
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    base = _base(root)
    return AutoModelForCausalLM.from_pretrained(str(base)), PreTrainedTokenizerFast.from_pretrained(str(base))


def save_pretrained_folder(root: Path, name: str = "save_pretrained", chat_template: str | None = CHATML) -> Path:
    model, tokenizer = _loaded(root)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    out = root / name
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def hub_folder(root: Path, name: str = "hub") -> Path:
    import torch

    out = save_pretrained_folder(root, name)
    (out / "README.md").write_text("---\nlicense: apache-2.0\n---\n# A model card\n")
    (out / "LICENSE").write_text("Apache License 2.0\n")
    (out / "banner.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 16)
    (out / ".gitattributes").write_text("*.safetensors filter=lfs diff=lfs merge=lfs -text\n")
    tokenizer = json.loads((out / "tokenizer.json").read_text())
    (out / "vocab.json").write_text(json.dumps(tokenizer["model"]["vocab"]))
    merges = [" ".join(m) if isinstance(m, list) else m for m in tokenizer["model"]["merges"]]
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    torch.save({"note": torch.zeros(1)}, out / "pytorch_model.bin")  # a pickle beside the safetensors
    return out


def sharded_folder(root: Path, name: str = "sharded") -> Path:
    model, tokenizer = _loaded(root)
    out = root / name
    model.save_pretrained(str(out), max_shard_size="40KB")
    tokenizer.save_pretrained(str(out))
    assert (out / "model.safetensors.index.json").is_file()
    return out


def pickle_only_folder(root: Path, name: str = "pickle_only") -> Path:
    import torch

    model, _ = _loaded(root)
    base = _base(root)
    out = root / name
    out.mkdir()
    for file in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(base / file, out / file)
    torch.save(model.state_dict(), out / "pytorch_model.bin")
    return out
