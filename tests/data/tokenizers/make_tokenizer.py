"""Small, real byte-level BPE tokenizers for tests and the demo (no download, no model hub).

`write_bpe_tokenizer(folder, vocab_size=2000, kind="llama3" | "qwen")` trains a byte-level BPE
tokenizer with the `tokenizers` library (installed with transformers) on `TEXT`, a few
paragraphs of English kept below, and writes what a Hugging Face checkpoint folder holds for
it: `tokenizer.json` and `tokenizer_config.json` (bos/eos, `tokenizer_class`
"PreTrainedTokenizerFast", `model_max_length`, a simple chat template). The special tokens are
the family's own, after the learned vocabulary as in the real releases:

- "llama3" (Llama-3.x): `<|begin_of_text|>` (bos, prepended by the post-processor),
  `<|end_of_text|>`, `<|start_header_id|>`, `<|end_header_id|>`, `<|eot_id|>` (eos, as in the
  instruct models); Llama-3's pre-tokenizer regex (digits in runs of up to three).
- "qwen" (Qwen2.5 / Qwen3): `<|endoftext|>` (pad), `<|im_start|>`, `<|im_end|>` (eos), no bos;
  Qwen2's regex (one digit per piece) and NFC normalization.

The output is deterministic: the same arguments give the same bytes, in any process
(`tests/engine/stages/fetch/test_fetch_tokenizer.py` checks it and that the copies committed beside
this file, `llama3/` and `qwen3/`, are what it writes today). To regenerate them:

    .venv/bin/python tests/data/tokenizers/make_tokenizer.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers.processors import ByteLevel as ByteLevelProcessor
from tokenizers.processors import TemplateProcessing

TokenizerKind = Literal["llama3", "qwen"]

HERE = Path(__file__).parent
# The committed copies: kind -> folder beside this file.
COMMITTED = {"llama3": HERE / "llama3", "qwen": HERE / "qwen3"}
COMMITTED_VOCAB_SIZE = 2000

# Llama-3's split pattern (tokenizer.json of meta-llama/Llama-3.1-8B) and Qwen2's (that of
# Qwen/Qwen2.5-7B and Qwen/Qwen3-8B): the same but for digits.
_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_LLAMA3_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)
_QWEN_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)

_FAMILIES: dict[str, dict] = {
    "llama3": {
        "special_tokens": [
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
        ],
        "pattern": _LLAMA3_PATTERN,
        "nfc": False,
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
        "pad_token": None,
        "chat_template": _LLAMA3_CHAT_TEMPLATE,
        "model_max_length": 131072,
    },
    "qwen": {
        "special_tokens": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "pattern": _QWEN_PATTERN,
        "nfc": True,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "chat_template": _QWEN_CHAT_TEMPLATE,
        "model_max_length": 131072,
    },
}

TEXT = """\
On the morning a new open model is published, platform teams race to run it on their own
machines. Somebody downloads the configuration, somebody else reads the model card, and a
third person checks whether the serving stack knows the architecture at all. By noon the
questions are always the same: does it load, does it compute the right numbers, how many
accelerators does it need, and how fast does it answer?

A tokenizer turns text into numbers and numbers back into text. Byte-level byte-pair
encoding starts from the 256 possible bytes, so that every string can be written down, and
then learns merges: the pair of neighbouring pieces seen most often becomes one new piece,
again and again, until the vocabulary reaches the size that was asked for. Frequent words end
up as single tokens, while rare words, names and numbers are spelled out in smaller parts.

Special tokens mark the structure of a conversation. One begins the text, another ends it,
and a few more wrap each message with the name of its speaker: the system, the user or the
assistant. A chat template, written in Jinja, says exactly how the messages of a dialogue are
joined into one prompt, and where the model should start writing its reply.

