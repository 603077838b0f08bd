"""How long ``brickwork.parallel.plan`` takes on the largest published layouts it is checked against.

Run ``python -m benchmarks.planner_speed`` (or ``python benchmarks/planner_speed.py``). For each case
it prints the seconds to read the spec on the meta device and to plan, the layouts the search
considered, how many it priced in full and how many it listed (parallel/planner/search.py says how
its bounds rule the others out). The cases:

- ``gpt-1t``: the 1008B GPT of Table 1 of Narayanan et al. 2021 (128 layers of width 25,600, 160
  heads, sequence 2048) on 384 nodes of 8 A100-80GB, global batch 3072;
- ``llama3-405b``: Llama 3 405B on 1024 nodes of 8 H100s, global batch 2048 of 8192 tokens, priced
  as Megatron-LM runs it.

``--repeat N`` plans each case N times and prints the fastest (the first call also fills caches).
"""

from __future__ import annotations

import argparse
import copy
import importlib
import time
from typing import Any

from brickwork.factory import get_preset
from brickwork.parallel.planner import model_facts, plan
from brickwork.parallel.planner.lengths import Lengths

search = importlib.import_module("brickwork.parallel.planner.search")  # the module, not plan's function


def gpt_1t() -> dict[str, Any]:
    """Table 1's 1008B GPT: the ``gpt2`` preset's blocks at its sizes, attention over materialized
    scores as the paper's runs had it, no dropout."""
    spec = copy.deepcopy(get_preset("gpt2"))
    spec.update(vocab_size=51200, dim_model=25600, max_seq_len=2048, dropout=0.0)
    spec["decoder"]["num_layers"] = 128
    block = spec["decoder"]["block"]
    block["attention"].update(num_heads=160, dropout=0.0)
    block["attention"]["mechanism"] = {"name": "scaled_dot_product", "backend": "math"}
    block["feedforward"].update(hidden_dim=4 * 25600, dropout=0.0)
    return spec


def llama3_405b() -> dict[str, Any]:
    """Llama 3 405B: the ``llama`` preset's blocks at its sizes."""
    spec = copy.deepcopy(get_preset("llama"))
    spec.update(vocab_size=128256, dim_model=16384, max_seq_len=8192)
    spec["decoder"]["num_layers"] = 126
    spec["decoder"]["block"]["attention"].update(num_heads=128, num_kv_heads=8)
    spec["decoder"]["block"]["feedforward"]["hidden_dim"] = 53248
    return spec


CASES: dict[str, dict[str, Any]] = {
    "gpt-1t": {
        "spec": gpt_1t,
        "cluster": "384x8xA100-80GB",
        "options": {"global_batch": 3072, "seq_len": 2048},
    },
    "llama3-405b": {
        "spec": llama3_405b,
        "cluster": "1024x8xH100-80GB",
        "options": {"global_batch": 2048, "seq_len": 8192, "implementation": "megatron"},
    },
}


class Counter:
    """Counts the layouts the search prices in full (its calls of ``estimate_layout``)."""

    def __init__(self) -> None:
        self.priced = 0
        self._estimate = search.estimate_layout

    def __enter__(self) -> Counter:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.priced += 1
            return self._estimate(*args, **kwargs)

        search.estimate_layout = counted
        return self

    def __exit__(self, *exc: object) -> None:
        search.estimate_layout = self._estimate


def considered(facts: Any, case: dict[str, Any]) -> int:
    """The layouts of the whole search space: every candidate of every size and ZeRO stage."""
    from brickwork.parallel.planner.choices import ALL_OPEN, candidates, step_fields
    from brickwork.parallel.planner.devices import parse_cluster

    cluster = parse_cluster(case["cluster"])
    options = case["options"]
    step = step_fields(cluster, "bf16-mixed", "adamw", options.get("implementation", "brickwork"))
    total = 0
    lengths = Lengths.one(options["seq_len"])
    for configs in search.size_configs(facts, cluster, options["global_batch"], lengths, step):
        for config in configs:
            rows = options["global_batch"] // config.data_parallel_size
            total += sum(1 for _ in candidates(config, ALL_OPEN, rows, facts.num_layers, step))
    return total


def run(name: str, repeat: int) -> None:
    case = CASES[name]
    start = time.perf_counter()
    facts = model_facts(case["spec"]())
    read = time.perf_counter() - start
    best = float("inf")
    for _ in range(repeat):
        with Counter() as counter:
            start = time.perf_counter()
            plans = plan(facts, case["cluster"], **case["options"])
            best = min(best, time.perf_counter() - start)
    print(
        f"{name}: spec read in {read:.2f} s, planned in {best:.2f} s; {considered(facts, case):,} layouts "
        f"considered, {counter.priced:,} priced, {len(plans)} listed; best {plans[0].name}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", help=f"any of {', '.join(CASES)} (default: all)")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    unknown = sorted(set(args.cases) - set(CASES))
    if unknown:
        parser.error(f"unknown cases {unknown}; choose from {list(CASES)}")
    for name in args.cases or CASES:
        run(name, args.repeat)


if __name__ == "__main__":
    main()
