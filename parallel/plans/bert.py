"""HF BERT (``BertModel``, ``BertForMaskedLM``, ``BertForSequenceClassification``, ...).

Each attention's q/k/v sit under ``attention.self`` and their row-wise partner under
``attention.output``; the MLP's halves are ``intermediate.dense`` and ``output.dense`` of the layer.
So the plan is written per layer, each attention and each layer owning its pair (a component's own
``tp_plan()`` declared from outside): a glob such as ``layer.*.output.dense`` would also match
``attention.output.dense``, since ``*`` crosses dots. The masked-LM decoder is split on the
vocabulary like the word embedding it is tied to; ``cls.predictions.bias`` (tied to its bias)
follows it. The small dense layers of the pooler, the MLM transform and classifiers stay whole.
"""

from __future__ import annotations

from torch import nn

from brickwork.parallel.plans.model_plan import ModelPlan, prefix

ATTENTION = {
    "self.query": "colwise",
    "self.key": "colwise",
    "self.value": "colwise",
    "output.dense": "rowwise",
}
MLP = {"intermediate.dense": "colwise", "output.dense": "rowwise"}
# Small dense layers on top of the encoder (MLM transform, NSP, task heads): kept whole on every rank.
WHOLE = ("cls.predictions.transform.dense", "cls.seq_relationship", "classifier", "qa_outputs")


def bert_plan(model: nn.Module) -> ModelPlan:
    p = prefix(model, "bert")
    plan: dict[str, str | dict[str, str]] = {f"{p}embeddings.word_embeddings": "vocab"}
    layers = model.get_submodule(f"{p}encoder.layer")
    for i, layer in enumerate(layers):
        here = f"{p}encoder.layer.{i}"
        plan[f"{here}.attention"] = ATTENTION
        if hasattr(layer, "crossattention"):
            plan[f"{here}.crossattention"] = ATTENTION
        plan[here] = MLP
    names = {name for name, _ in model.named_modules()}
    plan.update({name: "replicate" for name in (f"{p}pooler.dense", *WHOLE) if name in names})
    if "cls.predictions.decoder" in names:
        plan["cls.predictions.decoder"] = "colwise"
    # The attention reshapes with -1 heads, so nothing needs dividing; heads must still split whole.
    return ModelPlan(plan, {}, {"num_attention_heads": model.config.num_attention_heads})
