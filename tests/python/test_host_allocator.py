"""qlink.integrations.process_settings: expandable segments turned off for the outermost of
nested or concurrent loops where the process asked for them, back on after the last, every
other allocator option kept."""
import threading

import pytest
import torch

from qlink.integrations import process_settings
from qlink.integrations.process_settings import asked_for_expandable, fixed_segments, with_option

OFF, ON = "expandable_segments:False,max_split_size_mb:256", "expandable_segments:True,max_split_size_mb:256"


@pytest.fixture
def settings(monkeypatch):
    """PyTorch's run-time allocator setting, recorded: the settings asked for, in order."""
    calls = []
    monkeypatch.setattr(process_settings, "_has_cuda", lambda: True)  # the allocator's part is mocked
    monkeypatch.setattr(process_settings, "_setter", lambda: calls.append)
    monkeypatch.setattr(process_settings, "_snapshot_settings", dict)  # the config says, as on a torch without
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True,max_split_size_mb:256")
    return calls


def test_the_config_asks_for_expandable_segments_by_either_name():
    assert asked_for_expandable({"PYTORCH_ALLOC_CONF": "max_split_size_mb:256, expandable_segments:True"})
    assert asked_for_expandable({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert not asked_for_expandable({"PYTORCH_ALLOC_CONF": "max_split_size_mb:256",
                                     "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert not asked_for_expandable({"PYTORCH_ALLOC_CONF": "expandable_segments:False"})
    assert not asked_for_expandable({})
    assert asked_for_expandable({"PYTORCH_ALLOC_CONF": "roundup_power2_divisions:[256:1,>:2],expandable_segments:True"})


def test_an_option_set_in_a_settings_string_keeps_every_other_option():
    """PyTorch's setter puts every option a string leaves out back to its default."""
    gptqmodel = "expandable_segments:True,max_split_size_mb:256,garbage_collection_threshold:0.7"
    assert with_option(gptqmodel, "expandable_segments", "False") == \
        "expandable_segments:False,max_split_size_mb:256,garbage_collection_threshold:0.7"
    assert with_option("max_split_size_mb:256, roundup_power2_divisions:[256:1,>:2]", "expandable_segments",
                       "True") == "max_split_size_mb:256,roundup_power2_divisions:[256:1,>:2],expandable_segments:True"
    assert with_option("", "expandable_segments", "False") == "expandable_segments:False"


def test_nested_and_concurrent_loops_turn_them_off_once_and_the_last_back_on(settings):
    inside, release = threading.Event(), threading.Event()
    reasons = []

    def other_loop():
        with fixed_segments() as reason:
            reasons.append(reason)
            inside.set()
            release.wait()
    with fixed_segments() as reason:
        assert reason is None and settings == [OFF]
        thread = threading.Thread(target=other_loop)
        thread.start()
        inside.wait()
        with fixed_segments() as inner:
            assert inner is None
    assert settings == [OFF]  # the other thread's loop still runs
    release.set()
    thread.join()
    assert reasons == [None]
    assert settings == [OFF, ON]


def test_a_loop_that_raises_turns_them_back_on(settings):
    with pytest.raises(RuntimeError, match="the loop failed"):
        with fixed_segments():
            raise RuntimeError("the loop failed")
    assert settings == [OFF, ON]
    with fixed_segments():  # and the next loop starts afresh
        pass
    assert len(settings) == 4


def test_fixed_segments_asked_for_no_setter_or_no_cuda_leave_the_allocator_alone(settings, monkeypatch):
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:256")
    with fixed_segments() as reason:
        assert reason == "the allocator makes fixed segments already"
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True")
    monkeypatch.setattr(process_settings, "_setter", lambda: None)
    with fixed_segments() as reason:
        assert reason == "this torch cannot change its CUDA allocator's settings at run time"
    monkeypatch.setattr(process_settings, "_has_cuda", lambda: False)
    with fixed_segments() as reason:
        assert reason == "no CUDA device, no CUDA allocator"
    assert settings == []


def test_a_setting_pytorch_refuses_is_a_reason_not_a_failure(settings, monkeypatch):
    def refuse(setting):
        raise RuntimeError("Unrecognized key 'expandable_segments' in Caching Allocator Config.\nmore")
    monkeypatch.setattr(process_settings, "_setter", lambda: refuse)
    with fixed_segments() as reason:
        assert reason == ("PyTorch refused expandable_segments:False: Unrecognized key 'expandable_segments' "
                          "in Caching Allocator Config.")
    monkeypatch.setattr(process_settings, "_setter", lambda: settings.append)
    with fixed_segments() as reason:
        assert reason is None
    assert settings == [OFF, ON]


def test_what_the_allocator_reports_overrides_the_config(settings, monkeypatch):
    """An allocator that started before GPTQModel set the variable makes fixed segments
    whatever it says; one turned to expandable segments at run time makes expandable ones."""
    monkeypatch.setattr(process_settings, "_snapshot_settings", lambda: {"expandable_segments": False})
    with fixed_segments() as reason:
        assert reason == "the allocator makes fixed segments already"
    assert settings == []
    monkeypatch.setattr(process_settings, "_snapshot_settings", lambda: {"expandable_segments": True})
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:256")
    with fixed_segments() as reason:
        assert reason is None
    assert settings == ["max_split_size_mb:256,expandable_segments:False",
                        "max_split_size_mb:256,expandable_segments:True"]


def test_the_settings_the_allocator_last_parsed_are_the_ones_kept(settings, monkeypatch):
    """A process that changed its allocator at run time: the variable no longer says what
    the allocator runs with, its snapshot does."""
    last = "expandable_segments:True,garbage_collection_threshold:0.7"
    monkeypatch.setattr(process_settings, "_snapshot_settings",
                        lambda: {"expandable_segments": True, "PYTORCH_CUDA_ALLOC_CONF": last})
    with fixed_segments():
        pass
    assert settings == ["expandable_segments:False,garbage_collection_threshold:0.7",
                        "expandable_segments:True,garbage_collection_threshold:0.7"]


def _segment_of(tensor):
    return next(s for s in torch.cuda.memory._snapshot()["segments"]
                if s["address"] <= tensor.data_ptr() < s["address"] + s["total_size"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_a_loop_makes_fixed_segments_and_expandable_ones_come_back_after():
    """PyTorch's own setter and report: the segment a loop makes inside is a fixed one, the
    one made after it an expandable one again."""
    set_allocator = torch.cuda.memory._set_allocator_settings
    set_allocator("expandable_segments:True,max_split_size_mb:256")
    try:
        assert process_settings.expandable_now()
        torch.cuda.empty_cache()  # so that each allocation below makes a segment of its own
        with fixed_segments() as reason:
            assert reason is None and not process_settings.expandable_now()
            assert process_settings._snapshot_settings()["max_split_size"] == 256 << 20
            inside = torch.empty(96 << 20, dtype=torch.uint8, device="cuda")
            made_inside = _segment_of(inside)
        assert process_settings.expandable_now()
        assert process_settings._snapshot_settings()["max_split_size"] == 256 << 20
        del inside
        torch.cuda.empty_cache()
        after = torch.empty(96 << 20, dtype=torch.uint8, device="cuda")
        made_after = _segment_of(after)
        assert made_inside["is_expandable"] is False and made_after["is_expandable"] is True
    finally:
        set_allocator("expandable_segments:False")