The weather in the valley changed quickly that week. On Monday the river was quiet and
grey; on Tuesday it rained from dawn until dusk; by Thursday the wind had turned, the clouds
broke apart, and children were running along the bridge with paper boats. The baker opened
early, the library stayed open late, and the old clock in the square struck twelve twice.

Numbers appear everywhere in engineering notes: 8 devices per node, 141 gigabytes of memory,
4.8 terabytes per second, 2048 tokens of context, 0.001 as a tolerance, and version 3.1 of a
model released in 2024. A good tokenizer keeps digits in short groups, so that arithmetic
stays learnable and long numbers never become one opaque symbol.

Careful measurement beats confident guessing. Record what was measured and on which machine,
label what was only predicted, and write down what was not validated at all. When a result
looks surprising, run it again, compare it with a reference, and find the first layer where
the two disagree before changing anything else.

Good software is boring in the best sense: small functions with clear names, tests that
would fail if the code were wrong, errors that say what happened and what to do next, and
documentation that matches the behaviour. Reviewers read code far more often than authors
write it, so clarity is worth more than cleverness.

The kitchen smelled of fresh bread, roasted garlic and lemon. Maria chopped parsley while
James stirred the soup, and their neighbour brought a basket of apples, pears and plums from
the orchard behind the school. Everyone agreed that dinner tasted better because they had
cooked it together, laughing about the burnt toast from breakfast.

Autumn arrived in the mountains with a sudden frost. Hikers zipped their jackets, shepherds
led their flocks down to the lower meadows, and the innkeeper lit a fire that crackled until
midnight. Across the lake, a lighthouse blinked patiently, guiding fishermen home through
drifting fog and quietly reminding travellers that winter would soon follow.

Mathematics rewards patience. A proof begins with definitions, moves through lemmas and
arrives at a theorem; each step must follow from the previous ones without hidden
assumptions. Matrices multiply rows by columns, vectors have lengths and directions, and
probability distributions describe uncertainty with surprising precision.

Music fills the small concert hall: violins tremble, a cello hums beneath them, the flute
answers with bright, playful phrases, and the pianist waits for her cue. When the conductor
lowers his baton, the audience holds its breath for a moment before thunderous applause
erupts from every balcony.

Gardening teaches humility. Tomatoes demand sunshine, ferns prefer shade, and roses sulk
whenever the soil is too heavy. Beetles, snails and curious rabbits nibble the lettuce,
while bees hover over lavender and thyme. Still, every spring the gardener kneels, digs,
plants seeds and hopes.

Distributed systems fail in creative ways. Networks partition, disks fill up, clocks drift,
and a worker may vanish halfway through its job. Robust designs retry with backoff, record
heartbeats, claim work with conditional updates and treat every message as something that
might arrive twice, late, or never.

Long ago, sailors navigated by stars, currents and birds. They measured latitude with a
sextant, estimated speed by throwing a log overboard, and kept journals describing storms,
islands, whales and strange coastlines. Their maps, though imperfect, inspired generations of
explorers, cartographers and astronomers.

Chemistry explains why bread rises and iron rusts. Yeast ferments sugar into carbon dioxide
and alcohol; oxygen slowly combines with metal to form oxides. Acids react with bases, salts
dissolve in water, and catalysts speed up reactions without being consumed themselves.

Athletes train for months before a marathon. They jog at dawn, stretch carefully, eat
porridge, bananas and pasta, and sleep early. On race day, thousands gather at the starting
line, cheering volunteers hand out water, and the finish line feels wonderfully distant until
suddenly it appears.

Languages borrow words freely: algebra from Arabic, kindergarten from German, ballet from
French, tycoon from Japanese, and ketchup perhaps from Hokkien. Grammar shifts slowly,
spelling resists change, and dictionaries struggle to keep pace with slang invented yesterday
by teenagers on their phones.

Volcanoes, glaciers and earthquakes sculpt the planet. Lava cools into basalt, ice carves
valleys into granite, and shifting tectonic plates lift ancient seabeds into jagged peaks.
Geologists read these layers like chapters of a book whose first pages were written billions
of years ago.

