"""summary(model): a per-layer table of components, parameter counts and shapes."""

from factory_specs import tiny_decoder

from brickwork.blocks import summary
from brickwork.factory import build_model


def test_summary_lists_layers_components_counts_and_shapes() -> None:
    model = build_model(tiny_decoder())
    text = summary(model)
    lines = text.splitlines()
    assert lines[0] == "DecoderLM (decoder_lm)"
    total = sum(p.numel() for p in model.parameters())
    assert lines[-1] == f"total parameters: {total:,} (shared parameters counted once)"
    rows = {line.split()[0]: line for line in lines[2:-1]}
    assert "token_embedding" in rows and "[50, 16]" in rows["token_embedding"]
    assert "MultiHeadAttention[local]" in text and "MultiHeadAttention[scaled_dot_product]" in text
    assert "weight = token_embedding.weight" in rows["lm_head"]
    layer_total = sum(p.numel() for p in model.layers[0].parameters())
    layer_rows = [line for line in lines if line.startswith("layers.")]
    assert len(layer_rows) == 3 and f"{layer_total:,}" in layer_rows[0]
    counted = 0
    for line in lines[2:-1]:
        if not line.startswith("layers."):  # layer rows repeat the sum of their component rows
            counted += int(line.split()[2].replace(",", ""))
    assert counted == total, "each parameter is counted in exactly one row"
