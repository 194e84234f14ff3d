"""The demo model's size presets (no torch here: the CLI lists them at parse time)."""

# Model sizes: talker width / layers / heads, code-predictor width / layers (heads: width // 64, at least 4; KV
# heads: half of them). "base" is the CPU-trained bundle of late 2026; "medium" needs a GPU to train.
SIZES = {
    "tiny": dict(hidden=64, layers=4, heads=4, cp_hidden=64, cp_layers=2),
    "base": dict(hidden=192, layers=4, heads=4, cp_hidden=192, cp_layers=2),
    "small": dict(hidden=256, layers=4, heads=4, cp_hidden=256, cp_layers=2),
    "wide": dict(hidden=256, layers=6, heads=4, cp_hidden=256, cp_layers=3),
    "medium": dict(hidden=384, layers=6, heads=6, cp_hidden=256, cp_layers=4),
}
