"""A tiny random Llama model made on the spot, so vLLM's CPU build runs a real engine with no download.

Used by the real-engine tests (``pytest -m vllm_engine``), ``make demo BACKEND=vllm`` and
``make bench-vllm``. :func:`build_tiny_model` trains a byte-level BPE tokenizer (vocabulary ~1,000)
on generated product text, wraps it in ``PreTrainedTokenizerFast`` with bos/eos/pad tokens and a
small Jinja chat template, and saves it beside a 2-layer ``LlamaForCausalLM`` with random weights
(hidden size 128, ~0.4 M parameters) — about 2 MB, ~5-30 s on two cores. The weights are random:
the engine path is real, the answers are meaningless.

:data:`ENGINE_ARGS` are the ``vllm.LLM`` / ``vllm serve`` settings that keep the CPU build quick:
eager mode (compiling the graph takes minutes on two cores), a 512-token context, compact JSON.
:func:`cpu_engine_env` is the environment the CPU build needs (a 1 GiB KV cache).
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

# The chat template: one line per message, then the assistant's turn.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
MAX_MODEL_LEN = 512
# No whitespace between JSON tokens: a random model would otherwise wander in whitespace the grammar allows.
STRUCTURED_OUTPUTS = {"backend": "xgrammar", "disable_any_whitespace": True}
ENGINE_ARGS: dict[str, Any] = {
    "max_model_len": MAX_MODEL_LEN,
    "enforce_eager": True,
    "seed": 0,
    "structured_outputs_config": STRUCTURED_OUTPUTS,
}
_WORDS = [
    "red",
    "blue",
    "green",
    "small",
    "large",
    "cotton",
    "steel",
    "wooden",
    "lamp",
    "shirt",
    "ball",
    "doll",
    "cream",
    "novel",
    "rice",
    "phone",
    "cable",
    "chair",
    "shoe",
    "racket",
    "puzzle",
    "soap",
    "atlas",
    "bread",
    "jacket",
    "kettle",
    "glove",
    "robot",
    "lotion",
    "cookbook",
    "pasta",
    "book",
    "toy",
    "home",
    "sports",
    "beauty",
    "grocery",
    "clothing",
    "electronics",
    "books",
    "toys",
    "product",
    "number",
    "price",
    "classify",
    "the",
    "a",
    "of",
    "for",
]
DONE = "config.json"


def cpu_engine_env(*, in_process: bool = True) -> dict[str, str]:
    """Environment for vLLM's CPU build: a 1 GiB KV cache (its default takes a share of RAM).

    ``in_process``: the engine core runs in the calling process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
    instead of a spawned one that imports vLLM again (~25 s on two cores) and needs a ``__main__`` guard.
    """
    env = {"VLLM_CPU_KVCACHE_SPACE": "1"}
    if in_process:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return env


def cpu_engine_factory(**engine_args: Any) -> Any:
    """An ``[llm_batch] vllm_engine_factory`` for the CPU build: the operator's arguments plus :data:`ENGINE_ARGS`.

    ``make demo BACKEND=vllm`` sets it, so that the example DAG (written for GPUs) runs the tiny model
    in eager mode with a 512-token context; the engine is the real one (``vllm_engine.load_engine``).
    """
    from airflow_batch_provider.hooks import vllm_engine

    return vllm_engine.load_engine(**{**engine_args, **ENGINE_ARGS})


def _corpus(lines: int = 4000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    text = []
    for i in range(lines):
        words = rng.choices(_WORDS, k=rng.randint(4, 16))
        text.append(f"Product number {i}: {' '.join(words)}, {rng.randint(1, 999)}.{rng.randint(0, 99):02d}")
    return text


def build_tiny_model(folder: Path, *, vocab_size: int = 1000, hidden_size: int = 128, seed: int = 0) -> Path:
    """Write the tokenizer and a random 2-layer Llama to ``folder`` (reused when already complete)."""
    folder = Path(folder)
    if (folder / DONE).exists() and (folder / "tokenizer.json").exists():
        return folder
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(_corpus(seed=seed), trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=MAX_MODEL_LEN * 2,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    staging = folder.with_name(folder.name + ".partial")
    staging.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(staging)
    model.save_pretrained(staging)
    os.replace(staging, folder) if not folder.exists() else _move_into(staging, folder)
    return folder


def _move_into(staging: Path, folder: Path) -> None:
    # An empty target folder (a pytest tmp dir) exists already: move the files in, config.json last.
    files = sorted(staging.iterdir(), key=lambda p: p.name == DONE)
    for path in files:
        os.replace(path, folder / path.name)
    staging.rmdir()


if __name__ == "__main__":
    import sys

    print(build_tiny_model(Path(sys.argv[1] if len(sys.argv) > 1 else ".demo/tiny-llama")))
