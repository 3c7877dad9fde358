"""python/qlink/_abi.py, the hand-written ctypes mirror of plugin_api/qlink.h, against the
header as the C compiler lays it out (tests/abi_compat/layout_json): every struct's size
and fields (offset, kind, size), the end of its last field against the header's
*_STRUCT_SIZE macro, every function-table slot's offset and signature, every enumerator."""
import ctypes
import json
import subprocess

import pytest

from qlink import _abi

# The header's structs and the classes mirroring them.
MIRRORS = {
    "DLDevice": _abi.DLDevice,
    "DLDataType": _abi.DLDataType,
    "DLTensor": _abi.DLTensor,
    "qlink_device_info": _abi.DeviceInfo,
    "qlink_peer_info": _abi.PeerInfo,
    "qlink_link_measurement": _abi.LinkMeasurement,
    "qlink_stream": _abi.Stream,
    "qlink_copy_args": _abi.CopyArgs,
    "qlink_broadcast_args": _abi.BroadcastArgs,
    "qlink_reduce_args": _abi.ReduceArgs,
    "qlink_all_reduce_args": _abi.AllReduceArgs,
    "qlink_hessian_args": _abi.HessianArgs,
    "qlink_gptq_options": _abi.GptqOptions,
    "qlink_gptq_layer": _abi.GptqLayer,
    "qlink_gptq_args": _abi.GptqArgs,
    "qlink_signround_options": _abi.SignRoundOptions,
    "qlink_signround_layer": _abi.SignRoundLayer,
    "qlink_signround_args": _abi.SignRoundArgs,
    "qlink_signsgd_param": _abi.SignSgdParam,
    "qlink_signsgd_args": _abi.SignSgdArgs,
    "qlink_signround_experts_args": _abi.SignRoundExpertsArgs,
    "qlink_signsgd_experts_args": _abi.SignSgdExpertsArgs,
    "qlink_unique_id": _abi.UniqueId,
    "qlink_api": _abi.Api,
}
API_HEADER_FIELDS = 3  # struct_size, abi_major, abi_minor; the slots follow


@pytest.fixture(scope="module")
def header(request):
    dump = request.config.getoption("--layout-dump")
    if dump is None:
        pytest.skip("no --layout-dump given (the Bazel test passes tests/abi_compat/layout_json)")
    return json.loads(subprocess.run([dump], check=True, capture_output=True, text=True).stdout)


def kind(ctype):
    """[kind, size] as layout_json writes it: i(nteger), f(loat), p(ointer), a(rray), s(truct)."""
    if issubclass(ctype, ctypes.Array):
        k = "a"
    elif issubclass(ctype, ctypes.Structure):
        k = "s"
    elif issubclass(ctype, (ctypes._Pointer, ctypes._CFuncPtr)) or getattr(ctype, "_type_", None) in ("P", "z", "Z"):
        k = "p"
    elif getattr(ctype, "_type_", None) in ("f", "d", "g"):
        k = "f"
    else:
        k = "i"
    return [k, ctypes.sizeof(ctype)]


def fields_of(mirror):
    return [[name, getattr(mirror, name).offset, kind(ctype)] for name, ctype in mirror._fields_]


def test_every_struct_of_the_dump_has_a_mirror(header):
    assert sorted(header["structs"]) == sorted(MIRRORS)


@pytest.mark.parametrize("name", sorted(MIRRORS))
def test_struct_layout(header, name):
    c, mirror = header["structs"][name], MIRRORS[name]
    fields = fields_of(mirror)
    if name == "qlink_api":
        fields = fields[:API_HEADER_FIELDS]
    assert fields == c["fields"], (
        "%s: _abi.py's fields differ from the header's (a field the header gained goes into both _abi.py "
        "and tests/abi_compat/layout_json.cc)" % name)
    assert ctypes.sizeof(mirror) == c["size"], name
    last_name, last_type = mirror._fields_[-1]
    assert getattr(mirror, last_name).offset + ctypes.sizeof(last_type) == c["size_macro"], (
        "%s: its *_STRUCT_SIZE macro ends past _abi.py's last field %s: the header has fields _abi.py lacks"
        % (name, last_name))


def test_table_slots(header):
    slots = [[name, getattr(_abi.Api, name).offset,
              {"result": kind(proto._restype_), "params": [kind(t) for t in proto._argtypes_]}]
             for name, proto in _abi.Api._fields_[API_HEADER_FIELDS:]]
    assert [s[0] for s in slots] == [s[0] for s in header["slots"]], (
        "_abi._TABLE and the header's table differ (a slot the header gained goes into both _abi.py and "
        "tests/abi_compat/layout_json.cc)")
    for mine, theirs in zip(slots, header["slots"]):
        assert mine == theirs, mine[0]


def test_enumerators(header):
    e = header["enums"]
    assert (_abi.ABI_MAJOR, _abi.ABI_MINOR) == (e["QLINK_ABI_MAJOR"], e["QLINK_ABI_MINOR"])
    assert (_abi.KDL_CPU, _abi.KDL_CUDA, _abi.KDL_ROCM) == (e["kDLCPU"], e["kDLCUDA"], e["kDLROCM"])
    statuses = ("OK", "INVALID_ARGUMENT", "UNAVAILABLE", "VERSION_MISMATCH", "OUT_OF_MEMORY", "RUNTIME_ERROR",
                "INTERNAL")
    assert {s: getattr(_abi, s) for s in statuses} == {s: e["QLINK_" + s] for s in statuses}
    assert {s: i for i, s in enumerate(_abi.PEER_STATES)} == {
        k[len("QLINK_PEER_"):].lower(): v for k, v in e.items() if k.startswith("QLINK_PEER_")}
    flags = ("COPY_SOURCES_READY", "COPY_SOURCES_HELD", "COPY_WAIT")
    assert {f: getattr(_abi, f) for f in flags} == {f: e["QLINK_" + f] for f in flags}
    for table, prefix in ((_abi.REDUCE_OPS, "QLINK_REDUCE_"), (_abi.TRANSPORTS, "QLINK_TRANSPORT_"),
                          (_abi.ALL_REDUCE_ALGORITHMS, "QLINK_ALL_REDUCE_"),
                          (_abi.HESSIAN_PRECISIONS, "QLINK_HESSIAN_PRECISION_"),
                          (_abi.GPTQ_INVERSES, "QLINK_GPTQ_INVERSE_")):
        assert table == {k[len(prefix):].lower(): v for k, v in e.items() if k.startswith(prefix)}, prefix
