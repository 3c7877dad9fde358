"""The host rules each integration restates (its contract module), checked as
bench/hosts/check_hosts.py checks them against the hosts' real trees: every rule cites a
host function the stand-ins carry, a digest ignores docstrings, comments and layout but
not the code, and the check names a rule whose host function changed."""
import os
import shutil
import sys

import pytest

from qlink.integrations.autoround.contract import CONTRACT as AUTOROUND
from qlink.integrations.contracts import Contract, source_digest
from qlink.integrations.gptqmodel.contract import CONTRACT as GPTQMODEL

from stand_in_hosts import HOSTS

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "hosts"))
from host_sources import changed_rules  # noqa: E402 (bench/hosts/check_hosts.py's check, out of the package)

CONTRACTS = {"gptqmodel": GPTQMODEL, "auto_round": AUTOROUND}


def _pinned_to(contract, root):
    """`contract`'s rules pinned to the functions as they are under `root`."""
    again = Contract(contract.title)
    for rule in contract.rules:
        with open(os.path.join(root, rule.host_file), encoding="utf-8") as f:
            again.copies(rule.host_file, rule.host_function, source_digest(f.read(), rule.host_function))(rule.copy)
    return again


@pytest.mark.parametrize("package", sorted(CONTRACTS))
def test_every_restated_rule_cites_a_host_function_the_stand_ins_carry(package):
    contract = CONTRACTS[package]
    assert contract.rules
    for rule in contract.rules:
        assert rule.host_file.startswith(package + "/") and len(rule.digest) == 16, rule.label
        assert not any(line.endswith(": gone") for line in changed_rules(contract, HOSTS)), rule.label


def test_a_digest_ignores_docstrings_comments_and_layout_but_not_the_code():
    source = "class A:\n    def f(self, x):\n        return x + 1\n"
    assert source_digest(source, "A.f") == source_digest(
        'class A:\n    def f(self,  x):\n        """what it does"""\n        # why\n        return (x + 1)\n', "A.f")
    assert source_digest(source, "A.f") != source_digest(source.replace("x + 1", "x + 2"), "A.f")
    assert source_digest(source, "A.g") is None


@pytest.mark.parametrize("package", sorted(CONTRACTS))
def test_the_check_names_a_rule_whose_host_function_changed(package, tmp_path):
    root = str(tmp_path / "hosts")
    shutil.copytree(HOSTS, root)
    contract = _pinned_to(CONTRACTS[package], root)
    assert changed_rules(contract, root) == []
    rule = contract.rules[0]
    path = os.path.join(root, rule.host_file)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    name = rule.host_function.rpartition(".")[2]
    head = text.index("def %s(" % name)
    body = text.index(":\n", text.index(")", head)) + 2
    indent = len(text[body:]) - len(text[body:].lstrip(" "))
    with open(path, "w", encoding="utf-8") as f:
        f.write(text[:body] + " " * indent + "changed = True\n" + text[body:])
    changed = changed_rules(contract, root)
    assert changed and all(rule.host_function in line and "pinned" in line for line in changed)
    assert "%s.%s" % (rule.copy.__module__, rule.copy.__qualname__) in changed[0]
