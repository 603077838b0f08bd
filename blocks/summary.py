"""``summary(model)``: a per-layer table of components, parameter counts and shapes."""

from __future__ import annotations

from torch import nn

from brickwork.components.attention import ATTENTION_REGISTRY, MultiHeadAttention
from brickwork.components.feedforward import FEEDFORWARD_REGISTRY
from brickwork.components.positional import POSITIONAL_REGISTRY
from brickwork.components.residual import NORM_REGISTRY, RESIDUAL_REGISTRY

MAX_SHAPES = 4
HEADER = ("module", "component", "parameters", "shapes")


def registered_name(module: nn.Module) -> str | None:
    """The registry name of ``module``'s class, if any family registered it."""
    for registry in (
        ATTENTION_REGISTRY,
        FEEDFORWARD_REGISTRY,
        POSITIONAL_REGISTRY,
        NORM_REGISTRY,
        RESIDUAL_REGISTRY,
    ):
        for name in registry.names():
            if registry.get(name) is type(module):
                return name
    return None


def component_name(module: nn.Module) -> str:
    """``mlp``, ``layernorm``, ``MultiHeadAttention[local + rotary]``, or the class name."""
    if isinstance(module, MultiHeadAttention):
        parts = [registered_name(module.mechanism) or type(module.mechanism).__name__]
        for hook in (module.rotary, module.position_bias):
            if isinstance(hook, nn.Module):
                parts.append(registered_name(hook) or type(hook).__name__)
        return f"MultiHeadAttention[{' + '.join(parts)}]"
    return registered_name(module) or type(module).__name__


class _Table:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, int, str]] = []
        self.owner: dict[int, str] = {}  # parameter id -> the first name it was listed under

    def add(self, name: str, module: nn.Module, indent: int = 0) -> int:
        """Add a row for ``module`` and return the number of parameters it newly counts."""
        count, shapes = 0, []
        for param_name, param in module.named_parameters():
            if id(param) in self.owner:
                shapes.append(f"{param_name} = {self.owner[id(param)]}")
                continue
            self.owner[id(param)] = f"{name}.{param_name}"
            count += param.numel()
            shapes.append(f"{param_name} {list(param.shape)}")
        if len(shapes) > MAX_SHAPES:
            shapes = [*shapes[:MAX_SHAPES], f"... {len(shapes) - MAX_SHAPES} more"]
        label = "  " * indent + name.rsplit(".", 1)[-1] if indent else name
        self.rows.append((label, component_name(module), count, ", ".join(shapes)))
        return count

    def add_layer(self, name: str, layer: nn.Module) -> None:
        """A row for the layer (its total), then one indented row per component."""
        at = len(self.rows)
        total = sum(self.add(f"{name}.{part_name}", part, 1) for part_name, part in layer.named_children())
        self.rows.insert(at, (name, component_name(layer), total, ""))

    def render(self, title: str, total: int) -> str:
        cells = [HEADER] + [(a, b, f"{c:,}", d) for a, b, c, d in self.rows]
        widths = [max(len(row[i]) for row in cells) for i in range(3)]
        lines = [title]
        for row in cells:
            left = f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]:>{widths[2]}}"
            lines.append(f"{left}  {row[3]}".rstrip())
        lines.append(f"total parameters: {total:,} (shared parameters counted once)")
        return "\n".join(lines)


def summary(model: nn.Module) -> str:
    """A text table: one row per top-level part, per layer, and per component inside each layer.

    Each row gives the component (registry name where there is one), the parameters it holds that no
    earlier row holds, and their shapes; a tied weight is shown as ``weight = <first owner>``.
    """
    table = _Table()
    for name, child in model.named_children():
        if isinstance(child, nn.ModuleList):
            for index, layer in child.named_children():
                table.add_layer(f"{name}.{index}", layer)
        elif not isinstance(child, (nn.Dropout, nn.Identity)):
            table.add(name, child)
    total = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    spec = getattr(model, "spec", None)
    kind = spec.get("model") if isinstance(spec, dict) else None
    title = type(model).__name__ + (f" ({kind})" if kind else "")
    return table.render(title, total)
