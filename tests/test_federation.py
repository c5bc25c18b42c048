"""Federation files and key files: clear errors, keys with the right modes."""
import os
import stat

import pytest

from fedhet.parties import keys
from fedhet.parties.ops import presets
from fedhet.parties.ops.cli import main
from fedhet.parties.federation import FederationError, from_dict, load

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)

GOOD = {
    "federation": {"name": "t", "key_dir": "keys"},
    "algorithm": {"name": "fedavg_logreg", "rounds": 2},
    "party": [{"name": "s", "role": "server", "endpoint": "tcp://127.0.0.1:5000"},
              {"name": "c", "role": "client", "endpoint": "tcp://127.0.0.1:5001", "device": "cpu"}],
}


def test_presets_load():
    assert "demo" in presets.names()
    fed = load(presets.path("demo"))
    assert fed.algorithm_name == "fedavg_logreg" and len(fed.parties) == 4


@pytest.mark.parametrize("change,msg", [
    (lambda d: d["party"].pop(), "at least two"),
    (lambda d: d["party"][1].update(name="s"), "duplicate party name"),
    (lambda d: d["party"][1].update(endpoint="http://x"), "endpoint"),
    (lambda d: d["party"][1].update(endpoint="tcp://127.0.0.1:5000"), "used by another party"),
    (lambda d: d["party"][1].update(device="tpu"), "device"),
    (lambda d: d["party"][1].update(colour="red"), "unknown key 'colour'"),
    (lambda d: d["algorithm"].pop("name"), r"\[algorithm\] needs a name"),
    (lambda d: d.update(extra={}), "unknown top-level"),
    (lambda d: d["federation"].update(timeout=-1), r"f.toml: \[federation\]: timeout must be > 0, got -1"),
    (lambda d: d["federation"].update(timeout="soon"), r"\[federation\]: timeout must be a finite number, got 'soon'"),
    (lambda d: d["federation"].update(engine="k8s"), r"\[federation\]: engine must be one of 'local', 'ray'"),
    (lambda d: d["party"][1].update(host=3), r"\[\[party\]\] #2 'c': host must be a string, got 3"),
    (lambda d: d["party"][1].update(data=[1]), r"\[\[party\]\] #2 'c': data must be a table"),
])
def test_bad_federations_name_what_is_wrong(change, msg):
    import copy
    d = copy.deepcopy(GOOD)
    change(d)
    with pytest.raises(FederationError, match=msg):
        from_dict(d, source="f.toml")


def test_toml_round_trip(tmp_path):
    fed = from_dict(GOOD, source=str(tmp_path / "f.toml"), base_dir=tmp_path)
    (tmp_path / "f.toml").write_text(fed.to_toml())
    again = load(tmp_path / "f.toml")
    assert again.roles == fed.roles and again.algorithm == fed.algorithm and again.key_dir == fed.key_dir


def test_keys_command_writes_private_files_0600_and_updates_the_file(tmp_path, capsys):
    f = tmp_path / "fed.toml"
    f.write_text(from_dict(GOOD, source=str(f), base_dir=tmp_path).to_toml())
    assert main(["keys", str(f), "--update"]) == 0
    out = capsys.readouterr().out
    fed = load(f)
    for p in fed.parties:
        assert p.public_key and p.public_key in out and p.sign_key
        for suffix in ("curve.key", "sign.key"):
            mode = stat.S_IMODE(os.stat(tmp_path / "keys" / f"{p.name}.{suffix}").st_mode)
            assert mode == 0o600
        assert keys.load_public(tmp_path / "keys", p.name).curve == p.public_key
    # refusing to overwrite keys silently
    assert main(["keys", str(f)]) == 2


def test_loose_secret_key_mode_is_refused(tmp_path):
    keys.generate(tmp_path, "x")
    os.chmod(tmp_path / "x.curve.key", 0o644)
    with pytest.raises(PermissionError, match="0600"):
        keys.load_curve_secret(tmp_path, "x")


def test_the_fingerprint_covers_every_shared_key_and_no_local_or_launch_key():
    """By construction: the [federation] digest is over SharedSettings' fields; changing any of them
    changes it, changing a key of this machine or of the launcher does not."""
    from dataclasses import replace

    from fedhet.parties.federation import LaunchSettings, LocalSettings, SharedSettings
    from fedhet.parties.settings import known_keys

    fed = from_dict(GOOD, source="f.toml")
    base = fed.fingerprint()["federation"]
    changed = {"name": "other", "timeout": 99.0, "seed": 7, "max_message_mb": 8, "peer_lost_s": 3.0,
               "restart_grace_s": 5.0, "network": "wan"}
    assert set(changed) == set(known_keys(SharedSettings))
    for k, v in changed.items():
        assert replace(fed, **{k: v}).fingerprint()["federation"] != base, k
    others = {"data_dir": "/d", "run_id": "r", "checkpoint_every": 3, "hosts": 2, "host_threads": 1,
              "engine": "ray", "ray_address": "h:1", "placement": "pack", "party_ports": (2000, 2100)}
    assert set(others) == (set(known_keys(LocalSettings)) - {"key_dir"}) | set(known_keys(LaunchSettings))
    for k, v in others.items():
        assert replace(fed, **{k: v}).fingerprint()["federation"] == base, k


def test_a_party_reads_no_launch_key_and_keeps_them_for_the_record():
    """`fedhet party` loads with launch=False: the launch keys are checked to be known keys only; its
    public record and derived run id are the launcher's, key for key."""
    import copy

    d = copy.deepcopy(GOOD)
    d["federation"].update(hosts=2, engine="ray", placement="spread", party_ports="20000-20999")
    full, party = from_dict(d, source="f.toml"), from_dict(d, source="f.toml", launch=False)
    assert (full.hosts, full.engine, full.party_ports) == (2, "ray", (20000, 20999))
    assert (party.hosts, party.engine, party.party_ports) == (0, "local", None)   # never read by a party
    assert party.to_dict() == full.to_dict() and party.derived_run_id() == full.derived_run_id()
    assert party.fingerprint() == full.fingerprint()
    d["federation"]["engine"] = "k8s"   # wrong for the launcher, nothing to a party
    with pytest.raises(FederationError, match=r"\[federation\]: engine must be one of"):
        from_dict(d, source="f.toml")
    assert from_dict(d, source="f.toml", launch=False).to_dict()["federation"]["engine"] == "k8s"
    d["federation"]["engin"] = "ray"    # a typo is still caught everywhere
    with pytest.raises(FederationError, match="did you mean 'engine'"):
        from_dict(d, source="f.toml", launch=False)
