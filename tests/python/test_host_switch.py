"""qlink.integrations.process_settings: the switch interval shortened for the outermost of
nested or concurrent loops, restored after unless something else changed it meanwhile."""
import sys
import threading

import pytest

from qlink.integrations.process_settings import short_switch_interval


@pytest.fixture
def interval():
    """The interpreter's interval set to 5 ms for the test, the one before restored after."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield 0.005
    sys.setswitchinterval(before)


def test_nested_and_concurrent_loops_share_one_interval_restored_by_the_last(interval):
    inside, release = threading.Event(), threading.Event()

    def other_loop():
        with short_switch_interval(1e-3) as reason:
            assert reason is None
            inside.set()
            release.wait()
    with short_switch_interval(1e-4) as reason:
        assert reason is None and sys.getswitchinterval() == pytest.approx(1e-4)
        thread = threading.Thread(target=other_loop)
        thread.start()
        inside.wait()
        with short_switch_interval(1e-4):
            pass
        assert sys.getswitchinterval() == pytest.approx(1e-4)  # the inner loop restored nothing
    assert sys.getswitchinterval() == pytest.approx(1e-4)  # the other thread's loop still runs
    release.set()
    thread.join()
    assert sys.getswitchinterval() == interval


def test_a_shorter_interval_is_kept_and_one_changed_meanwhile_stays(interval):
    sys.setswitchinterval(5e-5)
    with short_switch_interval(1e-4) as reason:
        assert reason == "the interval is already 5e-05 s"
        assert sys.getswitchinterval() == pytest.approx(5e-5)
    assert sys.getswitchinterval() == pytest.approx(5e-5)
    sys.setswitchinterval(interval)
    with short_switch_interval(1e-4):
        sys.setswitchinterval(2e-3)  # the host's own choice during the loop
    assert sys.getswitchinterval() == pytest.approx(2e-3)
