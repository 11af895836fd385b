"""Target profiles are data: a user's YAML file is validated with sentences that name the key."""

from __future__ import annotations

import copy

import pytest
import yaml

from fixer.errors import ProfileError
from fixer.npu.profile import load_profile, parse_profile


def builtin_data() -> dict:
    from importlib import resources

    return yaml.safe_load((resources.files("fixer.npu") / "profiles" / "stm32n6.yaml").read_text())


def test_builtin_profile_has_a_tag_on_every_limit_and_operator():
    prof = load_profile()
    assert prof.name == "stm32n6"
    assert all(l.tag in ("DOC", "OBS", "3P", "INF") and l.source for l in prof.limits.values())
    assert all(r.tag in ("DOC", "OBS", "3P", "INF") for r in prof.operators.values())
    for row in ("Conv", "Gemm", "MatMul", "Softmax", "Resize", "DepthToSpace", "Cast", "LSTM", "BatchNormalization",
                "ReduceMean", "Transpose", "Pad", "Div", "Sub", "PRelu"):
        assert row in prof.operators, row


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda d: d["limits"]["channel_chunk_max"].update(tag="GUESS"), "'limits.channel_chunk_max.tag' is 'GUESS'"),
        (lambda d: d["limits"]["channel_chunk_max"].update(value="many"), "'limits.channel_chunk_max.value' must be a number"),
        (lambda d: d["operators"]["Conv"].update(tier="npu"), "'operators.Conv.tier' is 'npu'; use one of hw, sw, movement"),
        (lambda d: d["operators"]["Relu"].update(epoch="later"), "'operators.Relu.epoch' is 'later'"),
        (lambda d: d["operators"]["Relu"].pop("tag"), "'operators.Relu' is missing the key 'tag'"),
        (lambda d: d.pop("limits"), "'<top>' is missing the key 'limits'"),
    ],
)
def test_invalid_profile_names_the_key(mutate, message):
    data = copy.deepcopy(builtin_data())
    mutate(data)
    with pytest.raises(ProfileError) as exc:
        parse_profile(data, "my.yaml")
    assert str(exc.value).startswith("my.yaml: ") and message in str(exc.value)


def test_user_profile_file_changes_the_limits(tmp_path):
    data = builtin_data()
    data["limits"]["channel_chunk_max"]["value"] = 300
    p = tmp_path / "mine.yaml"
    p.write_text(yaml.safe_dump(data))
    prof = load_profile(str(p))
    assert prof.limit("channel_chunk_max") == 300
    with pytest.raises(ProfileError, match="unknown target profile 'stm32n7'"):
        load_profile("stm32n7")
    with pytest.raises(ProfileError, match="unknown stedgeai option"):
        load_profile(options=frozenset({"--expand-everything"}))
