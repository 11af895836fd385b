"""Tests of fixer.npu.mpool: .mpool and Neural-ART profile parsing, built-in pools, the greedy fit."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from fixer.errors import ProfileError, UsageError
from fixer.npu.mpool import (
    MemoryPool,
    default_stm32n6_pools,
    fit_activations,
    load_mpool,
    load_neural_art_profile,
    parse_mpool,
    strip_json_comments,
)

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
REFERENCE = SHARED / "reference"
needs_shared = pytest.mark.skipif(
    not REFERENCE.is_dir(), reason=f"{REFERENCE} is not available (shared reference data)"
)

KIB = 1024
MIB = 1024 * 1024

# The .mpool example of NEURAL_ART.md section 6, with comments and a URL in a string.
SNAKE_MPOOL = """\
// stm32n6 memory map, see https://www.st.com/ (this comment is stripped)
{"params": {"param": [{"paramname": "max_onchip_sram_size", "value": "1024", "magnitude": "KBYTES"}]},
 "memory": {"cacheinfo": [], "mem_file_prefix": "atonbuf",  // prefix of the raw files
  "mempools": [
   {"fname": "AXISRAM3", "name": "npuRAM3", "fformat": "FORMAT_RAW",
    "prop": {"rights": "ACC_WRITE", "throughput": "HIGH", "latency": "LOW", "byteWidth": 8,
             "freqRatio": 1.25, "read_power": 18.531, "write_power": 16.201},
    "offset": {"value": "0x34200000", "magnitude": "BYTES"},
    "size": {"value": "448", "magnitude": "KBYTES"}},
   /* a disabled pool */
   {"fname": "AXISRAM1", "name": "cpuRAM1", "fformat": "FORMAT_RAW",
    "prop": {"rights": "ACC_WRITE", "throughput": "MID", "latency": "MID"},
    "offset": {"value": "0x34064000", "magnitude": "BYTES"},
    "size": {"value": "0", "magnitude": "KBYTES"}},
   {"fname": "xSPI2", "name": "octoFlash", "fformat": "FORMAT_RAW",
    "prop": {"rights": "ACC_READ", "throughput": "MID", "latency": "HIGH", "byteWidth": 1,
             "freqRatio": 6.00, "cacheable": "CACHEABLE_ON", "constants_preferred": "true"},
    "offset": {"value": "0x71000000", "magnitude": "BYTES"},
    "size": {"value": "16", "magnitude": "MBYTES"}, "mode": "USEMODE_RELATIVE"},
  ]}}
