"""A tiny Llama with seeded random weights and a locally trained tokenizer, made at test time.

Why: nothing can be fetched from a model hub here (and a test must not depend on one), yet real
`vllm serve` needs a real Hugging Face model directory. This script writes one: a
`LlamaForCausalLM` (2 layers, hidden 128, 2 heads, vocab 2048) with weights from a fixed seed, saved
as safetensors, and a byte-level BPE tokenizer trained with `tokenizers` on a generated corpus,
wrapped in `PreTrainedTokenizerFast` with a chat template so /v1/chat/completions works too. Its
text is gibberish; its shapes, files and code paths are the real ones.

It runs under the vLLM venv's interpreter (torch, transformers, tokenizers, safetensors live
there), either as `python tinymodel.py OUT_DIR` or through `ensure_model()` from the project's
interpreter, which caches the result by a content key (this file's bytes plus the venv's path,
which names every pinned version) and builds into a temporary folder renamed when complete.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SEED = 20261201
VOCAB_SIZE = 2048
MODEL_NAME = "pdwarden-tiny-llama"
# Small enough to make in seconds and serve on a busy CPU; head_dim 64 is a size vLLM's CPU
# attention kernels support.
LLAMA = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL = ["<s>", "</s>", "<unk>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
COMMON_WORDS = ["the", "a", "of", "to", "and", "in", "is", "it", "that", "for", "on", "with"]
# Completeness marker written last; a folder without it is never used.
DONE = ".pdwarden-complete"


def corpus(lines: int = 4000) -> list[str]:
    """Deterministic English-ish text: enough merges for a 2048-token vocabulary."""
    import random

    rng = random.Random(SEED)
    syllables = ["ka", "to", "ri", "mu", "sen", "lo", "pa", "ve", "di", "gor", "an", "el", "qu"]
    words = ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(3000)]
    words += COMMON_WORDS
    return [" ".join(rng.choices(words, k=rng.randint(5, 30))) + "." for _ in range(lines)]


def make(out: Path) -> None:
    """Write the model directory into `out` (which must exist and be empty)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        additional_special_tokens=SPECIAL[4:],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = LLAMA["max_position_embeddings"]
    fast.save_pretrained(out)

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        torch_dtype="float32",
        **LLAMA,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)


def content_key(venv: Path) -> str:
    """Changes whenever this file or the venv (hence a pinned version) changes."""
    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(str(venv.resolve()).encode())
    return h.hexdigest()[:16]


def ensure_model(venv: Path, cache: Path, timeout: float = 900) -> Path:
    """The model directory for this venv, made once (under the venv's Python) and reused."""
    final = cache / f"vllm-model-{content_key(venv)}"
    if (final / DONE).exists():
        return final
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".vllm-model.", dir=cache))
    try:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        subprocess.run(
            [str(venv / "bin" / "python"), __file__, str(tmp)],
            env=env,
            check=True,
            timeout=timeout,
        )
        (tmp / DONE).write_text("ok\n")
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tinymodel.py OUT_DIR (run with the vLLM venv's interpreter)")
    make(Path(sys.argv[1]))
