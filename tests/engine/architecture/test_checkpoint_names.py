"""Folding checkpoint tensor names by their numbers gives back every name exactly, whatever
an uploader wrote: zero-padded numbers and numbers past Python's int-string limit stay
literal."""

from __future__ import annotations

from engine.architecture.checkpoint_names import (
    decoder_layer,
    fold_tensors,
    name_template,
    unfold_tensors,
)


def test_padded_and_over_long_numbers_round_trip_exactly():
    names = [
        "model.layers.0.w",
        "model.layers.1.w",
        "model.layers.01.w",
        "model.layers.00.w",
        "model.layers.10.w",
        "model.layers.1234567890.w",
        "model.layers." + "9" * 5000 + ".w",
        "model.layers.999999999.w",
    ]
    tensors = {name: {"dtype": "BF16", "shape": [4]} for name in names}

    folded = fold_tensors(tensors)

    assert set(unfold_tensors(folded)) == set(names)
    assert {
        "name": "model.layers.*.w",
        "dtype": "BF16",
        "shape": [4],
        "index": ["0-1,10,999999999"],
    } in folded


def test_only_canonical_numbers_are_numbers():
    assert name_template("layers.01.experts.7.w") == ("layers.01.experts.*.w", (7,))
    assert name_template("layers.0.w") == ("layers.*.w", (0,))
    assert name_template("layers.1234567890.w") == ("layers.1234567890.w", ())
    assert decoder_layer("model.layers." + "9" * 5000 + ".w") is None
    assert decoder_layer("model.layers.12.w") == 12