"""

# The same pools as the compiler saves them (camelCase keys, no comments).
CAMEL_MPOOL = {
    "params": {"param": [{"paramname": "max_onchip_sram_size", "value": "1", "magnitude": "MBYTES"}]},
    "memory": {
        "memFilePrefix": "atonbuf",
        "mempools": [
            {"fname": "AXISRAM3", "name": "npuRAM3",
             "prop": {"rights": "ACC_WRITE", "throughput": "HIGH", "latency": "LOW", "byteWidth": 8,
                      "freqRatio": 1.25, "readPower": 18.531, "writePower": 16.201},
             "offset": {"value": "0x34200000", "magnitude": "BYTES"},
             "size": {"value": "458752", "magnitude": "BYTES"}},
            {"fname": "xSPI2", "name": "octoFlash",
             "prop": {"rights": "ACC_READ", "throughput": "MID", "latency": "HIGH", "constantsPreferred": "true"},
             "offset": {"value": "0x71000000", "magnitude": "BYTES"},
             "size": {"value": "16384", "magnitude": "KBYTES"}, "mode": "USEMODE_ABSOLUTE"},
        ],
    },
}


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------
# Comments
# ---------------------------------------------------------------------------------------------


def test_strip_comments_keeps_strings_and_positions() -> None:
    text = '{"url": "https://x.org/a//b", // note\n "path": "C://tools/\\"q//\\"", /* block\n x */ "n": 1,}'
    cleaned = strip_json_comments(text)
    assert len(cleaned) == len(text) and cleaned.count("\n") == text.count("\n")
    assert json.loads(cleaned) == {"url": "https://x.org/a//b", "path": 'C://tools/"q//"', "n": 1}


def test_strip_comments_trailing_commas_only_outside_strings() -> None:
    assert json.loads(strip_json_comments('[1, 2, // last\n ]')) == [1, 2]
    assert json.loads(strip_json_comments('{"a": ",}"}')) == {"a": ",}"}
    assert strip_json_comments('{"a": 1}') == '{"a": 1}'


# ---------------------------------------------------------------------------------------------
# .mpool
# ---------------------------------------------------------------------------------------------


def test_load_mpool_snake_case_with_comments(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _write(tmp_path / "my.mpool", SNAKE_MPOOL)
    with caplog.at_level(logging.WARNING, logger="fixer.npu.mpool"):
        mpool = load_mpool(path)
    assert "atonn may reject" in caplog.text
    assert mpool.path == path and mpool.mem_file_prefix == "atonbuf"
    assert mpool.params == {"max_onchip_sram_size": 1024 * KIB}
    assert [p.name for p in mpool.pools] == ["npuRAM3", "cpuRAM1", "octoFlash"]
    npu = mpool.pool("npuRAM3")
    assert npu is not None
    assert (npu.size_bytes, npu.offset, npu.rights, npu.writable, npu.on_chip) == (
        448 * KIB, 0x34200000, "ACC_WRITE", True, True)
    assert (npu.throughput, npu.latency, npu.byte_width, npu.freq_ratio) == ("HIGH", "LOW", 8, 1.25)
    assert npu.provenance is None
    flash = mpool.pool("octoFlash")
    assert flash is not None
    assert (flash.size_bytes, flash.writable, flash.on_chip, flash.mode, flash.constants_preferred) == (
        16 * MIB, False, False, "USEMODE_RELATIVE", True)


def test_size_zero_disables_a_pool(tmp_path: Path) -> None:
    mpool = load_mpool(_write(tmp_path / "my.mpool", SNAKE_MPOOL))
    disabled = mpool.pool("cpuRAM1")
    assert disabled is not None and disabled.size_bytes == 0 and not disabled.enabled
    assert [p.name for p in mpool.enabled_pools] == ["npuRAM3", "octoFlash"]


def test_camel_case_keys_give_the_same_pools(tmp_path: Path) -> None:
    snake = load_mpool(_write(tmp_path / "a.mpool", SNAKE_MPOOL))
    camel = load_mpool(_write(tmp_path / "b.mpool", json.dumps(CAMEL_MPOOL)))
    assert camel.mem_file_prefix == "atonbuf"
    assert camel.params == {"max_onchip_sram_size": MIB}
    for name in ("npuRAM3", "octoFlash"):
        a, b = snake.pool(name), camel.pool(name)
        assert a is not None and b is not None
        assert (a.size_bytes, a.offset, a.writable, a.on_chip, a.constants_preferred) == (
            b.size_bytes, b.offset, b.writable, b.on_chip, b.constants_preferred)
    assert camel.pool("npuRAM3").byte_width == 8
    assert camel.pool("octoFlash").mode == "USEMODE_ABSOLUTE"


@pytest.mark.parametrize(("magnitude", "value", "expected"), [
    ("BYTES", "4096", 4096), ("KBYTES", "448", 458752), ("MBYTES", "16", 16 * MIB), ("KBYTES", "0.5", 512),
    ("BYTES", "0x1000", 4096)])
def test_magnitudes(magnitude: str, value: str, expected: int) -> None:
    data = {"memory": {"mempools": [{"name": "p", "fname": "AXISRAM3", "prop": {"rights": "ACC_WRITE"},
                                     "size": {"value": value, "magnitude": magnitude}}]}}
    assert parse_mpool(data).pools[0].size_bytes == expected


@pytest.mark.parametrize(("change", "message"), [
    ({"size": {"value": "1", "magnitude": "GBYTES"}}, r"'npuRAM3'.*magnitude 'GBYTES'"),
    ({"size": {"value": "lots", "magnitude": "KBYTES"}}, r"'npuRAM3'.*not a number"),
    ({"size": None}, r"'npuRAM3'.*no 'size'"),
    ({"prop": {"rights": "ACC_EXEC"}}, r"'npuRAM3'.*ACC_READ or ACC_WRITE"),
    ({"mode": "USEMODE_SOMETIMES"}, r"'npuRAM3'.*USEMODE_RELATIVE"),
])
def test_invalid_pool_entries(change: dict, message: str) -> None:
    pool = {"name": "npuRAM3", "fname": "AXISRAM3", "prop": {"rights": "ACC_WRITE"},
            "size": {"value": "448", "magnitude": "KBYTES"}}
    pool.update(change)
    pool = {k: v for k, v in pool.items() if v is not None}
    with pytest.raises(ProfileError, match=message):
        parse_mpool({"memory": {"mempools": [pool]}}, source="x.mpool")


def test_invalid_mpool_structure() -> None:
    with pytest.raises(ProfileError, match="'memory'"):
        parse_mpool({"params": {}})
    with pytest.raises(ProfileError, match="mempools"):
        parse_mpool({"memory": {"mempools": {}}})
    pool = {"name": "a", "prop": {"rights": "ACC_WRITE"}, "size": {"value": "1"}}
    with pytest.raises(ProfileError, match="repeats"):
        parse_mpool({"memory": {"mempools": [pool, pool]}})


def test_bad_json_names_the_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "bad.mpool", '{\n  "memory": {\n    "mempools": [\n      {"name": "a" "fname": "b"}\n]}}')
    with pytest.raises(ProfileError, match=r"bad\.mpool is not valid JSON at line 4"):
        load_mpool(path)
    with pytest.raises(ProfileError, match="does not exist"):
        load_mpool(tmp_path / "missing.mpool")


@pytest.mark.parametrize(("name", "fname", "offset", "on_chip"), [
    ("npuRAM4", "AXISRAM4", 0x34270000, True),
    ("cpuRAM2", "atonbuf.AXISRAM2.raw", None, True),
    ("flexMEM", "AXIFLEXMEM", 0x34000000, True),
    ("hyperRAM", "xSPI1", 0x90000000, False),
    ("octoFlash", "atonbuf.xSPI2.raw", None, False),
    ("scratch", "MYRAM", 0x34300000, True),
    ("board", "MYRAM", 0xC0000000, False),
])
def test_on_chip_inference(name: str, fname: str, offset: int | None, on_chip: bool) -> None:
    pool = {"name": name, "fname": fname, "prop": {"rights": "ACC_WRITE"}, "size": {"value": "1"}}
    if offset is not None:
        pool["offset"] = {"value": hex(offset), "magnitude": "BYTES"}
    assert parse_mpool({"memory": {"mempools": [pool]}}).pools[0].on_chip is on_chip


# ---------------------------------------------------------------------------------------------
# Neural-ART profile JSON
# ---------------------------------------------------------------------------------------------


PROFILE_JSON = """\
// user_neuralart.json, as shipped with comments
{"Globals": {},
 "Profiles": {
   "n6-noextmem": {"memory_pool": "./my_mpools/stm32n6__noextmem.mpool",
                   "machine_desc": "./my_mdescs/stm32n6.mdesc",
                   "options": "--optimization 3 --all-buffers-info --mvei --cache-maintenance --Oauto-sched --native-float --enable-virtual-mem-pools --Omax-ca-pipe 4 --Ocache-opt --Os"},
   "n6-allmems-O3": {"memory_pool": "./my_mpools/stm32n6.mpool",
                     "machine_desc": "./my_mdescs/stm32n6.mdesc",
                     "options": "--optimization 3"}
 }}
