"""Named hyper-parameter presets for translation, in one table.

``transformer_base`` and ``transformer_big`` are the paper's (Vaswani et
al., 2017, Table 3, §5.1-5.4, §6.1): warmup 4,000 steps, label smoothing
0.1, a shared ~37,000-token vocabulary, ~25,000 tokens a side per batch,
beam 4, α = 0.6. ``cpu_small`` is the Multi30k recipe's 2-core CPU run
(``TranslationConfig``'s defaults); ``tiny`` is for smoke runs and tests.
"""

import dataclasses

_PAPER_TRAINING = dict(label_smoothing=0.1, warmup_steps=4000, lr_scale=1.0,
                       beam_size=4, length_penalty=0.6)

PRESETS = {
    # TranslationConfig's own defaults: the Multi30k CPU run.
    "cpu_small": dict(num_layers=3, d_model=256, num_heads=4, d_ff=1024,
                      dropout_rate=0.3, vocabulary_size=10000,
                      max_sequence_length=128,
                      label_smoothing=0.2, warmup_steps=800, lr_scale=0.6,
                      tokens_per_batch=2048, beam_size=5, length_penalty=1.2),
    "tiny": dict(num_layers=1, d_model=32, num_heads=2, d_ff=64,
                 dropout_rate=0.1, vocabulary_size=500,
                 max_sequence_length=64,
                 label_smoothing=0.1, warmup_steps=10, lr_scale=1.0,
                 tokens_per_batch=1024, beam_size=4, length_penalty=0.6),
    "transformer_base": dict(num_layers=6, d_model=512, num_heads=8, d_ff=2048,
                             dropout_rate=0.1, vocabulary_size=37000,
                             max_sequence_length=256, tokens_per_batch=25000,
                             **_PAPER_TRAINING),
    "transformer_big": dict(num_layers=6, d_model=1024, num_heads=16, d_ff=4096,
                            dropout_rate=0.3, vocabulary_size=37000,
                            max_sequence_length=256, tokens_per_batch=25000,
                            **_PAPER_TRAINING),
}


def preset(name):
    """The hyper-parameters of a named preset.

    Args:
        name: one of ``PRESETS`` (``"cpu_small"``, ``"tiny"``,
            ``"transformer_base"``, ``"transformer_big"``).

    Returns:
        a new dict field name -> value (``d_model``, ``tokens_per_batch``:
        padded tokens per side per batch, ...).

    Raises:
        ValueError: unknown ``name``.

    Example:
        >>> preset("transformer_big")["d_model"], preset("transformer_big")["dropout_rate"]
        (1024, 0.3)
    """
    if name not in PRESETS:
        raise ValueError(f"`preset` must be one of {tuple(PRESETS)}, got preset={name!r}")
    return dict(PRESETS[name])


def apply_preset(config, name=None):
    """Fills a dataclass config from a preset; explicit values win: a field
    still equal to its default takes the preset's value (so a flag set to
    exactly its default reads as "not set").

    Args:
        config: a dataclass instance (e.g. ``TranslationConfig``).
        name: preset name; default ``config.preset``; ``""`` or None
            returns ``config`` unchanged.

    Returns:
        a new config (``dataclasses.replace``).

    Raises:
        ValueError: unknown preset name.

    Example:
        >>> @dataclasses.dataclass
        ... class C:
        ...     d_model: int = 256
        ...     dropout_rate: float = 0.1
        >>> apply_preset(C(dropout_rate=0.2), "transformer_big")
        C(d_model=1024, dropout_rate=0.2)
    """
    name = getattr(config, "preset", "") if name is None else name
    if not name:
        return config
    values = preset(name)
    return dataclasses.replace(config, **{
        f.name: values[f.name] for f in dataclasses.fields(config)
        if f.name in values and getattr(config, f.name) == f.default})
