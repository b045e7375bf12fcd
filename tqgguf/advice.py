"""The K/V recommendation of `tqgguf check`, from the rules in data/rules.json."""

from __future__ import annotations

import json
import operator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from .gguf_check import ModelFacts
from .kvcompat import verdict

_RULES = Path(__file__).resolve().parent / "data" / "rules.json"
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq, "!=": operator.ne, ">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt,
    "in": lambda a, b: a in b,
}


@lru_cache(maxsize=1)
def rules() -> dict:
    return json.loads(_RULES.read_text())


def split(config: str) -> tuple[str, str]:
    k, _, v = config.partition("/")
    return k, v or k


@dataclass
class Advice:
    config: str | None          # "K/V" (or "T" for K = V); None: no recommendation
    rule: str
    reason: str
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        k, v = split(self.config) if self.config else (None, None)
        return {"config": self.config, "k": k, "v": v, "rule": self.rule, "reason": self.reason, "notes": self.notes}


def facts(m: ModelFacts, flash_attn: bool = True) -> dict[str, Any]:
    """The facts the rules can test."""
    kv = m.kv_layers
    side_ok = [verdict(m, s, "turbo4", flash_attn).status in ("native", "no cache") for s in ("K", "V")]
    q4_ok = [verdict(m, s, "q4_0", flash_attn).status in ("native", "no cache") for s in ("K", "V")]
    dims = sorted({ly.head_dim_k for ly in kv} | {ly.head_dim_v for ly in kv})
    return {
        "arch": m.arch, "kv_layers": len(kv), "mla": m.mla, "swa": m.swa_type != "none", "n_swa": m.n_swa,
        "gqa_ratio": round(m.gqa_ratio, 2), "n_embd": m.n_embd, "n_layer": m.n_layer,
        "head_dims": "/".join(map(str, dims)), "turbo_native": all(side_ok), "q4_native": all(q4_ok),
        "flash_attn": flash_attn and m.arch != "grok",
    }


def _holds(when: dict, f: dict) -> bool:
    for key, (op, value) in when.items():
        if key not in f or not _OPS[op](f[key], value):
            return False
    return True


def recommend(m: ModelFacts, flash_attn: bool = True, fits: Callable[[str], bool] | None = None) -> Advice:
    """The first matching rule; with `fits` (config -> fits the budget at the requested context), the first config
    of the quality order from the recommended one on that fits."""
    f = facts(m, flash_attn)
    data = rules()
    rule = next(r for r in data["rules"] if _holds(r["when"], f))
    config, reason = rule["recommend"], rule["reason"].format(**f)
    rule_id = rule["id"]
    if config and fits is not None and not fits(config):
        order = data["quality_order"]["mla" if f["mla"] else "turbo" if f["turbo_native"] else "no_turbo"]
        rest = order[order.index(config) + 1:] if config in order else []
        smaller = next((c for c in rest if fits(c)), None)
        if smaller:
            reason = f"{config} does not fit the memory budget at this context; {smaller} is the best-quality pair that does"
            config, rule_id = smaller, "fit"
        else:
            rule_id = "fit-none"   # keeps the rule's pair and reason; the caller warns
    notes = []
    if config:
        k, v = split(config)
        f.update(config_k=k, config_v=v)
    for n in data["notes"]:
        if _holds(n["when"], f):
            notes.append(n["text"].format(**f))
    return Advice(config, rule_id, reason, notes)
