"""Progress bars stay quiet off a terminal: a run whose stderr is a file or a pipe gets no bar."""

from __future__ import annotations

from rlvr_core.models.sft import SftSettings, supervised_warmup


def test_sft_bar_is_silent_when_stderr_is_not_a_terminal(capsys):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlvr_core.models.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(["1+1= 2", "2+2= 4"], 300)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    supervised_warmup(model, tokenizer, [("1+1=", " 2")], SftSettings(3, 2, 1e-3, 0, 32), progress=True)
    assert "SFT warm-up" not in capsys.readouterr().err
