"""ExperimentConfig: a bad value's message names the value, the range and the fix; a config round-trips
through JSON; `import kit.experiments` (config, records) stays free of torch."""
from __future__ import annotations

import copy
import json
import pickle
import subprocess
import sys

import pytest

from kit.experiments.config import ExperimentConfig, ExperimentConfigError


@pytest.mark.parametrize("kw, words", [
    (dict(strategy="pipeline", batch_size=8, micro_batches=3), ["micro_batches=3", "batch_size=8", "2, 4 or 8"]),
    (dict(strategy="pipeline", batch_size=1), ["micro_batches=4", "batch_size=1", "micro_batches=1", "multiple of 4"]),
    (dict(strategy="ddp", world_size=1), ["world_size >= 2", "single"]),
    (dict(strategy="single", world_size=2), ["world_size=1"]),
    (dict(precision="fp8"), ["'fp8'", "'bf16'"]),
    (dict(bucket_cap_mb=0), ["bucket_cap_mb=0", "> 0"]),
    (dict(interconnect="custom"), ["link_alpha_us", "link_gbps"]),
    (dict(interconnect="10gbe", strategy="pipeline"), ["'ddp'", "pipeline"]),
    (dict(steps=0), ["steps=0", ">= 1"]),
    (dict(grad_accum_steps=2, strategy="pipeline"), ["micro_batches"]),
])
def test_config_errors_name_value_range_and_fix(kw: dict, words: list[str]) -> None:
    with pytest.raises(ExperimentConfigError) as e:
        ExperimentConfig(**kw)
    for w in words:
        assert w in str(e.value)


def test_config_roundtrip_label_and_batch() -> None:
    c = ExperimentConfig(strategy="ddp", batch_size=16, grad_accum_steps=2)
    assert ExperimentConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    assert c.global_batch_size == 64
    assert ExperimentConfig().label() == "ddp mlp bs32 fp32 bucket25MiB"
    assert c.replace(bucket_cap_mb=5).bucket_cap_mb == 5
    with pytest.raises(ExperimentConfigError, match="unknown config keys"):
        c.replace(bucket_mb=5)


def test_a_refused_value_shows_the_learners_line_not_the_rules_frames() -> None:
    """`ExperimentConfig(world_size=0)` showed six frames, four inside config_rules, before the message."""
    import traceback

    with pytest.raises(ExperimentConfigError, match="world_size=0 is too small") as e:
        ExperimentConfig(world_size=0)
    frames = [f.name for f in traceback.extract_tb(e.value.__traceback__)]
    assert frames[-1] == "__post_init__" and "_at_least" not in frames, frames


def test_a_misspelt_knob_is_named_with_the_closest_key_however_it_is_passed() -> None:
    """`ExperimentConfig(bucket_mb=5)` was Python's bare "unexpected keyword argument 'bucket_mb'", while
    replace() and from_dict() listed the valid keys: a learner guessing a knob's name now gets its name."""
    base = ExperimentConfig()
    for make in (lambda: ExperimentConfig(strategy="ddp", bucket_mb=5), lambda: base.replace(bucket_mb=5),
                 lambda: ExperimentConfig.from_dict({"bucket_mb": 5})):
        with pytest.raises(ExperimentConfigError) as e:
            make()
        assert "unknown config keys ['bucket_mb'] (did you mean 'bucket_cap_mb' for 'bucket_mb'?)" in str(e.value)
        assert "'world_size'" in str(e.value)  # the valid keys follow
    with pytest.raises(ExperimentConfigError, match=r"\['lr'\]; valid keys"):  # nothing close: no guess
        ExperimentConfig(lr=0.1)
    assert ExperimentConfig(strategy="ddp", bucket_cap_mb=5).bucket_cap_mb == 5
    assert pickle.loads(pickle.dumps(base)) == base and copy.deepcopy(base) == base


def test_package_import_stays_light() -> None:
    code = ("import sys, kit.experiments as e; c = e.ExperimentConfig(); e.table; e.run; e.load_jsonl; "
            "import kit.experiments.records; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