Inside the museum, visitors wandered past Egyptian sarcophagi, Roman mosaics, medieval
tapestries and Impressionist paintings. A curator explained how restorers clean varnish with
cotton swabs, photograph canvases under ultraviolet light and sometimes discover forgotten
sketches hidden beneath the visible brushstrokes.

Our quarterly budget review highlighted several priorities: reduce cloud spending, hire two
backend engineers, upgrade monitoring dashboards, and negotiate better licensing terms with
vendors. Finance requested detailed forecasts, whereas product managers emphasised customer
feedback, onboarding friction and churn.

Owls hunt silently at twilight, foxes trot across frozen fields, and hedgehogs shuffle
through fallen leaves searching for worms. Meanwhile squirrels bury acorns, woodpeckers drum
on hollow trunks, and a badger emerges cautiously from its burrow, sniffing the damp evening
air.
"""


def _tokenizer(kind: str, vocab_size: int) -> Tokenizer:
    family = _FAMILIES[kind]
    specials: list[str] = family["special_tokens"]
    learned = vocab_size - len(specials)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if learned < len(alphabet):
        raise ValueError(
            f"vocab_size {vocab_size} leaves {learned} learned tokens: fewer than the"
            f" {len(alphabet)} bytes plus {len(specials)} special tokens"
        )
    tokenizer = Tokenizer(models.BPE())
    if family["nfc"]:
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(family["pattern"]), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=learned,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=sorted(alphabet),
        special_tokens=[],
    )
    tokenizer.train_from_iterator(TEXT.splitlines(keepends=True), trainer=trainer)
    if tokenizer.get_vocab_size() != learned:
        raise ValueError(
            f"the built-in text gives {tokenizer.get_vocab_size()} tokens, not the {learned}"
            f" asked for (vocab_size {vocab_size} less {len(specials)} special tokens)"
        )
    # The family's special tokens take the ids after the learned vocabulary, as in the releases.
    tokenizer.add_special_tokens(specials)
    if family["bos_token"] is not None:
        bos = family["bos_token"]
        tokenizer.post_processor = TemplateProcessing(
            single=f"{bos} $A",
            pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, tokenizer.token_to_id(bos))],
        )
    else:
        tokenizer.post_processor = ByteLevelProcessor(trim_offsets=False)
    return tokenizer


def write_bpe_tokenizer(
    folder: str | Path, *, vocab_size: int = COMMITTED_VOCAB_SIZE, kind: TokenizerKind = "llama3"
) -> list[str]:
    """Train and write a small byte-level BPE tokenizer of `kind` into `folder` (created).

    `vocab_size` counts every token, the family's special tokens included (they take the last
    ids), so a twin config's `vocab_size` of the same value covers it. Returns the names of
    the files written, sorted. Raises ValueError for an unknown kind, or a `vocab_size` the
    built-in text cannot fill (below the 256 bytes plus the special tokens, or above what its
    words allow: a few thousand).
    """
    if kind not in _FAMILIES:
        raise ValueError(f"unknown tokenizer kind {kind!r}: known kinds are llama3, qwen")
    family = _FAMILIES[kind]
    tokenizer = _tokenizer(kind, vocab_size)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": family["bos_token"],
        "eos_token": family["eos_token"],
        "pad_token": family["pad_token"],
        "model_max_length": family["model_max_length"],
        "clean_up_tokenization_spaces": False,
        "chat_template": family["chat_template"],
    }
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(tokenizer.to_str(pretty=True) + "\n", encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(
        json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    return ["tokenizer.json", "tokenizer_config.json"]


if __name__ == "__main__":
    for name, target in COMMITTED.items():
        written = write_bpe_tokenizer(target, kind=name)  # type: ignore[arg-type]
        print(f"{target}: {', '.join(written)}")
