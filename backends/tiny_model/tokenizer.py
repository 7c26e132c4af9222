"""A byte-level BPE tokenizer trained with `tokenizers` on text generated here, plus
tokenizer_config.json with bos/eos and a chat template (for /v1/chat/completions)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from backends.tiny_model.weights import BOS_ID, EOS_ID, MAX_POSITIONS, VOCAB_SIZE

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2, matching config.json
BOS, EOS = SPECIAL_TOKENS[BOS_ID], SPECIAL_TOKENS[EOS_ID]
NUM_SENTENCES = 2000

_WORDS = (
    "the a an of to and in is it that for on with as was at by this be from or have not are but "
    "what all were when we there can your which their said if do will each about how up out them "
    "then she many some so these would other into has more her two like him see time could no make "
    "than first been its who now people my made over did down only way find use may water long "
    "little very after words called just where most know get through back much before go good new "
    "write our used me man too any day same right look think also around another came come work "
    "three word must because does part even place well such here take why things help put years "
    "token step batch slot engine gateway request stream latency throughput model GPU CPU schedule"
).split()

# A ChatML-like template: every message, then the assistant's turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<s>' + message['role'] + '\\n' + message['content'] + '</s>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<s>assistant\\n' }}{% endif %}"
)


def corpus(seed: int, num_sentences: int = NUM_SENTENCES) -> list[str]:
    """Sentences of random words, numbers and punctuation: deterministic for a seed."""
    rng = np.random.default_rng(seed)
    sentences = []
    for _ in range(num_sentences):
        words = [str(w) for w in rng.choice(_WORDS, size=int(rng.integers(4, 16)))]
        if rng.random() < 0.3:
            words.insert(int(rng.integers(0, len(words))), str(int(rng.integers(0, 10_000))))
        sentences.append(" ".join(words).capitalize() + str(rng.choice([".", "?", "!", ","])))
    return sentences


def train_tokenizer(seed: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS[0]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(seed), trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, BOS_ID)]
    )
    return tokenizer


def tokenizer_config() -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": SPECIAL_TOKENS[0],
        "pad_token": EOS,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
    }


def write_tokenizer(out_dir: Path, seed: int) -> None:
    train_tokenizer(seed).save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2) + "\n")
    special = {"bos_token": BOS, "eos_token": EOS, "unk_token": SPECIAL_TOKENS[0], "pad_token": EOS}
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
