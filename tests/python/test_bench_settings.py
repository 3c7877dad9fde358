"""bench/hosts/common.py's settings for the baselines' rows without qlink: "workers" sizes
GPTQModel's CPU pool as install(cpu_workers=2) does, through GPTQModel's own
GPTQMODEL_CPU_WORKERS, and no other setting touches it; an unknown setting is refused."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "hosts"))
import common  # noqa: E402 (bench/hosts)


def test_workers_sets_gptqmodels_pool_size_and_nothing_else_does(monkeypatch):
    monkeypatch.delenv("GPTQMODEL_CPU_WORKERS", raising=False)
    common.pool_setting(["gc", "switch", "segments"])
    assert "GPTQMODEL_CPU_WORKERS" not in os.environ
    common.pool_setting(["gc", common.POOL_SETTING])
    assert os.environ["GPTQMODEL_CPU_WORKERS"] == "2"


def test_process_settings_take_workers_and_refuse_what_they_do_not_know():
    with common.process_settings([common.POOL_SETTING]):
        pass
    with pytest.raises(ValueError, match=r"unknown process settings \['threads'\]"):
        with common.process_settings(["threads"]):
            pass