"""


@pytest.fixture()
def profile_file(tmp_path: Path) -> Path:
    root = tmp_path / "scripts" / "N6_scripts"
    _write(root / "my_mpools" / "stm32n6__noextmem.mpool", SNAKE_MPOOL)
    _write(root / "my_mpools" / "stm32n6.mpool", json.dumps(CAMEL_MPOOL))
    _write(root / "my_mdescs" / "stm32n6.mdesc", "{}")
    return _write(root / "user_neuralart.json", PROFILE_JSON)


def test_load_profile_resolves_paths_relative_to_the_file(profile_file: Path) -> None:
    profile = load_neural_art_profile(f"n6-noextmem@{profile_file}")
    root = profile_file.parent
    assert profile.name == "n6-noextmem" and profile.path == profile_file
    assert profile.memory_pool == root / "my_mpools" / "stm32n6__noextmem.mpool"
    assert profile.machine_desc == root / "my_mdescs" / "stm32n6.mdesc"
    assert profile.option_args[:2] == ("--optimization", "3")
    assert "--enable-virtual-mem-pools" in profile.option_args
    assert profile.pools is not None and [p.name for p in profile.pools.pools] == ["npuRAM3", "cpuRAM1", "octoFlash"]
    assert profile.spec == f"n6-noextmem@{profile_file}"
    other = load_neural_art_profile(f"n6-allmems-O3@{profile_file}", load_pools=False)
    assert other.pools is None and other.options == "--optimization 3"


def test_profile_relative_spec_from_cwd(profile_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(profile_file.parent.parent)
    profile = load_neural_art_profile("n6-allmems-O3@N6_scripts/user_neuralart.json")
    assert profile.pools is not None and profile.pools.pool("octoFlash") is not None


def test_old_memory_desc_key_is_rejected(tmp_path: Path) -> None:
    path = _write(tmp_path / "p.json", json.dumps({"Profiles": {"old": {
        "memory_pool": "a.mpool", "memory_desc": "stm32n6.mdesc", "options": ""}}}))
    with pytest.raises(ProfileError, match=r"profile 'old' uses the old key 'memory_desc'; rename it to 'machine_desc'"):
        load_neural_art_profile(f"old@{path}")


def test_unknown_profile_lists_the_available_ones(profile_file: Path) -> None:
    with pytest.raises(ProfileError) as info:
        load_neural_art_profile(f"n6-noextmen@{profile_file}")
    message = str(info.value)
    assert "no profile named 'n6-noextmen'" in message
    assert "available profiles: n6-allmems-O3, n6-noextmem" in message
    assert "Did you mean 'n6-noextmem'?" in message


def test_profile_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"does not exist"):
        load_neural_art_profile(f"x@{tmp_path / 'missing.json'}")
    with pytest.raises(ProfileError, match=r"NAME@FILE\.json"):
        load_neural_art_profile("just-a-name")
    bad = _write(tmp_path / "bad.json", '{"Profiles": {\n  "a": {"options": "x"\n}')
    with pytest.raises(ProfileError, match=r"bad\.json is not valid JSON at line 3"):
        load_neural_art_profile(f"a@{bad}")
    empty = _write(tmp_path / "empty.json", '{"Globals": {}}')
    with pytest.raises(ProfileError, match="'Profiles'"):
        load_neural_art_profile(f"a@{empty}")


def test_profile_with_missing_mpool_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "p.json", json.dumps({"Profiles": {"p": {"memory_pool": "nope.mpool", "options": ""}}}))
    with pytest.raises(ProfileError, match=r"nope\.mpool, which does not exist"):
        load_neural_art_profile(f"p@{path}")
    assert load_neural_art_profile(f"p@{path}", load_pools=False).memory_pool == tmp_path / "nope.mpool"


# ---------------------------------------------------------------------------------------------
# Built-in pools and the greedy fit
# ---------------------------------------------------------------------------------------------


def test_default_pools_match_the_memory_map() -> None:
    pools = {p.name: p for p in default_stm32n6_pools()}
    assert list(pools) == ["cpuRAM2", "npuRAM3", "npuRAM4", "npuRAM5", "npuRAM6", "hyperRAM", "octoFlash"]
    assert pools["cpuRAM2"].size_bytes == MIB and pools["cpuRAM2"].offset == 0x34100000
    assert [pools[f"npuRAM{i}"].offset for i in (3, 4, 5, 6)] == [0x34200000, 0x34270000, 0x342E0000, 0x34350000]
    assert all(pools[f"npuRAM{i}"].size_bytes == 448 * KIB for i in (3, 4, 5, 6))
    # on-chip total = the compiler's virtual pool cpuRAM2_npuRAM3..6 (2,883,584 B in real c_info files)
    assert sum(p.size_bytes for p in pools.values() if p.on_chip) == 2883584
    assert pools["hyperRAM"].size_bytes == 16 * MIB and pools["hyperRAM"].writable and not pools["hyperRAM"].on_chip
    assert not pools["octoFlash"].writable and not pools["octoFlash"].on_chip
    assert all(p.provenance in ("DOC", "OBS", "3P", "INF") for p in pools.values())


def _pool(name: str, size: int, *, on_chip: bool, writable: bool = True) -> MemoryPool:
    return MemoryPool(name=name, fname=name, size_bytes=size, offset=None,
                      rights="ACC_WRITE" if writable else "ACC_READ", throughput=None, latency=None,
                      on_chip=on_chip, writable=writable)


def test_fit_on_chip() -> None:
    fit = fit_activations(default_stm32n6_pools(), 600 * KIB, 2 * MIB)
    assert fit.fits and not fit.spills_activations
    assert (fit.activations_on_chip, fit.activations_external) == (600 * KIB, 0)
    assert (fit.weights_on_chip, fit.weights_external) == (0, 2 * MIB)  # weights go to flash first
    assert [(a.pool, a.kind) for a in fit.allocations] == [
        ("cpuRAM2", "activations"), ("octoFlash", "weights")]


def test_fit_spills_to_external_ram() -> None:
    fit = fit_activations(default_stm32n6_pools(), 4 * MIB, 0)
    assert fit.fits and fit.spills_activations
    assert fit.activations_on_chip == 2883584
    assert fit.activations_external == 4 * MIB - 2883584
    assert fit.allocations[-1].pool == "hyperRAM"


def test_fit_reports_unallocated_bytes() -> None:
    pools = [p for p in default_stm32n6_pools() if p.on_chip]  # like n6-noextmem
    fit = fit_activations(pools, 3 * MIB, 100 * KIB)
    assert not fit.fits
    assert fit.unallocated_activation_bytes == 3 * MIB - 2883584
    assert fit.unallocated_weight_bytes == 100 * KIB  # no flash, no RAM left
    assert fit.unallocated_bytes == 3 * MIB - 2883584 + 100 * KIB


def test_fit_weights_fall_back_to_free_ram_and_skip_disabled_pools() -> None:
    pools = [_pool("npuRAM3", 448 * KIB, on_chip=True), _pool("cpuRAM1", 0, on_chip=True),
             _pool("octoFlash", 64 * KIB, on_chip=False, writable=False)]
    fit = fit_activations(pools, 100 * KIB, 128 * KIB)
    assert fit.fits
    assert fit.weights_external == 64 * KIB and fit.weights_on_chip == 64 * KIB
    assert all(a.pool != "cpuRAM1" for a in fit.allocations)
    assert fit_activations([], 0, 0).fits


def test_fit_rejects_negative_sizes() -> None:
    with pytest.raises(UsageError, match="non-negative"):
        fit_activations(default_stm32n6_pools(), -1, 0)


@needs_shared
def test_fit_is_a_lower_bound_of_real_external_use() -> None:
    """The greedy fit never predicts more external activation bytes than atonn really used."""
    from fixer.stedgeai import load_c_info

    for c_info_path in sorted((REFERENCE / "pairs").glob("*/c_info.json")):
        c_info = load_c_info(c_info_path)
        fit = fit_activations(default_stm32n6_pools(), c_info.activations_bytes or 0, c_info.weights_bytes or 0)
        hyper = c_info.pool("hyperRAM")
        real_external = hyper.used_size_bytes if hyper else 0
        assert fit.activations_external <= real_external, c_info_path
    faces = load_c_info(REFERENCE / "pairs" / "mobilefacenet_int8_faces" / "c_info.json")
    fit = fit_activations(default_stm32n6_pools(), faces.activations_bytes, faces.weights_bytes)
    assert fit.spills_activations and fit.activations_external == 4116480 - 2883584
